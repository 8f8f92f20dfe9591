#!/usr/bin/env python3
"""A/B of flashkda-bench builds: each build in its own process, interleaved, for a
few rounds, over the same arguments; a markdown table of the medians per round and
the ratio of each build to the first.

    python3 bench/ab_compare.py --build main=build-main/flashkda-bench \\
        --build new=build/flashkda-bench --rounds 2 -- --heads 12,24 --cases varlen6,1x2000+63x64 --states fp32

Why interleaved: the SM clock drifts by a few per cent over a run (the bench prints
it with each row), as much as the changes measured here; builds run one after the
other in each round, the order reversed every other round, so that drift lands on
both alike. The rows are flashkda-bench's progress lines (stderr):
``  H=12 varlen6  fp32 vsplit=2 4 stages, segments of 65  1755 MHz  0.200 ms``.
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys

ROW = re.compile(r"^\s*H=(\d+)\s+(\S+)\s+(\S+)\s+vsplit=(\d)\s+(.*?)\s+(\d+) MHz\s+([\d.]+) ms\s*$")


def parse_rows(text):
    """{(H, case, state, k): (ms, plan, MHz)} of one run's progress lines: k counts the
    lines of one (H, case, state), one a plan where the bench sweeps plans
    (--plans, --sweep-plan, --sweep-v-split), in the order it prints them."""
    rows = {}
    for line in text.splitlines():
        m = ROW.match(line)
        if m:
            H, case, state, _, plan, mhz, ms = m.groups()
            k = 0
            while (int(H), case, state, k) in rows:
                k += 1
            rows[(int(H), case, state, k)] = (float(ms), plan, int(mhz))
    return rows


def run(path, args, timeout):
    p = subprocess.run([path, *args], capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-2000:] + p.stderr[-2000:])
        raise SystemExit(f"{path} exited with {p.returncode}")
    return parse_rows(p.stderr + p.stdout)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", action="append", required=True, metavar="NAME=PATH",
                    help="a flashkda-bench binary and its name; the first is the base of the ratios")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600, help="seconds for one run of one build")
    ap.add_argument("bench_args", nargs=argparse.REMAINDER, help="after --: flashkda-bench's arguments")
    a = ap.parse_args(argv)
    builds = []
    for b in a.build:
        name, sep, path = b.partition("=")
        if not sep or not name or not path:
            ap.error(f"--build: expected NAME=PATH, got {b!r}")
        builds.append((name, path))
    if a.rounds < 1:
        ap.error("--rounds: expected at least 1")
    bench_args = a.bench_args[1:] if a.bench_args[:1] == ["--"] else a.bench_args

    results = {name: [] for name, _ in builds}  # name -> [rows of round r]
    for r in range(a.rounds):
        order = builds if r % 2 == 0 else builds[::-1]
        for name, path in order:
            results[name].append(run(path, bench_args, a.timeout))

    keys = []
    for rows in results[builds[0][0]]:
        keys += [k for k in rows if k not in keys]
    base = builds[0][0]
    head = ["H", "case", "state", "#"] + [f"{n} (ms)" for n, _ in builds] + [f"{n} / {base}" for n, _ in builds[1:]]
    head += [f"plan ({n})" for n, _ in builds]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for k in keys:
        cells = [str(k[0]), k[1], k[2], str(k[3])]
        medians, plans = {}, {}
        for name, _ in builds:
            ms = [rows[k][0] for rows in results[name] if k in rows]
            plans[name] = next((rows[k][1] for rows in results[name] if k in rows), "")
            medians[name] = statistics.median(ms) if ms else None
            cells.append(" / ".join(f"{x:.3f}" for x in ms) if ms else "-")
        for name, _ in builds[1:]:
            b, n = medians[base], medians[name]
            cells.append(f"{n / b:.3f}" if b and n else "-")
        cells += [plans[n] for n, _ in builds]
        print("| " + " | ".join(cells) + " |")
    clocks = [rows[k][2] for name, _ in builds for rows in results[name] for k in rows]
    if clocks:
        print(f"\nSM clock over the rows: {min(clocks)}-{max(clocks)} MHz; {a.rounds} round(s), "
              f"builds in their own processes, order reversed every other round.")


if __name__ == "__main__":
    main()
