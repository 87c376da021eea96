// Charts of a training run (loss curves, step-time breakdowns) written as PNG files: a PNG
// encoder over zlib and a small renderer with built-in anti-aliased fonts (DejaVu Sans, rendered
// into the library: no font file or font library at run time).
//
// Example:
//   Series train{"train", {0, 1, 2}, {4.1, 3.2, 2.9}, chart_color(0)};
//   write_png("loss.png", line_chart("GPT: loss per step", "step", "loss", {train}));
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace meshcast::training {

// Colours are 0xRRGGBB.
inline constexpr std::uint32_t kWhite = 0xffffff;

// The i-th colour of a qualitative palette of 10 (cycles): distinct series colours for callers.
std::uint32_t chart_color(std::size_t i);

// An RGB image: `rgb` is row-major, 3 bytes per pixel (red, green, blue), top row first.
struct Image {
  int width = 0;
  int height = 0;
  std::vector<std::uint8_t> rgb;

  Image() = default;
  // Filled with `color`. Throws ValidationError("image") unless 1 <= width, height <= 16384.
  Image(int width, int height, std::uint32_t color = kWhite);

  // Throws std::out_of_range outside the image.
  std::uint32_t at(int x, int y) const;
  // Pixels outside the image are ignored, so that drawing clips at the borders.
  void set(int x, int y, std::uint32_t color);
  // The rectangle [x0, x1) x [y0, y1), clipped to the image.
  void fill(int x0, int y0, int x1, int y1, std::uint32_t color);
};

// The PNG file of `image`: 8-bit RGB, no interlace; each row filtered by the type (None, Sub,
// Up, Average, Paeth) whose bytes have the least sum of absolute values (as signed), ties to the
// lower type; one IDAT holding the rows deflated by zlib at its best compression; every chunk
// ends with its CRC-32. An 800x500 chart takes some 15 KB. Throws ValidationError("image") if
// the dimensions are out of range or rgb.size() != 3 * width * height.
std::vector<std::uint8_t> encode_png(const Image& image);

// Writes encode_png(image) to `path` atomically: into a temporary file beside it, then renamed
// over it, so that a reader never sees a partial file. Throws IoError(field) if it cannot, and
// leaves no temporary file behind.
void write_png(const std::string& path, const Image& image, const std::string& field = "png");

// Text in charts is DejaVu Sans, anti-aliased: 13 px, titles 17 px (13 px if too wide), whatever
// the image's size. It covers printable ASCII; any other character (a UTF-8 sequence counts as
// one) is drawn as '?'.

// One line of a line chart: point i is (x[i], y[i]). Points with a NaN, infinite or huge
// (|v| > 1e300) coordinate are skipped and break the line; an isolated point is drawn as a dot.
// A series with an empty name is left out of the legend.
struct Series {
  std::string name;
  std::vector<double> x, y;
  std::uint32_t color = 0;
};

// A line chart: the title on top, a legend below it, then the plot with both axes ticked at
// round numbers and labelled, light grid lines, and each series as a polyline. The axes span the
// finite points (a constant range is padded; no points at all gives [0, 1]). Margins, ticks and
// lines scale with the image (2x at 800x500). Throws ValidationError("series") if a series' x and y
// differ in length, ValidationError("chart") if width < 200 or height < 150.
Image line_chart(const std::string& title, const std::string& x_label, const std::string& y_label,
                 const std::vector<Series>& series, int width = 800, int height = 500);

// One segment kind of a stacked bar chart: values[i] is its height in category i. Negative and
// non-finite values count as 0.
struct Stack {
  std::string name;
  std::uint32_t color = 0;
  std::vector<double> values;
};

// A stacked bar chart: one bar per category, labelled below it (some labels are left out when
// they would overlap), made of one segment per stack from the bottom up, heights on a y axis
// from 0; a legend of the stacks under the title. Throws ValidationError("stacks") if a stack
// does not have one value per category, ValidationError("chart") as line_chart.
Image stacked_bars(const std::string& title, const std::string& y_label,
                   const std::vector<std::string>& categories, const std::vector<Stack>& stacks,
                   int width = 800, int height = 500);

}  // namespace meshcast::training
