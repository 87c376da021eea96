// Regions: copy_region / pack / unpack / accumulate / zero_region against naive element loops on
// random boxes of random buffers; is_contiguous against the offsets of every element.
#include "meshcast/region.h"

#include <gtest/gtest.h>

#include <cstring>
#include <type_traits>

#include "meshcast/dtype.h"
#include "meshcast/error.h"
#include "support/testing.h"

namespace meshcast {
namespace {

using testing::Rng;
using Bytes = std::vector<std::byte>;

// A random box (offset, count) inside a random buffer (extent) of ndim dimensions; counts may be
// zero when `empty_ok`.
Region random_region(Rng& rng, std::size_t ndim, std::size_t elem, void* base, bool empty_ok) {
  Region r;
  r.base = base;
  r.elem_size = elem;
  for (std::size_t d = 0; d < ndim; ++d) {
    const auto e = rng.between(1, 6);
    auto c = rng.between(empty_ok && rng.chance(1, 30) ? 0 : 1, e);
    if (rng.chance(1, 3)) c = e;  // whole dimensions are common
    r.extent.push_back(e);
    r.count.push_back(c);
    r.offset.push_back(rng.between(0, e - c));
  }
  return r;
}

// A region with the same counts inside a different random buffer.
Region region_like(Rng& rng, const Region& like, void* base) {
  Region r;
  r.base = base;
  r.elem_size = like.elem_size;
  for (auto c : like.count) {
    const auto e = c + (rng.chance(1, 2) ? 0 : rng.between(0, 3));
    r.extent.push_back(e);
    r.count.push_back(c);
    r.offset.push_back(rng.between(0, e - c));
  }
  return r;
}

std::int64_t buffer_elems(const Region& r) { return testing::ref_volume(r.extent); }

// Byte offsets of the region's elements, row-major over its box.
std::vector<std::int64_t> offsets(const Region& r) {
  std::vector<std::int64_t> out;
  std::vector<Range> box;
  for (std::size_t d = 0; d < r.count.size(); ++d)
    box.push_back({r.offset[d], r.offset[d] + r.count[d]});
  testing::ref_for_each(r.extent, Box(box), [&](const auto&, std::int64_t g) {
    out.push_back(g * static_cast<std::int64_t>(r.elem_size));
  });
  return out;
}

Bytes random_bytes(Rng& rng, std::size_t n) {
  Bytes b(n);
  for (auto& x : b) x = static_cast<std::byte>(rng.next());
  return b;
}

// A random region (1-4 dimensions, elements of 1-8 bytes, possibly empty) over `buf`, which it
// fills with random bytes.
Region random_filled_region(Rng& rng, Bytes& buf) {
  const std::size_t ndim = static_cast<std::size_t>(rng.between(1, 4));
  const std::size_t elem = std::size_t{1} << rng.below(4);
  Region r = random_region(rng, ndim, elem, nullptr, true);
  buf = random_bytes(rng, static_cast<std::size_t>(buffer_elems(r)) * elem);
  r.base = buf.data();
  return r;
}

std::string describe(const Region& r) {
  std::ostringstream os;
  os << "elem " << r.elem_size << " extent " << shape_str(r.extent) << " offset "
     << shape_str(r.offset) << " count " << shape_str(r.count);
  return os.str();
}

TEST(Region, OfTileAndBox) {
  int buf[1];
  const Region r = Region::of(buf, 4, Box({{4, 8}, {10, 16}}), Box({{5, 7}, {12, 16}}));
  EXPECT_EQ(r.base, static_cast<void*>(buf));
  EXPECT_EQ(r.elem_size, 4u);
  EXPECT_EQ(r.extent, (std::vector<std::int64_t>{4, 6}));
  EXPECT_EQ(r.offset, (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(r.count, (std::vector<std::int64_t>{2, 4}));
  EXPECT_EQ(r.elements(), 8);
  EXPECT_EQ(r.bytes(), 32u);
  const Region c = Region::contiguous(buf, 12);
  EXPECT_EQ(c.bytes(), 12u);
  EXPECT_TRUE(c.is_contiguous());
  const Region p = Region::packed_like(r, buf);
  EXPECT_EQ(p.extent, r.count);
  EXPECT_EQ(p.count, r.count);
  EXPECT_EQ(p.offset, (std::vector<std::int64_t>{0, 0}));
  EXPECT_EQ(p.elem_size, 4u);
}

TEST(Region, CopyMatchesElementLoop) {
  Rng rng(0xc097);
  for (int i = 0; i < testing::scaled(4000); ++i) {
    const std::size_t ndim = static_cast<std::size_t>(rng.between(1, 4));
    const std::size_t elem = std::size_t{1} << rng.below(4);
    Region from = random_region(rng, ndim, elem, nullptr, true);
    Region to = region_like(rng, from, nullptr);
    Bytes a = random_bytes(rng, static_cast<std::size_t>(buffer_elems(from)) * elem);
    Bytes b = random_bytes(rng, static_cast<std::size_t>(buffer_elems(to)) * elem);
    from.base = a.data();
    to.base = b.data();
    Bytes want = b;
    const auto fo = offsets(from), to_off = offsets(to);
    ASSERT_EQ(fo.size(), to_off.size());
    for (std::size_t k = 0; k < fo.size(); ++k)
      std::memcpy(want.data() + to_off[k], a.data() + fo[k], elem);
    const Bytes a_before = a;
    copy_region(from, to);
    ASSERT_EQ(b, want) << "from " << describe(from) << " to " << describe(to);
    ASSERT_EQ(a, a_before) << "the source changed";
  }
}

TEST(Region, PackUnpackMatchElementLoopAndInvert) {
  Rng rng(0x9ac4);
  for (int i = 0; i < testing::scaled(4000); ++i) {
    Bytes buf;
    Region r = random_filled_region(rng, buf);
    const std::size_t elem = r.elem_size;
    const auto off = offsets(r);
    ASSERT_EQ(static_cast<std::int64_t>(off.size()), r.elements());
    // pack: the box's elements in row-major order; nothing written past r.bytes().
    Bytes packed(r.bytes() + 16, std::byte{0x77});
    pack(r, packed.data());
    Bytes want(r.bytes() + 16, std::byte{0x77});
    for (std::size_t k = 0; k < off.size(); ++k)
      std::memcpy(want.data() + k * elem, buf.data() + off[k], elem);
    ASSERT_EQ(packed, want) << describe(r);
    // unpack into a scrambled copy restores the buffer: unpack(pack(r)) is the identity on r.
    const Bytes original = buf;
    for (auto o : off)
      for (std::size_t b = 0; b < elem; ++b) buf[static_cast<std::size_t>(o) + b] = std::byte{0xee};
    unpack(packed.data(), r);
    ASSERT_EQ(buf, original) << describe(r);
    // unpack of fresh data writes exactly the box's elements.
    const Bytes fresh = random_bytes(rng, r.bytes());
    Bytes expect = buf;
    for (std::size_t k = 0; k < off.size(); ++k)
      std::memcpy(expect.data() + off[k], fresh.data() + k * elem, elem);
    unpack(fresh.data(), r);
    ASSERT_EQ(buf, expect) << describe(r);
  }
}

// pack_range / unpack_range over a random cut of the packed bytes into ranges (not aligned with
// elements or rows) agree with pack / unpack of the whole, and touch nothing else.
TEST(Region, RangesAgreeWithWholePackAndUnpack) {
  Rng rng(0x7a11);
  for (int i = 0; i < testing::scaled(3000); ++i) {
    Bytes buf;
    Region r = random_filled_region(rng, buf);
    Bytes whole(r.bytes());
    pack(r, whole.data());
    const std::size_t step = static_cast<std::size_t>(rng.between(1, 40));
    Bytes pieces(r.bytes());
    for (std::size_t at = 0; at < r.bytes(); at += step) {
      const std::size_t n = std::min(step, r.bytes() - at);
      Bytes out(n + 8, std::byte{0x55});
      pack_range(r, at, n, out.data());
      ASSERT_EQ(out[n], std::byte{0x55}) << "wrote past the range: " << describe(r);
      std::copy(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(n),
                pieces.begin() + static_cast<std::ptrdiff_t>(at));
    }
    ASSERT_EQ(pieces, whole) << describe(r) << " step " << step;
    // Unpacking fresh bytes range by range, in a shuffled order, equals one unpack.
    const Bytes fresh = random_bytes(rng, r.bytes());
    Bytes expect = buf;
    Region e = r;
    e.base = expect.data();
    unpack(fresh.data(), e);
    std::vector<std::size_t> starts;
    for (std::size_t at = 0; at < r.bytes(); at += step) starts.push_back(at);
    rng.shuffle(starts);
    for (std::size_t at : starts)
      unpack_range(fresh.data() + at, r, at, std::min(step, r.bytes() - at));
    ASSERT_EQ(buf, expect) << describe(r) << " step " << step;
  }
  // A range outside the region is refused.
  std::vector<std::int32_t> tile(12);
  const Region r = Region::of(tile.data(), 4, Box({{0, 3}, {0, 4}}), Box({{0, 3}, {1, 3}}));
  std::byte out[32];
  EXPECT_THROW(pack_range(r, 20, 8, out), ValidationError);
  EXPECT_THROW(unpack_range(out, r, 25, 0), ValidationError);
  EXPECT_NO_THROW(pack_range(r, 24, 0, out));
}

TEST(Region, ZeroMatchesElementLoop) {
  Rng rng(0x2e70);
  for (int i = 0; i < testing::scaled(2000); ++i) {
    Bytes buf;
    Region r = random_filled_region(rng, buf);
    const std::size_t elem = r.elem_size;
    Bytes want = buf;
    for (auto o : offsets(r))
      for (std::size_t b = 0; b < elem; ++b) want[static_cast<std::size_t>(o) + b] = std::byte{0};
    zero_region(r);
    ASSERT_EQ(buf, want) << describe(r);
  }
}

// Random values of a dtype that are not NaN (floats). The older integer types stay where their
// sum cannot overflow; the newer ones take any bits, so that their sums wrap. bool: 0 or 1.
void random_value(Rng& rng, DType t, std::byte* p) {
  switch (t) {
    case DType::f16:
    case DType::bf16: {
      unsigned short h;
      do {
        h = static_cast<unsigned short>(rng.next());
      } while (t == DType::f16 ? ((h & 0x7c00) == 0x7c00) : ((h & 0x7f80) == 0x7f80));
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::f32: {
      const float f = static_cast<float>(rng.between(-1000000, 1000000)) / 64.0f;
      std::memcpy(p, &f, 4);
      break;
    }
    case DType::f64: {
      const double f = static_cast<double>(static_cast<std::int64_t>(rng.next() >> 12)) / 3.0;
      std::memcpy(p, &f, 8);
      break;
    }
    case DType::i8: {
      const auto v = static_cast<std::int8_t>(rng.between(-64, 63));
      std::memcpy(p, &v, 1);
      break;
    }
    case DType::i32: {
      const auto v = static_cast<std::int32_t>(rng.between(-1000000000, 1000000000));
      std::memcpy(p, &v, 4);
      break;
    }
    case DType::i64: {
      const std::int64_t v = static_cast<std::int64_t>(rng.next() >> 2) - (std::int64_t{1} << 61);
      std::memcpy(p, &v, 8);
      break;
    }
    case DType::i16:
    case DType::u8:
    case DType::u16:
    case DType::u32:
    case DType::u64: {
      const std::uint64_t bits = rng.next();
      std::memcpy(p, &bits, dtype_size(t));  // little-endian: the low bytes
      break;
    }
    case DType::b8:
      *p = static_cast<std::byte>(rng.next() & 1);
      break;
    case DType::c64:
      random_value(rng, DType::f32, p);
      random_value(rng, DType::f32, p + 4);
      break;
    case DType::c128:
      random_value(rng, DType::f64, p);
      random_value(rng, DType::f64, p + 8);
      break;
  }
}

// to := to + from for one element, naively: integers modulo 2^bits (through 64-bit unsigned
// arithmetic), bool as or, complex numbers part by part.
void add_one(DType t, const std::byte* from, std::byte* to, std::size_t at = 0) {
  auto add = [&](auto zero) {
    using T = decltype(zero);
    T a, b;
    std::memcpy(&a, to + at, sizeof(T));
    std::memcpy(&b, from + at, sizeof(T));
    T c;
    if constexpr (std::is_integral_v<T>)
      c = static_cast<T>(static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b));
    else
      c = static_cast<T>(a + b);
    std::memcpy(to + at, &c, sizeof(T));
  };
  unsigned short a, b, c;
  switch (t) {
    case DType::f16:
      std::memcpy(&a, to, 2);
      std::memcpy(&b, from, 2);
      c = float_to_half(half_to_float(a) + half_to_float(b));
      std::memcpy(to, &c, 2);
      break;
    case DType::bf16:
      std::memcpy(&a, to, 2);
      std::memcpy(&b, from, 2);
      c = float_to_bf16(bf16_to_float(a) + bf16_to_float(b));
      std::memcpy(to, &c, 2);
      break;
    case DType::f32:
      add(float{});
      break;
    case DType::f64:
      add(double{});
      break;
    case DType::i8:
      add(std::int8_t{});
      break;
    case DType::i32:
      add(std::int32_t{});
      break;
    case DType::i64:
      add(std::int64_t{});
      break;
    case DType::i16:
      add(std::int16_t{});
      break;
    case DType::u8:
      add(std::uint8_t{});
      break;
    case DType::u16:
      add(std::uint16_t{});
      break;
    case DType::u32:
      add(std::uint32_t{});
      break;
    case DType::u64:
      add(std::uint64_t{});
      break;
    case DType::b8:
      *to = static_cast<std::byte>(*to != std::byte{0} || *from != std::byte{0});
      break;
    case DType::c64:
      add_one(DType::f32, from, to);
      add_one(DType::f32, from, to, 4);
      break;
    case DType::c128:
      add_one(DType::f64, from, to);
      add_one(DType::f64, from, to, 8);
      break;
  }
}

TEST(Region, AccumulateMatchesElementLoopForEveryDtype) {
  Rng rng(0xacc0);
  for (int i = 0; i < testing::scaled(3500); ++i) {
    const DType t = testing::dtype_at(i);
    const std::size_t elem = dtype_size(t);
    const std::size_t ndim = static_cast<std::size_t>(rng.between(1, 4));
    Region from = random_region(rng, ndim, elem, nullptr, true);
    Region to = region_like(rng, from, nullptr);
    Bytes a(static_cast<std::size_t>(buffer_elems(from)) * elem);
    Bytes b(static_cast<std::size_t>(buffer_elems(to)) * elem);
    for (std::size_t k = 0; k < a.size(); k += elem) random_value(rng, t, a.data() + k);
    for (std::size_t k = 0; k < b.size(); k += elem) random_value(rng, t, b.data() + k);
    from.base = a.data();
    to.base = b.data();
    Bytes want = b;
    const auto fo = offsets(from), to_off = offsets(to);
    for (std::size_t k = 0; k < fo.size(); ++k)
      add_one(t, a.data() + fo[k], want.data() + to_off[k]);
    accumulate(from, to, t);
    ASSERT_EQ(b, want) << to_string(t) << " from " << describe(from) << " to " << describe(to);
  }
}

TEST(Region, AccumulateHalfTypesExactOnSmallIntegers) {
  // Hand cases: 1 + 2 = 3 exactly; halves round once per add.
  for (DType t : {DType::f16, DType::bf16}) {
    auto enc = [&](float f) { return t == DType::f16 ? float_to_half(f) : float_to_bf16(f); };
    auto dec = [&](unsigned short h) {
      return t == DType::f16 ? half_to_float(h) : bf16_to_float(h);
    };
    unsigned short x[3] = {enc(1), enc(-7), enc(100)}, y[3] = {enc(2), enc(7), enc(28)};
    accumulate(Region{x, 2, {3}, {0}, {3}}, Region{y, 2, {3}, {0}, {3}}, t);
    EXPECT_EQ(dec(y[0]), 3.0f) << to_string(t);
    EXPECT_EQ(dec(y[1]), 0.0f) << to_string(t);
    EXPECT_EQ(dec(y[2]), 128.0f) << to_string(t);
  }
}

TEST(Region, MismatchedShapesOrDtypeAreRefused) {
  float a[8] = {}, b[8] = {};
  const Region r4{a, 4, {8}, {0}, {4}}, r5{b, 4, {8}, {0}, {5}};
  EXPECT_THROW(copy_region(r4, r5), ValidationError);
  EXPECT_THROW(accumulate(r4, r5, DType::f32), ValidationError);
  const Region r4b{b, 4, {8}, {0}, {4}};
  EXPECT_THROW(accumulate(r4, r4b, DType::f64), ValidationError) << "element size 4 is not f64";
}

// A region built by hand must lie in its buffer before anything walks it: a negative count
// defeated the byte-range check (its bytes wrapped), a short extent was read past its end, a box
// outside the tile or of fewer dims became a region outside the buffer.
TEST(Region, RegionsOutsideTheirBufferAreRefused) {
  float a[8] = {}, b[8] = {}, out[8] = {};
  const Region good{a, 4, {8}, {0}, {4}};
  const std::vector<Region> bad = {
      Region{b, 4, {8}, {0}, {-4}},  // negative count
      Region{b, 4, {8}, {6}, {4}},   // past the extent
      Region{b, 4, {8}, {-1}, {4}},  // before it
      Region{b, 4, {}, {0}, {4}},    // extent of another ndim
      Region{b, 0, {8}, {0}, {4}},   // elements of no bytes
  };
  for (const Region& r : bad) {
    EXPECT_THROW(copy_region(good, r), ValidationError);
    EXPECT_THROW(pack(r, out), ValidationError);
    EXPECT_THROW(pack_range(r, 0, 4, out), ValidationError);
    EXPECT_THROW(zero_region(r), ValidationError);
    EXPECT_THROW(convert_region(r, DType::f32, good, DType::f32), ValidationError);
  }
  EXPECT_THROW((void)Region({a, 4, {1}, {0}, {std::int64_t{1} << 62}}).bytes(), ValidationError);
  const Box tile({{0, 4}, {0, 2}});
  EXPECT_THROW(Region::of(a, 4, tile, Box({{2, 6}, {0, 2}})), ValidationError);  // outside
  EXPECT_THROW(Region::of(a, 4, tile, Box({{0, 4}})), ValidationError);          // fewer dims
  EXPECT_NO_THROW(Region::of(a, 4, tile, Box({{1, 3}, {0, 1}})));
}

TEST(Region, IsContiguousCases) {
  struct Case {
    std::vector<std::int64_t> extent, offset, count;
    bool contiguous;
  };
  const Case cases[] = {
      {{8}, {2}, {3}, true},
      {{4, 4}, {0, 0}, {4, 4}, true},
      {{4, 4}, {1, 0}, {2, 4}, true},   // whole rows
      {{4, 4}, {1, 1}, {1, 2}, true},   // part of one row
      {{4, 4}, {1, 1}, {2, 2}, false},  // parts of two rows
      {{4, 4}, {0, 0}, {2, 3}, false},
      {{2, 3, 4}, {1, 0, 0}, {1, 3, 4}, true},
      {{2, 3, 4}, {0, 1, 0}, {1, 2, 4}, true},
      {{2, 3, 4}, {0, 1, 0}, {2, 2, 4}, false},
      {{2, 3, 4}, {1, 2, 1}, {1, 1, 3}, true},
      {{2, 3, 4}, {0, 0, 1}, {2, 3, 3}, false},
      {{5, 1, 1}, {1, 0, 0}, {3, 1, 1}, true},
      {{3, 5}, {0, 0}, {0, 5}, true},  // empty
  };
  for (const auto& c : cases) {
    const Region r{nullptr, 4, c.extent, c.offset, c.count};
    EXPECT_EQ(r.is_contiguous(), c.contiguous) << describe(r);
  }
}

TEST(Region, IsContiguousMatchesElementOffsets) {
  Rng rng(0xc047);
  for (int i = 0; i < testing::scaled(5000); ++i) {
    const std::size_t ndim = static_cast<std::size_t>(rng.between(1, 4));
    const Region r = random_region(rng, ndim, 2, nullptr, false);
    const auto off = offsets(r);
    bool run = true;
    for (std::size_t k = 1; k < off.size(); ++k) run = run && off[k] == off[k - 1] + 2;
    ASSERT_EQ(r.is_contiguous(), run) << describe(r);
  }
}

}  // namespace
}  // namespace meshcast
