// Helpers shared by the subcommands of `meshcast`: option parsing, capacity checks, formatting.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "cli.h"
#include "meshcast/error.h"

namespace meshcast::cli {
namespace {

// The in-process backend runs one thread per device.
constexpr std::size_t kMaxLocalDevices = 1024;
constexpr int kMaxLocalDeviceId = 65535;
// Share of the machine's memory that the local backend's buffers may take.
constexpr double kMemoryShare = 0.75;
constexpr int kMaxIters = 1000000;

std::string printable(const std::string& s) {
  std::string out;
  for (char c : s.substr(0, 64)) out += (c >= 32 && c < 127) ? c : '?';
  return out + (s.size() > 64 ? "..." : "");
}

// An integer in [lo, hi]; throws ValidationError(field) naming what is wrong.
std::int64_t parse_int_in(const std::string& text, const std::string& field, std::int64_t lo,
                          std::int64_t hi) {
  std::int64_t n = 0;
  const char* end = text.data() + text.size();
  const auto [p, ec] = std::from_chars(text.data(), end, n);
  if (ec != std::errc() || p != end || text.empty())
    throw ValidationError(field, "expected a positive integer, got '" + printable(text) + "'");
  if (n < lo)
    throw ValidationError(field, "must be >= " + std::to_string(lo) + " (got " + text + ")");
  if (n > hi)
    throw ValidationError(field, "must be <= " + std::to_string(hi) + " (got " + text + ")");
  return n;
}

}  // namespace

Plan make_plan(const PlanArgs& args, Topology* topology_out) {
  PlanOptions options;
  options.strategy = parse_strategy(args.strategy, "strategy");
  options.balance = parse_balance(args.balance, "balance");
  options.chunk_bytes = parse_chunk(args.chunk);
  const Shape shape = parse_shape(args.shape, "shape");
  const DType dtype = parse_dtype(args.dtype, "dtype");
  const Layout src = Layout::parse(shape, dtype, args.src, "src");
  const Layout dst = Layout::parse(shape, dtype, args.dst, "dst");
  const Topology topology =
      args.topology.empty() ? Topology::single_host() : Topology::load(args.topology);
  Plan p = plan(src, dst, topology, options);
  if (topology_out) *topology_out = topology;
  return p;
}

std::int64_t parse_chunk(const std::string& text) {
  return parse_int_in(text, "chunk-bytes", 1, std::int64_t{1} << 30);
}

int parse_iters(const std::string& text) {
  return static_cast<int>(parse_int_in(text, "iters", 1, kMaxIters));
}

void check_backend(const std::string& backend) {
  if (backend == "local") return;
#ifdef MESHCAST_HAS_MPI
  if (backend == "mpi") return;
#endif
#ifdef MESHCAST_HAS_UCX
  if (backend == "ucx") return;
#endif
#ifdef MESHCAST_HAS_NCCL
  if (backend == "nccl") return;
#endif
  if (backend == "mpi" || backend == "ucx" || backend == "nccl")
    throw ValidationError("backend", backend + " is not built into this meshcast");
  throw ValidationError(
      "backend", "unknown backend '" + printable(backend) + "' (expected local, mpi, ucx or nccl)");
}

void check_local_capacity(const Plan& plan) {
  const std::vector<int> devices = plan.devices();
  if (devices.size() > kMaxLocalDevices || (!devices.empty() && devices.back() > kMaxLocalDeviceId))
    throw ValidationError(
        "backend", "the local backend runs one thread per device: at most " +
                       std::to_string(kMaxLocalDevices) +
                       " devices with ids <= " + std::to_string(kMaxLocalDeviceId) + " (got " +
                       std::to_string(devices.size()) + " devices, largest id " +
                       std::to_string(devices.back()) + ")");
  // Every device holds its source and destination tiles (sums in double: no overflow).
  double need = 0;
  const double elem = static_cast<double>(dtype_size(plan.src().dtype()));
  for (const Layout* l : {&plan.src(), &plan.dst()})
    for (std::int64_t i = 0; i < l->mesh().size(); ++i)
      need += static_cast<double>(l->tile_at(i).volume()) * elem;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return;
  const double have = static_cast<double>(pages) * static_cast<double>(page);
  if (need > kMemoryShare * have)
    throw ValidationError(
        "shape", "the local backend needs " +
                     human_bytes(static_cast<std::int64_t>(std::min(need, 9.2e18))) +
                     " of tile buffers, more than " +
                     std::to_string(static_cast<int>(kMemoryShare * 100)) + "% of this machine's " +
                     human_bytes(static_cast<std::int64_t>(have)) + " memory");
}

void write_file(const std::string& path, const std::string& text, const std::string& field) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw IoError(field, "cannot write " + path + ": " + std::strerror(errno));
  out << text;
  out.flush();
  if (!out) throw IoError(field, "cannot write " + path + ": " + std::strerror(errno));
}

Topology builtin_aws_p3() {
  // Keep in step with meshes/aws-p3.8xlarge.json (tests/tools/cli_test.sh compares them).
  return Topology::uniform("aws-p3.8xlarge", 8, 4, LinkClass{"intra", 50e9, 5e-6},
                           LinkClass{"network", 10e9 / 8, 30e-6});
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace meshcast::cli
