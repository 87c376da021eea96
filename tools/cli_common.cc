// Helpers shared by the subcommands of `meshcast`: option parsing, capacity checks, formatting.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <limits>
#include <new>
#include <thread>
#include <tuple>

#include "cli.h"
#include "lib/support/saturated.h"
#include "lib/support/text.h"
#include "meshcast/error.h"
#include "meshcast/limits.h"
#ifdef MESHCAST_HAS_NCCL
#include "meshcast/nccl.h"
#endif

namespace meshcast::cli {
namespace {

// The in-process backend runs one thread per device.
constexpr int kMaxLocalDeviceId = 65535;
constexpr int kMaxIters = 1000000;

// An integer in [lo, hi]; throws ValidationError(field) naming what is wrong.
std::int64_t parse_int_in(const std::string& text, const std::string& field, std::int64_t lo,
                          std::int64_t hi) {
  std::int64_t n = 0;
  const char* end = text.data() + text.size();
  const auto [p, ec] = std::from_chars(text.data(), end, n);
  if (ec != std::errc() || p != end || text.empty())
    throw ValidationError(field, "expected a positive integer, got " + detail::quote(text));
  if (n < lo)
    throw ValidationError(field, "must be >= " + std::to_string(lo) + " (got " + text + ")");
  if (n > hi)
    throw ValidationError(field, "must be <= " + std::to_string(hi) + " (got " + text + ")");
  return n;
}

}  // namespace

PlanInputs parse_plan_inputs(const PlanArgs& args) {
  PlanOptions options;
  options.strategy = parse_strategy(args.strategy, "strategy");
  options.balance = parse_balance(args.balance, "balance");
  options.chunk_bytes = parse_chunk(args.chunk);
  const Shape shape = parse_shape(args.shape, "shape");
  const DType dtype = parse_dtype(args.dtype, "dtype");
  return PlanInputs{Layout::parse(shape, dtype, args.src, "src"),
                    Layout::parse(shape, dtype, args.dst, "dst"), load_topology(args.topology),
                    options};
}

bool is_auto_topology(const std::string& text, std::string* preset) {
  if (text != "auto" && text.rfind("auto:", 0) != 0) return false;
  if (preset) *preset = text.size() > 5 ? text.substr(5) : std::string();
  return true;
}

Topology load_topology(const std::string& text) {
  if (text.empty()) return Topology::single_host();
  std::string preset;
  if (!is_auto_topology(text, &preset)) return Topology::resolve(text);
  if (text == "auto:") throw ValidationError("topology", "auto: needs a preset name after ':'");
  // Without a job to ask, every device is in this process, on this host; a preset is still
  // checked, so that a typo shows before any process backend starts.
  if (!preset.empty()) (void)Topology::resolve(preset);
  return Topology::single_host();
}

Plan make_plan(const PlanArgs& args, Topology* topology_out) {
  const PlanInputs in = parse_plan_inputs(args);
  Plan p = plan(in.src, in.dst, in.topology, in.options);
  if (topology_out) *topology_out = in.topology;
  return p;
}

Plan load_plan_file(const PlanArgs& args) {
  Plan p = Plan::from_json(read_input_file(args.plan_file, "plan", limits().input_file_bytes));
  const auto differs = [&](const std::string& field, const std::string& given,
                           const std::string& saved) {
    throw ValidationError(field, args.plan_file + " moves " + saved + ", not " + given +
                                     " (leave --" + field + " out to run the saved plan)");
  };
  if (!args.shape.empty() && parse_shape(args.shape, "shape") != p.src().shape())
    differs("shape", args.shape, shape_str(p.src().shape()));
  if (!args.dtype.empty() && parse_dtype(args.dtype, "dtype") != p.src().dtype())
    differs("dtype", args.dtype, to_string(p.src().dtype()));
  // The shape as given: a 0-d tensor's is {} (planned as {1}).
  const Shape shape = p.src().scalar() ? Shape{} : p.src().shape();
  for (const auto& [field, text, saved] :
       {std::tuple{"src", &args.src, &p.src()}, std::tuple{"dst", &args.dst, &p.dst()}})
    if (!text->empty() && Layout::parse(shape, p.src().dtype(), *text, field) != *saved)
      differs(field, *text, saved->str());
  // A saved plan's senders and ops are fixed: options that would choose them again are refused.
  const auto fixed = [&](const std::string& field, const std::string& saved) {
    throw ValidationError(field, "the saved plan " + args.plan_file + " was made with " + field +
                                     " " + saved + "; leave --" + field + " out to run it");
  };
  // The same topology again is no change (a plan names its topology, by name).
  if (!args.topology.empty() && (is_auto_topology(args.topology, nullptr) ||
                                 Topology::resolve(args.topology).name() != p.topology()))
    fixed("topology", p.topology());
  if (args.strategy != "auto" && parse_strategy(args.strategy, "strategy") != p.strategy())
    fixed("strategy", to_string(p.strategy()));
  if (args.balance != "search" && parse_balance(args.balance, "balance") != p.balance())
    fixed("balance", to_string(p.balance()));
  return p;
}

RankPart make_rank_plan(const PlanArgs& args) {
  const PlanInputs in = parse_plan_inputs(args);
  const int device =
      static_cast<int>(parse_int_in(args.rank, "rank", 0, std::numeric_limits<int>::max()));
  const auto t0 = std::chrono::steady_clock::now();
  RankPlan p = plan_rank(in.src, in.dst, device, in.topology, in.options);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {std::move(p), seconds};
}

std::int64_t parse_chunk(const std::string& text) {
  return parse_int_in(text, "chunk-bytes", 1, std::int64_t{1} << 30);
}

int parse_iters(const std::string& text) {
  return static_cast<int>(parse_int_in(text, "iters", 1, kMaxIters));
}

namespace {
// "1.5", "128": a count as few digits show it (3 significant).
std::string shortest(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}
}  // namespace

void check_run(int iters, double bytes, double transfers, std::int64_t local_threads) {
  const double runs = iters + 1.0;  // (no overflow: iters <= kMaxIters)
  // The warm-up counts: it moves what an iteration does.
  const std::string counted =
      std::to_string(iters) + " iteration" + (iters == 1 ? "" : "s") + " and the warm-up, each of ";
  if (runs * bytes > static_cast<double>(limits().run_bytes))
    throw ValidationError("run bytes", counted + human_bytes(detail::saturated_int64(bytes)) +
                                           ", exceed the limit of " +
                                           human_bytes(limits().run_bytes) +
                                           " (raise it with MESHCAST_MAX_RUN_BYTES)");
  // The in-process backend's device threads take turns on the cores: past 4 a core, a transfer
  // waits for its threads' turns (measured on 2 cores: 13 us a transfer with 128 threads, 80 us
  // with 1,024, against a few alone), so it counts as threads / (4 x cores) transfers.
  const auto cores = static_cast<double>(std::max(1u, std::thread::hardware_concurrency()));
  const double weight = std::max(1.0, static_cast<double>(local_threads) / (4 * cores));
  if (runs * transfers * weight > static_cast<double>(limits().run_transfers))
    throw ValidationError("run transfers",
                          counted + std::to_string(detail::saturated_int64(transfers)) +
                              " transfers" +
                              (weight > 1 ? " (each counted " + shortest(weight) +
                                                " times: " + std::to_string(local_threads) +
                                                " device threads on " + shortest(cores) + " cores)"
                                          : std::string()) +
                              ", exceed the limit of " + std::to_string(limits().run_transfers) +
                              " (raise it with MESHCAST_MAX_RUN_TRANSFERS)");
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
  throw ValidationError("backend", "unknown backend " + detail::quote(backend) +
                                       " (expected local, mpi, ucx or nccl)");
}

void exec_nccl_program([[maybe_unused]] char** argv) {
#ifdef MESHCAST_NCCL_PROGRAM
  std::string self(4096, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", self.data(), self.size() - 1);
  self.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  const std::string program =
      self.substr(0, self.rfind('/') + 1) + std::string(MESHCAST_NCCL_PROGRAM);
  std::cout.flush();
  ::execv(program.c_str(), argv);
  throw ValidationError("backend", "nccl runs in " + program +
                                       " (this program links no CUDA), which cannot be started: " +
                                       std::strerror(errno));
#endif
}

void* RankBuffers::place(std::vector<std::byte>& host) {
  if (host.empty()) return nullptr;
#ifdef MESHCAST_HAS_NCCL
  if (gpu_) {
    void* copy = gpu_memory_.emplace_back(gpu_->allocate(host.size())).get();
    gpu_->upload(host.data(), copy, host.size());
    return copy;
  }
#endif
  return host.data();
}

void RankBuffers::fetch([[maybe_unused]] const void* placed,
                        [[maybe_unused]] std::vector<std::byte>& host) {
#ifdef MESHCAST_HAS_NCCL
  if (gpu_ && !host.empty()) gpu_->download(placed, host.data(), host.size());
#endif
}

void* RankBuffers::scratch(std::size_t bytes) {
#ifdef MESHCAST_HAS_NCCL
  if (gpu_) {
    return gpu_memory_.emplace_back(gpu_->allocate(bytes)).get();
  }
#endif
  return host_scratch_.emplace_back(bytes).data();
}

void check_local_capacity(const Layout& src, const Layout& dst) {
  check_local_capacity(std::vector<const Layout*>{&src, &dst}, "shape");
}

void check_local_capacity(const std::vector<const Layout*>& layouts, const std::string& field,
                          const std::function<std::string(std::size_t)>& name, double scratch) {
  // The union of the meshes' devices (when one mesh alone is over the bound, its size).
  const std::int64_t bound = limits().local_threads;
  std::int64_t largest = 0, biggest_mesh = 0;
  bool small = true;
  for (const Layout* l : layouts) {
    for (int d : l->mesh().devices()) largest = std::max<std::int64_t>(largest, d);
    biggest_mesh = std::max(biggest_mesh, l->mesh().size());
    small = small && l->mesh().size() <= bound;
  }
  std::vector<int> devices;
  if (small) {
    for (const Layout* l : layouts) {
      devices.insert(devices.end(), l->mesh().devices().begin(), l->mesh().devices().end());
      std::sort(devices.begin(), devices.end());
      devices.erase(std::unique(devices.begin(), devices.end()), devices.end());
    }
  }
  const std::int64_t count =
      devices.empty() ? biggest_mesh : static_cast<std::int64_t>(devices.size());
  check_limit("local devices", count, bound, "LOCAL_THREADS");
  if (largest > kMaxLocalDeviceId)
    throw ValidationError("backend", "the local backend runs one thread per device id up to " +
                                         std::to_string(kMaxLocalDeviceId) + " (largest id " +
                                         std::to_string(largest) + ")");
  // Every device holds its tiles, and the scratch (sums in double: no overflow).
  double need = scratch, most = scratch > 0 ? scratch : -1;
  std::size_t biggest = layouts.size();  // the layout whose tiles take the most (or the scratch)
  for (std::size_t k = 0; k < layouts.size(); ++k) {
    const Layout* l = layouts[k];
    const double elem = static_cast<double>(dtype_size(l->dtype()));
    double bytes = 0;
    for (std::int64_t i = 0; i < l->mesh().size(); ++i)
      bytes += static_cast<double>(l->tile_at(i).volume()) * elem;
    need += bytes;
    if (bytes > most) {
      most = bytes;
      biggest = k;
    }
  }
  if (need > static_cast<double>(limits().buffer_bytes) && name)
    throw ValidationError("buffer bytes",
                          human_bytes(detail::saturated_int64(need)) +
                              (scratch > 0 ? " of tile and scratch buffers" : " of tile buffers") +
                              " exceed the limit of " + human_bytes(limits().buffer_bytes) +
                              " (raise it with MESHCAST_MAX_BUFFER_BYTES); the largest: " +
                              name(biggest) + ", " + human_bytes(detail::saturated_int64(most)));
  check_limit("buffer bytes", detail::saturated_int64(need), limits().buffer_bytes, "BUFFER_BYTES");
  const double usable = usable_memory_bytes();
  if (usable > 0 && need > usable)
    throw ValidationError(
        field, "the local backend needs " + human_bytes(detail::saturated_int64(need)) +
                   " of tile buffers, more than " +
                   std::to_string(static_cast<int>(kMemoryShare * 100)) + "% of this machine's " +
                   human_bytes(static_cast<std::int64_t>(usable / kMemoryShare)) + " memory");
}

double usable_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return kMemoryShare * static_cast<double>(pages) * static_cast<double>(page);
}

void check_writable(const std::string& path, const std::string& field) {
  if (path.empty()) return;
  // A FIFO or a device (/dev/stdout) is not opened to check it: a FIFO's reader would take the
  // close for the end of the output, and with none the open would block.
  if (struct stat st{}; ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    if (S_ISDIR(st.st_mode)) throw IoError(field, "cannot write " + path + ": a directory");
    if (::access(path.c_str(), W_OK) != 0)
      throw IoError(field, "cannot write " + path + ": " + std::strerror(errno));
    return;
  }
  // Opened (created if need be) but not truncated: what is there survives a later failure.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT, 0666);  // less the umask
  if (fd < 0) throw IoError(field, "cannot write " + path + ": " + std::strerror(errno));
  ::close(fd);
}

void write_file(const std::string& path, const std::string& text, const std::string& field) {
  const auto fail = [&](const std::string& why) {
    return IoError(field, "cannot write " + path + ": " + why);
  };
  // Non-blocking open: a FIFO with no reader fails it (ENXIO) rather than blocking the command
  // for ever; a reader has kFifoWait to come (one started beside the command), then writes block
  // as usual while it takes them. (A socket fails it with ENXIO too: at once.)
  constexpr auto kFifoWait = std::chrono::seconds(10);
  const auto until = std::chrono::steady_clock::now() + kFifoWait;
  const auto fifo = [&] {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
  };
  int fd;
  while ((fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK | O_CLOEXEC, 0666)) <
             0 &&
         (errno == EINTR || (errno == ENXIO && fifo() && std::chrono::steady_clock::now() < until)))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (fd < 0)
    throw fail(errno == ENXIO && fifo() ? "a FIFO that no process opened for reading within " +
                                              std::to_string(kFifoWait.count()) + " s"
                                        : std::string(std::strerror(errno)));
  std::string why;
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) why = std::strerror(errno);
  for (std::size_t done = 0; why.empty() && done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      why = std::strerror(errno);
    else
      done += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0 && why.empty()) why = std::strerror(errno);
  if (!why.empty()) throw fail(why);
}

Topology builtin_aws_p3() {
  // Keep in step with meshes/aws-p3.8xlarge.json (tests/tools/cli_test.sh compares them).
  return Topology::uniform("aws-p3.8xlarge", 8, 4,
                           LinkClass{"intra", 50e9, 5e-6, {}, kDefaultIntraOverhead},
                           LinkClass{"network", 10e9 / 8, 30e-6, {}, kDefaultNetworkOverhead});
}

int exit_status(const std::exception& e) {
  const auto* error = dynamic_cast<const Error*>(&e);
  if (error == nullptr) return 1;
  switch (error->kind()) {
    case ErrorKind::BadInput:
      return 2;
    case ErrorKind::PeerFailure:
      return 3;
    case ErrorKind::Io:
      return 4;
    case ErrorKind::Internal:
      return 1;
  }
  return 1;
}

void report_error(const std::exception& e) {
  const bool known = dynamic_cast<const Error*>(&e) != nullptr;
  const bool memory = dynamic_cast<const std::bad_alloc*>(&e) != nullptr;
  const std::string line = "meshcast: " +
                           (memory  ? std::string("internal error: out of memory")
                            : known ? one_line(e.what())
                                    : "internal error: " + one_line(e.what())) +
                           "\n";
  // One write: the ranks of a job share a stderr, and their lines must not interleave.
  std::cerr.flush();
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
}

std::string one_line(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  // Other control characters (a name read from a file: an escape sequence) would reach the
  // terminal as they are.
  for (char& c : s)
    if (c == '\n' || c == '\r' || c == '\t')
      c = ' ';
    else if (static_cast<unsigned char>(c) < 32 || c == 127)
      c = '?';
  if (s.size() > kMaxMessageChars) s = s.substr(0, kMaxMessageChars - 3) + "...";
  return s;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace meshcast::cli
