#include "meshcast/region.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "meshcast/error.h"

namespace meshcast {
namespace {

// Walks the contiguous runs of one or two regions with equal counts: the trailing dimensions
// that both cover whole merge into one run, the outer ones are iterated. f(a_off, b_off, n)
// gets byte offsets and the run length in elements.
template <class F>
void for_each_run(const Region& a, const Region& b, F&& f) {
  const std::size_t ndim = a.count.size();
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

void check_range(const Region& r, std::size_t offset, std::size_t bytes) {
  if (offset > r.bytes() || bytes > r.bytes() - offset)
    throw ValidationError("region", "byte range [" + std::to_string(offset) + ", " +
                                        std::to_string(offset + bytes) + ") outside a region of " +
                                        std::to_string(r.bytes()) + " bytes");
}

void check_same(const Region& a, const Region& b) {
  if (a.count != b.count || a.elem_size != b.elem_size)
    throw ValidationError("region", "regions of different shapes or element sizes");
}

template <class T>
void add_run(const std::byte* in, std::byte* out, std::int64_t n) {
  T* o = reinterpret_cast<T*>(out);
  const T* x = reinterpret_cast<const T*>(in);
  for (std::int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(o[i] + x[i]);
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

}  // namespace

Region Region::of(void* base, std::size_t elem_size, const Box& tile, const Box& box) {
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
  std::int64_t n = 1;
  for (auto c : count) n *= c;
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
      add = add_run<std::int8_t>;
      break;
    case DType::i32:
      add = add_run<std::int32_t>;
      break;
    case DType::i64:
      add = add_run<std::int64_t>;
      break;
  }
  for_each_run(from, to,
               [&](std::int64_t a, std::int64_t b, std::int64_t n) { add(src + a, dst + b, n); });
}

void zero_region(const Region& r) {
  auto* dst = static_cast<std::byte*>(r.base);
  for_each_run(r, r, [&](std::int64_t a, std::int64_t, std::int64_t n) {
    std::memset(dst + a, 0, static_cast<std::size_t>(n) * r.elem_size);
  });
}

}  // namespace meshcast
