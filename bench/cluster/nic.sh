#!/bin/sh
# Runs PROGRAM ARGS in the namespace of this rank's own NIC (cluster.sh run --nic-per-rank): the
# launcher starts the ranks of host H in namespace mc-hostH, named mc-hostH by its UTS
# namespace; local rank I moves to mc-hostHnI, keeping the host's name and memory.
#   nic.sh PROGRAM ARGS...
nic="$(hostname)n${OMPI_COMM_WORLD_LOCAL_RANK:?not started by Open MPI}"
exec ip netns exec "$nic" "$@"
