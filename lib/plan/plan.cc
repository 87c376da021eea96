// The Plan value: naming, the JSON round trip (validated by lib/plan_check.cc) and the print.
#include "meshcast/plan.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <iomanip>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <tuple>
#include <type_traits>

#include "lib/plan/op_text.h"
#include "lib/plan/plan_check.h"
#include "lib/plan/plan_stats.h"
#include "lib/support/json_text.h"
#include "lib/support/text.h"
#include "meshcast/error.h"
#include "meshcast/limits.h"

namespace meshcast {

namespace {

constexpr std::pair<Strategy, const char*> kStrategies[] = {{Strategy::Auto, "auto"},
                                                            {Strategy::Broadcast, "broadcast"},
                                                            {Strategy::SendRecv, "sendrecv"},
                                                            {Strategy::AllGather, "allgather"}};
constexpr std::pair<Balance, const char*> kBalances[] = {{Balance::None, "none"},
                                                         {Balance::Greedy, "greedy"},
                                                         {Balance::Search, "search"},
                                                         {Balance::Local, "local"}};
constexpr std::pair<OpKind, const char*> kOpKinds[] = {{OpKind::Copy, "copy"},
                                                       {OpKind::Multicast, "multicast"},
                                                       {OpKind::Reduce, "reduce"},
                                                       {OpKind::Zero, "zero"}};

template <class E, std::size_t N>
const char* name_of(const std::pair<E, const char*> (&table)[N], E e) {
  for (const auto& [v, n] : table)
    if (v == e) return n;
  return "?";
}

template <class E, std::size_t N>
E value_of(const std::pair<E, const char*> (&table)[N], std::string_view text,
           const std::string& field) {
  std::string choices;
  for (const auto& [v, n] : table) {
    if (text == n) return v;
    choices += (choices.empty() ? "" : ", ") + std::string(n);
  }
  throw ParseError(field, "unknown value " + detail::quote(text) + " (expected " + choices + ")");
}

// Reading a plan document: every value checked for its type, every error a ParseError naming
// the JSON path ("plan.ops[3].box[1]"). Paths are spelled out only for an error (`where`: a
// string or a callable returning one), not for each of a large plan's millions of values.
using detail::at_index;
using detail::JsonReader;

template <class W>
std::string where_str(W&& where) {
  if constexpr (std::is_invocable_v<W>)
    return where();
  else
    return std::string(where);
}

// The first `n` of `keys` are required: one not seen in the object is "missing".
template <std::size_t N, class W>
void require(unsigned seen, const std::string_view (&keys)[N], std::size_t n, W&& where) {
  for (std::size_t k = 0; k < n && k < N; ++k)
    if (!(seen >> k & 1u))
      throw ParseError(where_str(where) + "." + std::string(keys[k]), "missing");
}

// The index of `key` in `keys`, N if absent.
template <std::size_t N>
std::size_t key_index(const std::string_view (&keys)[N], std::string_view key) {
  std::size_t k = 0;
  while (k < N && key != keys[k]) ++k;
  return k;
}

template <class T>
std::vector<T> integers(JsonReader& r, const std::string& field) {
  std::vector<T> v;
  r.array(field,
          [&](std::size_t i) { v.push_back(r.integer<T>([&] { return at_index(field, i); })); });
  return v;
}

// A byte count of the stats: >= 0.
std::int64_t count_at(JsonReader& r, const std::string& field) {
  const auto v = r.integer<std::int64_t>(field);
  if (v < 0) throw ValidationError(field, "must be >= 0");
  return v;
}

// {"3": 1024, ...}: per-device byte counts.
std::map<int, std::int64_t> per_device(JsonReader& r, const std::string& field) {
  std::map<int, std::int64_t> m;
  r.object(field, [&](std::string_view k) {
    m[static_cast<int>(detail::parse_uint(k, std::numeric_limits<int>::max(), field,
                                          "device id"))] = count_at(r, field);
  });
  return m;
}

// [[lo, hi], ...]: one pair per dimension (validate() checks them against the tensor).
template <class W>
Box box_from(JsonReader& r, W&& where) {
  std::vector<Range> ranges;
  r.array(where, [&](std::size_t d) {
    const auto f = [&] { return at_index(where_str(where), d); };
    std::int64_t b[2] = {0, 0};
    std::size_t n = 0;
    r.array(f, [&](std::size_t) {
      if (n == 2) throw ParseError(f(), "expected [lo, hi]");
      b[n++] = r.integer<std::int64_t>(f);
    });
    if (n != 2) throw ParseError(f(), "expected [lo, hi]");
    ranges.push_back({b[0], b[1]});
  });
  return Box(std::move(ranges));
}

constexpr std::string_view kOpKeys[] = {"kind",     "root",   "phase", "box", "peers",
                                        "from_dst", "stream", "group", "fork"};

// One op; `has_stream` tells whether it had a "stream" (needed when the plan has "streams").
Op op_from(JsonReader& r, std::size_t i, bool& has_stream) {
  const auto field = [i] { return at_index("plan.ops", i); };
  const auto f = [&](const char* member) { return [&field, member] { return field() + member; }; };
  Op op;
  unsigned seen = 0;
  r.object(field, [&](std::string_view key) {
    const std::size_t k = key_index(kOpKeys, key);
    seen |= 1u << k;
    switch (k) {
      case 0: {
        const std::string text = r.string(f(".kind"));
        op.kind = value_of(kOpKinds, text, field() + ".kind");
        return;
      }
      case 1:
        op.root = r.integer<int>(f(".root"));
        return;
      case 2:
        op.phase = r.integer<int>(f(".phase"));
        return;
      case 3:
        op.box = box_from(r, f(".box"));
        return;
      case 4:
        r.array(f(".peers"), [&](std::size_t p) {
          op.peers.push_back(r.integer<int>([&] { return at_index(field() + ".peers", p); }));
        });
        return;
      case 5:
        op.from_dst = r.boolean(f(".from_dst"));
        return;
      case 6:
        op.stream = r.integer<std::int64_t>(f(".stream"));
        return;
      case 7:
        op.group = r.integer<std::int32_t>(f(".group"));
        return;
      case 8:
        op.fork = r.integer<std::int32_t>(f(".fork"));
        return;
      default:
        r.skip();  // unknown members are ignored, as in every document
    }
  });
  has_stream = seen >> 6 & 1u;
  require(seen, kOpKeys, 6, field);  // all but "stream", "group" and "fork"
  return op;
}

Layout layout_from(JsonReader& r, const std::string& field) {
  constexpr std::string_view kKeys[] = {"shape", "dtype", "layout"};
  Shape shape;
  std::string dtype, layout;
  unsigned seen = 0;
  r.object(field, [&](std::string_view key) {
    const std::size_t k = key_index(kKeys, key);
    seen |= 1u << k;
    if (k == 0)
      shape = integers<std::int64_t>(r, field + ".shape");
    else if (k == 1)
      dtype = r.string(field + ".dtype");
    else if (k == 2)
      layout = r.string(field + ".layout");
    else
      r.skip();
  });
  require(seen, kKeys, 3, field);
  return Layout::parse(shape, parse_dtype(dtype, field + ".dtype"), layout, field);
}

}  // namespace

std::string to_string(Strategy s) { return name_of(kStrategies, s); }
Strategy parse_strategy(std::string_view text, const std::string& field) {
  return value_of(kStrategies, text, field);
}
std::string to_string(Balance b) { return name_of(kBalances, b); }
Balance parse_balance(std::string_view text, const std::string& field) {
  return value_of(kBalances, text, field);
}
std::string to_string(OpKind k) { return name_of(kOpKinds, k); }

Plan::Plan(Layout src, Layout dst, Strategy strategy, Balance balance, std::string topology,
           std::vector<Op> ops, PlanStats stats, std::int64_t streams)
    : src_(std::move(src)),
      dst_(std::move(dst)),
      strategy_(strategy),
      balance_(balance),
      topology_(std::move(topology)),
      ops_(std::move(ops)),
      stats_(std::move(stats)),
      streams_(streams) {
  if (streams_ < 0) {
    streams_ = static_cast<std::int64_t>(ops_.size());
    for (std::size_t i = 0; i < ops_.size(); ++i) ops_[i].stream = static_cast<std::int64_t>(i);
  }
}

int Plan::phases() const {
  int p = 0;
  for (const Op& op : ops_) p = std::max(p, op.phase + 1);
  return p;
}

std::vector<int> Plan::devices() const {
  std::vector<int> d = src_.mesh().devices();
  d.insert(d.end(), dst_.mesh().devices().begin(), dst_.mesh().devices().end());
  std::sort(d.begin(), d.end());
  d.erase(std::unique(d.begin(), d.end()), d.end());
  return d;
}

// Written op by op with no tree in between (a 4,096 -> 4,096 plan is 30 MB of text). The small
// members come first, so a reader sees them before the ops.
void Plan::write_json(std::ostream& os) const {
  detail::JsonWriter w(os);
  const auto layout = [&w](const char* key, const Layout& l) {
    w.key(key);
    w.begin_object();
    w.key("shape");
    w.begin_array();
    if (!l.scalar())  // read back as 0-d
      for (const std::int64_t e : l.shape()) w.value(e);
    w.end_array();
    w.member("dtype", to_string(l.dtype()));
    w.member("layout", l.str());
    w.end_object();
  };
  const auto per_device = [&w](const char* key, const std::map<int, std::int64_t>& m) {
    w.key(key);
    w.begin_object();
    for (const auto& [d, b] : m) {
      char id[16];
      w.member(
          std::string_view(id, static_cast<std::size_t>(std::to_chars(id, id + 16, d).ptr - id)),
          b);
    }
    w.end_object();
  };
  w.begin_object();
  layout("src", src_);
  layout("dst", dst_);
  w.member("strategy", name_of(kStrategies, strategy_));
  w.member("balance", name_of(kBalances, balance_));
  w.member("topology", topology_);
  w.member("streams", streams_);
  w.key("stats");
  w.begin_object();
  w.member("bytes_moved", stats_.bytes_moved);
  w.member("bytes_local", stats_.bytes_local);
  w.member("bytes_intra_host", stats_.bytes_intra_host);
  w.member("bytes_network", stats_.bytes_network);
  per_device("sent", stats_.sent);
  per_device("received", stats_.received);
  w.member("predicted_seconds", stats_.predicted_seconds);
  w.member("search_truncated", stats_.search_truncated);
  w.end_object();
  w.key("ops");
  w.begin_array();
  for (const Op& op : ops_) {
    w.begin_object();
    w.member("kind", name_of(kOpKinds, op.kind));
    w.member("phase", op.phase);
    w.key("box");
    w.begin_array();
    for (const Range& r : op.box.ranges()) {
      w.begin_array();
      w.value(r.lo);
      w.value(r.hi);
      w.end_array();
    }
    w.end_array();
    w.member("root", op.root);
    w.key("peers");
    w.begin_array();
    for (const int p : op.peers) w.value(p);
    w.end_array();
    w.member("from_dst", op.from_dst);
    w.member("stream", op.stream);
    if (op.group != 0) w.member("group", op.group);  // absent: one chain (older documents)
    if (op.fork != 0) w.member("fork", op.fork);     // absent: no split
    w.end_object();
  }
  w.end_array();
  w.end_object();
}

std::string Plan::to_json() const {
  std::ostringstream os;
  write_json(os);
  return std::move(os).str();
}

// A saved plan's byte counts are what its ops move: the run bound (MESHCAST_MAX_RUN_BYTES) and
// the reported bandwidth are taken from them. Without the topology it was planned on, the split
// between intra-host and network bytes is checked only to add up.
namespace {
void check_saved_stats(const Plan& p) {
  struct OneHost {
    std::vector<int> all;
    const std::vector<int>& devices() const { return all; }
    std::size_t slot(int d) const {
      return static_cast<std::size_t>(std::lower_bound(all.begin(), all.end(), d) - all.begin());
    }
    int host(int) const { return 0; }
  } where{p.devices()};
  const PlanStats& saved = p.stats();
  const PlanStats ops = detail::account(p.ops(), where, dtype_size(p.src().dtype()));
  const auto differ = [](const std::string& key, const std::string& saved, const std::string& ops) {
    throw ValidationError("plan.stats." + key, "says " + saved + " where the ops give " + ops);
  };
  for (const auto& [key, s, o] : {std::tuple{"bytes_moved", saved.bytes_moved, ops.bytes_moved},
                                  std::tuple{"bytes_local", saved.bytes_local, ops.bytes_local}})
    if (s != o) differ(key, std::to_string(s), std::to_string(o));
  if (saved.bytes_intra_host > saved.bytes_moved ||
      saved.bytes_network != saved.bytes_moved - saved.bytes_intra_host)
    differ("bytes_network", std::to_string(saved.bytes_network),
           std::to_string(saved.bytes_moved - saved.bytes_intra_host) +
               " (bytes_moved less bytes_intra_host)");
  for (const auto& [key, s, o] : {std::tuple{"sent", &saved.sent, &ops.sent},
                                  std::tuple{"received", &saved.received, &ops.received}})
    if (*s != *o) {
      // The first device they disagree on (a device absent from one map counts 0 there).
      auto at = [](const std::map<int, std::int64_t>& m, int d) {
        const auto it = m.find(d);
        return it == m.end() ? std::int64_t{0} : it->second;
      };
      for (const int d : where.all)
        if (at(*s, d) != at(*o, d) || s->count(d) != o->count(d))
          differ(std::string(key) + "." + std::to_string(d), std::to_string(at(*s, d)),
                 std::to_string(at(*o, d)));
      throw ValidationError("plan.stats." + std::string(key), "names a device outside the plan");
    }
}
}  // namespace

// Read in place (JsonReader): a 30 MB plan loads in a fraction of a second, where a tree of it
// took seconds and gigabytes.
Plan Plan::from_json(std::string_view text) {
  JsonReader r(text, "plan");
  r.check();  // malformed text and repeated keys first, as such
  if (r.peek() != JsonReader::Type::Object) throw ParseError("plan", "expected a JSON object");
  constexpr std::string_view kKeys[] = {"src",      "dst",   "strategy", "balance",
                                        "topology", "stats", "ops",      "streams"};
  constexpr std::string_view kStatKeys[] = {
      "bytes_moved", "bytes_local", "bytes_intra_host",  "bytes_network",
      "sent",        "received",    "predicted_seconds", "search_truncated"};
  std::optional<Layout> src, dst;
  std::string strategy, balance, topology;
  PlanStats st;
  std::vector<Op> ops;
  std::int64_t streams = -1;  // absent: the ops are numbered in order
  std::size_t without_stream = std::numeric_limits<std::size_t>::max();  // the first such op
  unsigned seen = 0, stats_seen = 0;
  r.object("plan", [&](std::string_view key) {
    const std::size_t k = key_index(kKeys, key);
    seen |= 1u << k;
    switch (k) {
      case 0:
        src = layout_from(r, "plan.src");
        return;
      case 1:
        dst = layout_from(r, "plan.dst");
        return;
      case 2:
        strategy = r.string("plan.strategy");
        return;
      case 3:
        balance = r.string("plan.balance");
        return;
      case 4:
        topology = r.string("plan.topology");
        return;
      case 5:
        r.object("plan.stats", [&](std::string_view sk) {
          const std::size_t j = key_index(kStatKeys, sk);
          stats_seen |= 1u << j;
          const std::string f = "plan.stats." + std::string(sk);
          switch (j) {
            case 0:
              st.bytes_moved = count_at(r, f);
              return;
            case 1:
              st.bytes_local = count_at(r, f);
              return;
            case 2:
              st.bytes_intra_host = count_at(r, f);
              return;
            case 3:
              st.bytes_network = count_at(r, f);
              return;
            case 4:
              st.sent = per_device(r, f);
              return;
            case 5:
              st.received = per_device(r, f);
              return;
            case 6:
              st.predicted_seconds = r.number(f);
              if (!(st.predicted_seconds >= 0) || !std::isfinite(st.predicted_seconds))
                throw ValidationError(f, "must be a finite number >= 0");
              return;
            case 7:
              st.search_truncated = r.boolean(f);
              return;
            default:
              r.skip();
          }
        });
        return;
      case 6: {
        // Bounded before anything proportional to the ops (validate() is near linear in them).
        const std::size_t n = r.count("plan.ops");
        check_limit("plan.ops", static_cast<std::int64_t>(n), limits().plan_ops, "PLAN_OPS");
        ops.reserve(n);
        r.array("plan.ops", [&](std::size_t i) {
          bool has_stream = false;
          ops.push_back(op_from(r, i, has_stream));
          if (!has_stream) without_stream = std::min(without_stream, i);
        });
        return;
      }
      case 7:
        streams = r.integer<std::int64_t>("plan.streams");
        if (streams < 0) throw ValidationError("plan.streams", "must be >= 0");
        return;
      default:
        r.skip();
    }
  });
  require(seen, kKeys, 7, "plan");  // all but "streams"
  require(stats_seen, kStatKeys, 8, "plan.stats");
  if (streams >= 0 && without_stream < ops.size())
    throw ParseError(at_index("plan.ops", without_stream) + ".stream",
                     "missing (the plan has \"streams\")");
  Plan p(std::move(*src), std::move(*dst), value_of(kStrategies, strategy, "plan.strategy"),
         value_of(kBalances, balance, "plan.balance"), std::move(topology), std::move(ops),
         std::move(st), streams);
  p.validate();
  check_saved_stats(p);
  return p;
}

void Plan::validate() const { detail::check_plan(*this); }

std::string Plan::str(std::size_t max_ops) const {
  std::ostringstream os;
  os << "plan " << shape_str(src_.shape()) << ' ' << to_string(src_.dtype()) << "  " << src_.str()
     << " -> " << dst_.str() << '\n'
     << "  strategy " << to_string(strategy_) << ", balance " << to_string(balance_)
     << ", topology " << topology_ << ", "
     << detail::counted(static_cast<std::int64_t>(ops_.size()), "op") << " in "
     << detail::counted(phases(), "phase") << '\n'
     << "  bytes moved " << stats_.bytes_moved << " (intra-host " << stats_.bytes_intra_host
     << ", network " << stats_.bytes_network << "), local copies " << stats_.bytes_local << '\n'
     << "  predicted " << std::setprecision(4) << stats_.predicted_seconds * 1e3 << " ms"
     << (stats_.search_truncated ? " (search cut short by its time cap)" : "") << '\n';
  detail::write_op_list(os, ops_, max_ops);
  return os.str();
}

namespace detail {

void write_op_list(std::ostream& os, const std::vector<Op>& ops, std::size_t max_ops) {
  constexpr std::size_t kListedPeers = 16;
  for (std::size_t i = 0; i < ops.size() && i < max_ops; ++i) {
    const Op& op = ops[i];
    // A multicast to one receiver is a plain send (what strategy sendrecv makes): named so.
    const bool send = op.kind == OpKind::Multicast && op.peers.size() == 1;
    os << "  [" << op.phase << "] " << std::left << std::setw(9)
       << (send ? std::string("send") : to_string(op.kind)) << ' ' << op.box.str() << ' ';
    switch (op.kind) {
      case OpKind::Copy:
      case OpKind::Zero:
        os << "on " << op.root;
        break;
      case OpKind::Multicast:
        os << op.root << (op.from_dst ? "(dst)" : "") << " -> ";
        // A multicast to thousands would fill a screen per op: the first few, then a count.
        for (std::size_t k = 0; k < op.peers.size() && k < kListedPeers; ++k)
          os << (k ? "," : "") << op.peers[k];
        if (op.peers.size() > kListedPeers) os << ",... (" << op.peers.size() << " receivers)";
        if (op.fork != 0) os << " forked after " << op.fork;
        if (op.group != 0)
          os << " as "
             << multicast_chains(static_cast<std::int64_t>(op.peers.size()), op.group, op.fork)
             << " chains of <= " << op.group;
        break;
      case OpKind::Reduce:
        for (std::size_t k = 0; k < op.peers.size() && k < kListedPeers; ++k)
          os << (k ? "+" : "") << op.peers[k];
        if (op.peers.size() > kListedPeers) os << "+... (" << op.peers.size() << " addends)";
        os << " -> " << op.root;
        break;
    }
    os << '\n';
  }
  if (ops.size() > max_ops)
    os << "  ... " << counted(static_cast<std::int64_t>(ops.size() - max_ops), "more op") << '\n';
}

}  // namespace detail

}  // namespace meshcast
