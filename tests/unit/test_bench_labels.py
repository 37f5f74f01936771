"""The benchmark header's labels: which llama.cpp source and which heteroserve commit ran."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from tests.bench import cpu_engine_vs_llamacpp as bench
from tests.bench.cpu_engine_vs_llamacpp import commit_file, engine_digest, git_commit, source_commit

ROOT = Path(__file__).resolve().parents[2]


def test_a_commit_file_names_the_source(tmp_path):
    (tmp_path / "COMMIT").write_text("llama-cpp-python 0.3.36's vendor/llama.cpp\n")
    assert source_commit(str(tmp_path), "2366fef") == "llama-cpp-python 0.3.36's vendor/llama.cpp"


def test_without_a_commit_file_the_stamp_or_unknown(tmp_path):
    assert source_commit(str(tmp_path), "8337e4cd3") == "8337e4cd3"
    assert source_commit(str(tmp_path), "unknown").startswith("unknown (no COMMIT file")
    assert source_commit(str(tmp_path)).startswith("unknown (no COMMIT file")


def test_the_commit_passed_in_replaces_head_and_keeps_the_digest(monkeypatch):
    monkeypatch.setenv("HETEROSERVE_COMMIT", "abc1234")
    assert git_commit() == f"abc1234 (engine sources {engine_digest()})"
    monkeypatch.delenv("HETEROSERVE_COMMIT")
    assert re.fullmatch(r"\S+ \(engine sources [0-9a-f]{12}\)", git_commit())


def test_the_build_records_a_commit_only_from_a_commit_file(tmp_path, monkeypatch):
    """A pruned copy's COMMIT file names the build; a git checkout keeps the tools' own stamp
    (nothing recorded, so the header takes it)."""
    def fake_build(src, build, flags, jobs, log, ik=False):
        (build / "bin").mkdir(parents=True, exist_ok=True)

    monkeypatch.setattr(bench, "_cmake_build", fake_build)
    monkeypatch.setattr(bench, "_amx_check", lambda bin_dir, model: (0, ""))
    monkeypatch.setattr(bench, "system_info", lambda bin_dir: "CPU : AVX2 = 1")
    src = tmp_path / "src"
    src.mkdir()
    info = json.loads((bench.build_llamacpp(str(src), str(tmp_path / "a"), "m.gguf", 1)
                       / "heteroserve-build.json").read_text())
    assert "commit" not in info
    assert bench.known_stamp("abc1234") == "abc1234"
    (src / "COMMIT").write_text("llama-cpp-python 0.3.36's vendor/llama.cpp\n")
    info = json.loads((bench.build_llamacpp(str(src), str(tmp_path / "b"), "m.gguf", 1)
                       / "heteroserve-build.json").read_text())
    assert info["commit"] == "llama-cpp-python 0.3.36's vendor/llama.cpp"
    assert commit_file(str(tmp_path)) is None


def test_peer_flags_reach_both_builds_and_name_them(tmp_path, monkeypatch):
    """--peer-flags (an AVX2-only peer on an AVX-512 CPU) goes to the native build and to the
    AMX fallback, and the recorded flags say so."""
    built = []

    def fake_build(src, build, flags, jobs, log, ik=False):
        built.append((build.name, flags))
        (build / "bin").mkdir(parents=True, exist_ok=True)

    monkeypatch.setattr(bench, "_cmake_build", fake_build)
    monkeypatch.setattr(bench, "system_info", lambda bin_dir: "CPU : AVX2 = 1 | AVX512 = 0")
    monkeypatch.setattr(bench, "_amx_check", lambda bin_dir, model: (0, ""))
    src = tmp_path / "src"
    src.mkdir()
    info = json.loads((bench.build_llamacpp(str(src), str(tmp_path / "a"), "m.gguf", 1,
                                            "-mno-avx512f") / "heteroserve-build.json").read_text())
    assert built == [("native", "-mno-avx512f")]
    assert info["flags"] == "-march=native -mno-avx512f (GGML_NATIVE=ON)"
    monkeypatch.setattr(bench, "_amx_check", lambda bin_dir, model: (
        (-4, "") if bin_dir.parent.name == "native" else (0, "")))
    info = json.loads((bench.build_llamacpp(str(src), str(tmp_path / "b"), "m.gguf", 1,
                                            "-mno-avx512f") / "heteroserve-build.json").read_text())
    assert built[-1] == ("no-amx", f"-mno-avx512f {bench.AMX_OFF}")
    assert info["flags"].startswith(f"-march=native -mno-avx512f {bench.AMX_OFF} (the native")
    if "avx2" in Path("/proc/cpuinfo").read_text():  # what the label prints for ik_llama.cpp
        limited = bench.native_isa("-mno-avx512f").split()
        assert "AVX2" in limited and not any(name.startswith("AVX512") for name in limited)


def test_the_peer_build_stops_git_at_the_pruned_copy(tmp_path, monkeypatch):
    """A copy inside heteroserve's repository must not be stamped with heteroserve's commit:
    cmake and ninja both run with git's search stopped above the copy."""
    # with such a ceiling git finds no repository in a folder of this one
    probe = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT / "engines", capture_output=True,
                           env={**os.environ, "GIT_CEILING_DIRECTORIES": str(ROOT)}, check=False)
    assert probe.returncode != 0
    src = tmp_path / "llama-src"
    src.mkdir()
    calls = []
    monkeypatch.setattr(bench.subprocess, "run", lambda args, **kw: calls.append((args, kw)))
    bench._cmake_build(str(src), tmp_path / "build", "", 2, log=None)
    assert [args[0] for args, _ in calls] == ["cmake", "ninja"]
    for _, kw in calls:
        assert kw["env"]["GIT_CEILING_DIRECTORIES"] == str(tmp_path.resolve())
