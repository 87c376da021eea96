// `meshcast demo`: the quick start. Two cases of the paper's microbenchmark on its cluster
// (AWS p3.8xlarge: 8 hosts of 4 GPUs, one 10 Gbit/s link per host), planned, run on the
// in-process backend with every element checked, and compared against send/recv by the bytes
// that cross hosts.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "cli.h"

namespace meshcast::cli {
namespace {

struct DemoCase {
  const char* title;
  const char* src;
  const char* dst;
};

// 256 x 256 x 64 f32 = 16 MiB. Each destination tile is replicated over the 4 devices of a
// host: send/recv ships one copy per receiver across the network, a broadcast one per host.
constexpr const char* kShape = "256,256,64";
constexpr const char* kDType = "f32";
constexpr DemoCase kCases[] = {
    {"1-to-m: one device to two hosts", "1@0:RRR", "2x4@4-11:S0RR"},
    {"n-to-m: two hosts to two other hosts", "2x4@0-7:S0S1R", "2x4@8-15:RS0R"},
};

// "4.00x as many bytes as broadcast".
std::string ratio(std::int64_t sendrecv, std::int64_t broadcast) {
  if (broadcast == 0) return sendrecv == 0 ? "none either" : "some, broadcast none";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2fx as many bytes as broadcast",
                static_cast<double>(sendrecv) / static_cast<double>(broadcast));
  return buf;
}

std::string gbit(double bytes_per_second) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g Gbit/s", bytes_per_second * 8 / 1e9);
  return buf;
}

}  // namespace

int run_demo(const DemoArgs& args) {
  const int iters = parse_iters(args.iters);
  const Topology topology =
      args.topology.empty() ? builtin_aws_p3() : Topology::resolve(args.topology);
  const Shape shape = parse_shape(kShape);
  const DType dtype = parse_dtype(kDType);
  // Every case planned before any runs, so that what the iterations move (each the plans' bytes
  // moved and copied) is bounded before work starts.
  std::vector<Plan> plans;
  double bytes = 0, transfers = 0;
  std::int64_t threads = 0;
  for (const DemoCase& c : kCases) {
    const Layout src = Layout::parse(shape, dtype, c.src, "src");
    const Layout dst = Layout::parse(shape, dtype, c.dst, "dst");
    check_local_capacity(src, dst);
    plans.push_back(plan(src, dst, topology));
    bytes +=
        static_cast<double>(plans.back().stats().bytes_moved + plans.back().stats().bytes_local);
    transfers += static_cast<double>(plans.back().ops().size());
    threads = std::max(threads, static_cast<std::int64_t>(plans.back().devices().size()));
  }
  check_run(iters, bytes, transfers, threads);

  std::cout << "meshcast demo: cross-mesh resharding on the in-process backend (one thread per "
               "device)\n"
            << "topology " << topology.name() << ": " << topology.hosts() << " hosts, "
            << topology.device_count() << " devices, intra-host "
            << human_rate(topology.intra().bandwidth) << ", network "
            << human_rate(topology.network().bandwidth) << " ("
            << gbit(topology.network().bandwidth) << ") per host\n";

  bool all_ok = true;
  int n = 0;
  for (const DemoCase& c : kCases) {
    const Plan& chosen = plans[static_cast<std::size_t>(n++)];
    const Layout &src = chosen.src(), &dst = chosen.dst();
    std::cout << "\n== case " << n << " (" << c.title << "): " << kShape << ' ' << kDType << " ("
              << human_bytes(src.bytes()) << ") from " << src.str() << " to " << dst.str() << '\n';
    std::cout << chosen.str(8);
    const LocalRun r = run_local(chosen, iters, true);
    const double seconds = median(r.seconds);
    const bool ok = r.mismatches == 0;
    all_ok = all_ok && ok;
    std::cout << "run: " << (ok ? "verified" : "NOT VERIFIED") << ", " << r.mismatches
              << " mismatches; median " << human_seconds(seconds) << " over " << iters
              << " iterations, effective "
              << human_rate(seconds > 0 ? static_cast<double>(src.bytes()) / seconds : 0)
              << " (on this machine's threads, not the modelled cluster)\n";

    PlanOptions bcast, p2p;
    bcast.strategy = Strategy::Broadcast;
    p2p.strategy = Strategy::SendRecv;
    const std::int64_t b = plan(src, dst, topology, bcast).stats().bytes_network;
    const std::int64_t s = plan(src, dst, topology, p2p).stats().bytes_network;
    std::cout << "bytes crossing hosts: broadcast " << human_bytes(b) << ", sendrecv "
              << human_bytes(s) << ": send/recv sends " << ratio(s, b) << '\n';
  }
  std::cout << '\n'
            << (all_ok ? "all cases verified" : "VERIFICATION FAILED") << '\n'
            << "next: meshcast plan --help, meshcast reshard --help, meshes/*.json\n";
  return all_ok ? 0 : 1;
}

}  // namespace meshcast::cli
