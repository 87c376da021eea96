// Small helpers for the text parsers (mesh, spec, shape) and reports. Internal to the project
// (its libraries, tools and Python binding), not installed.
#pragma once

#include <cctype>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "meshcast/error.h"
#include "meshcast/units.h"

namespace meshcast::detail {

// Text safe in a one-line message: printable ASCII only (else '?'), at most `width` characters
// (then "...").
inline std::string printable(std::string_view s, std::size_t width = 64) {
  std::string out;
  for (char c : s.substr(0, width)) out += (c >= 32 && c < 127) ? c : '?';
  if (s.size() > width) out += "...";
  return out;
}

// A tensor's name in a message: long enough that two names differ (PEFT's share their first
// 64 characters).
inline constexpr std::size_t kNameWidth = 160;

// The same, quoted: what the user gave, named in a message.
inline std::string quote(std::string_view s, std::size_t width = 64) {
  return "'" + printable(s, width) + "'";
}

// The length of the well-formed UTF-8 sequence at s[i]: 1 for ASCII, 2 to 4 for a character in
// its shortest form that is no surrogate and at most U+10FFFF (RFC 3629), else 0.
inline std::size_t utf8_length(std::string_view s, std::size_t i) {
  const auto at = [&](std::size_t k) {
    return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0u;
  };
  const unsigned c = at(0);
  const auto cont = [&](std::size_t k, unsigned lo = 0x80, unsigned hi = 0xBF) {
    return at(k) >= lo && at(k) <= hi;
  };
  if (i >= s.size()) return 0;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    const unsigned lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    return cont(1, lo, hi) && cont(2) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    const unsigned lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    return cont(1, lo, hi) && cont(2) && cont(3) ? 4 : 0;
  }
  return 0;
}

// "1 op", "3 ops", "0 phases": a count with its noun, plural unless it is 1.
inline std::string counted(std::int64_t n, std::string_view noun) {
  return std::to_string(n) + ' ' + std::string(noun) + (n == 1 ? "" : "s");
}

// `text` cut at each `sep`, empty pieces kept: "a,,b," is four ("" is one), so that a parser
// sees a stray separator.
inline std::vector<std::string_view> split(std::string_view text, char sep) {
  std::vector<std::string_view> out;
  for (std::size_t at = 0;;) {
    const std::size_t end = text.find(sep, at);
    out.push_back(text.substr(at, end - at));
    if (end == std::string_view::npos) return out;
    at = end + 1;
  }
}

// The value of decimal digits `s` if it is at most `max`, else -1 (also for no digits or a
// character that is not one).
inline std::int64_t digits_value(std::string_view s, std::int64_t max) {
  if (s.empty()) return -1;
  std::int64_t v = 0;
  for (char c : s) {
    const int d = c - '0';
    if (d < 0 || d > 9 || d > max || v > (max - d) / 10) return -1;
    v = v * 10 + d;
  }
  return v;
}

// A number as people write one in a variable: digits, a point, an exponent (strtod also takes
// hex, "inf", "nan" and leading blanks).
inline bool plain_decimal(std::string_view s) {
  return !s.empty() && (std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '.') &&
         s.find_first_not_of("0123456789.eE+-") == std::string_view::npos;
}

// Parses a non-negative decimal integer <= max; throws ParseError(field) naming `what`.
inline std::int64_t parse_uint(std::string_view s, std::int64_t max, const std::string& field,
                               const std::string& what) {
  if (s.empty()) throw ParseError(field, "missing " + what);
  const std::int64_t v = digits_value(s, max);
  if (v >= 0) return v;
  if (s.find_first_not_of("0123456789") != std::string_view::npos)
    throw ParseError(field, "bad " + what + " " + quote(s) + " (expected digits)");
  throw ParseError(field,
                   what + " " + quote(s) + " is too large (max " + std::to_string(max) + ")");
}

// Parses a size in bytes: decimal digits and an optional binary unit K, M, G or T ("64K" is
// 65536), at most `max`; throws ParseError(field) saying the form.
inline std::int64_t parse_bytes(std::string_view s, std::int64_t max, const std::string& field) {
  const std::string_view units = "KMGT";
  const std::size_t unit = s.empty() ? std::string_view::npos : units.find(s.back());
  const int shift = unit == std::string_view::npos ? 0 : 10 * static_cast<int>(unit + 1);
  const std::string_view digits = shift > 0 ? s.substr(0, s.size() - 1) : s;
  const std::int64_t v = digits_value(digits, max >> shift);
  if (v < 0)
    throw ParseError(field, "expected bytes as digits with an optional K, M, G or T, at most " +
                                human_bytes(max) + ", got " + quote(s));
  return v << shift;
}

}  // namespace meshcast::detail
