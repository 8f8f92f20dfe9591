#!/usr/bin/env python3
"""Where a kernel's time goes around its chunk loop, from ncu's source page: the warp
instructions executed and the stall samples before the chunk loop (a CTA's set-up),
in it, and after it (the final stores, the exit), with each region's largest stall
reasons.

A CTA that runs few chunks pays its set-up and its exit on every item of work; this
splits them from the loop without reading the SASS by hand. The chunk loop is the
one tools/sass_loops.py compares: the backward branch spanning the most HGMMA.

  ncu --section SourceCounters ... -o run <program>
  ncu -i run.ncu-rep --page source --csv --print-source sass > run.csv
  python3 tools/ncu_regions.py run.csv [more.csv ...] [--warps N]

--warps N also prints each region's instructions per warp (N: the launch's warps,
CTAs x warps a CTA).
"""
from __future__ import annotations

import argparse
import csv
import importlib.util
import pathlib
import sys

_HERE = pathlib.Path(__file__).resolve().parent
_REGIONS = ("before", "loop", "after")


def _sass_loops():
    spec = importlib.util.spec_from_file_location("sass_loops", _HERE / "sass_loops.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def read_source_page(lines) -> list[dict]:
    """ncu's --page source --csv rows (the first line names the kernel, the second
    the columns) -> [{address, source, samples, executed, stalls: {reason: n}}]."""
    rows = list(csv.reader(lines))
    header = next(i for i, r in enumerate(rows) if "Address" in r and "Source" in r)
    cols = rows[header]
    at = {name: cols.index(name) for name in ("Address", "Source", "Warp Stall Sampling (All Samples)",
                                               "Instructions Executed")}
    stall_cols = [(i, c[len("stall_"):]) for i, c in enumerate(cols)
                  if c.startswith("stall_") and "Not Issued" not in c]
    out = []
    for r in rows[header + 1:]:
        try:
            address = int(r[at["Address"]], 16)
        except (ValueError, IndexError):
            continue

        def num(i):
            return int(r[i] or 0) if i < len(r) and r[i].strip().isdigit() else 0

        out.append({"address": address, "source": r[at["Source"]].strip(),
                    "samples": num(at["Warp Stall Sampling (All Samples)"]),
                    "executed": num(at["Instructions Executed"]),
                    "stalls": {name: num(i) for i, name in stall_cols}})
    return out


def regions(rows: list[dict]) -> dict[str, dict]:
    """Sums of executed instructions, samples and stall reasons before, in and after
    the chunk loop (all of it 'before' where there is no loop)."""
    span = _sass_loops().chunk_loop_span([(r["address"], r["source"]) for r in rows])
    sums = {k: {"executed": 0, "samples": 0, "stalls": {}} for k in _REGIONS}
    for i, r in enumerate(rows):
        k = "before" if span is None or i < span[0] else "loop" if i <= span[1] else "after"
        sums[k]["executed"] += r["executed"]
        sums[k]["samples"] += r["samples"]
        for name, n in r["stalls"].items():
            sums[k]["stalls"][name] = sums[k]["stalls"].get(name, 0) + n
    return sums


def table(name: str, sums: dict[str, dict], warps: int = 0, top: int = 4) -> str:
    total = sum(s["samples"] for s in sums.values()) or 1
    per_warp = " | instructions a warp" if warps else ""
    lines = [f"{name}", "", f"| region | warp instructions{per_warp} | samples | share | largest stalls |",
             "|---|---|---|---|---|" + ("---|" if warps else "")]
    for k in _REGIONS:
        s = sums[k]
        stalls = ", ".join(f"{n} {v}" for n, v in sorted(s["stalls"].items(), key=lambda x: -x[1])[:top] if v)
        pw = f" | {s['executed'] / warps:.0f}" if warps else ""
        lines.append(f"| {k} | {s['executed']}{pw} | {s['samples']} | {100 * s['samples'] / total:.1f} % | {stalls} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--warps", type=int, default=0, help="the launch's warps, for instructions a warp")
    a = ap.parse_args(argv)
    for path in a.csv:
        with open(path, newline="") as f:
            print(table(path, regions(read_source_page(f)), a.warps))
            print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
