// The Plan value: naming, the JSON round trip (validated by lib/plan_check.cc) and the print.
#include "meshcast/plan.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "lib/plan/plan_check.h"
#include "lib/support/json_text.h"
#include "lib/support/text.h"
#include "meshcast/error.h"
#include "meshcast/limits.h"

namespace meshcast {

using nlohmann::json;

namespace {

constexpr std::pair<Strategy, const char*> kStrategies[] = {{Strategy::Auto, "auto"},
                                                            {Strategy::Broadcast, "broadcast"},
                                                            {Strategy::SendRecv, "sendrecv"},
                                                            {Strategy::AllGather, "allgather"}};
constexpr std::pair<Balance, const char*> kBalances[] = {
    {Balance::None, "none"}, {Balance::Greedy, "greedy"}, {Balance::Search, "search"}};
constexpr std::pair<OpKind, const char*> kOpKinds[] = {{OpKind::Copy, "copy"},
                                                       {OpKind::Multicast, "multicast"},
                                                       {OpKind::Reduce, "reduce"},
                                                       {OpKind::Zero, "zero"}};

template <class E, std::size_t N>
std::string name_of(const std::pair<E, const char*> (&table)[N], E e) {
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
// the JSON path ("plan.ops[3].box[1]").

const json& member(const json& obj, const char* key, const std::string& field) {
  if (!obj.is_object()) throw ParseError(field, "expected an object");
  const auto it = obj.find(key);
  if (it == obj.end()) throw ParseError(field + "." + key, "missing");
  return *it;
}

std::string text_at(const json& j, const std::string& field) {
  if (!j.is_string()) throw ParseError(field, "expected a string");
  return j.get<std::string>();
}

bool flag_at(const json& j, const std::string& field) {
  if (!j.is_boolean()) throw ParseError(field, "expected true or false");
  return j.get<bool>();
}

const json& array_at(const json& j, const std::string& field) {
  if (!j.is_array()) throw ParseError(field, "expected an array");
  return j;
}

using detail::at_index;

// Integers must be JSON integers in range: 1.5 or 1e30 are refused, not truncated.
template <class T>
T integer(const json& j, const std::string& field) {
  if (!j.is_number_integer()) throw ParseError(field, "expected an integer");
  if (j.is_number_unsigned()
          ? j.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<T>::max())
          : j.get<std::int64_t>() < std::numeric_limits<T>::min() ||
                j.get<std::int64_t>() > std::numeric_limits<T>::max())
    throw ParseError(field, "integer out of range");
  return static_cast<T>(j.get<std::int64_t>());
}

template <class T>
std::vector<T> integers(const json& j, const std::string& field) {
  std::vector<T> v;
  for (std::size_t i = 0; i < array_at(j, field).size(); ++i)
    v.push_back(integer<T>(j[i], at_index(field, i)));
  return v;
}

// A byte count or a duration of the stats: >= 0.
std::int64_t count_at(const json& j, const std::string& field) {
  const auto v = integer<std::int64_t>(j, field);
  if (v < 0) throw ValidationError(field, "must be >= 0");
  return v;
}

// {"3": 1024, ...}: per-device byte counts.
std::map<int, std::int64_t> per_device(const json& j, const std::string& field) {
  if (!j.is_object()) throw ParseError(field, "expected an object");
  std::map<int, std::int64_t> m;
  for (const auto& [k, v] : j.items())
    m[static_cast<int>(detail::parse_uint(k, std::numeric_limits<int>::max(), field,
                                          "device id"))] = count_at(v, field);
  return m;
}

json box_json(const Box& b) {
  json a = json::array();
  for (const Range& r : b.ranges()) a.push_back({r.lo, r.hi});
  return a;
}

// [[lo, hi], ...]: one pair per dimension (validate() checks them against the tensor).
Box box_from(const json& j, const std::string& field) {
  std::vector<Range> r;
  for (std::size_t d = 0; d < array_at(j, field).size(); ++d) {
    const std::string f = at_index(field, d);
    if (!j[d].is_array() || j[d].size() != 2) throw ParseError(f, "expected [lo, hi]");
    r.push_back({integer<std::int64_t>(j[d][0], f), integer<std::int64_t>(j[d][1], f)});
  }
  return Box(std::move(r));
}

Op op_from(const json& o, const std::string& field) {
  Op op;
  op.kind = value_of(kOpKinds, text_at(member(o, "kind", field), field + ".kind"), field + ".kind");
  op.phase = integer<int>(member(o, "phase", field), field + ".phase");
  op.box = box_from(member(o, "box", field), field + ".box");
  op.root = integer<int>(member(o, "root", field), field + ".root");
  op.peers = integers<int>(member(o, "peers", field), field + ".peers");
  op.from_dst = flag_at(member(o, "from_dst", field), field + ".from_dst");
  return op;
}

json layout_json(const Layout& l) {
  return {{"shape", l.shape()}, {"dtype", to_string(l.dtype())}, {"layout", l.str()}};
}

Layout layout_from(const json& j, const std::string& field) {
  const Shape shape = integers<std::int64_t>(member(j, "shape", field), field + ".shape");
  const DType dtype =
      parse_dtype(text_at(member(j, "dtype", field), field + ".dtype"), field + ".dtype");
  return Layout::parse(shape, dtype, text_at(member(j, "layout", field), field + ".layout"), field);
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
           std::vector<Op> ops, PlanStats stats)
    : src_(std::move(src)),
      dst_(std::move(dst)),
      strategy_(strategy),
      balance_(balance),
      topology_(std::move(topology)),
      ops_(std::move(ops)),
      stats_(std::move(stats)) {}

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

std::string Plan::to_json() const {
  json ops = json::array();
  for (const Op& op : ops_)
    ops.push_back({{"kind", to_string(op.kind)},
                   {"phase", op.phase},
                   {"box", box_json(op.box)},
                   {"root", op.root},
                   {"peers", op.peers},
                   {"from_dst", op.from_dst}});
  auto per_device = [](const std::map<int, std::int64_t>& m) {
    json o = json::object();
    for (const auto& [d, b] : m) o[std::to_string(d)] = b;
    return o;
  };
  json j = {{"src", layout_json(src_)},
            {"dst", layout_json(dst_)},
            {"strategy", to_string(strategy_)},
            {"balance", to_string(balance_)},
            {"topology", topology_},
            {"stats",
             {{"bytes_moved", stats_.bytes_moved},
              {"bytes_local", stats_.bytes_local},
              {"bytes_intra_host", stats_.bytes_intra_host},
              {"bytes_network", stats_.bytes_network},
              {"sent", per_device(stats_.sent)},
              {"received", per_device(stats_.received)},
              {"predicted_seconds", stats_.predicted_seconds},
              {"search_truncated", stats_.search_truncated}}},
            {"ops", ops}};
  return j.dump();
}

Plan Plan::from_json(std::string_view text) {
  try {
    json j;
    try {
      j = detail::parse_json(std::string(text), "plan");
    } catch (const ParseError& e) {  // one bounded line: nlohmann quotes the token it read
      if (e.cause().size() <= 300) throw;
      throw ParseError(e.field(), e.cause().substr(0, 280) + "...");
    }
    if (!j.is_object()) throw ParseError("plan", "expected a JSON object");
    const Layout src = layout_from(member(j, "src", "plan"), "plan.src");
    const Layout dst = layout_from(member(j, "dst", "plan"), "plan.dst");
    const Strategy strategy = value_of(
        kStrategies, text_at(member(j, "strategy", "plan"), "plan.strategy"), "plan.strategy");
    const Balance balance =
        value_of(kBalances, text_at(member(j, "balance", "plan"), "plan.balance"), "plan.balance");
    std::string topology = text_at(member(j, "topology", "plan"), "plan.topology");
    const json& s = member(j, "stats", "plan");
    PlanStats st;
    st.bytes_moved = count_at(member(s, "bytes_moved", "plan.stats"), "plan.stats.bytes_moved");
    st.bytes_local = count_at(member(s, "bytes_local", "plan.stats"), "plan.stats.bytes_local");
    st.bytes_intra_host =
        count_at(member(s, "bytes_intra_host", "plan.stats"), "plan.stats.bytes_intra_host");
    st.bytes_network =
        count_at(member(s, "bytes_network", "plan.stats"), "plan.stats.bytes_network");
    st.sent = per_device(member(s, "sent", "plan.stats"), "plan.stats.sent");
    st.received = per_device(member(s, "received", "plan.stats"), "plan.stats.received");
    const json& predicted = member(s, "predicted_seconds", "plan.stats");
    if (!predicted.is_number())
      throw ParseError("plan.stats.predicted_seconds", "expected a number");
    st.predicted_seconds = predicted.get<double>();
    if (!(st.predicted_seconds >= 0) || !std::isfinite(st.predicted_seconds))
      throw ValidationError("plan.stats.predicted_seconds", "must be a finite number >= 0");
    st.search_truncated =
        flag_at(member(s, "search_truncated", "plan.stats"), "plan.stats.search_truncated");
    // Bounded before anything proportional to the ops (validate() is near linear in them).
    const json& o = array_at(member(j, "ops", "plan"), "plan.ops");
    check_limit("plan.ops", static_cast<std::int64_t>(o.size()), limits().plan_ops, "PLAN_OPS");
    std::vector<Op> ops;
    ops.reserve(o.size());
    for (std::size_t i = 0; i < o.size(); ++i)
      ops.push_back(op_from(o[i], at_index("plan.ops", i)));
    Plan p(src, dst, strategy, balance, std::move(topology), std::move(ops), std::move(st));
    p.validate();
    return p;
  } catch (const json::exception& e) {
    throw ParseError("plan", std::string("invalid plan JSON: ") + e.what());
  }
}

void Plan::validate() const { detail::check_plan(*this); }

std::string Plan::str(std::size_t max_ops) const {
  std::ostringstream os;
  os << "plan " << shape_str(src_.shape()) << ' ' << to_string(src_.dtype()) << "  " << src_.str()
     << " -> " << dst_.str() << '\n'
     << "  strategy " << to_string(strategy_) << ", balance " << to_string(balance_)
     << ", topology " << topology_ << ", " << ops_.size() << " ops in " << phases() << " phase(s)\n"
     << "  bytes moved " << stats_.bytes_moved << " (intra-host " << stats_.bytes_intra_host
     << ", network " << stats_.bytes_network << "), local copies " << stats_.bytes_local << '\n'
     << "  predicted " << std::setprecision(4) << stats_.predicted_seconds * 1e3 << " ms"
     << (stats_.search_truncated ? " (search cut short by its time cap)" : "") << '\n';
  for (std::size_t i = 0; i < ops_.size() && i < max_ops; ++i) {
    const Op& op = ops_[i];
    os << "  [" << op.phase << "] " << std::left << std::setw(9) << to_string(op.kind) << ' '
       << op.box.str() << ' ';
    switch (op.kind) {
      case OpKind::Copy:
      case OpKind::Zero:
        os << "on " << op.root;
        break;
      case OpKind::Multicast:
        os << op.root << (op.from_dst ? "(dst)" : "") << " -> ";
        for (std::size_t k = 0; k < op.peers.size(); ++k) os << (k ? "," : "") << op.peers[k];
        break;
      case OpKind::Reduce:
        for (std::size_t k = 0; k < op.peers.size(); ++k) os << (k ? "+" : "") << op.peers[k];
        os << " -> " << op.root;
        break;
    }
    os << '\n';
  }
  if (ops_.size() > max_ops) os << "  ... " << ops_.size() - max_ops << " more ops\n";
  return os.str();
}

}  // namespace meshcast
