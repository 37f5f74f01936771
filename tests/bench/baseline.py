"""The CPU engine as built from another revision, for before/after benchmarks (`--baseline REV`
in cpu_engine_profile and cpu_engine_long_context).

`engines/cpu` of REV is exported with `git archive` and installed with pip into
~/.cache/heteroserve/baseline/<commit> (built once per commit, reused after). REV may also be a
folder holding a copy of some revision's `engines/cpu` (where the repository's history is not at
hand, as on the device machine, whose copy carries no current `.git`): built likewise, keyed by a
digest of its files. A benchmark then
runs that revision's engine in a child process (`env_for`, then `use` in the child, which imports
heteroserve_cpu from that folder and checks that it did). Everything else (the model loader, the
benchmark itself) is the working tree's.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from tests.bench.cpu_engine_vs_llamacpp import CACHE as BENCH_CACHE

ROOT = Path(__file__).resolve().parents[2]
ENV = "HETEROSERVE_BASELINE_ENGINE"  # the folder a child imports heteroserve_cpu from
CACHE = BENCH_CACHE.parent / "baseline"


def commit_of(rev: str) -> str:
    """The full commit id of `rev` (a branch, tag or abbreviated id); a clear error if unknown."""
    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet",
                          f"{rev}^{{commit}}"], check=False, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"--baseline {rev}: not a commit of {ROOT}")
    return out.stdout.strip()


def source_digest(folder: Path) -> str:
    """A digest of an engine source folder's files (names and contents; build output left out)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and "build" not in
                       p.relative_to(folder).parts[:1]):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def build(rev: str) -> tuple[str, Path]:
    """(a label: the short commit id or the folder's name and digest, folder holding that
    engine's heteroserve_cpu), built if missing."""
    folder = Path(rev)
    if folder.is_dir():
        source = folder / "engines" / "cpu" if (folder / "engines" / "cpu").is_dir() else folder
        if not (source / "pyproject.toml").is_file():
            raise SystemExit(f"--baseline {rev}: neither a commit nor a copy of engines/cpu")
        key = source_digest(source)
        label = f"{folder.name}@{key[:9]}"
    else:
        source, key = None, commit_of(rev)
        label = key[:9]
    dest = CACHE / key
    if (dest / "heteroserve_cpu").is_dir():
        return label, dest
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        if source is None:
            archive = Path(tmp) / "src.tar"
            subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), key,
                            "engines/cpu"], check=True)
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="data")
            source = Path(tmp) / "engines" / "cpu"
        else:  # a copy, so that its own build folder is left as it is
            source = Path(shutil.copytree(source, Path(tmp) / "src",
                                          ignore=shutil.ignore_patterns("build")))
        staged = Path(tmp) / "installed"
        print(f"building the CPU engine of {label} into {dest}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation",
                        "--no-deps", "--target", str(staged), str(source)], check=True)
        shutil.rmtree(dest, ignore_errors=True)
        staged.rename(dest)
    return label, dest


def env_for(base: dict, folder: Path | None) -> dict:
    """`base` with `folder` (a baseline build, or None for the working tree's) named for the
    child's `use`."""
    env = dict(base)
    env.pop(ENV, None)
    if folder is not None:
        env[ENV] = str(folder)
    return env


class _Finder:
    """Finds heteroserve_cpu (and its submodules) in one folder only, ahead of every other
    finder (the working tree's editable install is a finder of its own, ahead of PYTHONPATH)."""

    def __init__(self, folder: str):
        self.folder = folder

    def find_spec(self, name, path=None, target=None):
        if name != "heteroserve_cpu" and not name.startswith("heteroserve_cpu."):
            return None
        return importlib.machinery.PathFinder.find_spec(name, path or [self.folder], target)


def use() -> None:
    """In a benchmark's child process, before it imports heteroserve_cpu: where the parent named
    a baseline build, import that one; stop if it is not what gets imported."""
    folder = os.environ.get(ENV)
    if not folder:
        return
    sys.meta_path.insert(0, _Finder(folder))
    import heteroserve_cpu

    where = Path(heteroserve_cpu.__file__).resolve()
    if Path(folder).resolve() not in where.parents:
        raise SystemExit(f"baseline engine expected from {folder}, imported {where}")
