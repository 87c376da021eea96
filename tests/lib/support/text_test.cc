// The text parsers of lib/support/text.h: digits up to a bound (also bounds under 10), byte
// sizes with binary units, and the one-line errors naming their field; and the saturating
// conversion of an estimate (lib/support/saturated.h) the limit checks take.
#include "lib/support/text.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "lib/support/saturated.h"

namespace meshcast::detail {
namespace {

constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();

TEST(Saturated, EstimatesPastInt64AreTheLargestInt64) {
  EXPECT_EQ(saturated_int64(0), 0);
  EXPECT_EQ(saturated_int64(5.9), 5);
  EXPECT_EQ(saturated_int64(0x1p62), std::int64_t{1} << 62);
  EXPECT_EQ(saturated_int64(0x1p63), kMax);  // one past the largest int64
  EXPECT_EQ(saturated_int64(1e300), kMax);
  EXPECT_EQ(saturated_int64(std::numeric_limits<double>::infinity()), kMax);
  EXPECT_EQ(saturated_int64(std::numeric_limits<double>::quiet_NaN()), kMax);  // refused
  EXPECT_EQ(saturated_int64(-1e300), std::numeric_limits<std::int64_t>::min());
}

TEST(Text, ParseUintTakesDigitsUpToTheBound) {
  EXPECT_EQ(parse_uint("0", 0, "f", "n"), 0);
  EXPECT_EQ(parse_uint("007", 7, "f", "n"), 7);
  EXPECT_EQ(parse_uint("9223372036854775807", kMax, "f", "n"), kMax);
  EXPECT_THROW(parse_uint("8", 7, "f", "n"), ParseError);  // one digit above a bound under 10
  EXPECT_THROW(parse_uint("9223372036854775808", kMax, "f", "n"), ParseError);
  EXPECT_THROW(parse_uint("", kMax, "f", "n"), ParseError);
  EXPECT_THROW(parse_uint("-1", kMax, "f", "n"), ParseError);
  EXPECT_THROW(parse_uint("1 ", kMax, "f", "n"), ParseError);
  try {
    parse_uint("12x", kMax, "field", "extent");
    FAIL();
  } catch (const ParseError& e) {
    EXPECT_EQ(e.field(), "field");
    EXPECT_NE(e.cause().find("expected digits"), std::string::npos) << e.cause();
  }
  try {
    parse_uint("100", 99, "field", "extent");
    FAIL();
  } catch (const ParseError& e) {
    EXPECT_NE(e.cause().find("too large (max 99)"), std::string::npos) << e.cause();
  }
}

TEST(Text, ParseBytesTakesBinaryUnitsUpToTheBound) {
  EXPECT_EQ(parse_bytes("0", kMax, "f"), 0);
  EXPECT_EQ(parse_bytes("64K", kMax, "f"), 65536);
  EXPECT_EQ(parse_bytes("3M", kMax, "f"), std::int64_t{3} << 20);
  EXPECT_EQ(parse_bytes("2T", kMax, "f"), std::int64_t{2} << 40);
  EXPECT_EQ(parse_bytes("1K", 1024, "f"), 1024);
  EXPECT_THROW(parse_bytes("2K", 2047, "f"), ParseError);  // the bound in units is under 10
  EXPECT_THROW(parse_bytes("1K", 1023, "f"), ParseError);
  EXPECT_THROW(parse_bytes("8388608T", kMax, "f"), ParseError);  // 2^63 bytes
  EXPECT_EQ(parse_bytes("8388607T", kMax, "f"), std::int64_t{8388607} << 40);
  for (const char* bad : {"", "K", "1.5M", "-1", "1KB", "1k", " 1"})
    EXPECT_THROW(parse_bytes(bad, kMax, "f"), ParseError) << bad;
}

TEST(Text, SplitKeepsEveryPieceAndRejoinsToItsText) {
  using V = std::vector<std::string_view>;
  EXPECT_EQ(split("a,,b,", ','), (V{"a", "", "b", ""}));
  EXPECT_EQ(split("", ','), (V{""}));
  EXPECT_EQ(split("2x1x1x", 'x'), (V{"2", "1", "1", ""}));
  for (std::string_view text : {"a", ",", ",,x,", "dp=2,tp=2"}) {
    std::string joined;
    for (std::string_view piece : split(text, ',')) joined += std::string(piece) + ',';
    joined.pop_back();
    EXPECT_EQ(joined, text);
  }
}

}  // namespace
}  // namespace meshcast::detail
