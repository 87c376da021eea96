#!/usr/bin/env python3
"""Fits a topology's latencies and per-message overheads to the emulated cluster's measurements.

For every meshcast plan the suite measured (docs/data/cluster-*.json, written by
bench/run-cluster.sh), re-plans the case with `meshcast simulate` on the topology with each
candidate (latency_us, chain_latency_us, network overhead_us, intra overhead_us) of a grid, and
prints the candidates ranked by the worst relative error of the analytic model (ties broken by
the root-mean-square error). Each grid defaults to what the file gives (one candidate), so pass
the axes to fit. Bandwidths stay as the file gives them: the link-bound optimum of
docs/benchmarks.md is computed from them.

  bench/fit_topology.py --meshcast build/default/bin/meshcast --topology meshes/emulated.json \
      --latency-ms 8,10,12,14 --chain-latency-ms 2,4,6 --overhead-us 0,2,10,50,200 \
      docs/data/cluster-*.json
"""
import argparse
import concurrent.futures
import itertools
import json
import os
import subprocess
import sys
import tempfile


def rows_of(paths):
    out = []
    for p in paths:
        with open(p) as f:
            doc = json.load(f)
        for r in doc["rows"]:
            if r.get("src") and r.get("strategy") and not r.get("same_as"):
                out.append(dict(r, chunk=doc.get("chain_chunk_bytes", 32768)))
    return out


def predict(meshcast, topology, r):
    cmd = [meshcast, "simulate", "--json", "--topology", topology, "--shape", r["shape"],
           "--dtype", r["dtype"], "--src", r["src"], "--dst", r["dst"], "--strategy",
           r["strategy"], "--balance", r["balance"], "--chunk-bytes", str(r["chunk"])]
    j = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return j["predicted_seconds"], j["simulated_seconds"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--meshcast", required=True)
    ap.add_argument("--topology", required=True)
    ap.add_argument("--latency-ms", help="network latency_us / 1000 (default: the file's)")
    ap.add_argument("--chain-latency-ms", help="network chain_latency_us / 1000 (the file's)")
    ap.add_argument("--overhead-us", help="network overhead_us per message (the file's)")
    ap.add_argument("--intra-overhead-us", help="intra overhead_us per message (the file's)")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args()
    rows = rows_of(a.runs)
    if not rows:
        sys.exit("fit_topology: no rows with layouts (re-run bench/run-cluster.sh)")
    with open(a.topology) as f:
        base = json.load(f)
    net0, intra0 = base["links"]["network"], base["links"]["intra"]
    # A link without overhead_us takes the class default of meshcast/topology.h.
    def axis(arg, default):
        return [float(x) for x in arg.split(",")] if arg else [default]
    grid = itertools.product(
        axis(a.latency_ms, net0["latency_us"] / 1000),
        axis(a.chain_latency_ms, net0.get("chain_latency_us", net0["latency_us"]) / 1000),
        axis(a.overhead_us, net0.get("overhead_us", 2)),
        axis(a.intra_overhead_us, intra0.get("overhead_us", 1)))
    results = []
    with tempfile.TemporaryDirectory() as tmp, concurrent.futures.ThreadPoolExecutor(2) as pool:
        for k, (lat, chain, over, intra_over) in enumerate(grid):
            topo = json.loads(json.dumps(base))
            net = topo["links"]["network"]
            net["latency_us"] = lat * 1000
            net["chain_latency_us"] = chain * 1000
            net["overhead_us"] = over
            topo["links"]["intra"]["overhead_us"] = intra_over
            path = os.path.join(tmp, f"t-{k}.json")
            with open(path, "w") as f:
                json.dump(topo, f)
            got = list(pool.map(lambda r: predict(a.meshcast, path, r), rows))
            err_m = [p / r["seconds"] - 1 for (p, _), r in zip(got, rows)]
            err_s = [s / r["seconds"] - 1 for (_, s), r in zip(got, rows)]
            worst = max(err_m, key=abs)
            within = sum(abs(e) <= 0.2 for e in err_m)
            within_s = sum(abs(e) <= 0.2 for e in err_s)
            rms = (sum(e * e for e in err_m) / len(err_m)) ** 0.5
            results.append((round(abs(worst), 3), rms, lat, chain, over, intra_over, worst, within,
                            max(map(abs, err_s)), within_s))
    results.sort()
    n = len(rows)
    print(f"{n} plans; candidates by the model's worst error:")
    print("latency_ms chain_latency_ms overhead_us intra_overhead_us  worst_model  rms_model"
          "  worst_sim  within_20% (model, sim)")
    for _, rms, lat, chain, over, io, worst, within, sw, ws in results[:a.top]:
        print(f"{lat:10g} {chain:16g} {over:11g} {io:17g}  {worst:+10.3f}  {rms:9.3f}  {sw:9.3f}"
              f"  {within}/{n}, {ws}/{n}")


if __name__ == "__main__":
    main()
