"""A PyTorch model's state_dict moved from a "training" layout (tensor parallel 2 x pipeline
parallel 2, ranks 0-3) to an "inference" one (tensor parallel 2 x data parallel 2, ranks 4-7)
in one meshcast sync, every weight compared with the original.

    mpirun -np 8 python3 examples/torch_state_dict.py

Each rank builds the same model (same seed) only to know the original weights for the check;
a trainer rank contributes just its shards, an inference rank receives just its own.
"""
import sys

import torch
from mpi4py import MPI

import meshcast as mc

comm = mc.from_mpi4py(MPI.COMM_WORLD)
me = comm.rank
assert comm.size == 8, "run with mpirun -np 8"

torch.manual_seed(0)
hidden, layers, vocab = 64, 4, 1000
blocks = []
for _ in range(layers):
    blocks += [torch.nn.LayerNorm(hidden), torch.nn.Linear(hidden, 4 * hidden),
               torch.nn.GELU(), torch.nn.Linear(4 * hidden, hidden)]
model = torch.nn.Sequential(torch.nn.Embedding(vocab, hidden), *blocks,
                            torch.nn.LayerNorm(hidden), torch.nn.Linear(hidden, vocab))
state = {k: v.detach() for k, v in model.state_dict().items()}
modules = dict(model.named_modules())


def placement(name, tensor):
    """(training layout, inference layout) by the Megatron convention."""
    module = modules[name.rsplit(".", 1)[0]]
    index = int(name.split(".")[0])
    stage = 0 if index <= len(model) // 2 else 1  # pipeline stage: first or second half
    train = f"2@{2 * stage}-{2 * stage + 1}"  # the stage's two tensor-parallel ranks
    infer = "2x2@4-7"  # (data parallel, tensor parallel)
    if isinstance(module, (torch.nn.Embedding,)) or (
            isinstance(module, torch.nn.Linear) and module.out_features > module.in_features
            or index == len(model) - 1):
        split = ("S0" + "R" * (tensor.dim() - 1), "S1" + "R" * (tensor.dim() - 1))  # column
    elif isinstance(module, torch.nn.Linear) and tensor.dim() == 2:
        split = ("RS0", "RS1")  # row-parallel
    else:
        split = ("R" * tensor.dim(), "R" * tensor.dim())  # norms, row-parallel biases
    return (mc.Layout(tensor.shape, tensor.dtype, f"{train}:{split[0]}"),
            mc.Layout(tensor.shape, tensor.dtype, f"{infer}:{split[1]}"))


moves = [(name, *placement(name, t)) for name, t in state.items()]
plan = mc.plan_sync(moves, me)
src = {n: state[n][s.local_box(me)].contiguous() for n, s, _ in moves if me in s.mesh}
dst = {n: torch.empty(d.local_shape(me)) for n, _, d in moves if me in d.mesh}
mc.sync(plan, comm, src, dst)

wrong = sum(int((dst[n] != state[n][d.local_box(me)]).sum()) for n, _, d in moves if n in dst)
wrong = MPI.COMM_WORLD.allreduce(wrong)
if me == 0:
    params = sum(t.numel() for t in state.values())
    print(f"synced {len(moves)} tensors ({params} parameters) tp2 x pp2 -> tp2 x dp2 "
          f"in one sync: {wrong} wrong elements")
sys.exit(1 if wrong else 0)
