#!/usr/bin/env python3
"""Tessera, PyTorch and JAX on the same training step, side by side (`make bench-peers`).

Runs every setup of each system, interleaved (Tessera, PyTorch, JAX for one setup, then the next
setup), for --rounds rounds, and prints each system's median over the rounds and the ratios
against Tessera (> 1: Tessera is faster). The machine is shared and noisy; interleaving keeps a
slow moment from landing on one system only. Nothing is asserted.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

SETUPS = ["1rank", "dp4", "tp4", "dp2xtp2"]
LABELS = {"1rank": "1 rank", "dp4": "dp4 (DDP)", "tp4": "tp4", "dp2xtp2": "dp2 x tp2 (TP + FSDP)"}
HERE = os.path.dirname(os.path.abspath(__file__))


def one_thread_env():
    env = dict(os.environ)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = "1"
    return env


def run(cmd):
    """Runs one measurement; returns its step_ms, or None (with the reason on stderr)."""
    done = subprocess.run(cmd, env=one_thread_env(), capture_output=True, text=True, timeout=1800)
    match = re.search(r"step_ms=([0-9.]+)", done.stdout)
    if done.returncode != 0 or not match:
        sys.stderr.write(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stdout}{done.stderr[-2000:]}\n")
        return None
    return float(match.group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tessera", required=True, help="the tessera_train_bench binary")
    parser.add_argument("--python", required=True, help="the venv's python with torch and jax")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--setups", default=",".join(SETUPS))
    args = parser.parse_args()
    setups = args.setups.split(",")
    systems = {
        "Tessera": lambda s: [args.tessera, "--setup", s, "--steps", str(args.steps)],
        "PyTorch": lambda s: [args.python, os.path.join(HERE, "torch_lm.py"), "--setup", s, "--steps",
                              str(args.steps), "--warmup", "2"],
        "JAX (jit)": lambda s: [args.python, os.path.join(HERE, "jax_lm.py"), "--setup", s, "--steps",
                                str(args.steps), "--warmup", "2"],
    }
    times = {(system, s): [] for system in systems for s in setups}
    for r in range(args.rounds):
        for s in setups:
            for system, command in systems.items():
                ms = run(command(s))
                if ms is not None:
                    times[(system, s)].append(ms)
                print(f"round {r + 1} {s:8s} {system:10s} {ms if ms is not None else 'failed'}", file=sys.stderr)

    def median(system, s):
        values = times[(system, s)]
        return statistics.median(values) if values else float("nan")

    print(f"\nTraining step (ms), median of {args.rounds} interleaved rounds, one intra-op thread per rank:\n")
    header = f"{'setup':24s} {'Tessera':>9s} {'PyTorch':>9s} {'JAX jit':>9s} {'PyTorch/Tessera':>16s} {'JAX/Tessera':>12s}"
    print(header)
    print("-" * len(header))
    for s in setups:
        t, p, j = median("Tessera", s), median("PyTorch", s), median("JAX (jit)", s)
        print(f"{LABELS.get(s, s):24s} {t:9.1f} {p:9.1f} {j:9.1f} {p / t:15.2f}x {j / t:11.2f}x")
    print("\n(> 1x: Tessera is faster. 4-rank setups share this machine's cores.)")


if __name__ == "__main__":
    main()
