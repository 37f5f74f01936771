"""The standalone kernel test (engines/cpu/tests/kernel_test.c) built for and run on this machine:
one pytest result per kernel variant of the architecture. A variant the CPU does not grant (AMX
where the CPU or the kernel withholds its tile state, AVX-512 on older x86) is reported skipped
with the binary's reason, never passed without running; one it grants must run its checks and
fail none. The same binary runs first on the device machine (tests/bench/device_cpu_bench.sh)."""

from __future__ import annotations

import os
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


def avx512_bf16() -> bool:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return all(re.search(rf"\b{f}\b", flags) for f in ("avx512_vnni", "avx512_bf16"))


@pytest.mark.skipif(platform.machine() != "x86_64" or not avx512_bf16(),
                    reason="the amx variant's vector half needs AVX-512 VNNI and BF16")
def test_the_amx_variant_with_emulated_tiles_matches_the_reference(tmp_path):
    # Where the CPU withholds AMX (this VM, CI), the tile instructions in C
    # (engines/cpu/tests/amx_emulate.h) run the amx variant's own code paths: the int8 tile
    # pipeline, the bf16 products and the tile attention, against the same references and bounds.
    subprocess.run(["cmake", "-S", str(ENGINE), "-B", str(tmp_path), "-DHS_BUILD_KERNEL_TEST=ON",
                    "-DHS_AMX_EMULATE=ON"], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(tmp_path), "--target", "kernel_test", "-j2"],
                   check=True, capture_output=True)
    result = subprocess.run([str(tmp_path / "kernel_test")], capture_output=True, text=True,
                            timeout=300, check=False)
    assert result.returncode == 0, result.stdout
    line = re.search(r"^variant amx: (\d+) checks, (\d+) failed$", result.stdout, re.MULTILINE)
    assert line and int(line.group(1)) > 0 and line.group(2) == "0", result.stdout


def avx2() -> bool:
    return bool(re.search(r"\bavx2\b", Path("/proc/cpuinfo").read_text()))


@pytest.mark.parametrize("target, granted", [
    pytest.param("expf_check", avx512_bf16, id="avx512"),
    pytest.param("expf_check_avx2", avx2, id="avx2"),
])
def test_the_attention_vector_expf_is_the_c_librarys_bit_for_bit(kernel_test, target, granted):
    # The exact hand-off's prefill engine repeats glibc's expf (prefill/exact.py); the vector
    # form in the attention (x86_common.h) must give the same bits for every float: here every
    # 61st group of 8 bit patterns (70 million floats, all of them with `expf_check all`), for
    # each of its two forms (AVX-512's permutes, AVX2's 4-double halves and gathers).
    if platform.machine() != "x86_64" or not granted():
        pytest.skip(f"{target} is built with flags this CPU does not grant")
    subprocess.run(["cmake", "--build", str(kernel_test.parent), "--target", target, "-j2"],
                   check=True, capture_output=True)
    result = subprocess.run([str(kernel_test.parent / target)], capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout
    assert re.search(r"^checked \d{8,} floats: 0 mismatches$", result.stdout, re.MULTILINE)


@pytest.mark.skipif(platform.machine() != "x86_64" or "avx2" not in Path(
    "/proc/cpuinfo").read_text(), reason="the x86 variants' attention benchmark")
def test_the_attention_benchmark_builds_runs_and_refuses_bad_input(tmp_path):
    # tests/bench/attend_rows.sh (a benchmark, not a timed test): it must build from the
    # sources as they are, give every shape its row and median, and turn bad input away.
    root = ENGINE.parents[1]
    env = {"PATH": "/usr/bin:/bin", "BUILD": str(tmp_path), "VARIANTS": "avx2", "ROUNDS": "2",
           "REPS": "1", "SHAPES": "64 3 40;32 16 17", "FMA_THREADS": "2"}
    result = subprocess.run(["bash", str(root / "tests/bench/attend_rows.sh")], cwd=root,
                            env=env, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr
    runs = re.findall(r"^\| cur \| avx2 \| (\d+) \| (\d+) \| (\d+) \| [\d.]+ \| ([\d.]+) \| "
                      r"(\S+) \|$", result.stdout, re.MULTILINE)
    shapes = sorted({r[:3] for r in runs})
    assert shapes == [("32", "16", "17"), ("64", "3", "40")], result.stdout
    assert len(runs) == 4 and all(float(r[3]) > 0 for r in runs), result.stdout
    # the same input gives the same outputs, run after run
    assert len({r[4] for r in runs if r[0] == "64"}) == 1, result.stdout
    medians = re.findall(r"^\| cur \| avx2 \| (\d+) \| \d+ \| \d+ \| [\d.]+ \| 2 \|$",
                         result.stdout, re.MULTILINE)
    assert sorted(medians) == ["32", "64"], result.stdout
    peaks = re.findall(r"^FMA peak: (\d) thread\(s\), ([\d.]+) G", result.stdout, re.MULTILINE)
    assert [p[0] for p in peaks] == ["1", "2"] and all(float(p[1]) > 0 for p in peaks)
    binary = tmp_path / "cur" / "attend_rows"
    for args, message in ((["t", "no-such-variant", "64", "3", "40", "1"], "not granted"),
                          (["t", "avx2", "48", "3", "40", "1"], "multiple of 32"),
                          (["t", "avx2", "64"], "usage")):
        bad = subprocess.run([str(binary), *args], capture_output=True, text=True, check=False)
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr
    # the decode attention's bench (DECODE=...): every KV head of the stride, in a row of its own
    decode = tmp_path / "cur" / "attend_decode"
    ran = subprocess.run([str(decode), "t", "avx2", "3", "192", "512"], capture_output=True,
                         text=True, timeout=60, check=False)
    assert ran.returncode == 0 and re.search(
        r"^\| t \| avx2 \| 3 x 64, stride 192, 512 positions \| [\d.]+ \| [\d.]+ \| \S+ \|$",
        ran.stdout, re.MULTILINE), ran.stdout + ran.stderr
    bad = subprocess.run([str(decode), "t", "avx2", "3", "96", "512"], capture_output=True,
                         text=True, check=False)
    assert bad.returncode == 2 and "STRIDE a multiple of 64" in bad.stderr, bad.stderr


@pytest.mark.skipif(platform.machine() != "x86_64" or "avx512_vnni" not in Path(
    "/proc/cpuinfo").read_text(), reason="the products benchmark's register tiles (AVX-512 VNNI)")
def test_the_products_benchmark_builds_runs_and_refuses_bad_input(tmp_path):
    # tests/bench/amx_products.sh (a benchmark, not a timed test): bad input is turned away
    # before anything is built; where AMX is not granted PATHS=regtile runs avx512vnni's
    # register tiles, every build, matrix, thread count and batch in each of two rounds, after
    # the kernel test and beside the vpdpbusd rate that bounds them.
    root = ENGINE.parents[1]
    script = [str(root / "tests/bench/amx_products.sh")]
    env = {"PATH": "/usr/bin:/bin", "BUILD": str(tmp_path)}
    for extra, message in (({"SPECS": "2 256 4096"}, "write TYPE ROWS COLS COPIES"),
                           ({"PATHS": "tiles"}, "all, wide8 or regtile"),
                           ({"THREADS": "2 0"}, "a thread count"),
                           ({"DEFS": "noequals"}, "write TAG=-DNAME=VALUE")):
        bad = subprocess.run(["bash", *script], cwd=root, env={**env, **extra},
                             capture_output=True, text=True, timeout=60, check=False)
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr
        assert not any(tmp_path.iterdir()), "refused input must build nothing"
    run = {"SPECS": "2 256 4096 1;8 64 2048 2", "PATHS": "regtile", "THREADS": "2 1",
           "DEFS": "noscale=-DREGTILE_SKIP=1"}
    result = subprocess.run(["bash", *script], cwd=root, env={**env, **run},
                            capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr + result.stdout
    assert re.search(r"^\d+ passed, 0 failed", result.stdout, re.MULTILINE), result.stdout
    peaks = re.findall(r"^VNNI peak: (\d) thread\(s\), ([\d.]+) G", result.stdout, re.MULTILINE)
    assert [p[0] for p in peaks] == ["1", "2"] and all(float(p[1]) > 0 for p in peaks)
    lines = re.findall(r"^(cur|noscale) +(amx|avx512vnni) regtile q(\d) (\d+)x(\d+)x(\d+) "
                       r"n= *(\d+) T=(\d): .* ([\d.]+) GMAC/s", result.stdout, re.MULTILINE)
    # builds x matrices x thread counts x batches x rounds
    assert len(lines) == 2 * 2 * 2 * 4 * 2, result.stdout
    assert {(line[0], line[2], line[4], line[6], line[7]) for line in lines} == {
        (tag, q, rows, n, t) for tag in ("cur", "noscale")
        for q, rows in (("4", "256"), ("8", "64")) for n in ("1", "8", "16", "32")
        for t in ("2", "1")}
    assert len({line[1] for line in lines}) == 1 and all(float(line[8]) > 0 for line in lines)
    binary = tmp_path / "products_cur"
    for args, message in ((["t", "3", "256", "4096", "1"], "TYPE 2 or 8"),
                          (["t", "2", "256", "4096", "1", "tiles"], "paths 'tiles'"),
                          (["t"], "usage")):
        bad = subprocess.run([str(binary), *args], capture_output=True, text=True, check=False)
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr


@pytest.mark.skipif(platform.machine() != "x86_64" or "avx2" not in Path(
    "/proc/cpuinfo").read_text(), reason="the x86 kernels' same-bits check")
def test_the_same_bits_check_passes_an_unchanged_kernel_and_fails_a_changed_one(tmp_path):
    # tests/bench/kernel_same_bits.sh (the check behind "the same bits" in docs): HEAD's source
    # against itself passes (given as NEW, so that edits in the working tree do not matter);
    # one constant changed (q4_0's offset 8 -> 7 in avx2's products) fails, naming the
    # difference; bad input is turned away before anything is built.
    root = ENGINE.parents[1]
    if subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                      check=False).returncode != 0:
        pytest.skip("not a git checkout: the check compares against a revision")
    script = ["bash", str(root / "tests/bench/kernel_same_bits.sh")]
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    for args, extra, message in ((["no-such-rev", "x86_avx2.c"], {}, "REV 'no-such-rev'"),
                                 (["HEAD", "model.c"], {}, "FILE 'model.c'"),
                                 (["HEAD", "x86_avx2.c", "amx"], {}, "usage"),
                                 (["HEAD", "x86_avx2.c"], {"NEW": str(tmp_path / "none.c")},
                                  "no such file")):
        build = tmp_path / "refused"
        bad = subprocess.run([*script, *args], cwd=root, env={**env, **extra,
                             "BUILD": str(build)}, capture_output=True, text=True, timeout=60,
                             check=False)
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr
        assert not build.exists(), "refused input must build nothing"
    source = subprocess.run(["git", "-C", str(root), "show", "HEAD:engines/cpu/src/x86_avx2.c"],
                            capture_output=True, text=True, check=True).stdout
    unchanged = tmp_path / "unchanged" / "x86_avx2.c"
    unchanged.parent.mkdir()
    unchanged.write_text(source)
    same = subprocess.run([*script, "HEAD", "x86_avx2.c"], cwd=root,
                          env={**env, "NEW": str(unchanged)}, capture_output=True, text=True,
                          timeout=600, check=False)
    assert same.returncode == 0, same.stderr + same.stdout
    assert "same bits: avx2's products" in same.stdout
    written = re.findall(r"^(old|new) .*: avx2: (\d+) products written$", same.stdout,
                         re.MULTILINE)
    assert [w[0] for w in written] == ["old", "new"] and written[0][1] == written[1][1]
    assert int(written[0][1]) > 10000, same.stdout
    assert "#define Q4_0_OFFSET 8 " in source
    changed = tmp_path / "x86_avx2.c"
    changed.write_text(source.replace("#define Q4_0_OFFSET 8 ", "#define Q4_0_OFFSET 7 "))
    differs = subprocess.run([*script, "HEAD", "x86_avx2.c"], cwd=root,
                             env={**env, "NEW": str(changed)}, capture_output=True, text=True,
                             timeout=600, check=False)
    assert differs.returncode == 1, differs.stderr + differs.stdout
    assert "DIFFERENT: avx2's products" in differs.stderr


def test_the_pool_benchmark_builds_runs_and_refuses_bad_input(tmp_path):
    # tests/bench/pool_run.c (a benchmark, not a timed test): built as its comment says, it
    # times both tasks on the threads asked for and turns bad arguments away.
    root = ENGINE.parents[1]
    binary = tmp_path / "pool_run"
    subprocess.run(["gcc", "-O2", f"-I{root / 'engines/cpu/src'}",
                    str(root / "tests/bench/pool_run.c"),
                    str(root / "engines/cpu/src/threadpool.c"), "-lpthread", "-o", str(binary)],
                   check=True, timeout=120)
    result = subprocess.run([str(binary), "2", "2000"], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    lines = re.findall(r"^pool_run (empty|touch) threads=2: (\d+) ns a run \(median of 5 rounds "
                       r"of 2000; (\d+)-(\d+)\)$", result.stdout, re.MULTILINE)
    assert [line[0] for line in lines] == ["empty", "touch"], result.stdout
    assert all(0 < int(lo) <= int(mid) <= int(hi) for _, mid, lo, hi in lines), result.stdout
    for args in ([], ["0"], ["2", "0"]):
        bad = subprocess.run([str(binary), *args], capture_output=True, text=True, check=False)
        assert bad.returncode == 2 and "usage" in bad.stderr, bad.stderr
