"""A free TCP port on 127.0.0.1 for a test job's rendezvous (module and script).

The port is drawn below the kernel's ephemeral range, so that no other process's connection
(nor a rank's own connect meeting itself) can take it between this pick and rank 0's listen.

    python3 free_port.py [LO HI] [--pair]

prints a port in [LO, HI) (default [20000, the ephemeral range's start)); with --pair its
predecessor is free too (torchrun's MASTER_PORT is the one below meshcast's).
"""
import random
import socket
import sys


def ephemeral_start():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(lo=20000, hi=None, pair=False):
    hi = hi or ephemeral_start()
    if hi - lo < 2:
        lo, hi = 1024, 65536  # an odd machine's range: any port, as before
    for _ in range(1000):
        p = random.randrange(lo + 1, hi)
        try:
            for q in (p - 1, p) if pair else (p,):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", q))
            return p
        except OSError:
            pass
    raise RuntimeError(f"no free port in [{lo}, {hi})")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--pair"]
    print(free_port(*map(int, args), pair="--pair" in sys.argv))
