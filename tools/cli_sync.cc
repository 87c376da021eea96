// `meshcast sync`: a whole model moved from the trainer's layouts to the generator's, in one
// of three modes measured alike: fused (one sync plan: boxes coalesced per sender and
// receivers, senders rotated over every replica), per-tensor (one reshard per tensor, one after
// the other) and gather (each tensor gathered on the first device of its source mesh, then sent
// from there to every generator: what many RL frameworks do). `--predict` prices a mode by the
// cost model without running it, at any size.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

#include "cli.h"
#include "lib/support/fnv.h"
#include "lib/support/json_text.h"
#include "lib/support/parallel_for.h"
#include "lib/support/saturated.h"
#include "lib/support/text.h"
#include "meshcast/bootstrap.h"
#include "meshcast/cost.h"
#include "meshcast/error.h"
#include "meshcast/limits.h"
#include "meshcast/manifest.h"
#include "meshcast/plan_size.h"
#include "meshcast/region.h"
#include "meshcast/sync.h"
#include "meshcast/testing.h"

namespace meshcast::cli {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A mode as steps run one after the other, each one sync of some tensors. fused: one step of
// all. per-tensor: a step per tensor. gather: per tensor, a gather on the first device of its
// source mesh, a broadcast of the whole tensor from there to every generator (each receives all
// of it, as RL frameworks' broadcasts do), then each generator's own slice, copied locally.
enum class Buffer { Source, Target, Gathered, Whole };
struct Step {
  std::vector<TensorMove> moves;
  std::vector<int> tensor;  // per move: the model tensor it moves
  Buffer from = Buffer::Source, to = Buffer::Target;
};

std::vector<Step> steps_of(const ModelManifest& m, const std::string& mode) {
  std::vector<Step> steps;
  const auto n = static_cast<int>(m.moves.size());
  if (mode == "fused") {
    Step s{m.moves, {}};
    for (int i = 0; i < n; ++i) s.tensor.push_back(i);
    steps.push_back(std::move(s));
    return steps;
  }
  for (int i = 0; i < n; ++i) {
    const TensorMove& t = m.moves[static_cast<std::size_t>(i)];
    if (mode == "per-tensor") {
      steps.push_back({{t}, {i}});
      continue;
    }
    const std::string replicated(t.src.shape().size(), 'R');
    // A cast happens at the senders of the gather, as fused casts at its senders.
    const Layout one =
        Layout::parse(t.src.shape(), t.dst.dtype(),
                      "1@" + std::to_string(t.src.mesh().devices().front()) + ":" + replicated);
    const Layout every(t.dst.shape(), t.dst.dtype(), t.dst.mesh(),
                       ShardingSpec(std::vector<std::vector<int>>(t.dst.shape().size())));
    steps.push_back({{{t.name, t.src, one}}, {i}, Buffer::Source, Buffer::Gathered});
    steps.push_back({{{t.name, one, every}}, {i}, Buffer::Gathered, Buffer::Whole});
    steps.push_back({{{t.name, every, t.dst}}, {i}, Buffer::Whole, Buffer::Target});
  }
  return steps;
}

// "65536", "64K", "64M", "1G" (binary units), 8 bytes (the least a sync packs,
// SyncOptions::max_staging_bytes) .. 1 TiB.
std::int64_t parse_size(const std::string& text, const std::string& field) {
  const std::int64_t v = detail::parse_bytes(text, std::int64_t{1} << 40, field);
  if (v < 8) throw ValidationError(field, "must be at least 8 bytes, got " + detail::quote(text));
  return v;
}

SyncOptions sync_options(const SyncArgs& a) {
  SyncOptions o;
  o.plan.strategy = parse_strategy(a.strategy);
  o.max_staging_bytes = parse_size(a.max_staging, "max-staging-bytes");
  o.plan.fork = !a.no_fork;
  return o;
}

struct Loaded {
  ModelManifest model;
  Topology topology;
  SyncOptions options;
  std::vector<Step> steps;
  std::string mode;
};

Loaded load(const SyncArgs& a) {
  // (An empty --plan or --save-plan read as absent ran the whole sync instead.)
  for (const auto& [flag, value] :
       {std::pair{"cast", &a.cast}, std::pair{"topology", &a.topology},
        std::pair{"model", &a.model}, std::pair{"system", &a.system},
        std::pair{"plan", &a.plan_file}, std::pair{"save-plan", &a.save_plan}})
    if (a.given.count(flag) && value->empty()) throw ValidationError(flag, kGivenEmpty);
  if (a.predict && !a.save_plan.empty())
    throw ValidationError("save-plan",
                          "saves the sync and exits, pricing nothing: leave out --predict (price "
                          "the saved sync with --plan FILE --predict)");
  if (a.predict && a.verify)
    throw ValidationError("verify", "--predict runs nothing to verify; leave one of them out");
  if (a.mode != "fused" && a.mode != "per-tensor" && a.mode != "gather")
    throw ValidationError("mode", "expected fused, per-tensor or gather, got '" + a.mode + "'");
  std::optional<DType> cast;
  if (!a.cast.empty()) {
    cast = parse_dtype(a.cast, "cast");
    if (*cast != DType::bf16 && *cast != DType::f16)
      throw ValidationError("cast", "expected bf16 or f16, got '" + a.cast + "'");
  }
  Loaded l;
  l.options = sync_options(a);
  if (!a.model_text.empty()) {  // a saved plan: explicit layouts, the targets' dtypes written out
    try {  // its cast as given to --save-plan (a no-op on the tensors it wrote)
      l.model = read_model(a.model_text, nullptr, cast);
    } catch (const Error& e) {
      if (e.field() == "system")  // it wants a system config: the file has no layouts
        throw ValidationError("plan.tensors", "every tensor needs its src and dst layouts");
      // Named where they are: in the plan file's tensors, not in a model file.
      const bool in_tensors = e.field().starts_with("tensors");
      if (!in_tensors && e.field() != "model") throw;
      throw Error(e.kind(), in_tensors ? "plan." + e.field() : "plan.tensors", e.cause());
    }
    l.topology = Topology::from_json(a.topology_text, "plan.topology");
  } else {
    if (a.model.empty())
      throw ValidationError("model", "is required (or --plan FILE, a sync saved by --save-plan)");
    std::optional<SystemConfig> system;
    if (!a.system.empty()) system = load_system_config(a.system);
    l.model = load_model(a.model, system ? &*system : nullptr, cast);
    l.topology = load_topology(a.topology);  // auto: replaced once a process backend started
  }
  l.steps = steps_of(l.model, a.mode);
  l.mode = a.mode;
  return l;
}

// What makes two steps' predictions the same: their moves' shapes, dtypes and layouts.
std::uint64_t step_digest(const Step& s) {
  detail::Fnv f;
  for (const TensorMove& m : s.moves) {
    for (std::int64_t n : m.src.shape()) f.add(n);
    f.add(to_string(m.src.dtype())).add(to_string(m.dst.dtype()));
    f.add(m.src.str()).add("|").add(m.dst.str()).add(";");
  }
  return f.h;
}

// A mode's steps by kind, in the order each first comes: one of each, and how many there are.
// A model's layers repeat their shapes and layouts (gpt2-small's 588 gather steps are 61
// kinds between meshes of 8,192 devices): a prediction prices each kind once, and times its
// planning (rank_plan_seconds).
struct StepKind {
  const Step* step;
  std::int64_t count;
};
std::vector<StepKind> step_kinds(const Loaded& l) {
  std::vector<StepKind> kinds;
  std::map<std::uint64_t, std::size_t> index;
  for (const Step& s : l.steps) {
    const auto [it, fresh] = index.emplace(step_digest(s), kinds.size());
    if (fresh) kinds.push_back({&s, 0});
    ++kinds[it->second].count;
  }
  return kinds;
}

// The model's prediction of a mode: its steps one after the other. The kinds priced are bounded
// together as one plan is (limits().plan_ops), so that a mode of many steps on large meshes is
// refused within that work, not after hours.
SyncStats predict_steps(const Loaded& l) {
  // The whole sync in this process alone: under the whole planning bound, as --predict's (the
  // local backend gives each device's part a share of it, which the whole sync exceeds).
  SyncOptions whole = l.options;
  whole.plan.max_plan_bytes = 0;
  SyncStats total;
  std::int64_t messages = 0, priced = 0;
  double bounding = -1;  // the largest bound a kind of step adds: its busiest link is reported
  for (const StepKind& k : step_kinds(l)) {
    const SyncStats p = predict_sync(k.step->moves, l.topology, whole);
    messages += p.messages;
    ++priced;
    if (messages > limits().plan_ops)
      throw ValidationError(
          "plan ops", "the " + std::to_string(priced) + " kinds of step of mode " + l.mode +
                          " priced so far hold " + std::to_string(messages) +
                          " messages, over the limit of " + std::to_string(limits().plan_ops) +
                          " (raise it with MESHCAST_MAX_PLAN_OPS)");
    for (const auto field : {&SyncStats::messages, &SyncStats::boxes, &SyncStats::bytes_moved,
                             &SyncStats::bytes_network})
      if (!detail::add_product(total.*field, p.*field, k.count))
        throw ValidationError("model", "the sync would move more than 2^63 bytes (8 EiB)");
    total.predicted_seconds += p.predicted_seconds * static_cast<double>(k.count);
    total.link_bound_seconds += p.link_bound_seconds * static_cast<double>(k.count);
    if (const double adds = p.link_bound_seconds * static_cast<double>(k.count); adds > bounding)
      bounding = adds, total.busiest_link = p.busiest_link;
  }
  total.tensors = static_cast<std::int64_t>(l.model.moves.size());
  return total;
}

// The seconds device `device` takes to plan its part of every step: each kind timed once, and
// (`repeats`) once more where it repeats, the repeats at the second time (the first pays what a
// process pays once, which the count multiplied: 20,000 alike steps read 3.8 s, planned in
// 0.29 s). Without `repeats`, each kind planned once: a check that every kind can be.
double rank_plan_seconds(const Loaded& l, int device, bool repeats = true) {
  const auto timed = [&](const StepKind& k) {
    const auto t0 = Clock::now();
    (void)plan_sync(k.step->moves, device, l.topology, l.options);
    return since(t0);
  };
  double seconds = 0;
  for (const StepKind& k : step_kinds(l)) {
    seconds += timed(k);
    if (k.count > 1 && repeats) seconds += timed(k) * static_cast<double>(k.count - 1);
  }
  return seconds;
}

struct RunResult {
  std::vector<double> seconds;  // per timed iteration (rank 0's)
  std::int64_t mismatches = 0;  // this device's
  double plan_seconds = 0;      // this device's
};

// A device's tiles of every tensor: its sources filled with the test values (a cast's, the
// target dtype's values widened: exact, so the cast must give them back), its targets zero.
struct Tiles {
  std::vector<std::vector<std::byte>> src, dst;
};
Tiles device_tiles(const Loaded& l, int me) {
  const auto& moves = l.model.moves;
  Tiles t{std::vector<std::vector<std::byte>>(moves.size()),
          std::vector<std::vector<std::byte>>(moves.size())};
  for (std::size_t i = 0; i < moves.size(); ++i) {
    const TensorMove& m = moves[i];
    if (m.src.mesh().contains(me)) {
      t.src[i].resize(static_cast<std::size_t>(m.src.local_elements(me)) *
                      dtype_size(m.src.dtype()));
      if (m.src.dtype() == m.dst.dtype()) {
        fill_source(m.src, me, t.src[i].data());
      } else {
        const Layout as(m.src.shape(), m.dst.dtype(), m.src.mesh(), m.src.spec());
        std::vector<std::byte> narrow(static_cast<std::size_t>(as.local_elements(me)) *
                                      dtype_size(as.dtype()));
        fill_source(as, me, narrow.data());
        const Box tile = m.src.tile_of(me);
        convert_region(Region::of(narrow.data(), dtype_size(as.dtype()), tile, tile), as.dtype(),
                       Region::of(t.src[i].data(), dtype_size(m.src.dtype()), tile, tile),
                       m.src.dtype());
      }
    }
    if (m.dst.mesh().contains(me))
      t.dst[i].resize(static_cast<std::size_t>(m.dst.local_elements(me)) *
                      dtype_size(m.dst.dtype()));
  }
  return t;
}

// One device's run over its tiles (on the GPU given an NCCL session): its plans, `iters` timed
// runs of every step after a warm-up, then (verify) every element of every target tile checked.
// `boot`: a process backend's, over which the ranks plan together (a rank whose own part is over
// the planning bounds is refused on every rank, not left for the others to find dead).
RunResult run_device(const Loaded& l, Communicator& comm, Tiles& tiles, int iters, bool verify,
                     Bootstrap* boot = nullptr, NcclSession* gpu = nullptr) {
  const int me = comm.rank();
  const auto& moves = l.model.moves;
  auto& [src, dst] = tiles;
  RankBuffers memory(gpu);
  std::vector<void*> src_at, dst_at;
  for (std::size_t i = 0; i < moves.size(); ++i) {
    src_at.push_back(memory.place(src[i]));
    dst_at.push_back(memory.place(dst[i]));
  }
  // The gather mode's two scratch buffers (one tensor at a time), as large as the largest
  // source: a cast only narrows (manifest.cc), so its target dtype takes no more.
  std::int64_t largest = 0;
  for (const TensorMove& t : moves) largest = std::max(largest, t.src.bytes());
  void* gathered = nullptr;
  void* whole = nullptr;
  RunResult r;
  std::vector<SyncPlan> plans;
  const auto plan = [&] {
    const auto t0 = Clock::now();
    for (const Step& s : l.steps) plans.push_back(plan_sync(s.moves, me, l.topology, l.options));
    r.plan_seconds = since(t0);
  };
  if (boot)
    checked_together(*boot, plan);
  else
    plan();
  auto buffer = [&](Buffer b, std::size_t i) -> void* {
    if (b == Buffer::Source) return src_at[i];
    if (b == Buffer::Target) return dst_at[i];
    void*& v = b == Buffer::Gathered ? gathered : whole;
    if (!v && largest > 0) v = memory.scratch(static_cast<std::size_t>(largest));
    return v;
  };
  for (int it = -1; it < iters; ++it) {  // iteration -1 warms up
    comm.barrier();
    const auto start = Clock::now();
    for (std::size_t k = 0; k < plans.size(); ++k) {
      const Step& s = l.steps[k];
      std::vector<const void*> in;
      std::vector<void*> out;
      for (std::size_t j = 0; j < s.moves.size(); ++j) {
        const auto i = static_cast<std::size_t>(s.tensor[j]);
        in.push_back(s.moves[j].src.mesh().contains(me) ? buffer(s.from, i) : nullptr);
        out.push_back(s.moves[j].dst.mesh().contains(me) ? buffer(s.to, i) : nullptr);
      }
      sync(plans[k], comm.world(), in, out);
    }
    comm.barrier();
    if (it >= 0) r.seconds.push_back(since(start));
  }
  if (verify)
    for (std::size_t i = 0; i < moves.size(); ++i)
      if (moves[i].dst.mesh().contains(me)) {
        memory.fetch(dst_at[i], dst[i]);
        r.mismatches += count_mismatches(moves[i].dst, me, dst[i].data());
      }
  return r;
}

// `p`: the sync's prediction; null for a run whose whole sync was not priced, `unpriced` saying
// why (its plan is over the bounds that one process may plan: each rank's part was not).
void print(const SyncArgs& a, const Loaded& l, const SyncStats* p, const RunResult* run,
           double rank_plan, const std::string& unpriced = {}) {
  const double seconds = run ? median(run->seconds) : 0;
  const std::int64_t bytes = l.model.bytes();
  const auto tensors = static_cast<std::int64_t>(l.model.moves.size());
  if (a.json) {
    using nlohmann::json;
    const auto priced = [&](auto field) { return p ? json(p->*field) : json(nullptr); };
    json j = {{"mode", a.mode},
              {"tensors", tensors},
              {"model_bytes", bytes},
              {"cast", a.cast.empty() ? json(nullptr) : json(a.cast)},
              {"fork", !a.no_fork},
              {"bytes_moved", priced(&SyncStats::bytes_moved)},
              {"bytes_network", priced(&SyncStats::bytes_network)},
              {"messages", priced(&SyncStats::messages)},
              {"boxes", priced(&SyncStats::boxes)},
              {"predicted_seconds", priced(&SyncStats::predicted_seconds)},
              {"link_bound_seconds", priced(&SyncStats::link_bound_seconds)},
              {"busiest_link", priced(&SyncStats::busiest_link)},
              {"plan_seconds", rank_plan},
              {"topology", l.topology.name()}};
    if (!p) j["unpriced"] = unpriced;
    if (run) {
      j["backend"] = a.backend;
      j["iters"] = run->seconds.size();
      j["seconds"] = seconds;
      j["times"] = run->seconds;
      j["verified"] = a.verify && run->mismatches == 0;
      j["mismatches"] = a.verify ? json(run->mismatches) : json(nullptr);
    }
    std::cout << j.dump() << '\n';
    return;
  }
  std::cout << "sync " << tensors << " tensors (" << human_bytes(bytes) << "), mode " << a.mode
            << (a.cast.empty() ? "" : ", cast to " + a.cast) << ", topology " << l.topology.name()
            << '\n';
  if (p)
    std::cout << "messages     " << p->messages << " carrying " << p->boxes << " boxes\n"
              << "bytes moved  " << human_bytes(p->bytes_moved) << " (network "
              << human_bytes(p->bytes_network) << ")\n"
              << "predicted    " << human_seconds(p->predicted_seconds) << " (link bound "
              << human_seconds(p->link_bound_seconds)
              << (p->busiest_link.empty() ? "" : ", " + p->busiest_link) << ")\n";
  else
    std::cout << "predicted    not priced: " << unpriced << '\n';
  std::cout << "plan         " << human_seconds(rank_plan) << " per device\n";
  if (!run) return;
  std::cout << "backend      " << a.backend << ", " << run->seconds.size()
            << " iterations after a warm-up\n"
            << "median time  " << human_seconds(seconds) << " ("
            << human_rate(seconds > 0 ? static_cast<double>(bytes) / seconds : 0)
            << " of model bytes)\n"
            << "verified     "
            << (!a.verify              ? std::string("not checked (pass --verify)")
                : run->mismatches == 0 ? std::string("yes, 0 mismatches")
                                       : "NO, " + std::to_string(run->mismatches) + " mismatches")
            << '\n';
}

// A saved sync: its inputs whole (the tensors' layouts in the model file's explicit form, the
// mode, the options and the topology), from which every rank derives its own part as it would
// from the flags: a job of thousands of ranks stores no rank's messages.
constexpr const char* kSavedSync = "meshcast_sync_plan";

void save_sync(const SyncArgs& a, const Loaded& l) {
  if (is_auto_topology(a.topology))
    throw ValidationError("topology",
                          "auto is discovered when a job starts; save a plan with a "
                          "topology file or preset");
  // The tensors written member by member: an ordered_json object finds each key by a linear
  // search, quadratic in the model's tensors (500,000 took minutes). Their names are distinct.
  std::string tensors = "{";
  for (std::size_t i = 0; i < l.model.moves.size(); ++i) {
    const TensorMove& t = l.model.moves[i];
    nlohmann::ordered_json e = {{"shape", t.src.shape()},
                                {"dtype", l.model.dtype_names[i]},
                                {"src", t.src.str()},
                                {"dst", t.dst.str()}};
    // Under a cast, every target's dtype: one that opted out of it must stay out on replay.
    if (t.dst.dtype() != t.src.dtype() || !a.cast.empty())
      e["dst_dtype"] = t.dst.dtype() == t.src.dtype() ? l.model.dtype_names[i]  // F8_E4M3: not i8
                                                      : to_string(t.dst.dtype());
    (i ? tensors += ',' : tensors) += nlohmann::json(t.name).dump() + ':' + e.dump();
  }
  tensors += '}';
  const nlohmann::ordered_json out = {
      {kSavedSync, 1},
      {"mode", a.mode},
      {"cast", a.cast},
      {"strategy", a.strategy},
      {"max_staging_bytes", l.options.max_staging_bytes},
      {"fork", !a.no_fork},
      {"topology", nlohmann::ordered_json::parse(l.topology.to_json())}};
  std::string text = out.dump();
  text.pop_back();  // its closing brace: the tensors follow
  write_file(a.save_plan, text + ",\"tensors\":" + tensors + "}\n", "save-plan");
}

// `a` with --plan's file read into it. Flags the file fixes are refused where they differ.
SyncArgs with_saved_sync(const SyncArgs& a) {
  if (a.plan_file.empty()) return a;
  if (!a.save_plan.empty()) throw ValidationError("save-plan", "cannot be given with --plan");
  const std::string text = read_input_file(a.plan_file, "plan", limits().input_file_bytes);
  // Read in place, the tensors' and topology's text kept as it is: a tree of the document
  // (ordered_json) found each key by a linear search, quadratic in the model's tensors.
  detail::JsonReader r(text, "plan");
  r.check();
  const std::string not_saved = a.plan_file + " is not a sync saved by meshcast sync --save-plan";
  if (r.peek() != detail::JsonReader::Type::Object) throw ValidationError("plan", not_saved);
  std::map<std::string, std::string, std::less<>> strings;
  std::optional<std::int64_t> format, staging;
  std::optional<bool> fork;
  std::string_view topology, tensors;
  r.object("plan", [&](std::string_view key) {
    const auto field = "plan." + std::string(key);
    if (key == kSavedSync) {
      const std::string_view v = r.raw();
      if (v != "1")
        throw ValidationError("plan", a.plan_file + " is a sync saved in format " +
                                          detail::printable(v, 16) + "; this build reads 1");
      format = 1;
    } else if (key == "mode" || key == "cast" || key == "strategy") {
      if (r.peek() != detail::JsonReader::Type::String)
        throw ValidationError(field, "missing or not a string");
      strings[std::string(key)] = r.string(field);
    } else if (key == "max_staging_bytes") {
      staging = r.integer<std::int64_t>(field);
    } else if (key == "fork") {
      if (r.peek() != detail::JsonReader::Type::Bool) throw ValidationError(field, "not a boolean");
      fork = r.boolean(field);
    } else if (key == "topology" || key == "tensors") {
      if (r.peek() != detail::JsonReader::Type::Object)
        throw ValidationError(field, "missing or not an object");
      (key == "topology" ? topology : tensors) = r.raw();
    } else {  // written by meshcast (the format's keys only grow): a key edited in or mistyped
      throw ValidationError(field, "unknown key (a saved sync has " + std::string(kSavedSync) +
                                       ", mode, cast, strategy, max_staging_bytes, fork, "
                                       "topology and tensors)");
    }
  });
  if (!format) throw ValidationError("plan", not_saved);
  SyncArgs s = a;
  const auto text_of = [&](const char* key) {
    const auto it = strings.find(key);
    if (it == strings.end())
      throw ValidationError(std::string("plan.") + key, "missing or not a string");
    return it->second;
  };
  for (const auto& [flag, given, key] :
       {std::tuple{"mode", &a.mode, "mode"}, std::tuple{"cast", &a.cast, "cast"},
        std::tuple{"strategy", &a.strategy, "strategy"}}) {
    const std::string saved = text_of(key);
    if (a.given.count(flag) && *given != saved)
      throw ValidationError(flag, "the saved plan " + a.plan_file + " was made with --" + flag +
                                      " " + (saved.empty() ? "unset" : saved) + "; leave --" +
                                      flag + " out to run it");
  }
  s.mode = text_of("mode");
  s.cast = text_of("cast");
  s.strategy = text_of("strategy");
  if (!staging) throw ValidationError("plan.max_staging_bytes", "missing or not an integer");
  s.max_staging = std::to_string(*staging);
  if (a.given.count("max-staging-bytes") &&
      parse_size(a.max_staging, "max-staging-bytes") != *staging)
    throw ValidationError("max-staging-bytes", "the saved plan " + a.plan_file + " was made with " +
                                                   s.max_staging + "; leave it out to run it");
  // Absent from files saved before chains forked: they may.
  s.no_fork = fork && !*fork;
  if (a.no_fork && !s.no_fork)
    throw ValidationError("no-fork", "the saved plan " + a.plan_file +
                                         " was made without it; leave --no-fork out to run it");
  for (const auto& [flag, given] : {std::pair{"model", &a.model}, std::pair{"system", &a.system}})
    if (!given->empty())
      throw ValidationError(flag, "the saved plan " + a.plan_file + " fixes it; leave --" +
                                      std::string(flag) + " out to run it");
  if (topology.empty()) throw ValidationError("plan.topology", "missing or not an object");
  // The same topology again is fine, as the same --mode is: only another one is refused.
  if (!a.topology.empty() &&
      (is_auto_topology(a.topology) ||
       load_topology(a.topology).to_json() !=
           Topology::from_json(std::string(topology), "plan.topology").to_json()))
    throw ValidationError("topology", "the saved plan " + a.plan_file +
                                          " was made on another topology; leave --topology out "
                                          "to run it");
  if (tensors.empty()) throw ValidationError("plan.tensors", "missing or not an object");
  s.topology_text = std::string(topology);
  s.model_text = std::string(tensors);
  return s;
}

}  // namespace

void add_sync_options(CLI::App& cmd, SyncArgs& a) {
  const auto noted = [&a](const char* flag) {
    return [&a, flag](const std::string&) { a.given.insert(flag); };
  };
  cmd.add_option("--model", a.model,
                 "model file (unless --plan): NCCL M2N's model config ({\"name\": {\"shape\", "
                 "\"dtype\"}}, with --system) or the explicit form ({\"name\": {\"shape\", "
                 "\"dtype\", \"src\", \"dst\"}}); see models/README.md")
      ->type_name("FILE")
      ->each(noted("model"));
  cmd.add_option("--system", a.system,
                 "NCCL M2N's system config: the trainer's and the generator's parallel degrees "
                 "(placed by the Megatron convention, include/meshcast/manifest.h)")
      ->type_name("FILE")
      ->each(noted("system"));
  cmd.add_option("--topology", a.topology,
                 "topology: a JSON file, a preset name (dgx-a100, ...), or auto (--backend "
                 "mpi|ucx: discovered from the job's host names and measured links; "
                 "auto:PRESET takes PRESET's links; one host with the local backend and "
                 "--predict); default: one host")
      ->type_name("FILE|NAME|auto")
      ->each(noted("topology"));
  cmd.add_option("--backend", a.backend, "communicator: local (threads), mpi, ucx, nccl")
      ->type_name("NAME")
      ->capture_default_str();
  cmd.add_option("--mode", a.mode,
                 "fused (one plan for the model), per-tensor (one plan per tensor, one after the "
                 "other) or gather (each tensor gathered on the first trainer of its stage, then "
                 "broadcast whole to every generator)")
      ->type_name("MODE")
      ->capture_default_str()
      ->each(noted("mode"));
  cmd.add_option("--cast", a.cast,
                 "bf16 or f16: f32 tensors cross as this dtype (cast by the sender, round to "
                 "nearest even)")
      ->type_name("DTYPE")
      // Spelled as model files spell dtypes too ("BF16").
      ->transform([](std::string s) {
        std::transform(s.begin(), s.end(), s.begin(),
                       [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
        return s;
      })
      ->each(noted("cast"));
  cmd.add_option("--strategy", a.strategy, "per tensor: auto, broadcast, sendrecv, allgather")
      ->type_name("NAME")
      ->capture_default_str()
      ->each(noted("strategy"));
  cmd.add_option("--max-staging-bytes", a.max_staging,
                 "packing memory in flight per device (K/M/G/T suffixes; 8 bytes to 1 TiB)")
      ->type_name("BYTES")
      ->capture_default_str()
      ->each(noted("max-staging-bytes"));
  cmd.add_option("--iters", a.iters, "timed iterations after one warm-up (>= 1)")
      ->type_name("N")
      ->capture_default_str();
  cmd.add_option("--save-plan", a.save_plan,
                 "write the sync as one file (its tensors' layouts, mode, options, topology) and "
                 "exit: every rank derives its own part from it; run it with --plan")
      ->type_name("FILE")
      ->each(noted("save-plan"));
  cmd.add_option("--plan", a.plan_file,
                 "run a sync saved by --save-plan (it fixes --model, --system, --topology, "
                 "--mode, --cast, --strategy, --max-staging-bytes and --no-fork)")
      ->type_name("FILE")
      ->each(noted("plan"));
  cmd.add_flag("--no-fork", a.no_fork,
               "multicast chains never fork at the root (by default one forks where the sources "
               "on the root's host use more NICs than its receivers there, so that what leaves "
               "the host goes through the sources' NICs): the baseline of what forking gains");
  cmd.add_flag("--verify", a.verify, "check every element of every tensor on every generator");
  cmd.add_flag("--predict", a.predict,
               "plan and price the mode by the cost model without running it (any size)");
  cmd.add_flag(
      "--json", a.json,
      "print one JSON object: mode, cast, fork, topology, tensors, model_bytes, bytes_moved, "
      "bytes_network, messages, boxes, predicted_seconds, link_bound_seconds (busiest "
      "link's bytes / its rate), busiest_link, plan_seconds (one device's planning); "
      "when run also backend, iters, seconds (median), times, verified, mismatches, and "
      "unpriced where the whole sync is over one process's planning bounds (then bytes_moved "
      "to busiest_link are null)");
}

namespace {

// The gather mode's two scratch buffers of a rank, each as large as the largest tensor (none in
// the other modes).
std::int64_t scratch_bytes(const Loaded& l) {
  const bool gathers = std::any_of(l.steps.begin(), l.steps.end(),
                                   [](const Step& s) { return s.from == Buffer::Gathered; });
  std::int64_t largest = 0;
  for (const TensorMove& t : l.model.moves) largest = std::max(largest, t.src.bytes());
  return gathers ? 2 * largest : 0;
}

// The bytes `me` holds in a run: its source and target tiles, and the scratch.
std::int64_t rank_buffer_bytes(const Loaded& l, int me) {
  std::int64_t bytes = scratch_bytes(l);
  for (const TensorMove& t : l.model.moves) {
    if (t.src.mesh().contains(me)) bytes += t.src.local_elements(me) * dtype_size(t.src.dtype());
    if (t.dst.mesh().contains(me)) bytes += t.dst.local_elements(me) * dtype_size(t.dst.dtype());
  }
  return bytes;
}

// What every iteration writes at least: every target tile of every tensor (each mode moves it
// once, or, gathering, more).
double target_bytes(const Loaded& l) {
  double bytes = 0;
  for (const TensorMove& t : l.model.moves)
    for (int d : t.dst.mesh().devices())
      bytes += static_cast<double>(t.dst.local_elements(d)) *
               static_cast<double>(dtype_size(t.dst.dtype()));
  return bytes;
}

// Refuses, before any planning, a run whose devices' plans would exceed the planning memory:
// each device in this process (every device on the local backend) holds every move of every
// step (gather's three a tensor), at kTensorPlanBytes, and 12 bytes for each id of its meshes
// (both layouts' id lists, copied into the device's plan, and a chain's receivers on each of
// its devices: 11.8 KB a tensor and device measured for 512 -> 512 devices, where 64 tensors on
// the local backend took 1.4 GB).
void check_plans_memory(const Loaded& l, std::size_t devices_here) {
  const ModelManifest& m = l.model;
  double per_device = 0;
  for (const Step& st : l.steps)
    for (const TensorMove& t : st.moves)
      per_device += static_cast<double>(kTensorPlanBytes) +
                    12.0 * static_cast<double>(t.src.mesh().size() + t.dst.mesh().size());
  const double bytes = per_device * static_cast<double>(devices_here);
  if (bytes > static_cast<double>(limits().plan_memory_bytes))
    throw ValidationError("plan memory",
                          (devices_here == 1 ? std::string("the device's plan")
                                             : std::to_string(devices_here) + " devices' plans") +
                              " of " +
                              detail::counted(static_cast<std::int64_t>(m.moves.size()), "tensor") +
                              ", an estimated " + human_bytes(detail::saturated_int64(bytes)) +
                              (devices_here == 1 ? ", exceeds" : ", exceed") + " the limit of " +
                              human_bytes(limits().plan_memory_bytes) +
                              " (raise it with MESHCAST_MAX_PLAN_MEMORY_BYTES)");
}

// One rank's sync (every device's on the local backend, `s` null): its input checked (on a
// process backend together with every rank's), then saved, priced or run.
int sync_rank(const SyncArgs& args, ProcessSession* s) {
  SyncArgs a;
  int iters = 0;
  std::optional<Loaded> l;
  std::vector<int> devices;
  const auto prepare = [&] {
    a = with_saved_sync(args);
    iters = parse_iters(a.iters);
    try {
      l = load(a);
    } catch (const Error& e) {
      // A value --plan's file fixed is named as the file's field, not as the option.
      static const std::map<std::string, std::string> kSaved = {
          {"mode", "mode"},
          {"cast", "cast"},
          {"strategy", "strategy"},
          {"max-staging-bytes", "max_staging_bytes"}};
      const auto saved = kSaved.find(e.field());
      if (a.plan_file.empty() || saved == kSaved.end()) throw;
      throw Error(e.kind(), "plan." + saved->second, e.cause() + " (in " + a.plan_file + ")");
    }
    devices = sync_devices(l->model.moves);
    if (!a.predict && a.save_plan.empty()) {
      // Fused: every target device takes each tensor of each step in one transfer at least
      // (boxes coalesced into messages), and a cast or a pending sum in a piece per bucket
      // (65,536 floats summed under an 8-byte staging bound: as many messages an iteration).
      // Per-tensor and gather modes sync each tensor alone, in a message per box and receiver
      // (an all-gather of 100 small tensors over 64 devices sends 403,200 an iteration, 63 times
      // its tensors' targets, and took 5 s).
      double moves = 0;
      for (const Step& st : l->steps)
        for (const TensorMove& t : st.moves)
          moves += std::max(
              sync_transfers(t, l->options),
              a.mode == "fused"
                  ? 0
                  : estimate_plan_size(t.src, t.dst, Strategy::SendRecv, Balance::None).ops);
      check_run(iters, target_bytes(*l), moves, s ? 0 : static_cast<std::int64_t>(devices.size()));
      check_plans_memory(*l, s ? 1 : devices.size());
      // The local backend plans every device's part in this process, at once: each gets its
      // share of the planning memory, which auto's choices and the parts' check then keep to
      // (before, each part could take the whole bound: 128 devices reached 8.5 GB).
      if (!s && devices.size() > 1)
        l->options.plan.max_plan_bytes = plan_memory_share(
            limits().plan_memory_bytes, static_cast<std::int64_t>(devices.size()));
    }
    if (!s) return;
    const std::int64_t needed = std::int64_t{devices.back()} + 1;  // (the largest id is 2^31 - 1)
    // A system places T + G devices, whether or not its last generator takes a tensor.
    const std::int64_t placed = std::int64_t{l->model.trainer_devices} + l->model.generator_devices;
    if (!a.system.empty() && s->comm.size() != placed)
      throw ValidationError("system", "places " + std::to_string(placed) +
                                          " devices (trainers and generators), but " +
                                          std::to_string(s->comm.size()) + " ranks started");
    require_ranks(*s, needed,
                  "the model's meshes use device ids up to " + std::to_string(needed - 1), false);
  };
  if (!s) prepare();
#ifdef MESHCAST_HAS_MPI  // without it s is null
  else {
    checked_together(s->boot, prepare);
    // A rank given another model, system or option would hang or corrupt: refuse it first.
    // The first that differs is named: the options a --plan file fixes before the file, the
    // file before what it holds (its tensors are the model).
    const auto file_digest = [](const std::string& path, const char* field) {
      return path.empty() ? std::string()
                          : digest(read_input_file(path, field, limits().input_file_bytes));
    };
    const bool runs = !a.predict && a.save_plan.empty();
    agree(s->boot,
          {{"mode", a.mode},
           {"cast", a.cast},
           {"strategy", a.strategy},
           {"max-staging-bytes", std::to_string(l->options.max_staging_bytes)},
           {"no-fork", a.no_fork ? "on" : "off"},
           {"iters", std::to_string(iters)},
           {"verify", a.verify ? "on" : "off"},
           {"predict", a.predict ? "on" : "off"},
           {"save-plan", a.save_plan},
           {"backend", s->comm.backend()},
           {"plan", file_digest(a.plan_file, "plan")},
           {"model", a.model_text.empty() ? file_digest(a.model, "model") : digest(a.model_text)},
           {"system", file_digest(a.system, "system")},
           {"topology", digest(is_auto_topology(a.topology) ? a.topology : l->topology.to_json())},
           // Each rank of a run plans its own part, under these: auto leaves out strategies
           // past them, and the parts are split to fit (a rank of another bound planned another
           // sync). --predict and --save-plan plan on rank 0 alone, or nothing.
           {"MESHCAST_MAX_PLAN_OPS", runs ? std::to_string(limits().plan_ops) : ""},
           {"MESHCAST_MAX_PLAN_MEMORY_BYTES",
            runs ? std::to_string(limits().plan_memory_bytes) : ""}});
  }
#endif
  const bool root = !s || s->comm.rank() == 0;  // the rank that writes and prints
  if (!a.save_plan.empty() || a.predict) {
    const auto report = [&] {
      if (!root) return;
      if (!a.save_plan.empty()) {
        save_sync(a, *l);
        std::cout << "saved " << a.save_plan << ": " << l->model.moves.size() << " tensors, mode "
                  << a.mode << "; run it with meshcast sync --plan " << a.save_plan << '\n';
        return;
      }
      const SyncStats p = predict_steps(*l);
      const double plan =
          std::max(rank_plan_seconds(*l, devices.front()), rank_plan_seconds(*l, devices.back()));
      print(a, *l, &p, nullptr, plan);
    };
    if (!s) report();
#ifdef MESHCAST_HAS_MPI
    else  // the others wait for rank 0's outcome: its failure is theirs, none left waiting
      checked_together(s->boot, report);
#endif
    return 0;
  }
  // The report's prediction, priced before the run under the whole planning bound (it was
  // priced after the run, and a local sync of 2.5 M messages ran 16 s and 3 GB to be refused
  // there). A whole sync over the bounds of one process is not priced but runs: each rank
  // plans only its part (a job of tens of thousands of ranks).
  std::optional<SyncStats> predicted;
  std::string unpriced;
  const auto predict = [&] {
    if (!root) return;
    try {
      predicted = predict_steps(*l);
    } catch (const ValidationError& e) {
      if (e.field() != "plan memory" && e.field() != "plan ops") throw;
      unpriced = e.what();
    }
  };
  RunResult result;
  if (!s) {
    predict();
    std::vector<const Layout*> layouts;
    for (const TensorMove& t : l->model.moves) {
      layouts.push_back(&t.src);
      layouts.push_back(&t.dst);
    }
    // Every device's scratch, as a process backend's rank counts its own (rank_buffer_bytes).
    const double scratch =
        static_cast<double>(devices.size()) * static_cast<double>(scratch_bytes(*l));
    check_local_capacity(
        layouts, "model",
        [&](std::size_t k) {
          return k == layouts.size() ? std::string("the gather mode's whole-tensor buffers")
                                     : "tensors." + l->model.moves[k / 2].name +
                                           (k % 2 ? " (target)" : " (source)");
        },
        scratch);
    // A sync too large to plan is refused alike on every device (its parts are summed over the
    // tensors, the same everywhere): one device plans first, so that such a sync ends before
    // a thread per device prices it at once (128 devices: 1.1 GB and 6 s before the refusal).
    (void)rank_plan_seconds(*l, devices.front(), false);
    // Ids up to the largest, but a thread only for each device of the model.
    LocalWorld world(devices.back() + 1);
    // Tiles filled before the devices start, where a long fill is no stall (run_local).
    std::vector<Tiles> tiles(devices.size());
    detail::parallel_for(devices.size(),
                         [&](std::size_t k) { tiles[k] = device_tiles(*l, devices[k]); });
    std::atomic<std::int64_t> wrong{0};
    std::mutex m;
    world.run(
        [&](Communicator& comm) {
          const auto slot = static_cast<std::size_t>(
              std::lower_bound(devices.begin(), devices.end(), comm.rank()) - devices.begin());
          RunResult r = run_device(*l, comm, tiles[slot], iters, a.verify);
          wrong += r.mismatches;
          if (comm.rank() == devices.front()) {
            std::lock_guard lock(m);
            result = std::move(r);
          }
        },
        devices);
    result.mismatches = wrong;
  }
#ifdef MESHCAST_HAS_MPI
  else {
    check_job_capacity(s->boot, rank_buffer_bytes(*l, s->comm.rank()), "model");
    // Every rank the same topology: discovered together (identical on every rank).
    if (is_auto_topology(a.topology)) l->topology = discover_job_topology(*s, a.topology);
    checked_together(s->boot, predict);  // rank 0's outcome is every rank's
    Tiles tiles = device_tiles(*l, s->comm.rank());
    result = run_device(*l, s->comm, tiles, iters, a.verify, &s->boot, s->nccl);
    result.mismatches = s->boot.sum(result.mismatches);
  }
#endif
  if (root) print(a, *l, predicted ? &*predicted : nullptr, &result, result.plan_seconds, unpriced);
  return !a.verify || result.mismatches == 0 ? 0 : 1;
}

}  // namespace

int run_sync(const SyncArgs& args) {
  check_backend(args.backend);
  // The library names SyncOptions' fields; here they were given as options (also in a line
  // relayed from another rank, "rank 0: max_staging_bytes: ...").
  const auto as_options = [&](ProcessSession* s) {
    try {
      return sync_rank(args, s);
    } catch (const Error& e) {
      // The only bound the CLI sets is the local backend's per-device share.
      const std::string share = "(PlanOptions::max_plan_bytes)";
      if (const auto at = e.cause().find(share); at != std::string::npos)
        throw Error(e.kind(), e.field(),
                    std::string(e.cause()).replace(
                        at, share.size(),
                        "(a device's share of MESHCAST_MAX_PLAN_MEMORY_BYTES: the local backend "
                        "plans every device's part in one process)"));
      const std::string field = "max_staging_bytes", option = "max-staging-bytes";
      if (e.field() == field) throw Error(e.kind(), option, e.cause());
      if (!e.cause().starts_with(field + ": ")) throw;
      throw Error(e.kind(), e.field(), option + e.cause().substr(field.size()));
    }
  };
  if (args.backend == "local") return as_options(nullptr);
  int status = 0;
#ifdef MESHCAST_HAS_MPI  // without it check_backend() refused every other backend
  with_process_backend(args.backend, [&](ProcessSession& s) { status = as_options(&s); });
#endif
  return status;
}

}  // namespace meshcast::cli
