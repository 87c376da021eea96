// A user's program on meshcast::ucx, started without MPI: two processes with MESHCAST_RANK,
// MESHCAST_SIZE=2 and MESHCAST_RENDEZVOUS; device 0's tensor moves to device 1, which checks it.
#include "meshcast/ucx.h"

#include <cstdio>
#include <exception>
#include <vector>

#include "meshcast/bootstrap.h"
#include "meshcast/meshcast.h"
#include "meshcast/testing.h"

int main() {
  try {
    const auto boot = meshcast::TcpBootstrap::from_env();
    if (!boot) {
      std::fprintf(stderr, "consumer: set MESHCAST_RANK, MESHCAST_SIZE, MESHCAST_RENDEZVOUS\n");
      return 2;
    }
    meshcast::UcxSession session(*boot);
    meshcast::Communicator& comm = session.world();
    const meshcast::Shape shape{5, 7};
    const auto src = meshcast::Layout::parse(shape, meshcast::DType::f64, "1@0:RR");
    const auto dst = meshcast::Layout::parse(shape, meshcast::DType::f64, "1@1:RR");
    const meshcast::Plan p = meshcast::plan(src, dst);
    const int me = comm.rank();
    std::vector<double> in(src.mesh().contains(me) ? src.local_elements(me) : 0);
    std::vector<double> out(dst.mesh().contains(me) ? dst.local_elements(me) : 0);
    if (!in.empty()) meshcast::fill_source(src, me, in.data());
    meshcast::reshard(p, comm, in.empty() ? nullptr : in.data(),
                      out.empty() ? nullptr : out.data());
    const auto wrong = out.empty() ? 0 : meshcast::count_mismatches(dst, me, out.data());
    std::printf("rank %d: %lld wrong\n", me, static_cast<long long>(wrong));
    return wrong == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
