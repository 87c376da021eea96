// Pipeline schedules: every kind over a grid of shapes is complete, deadlock-free and runs each
// pass as soon as its inputs and its stage allow; warm-ups and peaks as documented; the known
// closed forms for makespan and bubble; simulate_pipeline() rejects broken schedules.
#include "meshcast/training/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "meshcast/error.h"

namespace meshcast::training {

// Readable failure messages; found by gtest through the argument's namespace.
void PrintTo(const PipeOp& op, std::ostream* os) {
  *os << (op.forward ? "F" : "B") << "(" << op.micro_batch << ", " << op.piece << ")";
}

namespace {

using Schedule = std::vector<std::vector<PipeOp>>;

constexpr ScheduleKind kKinds[] = {ScheduleKind::GPipe, ScheduleKind::OneFOneB,
                                   ScheduleKind::Interleaved, ScheduleKind::Eager1F1B};

struct Shape {
  ScheduleKind kind;
  int n, b, v;
};

std::string str(const Shape& s) {
  return to_string(s.kind) + " n=" + std::to_string(s.n) + " B=" + std::to_string(s.b) +
         " v=" + std::to_string(s.v);
}

// Every valid (kind, stages, micro-batches, chunks) of the grid.
std::vector<Shape> grid() {
  std::vector<Shape> out;
  for (ScheduleKind k : kKinds)
    for (int n : {1, 2, 3, 4, 8})
      for (int b : {1, 2, 3, 4, 8, 12, 16})
        for (int v : {1, 2, 3}) {
          if (k != ScheduleKind::Interleaved && v > 1) continue;
          if (k == ScheduleKind::Interleaved && b % n != 0) continue;
          out.push_back({k, n, b, v});
        }
  return out;
}

PipeOp F(int mb, int piece) { return {true, mb, piece}; }
PipeOp B(int mb, int piece) { return {false, mb, piece}; }

int forwards_before_first_backward(const std::vector<PipeOp>& ops) {
  return static_cast<int>(
      std::find_if(ops.begin(), ops.end(), [](const PipeOp& op) { return !op.forward; }) -
      ops.begin());
}

int peak(const std::vector<PipeOp>& ops) {
  int held = 0, most = 0;
  for (const PipeOp& op : ops) most = std::max(most, held += op.forward ? 1 : -1);
  return most;
}

// Forwards stage `stage` runs before its first backward, as the header and Megatron define
// them (Megatron's warm-up is followed by one more forward).
int lead(const Shape& s, int stage) {
  switch (s.kind) {
    case ScheduleKind::GPipe:
      return s.b;
    case ScheduleKind::OneFOneB:
      return std::min(s.b, s.n - stage);
    case ScheduleKind::Eager1F1B:
      return std::min(s.b, 2 * (s.n - stage) - 1);
    case ScheduleKind::Interleaved:
      if (s.v == 1) return std::min(s.b, s.n - stage);
      return std::min(s.b * s.v, 2 * (s.n - stage - 1) + (s.v - 1) * s.n + 1);
  }
  return -1;
}

TEST(Schedule, NamesRoundTrip) {
  const char* names[] = {"gpipe", "1f1b", "interleaved", "eager-1f1b"};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(to_string(kKinds[i]), names[i]);
    EXPECT_EQ(parse_schedule(names[i]), kKinds[i]);
  }
}

TEST(Schedule, UnknownNamesThrowNamingTheField) {
  for (const char* bad : {"", "GPipe", "1F1B", "eager", "eager_1f1b", "1f1b ", "pipedream\n"}) {
    try {
      parse_schedule(bad, "train.schedule");
      ADD_FAILURE() << "'" << bad << "' parsed";
    } catch (const ValidationError& e) {
      EXPECT_EQ(e.field(), "train.schedule") << bad;
      const std::string what = e.what();
      EXPECT_EQ(what.find('\n'), std::string::npos) << bad;
      EXPECT_NE(what.find("eager-1f1b"), std::string::npos) << what;
    }
  }
  EXPECT_THROW(parse_schedule("zb"), ValidationError);
}

TEST(Schedule, RejectsBadShapes) {
  auto field_of = [](ScheduleKind k, int n, int b, int v) -> std::string {
    try {
      make_schedule(k, n, b, v);
    } catch (const ValidationError& e) {
      return e.field();
    }
    return "accepted";
  };
  EXPECT_EQ(field_of(ScheduleKind::GPipe, 0, 4, 1), "stages");
  EXPECT_EQ(field_of(ScheduleKind::OneFOneB, 2, 0, 1), "micro_batches");
  EXPECT_EQ(field_of(ScheduleKind::Interleaved, 2, 4, 0), "chunks");
  EXPECT_EQ(field_of(ScheduleKind::OneFOneB, 2, 4, 2), "chunks");
  EXPECT_EQ(field_of(ScheduleKind::Eager1F1B, 2, 4, 2), "chunks");
  EXPECT_EQ(field_of(ScheduleKind::Interleaved, 4, 6, 2), "micro_batches");
  EXPECT_EQ(field_of(ScheduleKind::Interleaved, 4, 6, 1), "micro_batches");
  EXPECT_EQ(field_of(ScheduleKind::Interleaved, 4, 8, 2), "accepted");
}

// Each pass once, on its stage; the simulated timeline starts every pass exactly when its stage
// is free and its inputs have arrived (recomputed here from the starts alone).
TEST(Schedule, EveryKindIsCompleteAndRunsAsSoonAsPossible) {
  const double f = 1, b = 2, t = 0.5;
  for (const Shape& s : grid()) {
    SCOPED_TRACE(str(s));
    const Schedule sched = make_schedule(s.kind, s.n, s.b, s.v);
    ASSERT_EQ(sched.size(), static_cast<std::size_t>(s.n));
    const int pieces = s.n * s.v;
    std::map<std::tuple<bool, int, int>, double> end;
    for (int st = 0; st < s.n; ++st) {
      ASSERT_EQ(sched[st].size(), static_cast<std::size_t>(2 * s.b * s.v));
      for (const PipeOp& op : sched[st]) ASSERT_EQ(op.piece % s.n, st);
    }
    const Timeline tl = simulate_pipeline(sched, s.n, s.b, s.v, f, b, t);
    for (int st = 0; st < s.n; ++st)
      for (std::size_t j = 0; j < sched[st].size(); ++j) {
        const PipeOp& op = sched[st][j];
        end[{op.forward, op.micro_batch, op.piece}] = tl.start[st][j] + (op.forward ? f : b);
      }
    ASSERT_EQ(end.size(), static_cast<std::size_t>(2 * s.b * pieces));
    const double hop = s.n > 1 ? t : 0;
    double last = 0;
    for (int st = 0; st < s.n; ++st)
      for (std::size_t j = 0; j < sched[st].size(); ++j) {
        const PipeOp& op = sched[st][j];
        double at = j > 0 ? end[{sched[st][j - 1].forward, sched[st][j - 1].micro_batch,
                                 sched[st][j - 1].piece}]
                          : 0;
        if (op.forward && op.piece > 0)
          at = std::max(at, end[{true, op.micro_batch, op.piece - 1}] + hop);
        if (!op.forward) at = std::max(at, end[{true, op.micro_batch, op.piece}]);
        if (!op.forward && op.piece < pieces - 1)
          at = std::max(at, end[{false, op.micro_batch, op.piece + 1}] + hop);
        EXPECT_DOUBLE_EQ(tl.start[st][j], at) << "stage " << st << " pass " << j;
        last = std::max(last, tl.start[st][j] + (op.forward ? f : b));
      }
    EXPECT_DOUBLE_EQ(tl.makespan, last);
    EXPECT_NEAR(tl.bubble, 1 - s.b * s.v * (f + b) / tl.makespan, 1e-12);
  }
}

TEST(Schedule, WarmUpAndPeakInFlight) {
  for (const Shape& s : grid()) {
    SCOPED_TRACE(str(s));
    const Schedule sched = make_schedule(s.kind, s.n, s.b, s.v);
    for (int st = 0; st < s.n; ++st) {
      EXPECT_EQ(forwards_before_first_backward(sched[st]), lead(s, st)) << "stage " << st;
      // Every later forward follows a backward, so the lead is also the peak.
      EXPECT_EQ(peak(sched[st]), lead(s, st)) << "stage " << st;
    }
    // Stage 0 leads longest, so its peak is the schedule's.
    EXPECT_EQ(simulate_pipeline(sched, s.n, s.b, s.v, 1, 2, 0).peak_in_flight, lead(s, 0));
  }
  auto peak_of = [](ScheduleKind k) {
    return simulate_pipeline(make_schedule(k, 4, 8), 4, 8, 1, 1, 2, 0).peak_in_flight;
  };
  EXPECT_EQ(peak_of(ScheduleKind::GPipe), 8);
  EXPECT_EQ(peak_of(ScheduleKind::OneFOneB), 4);
  EXPECT_EQ(peak_of(ScheduleKind::Eager1F1B), 7);
}

TEST(Schedule, OneFOneBOrder) {
  const Schedule s = make_schedule(ScheduleKind::OneFOneB, 3, 4);
  EXPECT_EQ(s[0],
            (std::vector{F(0, 0), F(1, 0), F(2, 0), B(0, 0), F(3, 0), B(1, 0), B(2, 0), B(3, 0)}));
  EXPECT_EQ(s[2],
            (std::vector{F(0, 2), B(0, 2), F(1, 2), B(1, 2), F(2, 2), B(2, 2), F(3, 2), B(3, 2)}));
  // Eager: 2(n-s)-1 forwards lead; the last stage runs as in 1F1B.
  const Schedule e = make_schedule(ScheduleKind::Eager1F1B, 3, 8);
  EXPECT_EQ(e[0],
            (std::vector{F(0, 0), F(1, 0), F(2, 0), F(3, 0), F(4, 0), B(0, 0), F(5, 0), B(1, 0),
                         F(6, 0), B(2, 0), F(7, 0), B(3, 0), B(4, 0), B(5, 0), B(6, 0), B(7, 0)}));
  EXPECT_EQ(e[2], make_schedule(ScheduleKind::OneFOneB, 3, 8)[2]);
}

// Megatron's order for 2 stages, 4 micro-batches, 2 chunks, written out by hand.
TEST(Schedule, InterleavedOrderMatchesMegatron) {
  const Schedule s = make_schedule(ScheduleKind::Interleaved, 2, 4, 2);
  EXPECT_EQ(s[0],
            (std::vector{F(0, 0), F(1, 0), F(0, 2), F(1, 2), F(2, 0), B(0, 2), F(3, 0), B(1, 2),
                         F(2, 2), B(0, 0), F(3, 2), B(1, 0), B(2, 2), B(3, 2), B(2, 0), B(3, 0)}));
  EXPECT_EQ(s[1],
            (std::vector{F(0, 1), F(1, 1), F(0, 3), B(0, 3), F(1, 3), B(1, 3), F(2, 1), B(0, 1),
                         F(3, 1), B(1, 1), F(2, 3), B(2, 3), F(3, 3), B(3, 3), B(2, 1), B(3, 1)}));
}

TEST(Schedule, InterleavedWithOneChunkIsOneFOneB) {
  for (int n : {1, 2, 4, 8})
    for (int b : {8, 16})
      EXPECT_EQ(make_schedule(ScheduleKind::Interleaved, n, b, 1),
                make_schedule(ScheduleKind::OneFOneB, n, b, 1));
}

// Forward 1, backward 2, free transfers: GPipe and 1F1B both take (B + n - 1) * 3, bubble
// (n-1)/(B+n-1); interleaving v chunks (each 1/v, 2/v) shrinks the fill to (n-1)/v.
TEST(Schedule, ClosedFormsWithoutTransfer) {
  for (const Shape& s : grid()) {
    SCOPED_TRACE(str(s));
    const Timeline tl = simulate_pipeline(make_schedule(s.kind, s.n, s.b, s.v), s.n, s.b, s.v,
                                          1.0 / s.v, 2.0 / s.v, 0);
    const double fill = (s.n - 1.0) / s.v;
    EXPECT_NEAR(tl.makespan, (s.b + fill) * 3, 1e-9);
    EXPECT_NEAR(tl.bubble, fill / (s.b + fill), 1e-12);
    if (s.kind == ScheduleKind::Interleaved && s.v > 1 && s.n > 1) {
      const Timeline plain =
          simulate_pipeline(make_schedule(ScheduleKind::OneFOneB, s.n, s.b), s.n, s.b, 1, 1, 2, 0);
      EXPECT_LT(tl.makespan, plain.makespan);
      EXPECT_LT(tl.bubble, plain.bubble);
    }
  }
}

// No schedule beats the critical path: the first micro-batch's forward through every stage, the
// last stage's B passes, and the last backward back to stage 0, each hop costing `transfer`.
double critical_path(int n, int b, double f, double bw, double t) {
  return (b + n - 1) * (f + bw) + 2 * (n - 1) * t;
}

// With a transfer no longer than a pass, eager 1F1B's early forwards hide every transfer: it
// meets the critical path, while 1F1B waits a round trip per step once B >= 3.
TEST(Schedule, EagerOneFOneBHidesTransfers) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> time(0.1, 3.0);
  for (int trial = 0; trial < 400; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 8), b = 1 + static_cast<int>(rng() % 16);
    const double f = time(rng), bw = time(rng), t = time(rng) * std::min(f, bw) / 3.0;
    SCOPED_TRACE("n=" + std::to_string(n) + " B=" + std::to_string(b) + " f=" + std::to_string(f) +
                 " b=" + std::to_string(bw) + " t=" + std::to_string(t));
    const double bound = critical_path(n, b, f, bw, t);
    const double eager =
        simulate_pipeline(make_schedule(ScheduleKind::Eager1F1B, n, b), n, b, 1, f, bw, t).makespan;
    const double plain =
        simulate_pipeline(make_schedule(ScheduleKind::OneFOneB, n, b), n, b, 1, f, bw, t).makespan;
    EXPECT_NEAR(eager, bound, 1e-9);
    if (n >= 2 && b >= 3)
      EXPECT_GT(plain, eager + 1e-9);
    else
      EXPECT_NEAR(plain, eager, 1e-9);
  }
  // A transfer longer than a pass: eager no longer meets the bound but still beats 1F1B.
  for (const auto& [k, makespan] : {std::pair{ScheduleKind::GPipe, 45.0},
                                    {ScheduleKind::OneFOneB, 65.0},
                                    {ScheduleKind::Eager1F1B, 48.0}})
    EXPECT_DOUBLE_EQ(simulate_pipeline(make_schedule(k, 4, 8), 4, 8, 1, 1, 2, 2).makespan, makespan)
        << to_string(k);
}

TEST(Schedule, EveryScheduleRespectsTheCriticalPath) {
  for (const Shape& s : grid()) {
    if (s.v > 1) continue;
    SCOPED_TRACE(str(s));
    EXPECT_GE(simulate_pipeline(make_schedule(s.kind, s.n, s.b), s.n, s.b, 1, 1, 2, 1).makespan,
              critical_path(s.n, s.b, 1, 2, 1) - 1e-9);
  }
}

// Forward 1, backward 2, transfer 0 and 1, four stages, eight micro-batches.
TEST(Schedule, ReferenceTable) {
  struct Row {
    ScheduleKind kind;
    int v;
    double transfer, makespan;
  } rows[] = {
      {ScheduleKind::GPipe, 1, 0, 33},     {ScheduleKind::OneFOneB, 1, 0, 33},
      {ScheduleKind::Eager1F1B, 1, 0, 33}, {ScheduleKind::Interleaved, 2, 0, 28.5},
      {ScheduleKind::GPipe, 1, 1, 39},     {ScheduleKind::OneFOneB, 1, 1, 49},
      {ScheduleKind::Eager1F1B, 1, 1, 39}, {ScheduleKind::Interleaved, 2, 1, 46},
  };
  for (const Row& r : rows) {
    const Timeline tl = simulate_pipeline(make_schedule(r.kind, 4, 8, r.v), 4, 8, r.v, 1.0 / r.v,
                                          2.0 / r.v, r.transfer);
    EXPECT_DOUBLE_EQ(tl.makespan, r.makespan) << to_string(r.kind) << " t=" << r.transfer;
    EXPECT_NEAR(tl.bubble, 1 - 24 / r.makespan, 1e-12) << to_string(r.kind);
  }
}

// One stage hosting every chunk passes nothing between stages.
TEST(Schedule, OneStageHasNoTransfers) {
  for (int v : {1, 2, 3})
    EXPECT_DOUBLE_EQ(
        simulate_pipeline(make_schedule(ScheduleKind::Interleaved, 1, 4, v), 1, 4, v, 1, 2, 5)
            .makespan,
        4 * v * 3.0);
}

std::string rejection(const Schedule& s, int n, int b, int v = 1) {
  try {
    simulate_pipeline(s, n, b, v, 1, 2, 0);
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "schedule");
    return e.what();
  }
  return "accepted";
}

TEST(Schedule, SimulatePipelineRejectsBrokenSchedules) {
  const Schedule good = make_schedule(ScheduleKind::OneFOneB, 3, 4);
  ASSERT_EQ(rejection(good, 3, 4), "accepted");

  Schedule dup = good;
  dup[1][3] = dup[1][2];
  EXPECT_NE(rejection(dup, 3, 4).find("twice"), std::string::npos);

  Schedule missing = good;
  missing[2].pop_back();
  EXPECT_NE(rejection(missing, 3, 4).find("never"), std::string::npos);

  Schedule elsewhere = good;
  elsewhere[0][0].piece = 1;
  EXPECT_NE(rejection(elsewhere, 3, 4).find("stage 1"), std::string::npos);

  Schedule out = good;
  out[0][0].micro_batch = 4;
  EXPECT_NE(rejection(out, 3, 4).find("range"), std::string::npos);

  EXPECT_NE(rejection(good, 2, 4).find("stage lists"), std::string::npos);

  // Stage 0 waits for backward 1 before running forward 2, which stage 2 needs first.
  Schedule reordered = good;
  std::swap(reordered[0][2], reordered[0][5]);
  EXPECT_NE(rejection(reordered, 3, 4).find("deadlock"), std::string::npos);

  // A backward ahead of its own forward on the same stage can never run.
  Schedule early = good;
  std::swap(early[2][0], early[2][1]);
  EXPECT_NE(rejection(early, 3, 4).find("deadlock"), std::string::npos);

  // Interleaved with one chunk's passes swapped: chunk 1 before chunk 0 of the same micro-batch.
  Schedule chunks = make_schedule(ScheduleKind::Interleaved, 2, 2, 2);
  ASSERT_EQ(rejection(chunks, 2, 2, 2), "accepted");
  std::swap(chunks[0][0], chunks[0][2]);
  EXPECT_NE(rejection(chunks, 2, 2, 2).find("deadlock"), std::string::npos);
}

TEST(Schedule, SimulatePipelineRejectsBadTimes) {
  const Schedule s = make_schedule(ScheduleKind::GPipe, 2, 2);
  EXPECT_THROW(simulate_pipeline(s, 2, 2, 1, -1, 2, 0), ValidationError);
  EXPECT_THROW(simulate_pipeline(s, 2, 2, 1, 1, 2, std::nan("")), ValidationError);
  EXPECT_THROW(simulate_pipeline(s, 0, 2, 1, 1, 2, 0), ValidationError);
}

}  // namespace
}  // namespace meshcast::training
