// The tests' own tensor data (tests/lib/exec): a value per global element that every dtype holds
// exactly, source tiles filled with it (split into addends for a partial source), and a check of
// every element of every target tile against it. Independent of lib/: tiles come from ref_*.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "meshcast/meshcast.h"
#include "support/testing.h"

namespace meshcast::testing {

// The test's own data: a small integer per global element, exact in every dtype, and for a
// partial source G addends (small offsets, the rest in addend 0) whose every partial sum in
// addend order stays exact.
inline std::int64_t modulus(DType t) {
  switch (t) {
    case DType::i8:
      return 101;  // |v| <= 50, |partial sums| <= 50 + 2*7
    case DType::bf16:
      return 201;  // exact integers up to 256
    case DType::f16:
      return 1001;  // up to 2048
    case DType::f32:
      return 1000003;
    case DType::i32:
      return 1000003;
    case DType::f64:
      return std::int64_t{1} << 40;
    case DType::i64:
      return std::int64_t{1} << 50;
  }
  return 1;
}
inline std::int64_t value(std::int64_t e, DType t) {
  const std::int64_t m = modulus(t);
  return (e * 7919 + 13) % m - m / 2;
}
inline std::int64_t addend(std::int64_t e, std::int64_t g, std::int64_t groups, DType t) {
  if (g > 0) return (e + 3 * g) % 5 - 2;
  std::int64_t a = value(e, t);
  for (std::int64_t k = 1; k < groups; ++k) a -= (e + 3 * k) % 5 - 2;
  return a;
}

inline void store(DType t, std::byte* p, std::int64_t v) {
  switch (t) {
    case DType::f16: {
      const unsigned short h = float_to_half(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      return;
    }
    case DType::bf16: {
      const unsigned short h = float_to_bf16(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      return;
    }
    case DType::f32: {
      const float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      return;
    }
    case DType::f64: {
      const double f = static_cast<double>(v);
      std::memcpy(p, &f, 8);
      return;
    }
    case DType::i8:
      *p = static_cast<std::byte>(static_cast<std::int8_t>(v));
      return;
    case DType::i32: {
      const auto x = static_cast<std::int32_t>(v);
      std::memcpy(p, &x, 4);
      return;
    }
    case DType::i64:
      std::memcpy(p, &v, 8);
      return;
  }
}

using Bytes = std::vector<std::byte>;

// Every device's source and target tile, by device id.
struct Buffers {
  std::vector<Bytes> src, dst;
};

// Source tiles filled with the test's values; target tiles with a sentinel no expected value
// equals (0x5a bytes: 203.25 in f16, 90 in i8, huge otherwise). Values are those of the target's
// dtype, stored in the source's (a cast from f32 keeps them exact).
inline Buffers make_buffers(const Layout& src, const Layout& dst, int world) {
  Buffers b{std::vector<Bytes>(static_cast<std::size_t>(world)),
            std::vector<Bytes>(static_cast<std::size_t>(world))};
  const DType t = src.dtype(), v = dst.dtype();
  const std::size_t elem = dtype_size(t);
  const std::int64_t groups = testing::ref_groups(src);
  for (std::int64_t i = 0; i < src.mesh().size(); ++i) {
    const Box tile = testing::ref_tile(src, i);
    Bytes& buf = b.src[static_cast<std::size_t>(src.mesh().device(i))];
    buf.resize(static_cast<std::size_t>(tile.volume()) * elem);
    const std::int64_t g = testing::ref_addend(src, i);
    std::size_t at = 0;
    testing::ref_for_each(src.shape(), tile, [&](const auto&, std::int64_t e) {
      store(t, buf.data() + at, groups == 1 ? value(e, v) : addend(e, g, groups, v));
      at += elem;
    });
  }
  for (std::int64_t i = 0; i < dst.mesh().size(); ++i) {
    const Box tile = testing::ref_tile(dst, i);
    b.dst[static_cast<std::size_t>(dst.mesh().device(i))].assign(
        static_cast<std::size_t>(tile.volume()) * dtype_size(v), std::byte{0x5a});
  }
  return b;
}

// Mismatches of every target tile against the expected values; describes the first.
inline std::int64_t check(const Layout& dst, const Buffers& b, std::string& first) {
  const DType t = dst.dtype();
  const std::size_t elem = dtype_size(t);
  const bool partial = !dst.spec().partial().empty();
  std::int64_t wrong = 0;
  for (std::int64_t i = 0; i < dst.mesh().size(); ++i) {
    const int dev = dst.mesh().device(i);
    const Bytes& buf = b.dst[static_cast<std::size_t>(dev)];
    const bool zero = partial && testing::ref_addend(dst, i) != 0;
    std::size_t at = 0;
    testing::ref_for_each(dst.shape(), testing::ref_tile(dst, i), [&](const auto&, std::int64_t e) {
      const double want = zero ? 0.0 : static_cast<double>(value(e, t));
      const double got = testing::load_element(t, buf.data() + at);
      if (got != want) {
        if (wrong++ == 0)
          first = "device " + std::to_string(dev) + " element " + std::to_string(e) + ": got " +
                  std::to_string(got) + ", want " + std::to_string(want);
      }
      at += elem;
    });
  }
  return wrong;
}

}  // namespace meshcast::testing
