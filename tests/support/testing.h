// Shared helpers of the test suites: a seeded generator, random meshes and layouts, and the
// tests' own reference formulas (written from DESIGN.md, independent of lib/). A test never uses
// the code under test as its own oracle: the layouts below only use Mesh/ShardingSpec/Layout as
// plain values (shape, devices, axes); tiles and addends come from the ref_* functions.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "meshcast/meshcast.h"

namespace meshcast::testing {

// This process's resident memory now, from /proc/self/statm (0 where it cannot be read).
inline std::int64_t resident_bytes() {
  long pages = 0, resident = 0;
  if (FILE* statm = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(statm, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(statm);
  }
  return std::int64_t{resident} * sysconf(_SC_PAGESIZE);
}

__extension__ typedef __int128 i128;

// A 16-bit IEEE-style float of `ebits` exponent and `mbits` fraction bits decoded by its
// definition: sign, biased exponent, fraction (binary16: 5 and 10; bfloat16, the top half of a
// binary32: 8 and 7).
inline double ref_float16(unsigned h, int ebits, int mbits) {
  const int top = (1 << ebits) - 1, bias = top / 2;
  const int exp = static_cast<int>(h >> mbits) & top,
            man = static_cast<int>(h) & ((1 << mbits) - 1);
  const double v = exp == 0     ? std::ldexp(man, 1 - bias - mbits)
                   : exp == top ? (man ? std::numeric_limits<double>::quiet_NaN()
                                       : std::numeric_limits<double>::infinity())
                                : std::ldexp((1 << mbits) + man, exp - bias - mbits);
  return (h & 0x8000) ? -v : v;
}
inline double ref_half(unsigned h) { return ref_float16(h, 5, 10); }
inline double ref_bf16(unsigned h) { return ref_float16(h, 8, 7); }
inline bool half_is_nan(unsigned h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }
inline bool bf16_is_nan(unsigned h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f); }

// MESHCAST_TEST_SCALE multiplies the counts of the randomized sweeps (default 1).
inline double test_scale() {
  const char* s = std::getenv("MESHCAST_TEST_SCALE");
  if (s == nullptr || *s == '\0') return 1.0;
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  return end != s && v > 0 ? v : 1.0;
}
inline int scaled(int n) {
  return std::max(1, static_cast<int>(static_cast<double>(n) * test_scale() + 0.5));
}

// A fixed-seed generator; values are derived with modulo (portable across standard libraries).
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : g_(seed) {}
  std::uint64_t next() { return g_(); }
  // [0, n)
  std::int64_t below(std::int64_t n) {
    return static_cast<std::int64_t>(g_() % static_cast<std::uint64_t>(n));
  }
  // [lo, hi]
  std::int64_t between(std::int64_t lo, std::int64_t hi) { return lo + below(hi - lo + 1); }
  bool chance(int num, int den) { return below(den) < num; }
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (std::size_t i = v.size(); i > 1; --i)
      std::swap(v[i - 1], v[static_cast<std::size_t>(below(static_cast<std::int64_t>(i)))]);
  }
  template <class T>
  const T& pick(const std::vector<T>& v) {
    return v[static_cast<std::size_t>(below(static_cast<std::int64_t>(v.size())))];
  }

 private:
  std::mt19937_64 g_;
};

// ---- Reference formulas ------------------------------------------------------------------------

// Row-major coordinate of linear index i in a grid of this shape.
inline std::vector<std::int64_t> ref_coord(const std::vector<std::int64_t>& shape, std::int64_t i) {
  std::vector<std::int64_t> c(shape.size());
  for (std::size_t a = shape.size(); a-- > 0;) {
    c[a] = i % shape[a];
    i /= shape[a];
  }
  return c;
}

inline std::int64_t ref_volume(const std::vector<std::int64_t>& shape) {
  std::int64_t v = 1;
  for (auto e : shape) v *= e;
  return v;
}

// DESIGN.md: shard k of n split p ways is [floor(k*n/p), floor((k+1)*n/p)).
inline Range ref_shard(std::int64_t n, std::int64_t p, std::int64_t k) {
  return {static_cast<std::int64_t>(i128{k} * n / p),
          static_cast<std::int64_t>(i128{k + 1} * n / p)};
}

// Shard index and split count of tensor dim d for mesh coordinate c: the dim's axes form a
// mixed-radix number, major first.
inline std::pair<std::int64_t, std::int64_t> ref_shard_of(const Layout& l, std::size_t d,
                                                          const std::vector<std::int64_t>& c) {
  std::int64_t k = 0, p = 1;
  for (int a : l.spec().dims()[d]) {
    const auto ax = static_cast<std::size_t>(a);
    k = k * l.mesh().shape()[ax] + c[ax];
    p *= l.mesh().shape()[ax];
  }
  return {k, p};
}

// The box held by the device at mesh linear index i.
inline Box ref_tile(const Layout& l, std::int64_t i) {
  const auto c = ref_coord(l.mesh().shape(), i);
  std::vector<Range> r;
  for (std::size_t d = 0; d < l.shape().size(); ++d) {
    const auto [k, p] = ref_shard_of(l, d, c);
    r.push_back(ref_shard(l.shape()[d], p, k));
  }
  return Box(std::move(r));
}

// Number of addends, and the addend held by mesh index i (row-major over the partial axes).
inline std::int64_t ref_groups(const Layout& l) {
  std::int64_t g = 1;
  for (int a : l.spec().partial()) g *= l.mesh().shape()[static_cast<std::size_t>(a)];
  return g;
}
inline std::int64_t ref_addend(const Layout& l, std::int64_t i) {
  const auto c = ref_coord(l.mesh().shape(), i);
  std::int64_t g = 0;
  for (int a : l.spec().partial()) {
    const auto ax = static_cast<std::size_t>(a);
    g = g * l.mesh().shape()[ax] + c[ax];
  }
  return g;
}

inline bool ref_has(const Box& b, const std::vector<std::int64_t>& idx) {
  for (std::size_t d = 0; d < idx.size(); ++d)
    if (idx[d] < b[d].lo || idx[d] >= b[d].hi) return false;
  return true;
}

// Calls f(global coordinate, global row-major index) for every element of box b of a tensor of
// this shape, in row-major order.
template <class F>
void ref_for_each(const std::vector<std::int64_t>& shape, const Box& b, F&& f) {
  for (std::size_t d = 0; d < b.ndim(); ++d)
    if (b[d].hi <= b[d].lo) return;
  std::vector<std::int64_t> idx(b.ndim());
  for (std::size_t d = 0; d < b.ndim(); ++d) idx[d] = b[d].lo;
  while (true) {
    std::int64_t g = 0;
    for (std::size_t d = 0; d < shape.size(); ++d) g = g * shape[d] + idx[d];
    f(idx, g);
    std::size_t d = b.ndim();
    while (d-- > 0) {
      if (++idx[d] < b[d].hi) break;
      idx[d] = b[d].lo;
    }
    if (d == static_cast<std::size_t>(-1)) return;
  }
}

// ---- Random inputs -----------------------------------------------------------------------------

// The tests' twelve devices on three hosts of four; with `nics` NICs per host (4: one per
// device, where a broadcast from a host whose source devices use more NICs than its receivers'
// forks at the root: Op::fork).
inline Topology three_hosts(int nics = 1) {
  std::vector<Topology::Host> hosts;
  for (int h = 0; h < 3; ++h)
    hosts.push_back({"host" + std::to_string(h), {4 * h, 4 * h + 1, 4 * h + 2, 4 * h + 3}});
  return Topology::from_hosts(nics == 1 ? "three" : "three-nics", hosts,
                              LinkClass{"intra", 50e9, 1e-6},
                              LinkClass{"network", 1e9 * nics, 2e-5}, nics);
}

struct Limits {
  int max_ndim = 4;  // tensor dimensions, 1..max_ndim
  int max_extent = 6;
  std::int64_t max_volume = 120;
  bool zero_extents = true;  // occasionally an extent of 0
  int max_mesh_ndim = 3;
  int max_mesh_extent = 4;
  int max_mesh_size = 8;
  int pool = 16;  // device ids are drawn from [0, pool)
  bool partial_src = true;
  bool partial_dst = true;
  bool scalars = true;  // random_case: occasionally a 0-d tensor
};

inline Shape random_shape(Rng& rng, const Limits& lim) {
  Shape s(static_cast<std::size_t>(rng.between(1, lim.max_ndim)));
  for (auto& e : s) e = lim.zero_extents && rng.chance(1, 40) ? 0 : rng.between(1, lim.max_extent);
  while (ref_volume(s) > lim.max_volume) {
    auto it = std::max_element(s.begin(), s.end());
    *it = (*it + 1) / 2;
  }
  return s;
}

inline std::vector<std::int64_t> random_mesh_shape(Rng& rng, int max_ndim, int max_extent,
                                                   int max_size) {
  std::vector<std::int64_t> s(static_cast<std::size_t>(rng.between(1, max_ndim)));
  for (auto& e : s) e = rng.between(1, max_extent);
  while (ref_volume(s) > max_size) {
    auto it = std::max_element(s.begin(), s.end());
    --*it;
  }
  return s;
}

// A random shape of exactly n devices (n factored at random), 1..max_ndim axes.
inline std::vector<std::int64_t> random_mesh_shape_of(Rng& rng, std::int64_t n, int max_ndim) {
  std::vector<std::int64_t> s;
  const auto ndim = rng.between(1, max_ndim);
  for (std::int64_t a = 0; a + 1 < ndim; ++a) {
    std::vector<std::int64_t> divisors;
    for (std::int64_t d = 1; d <= n; ++d)
      if (n % d == 0) divisors.push_back(d);
    const auto d = rng.pick(divisors);
    s.push_back(d);
    n /= d;
  }
  s.push_back(n);
  rng.shuffle(s);
  return s;
}

// `count` distinct ids from `pool`, in random order.
inline std::vector<int> sample(Rng& rng, std::vector<int> pool, std::size_t count) {
  rng.shuffle(pool);
  pool.resize(count);
  return pool;
}

inline ShardingSpec random_spec(Rng& rng, std::size_t ndim, std::size_t mesh_ndim, bool partial) {
  std::vector<std::vector<int>> dims(ndim);
  std::vector<int> p;
  std::vector<int> axes(mesh_ndim);
  std::iota(axes.begin(), axes.end(), 0);
  rng.shuffle(axes);  // the order axes are appended in: gives S10 as well as S01
  for (int a : axes) {
    const auto r = rng.below(10);
    if (r < 2) continue;  // replicated along a
    if (r < 4 && partial)
      p.push_back(a);
    else if (ndim > 0)  // a 0-d tensor has no dimension to split
      dims[static_cast<std::size_t>(rng.below(static_cast<std::int64_t>(ndim)))].push_back(a);
  }
  return ShardingSpec(std::move(dims), std::move(p));
}

enum class Devices { Same, Permuted, Overlapping, Disjoint };

inline const char* to_string(Devices d) {
  switch (d) {
    case Devices::Same:
      return "same";
    case Devices::Permuted:
      return "permuted";
    case Devices::Overlapping:
      return "overlapping";
    case Devices::Disjoint:
      return "disjoint";
  }
  return "?";
}

// A source mesh and a target mesh related as `rel` says.
inline std::pair<Mesh, Mesh> random_meshes(Rng& rng, const Limits& lim, Devices rel) {
  std::vector<int> pool(static_cast<std::size_t>(lim.pool));
  std::iota(pool.begin(), pool.end(), 0);
  const auto s_shape =
      random_mesh_shape(rng, lim.max_mesh_ndim, lim.max_mesh_extent, lim.max_mesh_size);
  const auto n = static_cast<std::size_t>(ref_volume(s_shape));
  auto s_dev = sample(rng, pool, n);
  if (rng.chance(1, 3)) std::sort(s_dev.begin(), s_dev.end());
  Mesh src(s_shape, s_dev);
  switch (rel) {
    case Devices::Same:
      return {src, src};
    case Devices::Permuted: {
      auto d = s_dev;
      rng.shuffle(d);
      return {src,
              Mesh(random_mesh_shape_of(rng, static_cast<std::int64_t>(n), lim.max_mesh_ndim), d)};
    }
    case Devices::Overlapping: {
      const auto d_shape =
          random_mesh_shape(rng, lim.max_mesh_ndim, lim.max_mesh_extent, lim.max_mesh_size);
      const auto m = static_cast<std::size_t>(ref_volume(d_shape));
      const auto shared =
          static_cast<std::size_t>(rng.between(1, static_cast<std::int64_t>(std::min(n, m))));
      std::vector<int> rest;
      for (int d : pool)
        if (std::find(s_dev.begin(), s_dev.end(), d) == s_dev.end()) rest.push_back(d);
      auto d = sample(rng, s_dev, shared);
      const auto others = sample(rng, rest, std::min(rest.size(), m - shared));
      d.insert(d.end(), others.begin(), others.end());
      while (d.size() < m) {  // the pool ran out of fresh ids: share more
        for (int x : s_dev)
          if (d.size() < m && std::find(d.begin(), d.end(), x) == d.end()) d.push_back(x);
      }
      rng.shuffle(d);
      return {src, Mesh(d_shape, d)};
    }
    case Devices::Disjoint: {
      std::vector<int> rest;
      for (int d : pool)
        if (std::find(s_dev.begin(), s_dev.end(), d) == s_dev.end()) rest.push_back(d);
      const auto d_shape =
          random_mesh_shape(rng, lim.max_mesh_ndim, lim.max_mesh_extent,
                            static_cast<int>(std::min<std::size_t>(
                                rest.size(), static_cast<std::size_t>(lim.max_mesh_size))));
      auto d = sample(rng, rest, static_cast<std::size_t>(ref_volume(d_shape)));
      if (rng.chance(1, 2)) std::sort(d.begin(), d.end());
      return {src, Mesh(d_shape, d)};
    }
  }
  return {src, src};
}

struct Case {
  Layout src;
  Layout dst;
  Devices rel;
  // "shape 3,5 f32 2x2@[1,0,3,2]:S0R -> 4@4-7:RS0 (disjoint)"
  std::string str() const {
    std::ostringstream os;
    os << "shape " << (src.scalar() ? "[] (0-d)" : shape_str(src.shape())) << ' '
       << meshcast::to_string(src.dtype()) << ' ' << src.str() << " -> " << dst.str() << " ("
       << to_string(rel) << " devices)";
    return os.str();
  }
};

// kAllDTypes[i], cycling: case i of a sweep takes every dtype in turn.
inline constexpr auto kDTypeCount = static_cast<std::int64_t>(std::size(kAllDTypes));
inline DType dtype_at(std::int64_t i) {
  return kAllDTypes[static_cast<std::size_t>(i % kDTypeCount)];
}

inline Case random_case(Rng& rng, const Limits& lim, DType dtype) {
  const Shape shape = lim.scalars && rng.chance(1, 40) ? Shape{} : random_shape(rng, lim);
  const auto rel = static_cast<Devices>(rng.below(4));
  auto [sm, dm] = random_meshes(rng, lim, rel);
  auto s_spec = random_spec(rng, shape.size(), sm.ndim(), lim.partial_src && rng.chance(1, 2));
  auto d_spec = random_spec(rng, shape.size(), dm.ndim(), lim.partial_dst && rng.chance(1, 3));
  if (rel == Devices::Same && rng.chance(1, 8)) d_spec = s_spec;  // identical layouts
  return {Layout(shape, dtype, sm, s_spec), Layout(shape, dtype, dm, d_spec), rel};
}

inline Case random_case(Rng& rng, const Limits& lim) {
  return random_case(rng, lim, dtype_at(rng.below(kDTypeCount)));
}

// The element as a double (exact for the values used here), for comparison. bool: its byte (0 or
// 1 when well formed). Complex: the tests store (v, -v), so the real part when the imaginary part
// is its negation, else NaN (equal to nothing).
inline double load_element(DType t, const std::byte* p) {
  auto get = [p](auto zero, std::size_t at = 0) {
    decltype(zero) x;
    std::memcpy(&x, p + at, sizeof x);
    return static_cast<double>(x);
  };
  unsigned short h;
  switch (t) {
    case DType::f16:
      std::memcpy(&h, p, 2);
      return half_to_float(h);
    case DType::bf16:
      std::memcpy(&h, p, 2);
      return bf16_to_float(h);
    case DType::f32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::f64: {
      double f;
      std::memcpy(&f, p, 8);
      return f;
    }
    case DType::i8:
      return static_cast<std::int8_t>(*p);
    case DType::i32: {
      std::int32_t x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case DType::i64: {
      std::int64_t x;
      std::memcpy(&x, p, 8);
      return static_cast<double>(x);
    }
    case DType::i16:
      return get(std::int16_t{});
    case DType::u8:
    case DType::b8:
      return get(std::uint8_t{});
    case DType::u16:
      return get(std::uint16_t{});
    case DType::u32:
      return get(std::uint32_t{});
    case DType::u64:
      return get(std::uint64_t{});
    case DType::c64:
      return get(float{}, 4) == -get(float{}) ? get(float{}) : std::nan("");
    case DType::c128:
      return get(double{}, 8) == -get(double{}) ? get(double{}) : std::nan("");
  }
  return 0;
}

// ---- Random topologies -------------------------------------------------------------------------

// Each group of device ids shuffled over hosts of its own (1..6 per group, of uneven sizes),
// 1..4 NICs per host, random link classes (with or without chain latency and per-message
// overhead).
inline Topology random_topology(Rng& rng, std::vector<std::vector<int>> groups) {
  std::vector<std::vector<int>> on;
  for (std::vector<int>& ids : groups) {
    rng.shuffle(ids);
    const auto first = on.size();
    on.resize(first + static_cast<std::size_t>(rng.between(1, 6)));
    const std::size_t hosts = on.size() - first;
    for (std::size_t i = 0; i < ids.size(); ++i)  // every host gets one, the rest at random
      on[first +
         (i < hosts ? i : static_cast<std::size_t>(rng.below(static_cast<std::int64_t>(hosts))))]
          .push_back(ids[i]);
  }
  std::erase_if(on, [](const std::vector<int>& h) { return h.empty(); });
  auto link = [&](const char* bandwidth_key) {
    std::ostringstream os;
    os << "{\"" << bandwidth_key << "\": " << rng.between(1, 200)
       << ", \"latency_us\": " << rng.between(0, 20);
    if (rng.chance(1, 2)) os << ", \"chain_latency_us\": " << rng.between(0, 5);
    os << ", \"overhead_us\": " << (rng.chance(1, 3) ? 0 : rng.between(1, 4));
    return os.str();
  };
  std::ostringstream os;
  os << "{\"name\": \"random\", \"links\": {\"intra\": " << link("bandwidth_gbyte_s")
     << "}, \"network\": " << link("bandwidth_gbit_s")
     << ", \"nics_per_host\": " << rng.between(1, 4) << "}}, \"hosts\": [";
  for (std::size_t h = 0; h < on.size(); ++h) {
    os << (h ? ", " : "") << "{\"devices\": [";
    for (std::size_t k = 0; k < on[h].size(); ++k) os << (k ? ", " : "") << on[h][k];
    os << "]}";
  }
  os << "]}";
  return Topology::from_json(os.str());
}

// The devices [0, pool) over hosts shared by all.
inline Topology random_topology(Rng& rng, int pool) {
  std::vector<int> ids(static_cast<std::size_t>(pool));
  std::iota(ids.begin(), ids.end(), 0);
  return random_topology(rng, std::vector<std::vector<int>>{ids});
}

}  // namespace meshcast::testing
