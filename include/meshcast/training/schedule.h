// Pipeline schedules: for each pipeline device (a stage mesh), the order in which it runs the
// forward and backward passes of every micro-batch on every model chunk it hosts. Pure
// functions of (kind, stages, micro-batches, chunks per stage), checked by simulate_pipeline().
//
// The model is cut into stages * chunks pieces; piece p lives on stage p % stages (chunk
// p / stages of that stage), so with chunks > 1 a micro-batch visits every stage `chunks` times
// (interleaved 1F1B). Forward of piece p needs forward of piece p-1 (same micro-batch);
// backward of piece p needs backward of piece p+1, and the last piece's backward needs its own
// forward.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace meshcast::training {

enum class ScheduleKind {
  GPipe,        // all forwards, then all backwards
  OneFOneB,     // stage i runs min(B, n-i-1) forwards, then alternates one forward, one backward
  Interleaved,  // Megatron's interleaved 1F1B over `chunks` pieces per stage: stage i warms up
                // with min(B*v, 2(n-i-1) + (v-1)n) forwards; with one chunk it is OneFOneB
  Eager1F1B,    // stage i runs min(B, 2(n-i)-1) forwards before its first backward, so that each
                // output is sent a tick before it is needed and the transfer hides behind compute
};
std::string to_string(ScheduleKind k);
// Accepts gpipe, 1f1b, interleaved, eager-1f1b; throws ValidationError naming `field`.
ScheduleKind parse_schedule(std::string_view text, const std::string& field = "schedule");

struct PipeOp {
  bool forward = true;
  int micro_batch = 0;
  int piece = 0;  // model piece (stage + chunk * stages)
  friend bool operator==(const PipeOp&, const PipeOp&) = default;
};

// Throws ValidationError when stages < 1, micro_batches < 1, chunks < 1, chunks > 1 with a kind
// other than Interleaved, or Interleaved with micro_batches not a multiple of stages (Megatron's
// condition): what make_schedule() refuses, without building the 2 x stages x micro_batches x
// chunks passes (validate() and the configuration search ask it of every candidate).
void check_schedule(ScheduleKind kind, int stages, int micro_batches, int chunks = 1);
// ops[s] = stage s's passes in order; refuses what check_schedule() does.
std::vector<std::vector<PipeOp>> make_schedule(ScheduleKind kind, int stages, int micro_batches,
                                               int chunks = 1);

// Runs a schedule on an idealised pipeline: every forward takes `forward` seconds, every
// backward `backward`, and an output reaches the next stage `transfer` seconds after its pass
// ends (the transfer overlaps whatever the stages compute meanwhile; none between two pieces of
// one stage). A pass starts once its stage has finished the pass before it and its inputs have
// arrived. Throws ValidationError if a pass is missing, repeated, on the wrong stage, or waits on
// a pass that can never run (deadlock), or if a time is negative or not finite.
struct Timeline {
  double makespan = 0;                     // seconds from the first pass to the last
  double bubble = 0;                       // idle fraction of stages*makespan
  std::vector<std::vector<double>> start;  // start[s][j]: start of stage s's j-th pass
  int peak_in_flight = 0;                  // most forwards any stage holds awaiting their backward
};
Timeline simulate_pipeline(const std::vector<std::vector<PipeOp>>& schedule, int stages,
                           int micro_batches, int chunks, double forward, double backward,
                           double transfer);

}  // namespace meshcast::training
