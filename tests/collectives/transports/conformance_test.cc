// The transport conformance suite (support/conformance_cases.h) on the local transport: every
// case at 1, 2, 3, 5 and 8 devices with node memory, and the failure cases. The same cases run
// on the process transports under tests/mpi/conformance.cc.
#include <gtest/gtest.h>
#include <meshcast/local.h>

#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "support/conformance_cases.h"

namespace meshcast {
namespace {

using conformance::Case;

class Conformance : public ::testing::TestWithParam<std::tuple<Case, int>> {};

TEST_P(Conformance, Local) {
  const auto& [c, n] = GetParam();
  LocalWorld world(n, std::size_t{64} << 10);
  world.run([&](Communicator& comm) { c.run(comm); });
}

INSTANTIATE_TEST_SUITE_P(Cases, Conformance,
                         ::testing::Combine(::testing::ValuesIn(conformance::cases()),
                                            ::testing::Values(1, 2, 3, 5, 8)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).name) + "_" +
                                  std::to_string(std::get<1>(info.param)) + "devices";
                         });

// A failure case on 4 devices, device 1 the victim: what run() threw, and each survivor's line
// (or its failure).
struct Outcome {
  std::string thrown;
  std::vector<std::string> survivors;
};
Outcome run_failure(LocalWorld& world, const std::function<std::string(Communicator&)>& run) {
  std::vector<std::string> lines(4);
  Outcome out;
  try {
    world.run([&](Communicator& comm) {
      const auto me = static_cast<std::size_t>(comm.rank());
      if (me == 1) {
        lines[me] = run(comm);
        return;
      }
      try {
        lines[me] = run(comm);
      } catch (const std::exception& e) {
        lines[me] = std::string("FAIL ") + e.what();
      }
    });
  } catch (const std::exception& e) {
    out.thrown = e.what();
  }
  for (std::size_t d : {0, 2, 3}) out.survivors.push_back(lines[d]);
  return out;
}

TEST(ConformanceFailure, ADeviceThatThrowsIsNamedBySurvivors) {
  LocalWorld world(4);
  const Outcome out = run_failure(
      world, [](Communicator& comm) { return conformance::device_throws(comm, 1, 10); });
  EXPECT_EQ(out.thrown, "injected failure");
  for (const auto& line : out.survivors) EXPECT_EQ(line.rfind("CommError after", 0), 0u) << line;
}

// A thread that returns without sending: the survivors' waits on it end at the world's timeout
// (1 s here), naming it.
TEST(ConformanceFailure, APeerThatLeftIsNamedBySurvivors) {
  LocalWorld world(4, 0, 1);
  const Outcome out = run_failure(
      world, [](Communicator& comm) { return conformance::device_exits(comm, 1, 5, [] {}); });
  for (const auto& line : out.survivors) EXPECT_EQ(line.rfind("CommError after", 0), 0u) << line;
}

TEST(ConformanceFailure, APeerThatStallsIsNamedBySurvivors) {
  LocalWorld world(4, 0, 1);
  const Outcome out = run_failure(
      world, [](Communicator& comm) { return conformance::device_stalls(comm, 1, 3, 4); });
  for (const auto& line : out.survivors) EXPECT_EQ(line.rfind("CommError after", 0), 0u) << line;
}

// Within 2 s of a 30 s timeout: the survivors learn of the abort from the transport at once.
TEST(ConformanceFailure, APeerThatGivesUpIsNamedBySurvivorsAtOnce) {
  LocalWorld world(4, 0, 30);
  const Outcome out = run_failure(
      world, [](Communicator& comm) { return conformance::device_abandons(comm, 1, 2, 4); });
  EXPECT_EQ(out.thrown, "");  // every survivor caught its CommError; the victim returned
  for (const auto& line : out.survivors) {
    EXPECT_EQ(line.rfind("CommError after", 0), 0u) << line;
    EXPECT_NE(line.find("device 1: gave up"), std::string::npos) << line;
  }
}

// Device 1 waits on device 0, and device 3 in a barrier, for three times the world's timeout
// (1 s) while device 0 exchanges messages with device 2: the world moves, so no wait fails.
TEST(ConformanceFailure, AWaitGoesOnWhileOtherDevicesProgress) {
  LocalWorld world(4, 0, 1);
  std::vector<std::string> did(4);
  world.run([&](Communicator& comm) {
    did[static_cast<std::size_t>(comm.rank())] = conformance::device_busy_elsewhere(comm, 3);
  });
  EXPECT_EQ(did[1].rfind("received from device 0 after", 0), 0u) << did[1];
  EXPECT_EQ(did[3], "waited in the barrier");
}

}  // namespace
}  // namespace meshcast
