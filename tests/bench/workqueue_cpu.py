"""The operator's work queue under a 1,000-object burst (a script, not a test): its own CPU.

    .venv/bin/python -m tests.bench.workqueue_cpu [--also LABEL=DIR ...]

N keys are added at once, then each is triggered `--triggers` more times at random moments over
`--spread` seconds, as the children's watch events trigger an InferenceDeployment; 32 workers
"reconcile" by sleeping 30 ms (a reconcile mostly waits for the apiserver), with the operator's
one-second minimum between two reconciles of a key. What the process spends on CPU is the
queue's own cost. `--also LABEL=DIR` runs the same load, in a process of its own, against the
`heteroserve_operator` package found in DIR (e.g. a `git archive` of an earlier commit's
operator/ folder): a before/after side by side.

Printed: reconciles, wall seconds and CPU seconds, per queue.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path


def measure(keys: int, triggers: int, spread: float, workers: int) -> dict[str, float]:
    from heteroserve_operator.workqueue import WorkQueue

    done = 0
    lock = threading.Lock()

    def work(_namespace: str, _name: str) -> None:
        nonlocal done
        time.sleep(0.03)
        with lock:
            done += 1

    queue = WorkQueue(work, workers, min_interval=1.0)
    queue.start()
    rng = random.Random(1)
    events = sorted((rng.uniform(0, spread), i) for i in range(keys) for _ in range(triggers))
    start, cpu = time.monotonic(), time.process_time()
    for i in range(keys):
        queue.add("ns", f"o{i}")
    for at, i in events:
        delay = at - (time.monotonic() - start)
        if delay > 0:
            time.sleep(delay)
        queue.add("ns", f"o{i}")
    while len(queue) or time.monotonic() - start < spread + 1:
        time.sleep(0.05)
    time.sleep(1.5)   # the last keys' reconciles end
    result = {"reconciles": done, "wall": time.monotonic() - start,
              "cpu": time.process_time() - cpu}
    queue.stop()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--triggers", type=int, default=8)
    parser.add_argument("--spread", type=float, default=15.0)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--also", metavar="LABEL=DIR", action="append", default=[])
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.json:   # one measurement, in this process
        print(json.dumps(measure(args.keys, args.triggers, args.spread, args.workers)))
        return 0
    repo = Path(__file__).resolve().parents[2]
    rows = []
    for label, path in [("this tree", str(repo / "operator")),
                        *(tuple(a.split("=", 1)) for a in args.also)]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(path).resolve()),
                                                            str(repo)])}
        out = subprocess.run(
            [sys.executable, "-m", "tests.bench.workqueue_cpu", "--json", "--keys",
             str(args.keys), "--triggers", str(args.triggers), "--spread", str(args.spread),
             "--workers", str(args.workers)],
            env=env, cwd=repo, check=True, capture_output=True, text=True).stdout
        rows.append((label, json.loads(out)))
    print(f"\n{args.keys} keys, {args.triggers} triggers each over {args.spread:g} s, "
          f"{args.workers} workers, 1 s minimum interval\n")
    print("| queue | reconciles | wall s | CPU s |")
    print("|---|---|---|---|")
    for label, r in rows:
        print(f"| {label} | {r['reconciles']} | {r['wall']:.1f} | {r['cpu']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
