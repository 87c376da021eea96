// Sparse gradient synchronisation: the sum over a group of gradients whose rows are mostly zero
// (embedding tables), with the traffic of the non-zero rows only.
//
// Methods:
// - Dense: all-reduce of the whole table (the baseline; traffic independent of density).
// - AllGather: every member's (index, row) pairs go to every member, which sums them all.
// - Balanced (Zen, "near-optimal sparse tensor synchronization"): each non-zero row index is
//   owned by one member, chosen by a hash that spreads skewed (Zipf) indices evenly; every
//   member pushes each row to its owner (all-to-all(v)), owners sum what they received, then
//   every owner's summed rows go to every member (all-gather(v)) — each row crosses the network
//   about twice, whatever the number of members that hold it. An owner sends its rows' indices
//   as a bitmap of the table's rows instead where that is smaller (more than rows / 64 rows).
// - Auto: the cheapest by a cost model of the bytes each method moves (sparse_traffic()); the
//   rows non-zero anywhere are counted first with an all-reduced sketch of at most 16 KiB
//   (exact up to 16,384 rows, a linear-counting estimate beyond).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "meshcast/collectives.h"

namespace meshcast {

// Rows of a (rows x width) f32 table; indices strictly increasing, values row after row.
struct SparseRows {
  std::int64_t rows = 0, width = 0;
  std::vector<std::int64_t> indices;
  std::vector<float> values;  // indices.size() * width

  // The rows of a dense table that hold a non-zero element.
  static SparseRows from_dense(std::span<const float> dense, std::int64_t rows, std::int64_t width);
  // Throws ValidationError("indices" / "values" / "rows") unless well formed (rows x width below
  // 2^63).
  void validate() const;
};

enum class SparseMethod { Auto, Dense, AllGather, Balanced };
std::string to_string(SparseMethod m);
SparseMethod parse_sparse_method(std::string_view text, const std::string& field = "method");

// The owner (0..members-1) of row `index` under the balanced scheme.
std::size_t sparse_owner(std::int64_t index, std::size_t members);

// Bytes the busiest member sends under `m` (its link is the bottleneck), given every member's
// non-zero row count and the number of rows non-zero anywhere: what Auto compares. Dense: the
// ring all-reduce's 2(n-1)/n of the table; AllGather (a ring all-gather of the records): all
// records but its successor's; Balanced: its records to their owners, then (n-1)/n of the
// summed distinct rows, each owner's indices as records or a bitmap, whichever is smaller.
double sparse_traffic(SparseMethod m, std::span<const std::int64_t> nonzero_rows,
                      std::int64_t distinct_rows, std::int64_t rows, std::int64_t width);

// Sums the members' `mine` over the group into `out` (rows * width floats, dense), on every
// member; every member passes the same rows, width, method and options (agreed first, one small
// all-reduce: members that differ all throw the same ValidationError, "rows", "width", "method"
// or "options", Error::agreed()). Float sums may differ from a serial sum by order, and a sum of
// zeros may be +0 where a serial sum gives -0 (a row of zeros is not sent). Returns the method
// used.
SparseMethod sparse_all_reduce(const Group& group, const SparseRows& mine, std::span<float> out,
                               SparseMethod method = SparseMethod::Auto,
                               const CollectiveOptions& options = {});

}  // namespace meshcast
