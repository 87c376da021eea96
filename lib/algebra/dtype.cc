#include "meshcast/dtype.h"

#include <bit>
#include <cmath>
#include <cstdint>

#include "lib/support/text.h"
#include "meshcast/error.h"

namespace meshcast {

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::i8:
    case DType::u8:
    case DType::b8:
      return 1;
    case DType::f16:
    case DType::bf16:
    case DType::i16:
    case DType::u16:
      return 2;
    case DType::f32:
    case DType::i32:
    case DType::u32:
      return 4;
    case DType::f64:
    case DType::i64:
    case DType::u64:
    case DType::c64:
      return 8;
    case DType::c128:
      return 16;
  }
  return 0;
}

std::string to_string(DType t) {
  switch (t) {
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::i8:
      return "i8";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
    case DType::i16:
      return "i16";
    case DType::u16:
      return "u16";
    case DType::u32:
      return "u32";
    case DType::u64:
      return "u64";
    case DType::b8:
      return "bool";  // numpy's name
    case DType::c64:
      return "c64";
    case DType::c128:
      return "c128";
  }
  return "?";
}

DType parse_dtype(std::string_view text, const std::string& field) {
  for (DType t : kAllDTypes)
    if (text == to_string(t)) return t;
  throw ParseError(field, "unknown dtype " + detail::quote(text) +
                              " (expected f16, bf16, f32, f64, i8, i16, i32, i64, u8, u16, u32, "
                              "u64, bool, c64 or c128)");
}

float half_to_float(unsigned short h) {
  const std::uint32_t sign = (h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1f;
  const std::uint32_t man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24
    const float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  std::uint32_t bits;
  if (exp == 31)
    bits = sign | 0x7f800000u | (man << 13);
  else
    bits = sign | ((exp + 112) << 23) | (man << 13);
  return std::bit_cast<float>(bits);
}

unsigned short float_to_half(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u)  // inf or nan
    return static_cast<unsigned short>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
  if (absx >= 0x477ff000u)  // rounds to >= 65520: overflow to inf
    return static_cast<unsigned short>(sign | 0x7c00u);
  if (absx < 0x38800000u) {  // below the smallest normal half: subnormal, round to nearest even
    const float a = std::bit_cast<float>(absx);
    const long m = std::lrint(std::ldexp(a, 24));  // lrint rounds half to even
    return static_cast<unsigned short>(sign | static_cast<std::uint32_t>(m));
  }
  std::uint32_t r = absx - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);        // round to nearest even on the 13 dropped bits
  return static_cast<unsigned short>(sign | (r >> 13));
}

float bf16_to_float(unsigned short h) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

unsigned short float_to_bf16(float f) {
  std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<unsigned short>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<unsigned short>(x >> 16);
}

}  // namespace meshcast
