"""`python -m heteroserve_engines.bind.zipapp <target>`: heteroserve-bind as one file that any
Python 3.8+ runs with its standard library alone.

Engine images heteroserve does not build (sysHAX's CPU vLLM, sysInfer's server) cannot carry the
`heteroserve-bind` entrypoint, yet they must bind the CPUs their container was granted, not the
operator's guess. Their pods run an init container from heteroserve's CPU engine image that
writes this zipapp into an emptyDir shared with the engine container; the engine container runs
`python3 <zipapp> --numa-nodes N --threads-per-node K -- <the seed's command>`. It holds
`heteroserve_engines.bind` and `heteroserve_engines.protocol.binding` only (the package's
`__init__` files are docstrings): nothing of the engine image's Python packages is imported.

Built from the installed package at the time the init container runs, so the zipapp is always
the code of the image that wrote it.
"""

from __future__ import annotations

import argparse
import os
import sys
import zipfile
from pathlib import Path

# The files the zipapp holds, relative to the directory that holds heteroserve_engines.
MODULES = (
    "heteroserve_engines/__init__.py",
    "heteroserve_engines/protocol/__init__.py",
    "heteroserve_engines/protocol/binding.py",
    "heteroserve_engines/bind/__init__.py",
    "heteroserve_engines/bind/__main__.py",
    "heteroserve_engines/bind/grant.py",
    "heteroserve_engines/bind/plan.py",
)
MINIMUM_PYTHON = (3, 8)
SHEBANG = b"#!/usr/bin/env python3\n"
ENTRY = f"""\
import sys

if sys.version_info < {MINIMUM_PYTHON!r}:
    sys.stderr.write("heteroserve-bind: needs Python %d.%d or later, this is %d.%d\\n"
                     % ({MINIMUM_PYTHON!r} + tuple(sys.version_info[:2])))
    sys.exit(2)
from heteroserve_engines.bind.__main__ import main

sys.exit(main())
"""


def package_root() -> Path:
    """The directory holding the installed heteroserve_engines package."""
    return Path(__file__).resolve().parents[2]


def build(target: Path) -> Path:
    """Writes the zipapp to `target` (atomically: a reader never sees half a file), mode 0755,
    and returns it."""
    root = package_root()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    with open(partial, "wb") as out:
        out.write(SHEBANG)
        with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("__main__.py", ENTRY)
            for name in MODULES:
                archive.write(root / name, name)
    os.chmod(partial, 0o755)
    os.replace(partial, target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m heteroserve_engines.bind.zipapp",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", type=Path, help="where to write the zipapp")
    args = parser.parse_args(argv)
    print(f"heteroserve-bind zipapp written to {build(args.target)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
