#include "meshcast/region.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>
#include <type_traits>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "meshcast/error.h"

namespace meshcast {
namespace {

// Walks the contiguous runs of one or two regions with equal counts: the trailing dimensions
// that both cover whole merge into one run, the outer ones are iterated. f(a_off, b_off, n)
// gets byte offsets and the run length in elements.
template <class F>
void for_each_run(const Region& a, const Region& b, F&& f) {
  const std::size_t ndim = a.count.size();
  if (ndim == 0) return f(0, 0, 1);  // a scalar: one element at the buffers' starts
  for (auto c : a.count)
    if (c <= 0) return;
  std::size_t d = ndim - 1;
  std::int64_t run = a.count[d];
  while (d > 0 && a.count[d] == a.extent[d] && b.count[d] == b.extent[d]) {
    --d;
    run *= a.count[d];
  }
  // Element strides of dims 0..d in each buffer.
  std::vector<std::int64_t> sa(ndim, 1), sb(ndim, 1);
  for (std::size_t i = ndim - 1; i > 0; --i) {
    sa[i - 1] = sa[i] * a.extent[i];
    sb[i - 1] = sb[i] * b.extent[i];
  }
  std::int64_t oa = 0, ob = 0;
  for (std::size_t i = 0; i < ndim; ++i) {
    oa += a.offset[i] * sa[i];
    ob += b.offset[i] * sb[i];
  }
  std::vector<std::int64_t> idx(d, 0);  // odometer over dims 0..d-1
  while (true) {
    f(oa * static_cast<std::int64_t>(a.elem_size), ob * static_cast<std::int64_t>(b.elem_size),
      run);
    std::size_t i = d;
    while (i-- > 0) {
      oa += sa[i];
      ob += sb[i];
      if (++idx[i] < a.count[i]) break;
      oa -= sa[i] * a.count[i];
      ob -= sb[i] * b.count[i];
      idx[i] = 0;
    }
    if (i == static_cast<std::size_t>(-1)) return;
  }
}

// Walks the parts of r's contiguous runs that hold bytes [lo, hi) of its packed form, starting
// at the run that holds byte lo (no walk from the first run: a chunk costs what it touches).
// f(buffer_offset, packed_offset, n) gets byte offsets and a length in bytes.
template <class F>
void for_each_run_in(const Region& r, std::size_t lo, std::size_t hi, F&& f) {
  if (lo >= hi) return;
  const std::size_t ndim = r.count.size();
  if (ndim == 0) return f(lo, lo, hi - lo);  // one element, at the buffer's start
  std::size_t d = ndim - 1;
  std::int64_t run = r.count[d];
  while (d > 0 && r.count[d] == r.extent[d]) {
    --d;
    run *= r.count[d];
  }
  const std::size_t run_bytes = static_cast<std::size_t>(run) * r.elem_size;
  std::vector<std::int64_t> stride(ndim, 1);  // in elements
  for (std::size_t i = ndim - 1; i > 0; --i) stride[i - 1] = stride[i] * r.extent[i];
  // The first run's index over dims 0..d-1 (the last fastest), and its buffer offset.
  std::vector<std::int64_t> idx(d, 0);
  std::int64_t at = 0;
  for (std::size_t i = 0; i < ndim; ++i) at += r.offset[i] * stride[i];
  std::size_t j = lo / run_bytes;
  for (std::size_t i = d; i-- > 0;) {
    idx[i] = static_cast<std::int64_t>(j % static_cast<std::size_t>(r.count[i]));
    j /= static_cast<std::size_t>(r.count[i]);
    at += idx[i] * stride[i];
  }
  std::size_t pos = lo - lo % run_bytes;  // packed offset of the current run
  while (pos < hi) {
    const std::size_t from = std::max(lo, pos), to = std::min(hi, pos + run_bytes);
    f(static_cast<std::size_t>(at) * r.elem_size + (from - pos), from, to - from);
    pos += run_bytes;
    std::size_t i = d;
    while (i-- > 0) {
      at += stride[i];
      if (++idx[i] < r.count[i]) break;
      at -= stride[i] * r.count[i];
      idx[i] = 0;
    }
  }
}

// A region built by hand must lie in its buffer: the walks below index by its fields alone.
void check_region(const Region& r) {
  const std::size_t n = r.count.size();
  if (r.extent.size() != n || r.offset.size() != n)
    throw ValidationError(
        "region", "extent, offset and count have " + std::to_string(r.extent.size()) + ", " +
                      std::to_string(r.offset.size()) + " and " + std::to_string(n) + " dims");
  if (r.elem_size < 1) throw ValidationError("region", "elem_size must be >= 1");
  for (std::size_t d = 0; d < n; ++d)
    if (r.count[d] < 0 || r.offset[d] < 0 || r.extent[d] < r.count[d] ||
        r.offset[d] > r.extent[d] - r.count[d])
      throw ValidationError("region",
                            "dim " + std::to_string(d) + ": offset " + std::to_string(r.offset[d]) +
                                " and count " + std::to_string(r.count[d]) +
                                " do not lie in an extent of " + std::to_string(r.extent[d]));
  (void)r.bytes();  // its size fits (else elements() throws)
}

void check_range(const Region& r, std::size_t offset, std::size_t bytes) {
  check_region(r);
  if (offset > r.bytes() || bytes > r.bytes() - offset)
    throw ValidationError("region", "byte range [" + std::to_string(offset) + ", " +
                                        std::to_string(offset + bytes) + ") outside a region of " +
                                        std::to_string(r.bytes()) + " bytes");
}

void check_same(const Region& a, const Region& b) {
  check_region(a);
  check_region(b);
  if (a.count != b.count || a.elem_size != b.elem_size)
    throw ValidationError("region", "regions of different shapes or element sizes");
}

template <class T>
void add_run(const std::byte* in, std::byte* out, std::int64_t n) {
  T* o = reinterpret_cast<T*>(out);
  const T* x = reinterpret_cast<const T*>(in);
  for (std::int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(o[i] + x[i]);
}

// Integers wrap modulo 2^bits (numpy's add), summed in the unsigned type of the same width
// since signed overflow is undefined behaviour.
template <class T>
void add_int_run(const std::byte* in, std::byte* out, std::int64_t n) {
  using U = std::make_unsigned_t<T>;
  T* o = reinterpret_cast<T*>(out);
  const T* x = reinterpret_cast<const T*>(in);
  for (std::int64_t i = 0; i < n; ++i)
    o[i] = static_cast<T>(static_cast<U>(static_cast<U>(o[i]) + static_cast<U>(x[i])));
}

// bool: the sum is logical or (numpy's add on bool), 0 or 1.
void add_bool_run(const std::byte* in, std::byte* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i)
    out[i] = static_cast<std::byte>((out[i] | in[i]) != std::byte{0});
}

// Complex: the real and imaginary parts add as two independent floats.
template <class T>
void add_complex_run(const std::byte* in, std::byte* out, std::int64_t n) {
  add_run<T>(in, out, 2 * n);
}

template <float (*ToF)(unsigned short), unsigned short (*FromF)(float)>
void add_half_run(const std::byte* in, std::byte* out, std::int64_t n) {
  unsigned short h_in, h_out;
  for (std::int64_t i = 0; i < n; ++i) {
    std::memcpy(&h_in, in + 2 * i, 2);
    std::memcpy(&h_out, out + 2 * i, 2);
    h_out = FromF(ToF(h_out) + ToF(h_in));
    std::memcpy(out + 2 * i, &h_out, 2);
  }
}

// Element kernels of convert_region. They choose with masks, not branches or ?: (which GCC
// turns back into branches around the float arithmetic, as that may trap), so that the run
// loops vectorise; and they give bit for bit what the scalar float_to_bf16 / float_to_half /
// half_to_float in dtype.cc give (tests/lib/algebra/cast_test.cc checks every input).
inline std::uint32_t pick(bool c, std::uint32_t if_true, std::uint32_t if_false) {
  const std::uint32_t m = 0u - static_cast<std::uint32_t>(c);
  return (if_true & m) | (if_false & ~m);
}

inline std::uint16_t bf16_of_f32(std::uint32_t x) {
  const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;  // nearest even
  const std::uint32_t nan = (x >> 16) | 0x40u;  // quiet, sign and top payload bits kept
  return static_cast<std::uint16_t>(pick((x & 0x7fffffffu) > 0x7f800000u, nan, rounded));
}

inline std::uint16_t half_of_f32(std::uint32_t x) {
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t a = x & 0x7fffffffu;
  // Normal: rebias 127 -> 15 and round to nearest even on the 13 dropped bits; a carry out of
  // the mantissa bumps the exponent, as it should.
  const std::uint32_t normal = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
  // Below 2^-14: adding 0.5f puts the half's subnormal unit (2^-24) on the float's last
  // mantissa bit, so the FPU's own round to nearest even rounds; the low bits are the half.
  const std::uint32_t sub =
      std::bit_cast<std::uint32_t>(std::bit_cast<float>(a) + 0.5f) - 0x3f000000u;
  std::uint32_t h = pick(a < 0x38800000u, sub, normal);
  h = pick(a >= 0x477ff000u, 0x7c00u, h);  // >= 65520 (and inf) round to inf
  h = pick(a > 0x7f800000u, 0x7e00u, h);   // NaN: quiet, sign kept
  return static_cast<std::uint16_t>(sign | h);
}

inline std::uint32_t f32_of_bf16(std::uint16_t h) { return std::uint32_t{h} << 16; }

inline std::uint32_t f32_of_half(std::uint16_t h) {
  const std::uint32_t sign = (std::uint32_t{h} & 0x8000u) << 16;
  const std::uint32_t em = (std::uint32_t{h} & 0x7fffu) << 13;  // on the float's bit positions
  const std::uint32_t exp = em & 0x0f800000u;
  const std::uint32_t normal = em + 0x38000000u;   // rebias 15 -> 127
  const std::uint32_t special = em + 0x70000000u;  // inf, NaN (payload kept): exponent 255
  // Subnormal man * 2^-24: 2^-14 * (1 + man/1024) - 2^-14, both steps exact.
  const std::uint32_t sub = std::bit_cast<std::uint32_t>(std::bit_cast<float>(em + 0x38800000u) -
                                                         std::bit_cast<float>(0x38800000u));
  return sign | pick(exp == 0, sub, pick(exp == 0x0f800000u, special, normal));
}

inline std::uint16_t half_of_bf16(std::uint16_t h) { return half_of_f32(f32_of_bf16(h)); }
inline std::uint16_t bf16_of_half(std::uint16_t h) { return bf16_of_f32(f32_of_half(h)); }

// One contiguous run; memcpy loads and stores because only the regions' element sizes, not
// their alignment, are known.
template <class In, class Out, Out (*F)(In)>
void convert_run(const std::byte* __restrict in, std::byte* __restrict out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    In x;
    std::memcpy(&x, in + i * static_cast<std::int64_t>(sizeof(In)), sizeof(In));
    const Out y = F(x);
    std::memcpy(out + i * static_cast<std::int64_t>(sizeof(Out)), &y, sizeof(Out));
  }
}

#if defined(__SSE2__)
// The narrowing kernels again, four lanes at a time. GCC vectorises the loops above, but has
// only shuffles (SSE2 has no packusdw) to narrow 32-bit lanes to 16: these compute each result
// sign-extended to 32 bits instead, so that packs_epi32's saturation never bites and narrows
// them in one instruction (1.6x on f32 -> bf16, close to a memcpy of the same bytes).
inline __m128i select4(__m128i mask, __m128i if_true, __m128i if_false) {
  return _mm_or_si128(_mm_and_si128(mask, if_true), _mm_andnot_si128(mask, if_false));
}

inline __m128i bf16_of_f32x4(__m128i x) {
  const __m128i lsb = _mm_and_si128(_mm_srli_epi32(x, 16), _mm_set1_epi32(1));
  const __m128i rounded =
      _mm_srai_epi32(_mm_add_epi32(_mm_add_epi32(x, _mm_set1_epi32(0x7fff)), lsb), 16);
  const __m128i nan = _mm_or_si128(_mm_srai_epi32(x, 16), _mm_set1_epi32(0x40));
  const __m128i is_nan =
      _mm_cmpgt_epi32(_mm_and_si128(x, _mm_set1_epi32(0x7fffffff)), _mm_set1_epi32(0x7f800000));
  return select4(is_nan, nan, rounded);
}

inline __m128i half_of_f32x4(__m128i x) {
  const __m128i a = _mm_and_si128(x, _mm_set1_epi32(0x7fffffff));  // signed compares are fine
  const __m128i lsb = _mm_and_si128(_mm_srli_epi32(a, 13), _mm_set1_epi32(1));
  const __m128i normal = _mm_srli_epi32(
      _mm_add_epi32(_mm_add_epi32(a, _mm_set1_epi32(static_cast<int>(0xc8000fffu))), lsb), 13);
  const __m128i sub =
      _mm_sub_epi32(_mm_castps_si128(_mm_add_ps(_mm_castsi128_ps(a), _mm_set1_ps(0.5f))),
                    _mm_set1_epi32(0x3f000000));
  __m128i h = select4(_mm_cmplt_epi32(a, _mm_set1_epi32(0x38800000)), sub, normal);
  h = select4(_mm_cmpgt_epi32(a, _mm_set1_epi32(0x477fefff)), _mm_set1_epi32(0x7c00), h);
  h = select4(_mm_cmpgt_epi32(a, _mm_set1_epi32(0x7f800000)), _mm_set1_epi32(0x7e00), h);
  const __m128i sign = _mm_and_si128(_mm_srai_epi32(x, 31), _mm_set1_epi32(-0x8000));
  return _mm_or_si128(h, sign);
}

template <__m128i (*F4)(__m128i), std::uint16_t (*F)(std::uint32_t)>
void narrow_run(const std::byte* __restrict in, std::byte* __restrict out, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 4 * i));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 4 * i + 16));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), _mm_packs_epi32(F4(lo), F4(hi)));
  }
  convert_run<std::uint32_t, std::uint16_t, F>(in + 4 * i, out + 2 * i, n - i);
}
#endif

}  // namespace

Region Region::of(void* base, std::size_t elem_size, const Box& tile, const Box& box) {
  if (box.ndim() != tile.ndim() || !tile.contains(box))
    throw ValidationError("box", box.str() + " does not lie in the tile " + tile.str());
  Region r;
  r.base = base;
  r.elem_size = elem_size;
  for (std::size_t d = 0; d < tile.ndim(); ++d) {
    r.extent.push_back(tile[d].size());
    r.offset.push_back(box[d].lo - tile[d].lo);
    r.count.push_back(box[d].size());
  }
  return r;
}

Region Region::contiguous(void* base, std::size_t bytes) {
  const auto n = static_cast<std::int64_t>(bytes);
  return Region{base, 1, {n}, {0}, {n}};
}

std::int64_t Region::elements() const {
  std::int64_t n = 1, bytes = 0;
  for (auto c : count)
    if (c < 0 || __builtin_mul_overflow(n, c, &n))
      throw ValidationError("region", c < 0 ? "a count is negative" : "its count overflows");
  if (__builtin_mul_overflow(n, static_cast<std::int64_t>(elem_size), &bytes))
    throw ValidationError("region", "its bytes overflow");
  return n;
}

bool Region::is_contiguous() const {
  // Whole trailing dimensions, then at most one partial one, then only extents of 1.
  std::size_t d = count.size();
  while (d > 0 && count[d - 1] == extent[d - 1]) --d;
  for (std::size_t i = 0; i + 1 < d; ++i)
    if (count[i] != 1) return elements() == 0;
  return true;
}

void* Region::origin() const {
  std::int64_t off = 0, stride = 1;  // in elements, row-major
  for (std::size_t d = extent.size(); d-- > 0;) {
    off += offset[d] * stride;
    stride *= extent[d];
  }
  return static_cast<std::byte*>(base) + off * static_cast<std::int64_t>(elem_size);
}

void copy_region(const Region& from, const Region& to) {
  check_same(from, to);
  const auto* src = static_cast<const std::byte*>(from.base);
  auto* dst = static_cast<std::byte*>(to.base);
  for_each_run(from, to, [&](std::int64_t a, std::int64_t b, std::int64_t n) {
    std::memcpy(dst + b, src + a, static_cast<std::size_t>(n) * from.elem_size);
  });
}

Region Region::packed_like(const Region& r, void* base) {
  return Region{base, r.elem_size, r.count, std::vector<std::int64_t>(r.count.size(), 0), r.count};
}

void pack(const Region& from, void* out) { copy_region(from, Region::packed_like(from, out)); }

void unpack(const void* in, const Region& to) {
  copy_region(Region::packed_like(to, const_cast<void*>(in)), to);
}

void pack_range(const Region& from, std::size_t offset, std::size_t bytes, void* out) {
  check_range(from, offset, bytes);
  const auto* src = static_cast<const std::byte*>(from.base);
  auto* dst = static_cast<std::byte*>(out);
  for_each_run_in(from, offset, offset + bytes, [&](std::size_t a, std::size_t p, std::size_t n) {
    std::memcpy(dst + (p - offset), src + a, n);
  });
}

void unpack_range(const void* in, const Region& to, std::size_t offset, std::size_t bytes) {
  check_range(to, offset, bytes);
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(to.base);
  for_each_run_in(to, offset, offset + bytes, [&](std::size_t a, std::size_t p, std::size_t n) {
    std::memcpy(dst + a, src + (p - offset), n);
  });
}

void accumulate(const Region& from, const Region& to, DType dtype) {
  check_same(from, to);
  if (dtype_size(dtype) != to.elem_size)
    throw ValidationError("region", "element size does not match dtype " + to_string(dtype));
  const auto* src = static_cast<const std::byte*>(from.base);
  auto* dst = static_cast<std::byte*>(to.base);
  void (*add)(const std::byte*, std::byte*, std::int64_t) = nullptr;
  switch (dtype) {
    case DType::f16:
      add = add_half_run<half_to_float, float_to_half>;
      break;
    case DType::bf16:
      add = add_half_run<bf16_to_float, float_to_bf16>;
      break;
    case DType::f32:
      add = add_run<float>;
      break;
    case DType::f64:
      add = add_run<double>;
      break;
    case DType::i8:
      add = add_int_run<std::int8_t>;
      break;
    case DType::i16:
      add = add_int_run<std::int16_t>;
      break;
    case DType::i32:
      add = add_int_run<std::int32_t>;
      break;
    case DType::i64:
      add = add_int_run<std::int64_t>;
      break;
    case DType::u8:
      add = add_int_run<std::uint8_t>;
      break;
    case DType::u16:
      add = add_int_run<std::uint16_t>;
      break;
    case DType::u32:
      add = add_int_run<std::uint32_t>;
      break;
    case DType::u64:
      add = add_int_run<std::uint64_t>;
      break;
    case DType::b8:
      add = add_bool_run;
      break;
    case DType::c64:
      add = add_complex_run<float>;
      break;
    case DType::c128:
      add = add_complex_run<double>;
      break;
  }
  for_each_run(from, to,
               [&](std::int64_t a, std::int64_t b, std::int64_t n) { add(src + a, dst + b, n); });
}

void zero_region(const Region& r) {
  check_region(r);
  auto* dst = static_cast<std::byte*>(r.base);
  for_each_run(r, r, [&](std::int64_t a, std::int64_t, std::int64_t n) {
    std::memset(dst + a, 0, static_cast<std::size_t>(n) * r.elem_size);
  });
}

void convert_region(const Region& from, DType from_type, const Region& to, DType to_type) {
  using U16 = std::uint16_t;
  using U32 = std::uint32_t;
  void (*run)(const std::byte*, std::byte*, std::int64_t) = nullptr;
#if defined(__SSE2__)
  if (from_type == DType::f32 && to_type == DType::bf16)
    run = narrow_run<bf16_of_f32x4, bf16_of_f32>;
  else if (from_type == DType::f32 && to_type == DType::f16)
    run = narrow_run<half_of_f32x4, half_of_f32>;
#else
  if (from_type == DType::f32 && to_type == DType::bf16)
    run = convert_run<U32, U16, bf16_of_f32>;
  else if (from_type == DType::f32 && to_type == DType::f16)
    run = convert_run<U32, U16, half_of_f32>;
#endif
  else if (from_type == DType::bf16 && to_type == DType::f32)
    run = convert_run<U16, U32, f32_of_bf16>;
  else if (from_type == DType::f16 && to_type == DType::f32)
    run = convert_run<U16, U32, f32_of_half>;
  else if (from_type == DType::bf16 && to_type == DType::f16)
    run = convert_run<U16, U16, half_of_bf16>;
  else if (from_type == DType::f16 && to_type == DType::bf16)
    run = convert_run<U16, U16, bf16_of_half>;
  else if (from_type != to_type)
    throw ValidationError("dtype", "cannot convert " + to_string(from_type) + " to " +
                                       to_string(to_type) +
                                       " (conversions are among f32, bf16 and f16)");
  check_region(from);
  check_region(to);
  if (from.count != to.count)
    throw ValidationError("region", "converting between regions of different shapes");
  if (from.elem_size != dtype_size(from_type) || to.elem_size != dtype_size(to_type))
    throw ValidationError("region", "element sizes do not match dtypes " + to_string(from_type) +
                                        " and " + to_string(to_type));
  if (!run) return copy_region(from, to);
  const auto* src = static_cast<const std::byte*>(from.base);
  auto* dst = static_cast<std::byte*>(to.base);
  for_each_run(from, to,
               [&](std::int64_t a, std::int64_t b, std::int64_t n) { run(src + a, dst + b, n); });
}

}  // namespace meshcast
