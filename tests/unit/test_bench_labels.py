"""The benchmark header's labels: which llama.cpp source and which heteroserve commit ran."""

from __future__ import annotations

import re

from tests.bench.cpu_engine_vs_llamacpp import engine_digest, git_commit, source_commit


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
