"""The engine image's build steps without Docker: build the kernel wheel in isolation, install
only the wheel into a clean virtual environment, and run a kernel from it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SMOKE = """
import numpy as np, heteroserve_cpu as hc
print(hc.available_variants())
w = np.frombuffer(hc.quantize(8, np.arange(64, dtype=np.float32) / 64), dtype=np.uint8)
out = hc.matmul(hc.Pool([], 2), 8, 1, 64, w, np.ones(64, dtype=np.float32))
assert abs(out[0, 0] - (np.arange(64) / 64).sum()) < 0.1, out
print("ok", hc.selected_variant())
"""


def test_wheel_builds_installs_and_runs_in_a_clean_venv(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels),
                    str(REPO / "engines" / "cpu")], check=True, timeout=600)
    (wheel,) = wheels.glob("heteroserve_cpu-*.whl")
    assert "linux_x86_64" in wheel.name or "linux_aarch64" in wheel.name
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], check=True,
                   timeout=600)
    result = subprocess.run([str(venv / "bin" / "python"), "-c", SMOKE], capture_output=True,
                            text=True, check=True, cwd=tmp_path)
    assert "reference" in result.stdout and "ok" in result.stdout
