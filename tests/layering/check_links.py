#!/usr/bin/env python3
"""Checks the layering at link level: every meshcast symbol a library leaves undefined is defined
in the library itself or in one it may use, so that no arrow points up or sideways.

    check_links.py NAME=PATH ...     (the static libraries, by target name)

Allowed uses (docs/design.md, "Layers"): the core uses nothing of meshcast; the collectives, the
local transport and the process plumbing use the core; mpi, ucx and nccl use the core and the
process plumbing, never each other; training uses the core and the collectives.
"""
import subprocess
import sys

ALLOWED = {
    "meshcast_core": [],
    "meshcast_collectives": ["meshcast_core"],
    "meshcast_local": ["meshcast_core"],
    "meshcast_process": ["meshcast_core"],
    "meshcast_mpi": ["meshcast_core", "meshcast_process"],
    "meshcast_ucx": ["meshcast_core", "meshcast_process"],
    "meshcast_nccl": ["meshcast_core", "meshcast_process"],
    "meshcast_training": ["meshcast_core", "meshcast_collectives"],
}


def symbols(path):
    """(defined, undefined) mangled names in namespace meshcast, from nm."""
    out = subprocess.run(["nm", "--format=posix", path], capture_output=True, text=True, check=True)
    defined, undefined = set(), set()
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) < 2 or not parts[0].startswith("_ZN") or "8meshcast" not in parts[0][:16]:
            continue
        (undefined if parts[1] == "U" else defined).add(parts[0])
    return defined, undefined


def main():
    libs = dict(arg.split("=", 1) for arg in sys.argv[1:])
    unknown = set(libs) - set(ALLOWED)
    if unknown:
        print("check_links: no rule for", ", ".join(sorted(unknown)))
        return 2
    table = {name: symbols(path) for name, path in libs.items()}
    bad = 0
    for name, (defined, undefined) in sorted(table.items()):
        allowed = set(defined)
        for dep in ALLOWED[name]:
            if dep in table:
                allowed |= table[dep][0]
        missing = sorted(undefined - allowed)
        for other, (odef, _) in sorted(table.items()):
            if other == name or other in ALLOWED[name]:
                continue
            used = [s for s in missing if s in odef]
            if used:
                bad += 1
                demangled = subprocess.run(["c++filt", used[0]], capture_output=True,
                                           text=True).stdout.strip()
                print(f"{name} uses {other} ({len(used)} symbols, e.g. {demangled})")
    print(f"check_links: {len(table)} libraries, {'layering holds' if not bad else f'{bad} wrong arrows'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
