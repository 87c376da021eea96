#include <bit>
#include <cstring>
#include <limits>

#include "meshcast/error.h"
#include "meshcast/testing.h"

namespace meshcast {
namespace {

// Values are below these bounds (primes, as periods once were), which keep |value| + (addends - 1)
// within the exact integers of each dtype for up to 64 addends: bf16 (256), i8 (127), f16 (2048),
// f32 and c64's parts (2^24), and below the top of each unsigned type (whose addends may wrap below
// zero: the sum wraps back). bool has none (see test_value).
std::int64_t bound(DType t) {
  switch (t) {
    case DType::i8:
      return 61;
    case DType::bf16:
    case DType::u8:
      return 191;
    case DType::f16:
      return 1021;
    case DType::i16:
      return 32693;
    case DType::u16:
      return 65449;
    case DType::f32:
    case DType::c64:
      return 16000057;
    case DType::i32:
      return 2147483629;
    case DType::u32:
      return 4294967231;
    case DType::f64:
    case DType::i64:
    case DType::u64:
    case DType::b8:
    case DType::c128:
      return 0;
  }
  return 0;
}

template <class T>
void put(void* p, T v) {
  std::memcpy(p, &v, sizeof v);
}
template <class T>
T get(const void* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Integers are stored modulo 2^bits (a negative addend of an unsigned type wraps); complex
// numbers as (v, -v), so that both parts are checked and a swap of them is seen.
void store(void* p, DType t, std::int64_t v) {
  switch (t) {
    case DType::f16:
      return put(p, float_to_half(static_cast<float>(v)));
    case DType::bf16:
      return put(p, float_to_bf16(static_cast<float>(v)));
    case DType::f32:
      return put(p, static_cast<float>(v));
    case DType::f64:
      return put(p, static_cast<double>(v));
    case DType::i8:
      return put(p, static_cast<std::int8_t>(v));
    case DType::i16:
      return put(p, static_cast<std::int16_t>(v));
    case DType::i32:
      return put(p, static_cast<std::int32_t>(v));
    case DType::i64:
      return put(p, v);
    case DType::u8:
      return put(p, static_cast<std::uint8_t>(v));
    case DType::u16:
      return put(p, static_cast<std::uint16_t>(v));
    case DType::u32:
      return put(p, static_cast<std::uint32_t>(v));
    case DType::u64:
      return put(p, static_cast<std::uint64_t>(v));
    case DType::b8:
      return put(p, static_cast<std::uint8_t>(v != 0));
    case DType::c64:
      put(p, static_cast<float>(v));
      return put(static_cast<std::byte*>(p) + 4, static_cast<float>(-v));
    case DType::c128:
      put(p, static_cast<double>(v));
      return put(static_cast<std::byte*>(p) + 8, static_cast<double>(-v));
  }
}

bool equals(const void* p, DType t, std::int64_t v) {
  const auto* b = static_cast<const std::byte*>(p);
  switch (t) {
    case DType::f16:
      return half_to_float(get<unsigned short>(p)) == static_cast<float>(v);
    case DType::bf16:
      return bf16_to_float(get<unsigned short>(p)) == static_cast<float>(v);
    case DType::f32:
      return get<float>(p) == static_cast<float>(v);
    case DType::f64:
      return get<double>(p) == static_cast<double>(v);
    case DType::i8:
      return get<std::int8_t>(p) == v;
    case DType::i16:
      return get<std::int16_t>(p) == v;
    case DType::i32:
      return get<std::int32_t>(p) == v;
    case DType::i64:
      return get<std::int64_t>(p) == v;
    case DType::u8:
      return get<std::uint8_t>(p) == static_cast<std::uint8_t>(v);
    case DType::u16:
      return get<std::uint16_t>(p) == static_cast<std::uint16_t>(v);
    case DType::u32:
      return get<std::uint32_t>(p) == static_cast<std::uint32_t>(v);
    case DType::u64:
      return get<std::uint64_t>(p) == static_cast<std::uint64_t>(v);
    case DType::b8:  // the byte itself: a bool other than 0 or 1 is wrong
      return get<std::uint8_t>(p) == (v != 0);
    case DType::c64:
      return get<float>(b) == static_cast<float>(v) && get<float>(b + 4) == static_cast<float>(-v);
    case DType::c128:
      return get<double>(b) == static_cast<double>(v) &&
             get<double>(b + 8) == static_cast<double>(-v);
  }
  return false;
}

// The addends after the first that hold an offset: any partial sum, in any order, then stays
// within the float type's exact integers (|v| < bound, each offset within 1). The later ones
// hold 0 (a bf16 sum of 100 addends was checked wrong in the rounding of its partial sums).
std::int64_t offset_addends(DType t) {
  const auto exact_beyond_bound = [&](std::int64_t exact) { return exact - bound(t) + 1; };
  switch (t) {
    case DType::bf16:
      return exact_beyond_bound(256);
    case DType::f16:
      return exact_beyond_bound(2048);
    case DType::f32:
    case DType::c64:
      return exact_beyond_bound(std::int64_t{1} << 24);
    default:  // exact: integers wrap, f64 and c128 hold any index
      return std::numeric_limits<std::int64_t>::max();
  }
}

// Addend g of G for element i: small offsets in {-1, 0, 1} for 1 <= g <= offset_addends, the
// rest in addend 0.
std::int64_t offset(std::int64_t i, std::int64_t g, DType t) {
  return g <= offset_addends(t) ? (i + 3 * g) % 3 - 1 : 0;
}
std::int64_t addend(std::int64_t i, std::int64_t v, std::int64_t g, std::int64_t groups, DType t) {
  // bool sums by or: addend i % groups holds v, some others hold it too (never 1 when v is 0).
  if (t == DType::b8) return v != 0 && (g == i % groups || (i + g) % 3 == 0);
  if (g > 0) return offset(i, g, t);
  std::int64_t a = v;
  for (std::int64_t k = 1; k < groups && k <= offset_addends(t); ++k) a -= offset(i, k, t);
  return a;
}

// Calls f(global index of its first element, elements, pointer to it) for every row of a
// device's tile (the run of its last dimension, contiguous in both).
template <class F>
void for_each_row(const Layout& l, int device, void* local, F&& f) {
  const Box tile = l.tile_of(device);
  if (tile.empty()) return;
  const std::size_t ndim = l.ndim(), elem = dtype_size(l.dtype());
  std::vector<std::int64_t> stride(ndim, 1);
  for (std::size_t d = ndim - 1; d > 0; --d) stride[d - 1] = stride[d] * l.shape()[d];
  std::vector<std::int64_t> idx = tile.origin();
  auto* p = static_cast<std::byte*>(local);
  const std::int64_t row = tile[ndim - 1].size();
  while (true) {
    std::int64_t g = 0;
    for (std::size_t d = 0; d < ndim; ++d) g += idx[d] * stride[d];
    f(g, row, p);
    p += static_cast<std::size_t>(row) * elem;
    std::size_t d = ndim - 1;
    while (d-- > 0) {
      if (++idx[d] < tile[d].hi) break;
      idx[d] = tile[d].lo;
    }
    if (d == static_cast<std::size_t>(-1)) return;
  }
}

// The offset of block b of p consecutive elements (splitmix64's finalizer of b, mod p).
std::int64_t block_offset(std::int64_t b, std::int64_t p) {
  auto z = static_cast<std::uint64_t>(b) + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return static_cast<std::int64_t>((z ^ (z >> 31)) % static_cast<std::uint64_t>(p));
}

// test_value(i), test_value(i + 1), ...: a row's values with a division per block of p, not
// four per element (a verified sync of 500 MB spent most of its time here).
class TestValues {
 public:
  TestValues(std::int64_t i, DType t) : i_(static_cast<std::uint64_t>(i)), t_(t), p_(bound(t)) {
    if (!p_) return;
    block_ = i / p_;
    pos_ = i % p_;
    offset_ = block_offset(block_, p_);
  }
  std::int64_t next() {
    // bool: the parity of i's bits (Thue-Morse): not periodic, so a shifted element shows.
    if (t_ == DType::b8) return std::popcount(i_++) & 1;
    if (!p_) return static_cast<std::int64_t>(i_++);
    // i's place in its block of p consecutive elements, which always differ (a shift by fewer
    // than p is seen), offset by a hash of the block's number: i % p alone repeated every p
    // elements, so a row moved to another row of a tensor whose rows are a multiple of p long
    // (191 bf16 elements) matched element for element. Now two blocks match by chance only, one
    // in p.
    std::int64_t v = pos_ + offset_;
    if (v >= p_) v -= p_;
    if (++pos_ == p_) {
      pos_ = 0;
      offset_ = block_offset(++block_, p_);
    }
    return v;
  }

 private:
  std::uint64_t i_;  // b8 and the unbounded types: the next index (unsigned: i = 2^63 - 1 is one)
  DType t_;
  std::int64_t p_, block_ = 0, pos_ = 0, offset_ = 0;
};

}  // namespace

std::int64_t test_value(std::int64_t i, DType dtype) { return TestValues(i, dtype).next(); }

void fill_source(const Layout& src, int device, void* local) {
  const auto index = src.mesh().index_of(device);
  if (!index)
    throw ValidationError("device", std::to_string(device) + " is not in the source mesh");
  const std::int64_t g = src.partial_group(*index), groups = src.partial_groups();
  const DType t = src.dtype();
  const std::size_t elem = dtype_size(t);
  for_each_row(src, device, local, [&](std::int64_t i, std::int64_t n, std::byte* p) {
    TestValues values(i, t);
    for (std::int64_t k = i; k < i + n; ++k, p += elem) {
      const std::int64_t v = values.next();
      store(p, t, groups == 1 ? v : addend(k, v, g, groups, t));
    }
  });
}

std::int64_t count_mismatches(const Layout& dst, int device, const void* local) {
  const auto index = dst.mesh().index_of(device);
  if (!index)
    throw ValidationError("device", std::to_string(device) + " is not in the target mesh");
  const bool zero = dst.partial_group(*index) != 0;
  const DType t = dst.dtype();
  std::int64_t wrong = 0;
  const std::size_t elem = dtype_size(t);
  for_each_row(dst, device, const_cast<void*>(local),
               [&](std::int64_t i, std::int64_t n, std::byte* p) {
                 TestValues values(i, t);
                 for (std::int64_t k = 0; k < n; ++k, p += elem)
                   wrong += !equals(p, t, zero ? 0 : values.next());
               });
  return wrong;
}

}  // namespace meshcast
