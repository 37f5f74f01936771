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
