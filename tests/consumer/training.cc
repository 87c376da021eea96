// A user's program on meshcast::training: two steps of a tiny GPT-style model on 2 in-process
// devices (tensor parallel), on generated tokens; the loss must be finite and positive.
#include <cmath>
#include <cstdio>
#include <exception>

#include "meshcast/local.h"
#include "meshcast/training/engine.h"

int main() {
  try {
    namespace tr = meshcast::training;
    tr::ModelConfig model;
    model.vocab = 32;
    model.seq = 8;
    model.d_model = 16;
    model.heads = 2;
    model.layers = 1;
    tr::ParallelConfig parallel;
    parallel.stages = {tr::parse_stage_shape("dp=1,tp=2")};
    tr::TrainConfig train;
    train.batch = 4;
    train.steps = 2;
    const tr::BatchSource batches = tr::random_batches(model, train.batch, 7);
    double loss = -1;
    meshcast::LocalWorld world(2);
    world.run([&](meshcast::Communicator& comm) {
      const tr::TrainResult r = tr::train(comm, model, parallel, train, batches);
      if (comm.rank() == 0) loss = r.steps.back().loss;
    });
    std::printf("loss after 2 steps %.4f\n", loss);
    return std::isfinite(loss) && loss > 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
