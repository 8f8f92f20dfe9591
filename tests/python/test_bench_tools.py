"""The build-comparison tools. bench/ab_compare.py (the A/B of flashkda-bench builds)
on stand-in binaries that print flashkda-bench's progress lines: rows parsed, rounds
interleaved with the order reversed every other round, medians and ratios against the
first build. tools/sass_loops.py on hand-written cuobjdump text: functions and
registers parsed, the chunk loop found (the backward branch over the most HGMMA, not an
inner one), and its three verdicts. tools/ncu_regions.py on a hand-written ncu source
page: the sums before, in and after that loop."""
from __future__ import annotations

import importlib.util
import os
import stat
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_script(relative):
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_ab():
    return load_script("bench/ab_compare.py")


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


# ---- tools/sass_loops.py ----------------------------------------------------------

def sass(name, body):
    lines = [f"\t\tFunction : {name}"]
    for i, text in enumerate(body):
        lines.append(f"        /*{16 * i:04x}*/                   {text} ;   /* 0x000 */")
    return "\n".join(lines) + "\n"


# 0: set-up; 1-6: the chunk loop (HGMMA x2, an inner loop without HGMMA at 3-4); 7: exit.
BASE = ["MOV R1, c[0x0][0x28]", "HGMMA.64x128x16.F32 R24, gdesc[UR4], R24", "IADD3 R2, R2, 0x1, RZ",
        "FFMA R3, R3, R4, R5", "@P0 BRA 0x0030", "HGMMA.64x128x16.F32 R24, gdesc[UR8], R24",
        "@P1 BRA 0x0010", "EXIT"]


def test_the_chunk_loop_is_the_backward_branch_over_the_most_hgmma():
    t = load_script("tools/sass_loops.py")
    f = t.parse_sass(sass("k", BASE))["k"]
    assert t.chunk_loop(f) == BASE[1:7]


def test_verdicts():
    t = load_script("tools/sass_loops.py")
    loop = lambda body: t.chunk_loop(t.parse_sass(sass("k", body))["k"])  # noqa: E731
    old = loop(BASE)
    # Code before the loop moves its branch targets: still identical.
    moved = ["NOP"] + [s.replace("BRA 0x0030", "BRA 0x0040").replace("BRA 0x0010", "BRA 0x0020") for s in BASE]
    assert t.compare_loops(old, loop(moved)) == "identical"
    renamed = [s.replace("R3", "R9").replace("c[0x0][0x28]", "c[0x0][0x30]") for s in BASE]
    assert t.compare_loops(old, loop(renamed)) == "same opcodes"
    longer = BASE[:3] + ["IMAD R7, R7, 0x3, RZ"] + BASE[3:]
    longer = [s.replace("BRA 0x0030", "BRA 0x0040").replace("BRA 0x0010", "BRA 0x0010") for s in longer]
    assert t.compare_loops(old, loop(longer)) == "differs (1)"


# ---- tools/ncu_regions.py ---------------------------------------------------------

def ncu_source_csv(body, samples, executed, long_sb):
    """ncu's --page source --csv form: the kernel's name, the columns, a row an instruction."""
    cols = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
            "Instructions Executed", "stall_long_sb", "stall_wait", "stall_long_sb (Not Issued)"]
    lines = ['"Kernel Name","void k(Params)",', ",".join(f'"{c}"' for c in cols)]
    for i, text in enumerate(body):
        row = [f"0x{0x7f0000 + 16 * i:x}", text, samples[i], 0, executed[i], long_sb[i], samples[i] - long_sb[i], 0]
        lines.append(",".join(f'"{x}"' for x in row))
    return lines


def test_ncu_regions_split_around_the_chunk_loop():
    t = load_script("tools/ncu_regions.py")
    # BASE with absolute addresses (ncu's): the branch targets move with them.
    body = [s.replace("BRA 0x0030", "BRA 0x7f0030").replace("BRA 0x0010", "BRA 0x7f0010") for s in BASE]
    samples = [5, 10, 1, 1, 1, 10, 2, 7]
    executed = [4, 40, 40, 80, 80, 40, 40, 4]
    long_sb = [5, 0, 0, 1, 0, 0, 0, 3]
    rows = t.read_source_page(ncu_source_csv(body, samples, executed, long_sb))
    assert [r["samples"] for r in rows] == samples
    sums = t.regions(rows)
    assert (sums["before"]["executed"], sums["before"]["samples"]) == (4, 5)
    assert (sums["loop"]["executed"], sums["loop"]["samples"]) == (320, 25)
    assert (sums["after"]["executed"], sums["after"]["samples"]) == (4, 7)
    assert sums["before"]["stalls"] == {"long_sb": 5, "wait": 0}
    assert sums["after"]["stalls"] == {"long_sb": 3, "wait": 4}
    text = t.table("k", sums, warps=4)
    assert "| before | 4 | 1 | 5 | 13.5 % | long_sb 5 |" in text
    # No loop (no backward branch over a tensor-core instruction): all of it is set-up.
    flat = t.regions(t.read_source_page(ncu_source_csv(["MOV R1, R2", "EXIT"], [1, 2], [3, 4], [0, 0])))
    assert (flat["before"]["executed"], flat["loop"]["executed"], flat["after"]["executed"]) == (7, 0, 0)


def test_registers_from_res_usage():
    t = load_script("tools/sass_loops.py")
    text = (" Function _ZN1a6kernelEv:\n  REG:194 STACK:0 SHARED:1024 LOCAL:0\n"
            " Function _ZN1b6kernelEv:\n  REG:63 STACK:0 SHARED:0 LOCAL:0\n")
    assert t.parse_registers(text) == {"_ZN1a6kernelEv": 194, "_ZN1b6kernelEv": 63}
