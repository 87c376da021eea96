// A user's MPI program on meshcast::mpi: under mpirun -np 4, a 2-way row split on ranks 0-1
// moves to a column split on ranks 2-3; every rank checks its elements.
#include "meshcast/mpi.h"

#include <cstdio>
#include <exception>
#include <vector>

#include "meshcast/meshcast.h"
#include "meshcast/testing.h"

int main(int argc, char** argv) {
  try {
    meshcast::MpiSession session(&argc, &argv);
    meshcast::Communicator& comm = session.world();
    const meshcast::Shape shape{8, 6};
    const auto src = meshcast::Layout::parse(shape, meshcast::DType::f32, "2@0-1:S0R");
    const auto dst = meshcast::Layout::parse(shape, meshcast::DType::f32, "2@2-3:RS0");
    const meshcast::Plan p = meshcast::plan(src, dst);
    const int me = comm.rank();
    std::vector<float> in(src.mesh().contains(me) ? src.local_elements(me) : 0);
    std::vector<float> out(dst.mesh().contains(me) ? dst.local_elements(me) : 0);
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
