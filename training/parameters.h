// Parameters as this device holds them: a block of each full tensor (features split over the
// grid's rows or columns), linear weights further sharded over depth, and their gradients,
// synchronised across the devices that split the samples and updated with AdamW.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "meshcast/box.h"
#include "meshcast/collectives.h"
#include "meshcast/layout.h"
#include "meshcast/training/engine.h"
#include "training/ops.h"
#include "training/stage.h"

namespace meshcast::training {

// Seconds on a monotonic clock, and a wait that adds the seconds it blocked to `blocked`: how
// the engine counts exposed communication.
double now();
void timed_wait(Collective& c, double& blocked);

enum class Split { None, Rows, Cols };  // the grid axis that splits a dimension

struct Param {
  Param(std::string n, Layout l) : name(std::move(n)), shape(l.shape()), layout(std::move(l)) {}
  std::string name;
  std::vector<std::int64_t> shape;  // of the full tensor
  Layout layout;                    // on the stage mesh: what each device stores
  bool sharded = false;             // stored as a depth shard, all-gathered before use
  bool sparse = false;              // gradient rows synchronised by the sparse path
  bool counted = false;             // this device reports it (one device per element)
  Box block;                        // this device's block (the layout without depth)
  Box shard;                        // the part of the block it stores (first rows over depth)
  std::vector<float> value;         // shard
  std::vector<float> grad;          // block, summed over this device's micro-batches
  std::vector<float> synced;        // shard of the gradient summed over the samples' devices
  std::vector<float> m, v;          // AdamW moments (shard)
  std::vector<float> full;          // gathered block while a step runs (sharded only)
  Collective gather;                // the all-gather of `full` in flight

  std::int64_t block_elements() const { return block.volume(); }
  // The block's values for compute (waits for the gather the first time in a step).
  const float* weights(double& blocked);
};

enum class Init { Normal, Zeros, Ones };

class Parameters {
 public:
  Parameters(const Place& place, const TrainConfig& train, const ModelConfig& model);
  Param& add(const std::string& name, std::vector<std::int64_t> shape, std::vector<Split> split,
             Init init, bool sharded, bool sparse = false);

  // Starts the all-gathers of the sharded weights over `depth` (a step's first use waits on
  // them); returns the seconds blocked (without overlap it waits for each at once).
  double start_gathers(const Group& depth, bool overlap);
  void zero_grads();
  std::vector<ParameterPart> parts() const;
  std::deque<Param>& all() { return params_; }
  // Sum of squares of the synchronised gradients this device reports.
  double counted_grad_sum_of_squares() const;
  // AdamW on every parameter after scaling gradients by `clip`.
  void update(const AdamW& opt, std::int64_t step, float clip);

 private:
  const Place& place_;
  std::uint64_t seed_;
  float std_;
  std::deque<Param> params_;  // stable addresses
};

// Synchronises gradients over the devices that split the samples (data parallelism and depth):
// parameters join as their gradient becomes final; dense ones are packed into buckets that are
// all-reduced as soon as full, sharded weights are reduce-scattered over depth and then
// all-reduced over the replicas (in the order they joined, on every replica: a group's
// collectives start in the same order on all its members). Sparse ones wait for finish().
class GradSync {
 public:
  GradSync(const PlaceGroups& groups, const Place& place, const CollectiveOptions& options,
           std::int64_t bucket_bytes, bool overlap);
  void add(Param& p);
  void progress();
  // Starts what is left and waits for everything; returns the seconds blocked since the step
  // started (without overlap, add() waits for each synchronisation at once).
  double finish();

 private:
  struct Pending {
    std::vector<Param*> params;
    std::vector<float> buffer;  // packed bucket (dense all-reduce)
    Collective op;
    bool second = false;  // sharded: the reduce-scatter is done, the replica all-reduce runs
  };
  void start_bucket();
  // Moves p on; its replica all-reduce starts only when `may_start` (every earlier one has
  // started). Returns whether later ones may start theirs.
  bool advance(Pending& p, bool block, bool may_start = true);
  void complete(Pending& p);

  const PlaceGroups& groups_;
  const Place& place_;
  CollectiveOptions options_;
  std::int64_t bucket_bytes_;
  bool overlap_;
  std::vector<Param*> open_;  // the bucket being filled
  std::int64_t open_bytes_ = 0;
  std::vector<Param*> sparse_;
  std::deque<Pending> pending_;
  double blocked_ = 0;
};

}  // namespace meshcast::training
