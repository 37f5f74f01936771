"""The loops GCC makes of a kernel (a script, not a test): compiles a source file to assembly as
the engine's build does for that variant and prints, for each function named, every loop whose
body is one basic block ending in a jump back to itself - its instruction count, how many of them
are the instruction counted (vpmaddubsw unless --count says otherwise) and how many touch the
stack (spills). docs/benchmarks.md's instruction counts for the avx2 products come from it.

    .venv/bin/python -m tests.bench.asm_loops engines/cpu/src/x86_avx2.c mm_q4_0 mm_q8_0
        [--flags "-mavx2 -mfma -mf16c"] [--count vpmaddubsw]

To see what GCC made of an older form, give it that file: `git show REV:engines/cpu/src/
x86_avx2.c > /tmp/old.c` (its includes are found in engines/cpu/src)."""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Loop:
    function: str
    label: str
    instructions: int
    counted: int
    stack: int


def assembly(source: str, flags: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.s"
        subprocess.run(["gcc", "-O3", *shlex.split(flags), "-S", "-I",
                        str(ROOT / "engines/cpu/src"), source, "-o", str(out)], check=True)
        return out.read_text()


def loops(text: str, function: str, counted: str = "vpmaddubsw") -> list[Loop]:
    lines = text.splitlines()
    try:
        start = lines.index(f"{function}:")
    except ValueError:
        raise SystemExit(f"no function {function!r} in the assembly") from None
    found, label, body = [], None, []
    for line in lines[start + 1:]:
        if line.startswith(f"\t.size\t{function},"):
            break
        if re.match(r"^\.L\w+:", line):
            label, body = line[:-1], []
        elif line.startswith("\t") and not line.startswith("\t."):
            body.append(line.strip())
            if label and re.match(rf"^j\w+\s+{re.escape(label)}$", body[-1]):
                found.append(Loop(function, label, len(body),
                                  sum(x.split()[0] == counted for x in body),
                                  sum("(%rsp)" in x for x in body)))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source")
    parser.add_argument("functions", nargs="+")
    parser.add_argument("--flags", default="-mavx2 -mfma -mf16c")
    parser.add_argument("--count", default="vpmaddubsw")
    args = parser.parse_args(argv)
    if not Path(args.source).is_file():
        parser.error(f"{args.source}: no such file")
    text = assembly(args.source, args.flags)
    print(f"| function | loop | instructions | {args.count} | stack references |")
    print("|---|---|---|---|---|")
    for function in args.functions:
        for loop in loops(text, function, args.count):
            print(f"| {function} | {loop.label} | {loop.instructions} | {loop.counted} | "
                  f"{loop.stack} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
