// Sparse gradient synchronisation (meshcast/sparse.h) on top of the collectives: rows travel
// packed as (index, width floats) records, or an owner's summed rows as a bitmap of the table
// followed by their values, whichever is smaller.
#include "meshcast/sparse.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "lib/support/agreed.h"
#include "lib/support/fnv.h"
#include "lib/support/spread.h"
#include "lib/support/text.h"
#include "meshcast/error.h"
#include "meshcast/topology.h"

namespace meshcast {
namespace {

std::size_t record_bytes(std::int64_t width) {
  return sizeof(std::int64_t) + static_cast<std::size_t>(width) * sizeof(float);
}

// Appends the record of row `index` with values `v` to `out`.
void pack_row(std::vector<std::byte>& out, std::int64_t index, const float* v, std::int64_t width) {
  const std::size_t at = out.size();
  out.resize(at + record_bytes(width));
  std::memcpy(out.data() + at, &index, sizeof index);
  std::memcpy(out.data() + at + sizeof index, v, static_cast<std::size_t>(width) * sizeof(float));
}

// An owner's summed rows in the pull (Zen): `count` records, or, where that is smaller, a
// bitmap of the table's `rows` (bit i of byte i / 8 for row i) and the values in index order.
std::int64_t bitmap_bytes(std::int64_t rows) { return (rows + 7) / 8; }
bool as_bitmap(std::int64_t count, std::int64_t rows) {
  return count * static_cast<std::int64_t>(sizeof(std::int64_t)) > bitmap_bytes(rows);
}
std::int64_t owned_bytes(std::int64_t count, std::int64_t rows, std::int64_t width) {
  return as_bitmap(count, rows)
             ? bitmap_bytes(rows) + count * width * static_cast<std::int64_t>(sizeof(float))
             : count * static_cast<std::int64_t>(record_bytes(width));
}

// Calls f(index, values) for each record of `bytes`.
template <class F>
void for_each_row(const std::byte* bytes, std::size_t n, std::int64_t width, F&& f) {
  const std::size_t rb = record_bytes(width);
  for (std::size_t k = 0; k < n; ++k) {
    std::int64_t index = 0;
    std::memcpy(&index, bytes + k * rb, sizeof index);
    f(index, reinterpret_cast<const float*>(bytes + k * rb + sizeof index));
  }
}

// The options for a small collective: recursive doubling, whose log2(n) rounds beat the ring's
// n - 1 where latency, not bytes, is the cost.
CollectiveOptions latency_bound(CollectiveOptions o) {
  o.algorithm = Algorithm::RecursiveDoubling;
  return o;
}

// Every member's block (bytes[j] from member j), in group order.
std::vector<std::byte> gather_blocks(const Group& group, const std::vector<std::byte>& mine,
                                     const std::vector<std::int64_t>& bytes,
                                     const CollectiveOptions& o) {
  std::vector<std::byte> all(
      static_cast<std::size_t>(std::accumulate(bytes.begin(), bytes.end(), std::int64_t{0})));
  all_gatherv(group, mine.data(), all.data(), bytes, DType::i8, o);
  return all;
}

// Every member's value of x, in group order: a sum of vectors that are zero but at the member's
// own slot, by recursive doubling (log2(n) rounds: a ring's n - 1 rounds of latency would cost
// more than the rows themselves at low density).
std::vector<std::int64_t> gather_counts(const Group& group, std::size_t me, std::int64_t x,
                                        const CollectiveOptions& o) {
  std::vector<std::int64_t> all(group.devices().size(), 0);
  all[me] = x;
  all_reduce(group, all.data(), all.data(), static_cast<std::int64_t>(all.size()), DType::i64,
             ReduceOp::Sum, latency_bound(o));
  return all;
}

// Rows non-zero on some member: an all-reduced (max) sketch of one byte per slot, a row's slot
// its index (exact) or, for tables of more than 16,384 rows, a hash of it (linear counting).
std::int64_t count_distinct(const Group& group, const SparseRows& mine,
                            const CollectiveOptions& o) {
  constexpr std::int64_t kSlots = 16384;
  const std::int64_t m = std::min(mine.rows, kSlots);
  if (m == 0) return 0;
  std::vector<std::int8_t> seen(static_cast<std::size_t>(m), 0);
  for (std::int64_t i : mine.indices)
    seen[m == mine.rows ? static_cast<std::size_t>(i)
                        : sparse_owner(i, static_cast<std::size_t>(m))] = 1;
  all_reduce(group, seen.data(), seen.data(), m, DType::i8, ReduceOp::Max, latency_bound(o));
  const auto set = static_cast<std::int64_t>(std::count(seen.begin(), seen.end(), 1));
  if (m == mine.rows || set == 0) return set;
  if (set == m) return mine.rows;
  const double zero = static_cast<double>(m - set) / static_cast<double>(m);
  return std::min(mine.rows, static_cast<std::int64_t>(-static_cast<double>(m) * std::log(zero)));
}

// What every member passes alike, agreed before any row travels: the table's rows and width
// (a member of a smaller table would place another's rows past the end of its output), the
// method and the options the dense all-reduce is chosen by (members that chose differently
// would exchange other messages, and wait on each other for the timeout). One small all-reduce
// (detail::spread), refused alike on every member (Error::agreed()).
void agree_on_call(const Group& group, const SparseRows& mine, SparseMethod method,
                   const CollectiveOptions& o) {
  detail::Fnv options;  // what the dense all-reduce's algorithm is chosen by
  options.add(static_cast<std::int64_t>(o.algorithm));
  if (o.algorithm == Algorithm::Auto || o.algorithm == Algorithm::Hierarchical) {
    const Topology one = Topology::single_host();  // as a null topology prices
    const Topology& t = o.topology ? *o.topology : one;
    for (const LinkClass* c : {&t.intra(), &t.network()})
      for (double v : {c->bandwidth, c->latency, c->overhead, c->chain_latency.value_or(-1)})
        options.add(&v, sizeof v);
    options.add(t.nics_per_host());
    for (int d : group.devices())
      options.add(t.covers(d) ? t.host_of(d) : -1).add(t.covers(d) ? t.nic_of(d) : -1);
  }
  const std::int64_t values[] = {mine.rows, mine.width, static_cast<std::int64_t>(method),
                                 static_cast<std::int64_t>(options.h >> 1)};
  const std::vector<detail::Spread> got = detail::spread(group, values, latency_bound(o));
  const auto refuse = [](const char* field, const std::string& cause) {
    detail::throw_agreed(ValidationError(field, cause));
  };
  for (int k = 0; k < 2; ++k)
    if (!got[k].same())
      refuse(k == 0 ? "rows" : "width", "members pass tables of " + std::to_string(got[k].least) +
                                            " to " + std::to_string(got[k].most) +
                                            (k == 0 ? " rows" : " floats a row") +
                                            ": every member passes the same rows and width");
  if (!got[2].same())
    refuse("method", "members pass the methods " +
                         to_string(static_cast<SparseMethod>(got[2].least)) + " and " +
                         to_string(static_cast<SparseMethod>(got[2].most)) +
                         ": every member passes the same method");
  if (!got[3].same())
    refuse("options",
           "members pass other collective options (algorithm, or topology of the "
           "group's devices): every member passes the same");
}

// A row index that came from a peer, checked before it places anything (a record corrupted or
// of a peer that disagrees must not write past the table).
void check_row(std::int64_t index, std::int64_t rows) {
  if (index < 0 || index >= rows)
    throw ValidationError("indices", "a member sent row " + std::to_string(index) +
                                         ", outside the table's " + std::to_string(rows) + " rows");
}

}  // namespace

SparseRows SparseRows::from_dense(std::span<const float> dense, std::int64_t rows,
                                  std::int64_t width) {
  std::int64_t floats = 0;
  if (rows < 0 || width < 0 || __builtin_mul_overflow(rows, width, &floats) ||
      static_cast<std::int64_t>(dense.size()) != floats)
    throw ValidationError("dense", "holds " + std::to_string(dense.size()) + " floats, not " +
                                       std::to_string(rows) + " x " + std::to_string(width));
  SparseRows s{rows, width, {}, {}};
  if (width == 0) return s;  // no row holds an element (and rows may be any number)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = dense.data() + r * width;
    if (std::any_of(row, row + width, [](float v) { return v != 0; })) {
      s.indices.push_back(r);
      s.values.insert(s.values.end(), row, row + width);
    }
  }
  return s;
}

void SparseRows::validate() const {
  if (rows < 0 || width < 0) throw ValidationError("rows", "rows and width must be >= 0");
  std::int64_t floats = 0;  // the table's, and the rows' here: each below 2^63 - 1
  if (__builtin_mul_overflow(rows, width, &floats) ||
      __builtin_mul_overflow(static_cast<std::int64_t>(indices.size()), width, &floats))
    throw ValidationError("rows", std::to_string(rows) + " rows of " + std::to_string(width) +
                                      " floats exceed 2^63 - 1");
  for (std::size_t k = 0; k < indices.size(); ++k)
    if (indices[k] < 0 || indices[k] >= rows || (k && indices[k] <= indices[k - 1]))
      throw ValidationError("indices", "must increase strictly within [0, " + std::to_string(rows) +
                                           "); entry " + std::to_string(k) + " is " +
                                           std::to_string(indices[k]));
  if (static_cast<std::int64_t>(values.size()) != floats)
    throw ValidationError("values", "holds " + std::to_string(values.size()) + " floats for " +
                                        std::to_string(indices.size()) + " rows of " +
                                        std::to_string(width));
}

std::string to_string(SparseMethod m) {
  switch (m) {
    case SparseMethod::Auto:
      return "auto";
    case SparseMethod::Dense:
      return "dense";
    case SparseMethod::AllGather:
      return "allgather";
    case SparseMethod::Balanced:
      return "balanced";
  }
  return "?";
}

SparseMethod parse_sparse_method(std::string_view text, const std::string& field) {
  for (SparseMethod m :
       {SparseMethod::Auto, SparseMethod::Dense, SparseMethod::AllGather, SparseMethod::Balanced})
    if (text == to_string(m)) return m;
  throw ParseError(field, "unknown method " + detail::quote(text) +
                              " (expected auto, dense, allgather or balanced)");
}

std::size_t sparse_owner(std::int64_t index, std::size_t members) {
  // splitmix64's finaliser: neighbouring and hot indices land on unrelated owners.
  auto z = static_cast<std::uint64_t>(index) + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return static_cast<std::size_t>((z ^ (z >> 31)) % members);
}

double sparse_traffic(SparseMethod m, std::span<const std::int64_t> nonzero_rows,
                      std::int64_t distinct_rows, std::int64_t rows, std::int64_t width) {
  const auto n = static_cast<double>(nonzero_rows.size());
  if (n < 2) return 0;
  const double rb = static_cast<double>(record_bytes(width));
  double total = 0, most = 0, least = 1e300;
  for (std::int64_t z : nonzero_rows) {
    total += static_cast<double>(z);
    most = std::max(most, static_cast<double>(z));
    least = std::min(least, static_cast<double>(z));
  }
  switch (m) {
    case SparseMethod::Dense:
      return 2 * (n - 1) / n * static_cast<double>(rows) * static_cast<double>(width) *
             sizeof(float);
    case SparseMethod::AllGather:
      return (total - least) * rb;
    case SparseMethod::Balanced: {
      // The pull: every distinct row's values, and each owner's indices as records or a bitmap.
      const double d = static_cast<double>(distinct_rows);
      const double indices =
          n * std::min(d / n * sizeof(std::int64_t), static_cast<double>(bitmap_bytes(rows)));
      return (most * rb + d * static_cast<double>(width) * sizeof(float) + indices) * (n - 1) / n;
    }
    case SparseMethod::Auto:
      break;
  }
  return 0;
}

SparseMethod sparse_all_reduce(const Group& group, const SparseRows& mine, std::span<float> out,
                               SparseMethod method, const CollectiveOptions& o) {
  mine.validate();
  if (static_cast<std::int64_t>(out.size()) != mine.rows * mine.width)
    throw ValidationError("out", "holds " + std::to_string(out.size()) + " floats, not " +
                                     std::to_string(mine.rows) + " x " +
                                     std::to_string(mine.width));
  const int rank = group.comm().rank();
  if (!group.contains(rank))
    throw ValidationError("group", "device " + std::to_string(rank) + " is not in the group");
  const auto me = static_cast<std::size_t>(group.index_of(rank));
  const std::size_t n = group.devices().size();
  const std::int64_t w = mine.width;
  agree_on_call(group, mine, method, o);
  // Every member's row count: what auto weighs and what the all-gather receives (the dense and
  // balanced methods need none; every round counts where latency dominates).
  std::vector<std::int64_t> nnz;
  if (method == SparseMethod::Auto || method == SparseMethod::AllGather)
    nnz = gather_counts(group, me, static_cast<std::int64_t>(mine.indices.size()), o);
  if (method == SparseMethod::Auto) {
    const std::int64_t distinct = count_distinct(group, mine, o);
    method = SparseMethod::Dense;
    for (SparseMethod m : {SparseMethod::Balanced, SparseMethod::AllGather})
      if (sparse_traffic(m, nnz, distinct, mine.rows, w) <
          sparse_traffic(method, nnz, distinct, mine.rows, w))
        method = m;
  }
  std::fill(out.begin(), out.end(), 0.0f);
  auto add_row = [&](std::int64_t index, const float* v) {
    check_row(index, mine.rows);
    float* row = out.data() + index * w;
    for (std::int64_t c = 0; c < w; ++c) row[c] += v[c];
  };
  const std::int64_t rb = static_cast<std::int64_t>(record_bytes(w));
  if (method == SparseMethod::Dense) {
    for (std::size_t k = 0; k < mine.indices.size(); ++k)
      add_row(mine.indices[k], mine.values.data() + static_cast<std::int64_t>(k) * w);
    all_reduce(group, out.data(), out.data(), static_cast<std::int64_t>(out.size()), DType::f32,
               ReduceOp::Sum, o);
    return method;
  }
  std::vector<std::byte> packed;
  if (method == SparseMethod::AllGather) {
    for (std::size_t k = 0; k < mine.indices.size(); ++k)
      pack_row(packed, mine.indices[k], mine.values.data() + static_cast<std::int64_t>(k) * w, w);
    std::vector<std::int64_t> bytes;
    for (std::int64_t c : nnz) bytes.push_back(c * rb);
    const auto all = gather_blocks(group, packed, bytes, o);
    // Members in group order, rows in index order: the same sums on every member.
    std::size_t at = 0;
    for (std::size_t k = 0; k < n; ++k) {
      for_each_row(all.data() + at, static_cast<std::size_t>(nnz[k]), w, add_row);
      at += static_cast<std::size_t>(nnz[k] * rb);
    }
    return method;
  }
  // Balanced: push each row to its owner, owners sum, pull every owner's sums.
  std::vector<std::vector<std::byte>> to(n);
  for (std::size_t k = 0; k < mine.indices.size(); ++k)
    pack_row(to[sparse_owner(mine.indices[k], n)], mine.indices[k],
             mine.values.data() + static_cast<std::int64_t>(k) * w, w);
  std::vector<std::int64_t> sc(n), rc(n);
  for (std::size_t k = 0; k < n; ++k) {
    sc[k] = static_cast<std::int64_t>(to[k].size());
    packed.insert(packed.end(), to[k].begin(), to[k].end());
  }
  // Block sizes first (one count per pair), then the blocks (all-to-all has one algorithm).
  CollectiveOptions direct = o;
  direct.algorithm = Algorithm::Auto;
  std::vector<std::int64_t> ones(n, 1);
  all_to_allv(group, sc.data(), ones, rc.data(), ones, DType::i64, direct);
  std::vector<std::byte> got(
      static_cast<std::size_t>(std::accumulate(rc.begin(), rc.end(), std::int64_t{0})));
  all_to_allv(group, packed.data(), sc, got.data(), rc, DType::i8, direct);
  // The owner's sums, in index order: records from members in group order, merged by index.
  std::vector<std::pair<std::int64_t, std::size_t>> recs;  // (index, offset of its values)
  std::size_t at = 0;
  for (std::size_t k = 0; k < n; ++k) {
    for_each_row(
        got.data() + at, static_cast<std::size_t>(rc[k] / rb), w,
        [&](std::int64_t index, const float* v) {
          recs.emplace_back(
              index, static_cast<std::size_t>(reinterpret_cast<const std::byte*>(v) - got.data()));
        });
    at += static_cast<std::size_t>(rc[k]);
  }
  std::stable_sort(recs.begin(), recs.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::int64_t> owned_rows;
  std::vector<float> sums;  // owned_rows.size() rows
  for (std::size_t i = 0; i < recs.size();) {
    const std::int64_t index = recs[i].first;
    owned_rows.push_back(index);
    sums.resize(sums.size() + static_cast<std::size_t>(w), 0.0f);
    float* acc = sums.data() + sums.size() - static_cast<std::size_t>(w);
    for (; i < recs.size() && recs[i].first == index; ++i) {
      const auto* v = reinterpret_cast<const float*>(got.data() + recs[i].second);
      for (std::int64_t c = 0; c < w; ++c) acc[c] += v[c];
    }
  }
  const auto count = static_cast<std::int64_t>(owned_rows.size());
  std::vector<std::byte> block;
  if (as_bitmap(count, mine.rows)) {
    block.resize(static_cast<std::size_t>(owned_bytes(count, mine.rows, w)), std::byte{0});
    for (std::int64_t index : owned_rows)
      block[static_cast<std::size_t>(index / 8)] |= std::byte{1} << (index % 8);
    std::memcpy(block.data() + bitmap_bytes(mine.rows), sums.data(), sums.size() * sizeof(float));
  } else {
    for (std::size_t k = 0; k < owned_rows.size(); ++k)
      pack_row(block, owned_rows[k], sums.data() + k * static_cast<std::size_t>(w), w);
  }
  const auto owned = gather_counts(group, me, count, o);
  std::vector<std::int64_t> bytes;
  for (std::int64_t c : owned) bytes.push_back(owned_bytes(c, mine.rows, w));
  const auto all = gather_blocks(group, block, bytes, o);
  auto put = [&](std::int64_t index, const float* v) {
    check_row(index, mine.rows);
    std::memcpy(out.data() + index * w, v, static_cast<std::size_t>(w) * sizeof(float));
  };
  const std::byte* at_block = all.data();
  for (std::size_t k = 0; k < n; ++k) {
    if (as_bitmap(owned[k], mine.rows)) {
      const auto* v = reinterpret_cast<const float*>(at_block + bitmap_bytes(mine.rows));
      for (std::int64_t index = 0; index < mine.rows; ++index)
        if ((at_block[static_cast<std::size_t>(index / 8)] >> (index % 8) & std::byte{1}) !=
            std::byte{0}) {
          put(index, v);
          v += w;
        }
    } else {
      for_each_row(at_block, static_cast<std::size_t>(owned[k]), w, put);
    }
    at_block += bytes[k];
  }
  return method;
}

}  // namespace meshcast
