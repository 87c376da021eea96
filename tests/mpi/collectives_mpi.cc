// The collectives on the MPI or UCX backend under mpirun: every collective, dtype, reduction and
// algorithm against the naive reference of support/collectives_check.h, on the whole world, on a
// sub-group in reversed order, and over "hosts" of 2 ranks (hierarchical); on MPI also through
// node memory (shared-memory). Exit status 1 on any
// wrong element (each printed), 2 on bad arguments.
//   collectives_mpi mpi|ucx
#include <meshcast/meshcast.h>
#include <meshcast/mpi.h>
#ifdef MESHCAST_HAS_UCX
#include <meshcast/ucx.h>
#endif

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "support/collectives_check.h"

using namespace meshcast;

int main(int argc, char** argv) {
  const std::string backend = argc > 1 ? argv[1] : "mpi";
  MpiOptions opt;
  opt.timeout_seconds = 120;
  // Node memory (the blocking collectives' shared-memory algorithm, also Auto's choice here):
  // 8 KiB segments, so that the larger cases go through it in many chunks, unless the
  // environment names another size (tests/CMakeLists.txt: 4 MiB at 5 ranks, none at 3, where
  // Auto then picks among the algorithms that send).
  const char* segment = std::getenv("MESHCAST_TEST_SEGMENT_BYTES");
  opt.node_segment_bytes = segment ? std::stoul(segment) : std::size_t{8} << 10;
  MpiSession mpi(&argc, &argv, opt);
  Communicator* comm = &mpi.world();
#ifdef MESHCAST_HAS_UCX
  std::unique_ptr<UcxSession> ucx;
  if (backend == "ucx") comm = &(ucx = std::make_unique<UcxSession>(mpi, UcxOptions{}))->world();
#endif
  if (comm->backend() != backend) {
    std::fprintf(stderr, "collectives_mpi: backend: %s is not built in\n", backend.c_str());
    return 2;
  }
  const int n = comm->size(), me = comm->rank();
  const Group& world = comm->world();
  const std::vector<std::int64_t> counts{0, 1, 3, 13, 1009, 40013};
  std::vector<std::string> errors =
      testing::check_collectives(world, testing::collective_cases(counts));
  // Not with one rank (no group to share), on UCX (no node memory) or MPI without it; MPI
  // with a segment size must have mapped node memory (else Auto would silently send).
  const bool node = backend == "mpi" && opt.node_segment_bytes > 0;
  if (node && !comm->node_segment(me)) {
    std::fprintf(stderr, "collectives_mpi: rank %d: MPI mapped no node memory\n", me);
    return 1;
  }
  if (n >= 2 && node) {
    const auto e = testing::check_collectives(
        world, testing::collective_cases({1, 13, 1009, 40013}, {Algorithm::SharedMemory}));
    errors.insert(errors.end(), e.begin(), e.end());
  }
  // Every other rank, reversed (every rank makes the group): ranks outside it do nothing.
  std::vector<int> every_other;
  for (int r = n - 1; r >= 0; r -= 2) every_other.push_back(r);
  const Group sub = comm->group(every_other);
  if (sub.contains(me)) {
    const auto e = testing::check_collectives(sub, testing::collective_cases({7, 20011}));
    errors.insert(errors.end(), e.begin(), e.end());
  }
  if (n % 2 == 0 && n >= 4) {
    const Topology hosts =
        Topology::uniform("pairs", n / 2, 2, {"intra", 1e10, 0}, {"net", 1e9, 0});
    const auto e = testing::check_collectives(world, testing::collective_cases({40013}), &hosts);
    errors.insert(errors.end(), e.begin(), e.end());
  }
  for (const auto& e : errors) std::printf("%s\n", e.c_str());
  if (me == 0)
    std::printf("collectives_mpi %s np %d: rank 0 saw %zu wrong results\n", backend.c_str(), n,
                errors.size());
  std::fflush(stdout);
  int bad = errors.empty() ? 0 : 1;
  comm->barrier();
  return bad;
}
