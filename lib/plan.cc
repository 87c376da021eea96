// The Plan value: naming, JSON round trip and the readable print.
#include "meshcast/plan.h"

#include <algorithm>
#include <iomanip>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "meshcast/error.h"
#include "text.h"

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
  if (!j.is_array()) throw ParseError(field, "expected an array of integers");
  std::vector<T> v;
  for (const auto& x : j) v.push_back(integer<T>(x, field));
  return v;
}

// {"3": 1024, ...}: per-device byte counts.
std::map<int, std::int64_t> per_device(const json& j, const std::string& field) {
  std::map<int, std::int64_t> m;
  for (const auto& [k, v] : j.items())
    m[static_cast<int>(detail::parse_uint(k, std::numeric_limits<int>::max(), field,
                                          "device id"))] = integer<std::int64_t>(v, field);
  return m;
}

json box_json(const Box& b) {
  json a = json::array();
  for (const Range& r : b.ranges()) a.push_back({r.lo, r.hi});
  return a;
}

Box box_from(const json& j, const std::string& field) {
  std::vector<Range> r;
  for (const auto& x : j.at("box"))
    r.push_back({integer<std::int64_t>(x.at(0), field), integer<std::int64_t>(x.at(1), field)});
  return Box(std::move(r));
}

json layout_json(const Layout& l) {
  return {{"shape", l.shape()}, {"dtype", to_string(l.dtype())}, {"layout", l.str()}};
}

Layout layout_from(const json& j, const std::string& field) {
  return Layout::parse(integers<std::int64_t>(j.at("shape"), field + ".shape"),
                       parse_dtype(j.at("dtype").get<std::string>(), field + ".dtype"),
                       j.at("layout").get<std::string>(), field);
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
    const json j = json::parse(text);
    std::vector<Op> ops;
    for (const auto& o : j.at("ops"))
      ops.push_back({value_of(kOpKinds, o.at("kind").get<std::string>(), "plan.ops.kind"),
                     integer<int>(o.at("phase"), "plan.ops.phase"), box_from(o, "plan.ops.box"),
                     integer<int>(o.at("root"), "plan.ops.root"),
                     integers<int>(o.at("peers"), "plan.ops.peers"), o.at("from_dst").get<bool>()});
    const json& s = j.at("stats");
    PlanStats st;
    st.bytes_moved = integer<std::int64_t>(s.at("bytes_moved"), "plan.stats.bytes_moved");
    st.bytes_local = integer<std::int64_t>(s.at("bytes_local"), "plan.stats.bytes_local");
    st.bytes_intra_host =
        integer<std::int64_t>(s.at("bytes_intra_host"), "plan.stats.bytes_intra_host");
    st.bytes_network = integer<std::int64_t>(s.at("bytes_network"), "plan.stats.bytes_network");
    st.sent = per_device(s.at("sent"), "plan.stats.sent");
    st.received = per_device(s.at("received"), "plan.stats.received");
    st.predicted_seconds = s.at("predicted_seconds").get<double>();
    st.search_truncated = s.at("search_truncated").get<bool>();
    Plan p(layout_from(j.at("src"), "plan.src"), layout_from(j.at("dst"), "plan.dst"),
           value_of(kStrategies, j.at("strategy").get<std::string>(), "plan.strategy"),
           value_of(kBalances, j.at("balance").get<std::string>(), "plan.balance"),
           j.at("topology").get<std::string>(), std::move(ops), std::move(st));
    p.validate();
    return p;
  } catch (const json::exception& e) {
    throw ParseError("plan", std::string("invalid plan JSON: ") + e.what());
  }
}

void Plan::validate() const {
  const auto devs = devices();
  auto known = [&](int d) { return std::binary_search(devs.begin(), devs.end(), d); };
  for (std::size_t i = 0; i < ops_.size(); ++i) {
    const Op& op = ops_[i];
    const std::string field = "plan.ops[" + std::to_string(i) + "]";
    if (op.box.rank() != src_.rank())
      throw ValidationError(field + ".box", "rank differs from the tensor's");
    if (!Box::whole(src_.shape()).contains(op.box))
      throw ValidationError(field + ".box", op.box.str() + " lies outside the tensor");
    if (op.phase < 0) throw ValidationError(field + ".phase", "negative phase");
    if (!known(op.root)) throw ValidationError(field + ".root", "device not in either mesh");
    for (int p : op.peers)
      if (!known(p)) throw ValidationError(field + ".peers", "device not in either mesh");
  }
}

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
