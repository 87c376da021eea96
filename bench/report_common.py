"""What bench/mpi_report.py and bench/cluster_report.py share: reading the JSON of MPI benchmark
runs, and matplotlib (headless) when it is installed."""
import json
import os
import sys


def load(paths):
    """(file name, JSON) per run, and every row with its run's file name under "run"."""
    runs, rows = [], []
    for p in paths:
        with open(p) as f:
            j = json.load(f)
        runs.append((os.path.basename(p), j))
        for r in j["rows"]:
            r = dict(r)
            r["run"] = os.path.basename(p)
            rows.append(r)
    return runs, rows


def pyplot(who):
    """matplotlib.pyplot on the Agg backend, or None (and a note on stderr) without it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        print(f"{who}: matplotlib not available, no plots", file=sys.stderr)
        return None
