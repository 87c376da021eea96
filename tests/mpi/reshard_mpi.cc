// Random reshard cases on the MPI, UCX or NCCL backend, run under mpirun by ctest. Every rank
// draws the same cases from the same seed, executes its part, and checks every element of its
// target tile against the value each global index must hold. Exit status 1 on any mismatch, 77
// (ctest's skip) when the backend cannot run here (NCCL without a GPU).
//   reshard_mpi mpi|ucx|nccl|ucx-tcp [cases] [seed] [chain|native [CHUNK_BYTES [STAGING_BYTES]]]
// STAGING_BYTES bounds a chain's staging of strided boxes (MpiOptions/UcxOptions::staging_bytes).
// ucx-tcp: UCX started through TcpBootstrap::from_env() (MESHCAST_RENDEZVOUS, MESHCAST_RANK,
// MESHCAST_SIZE; tests/mpi/ucx_tcp.sh launches the processes), without mpirun; it also checks
// that MPI was never initialised. Bad bootstrap input or a bootstrap failure: exit status 2 with
// "reshard_mpi: <field>: <cause>".
#include <meshcast/meshcast.h>
#include <meshcast/mpi.h>
#include <meshcast/testing.h>
#ifdef MESHCAST_HAS_UCX
#include <meshcast/ucx.h>
#endif
#ifdef MESHCAST_HAS_NCCL
#include <meshcast/nccl.h>
#endif

#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <string_view>

using namespace meshcast;

namespace {

std::uint64_t pick(std::mt19937_64& rng, std::uint64_t n) { return rng() % n; }

// A random mesh of at most `world` devices drawn from ids [0, world), permuted.
Mesh random_mesh(std::mt19937_64& rng, int world) {
  std::vector<std::int64_t> shape;
  const int ndim = 1 + static_cast<int>(pick(rng, 3));
  std::int64_t n = 1;
  for (int a = 0; a < ndim; ++a) {
    const std::int64_t e = 1 + static_cast<std::int64_t>(pick(rng, 3));
    if (n * e > world) break;
    shape.push_back(e);
    n *= e;
  }
  if (shape.empty()) shape.push_back(1);
  std::vector<int> ids(static_cast<std::size_t>(world));
  for (int i = 0; i < world; ++i) ids[static_cast<std::size_t>(i)] = i;
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(static_cast<std::size_t>(n));
  if (pick(rng, 2)) std::sort(ids.begin(), ids.end());
  return Mesh(shape, ids);
}

// Each mesh axis splits a random dimension, replicates, or (if allowed) holds addends.
ShardingSpec random_spec(std::mt19937_64& rng, std::size_t rank, std::size_t ndim, bool partial) {
  std::vector<std::vector<int>> dims(rank);
  std::vector<int> sums;
  for (std::size_t a = 0; a < ndim; ++a) {
    const auto r = pick(rng, 10);
    if (r < 6)
      dims[pick(rng, rank)].push_back(static_cast<int>(a));
    else if (r < 8 && partial)
      sums.push_back(static_cast<int>(a));
  }
  return ShardingSpec(dims, sums);
}

// Runs the random cases on `comm`; totals go through `boot`. Returns the exit status.
int run_cases(Communicator& comm, Bootstrap& boot, [[maybe_unused]] void* gpu, int argc,
              char** argv) {
#ifdef MESHCAST_HAS_NCCL
  auto* nccl = static_cast<NcclSession*>(gpu);
#endif
  const int cases = argc > 2 ? std::stoi(argv[2]) : 200;
  std::mt19937_64 rng(argc > 3 ? std::stoull(argv[3]) : 20261121);
  const Strategy strategies[] = {Strategy::Broadcast, Strategy::SendRecv, Strategy::AllGather,
                                 Strategy::Auto};
  long long failed_cases = 0, elements = 0;
  for (int c = 0; c < cases; ++c) {
    const std::size_t rank = 1 + pick(rng, 4);
    Shape shape;
    for (std::size_t d = 0; d < rank; ++d) shape.push_back(static_cast<std::int64_t>(pick(rng, 9)));
    const DType t = kAllDTypes[pick(rng, std::size(kAllDTypes))];
    const Mesh sm = random_mesh(rng, comm.size()), dm = random_mesh(rng, comm.size());
    const Layout src(shape, t, sm, random_spec(rng, rank, sm.ndim(), true));
    const Layout dst(shape, t, dm, random_spec(rng, rank, dm.ndim(), pick(rng, 4) == 0));
    PlanOptions opt;
    opt.strategy = strategies[c % 4];
    const int me = comm.rank();
    // Even cases: every rank plans the whole move and runs its part of it. Odd cases: every rank
    // plans only its own part (plan_rank, as the ranks of a job do), on hosts of two devices so
    // that trees of chains and the local rule's host preference come into play.
    const Topology pairs =
        Topology::uniform("pairs", (comm.size() + 1) / 2, 2, LinkClass{"intra", 50e9, 2e-6},
                          LinkClass{"network", 5e9, 1e-5});
    const bool alone = c % 2 == 1;
    const RankPlan part = alone ? plan_rank(src, dst, me, pairs, opt)
                                : plan(src, dst, Topology::single_host(), opt).rank(me);
    const std::size_t elem = dtype_size(t);
    std::vector<std::byte> in, out;
    if (src.mesh().contains(me)) {
      in.resize(static_cast<std::size_t>(src.local_elements(me)) * elem);
      fill_source(src, me, in.data());
    }
    if (dst.mesh().contains(me))
      out.resize(static_cast<std::size_t>(dst.local_elements(me)) * elem);
#ifdef MESHCAST_HAS_NCCL
    if (nccl) {  // the same buffers, in GPU memory
      auto gin = nccl->allocate(in.size()), gout = nccl->allocate(out.size());
      nccl->upload(in.data(), gin.get(), in.size());
      reshard(part, comm, in.empty() ? nullptr : gin.get(), out.empty() ? nullptr : gout.get());
      nccl->download(gout.get(), out.data(), out.size());
    } else
#endif
      reshard(part, comm, in.empty() ? nullptr : in.data(), out.empty() ? nullptr : out.data());
    const long long wrong =
        boot.sum(dst.mesh().contains(me) ? count_mismatches(dst, me, out.data()) : 0);
    elements += boot.sum(static_cast<long long>(out.size() / elem));
    if (wrong) {
      ++failed_cases;
      if (me == 0)
        std::printf("FAIL case %d: shape %s %s %s -> %s (%s): %lld wrong\n", c,
                    shape_str(shape).c_str(), to_string(t).c_str(), src.str().c_str(),
                    dst.str().c_str(), to_string(part.strategy()).c_str(), wrong);
    }
  }
  if (comm.rank() == 0)
    std::printf("%s: %d ranks, %d cases, %lld target elements checked, %lld failed cases\n",
                comm.backend().c_str(), comm.size(), cases, elements, failed_cases);
  return failed_cases ? 1 : 0;
}

// ucx-tcp: no mpirun, no MPI.
int run_ucx_tcp([[maybe_unused]] std::size_t chunk_bytes, int argc, char** argv) {
#ifdef MESHCAST_HAS_UCX
  int status = 0;
  try {
    auto boot = TcpBootstrap::from_env();
    if (!boot) {
      std::fprintf(stderr, "reshard_mpi: MESHCAST_RENDEZVOUS: not set (ucx-tcp needs it)\n");
      return 2;
    }
    UcxSession ucx(*boot, UcxOptions{30, chunk_bytes});
    status = run_cases(ucx.world(), *boot, nullptr, argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "reshard_mpi: %s\n", e.what());
    return 2;
  }
  int inited = 1;
  MPI_Initialized(&inited);  // allowed before MPI_Init
  if (inited) {
    std::fprintf(stderr, "reshard_mpi: ucx-tcp initialised MPI\n");
    return 1;
  }
  return status;
#else
  (void)argc;
  (void)argv;
  std::printf("backend ucx is not built here\n");
  return 2;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  // Broadcasts: pipelined chains of CHUNK_BYTES chunks (small ones exercise the pipeline on
  // tiny tensors), or MPI_Ibcast.
  MpiOptions mopt{30};
  if (argc > 4 && std::string(argv[4]) == "native") mopt.broadcast = MpiOptions::Broadcast::Native;
  if (argc > 5) mopt.chunk_bytes = std::stoull(argv[5]);
  if (argc > 6) mopt.staging_bytes = std::stoull(argv[6]);
  const std::string backend = argc > 1 ? argv[1] : "mpi";
  if (backend == "ucx-tcp") return run_ucx_tcp(mopt.chunk_bytes, argc, argv);
  MpiSession mpi(&argc, &argv, mopt);
#ifdef MESHCAST_HAS_UCX
  std::unique_ptr<UcxSession> ucx;
  if (backend == "ucx")
    ucx = std::make_unique<UcxSession>(mpi, UcxOptions{30, mopt.chunk_bytes, mopt.staging_bytes});
#endif
  void* gpu = nullptr;
#ifdef MESHCAST_HAS_NCCL
  std::unique_ptr<NcclSession> nccl;
  if (backend == "nccl") {
    try {
      nccl = std::make_unique<NcclSession>(mpi, NcclOptions{30});
    } catch (const Error& e) {  // this rank's, or another's, lack of a GPU: nothing to run
      if (std::string_view(e.what()).find("no CUDA device") == std::string_view::npos) throw;
      if (mpi.world().rank() == 0) std::printf("SKIP: %s\n", e.what());
      return 77;
    }
    gpu = nccl.get();
  }
#endif
  Communicator* chosen = &mpi.world();
#ifdef MESHCAST_HAS_UCX
  if (ucx) chosen = &ucx->world();
#endif
#ifdef MESHCAST_HAS_NCCL
  if (nccl) chosen = &nccl->world();
#endif
  if (chosen->backend() != backend) {
    if (mpi.world().rank() == 0) std::printf("backend %s is not built here\n", backend.c_str());
    return 2;
  }
  return run_cases(*chosen, mpi, gpu, argc, argv);
}
