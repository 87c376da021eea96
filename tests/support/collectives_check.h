// Checks every collective of meshcast/collectives.h on one communicator against a naive
// reference that needs no communication: member j's input element i is a small integer
// function of (j, i), so every member knows every other's input, and sums are exact in every
// dtype (half types included), whatever the order of summation. Shared by the in-process tests
// (tests/collectives/algorithms/collectives_test.cc) and the multi-process driver (tests/mpi).
#pragma once

#include <meshcast/collectives.h>
#include <meshcast/error.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "support/testing.h"

namespace meshcast::testing {

// Member j's element i, within [0, 29]: sums of 8 stay below 256, exact in bf16.
inline int input_value(std::size_t j, std::int64_t i) {
  return static_cast<int>((static_cast<std::int64_t>(j) * 7 + i * 3 + (i / 5) * 11) % 30);
}

// Member j's element i in dtype t: input_value, but 0 or 1 for bool (one in three is 1).
inline int input_of(DType t, std::size_t j, std::int64_t i) {
  const int v = input_value(j, i);
  return t == DType::b8 ? v % 3 == 0 : v;
}

// A complex element holds (v, -v) (load_element).
inline void store(DType t, void* base, std::int64_t i, double v) {
  std::byte* p = static_cast<std::byte*>(base) + static_cast<std::size_t>(i) * dtype_size(t);
  switch (t) {
    case DType::f16: {
      const auto h = float_to_half(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::bf16: {
      const auto h = float_to_bf16(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::f32: {
      const auto x = static_cast<float>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case DType::f64:
      std::memcpy(p, &v, 8);
      break;
    case DType::i8: {
      const auto x = static_cast<std::int8_t>(v);
      std::memcpy(p, &x, 1);
      break;
    }
    case DType::i32: {
      const auto x = static_cast<std::int32_t>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case DType::i64: {
      const auto x = static_cast<std::int64_t>(v);
      std::memcpy(p, &x, 8);
      break;
    }
    case DType::i16: {
      const auto x = static_cast<std::int16_t>(v);
      std::memcpy(p, &x, 2);
      break;
    }
    case DType::u8:
    case DType::b8: {
      const auto x = static_cast<std::uint8_t>(v);
      std::memcpy(p, &x, 1);
      break;
    }
    case DType::u16: {
      const auto x = static_cast<std::uint16_t>(v);
      std::memcpy(p, &x, 2);
      break;
    }
    case DType::u32: {
      const auto x = static_cast<std::uint32_t>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case DType::u64: {
      const auto x = static_cast<std::uint64_t>(v);
      std::memcpy(p, &x, 8);
      break;
    }
    case DType::c64: {
      const float x[2] = {static_cast<float>(v), static_cast<float>(-v)};
      std::memcpy(p, x, 8);
      break;
    }
    case DType::c128: {
      const double x[2] = {v, -v};
      std::memcpy(p, x, 16);
      break;
    }
  }
}

inline double fetch(DType t, const void* base, std::int64_t i) {
  return load_element(
      t, static_cast<const std::byte*>(base) + static_cast<std::size_t>(i) * dtype_size(t));
}

// The reduction over n members of element i (bool: both are logical or, the max of 0 and 1).
inline double reduced(DType t, std::size_t n, std::int64_t i, ReduceOp op) {
  const bool sum = op == ReduceOp::Sum && t != DType::b8;
  double r = sum ? 0 : -1;
  for (std::size_t j = 0; j < n; ++j)
    r = sum ? r + input_of(t, j, i) : std::max<double>(r, input_of(t, j, i));
  return r;
}

struct CollectiveCase {
  std::string what;
  DType dtype;
  std::int64_t count;
  ReduceOp op;
  Algorithm algorithm;
  bool in_place;
};

// The cases each member runs, in the same order everywhere. i8 sums of 8 members overflow
// (up to 232), so i8 is checked with max only; complex numbers have no max (refused).
inline std::vector<CollectiveCase> collective_cases(const std::vector<std::int64_t>& counts,
                                                    const std::vector<Algorithm>& algorithms = {
                                                        Algorithm::Auto, Algorithm::Ring,
                                                        Algorithm::RecursiveDoubling,
                                                        Algorithm::HalvingDoubling,
                                                        Algorithm::Hierarchical}) {
  std::vector<CollectiveCase> out;
  std::size_t k = 0;
  for (std::int64_t count : counts)
    for (DType t : kAllDTypes)
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
        if (t == DType::i8 && op == ReduceOp::Sum) continue;
        if (is_complex(t) && op == ReduceOp::Max) continue;
        const Algorithm a = algorithms[k % algorithms.size()];
        // In place every third case, shifted each pass over the algorithms so that every
        // algorithm runs both ways.
        out.push_back({"", t, count, op, a, (k + k / algorithms.size()) % 3 == 0});
        ++k;
      }
  return out;
}

// Runs every collective on `cases` and returns a description of each wrong result (empty when
// all are right). `topology` (optional) lets Auto and Hierarchical see hosts; the hierarchical
// algorithm is skipped when it does not apply to this group.
inline std::vector<std::string> check_collectives(const Group& group,
                                                  const std::vector<CollectiveCase>& cases,
                                                  const Topology* topology = nullptr) {
  std::vector<std::string> errors;
  Communicator& comm = group.comm();
  const auto me = static_cast<std::size_t>(group.index_of(comm.rank()));
  const std::size_t n = group.devices().size();
  auto fill = [&](DType t, std::vector<std::byte>& buf, std::int64_t count, std::size_t j,
                  std::int64_t lo = 0) {
    buf.assign(static_cast<std::size_t>(count) * dtype_size(t), std::byte{0});
    for (std::int64_t i = 0; i < count; ++i) store(t, buf.data(), i, input_of(t, j, lo + i));
  };
  auto expect = [&](const std::string& what, const CollectiveCase& c, const void* got,
                    std::int64_t count, auto&& want) {
    std::int64_t bad = 0, first = -1;
    for (std::int64_t i = 0; i < count; ++i)
      if (fetch(c.dtype, got, i) != want(i) && bad++ == 0) first = i;
    if (bad) {
      std::ostringstream os;
      os << "device " << comm.rank() << ": " << what << " " << to_string(c.dtype) << " count "
         << c.count << " " << to_string(c.op) << " " << to_string(c.algorithm)
         << (c.in_place ? " in place" : "") << ": " << bad << " wrong, first at " << first
         << " (got " << fetch(c.dtype, got, first) << ", want " << want(first) << ")";
      errors.push_back(os.str());
    }
  };
  for (const CollectiveCase& c : cases) {
    CollectiveOptions o;
    o.topology = topology;
    o.algorithm = c.algorithm;
    std::vector<std::byte> in, out;
    // all-reduce
    fill(c.dtype, in, c.count, me);
    out.assign(in.size(), std::byte{0xee});
    try {
      if (c.in_place)
        all_reduce(group, in.data(), in.data(), c.count, c.dtype, c.op, o);
      else
        all_reduce(group, in.data(), out.data(), c.count, c.dtype, c.op, o);
      expect("all_reduce", c, c.in_place ? in.data() : out.data(), c.count,
             [&](std::int64_t i) { return reduced(c.dtype, n, i, c.op); });
    } catch (const ValidationError& e) {
      if (c.algorithm != Algorithm::Hierarchical) throw;  // not applicable to this group
    }
    // reduce-scatter: the caller's range of the uneven split
    const Range mine =
        shard_range(c.count, static_cast<std::int64_t>(n), static_cast<std::int64_t>(me));
    fill(c.dtype, in, c.count, me);
    out.assign(static_cast<std::size_t>(mine.size()) * dtype_size(c.dtype), std::byte{0xee});
    try {
      reduce_scatter(group, in.data(), out.data(), c.count, c.dtype, c.op, o);
      expect("reduce_scatter", c, out.data(), mine.size(),
             [&](std::int64_t i) { return reduced(c.dtype, n, mine.lo + i, c.op); });
    } catch (const ValidationError& e) {
      if (c.algorithm != Algorithm::Hierarchical) throw;  // not applicable to this group
    }
    // all-gather: member j contributes its range, holding its own values there
    std::vector<std::byte> all(static_cast<std::size_t>(c.count) * dtype_size(c.dtype),
                               std::byte{0xee});
    auto owner = [&](std::int64_t i) {
      std::size_t j = 0;
      while (shard_range(c.count, static_cast<std::int64_t>(n), static_cast<std::int64_t>(j)).hi <=
             i)
        ++j;
      return j;
    };
    fill(c.dtype, in, mine.size(), me, mine.lo);
    try {
      if (c.in_place) {
        std::copy(in.begin(), in.end(),
                  all.begin() + static_cast<std::ptrdiff_t>(mine.lo) *
                                    static_cast<std::ptrdiff_t>(dtype_size(c.dtype)));
        all_gather(group, all.data() + static_cast<std::size_t>(mine.lo) * dtype_size(c.dtype),
                   all.data(), c.count, c.dtype, o);
      } else {
        all_gather(group, in.data(), all.data(), c.count, c.dtype, o);
      }
      expect("all_gather", c, all.data(), c.count,
             [&](std::int64_t i) { return static_cast<double>(input_of(c.dtype, owner(i), i)); });
    } catch (const ValidationError& e) {
      if (c.algorithm != Algorithm::Hierarchical) throw;  // not applicable to this group
    }
    // broadcast from the member c.count % n
    const int root = group.devices()[static_cast<std::size_t>(c.count) % n];
    fill(c.dtype, in, c.count, root == comm.rank() ? 99 : me);
    // Broadcast and all-to-all(v) have one algorithm each (they refuse others).
    CollectiveOptions single = o;
    single.algorithm = Algorithm::Auto;
    broadcast(group, root, in.data(), c.count, c.dtype, single);
    expect("broadcast", c, in.data(), c.count,
           [&](std::int64_t i) { return static_cast<double>(input_of(c.dtype, 99, i)); });
    // all-to-all(v): member j sends (j + k + c.count) % 4 elements to member k, valued
    // input_value(j * 8 + k, i)
    std::vector<std::int64_t> sc(n), rc(n);
    std::int64_t st = 0, rt = 0;
    for (std::size_t k = 0; k < n; ++k) {
      sc[k] = static_cast<std::int64_t>((me + k + static_cast<std::size_t>(c.count)) % 4);
      rc[k] = static_cast<std::int64_t>((k + me + static_cast<std::size_t>(c.count)) % 4);
      st += sc[k];
      rt += rc[k];
    }
    std::vector<std::byte> sb(static_cast<std::size_t>(st) * dtype_size(c.dtype)),
        rb(static_cast<std::size_t>(rt) * dtype_size(c.dtype), std::byte{0xee});
    std::int64_t pos = 0;
    for (std::size_t k = 0; k < n; ++k)
      for (std::int64_t i = 0; i < sc[k]; ++i)
        store(c.dtype, sb.data(), pos++, input_of(c.dtype, me * 8 + k, i));
    all_to_allv(group, sb.data(), sc, rb.data(), rc, c.dtype, single);
    std::vector<double> want;
    for (std::size_t k = 0; k < n; ++k)
      for (std::int64_t i = 0; i < rc[k]; ++i) want.push_back(input_of(c.dtype, k * 8 + me, i));
    expect("all_to_allv", c, rb.data(), rt,
           [&](std::int64_t i) { return want[static_cast<std::size_t>(i)]; });
  }
  return errors;
}

}  // namespace meshcast::testing
