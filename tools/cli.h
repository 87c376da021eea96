// The `meshcast` command-line program: the pieces shared by its subcommands. Private to tools/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "meshcast/layout.h"
#include "meshcast/local.h"
#include "meshcast/plan.h"
#include "meshcast/testing.h"
#include "meshcast/topology.h"
#include "meshcast/units.h"

namespace CLI {
class App;
}

namespace meshcast {
class Bootstrap;
class NcclSession;
}  // namespace meshcast

namespace meshcast::cli {

// What an option of any subcommand given as '' is told: it is refused rather than taken for its
// default.
inline constexpr const char* kGivenEmpty = "given empty; leave it out for the default";

// Options of `plan` and `reshard`, as typed: parsed and validated by make_plan(), so that every
// message names its field the same way.
struct PlanArgs {
  std::string shape, dtype, src, dst, topology, svg;
  std::string strategy = "auto";
  std::string balance = "search";
  std::string chunk = std::to_string(kDefaultChunkBytes);  // plan, simulate: --chunk-bytes
  std::string rank;                                        // plan, simulate: --rank
  std::string plan_file;                                   // reshard: --plan FILE
  bool json = false;
};

// Options only `reshard` has.
struct RunArgs {
  std::string backend = "local";
  std::string iters = "5";
  bool verify = false;
};

struct DemoArgs {
  std::string topology;
  std::string iters = "3";
};

// Options of `train gpt|utransformer`, as typed (validated by run_train); a --config JSON file
// fills the ones not given on the command line.
struct TrainArgs {
  std::string config;
  std::string stages = "dp=1";
  std::string chunks = "1", micro_batches = "1", schedule = "1f1b", sub_batches = "1";
  bool no_overlap = false;
  std::string reshard = "auto", topology;
  std::string vocab = "256", seq = "64", d_model = "64", heads = "4", layers = "4";
  std::string batch = "16", steps = "300", lr = "0.003", seed = "1";
  std::string data;  // gpt: a text file or directory (default: the Debian corpus), or random
  std::string noise = "0.25";
  std::string eval_every = "0";  // 0: steps / 10
  std::string checkpoint_dir, checkpoint_every = "0";
  bool resume = false;
  std::string out = "meshcast-out";
  std::string backend = "local";
  bool json = false;
  bool plan = false;  // search the parallel configurations instead of training
  std::string devices = "8", top = "5";
};

// Subcommands: each returns the process exit status; a meshcast::Error escapes to main().
// `saved_plan`: reshard's, where --plan FILE may stand for the layout options.
void add_plan_options(CLI::App& cmd, PlanArgs& args, bool saved_plan = false);
int run_plan(const PlanArgs& args);
int run_simulate(const PlanArgs& args);
int run_reshard(const PlanArgs& args, const RunArgs& run);
int run_demo(const DemoArgs& args);
// `sync`: a whole model (cli_sync.cc).
struct SyncArgs {
  std::string model, system, topology, cast, mode = "fused", backend = "local", iters = "3";
  std::string strategy = "auto", max_staging = std::to_string(std::int64_t{64} << 20);
  std::string plan_file, save_plan;  // --plan, --save-plan
  bool verify = false, json = false, predict = false, no_fork = false;
  // The options given, of those that have defaults or may be empty: --plan refuses the ones its
  // file fixes even at their default values, and none may be given empty.
  std::set<std::string> given;
  // From --plan's file (run_sync fills them): the tensors (explicit form) and the topology.
  std::string model_text, topology_text;
};
void add_sync_options(CLI::App& cmd, SyncArgs& args);
int run_sync(const SyncArgs& args);
// `model` is "gpt" or "utransformer".
void add_train_options(CLI::App& cmd, TrainArgs& args, const std::string& model);
int run_train(const TrainArgs& args, const std::string& model, const CLI::App& cmd);

// Shared helpers (cli_common.cc).
// The plan options of `args`, parsed and validated (throws meshcast::Error naming the field).
struct PlanInputs {
  Layout src, dst;
  Topology topology;
  PlanOptions options;
};
PlanInputs parse_plan_inputs(const PlanArgs& args);
// --topology as given: "" (every device on one host), a file or a preset name
// (Topology::resolve), or "auto" / "auto:PRESET", which a process backend discovers once its job
// has started (discover_job_topology); without one (plan, simulate, the local backend) every
// device is in this process, so on one host: single_host(). Throws meshcast::Error("topology").
Topology load_topology(const std::string& text);
// Whether --topology asks for discovery ("auto", "auto:PRESET"); `preset` receives PRESET.
bool is_auto_topology(const std::string& text, std::string* preset = nullptr);
// Parses and validates every option of `args`, then plans. Throws meshcast::Error naming the
// field ("shape", "dtype", "src", "dst", "topology", "strategy", "balance", "chunk-bytes").
// `topology`, when given, receives the topology planned on.
Plan make_plan(const PlanArgs& args, Topology* topology = nullptr);
// The plan saved in --plan FILE (by `plan --json`), checked against the options given with it:
// the layout options, when given, must be the plan's, and --strategy, --balance and --topology
// cannot re-plan it (ValidationError naming the option). Throws ParseError("plan...") for a file
// that is not a valid plan, IoError("plan") for one that cannot be read.
Plan load_plan_file(const PlanArgs& args);
// Device --rank's part of the plan, computed alone (plan_rank), and the seconds that took.
struct RankPart {
  RankPlan plan;
  double seconds = 0;
};
RankPart make_rank_plan(const PlanArgs& args);
// The plan as JSON with a "cost" object: the model's prediction, the link bound and the bytes
// and least time of every link that carries bytes (cli_simulate.cc). Streamed to `os` (a plan
// can be tens of MB), then a newline; throws IoError("json") when `os` fails.
void write_plan_json_with_cost(std::ostream& os, const Plan& plan, const Topology& topology,
                               std::int64_t chunk);
// The chain chunk of --chunk-bytes, 1 .. 1 GiB; throws ValidationError("chunk-bytes").
std::int64_t parse_chunk(const std::string& text);
// A positive iteration count; throws ValidationError("iters").
int parse_iters(const std::string& text);
// Refuses a run whose iterations (and its warm-up) would move more than limits().run_bytes or
// make more than limits().run_transfers transfers: `bytes` and `transfers` per iteration (a run
// of hours is refused before it starts, as a plan too large is). `local_threads`: the device
// threads of an in-process run (0 for a process backend), which make each transfer slower past
// a few a core.
void check_run(int iters, double bytes, double transfers, std::int64_t local_threads = 0);
// Refuses (ValidationError "backend") a backend that is unknown or not built in.
void check_backend(const std::string& backend);
// `meshcast` links no CUDA, so that it starts on any machine; where the NCCL backend is built,
// the program meshcast-nccl beside it has it, and a run with --backend nccl becomes that program
// (execv with the same arguments; throws ValidationError("backend") when it cannot). Does
// nothing in a program built with the NCCL backend or without a meshcast-nccl.
void exec_nccl_program(char** argv);
// A started process backend (cli_process.cc): its communicator, its bootstrap, the variable that
// gave the job's size under the TCP rendezvous (WORLD_SIZE, ...; empty: MPI started the job),
// and the NCCL session when it is nccl.
struct ProcessSession {
  Communicator& comm;
  Bootstrap& boot;
  std::string size_from;
  NcclSession* nccl = nullptr;  // set only in a program built with the NCCL backend
};
// A rank's buffers where its communicator reads and writes them: the host bytes themselves, or,
// given an NCCL session, GPU copies (the transport refuses host memory). place() returns the
// buffer to hand to reshard or sync (null for no bytes), uploading the host bytes; fetch()
// brings the bytes of what place(host) returned back to host; scratch() is uninitialised
// memory of the same kind. Buffers live as long as this.
class RankBuffers {
 public:
  explicit RankBuffers(NcclSession* gpu) : gpu_(gpu) {}
  void* place(std::vector<std::byte>& host);
  void fetch(const void* placed, std::vector<std::byte>& host);
  void* scratch(std::size_t bytes);

 private:
  NcclSession* gpu_;
  std::vector<std::shared_ptr<void>> gpu_memory_;
  std::vector<std::vector<std::byte>> host_scratch_;
};
// Checks that every rank of the job was given the same settings (name, value), in the same
// order on every rank; collective. Throws ValidationError naming the first setting that differs
// and the ranks that differ from the majority.
void agree(Bootstrap& boot, const std::vector<std::pair<std::string, std::string>>& settings);
// A short digest of a text (a file's contents) for agree(): the same on every rank of one build.
std::string digest(const std::string& text);
// Starts `backend` (mpi under mpirun; ucx, nccl also by TCP rendezvous), runs fn, shuts down.
// If starting or fn fails, the error is reported at once and the process exits with its status
// (exit_status) without shutting the backend down: after a peer failed, freeing windows or
// finalizing MPI could wait forever on it.
void with_process_backend(const std::string& backend,
                          const std::function<void(ProcessSession&)>& fn);
// A plan run on a started process backend: every rank checks that all planned the same, then
// runs, times and (verify) checks it together. Collective; `root` is true on the rank that
// reports.
struct ProcessRun {
  LocalRun run;
  bool root = false;
};
ProcessRun run_plan_on(const Plan& plan, ProcessSession& session, int iters, bool verify);
// Refuses a job of fewer ranks than `needed` devices (`exactly`: of another number; a surplus
// rank would sit idle), naming what the launcher must start; the same on every rank.
void require_ranks(const ProcessSession& session, std::int64_t needed, const std::string& why,
                   bool exactly);
// Runs this rank's own checks of its input (parsing, loading, planning) once the job has
// started, and fails every rank alike when any rank's fail: the error of the lowest failing
// rank, which the others report as "rank R: <its line>" with its exit status. A rank that exited
// on its own would leave the others waiting in the backend's start forever under a launcher that
// does not end a job with its first failed rank (srun's default). Collective.
void checked_together(Bootstrap& boot, const std::function<void()>& checks);
// Refuses, on every rank alike, a run whose buffers do not fit before any is allocated: a
// rank's `mine` bytes over limits().buffer_bytes, or the ranks of one host together over
// usable_memory_bytes() there (each alone may fit while together they would not). The refusal
// names `field`. Collective.
void check_job_capacity(Bootstrap& boot, std::int64_t mine, const std::string& field);
// The topology of a started job for --topology auto[:PRESET] (discover_topology over its
// world: hosts by MESHCAST_HOSTNAME or gethostname(), links measured or PRESET's); collective,
// identical on every rank. Refused (ValidationError "topology") on nccl.
Topology discover_job_topology(ProcessSession& session, const std::string& topology);
// Refuses, before planning, a move the in-process backend cannot run on this machine: too many
// device threads, or buffers over limits().buffer_bytes or most of the machine's memory.
void check_local_capacity(const Layout& src, const Layout& dst);
// The same for the tiles of many layouts (a sync's) and `scratch` bytes held besides them (its
// gather mode's); the memory refusal names `field`, and the refusal over limits().buffer_bytes
// what takes the most: a layout's tiles by name(its index), or name(layouts.size()) for the
// scratch.
void check_local_capacity(const std::vector<const Layout*>& layouts, const std::string& field,
                          const std::function<std::string(std::size_t)>& name = {},
                          double scratch = 0);
// The memory a run's buffers may take on a machine: a share of its physical memory (0 when
// unknown).
constexpr double kMemoryShare = 0.75;
double usable_memory_bytes();
// Refuses (IoError naming `field`, the path and the OS reason) an output file that cannot be
// written, before any work starts; an empty path is no file. Creates it, never truncates it.
void check_writable(const std::string& path, const std::string& field);
// Writes a text file; throws IoError(field) when it cannot.
void write_file(const std::string& path, const std::string& text, const std::string& field);

// The paper's cluster (meshes/aws-p3.8xlarge.json), built in so that `demo` runs anywhere.
Topology builtin_aws_p3();

double median(std::vector<double> v);

// What a command says beyond its results (cli_output.cc): --log-level error|warn|info, default
// info; --quiet is error. Results (a plan, a report, JSON) and errors print at every level;
// warnings at warn and info; progress and other running commentary at info.
enum class LogLevel { Error, Warn, Info };
LogLevel& log_level();
LogLevel parse_log_level(const std::string& text);  // throws ValidationError("log-level")
bool says(LogLevel level);
// "meshcast: warning: <what>" on stderr, unless the level is error.
void warn(const std::string& what);
// Whether stdout is a terminal a person watches, so progress may redraw one line in place: a
// tty, and not a rank's pty under a launcher (mpirun, srun, torchrun: LaunchEnv::detect).
bool live_terminal();
// The width of the terminal on stdout (TIOCGWINSZ), 80 when it says nothing.
int terminal_columns();

// Exit status by kind of error (Error::kind(), docs/cli.md): 2 BadInput, 3 PeerFailure, 4 Io,
// 1 Internal and anything that is not an Error. 1 also means that a reshard delivered wrong
// elements.
int exit_status(const std::exception& e);
// Prints "meshcast: <what>" as one bounded line on stderr.
void report_error(const std::exception& e);
// `s` on one line of at most kMaxMessageChars characters (longer ones end in "...").
inline constexpr std::size_t kMaxMessageChars = 1000;
std::string one_line(std::string s);
}  // namespace meshcast::cli
