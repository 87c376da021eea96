// Communicator::agree on the in-process backend: every member returns, or every member throws the
// same error (its type, kind, field, cause and device), the failure of the member first in group
// order; on the world of a thousand devices and on a sub-group; a member that died is reported by
// every survivor.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "meshcast/local.h"

namespace meshcast {
namespace {

// What agree() did on one device: "" when it returned, else the error's type and its parts.
struct Outcome {
  std::string type;
  ErrorKind kind = ErrorKind::Internal;
  std::string field, cause;
  int device = -1;
  friend bool operator==(const Outcome&, const Outcome&) = default;
};

std::string type_of(const Error& e) {
  if (dynamic_cast<const ParseError*>(&e)) return "ParseError";
  if (dynamic_cast<const ValidationError*>(&e)) return "ValidationError";
  if (dynamic_cast<const IoError*>(&e)) return "IoError";
  if (dynamic_cast<const CommError*>(&e)) return "CommError";
  if (dynamic_cast<const InternalError*>(&e)) return "InternalError";
  return "Error";
}

Outcome outcome_of(const Error& e) {
  return {type_of(e), e.kind(), e.field(), e.cause(), e.device()};
}

// Runs agree() on `size` devices over the group `members` (the world when empty), each passing
// the error `errors` holds for it (none when absent); returns each member's outcome.
std::map<int, Outcome> agree_on(int size, const std::vector<int>& members,
                                const std::map<int, std::shared_ptr<Error>>& errors,
                                int rounds = 1) {
  std::map<int, Outcome> out;
  std::mutex mu;
  LocalWorld world(size);
  world.run([&](Communicator& comm) {
    const Group group = members.empty() ? comm.world() : comm.group(members);
    if (!group.contains(comm.rank())) return;
    const auto it = errors.find(comm.rank());
    Outcome o;
    for (int r = 0; r < rounds; ++r) {
      try {
        comm.agree(group, it == errors.end() ? nullptr : it->second.get());
        o = {};
      } catch (const Error& e) {
        EXPECT_TRUE(e.agreed()) << e.what();  // the communicator stays usable
        o = outcome_of(e);
      }
    }
    std::lock_guard lock(mu);
    out[comm.rank()] = o;
  });
  return out;
}

void expect_all(const std::map<int, Outcome>& got, std::size_t members, const Outcome& want) {
  EXPECT_EQ(got.size(), members);
  for (const auto& [device, o] : got) {
    EXPECT_EQ(o, want) << "device " << device << ": " << o.type << " " << o.field << ": "
                       << o.cause;
  }
}

TEST(Agree, AThousandMembersReturnWhenNoneFailed) {
  expect_all(agree_on(1000, {}, {}, 3), 1000, Outcome{});
}

TEST(Agree, OneFailureReachesEveryMember) {
  const auto e = std::make_shared<IoError>("checkpoint", "device-7.bin: No such file or directory");
  expect_all(agree_on(1000, {}, {{617, e}}, 2), 1000, outcome_of(*e));
}

TEST(Agree, TheFirstFailureInGroupOrderWins) {
  const std::map<int, std::shared_ptr<Error>> errors = {
      {40, std::make_shared<IoError>("file", "unreadable")},
      {9, std::make_shared<ValidationError>("shape", "negative")},
      {700, std::make_shared<ParseError>("config", "key 'x' appears twice")},
  };
  expect_all(agree_on(1000, {}, errors), 1000, outcome_of(*errors.at(9)));
}

// Group order, not device order: device 9 is ahead of device 0 in {5, 2, 9, 0}; the other devices
// of the world take no part.
TEST(Agree, OnASubGroupInItsOrder) {
  const std::map<int, std::shared_ptr<Error>> errors = {
      {0, std::make_shared<ValidationError>("a", "from device 0")},
      {9, std::make_shared<ValidationError>("b", "from device 9")},
      {7, std::make_shared<ValidationError>("c", "from device 7, not a member")},
  };
  expect_all(agree_on(12, {5, 2, 9, 0}, errors), 4, outcome_of(*errors.at(9)));
  expect_all(agree_on(12, {5, 2, 9, 0}, {{7, errors.at(7)}}), 4, Outcome{});
  // A group of one throws its own error.
  expect_all(agree_on(3, {1}, {{1, errors.at(0)}}), 1, outcome_of(*errors.at(0)));
}

TEST(Agree, KeepsTypeKindFieldCauseAndDevice) {
  const std::vector<std::shared_ptr<Error>> errors = {
      std::make_shared<ParseError>("config", "expected '}'"),
      std::make_shared<ValidationError>("src.mesh", "device 3 twice"),
      std::make_shared<IoError>("out", "cannot write /x: Permission denied"),
      std::make_shared<CommError>(4, "stopped answering"),
      std::make_shared<CommError>("bootstrap", "the job key differs"),
      std::make_shared<InternalError>("MPI_Isend", "MPI_ERR_TRUNCATE"),
      std::make_shared<Error>(ErrorKind::PeerFailure, "iters", "a plain error", 2),
  };
  for (const auto& e : errors) {
    SCOPED_TRACE(e->what());
    expect_all(agree_on(6, {}, {{3, e}}), 6, outcome_of(*e));
  }
}

TEST(Agree, CutsALongCauseAndFieldToABoundedRecord) {
  const auto e = std::make_shared<ValidationError>(std::string(500, 'f'),
                                                   "why: " + std::string(5000, 'x') + "\xc3\xa9");
  const auto got = agree_on(4, {}, {{2, e}});
  ASSERT_EQ(got.size(), 4u);
  const Outcome& o = got.begin()->second;
  expect_all(got, 4, o);
  EXPECT_EQ(o.type, "ValidationError");
  EXPECT_LE(o.cause.size(), 900u);
  EXPECT_LE(o.field.size(), 96u);
  EXPECT_EQ(o.cause.substr(0, 7), "why: xx");
  EXPECT_EQ(o.cause.substr(o.cause.size() - 3), "...");
}

// A member that throws instead of agreeing: every survivor throws CommError naming it.
TEST(Agree, AMemberThatDiedIsReportedByEverySurvivor) {
  std::map<int, Outcome> out;
  std::mutex mu;
  LocalWorld world(64);
  EXPECT_THROW(world.run([&](Communicator& comm) {
    if (comm.rank() == 17) throw std::runtime_error("died");
    Outcome o;
    try {
      comm.agree(comm.world(), nullptr);
    } catch (const Error& e) {
      o = outcome_of(e);
    }
    std::lock_guard lock(mu);
    out[comm.rank()] = o;
  }),
               std::runtime_error);
  ASSERT_EQ(out.size(), 63u);
  for (const auto& [device, o] : out) {
    EXPECT_EQ(o.type, "CommError") << "device " << device << ": " << o.cause;
    EXPECT_EQ(o.device, 17) << "device " << device << ": " << o.cause;
  }
}

}  // namespace
}  // namespace meshcast
