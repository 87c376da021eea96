// LaunchEnv: who this process is in its job, from the variables its launcher set (MESHCAST_* by
// hand, torchrun, Open MPI's mpirun, Slurm's srun), and TcpBootstrap::from_env on top of it.
// Only the variables a field is taken from are read and checked: a stale variable of a launcher
// whose value is overridden never fails a job. Every message is one line naming the variable,
// its value quoted to at most 64 characters.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>

#include "lib/support/text.h"
#include "meshcast/bootstrap.h"
#include "meshcast/error.h"
#include "meshcast/limits.h"

namespace meshcast {
namespace {

constexpr std::size_t kMaxCommandLine = std::size_t{1} << 20;
// A Slurm job's port when no variable gives one: 10000 + (16 * job + step) mod 20000, below
// Linux's ephemeral ports (32768 and up), distinct for 16 steps of one job.
constexpr std::uint64_t kSlurmPortBase = 10000, kSlurmPorts = 20000, kSlurmSteps = 16;
// Numbers in variables: job ids and the like, well below this.
constexpr std::uint64_t kMaxId = std::uint64_t{1} << 62;

using Getenv = LaunchEnv::Getenv;

// A launcher's variables, and how messages name it.
struct Launcher {
  const char* name;  // LaunchEnv::launcher, and MESHCAST_LAUNCHER's value
  const char* rank;
  const char* size;
  const char* local_rank;
};
constexpr Launcher kTorchrun{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"};
constexpr Launcher kOpenMpi{"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                            "OMPI_COMM_WORLD_LOCAL_RANK"};
constexpr Launcher kSlurm{"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"};
constexpr Launcher kByHand{"meshcast", "MESHCAST_RANK", "MESHCAST_SIZE", "MESHCAST_LOCAL_RANK"};
// Detected in this order: the innermost launcher first (torchrun and mpirun run inside Slurm
// allocations and inherit its variables).
constexpr const Launcher* kDetected[] = {&kTorchrun, &kOpenMpi, &kSlurm};

[[noreturn]] void expected(const char* name, const std::string& what, std::string_view got) {
  throw ValidationError(name, "expected " + what + ", got " + detail::quote(got));
}

// The integer a variable holds, or nullopt (not one, or beyond long long).
std::optional<long long> integer(std::string_view s) {
  long long v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// A set variable's integer in [lo, hi], else ValidationError "expected <what>".
long long integer_in(const char* name, const char* text, long long lo, long long hi,
                     const std::string& what) {
  const auto v = integer(text);
  if (!v || *v < lo || *v > hi) expected(name, what, text);
  return *v;
}

// Which launcher's variables give rank, size and local rank.
const Launcher* pick_launcher(const Getenv& env) {
  const char* forced = env("MESHCAST_LAUNCHER");
  if (forced && *forced && std::string_view(forced) != "auto") {
    for (const Launcher* l : {&kTorchrun, &kOpenMpi, &kSlurm, &kByHand})
      if (std::string_view(forced) == l->name) return l;
    expected("MESHCAST_LAUNCHER", "auto, meshcast, torchrun, openmpi or slurm", forced);
  }
  for (const Launcher* l : kDetected)
    if (env(l->rank) || env(l->size)) return l;
  return &kByHand;
}

// The variable missing for a field of launcher `l`, explained.
[[noreturn]] void missing(const char* name, const Launcher& l, const Getenv& env) {
  if (&l == &kByHand)
    throw ValidationError(name,
                          "not set; a process started by hand needs MESHCAST_RENDEZVOUS, "
                          "MESHCAST_RANK and MESHCAST_SIZE (or a launcher's: torchrun, mpirun, "
                          "srun)");
  const char* other = std::string_view(name) == l.rank ? l.size : l.rank;
  if (env(other))
    throw ValidationError(
        name, std::string("not set, though ") + other + " is (a " + l.name + " job sets both)");
  throw ValidationError(name, std::string("not set (MESHCAST_LAUNCHER=") + l.name + ")");
}

// HOST:PORT, an IPv6 host in brackets.
void parse_host_port(const char* name, std::string_view rv, LaunchEnv& e) {
  const std::string form =
      detail::quote(rv) + " is not HOST:PORT (e.g. 127.0.0.1:29500 or [::1]:29500)";
  std::string_view host, port;
  if (!rv.empty() && rv.front() == '[') {
    const auto close = rv.find(']');
    if (close == std::string_view::npos || close + 1 >= rv.size() || rv[close + 1] != ':')
      throw ValidationError(name, form);
    host = rv.substr(1, close - 1);
    port = rv.substr(close + 2);
  } else {
    const auto colon = rv.rfind(':');
    if (colon == std::string_view::npos) throw ValidationError(name, form);
    host = rv.substr(0, colon);
    port = rv.substr(colon + 1);
  }
  const auto p = integer(port);
  if (host.empty() || !p || *p < 1 || *p > 65535) throw ValidationError(name, form);
  e.host = host;
  e.port = static_cast<int>(*p);
  e.host_from = e.port_from = name;
}

// The first host of a Slurm host list ("node[01-04,07],gpu3" -> "node01"), the whole list
// checked: hosts separated by commas, each made of name characters and bracketed lists of
// numbers and ranges (lo-hi, lo <= hi; the first host takes each bracket's first number as
// written, zeros included). nullopt when malformed.
std::optional<std::string> first_host(std::string_view list) {
  std::string first;
  bool in_first = true, empty_item = true;
  const auto name_char = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
  };
  const auto number = [](std::string_view d) -> std::optional<std::uint64_t> {
    if (d.empty() || d.size() > 18 ||
        !std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return std::nullopt;
    std::uint64_t v = 0;
    for (char c : d) v = v * 10 + static_cast<std::uint64_t>(c - '0');
    return v;
  };
  for (std::size_t i = 0; i < list.size();) {
    const char c = list[i];
    if (c == ',') {
      if (empty_item) return std::nullopt;
      in_first = false;
      empty_item = true;
      ++i;
    } else if (c == '[') {
      const auto close = list.find(']', i);
      if (close == std::string_view::npos || close == i + 1) return std::nullopt;
      const std::string_view body = list.substr(i + 1, close - i - 1);
      bool first_range = true;
      for (std::size_t at = 0; at <= body.size();) {
        const auto comma = std::min(body.find(',', at), body.size());
        const std::string_view range = body.substr(at, comma - at);
        const auto dash = range.find('-');
        const std::string_view lo = range.substr(0, dash);
        const auto a = number(lo);
        if (!a) return std::nullopt;
        if (dash != std::string_view::npos) {
          const auto b = number(range.substr(dash + 1));
          if (!b || *b < *a) return std::nullopt;
        }
        if (in_first && first_range) first += lo;
        first_range = false;
        at = comma + 1;
      }
      empty_item = false;
      i = close + 1;
    } else if (name_char(c)) {
      if (in_first) first += c;
      empty_item = false;
      ++i;
    } else {
      return std::nullopt;
    }
  }
  if (empty_item) return std::nullopt;
  return first;
}

// The rendezvous of a Slurm job without MESHCAST_RENDEZVOUS or MASTER_*: the first node of the
// step (where srun's default block distribution puts task 0), a port from the job id.
void slurm_rendezvous(const Getenv& env, LaunchEnv& e) {
  const char* nodes_from = env("SLURM_STEP_NODELIST")  ? "SLURM_STEP_NODELIST"
                           : env("SLURM_JOB_NODELIST") ? "SLURM_JOB_NODELIST"
                                                       : nullptr;
  if (!nodes_from)
    throw ValidationError("SLURM_JOB_NODELIST",
                          "not set (nor SLURM_STEP_NODELIST): the rendezvous needs rank 0's node; "
                          "set MESHCAST_RENDEZVOUS, or MASTER_ADDR and MASTER_PORT");
  const char* nodes = env(nodes_from);
  const auto host = first_host(nodes);
  if (!host) expected(nodes_from, "a Slurm host list such as node[01-04,07],gpu3", nodes);
  const char* job = env("SLURM_JOB_ID");
  if (!job)
    throw ValidationError("SLURM_JOB_ID",
                          "not set: the rendezvous port is derived from it (or set "
                          "MESHCAST_RENDEZVOUS, or MASTER_ADDR and MASTER_PORT)");
  const auto j = static_cast<std::uint64_t>(
      integer_in("SLURM_JOB_ID", job, 0, static_cast<long long>(kMaxId), "a job id"));
  std::uint64_t step = 0;
  if (const char* s = env("SLURM_STEP_ID"))
    step = static_cast<std::uint64_t>(
        integer_in("SLURM_STEP_ID", s, 0, static_cast<long long>(kMaxId), "a step id"));
  e.host = *host;
  e.port = static_cast<int>(kSlurmPortBase +
                            ((j % kSlurmPorts) * kSlurmSteps + step % kSlurmPorts) % kSlurmPorts);
  e.host_from = nodes_from;
  e.port_from = "SLURM_JOB_ID";
}

// MASTER_ADDR and MASTER_PORT: meshcast listens on MASTER_PORT + 1, since MASTER_PORT itself is
// where torchrun's agent (or torch.distributed's rank 0) serves its TCP store.
void master_rendezvous(const Getenv& env, LaunchEnv& e) {
  const char* addr = env("MASTER_ADDR");
  const char* port = env("MASTER_PORT");
  if (!addr) throw ValidationError("MASTER_ADDR", "not set, though MASTER_PORT is (give both)");
  if (!port) throw ValidationError("MASTER_PORT", "not set, though MASTER_ADDR is (give both)");
  std::string_view host(addr);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host.empty()) expected("MASTER_ADDR", "a host name or address", addr);
  e.port =
      static_cast<int>(integer_in("MASTER_PORT", port, 1, 65534,
                                  "a port in [1, 65534] (meshcast listens on MASTER_PORT + 1)")) +
      1;
  e.host = host;
  e.host_from = "MASTER_ADDR";
  e.port_from = "MASTER_PORT";
}

// This process's command line (NUL-separated, at most 1 MiB), the program by its file name.
std::string command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string s;
  char buf[4096];
  while (s.size() < kMaxCommandLine && (in.read(buf, sizeof buf) || in.gcount() > 0))
    s.append(buf, static_cast<std::size_t>(in.gcount()));
  const auto end0 = std::min(s.find('\0'), s.size());
  const auto slash = s.rfind('/', end0 == 0 ? 0 : end0 - 1);
  if (slash != std::string::npos && slash < end0) s.erase(0, slash + 1);
  return s;
}

const Getenv& process_env() {
  static const Getenv get = [](const char* name) -> const char* { return std::getenv(name); };
  return get;
}

}  // namespace

std::string LaunchEnv::rendezvous() const {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
         std::to_string(port);
}

std::string LaunchEnv::str() const {
  std::string s = launcher + ": rank " + std::to_string(rank) + " of " + std::to_string(size);
  if (local_rank >= 0) s += " (local rank " + std::to_string(local_rank) + ")";
  if (!has_rendezvous()) return s + ", no rendezvous (MPI starts the job)";
  s += ", rendezvous " + rendezvous() + " (" + host_from;
  if (port_from != host_from) s += ", " + port_from;
  return s + ")";
}

double LaunchEnv::timeout_from(const Getenv& env) {
  const char* t = env("MESHCAST_RENDEZVOUS_TIMEOUT");
  if (!t) return 60;
  const std::string s(t);
  char* stop = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &stop);
  if (!detail::plain_decimal(s) || errno != 0 || *stop != '\0' || !(v > 0) || !std::isfinite(v) ||
      v > 1e7)
    throw ValidationError("MESHCAST_RENDEZVOUS_TIMEOUT",
                          detail::quote(s) + " is not a number of seconds in (0, 1e7]");
  return v;
}

std::optional<LaunchEnv> LaunchEnv::from(const Getenv& env) {
  // With MESHCAST_RANK and MESHCAST_SIZE both given the job is started by hand (maybe inside
  // an allocation whose variables describe another layout): no launcher variable is read.
  // (MESHCAST_LAUNCHER is checked either way: a typo there must not pass in one case only.)
  const Launcher* picked = pick_launcher(env);
  const Launcher& l = env("MESHCAST_RANK") && env("MESHCAST_SIZE") ? kByHand : *picked;
  if (&l == &kByHand && !env("MESHCAST_RENDEZVOUS") && !env("MESHCAST_RANK") &&
      !env("MESHCAST_SIZE"))
    return std::nullopt;  // started alone, or by a launcher meshcast does not read
  LaunchEnv e;
  e.launcher = l.name;
  // MESHCAST_* override the launcher's variable of each field. The size is bounded before
  // anything is sized by it.
  const auto pick = [&](const char* mine, const char* theirs) { return env(mine) ? mine : theirs; };
  const char* size_from = pick("MESHCAST_SIZE", l.size);
  const char* size_text = env(size_from);
  if (!size_text) missing(size_from, l, env);
  const auto size = integer(size_text);
  if (!size) expected(size_from, "a number of processes", size_text);
  if (*size < 1) expected(size_from, "at least 1 process", size_text);
  check_limit(size_from, *size, limits().devices, "DEVICES");
  if (*size > INT32_MAX) expected(size_from, "a number of processes", size_text);
  e.size = static_cast<int>(*size);
  e.size_from = size_from;
  const std::string range =
      "[0, " + std::to_string(e.size) + ") (" + size_from + "=" + std::to_string(e.size) + ")";

  const char* rank_from = pick("MESHCAST_RANK", l.rank);
  const char* rank_text = env(rank_from);
  if (!rank_text) missing(rank_from, l, env);
  e.rank = static_cast<int>(integer_in(rank_from, rank_text, 0, e.size - 1, "a rank in " + range));

  const char* local_from = pick("MESHCAST_LOCAL_RANK", l.local_rank);
  if (const char* t = env(local_from))
    e.local_rank =
        static_cast<int>(integer_in(local_from, t, 0, e.size - 1, "a local rank in " + range));

  if (const char* rv = env("MESHCAST_RENDEZVOUS")) {
    parse_host_port("MESHCAST_RENDEZVOUS", rv, e);
  } else if (env("MASTER_ADDR") || env("MASTER_PORT")) {
    master_rendezvous(env, e);
  } else if (&l == &kSlurm) {
    slurm_rendezvous(env, e);
  } else if (&l == &kTorchrun) {
    throw ValidationError("MASTER_ADDR",
                          "not set; torchrun's RANK and WORLD_SIZE are set, the rendezvous needs "
                          "MASTER_ADDR and MASTER_PORT (or MESHCAST_RENDEZVOUS)");
  } else if (&l == &kByHand) {
    throw ValidationError("MESHCAST_RENDEZVOUS",
                          "not set; every process of the job needs rank 0's HOST:PORT there (or "
                          "MASTER_ADDR and MASTER_PORT)");
  }  // Open MPI without a rendezvous: mpirun's MPI starts the job.

  e.timeout_seconds = timeout_from(env);
  if (e.has_rendezvous()) e.job_key = TcpBootstrap::job_key_from_env(e.rendezvous(), e.size, env);
  return e;
}

std::optional<LaunchEnv> LaunchEnv::detect() { return from(process_env()); }

std::string TcpBootstrap::job_key_from_env(const std::string& rendezvous, int size) {
  return job_key_from_env(rendezvous, size, process_env());
}

std::string TcpBootstrap::job_key_from_env(const std::string& rendezvous, int size,
                                           const Getenv& env) {
  if (const char* k = env("MESHCAST_JOB_KEY"); k && *k) return std::string("MESHCAST_JOB_KEY=") + k;
  std::string ids;
  for (const char* name : {"SLURM_JOB_ID", "SLURM_STEP_ID", "TORCHELASTIC_RUN_ID", "PMIX_NAMESPACE",
                           "OMPI_MCA_ess_base_jobid", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID"}) {
    const char* v = env(name);
    if (!v || !*v ||
        (std::string_view(name) == "TORCHELASTIC_RUN_ID" && std::string_view(v) == "none"))
      continue;
    ids += std::string(name) + "=" + v + ";";
  }
  const std::string job = "size=" + std::to_string(size) + ";rendezvous=" + rendezvous;
  if (!ids.empty()) return "launcher:" + ids + job;
  std::string cmd = command_line();
  return "command:" + std::to_string(cmd.size()) + ":" + cmd + ";" + job;
}

std::unique_ptr<TcpBootstrap> TcpBootstrap::from_env() {
  const auto env = LaunchEnv::detect();
  return env ? from_launch(*env) : nullptr;
}

std::unique_ptr<TcpBootstrap> TcpBootstrap::from_launch(const LaunchEnv& env) {
  if (!env.has_rendezvous()) return nullptr;
  try {
    return std::make_unique<TcpBootstrap>(env.host, env.port, env.rank, env.size,
                                          env.timeout_seconds, env.job_key);
  } catch (const ValidationError& e) {  // a bad host or port: name the variable that gave it
    const std::string& f = e.field();
    if (f == "host" && !env.host_from.empty()) throw ValidationError(env.host_from, e.cause());
    if (f == "port" && !env.port_from.empty()) throw ValidationError(env.port_from, e.cause());
    throw;
  }
}

}  // namespace meshcast
