// The PNG encoder checked against the format: chunks and their CRC-32s (the test's own bitwise
// CRC), the IDAT inflated by zlib's uncompress (which checks the stream's Adler-32), every row's
// filter undone by the test's own code to give back the pixels, each row's filter the one with
// the least sum of absolute differences; size on charts; Pillow decoding the file to the same
// pixels where python3 has it. Then Image's clipping and write_png's errors and atomic
// replacement.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "meshcast/error.h"
#include "support/pixels.h"
#include "support/temp_dir.h"
#include "training/chart.h"

namespace meshcast::training {
namespace {

using Bytes = std::vector<std::uint8_t>;

// Bitwise CRC-32 (reflected polynomial 0xedb88320), independent of zlib's tables.
std::uint32_t ref_crc32(const Bytes& data) {
  std::uint32_t c = 0xffffffffu;
  for (std::uint8_t b : data) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1)));
  }
  return ~c;
}

Bytes bytes_of(const std::string& s) { return Bytes(s.begin(), s.end()); }

std::uint32_t be32(const Bytes& d, std::size_t at) {
  return std::uint32_t{d[at]} << 24 | std::uint32_t{d[at + 1]} << 16 |
         std::uint32_t{d[at + 2]} << 8 | d[at + 3];
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

// The filtered scanlines of an encoded RGB image of height h: IHDR, one IDAT, IEND, the IDAT a
// zlib stream that inflates to exactly h rows of 1 + 3 * w bytes.
Bytes scanlines_of(const Bytes& png, int w, int h) {
  const std::vector<Chunk> chunks = read_chunks(png);
  EXPECT_EQ(chunks.size(), 3u);
  if (chunks.size() != 3) return {};
  EXPECT_EQ(chunks[0].type, "IHDR");
  EXPECT_EQ(chunks[1].type, "IDAT");
  EXPECT_EQ(chunks[2].type, "IEND");
  EXPECT_TRUE(chunks[2].data.empty());
  Bytes ihdr;
  for (int v : {w, h})
    for (int shift = 24; shift >= 0; shift -= 8)
      ihdr.push_back(static_cast<std::uint8_t>(v >> shift));
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});  // 8-bit RGB, deflate, adaptive filters, no interlace
  EXPECT_EQ(chunks[0].data, ihdr);
  const Bytes& z = chunks[1].data;
  EXPECT_EQ(z[0] & 0x0f, 8) << "deflate";
  EXPECT_EQ((z[0] * 256 + z[1]) % 31, 0);
  // One byte more than expected: a stream that inflates to more fails with Z_BUF_ERROR.
  Bytes raw(static_cast<std::size_t>(h) * (1 + 3 * static_cast<std::size_t>(w)) + 1);
  uLongf size = raw.size();
  EXPECT_EQ(::uncompress(raw.data(), &size, z.data(), z.size()), Z_OK);
  EXPECT_EQ(size, raw.size() - 1);
  raw.resize(size);
  return raw;
}

int paeth(int a, int b, int c) {
  const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
  return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

// What filter `type` predicts for byte i of a row from the (unfiltered) row so far and the one
// above.
int predict(int type, const std::uint8_t* row, const std::uint8_t* up, std::size_t i) {
  const int a = i >= 3 ? row[i - 3] : 0, b = up[i], c = i >= 3 ? up[i - 3] : 0;
  switch (type) {
    case 0:
      return 0;
    case 1:
      return a;
    case 2:
      return b;
    case 3:
      return (a + b) / 2;
    default:
      return paeth(a, b, c);
  }
}

// Undoes the filters (PNG spec, section 9): the RGB pixels, and each row's filter type.
Bytes unfilter(const Bytes& scanlines, int w, int h, std::vector<int>* types) {
  const std::size_t n = 3 * static_cast<std::size_t>(w);
  Bytes rgb(n * static_cast<std::size_t>(h));
  const Bytes zeros(n, 0);
  for (std::size_t y = 0; y < static_cast<std::size_t>(h); ++y) {
    const std::uint8_t* in = scanlines.data() + y * (n + 1);
    EXPECT_LE(in[0], 4) << "row " << y;
    types->push_back(in[0]);
    std::uint8_t* row = rgb.data() + y * n;
    const std::uint8_t* up = y == 0 ? zeros.data() : row - n;
    for (std::size_t i = 0; i < n; ++i)
      row[i] = static_cast<std::uint8_t>(in[1 + i] + predict(in[0], row, up, i));
  }
  return rgb;
}

// The sum of |filtered byte as signed| of each filter type for row y.
std::vector<long> filter_costs(const Image& img, int y) {
  const std::size_t n = 3 * static_cast<std::size_t>(img.width);
  const Bytes zeros(n, 0);
  const std::uint8_t* row = img.rgb.data() + static_cast<std::size_t>(y) * n;
  const std::uint8_t* up = y == 0 ? zeros.data() : row - n;
  std::vector<long> costs;
  for (int type = 0; type <= 4; ++type) {
    long cost = 0;
    for (std::size_t i = 0; i < n; ++i)
      cost += std::abs(static_cast<std::int8_t>(row[i] - predict(type, row, up, i)));
    costs.push_back(cost);
  }
  return costs;
}

// Encodes `img` and checks that the file gives back its pixels through the filters it names;
// returns the filter type of each row.
std::vector<int> round_trip(const Image& img) {
  const Bytes raw = scanlines_of(encode_png(img), img.width, img.height);
  std::vector<int> types;
  if (raw.empty()) return types;
  EXPECT_TRUE(unfilter(raw, img.width, img.height, &types) == img.rgb);
  return types;
}

Image patterned(int w, int h) {
  Image img(w, h);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      img.set(x, y, static_cast<std::uint32_t>(x * 2654435761u ^ y * 40503u) & 0xffffff);
  return img;
}

// Smooth in both directions, with noise: every filter type has rows where it is best.
Image mixed(int w, int h) {
  Image img(w, h);
  std::uint32_t state = 12345;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      state = state * 1664525u + 1013904223u;
      const int band = y / 8 % 5;
      const int v = band == 0   ? x * 3 + y
                    : band == 1 ? y * 5
                    : band == 2 ? (x + y) * 2 + static_cast<int>(state >> 29)
                    : band == 3 ? static_cast<int>(state >> 24)
                                : (x / 4 % 2) * 3;
      img.set(x, y, static_cast<std::uint32_t>(v & 0xff) * 0x010101u);
    }
  return img;
}

Image chart() {
  Series train{"train", {}, {}, chart_color(0)}, held{"held-out", {}, {}, chart_color(1)};
  for (int i = 0; i <= 300; ++i) {
    train.x.push_back(i);
    train.y.push_back(5 * std::exp(-i / 80.0) + 0.3 * std::sin(i * 0.7) + 1);
    held.x.push_back(i);
    held.y.push_back(5 * std::exp(-i / 80.0) + 1.1);
  }
  return line_chart("GPT: loss per step (dp=2, tp=2, 1f1b)", "step", "loss (nats/token)",
                    {train, held});
}

Bytes read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

// The names in a directory, sorted.
std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

using testing::pixels_of;
using testing::TempDir;

TEST(Png, ReferenceCrcMatchesKnownValues) {
  EXPECT_EQ(ref_crc32(bytes_of("123456789")), 0xcbf43926u);
  EXPECT_EQ(ref_crc32(bytes_of("IEND")), 0xae426082u);
}

TEST(Png, SmallImageRoundTrips) {
  Image img(3, 2);
  const std::uint32_t px[2][3] = {{0xff0000, 0x00ff00, 0x0000ff}, {0x123456, 0x000000, 0xfedcba}};
  for (int y = 0; y < 2; ++y)
    for (int x = 0; x < 3; ++x) img.set(x, y, px[y][x]);
  const Bytes png = encode_png(img);
  EXPECT_EQ(Bytes(png.end() - 12, png.end()),
            (Bytes{0, 0, 0, 0, 'I', 'E', 'N', 'D', 0xae, 0x42, 0x60, 0x82}));
  EXPECT_EQ(round_trip(img).size(), 2u);
  EXPECT_EQ(round_trip(Image(1, 1, 0x123456)), std::vector<int>{0});
}

TEST(Png, EveryFilterRoundTrips) {
  std::vector<int> used(5, 0);
  for (const Image& img : {mixed(301, 200), patterned(800, 500), patterned(1, 7), chart()})
    for (int type : round_trip(img)) ++used[static_cast<std::size_t>(type)];
  for (int type = 0; type <= 4; ++type) EXPECT_GT(used[type], 0) << "filter type " << type;
}

TEST(Png, EachRowTakesTheFilterOfLeastAbsoluteSum) {
  for (const Image& img : {mixed(301, 200), chart()}) {
    const std::vector<int> types = round_trip(img);
    ASSERT_EQ(types.size(), static_cast<std::size_t>(img.height));
    for (int y = 0; y < img.height; ++y) {
      const std::vector<long> costs = filter_costs(img, y);
      // Ties go to the lower type.
      const auto best = std::min_element(costs.begin(), costs.end()) - costs.begin();
      EXPECT_EQ(types[static_cast<std::size_t>(y)], best) << "row " << y;
    }
  }
  // A horizontal ramp repeated on every row: Sub on the first (all 3s after the first pixel),
  // Up below it (all zeros).
  Image ramp(100, 4);
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 100; ++x) ramp.set(x, y, static_cast<std::uint32_t>(x) * 0x010101u);
  EXPECT_EQ(round_trip(ramp), (std::vector<int>{1, 2, 2, 2}));
}

TEST(Png, ChartsCompressWell) {
  const Image img = chart();
  const std::size_t size = encode_png(img).size();
  EXPECT_LT(size, 40'000u) << "an 800x500 loss chart; 1.2 MB of pixels";
  EXPECT_GT(size, 1'000u);
  // Deflate copies at most 258 bytes per two-byte match: 1.2 MB of white is ~2 KB at best.
  EXPECT_LT(encode_png(Image(800, 500)).size(), 2'500u) << "blank";
  // Noise does not compress, and still fits: the stream grows by at most a few bytes per block.
  const Image noise = mixed(1000, 1000);
  EXPECT_LT(encode_png(noise).size(), noise.rgb.size() + 1000 + noise.rgb.size() / 1000);
}

TEST(Png, PillowDecodesTheSamePixels) {
  // Debian's interpreter first: its python3-pil (another python3 may come first on PATH).
  const std::string python = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  if (std::system((python + " -c 'import PIL' >/dev/null 2>&1").c_str()) != 0)
    GTEST_SKIP() << "no python3 with Pillow (Debian: python3-pil)";
  const TempDir dir;
  std::ofstream(dir.path() + "/check.py") << R"(import sys
from PIL import Image
im = Image.open(sys.argv[1])
im.load()
assert im.mode == 'RGB', im.mode
assert im.size == (int(sys.argv[3]), int(sys.argv[4])), im.size
assert im.tobytes() == open(sys.argv[2], 'rb').read(), 'pixels differ'
)";
  int i = 0;
  for (const Image& img : {mixed(301, 200), chart(), patterned(1, 1)}) {
    const std::string png = dir.path() + "/" + std::to_string(i) + ".png";
    const std::string rgb = dir.path() + "/" + std::to_string(i++) + ".rgb";
    write_png(png, img);
    std::ofstream(rgb, std::ios::binary)
        .write(reinterpret_cast<const char*>(img.rgb.data()),
               static_cast<std::streamsize>(img.rgb.size()));
    const std::string cmd = python + " " + dir.path() + "/check.py" + " " + png + " " + rgb + " " +
                            std::to_string(img.width) + " " + std::to_string(img.height);
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
}

TEST(Png, ImageClipsAndRejectsBadSizes) {
  Image img(4, 3, 0x102030);
  EXPECT_EQ(img.rgb.size(), 36u);
  EXPECT_EQ(img.at(3, 2), 0x102030u);
  img.set(-1, 0, 0);
  img.set(4, 0, 0);
  img.set(0, 3, 0);
  img.fill(-5, -5, 2, 2, 0xabcdef);
  img.fill(3, 2, 100, 100, 0x010203);
  EXPECT_EQ(pixels_of(img, 0xabcdef), 4);
  EXPECT_EQ(pixels_of(img, 0x010203), 1);
  EXPECT_EQ(pixels_of(img, 0x102030), 12 - 5);
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

TEST(Png, WritePngReplacesAtomically) {
  const TempDir dir;
  const std::string path = dir.path() + "/loss.png";
  std::ofstream(path) << "old contents";
  const Image img = patterned(40, 30);
  write_png(path, img);
  EXPECT_TRUE(read_file(path) == encode_png(img));
  EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"loss.png"});
}

TEST(Png, WritePngFailuresThrowIoErrorNamingTheField) {
  const TempDir dir;
  const Image img(2, 2);
  const std::string missing = dir.path() + "/no-such-dir/loss.png";
  try {
    write_png(missing, img, "loss_png");
    ADD_FAILURE() << "wrote into a missing directory";
  } catch (const IoError& e) {
    EXPECT_EQ(e.field(), "loss_png");
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  // The temporary file can be made, the rename onto a directory cannot: it must not linger.
  std::filesystem::create_directory(dir.path() + "/taken");
  try {
    write_png(dir.path() + "/taken", img, "breakdown_png");
    ADD_FAILURE() << "renamed over a directory";
  } catch (const IoError& e) {
    EXPECT_EQ(e.field(), "breakdown_png");
  }
  EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"taken"});
}

}  // namespace
}  // namespace meshcast::training
