// The fonts of chart text: printable ASCII of DejaVu Sans as 8-bit coverage bitmaps, rendered
// once by scripts/gen_font.py into font_dejavu.cc, so that charts need no font file or FreeType.
//
// Example: the pen at (x, baseline) draws glyph(c) with its top-left pixel at
// (x + left, baseline + top), then moves right by advance.
#pragma once

#include <cstdint>
#include <span>

namespace meshcast::training::font {

// A glyph's ink box: `height` rows of `width` coverage bytes (0 background .. 255 ink) at
// Face::coverage[offset]; `left`, `top`: its top-left pixel relative to the pen on the baseline
// (top < 0 is above the baseline); `advance`: how far the pen moves.
struct Glyph {
  std::uint32_t offset;
  std::uint8_t width, height;
  std::int8_t left, top;
  std::uint8_t advance;
};

inline constexpr char kFirst = ' ', kLast = '~';

struct Face {
  int size;             // pixels per em
  int ascent, descent;  // the line's extent above and below the baseline
  int cap;              // the height of capitals and digits above the baseline
  std::span<const Glyph, kLast - kFirst + 1> glyphs;
  std::span<const std::uint8_t> coverage;

  // Characters outside ' ' .. '~' are drawn as '?'.
  const Glyph& glyph(char c) const {
    return glyphs[c >= kFirst && c <= kLast ? c - kFirst : '?' - kFirst];
  }
};

extern const Face kLabel;  // 13 px: tick labels, axis labels, legends
extern const Face kTitle;  // 17 px: titles

}  // namespace meshcast::training::font
