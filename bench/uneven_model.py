#!/usr/bin/env python3
"""Writes a hard model for the sync planner: 1,000 tensors moved 128 -> 128 devices.

Every tensor is 1-, 2- or 3-D with extents that no mesh axis divides, split over an 8x16 mesh of
devices 0-127 and wanted on a 16x8 mesh of devices 128-255 with the split axes transposed, so
that each source tile meets many target tiles. With --partial the 2-D tensors also carry a
pending sum over the source mesh's second axis. Deterministic (seeded): the same file each run.

    python3 bench/uneven_model.py [--partial] > uneven.json
    meshcast sync --model uneven.json --predict --json   # plan_seconds: one device's planning
"""
import argparse
import json
import random
import sys


def model(partial):
    rng = random.Random(1)
    tensors = {}
    for i in range(1000):
        kind = rng.choice([1, 2, 3])
        if kind == 1:
            shape = [rng.randint(1000, 50000)]
            src, dst = "8x16@0-127:S01", "16x8@128-255:S10"
        elif kind == 2:
            shape = [rng.randint(500, 4000) | 1, rng.randint(500, 4000) | 1]
            src = "8x16@0-127:S0R+P1" if partial else "8x16@0-127:S0S1"
            dst = "16x8@128-255:S1S0"
        else:
            shape = [rng.randint(3, 17), rng.randint(100, 600) | 1, rng.randint(60, 300) | 1]
            src, dst = "8x16@0-127:RS0S1", "16x8@128-255:S0RS1"
        tensors[f"t{i}"] = {"shape": shape, "dtype": "F32", "src": src, "dst": dst}
    return tensors


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partial", action="store_true",
                        help="the 2-D tensors' sources hold pending sums")
    json.dump(model(parser.parse_args().partial), sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
