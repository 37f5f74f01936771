"""tests/bench/prune_peer_source.sh: the pruned peer sources the device benchmark carries keep
the CPU backend and the two tools, drop the rest, name their source, and refuse bad input
without touching anything."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "tests" / "bench" / "prune_peer_source.sh"


def prune(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, check=False)


def touch(root: Path, *paths: str) -> None:
    for p in paths:
        (root / p).parent.mkdir(parents=True, exist_ok=True)
        (root / p).write_text(p)


def llama_sdist(tmp_path: Path) -> Path:
    sdist = tmp_path / "llama_cpp_python-0.3.36"
    (sdist / "PKG-INFO").parent.mkdir(parents=True)
    (sdist / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: llama_cpp_python\n"
                                    "Version: 0.3.36\n")
    src = sdist / "vendor" / "llama.cpp"
    touch(src, "CMakeLists.txt", "LICENSE", "cmake/common.cmake", "common/common.cpp",
          "include/llama.h", "src/llama.cpp", "vendor/nlohmann/json.hpp", "ggml/CMakeLists.txt",
          "ggml/.gitignore", "ggml/src/ggml.c", "ggml/src/ggml-cpu/ggml-cpu.c",
          "ggml/src/ggml-cuda/ggml-cuda.cu", "ggml/src/ggml-vulkan/ggml-vulkan.cpp",
          "tools/CMakeLists.txt", "tools/llama-bench/llama-bench.cpp",
          "tools/batched-bench/batched-bench.cpp", "tools/server/server.cpp",
          "examples/simple/simple.cpp", "docs/build.md")
    return src


def test_llama_keeps_the_cpu_backend_and_the_two_tools(tmp_path):
    src, dest = llama_sdist(tmp_path), tmp_path / "out"
    done = prune("llama", str(src), str(dest))
    assert done.returncode == 0, done.stderr
    assert (dest / "ggml" / "src" / "ggml-cpu" / "ggml-cpu.c").exists()
    assert (dest / "ggml" / "src" / "ggml.c").exists()
    assert not (dest / "ggml" / "src" / "ggml-cuda").exists()
    assert not (dest / "ggml" / "src" / "ggml-vulkan").exists()
    assert sorted(p.name for p in (dest / "tools").iterdir()) == [
        "CMakeLists.txt", "batched-bench", "llama-bench"]
    assert "add_subdirectory(server)" not in (dest / "tools" / "CMakeLists.txt").read_text()
    assert not (dest / "examples").exists() and not (dest / "docs").exists()
    assert (dest / "vendor" / "nlohmann" / "json.hpp").exists()
    assert (dest / "COMMIT").read_text().strip() == "llama-cpp-python 0.3.36's vendor/llama.cpp"


def test_ik_keeps_its_kernels_and_names_the_commit_given(tmp_path):
    src, dest = tmp_path / "ik", tmp_path / "out"
    touch(src, "CMakeLists.txt", "LICENSE", "cmake/x.cmake", "common/common.cpp",
          "include/llama.h", "src/llama.cpp", "ggml/CMakeLists.txt", "ggml/src/ggml.c",
          "ggml/src/iqk/iqk_mul_mat.cpp", "ggml/src/ggml-cuda.cu", "ggml/src/ggml-cuda/x.cu",
          "ggml/src/ggml-metal.m", "vendor/cpp-httplib/httplib.h", "vendor/nlohmann/json.hpp",
          "vendor/miniaudio/miniaudio.h", "examples/CMakeLists.txt",
          "examples/llama-bench/llama-bench.cpp", "examples/batched-bench/batched-bench.cpp",
          "examples/main/main.cpp", "pocs/vdot/vdot.cpp")
    (src / "CMakeLists.txt").write_text("if (LLAMA_BUILD_EXAMPLES)\n    add_subdirectory(examples)"
                                        "\n    add_subdirectory(pocs)\nendif()\n")
    done = prune("ik", str(src), str(dest), env={"COMMIT": "8337e4cd3", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert (dest / "ggml" / "src" / "iqk" / "iqk_mul_mat.cpp").exists()
    assert not (dest / "ggml" / "src" / "ggml-cuda").exists()
    assert not (dest / "ggml" / "src" / "ggml-cuda.cu").exists()
    assert not (dest / "ggml" / "src" / "ggml-metal.m").exists()
    assert sorted(p.name for p in (dest / "vendor").iterdir()) == ["cpp-httplib", "nlohmann"]
    assert not (dest / "examples" / "main").exists() and not (dest / "pocs").exists()
    top = (dest / "CMakeLists.txt").read_text()
    assert "# add_subdirectory(pocs)" in top and "    add_subdirectory(examples)" in top
    assert (dest / "COMMIT").read_text().startswith("8337e4cd3, pruned to ggml's CPU backend")


def test_bad_input_is_refused_and_nothing_is_overwritten(tmp_path):
    src = llama_sdist(tmp_path)
    assert prune("gpu", str(src)).returncode == 2
    assert prune("llama").returncode == 2
    not_ik = prune("ik", str(src), str(tmp_path / "x"))  # llama.cpp has tools/, not examples/
    assert not_ik.returncode == 2 and "has no examples/llama-bench" in not_ik.stderr
    assert not (tmp_path / "x").exists()
    dest = tmp_path / "kept"
    dest.mkdir()
    (dest / "mine").write_text("keep")
    again = prune("llama", str(src), str(dest))
    assert again.returncode == 2 and "exists" in again.stderr
    assert (dest / "mine").read_text() == "keep" and not (dest / "COMMIT").exists()
