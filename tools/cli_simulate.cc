// `meshcast simulate` and the "cost" object of `plan --json`: what a plan costs on a topology
// by the analytic model, the link bound and the discrete-event simulator (meshcast/cost.h).
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "meshcast/cost.h"

namespace meshcast::cli {
namespace {

// Links listed in the text report.
constexpr std::size_t kTopLinks = 8;

nlohmann::json links_json(const std::vector<LinkLoad>& links) {
  nlohmann::json out = nlohmann::json::array();
  for (const LinkLoad& l : links)
    out.push_back({{"link", l.name},
                   {"class", l.network ? "network" : "intra"},
                   {"bytes", l.bytes},
                   {"seconds", l.seconds}});
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::string plan_json_with_cost(const Plan& plan, const Topology& topology, std::int64_t chunk) {
  const Prediction p = predict(plan, topology, chunk);
  nlohmann::json j = nlohmann::json::parse(plan.to_json());
  j["cost"] = {{"chunk_bytes", chunk},
               {"predicted_seconds", p.seconds},
               {"bound_seconds", p.bound_seconds},
               {"links", links_json(p.links)}};
  return j.dump();
}

int run_simulate(const PlanArgs& args) {
  Topology topology;
  const auto t0 = std::chrono::steady_clock::now();
  const Plan plan = make_plan(args, &topology);
  const double plan_seconds = seconds_since(t0);
  const std::int64_t chunk = parse_chunk(args.chunk);
  const auto t1 = std::chrono::steady_clock::now();
  const Simulation sim = simulate(plan, topology, chunk);
  const double sim_seconds = seconds_since(t1);
  const Prediction model = predict(plan, topology, chunk);
  const double bytes = static_cast<double>(plan.src().bytes());
  const double effective = sim.seconds > 0 ? bytes / sim.seconds : 0;
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
    j["effective_gbps"] = effective / 1e9;
    j["events"] = sim.events;
    j["plan_cpu_seconds"] = plan_seconds;
    j["simulate_cpu_seconds"] = sim_seconds;
    j["links"] = links_json(sim.links);
    std::cout << j.dump() << '\n';
    return 0;
  }
  std::cout << "simulate " << shape_str(plan.src().shape()) << ' ' << to_string(plan.src().dtype())
            << " (" << human_bytes(plan.src().bytes()) << ") " << plan.src().str() << " -> "
            << plan.dst().str() << '\n'
            << "  on " << topology.name() << ": strategy " << to_string(plan.strategy())
            << ", balance " << to_string(plan.balance()) << ", " << plan.ops().size() << " ops in "
            << plan.phases() << " phase(s) over " << plan.devices().size()
            << " devices, chain chunk " << human_bytes(chunk) << '\n'
            << "  model      " << human_seconds(model.seconds)
            << "  (list schedule: what plan() predicts)\n"
            << "  simulated  " << human_seconds(sim.seconds)
            << "  (discrete events, contended links shared fairly; " << sim.events
            << " rate updates)\n"
            << "  link bound " << human_seconds(model.bound_seconds) << "  (busiest link"
            << (model.links.empty() ? std::string() : ": " + model.links.front().name) << ")\n"
            << "  effective  " << human_rate(effective) << "  (tensor bytes / simulated time)\n"
            << "  took       " << human_seconds(plan_seconds) << " to plan, "
            << human_seconds(sim_seconds) << " to simulate\n";
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
  return 0;
}

}  // namespace meshcast::cli
