"""The one report module of bench/: every bench/*_report.py writes its doc through it.

A report reads the JSON that its bench/run-*.sh made and writes one Markdown doc (its tables,
then the hand-written bench/NAME_commentary.md) with PNG plots beside it. What every report
shares is here, so that they all behave alike:
- the command line: the inputs, --doc, --img, --command (how the inputs were made, quoted in the
  doc), --no-plots;
- reading runs, median and geometric mean;
- matplotlib without a display, or tables only (and a note) where it is not installed;
- saving a plot under --img and linking it from the doc by a path relative to the doc;
- writing the doc, one line saying what was written, and the exit status: 1 when a run counted a
  wrong element or missed a check, 2 for bad arguments (argparse's).
"""
import argparse
import json
import math
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def read_json(path):
    with open(path) as f:
        return json.load(f)


def load(paths):
    """(file name, JSON) per run, and every row of the runs' "rows" with its run's file name under
    "run" (the MPI suites' format)."""
    runs, rows = [], []
    for p in paths:
        j = read_json(p)
        runs.append((os.path.basename(p), j))
        for r in j["rows"]:
            r = dict(r)
            r["run"] = os.path.basename(p)
            rows.append(r)
    return runs, rows


def nic_per_device(run):
    """Whether a bench/cluster_suite run (its JSON) ran on hosts with a NIC per device
    (cluster.sh --nic-per-rank) rather than one per host."""
    return run["topology"]["links"]["network"].get("nics_per_host", 1) > 1


def median(xs):
    return statistics.median(xs)


def gmean(xs):
    """The geometric mean of the positive values (NaN when there are none)."""
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


class Report:
    """One report: `name` is its file's stem (bench/NAME_report.py, bench/NAME_commentary.md,
    bench/run-NAME.sh the default --command); `doc` the default --doc."""

    def __init__(self, name, doc, docstring):
        self.name = name
        summary = " ".join(docstring.strip().split("\n\n")[0].split())  # its first paragraph
        self.parser = argparse.ArgumentParser(
            prog=f"bench/{name}_report.py", description=summary,
            epilog=f"Writes --doc (default {doc}) and PNG plots under --img.")
        self.parser.add_argument("--doc", default=doc, help="the Markdown file to write")
        self.parser.add_argument("--img", default="docs/img", help="where the PNG plots go")
        self.parser.add_argument("--command", default=f"bench/run-{name}.sh",
                                 help="the command that made the inputs, as the doc quotes it")
        self.parser.add_argument("--no-plots", action="store_true",
                                 help="write the doc's text only (its image links stay)")
        self.args = None
        self.made = []  # file names of the plots written, in order
        self._plt = False  # not looked up yet

    def add(self, *args, **kwargs):
        """An option or input of this report (argparse's add_argument)."""
        return self.parser.add_argument(*args, **kwargs)

    def parse(self, argv=None):
        self.args = self.parser.parse_args(argv)
        return self.args

    def pyplot(self):
        """matplotlib.pyplot on the Agg backend, or None: --no-plots, or matplotlib missing (said
        once on stderr; Debian: python3-matplotlib)."""
        if self._plt is False:
            self._plt = None
            if not self.args.no_plots:
                try:
                    import matplotlib
                    matplotlib.use("Agg")
                    import matplotlib.pyplot as plt
                    self._plt = plt
                except ImportError:
                    print(f"{self.name}_report: matplotlib not available, no plots", file=sys.stderr)
        return self._plt

    def save(self, fig, filename):
        """Writes `fig` as --img/filename (110 dpi, as every doc plot), closes it, and returns
        the path."""
        os.makedirs(self.args.img, exist_ok=True)
        path = os.path.join(self.args.img, filename)
        fig.savefig(path, dpi=110)
        self.pyplot().close(fig)
        self.made.append(filename)
        return path

    def image(self, filename, alt):
        """The doc's Markdown link to the plot --img/filename."""
        doc_dir = os.path.dirname(os.path.abspath(self.args.doc))
        return f"![{alt}]({os.path.relpath(os.path.join(self.args.img, filename), doc_dir)})"

    def commentary(self):
        """bench/NAME_commentary.md: what the figures mean, written by hand beside the data."""
        with open(os.path.join(HERE, f"{self.name}_commentary.md")) as f:
            return f.read()

    def write(self, text, failed=False, summary=""):
        """Writes the doc, says so in one line, and returns the exit status."""
        os.makedirs(os.path.dirname(os.path.abspath(self.args.doc)), exist_ok=True)
        with open(self.args.doc, "w") as f:
            f.write(text)
        line = f"{self.name}_report: wrote {self.args.doc}"
        if summary:
            line += f" ({summary})"
        if self.made:
            line += f" and {', '.join(self.made)} under {self.args.img}"
        print(line)
        return 1 if failed else 0
