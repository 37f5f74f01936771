"""Whether the benchmark's way of timing batched decode costs heteroserve anything (a script, not
a test): in one process, the 8- and 16-sequence steps timed as cpu_engine_vs_llamacpp's worker
times them (each sequence's prompt of `npp` tokens in one call, then `steps` steps straight
after, as llama-batched-bench does) and as cpu_engine_profile times them (one warm-up step of the
batch's shape, then every step at position 32), alternately, ROUNDS times; each step's time and
the model's phase counters (ms a step) for each.

    .venv/bin/python -m tests.bench.batched_patterns --model 8b:q8_0 [--threads N] [--rounds 2]
        [--fresh] [--tokenizer JSON]

SPEC as in cpu_engine_vs_llamacpp, with its SETTINGS and KV sizing. Before the batched runs, as
the worker does, a 256-token prefill and the batch-1 steps (`--fresh`: nothing before them).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from tests.bench.cpu_engine_vs_llamacpp import (
    add_model_options,
    batch_prompts,
    bench_env,
    kv_positions,
    model_arg,
    open_heteroserve,
    prompt_tokens,
    settings_for,
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_options(ap)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--fresh", action="store_true", help="no prefill or batch-1 steps first")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.threads < 1:
        ap.error("--rounds and --threads must be 1 or more")
    label, path = model_arg(ap, args.model, args.tokenizer)
    env, policy = bench_env()
    os.environ.update(env)  # the benchmark's huge-page policy, before the engine allocates
    settings = settings_for(args.model)
    _prompts, decode, npp, steps = settings
    total = kv_positions(settings)
    model, _pool, config, run = open_heteroserve(str(path), args.threads, total // 16, 16, total)
    vocab = config.n_vocab
    print(f"{label}, {args.threads} threads, {policy}; {npp}+{steps} positions a sequence",
          flush=True)

    def timed(batch: int, step) -> str:
        model.set_profiling(True)
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        phases = {k: v / steps * 1e3 for k, v in model.profile.items()}
        model.set_profiling(False)
        rate = batch * steps / sum(times)
        return (f"{rate:6.1f} tok/s; gate/up {phases['gate_up']:.1f}, down {phases['down']:.1f} "
                f"ms a step; steps (ms): " + " ".join(f"{t * 1e3:.0f}" for t in times))

    if not args.fresh:
        warm = prompt_tokens(256, vocab, 1)
        run(warm, range(256), [0] * 256, [255])
        nxt = run(warm[:1], [0], [0], [0])
        for position in range(decode):
            nxt = run(nxt, [position], [0], [0])
    for rnd in range(1, args.rounds + 1):
        for batch in (8, 16):
            state = {"next": run(*batch_prompts(batch, npp, vocab)), "at": npp}

            def bench_step(b=batch, state=state):
                state["next"] = run(state["next"], [state["at"]] * b, range(b), range(b))
                state["at"] += 1

            print(f"round {rnd}, {batch:2d} seq, benchmark: {timed(batch, bench_step)}",
                  flush=True)
            fixed = prompt_tokens(batch, vocab, 3)
            run(fixed, [31] * batch, range(batch), range(batch))  # warm-up

            def profile_step(b=batch, fixed=fixed):
                run(fixed, [32] * b, range(b), range(b))

            print(f"round {rnd}, {batch:2d} seq, profile:   {timed(batch, profile_step)}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
