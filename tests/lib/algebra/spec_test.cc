// ShardingSpec: Alpa's notation round-trips, and malformed specs name their field.
#include "meshcast/spec.h"

#include <gtest/gtest.h>

#include "meshcast/error.h"
#include "support/testing.h"

namespace meshcast {
namespace {

using Dims = std::vector<std::vector<int>>;

TEST(Spec, RoundTrips) {
  struct Case {
    const char* text;
    Dims dims;
    std::vector<int> partial;
  };
  const Case cases[] = {
      {"S0R", {{0}, {}}, {}},
      {"RS1", {{}, {1}}, {}},
      {"S01R", {{0, 1}, {}}, {}},
      {"S10", {{1, 0}}, {}},
      {"S0R+P1", {{0}, {}}, {1}},
      {"RR+P01", {{}, {}}, {0, 1}},
      {"RR+P10", {{}, {}}, {1, 0}},
      {"R", {{}}, {}},
      {"S0S1", {{0}, {1}}, {}},
      {"RS2RS0R+P1", {{}, {2}, {}, {0}, {}}, {1}},
      {"S9876543210", {{9, 8, 7, 6, 5, 4, 3, 2, 1, 0}}, {}},
      {"", {}, {}},  // a 0-d tensor's
      {"+P1", {}, {1}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    const ShardingSpec s = ShardingSpec::parse(c.text);
    EXPECT_EQ(s.dims(), c.dims);
    EXPECT_EQ(s.partial(), c.partial);
    EXPECT_EQ(s.ndim(), c.dims.size());
    EXPECT_EQ(s.is_partial(), !c.partial.empty());
    EXPECT_EQ(s.str(), c.text);
    EXPECT_EQ(ShardingSpec::parse(s.str()), s);
    EXPECT_EQ(ShardingSpec(c.dims, c.partial), s);
    for (std::size_t d = 0; d < c.dims.size(); ++d) EXPECT_EQ(s.axes(d), c.dims[d]);
    std::ostringstream os;
    os << s;
    EXPECT_EQ(os.str(), c.text);
  }
}

TEST(Spec, RandomSpecsRoundTrip) {
  testing::Rng rng(0x5bec);
  for (int i = 0; i < testing::scaled(2000); ++i) {
    const auto s = testing::random_spec(rng, static_cast<std::size_t>(rng.between(1, 6)),
                                        static_cast<std::size_t>(rng.between(1, 10)), true);
    ASSERT_EQ(ShardingSpec::parse(s.str()), s) << s.str();
  }
}

TEST(Spec, BadSpecsNameTheFieldInOneLine) {
  for (const char* bad : {"Q0R", "S",        "S0S0",      "S0R+P0",  "S0R+", "S0R+Q1", "+Q1",
                          "+P",  "S0R+P",    "S0R+P1+P2", "S0R+P1R", "s0R",  "S0 R",   "RR+P11",
                          "S00", "S0R+P1S2", "S-1",       "R+",      "+",    "S0R\n",  "+P1R"}) {
    SCOPED_TRACE(std::string("spec '") + bad + "'");
    try {
      const ShardingSpec s = ShardingSpec::parse(bad, "src.spec");
      ADD_FAILURE() << "parsed as " << s.str();
    } catch (const ParseError& e) {
      EXPECT_EQ(e.field(), "src.spec");
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("src.spec: ", 0), 0u) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a ParseError: " << e.what();
    }
  }
}

}  // namespace
}  // namespace meshcast
