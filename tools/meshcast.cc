// `meshcast`: plan, run and inspect cross-mesh reshards from the command line.
//
//   meshcast plan    --shape 1024,1024,512 --dtype f32 --src 2x4@0-7:S0R --dst 2x4@8-15:RS1
//   meshcast reshard (the same options) [--backend local|mpi|ucx|nccl] [--iters N] [--verify]
//   [--json]
//   meshcast simulate (the plan options) [--chunk-bytes N] [--json]
//   meshcast demo
//   meshcast sync --model models/qwen2.5-0.5b.json --system models/systems/tp2pp2-to-tp2dp2.json
//   meshcast train gpt|utransformer [--stages dp=2,tp=2/grid=2x1x2] [--schedule eager-1f1b] ...
//
// Exit status: 0 success; 1 a reshard delivered wrong elements, or an internal error; 2 bad
// input (one line on stderr, "meshcast: <field>: <cause>"); 3 a peer failed; 4 I/O.
#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstring>
#include <functional>
#include <iostream>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cli.h"
#include "meshcast/error.h"
#include "meshcast/reshard.h"

namespace meshcast::cli {
namespace {

// An option given as '' is refused rather than taken for its default (as sync's are).
const CLI::Validator kGivenNonEmpty([](std::string& v) { return v.empty() ? kGivenEmpty : ""; }, "",
                                    "non-empty");

constexpr const char* kFormats = R"(
Formats:
  shape   comma-separated extents, e.g. 1024,1024,512
  dtype   f16 bf16 f32 f64 i8 i16 i32 i64 u8 u16 u32 u64 bool c64 c128
  layout  MESH:SPEC. MESH is an N-D grid over device ids, row-major: 2x4 (devices 0-7),
          2x4@8-15, 2x2@[0,2,4,6], 4@0-3. SPEC has one token per tensor dimension: R (not
          split) or S followed by the mesh axes splitting it, major first (S0, S1, S01); an
          optional pending sum over mesh axes follows a '+': S0R+P1. A dimension of n split p
          ways gives shard k the range [floor(k*n/p), floor((k+1)*n/p)).
  topology  a JSON file of hosts and links (see docs/topology.md), or a preset name: a file
          <name>.json of MESHCAST_TOPOLOGY_PATH (colon-separated directories) or of the
          installed presets (share/meshcast/meshes: aws-p3.8xlarge, dgx-a100, ...); or auto:
          reshard and sync with --backend mpi or ucx find the job's hosts by host name
          (MESHCAST_HOSTNAME, else gethostname) and measure the links (auto:PRESET takes
          PRESET's links); elsewhere, and with the local backend, auto is one host. Without
          it every device is on one host.

Every command also takes --quiet and --log-level error|warn|info (see meshcast --help).

Exit status: 0 success; 1 reshard --verify found wrong elements, or an internal error; 2 bad
input (one line on stderr, "meshcast: <field>: <cause>"); 3 a peer failed (named); 4 I/O (the
path and the OS reason). Limits on what one request may cost: docs/cli.md, "Limits".
)";

void add_run_options(CLI::App& cmd, RunArgs& run) {
  cmd.add_option("--backend", run.backend,
                 "communicator: local (threads in this process), or, with one process per device "
                 "id, mpi, ucx, nccl (when built in), under mpirun. ucx and nccl also start "
                 "without MPI, through a TCP rendezvous: under torchrun (RANK, WORLD_SIZE, "
                 "LOCAL_RANK, MASTER_ADDR; rank 0 listens on MASTER_PORT + 1), under srun "
                 "(SLURM_PROCID, SLURM_NTASKS; rank 0 listens on the first node of "
                 "SLURM_STEP_NODELIST, port 10000 + (16 * SLURM_JOB_ID + SLURM_STEP_ID) mod "
                 "20000), under mpirun with MASTER_ADDR/MASTER_PORT or MESHCAST_RENDEZVOUS, or "
                 "launched by hand, each process with MESHCAST_RENDEZVOUS=HOST:PORT (the same "
                 "for all; rank 0 listens there), MESHCAST_RANK (0..size-1) and MESHCAST_SIZE. "
                 "MESHCAST_* override the launcher's value of each; MESHCAST_LAUNCHER=meshcast "
                 "reads MESHCAST_* only. Optionally MESHCAST_RENDEZVOUS_TIMEOUT (seconds to wait "
                 "for the others, default 60). See docs/cli.md")
      ->type_name("NAME")
      ->capture_default_str();
  cmd.add_option("--iters", run.iters, "timed iterations after one warm-up run (>= 1)")
      ->type_name("N")
      ->capture_default_str();
  cmd.add_flag("--verify", run.verify,
               "fill every source tile with a function of the global element index and check "
               "every destination element");
}

// One line of JSON for `reshard --json`.
nlohmann::json report_json(const Plan& p, const std::string& backend, int iters, bool verify,
                           const LocalRun& r, double seconds) {
  const PlanStats& st = p.stats();
  nlohmann::json j;
  j["verified"] = verify && r.mismatches == 0;
  j["mismatches"] = verify ? nlohmann::json(r.mismatches) : nlohmann::json(nullptr);
  j["bytes_moved"] = st.bytes_moved;
  j["seconds"] = seconds;
  j["strategy"] = to_string(p.strategy());
  j["balance"] = to_string(p.balance());
  j["backend"] = backend;
  j["iters"] = iters;
  j["src"] = p.src().str();
  j["dst"] = p.dst().str();
  j["shape"] = p.src().shape();
  j["dtype"] = to_string(p.src().dtype());
  j["topology"] = p.topology();
  j["tensor_bytes"] = p.src().bytes();
  j["bytes_network"] = st.bytes_network;
  j["bytes_intra_host"] = st.bytes_intra_host;
  j["bytes_local"] = st.bytes_local;
  j["predicted_seconds"] = st.predicted_seconds;
  j["effective_gbps"] = seconds > 0
                            ? nlohmann::json(static_cast<double>(p.src().bytes()) / seconds / 1e9)
                            : nlohmann::json(nullptr);
  j["times"] = r.seconds;
  return j;
}

// The chain chunk the cost model assumes (plan and simulate only: the backends take theirs from
// their options).
void add_chunk_option(CLI::App& cmd, PlanArgs& args) {
  cmd.add_option("--chunk-bytes", args.chunk,
                 "chunk of a pipelined chain broadcast that the cost model assumes (the "
                 "backends' default)")
      ->type_name("N")
      ->capture_default_str();
}

// `what`: what the subcommand does with the part.
void add_rank_option(CLI::App& cmd, PlanArgs& args, const std::string& what) {
  cmd.add_option("--rank", args.rank,
                 what +
                     " device R's own part, computed alone as each device of a job does (no "
                     "whole plan: greedy and search give way to the local rule), and how long "
                     "that took")
      ->type_name("R")
      ->check(kGivenNonEmpty);
}

}  // namespace

void add_plan_options(CLI::App& cmd, PlanArgs& args, bool saved_plan) {
  const auto layout_option = [&](const char* name, std::string& value, const char* help,
                                 const char* type) {
    CLI::Option* o = cmd.add_option(name, value, help)->type_name(type)->check(kGivenNonEmpty);
    if (!saved_plan) o->required();
  };
  layout_option("--shape", args.shape, "global tensor shape, e.g. 1024,1024,512", "SHAPE");
  layout_option("--dtype", args.dtype,
                "element type: f16 bf16 f32 f64 i8 i16 i32 i64 u8 u16 u32 u64 bool c64 c128",
                "DTYPE");
  layout_option("--src", args.src, "source layout MESH:SPEC, e.g. 2x4@0-7:S0R", "LAYOUT");
  layout_option("--dst", args.dst, "destination layout MESH:SPEC, e.g. 2x4@8-15:RS1", "LAYOUT");
  if (saved_plan)
    cmd.add_option("--plan", args.plan_file,
                   "run the plan saved in FILE by `meshcast plan --json` instead of planning: "
                   "--shape, --dtype, --src and --dst may then be left out (when given they "
                   "must be the plan's), and --topology, --strategy and --balance cannot change "
                   "it; process backends check that every rank read the same plan and that the "
                   "job has its devices")
        ->type_name("FILE")
        ->check(kGivenNonEmpty);
  cmd.add_option("--topology", args.topology,
                 "topology: a JSON file, a preset name (dgx-a100, aws-p3.8xlarge, ...: see "
                 "Formats), or auto (reshard --backend mpi|ucx: discovered from the job's host "
                 "names and measured links; auto:PRESET takes PRESET's links; one host for plan, "
                 "simulate and the local backend); default: every device on one host")
      ->type_name("FILE|NAME|auto")
      ->check(kGivenNonEmpty);
  cmd.add_option("--strategy", args.strategy,
                 "auto (cheapest by the cost model), broadcast (one multicast per task), "
                 "sendrecv (one send per receiver), allgather (scatter, then all-gather)")
      ->type_name("NAME")
      ->capture_default_str();
  cmd.add_option("--balance", args.balance,
                 "sender choice: none (first holder), greedy, search (greedy + local search), "
                 "local (per task, what each device computes alone: --rank's)")
      ->type_name("NAME")
      ->capture_default_str();
  cmd.add_option("--svg", args.svg, "also draw the plan as an SVG picture into this file")
      ->type_name("FILE")
      ->check(kGivenNonEmpty);
  cmd.footer(kFormats);
}

int run_plan(const PlanArgs& args) {
  if (!args.rank.empty()) {
    if (args.json || !args.svg.empty())
      throw ValidationError("rank",
                            "prints device R's part as text; --json and --svg draw the "
                            "whole plan (run without --rank)");
    const RankPart r = make_rank_plan(args);
    std::cout << r.plan.str() << "  computed alone in " << human_seconds(r.seconds)
              << " (no whole plan built)\n";
    const int d = r.plan.device();
    if (!r.plan.src().mesh().contains(d) && !r.plan.dst().mesh().contains(d))
      std::cout << "  device " << d << " is in neither mesh: it takes no part\n";
    return 0;
  }
  check_writable(args.svg, "svg");
  Topology topology;
  const Plan p = make_plan(args, &topology);
  if (!args.svg.empty()) write_file(args.svg, plan_svg(p, topology), "svg");
  if (args.json) {
    write_plan_json_with_cost(std::cout, p, topology, parse_chunk(args.chunk));
  } else {
    std::cout << p.str();
    if (!args.svg.empty()) std::cout << "plan drawn in " << args.svg << '\n';
  }
  return 0;
}

int run_reshard(const PlanArgs& args, const RunArgs& run) {
  check_backend(run.backend);
  int iters = 0;
  std::optional<PlanInputs> in;
  std::optional<Plan> made;
  bool discover = false;  // --topology auto on a process backend: planned once the job found it
  // What the iterations move in all, each the plan's bytes moved and copied.
  const auto check_iterations = [&](const Plan& p) {
    check_run(
        iters,
        static_cast<double>(p.stats().bytes_moved) + static_cast<double>(p.stats().bytes_local),
        static_cast<double>(p.ops().size()),
        run.backend == "local" ? static_cast<std::int64_t>(p.devices().size()) : 0);
  };
  // This rank's input checked and planned; on a process backend once the job has started, every
  // rank's failure agreed (checked_together).
  const auto prepare = [&] {
    iters = parse_iters(run.iters);
    check_writable(args.svg, "svg");
    const bool saved = !args.plan_file.empty();
    for (const auto& [field, value] : {std::pair{"shape", &args.shape},
                                       {"dtype", &args.dtype},
                                       {"src", &args.src},
                                       {"dst", &args.dst}})
      if (!saved && value->empty())
        throw ValidationError(field,
                              "required: give --shape, --dtype, --src and --dst, or --plan "
                              "FILE (a plan saved by meshcast plan --json)");
    if (saved)
      made = load_plan_file(args);
    else
      in = parse_plan_inputs(args);
    if (run.backend == "local")
      check_local_capacity(made ? made->src() : in->src, made ? made->dst() : in->dst);
    discover = !saved && run.backend != "local" && is_auto_topology(args.topology);
    if (!made && !discover) made = plan(in->src, in->dst, in->topology, in->options);
    if (made) check_iterations(*made);
    if (run.backend == "local")  // again, with the scratch of the plan's reduces
      check_local_capacity(
          {&made->src(), &made->dst()}, "shape",
          [](std::size_t k) {
            return k == 2 ? "the reduces' scratch" : k ? "the target" : "the source";
          },
          static_cast<double>(reshard_scratch_bytes(*made)));
  };
  LocalRun r;
  bool root = true;
  if (run.backend == "local") {
    prepare();
    r = run_local(*made, iters, run.verify);
  }
#ifdef MESHCAST_HAS_MPI  // without it check_backend() refused every other backend
  else {
    with_process_backend(run.backend, [&](ProcessSession& s) {
      checked_together(s.boot, prepare);
      if (discover) {
        // First, that every rank discovers: a rank given a file instead would wait in another
        // collective (its own agree() in run_plan_on sees this record and names the difference).
        agree(s.boot,
              {{"topology", "auto " + std::to_string(std::hash<std::string>{}(args.topology))}});
        made = plan(in->src, in->dst, discover_job_topology(s, args.topology), in->options);
        check_iterations(*made);
      }
      ProcessRun pr = run_plan_on(*made, s, iters, run.verify);
      root = pr.root;
      r = std::move(pr.run);
    });
  }
#endif
  if (!root) return !run.verify || r.mismatches == 0 ? 0 : 1;  // rank 0 reports
  // The hosts of the topology planned on (a saved plan names its own: plan_svg finds it).
  if (!args.svg.empty())
    write_file(args.svg, in && !discover ? plan_svg(*made, in->topology) : plan_svg(*made), "svg");
  const Plan& p = *made;
  const double seconds = median(r.seconds);
  const bool ok = !run.verify || r.mismatches == 0;
  if (args.json) {
    std::cout << report_json(p, run.backend, iters, run.verify, r, seconds).dump() << '\n';
  } else {
    const PlanStats& st = p.stats();
    std::cout << "reshard " << shape_str(p.src().shape()) << ' ' << to_string(p.src().dtype())
              << " (" << human_bytes(p.src().bytes()) << ") " << p.src().str() << " -> "
              << p.dst().str() << '\n'
              << "strategy     " << to_string(p.strategy()) << " (balance "
              << to_string(p.balance()) << ", topology " << p.topology() << ")\n"
              << "backend      " << run.backend << ", " << iters << " iterations after a warm-up\n"
              << "bytes moved  " << human_bytes(st.bytes_moved) << " (intra-host "
              << human_bytes(st.bytes_intra_host) << ", network " << human_bytes(st.bytes_network)
              << "), local copies " << human_bytes(st.bytes_local) << '\n'
              << "median time  " << human_seconds(seconds) << " (predicted "
              << human_seconds(st.predicted_seconds) << ")\n"
              << "effective    "
              << human_rate(seconds > 0 ? static_cast<double>(p.src().bytes()) / seconds : 0)
              << " (tensor bytes / median time)\n"
              << "verified     "
              << (!run.verify         ? std::string("not checked (pass --verify)")
                  : r.mismatches == 0 ? std::string("yes, 0 mismatches")
                                      : "NO, " + std::to_string(r.mismatches) + " mismatches")
              << '\n';
  }
  return ok ? 0 : 1;
}

}  // namespace meshcast::cli

namespace {

// The subcommands named at the front of argv ("train gpt"), and the first word that names none
// where one was expected (CLI11 would say only "A subcommand is required").
struct CommandPath {
  std::string path;     // "meshcast train"
  std::string unknown;  // "bert"
  std::string choices;  // "gpt, utransformer"
};

CommandPath command_path(CLI::App& app, int argc, char** argv) {
  CommandPath out{"meshcast", "", ""};
  CLI::App* at = &app;
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    const auto subs = at->get_subcommands([](CLI::App*) { return true; });
    if (word.empty() || word[0] == '-' || subs.empty()) break;  // options: CLI11 judges them
    CLI::App* next = nullptr;
    for (CLI::App* sub : subs) {
      out.choices += (out.choices.empty() ? "" : ", ") + sub->get_name();
      if (sub->get_name() == word) next = sub;
    }
    if (!next) {
      out.unknown = word;
      break;
    }
    out.choices.clear();
    out.path += " " + word;
    at = next;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace meshcast::cli;
  CLI::App app{
      "meshcast: cross-mesh resharding of sharded tensors. Plans the move of a tensor from one "
      "device mesh and sharding to another as broadcast-based multicasts, and runs it."};
  app.name("meshcast");
  app.set_version_flag("--version", "meshcast " MESHCAST_VERSION);
  app.require_subcommand(1);
  std::string log_level_text = "info";
  bool quiet = false;
  app.add_option("--log-level", log_level_text,
                 "what to say beyond results and errors: error, warn (also warnings) or info "
                 "(also progress and commentary); any command takes it, before or after its name")
      ->type_name("LEVEL")
      ->capture_default_str();
  app.add_flag("-q,--quiet", quiet, "the same as --log-level error");
  app.fallthrough();  // inherited by the subcommands added below: `meshcast train gpt --quiet`
  app.footer(
      "Exit status: 0 success, 1 a reshard delivered wrong elements or an internal error, 2 bad "
      "input (one line on stderr naming the field), 3 a peer failed, 4 I/O.\nRun 'meshcast "
      "demo' for a quick start.");

  PlanArgs plan_args;
  RunArgs run_args;
  DemoArgs demo_args;

  CLI::App* plan_cmd = app.add_subcommand(
      "plan", "Plan a reshard and print the plan (or its JSON with --json; --svg draws it).");
  add_plan_options(*plan_cmd, plan_args);
  add_chunk_option(*plan_cmd, plan_args);
  add_rank_option(*plan_cmd, plan_args, "print only");
  plan_cmd->add_flag(
      "--json", plan_args.json,
      "print the plan as one JSON document, with a \"cost\" object: the model's "
      "predicted_seconds, bound_seconds (the busiest link's time busy: bytes / bandwidth, "
      "and a sender's port each message's overhead) and "
      "links (bytes and least time of every link that carries bytes)");

  CLI::App* simulate_cmd = app.add_subcommand(
      "simulate",
      "Plan a reshard and predict its time on the topology: the analytic model, the link bound, "
      "and a discrete-event simulation in which contended links are shared fairly; lists the "
      "busiest links. Runs nothing.");
  add_plan_options(*simulate_cmd, plan_args);
  add_chunk_option(*simulate_cmd, plan_args);
  add_rank_option(*simulate_cmd, plan_args, "also report");
  simulate_cmd->add_flag(
      "--json", plan_args.json,
      "print one JSON object: predicted_seconds (model), simulated_seconds, bound_seconds, "
      "effective_gbps (tensor bytes / simulated time), events, plan_cpu_seconds, "
      "simulate_cpu_seconds, links (every link that carries bytes: link, class, bytes, seconds)");

  CLI::App* reshard_cmd = app.add_subcommand(
      "reshard", "Plan a reshard and run it on a backend; report time and bandwidth.");
  add_plan_options(*reshard_cmd, plan_args, true);
  add_run_options(*reshard_cmd, run_args);
  reshard_cmd->add_flag(
      "--json", plan_args.json,
      "print one JSON object on one line: verified (true only with --verify and no mismatch), "
      "mismatches (null without --verify), bytes_moved, seconds (median), strategy, iters, src, "
      "dst, shape, dtype, bytes_network, effective_gbps (tensor bytes / median seconds / 1e9), "
      "times (every iteration)");

  CLI::App* demo_cmd = app.add_subcommand(
      "demo",
      "The quick start: plans two cases of the paper on its cluster (8 hosts x 4 GPUs, 10 Gbit/s "
      "per host), runs them on the in-process backend and checks every element, then compares "
      "the bytes that broadcast and send/recv plans send across hosts. Needs no launcher.");
  demo_cmd
      ->add_option("--topology", demo_args.topology,
                   "topology JSON file or preset name; default: the built-in copy of "
                   "meshes/aws-p3.8xlarge.json")
      ->type_name("FILE|NAME")
      ->check(kGivenNonEmpty);
  demo_cmd->add_option("--iters", demo_args.iters, "timed iterations per case (>= 1)")
      ->type_name("N")
      ->capture_default_str();

  SyncArgs sync_args;
  CLI::App* sync_cmd = app.add_subcommand(
      "sync",
      "Move a whole model (hundreds of tensors) from a trainer's layouts to a generator's in one "
      "fused plan, or tensor by tensor, or through one gathering device; run it and report time "
      "and bandwidth, or (--predict) price it by the cost model.");
  add_sync_options(*sync_cmd, sync_args);

  CLI::App* train_cmd = app.add_subcommand(
      "train", "Train a model with data, tensor and pipeline parallelism across meshes.");
  train_cmd->require_subcommand(1);
  TrainArgs gpt_args, unet_args;
  CLI::App* gpt_cmd = train_cmd->add_subcommand(
      "gpt",
      "A GPT-style decoder on real text (byte-level tokens; by default the license texts every "
      "Debian system ships in /usr/share/common-licenses), with a held-out loss. Shows "
      "progress, writes a loss curve, a step-time chart and a JSON summary into --out.");
  add_train_options(*gpt_cmd, gpt_args, "gpt");
  CLI::App* unet_cmd = train_cmd->add_subcommand(
      "utransformer",
      "A U-Transformer (encoder blocks halve the sequence, decoder blocks double it, skip "
      "connections from encoder block i to decoder block L-1-i) denoising generated sequences; "
      "pipeline stages on separate meshes, so skips cross non-adjacent meshes.");
  add_train_options(*unet_cmd, unet_args, "utransformer");

  // A flag given twice is refused as an option given twice is (CLI11 counts repeated flags).
  const std::function<void(CLI::App&)> one_each = [&](CLI::App& a) {
    for (CLI::Option* o : a.get_options())
      if (o->get_expected_max() == 0) o->multi_option_policy(CLI::MultiOptionPolicy::Throw);
    for (CLI::App* sub : a.get_subcommands({})) one_each(*sub);
  };
  one_each(app);
  const CommandPath command = command_path(app, argc, argv);
  if (!command.unknown.empty()) {
    std::cerr << command.path << ": unknown command '" << one_line(command.unknown)
              << "' (commands: " << command.choices << "; see " << command.path << " --help)"
              << std::endl;
    return 2;
  }
  // What was printed must have reached stdout (a full disk, a closed pipe): a JSON reader would
  // otherwise take a cut document, or none, for a success. (errno: cleared before the output.)
  const auto reached_stdout = [](int status) {
    std::cout.flush();
    if (!std::cout)
      throw meshcast::IoError("stdout", std::string("cannot write the output: ") +
                                            (errno ? std::strerror(errno) : "the stream failed"));
    return status;
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --help-all, --version
    try {
      errno = 0;
      return reached_stdout(app.exit(e));
    } catch (const std::exception& x) {
      report_error(x);
      return exit_status(x);
    }
  } catch (const CLI::ParseError& e) {
    std::cerr << command.path << ": " << one_line(e.what()) << " (see " << command.path
              << " --help)" << std::endl;
    return 2;
  }

  const auto run = [&] {
    log_level() = quiet ? LogLevel::Error : parse_log_level(log_level_text);
    if ((*reshard_cmd && run_args.backend == "nccl") || (*sync_cmd && sync_args.backend == "nccl"))
      exec_nccl_program(argv);
    if (*plan_cmd) return run_plan(plan_args);
    if (*reshard_cmd) return run_reshard(plan_args, run_args);
    if (*simulate_cmd) return run_simulate(plan_args);
    if (*demo_cmd) return run_demo(demo_args);
    if (*sync_cmd) return run_sync(sync_args);
    if (*gpt_cmd) return run_train(gpt_args, "gpt", *gpt_cmd);
    if (*unet_cmd) return run_train(unet_args, "utransformer", *unet_cmd);
    std::cerr << "meshcast: a subcommand is required: plan, reshard, simulate or demo" << std::endl;
    return 2;
  };
  try {
    const int status = run();
    errno = 0;
    return reached_stdout(status);
  } catch (const std::exception& e) {
    report_error(e);
    return exit_status(e);
  }
}
