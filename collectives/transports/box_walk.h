// A box of two regions as the GPU kernels walk it: rows of contiguous words. Dimensions that
// are contiguous in both buffers merge into one, and a word is the widest power of two up to
// 16 bytes that every address divides, so a kernel moves 16 bytes per access where the layout
// lets it and computes a word's place with one division per dimension left. Host code: the
// kernels call locate(), and so do the CPU tests that check it against element-wise copies.
// Internal to collectives/.
#pragma once

#include <cstdint>

#include "meshcast/region.h"

#if defined(__CUDACC__)
#define MESHCAST_HOST_DEVICE __host__ __device__
#else
#define MESHCAST_HOST_DEVICE
#endif

namespace meshcast::detail {

// Regions of rank <= kMaxRank (the tensor ranks meshcast supports on GPUs).
inline constexpr int kMaxRank = 8;

struct BoxWalk {
  int word = 1;                // bytes per word: 1, 2, 4, 8 or 16
  int outer = 0;               // dimensions outside a row, outermost first
  long long row = 1;           // words per row
  long long count[kMaxRank];   // the outer dimensions' counts
  long long step_a[kMaxRank];  // and their strides in words, in each buffer
  long long step_b[kMaxRank];
  long long first_a = 0;  // bytes from each region's base to the box's first element, where
  long long first_b = 0;  // the kernels' words are counted from

  long long words() const {
    long long n = row;
    for (int d = 0; d < outer; ++d) n *= count[d];
    return n;
  }

  // Word offsets of the i-th word of the box (row-major) from the box's first element.
  template <class Index>
  MESHCAST_HOST_DEVICE void locate(Index i, long long& a, long long& b) const {
    Index r = i / static_cast<Index>(row);
    const Index col = i - r * static_cast<Index>(row);
    a = b = static_cast<long long>(col);
    // The outermost dimension's index is what is left: no division for it.
    for (int d = outer - 1; d > 0; --d) {
      const Index q = r / static_cast<Index>(count[d]);
      const long long c = static_cast<long long>(r - q * static_cast<Index>(count[d]));
      a += c * step_a[d];
      b += c * step_b[d];
      r = q;
    }
    if (outer > 0) {
      a += static_cast<long long>(r) * step_a[0];
      b += static_cast<long long>(r) * step_b[0];
    }
  }
};

// The walk of `from`'s box into `to`'s (equal counts and ranks <= kMaxRank; the caller checks)
// in the widest words of max_word bytes or fewer (powers of two) that every address divides,
// and never narrower than min_word, a power of two that divides the element size (the caller
// vouches for that alignment, as for the elements themselves).
inline BoxWalk box_walk(const Region& from, const Region& to, int max_word, int min_word) {
  struct Dim {
    long long count, step_a, step_b;  // in elements
  };
  const int rank = static_cast<int>(from.count.size());
  Dim dims[kMaxRank];
  int n = 0;
  long long first_a = 0, first_b = 0, sa = 1, sb = 1;
  for (int d = rank - 1; d >= 0; --d) {
    first_a += from.offset[d] * sa;
    first_b += to.offset[d] * sb;
    if (from.count[d] != 1) dims[n++] = {from.count[d], sa, sb};  // innermost first
    sa *= from.extent[d];
    sb *= to.extent[d];
  }
  // Merge a dimension into the one inside it where both buffers lay them end to end.
  int m = 0;
  for (int i = 0; i < n; ++i) {
    if (m > 0 && dims[i].step_a == dims[m - 1].count * dims[m - 1].step_a &&
        dims[i].step_b == dims[m - 1].count * dims[m - 1].step_b) {
      dims[m - 1].count *= dims[i].count;
    } else {
      dims[m++] = dims[i];
    }
  }
  // The row: the innermost dimension where it is contiguous in both, else one element.
  const long long es = static_cast<long long>(from.elem_size);
  long long row_bytes = es;
  int inner = 0;
  if (m > 0 && dims[0].step_a == 1 && dims[0].step_b == 1) {
    row_bytes = dims[0].count * es;
    inner = 1;
  }
  // Every address a word is read or written at: the first elements, a row, the strides. (A
  // word of 2^k bytes fits where the low k bits of all of them are zero.)
  std::uint64_t any = (reinterpret_cast<std::uintptr_t>(from.base) + first_a * es) |
                      (reinterpret_cast<std::uintptr_t>(to.base) + first_b * es) |
                      static_cast<std::uint64_t>(row_bytes);
  for (int i = inner; i < m; ++i)
    any |= static_cast<std::uint64_t>(dims[i].step_a * es) |
           static_cast<std::uint64_t>(dims[i].step_b * es);
  int word = max_word;
  while (word > min_word && any % static_cast<std::uint64_t>(word) != 0) word /= 2;
  BoxWalk out{};
  out.word = word;
  out.row = row_bytes / word;
  out.first_a = first_a * es;
  out.first_b = first_b * es;
  out.outer = m - inner;
  for (int i = inner; i < m; ++i) {  // outermost first
    const int d = m - 1 - i;
    out.count[d] = dims[i].count;
    out.step_a[d] = dims[i].step_a * es / word;
    out.step_b[d] = dims[i].step_b * es / word;
  }
  return out;
}

}  // namespace meshcast::detail
