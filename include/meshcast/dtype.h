// Element types a tensor may have.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace meshcast {

// Every numeric numpy dtype. b8 is numpy's bool (one byte, 0 or 1; "bool" in text); c64 and c128
// are complex numbers of two f32 / two f64 (real part first). Names, not enumerator values, are
// what plans and files hold, so new enumerators may go anywhere.
enum class DType { f16, bf16, f32, f64, i8, i32, i64, u8, i16, u16, u32, u64, b8, c64, c128 };

inline constexpr DType kAllDTypes[] = {
    DType::f16, DType::bf16, DType::f32, DType::f64, DType::i8, DType::i16, DType::i32, DType::i64,
    DType::u8,  DType::u16,  DType::u32, DType::u64, DType::b8, DType::c64, DType::c128};

// c64 and c128: complex numbers have no order, so a Max reduction refuses them.
constexpr bool is_complex(DType t) { return t == DType::c64 || t == DType::c128; }

// Bytes per element: dtype_size(DType::bf16) == 2, dtype_size(DType::c128) == 16.
std::size_t dtype_size(DType t);
// "f32", "bool", "c64" etc.; the inverse of parse_dtype.
std::string to_string(DType t);
// Throws ParseError(field) for an unknown name.
DType parse_dtype(std::string_view text, const std::string& field = "dtype");

// Conversions used to fill, check and reduce half-precision data (round to nearest even).
float half_to_float(unsigned short h);
unsigned short float_to_half(float f);
float bf16_to_float(unsigned short h);
unsigned short float_to_bf16(float f);

}  // namespace meshcast
