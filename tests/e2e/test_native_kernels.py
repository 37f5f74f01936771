"""The standalone kernel test (engines/cpu/tests/kernel_test.c) built for and run on this machine:
one pytest result per kernel variant of the architecture. A variant the CPU does not grant (AMX
where the CPU or the kernel withholds its tile state, AVX-512 on older x86) is reported skipped
with the binary's reason, never passed without running; one it grants must run its checks and
fail none. The same binary runs first on the device machine (tests/bench/device_cpu_bench.sh)."""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[2] / "engines" / "cpu"
VARIANTS = {"x86_64": ["reference", "avx2", "avx512vnni", "amx"],
            "aarch64": ["reference", "neon", "dotprod", "i8mm"]}.get(platform.machine(),
                                                                      ["reference"])


@pytest.fixture(scope="module")
def kernel_test(tmp_path_factory) -> Path:
    assert shutil.which("cmake"), "cmake is missing"
    build = tmp_path_factory.mktemp("native")
    subprocess.run(["cmake", "-S", str(ENGINE), "-B", str(build), "-DHS_BUILD_KERNEL_TEST=ON"],
                   check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build), "--target", "kernel_test", "-j2"],
                   check=True, capture_output=True)
    return build / "kernel_test"


@pytest.fixture(scope="module")
def report(kernel_test) -> str:
    result = subprocess.run([str(kernel_test)], capture_output=True, text=True, timeout=300,
                            check=False)
    assert result.returncode == 0, result.stdout
    return result.stdout


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_matches_the_reference(report, variant):
    line = re.search(rf"^variant {variant}: (.*)$", report, re.MULTILINE)
    assert line, report
    if line.group(1).startswith("skipped"):
        pytest.skip(f"{variant}: {line.group(1)}")
    checks, failed = map(int, re.fullmatch(r"(\d+) checks, (\d+) failed", line.group(1)).groups())
    assert checks > 0 and failed == 0, report


@pytest.mark.skipif(platform.machine() != "x86_64", reason="an x86-64 CPU emulated by qemu")
def test_a_variant_the_cpu_lacks_is_reported_skipped(kernel_test):
    # qemu-user's x86 emulation has AVX2 but neither AVX-512 nor AMX.
    assert shutil.which("qemu-x86_64"), ("qemu-x86_64 is missing: `make test` installs "
                                         "qemu-user (Debian)")
    result = subprocess.run(["qemu-x86_64", "-cpu", "max", str(kernel_test)],
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout
    assert "variant amx: skipped (not granted by this CPU)" in result.stdout
    assert re.search(r"^variant avx2: [1-9]\d* checks, 0 failed$", result.stdout, re.MULTILINE)
    assert "selected: avx2" in result.stdout
