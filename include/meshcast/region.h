// A region: a box inside a device's row-major local buffer. What communicators move, so that
// strided boxes travel without an extra pack where the backend can avoid it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "meshcast/box.h"
#include "meshcast/dtype.h"

namespace meshcast {

struct Region {
  void* base = nullptr;              // the local buffer
  std::size_t elem_size = 1;         // bytes per element
  std::vector<std::int64_t> extent;  // shape of the local buffer (the device's tile)
  std::vector<std::int64_t> offset;  // box origin inside the local buffer
  std::vector<std::int64_t> count;   // box extents

  // The region of global box `box` inside the buffer of a device whose tile is `tile`
  // (ValidationError("box") unless the tile contains it).
  static Region of(void* base, std::size_t elem_size, const Box& tile, const Box& box);
  // A buffer holding r's box packed (row-major, its extent equal to its count).
  static Region packed_like(const Region& r, void* base);
  // A contiguous buffer of `bytes` bytes.
  static Region contiguous(void* base, std::size_t bytes);

  // ValidationError("region") for a negative count, or elements or bytes past 2^63 - 1.
  std::int64_t elements() const;
  std::size_t bytes() const { return static_cast<std::size_t>(elements()) * elem_size; }
  // True when the box is one contiguous run of the buffer.
  bool is_contiguous() const;
  // Address of the box's first element (for a contiguous region: the start of its run).
  void* origin() const;
};

// Copies between two regions of equal counts and element sizes. These functions throw
// ValidationError("region") for regions of other counts, or one that does not lie in its
// buffer (extent, offset and count of one ndim, 0 <= offset <= extent - count).
void copy_region(const Region& from, const Region& to);
// Packs a region into a contiguous buffer of from.bytes() bytes, and the inverse.
void pack(const Region& from, void* out);
void unpack(const void* in, const Region& to);
// The same for bytes [offset, offset + bytes) of the packed form only (a chunk of a pipelined
// transfer staged through a small buffer): pack_range writes them to out[0, bytes),
// unpack_range reads them from in[0, bytes). Ranges need not align with elements or rows.
void pack_range(const Region& from, std::size_t offset, std::size_t bytes, void* out);
void unpack_range(const void* in, const Region& to, std::size_t offset, std::size_t bytes);
// to += from, element-wise in `dtype` (half types summed in float, rounded once per add;
// integers wrap modulo 2^bits; bool is logical or; complex adds componentwise).
void accumulate(const Region& from, const Region& to, DType dtype);
// Zero-fills a region.
void zero_region(const Region& r);
// Converts element-wise between two regions of equal counts whose elem_size are the dtypes'
// sizes (regions must not overlap). Narrowing rounds to nearest even as float_to_bf16 and
// float_to_half do (NaN stays a quiet NaN with its sign, f16 overflows to inf); widening is
// exact. Supports f32 <-> bf16, f32 <-> f16, bf16 <-> f16 (exact through f32, one rounding) and
// any dtype to itself (copy_region); other pairs throw ValidationError("dtype", ...).
void convert_region(const Region& from, DType from_type, const Region& to, DType to_type);

}  // namespace meshcast
