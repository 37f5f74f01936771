"""tests/bench/baseline.py: a benchmark child told to use another build imports that build, ahead
of the working tree's editable install, and refuses to run on the wrong one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench import baseline

ROOT = Path(__file__).resolve().parents[2]
CHILD = ("from tests.bench import baseline; baseline.use(); import heteroserve_cpu; "
         "print(heteroserve_cpu.__file__); print(getattr(heteroserve_cpu, 'MARK', 'none'))")


def child(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)


def test_the_child_imports_the_named_build(tmp_path):
    package = tmp_path / "heteroserve_cpu"
    package.mkdir()
    (package / "__init__.py").write_text("MARK = 'baseline build'\n")
    out = child(baseline.env_for(dict(os.environ), tmp_path))
    assert out.returncode == 0, out.stderr
    where, mark = out.stdout.splitlines()
    assert Path(where).resolve() == (package / "__init__.py").resolve()
    assert mark == "baseline build"


def test_without_a_named_build_the_working_tree_is_imported():
    env = baseline.env_for(dict(os.environ, HETEROSERVE_BASELINE_ENGINE="/elsewhere"), None)
    assert baseline.ENV not in env
    out = child(env)
    assert out.returncode == 0, out.stderr
    import heteroserve_cpu

    assert Path(out.stdout.splitlines()[0]).resolve() == Path(heteroserve_cpu.__file__).resolve()


def test_a_folder_without_the_engine_stops_the_child(tmp_path):
    out = child(baseline.env_for(dict(os.environ), tmp_path))
    assert out.returncode != 0
    assert f"baseline engine expected from {tmp_path}" in out.stderr


def test_an_unknown_revision_is_a_clear_error():
    with pytest.raises(SystemExit, match="--baseline no-such-rev: not a commit"):
        baseline.build("no-such-rev")


def test_a_folder_that_is_no_engine_copy_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="neither a commit nor a copy of engines/cpu"):
        baseline.build(str(tmp_path))
