#include "meshcast/training/schedule.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include "meshcast/error.h"

namespace meshcast::training {
namespace {

constexpr ScheduleKind kAllKinds[] = {ScheduleKind::GPipe, ScheduleKind::OneFOneB,
                                      ScheduleKind::Interleaved, ScheduleKind::Eager1F1B};

// Printable ASCII only and at most 64 characters, so that the message stays one line.
std::string quote(std::string_view s) {
  std::string out = "'";
  for (char c : s.substr(0, 64)) out += (c >= 32 && c < 127) ? c : '?';
  return out + (s.size() > 64 ? "...'" : "'");
}

std::string op_str(const PipeOp& op) {
  return std::string(op.forward ? "F" : "B") + "(mb " + std::to_string(op.micro_batch) +
         ", piece " + std::to_string(op.piece) + ")";
}

// The 1F1B family: `lead` forwards, then one backward and one forward in turn while forwards
// remain, then the remaining backwards. op(k, forward) names the k-th pass of each direction.
template <class Op>
std::vector<PipeOp> lead_then_alternate(int total, int lead, Op op) {
  std::vector<PipeOp> ops;
  int f = 0, b = 0;
  for (; f < lead; ++f) ops.push_back(op(f, true));
  for (; f < total; ++f, ++b) {
    ops.push_back(op(b, false));
    ops.push_back(op(f, true));
  }
  for (; b < total; ++b) ops.push_back(op(b, false));
  return ops;
}

// One piece per stage; micro-batches in order in both directions.
std::vector<PipeOp> single_chunk(int stage, int micro_batches, int lead) {
  return lead_then_alternate(micro_batches, lead, [&](int k, bool forward) {
    return PipeOp{forward, k, stage};
  });
}

// Megatron-LM's interleaved 1F1B (forward_backward_pipelining_with_interleaving): virtual
// micro-batch k runs chunk (k / n) % v on micro-batch (k / (n v)) n + k % n, so a group of n
// micro-batches goes through a chunk before moving on to the next; backwards visit the chunks
// in reverse. Megatron's warm-up, 2(n-s-1) + (v-1)n, is followed by a forward before the
// first backward.
std::vector<PipeOp> interleaved(int stage, int n, int micro_batches, int v) {
  const int total = micro_batches * v;
  return lead_then_alternate(total, std::min(total, (n - stage - 1) * 2 + (v - 1) * n + 1),
                             [&](int k, bool forward) {
                               const int chunk = (k / n) % v;
                               return PipeOp{forward, (k / (n * v)) * n + k % n,
                                             (forward ? chunk : v - 1 - chunk) * n + stage};
                             });
}

}  // namespace

std::string to_string(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::GPipe:
      return "gpipe";
    case ScheduleKind::OneFOneB:
      return "1f1b";
    case ScheduleKind::Interleaved:
      return "interleaved";
    case ScheduleKind::Eager1F1B:
      return "eager-1f1b";
  }
  return "?";
}

ScheduleKind parse_schedule(std::string_view text, const std::string& field) {
  for (ScheduleKind k : kAllKinds)
    if (text == to_string(k)) return k;
  throw ValidationError(field, "unknown schedule " + quote(text) +
                                   " (expected gpipe, 1f1b, interleaved or eager-1f1b)");
}

void check_schedule(ScheduleKind kind, int stages, int micro_batches, int chunks) {
  if (stages < 1)
    throw ValidationError("stages", "must be >= 1 (got " + std::to_string(stages) + ")");
  if (micro_batches < 1)
    throw ValidationError("micro_batches",
                          "must be >= 1 (got " + std::to_string(micro_batches) + ")");
  if (chunks < 1)
    throw ValidationError("chunks", "must be >= 1 (got " + std::to_string(chunks) + ")");
  if (chunks > 1 && kind != ScheduleKind::Interleaved)
    throw ValidationError("chunks", "only the interleaved schedule runs " + std::to_string(chunks) +
                                        " chunks per stage (" + to_string(kind) + " needs 1)");
  if (kind == ScheduleKind::Interleaved && micro_batches % stages != 0)
    throw ValidationError("micro_batches", "interleaved needs a multiple of the " +
                                               std::to_string(stages) + " stages (got " +
                                               std::to_string(micro_batches) + ")");
}

std::vector<std::vector<PipeOp>> make_schedule(ScheduleKind kind, int stages, int micro_batches,
                                               int chunks) {
  check_schedule(kind, stages, micro_batches, chunks);
  std::vector<std::vector<PipeOp>> ops(stages);
  for (int s = 0; s < stages; ++s) {
    const int n = stages, b = micro_batches;
    // The lead is the forwards before the first backward; as every later forward follows a
    // backward, it is also the most activations the stage holds.
    switch (kind) {
      case ScheduleKind::GPipe:
        ops[s] = single_chunk(s, b, b);
        break;
      case ScheduleKind::OneFOneB:
        ops[s] = single_chunk(s, b, std::min(b, n - s));
        break;
      case ScheduleKind::Eager1F1B:
        // As Alpa's OverlapFriendlyPipeDreamSchedule (by the paper's authors).
        ops[s] = single_chunk(s, b, std::min(b, 2 * (n - s) - 1));
        break;
      case ScheduleKind::Interleaved:
        // One chunk is plain 1F1B: Megatron's rule would give 2(n-s)-1 (eager 1F1B) there.
        ops[s] =
            chunks == 1 ? single_chunk(s, b, std::min(b, n - s)) : interleaved(s, n, b, chunks);
        break;
    }
  }
  return ops;
}

Timeline simulate_pipeline(const std::vector<std::vector<PipeOp>>& schedule, int stages,
                           int micro_batches, int chunks, double forward, double backward,
                           double transfer) {
  if (stages < 1 || micro_batches < 1 || chunks < 1)
    throw ValidationError("schedule", "needs stages, micro_batches and chunks >= 1");
  for (auto [name, t] :
       {std::pair{"forward", forward}, {"backward", backward}, {"transfer", transfer}})
    if (!std::isfinite(t) || t < 0) throw ValidationError(name, "must be a finite time >= 0");
  if (static_cast<int>(schedule.size()) != stages)
    throw ValidationError("schedule", std::to_string(schedule.size()) + " stage lists for " +
                                          std::to_string(stages) + " stages");
  const int pieces = stages * chunks;
  auto index = [&](bool fwd, int mb, int piece) {
    return (static_cast<std::size_t>(fwd) * micro_batches + mb) * pieces + piece;
  };
  std::vector<char> seen(2 * static_cast<std::size_t>(micro_batches) * pieces, 0);
  for (int s = 0; s < stages; ++s)
    for (const PipeOp& op : schedule[s]) {
      if (op.micro_batch < 0 || op.micro_batch >= micro_batches || op.piece < 0 ||
          op.piece >= pieces)
        throw ValidationError(
            "schedule", "stage " + std::to_string(s) + " runs " + op_str(op) + ", out of range");
      if (op.piece % stages != s)
        throw ValidationError("schedule", "stage " + std::to_string(s) + " runs " + op_str(op) +
                                              ", which lives on stage " +
                                              std::to_string(op.piece % stages));
      char& c = seen[index(op.forward, op.micro_batch, op.piece)];
      if (c) throw ValidationError("schedule", op_str(op) + " is scheduled twice");
      c = 1;
    }
  for (int fwd = 0; fwd < 2; ++fwd)
    for (int mb = 0; mb < micro_batches; ++mb)
      for (int p = 0; p < pieces; ++p)
        if (!seen[index(fwd, mb, p)])
          throw ValidationError("schedule", op_str({fwd == 1, mb, p}) + " is never scheduled");

  // done[index(...)]: finish time of the pass, NaN until it has run.
  std::vector<double> done(seen.size(), std::numeric_limits<double>::quiet_NaN());
  // When `op`'s inputs are all on its stage, or nullopt while one of them has not run.
  auto inputs_at = [&](const PipeOp& op) -> std::optional<double> {
    double t = 0;
    bool pending = false;
    auto need = [&](bool fwd, int piece) {
      const double end = done[index(fwd, op.micro_batch, piece)];
      pending |= std::isnan(end);
      t = std::max(t, end + (piece % stages != op.piece % stages ? transfer : 0.0));
    };
    if (op.forward && op.piece > 0) need(true, op.piece - 1);
    if (!op.forward) need(true, op.piece);
    if (!op.forward && op.piece < pieces - 1) need(false, op.piece + 1);
    if (pending) return std::nullopt;
    return t;
  };
  Timeline tl;
  tl.start.resize(stages);
  std::vector<double> free_at(stages, 0.0);
  std::vector<std::size_t> next(stages, 0);
  double busy = 0;
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < stages; ++s)
      for (; next[s] < schedule[s].size(); ++next[s]) {
        const PipeOp& op = schedule[s][next[s]];
        const std::optional<double> inputs = inputs_at(op);
        if (!inputs) break;
        const double start = std::max(free_at[s], *inputs);
        const double length = op.forward ? forward : backward;
        tl.start[s].push_back(start);
        free_at[s] = start + length;
        done[index(op.forward, op.micro_batch, op.piece)] = free_at[s];
        busy += length;
        progress = true;
      }
  }
  std::string stuck;
  for (int s = 0; s < stages; ++s)
    if (next[s] < schedule[s].size())
      stuck += (stuck.empty() ? "" : ", ") + std::string("stage ") + std::to_string(s) +
               " waits at " + op_str(schedule[s][next[s]]);
  if (!stuck.empty()) throw ValidationError("schedule", "deadlock: " + stuck);

  for (int s = 0; s < stages; ++s) {
    tl.makespan = std::max(tl.makespan, free_at[s]);
    int held = 0;
    for (const PipeOp& op : schedule[s]) {
      held += op.forward ? 1 : -1;
      tl.peak_in_flight = std::max(tl.peak_in_flight, held);
    }
  }
  tl.bubble = tl.makespan > 0 ? 1 - busy / (stages * tl.makespan) : 0;
  return tl;
}

}  // namespace meshcast::training
