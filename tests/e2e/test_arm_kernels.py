"""The aarch64 (Kunpeng) path, proven here without ARM hardware: cross-compile the kernels with
gcc-aarch64-linux-gnu and run the standalone kernel test under qemu-user on three CPUs: one with the
int8 matrix-multiply extension (dispatch picks `i8mm`), a Neoverse N1 with the dot product but no
i8mm (`dotprod`, Kunpeng 920's level) and a Cortex-A53 with neither (`neon`)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[2] / "engines" / "cpu"


@pytest.fixture(scope="module")
def kernel_test(tmp_path_factory) -> Path:
    for tool in ("aarch64-linux-gnu-gcc", "qemu-aarch64", "cmake"):
        assert shutil.which(tool), (f"{tool} is missing: `make test` installs "
                                    "gcc-aarch64-linux-gnu and qemu-user (Debian)")
    build = tmp_path_factory.mktemp("aarch64")
    subprocess.run(["cmake", "-S", str(ENGINE), "-B", str(build), "-DCMAKE_SYSTEM_NAME=Linux",
                    "-DCMAKE_SYSTEM_PROCESSOR=aarch64",
                    "-DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc", "-DHS_BUILD_KERNEL_TEST=ON"],
                   check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build), "--target", "kernel_test", "-j2"],
                   check=True, capture_output=True)
    binary = build / "kernel_test"
    assert "ARM aarch64" in subprocess.run(["file", str(binary)], capture_output=True,
                                            text=True, check=True).stdout
    return binary


@pytest.mark.parametrize(("cpu", "selected"), [("max", "i8mm"), ("neoverse-n1", "dotprod"),
                                                ("cortex-a53", "neon")])
def test_arm_kernels_match_the_reference_under_qemu(kernel_test, cpu, selected):
    result = subprocess.run(["qemu-aarch64", "-cpu", cpu, "-L", "/usr/aarch64-linux-gnu",
                             str(kernel_test)], capture_output=True, text=True, timeout=300,
                            check=False)
    assert result.returncode == 0, result.stdout
    assert f"selected: {selected}" in result.stdout
    assert " 0 failed" in result.stdout


def test_the_pool_never_loses_its_callers_wake_up_under_qemu(tmp_path):
    # The pool's caller parks on a futex when its spin runs out; a worker that finishes wakes it
    # if it was named (threadpool.c). With plain seq_cst stores for the two announcements,
    # qemu-user's aarch64 let a load pass the store before it and the caller slept for good:
    # tests/bench/pool_run.c with 8 threads, every wait parked, 5 x 2 x 3000 runs, hung 3 times in
    # 4 (once in CI, in the kernel test's 800 runs). Three such runs here, about a second each.
    for tool in ("aarch64-linux-gnu-gcc", "qemu-aarch64"):
        assert shutil.which(tool), f"{tool} is missing: `make test` installs it"
    root, binary = ENGINE.parents[1], tmp_path / "pool_run"
    subprocess.run(["aarch64-linux-gnu-gcc", "-O2", f"-I{ENGINE / 'src'}",
                    str(root / "tests/bench/pool_run.c"), str(ENGINE / "src/threadpool.c"),
                    "-lpthread", "-o", str(binary)], check=True, timeout=120)
    for _ in range(3):
        result = subprocess.run(["qemu-aarch64", "-cpu", "max", "-L", "/usr/aarch64-linux-gnu",
                                 str(binary), "8", "3000"], capture_output=True, text=True,
                                env={"HETEROSERVE_POOL_SPIN_US": "0"}, timeout=60, check=False)
        assert result.returncode == 0, result.stderr
        assert result.stdout.count("threads=8:") == 2, result.stdout
