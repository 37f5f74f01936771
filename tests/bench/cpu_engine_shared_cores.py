"""The CPU engine sharing its cores with a busy process (a script, not a test).

    .venv/bin/python -m tests.bench.cpu_engine_shared_cores [--threads N] [--model PATH]
        [--spins default,10000,200/0] [--loads exclusive,one,all] [--runs 5] [--tokens 128]
        [--seconds 2]

Batch-1 decode tok/s of the embedded SmolLM2 (or --model), side by side in one run, with 1 thread
and with N threads (default: every CPU of the process, pinned) under three loads: exclusive cores;
one busy process (a Python `while` loop) pinned to the engine's last core (1 thread then runs on a
core of its own); a busy process pinned to each core the engine uses. The N-thread rows come once
per pool spin: `default` leaves the pool's own; `S` sets `HETEROSERVE_POOL_SPIN_US=S` (10000 spins
about as the pool did before it parked); `S/A` also sets `HETEROSERVE_POOL_SPIN_ALONE_US=A`, the
longer spin while no other thread wants the core (`200/0`: the pool before it had one, parking
after 200 µs whoever wants the core). "parks a token": the pool's waits that ended parked on a
futex (`Pool.parks`) over the tokens. Each configuration runs in its own process: a 32-token
prompt, then `--runs` timed runs of `--tokens` greedy tokens (a run stops early after `--seconds`,
so a starved engine cannot stall the benchmark); tok/s is the median of the runs, "engine CPU" the
CPU time of the engine process over the wall time of the runs (1.0 = one core; a row that got less
than its load leaves it, i.e. ran beside someone else's work, is named after the table). The busy
processes end themselves after two minutes in any case and are killed as soon as their row is done.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from tests.bench.cpu_engine_vs_llamacpp import open_heteroserve, prompt_tokens, smollm2_path

PROMPT = 32
SPIN_ENV = "HETEROSERVE_POOL_SPIN_US"
ALONE_ENV = "HETEROSERVE_POOL_SPIN_ALONE_US"
BUSY = ("import os, sys, time\nos.sched_setaffinity(0, {int(sys.argv[1])})\n"
        "end = time.monotonic() + 120\nwhile time.monotonic() < end:\n"
        "    for _ in range(100000): pass\n")


def worker(model_path: str, threads: int, runs: int, tokens: int, seconds: float) -> dict:
    _model, pool, config, run = open_heteroserve(model_path, threads, PROMPT + tokens + 8, 1)
    prompt = prompt_tokens(PROMPT, config.n_vocab, 3)
    first = run(prompt, range(PROMPT), [0] * PROMPT, [PROMPT - 1])
    rates, cpu, wall, parks, generated = [], 0.0, 0.0, 0, 0
    for _ in range(runs):
        nxt, done = first, 0
        usage = resource.getrusage(resource.RUSAGE_SELF)
        parked = pool.parks
        start = time.perf_counter()
        while done < tokens and (done == 0 or time.perf_counter() - start < seconds):
            nxt = run(nxt, [PROMPT + done], [0], [0])
            done += 1
        elapsed = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_SELF)
        parks += pool.parks - parked
        generated += done
        rates.append(done / elapsed)
        cpu += after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime
        wall += elapsed
    return {"rate": statistics.median(rates), "runs": rates, "cpu": cpu / wall,
            "parks": parks / generated}


def spin_env(spin: str) -> dict:
    """The pool's spin variables for a --spins entry (`default`, `S` or `S/A`)."""
    if spin == "default":
        return {}
    values = spin.split("/")
    for value in values:
        try:
            ok = float(value) >= 0
        except ValueError:
            ok = False
        if not ok or len(values) > 2:
            raise SystemExit(f"--spins entry {spin!r}: 'default', S or S/A, microseconds >= 0")
    short, alone = values[0], values[1] if len(values) == 2 else ""
    return {SPIN_ENV: short, **({ALONE_ENV: alone} if alone else {})}


def measure(args, threads: int, spin: str, busy_cpus: list[int]) -> dict:
    env = dict(os.environ)
    env.pop(SPIN_ENV, None)
    env.pop(ALONE_ENV, None)
    env.update(spin_env(spin))
    busy = []
    try:
        for cpu in busy_cpus:
            busy.append(subprocess.Popen([sys.executable, "-c", BUSY, str(cpu)]))
        out = subprocess.run([sys.executable, "-m", "tests.bench.cpu_engine_shared_cores",
                              "--worker", "--model", args.model, "--threads", str(threads),
                              "--runs", str(args.runs), "--tokens", str(args.tokens),
                              "--seconds", str(args.seconds)], env=env, capture_output=True,
                             text=True, check=True, timeout=120)
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        for p in busy:
            p.kill()
        for p in busy:
            p.wait()


LOADS = {"exclusive": "exclusive", "one": "one busy process (last core)",
         "all": "a busy process on every core"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--model")
    parser.add_argument("--spins", default="default,10000,200/0",
                        help=f"{SPIN_ENV} values (S) for the N-thread rows, or S/A with "
                             f"{ALONE_ENV}=A; default: both unset")
    parser.add_argument("--loads", default="exclusive,one,all")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--worker", action="store_true")
    args = parser.parse_args()
    args.model = args.model or str(smollm2_path())
    if args.worker:
        print(json.dumps(worker(args.model, args.threads, args.runs, args.tokens, args.seconds)))
        return 0
    cpus = sorted(os.sched_getaffinity(0))[:args.threads]
    spins, loads, n = args.spins.split(","), args.loads.split(","), args.threads
    for spin in spins:
        spin_env(spin)  # a bad entry stops here, before any process runs
    print(f"\nmodel: {os.path.basename(args.model)}; engine CPUs {cpus}; batch-1 decode tok/s, "
          f"median of {args.runs} runs of {args.tokens} tokens (or {args.seconds} s); "
          f"load average before: {os.getloadavg()[0]:.2f}\n")
    print("| load | threads | pool spin (µs) | tok/s | runs | engine CPU | parks a token "
          "| vs 1 thread, same load | vs 1 thread, exclusive |")
    print("|---|---|---|---|---|---|---|---|---|")
    results = {}
    for load in loads:
        busy_cpus = {"exclusive": [], "one": cpus[-1:], "all": cpus}[load]
        for threads, spin in [(1, "default")] + [(n, s) for s in spins]:
            r = results[load, threads, spin] = measure(args, threads, spin, busy_cpus)
            alone = results.get(("exclusive", 1, "default"))
            print(f"| {LOADS[load]} | {threads} | {spin} | {r['rate']:.1f} | "
                  f"{min(r['runs']):.1f}-{max(r['runs']):.1f} | {r['cpu']:.2f} | "
                  f"{r['parks']:.1f} | "
                  f"{r['rate'] / results[load, 1, 'default']['rate']:.2f} | "
                  + (f"{r['rate'] / alone['rate']:.2f} |" if alone else "- |"), flush=True)
    print(f"\nload average after: {os.getloadavg()[0]:.2f}\n")
    # Rows whose engine got less CPU than their load leaves it: another process used the cores.
    expected = {"exclusive": lambda t: t, "one": lambda t: 1.0, "all": lambda t: 0.5}
    for (load, threads, spin), r in results.items():
        if (load == "exclusive" or threads == 1) and r["cpu"] < 0.9 * expected[load](threads):
            print(f"note: {LOADS[load]}, {threads} thread(s), spin {spin} ran on {r['cpu']:.2f} "
                  f"cores, short of {expected[load](threads):.1f}: another process was using "
                  "the cores; run again\n")
    for load in loads:
        for spin in spins:
            rate, one = results[load, n, spin]["rate"], results[load, 1, "default"]["rate"]
            if load == "exclusive":
                if spin != spins[0]:
                    print(f"exclusive cores, {n} threads: spin {spins[0]} / spin {spin} = "
                          f"{results[load, n, spins[0]]['rate'] / rate:.3f}")
                continue
            line = (f"{LOADS[load]}, {n} threads, spin {spin}: {100 * rate / one:.0f} % of "
                    f"1 thread under the same load")
            if ("exclusive", 1, "default") in results:
                line += (f", {100 * rate / results['exclusive', 1, 'default']['rate']:.0f} % of 1 "
                         f"thread on exclusive cores")
            print(line + " (goal: >= 80 %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
