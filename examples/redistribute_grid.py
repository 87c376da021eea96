"""A 2-D matrix redistributed between two process grids with numpy + mpi4py (the ScaLAPACK
user's case): row blocks over a 2x2 grid -> column blocks over a 1x4 grid, then back to a 4x1
grid with uneven row blocks. Every element is checked against the formula that made it.

    mpirun -np 4 python3 examples/redistribute_grid.py [ROWS COLS]
"""
import sys

import numpy as np
from mpi4py import MPI

import meshcast as mc

rows, cols = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (1000, 998)
comm = mc.from_mpi4py(MPI.COMM_WORLD)
me = comm.rank
assert comm.size == 4, "run with mpirun -np 4"


def block(layout):
    """This rank's block of A[i, j] = i * cols + j, made from its global indices."""
    box = layout.local_box(me)
    i = np.arange(box[0].start, box[0].stop, dtype=np.float64)[:, None]
    j = np.arange(box[1].start, box[1].stop, dtype=np.float64)[None, :]
    return i * cols + j


grid_a = mc.Layout((rows, cols), np.float64, "2x2@0-3:S0S1")  # 2x2 process grid, 2-D blocks
grid_b = mc.Layout((rows, cols), np.float64, "4@0-3:RS0")  # 1x4 grid: column blocks
grid_c = mc.Layout((rows, cols), np.float64, "4@[3,2,1,0]:S0R")  # 4x1 grid, reversed ranks

a = block(grid_a)
b = np.empty(grid_b.local_shape(me))
c = np.empty(grid_c.local_shape(me))
mc.reshard(mc.plan(grid_a, grid_b), comm, a, b)
mc.reshard(mc.plan(grid_b, grid_c), comm, b, c)
wrong = int((b != block(grid_b)).sum() + (c != block(grid_c)).sum())
wrong = MPI.COMM_WORLD.allreduce(wrong)
if me == 0:
    print(f"redistributed {rows}x{cols} f64: 2x2 blocks -> 1x4 columns -> 4x1 rows, "
          f"{wrong} wrong elements")
sys.exit(1 if wrong else 0)
