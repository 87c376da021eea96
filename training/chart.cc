// Line and stacked bar charts drawn into an Image: anti-aliased text (training/font.h), axes
// ticked at round numbers (1, 2 or 5 times a power of ten).
#include "training/chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string_view>

#include "meshcast/error.h"
#include "training/font.h"

namespace meshcast::training {
namespace {

using font::Face;

constexpr std::uint32_t kText = 0x222222, kAxis = 0x444444, kGrid = 0xe2e2e2;

// A UTF-8 continuation byte: skipped, so that one non-ASCII character draws one '?'.
bool continuation(char c) { return (static_cast<unsigned char>(c) & 0xc0) == 0x80; }

int text_width(std::string_view text, const Face& face) {
  int width = 0;
  for (char c : text)
    if (!continuation(c)) width += face.glyph(c).advance;
  return width;
}

// The rows a line of text takes: the font's ascent above the baseline and descent below it.
int line_height(const Face& face) { return face.ascent + face.descent; }

// Mixes `color` over the pixel by `alpha` (0 .. 255); outside the image, nothing.
void blend(Image& img, int x, int y, std::uint32_t color, int alpha) {
  if (x < 0 || y < 0 || x >= img.width || y >= img.height || alpha == 0) return;
  const std::uint32_t under = img.at(x, y);
  std::uint32_t mixed = 0;
  for (int shift = 16; shift >= 0; shift -= 8) {
    const std::uint32_t fg = color >> shift & 0xff, bg = under >> shift & 0xff;
    const auto a = static_cast<std::uint32_t>(alpha);
    mixed |= (fg * a + bg * (255 - a) + 127) / 255 << shift;
  }
  img.set(x, y, mixed);
}

// Draws `text` with the pen starting on the baseline at (x, y); `up`: rotated a quarter turn
// anticlockwise, reading upwards from (x, y) along the baseline column x, tops facing left.
void draw_text(Image& img, int x, int y, std::string_view text, const Face& face,
               std::uint32_t color, bool up = false) {
  int pen = 0;
  for (char c : text) {
    if (continuation(c)) continue;
    const font::Glyph& g = face.glyph(c);
    const std::uint8_t* coverage = face.coverage.data() + g.offset;
    for (int r = 0; r < g.height; ++r)
      for (int col = 0; col < g.width; ++col) {
        const int along = pen + g.left + col, across = g.top + r;
        const int alpha = coverage[r * g.width + col];
        if (up)
          blend(img, x + across, y - along, color, alpha);
        else
          blend(img, x + along, y + across, color, alpha);
      }
    pen += g.advance;
  }
}

// Inclusive pixel bounds.
struct Rect {
  int x0, y0, x1, y1;
  bool contains(int x, int y) const { return x >= x0 && x <= x1 && y >= y0 && y <= y1; }
};

// A size x size square around (x, y), clipped to `clip`.
void dot(Image& img, const Rect& clip, int x, int y, int size, std::uint32_t color) {
  for (int dy = 0; dy < size; ++dy)
    for (int dx = 0; dx < size; ++dx) {
      const int px = x - size / 2 + dx, py = y - size / 2 + dy;
      if (clip.contains(px, py)) img.set(px, py, color);
    }
}

// Bresenham's line with a square brush.
void draw_line(Image& img, const Rect& clip, int x0, int y0, int x1, int y1, int size,
               std::uint32_t color) {
  const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
  const int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
  for (int err = dx + dy;;) {
    dot(img, clip, x0, y0, size, color);
    if (x0 == x1 && y0 == y1) return;
    const int e2 = 2 * err;
    if (e2 >= dy) err += dy, x0 += sx;
    if (e2 <= dx) err += dx, y0 += sy;
  }
}

// Coordinates beyond this are skipped with NaN and infinities, so that spans stay finite.
bool usable(double v) { return std::isfinite(v) && std::abs(v) <= 1e300; }

// The extent of the values added; [0, 1] if none; padded if (nearly) constant.
struct Range {
  double lo = INFINITY, hi = -INFINITY;
  void add(double v) { lo = std::min(lo, v), hi = std::max(hi, v); }
  std::pair<double, double> padded() const {
    if (lo > hi) return {0, 1};
    if (hi - lo > 1e-9 * std::max(std::abs(lo), std::abs(hi))) return {lo, hi};
    const double pad = lo == 0 ? 1 : std::abs(lo) * 0.05;
    return {lo - pad, hi + pad};
  }
};

// Ticks at lo, lo + step, ..., hi.
struct Axis {
  double lo, hi, step;
  int intervals() const { return static_cast<int>(std::lround((hi - lo) / step)); }
  double tick(int i) const { return lo + i * step; }
};

// The smallest step of 1, 2 or 5 times a power of ten giving at most `max_intervals` over
// [lo, hi] (lo < hi), the range widened to multiples of it: nice_axis(0.3, 9.1, 5) = {0, 10, 2}.
Axis nice_axis(double lo, double hi, int max_intervals) {
  const double mag = std::pow(10.0, std::floor(std::log10((hi - lo) / max_intervals)));
  double step = 10 * mag;
  for (double m : {1.0, 2.0, 5.0})
    if ((hi - lo) / (m * mag) <= max_intervals + 1e-9) {
      step = m * mag;
      break;
    }
  return {std::floor(lo / step + 1e-9) * step, std::ceil(hi / step - 1e-9) * step, step};
}

// Just the digits the step needs: fixed point, or %g for very large or small numbers.
std::string tick_label(double v, const Axis& a) {
  if (std::abs(v) < a.step * 1e-6) v = 0;  // no "-0" or "1e-17" from rounding
  const int step_exp = static_cast<int>(std::floor(std::log10(a.step) + 1e-9));
  const double big = std::max(std::abs(a.lo), std::abs(a.hi));
  char buf[64];
  if (step_exp >= -4 && big < 1e7) {
    std::snprintf(buf, sizeof buf, "%.*f", std::max(0, -step_exp), v);
  } else {
    const int digits = static_cast<int>(std::floor(std::log10(big))) - step_exp + 1;
    std::snprintf(buf, sizeof buf, "%.*g", std::clamp(digits, 1, 15), v);
  }
  return buf;
}

// The pixel of v on an axis drawn from pixel p_lo (at a.lo) to p_hi (at a.hi).
int to_pixel(double v, const Axis& a, int p_lo, int p_hi) {
  const double t = std::clamp((v - a.lo) / (a.hi - a.lo), 0.0, 1.0);
  return p_lo + static_cast<int>(std::lround(t * (p_hi - p_lo)));
}

// Text centred on column x with its baseline on row y, moved inside the image if it would stick
// out.
void draw_centred(Image& img, int x, int y, const std::string& text, const Face& face) {
  const int w = text_width(text, face);
  draw_text(img, std::clamp(x - w / 2, 0, std::max(0, img.width - w)), y, text, face, kText);
}

struct LegendEntry {
  std::string name;
  std::uint32_t color;
};

// Margins, gaps, ticks and lines are `s` times their smallest size: 2 at 800x500. Text keeps its
// size: made for screens, it is as readable on a small chart as on a large one.
int layout_scale(int width, int height) { return std::max(1, std::min(width / 400, height / 250)); }

void check_chart_size(int width, int height) {
  if (width < 200 || height < 150)
    throw ValidationError("chart", "size " + std::to_string(width) + "x" + std::to_string(height) +
                                       " is below 200x150");
}

// Draws the title (in the label font if the title font is too wide) and the legend in centred
// rows; returns the first pixel row below them.
int draw_header(Image& img, int s, const std::string& title,
                const std::vector<LegendEntry>& legend) {
  const Face& label = font::kLabel;
  const int room = img.width - 10 * s;
  int y = 5 * s;
  if (!title.empty()) {
    const Face& face = text_width(title, font::kTitle) <= room ? font::kTitle : label;
    draw_centred(img, img.width / 2, y + face.ascent, title, face);
    y += line_height(face) + 2 * s;
  }
  // A swatch as tall as the capitals beside it, on the same baseline.
  const int swatch = label.cap + 1, gap = 3 * s, spacing = 12 * s;
  const auto item_width = [&](const LegendEntry& e) {
    return swatch + gap + text_width(e.name, label);
  };
  for (std::size_t begin = 0; begin < legend.size();) {
    std::size_t end = begin + 1;
    int row = item_width(legend[begin]);
    while (end < legend.size() && row + spacing + item_width(legend[end]) <= room)
      row += spacing + item_width(legend[end++]);
    int x = std::max(0, (img.width - row) / 2);
    const int baseline = y + label.ascent;
    for (std::size_t i = begin; i < end; ++i) {
      img.fill(x, baseline - swatch, x + swatch, baseline, legend[i].color);
      draw_text(img, x + swatch + gap, baseline, legend[i].name, label, kText);
      x += item_width(legend[i]) + spacing;
    }
    y += line_height(label) + s;
    begin = end;
  }
  return y;
}

// The y axis for a plot from row `top` to `bottom`: ticks at least 22 * s pixels apart.
Axis value_axis(double lo, double hi, int top, int bottom, int s) {
  return nice_axis(lo, hi, std::max(1, (bottom - top) / (22 * s)));
}

// The plot's left edge: room for the y label, the widest tick label and the ticks.
int plot_left(const Axis& y, const std::string& y_label, int s) {
  int widest = 0;
  for (int i = 0; i <= y.intervals(); ++i)
    widest = std::max(widest, text_width(tick_label(y.tick(i), y), font::kLabel));
  return 5 * s + (y_label.empty() ? 0 : line_height(font::kLabel) + 3 * s) + widest + 5 * s;
}

// Grid lines, ticks and labels of the y axis, and its label rotated along it.
void draw_y_axis(Image& img, int s, const Rect& plot, const Axis& y, const std::string& label) {
  const Face& label_face = font::kLabel;
  for (int i = 0; i <= y.intervals(); ++i) {
    const int py = to_pixel(y.tick(i), y, plot.y1, plot.y0);
    img.fill(plot.x0 + 1, py, plot.x1, py + 1, kGrid);
    img.fill(plot.x0 - 3 * s, py, plot.x0, py + 1, kAxis);
    const std::string text = tick_label(y.tick(i), y);
    // Digits centred on the tick.
    draw_text(img, plot.x0 - 5 * s - text_width(text, label_face), py + (label_face.cap + 1) / 2,
              text, label_face, kText);
  }
  draw_text(img, 5 * s + label_face.ascent, (plot.y0 + plot.y1 + text_width(label, label_face)) / 2,
            label, label_face, kText, true);
}

void draw_border(Image& img, const Rect& r) {
  img.fill(r.x0, r.y0, r.x1 + 1, r.y0 + 1, kAxis);
  img.fill(r.x0, r.y1, r.x1 + 1, r.y1 + 1, kAxis);
  img.fill(r.x0, r.y0, r.x0 + 1, r.y1 + 1, kAxis);
  img.fill(r.x1, r.y0, r.x1 + 1, r.y1 + 1, kAxis);
}

// The x axis over `width` pixels with as many ticks as fit with their labels a few glyphs apart.
Axis fit_x_axis(double lo, double hi, int width, int s) {
  const Face& face = font::kLabel;
  for (int n = std::max(1, width / (40 * s));; --n) {
    const Axis a = nice_axis(lo, hi, n);
    int widest = 0;
    for (int i = 0; i <= a.intervals(); ++i)
      widest = std::max(widest, text_width(tick_label(a.tick(i), a), face));
    if (n == 1 || width >= a.intervals() * (widest + 2 * face.size)) return a;
  }
}

}  // namespace

std::uint32_t chart_color(std::size_t i) {
  // Tableau 10, as matplotlib's default colour cycle.
  constexpr std::uint32_t kPalette[] = {0x1f77b4, 0xff7f0e, 0x2ca02c, 0xd62728, 0x9467bd,
                                        0x8c564b, 0xe377c2, 0x7f7f7f, 0xbcbd22, 0x17becf};
  return kPalette[i % std::size(kPalette)];
}

Image line_chart(const std::string& title, const std::string& x_label, const std::string& y_label,
                 const std::vector<Series>& series, int width, int height) {
  check_chart_size(width, height);
  for (const Series& se : series)
    if (se.x.size() != se.y.size())
      throw ValidationError("series", "'" + se.name + "' has " + std::to_string(se.x.size()) +
                                          " x values and " + std::to_string(se.y.size()) +
                                          " y values");
  const int s = layout_scale(width, height);
  Image img(width, height);
  std::vector<LegendEntry> legend;
  Range xr, yr;
  for (const Series& se : series) {
    if (!se.name.empty()) legend.push_back({se.name, se.color});
    for (std::size_t i = 0; i < se.x.size(); ++i)
      if (usable(se.x[i]) && usable(se.y[i])) xr.add(se.x[i]), yr.add(se.y[i]);
  }
  // Below the plot: ticks, their labels, the x label. A crowded legend may overlap the plot.
  const Face& face = font::kLabel;
  const int bottom = height - 1 - 5 * s - 5 * s - line_height(face) -
                     (x_label.empty() ? 0 : line_height(face) + 2 * s);
  const int top = std::min(draw_header(img, s, title, legend) + 4 * s, bottom - 20 * s);
  const auto [ylo, yhi] = yr.padded();
  const Axis ya = value_axis(ylo, yhi, top, bottom, s);
  const int right = width - 1 - 16 * s;
  const int left = std::min(plot_left(ya, y_label, s), right - 20 * s);
  const Rect plot{left, top, right, bottom};
  const auto [xlo, xhi] = xr.padded();
  const Axis xa = fit_x_axis(xlo, xhi, right - left, s);

  draw_y_axis(img, s, plot, ya, y_label);
  for (int i = 0; i <= xa.intervals(); ++i) {
    const int px = to_pixel(xa.tick(i), xa, left, right);
    img.fill(px, top + 1, px + 1, bottom, kGrid);
    img.fill(px, bottom + 1, px + 1, bottom + 1 + 3 * s, kAxis);
    draw_centred(img, px, bottom + 5 * s + face.ascent, tick_label(xa.tick(i), xa), face);
  }
  draw_centred(img, (left + right) / 2, bottom + 7 * s + line_height(face) + face.ascent, x_label,
               face);
  draw_border(img, plot);

  for (const Series& se : series) {
    // Consecutive usable points are joined; a run of one is a dot.
    int run = 0, lx = 0, ly = 0;
    for (std::size_t i = 0; i <= se.x.size(); ++i) {
      if (i == se.x.size() || !usable(se.x[i]) || !usable(se.y[i])) {
        if (run == 1) dot(img, plot, lx, ly, 2 * s + 1, se.color);
        run = 0;
        continue;
      }
      const int px = to_pixel(se.x[i], xa, left, right), py = to_pixel(se.y[i], ya, bottom, top);
      if (run++ > 0) draw_line(img, plot, lx, ly, px, py, s, se.color);
      lx = px, ly = py;
    }
  }
  return img;
}

Image stacked_bars(const std::string& title, const std::string& y_label,
                   const std::vector<std::string>& categories, const std::vector<Stack>& stacks,
                   int width, int height) {
  check_chart_size(width, height);
  for (const Stack& st : stacks)
    if (st.values.size() != categories.size())
      throw ValidationError("stacks", "'" + st.name + "' has " + std::to_string(st.values.size()) +
                                          " values for " + std::to_string(categories.size()) +
                                          " categories");
  const auto value = [](double v) { return usable(v) && v > 0 ? v : 0.0; };
  const int s = layout_scale(width, height);
  Image img(width, height);
  std::vector<LegendEntry> legend;
  for (const Stack& st : stacks)
    if (!st.name.empty()) legend.push_back({st.name, st.color});
  double highest = 0;
  for (std::size_t i = 0; i < categories.size(); ++i) {
    double total = 0;
    for (const Stack& st : stacks) total += value(st.values[i]);
    highest = std::max(highest, total);
  }
  const Face& face = font::kLabel;
  const int bottom = height - 1 - 5 * s - 2 * s - line_height(face);
  const int top = std::min(draw_header(img, s, title, legend) + 4 * s, bottom - 20 * s);
  const Axis ya = value_axis(0, highest > 0 ? highest : 1, top, bottom, s);
  const int right = width - 1 - 8 * s;
  const int left = std::min(plot_left(ya, y_label, s), right - 20 * s);
  const Rect plot{left, top, right, bottom};
  draw_y_axis(img, s, plot, ya, y_label);
  draw_border(img, plot);

  const auto n = static_cast<int>(categories.size());
  const int inner = right - left - 1;  // columns strictly between the borders
  int widest = 0;
  for (const std::string& c : categories) widest = std::max(widest, text_width(c, face));
  // Label every k-th bar, k round (1, 2, 5, 10, ...), so that labels keep a glyph apart.
  const auto need = std::int64_t{widest + face.size} * n / std::max(1, inner) + 1;
  std::int64_t k = 1;
  for (std::int64_t p = 1; k < need; p *= 10)
    for (int m : {1, 2, 5})
      if (k < need) k = m * p;
  const auto column = [&](std::int64_t i) {  // 64-bit: thousands of categories times pixels
    return left + 1 + static_cast<int>(i * inner / std::max(n, 1));
  };
  for (int i = 0; i < n; ++i) {
    int x0 = column(i), x1 = column(i + 1);
    const int gap = x1 - x0 >= 5 ? (x1 - x0) / 6 : 0;
    x0 += gap, x1 = std::max(x1 - gap, x0 + 1);
    // Segment rows are differences of rounded cumulative heights: each within a pixel of
    // proportional, and the stack exactly as tall as its total.
    double sum = 0;
    for (const Stack& st : stacks) {
      const double v = value(st.values[static_cast<std::size_t>(i)]);
      const int y_low = to_pixel(sum, ya, bottom, top), y_high = to_pixel(sum + v, ya, bottom, top);
      img.fill(x0, y_high, x1, y_low, st.color);
      sum += v;
    }
    if (i % k == 0)
      draw_centred(img, (x0 + x1 - 1) / 2, bottom + 2 * s + face.ascent,
                   categories[static_cast<std::size_t>(i)], face);
  }
  return img;
}

}  // namespace meshcast::training
