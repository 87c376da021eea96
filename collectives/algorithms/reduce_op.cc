// The reduction operators of the collectives, per element type.
#include <algorithm>
#include <cstring>

#include "meshcast/collectives.h"
#include "meshcast/error.h"

namespace meshcast {
namespace {

template <class T>
void combine(const void* from, const void* base, void* to, std::int64_t n, ReduceOp op) {
  const T* a = static_cast<const T*>(from);
  const T* b = static_cast<const T*>(base);
  T* c = static_cast<T*>(to);
  if (op == ReduceOp::Sum)
    for (std::int64_t i = 0; i < n; ++i) c[i] = static_cast<T>(b[i] + a[i]);
  else
    for (std::int64_t i = 0; i < n; ++i) c[i] = std::max(b[i], a[i]);
}

// Half types: each pair combined in float, rounded once.
template <float (*ToFloat)(unsigned short), unsigned short (*FromFloat)(float)>
void combine_half(const void* from, const void* base, void* to, std::int64_t n, ReduceOp op) {
  const auto* a = static_cast<const unsigned short*>(from);
  const auto* b = static_cast<const unsigned short*>(base);
  auto* c = static_cast<unsigned short*>(to);
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = ToFloat(a[i]), y = ToFloat(b[i]);
    c[i] = FromFloat(op == ReduceOp::Sum ? y + x : std::max(y, x));
  }
}

}  // namespace

void reduce_into(const void* from, const void* base, void* to, std::int64_t count, DType dtype,
                 ReduceOp op) {
  switch (dtype) {
    case DType::f16:
      return combine_half<half_to_float, float_to_half>(from, base, to, count, op);
    case DType::bf16:
      return combine_half<bf16_to_float, float_to_bf16>(from, base, to, count, op);
    case DType::f32:
      return combine<float>(from, base, to, count, op);
    case DType::f64:
      return combine<double>(from, base, to, count, op);
    case DType::i8:
      return combine<std::int8_t>(from, base, to, count, op);
    case DType::i32:
      return combine<std::int32_t>(from, base, to, count, op);
    case DType::i64:
      return combine<std::int64_t>(from, base, to, count, op);
  }
}

void reduce_into(const void* from, void* to, std::int64_t count, DType dtype, ReduceOp op) {
  reduce_into(from, to, to, count, dtype, op);
}

std::string to_string(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : "max"; }

ReduceOp parse_reduce_op(std::string_view text, const std::string& field) {
  if (text == "sum") return ReduceOp::Sum;
  if (text == "max") return ReduceOp::Max;
  throw ParseError(
      field, "unknown reduction '" + std::string(text.substr(0, 16)) + "' (expected sum or max)");
}

std::string to_string(Algorithm a) {
  switch (a) {
    case Algorithm::Auto:
      return "auto";
    case Algorithm::Ring:
      return "ring";
    case Algorithm::RecursiveDoubling:
      return "recursive-doubling";
    case Algorithm::HalvingDoubling:
      return "halving-doubling";
    case Algorithm::Hierarchical:
      return "hierarchical";
    case Algorithm::SharedMemory:
      return "shared-memory";
  }
  return "?";
}

Algorithm parse_algorithm(std::string_view text, const std::string& field) {
  for (Algorithm a : {Algorithm::Auto, Algorithm::Ring, Algorithm::RecursiveDoubling,
                      Algorithm::HalvingDoubling, Algorithm::Hierarchical, Algorithm::SharedMemory})
    if (text == to_string(a)) return a;
  throw ParseError(
      field, "unknown algorithm '" + std::string(text.substr(0, 32)) +
                 "' (expected auto, ring, recursive-doubling, halving-doubling, hierarchical or "
                 "shared-memory)");
}

}  // namespace meshcast
