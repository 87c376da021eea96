#!/bin/sh
# mpirun's remote-shell agent for the emulated hosts (cluster.sh): "agent.sh HOST COMMAND..."
# runs COMMAND inside network namespace HOST, as ssh would run it on a real host, with the
# namespace's name as its hostname (each host needs its own, or Open MPI's shared-memory
# transport takes ranks on different hosts for neighbours).
host=$1
shift
exec ip netns exec "$host" unshare --uts /bin/sh -c "hostname '$host' && $*"
