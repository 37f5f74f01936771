"""The work queue collapses bursts and never runs one key twice at once."""

from __future__ import annotations

import threading
import time

from heteroserve_operator.workqueue import WorkQueue


def test_burst_is_collapsed_and_keys_are_exclusive():
    calls: list[tuple[str, str]] = []
    running: set[tuple[str, str]] = set()
    overlap = threading.Event()
    gate = threading.Event()

    def work(namespace: str, name: str) -> None:
        key = (namespace, name)
        if key in running:
            overlap.set()
        running.add(key)
        gate.wait(5)
        calls.append(key)
        running.discard(key)

    queue = WorkQueue(work, workers=4)
    queue.start()
    queue.add("ns", "a")
    time.sleep(0.05)       # "a" is now running
    for _ in range(50):    # a burst while it runs: one more reconcile, not fifty
        queue.add("ns", "a")
    queue.add("ns", "b")
    gate.set()
    deadline = time.monotonic() + 5
    while (len(calls) < 3 or len(queue)) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    queue.stop()
    assert sorted(calls) == [("ns", "a"), ("ns", "a"), ("ns", "b")]
    assert not overlap.is_set()


def test_min_interval_spaces_reconciles_of_one_key():
    stamps: list[float] = []
    queue = WorkQueue(lambda _ns, _n: stamps.append(time.monotonic()), workers=2,
                      min_interval=0.3)
    queue.start()
    queue.add("ns", "a")
    time.sleep(0.05)
    queue.add("ns", "a")
    deadline = time.monotonic() + 3
    while len(stamps) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    queue.stop()
    assert len(stamps) == 2
    assert stamps[1] - stamps[0] >= 0.29


def test_add_unless_recent_leaves_out_keys_reconciled_lately_queued_or_running():
    calls: list[tuple[str, str]] = []
    gate = threading.Event()

    def work(namespace: str, name: str) -> None:
        if name == "slow":
            gate.wait(5)
        calls.append((namespace, name))

    queue = WorkQueue(work, workers=2)
    queue.start()
    queue.add("ns", "done")
    queue.add("ns", "slow")
    deadline = time.monotonic() + 5
    while ("ns", "done") not in calls and time.monotonic() < deadline:
        time.sleep(0.01)
    # "done" finished moments ago, "slow" is running: the resync queues neither.
    assert not queue.add_unless_recent("ns", "done", within=60)
    assert not queue.add_unless_recent("ns", "slow", within=60)
    # Never reconciled, or reconciled longer ago than `within`: queued.
    assert queue.add_unless_recent("ns", "new", within=60)
    assert queue.add_unless_recent("ns", "done", within=0)
    gate.set()
    while len(calls) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    queue.stop()
    assert sorted(calls) == [("ns", "done"), ("ns", "done"), ("ns", "new"), ("ns", "slow")]


def _wait_for(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)


def test_ready_keys_run_first_in_first_out_and_a_held_back_key_holds_up_none():
    order: list[str] = []
    ended: dict[str, float] = {}
    started: dict[str, list[float]] = {}

    def work(_namespace: str, name: str) -> None:
        started.setdefault(name, []).append(time.monotonic())
        order.append(name)
        ended[name] = time.monotonic()

    queue = WorkQueue(work, workers=1, min_interval=0.4)
    queue.add("ns", "a")
    queue.start()
    _wait_for(lambda: "a" in ended)
    queue.add("ns", "a")                  # held back until 0.4 s after its reconcile
    for name in ("b", "c", "d"):
        queue.add("ns", name)
    _wait_for(lambda: order.count("a") == 2)
    queue.stop()
    assert order == ["a", "b", "c", "d", "a"]
    assert started["a"][1] - started["a"][0] >= 0.39
    assert len(queue) == 0


def test_many_held_back_keys_are_each_run_once_when_due():
    calls: list[str] = []
    lock = threading.Lock()

    def work(_namespace: str, name: str) -> None:
        with lock:
            calls.append(name)

    queue = WorkQueue(work, workers=8, min_interval=0.2)
    queue.start()
    names = [f"o{i}" for i in range(300)]
    for name in names:
        queue.add("ns", name)
    _wait_for(lambda: len(calls) == 300)
    for name in names:                    # each finished moments ago: all held back
        queue.add("ns", name)
        queue.add("ns", name)             # and a second trigger collapses into the first
    _wait_for(lambda: len(calls) == 600)
    time.sleep(0.3)                       # nothing more is due
    queue.stop()
    assert sorted(calls) == sorted(names * 2)


def test_stop_ends_workers_waiting_for_a_held_back_key():
    queue = WorkQueue(lambda _ns, _n: None, workers=3, min_interval=30)
    queue.start()
    queue.add("ns", "a")
    _wait_for(lambda: len(queue) == 0)
    time.sleep(0.05)
    queue.add("ns", "a")                  # due in 30 s: one worker waits for it
    queue.stop()
    for thread in queue._threads:
        thread.join(2)
    assert not any(thread.is_alive() for thread in queue._threads)
