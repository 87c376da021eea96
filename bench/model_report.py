#!/usr/bin/env python3
"""Writes docs/model.md (and docs/img/model-*.png): the cost model and the simulator against
the emulated cluster's measurements, and their predictions at scales this machine cannot run.

  bench/model_report.py --cluster docs/data/cluster-*.json --study STUDY.json \
      --scale GBENCH.json --doc docs/model.md --img docs/img [--command TEXT]

--cluster: JSON of bench/cluster_suite runs (bench/run-cluster.sh copies them to docs/data/);
every meshcast row carries the model's and the simulator's time for the plan it ran. Runs on
hosts with a NIC per device are left out: the study predicts every run on meshes/emulated.json,
whose hosts have one NIC each.
--study: JSON of bench/model --json; --scale: Google Benchmark JSON of the same run's
scale/* benchmarks. bench/run-model.sh runs it all.
"""
import sys

from report import Report, load, nic_per_device, read_json

REPORT = Report("model", "docs/model.md", __doc__)
REPORT.add("--cluster", nargs="+", required=True, help="bench/cluster_suite --json files")
REPORT.add("--study", required=True, help="bench/model --json file")
REPORT.add("--scale", required=True, help="bench/model --benchmark_out file (JSON)")

MESHCAST = ["sendrecv", "allgather", "broadcast", "broadcast+greedy", "broadcast+search"]
# The candidates of strategy auto (each planned with balance search).
AUTO_CANDIDATES = ["sendrecv", "allgather", "broadcast+search"]
TOLERANCE = 0.20  # the figure: predicted within +-20% of measured
PICK_SLACK = 0.05  # auto's pick within 5% of the measured-fastest


def err(pred, meas):
    return pred / meas - 1


def pct(x):
    return f"{x * 100:+.0f}%"


def ms(s):
    return f"{s * 1e3:.1f}"


def validation(rows):
    """Rows of meshcast methods that ran their own plan, with model and simulator errors."""
    out = []
    for r in rows:
        if r["method"] not in MESHCAST or r.get("same_as") or not r.get("simulated_seconds"):
            continue
        out.append(dict(r, e_model=err(r["predicted_seconds"], r["seconds"]),
                        e_sim=err(r["simulated_seconds"], r["seconds"])))
    return out


def by_case(rows):
    out = {}
    for r in rows:
        out.setdefault((r["group"], r["case"], r["bytes"]), {})[r["method"]] = r
    return out


def time_of(by, m):
    """Measured time of method m in a case (following "same plan as")."""
    r = by.get(m)
    if r is None:
        return None
    return r["seconds"]


def picks(rows):
    """Per case: auto's pick, its measured time, the measured-fastest candidate."""
    out = []
    for (group, case, size), by in by_case(rows).items():
        cand = {m: time_of(by, m) for m in AUTO_CANDIDATES if time_of(by, m)}
        if not cand:
            continue
        pick = next(iter(by.values())).get("auto_pick")
        if pick not in cand:
            continue
        best = min(cand, key=cand.get)
        out.append({"group": group, "case": case, "bytes": size, "pick": pick,
                    "t_pick": cand[pick], "best": best, "t_best": cand[best],
                    "ok": cand[pick] <= cand[best] * (1 + PICK_SLACK)})
    return out


def scale_medians(scale):
    """One row per scale benchmark: the median CPU time over its repetitions, with its counters."""
    by = {}
    for b in scale.get("benchmarks", []):
        if b.get("run_type", "iteration") == "iteration":
            by.setdefault(b["run_name"] if "run_name" in b else b["name"], []).append(b)
    out = []
    for runs in by.values():
        runs = sorted(runs, key=lambda b: b["cpu_time"])
        out.append(runs[len(runs) // 2])
    return out


def plot_validation(plt, val, filename):
    fig, ax = plt.subplots(figsize=(6, 5))
    xs = [r["seconds"] for r in val]
    lo, hi = min(xs) * 0.7, max(xs) * 1.4
    ax.plot([lo, hi], [lo, hi], color="black", lw=1)
    ax.fill_between([lo, hi], [lo * (1 - TOLERANCE), hi * (1 - TOLERANCE)],
                    [lo * (1 + TOLERANCE), hi * (1 + TOLERANCE)], color="0.9", label="±20%")
    ax.scatter(xs, [r["predicted_seconds"] for r in val], marker="o", facecolors="none",
               edgecolors="C0", label="analytic model")
    ax.scatter(xs, [r["simulated_seconds"] for r in val], marker="x", color="C3",
               label="simulator")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured time (s), emulated cluster")
    ax.set_ylabel("predicted time (s)")
    ax.set_title("Predicted vs measured, every meshcast plan of the suite")
    ax.legend()
    fig.tight_layout()
    REPORT.save(fig, filename)


def plot_one_to_m(plt, study, topology, filename):
    rows = [r for r in study if r["topology"] == topology and r["group"] == "1m"]
    if not rows:
        return False
    # One position per case, by receivers then hosts: two cases of as many receivers (4 on one
    # host, 4 on two) are different moves, not two values at one x.
    cases = sorted({(r["devices"] - 1, r["receiver_hosts"], r["case"]) for r in rows})
    at = {c[2]: i for i, c in enumerate(cases)}
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    for m in ["sendrecv", "allgather", "broadcast+search"]:
        pts = sorted((at[r["case"]], r["bytes"] / r["simulated_seconds"] / 1e9)
                     for r in rows if r["method"] == m)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=m)
        missing = [c for c in cases if not any(r["case"] == c[2] and r["method"] == m for r in rows)]
        if missing:  # allgather: r^2 ops, not planned past 512 receivers
            ax.annotate(f"{m}: not planned for {missing[0][0]}+ receivers (r\u00b2 ops)",
                        xy=(at[missing[0][2]] - 0.5, ax.get_ylim()[1] * 0.5), fontsize=8,
                        ha="center", color="C1")
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels([f"{r}\non {h} host{'s' if h > 1 else ''}" for r, h, _ in cases], fontsize=8)
    ax.set_xlabel("receiving devices (one sender on another host)")
    ax.set_ylabel("effective GB/s (simulated)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"1-to-m on {topology}: one sender, receivers on other hosts")
    ax.legend()
    fig.tight_layout()
    REPORT.save(fig, filename)
    return True


def local_vs_search(study):
    """Simulated time of broadcast with the local rule (what each device computes alone) over
    broadcast with search (the whole plan's balancer), case by case."""
    by = {}
    for r in study:
        by.setdefault((r["topology"], r["group"], r["case"], r["bytes"]), {})[r["method"]] = r
    rows = []
    for (topo, group, case, size), m in sorted(by.items()):
        if "broadcast+local" in m and "broadcast+search" in m:
            rows.append((topo, case, size, m["broadcast+local"]["simulated_seconds"] /
                         m["broadcast+search"]["simulated_seconds"]))
    if not rows:
        return []
    ratios = sorted(x[3] for x in rows)
    worst = max(rows, key=lambda x: x[3])
    d = ["### Per-rank plans: the local rule against search\n",
         "A device planning its own part alone (`plan_rank`) cannot run search, which balances "
         "senders over the whole plan; it uses the local rule (a holder on the receiver's host, "
         "in rotation by task). Simulated time of broadcast+local over broadcast+search, on "
         f"every case of the study ({len(rows)}): median {ratios[len(ratios) // 2]:.3f}, best "
         f"{ratios[0]:.3f}, worst {worst[3]:.3f} ({worst[0]} {worst[1]} "
         f"{worst[2] / 2**20:g} MiB); above 1 the local plan is slower.\n",
         "| topology | case | size | local / search |", "|---|---|---|---|"]
    d += [f"| {t} | {c} | {s / 2**20:g} MiB | {x:.3f} |" for t, c, s, x in rows]
    d.append("")
    return d


def study_table(study, topology, group):
    rows = [r for r in study if r["topology"] == topology and r["group"] == group]
    methods = [m for m in MESHCAST + ["auto"] if any(r["method"] == m for r in rows)]
    keys = []
    for r in rows:
        if (r["case"], r["bytes"]) not in keys:
            keys.append((r["case"], r["bytes"]))
    out = ["| case | size | " + " | ".join(methods) + " |", "|---|---|" + "---|" * len(methods)]
    for case, size in keys:
        cells = []
        for m in methods:
            r = next((x for x in rows if x["case"] == case and x["bytes"] == size
                      and x["method"] == m), None)
            if r is None:
                cells.append("")
                continue
            cell = f"{size / r['simulated_seconds'] / 1e9:.2f}"
            if m == "auto":
                cell += f" ({r['strategy']})"
            cells.append(cell)
        out.append(f"| {case} | {size / 2**30:g} GiB | " + " | ".join(cells) + " |")
    return out


def main():
    a = REPORT.parse()

    runs, rows = load(a.cluster)
    nic = {n for n, j in runs if nic_per_device(j)}
    runs = [(n, j) for n, j in runs if n not in nic]
    rows = [r for r in rows if r["run"] not in nic]
    study = read_json(a.study)["rows"]
    scale = read_json(a.scale)
    val = validation(rows)
    pk = picks(rows)
    plt = REPORT.pyplot()

    worst_m = max(val, key=lambda r: abs(r["e_model"]))
    worst_s = max(val, key=lambda r: abs(r["e_sim"]))
    in_m = sum(abs(r["e_model"]) <= TOLERANCE for r in val)
    in_s = sum(abs(r["e_sim"]) <= TOLERANCE for r in val)
    ok_pick = sum(p["ok"] for p in pk)
    exact_pick = sum(p["pick"] == p["best"] for p in pk)

    d = []
    d.append("# The cost model and the simulator: validated, then used at scale\n")
    d.append(f"Generated by `bench/model_report.py` (`{a.command}`); do not edit by hand. "
             "What the models are: [design.md](design.md#cost-model-and-simulator); the API: "
             "`predict()` and `simulate()` in `include/meshcast/cost.h`; the command line: "
             "`meshcast simulate` and `meshcast plan --json` ([cli.md](cli.md)).\n")
    d.append("## Targets\n")
    d.append("| target | measured | met |\n|---|---|---|")
    d.append(f"| predicted within ±20% of measured, every case of the suite on the emulated "
             f"cluster: analytic model | {in_m} of {len(val)} plans; worst {pct(worst_m['e_model'])} "
             f"({worst_m['case']} {worst_m['bytes'] / 2**20:g} MiB {worst_m['method']}) | "
             f"{'yes' if in_m == len(val) else '**no**'} |")
    d.append(f"| the same, simulator | {in_s} of {len(val)} plans; worst {pct(worst_s['e_sim'])} "
             f"({worst_s['case']} {worst_s['bytes'] / 2**20:g} MiB {worst_s['method']}) | "
             f"{'yes' if in_s == len(val) else '**no**'} |")
    d.append(f"| strategy auto picks the measured-fastest strategy or one within 5% | "
             f"{ok_pick} of {len(pk)} cases ({exact_pick} the fastest itself) | "
             f"{'yes' if ok_pick == len(pk) else '**no**'} |")
    big = scale_medians(scale)
    if big:
        worst = max(big, key=lambda b: b["cpu_time"])
        fat = max(big, key=lambda b: b.get("peak_mb", 0))
        d.append(f"| planning + simulating an 8,192-device reshard in < 10 s and < 2 GB on one core | "
                 f"{worst['cpu_time'] / 1e3:.2f} s CPU at most ({worst['name'].split('/')[1]}), "
                 f"{fat.get('peak_mb', 0) * 2**20 / 1e9:.2f} GB peak at most ({fat['name'].split('/')[1]}) | "
                 f"{'yes' if worst['cpu_time'] < 10e3 and fat.get('peak_mb', 0) * 2**20 < 2e9 and worst.get('devices', 0) >= 8192 else '**no**'} |")
    d.append("")

    d.append("## Validation on the emulated cluster\n")
    d.append("Every plan that meshcast ran in the suite ([benchmarks.md](benchmarks.md): 5 hosts × "
             "4 ranks, one 1 Gbit/s link per host), its measured time (median of the slowest "
             "rank), the analytic model's time (`predict()`, what the planner ranks by) and the "
             "simulator's (`simulate()`), on `meshes/emulated.json`. Runs: " +
             "; ".join(f"`{n}` {j.get('date', '')}" for n, j in runs) + ".\n")
    if plt:
        plot_validation(plt, val, "model-validation.png")
        d.append(REPORT.image("model-validation.png", "validation") + "\n")
    d.append("| case | size | method | measured ms | model ms | model err | simulated ms | sim err |")
    d.append("|---|---|---|---|---|---|---|---|")
    for r in val:
        d.append(f"| {r['case']} | {r['bytes'] / 2**20:g} MiB | {r['method']} | {ms(r['seconds'])} | "
                 f"{ms(r['predicted_seconds'])} | {pct(r['e_model'])} | "
                 f"{ms(r['simulated_seconds'])} | {pct(r['e_sim'])} |")
    d.append("")
    d.append("### Strategy auto against the measurements\n")
    d.append("auto plans sendrecv, allgather and broadcast (each with balance search) and keeps "
             "the least predicted time. Measured times of the three in the same run:\n")
    d.append("| case | size | auto picks | its time ms | measured-fastest | its time ms | within 5% |")
    d.append("|---|---|---|---|---|---|---|")
    for p in pk:
        d.append(f"| {p['case']} | {p['bytes'] / 2**20:g} MiB | {p['pick']} | {ms(p['t_pick'])} | "
                 f"{p['best']} | {ms(p['t_best'])} | {'yes' if p['ok'] else '**no**'} |")
    d.append("")
    d.append("### Load balancing: none vs greedy vs search, predicted and measured\n")
    d.append("Multi-sender n-to-m cases (several devices hold each box). Time in ms; the gain is "
             "none's time / the method's time.\n")
    d.append("| case | size | none: measured / sim / model | greedy: measured / sim / model | search: measured / sim / model | measured gain greedy, search | simulated gain |")
    d.append("|---|---|---|---|---|---|---|")
    for (group, case, size), by in by_case(rows).items():
        if group != "nm" or "broadcast" not in by:
            continue
        def trio(m):
            r = by[m]
            src = by.get(r.get("same_as") or m, r)
            return r["seconds"], src.get("simulated_seconds") or r.get("simulated_seconds"), \
                src.get("predicted_seconds") or r.get("predicted_seconds")
        n, g, s = trio("broadcast"), trio("broadcast+greedy"), trio("broadcast+search")
        cells = [" / ".join(ms(x) for x in t) for t in (n, g, s)]
        d.append(f"| {case} | {size / 2**20:g} MiB | " + " | ".join(cells) +
                 f" | {n[0] / g[0]:.2f}×, {n[0] / s[0]:.2f}× | {n[1] / g[1]:.2f}×, {n[1] / s[1]:.2f}× |")
    d.append("")

    d += local_vs_search(study)

    d.append("## At scale: the paper's cluster and a 1,024-host cluster\n")
    d.append("Effective GB/s (tensor bytes / simulated time) per method, from `bench/model` "
             "(planned and simulated on this machine; no such cluster was run). auto shows the "
             "strategy it picked. allgather and auto are left out where a box has more than "
             "512 receivers (allgather's r² ops).\n")
    for topo in ["aws-p3.8xlarge", "cluster-1024x8"]:
        if not any(r["topology"] == topo for r in study):
            continue
        d.append(f"### {topo}\n")
        if plt and plot_one_to_m(plt, study, topo, f"model-{topo}-1m.png"):
            d.append(REPORT.image(f"model-{topo}-1m.png", "1m") + "\n")
        d.append("1-to-m (one sender on host 0, receivers on h other hosts):\n")
        d += study_table(study, topo, "1m")
        d.append("\nn-to-m (disjoint meshes on disjoint hosts):\n")
        d += study_table(study, topo, "nm")
        d.append("")
    if big:
        d.append("### Planning + simulation time, 8,192 devices (1,024 hosts × 8)\n")
        d.append("Google Benchmark, CPU time of one process (one core) per iteration: plan from "
                 "scratch (strategy broadcast, balance search), then simulate; peak = the "
                 "process's peak resident memory over the case's iterations (reset before it).\n")
        d.append("| case | devices | ops | CPU s (median) | peak MiB | simulated time | rate updates |")
        d.append("|---|---|---|---|---|---|---|")
        for b in big:
            d.append(f"| {b['name'].split('/')[1]} | {b.get('devices', 0):.0f} | {b.get('ops', 0):.0f} | "
                     f"{b['cpu_time'] / 1e3:.2f} | {b.get('peak_mb', 0):.0f} | "
                     f"{b.get('simulated_s', 0) * 1e6:.1f} µs | {b.get('events', 0):.0f} |")
        d.append("")
    d.append(REPORT.commentary())
    return REPORT.write("\n".join(d).rstrip() + "\n",
                        summary=f"{in_m}/{len(val)} model, {in_s}/{len(val)} simulator within "
                                f"±20%, auto {ok_pick}/{len(pk)}")


if __name__ == "__main__":
    sys.exit(main())
