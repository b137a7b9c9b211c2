#include "model/dtype.h"

namespace fsdp_plan {
namespace {

// c10's ScalarType list (torch 2.13 has them all; 1.13 the first eighteen),
// with the codes torch.export's schema gives them (torch/_export/serde/schema.py).
const DtypeInfo kDtypes[] = {
    // stem, name, itemsize, torch.export code
    {"Byte", "uint8", 1, 1},
    {"Char", "int8", 1, 2},
    {"Short", "int16", 2, 3},
    {"Int", "int32", 4, 4},
    {"Long", "int64", 8, 5},
    {"Half", "float16", 2, 6},
    {"Float", "float32", 4, 7},
    {"Double", "float64", 8, 8},
    {"ComplexHalf", "complex32", 4, 9},
    {"ComplexFloat", "complex64", 8, 10},
    {"ComplexDouble", "complex128", 16, 11},
    {"Bool", "bool", 1, 12},
    {"QInt8", "qint8", 1, 0},
    {"QUInt8", "quint8", 1, 0},
    {"QInt32", "qint32", 4, 0},
    {"BFloat16", "bfloat16", 2, 13},
    {"QUInt4x2", "quint4x2", 1, 0},
    {"QUInt2x4", "quint2x4", 1, 0},
    {"Bits1x8", "bits1x8", 1, 0},
    {"Bits2x4", "bits2x4", 1, 0},
    {"Bits4x2", "bits4x2", 1, 0},
    {"Bits8", "bits8", 1, 0},
    {"Bits16", "bits16", 2, 0},
    {"Float8_e5m2", "float8_e5m2", 1, 30},
    {"Float8_e4m3fn", "float8_e4m3fn", 1, 29},
    {"Float8_e5m2fnuz", "float8_e5m2fnuz", 1, 32},
    {"Float8_e4m3fnuz", "float8_e4m3fnuz", 1, 31},
    {"UInt16", "uint16", 2, 28},
    {"UInt32", "uint32", 4, 34},
    {"UInt64", "uint64", 8, 35},
    {"Float8_e8m0fnu", "float8_e8m0fnu", 1, 33},
    {"Float4_e2m1fn_x2", "float4_e2m1fn_x2", 1, 0},
};

}  // namespace

const DtypeInfo* dtype_from_stem(const std::string& stem) {
  for (const DtypeInfo& d : kDtypes) {
    if (stem == d.stem) return &d;
  }
  return nullptr;
}

const DtypeInfo* dtype_from_name(const std::string& name) {
  for (const DtypeInfo& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

const DtypeInfo* dtype_from_export_code(int code) {
  for (const DtypeInfo& d : kDtypes) {
    if (code != 0 && code == d.export_code) return &d;
  }
  return nullptr;
}

std::vector<std::string> dtype_stems() {
  std::vector<std::string> out;
  for (const DtypeInfo& d : kDtypes) out.emplace_back(d.stem);
  return out;
}

bool is_floating_dtype(std::string_view dtype) {
  return dtype.substr(0, 5) == "float" || dtype.substr(0, 6) == "bfloat";
}

int64_t dtype_itemsize(const std::string& dtype) {
  if (dtype == "float32") return 4;
  if (dtype == "float16" || dtype == "bfloat16") return 2;
  if (dtype == "float64") return 8;
  return 0;
}

}  // namespace fsdp_plan
