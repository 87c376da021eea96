// A user's program on meshcast::ucx, started without MPI: two processes with MESHCAST_RANK,
// MESHCAST_SIZE=2 and MESHCAST_RENDEZVOUS; device 0's tensor moves to device 1, which checks it.
#include "meshcast/ucx.h"

#include <cstdio>
#include <exception>

#include "meshcast/bootstrap.h"
#include "reshard_check.h"

int main() {
  try {
    const auto boot = meshcast::TcpBootstrap::from_env();
    if (!boot) {
      std::fprintf(stderr, "consumer: set MESHCAST_RANK, MESHCAST_SIZE, MESHCAST_RENDEZVOUS\n");
      return 2;
    }
    meshcast::UcxSession session(*boot);
    const meshcast::Shape shape{5, 7};
    return reshard_and_check(*boot, session.world(),
                             meshcast::Layout::parse(shape, meshcast::DType::f64, "1@0:RR"),
                             meshcast::Layout::parse(shape, meshcast::DType::f64, "1@1:RR"));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
