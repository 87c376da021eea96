// `meshcast reshard --backend mpi|ucx|nccl`: one process per device, under mpirun or, for ucx
// and nccl, started by hand with a TCP rendezvous (MESHCAST_RENDEZVOUS=HOST:PORT, MESHCAST_RANK,
// MESHCAST_SIZE: TcpBootstrap::from_env; MPI is then never initialised). Every rank parses the
// same options and plans; the ranks first check that their plans agree (a rank given other
// options would otherwise hang or corrupt), then run, time and verify together. Only rank 0
// prints. Built only when the MPI backend is.
#include <chrono>
#include <functional>
#include <memory>

#include "cli.h"
#include "meshcast/bootstrap.h"
#include "meshcast/error.h"
#include "meshcast/mpi.h"
#include "meshcast/reshard.h"
#include "meshcast/verify.h"
#ifdef MESHCAST_HAS_UCX
#include "meshcast/ucx.h"
#endif
#ifdef MESHCAST_HAS_NCCL
#include "meshcast/nccl.h"
#endif

namespace meshcast::cli {

namespace {
ProcessRun run_plan_on(const Plan& p, ProcessSession& session, int iters, bool verify);
}  // namespace

void with_process_backend(const std::string& backend,
                          const std::function<void(ProcessSession&)>& fn) {
  // The bootstrap: a TCP rendezvous when MESHCAST_RENDEZVOUS is set (ucx, nccl), else MPI.
  std::unique_ptr<TcpBootstrap> tcp;
  if (backend != "mpi") tcp = TcpBootstrap::from_env();
  std::unique_ptr<MpiSession> mpi;
  if (!tcp) mpi = std::make_unique<MpiSession>(nullptr, nullptr);
  Bootstrap& boot = tcp ? static_cast<Bootstrap&>(*tcp) : *mpi;
  Communicator* comm = mpi ? &mpi->world() : nullptr;
#ifdef MESHCAST_HAS_UCX
  std::unique_ptr<UcxSession> ucx;
  if (backend == "ucx") comm = &(ucx = std::make_unique<UcxSession>(boot))->world();
#endif
#ifdef MESHCAST_HAS_NCCL
  std::unique_ptr<NcclSession> nccl;
  if (backend == "nccl") comm = &(nccl = std::make_unique<NcclSession>(boot))->world();
#endif
  if (!comm || comm->backend() != backend)
    throw ValidationError("backend", backend + " is not built into this meshcast");
  ProcessSession session{*comm, boot, tcp != nullptr};
#ifdef MESHCAST_HAS_NCCL
  session.nccl = nccl.get();
#endif
  fn(session);
}

ProcessRun run_process(const Plan& p, const std::string& backend, int iters, bool verify) {
  ProcessRun result;
  with_process_backend(backend,
                       [&](ProcessSession& s) { result = run_plan_on(p, s, iters, verify); });
  return result;
}

namespace {

// The plan on a started backend: check that every rank planned the same, then run, time and
// verify together.
ProcessRun run_plan_on(const Plan& p, ProcessSession& session, int iters, bool verify) {
  Communicator* comm = &session.comm;
  Bootstrap& boot = session.boot;
  const bool tcp = session.tcp;
#ifdef MESHCAST_HAS_NCCL
  NcclSession* nccl = session.nccl;
#endif
  const int needed = p.devices().back() + 1;
  if (comm->size() < needed && tcp)
    throw ValidationError("MESHCAST_SIZE",
                          "the meshes use device ids up to " + std::to_string(needed - 1) +
                              ", so it must be at least " + std::to_string(needed) + " (it is " +
                              std::to_string(comm->size()) + ")");
  if (comm->size() < needed)
    throw ValidationError("backend",
                          "the meshes use device ids up to " + std::to_string(needed - 1) +
                              ", so mpirun must start at least " + std::to_string(needed) +
                              " ranks (it started " + std::to_string(comm->size()) + ")");
  // Every rank must run the same plan.
  const std::size_t h = std::hash<std::string>{}(p.to_json());
  std::vector<unsigned char> mine(reinterpret_cast<const unsigned char*>(&h),
                                  reinterpret_cast<const unsigned char*>(&h) + sizeof h);
  const auto all = boot.allgather(mine);
  for (std::size_t r = 0; r < all.size(); ++r)
    if (all[r] != all[0])
      throw ValidationError("plan", "rank " + std::to_string(r) +
                                        " planned a different move than rank 0 (the ranks were "
                                        "given different options)");

  const int me = comm->rank();
  const Layout& src = p.src();
  const Layout& dst = p.dst();
  const std::size_t elem = dtype_size(src.dtype());
  std::vector<std::byte> in, out;
  if (src.mesh().contains(me)) {
    in.resize(static_cast<std::size_t>(src.local_elements(me)) * elem);
    fill_source(src, me, in.data());
  }
  if (dst.mesh().contains(me)) out.resize(static_cast<std::size_t>(dst.local_elements(me)) * elem);
  void* src_buf = in.empty() ? nullptr : in.data();
  void* dst_buf = out.empty() ? nullptr : out.data();
#ifdef MESHCAST_HAS_NCCL
  std::shared_ptr<void> gin, gout;  // GPU copies of the buffers
  if (nccl) {
    gin = nccl->allocate(in.size());
    gout = nccl->allocate(out.size());
    nccl->upload(in.data(), gin.get(), in.size());
    src_buf = in.empty() ? nullptr : gin.get();
    dst_buf = out.empty() ? nullptr : gout.get();
  }
#endif
  ProcessRun result;
  result.root = me == 0;
  for (int it = -1; it < iters; ++it) {  // iteration -1 warms up
    comm->barrier();
    const auto t0 = std::chrono::steady_clock::now();
    reshard(p, *comm, src_buf, dst_buf);
    comm->barrier();
    if (it >= 0)
      result.run.seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
#ifdef MESHCAST_HAS_NCCL
  if (nccl) nccl->download(gout.get(), out.data(), out.size());
#endif
  if (verify)
    result.run.mismatches =
        boot.sum(dst.mesh().contains(me) ? count_mismatches(dst, me, out.data()) : 0);
  return result;
}

}  // namespace

}  // namespace meshcast::cli
