#!/usr/bin/env python3
"""Compares the chunk loops of the kernels in two builds, from their SASS, without a GPU.

For each kernel function present in both (a binary, a shared library or one object
file each), it prints the registers (cuobjdump -res-usage), the length of the chunk
loop and whether the loops are

  identical       the same instructions with the same registers (branch targets
                  aside, which move with any code before the loop)
  same opcodes    the same instructions in the same order, register names and
                  parameter offsets aside
  differs (n)     n instruction lines added or removed, those aside

The chunk loop is the body of the backward branch that spans the most tensor-core
instructions (HGMMA; HMMA where a kernel has none): the recurrence's chunk loop, the
prologue's chunk loop. A change meant to leave a kernel's loop alone (code before or
after the loop, another instantiation) can be checked this way before any timing.

  python3 tools/sass_loops.py OLD NEW [--filter recurrence] [--cuobjdump PATH]
"""
from __future__ import annotations

import argparse
import difflib
import re
import shutil
import subprocess
import sys

_SASS_FUNCTION = re.compile(r"Function : (\S+)")         # cuobjdump -sass
_USAGE_FUNCTION = re.compile(r"^\s*Function (\S+?):\s*$")  # cuobjdump -res-usage
_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_BRANCH_TARGET = re.compile(r"\b(?:BRA|BSSY)\b.*?(0x[0-9a-f]+)")
_REGISTERS = re.compile(r"REG:(\d+)")
# Registers, predicates and constant-bank offsets (a parameter struct's field moves
# them all when a field is added before it).
_NAMES = re.compile(r"\bU?R\d+\b|\bU?P\d\b|c\[0x[0-9a-f]+\]\[0x[0-9a-f]+\]")


def parse_sass(text: str) -> dict[str, list[tuple[int, str]]]:
    """cuobjdump -sass output -> {function: [(address, instruction), ...]}."""
    functions: dict[str, list[tuple[int, str]]] = {}
    current = None
    for line in text.splitlines():
        m = _SASS_FUNCTION.search(line)
        if m:
            current = functions.setdefault(m.group(1), [])
            continue
        m = _INSTRUCTION.search(line)
        if current is not None and m:
            current.append((int(m.group(1), 16), m.group(2)))
    return functions


def parse_registers(text: str) -> dict[str, int]:
    """cuobjdump -res-usage output -> {function: registers}."""
    registers: dict[str, int] = {}
    current = None
    for line in text.splitlines():
        m = _USAGE_FUNCTION.match(line)
        if m:
            current = m.group(1)
            continue
        m = _REGISTERS.search(line)
        if current is not None and m:
            registers[current] = int(m.group(1))
            current = None
    return registers


def chunk_loop_span(instructions: list[tuple[int, str]]) -> tuple[int, int] | None:
    """(first, last) index of the body of the backward branch spanning the most HGMMA
    (or HMMA) instructions; None without one."""
    index = {address: i for i, (address, _) in enumerate(instructions)}
    for opcode in ("HGMMA", "HMMA"):
        best: tuple[int, tuple[int, int] | None] = (0, None)
        for i, (address, text) in enumerate(instructions):
            m = _BRANCH_TARGET.search(text)
            if not m or "BSSY" in text:
                continue
            target = int(m.group(1), 16)
            if target >= address or target not in index:
                continue
            count = sum(opcode in t for _, t in instructions[index[target]:i + 1])
            if count > best[0]:
                best = (count, (index[target], i))
        if best[1] is not None:
            return best[1]
    return None


def chunk_loop(instructions: list[tuple[int, str]]) -> list[str]:
    """The body of the backward branch spanning the most HGMMA (or HMMA) instructions."""
    span = chunk_loop_span(instructions)
    return [t for _, t in instructions[span[0]:span[1] + 1]] if span else []


def _without_targets(body: list[str]) -> list[str]:
    """Branch and convergence-barrier targets blanked: they move with any code before
    the loop."""
    return [t[:m.start(1)] + "_" + t[m.end(1):] if (m := _BRANCH_TARGET.search(t)) else t for t in body]


def compare_loops(old: list[str], new: list[str]) -> str:
    a, b = _without_targets(old), _without_targets(new)
    if a == b:
        return "identical"
    a = [_NAMES.sub("_", t) for t in a]
    b = [_NAMES.sub("_", t) for t in b]
    if a == b:
        return "same opcodes"
    changed = sum(1 for line in difflib.unified_diff(a, b, lineterm="", n=0)
                  if line[:1] in "+-" and not line.startswith(("+++", "---")))
    return f"differs ({changed})"


def _cuobjdump(tool: str, flag: str, path: str) -> str:
    return subprocess.run([tool, flag, path], capture_output=True, text=True, check=True).stdout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--filter", default="", help="only functions whose (mangled) name contains this")
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    a = ap.parse_args(argv)
    sass = [parse_sass(_cuobjdump(a.cuobjdump, "-sass", p)) for p in (a.old, a.new)]
    regs = [parse_registers(_cuobjdump(a.cuobjdump, "-res-usage", p)) for p in (a.old, a.new)]
    print("| function | registers old / new | loop old / new | loops |")
    print("|---|---|---|---|")
    for name in sorted(set(sass[0]) & set(sass[1])):
        if a.filter not in name:
            continue
        old, new = chunk_loop(sass[0][name]), chunk_loop(sass[1][name])
        if not old and not new:
            continue
        verdict = compare_loops(old, new)
        print(f"| {name} | {regs[0].get(name, '?')} / {regs[1].get(name, '?')} | {len(old)} / {len(new)} | {verdict} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
