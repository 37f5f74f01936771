"""The CPU engine's binding report on /metrics (cpu_engine/pinning.py) and its parsing
(protocol/binding_report.py): measured from the pool's real threads, read back by the parser the
operator uses."""

from __future__ import annotations

import os
import threading
import time

import heteroserve_cpu
import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from heteroserve_engines.cpu_engine.affinity import numa_nodes_of
from heteroserve_engines.cpu_engine.pinning import BindingInfo, PinnedThreads
from heteroserve_engines.protocol.binding_report import (
    METRIC,
    BindingReportError,
    ReportedBinding,
    find_binding,
)


def exposition(pinned: PinnedThreads) -> str:
    registry = CollectorRegistry()
    registry.register(BindingInfo(pinned))
    return generate_latest(registry).decode()


def pool_in_thread(cpus: list[int]):
    """A pool created (and its caller pinned) in a thread of its own, so the test process's
    main thread keeps its affinity; returns the pool, the captured threads and a stop event."""
    made: dict = {}
    stop = threading.Event()

    def owner():
        pinned = PinnedThreads()
        with pinned.capture():
            made["pool"] = heteroserve_cpu.Pool(cpus, len(cpus), pin_caller=True)
        made["pinned"] = pinned
        stop.wait()   # the caller thread is one of the compute threads: keep it alive

    thread = threading.Thread(target=owner, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while "pinned" not in made:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return made["pool"], made["pinned"], stop, thread


@pytest.mark.parametrize("which", ["last", "all"])
def test_the_metric_reports_where_the_pools_threads_run(which):
    allowed = sorted(os.sched_getaffinity(0))
    cpus = allowed[-1:] if which == "last" else allowed
    expected = ReportedBinding.of(cpus, numa_nodes_of(cpus).values(), len(cpus))
    _pool, pinned, stop, thread = pool_in_thread(cpus)
    try:
        # Workers pin themselves as they start.
        deadline = time.monotonic() + 10
        while (found := find_binding(exposition(pinned))) != expected \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert found == expected
        assert len(pinned.tids) == len(cpus)
    finally:
        stop.set()
        thread.join()


def test_a_refused_pin_shows_where_the_thread_really_runs(tmp_path):
    """The report is the threads' affinity, not the list the engine was given: a worker the
    kernel would not pin stays on its inherited CPUs, and those are what /metrics says."""
    for node, cpus in ((0, "0-3"), (1, "4-7")):
        (tmp_path / f"node{node}").mkdir()
        (tmp_path / f"node{node}" / "cpulist").write_text(cpus + "\n")
    masks = {100: {0}, 101: {1}, 102: {4, 5}}   # thread 102's pin to CPU 2 was refused
    pinned = PinnedThreads(node_root=tmp_path, affinity=lambda tid: masks[tid])
    pinned.tids = (100, 101, 102)
    assert find_binding(exposition(pinned)) == ReportedBinding((0, 1, 4, 5), (0, 1), 3)


def test_exited_threads_do_not_count_and_no_thread_reports_nothing():
    def affinity(tid: int) -> set[int]:
        if tid == 2:
            raise ProcessLookupError(tid)
        return {7}

    pinned = PinnedThreads(affinity=affinity)
    assert pinned.measure() is None and find_binding(exposition(pinned)) is None
    pinned.tids = (1, 2)
    assert pinned.measure().cpus == (7,)
    pinned.tids = (2,)
    assert find_binding(exposition(pinned)) is None


def test_find_binding_in_a_foreign_exposition():
    text = ("# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{model_name="m"} 0.0\n'
            f'{METRIC}{{cpus="0-3,8,10",numa_nodes="0,1",threads="6"}} 1.0\n'
            "garbage that is not prometheus {{{\n")
    assert find_binding(text) == ReportedBinding((0, 1, 2, 3, 8, 10), (0, 1), 6)
    assert find_binding(text).labels() == {"cpus": "0-3,8,10", "numa_nodes": "0,1",
                                          "threads": "6"}
    assert find_binding('vllm:num_requests_running{model_name="m"} 0.0\n') is None


@pytest.mark.parametrize("line", [
    f'{METRIC}{{cpus="0-3",numa_nodes="0"}} 1',               # no threads
    f'{METRIC}{{cpus="3-1",numa_nodes="0",threads="2"}} 1',    # not a CPU list
    f'{METRIC}{{cpus="",numa_nodes="0",threads="2"}} 1',       # no CPU
    f'{METRIC}{{cpus="0",numa_nodes="x",threads="1"}} 1',
    f'{METRIC}{{cpus="0",numa_nodes="0",threads="0"}} 1',
    f'{METRIC}{{cpus="0",numa_nodes="0",threads="1"}} 1\n'
    f'{METRIC}{{cpus="1",numa_nodes="0",threads="1"}} 1',      # two bindings
    f'{METRIC}{{cpus="0,numa_nodes="0",threads="1"}} 1',       # broken quoting
])
def test_a_malformed_report_is_an_error(line):
    with pytest.raises(BindingReportError):
        find_binding(line + "\n")


def test_the_pools_parked_waits_are_a_counter_read_at_scrape_time(monkeypatch):
    """Every wait parks with HETEROSERVE_POOL_SPIN_US=0, so a threaded product on two threads
    parks at least once, and /metrics shows the pool's own count, growing with it."""
    from heteroserve_engines.cpu_engine.pinning import PoolParks

    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs two CPUs")
    monkeypatch.setenv("HETEROSERVE_POOL_SPIN_US", "0")
    pool, _pinned, stop, thread = pool_in_thread(allowed[:2])
    try:
        registry = CollectorRegistry()
        registry.register(PoolParks(pool))

        def scraped() -> float:
            return registry.get_sample_value("heteroserve:cpu_pool_parks_total")

        start = scraped()
        assert start == pool.parks
        rows, cols = 64, 64
        weights = np.zeros(rows * cols // 32 * 34, dtype=np.uint8)   # q8_0 (type 8): zero blocks
        heteroserve_cpu.matmul(pool, 8, rows, cols, weights, np.zeros((1, cols), np.float32))
        assert pool.parks > start and scraped() == pool.parks
        text = generate_latest(registry).decode()
        assert "# TYPE heteroserve:cpu_pool_parks_total counter" in text
    finally:
        stop.set()
        thread.join()
