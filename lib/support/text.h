// Small helpers for the text parsers (mesh, spec, shape) and reports. Internal to lib/.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "meshcast/error.h"

namespace meshcast::detail {

// Text safe to quote in a one-line message: printable ASCII only, at most 64 characters.
inline std::string quote(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 64)) out += (c >= 32 && c < 127) ? c : '?';
  if (s.size() > 64) out += "...";
  return "'" + out + "'";
}

// "1 op", "3 ops", "0 phases": a count with its noun, plural unless it is 1.
inline std::string counted(std::int64_t n, std::string_view noun) {
  return std::to_string(n) + ' ' + std::string(noun) + (n == 1 ? "" : "s");
}

// Parses a non-negative decimal integer <= max; throws ParseError(field) naming `what`.
inline std::int64_t parse_uint(std::string_view s, std::int64_t max, const std::string& field,
                               const std::string& what) {
  if (s.empty()) throw ParseError(field, "missing " + what);
  std::int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9')
      throw ParseError(field, "bad " + what + " " + quote(s) + " (expected digits)");
    const int d = c - '0';
    if (v > (max - d) / 10)
      throw ParseError(field,
                       what + " " + quote(s) + " is too large (max " + std::to_string(max) + ")");
    v = v * 10 + d;
  }
  return v;
}

}  // namespace meshcast::detail
