// The Image value and its PNG encoding (stored deflate blocks: charts are small, and a real
// compressor would be a dependency or a few hundred lines for a few hundred kilobytes saved).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "meshcast/error.h"
#include "meshcast/training/chart.h"

namespace meshcast::training {
namespace {

constexpr int kMaxSide = 1 << 14;
constexpr std::size_t kMaxStored = 65535;  // a stored block's LEN is 16 bits

void check_size(int width, int height) {
  if (width < 1 || height < 1 || width > kMaxSide || height > kMaxSide)
    throw ValidationError("image", "size " + std::to_string(width) + "x" + std::to_string(height) +
                                       " is outside 1x1 .. " + std::to_string(kMaxSide) + "x" +
                                       std::to_string(kMaxSide));
}

constexpr std::array<std::uint32_t, 256> make_crc_table() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t n = 0; n < 256; ++n) {
    std::uint32_t c = n;
    for (int k = 0; k < 8; ++k) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
    t[n] = c;
  }
  return t;
}
constexpr auto kCrcTable = make_crc_table();

// CRC-32 (ISO 3309, as PNG specifies) of bytes [begin, end).
std::uint32_t crc32(const std::uint8_t* begin, const std::uint8_t* end) {
  std::uint32_t c = 0xffffffffu;
  for (const std::uint8_t* p = begin; p != end; ++p) c = kCrcTable[(c ^ *p) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

std::uint32_t adler32(const std::vector<std::uint8_t>& data) {
  constexpr std::uint32_t kMod = 65521;
  std::uint32_t a = 1, b = 0;
  for (std::uint8_t v : data) {
    a = (a + v) % kMod;
    b = (b + a) % kMod;
  }
  return b << 16 | a;
}

void put32(std::vector<std::uint8_t>& out, std::uint32_t v) {  // big-endian, as PNG and zlib
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(v >> shift));
}

// length, type, data, CRC-32 of type and data.
void put_chunk(std::vector<std::uint8_t>& out, const char (&type)[5],
               const std::vector<std::uint8_t>& data) {
  put32(out, static_cast<std::uint32_t>(data.size()));
  const std::size_t start = out.size();
  out.insert(out.end(), type, type + 4);
  out.insert(out.end(), data.begin(), data.end());
  put32(out, crc32(out.data() + start, out.data() + out.size()));
}

// A zlib stream of `raw` in stored blocks: CMF 0x78 (deflate, 32K window), FLG 0x01 (no
// dictionary, fastest; 0x7801 is a multiple of 31 as the header check requires).
std::vector<std::uint8_t> zlib_stored(const std::vector<std::uint8_t>& raw) {
  std::vector<std::uint8_t> z{0x78, 0x01};
  z.reserve(2 + raw.size() + 5 * (raw.size() / kMaxStored + 1) + 4);
  std::size_t at = 0;
  do {
    const std::size_t n = std::min(kMaxStored, raw.size() - at);
    const bool last = at + n == raw.size();
    // BFINAL in bit 0, BTYPE 00 (stored) in bits 1-2; the rest of the byte is padding.
    z.push_back(last ? 1 : 0);
    const auto len = static_cast<std::uint16_t>(n), nlen = static_cast<std::uint16_t>(~len);
    for (std::uint16_t v : {len, nlen}) {  // little-endian, as deflate
      z.push_back(static_cast<std::uint8_t>(v & 0xff));
      z.push_back(static_cast<std::uint8_t>(v >> 8));
    }
    z.insert(z.end(), raw.begin() + static_cast<std::ptrdiff_t>(at),
             raw.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
  } while (at < raw.size());
  put32(z, adler32(raw));
  return z;
}

}  // namespace

Image::Image(int w, int h, std::uint32_t color) : width(w), height(h) {
  check_size(w, h);
  rgb.resize(static_cast<std::size_t>(w) * static_cast<std::size_t>(h) * 3);
  fill(0, 0, w, h, color);
}

std::uint32_t Image::at(int x, int y) const {
  if (x < 0 || y < 0 || x >= width || y >= height)
    throw std::out_of_range("Image::at(" + std::to_string(x) + ", " + std::to_string(y) + ")");
  const std::size_t i = (static_cast<std::size_t>(y) * static_cast<std::size_t>(width) +
                         static_cast<std::size_t>(x)) *
                        3;
  return std::uint32_t{rgb[i]} << 16 | std::uint32_t{rgb[i + 1]} << 8 | rgb[i + 2];
}

void Image::set(int x, int y, std::uint32_t color) {
  if (x < 0 || y < 0 || x >= width || y >= height) return;
  const std::size_t i = (static_cast<std::size_t>(y) * static_cast<std::size_t>(width) +
                         static_cast<std::size_t>(x)) *
                        3;
  rgb[i] = static_cast<std::uint8_t>(color >> 16);
  rgb[i + 1] = static_cast<std::uint8_t>(color >> 8);
  rgb[i + 2] = static_cast<std::uint8_t>(color);
}

void Image::fill(int x0, int y0, int x1, int y1, std::uint32_t color) {
  x0 = std::max(x0, 0), y0 = std::max(y0, 0);
  x1 = std::min(x1, width), y1 = std::min(y1, height);
  for (int y = y0; y < y1; ++y)
    for (int x = x0; x < x1; ++x) set(x, y, color);
}

std::vector<std::uint8_t> encode_png(const Image& image) {
  check_size(image.width, image.height);
  const auto w = static_cast<std::size_t>(image.width), h = static_cast<std::size_t>(image.height);
  if (image.rgb.size() != w * h * 3)
    throw ValidationError("image", "has " + std::to_string(image.rgb.size()) +
                                       " bytes of pixels, expected 3 * " + std::to_string(w) +
                                       " * " + std::to_string(h));
  // Each scanline is its filter type (0: None) followed by the row's pixels.
  std::vector<std::uint8_t> raw;
  raw.reserve(h * (1 + 3 * w));
  for (std::size_t y = 0; y < h; ++y) {
    raw.push_back(0);
    const auto row = image.rgb.begin() + static_cast<std::ptrdiff_t>(y * 3 * w);
    raw.insert(raw.end(), row, row + static_cast<std::ptrdiff_t>(3 * w));
  }
  std::vector<std::uint8_t> ihdr;
  put32(ihdr, static_cast<std::uint32_t>(w));
  put32(ihdr, static_cast<std::uint32_t>(h));
  // bit depth 8, colour type 2 (RGB), compression 0, filter method 0, no interlace
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});

  std::vector<std::uint8_t> png{0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  put_chunk(png, "IHDR", ihdr);
  put_chunk(png, "IDAT", zlib_stored(raw));
  put_chunk(png, "IEND", {});
  return png;
}

void write_png(const std::string& path, const Image& image, const std::string& field) {
  const std::vector<std::uint8_t> bytes = encode_png(image);
  // The pid keeps concurrent writers of one path from sharing a temporary file.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError(field, "cannot write " + path + ": " + std::strerror(errno));
  const auto fail = [&](const char* step) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw IoError(field, std::string("cannot ") + step + " " + path + ": " + std::strerror(err));
  };
  for (std::size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("write");
    done += static_cast<std::size_t>(n);
  }
  // Durable before it replaces the old file, so that a crash leaves one or the other.
  if (::fsync(fd) != 0) fail("write");
  const int closed = ::close(fd);
  fd = -1;
  if (closed != 0) fail("write");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("rename onto");
}

}  // namespace meshcast::training
