// `meshcast simulate` and the "cost" object of `plan --json`: what a plan costs on a topology
// by the analytic model, the link bound and the discrete-event simulator (meshcast/cost.h).
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <streambuf>
#include <string_view>

#include "cli.h"
#include "lib/support/text.h"
#include "meshcast/cost.h"
#include "meshcast/error.h"

namespace meshcast::cli {
namespace {

// Links listed in the text report.
constexpr std::size_t kTopLinks = 8;

// Every link that carries bytes, streamed: a broadcast to n devices has a few links per device,
// and a JSON tree of them took several times the plan's own memory (the planner's estimate).
void write_links_json(std::ostream& os, const std::vector<LinkLoad>& links) {
  os << '[';
  for (std::size_t i = 0; i < links.size(); ++i) {
    const LinkLoad& l = links[i];
    os << (i == 0 ? "{" : ",{") << "\"bytes\":" << l.bytes << ",\"class\":\""
       << (l.network ? "network" : "intra") << "\",\"link\":" << nlohmann::json(l.name).dump()
       << ",\"seconds\":" << nlohmann::json(l.seconds).dump() << '}';
  }
  os << ']';
}

// Passes all but the first character on: the plan document without its opening brace, to
// follow the members written before it in one object.
class SkipFirst : public std::streambuf {
 public:
  explicit SkipFirst(std::streambuf* out) : out_(out) {}

 protected:
  int_type overflow(int_type c) override {
    if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
    if (!skipped_) {
      skipped_ = true;
      return c;
    }
    return out_->sputc(traits_type::to_char_type(c));
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    if (n > 0 && !skipped_) {
      skipped_ = true;
      return out_->sputn(s + 1, n - 1) == n - 1 ? n : 0;
    }
    return out_->sputn(s, n);
  }
  int sync() override { return out_->pubsync(); }

 private:
  std::streambuf* out_;
  bool skipped_ = false;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void write_plan_json_with_cost(std::ostream& os, const Plan& plan, const Topology& topology,
                               std::int64_t chunk) {
  const Prediction p = predict(plan, topology, chunk);
  const nlohmann::json cost = {
      {"chunk_bytes", chunk}, {"predicted_seconds", p.seconds}, {"bound_seconds", p.bound_seconds}};
  // The "cost" member opens the object; the plan's own members follow, streamed.
  const std::string head = cost.dump();
  os << "{\"cost\":" << std::string_view(head).substr(0, head.size() - 1) << ",\"links\":";
  write_links_json(os, p.links);
  os << "},";
  SkipFirst rest(os.rdbuf());
  std::ostream tail(&rest);
  plan.write_json(tail);
  tail.flush();
  os << '\n' << std::flush;
  if (!os || !tail)
    throw IoError("json", std::string("cannot write the plan: ") + std::strerror(errno));
}

int run_simulate(const PlanArgs& args) {
  check_writable(args.svg, "svg");
  Topology topology;
  const auto t0 = std::chrono::steady_clock::now();
  const Plan plan = make_plan(args, &topology);
  const double plan_seconds = seconds_since(t0);
  const std::int64_t chunk = parse_chunk(args.chunk);
  const auto t1 = std::chrono::steady_clock::now();
  const Simulation sim = simulate(plan, topology, chunk);
  const double sim_seconds = seconds_since(t1);
  // After the simulation, which may be refused (simulate work): a refused run leaves the file.
  if (!args.svg.empty()) write_file(args.svg, plan_svg(plan, topology), "svg");
  const Prediction model = predict(plan, topology, chunk);
  const double bytes = static_cast<double>(plan.src().bytes());
  const double effective = sim.seconds > 0 ? bytes / sim.seconds : 0;
  std::optional<RankPart> part;
  if (!args.rank.empty()) part = make_rank_plan(args);
  if (args.json) {
    nlohmann::json j;
    j["src"] = plan.src().str();
    j["dst"] = plan.dst().str();
    j["shape"] = plan.src().shape();
    j["dtype"] = to_string(plan.src().dtype());
    j["topology"] = plan.topology();
    j["strategy"] = to_string(plan.strategy());
    j["balance"] = to_string(plan.balance());
    j["ops"] = plan.ops().size();
    j["devices"] = plan.devices().size();
    j["tensor_bytes"] = plan.src().bytes();
    j["bytes_moved"] = plan.stats().bytes_moved;
    j["bytes_network"] = plan.stats().bytes_network;
    j["chunk_bytes"] = chunk;
    j["predicted_seconds"] = model.seconds;
    j["simulated_seconds"] = sim.seconds;
    j["bound_seconds"] = model.bound_seconds;
    j["effective_gbps"] = sim.seconds > 0 ? nlohmann::json(effective / 1e9) : nlohmann::json();
    j["events"] = sim.events;
    j["plan_cpu_seconds"] = plan_seconds;
    j["simulate_cpu_seconds"] = sim_seconds;
    if (part) {
      j["rank"] = part->plan.device();
      j["rank_ops"] = part->plan.ops().size();
      j["rank_plan_cpu_seconds"] = part->seconds;
    }
    const std::string head = j.dump();  // then the links, streamed
    std::cout << std::string_view(head).substr(0, head.size() - 1) << ",\"links\":";
    write_links_json(std::cout, sim.links);
    std::cout << "}\n";
    return 0;
  }
  std::cout << "simulate " << shape_str(plan.src().shape()) << ' ' << to_string(plan.src().dtype())
            << " (" << human_bytes(plan.src().bytes()) << ") " << plan.src().str() << " -> "
            << plan.dst().str() << '\n'
            << "  on " << topology.name() << ": strategy " << to_string(plan.strategy())
            << ", balance " << to_string(plan.balance()) << ", "
            << detail::counted(static_cast<std::int64_t>(plan.ops().size()), "op") << " in "
            << detail::counted(plan.phases(), "phase") << " over "
            << detail::counted(static_cast<std::int64_t>(plan.devices().size()), "device")
            << ", chain chunk " << human_bytes(chunk) << '\n'
            << "  model      " << human_seconds(model.seconds)
            << "  (analytic, phase by phase: what plan() predicts)\n"
            << "  simulated  " << human_seconds(sim.seconds)
            << "  (discrete events, contended links shared fairly; " << sim.events
            << " rate updates)\n"
            << "  link bound " << human_seconds(model.bound_seconds) << "  (busiest link"
            << (model.links.empty() ? std::string() : ": " + model.links.front().name) << ")\n"
            << "  effective  " << human_rate(effective) << "  (tensor bytes / simulated time)\n"
            << "  took       " << human_seconds(plan_seconds) << " to plan, "
            << human_seconds(sim_seconds) << " to simulate\n";
  if (part)
    std::cout << "  device " << part->plan.device() << " alone: "
              << detail::counted(static_cast<std::int64_t>(part->plan.ops().size()), "op")
              << " of its own, computed in " << human_seconds(part->seconds)
              << " (no whole plan built; balance " << to_string(part->plan.balance()) << ")\n";
  if (!sim.links.empty()) std::cout << "  busiest links (bytes, least time):\n";
  for (std::size_t i = 0; i < sim.links.size() && i < kTopLinks; ++i) {
    const LinkLoad& l = sim.links[i];
    char line[160];
    std::snprintf(line, sizeof line, "    %-28s %-8s %12s %12s\n", l.name.c_str(),
                  l.network ? "network" : "intra", human_bytes(l.bytes).c_str(),
                  human_seconds(l.seconds).c_str());
    std::cout << line;
  }
  if (sim.links.size() > kTopLinks)
    std::cout << "    ... " << sim.links.size() - kTopLinks << " more (--json lists all)\n";
  if (!args.svg.empty()) std::cout << "plan drawn in " << args.svg << '\n';
  return 0;
}

}  // namespace meshcast::cli
