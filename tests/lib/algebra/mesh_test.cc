// Mesh: the text form of DESIGN.md, parse(str()) == m, coord/index inverse, index_of, and bad
// inputs naming their field in one line.
#include "meshcast/mesh.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <limits>

#include "meshcast/error.h"
#include "meshcast/layout.h"
#include "support/testing.h"

namespace meshcast {
namespace {

using testing::Rng;

// lo, lo+1, ..., lo+n-1 (no increment past the last: ids may end at INT_MAX).
std::vector<int> iota(int lo, int n) {
  std::vector<int> v;
  for (std::int64_t k = 0; k < n; ++k) v.push_back(static_cast<int>(lo + k));
  return v;
}

TEST(Mesh, ParsesTheDesignExamples) {
  const Mesh a = Mesh::parse("2x4");
  EXPECT_EQ(a.shape(), (std::vector<std::int64_t>{2, 4}));
  EXPECT_EQ(a.devices(), iota(0, 8));
  EXPECT_EQ(a.str(), "2x4@0-7");

  const Mesh b = Mesh::parse("2x4@8-15");
  EXPECT_EQ(b.shape(), (std::vector<std::int64_t>{2, 4}));
  EXPECT_EQ(b.devices(), iota(8, 8));
  EXPECT_EQ(b.str(), "2x4@8-15");

  const Mesh c = Mesh::parse("2x2@[0,2,4,6]");
  EXPECT_EQ(c.shape(), (std::vector<std::int64_t>{2, 2}));
  EXPECT_EQ(c.devices(), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(c.str(), "2x2@[0,2,4,6]");

  const Mesh d = Mesh::parse("4@0-3");
  EXPECT_EQ(d.ndim(), 1u);
  EXPECT_EQ(d.devices(), iota(0, 4));

  const Mesh e = Mesh::parse("1x1@5");
  EXPECT_EQ(e.shape(), (std::vector<std::int64_t>{1, 1}));
  EXPECT_EQ(e.devices(), (std::vector<int>{5}));
  EXPECT_EQ(e.str(), "1x1@5");

  const Mesh f = Mesh::parse("2x2@[0-1,6-7]");
  EXPECT_EQ(f.devices(), (std::vector<int>{0, 1, 6, 7}));
  EXPECT_EQ(Mesh::parse(f.str()), f);

  const Mesh g = Mesh::parse("4@[3,2,1,0]");
  EXPECT_EQ(g.devices(), (std::vector<int>{3, 2, 1, 0}));
  EXPECT_EQ(Mesh::parse(g.str()), g);

  EXPECT_EQ(a.size(), 8);
  EXPECT_EQ(a.extent(1), 4);
  EXPECT_EQ(b.device(3), 11);
  std::ostringstream os;
  os << c;
  EXPECT_EQ(os.str(), "2x2@[0,2,4,6]");
}

// Device lists of several kinds: consecutive, random ids, runs, permutations.
std::vector<int> random_devices(Rng& rng, std::int64_t n) {
  const auto count = static_cast<std::size_t>(n);
  switch (rng.below(4)) {
    case 0:
      return iota(static_cast<int>(rng.below(100)), static_cast<int>(n));
    case 1: {  // distinct ids from a wider range, random order
      std::vector<int> pool = iota(0, static_cast<int>(2 * n + 10));
      return testing::sample(rng, pool, count);
    }
    case 2: {  // runs of consecutive ids, then shuffled runs
      std::vector<int> v;
      int next = static_cast<int>(rng.below(5));
      while (v.size() < count) {
        const auto run = rng.between(1, 5);
        for (std::int64_t k = 0; k < run && v.size() < count; ++k) v.push_back(next++);
        next += static_cast<int>(rng.between(1, 3));
      }
      if (rng.chance(1, 2)) std::reverse(v.begin(), v.end());
      return v;
    }
    default: {  // a permutation of 0..n-1, with large ids sometimes
      auto v =
          iota(rng.chance(1, 4) ? 2147483647 - static_cast<int>(n) + 1 : 0, static_cast<int>(n));
      rng.shuffle(v);
      return v;
    }
  }
}

TEST(Mesh, RandomMeshesRoundTripAndIndexInverse) {
  Rng rng(0x3e54);
  for (int i = 0; i < testing::scaled(3000); ++i) {
    const auto shape = testing::random_mesh_shape(rng, 5, 4, 64);
    const auto n = testing::ref_volume(shape);
    const auto devices = random_devices(rng, n);
    const Mesh m(shape, devices);
    const std::string text = m.str();
    SCOPED_TRACE("mesh " + text);
    ASSERT_EQ(Mesh::parse(text), m);
    EXPECT_EQ(Mesh::parse(text).str(), text) << "str() is canonical";
    EXPECT_EQ(m.size(), n);
    EXPECT_EQ(m.ndim(), shape.size());
    for (std::int64_t k = 0; k < n; ++k) {
      const auto c = testing::ref_coord(shape, k);
      ASSERT_EQ(m.coord(k), c) << "index " << k;
      ASSERT_EQ(m.index(c), k);
      ASSERT_EQ(m.device(k), devices[static_cast<std::size_t>(k)]);
      ASSERT_EQ(m.index_of(devices[static_cast<std::size_t>(k)]), std::optional<std::int64_t>(k));
      ASSERT_TRUE(m.contains(devices[static_cast<std::size_t>(k)]));
    }
    // Ids that are not in the mesh.
    for (int d : {-1, 0, 1, 7, 63, 200, 2147483647}) {
      const bool in = std::find(devices.begin(), devices.end(), d) != devices.end();
      EXPECT_EQ(m.index_of(d).has_value(), in) << d;
      EXPECT_EQ(m.contains(d), in) << d;
    }
  }
}

// Ids up to INT_MAX print and parse back (no overflow looking for runs of consecutive ids).
TEST(Mesh, LargestIdsRoundTrip) {
  constexpr int kMax = std::numeric_limits<int>::max();
  for (const auto& devices : {std::vector<int>{kMax, 0}, std::vector<int>{kMax - 1, kMax},
                              std::vector<int>{kMax, kMax - 1, 5}, std::vector<int>{3, kMax, 4}}) {
    const Mesh m({static_cast<std::int64_t>(devices.size())}, devices);
    EXPECT_EQ(Mesh::parse(m.str()), m) << m.str();
  }
  EXPECT_EQ(Mesh::parse("2@2147483646-2147483647").devices(), (std::vector<int>{kMax - 1, kMax}));
}

enum class Kind { Parse, Validation, Either };

TEST(Mesh, BadInputsNameTheFieldInOneLine) {
  struct Bad {
    const char* text;
    Kind kind;
  };
  const Bad cases[] = {
      {"2x4@0-6", Kind::Validation},          // 7 ids for 8 devices
      {"2x4@0-8", Kind::Validation},          // 9 ids
      {"2x2@[0,1,2]", Kind::Validation},      // 3 ids
      {"2x2@[0,1,2,3,4]", Kind::Validation},  // 5 ids
      {"1x1@[5,6]", Kind::Validation},        // 2 ids
      {"2x2@[0,1,1,2]", Kind::Validation},    // duplicate id
      {"2x2@[0-2,2]", Kind::Validation},      // duplicate through a range
      {"2x", Kind::Parse},
      {"x4", Kind::Parse},
      {"2xx4", Kind::Parse},
      {"2x4@", Kind::Parse},
      {"2x2@[0,1", Kind::Parse},
      {"2x2@0,1]", Kind::Parse},
      {"2x2@[]", Kind::Parse},
      {"2x2@[0,1,,2]", Kind::Parse},
      {"2x2@[0,2,4,6]@1", Kind::Parse},
      {"0x4", Kind::Either},
      {"2x0", Kind::Either},
      {"2x4@7-0", Kind::Parse},
      {"2x4@0--7", Kind::Parse},
      {"99999999999999999999x2", Kind::Parse},  // extent beyond int64
      {"9223372036854775807x2", Kind::Either},
      {"65536x65536", Kind::Either},  // 2^32 devices
      {"1048576x1048576x1048576", Kind::Either},
      {"1@2147483648", Kind::Parse},  // id beyond int
      {"2@[0,99999999999]", Kind::Parse},
      {"2@2147483647-2147483648", Kind::Parse},
      {"2xa", Kind::Parse},
      {"2x4@a-b", Kind::Parse},
      {"2x4@0-7z", Kind::Parse},
      {"-1", Kind::Parse},
      {"4@-1-2", Kind::Parse},
      {"2x4@[0,1,2,3,4,5,6,-7]", Kind::Parse},
      {" 2x4", Kind::Parse},
      {"2x4 ", Kind::Parse},
      {"2X4", Kind::Parse},
      {"", Kind::Parse},
      {"@", Kind::Parse},
      {"x", Kind::Parse},
      {"2x4@0-7\n", Kind::Parse},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string("text '") + c.text + "'");
    try {
      const Mesh m = Mesh::parse(c.text, "dst.mesh");
      ADD_FAILURE() << "parsed as " << m.str();
    } catch (const Error& e) {
      const bool parse = dynamic_cast<const ParseError*>(&e) != nullptr;
      const bool validation = dynamic_cast<const ValidationError*>(&e) != nullptr;
      const bool kind_ok = c.kind == Kind::Parse        ? parse
                           : c.kind == Kind::Validation ? validation
                                                        : parse || validation;
      EXPECT_TRUE(kind_ok) << e.what();
      EXPECT_EQ(e.field(), "dst.mesh") << e.what();
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("dst.mesh: ", 0), 0u) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      EXPECT_LT(what.size(), 300u) << what;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a meshcast::Error: " << e.what();
    }
  }
}

TEST(Mesh, ConstructorValidates) {
  EXPECT_THROW(Mesh({}, {}, "m"), ValidationError);
  EXPECT_THROW(Mesh({2}, {0, -1}, "m"), ValidationError);
  EXPECT_THROW(Mesh({2}, {3, 3}, "m"), ValidationError);
  EXPECT_THROW(Mesh({2, 2}, {0, 1, 2}, "m"), ValidationError);
  EXPECT_THROW(Mesh({0}, {}, "m"), ValidationError);
  // Ten axes, the most a spec's one-digit axis names reach: axis 9 round-trips through text;
  // an eleventh is refused (it would print as "S10", read back as axes 1 and 0).
  const Mesh ten(std::vector<std::int64_t>(10, 1), {7}, "m");
  const Layout l({4, 4}, DType::f32, ten, ShardingSpec(std::vector<std::vector<int>>{{9}, {}}));
  EXPECT_EQ(Layout::parse({4, 4}, DType::f32, l.str()).str(), l.str());
  EXPECT_THROW(Mesh(std::vector<std::int64_t>(11, 1), {7}, "m"), ValidationError);
  EXPECT_THROW(Mesh::parse("1x1x1x1x1x1x1x1x1x1x1@0", "m"), Error);
  try {
    Mesh({2}, {4, 4}, "src.mesh");
    ADD_FAILURE();
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "src.mesh");
  }
}

TEST(Mesh, AccessorsRefuseOutOfRangeArguments) {
  const Mesh m = Mesh::parse("2x2@0-3");
  auto field = [](auto&& f) {
    try {
      f();
      return std::string("none");
    } catch (const ValidationError& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
      return e.field();
    }
  };
  EXPECT_EQ(field([&] { (void)m.device(100); }), "mesh");
  EXPECT_EQ(field([&] { (void)m.device(4); }), "mesh");
  EXPECT_EQ(field([&] { (void)m.device(-1); }), "mesh");
  EXPECT_EQ(field([&] { (void)m.coord(4); }), "mesh");
  EXPECT_EQ(field([&] { (void)m.coord(-1); }), "mesh");
  EXPECT_EQ(field([&] { (void)m.extent(2); }), "mesh");
  EXPECT_EQ(field([&] { (void)m.index({0}); }), "mesh");
  EXPECT_EQ(field([&] { (void)m.index({0, 0, 0}); }), "mesh");
  EXPECT_EQ(field([&] { (void)m.index({2, 0}); }), "mesh");
  EXPECT_EQ(field([&] { (void)m.index({0, -1}); }), "mesh");
  try {
    (void)m.device(100);
  } catch (const ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("device index 100"), std::string::npos) << e.what();
  }
  EXPECT_EQ(m.device(3), 3);
  EXPECT_EQ(m.index({1, 1}), 3);
  EXPECT_EQ(m.coord(3), (std::vector<std::int64_t>{1, 1}));
  EXPECT_EQ(m.extent(1), 2);
}

// A device list longer than the mesh is counted whole (not "5 ids given" for 20,001), in a
// message of one bounded line.
TEST(Mesh, TooManyIdsAreCountedInABoundedMessage) {
  std::string list;
  for (int i = 0; i <= 20000; ++i) list += (i ? "," : "") + std::to_string(i);
  for (const std::string& text : {"4@[" + list + "]", std::string("4@[0-9999,10000-20000]"),
                                  std::string("4@[0,1,2,3,4-20000]")}) {
    try {
      (void)Mesh::parse(text, "src.mesh");
      ADD_FAILURE() << "accepted";
    } catch (const ValidationError& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.field(), "src.mesh");
      EXPECT_NE(what.find("mesh has 4 devices but 20001 device ids given"), std::string::npos)
          << what;
      EXPECT_LT(what.size(), 200u);
    }
  }
  try {
    (void)Mesh::parse("2x2@[0,1,2]", "m");
    ADD_FAILURE();
  } catch (const ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("but 3 device ids given"), std::string::npos);
  }
  // Layouts over a mesh of 20,000 listed ids print a bounded mesh in their messages.
  std::string ids;
  for (int i = 0; i < 20000; ++i) ids += (i ? "," : "") + std::to_string(2 * i);
  for (const char* spec : {"S1", "RR"}) {
    try {
      (void)Layout::parse({8}, DType::f32, "20000@[" + ids + "]:" + spec, "src");
      ADD_FAILURE() << spec;
    } catch (const ValidationError& e) {
      EXPECT_LT(std::string(e.what()).size(), 300u) << e.what();
    }
  }
}

// How far f() raises peak memory above what this process holds: run in a child process, whose
// peak resident size the kernel reports when it ends.
std::int64_t peak_growth(const std::function<void()>& f) {
  const std::int64_t before = testing::resident_bytes();
  const pid_t pid = fork();
  if (pid == 0) {
    try {
      f();
    } catch (...) {
    }
    _exit(0);
  }
  int status = 0;
  rusage ru{};
  if (pid < 0 || wait4(pid, &status, 0, &ru) != pid || !WIFEXITED(status)) return -1;
  return std::int64_t{ru.ru_maxrss} * 1024 - before;
}

// A device range far larger than the mesh is refused without materialising its ids (30M ids
// would take 120 MB for a 4-device mesh).
TEST(Mesh, LongDeviceRangeIsRefusedWithoutMaterialisingIt) {
  for (const char* text : {"4@0-30000000", "2x2@[0-30000000]"}) {
    const std::int64_t growth = peak_growth([&] { (void)Mesh::parse(text, "mesh"); });
    EXPECT_NE(growth, -1) << "the child process failed";
    EXPECT_LT(growth, std::int64_t{32} << 20)
        << "Mesh::parse(\"" << text << "\") raised peak memory by " << (growth >> 20) << " MiB";
    EXPECT_THROW(Mesh::parse(text, "mesh"), Error) << text;
  }
}

}  // namespace
}  // namespace meshcast
