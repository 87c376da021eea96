// Plan::validate (run by Plan::from_json): hand-edited plan documents that the executor would
// run wrongly (wrong elements, a hang on a self-send) are refused naming the field; every plan
// the planner makes passes and round-trips; the check is box arithmetic, bounded in work.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "meshcast/error.h"
#include "meshcast/limits.h"
#include "meshcast/multicast_tree.h"
#include "meshcast/plan.h"
#include "support/testing.h"

namespace meshcast {
namespace {

using nlohmann::json;

json plan_json(const char* src, const char* dst, Shape shape = {4, 6},
               Strategy strategy = Strategy::Auto) {
  PlanOptions opt;
  opt.strategy = strategy;
  return json::parse(plan(Layout::parse(shape, DType::f32, src),
                          Layout::parse(shape, DType::f32, dst), Topology::single_host(), opt)
                         .to_json());
}

json box(std::initializer_list<std::pair<std::int64_t, std::int64_t>> ranges) {
  json b = json::array();
  for (const auto& [lo, hi] : ranges) b.push_back({lo, hi});
  return b;
}

json multicast(int root, std::vector<int> peers, json b, int phase = 0, bool from_dst = false) {
  return {{"kind", "multicast"}, {"phase", phase}, {"box", std::move(b)},
          {"root", root},        {"peers", peers}, {"from_dst", from_dst}};
}

// The index of the first op matching `pred`.
template <class P>
std::size_t find_op(const json& j, P&& pred) {
  for (std::size_t i = 0; i < j["ops"].size(); ++i)
    if (pred(j["ops"][i])) return i;
  ADD_FAILURE() << "no such op in " << j.dump();
  return 0;
}

// `j` with the stats its edited ops give (f32, one host), counted here from the document: a
// saved plan's byte counts must be its ops'.
json restat(json j) {
  std::map<std::string, std::int64_t> sent, received;
  std::int64_t moved = 0, local = 0;
  for (const json& op : j["ops"]) {
    std::int64_t bytes = 4;
    for (const json& r : op["box"]) bytes *= r[1].get<std::int64_t>() - r[0].get<std::int64_t>();
    const auto peers = op["peers"].get<std::vector<int>>();
    const int root = op["root"];
    const auto hop = [&](int from, int to) {
      sent[std::to_string(from)] += bytes;
      received[std::to_string(to)] += bytes;
      moved += bytes;
    };
    if (op["kind"] == "copy") local += bytes;
    if (op["kind"] == "reduce")
      for (int c : peers) c == root ? void(local += bytes) : hop(c, root);
    if (op["kind"] == "multicast") {
      const auto n = static_cast<std::int64_t>(peers.size());
      for (std::int64_t k = 0; k < n; ++k) {
        const std::int64_t from = multicast_parent(k, n, op.value("group", 0), op.value("fork", 0));
        hop(from < 0 ? root : peers[static_cast<std::size_t>(from)],
            peers[static_cast<std::size_t>(k)]);
      }
    }
  }
  json& st = j["stats"];
  st["bytes_moved"] = st["bytes_intra_host"] = moved;
  st["bytes_network"] = 0;
  st["bytes_local"] = local;
  st["sent"] = sent;
  st["received"] = received;
  return j;
}

// Loading `j` throws ValidationError with this field and a message containing `cause`, in one
// line; returns the message.
std::string refused(const json& j, const std::string& field, const std::string& cause) {
  try {
    (void)Plan::from_json(j.dump());
    ADD_FAILURE() << "accepted: " << j.dump().substr(0, 400);
  } catch (const ValidationError& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.field(), field) << what;
    EXPECT_NE(what.find(cause), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    EXPECT_LT(what.size(), 400u) << what;
    return what;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a ValidationError: " << e.what();
  }
  return "";
}

// 2x2@0-3:S0R -> 3@4-6:RS0 of a 4x6 tensor: six multicasts of one receiver each. Devices 0 and 1
// hold rows 0:2, devices 2 and 3 rows 2:4; device 4 needs columns 0:2, 5 2:4, 6 4:6.
json base() { return plan_json("2x2@0-3:S0R", "3@4-6:RS0"); }

TEST(PlanValidate, PlannerPlanLoads) {
  const json j = base();
  ASSERT_EQ(j["ops"].size(), 6u);
  EXPECT_NO_THROW((void)Plan::from_json(j.dump()));
}

TEST(PlanValidate, MalformedBoxesAreRefused) {
  json j = base();
  j["ops"][0]["box"][0] = {2, 0};  // reversed
  refused(j, "plan.ops[0].box", "empty in dimension 0");
  j = base();
  j["ops"][3]["box"][1] = {1, 1};  // empty
  refused(j, "plan.ops[3].box", "empty in dimension 1");
  j = base();
  j["ops"][0]["box"][0] = {0, 5};  // past the tensor
  refused(j, "plan.ops[0].box", "outside the tensor");
  j = base();
  j["ops"][0]["box"][1] = {-2, 2};
  refused(j, "plan.ops[0].box", "outside the tensor");
}

TEST(PlanValidate, MissingOpsLeaveElementsUnwritten) {
  json j = base();
  const int receiver = j["ops"][2]["peers"][0];
  j["ops"].erase(2);
  const std::string what = refused(j, "plan.ops", "are never written");
  EXPECT_NE(what.find("device " + std::to_string(receiver)), std::string::npos) << what;
  j["ops"] = json::array();
  refused(j, "plan.ops", "are never written");
}

TEST(PlanValidate, PeersMustBeDistinctReceiversOtherThanTheRoot) {
  json j = base();
  j["ops"][0]["peers"] = json::array();
  refused(j, "plan.ops[0].peers", "at least one receiver");
  j = base();
  const int r = j["ops"][1]["peers"][0];
  j["ops"][1]["peers"] = {r, r};
  refused(j, "plan.ops[1].peers", "device " + std::to_string(r) + " appears twice");
  j = base();
  j["ops"][1]["peers"] = json::array({j["ops"][1]["root"]});  // a self-send hangs the executor
  refused(j, "plan.ops[1].peers", "does not send to itself");
}

// A tree of chains: groups of at least 2 and at least two groups, on multicasts only; absent
// (0) is one chain, and a tree round-trips.
TEST(PlanValidate, TreeGroupsAreWithinTheReceivers) {
  json j = plan_json("1@0:RR", "6@1-6:RR", {4, 6}, Strategy::Broadcast);
  ASSERT_EQ(j["ops"].size(), 1u);
  j["ops"][0]["group"] = 2;
  const Plan p = Plan::from_json(restat(j).dump());
  EXPECT_EQ(p.ops()[0].group, 2);
  EXPECT_TRUE(Plan::from_json(p.to_json()) == p);
  EXPECT_NE(p.str().find("as 3 chains of <= 2"), std::string::npos) << p.str();
  for (int bad : {-1, 1, 6, 7}) {
    j["ops"][0]["group"] = bad;
    refused(j, "plan.ops[0].group", "must be 0 (one chain) or in [2, 6)");
  }
  j = base();
  j["ops"][0]["group"] = 2;
  refused(j, "plan.ops[0].group", "must be 0");  // one receiver: no tree
  j = plan_json("2@0-1:RR+P0", "1@2:RR");
  const std::size_t r = find_op(j, [](const json& o) { return o["kind"] == "reduce"; });
  j["ops"][r]["group"] = 2;
  refused(j, "plan.ops[" + std::to_string(r) + "].group", "on a reduce: only multicasts have one");
}

// An op's text lists at most 16 peers, then their count: a reduce of 1,024 addends was one
// line of kilobytes per op (a multicast's receivers were already cut so).
TEST(PlanText, AnOpListsAtMost16Peers) {
  const Plan reduce =
      plan(Layout::parse({4}, DType::f32, "40:R+P0", "src"),
           Layout::parse({4}, DType::f32, "1@40:R", "dst"), Topology::single_host());
  const std::string text = reduce.str();
  EXPECT_NE(text.find(" 0+1+2+3+4+5+6+7+8+9+10+11+12+13+14+15+... (40 addends) -> 40\n"),
            std::string::npos)
      << text;
  const Plan multicast =
      plan(Layout::parse({4}, DType::f32, "1@0:R", "src"),
           Layout::parse({4}, DType::f32, "40@1-40:R", "dst"), Topology::single_host());
  EXPECT_NE(multicast.str().find(",16,... (40 receivers)"), std::string::npos) << multicast.str();
}

// A fork leaves receivers on both sides of it, on multicasts only; groups then cut the receivers
// after it; a forked tree round-trips and is named in the plan's text.
TEST(PlanValidate, ForksLeaveReceiversOnBothSides) {
  json j = plan_json("1@0:RR", "6@1-6:RR", {4, 6}, Strategy::Broadcast);
  ASSERT_EQ(j["ops"].size(), 1u);
  j["ops"][0]["fork"] = 1;
  j["ops"][0]["group"] = 2;
  const Plan p = Plan::from_json(restat(j).dump());
  EXPECT_EQ(p.ops()[0].fork, 1);
  EXPECT_TRUE(Plan::from_json(p.to_json()) == p);
  EXPECT_NE(p.str().find("forked after 1 as 4 chains of <= 2"), std::string::npos) << p.str();
  for (int bad : {-1, 6, 7}) {
    j["ops"][0]["fork"] = bad;
    refused(j, "plan.ops[0].fork",
            "fork " + std::to_string(bad) + " must be 0 (no split) or in [1, 6) (its receivers)");
  }
  j["ops"][0]["fork"] = 3;
  j["ops"][0]["group"] = 3;  // 3 receivers after the fork: groups of 3 are one chain
  refused(j, "plan.ops[0].group",
          "must be 0 (one chain) or in [2, 3) (its receivers after the fork)");
  j = plan_json("2@0-1:RR+P0", "1@2:RR");
  const std::size_t r = find_op(j, [](const json& o) { return o["kind"] == "reduce"; });
  j["ops"][r]["fork"] = 1;
  refused(j, "plan.ops[" + std::to_string(r) + "].fork",
          "fork 1 on a reduce: only multicasts have one");
}

TEST(PlanValidate, SendersHoldTheBoxAndReceiversNeedIt) {
  json j = base();
  // Rows 0:2 are on devices 0 and 1 only.
  const std::size_t k = find_op(j, [](const json& o) { return o["box"][0][0] == 0; });
  ASSERT_LT(j["ops"][k]["root"], 2);
  j["ops"][k]["root"] = 2;
  refused(j, "plan.ops[" + std::to_string(k) + "].root", "device 2 does not hold");
  j = base();
  j["ops"][k]["root"] = 9;
  refused(j, "plan.ops[" + std::to_string(k) + "].root", "device 9 is not in the source mesh");
  // Columns 0:2 are needed by device 4 only.
  j = base();
  const std::size_t c =
      find_op(j, [](const json& o) { return o["box"][0][0] == 0 && o["box"][1][0] == 0; });
  j["ops"][c]["peers"] = json::array({5});
  refused(j, "plan.ops[" + std::to_string(c) + "].peers[0]",
          "device 5 does not hold [0:2,0:2] in the target layout");
  j["ops"][c]["peers"] = json::array({3});
  refused(j, "plan.ops[" + std::to_string(c) + "].peers[0]", "not in the target mesh");
}

// Two boxes written on one device that overlap, or leave a gap.
TEST(PlanValidate, OverlappingBoxesAreRefused) {
  json j = base();
  j["ops"].push_back(j["ops"][4]);  // an op twice
  refused(j, "plan.ops[6]", "which plan.ops[4] also writes");
  // A replicated source on 0 and 1 and one target device: the two holders split the work.
  j = plan_json("2@0-1:RR", "1@2:RR");
  j.erase("streams");  // hand-written ops: numbered in order
  j["ops"] = {multicast(0, {2}, box({{0, 4}, {0, 4}})), multicast(1, {2}, box({{0, 4}, {4, 6}}))};
  EXPECT_NO_THROW((void)Plan::from_json(restat(j).dump()));
  j["ops"][1]["box"] = box({{0, 4}, {3, 6}});
  refused(j, "plan.ops[1]", "writes [0:4,3:4] of device 2, which plan.ops[0] also writes");
  j["ops"][1]["box"] = box({{0, 4}, {5, 6}});
  refused(j, "plan.ops", "4 of the 24 elements of device 2's target tile [0:4,0:6]");
}

TEST(PlanValidate, PhasesAreInOrderAndForwardedDataArrivedEarlier) {
  json j = base();
  j["ops"][0]["phase"] = 1;
  refused(j, "plan.ops[0].phase", "skips phase 0");
  j = base();
  j["ops"][5]["phase"] = -1;
  refused(j, "plan.ops[5].phase", "negative phase");
  // All-gather: device 0 sends slice j to receiver j (phase 0), which forwards it (phase 1).
  for (const char* dst : {"3@1-3:RR", "24@1-24:RR"}) {  // pairwise, and a grid per device
    SCOPED_TRACE(dst);
    j = plan_json("1@0:RR", dst, {48, 6}, Strategy::AllGather);
    ASSERT_NO_THROW((void)Plan::from_json(j.dump()));
    const std::size_t last = j["ops"].size() - 1;
    j["ops"][last]["phase"] = 0;
    refused(j, "plan.ops[" + std::to_string(last) + "].phase", "after an op of phase 1");
    j = plan_json("1@0:RR", dst, {48, 6}, Strategy::AllGather);
    // The first slice arrives in the phase its receiver forwards it: too late.
    const std::size_t first = find_op(j, [](const json& o) { return o["phase"] == 0; });
    const int receiver = j["ops"][first]["peers"][0];
    json late = j["ops"][first];
    late["phase"] = 1;
    j["ops"].erase(first);
    j["ops"].push_back(late);
    const std::size_t fwd =
        find_op(j, [&](const json& o) { return o["from_dst"] == true && o["root"] == receiver; });
    refused(j, "plan.ops[" + std::to_string(fwd) + "].from_dst", "before all of it is written");
  }
}

TEST(PlanValidate, PartialSumsAreReducedInAddendOrder) {
  // 2x2@0-3:RR+P1: addend 0 on devices 0 and 2, addend 1 on 1 and 3; two reduces, at 4 and 5.
  json j = plan_json("2x2@0-3:RR+P1", "2@4-5:S0R");
  const std::size_t r = find_op(j, [](const json& o) { return o["kind"] == "reduce"; });
  ASSERT_EQ(j["ops"][r]["peers"].size(), 2u);
  json bad = j;
  std::swap(bad["ops"][r]["peers"][0], bad["ops"][r]["peers"][1]);
  refused(bad, "plan.ops[" + std::to_string(r) + "].peers[0]", "not 0");
  bad = j;
  bad["ops"][r]["peers"].erase(1);
  refused(bad, "plan.ops[" + std::to_string(r) + "].peers", "1 contributors for the source's 2");
  // An addend sent as if it were the value.
  bad = j;
  bad["ops"][r] = multicast(j["ops"][r]["peers"][0].get<int>(), {j["ops"][r]["root"].get<int>()},
                            j["ops"][r]["box"]);
  bad["ops"][r]["stream"] = j["ops"][r]["stream"];
  refused(bad, "plan.ops[" + std::to_string(r) + "].from_dst", "pending sum");
  // Partial target: addend 1 is zero-filled, not sent the value; addend 0 is not zero-filled.
  j = plan_json("4@0-3:S0R", "2x2@4-7:RS0+P1");
  const std::size_t z = find_op(j, [](const json& o) { return o["kind"] == "zero"; });
  const std::size_t m = find_op(j, [](const json& o) { return o["kind"] == "multicast"; });
  bad = j;
  bad["ops"][z]["root"] = j["ops"][m]["peers"][0];
  bad["ops"][z]["box"] = j["ops"][m]["box"];
  refused(bad, "plan.ops[" + std::to_string(z) + "].root", "needs the value, not zeros");
  bad = j;
  const int need_value = j["ops"][m]["peers"][0];  // 4 or 6; addend 1 of its columns: 5 or 7
  bad["ops"][m]["peers"] = json::array({need_value + 1});
  refused(bad, "plan.ops[" + std::to_string(m) + "].peers[0]",
          "device " + std::to_string(need_value + 1) + " holds addend 1 of the partial target");
}

TEST(PlanValidate, DocumentLevelChecks) {
  json j = base();
  j["strategy"] = "auto";
  refused(j, "plan.strategy", "never auto");
  j = base();
  j["dst"]["dtype"] = "f64";
  refused(j, "plan.dst.dtype", "differs");
  j = base();
  j["stats"]["bytes_moved"] = -1;
  refused(j, "plan.stats.bytes_moved", ">= 0");
  // A malformed document whose parser quotes a long token: still one bounded line.
  try {
    (void)Plan::from_json("{\"src\": \"" + std::string(100000, 'x') + "\x01\"}");
    ADD_FAILURE() << "accepted";
  } catch (const ParseError& e) {
    EXPECT_LT(std::string(e.what()).size(), 400u);
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
  }
  // A key twice in one object: which one would count?
  std::string text = base().dump();
  text.insert(1, "\"strategy\":\"sendrecv\",");
  try {
    (void)Plan::from_json(text);
    ADD_FAILURE() << "a duplicate key accepted";
  } catch (const ParseError& e) {
    EXPECT_NE(std::string(e.what()).find("appears twice"), std::string::npos) << e.what();
  }
}

// Validation is box arithmetic: a 2^40-element tensor checks as fast as a small one.
TEST(PlanValidate, HugeTensorsAreCheckedByBoxArithmetic) {
  const Shape shape{std::int64_t{1} << 20, std::int64_t{1} << 20};
  for (Strategy st : {Strategy::Broadcast, Strategy::AllGather}) {
    PlanOptions opt;
    opt.strategy = st;
    const Plan p =
        plan(Layout::parse(shape, DType::i8, "8@0-7:S0R"),
             Layout::parse(shape, DType::i8, "2x4@8-15:RS1"), Topology::single_host(), opt);
    EXPECT_NO_THROW(p.validate());
    json j = json::parse(p.to_json());
    j["ops"].erase(j["ops"].size() - 1);
    refused(j, "plan.ops", "are never written");
  }
}

// Streams: each op's below the plan's streams; the transfers' pairwise distinct (they would
// share tags), copies' and zero-fills' free to repeat.
TEST(PlanValidate, StreamsAreInRangeAndDistinctForTransfers) {
  json j = base();
  const std::string n = j["streams"].dump();
  j["ops"][3]["stream"] = j["streams"];
  refused(j, "plan.ops[3].stream", "stream " + n + " is outside the plan's " + n + " streams");
  j["ops"][3]["stream"] = -1;
  refused(j, "plan.ops[3].stream", "stream -1 is outside");
  j = base();
  j["ops"][4]["stream"] = j["ops"][1]["stream"];
  refused(j, "plan.ops[4].stream",
          "stream " + j["ops"][1]["stream"].dump() + " is also plan.ops[1]'s");
  j = base();
  j["streams"] = 1000;  // sparse numbering is fine
  for (std::size_t i = 0; i < j["ops"].size(); ++i) j["ops"][i]["stream"] = 999 - 7 * i;
  EXPECT_NO_THROW((void)Plan::from_json(j.dump()));
  // A local copy may share a transfer's stream.
  j = plan_json("1@0:RR", "2@0-1:S0R");
  const std::size_t c = find_op(j, [](const json& o) { return o["kind"] == "copy"; });
  const std::size_t m = find_op(j, [](const json& o) { return o["kind"] == "multicast"; });
  j["ops"][c]["stream"] = j["ops"][m]["stream"];
  EXPECT_NO_THROW((void)Plan::from_json(j.dump()));
  // Reduces are transfers.
  j = plan_json("2x2@0-3:RR+P1", "2@4-5:S0R");
  ASSERT_EQ(j["ops"].size(), 2u);
  ASSERT_EQ(j["ops"][1]["kind"], "reduce");
  j["ops"][1]["stream"] = j["ops"][0]["stream"];
  refused(j, "plan.ops[1].stream", "the transfers of a plan have distinct streams");
  // A plan built in code renumbers when told to (streams < 0), else keeps the ops' streams.
  const Plan p = Plan::from_json(base().dump());
  std::vector<Op> ops = p.ops();
  ops[0].stream = ops[1].stream;
  const Plan kept(p.src(), p.dst(), p.strategy(), p.balance(), p.topology(), ops, p.stats(),
                  p.streams());
  try {
    kept.validate();
    ADD_FAILURE() << "accepted";
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "plan.ops[1].stream") << e.what();
  }
  const Plan renumbered(p.src(), p.dst(), p.strategy(), p.balance(), p.topology(), ops, p.stats());
  EXPECT_NO_THROW(renumbered.validate());
}

// A valid partition whose grid is large and whose boxes a sweep compares pairwise: the
// staircase of L-shapes of a k x k tile. Accepted while the work is bounded; refused beyond.
std::vector<Op> staircase(std::int64_t k) {
  std::vector<Op> ops;
  for (std::int64_t i = 0; i < k; ++i) {
    ops.push_back({OpKind::Multicast, 0, Box({{i, i + 1}, {i, k}}), 0, {1}, false});
    if (i + 1 < k)
      ops.push_back({OpKind::Multicast, 0, Box({{i + 1, k}, {i, i + 1}}), 0, {1}, false});
  }
  return ops;
}

json with_ops(json j, const std::vector<Op>& ops) {
  j.erase("streams");  // numbered in order
  j["ops"] = json::array();
  for (const Op& op : ops) {
    json b = json::array();
    for (const Range& r : op.box.ranges()) b.push_back({r.lo, r.hi});
    j["ops"].push_back(multicast(op.root, op.peers, b));
  }
  return j;
}

TEST(PlanValidate, WorkIsBounded) {
  const json j = plan_json("1@0:RR", "1@1:RR", {300, 300});
  EXPECT_NO_THROW((void)Plan::from_json(with_ops(j, staircase(300)).dump()));
  auto ops = staircase(300);
  ops[6].box = Box({{3, 4}, {3, 299}});  // a gap at (3, 299)
  refused(with_ops(j, ops), "plan.ops", "1 of the 90000 elements");
  ops = staircase(300);
  ops.push_back(ops[100]);
  refused(with_ops(j, ops), "plan.ops[" + std::to_string(ops.size() - 1) + "]",
          "which plan.ops[100] also writes");
  // 12,000 boxes: a grid of 3.6e7 cells, 3.6e7 pairs to compare; the checker gives up within
  // its bound (2^24 + 64 per box) instead.
  const Shape shape{6000, 6000};
  const Plan big(Layout::parse(shape, DType::f32, "1@0:RR"),
                 Layout::parse(shape, DType::f32, "1@1:RR"), Strategy::Broadcast, Balance::None,
                 "single-host", staircase(6000), {});
  try {
    big.validate();
    ADD_FAILURE() << "accepted";
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "plan.ops");
    EXPECT_NE(std::string(e.what()).find("too fragmented to verify"), std::string::npos)
        << e.what();
  }
}

// Property: every plan the planner makes validates and round-trips through JSON.
TEST(PlanValidate, EveryPlannerPlanValidatesAndRoundTrips) {
  testing::Rng rng(0x5a11);
  testing::Limits lim;
  lim.max_volume = 200;
  const Topology topos[] = {Topology::single_host(),
                            Topology::uniform("four", 4, 4, LinkClass{"intra", 100e9, 1e-6},
                                              LinkClass{"network", 1.25e9, 1e-5})};
  for (int i = 0; i < testing::scaled(600); ++i) {
    const auto c = testing::random_case(rng, lim);
    PlanOptions opt;
    opt.strategy = static_cast<Strategy>(rng.below(4));
    opt.balance = static_cast<Balance>(rng.below(3));
    opt.search_moves = 200;
    opt.search_seconds = 1e9;
    const Plan p = plan(c.src, c.dst, topos[i % 2], opt);
    SCOPED_TRACE(c.str() + " strategy " + to_string(opt.strategy));
    ASSERT_NO_THROW(p.validate()) << p.str(64);
    const Plan back = Plan::from_json(p.to_json());
    ASSERT_TRUE(back == p) << p.to_json();
  }
}

// plan_ops bounds the document before anything proportional to it: checked in a child process
// of this test binary with MESHCAST_MAX_PLAN_OPS=3 (limits() reads the environment once).
TEST(PlanValidate, MoreOpsThanTheLimitAreRefused) {
  if (const char* v = std::getenv("MESHCAST_MAX_PLAN_OPS"); v && std::string(v) == "3") {
    ASSERT_EQ(limits().plan_ops, 3);
    // Written by hand: plan() itself respects the limit.
    json j = {{"src", {{"shape", {4, 6}}, {"dtype", "f32"}, {"layout", "2@0-1:RR"}}},
              {"dst", {{"shape", {4, 6}}, {"dtype", "f32"}, {"layout", "1@2:RR"}}},
              {"strategy", "broadcast"},
              {"balance", "none"},
              {"topology", "single-host"},
              {"stats",
               {{"bytes_moved", 96},
                {"bytes_local", 0},
                {"bytes_intra_host", 96},
                {"bytes_network", 0},
                {"sent", {{"0", 96}}},
                {"received", {{"2", 96}}},
                {"predicted_seconds", 0.001},
                {"search_truncated", false}}},
              {"ops", json::array()}};
    for (int r = 0; r < 4; ++r) j["ops"].push_back(multicast(0, {2}, box({{r, r + 1}, {0, 6}})));
    const std::string what = refused(j, "plan.ops", "4 exceeds the limit of 3");
    EXPECT_NE(what.find("MESHCAST_MAX_PLAN_OPS"), std::string::npos) << what;
    j["ops"].erase(3);
    j["ops"][2]["box"] = box({{2, 4}, {0, 6}});
    EXPECT_NO_THROW((void)Plan::from_json(j.dump()));
    return;
  }
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  ASSERT_GT(n, 0);
  const std::string cmd = "MESHCAST_MAX_PLAN_OPS=3 '" + std::string(self) +
                          "' --gtest_filter=PlanValidate.MoreOpsThanTheLimitAreRefused "
                          ">/dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

}  // namespace
}  // namespace meshcast
