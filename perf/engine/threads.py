"""`python -m perf.engine.threads`: the CPU thread policy's input, one step at 1 thread vs all threads.

For each model (all-MiniLM-L6-v2 and the `overhead` profile's near-free model) and each Linear
path (cpu_linear plain / auto), one sequence of N tokens is timed with 1 intra-op thread and with
torch's default, alternating in short blocks (median of each); printed next to the count
engine_lib/runner/step_threads.py picks for that step. Where 1 thread is as fast, a thread team
only costs the other processes on the cores (docs/engine.md). Prints a markdown table.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from ..machine import cpu_busy, wait_until_quiet

TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def step_time(engine, tokens: int, threads: int, reps: int) -> list[float]:
    import torch

    from engine_lib.contract import PackedBatch

    batch = PackedBatch.from_sequences([np.random.default_rng(tokens).integers(1000, min(20000, engine.vocab_size),
                                                                               size=tokens)])
    torch.set_num_threads(threads)
    engine.step(batch).wait()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        engine.step(batch).wait()
        times.append(time.perf_counter() - start)
    return times


def main(argv=None) -> None:
    import torch

    from engine_lib.runner.model_runner import ModelRunner
    from engine_lib.runner.step_threads import StepThreads, flops_per_token

    parser = argparse.ArgumentParser(prog="python -m perf.engine.threads", description=__doc__)
    parser.add_argument("--model-dir", action="append", help="model folders (default: all-MiniLM-L6-v2)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quiet-wait", type=float, default=120.0,
                        help="before each model and path, wait up to this many seconds for the machine to be "
                             "under 25%% busy (anyone's work)")
    args = parser.parse_args(argv)
    most = torch.get_num_threads()
    print(f"load average {os.getloadavg()[0]:.2f}; threads 1 vs {most}; median ms over "
          f"{args.rounds} x {args.reps} steps per cell\n")
    print(f"| model | cpu_linear | busy before | tokens | 1 thread ms | {most} threads ms | 1 / {most} | policy picks |")
    print("|---|---|---|---|---|---|---|---|")
    for model_dir in args.model_dir or ["default"]:
        for mode in ("plain", "auto"):
            engine = ModelRunner(model_dir, device="cpu", cpu_linear=mode)
            name = "/".join(engine.model_dir.rstrip("/").split("/")[-2:])
            busy = wait_until_quiet(0.25, args.quiet_wait) if args.quiet_wait else cpu_busy()
            policy = StepThreads(engine, most, flops_per_token(engine.model), lambda n: None)
            for tokens in TOKENS:
                samples = {1: [], most: []}
                for _ in range(args.rounds):
                    for threads in samples:
                        samples[threads] += step_time(engine, tokens, threads, args.reps)
                one, all_ = (np.median(samples[t]) * 1e3 for t in (1, most))
                print(f"| {name} | {engine.cpu_linear} | {busy:.0%} | {tokens} | "
                      f"{one:.2f} | {all_:.2f} | {one / all_:.2f} | {policy.threads_for(tokens)} |", flush=True)
            torch.set_num_threads(most)
    print(f"\nload average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
