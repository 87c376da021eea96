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
// addend order stays exact. Unsigned values are non-negative, their addend 0 may wrap below zero
// (the sum wraps back); bool values are 0 or 1 and their addends sum by or; a complex element
// holds (v, -v) (load_element).
inline std::int64_t modulus(DType t) {
  switch (t) {
    case DType::i8:
      return 101;  // |v| <= 50, |partial sums| <= 50 + 2*7
    case DType::u8:
      return 89;  // below the sentinel 0x5a
    case DType::bf16:
      return 201;  // exact integers up to 256
    case DType::f16:
      return 1001;  // up to 2048
    case DType::i16:
    case DType::u16:
      return 20011;  // below the sentinel 0x5a5a
    case DType::f32:
    case DType::i32:
    case DType::u32:
    case DType::c64:
      return 1000003;
    case DType::f64:
    case DType::c128:
      return std::int64_t{1} << 40;
    case DType::i64:
    case DType::u64:
      return std::int64_t{1} << 50;
    case DType::b8:
      return 2;
  }
  return 1;
}
inline bool is_unsigned(DType t) {
  return t == DType::u8 || t == DType::u16 || t == DType::u32 || t == DType::u64;
}
inline std::int64_t value(std::int64_t e, DType t) {
  if (t == DType::b8) return (e * 7919 + 13) % 7 < 3;
  const std::int64_t m = modulus(t);
  return (e * 7919 + 13) % m - (is_unsigned(t) ? 0 : m / 2);
}
inline std::int64_t addend(std::int64_t e, std::int64_t g, std::int64_t groups, DType t) {
  // bool: addend e % groups holds the value, some others hold it too.
  if (t == DType::b8) return value(e, t) && (g == e % groups || (e + g) % 3 == 0);
  if (g > 0) return (e + 3 * g) % 5 - 2;
  std::int64_t a = value(e, t);
  for (std::int64_t k = 1; k < groups; ++k) a -= (e + 3 * k) % 5 - 2;
  return a;
}

inline void store(DType t, std::byte* p, std::int64_t v) {
  auto put = [p](auto x, std::size_t at = 0) { std::memcpy(p + at, &x, sizeof x); };
  switch (t) {
    case DType::f16:
      return put(float_to_half(static_cast<float>(v)));
    case DType::bf16:
      return put(float_to_bf16(static_cast<float>(v)));
    case DType::f32:
      return put(static_cast<float>(v));
    case DType::f64:
      return put(static_cast<double>(v));
    case DType::i8:
      return put(static_cast<std::int8_t>(v));
    case DType::i16:
      return put(static_cast<std::int16_t>(v));
    case DType::i32:
      return put(static_cast<std::int32_t>(v));
    case DType::i64:
      return put(v);
    case DType::u8:
      return put(static_cast<std::uint8_t>(v));
    case DType::u16:
      return put(static_cast<std::uint16_t>(v));
    case DType::u32:
      return put(static_cast<std::uint32_t>(v));
    case DType::u64:
      return put(static_cast<std::uint64_t>(v));
    case DType::b8:
      return put(static_cast<std::uint8_t>(v != 0));
    case DType::c64:
      put(static_cast<float>(v));
      return put(static_cast<float>(-v), 4);
    case DType::c128:
      put(static_cast<double>(v));
      return put(static_cast<double>(-v), 8);
  }
}

using Bytes = std::vector<std::byte>;

// Every device's source and target tile, by device id.
struct Buffers {
  std::vector<Bytes> src, dst;
};

// Source tiles filled with the test's values; target tiles with a sentinel no expected value
// equals (0x5a bytes: 203.25 in f16, 90 in the 1-byte types, 23130 in the 2-byte integers,
// huge otherwise). Values are those of the target's
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
