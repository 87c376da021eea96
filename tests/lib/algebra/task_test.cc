// tasks(src, dst): every element lies in exactly one task, whose sources and destinations are
// exactly the devices the tests' own tile formula says hold and need it.
#include "meshcast/task.h"

#include <gtest/gtest.h>

#include <set>

#include "lib/algebra/holder_set.h"
#include "meshcast/error.h"
#include "support/testing.h"

namespace meshcast {
namespace {

using testing::Rng;

// Checks the law for one pair of layouts; returns false after the first failure.
bool check_tasks(const testing::Case& c) {
  const Layout& src = c.src;
  const Layout& dst = c.dst;
  const auto ts = tasks(src, dst);
  const Shape& shape = src.shape();
  const std::int64_t n = testing::ref_volume(shape);
  const std::int64_t groups = testing::ref_groups(src);
  const bool dst_partial = !dst.spec().partial().empty();
  std::vector<Box> s_tile, d_tile;
  for (std::int64_t i = 0; i < src.mesh().size(); ++i) s_tile.push_back(testing::ref_tile(src, i));
  for (std::int64_t i = 0; i < dst.mesh().size(); ++i) d_tile.push_back(testing::ref_tile(dst, i));

  std::vector<int> count(static_cast<std::size_t>(n), 0);
  std::vector<std::size_t> owner(static_cast<std::size_t>(n), 0);
  for (std::size_t t = 0; t < ts.size(); ++t) {
    EXPECT_EQ(ts[t].box.ndim(), shape.size()) << c.str() << " task " << t;
    EXPECT_FALSE(ts[t].box.empty()) << c.str() << " task " << t << " " << ts[t].box.str();
    if (!Box::whole(shape).contains(ts[t].box)) {
      ADD_FAILURE() << c.str() << " task " << t << " box " << ts[t].box.str()
                    << " outside the tensor";
      return false;
    }
    testing::ref_for_each(shape, ts[t].box, [&](const auto&, std::int64_t g) {
      ++count[static_cast<std::size_t>(g)];
      owner[static_cast<std::size_t>(g)] = t;
    });
  }
  std::vector<std::vector<int>> want_src(static_cast<std::size_t>(groups));
  std::vector<int> want_dst;
  bool ok = true;
  testing::ref_for_each(
      shape, Box::whole(shape), [&](const std::vector<std::int64_t>& x, std::int64_t g) {
        if (!ok) return;
        const auto at = static_cast<std::size_t>(g);
        if (count[at] != 1) {
          ADD_FAILURE() << c.str() << ": element " << g << " lies in " << count[at] << " tasks";
          ok = false;
          return;
        }
        const Task& t = ts[owner[at]];
        for (auto& v : want_src) v.clear();
        want_dst.clear();
        for (std::int64_t i = 0; i < src.mesh().size(); ++i)
          if (testing::ref_has(s_tile[static_cast<std::size_t>(i)], x))
            want_src[static_cast<std::size_t>(testing::ref_addend(src, i))].push_back(
                src.mesh().device(i));
        for (std::int64_t i = 0; i < dst.mesh().size(); ++i)
          if (testing::ref_has(d_tile[static_cast<std::size_t>(i)], x) &&
              (!dst_partial || testing::ref_addend(dst, i) == 0))
            want_dst.push_back(dst.mesh().device(i));
        if (t.sources != want_src || t.destinations != want_dst) {
          ADD_FAILURE() << c.str() << ": element " << g << " in task " << owner[at] << " box "
                        << t.box.str() << ": sources/destinations differ from the reference";
          ok = false;
        }
      });
  return ok;
}

TEST(Tasks, WorkedExample) {
  // 2x2 rows -> 2x2 columns on the same devices: 4 tasks, each a quarter.
  const auto src = Layout::parse({4, 4}, DType::f32, "2x2@0-3:S0R");
  const auto dst = Layout::parse({4, 4}, DType::f32, "2x2@0-3:RS0");
  const auto ts = tasks(src, dst);
  ASSERT_EQ(ts.size(), 4u);
  EXPECT_EQ(ts[0].box, Box({{0, 2}, {0, 2}}));
  EXPECT_EQ(ts[0].sources, (std::vector<std::vector<int>>{{0, 1}}));
  EXPECT_EQ(ts[0].destinations, (std::vector<int>{0, 1}));  // column shard 0: mesh row 0
  EXPECT_EQ(ts[3].box, Box({{2, 4}, {2, 4}}));
  EXPECT_EQ(ts[3].sources, (std::vector<std::vector<int>>{{2, 3}}));
  EXPECT_EQ(ts[3].destinations, (std::vector<int>{2, 3}));
}

TEST(Tasks, EveryElementInExactlyOneTaskWithTheRightDevices) {
  Rng rng(0x7a5c);
  testing::Limits lim;
  lim.max_mesh_size = 12;
  const int n = testing::scaled(10000);
  for (int i = 0; i < n; ++i) {
    const auto c = testing::random_case(rng, lim);
    ASSERT_TRUE(check_tasks(c)) << "case " << i;
  }
}

// The holders of a task's tiles as a view (lib/algebra/holder_set.h): position() inverts the k-th
// holder, and no other device of either mesh has one.
TEST(Tasks, HolderPositionsInvertTheKthHolder) {
  Rng rng(0x4f1d);
  testing::Limits lim;
  lim.max_mesh_size = 12;
  const int n = testing::scaled(2000);
  for (int c_i = 0; c_i < n; ++c_i) {
    const auto c = testing::random_case(rng, lim);
    const TaskGrid grid(c.src, c.dst);
    std::vector<int> all = c.src.mesh().devices();
    all.insert(all.end(), c.dst.mesh().devices().begin(), c.dst.mesh().devices().end());
    std::vector<std::int64_t> s, d;
    for (std::int64_t i = 0; i < grid.size(); ++i) {
      grid.shards(i, s, d);
      for (const auto& [layout, shard] : {std::pair{&c.src, &s}, std::pair{&c.dst, &d}})
        for (std::int64_t g = 0; g < layout->partial_groups(); ++g) {
          detail::HolderSet h(*layout);
          h.select(*shard, g);
          for (std::int64_t k = 0; k < h.size(); ++k)
            ASSERT_EQ(h.position(h[k]), k) << "case " << c_i << ": " << c.str();
          std::int64_t found = 0;
          for (int dev : std::set<int>(all.begin(), all.end())) found += h.position(dev) >= 0;
          found += h.position(-1) >= 0 || h.position(1 << 30) >= 0;
          ASSERT_EQ(found, h.size()) << "case " << c_i << ": " << c.str();
        }
    }
  }
}

TEST(Tasks, SpecialCases) {
  struct Case {
    Shape shape;
    const char* src;
    const char* dst;
  };
  for (const Case& c : {
           Case{{0, 5}, "2x2:S0S1", "4@4-7:S0R"},  // empty tensor: no tasks
           Case{{3}, "8:S0", "2x4@8-15:S10"},      // more shards than elements
           Case{{1, 1}, "2x2:S0S1", "4@4-7:RS0"},  // one element, mostly empty shards
           Case{{5, 7}, "2x3:S0R+P1", "2x3@[5,4,3,2,1,0]:S1S0"},  // partial, permuted
           Case{{5, 7}, "2x2:RR+P01", "2x2:S0R+P1"},              // partial to partial
           Case{{6}, "3x2:S0+P1", "3x2:S0+P1"},                   // identical partial layouts
           Case{{4, 4}, "1:RR", "2x2@1-4:S0S1"},                  // one source device
           Case{{4, 4}, "1x1:RR+P0", "2x2@1-4:S0S1"},             // partial over an extent-1 axis
       }) {
    const testing::Case tc{Layout::parse(c.shape, DType::f32, c.src),
                           Layout::parse(c.shape, DType::f32, c.dst),
                           testing::Devices::Overlapping};
    EXPECT_TRUE(check_tasks(tc)) << tc.str();
  }
  EXPECT_TRUE(tasks(Layout::parse({0, 5}, DType::f32, "2x2:S0S1"),
                    Layout::parse({0, 5}, DType::f32, "4@4-7:S0R"))
                  .empty());
}

// The grid's accessors check a task index and a region's ndim (they read past its tables).
TEST(Tasks, GridAccessorsRefuseIndicesOutOfRange) {
  const auto a = Layout::parse({4, 4}, DType::f32, "2x2:S0R");
  const auto b = Layout::parse({4, 4}, DType::f32, "2x2@4-7:RS1");
  const TaskGrid g(a, b);
  ASSERT_GT(g.size(), 0);
  EXPECT_NO_THROW(g.box(g.size() - 1));
  for (std::int64_t i : {std::int64_t{-1}, g.size()}) {
    EXPECT_THROW(g.box(i), ValidationError) << i;
    EXPECT_THROW(g.task(i), ValidationError) << i;
  }
  EXPECT_THROW(g.meeting(Box({{0, 4}})), ValidationError);
}

TEST(Tasks, MismatchedShapeOrDtypeNamesTheField) {
  const auto a = Layout::parse({4, 4}, DType::f32, "2x2:S0R");
  try {
    tasks(a, Layout::parse({4, 5}, DType::f32, "2x2:S0R"));
    ADD_FAILURE();
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "dst.shape");
  }
  try {
    tasks(a, Layout::parse({4}, DType::f32, "2x2:S0"));
    ADD_FAILURE();
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "dst.shape");
  }
  try {
    tasks(a, Layout::parse({4, 4}, DType::bf16, "2x2:S0R"));
    ADD_FAILURE();
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "dst.dtype");
  }
}

}  // namespace
}  // namespace meshcast
