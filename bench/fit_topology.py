#!/usr/bin/env python3
"""Fits a topology's network latencies to the emulated cluster's measurements.

For every meshcast plan the suite measured (docs/data/cluster-*.json, written by
bench/run-cluster.sh), re-plans the case with `meshcast simulate` on the topology with each
candidate (latency_us, chain_latency_us) of a grid, and prints the candidates ranked by the worst
relative error of the analytic model (ties broken by the root-mean-square error). Bandwidths stay as the file gives
them: the link-bound optimum of docs/benchmarks.md is computed from them.

  bench/fit_topology.py --meshcast build/default/bin/meshcast --topology meshes/emulated.json \
      docs/data/cluster-*.json
"""
import argparse
import concurrent.futures
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
    ap.add_argument("--latency-ms", default="2,4,6,8,10,12,14")
    ap.add_argument("--chain-latency-ms", default="0.5,1,1.5,2,2.5,3,4,6,12")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args()
    rows = rows_of(a.runs)
    if not rows:
        sys.exit("fit_topology: no rows with layouts (re-run bench/run-cluster.sh)")
    with open(a.topology) as f:
        base = json.load(f)
    results = []
    with tempfile.TemporaryDirectory() as tmp, concurrent.futures.ThreadPoolExecutor(2) as pool:
        for lat in (float(x) for x in a.latency_ms.split(",")):
            for chain in (float(x) for x in a.chain_latency_ms.split(",")):
                topo = json.loads(json.dumps(base))
                net = topo["links"]["network"]
                net["latency_us"] = lat * 1000
                net["chain_latency_us"] = chain * 1000
                path = os.path.join(tmp, f"t-{lat}-{chain}.json")
                with open(path, "w") as f:
                    json.dump(topo, f)
                got = list(pool.map(lambda r: predict(a.meshcast, path, r), rows))
                err_m = [p / r["seconds"] - 1 for (p, _), r in zip(got, rows)]
                err_s = [s / r["seconds"] - 1 for (_, s), r in zip(got, rows)]
                worst = max(err_m, key=abs)
                within = sum(abs(e) <= 0.2 for e in err_m)
                rms = (sum(e * e for e in err_m) / len(err_m)) ** 0.5
                results.append((round(abs(worst), 3), rms, lat, chain, worst, within,
                                max(map(abs, err_s))))
    results.sort()
    print(f"{len(rows)} plans; candidates by the model's worst error:")
    print("latency_ms chain_latency_ms  worst_model  rms_model  worst_sim  within_20%")
    for _, rms, lat, chain, worst, within, sw in results[:a.top]:
        print(f"{lat:10g} {chain:16g}  {worst:+10.3f}  {rms:9.3f}  {sw:9.3f}  {within}/{len(rows)}")


if __name__ == "__main__":
    main()
