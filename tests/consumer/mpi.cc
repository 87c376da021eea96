// A user's MPI program on meshcast::mpi: under mpirun -np 4, a 2-way row split on ranks 0-1
// moves to a column split on ranks 2-3; every rank checks its elements.
#include "meshcast/mpi.h"

#include <cstdio>
#include <exception>

#include "reshard_check.h"

int main(int argc, char** argv) {
  try {
    meshcast::MpiSession session(&argc, &argv);
    const meshcast::Shape shape{8, 6};
    return reshard_and_check(session, session.world(),
                             meshcast::Layout::parse(shape, meshcast::DType::f32, "2@0-1:S0R"),
                             meshcast::Layout::parse(shape, meshcast::DType::f32, "2@2-3:RS0"));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
