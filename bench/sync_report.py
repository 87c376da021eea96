"""Writes docs/sync.md and docs/img/sync-*.png from the runs of bench/run-sync.sh
(docs/data/sync-*.json: one `meshcast sync --json` object each).

    python3 bench/sync_report.py docs/data/sync-*.json
"""
import os
import sys

from report import Report, read_json

REPORT = Report("sync", "docs/sync.md", __doc__)
REPORT.add("json", nargs="+", help="meshcast sync --json files named sync-NAME.json")

# NCCL M2N's published GB200 NVL72 measurements for the same configurations (ms).
M2N = {
    "qwen3-235b-a22b": {"hierarchical": 988.75, "direct": 2175.16},
    "deepseek-v3": {"hierarchical": 1447.44, "direct": 3837.74},
}
MODES = ["fused", "per-tensor", "gather"]
# Each measured table's rows: the modes, then fused with a cast and fused without forked chains.
ROWS = MODES + ["fused-bf16", "fused-nofork"]


def load(paths):
    return {os.path.basename(p)[len("sync-"):-len(".json")]: read_json(p) for p in paths}


def ms(s):
    if s >= 10:
        return f"{s:,.1f} s"
    if s >= 0.01:
        return f"{s * 1e3:,.0f} ms"
    return f"{s * 1e3:.1f} ms" if s >= 0.001 else f"{s * 1e6:,.0f} µs"


def measured_table(runs, prefix, out):
    fused = runs.get(f"{prefix}-fused")
    out.append("| mode | tensors | median | predicted | link bound | link bound / median "
               "| median / fused's |")
    out.append("|---|---:|---:|---:|---:|---:|---:|")
    for name in [f"{prefix}-{m}" for m in ROWS]:
        r = runs.get(name)
        if not r:
            continue
        label = row_label(r)
        vs = f"{r['seconds'] / fused['seconds']:.2f}" if fused else "n/a"
        out.append(
            f"| {label} | {r['tensors']} | {ms(r['seconds'])} | {ms(r['predicted_seconds'])} | "
            f"{ms(r['link_bound_seconds'])} | {r['link_bound_seconds'] / r['seconds']:.2f} | "
            f"{vs} |")
        if not r.get("verified"):
            out.append(f"| (not verified: {r.get('mismatches')} mismatches) | | | | | | |")


def row_label(r):
    return (r["mode"] + (f" + cast {r['cast']}" if r.get("cast") else "")
            + (", chains never fork" if r.get("fork") is False else ""))


COLORS = {"fused": "#1f77b4", "per-tensor": "#ff7f0e", "gather": "#d62728",
          "fused-bf16": "#2ca02c", "fused-nofork": "#9467bd"}


def plot_measured(plt, runs, prefix, title, filename, bound_label="link bound (f32)"):
    rows = [m for m in ROWS if f"{prefix}-{m}" in runs]
    if not rows:
        return
    names = [f"{prefix}-{m}" for m in rows]
    labels = [row_label(runs[n]).replace(", chains never fork", "\nno fork")
              .replace(" + cast ", " + ") for n in names]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    secs = [runs[n]["seconds"] for n in names]
    ax.bar(labels, secs, color=[COLORS[m] for m in rows])
    bound = runs[names[0]]["link_bound_seconds"]
    ax.axhline(bound, color="black", linestyle="--", linewidth=1,
               label=f"{bound_label}: {ms(bound)}")
    for i, s in enumerate(secs):
        ax.text(i, s, ms(s), ha="center", va="bottom", fontsize=9)
    ax.set_ylabel("median seconds per sync")
    ax.set_ylim(0, max(secs) * 1.15)
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    REPORT.save(fig, filename)


def plot_scale(plt, runs, filename):
    cases = [("qwen3-235b-a22b", "Qwen3-235B-A22B\n64 -> 64"), ("deepseek-v3", "DeepSeek-V3\n128 -> 128")]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    width = 0.2
    series = [("meshcast fused, predicted", lambda m: runs.get(f"predict-{m}-gb200-nvl72-fused", {}).get("predicted_seconds")),
              ("meshcast fused, link bound", lambda m: runs.get(f"predict-{m}-gb200-nvl72-fused", {}).get("link_bound_seconds")),
              ("NCCL M2N hierarchical, measured", lambda m: M2N[m]["hierarchical"] / 1e3),
              ("NCCL M2N direct, measured", lambda m: M2N[m]["direct"] / 1e3)]
    for k, (label, get) in enumerate(series):
        xs = [i + (k - 1.5) * width for i in range(len(cases))]
        ys = [get(m) or 0 for m, _ in cases]
        ax.bar(xs, ys, width, label=label, hatch="//" if "M2N" in label else None)
    ax.set_xticks(range(len(cases)), [c[1] for c in cases])
    ax.set_ylabel("seconds per sync")
    ax.set_title("GB200 NVL72: meshcast's prediction beside NCCL M2N's measurements", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    REPORT.save(fig, filename)


def measured_sections():
    """(runs' prefix, heading, text, plot title, bound's label) of each measured table, in the
    doc's order; its plot is docs/img/sync-PREFIX.png."""
    gpt2 = ("GPT-2 medium (388 tensors, 1.42 GB of f32 master weights) from a trainer of tp=2 x "
            "pp=2 on hosts 0-1 to generators of tp=2 x dp=2 on hosts 2-3 (bench/cluster/cluster.sh, "
            "4 hosts x 2 MPI ranks, meshes/emulated-4x2.json), `--backend mpi`.")
    narrow = ("The synthetic 1,028-tensor model (models/gpt2-deep-narrow.json: 255 MB of f32, 642 "
              "of its tensors norms and biases of 1-4 KiB) on the same hosts and layouts.")
    same = "### The same, many small tensors"
    emu = "topology's link bound, NICs in and out (f32)"
    shm = "link bound of meshes/single-host.json (f32)"
    both, out_only = "1 Gbit/s each way", "1 Gbit/s out only"
    return [
        ("duplex", "## Emulated cluster, 1 Gbit/s per host in each direction",
         f"{gpt2} Each host's link is shaped both ways (`cluster.sh --duplex`), as the topology "
         "file's NICs are: its link bound is this network's.",
         f"GPT-2 medium, tp2 x pp2 -> tp2 x dp2, hosts {both}", emu),
        ("duplex-narrow", same, narrow,
         f"1,028 tensors (synthetic), tp2 x pp2 -> tp2 x dp2, hosts {both}", emu),
        ("nic", "### The same with a NIC per device",
         "GPT-2 medium on the same hosts, each device with a network link of its own shaped to 1 "
         "Gbit/s both ways (`cluster.sh --nic-per-rank --duplex`, meshes/emulated-4x2-nic.json), "
         "as on hosts with a NIC per GPU.",
         "GPT-2 medium, hosts with a 1 Gbit/s NIC per device", emu),
        ("colocated", "### A trainer and a generator sharing a host",
         "GPT-2 small (196 tensors, 498 MB of f32) from a trainer of dp=3 on host 0 to generators "
         "of dp=5, one on host 0 beside the trainer and four on host 1 (models/systems/"
         "dp3-to-dp5.json; `cluster.sh run --hosts 2 --ranks-per-host 4 --nic-per-rank "
         "--duplex`, meshes/emulated-2x4-nic.json): a NIC per device, 1 Gbit/s both ways. "
         "Fused chains fork at the trainer (docs/design.md, *Forked chains*), so what leaves "
         "host 0 goes through the trainers' three NICs; `--no-fork` keeps plain chains, which "
         "leave it through the generator's one.",
         "GPT-2 small, dp3 -> dp5, a generator beside the trainer, a NIC per device", emu),
        ("emulated", "## Emulated cluster, 1 Gbit/s per host out, unshaped in",
         f"{gpt2} Only each host's egress is shaped, so a host can receive from several hosts at "
         "once, faster than the topology's NIC: a mode can beat the topology's link bound here.",
         f"GPT-2 medium, tp2 x pp2 -> tp2 x dp2, hosts {out_only}", emu),
        ("emulated-narrow", same, narrow,
         f"1,028 tensors (synthetic), tp2 x pp2 -> tp2 x dp2, hosts {out_only}", emu),
        ("shm", "## Shared memory, 8 ranks, many small tensors",
         "The synthetic 1,028-tensor model (models/gpt2-deep-narrow.json: 642 of its tensors are "
         "norms and biases of 1-4 KiB) from tp=2 x pp=2 to tp=2 x dp=2, 8 MPI ranks on this "
         "host's shared memory (no emulation; 2 cores for 8 ranks). The link bound is the "
         "single-host topology's, not this machine's.",
         "1,028 tensors, 8 ranks, shared memory", shm),
        ("shm-small", "### The same model's small tensors alone",
         "Its 642 tensors of at most 64 KiB (the norms and biases, 0.85 MB in all), the rest of "
         "the model left out, on the same ranks: where messages, not bytes, take the time.",
         "the 1,028-tensor model's 642 of <= 64 KiB, 8 ranks, shared memory", shm),
    ]


def main():
    runs = load(REPORT.parse().json)
    out = ["# Whole-model sync: measured",
           "",
           "Written by `bench/run-sync.sh` (bench/sync_report.py) from docs/data/sync-*.json. "
           "Every mode of a table ran in the same session, one after the other, on this "
           "2-core machine; every element of every tensor on every generator was checked "
           "(`--verify`). How sync works: docs/design.md, \"Whole-model sync\"; the command: "
           "docs/cli.md, `meshcast sync`.",
           "",
           "Modes: **fused** plans the whole model as one sync (boxes coalesced per sender and "
           "receivers, senders rotated over every replica, at most `--max-staging-bytes` of "
           "packing memory in flight); **per-tensor** runs one meshcast plan per tensor, one "
           "after the other; **gather** gathers each tensor on the first trainer of its stage "
           "and broadcasts the whole tensor from there to every generator, which keeps its "
           "slice (what many RL frameworks do). The link bound is the busiest link's bytes over "
           "its rate as the topology file models the links: no schedule of the fused plan's bytes on those links is faster.",
           ""]
    for prefix, heading, text, _, _ in measured_sections():
        measured_table_block(runs, prefix, out, heading, text, f"sync-{prefix}.png")
    out += ["## At scale, predicted",
            "",
            "`meshcast sync --predict` on the topologies meshes/h100-cluster.json (8 H100 per host, "
            "NVLink 450 GB/s per direction, a 400 Gbit/s NIC per GPU) and meshes/gb200-nvl72.json "
            "(72 GPUs per NVLink domain at 900 GB/s, a 400 Gbit/s NIC per GPU). These are "
            "predictions of the cost model, not measurements: no claim of speed rests on them.",
            "",
            "| model | topology | mode | predicted | link bound | busiest link | messages | plan per device |",
            "|---|---|---|---:|---:|---|---:|---:|"]
    for m in ["qwen3-235b-a22b", "deepseek-v3"]:
        for topo in ["h100-cluster", "gb200-nvl72"]:
            for mode in MODES:
                r = runs.get(f"predict-{m}-{topo}-{mode}")
                if r:
                    out.append(f"| {m} ({r['tensors']} tensors) | {topo} | {mode} | "
                               f"{ms(r['predicted_seconds'])} | {ms(r['link_bound_seconds'])} | "
                               f"{r.get('busiest_link', '')} | {r['messages']:,} | "
                               f"{ms(r['plan_seconds'])} |")
    out += ["", REPORT.image("sync-scale.png", "prediction beside NCCL M2N"), ""]
    plt = REPORT.pyplot()
    if plt:
        for prefix, _, _, title, bound in measured_sections():
            plot_measured(plt, runs, prefix, title, f"sync-{prefix}.png", bound)
        plot_scale(plt, runs, "sync-scale.png")
    out.append(REPORT.commentary().strip())
    bad = [n for n, r in runs.items() if "verified" in r and not r["verified"]]
    return REPORT.write("\n".join(out) + "\n", failed=bool(bad), summary=f"{len(runs)} runs")


def measured_table_block(runs, prefix, out, title, text, image):
    if not any(f"{prefix}-{m}" in runs for m in MODES):
        return
    out += [title, "", text, ""]
    measured_table(runs, prefix, out)
    out += ["", REPORT.image(image, prefix), ""]


if __name__ == "__main__":
    sys.exit(main())
