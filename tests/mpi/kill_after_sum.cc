// An LD_PRELOAD module for tests/mpi/sync_mpi.sh: the rank MESHCAST_TEST_KILL_RANK names
// (OMPI_COMM_WORLD_RANK) ends by SIGKILL right after it posts its first MPI_Iallreduce, which
// in `meshcast sync` is the job's closing sum (MpiSession::sum of the mismatches). Some peers
// then finish that sum and end normally while others still wait in it: a moment of ~30 ms that
// a kill from outside finds by chance only.
#include <dlfcn.h>
#include <mpi.h>

#include <csignal>
#include <cstdlib>

extern "C" int MPI_Iallreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op,
                              MPI_Comm comm, MPI_Request* request) {
  using Real = int (*)(const void*, void*, int, MPI_Datatype, MPI_Op, MPI_Comm, MPI_Request*);
  static const auto real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "MPI_Iallreduce"));
  const int status = real(send, recv, count, type, op, comm, request);
  const char* victim = std::getenv("MESHCAST_TEST_KILL_RANK");
  const char* me = std::getenv("OMPI_COMM_WORLD_RANK");
  if (victim && me && std::atoi(victim) == std::atoi(me)) std::raise(SIGKILL);
  return status;
}
