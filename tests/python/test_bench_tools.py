"""bench/ab_compare.py (the A/B of flashkda-bench builds) on stand-in binaries that
print flashkda-bench's progress lines: rows parsed, rounds interleaved with the order
reversed every other round, medians and ratios against the first build."""
from __future__ import annotations

import importlib.util
import os
import stat
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_ab():
    spec = importlib.util.spec_from_file_location("ab_compare", ROOT / "bench" / "ab_compare.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def stand_in(tmp_path, name, ms_by_row, log):
    """A stand-in flashkda-bench: appends its name to `log` when run, prints one
    progress line a row (stderr) and a table line (stdout)."""
    lines = "\n".join(f'echo "  H={h} {case} fp32 vsplit=2 4 stages, segments of 65  1755 MHz  {ms:.3f} ms" >&2'
                      for (h, case), ms in ms_by_row.items())
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\necho {name} >> {log}\n{lines}\necho '| H | case |'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.skipif(os.name != "posix", reason="stand-in binaries are shell scripts")
def test_ab_compare_interleaves_and_reports_ratios(tmp_path, capsys):
    ab = load_ab()
    log = tmp_path / "order.txt"
    a = stand_in(tmp_path, "a", {(12, "varlen6"): 0.200, (24, "1x2000+63x64"): 0.250}, log)
    b = stand_in(tmp_path, "b", {(12, "varlen6"): 0.150, (24, "1x2000+63x64"): 0.300}, log)
    ab.main(["--build", f"main={a}", "--build", f"new={b}", "--rounds", "3", "--", "--heads", "12"])
    assert log.read_text().split() == ["a", "b", "b", "a", "a", "b"]
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| H | case | state | # | main (ms) | new (ms) | new / main |")
    row = next(line for line in out if line.startswith("| 12 | varlen6 |"))
    assert "0.200 / 0.200 / 0.200" in row and "| 0.750 |" in row
    row = next(line for line in out if line.startswith("| 24 | 1x2000+63x64 |"))
    assert "| 1.200 |" in row


def test_ab_compare_parses_the_progress_line():
    ab = load_ab()
    rows = ab.parse_rows("  H=12 1x8000+15x64 fp32 vsplit=2 4 stages, segments of 80 (device: 160) superposed"
                         "  1755 MHz  0.264 ms\nnoise\n")
    assert rows == {(12, "1x8000+15x64", "fp32", 0): (0.264, "4 stages, segments of 80 (device: 160) superposed",
                                                      1755)}
    # A plan sweep prints one line a plan for the same row: each is kept, in order.
    rows = ab.parse_rows("  H=12 8192 fp32 vsplit=2 4 stages  1755 MHz  0.300 ms\n"
                         "  H=12 8192 fp32 vsplit=1 4 stages  1755 MHz  0.400 ms\n")
    assert [rows[(12, "8192", "fp32", k)][0] for k in (0, 1)] == [0.300, 0.400]


def test_ab_compare_refuses_a_bad_build_argument():
    ab = load_ab()
    with pytest.raises(SystemExit):
        ab.main(["--build", "no-path-here"])
