// plan(): a symbolic simulation of every plan delivers every target element exactly once with
// the full sum; byte accounting, determinism, JSON round trip, the strategies' selection, and
// topology-aware expected tables.
#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <set>

#include "meshcast/error.h"
#include "meshcast/plan.h"
#include "support/testing.h"

namespace meshcast {
namespace {

using testing::Rng;

// ---- The simulator -----------------------------------------------------------------------------
// Each target element of each target device holds a symbolic value: the set of source addends
// summed into it (a bit mask), or "zero". Ops of one phase read the state left by earlier phases
// and write at the phase's end.

constexpr std::int64_t kUnwritten = -1;
constexpr std::int64_t kZero = -2;

struct Side {
  const Layout& l;
  std::map<int, std::int64_t> index;  // device id -> mesh index
  std::vector<Box> tile;
  explicit Side(const Layout& layout) : l(layout) {
    for (std::int64_t i = 0; i < l.mesh().size(); ++i) {
      index[l.mesh().devices()[static_cast<std::size_t>(i)]] = i;
      tile.push_back(testing::ref_tile(l, i));
    }
  }
  // The mesh index of `device` if its tile contains `box`, else -1.
  std::int64_t holding(int device, const Box& box) const {
    const auto it = index.find(device);
    if (it == index.end()) return -1;
    return tile[static_cast<std::size_t>(it->second)].contains(box) ? it->second : -1;
  }
};

// Returns "" when the plan is correct, else the first problem found.
std::string simulate(const Plan& p) {
  const Layout& src = p.src();
  const Layout& dst = p.dst();
  const Side s(src), d(dst);
  const Shape& shape = src.shape();
  const std::int64_t n = testing::ref_volume(shape);
  const std::int64_t groups = testing::ref_groups(src);
  const std::int64_t full = (std::int64_t{1} << groups) - 1;
  const bool dst_partial = !dst.spec().partial().empty();
  std::vector<std::vector<std::int64_t>> value(
      static_cast<std::size_t>(dst.mesh().size()),
      std::vector<std::int64_t>(static_cast<std::size_t>(n), kUnwritten));
  std::vector<std::vector<int>> writes(static_cast<std::size_t>(dst.mesh().size()),
                                       std::vector<int>(static_cast<std::size_t>(n), 0));
  struct Write {
    std::int64_t device, element, value;
  };
  std::vector<Write> pending;
  auto flush = [&] {
    for (const Write& w : pending) {
      value[static_cast<std::size_t>(w.device)][static_cast<std::size_t>(w.element)] = w.value;
      ++writes[static_cast<std::size_t>(w.device)][static_cast<std::size_t>(w.element)];
    }
    pending.clear();
  };
  const Box whole = Box::whole(shape);
  int phase = 0;
  for (std::size_t k = 0; k < p.ops().size(); ++k) {
    const Op& op = p.ops()[k];
    const std::string where = "op " + std::to_string(k) + " (" + to_string(op.kind) + " " +
                              op.box.str() + " root " + std::to_string(op.root) + " phase " +
                              std::to_string(op.phase) + ")";
    if (op.phase < phase) return where + ": ops are not in phase order";
    if (op.phase > phase) {
      flush();
      phase = op.phase;
    }
    if (op.box.ndim() != shape.size() || !whole.contains(op.box))
      return where + ": box outside the tensor";
    if (op.box.empty()) return where + ": empty op";
    auto write_all = [&](std::int64_t dev, auto&& val) {
      testing::ref_for_each(shape, op.box, [&](const auto&, std::int64_t e) {
        pending.push_back({dev, e, val(e)});
      });
    };
    switch (op.kind) {
      case OpKind::Copy: {
        const auto si = s.holding(op.root, op.box), di = d.holding(op.root, op.box);
        if (si < 0 || di < 0) return where + ": root does not hold the box in both layouts";
        const std::int64_t v = std::int64_t{1} << testing::ref_addend(src, si);
        write_all(di, [&](std::int64_t) { return v; });
        break;
      }
      case OpKind::Zero: {
        const auto di = d.holding(op.root, op.box);
        if (di < 0) return where + ": root's target tile does not contain the box";
        write_all(di, [&](std::int64_t) { return kZero; });
        break;
      }
      case OpKind::Multicast: {
        if (op.peers.empty()) return where + ": no receivers";
        std::set<int> seen(op.peers.begin(), op.peers.end());
        if (seen.size() != op.peers.size() || seen.count(op.root))
          return where + ": receivers repeat or include the root";
        std::vector<std::int64_t> v(static_cast<std::size_t>(n), kUnwritten);
        if (op.from_dst) {
          const auto ri = d.holding(op.root, op.box);
          if (ri < 0) return where + ": root's target tile does not contain the box";
          bool filled = true;
          testing::ref_for_each(shape, op.box, [&](const auto&, std::int64_t e) {
            v[static_cast<std::size_t>(e)] =
                value[static_cast<std::size_t>(ri)][static_cast<std::size_t>(e)];
            filled = filled && v[static_cast<std::size_t>(e)] != kUnwritten;
          });
          if (!filled) return where + ": root sends target data not filled in an earlier phase";
        } else {
          const auto ri = s.holding(op.root, op.box);
          if (ri < 0) return where + ": root's source tile does not contain the box";
          if (groups > 1) return where + ": multicast of one addend of a partial source";
          const std::int64_t a = std::int64_t{1} << testing::ref_addend(src, ri);
          testing::ref_for_each(shape, op.box, [&](const auto&, std::int64_t e) {
            v[static_cast<std::size_t>(e)] = a;
          });
        }
        // Along the chain or tree's edges: each receiver gets what its parent (the root or an
        // earlier receiver, which got all of it first) forwards.
        const auto peers = static_cast<std::int64_t>(op.peers.size());
        for (std::int64_t k = 0; k < peers; ++k) {
          const int r = op.peers[static_cast<std::size_t>(k)];
          const std::int64_t from = multicast_parent(k, peers, op.group, op.fork);
          if (from < -1 || from >= k)
            return where + ": receiver " + std::to_string(r) + " is fed by no earlier member";
          const auto di = d.holding(r, op.box);
          if (di < 0) return where + ": receiver " + std::to_string(r) + " does not need the box";
          write_all(di, [&](std::int64_t e) { return v[static_cast<std::size_t>(e)]; });
        }
        break;
      }
      case OpKind::Reduce: {
        const auto di = d.holding(op.root, op.box);
        if (di < 0) return where + ": root's target tile does not contain the box";
        if (static_cast<std::int64_t>(op.peers.size()) != groups)
          return where + ": " + std::to_string(op.peers.size()) + " contributors for " +
                 std::to_string(groups) + " addends";
        for (std::size_t g = 0; g < op.peers.size(); ++g) {
          const auto si = s.holding(op.peers[g], op.box);
          if (si < 0 || testing::ref_addend(src, si) != static_cast<std::int64_t>(g))
            return where + ": contributor " + std::to_string(op.peers[g]) +
                   " does not hold addend " + std::to_string(g);
        }
        write_all(di, [&](std::int64_t) { return full; });
        break;
      }
    }
  }
  flush();
  for (std::int64_t i = 0; i < dst.mesh().size(); ++i) {
    const bool zero = dst_partial && testing::ref_addend(dst, i) != 0;
    std::string bad;
    testing::ref_for_each(
        shape, d.tile[static_cast<std::size_t>(i)], [&](const auto&, std::int64_t e) {
          if (!bad.empty()) return;
          const int w = writes[static_cast<std::size_t>(i)][static_cast<std::size_t>(e)];
          const std::int64_t v = value[static_cast<std::size_t>(i)][static_cast<std::size_t>(e)];
          if (w != 1)
            bad = "element " + std::to_string(e) + " of device " +
                  std::to_string(dst.mesh().device(i)) + " written " + std::to_string(w) + " times";
          else if (v != (zero ? kZero : full))
            bad = "element " + std::to_string(e) + " of device " +
                  std::to_string(dst.mesh().device(i)) + " holds " +
                  (v == kZero ? std::string("zero") : "addends mask " + std::to_string(v));
        });
    if (!bad.empty()) return bad;
  }
  return "";
}

// Bytes a complete-source move must send: each needed element a target device does not hold.
std::int64_t min_bytes(const Layout& src, const Layout& dst) {
  const Side s(src), d(dst);
  const bool dst_partial = !dst.spec().partial().empty();
  std::int64_t bytes = 0;
  for (std::int64_t i = 0; i < dst.mesh().size(); ++i) {
    if (dst_partial && testing::ref_addend(dst, i) != 0) continue;
    const int dev = dst.mesh().device(i);
    const auto it = s.index.find(dev);
    testing::ref_for_each(dst.shape(), d.tile[static_cast<std::size_t>(i)],
                          [&](const auto& x, std::int64_t) {
                            if (it == s.index.end() ||
                                !testing::ref_has(s.tile[static_cast<std::size_t>(it->second)], x))
                              bytes += static_cast<std::int64_t>(dtype_size(dst.dtype()));
                          });
  }
  return bytes;
}

// The stats agree with the ops: hops of each multicast chain and reduce, local copies.
std::string check_stats(const Plan& p) {
  const auto& st = p.stats();
  const std::int64_t elem = static_cast<std::int64_t>(dtype_size(p.src().dtype()));
  std::int64_t moved = 0, local = 0;
  std::map<int, std::int64_t> sent, received;
  for (const Op& op : p.ops()) {
    const std::int64_t b = op.box.volume() * elem;
    if (op.kind == OpKind::Copy) local += b;
    if (op.kind == OpKind::Multicast) moved += b * static_cast<std::int64_t>(op.peers.size());
    if (op.kind == OpKind::Reduce)
      for (int c : op.peers) (c == op.root ? local : moved) += b;
  }
  std::int64_t sent_sum = 0, received_sum = 0;
  for (const auto& [dev, b] : st.sent) sent_sum += b;
  for (const auto& [dev, b] : st.received) received_sum += b;
  std::ostringstream os;
  if (st.bytes_moved != moved)
    os << "bytes_moved " << st.bytes_moved << " != ops' " << moved << "; ";
  if (st.bytes_local != local)
    os << "bytes_local " << st.bytes_local << " != ops' " << local << "; ";
  if (st.bytes_intra_host + st.bytes_network != st.bytes_moved) os << "intra + network != moved; ";
  if (sent_sum != st.bytes_moved || received_sum != st.bytes_moved)
    os << "per-device sums != moved; ";
  if (!(st.predicted_seconds >= 0)) os << "negative prediction; ";
  return os.str();
}

Topology four_hosts() {
  return Topology::uniform("four", 4, 4, LinkClass{"intra", 100e9, 1e-6},
                           LinkClass{"network", 1.25e9, 1e-5});
}

std::string describe(const testing::Case& c, Strategy st, Balance b, const Topology& t) {
  return c.str() + " strategy " + to_string(st) + " balance " + to_string(b) + " topology " +
         t.name();
}

TEST(Planner, EveryPlanDeliversEveryElementExactlyOnce) {
  Rng rng(0x91a7);
  testing::Limits lim;
  lim.max_volume = 64;
  lim.max_extent = 5;
  const Topology topos[] = {Topology::single_host(), four_hosts()};
  const Balance balances[] = {Balance::None, Balance::Greedy, Balance::Search};
  const int n = testing::scaled(10000);
  for (int i = 0; i < n; ++i) {
    const auto c = testing::random_case(rng, lim);
    const Topology& topo = topos[i % 2];
    PlanOptions opt;
    opt.balance = balances[(i / 2) % 3];
    opt.search_moves = rng.between(0, 300);
    opt.search_seconds = 1e9;  // deterministic: never cut short by the clock
    const bool complete = c.src.spec().partial().empty() || testing::ref_groups(c.src) == 1;
    const std::int64_t minimum = complete ? min_bytes(c.src, c.dst) : -1;
    std::map<Strategy, Plan> plans;
    for (Strategy st : {Strategy::Broadcast, Strategy::SendRecv, Strategy::AllGather}) {
      opt.strategy = st;
      const std::string ctx =
          "case " + std::to_string(i) + ": " + describe(c, st, opt.balance, topo);
      Plan p = plan(c.src, c.dst, topo, opt);
      ASSERT_EQ(p.strategy(), st) << ctx;
      ASSERT_EQ(p.balance(), opt.balance) << ctx;
      ASSERT_EQ(p.src(), c.src) << ctx;
      ASSERT_EQ(p.dst(), c.dst) << ctx;
      const std::string err = simulate(p);
      ASSERT_EQ(err, "") << ctx << "\n" << p.str(64);
      const std::string stats = check_stats(p);
      ASSERT_EQ(stats, "") << ctx << "\n" << p.str(64);
      if (complete) {
        ASSERT_EQ(p.stats().bytes_moved, minimum) << ctx << "\n" << p.str(64);
      }
      if (i % 5 == 0) {
        ASSERT_TRUE(Plan::from_json(p.to_json()) == p) << ctx << "\n" << p.to_json();
      }
      plans.emplace(st, std::move(p));
    }
    // Auto: exactly one strategy's plan; under balance none (which it prices with exactly) the
    // least predicted of the three. Greedy and search are priced with the local rule
    // (strategy_price_test.cc).
    opt.strategy = Strategy::Auto;
    const Plan a = plan(c.src, c.dst, topo, opt);
    double best = 1e300;
    for (const auto& [st, p] : plans) best = std::min(best, p.stats().predicted_seconds);
    const std::string ctx =
        "case " + std::to_string(i) + ": " + describe(c, Strategy::Auto, opt.balance, topo);
    ASSERT_NE(a.strategy(), Strategy::Auto) << ctx;
    if (opt.balance == Balance::None) {
      ASSERT_LE(a.stats().predicted_seconds, best * (1 + 1e-9)) << ctx;
    }
    ASSERT_TRUE(a == plans.at(a.strategy())) << ctx << "\nauto:\n"
                                             << a.str() << "\n"
                                             << to_string(a.strategy()) << ":\n"
                                             << plans.at(a.strategy()).str();
    // Search is never worse than greedy.
    if (opt.balance == Balance::Search) {
      PlanOptions g = opt;
      g.balance = Balance::Greedy;
      for (const auto& [st, p] : plans) {
        g.strategy = st;
        const Plan gp = plan(c.src, c.dst, topo, g);
        ASSERT_FALSE(p.stats().search_truncated) << ctx;
        ASSERT_LE(p.stats().predicted_seconds, gp.stats().predicted_seconds * (1 + 1e-12))
            << ctx << " strategy " << to_string(st);
      }
    }
  }
}

// A search cut short by its clock still returns a correct plan (greedy's, or better).
TEST(Planner, TruncatedSearchStillDelivers) {
  Rng rng(0x7c07);
  testing::Limits lim;
  lim.max_volume = 64;
  const Topology topo = four_hosts();
  for (int i = 0; i < testing::scaled(300); ++i) {
    const auto c = testing::random_case(rng, lim);
    PlanOptions opt;
    opt.strategy = static_cast<Strategy>(rng.below(4));
    opt.balance = Balance::Search;
    opt.search_seconds = 0;
    const Plan p = plan(c.src, c.dst, topo, opt);
    ASSERT_EQ(simulate(p), "") << describe(c, opt.strategy, opt.balance, topo) << "\n" << p.str(64);
  }
}

TEST(Planner, DeterministicAndJsonRoundTrip) {
  Rng rng(0xd37e);
  testing::Limits lim;
  lim.max_volume = 200;
  const Topology topo = four_hosts();
  for (int i = 0; i < testing::scaled(600); ++i) {
    const auto c = testing::random_case(rng, lim);
    PlanOptions opt;
    opt.strategy = static_cast<Strategy>(rng.below(4));
    opt.balance = static_cast<Balance>(rng.below(3));
    opt.search_seconds = 1e9;
    opt.search_moves = 500;
    const Topology& t = i % 2 ? topo : Topology::single_host();
    const Plan a = plan(c.src, c.dst, t, opt), b = plan(c.src, c.dst, t, opt);
    const std::string ctx = describe(c, opt.strategy, opt.balance, t);
    ASSERT_TRUE(a == b) << ctx << ": planning twice differs";
    const std::string json = a.to_json();
    const Plan back = Plan::from_json(json);
    ASSERT_TRUE(back == a) << ctx << "\n" << json;
    ASSERT_EQ(back.to_json(), json) << ctx;
    EXPECT_EQ(a.topology(), t.name()) << ctx;
    EXPECT_FALSE(a.str().empty());
    // devices(): the sorted union of both meshes.
    std::set<int> u(c.src.mesh().devices().begin(), c.src.mesh().devices().end());
    u.insert(c.dst.mesh().devices().begin(), c.dst.mesh().devices().end());
    EXPECT_EQ(a.devices(), std::vector<int>(u.begin(), u.end())) << ctx;
    int phases = 0;
    for (const Op& op : a.ops()) phases = std::max(phases, op.phase + 1);
    EXPECT_EQ(a.phases(), phases) << ctx;
  }
}

TEST(Planner, NamesAndParsers) {
  for (Strategy s : {Strategy::Auto, Strategy::Broadcast, Strategy::SendRecv, Strategy::AllGather})
    EXPECT_EQ(parse_strategy(to_string(s)), s);
  for (Balance b : {Balance::None, Balance::Greedy, Balance::Search})
    EXPECT_EQ(parse_balance(to_string(b)), b);
  EXPECT_EQ(to_string(Strategy::SendRecv), "sendrecv");
  EXPECT_EQ(to_string(Balance::Search), "search");
  EXPECT_EQ(to_string(OpKind::Multicast), "multicast");
  try {
    parse_strategy("fastest", "strategy");
    ADD_FAILURE();
  } catch (const ParseError& e) {
    EXPECT_EQ(e.field(), "strategy");
  }
  try {
    parse_balance("", "balance");
    ADD_FAILURE();
  } catch (const ParseError& e) {
    EXPECT_EQ(e.field(), "balance");
  }
}

TEST(Planner, MismatchedInputsNameTheField) {
  const auto a = Layout::parse({4, 4}, DType::f32, "2x2:S0R");
  try {
    plan(a, Layout::parse({4, 8}, DType::f32, "2x2@4-7:S0R"));
    ADD_FAILURE();
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "dst.shape");
  }
  try {
    plan(a, Layout::parse({4, 4}, DType::f64, "2x2@4-7:S0R"));
    ADD_FAILURE();
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "dst.dtype");
  }
  // A device the topology does not place.
  const Topology small = Topology::uniform("small", 2, 2, LinkClass{"intra", 1e10, 1e-6},
                                           LinkClass{"network", 1e9, 1e-5});
  try {
    plan(a, Layout::parse({4, 4}, DType::f32, "2x2@4-7:S0R"), small);
    ADD_FAILURE();
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field().rfind("topology", 0), 0u) << e.what();
  }
}

// Options out of their range are refused naming the field, by plan() and plan_rank() alike
// (a negative memory bound, a NaN cap and an enum value outside its names were taken).
TEST(Planner, OptionsOutsideTheirRangeAreRefused) {
  const auto a = Layout::parse({4, 4}, DType::f32, "2x2:S0R");
  const auto b = Layout::parse({4, 4}, DType::f32, "2x2@4-7:RS0");
  const auto refused = [&](const PlanOptions& o, const std::string& field) {
    for (int form = 0; form < 2; ++form) try {
        if (form == 0)
          plan(a, b, Topology::single_host(), o);
        else
          plan_rank(a, b, 4, Topology::single_host(), o);
        ADD_FAILURE() << field << " accepted";
      } catch (const ValidationError& e) {
        EXPECT_EQ(e.field(), field) << e.what();
      }
  };
  PlanOptions o;
  o.max_plan_bytes = -1;
  refused(o, "options.max_plan_bytes");
  o = {};
  o.search_seconds = std::numeric_limits<double>::quiet_NaN();
  refused(o, "options.search_seconds");
  o = {};
  o.search_moves = -1;
  refused(o, "options.search_moves");
  o = {};
  o.strategy = static_cast<Strategy>(42);
  refused(o, "options.strategy");
  o = {};
  o.balance = static_cast<Balance>(-1);
  refused(o, "options.balance");
  o = {};
  o.chunk_bytes = 0;
  refused(o, "chunk_bytes");
}

TEST(Topology, HostNamesAndTheirBounds) {
  const Topology t = Topology::load(MESHCAST_SOURCE_DIR "/meshes/emulated.json");
  ASSERT_EQ(t.hosts(), 5);
  EXPECT_EQ(t.host_name(0), "mc-host0");
  EXPECT_EQ(t.host_name(t.host_of(19)), "mc-host4");
  EXPECT_EQ(Topology::single_host().host_name(0), "");
  EXPECT_EQ(
      Topology::uniform("u", 2, 2, LinkClass{"intra", 1e10, 1e-6}, LinkClass{"network", 1e9, 1e-5})
          .host_name(1),
      "host1");
  for (int bad : {-1, 5}) {
    try {
      (void)t.host_name(bad);
      ADD_FAILURE() << bad;
    } catch (const ValidationError& e) {
      EXPECT_EQ(e.field(), "host");
    }
  }
}

TEST(Topology, EachDeviceUsesTheNicOfItsRankOnTheHost) {
  // Devices listed out of order: a device's NIC follows the order of ids on its host, which a
  // round trip through to_json() (which sorts them) keeps.
  const std::string file = R"({"name": "n", "links": {"intra": {"bandwidth_gbyte_s": 1,
      "latency_us": 2}, "network": {"bandwidth_gbit_s": 8, "latency_us": 5, "nics_per_host": 2}},
      "hosts": [{"devices": [7, 3, 5]}, {"devices": [0, 2]}]})";
  const Topology t = Topology::from_json(file);
  EXPECT_DOUBLE_EQ(t.nic_bandwidth(), t.network().bandwidth / 2);
  EXPECT_DOUBLE_EQ(t.nic_bandwidth(), 8e9 / 8);
  const std::map<int, int> want{{3, 0}, {5, 1}, {7, 0}, {0, 0}, {2, 1}};
  const Topology again = Topology::from_json(t.to_json());
  for (const auto& [d, nic] : want) {
    EXPECT_EQ(t.nic_of(d), nic) << d;
    EXPECT_EQ(again.nic_of(d), nic) << d;
  }
  const Topology u =
      Topology::uniform("u", 2, 4, LinkClass{"intra", 1e10, 1e-6}, LinkClass{"network", 1e9, 1e-5});
  EXPECT_EQ(u.nic_of(6), 0);  // one NIC per host
  EXPECT_EQ(Topology::single_host().nic_of(12345), 0);
  EXPECT_THROW((void)t.nic_of(4), ValidationError);
}

TEST(Planner, ANicPerDeviceSpreadsSendersOverTheHoldersNics) {
  // With a NIC per device, one holder's NIC carries all its sends: greedy gives a host's boxes
  // to different holders, and the model sees it (with one NIC per host it cannot matter).
  const Topology nic = Topology::load(MESHCAST_SOURCE_DIR "/meshes/emulated-nic.json");
  const Topology one = Topology::load(MESHCAST_SOURCE_DIR "/meshes/emulated.json");
  const auto src = Layout::parse({256, 256, 64}, DType::f32, "2x4@0-7:RS0R");
  const auto dst = Layout::parse({256, 256, 64}, DType::f32, "2x4@8-15:S0RR");
  PlanOptions opt;
  opt.strategy = Strategy::Broadcast;
  auto roots = [](const Plan& p) {
    std::set<int> r;
    for (const Op& op : p.ops())
      if (op.kind == OpKind::Multicast) r.insert(op.root);
    return r;
  };
  opt.balance = Balance::None;
  const Plan none = plan(src, dst, nic, opt);
  opt.balance = Balance::Greedy;
  const Plan greedy = plan(src, dst, nic, opt);
  EXPECT_EQ(simulate(greedy), "");
  EXPECT_EQ(roots(none).size(), 2u) << none.str(16);  // each host's first holder
  EXPECT_EQ(roots(greedy).size(), 4u) << greedy.str(16);
  for (int r : roots(greedy)) EXPECT_LT(r, 8);
  EXPECT_LT(predict(greedy, nic).seconds, 0.6 * predict(none, nic).seconds);
  EXPECT_NEAR(predict(plan(src, dst, one, opt), one).seconds, predict(none, one).seconds,
              1e-9 * predict(none, one).seconds);
  // A box that every device of a host holds goes fastest split over their NICs (allgather);
  // pooled into one link, one sender was as good.
  const auto rep = Layout::parse({256, 256, 64}, DType::f32, "2x4@0-7:S0RR");
  EXPECT_EQ(plan(rep, dst, nic).strategy(), Strategy::AllGather);
}

// Greedy prices a window of each transfer's candidate senders once the plan's candidates pass
// its budget (2^25 pricings): 8,192 holders of a replicated source sent to 8,192 receivers
// (6.7e7 candidates; 16,384 of each priced 2.7e8 for 17 s) still deliver every element, from
// senders spread over the holders.
TEST(Planner, GreedyPastItsBudgetStillSpreadsTheSenders) {
  const auto src = Layout::parse({8}, DType::f32, "8192@0-8191:R");
  const auto dst = Layout::parse({8}, DType::f32, "8192@8192-16383:R");
  const Topology t = Topology::uniform("u", 2048, 8, LinkClass{"intra", 1e10, 1e-6},
                                       LinkClass{"network", 1e9, 1e-5});
  PlanOptions opt;
  opt.strategy = Strategy::SendRecv;
  opt.balance = Balance::Greedy;
  const Plan p = plan(src, dst, t, opt);
  EXPECT_EQ(simulate(p), "");
  std::map<int, int> sends;
  for (const Op& op : p.ops())
    if (op.kind == OpKind::Multicast) ++sends[op.root];
  int most = 0;
  for (const auto& [root, n] : sends) most = std::max(most, n);
  EXPECT_GE(sends.size(), 4096u);
  EXPECT_LE(most, 2);
}

// ---- Topology-aware expected tables -------------------------------------------------------------

struct Expect {
  Shape shape;
  const char* src;
  const char* dst;
  Strategy strategy;
  Balance balance;
  std::int64_t moved;    // bytes sent between devices, in units of `unit` bytes
  std::int64_t network;  // of those, bytes crossing a host's network link
  std::int64_t unit;     // -1: the tensor's bytes
};

TEST(Planner, TopologyExpectedTables) {
  const Topology t = four_hosts();
  const std::int64_t T = -1;
  const Expect table[] = {
      // One device on host 0 to the 8 devices of hosts 2 and 3: one chain crosses the network
      // once per remote host; send/recv crosses it once per receiver.
      {{1024}, "1@0:R", "2x4@8-15:R", Strategy::Broadcast, Balance::None, 8, 2, T},
      {{1024}, "1@0:R", "2x4@8-15:R", Strategy::Broadcast, Balance::Search, 8, 2, T},
      {{1024}, "1@0:R", "2x4@8-15:R", Strategy::SendRecv, Balance::Greedy, 8, 8, T},
      {{1024}, "1@0:R", "2x4@8-15:R", Strategy::SendRecv, Balance::None, 8, 8, T},
      // To every device: device 0 keeps its copy; the chain enters each other host once.
      {{1024}, "1@0:R", "4x4@0-15:R", Strategy::Broadcast, Balance::Greedy, 15, 3, T},
      {{1024}, "1@0:R", "4x4@0-15:R", Strategy::SendRecv, Balance::Greedy, 15, 12, T},
      // One replica per host, each host needs a different quarter: greedy serves each host from
      // its own replica; "none" always sends from device 0.
      {{64}, "4@[0,4,8,12]:R", "4x4@0-15:S0", Strategy::Broadcast, Balance::Greedy, 12 * 16, 0, 4},
      {{64}, "4@[0,4,8,12]:R", "4x4@0-15:S0", Strategy::Broadcast, Balance::Search, 12 * 16, 0, 4},
      {{64}, "4@[0,4,8,12]:R", "4x4@0-15:S0", Strategy::SendRecv, Balance::Greedy, 12 * 16, 0, 4},
      {{64},
       "4@[0,4,8,12]:R",
       "4x4@0-15:S0",
       Strategy::Broadcast,
       Balance::None,
       12 * 16,
       3 * 16,
       4},
      // Same replicas, the target fully replicated: one task, so ONE chain from one replica,
      // entering each of the other three hosts once.
      {{64},
       "4@[0,4,8,12]:R",
       "4x4@0-15:R",
       Strategy::Broadcast,
       Balance::Greedy,
       12 * 64,
       3 * 64,
       4},
      // Host 0 -> host 1 row split: every byte crosses exactly once, whatever the strategy.
      {{4, 64}, "4@0-3:S0R", "4@4-7:S0R", Strategy::Broadcast, Balance::Greedy, 1, 1, T},
      {{4, 64}, "4@0-3:S0R", "4@4-7:S0R", Strategy::AllGather, Balance::Greedy, 1, 1, T},
      // Same devices, same layout: nothing moves.
      {{8, 8}, "2x2@0-3:S0S1", "2x2@0-3:S0S1", Strategy::Broadcast, Balance::Search, 0, 0, T},
  };
  for (const Expect& e : table) {
    const auto src = Layout::parse(e.shape, DType::f32, e.src);
    const auto dst = Layout::parse(e.shape, DType::f32, e.dst);
    PlanOptions opt;
    opt.strategy = e.strategy;
    opt.balance = e.balance;
    opt.search_seconds = 1e9;
    const Plan p = plan(src, dst, t, opt);
    const std::int64_t unit = e.unit < 0 ? src.bytes() : e.unit;
    SCOPED_TRACE(std::string(e.src) + " -> " + e.dst + " " + to_string(e.strategy) + "/" +
                 to_string(e.balance) + "\n" + p.str(64));
    EXPECT_EQ(simulate(p), "");
    EXPECT_EQ(p.stats().bytes_moved, e.moved * unit);
    EXPECT_EQ(p.stats().bytes_network, e.network * unit);
    EXPECT_EQ(p.stats().bytes_intra_host, (e.moved - e.network) * unit);
  }
}

TEST(Planner, GreedySpreadsSendersAcrossReplicas) {
  // Every host holds a replica and needs a different shard: no byte leaves its host, and each
  // sender is on its receivers' host.
  const Topology t = four_hosts();
  const auto src = Layout::parse({16, 8}, DType::f32, "4@[0,4,8,12]:RR");
  const auto dst = Layout::parse({16, 8}, DType::f32, "4x4@0-15:S0R");
  PlanOptions opt;
  opt.strategy = Strategy::Broadcast;
  opt.balance = Balance::Greedy;
  const Plan p = plan(src, dst, t, opt);
  EXPECT_EQ(simulate(p), "");
  for (const Op& op : p.ops()) {
    if (op.kind != OpKind::Multicast) continue;
    for (int r : op.peers) EXPECT_EQ(t.host_of(r), t.host_of(op.root)) << p.str(64);
  }
  EXPECT_EQ(p.stats().bytes_network, 0);
  // The senders are the four replicas, one per host.
  std::set<int> roots;
  for (const Op& op : p.ops())
    if (op.kind == OpKind::Multicast && !op.from_dst) roots.insert(op.root);
  EXPECT_EQ(roots, (std::set<int>{0, 4, 8, 12}));
}

TEST(Planner, PartialSourcesReduceThenServe) {
  // A pending sum over 4 devices of host 0 to a replicated target on host 1.
  const Topology t = four_hosts();
  const auto src = Layout::parse({8, 8}, DType::f32, "2x2@0-3:S0R+P1");
  const auto dst = Layout::parse({8, 8}, DType::f32, "4@4-7:RR");
  for (Strategy st :
       {Strategy::Broadcast, Strategy::SendRecv, Strategy::AllGather, Strategy::Auto}) {
    PlanOptions opt;
    opt.strategy = st;
    const Plan p = plan(src, dst, t, opt);
    EXPECT_EQ(simulate(p), "") << to_string(st) << "\n" << p.str(64);
    int reduces = 0;
    for (const Op& op : p.ops()) reduces += op.kind == OpKind::Reduce;
    EXPECT_GE(reduces, 1) << p.str(64);
  }
  // Partial target: addends other than the first are zero-filled.
  const auto pdst = Layout::parse({8, 8}, DType::f32, "2x2@4-7:RS0+P1");
  const Plan p = plan(Layout::parse({8, 8}, DType::f32, "4@0-3:S0R"), pdst, t);
  EXPECT_EQ(simulate(p), "") << p.str(64);
  int zeros = 0;
  for (const Op& op : p.ops()) zeros += op.kind == OpKind::Zero;
  EXPECT_EQ(zeros, 2) << p.str(64);
}

// The simulator itself: broken plans are caught (the oracle can fail).
TEST(Planner, SimulatorCatchesBrokenPlans) {
  auto with_ops = [](const Plan& p, std::vector<Op> ops) {
    return Plan(p.src(), p.dst(), p.strategy(), p.balance(), p.topology(), std::move(ops),
                p.stats());
  };
  PlanOptions opt;
  opt.strategy = Strategy::AllGather;
  const Plan ag = plan(Layout::parse({8, 8}, DType::f32, "2x2@0-3:S0R"),
                       Layout::parse({8, 8}, DType::f32, "4@4-7:RR"), Topology::single_host(), opt);
  ASSERT_EQ(simulate(ag), "");
  ASSERT_GE(ag.phases(), 2);
  std::vector<Op> ops = ag.ops();
  ops.pop_back();
  EXPECT_NE(simulate(with_ops(ag, ops)), "") << "a missing op";
  ops = ag.ops();
  ops.push_back(ops.back());
  EXPECT_NE(simulate(with_ops(ag, ops)), "") << "an op twice";
  ops = ag.ops();
  for (Op& op : ops) op.phase = 0;  // the all-gather step reads data not yet received
  EXPECT_NE(simulate(with_ops(ag, ops)), "") << "one phase";
  ops = ag.ops();
  std::reverse(ops.begin(), ops.end());
  EXPECT_NE(simulate(with_ops(ag, ops)), "") << "phases out of order";
  ops = ag.ops();
  for (Op& op : ops)
    if (op.kind == OpKind::Multicast && !op.from_dst) op.root = 4;  // not a source device
  EXPECT_NE(simulate(with_ops(ag, ops)), "") << "a root without the data";

  const Plan red = plan(Layout::parse({4, 4}, DType::f32, "2x2@0-3:S0R+P1"),
                        Layout::parse({4, 4}, DType::f32, "2@4-5:RS0"));
  ASSERT_EQ(simulate(red), "");
  ops = red.ops();
  bool changed = false;
  for (Op& op : ops)
    if (op.kind == OpKind::Reduce && !changed) {
      std::swap(op.peers[0], op.peers[1]);  // contributors out of addend order
      changed = true;
    }
  ASSERT_TRUE(changed) << red.str();
  EXPECT_NE(simulate(with_ops(red, ops)), "") << "addends swapped";
  ops = red.ops();
  for (Op& op : ops)
    if (op.kind == OpKind::Reduce) {
      const int target = op.root;
      op.kind = OpKind::Multicast;  // one addend sent as if it were the value
      op.root = op.peers[0] == target ? op.peers[1] : op.peers[0];
      op.peers = {target};
      op.from_dst = false;
    }
  EXPECT_NE(simulate(with_ops(red, ops)), "") << "an addend multicast";
}

// One random change to a plan's ops (an op dropped, repeated or moved; a root, peer, box bound,
// phase, kind or from_dst changed), the kind of hand edit Plan::validate must judge.
void mutate(Rng& rng, std::vector<Op>& ops) {
  auto pick = [&]() -> Op& { return ops[static_cast<std::size_t>(rng.below(std::ssize(ops)))]; };
  auto at = [&] { return static_cast<std::ptrdiff_t>(rng.below(std::ssize(ops))); };
  switch (rng.below(11)) {
    case 0:
      ops.erase(ops.begin() + at());
      break;
    case 1: {
      const auto i = at();
      ops.insert(ops.begin() + i, ops[static_cast<std::size_t>(i)]);
      break;
    }
    case 2:
      pick().root = static_cast<int>(rng.below(16));
      break;
    case 3: {
      Op& op = pick();
      if (op.peers.empty() || rng.chance(1, 3))
        op.peers.push_back(static_cast<int>(rng.below(16)));
      else
        op.peers[static_cast<std::size_t>(rng.below(std::ssize(op.peers)))] =
            static_cast<int>(rng.below(16));
      break;
    }
    case 4: {
      Op& op = pick();
      if (!op.peers.empty()) op.peers.erase(op.peers.begin() + rng.below(std::ssize(op.peers)));
      break;
    }
    case 5: {
      Op& op = pick();
      auto r = op.box.ranges();
      Range& x = r[static_cast<std::size_t>(rng.below(std::ssize(r)))];
      (rng.chance(1, 2) ? x.lo : x.hi) += rng.chance(1, 2) ? 1 : -1;
      op.box = Box(std::move(r));
      break;
    }
    case 6:
      pick().phase += rng.chance(1, 2) ? 1 : -1;
      break;
    case 7:
      pick().from_dst ^= true;
      break;
    case 8:
      pick().kind = static_cast<OpKind>(rng.below(4));
      break;
    case 9:
      std::swap(pick(), pick());
      break;
    default: {
      Op& op = pick();
      if (op.peers.size() > 1) std::swap(op.peers.front(), op.peers.back());
    }
  }
}

// The validator (box arithmetic) against the simulator (element by element) on planner plans
// and random mutations of them: validate() accepts exactly the plans the simulator finds
// correct, but for two forms the executor would run right that the validator refuses as
// malformed (a phase skipped; peers named on a copy or a zero-fill).
TEST(Planner, ValidatorAgreesWithTheSimulator) {
  Rng rng(0x7a1d);
  testing::Limits lim;
  lim.max_volume = 64;
  lim.max_extent = 5;
  const Topology topo = four_hosts();
  int correct = 0, broken = 0;
  for (int i = 0; i < testing::scaled(4000); ++i) {
    const auto c = testing::random_case(rng, lim);
    PlanOptions opt;
    opt.strategy = static_cast<Strategy>(rng.between(1, 3));
    opt.search_moves = 50;
    opt.search_seconds = 1e9;
    const Plan p = plan(c.src, c.dst, topo, opt);
    std::vector<Op> ops = p.ops();
    const int edits = static_cast<int>(rng.below(3));
    for (int e = 0; e < edits && !ops.empty(); ++e) mutate(rng, ops);
    const Plan m(p.src(), p.dst(), p.strategy(), p.balance(), p.topology(), ops, p.stats());
    const std::string sim = simulate(m);
    std::string val;
    try {
      m.validate();
    } catch (const ValidationError& e) {
      val = e.what();
    }
    const std::string ctx = "case " + std::to_string(i) + ": " + c.str() + "\nsimulator: " + sim +
                            "\nvalidator: " + val + "\n" + m.str(64);
    if (sim.empty()) {
      const bool malformed = val.find("skips phase") != std::string::npos ||
                             val.find("has no peers") != std::string::npos;
      ASSERT_TRUE(val.empty() || malformed) << ctx;
      correct += val.empty();
    } else {
      ASSERT_FALSE(val.empty()) << ctx;
      ++broken;
    }
  }
  // Both outcomes are exercised.
  EXPECT_GT(correct, testing::scaled(4000) / 5);
  EXPECT_GT(broken, testing::scaled(4000) / 5);
}

}  // namespace
}  // namespace meshcast
