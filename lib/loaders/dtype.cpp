#include "dtype.h"

namespace fsdp_plan {

std::string dtype_name(c10::ScalarType t) {
  using S = c10::ScalarType;
  switch (t) {
    case S::Byte: return "uint8";
    case S::Char: return "int8";
    case S::Short: return "int16";
    case S::Int: return "int32";
    case S::Long: return "int64";
    case S::Half: return "float16";
    case S::Float: return "float32";
    case S::Double: return "float64";
    case S::ComplexHalf: return "complex32";
    case S::ComplexFloat: return "complex64";
    case S::ComplexDouble: return "complex128";
    case S::Bool: return "bool";
    case S::QInt8: return "qint8";
    case S::QUInt8: return "quint8";
    case S::QInt32: return "qint32";
    case S::BFloat16: return "bfloat16";
    case S::QUInt4x2: return "quint4x2";
    case S::QUInt2x4: return "quint2x4";
    default: return c10::toString(t);
  }
}

}  // namespace fsdp_plan
