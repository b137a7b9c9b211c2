#include "dtype.h"

namespace fsdp_plan {
namespace {

// c10's ScalarType list (torch 2.13 has them all; 1.13 the first eighteen).
const DtypeInfo kDtypes[] = {
    {"Byte", "uint8", 1},           {"Char", "int8", 1},
    {"Short", "int16", 2},          {"Int", "int32", 4},
    {"Long", "int64", 8},           {"Half", "float16", 2},
    {"Float", "float32", 4},        {"Double", "float64", 8},
    {"ComplexHalf", "complex32", 4}, {"ComplexFloat", "complex64", 8},
    {"ComplexDouble", "complex128", 16}, {"Bool", "bool", 1},
    {"QInt8", "qint8", 1},          {"QUInt8", "quint8", 1},
    {"QInt32", "qint32", 4},        {"BFloat16", "bfloat16", 2},
    {"QUInt4x2", "quint4x2", 1},    {"QUInt2x4", "quint2x4", 1},
    {"Bits1x8", "bits1x8", 1},      {"Bits2x4", "bits2x4", 1},
    {"Bits4x2", "bits4x2", 1},      {"Bits8", "bits8", 1},
    {"Bits16", "bits16", 2},        {"Float8_e5m2", "float8_e5m2", 1},
    {"Float8_e4m3fn", "float8_e4m3fn", 1}, {"Float8_e5m2fnuz", "float8_e5m2fnuz", 1},
    {"Float8_e4m3fnuz", "float8_e4m3fnuz", 1}, {"UInt16", "uint16", 2},
    {"UInt32", "uint32", 4},        {"UInt64", "uint64", 8},
    {"Float8_e8m0fnu", "float8_e8m0fnu", 1}, {"Float4_e2m1fn_x2", "float4_e2m1fn_x2", 1},
};

}  // namespace

const DtypeInfo* dtype_from_stem(const std::string& stem) {
  for (const DtypeInfo& d : kDtypes) {
    if (stem == d.stem) return &d;
  }
  return nullptr;
}

std::vector<std::string> dtype_stems() {
  std::vector<std::string> out;
  for (const DtypeInfo& d : kDtypes) out.emplace_back(d.stem);
  return out;
}

}  // namespace fsdp_plan
