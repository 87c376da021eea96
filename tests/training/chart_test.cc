// PNG encoding checked against the format, with the test's own CRC-32, Adler-32 and stored-block
// decoder (and CPython's zlib where python3 is present); charts checked through their pixels:
// series and segment colours where expected, proportional bar heights, degenerate data drawn
// without failing; write_png's errors and atomic replacement.
#include "meshcast/training/chart.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "meshcast/error.h"

namespace meshcast::training {
namespace {

using Bytes = std::vector<std::uint8_t>;

// Bitwise CRC-32 (reflected polynomial 0xedb88320), independent of the encoder's table.
std::uint32_t ref_crc32(const Bytes& data) {
  std::uint32_t c = 0xffffffffu;
  for (std::uint8_t b : data) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1)));
  }
  return ~c;
}

std::uint32_t ref_adler32(const Bytes& data) {
  std::uint64_t a = 1, b = 0;
  for (std::uint8_t v : data) {
    a = (a + v) % 65521;
    b = (b + a) % 65521;
  }
  return static_cast<std::uint32_t>(b << 16 | a);
}

Bytes bytes_of(const std::string& s) { return Bytes(s.begin(), s.end()); }

std::uint32_t be32(const Bytes& d, std::size_t at) {
  return std::uint32_t{d[at]} << 24 | std::uint32_t{d[at + 1]} << 16 |
         std::uint32_t{d[at + 2]} << 8 | d[at + 3];
}
void put_be32(Bytes& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(v >> shift));
}

struct Chunk {
  std::string type;
  Bytes data;
};

// The chunks after the signature, each CRC checked.
std::vector<Chunk> read_chunks(const Bytes& png) {
  const Bytes signature{0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  EXPECT_EQ(Bytes(png.begin(), png.begin() + 8), signature);
  std::vector<Chunk> out;
  for (std::size_t at = 8; at < png.size();) {
    const std::uint32_t n = be32(png, at);
    EXPECT_LE(at + 12 + n, png.size());
    if (at + 12 + n > png.size()) break;
    const Bytes typed(png.begin() + static_cast<std::ptrdiff_t>(at + 4),
                      png.begin() + static_cast<std::ptrdiff_t>(at + 8 + n));
    EXPECT_EQ(be32(png, at + 8 + n), ref_crc32(typed)) << "chunk at " << at;
    out.push_back(
        {std::string(typed.begin(), typed.begin() + 4), Bytes(typed.begin() + 4, typed.end())});
    at += 12 + n;
  }
  return out;
}

// Inflates a zlib stream made only of stored blocks; checks the header, every LEN/NLEN pair,
// BFINAL on the last block only, and the Adler-32. `blocks` receives the block count.
Bytes inflate_stored(const Bytes& z, int* blocks) {
  EXPECT_GE(z.size(), 2u + 5u + 4u);
  EXPECT_EQ(z[0], 0x78);
  EXPECT_EQ(z[1], 0x01);
  EXPECT_EQ((z[0] * 256 + z[1]) % 31, 0);
  Bytes out;
  *blocks = 0;
  std::size_t at = 2;
  for (bool last = false; !last;) {
    if (at + 5 > z.size()) {
      ADD_FAILURE() << "stream ends inside a block header";
      return out;
    }
    last = z[at] & 1;
    EXPECT_EQ(z[at] >> 1, 0) << "BTYPE must be 00 (stored), padding 0";
    const unsigned len = z[at + 1] | z[at + 2] << 8, nlen = z[at + 3] | z[at + 4] << 8;
    EXPECT_EQ(len ^ 0xffffu, nlen);
    at += 5;
    if (at + len > z.size()) {
      ADD_FAILURE() << "block runs past the stream";
      return out;
    }
    out.insert(out.end(), z.begin() + static_cast<std::ptrdiff_t>(at),
               z.begin() + static_cast<std::ptrdiff_t>(at + len));
    at += len;
    ++*blocks;
    if (!last) {
      EXPECT_EQ(len, 65535u) << "only the last block may be short";
    }
  }
  EXPECT_EQ(at + 4, z.size());
  EXPECT_EQ(be32(z, at), ref_adler32(out));
  return out;
}

// Filter byte 0 then the row's RGB, per row: what the PNG must carry.
Bytes scanlines(const Image& img) {
  Bytes raw;
  for (int y = 0; y < img.height; ++y) {
    raw.push_back(0);
    for (int x = 0; x < img.width; ++x) {
      const std::uint32_t c = img.at(x, y);
      raw.insert(raw.end(), {static_cast<std::uint8_t>(c >> 16), static_cast<std::uint8_t>(c >> 8),
                             static_cast<std::uint8_t>(c)});
    }
  }
  return raw;
}

Image patterned(int w, int h) {
  Image img(w, h);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      img.set(x, y, static_cast<std::uint32_t>(x * 2654435761u ^ y * 40503u) & 0xffffff);
  return img;
}

Bytes read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

// A fresh directory, removed at the end of the test.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "chart_test.XXXXXX").string();
    path = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(path))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
};

int count(const Image& img, std::uint32_t color) {
  int n = 0;
  for (int y = 0; y < img.height; ++y)
    for (int x = 0; x < img.width; ++x) n += img.at(x, y) == color;
  return n;
}

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

TEST(Chart, ReferenceChecksumsMatchKnownValues) {
  EXPECT_EQ(ref_crc32(bytes_of("123456789")), 0xcbf43926u);
  EXPECT_EQ(ref_crc32(bytes_of("IEND")), 0xae426082u);
  EXPECT_EQ(ref_adler32(bytes_of("Wikipedia")), 0x11e60398u);
}

TEST(Chart, EncodesSmallImageByteForByte) {
  Image img(3, 2);
  const std::uint32_t px[2][3] = {{0xff0000, 0x00ff00, 0x0000ff}, {0x123456, 0x000000, 0xfedcba}};
  for (int y = 0; y < 2; ++y)
    for (int x = 0; x < 3; ++x) img.set(x, y, px[y][x]);

  const Bytes raw{0, 0xff, 0,    0,    0, 0xff, 0, 0,    0,    0xff,
                  0, 0x12, 0x34, 0x56, 0, 0,    0, 0xfe, 0xdc, 0xba};
  Bytes expected{0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  const auto chunk = [&](const std::string& type, const Bytes& data) {
    put_be32(expected, static_cast<std::uint32_t>(data.size()));
    Bytes typed = bytes_of(type);
    typed.insert(typed.end(), data.begin(), data.end());
    expected.insert(expected.end(), typed.begin(), typed.end());
    put_be32(expected, ref_crc32(typed));
  };
  chunk("IHDR", {0, 0, 0, 3, 0, 0, 0, 2, 8, 2, 0, 0, 0});
  Bytes z{0x78, 0x01, 0x01, 20, 0, 0xff - 20, 0xff};  // one final stored block of 20 bytes
  z.insert(z.end(), raw.begin(), raw.end());
  put_be32(z, ref_adler32(raw));
  chunk("IDAT", z);
  chunk("IEND", {});

  const Bytes png = encode_png(img);
  EXPECT_EQ(png, expected);
  ASSERT_EQ(png.size(), 8u + 25u + (12u + 31u) + 12u);
  EXPECT_EQ(be32(png, 8), 13u);  // IHDR length
  EXPECT_EQ(std::string(png.begin() + 12, png.begin() + 16), "IHDR");
  EXPECT_EQ(be32(png, 16), 3u);
  EXPECT_EQ(be32(png, 20), 2u);
  EXPECT_EQ(Bytes(png.begin() + 24, png.begin() + 29), (Bytes{8, 2, 0, 0, 0}));
  EXPECT_EQ(Bytes(png.end() - 12, png.end()),
            (Bytes{0, 0, 0, 0, 'I', 'E', 'N', 'D', 0xae, 0x42, 0x60, 0x82}));
}

TEST(Chart, LargeImageDecodesFromSeveralStoredBlocks) {
  const Image img = patterned(800, 500);
  const std::vector<Chunk> chunks = read_chunks(encode_png(img));
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0].type, "IHDR");
  EXPECT_EQ(chunks[1].type, "IDAT");
  EXPECT_EQ(chunks[2].type, "IEND");
  int blocks = 0;
  const Bytes raw = inflate_stored(chunks[1].data, &blocks);
  const std::size_t size = 500 * (1 + 3 * 800);
  EXPECT_EQ(blocks, static_cast<int>((size + 65534) / 65535));
  EXPECT_GT(blocks, 1);
  EXPECT_TRUE(raw == scanlines(img));
}

TEST(Chart, BlockBoundariesAtExactMultiples) {
  // 65535 = 15 rows of 1 + 3 * 1456 bytes: the data ends exactly at a block boundary.
  for (int rows : {15, 30}) {
    const Image img = patterned(1456, rows);
    const std::vector<Chunk> chunks = read_chunks(encode_png(img));
    ASSERT_EQ(chunks.size(), 3u);
    int blocks = 0;
    EXPECT_TRUE(inflate_stored(chunks[1].data, &blocks) == scanlines(img));
    EXPECT_EQ(blocks, rows / 15);
  }
}

TEST(Chart, PythonZlibAgrees) {
  if (std::system("python3 -c 'import zlib' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "no python3 with zlib";
  const TempDir dir;
  const Image img = patterned(300, 200);
  write_png((dir.path / "a.png").string(), img);
  std::ofstream(dir.path / "check.py") << R"(import struct, sys, zlib
d = open(sys.argv[1], 'rb').read()
i, z = 8, b''
while i < len(d):
    n, = struct.unpack('>I', d[i:i + 4])
    assert struct.unpack('>I', d[i + 8 + n:i + 12 + n])[0] == zlib.crc32(d[i + 4:i + 8 + n])
    if d[i + 4:i + 8] == b'IDAT':
        z += d[i + 8:i + 8 + n]
    i += 12 + n
open(sys.argv[2], 'wb').write(zlib.decompress(z))
)";
  const std::string cmd = "python3 " + (dir.path / "check.py").string() + " " +
                          (dir.path / "a.png").string() + " " + (dir.path / "raw").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  EXPECT_TRUE(read_file(dir.path / "raw") == scanlines(img));
}

TEST(Chart, ImageClipsAndRejectsBadSizes) {
  Image img(4, 3, 0x102030);
  EXPECT_EQ(img.rgb.size(), 36u);
  EXPECT_EQ(img.at(3, 2), 0x102030u);
  img.set(-1, 0, 0);
  img.set(4, 0, 0);
  img.set(0, 3, 0);
  img.fill(-5, -5, 2, 2, 0xabcdef);
  img.fill(3, 2, 100, 100, 0x010203);
  EXPECT_EQ(count(img, 0xabcdef), 4);
  EXPECT_EQ(count(img, 0x010203), 1);
  EXPECT_EQ(count(img, 0x102030), 12 - 5);
  EXPECT_THROW(img.at(4, 0), std::out_of_range);
  for (auto [w, h] : {std::pair{0, 1}, {1, 0}, {-3, 4}, {16385, 1}}) {
    try {
      Image bad(w, h);
      ADD_FAILURE() << w << "x" << h << " accepted";
    } catch (const ValidationError& e) {
      EXPECT_EQ(e.field(), "image");
    }
  }
  img.rgb.pop_back();
  EXPECT_THROW(encode_png(img), ValidationError);
}

TEST(Chart, WritePngReplacesAtomically) {
  const TempDir dir;
  const std::string path = (dir.path / "loss.png").string();
  std::ofstream(path) << "old contents";
  const Image img = patterned(40, 30);
  write_png(path, img);
  EXPECT_TRUE(read_file(path) == encode_png(img));
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"loss.png"});
}

TEST(Chart, WritePngFailuresThrowIoErrorNamingTheField) {
  const TempDir dir;
  const Image img(2, 2);
  const std::string missing = (dir.path / "no-such-dir" / "loss.png").string();
  try {
    write_png(missing, img, "loss_png");
    ADD_FAILURE() << "wrote into a missing directory";
  } catch (const IoError& e) {
    EXPECT_EQ(e.field(), "loss_png");
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  // The temporary file can be made, the rename onto a directory cannot: it must not linger.
  std::filesystem::create_directory(dir.path / "taken");
  try {
    write_png((dir.path / "taken").string(), img, "breakdown_png");
    ADD_FAILURE() << "renamed over a directory";
  } catch (const IoError& e) {
    EXPECT_EQ(e.field(), "breakdown_png");
  }
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"taken"});
}

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
  ASSERT_GT(count(img, kRed), 200);
  ASSERT_GT(count(img, kBlue), 200);
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
  EXPECT_GT(count(img, 0x222222), 100) << "text";
}

TEST(Chart, LineChartLegendShowsNamedSeries) {
  const Series named{"train", {0, 1}, {NAN, NAN}, kGreen};
  EXPECT_GT(count(line_chart("t", "x", "y", {named}), kGreen), 0);
  Series unnamed = named;
  unnamed.name.clear();
  EXPECT_EQ(count(line_chart("t", "x", "y", {unnamed}), kGreen), 0);
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
  EXPECT_GT(count(drawn({{"", {3}, {7}, kRed}}), kRed), 0) << "a single point is a dot";
  EXPECT_GT(count(drawn({{"", {1, 2, 3, 4, 5}, {nan, 2, inf, 1e308, -inf}, kRed}}), kRed), 0);
  EXPECT_EQ(count(drawn({{"", {nan, inf}, {1, 2}, kRed}}), kRed), 0);
  EXPECT_GT(count(drawn({{"", {0, 0, 0}, {0, 0, 0}, kRed}}), kRed), 0);
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
  EXPECT_GT(count(line_chart("many", "step", "y", {many}), kBlue), 10000);
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
  EXPECT_GT(count(two, kGreen), 0) << "still in the legend";
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
  EXPECT_GT(count(many, kBlue), 10000);
  EXPECT_GT(count(many, kRed), 1000);
  const Image none = stacked_bars("nothing yet", "ms", {}, {{"compute", kBlue, {}}});
  EXPECT_EQ(none.at(0, 0), kWhite);
  EXPECT_TRUE(bars_of(none, kBlue).empty());
}

}  // namespace
}  // namespace meshcast::training
