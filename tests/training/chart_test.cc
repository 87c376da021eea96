// Charts checked through their pixels: series and segment colours where expected, proportional
// bar heights, degenerate data drawn without failing, text anti-aliased and inside the image; the
// fonts' tables consistent. The PNG encoding is png_test.cc's.
#include "training/chart.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "meshcast/error.h"
#include "support/pixels.h"
#include "training/font.h"

namespace meshcast::training {
namespace {

using testing::pixels_of;

// Bars of one colour: for each group of adjacent columns whose longest vertical run of `color`
// is at least `min_run` pixels (longer than a legend swatch), that run and where it ends.
struct Bar {
  int x, run, bottom;
};
std::vector<Bar> bars_of(const Image& img, std::uint32_t color, int min_run = 20) {
  std::vector<Bar> out;
  bool in_bar = false;
  for (int x = 0; x < img.width; ++x) {
    int best = 0, best_end = 0;
    for (int y = 0, run = 0; y < img.height; ++y) {
      run = img.at(x, y) == color ? run + 1 : 0;
      if (run > best) best = run, best_end = y;
    }
    const bool bar = best >= min_run;
    if (bar && !in_bar) out.push_back({x, best, best_end});
    in_bar = bar;
  }
  return out;
}

constexpr std::uint32_t kRed = 0xd62728, kBlue = 0x1f77b4, kGreen = 0x2ca02c;

TEST(Chart, LineChartDrawsSeriesInsideWhiteBackground) {
  Series rising{"", {}, {}, kRed}, falling{"", {}, {}, kBlue};
  for (int i = 0; i <= 200; ++i) {
    rising.x.push_back(i);
    rising.y.push_back(0.05 * i);
    falling.x.push_back(i);
    falling.y.push_back(10 - 0.05 * i);
  }
  const Image img = line_chart("GPT: loss per step (train, held-out)", "step", "loss",
                               {rising, falling}, 640, 400);
  ASSERT_EQ(img.width, 640);
  ASSERT_EQ(img.height, 400);
  ASSERT_EQ(img.rgb.size(), 640u * 400u * 3u);
  for (auto [x, y] : {std::pair{0, 0}, {639, 0}, {0, 399}, {639, 399}})
    EXPECT_EQ(img.at(x, y), kWhite);
  ASSERT_GT(pixels_of(img, kRed), 200);
  ASSERT_GT(pixels_of(img, kBlue), 200);
  // Rising: the red column furthest left is lower (greater y) than the one furthest right.
  int left_x = img.width, right_x = -1, left_y = 0, right_y = 0;
  for (int x = 0; x < img.width; ++x)
    for (int y = 0; y < img.height; ++y)
      if (img.at(x, y) == kRed) {
        if (x < left_x) left_x = x, left_y = y;
        if (x >= right_x) right_x = x, right_y = y;
      }
  EXPECT_GT(left_y, right_y + 150);
  EXPECT_GT(right_x, left_x + 300);
  EXPECT_GT(pixels_of(img, 0x222222), 100) << "text";
}

TEST(Chart, LineChartLegendShowsNamedSeries) {
  const Series named{"train", {0, 1}, {NAN, NAN}, kGreen};
  EXPECT_GT(pixels_of(line_chart("t", "x", "y", {named}), kGreen), 0);
  Series unnamed = named;
  unnamed.name.clear();
  EXPECT_EQ(pixels_of(line_chart("t", "x", "y", {unnamed}), kGreen), 0);
}

TEST(Chart, LineChartHandlesDegenerateData) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const auto drawn = [](const std::vector<Series>& s) {
    const Image img = line_chart("degenerate", "x", "y", s, 400, 300);
    EXPECT_EQ(img.rgb.size(), 400u * 300u * 3u);
    return img;
  };
  drawn({});
  drawn({{"empty", {}, {}, kRed}});
  EXPECT_GT(pixels_of(drawn({{"", {3}, {7}, kRed}}), kRed), 0) << "a single point is a dot";
  EXPECT_GT(pixels_of(drawn({{"", {1, 2, 3, 4, 5}, {nan, 2, inf, 1e308, -inf}, kRed}}), kRed), 0);
  EXPECT_EQ(pixels_of(drawn({{"", {nan, inf}, {1, 2}, kRed}}), kRed), 0);
  EXPECT_GT(pixels_of(drawn({{"", {0, 0, 0}, {0, 0, 0}, kRed}}), kRed), 0);
  drawn({{"", {-1e300, 1e300}, {-1e300, 1e300}, kRed}});
  drawn({{"", {1, 2}, {1e-300, 2e-300}, kRed}});

  // Constant y: a horizontal line, two pixels thick at this size.
  const Image flat = drawn({{"", {0, 1, 2, 3}, {5, 5, 5, 5}, kRed}});
  int top = flat.height, bottom = -1;
  for (int y = 0; y < flat.height; ++y)
    for (int x = 0; x < flat.width; ++x)
      if (flat.at(x, y) == kRed) top = std::min(top, y), bottom = std::max(bottom, y);
  EXPECT_LE(bottom - top, 2);

  Series many{"noisy", {}, {}, kBlue};
  for (int i = 0; i < 20000; ++i) {
    many.x.push_back(i);
    many.y.push_back(std::sin(i * 0.37) * 100 + (i % 997 == 0 ? nan : 0));
  }
  EXPECT_GT(pixels_of(line_chart("many", "step", "y", {many}), kBlue), 10000);
}

// The rows and columns (inclusive) holding pixels other than white in rows [y0, y1).
struct Ink {
  int x0 = 1 << 30, y0 = 1 << 30, x1 = -1, y1 = -1;
};
Ink ink(const Image& img, int y0, int y1) {
  Ink box;
  for (int y = y0; y < y1; ++y)
    for (int x = 0; x < img.width; ++x)
      if (img.at(x, y) != kWhite)
        box = {std::min(box.x0, x), std::min(box.y0, y), std::max(box.x1, x), std::max(box.y1, y)};
  return box;
}

TEST(Chart, TextIsAntiAliased) {
  const Image img = line_chart("Loss per step (1f1b)", "step", "loss", {}, 800, 500);
  // Ink in 0x222222, edges blended towards white: greys strictly between.
  int edges = 0;
  for (int y = 0; y < img.height; ++y)
    for (int x = 0; x < img.width; ++x) {
      const std::uint32_t c = img.at(x, y);
      const std::uint32_t r = c >> 16, g = c >> 8 & 0xff, b = c & 0xff;
      edges += r == g && g == b && r > 0x22 && r < 0xe2;  // lighter than the text, darker than grid
    }
  EXPECT_GT(edges, 200);
  EXPECT_GT(pixels_of(img, 0x222222), 100);
}

TEST(Chart, TitleIsCentredAndFits) {
  // Nothing but the title in the top rows: its ink centred, in the title font while it fits,
  // else in the smaller label font.
  for (const auto& [title, width] : {std::pair{std::string("Loss"), 800},
                                     {std::string(60, 'W'), 800},
                                     {std::string(60, 'W'), 1200}}) {
    const Image img = line_chart(title, "", "", {}, width, 500);
    const Ink box = ink(img, 0, 30);
    ASSERT_GE(box.x1, 0) << title;
    EXPECT_NEAR(box.x0 + box.x1, width, 4) << title;
    int title_width = 0;
    for (char c : title) title_width += font::kTitle.glyph(c).advance;
    const font::Face& face = title_width <= width - 20 ? font::kTitle : font::kLabel;
    EXPECT_NEAR(box.y1 - box.y0 + 1, face.cap, 1) << title;
  }
}

TEST(Chart, NonAsciiDrawsOneQuestionMarkPerCharacter) {
  const Image accented = line_chart("d\xc3\xa9j\xc3\xa0 vu \xe2\x9c\x93", "x", "y", {});
  const Image plain = line_chart("d?j? vu ?", "x", "y", {});
  EXPECT_TRUE(accented.rgb == plain.rgb);
}

TEST(Chart, FontTablesAreConsistent) {
  for (const font::Face* face : {&font::kLabel, &font::kTitle}) {
    std::uint32_t offset = 0;
    for (char c = font::kFirst; c <= font::kLast; ++c) {
      const font::Glyph& g = face->glyph(c);
      EXPECT_EQ(g.offset, offset) << c;  // packed in order
      offset += std::uint32_t{g.width} * g.height;
      EXPECT_GT(g.advance, 0) << c;
      EXPECT_EQ(c == ' ', g.width * g.height == 0) << c;
      if (g.width > 0) {
        EXPECT_GE(g.top, -face->ascent) << c;
        EXPECT_LE(g.top + g.height, face->descent) << c;
      }
    }
    EXPECT_EQ(offset, face->coverage.size());
    // Tick labels line up: every digit advances alike.
    for (char c = '0'; c <= '9'; ++c) EXPECT_EQ(face->glyph(c).advance, face->glyph('0').advance);
    EXPECT_EQ(-face->glyph('H').top, face->cap);
    EXPECT_EQ(face->glyph('H').height, face->cap);
    EXPECT_EQ(&face->glyph('\x7f'), &face->glyph('?'));
    EXPECT_EQ(&face->glyph('\xc3'), &face->glyph('?'));
  }
  EXPECT_LT(font::kLabel.size, font::kTitle.size);
}

TEST(Chart, ChartsRejectBadInput) {
  try {
    line_chart("t", "x", "y", {{"loss", {1, 2}, {1}, kRed}});
    ADD_FAILURE() << "mismatched series accepted";
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "series");
  }
  try {
    stacked_bars("t", "y", {"a", "b"}, {{"compute", kRed, {1}}});
    ADD_FAILURE() << "mismatched stack accepted";
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "stacks");
  }
  try {
    line_chart("t", "x", "y", {}, 199, 500);
    ADD_FAILURE() << "tiny chart accepted";
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "chart");
  }
  EXPECT_THROW(stacked_bars("t", "y", {}, {}, 800, 149), ValidationError);
}

TEST(Chart, StackedBarsSegmentsAreProportional) {
  const Image one =
      stacked_bars("step time", "ms", {"step 1"},
                   {{"compute", kBlue, {1}}, {"exposed", kRed, {2}}, {"bubble", kGreen, {3}}});
  const std::vector<Bar> b = bars_of(one, kBlue), r = bars_of(one, kRed), g = bars_of(one, kGreen);
  ASSERT_EQ(b.size(), 1u);
  ASSERT_EQ(r.size(), 1u);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_GT(b[0].run, 40);
  EXPECT_NEAR(r[0].run, 2 * b[0].run, 2);
  EXPECT_NEAR(g[0].run, 3 * b[0].run, 3);
  // Stacked from the bottom up in order, touching.
  EXPECT_EQ(r[0].bottom, b[0].bottom - b[0].run);
  EXPECT_EQ(g[0].bottom, r[0].bottom - r[0].run);
  EXPECT_EQ(b[0].x, r[0].x);

  // Two categories: compute {1, 3}, exposed {1, 0}; bad values count as 0.
  const Image two = stacked_bars(
      "t", "ms", {"a", "b"},
      {{"compute", kBlue, {1, 3}}, {"exposed", kRed, {1, -2}}, {"nan", kGreen, {NAN, INFINITY}}});
  const std::vector<Bar> b2 = bars_of(two, kBlue), r2 = bars_of(two, kRed);
  ASSERT_EQ(b2.size(), 2u);
  ASSERT_EQ(r2.size(), 1u);
  EXPECT_LT(b2[0].x, b2[1].x);
  EXPECT_NEAR(b2[1].run, 3 * b2[0].run, 2);
  EXPECT_NEAR(r2[0].run, b2[0].run, 1);
  EXPECT_EQ(r2[0].x, b2[0].x);
  EXPECT_TRUE(bars_of(two, kGreen).empty());
  EXPECT_GT(pixels_of(two, kGreen), 0) << "still in the legend";
}

TEST(Chart, StackedBarsHandleManyAndNoCategories) {
  std::vector<std::string> steps;
  Stack compute{"compute", kBlue, {}}, bubble{"bubble", kRed, {}};
  for (int i = 0; i < 3000; ++i) {
    steps.push_back(std::to_string(i));
    compute.values.push_back(10 + i % 7);
    bubble.values.push_back(i % 5);
  }
  const Image many = stacked_bars("per step", "ms", steps, {compute, bubble});
  EXPECT_GT(pixels_of(many, kBlue), 10000);
  EXPECT_GT(pixels_of(many, kRed), 1000);
  const Image none = stacked_bars("nothing yet", "ms", {}, {{"compute", kBlue, {}}});
  EXPECT_EQ(none.at(0, 0), kWhite);
  EXPECT_TRUE(bars_of(none, kBlue).empty());
}

}  // namespace
}  // namespace meshcast::training
