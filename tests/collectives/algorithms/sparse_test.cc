// Sparse gradient synchronisation on the in-process backend: every method equals the dense sum
// exactly on integer-valued rows (uniform and Zipf-skewed indices, densities from none to all,
// 1-6 members), within summation-order tolerance on random floats; the owner hash balances
// skewed indices; the traffic model orders the methods as their bytes do; bad input.
#include "meshcast/sparse.h"

#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "meshcast/error.h"
#include "meshcast/local.h"

namespace meshcast {
namespace {

// Member r's non-zero rows: `density` of the table, drawn uniformly or Zipf(1.1)-skewed towards
// low indices; values small integers (exact sums) or random floats.
SparseRows make_rows(int r, std::int64_t rows, std::int64_t width, double density, bool zipf,
                     bool integers, std::uint64_t seed) {
  std::mt19937_64 g(seed * 7919 + static_cast<std::uint64_t>(r));
  std::vector<double> weight(static_cast<std::size_t>(rows), 1.0);
  if (zipf)
    for (std::int64_t i = 0; i < rows; ++i)
      weight[static_cast<std::size_t>(i)] = 1 / std::pow(i + 1.0, 1.1);
  std::discrete_distribution<std::int64_t> pick(weight.begin(), weight.end());
  std::vector<char> on(static_cast<std::size_t>(rows), 0);
  const auto want = static_cast<std::int64_t>(density * static_cast<double>(rows));
  for (std::int64_t k = 0, tries = 0; k < want && tries < 50 * rows + 100; ++tries) {
    auto& f = on[static_cast<std::size_t>(pick(g))];
    if (!f) f = 1, ++k;
  }
  SparseRows s{rows, width, {}, {}};
  std::uniform_real_distribution<float> real(-1, 1);
  for (std::int64_t i = 0; i < rows; ++i)
    if (on[static_cast<std::size_t>(i)]) {
      s.indices.push_back(i);
      for (std::int64_t c = 0; c < width; ++c)
        s.values.push_back(integers ? static_cast<float>((r * 13 + i * 7 + c) % 17 - 8) : real(g));
    }
  return s;
}

struct Result {
  std::vector<std::string> errors;
  double worst = 0;  // largest |got - reference|
};

Result run(int n, std::int64_t rows, std::int64_t width, double density, bool zipf, bool integers,
           SparseMethod method, std::uint64_t seed) {
  std::vector<SparseRows> inputs;
  for (int r = 0; r < n; ++r)
    inputs.push_back(make_rows(r, rows, width, density, zipf, integers, seed));
  std::vector<double> ref(static_cast<std::size_t>(rows * width), 0);
  for (const auto& s : inputs)
    for (std::size_t k = 0; k < s.indices.size(); ++k)
      for (std::int64_t c = 0; c < width; ++c)
        ref[static_cast<std::size_t>(s.indices[k] * width + c)] +=
            s.values[k * static_cast<std::size_t>(width) + static_cast<std::size_t>(c)];
  Result res;
  std::mutex m;
  LocalWorld w(n);
  w.run([&](Communicator& comm) {
    std::vector<float> out(static_cast<std::size_t>(rows * width), -99);
    sparse_all_reduce(comm.world(), inputs[static_cast<std::size_t>(comm.rank())], out, method);
    double worst = 0;
    std::int64_t wrong = 0;
    for (std::size_t i = 0; i < out.size(); ++i) {
      const double e = std::abs(out[i] - ref[i]);
      worst = std::max(worst, e);
      wrong += integers && e != 0;
    }
    std::lock_guard<std::mutex> lock(m);
    res.worst = std::max(res.worst, worst);
    if (wrong)
      res.errors.push_back("device " + std::to_string(comm.rank()) + ": " + std::to_string(wrong) +
                           " wrong elements with " + to_string(method));
  });
  return res;
}

TEST(Sparse, EveryMethodEqualsTheDenseSum) {
  std::uint64_t seed = 1;
  for (int n : {1, 2, 3, 6})
    for (double density : {0.0, 0.001, 0.01, 0.1, 1.0})
      for (bool zipf : {false, true})
        for (SparseMethod m : {SparseMethod::Dense, SparseMethod::AllGather, SparseMethod::Balanced,
                               SparseMethod::Auto}) {
          const Result r = run(n, 2000, 3, density, zipf, true, m, seed++);
          EXPECT_TRUE(r.errors.empty()) << n << " members, density " << density
                                        << (zipf ? " zipf: " : " uniform: ") << r.errors.front();
        }
}

TEST(Sparse, FloatsWithinSummationOrderTolerance) {
  for (SparseMethod m : {SparseMethod::AllGather, SparseMethod::Balanced}) {
    const Result r = run(5, 5000, 8, 0.05, true, false, m, 77);
    EXPECT_LT(r.worst, 1e-5) << to_string(m);
  }
}

TEST(Sparse, OwnerHashBalancesSkewedIndices) {
  // The 2,000 hottest rows of a Zipf table are its lowest indices: a range split would give
  // them all to member 0; the hash spreads them within a few percent of even.
  for (std::size_t n : {4u, 8u, 16u}) {
    std::vector<int> load(n, 0);
    for (std::int64_t i = 0; i < 2000; ++i) ++load[sparse_owner(i, n)];
    const int most = *std::max_element(load.begin(), load.end());
    EXPECT_LT(most, 1.25 * 2000.0 / static_cast<double>(n)) << n << " members";
  }
}

TEST(Sparse, TrafficModelOrdersTheMethods) {
  const std::vector<std::int64_t> sparse(8, 100), dense(8, 100000);
  const std::int64_t rows = 100000, width = 64;
  auto t = [&](SparseMethod m, const std::vector<std::int64_t>& z, std::int64_t distinct) {
    return sparse_traffic(m, z, distinct, rows, width);
  };
  // 0.1% density, no row shared: gathering the records beats routing them through owners, and
  // both are far below dense.
  EXPECT_LT(t(SparseMethod::AllGather, sparse, 800), t(SparseMethod::Balanced, sparse, 800));
  EXPECT_LT(t(SparseMethod::Balanced, sparse, 800), t(SparseMethod::Dense, sparse, 800) / 10);
  // Skewed: the members share most rows (200 distinct of 800), owners sum them once.
  EXPECT_LT(t(SparseMethod::Balanced, sparse, 200), t(SparseMethod::AllGather, sparse, 200));
  // Every row everywhere: dense wins (records carry their index too).
  EXPECT_LT(t(SparseMethod::Dense, dense, rows), t(SparseMethod::Balanced, dense, rows));
  // There the owners send bitmaps (rows / 8 bytes each) instead of 8-byte indices.
  const double records = (100000.0 + rows) * (8 + width * 4) * 7 / 8;
  EXPECT_DOUBLE_EQ(t(SparseMethod::Balanced, dense, rows),
                   records - (rows * 8.0 - 8 * (rows / 8.0)) * 7 / 8);
  EXPECT_LT(t(SparseMethod::Dense, dense, rows), t(SparseMethod::AllGather, dense, rows));
}

TEST(Sparse, BadInputNamesTheField) {
  SparseRows s{10, 2, {3, 3}, {1, 2, 3, 4}};
  try {
    s.validate();
    FAIL();
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "indices");
  }
  s.indices = {3};
  EXPECT_THROW(s.validate(), ValidationError);  // 4 values for 1 row of 2
  EXPECT_THROW(parse_sparse_method("zen"), ParseError);
  EXPECT_EQ(parse_sparse_method("balanced"), SparseMethod::Balanced);
  const std::vector<float> dense{0, 0, 1, 0, 0, 0, 0, 2};
  const SparseRows f = SparseRows::from_dense(dense, 4, 2);
  EXPECT_EQ(f.indices, (std::vector<std::int64_t>{1, 3}));
  EXPECT_EQ(f.values, (std::vector<float>{1, 0, 0, 2}));
}

// Members whose tables differ in rows or width are refused naming the field, by every method:
// a member of the smaller table placed another's rows past the end of its output. (Both refuse
// once the sizes are agreed; here one's return may fail the other first, as a peer that returned
// does in this backend.)
TEST(Sparse, MembersWithTablesOfOtherSizesAreRefused) {
  for (SparseMethod method :
       {SparseMethod::Auto, SparseMethod::Dense, SparseMethod::AllGather, SparseMethod::Balanced})
    for (const bool by_width : {false, true}) {
      SCOPED_TRACE(to_string(method) + (by_width ? " width" : " rows"));
      std::mutex m;
      std::vector<std::string> fields;
      LocalWorld w(2);
      EXPECT_ANY_THROW(w.run([&](Communicator& comm) {
        const bool small = comm.rank() == 1;
        const std::int64_t rows = small && !by_width ? 500 : 1000,
                           width = small && by_width ? 2 : 4;
        SparseRows mine{rows, width, {small ? 1 : 990}, std::vector<float>(width, 1.0f)};
        std::vector<float> backing(4000, 0.0f);
        std::span<float> out(backing.data(), static_cast<std::size_t>(rows * width));
        const auto untouched = [&] {
          for (std::size_t i = out.size(); i < backing.size(); ++i)
            ASSERT_EQ(backing[i], 0.0f) << "written past the output at " << i;
        };
        try {
          sparse_all_reduce(comm.world(), mine, out, method);
        } catch (const ValidationError& e) {
          untouched();
          std::lock_guard<std::mutex> lock(m);
          fields.push_back(e.field());
          throw;
        } catch (const CommError&) {
          untouched();
          throw;
        }
      }));
      ASSERT_FALSE(fields.empty());
      for (const std::string& f : fields) EXPECT_EQ(f, by_width ? "width" : "rows");
    }
}

// Members that pass other methods or options are refused alike, agreed before any row travels:
// another method waited for the timeout (its first collective was not the others'), another
// algorithm failed on a message's length. The group stays usable.
TEST(Sparse, MembersWithOtherMethodsOrOptionsAreRefusedAlike) {
  for (const bool by_method : {true, false}) {
    SCOPED_TRACE(by_method ? "method" : "options");
    std::mutex m;
    std::vector<std::string> fields;
    LocalWorld w(3);
    w.run([&](Communicator& comm) {
      const bool odd = comm.rank() == 2;
      CollectiveOptions o;
      if (!by_method && odd) o.algorithm = Algorithm::Ring;
      SparseRows mine{64, 2, {comm.rank()}, {1.0f, 2.0f}};
      std::vector<float> out(128);
      try {
        sparse_all_reduce(comm.world(), mine, out,
                          by_method && odd ? SparseMethod::Dense : SparseMethod::Auto, o);
        ADD_FAILURE() << "not refused";
      } catch (const ValidationError& e) {
        EXPECT_TRUE(e.agreed());
        std::lock_guard<std::mutex> lock(m);
        fields.push_back(e.field());
      }
      std::int64_t one = 1;
      all_reduce(comm.world(), &one, &one, 1, DType::i64, ReduceOp::Sum);
      EXPECT_EQ(one, 3);
    });
    EXPECT_EQ(fields, std::vector<std::string>(3, by_method ? "method" : "options"));
  }
}

// rows x width past 2^63 - 1 is refused, not wrapped to a small table.
TEST(Sparse, TablesPastInt64AreRefused) {
  const SparseRows huge{std::int64_t{1} << 62, 4, {5}, {1, 2, 3, 4}};
  EXPECT_THROW(huge.validate(), ValidationError);
  LocalWorld w(1);
  w.run([&](Communicator& comm) {
    EXPECT_THROW(sparse_all_reduce(comm.world(), huge, {}, SparseMethod::Dense), ValidationError);
  });
  const std::vector<float> none;
  EXPECT_THROW(SparseRows::from_dense(none, std::int64_t{1} << 62, 4), ValidationError);
}

}  // namespace
}  // namespace meshcast
