// Element types a tensor may have.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace meshcast {

enum class DType { f16, bf16, f32, f64, i8, i32, i64 };

inline constexpr DType kAllDTypes[] = {DType::f16, DType::bf16, DType::f32, DType::f64,
                                       DType::i8,  DType::i32,  DType::i64};

// Bytes per element: dtype_size(DType::bf16) == 2.
std::size_t dtype_size(DType t);
// "f32" etc.; the inverse of parse_dtype.
std::string to_string(DType t);
// Throws ParseError(field) for an unknown name.
DType parse_dtype(std::string_view text, const std::string& field = "dtype");

// Conversions used to fill, check and reduce half-precision data (round to nearest even).
float half_to_float(unsigned short h);
unsigned short float_to_half(float f);
float bf16_to_float(unsigned short h);
unsigned short float_to_bf16(float f);

}  // namespace meshcast
