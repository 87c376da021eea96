// Groups: what Communicator::group refuses, and that operations on groups never share tags.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <set>

#include "meshcast/error.h"
#include "meshcast/local.h"

namespace meshcast {
namespace {

std::string refusal(Communicator& comm, std::vector<int> devices) {
  try {
    comm.group(std::move(devices));
  } catch (const ValidationError& e) {
    return e.what();
  }
  return "accepted";
}

TEST(Group, RefusesBadDeviceLists) {
  LocalWorld world(1);
  world.run([](Communicator& comm) {
    EXPECT_EQ(refusal(comm, {}), "group: is empty");
    EXPECT_EQ(refusal(comm, {0, 0}), "group: device 0 appears twice");
    EXPECT_EQ(refusal(comm, {0, 1}), "group: device 1 is outside the world of 1");
    EXPECT_EQ(refusal(comm, {-1}), "group: device -1 is outside the world of 1");
    EXPECT_THROW(Group().reserve(1), ValidationError);
  });
}

// Runs of one group cycle through its window, and no two live groups' tags meet.
TEST(Group, TagsOfGroupsAndOperationsAreDistinct) {
  LocalWorld world(1);
  world.run([](Communicator& comm) {
    const Group a = comm.group({0}), b = comm.group({0});
    std::set<int> seen;
    for (const Group* g : {&comm.world(), &a, &b})
      for (int op = 0; op < 3; ++op) {
        const TagBlock t = g->reserve(10);
        for (std::size_t i = 0; i < 10; ++i) EXPECT_TRUE(seen.insert(t.tag(i)).second);
      }
    const std::uint32_t w = a.window();
    const TagBlock first = a.reserve(w), again = a.reserve(1);  // the window wrapped
    EXPECT_EQ(again.tag(0), first.tag(0));
    EXPECT_EQ(a.index_of(0), 0);
    EXPECT_EQ(comm.world().index_of(3), -1);
  });
}

// An operation that completes only when finished, and counts it.
struct Held : InFlight {
  bool finished = false;
  bool done() const override { return finished; }
  void finish() override { finished = true; }
  void poll() override {}
};

// A reservation finishes exactly the operations in flight whose tags it takes, as the window
// wraps: a run of ops in flight, then runs that wrap over them one by one; ops that completed
// on their own are passed by; an op that was never finished keeps its tags.
TEST(Group, AReservationFinishesOnlyTheOperationsWhoseTagsItTakes) {
  LocalWorld world(1);
  world.run([](Communicator& comm) {
    const Group g = comm.group({0});
    const std::uint32_t w = g.window();
    const std::uint32_t len = 7, n = w / len;  // n ops of 7 tags fill the window but w % 7
    std::vector<std::shared_ptr<Held>> ops;
    std::vector<TagBlock> blocks;
    for (std::uint32_t i = 0; i < n; ++i) {
      ops.push_back(std::make_shared<Held>());
      blocks.push_back(g.reserve(len, ops.back()));
    }
    for (const auto& op : ops) EXPECT_FALSE(op->finished);
    ops[1]->finished = true;  // completed on its own
    // The rest of the window, then 1 tag more: op 0's first tag.
    (void)g.reserve(w - n * len);
    EXPECT_FALSE(ops[0]->finished);
    EXPECT_EQ(g.reserve(1).tag(0), blocks[0].tag(0));
    EXPECT_TRUE(ops[0]->finished);
    EXPECT_FALSE(ops[2]->finished);
    // 6 + 7 + 1 tags more: op 0's rest, op 1's (done) and op 2's first; op 3 stays in flight.
    (void)g.reserve(6 + len + 1);
    EXPECT_TRUE(ops[2]->finished);
    EXPECT_FALSE(ops[3]->finished);
    // A whole window at once finishes every op still in flight.
    (void)g.reserve(w);
    for (const auto& op : ops) EXPECT_TRUE(op->finished);
  });
}

// An operation whose finish() starts another on the same group (a reservation inside a
// reservation): the outer run, whose tags come first, is still finished first when a later
// reservation takes them.
TEST(Group, AReservationInsideAFinishKeepsTheRunsInOrder) {
  LocalWorld world(1);
  world.run([](Communicator& comm) {
    const Group g = comm.group({0});
    const std::uint32_t w = g.window();
    struct Starts : Held {
      std::function<void()> then;
      void finish() override {
        finished = true;
        then();
      }
    };
    auto a = std::make_shared<Starts>();
    auto b = std::make_shared<Held>(), c = std::make_shared<Held>(), r = std::make_shared<Held>();
    a->then = [&] { (void)g.reserve(2, c); };
    (void)g.reserve(w / 2, a);
    (void)g.reserve(w - w / 2, b);
    (void)g.reserve(2, r);  // takes a's first tags: a finishes, and starts c after r
    EXPECT_TRUE(a->finished);
    EXPECT_FALSE(b->finished || c->finished || r->finished);
    (void)g.reserve(w - 4);  // the rest of the window: b's tags
    EXPECT_TRUE(b->finished);
    EXPECT_FALSE(r->finished || c->finished);
    (void)g.reserve(1);  // r's first tag
    EXPECT_TRUE(r->finished);
    EXPECT_FALSE(c->finished);
  });
}

// When the groups the transport's tags can keep apart are all alive, one more is refused; once
// one dies its window is free again.
TEST(Group, RefusesMoreLiveGroupsThanTheTagsHold) {
  LocalWorld world(1);
  world.run([](Communicator& comm) {
    std::vector<Group> alive;
    try {
      for (int i = 0; i < 1 << 16; ++i) alive.push_back(comm.group({0}));
      FAIL() << "no refusal";
    } catch (const ValidationError& e) {
      EXPECT_NE(std::string(e.what()).find("groups alive at once"), std::string::npos) << e.what();
    }
    EXPECT_GT(alive.size(), 1000u);
    alive.clear();
    EXPECT_NO_THROW(comm.group({0}));
  });
}

}  // namespace
}  // namespace meshcast
