#!/usr/bin/env python3
"""Writes a hard model for the sync planner: 1,000 tensors moved 128 -> 128 devices.

Every tensor is 1-, 2- or 3-D with extents that no mesh axis divides, split over an 8x16 mesh of
devices 0-127 and wanted on a 16x8 mesh of devices 128-255 with the split axes transposed, so
that each source tile meets many target tiles. With --partial the 2-D tensors also carry a
pending sum over the source mesh's second axis. With --random every tensor draws its own meshes
(1-, 2- and 3-D: 128, 2x64, 8x16, 4x4x8 -> 8x16, 16x8, 4x32, 2x4x16), its splits (several axes
on one dimension, in any order) and its pending sums, at most 2^28 elements each: no two
tensors alike, so nothing a model's repeated layers share helps. With --gather every tensor,
of its own extent, is split over devices 0-127 and wanted whole on each of them (an all-gather
of the model: each device takes part in every tensor, 127 receivers a box); --rotate gives each
tensor's source mesh its own order of the devices, so that no two tensors' layouts are alike;
--apart wants each tensor whole on devices 128-255 instead (a broadcast to other devices: each
of them receives 128 chains of 128 devices a tensor). Deterministic (seeded): the same file
each run.

    python3 bench/uneven_model.py [--partial | --random | --gather [--rotate] [--apart]] > uneven.json
    meshcast sync --model uneven.json --predict --json   # plan_seconds: one device's planning
"""
import argparse
import json
import math
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


def spec(rng, ndim, axes, partial):
    """A random spec: each mesh axis splits a dimension, stays replicated or (partial) sums."""
    order = list(range(axes))
    rng.shuffle(order)
    splits, pending = [[] for _ in range(ndim)], []
    for axis in order:
        r = rng.random()
        if r < 0.6:
            splits[rng.randrange(ndim)].append(axis)
        elif r < 0.75 and partial:
            pending.append(axis)
    text = "".join("S" + "".join(map(str, s)) if s else "R" for s in splits)
    return text + ("+P" + "".join(map(str, sorted(pending))) if pending else "")


def random_model():
    rng = random.Random(2)
    sources = [("4x4x8@0-127", 3), ("8x16@0-127", 2), ("128@0-127", 1), ("2x64@0-127", 2)]
    targets = [("8x16@128-255", 2), ("16x8@128-255", 2), ("4x32@128-255", 2),
               ("2x4x16@128-255", 3)]
    tensors = {}
    for i in range(1000):
        ndim = rng.choice([1, 2, 2, 3])
        while True:
            shape = [rng.choice([7, 63, 100, 257, 1000, 1023, 4096, 5003]) for _ in range(ndim)]
            if math.prod(shape) <= 1 << 28:
                break
        (src, a), (dst, b) = rng.choice(sources), rng.choice(targets)
        tensors[f"t{i}"] = {"shape": shape, "dtype": rng.choice(["F32", "BF16"]),
                            "src": src + ":" + spec(rng, ndim, a, True),
                            "dst": dst + ":" + spec(rng, ndim, b, False)}
    return tensors


def gather_model(rotate, apart):
    tensors = {}
    for i in range(1000):
        r = i % 128 if rotate else 0
        src = f"128@[{r}-127,0-{r - 1}]" if r else "128@0-127"
        dst = "128@128-255" if apart else "128@0-127"
        tensors[f"t{i}"] = {"shape": [4096 + 1000 * i + 1], "dtype": "F32",
                            "src": src + ":S0", "dst": dst + ":R"}
    return tensors


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--partial", action="store_true",
                      help="the 2-D tensors' sources hold pending sums")
    kind.add_argument("--random", action="store_true",
                      help="every tensor its own random meshes, splits and sums")
    kind.add_argument("--gather", action="store_true",
                      help="every tensor all-gathered over the same 128 devices")
    parser.add_argument("--rotate", action="store_true",
                        help="with --gather: each tensor's source mesh in its own device order")
    parser.add_argument("--apart", action="store_true",
                        help="with --gather: wanted whole on devices 128-255 instead")
    args = parser.parse_args()
    for flag in ("rotate", "apart"):
        if getattr(args, flag) and not args.gather:
            parser.error(f"--{flag} goes with --gather")
    if args.gather:
        tensors = gather_model(args.rotate, args.apart)
    else:
        tensors = random_model() if args.random else model(args.partial)
    json.dump(tensors, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
