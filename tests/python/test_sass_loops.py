"""tools/sass_loops.py on hand-written cuobjdump text: functions and registers parsed,
the chunk loop found (the backward branch over the most HGMMA, not an inner one), and
the three verdicts: identical (branch targets aside), same opcodes (registers and
parameter offsets aside), differs with the count of changed lines."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_tool():
    spec = importlib.util.spec_from_file_location("sass_loops", ROOT / "tools" / "sass_loops.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
    t = load_tool()
    f = t.parse_sass(sass("k", BASE))["k"]
    assert t.chunk_loop(f) == BASE[1:7]


def test_verdicts():
    t = load_tool()
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


def test_registers_from_res_usage():
    t = load_tool()
    text = (" Function _ZN1a6kernelEv:\n  REG:194 STACK:0 SHARED:1024 LOCAL:0\n"
            " Function _ZN1b6kernelEv:\n  REG:63 STACK:0 SHARED:0 LOCAL:0\n")
    assert t.parse_registers(text) == {"_ZN1a6kernelEv": 194, "_ZN1b6kernelEv": 63}
