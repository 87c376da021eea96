// Layout: each device's tile against the tests' own tile formula, replica groups, validation,
// and the shape parser.
#include "meshcast/layout.h"

#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <set>

#include "meshcast/error.h"
#include "support/testing.h"

namespace meshcast {
namespace {

using testing::Rng;
using Dims = std::vector<std::vector<int>>;

ShardingSpec spec(Dims dims, std::vector<int> partial = {}) {
  return ShardingSpec(std::move(dims), std::move(partial));
}

Layout random_layout(Rng& rng, int max_ndim, std::int64_t max_volume) {
  testing::Limits lim;
  lim.max_ndim = max_ndim;
  lim.max_extent = 7;
  lim.max_volume = max_volume;
  const Shape shape = testing::random_shape(rng, lim);
  const auto ms = testing::random_mesh_shape(rng, 3, 4, 12);
  std::vector<int> pool(20);
  std::iota(pool.begin(), pool.end(), 0);
  const Mesh mesh(ms,
                  testing::sample(rng, pool, static_cast<std::size_t>(testing::ref_volume(ms))));
  const auto spec = testing::random_spec(rng, shape.size(), mesh.ndim(), rng.chance(1, 3));
  return Layout(shape, testing::dtype_at(rng.below(testing::kDTypeCount)), mesh, spec);
}

std::string describe(const Layout& l) {
  return "shape " + shape_str(l.shape()) + " " + to_string(l.dtype()) + " " + l.str();
}

TEST(Layout, WorkedExample) {
  // 2x4 mesh, 10x6 tensor, rows over axis 0 (2 ways), columns over axis 1 (4 ways, uneven).
  const Layout l = Layout::parse({10, 6}, DType::f32, "2x4@8-15:S0S1");
  EXPECT_EQ(l.tile_of(8), Box({{0, 5}, {0, 1}}));
  EXPECT_EQ(l.tile_of(9), Box({{0, 5}, {1, 3}}));
  EXPECT_EQ(l.tile_of(11), Box({{0, 5}, {4, 6}}));
  EXPECT_EQ(l.tile_of(12), Box({{5, 10}, {0, 1}}));
  EXPECT_EQ(l.local_elements(15), 10);
  EXPECT_EQ(l.str(), "2x4@8-15:S0S1");
  EXPECT_EQ(l.elements(), 60);
  EXPECT_EQ(l.bytes(), 240);
  EXPECT_THROW(l.tile_of(7), ValidationError);
  // S10: axis 1 major, axis 0 minor: device at coordinate (r, c) holds shard c*2 + r.
  const Layout m = Layout::parse({8}, DType::i8, "2x4:S10");
  EXPECT_EQ(m.tile_of(0), Box({{0, 1}}));
  EXPECT_EQ(m.tile_of(4), Box({{1, 2}}));
  EXPECT_EQ(m.tile_of(1), Box({{2, 3}}));
  EXPECT_EQ(m.tile_of(7), Box({{7, 8}}));
}

TEST(Layout, TilesMatchTheReferenceFormula) {
  Rng rng(0x1a40);
  for (int i = 0; i < testing::scaled(3000); ++i) {
    // Mostly 1-4 dimensions; one in four up to 8.
    const Layout l = random_layout(rng, rng.chance(1, 4) ? 8 : 4, rng.chance(1, 4) ? 100000 : 200);
    SCOPED_TRACE(describe(l));
    const Mesh& m = l.mesh();
    EXPECT_EQ(l.partial_groups(), testing::ref_groups(l));
    for (std::size_t d = 0; d < l.ndim(); ++d) {
      std::int64_t p = 1;
      for (int a : l.spec().axes(d)) p *= m.extent(static_cast<std::size_t>(a));
      EXPECT_EQ(l.splits(d), p) << "dim " << d;
    }
    for (std::int64_t k = 0; k < m.size(); ++k) {
      const Box want = testing::ref_tile(l, k);
      ASSERT_EQ(l.tile_at(k), want) << "mesh index " << k;
      ASSERT_EQ(l.tile_of(m.device(k)), want) << "device " << m.device(k);
      ASSERT_EQ(l.local_elements(m.device(k)), want.volume());
      ASSERT_EQ(l.partial_group(k), testing::ref_addend(l, k)) << "mesh index " << k;
      const auto c = testing::ref_coord(m.shape(), k);
      std::vector<std::int64_t> shard;
      for (std::size_t d = 0; d < l.ndim(); ++d) {
        shard.push_back(testing::ref_shard_of(l, d, c).first);
        ASSERT_EQ(l.shard_index(d, k), shard.back()) << "mesh index " << k << " dim " << d;
      }
      // holders(shard): every mesh index with the same shard indices, in mesh order.
      std::vector<std::int64_t> holders;
      for (std::int64_t j = 0; j < m.size(); ++j) {
        const auto cj = testing::ref_coord(m.shape(), j);
        bool same = true;
        for (std::size_t d = 0; d < l.ndim(); ++d)
          same = same && testing::ref_shard_of(l, d, cj).first == shard[d];
        if (same) holders.push_back(j);
      }
      ASSERT_EQ(l.holders(shard), holders) << "mesh index " << k;
    }
  }
}

TEST(Layout, TilesOfANonPartialLayoutCoverTheTensor) {
  // Each replica (a choice of coordinates along the unused axes) holds the tensor exactly once.
  Rng rng(0xc0fe);
  for (int i = 0; i < testing::scaled(500); ++i) {
    const Layout l = random_layout(rng, 4, 150);
    SCOPED_TRACE(describe(l));
    std::int64_t total = 0;
    for (std::int64_t k = 0; k < l.mesh().size(); ++k) total += l.tile_at(k).volume();
    std::int64_t replicas = l.mesh().size();
    for (std::size_t d = 0; d < l.ndim(); ++d) replicas /= l.splits(d);
    EXPECT_EQ(total, l.elements() * replicas);
  }
}

TEST(Layout, ReplicaGroupsPartitionTheMesh) {
  Rng rng(0x6e01);
  for (int i = 0; i < testing::scaled(2000); ++i) {
    const Layout l = random_layout(rng, 4, 200);
    SCOPED_TRACE(describe(l));
    const auto groups = l.replica_groups();
    std::map<int, std::size_t> group_of;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      ASSERT_FALSE(groups[g].empty());
      for (int d : groups[g]) {
        ASSERT_TRUE(l.mesh().contains(d)) << d;
        ASSERT_TRUE(group_of.emplace(d, g).second) << "device " << d << " in two groups";
      }
      // In mesh order.
      for (std::size_t k = 1; k < groups[g].size(); ++k)
        EXPECT_LT(*l.mesh().index_of(groups[g][k - 1]), *l.mesh().index_of(groups[g][k]));
    }
    ASSERT_EQ(static_cast<std::int64_t>(group_of.size()), l.mesh().size());
    // Two devices share a group iff they hold the same tile and addend (empty tiles of different
    // shards may stay apart: they hold nothing).
    for (std::int64_t a = 0; a < l.mesh().size(); ++a)
      for (std::int64_t b = 0; b < l.mesh().size(); ++b) {
        const Box ta = testing::ref_tile(l, a), tb = testing::ref_tile(l, b);
        const bool same = ta == tb && testing::ref_addend(l, a) == testing::ref_addend(l, b);
        const bool together = group_of[l.mesh().device(a)] == group_of[l.mesh().device(b)];
        if (together) {
          EXPECT_TRUE(same) << "indices " << a << ", " << b;
        }
        if (same && !ta.empty()) {
          EXPECT_TRUE(together) << "indices " << a << ", " << b;
        }
      }
  }
}

// Accessors taking a dim or shard indices check them: splits(5) of a 2-D tensor read past the
// spec's tokens, holders({-1, 0}) answered devices of no tile, holders({}) crashed.
TEST(Layout, AccessorsRefuseIndicesOutOfRange) {
  const Layout l = Layout::parse({8, 8}, DType::f32, "2x2:S0R");
  EXPECT_EQ(l.holders({1, 0}), (std::vector<std::int64_t>{2, 3}));
  for (const std::vector<std::int64_t>& shard :
       {std::vector<std::int64_t>{-1, 0}, {2, 0}, {0, 1}, {}, {0, 0, 0}})
    try {
      (void)l.holders(shard);
      ADD_FAILURE() << "holders of " << shard.size() << " indices accepted";
    } catch (const ValidationError& e) {
      EXPECT_EQ(e.field(), "shard") << e.what();
    }
  EXPECT_THROW((void)l.splits(5), ValidationError);
  EXPECT_THROW((void)l.shard_index(5, 0), ValidationError);
  EXPECT_THROW((void)l.spec().axes(2), ValidationError);
}

TEST(Layout, ValidationNamesTheField) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  const Mesh m24 = Mesh::parse("2x4");
  struct Bad {
    Shape shape;
    DType dtype;
    ShardingSpec spec;
    const char* why;
  };
  const Bad cases[] = {
      {{4, 4}, DType::f32, spec(Dims{{0}}), "spec ndim 1, shape ndim 2"},
      {{4}, DType::f32, spec(Dims{{0}, {}}), "spec ndim 2, shape ndim 1"},
      {{4, 4}, DType::f32, spec(Dims{{2}, {}}), "axis 2 on a 2-D mesh"},
      {{4, 4}, DType::f32, spec(Dims{{0}, {}}, {7}), "partial axis 7"},
      {{4, 4}, DType::f32, spec(Dims{{-1}, {}}), "negative axis"},
      {{4, 4}, DType::f32, spec(Dims{{0}, {0}}), "axis 0 twice across dims"},
      {{4, 4}, DType::f32, spec(Dims{{0, 0}, {}}), "axis 0 twice in one dim"},
      {{4, 4}, DType::f32, spec(Dims{{0}, {}}, {0}), "axis 0 split and partial"},
      {{4, 4}, DType::f32, spec(Dims{{}, {}}, {1, 1}), "axis 1 partial twice"},
      {{-4, 4}, DType::f32, spec(Dims{{0}, {}}), "negative extent"},
      {{4, -1}, DType::f32, spec(Dims{{0}, {}}), "negative extent"},
      {{kMax, 4}, DType::f32, spec(Dims{{0}, {}}), "elements overflow"},
      {{kMax / 2, 1}, DType::f32, spec(Dims{{0}, {}}), "bytes overflow"},
      {{std::int64_t{1} << 32, std::int64_t{1} << 32},
       DType::i8,
       spec(Dims{{0}, {}}),
       "2^64 elements"},
      {{}, DType::f32, spec(Dims{{0}}), "a 0-d tensor split"},
      {{}, DType::f32, spec(Dims{{}, {}}), "a 0-d tensor with 2 spec dimensions"},
      {{}, DType::f32, spec(Dims{}, {2}), "a 0-d tensor's partial axis 2 on a 2-D mesh"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.why);
    try {
      const Layout l(c.shape, c.dtype, m24, c.spec, "src");
      ADD_FAILURE() << "accepted " << l.str();
    } catch (const ValidationError& e) {
      EXPECT_NE(e.field().find("src"), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a ValidationError: " << e.what();
    }
  }
  // Not an overflow: exactly the int64 range of bytes, and a zero extent next to a huge one.
  EXPECT_NO_THROW(Layout({kMax}, DType::i8, m24, spec(Dims{{}})));
  EXPECT_NO_THROW(Layout({0, kMax}, DType::f64, m24, spec(Dims{{0}, {1}})));
}

// An empty tensor is well defined whatever its other extents, in any order of dimensions.
TEST(Layout, EmptyTensorsWithHugeExtentsAreAccepted) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  const Mesh m = Mesh::parse("2x2");
  for (const Shape& shape : {Shape{0, kMax, 4}, Shape{kMax, 0, 4}, Shape{kMax, 4, 0}}) {
    SCOPED_TRACE("shape " + shape_str(shape));
    try {
      const Layout l(shape, DType::f32, m, spec(Dims{{0}, {1}, {}}));
      EXPECT_EQ(l.elements(), 0);
      EXPECT_EQ(l.bytes(), 0);
      for (std::int64_t k = 0; k < 4; ++k) EXPECT_TRUE(l.tile_at(k).empty());
    } catch (const Error& e) {
      ADD_FAILURE() << "refused: " << e.what();
    }
  }
}

// A 0-d tensor is planned as shape [1], whole on every device, and remembers it was 0-d; its
// spec is "" or "R", with a pending sum or not.
TEST(Layout, ZeroDimensionalTensorsArePlannedAsOneElement) {
  for (const char* text : {"2x4@8-15:", "2x4@8-15:R", "2x4@8-15:+P1", "2x4@8-15:R+P01"}) {
    SCOPED_TRACE(text);
    const Layout l = Layout::parse({}, DType::i64, text, "dst");
    EXPECT_TRUE(l.scalar());
    EXPECT_EQ(l.shape(), Shape{1});
    EXPECT_EQ(l.ndim(), 1u);
    EXPECT_EQ(l.elements(), 1);
    EXPECT_EQ(l.bytes(), 8);
    const auto partial = ShardingSpec::parse(std::string_view(text).substr(9)).partial();
    EXPECT_EQ(l.spec(), spec(Dims{{}}, partial));
    for (int d = 8; d < 16; ++d) EXPECT_EQ(l.tile_of(d), Box({{0, 1}}));
    EXPECT_EQ(Layout::parse({}, DType::i64, l.str()), l);  // str() reads back as 0-d
    const Layout one = Layout::parse({1}, DType::i64, l.str());
    EXPECT_FALSE(one.scalar());
    EXPECT_NE(one, l);  // the same element, not the same shape
    EXPECT_EQ(one.replica_groups(), l.replica_groups());
  }
}

TEST(Layout, ParseNamesTheField) {
  const Layout l = Layout::parse({8, 8}, DType::bf16, "2x4@8-15:S0R+P1", "dst");
  EXPECT_EQ(l.mesh(), Mesh::parse("2x4@8-15"));
  EXPECT_EQ(l.spec(), ShardingSpec::parse("S0R+P1"));
  EXPECT_EQ(l.str(), "2x4@8-15:S0R+P1");
  struct Bad {
    const char* text;
    const char* field;
  };
  for (const Bad& c : {Bad{"2x4", "dst"}, Bad{"2x4@0-7:Q0R", "dst.spec"}, Bad{"2x:S0R", "dst.mesh"},
                       Bad{"2x4@0-6:S0R", "dst.mesh"}, Bad{"2x4:S2R", "dst"}, Bad{"2x4:S0", "dst"},
                       Bad{":S0R", "dst.mesh"}, Bad{"2x4:", "dst.spec"}, Bad{"", "dst"}}) {
    SCOPED_TRACE(c.text);
    try {
      Layout::parse({8, 8}, DType::f32, c.text, "dst");
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.field().rfind(c.field, 0), 0u) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
  }
}

TEST(Shape, ParseAndPrint) {
  EXPECT_EQ(parse_shape("1024,1024,512"), (Shape{1024, 1024, 512}));
  EXPECT_EQ(parse_shape("7"), (Shape{7}));
  EXPECT_EQ(parse_shape("0,3"), (Shape{0, 3}));
  EXPECT_EQ(parse_shape("9223372036854775807,4"),
            (Shape{std::numeric_limits<std::int64_t>::max(), 4}));
  EXPECT_EQ(shape_str({1024, 1024, 512}), "1024,1024,512");
  EXPECT_EQ(parse_shape(shape_str({3, 0, 9})), (Shape{3, 0, 9}));
  // The maximal extent parses; with f32 its bytes overflow: the Layout refuses it.
  try {
    Layout(parse_shape("9223372036854775807,4"), DType::f32, Mesh::parse("1"), spec(Dims{{}, {}}),
           "src");
    ADD_FAILURE() << "accepted";
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field().rfind("src", 0), 0u) << e.what();
  }
}

TEST(Shape, BadTextThrowsParseErrorNamingTheField) {
  for (const char* bad : {"-4,4", "4,-4", "4,,4", "a", "", ",", "4,", ",4", "4 ,4", "4x4", "+4",
                          "9223372036854775808", "99999999999999999999999", "4.0", "0x10", "4\n"}) {
    SCOPED_TRACE(std::string("shape '") + bad + "'");
    try {
      const Shape s = parse_shape(bad, "shape");
      ADD_FAILURE() << "parsed as " << shape_str(s);
    } catch (const ParseError& e) {
      EXPECT_EQ(e.field(), "shape");
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a ParseError: " << e.what();
    }
  }
}

}  // namespace
}  // namespace meshcast
