# Sourced by bench/run-*.sh: `mpirun_shm ARGS...` runs an MPI job with every rank on this host,
# in shared memory: Open MPI's vader transport without a single-copy mechanism (containers
# refuse it), idle ranks yielding their core (4-8 ranks oversubscribe 2 cores), and no binding
# (Open MPI pins jobs of at most 2 ranks to cores).
mpirun_shm() {
  mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader \
    --mca btl_vader_single_copy_mechanism none --mca mpi_yield_when_idle 1 "$@"
}
