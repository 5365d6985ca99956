#!/usr/bin/env python3
"""Tessera, PyTorch and JAX on the same training step, side by side (`make bench-peers`).

Runs every setup of each system, interleaved (Tessera, PyTorch, JAX for one setup, then the next
setup), for --rounds rounds, and prints each system's median over the rounds and the ratios
against Tessera (> 1: Tessera is faster). The machine is shared and noisy; interleaving keeps a
slow moment from landing on one system only. Nothing is asserted.

With --dispatch PATH (the tessera_dispatch_bench binary) it then also compares DTensor op-dispatch
overhead: Tessera's dispatch bench and torch_dispatch.py, once each per round, interleaved, and
prints a second table of each op's overhead over its local op (medians over the rounds).

With --plan-scale PATH (the tessera_plan_scale_bench binary) it also compares the redistribute
planners at scale: Tessera's plan() and torch_planner.py (DTensor's planner on a fake process group
of as many ranks) on the pairs and meshes of plan_pairs.json, once each, and prints a table of
both times per pair with the ratio PyTorch / Tessera (>= 1: Tessera's plan is no slower).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

SETUPS = ["1rank", "dp4", "tp4", "dp2xtp2", "1rank-2t"]
LABELS = {"1rank": "1 rank", "dp4": "dp4 (DDP)", "tp4": "tp4", "dp2xtp2": "dp2 x tp2 (TP + FSDP)",
          "1rank-2t": "1 rank x 2 threads"}
# "<setup>-<n>t": the setup with n intra-op threads per rank (Tessera: BLAS threads; PyTorch:
# set_num_threads; JAX: XLA's thread pool over every core) instead of one.


def split_setup(name):
    """("1rank", 2) for "1rank-2t"; (name, 1) otherwise."""
    match = re.fullmatch(r"(.+)-(\d+)t", name)
    return (match.group(1), int(match.group(2))) if match else (name, 1)
HERE = os.path.dirname(os.path.abspath(__file__))


def one_thread_env(threads=1):
    env = dict(os.environ)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = "1"
    env["PEERS_THREADS"] = env["TESSERA_BLAS_THREADS"] = str(threads)
    return env


def run(cmd, threads=1):
    """Runs one measurement; returns (step_ms, peak_rss_mib or None, peak tensor MiB per rank or
    None), or None (with the reason on stderr)."""
    done = subprocess.run(cmd, env=one_thread_env(threads), capture_output=True, text=True, timeout=1800)
    match = re.search(r"step_ms=([0-9.]+)", done.stdout)
    if done.returncode != 0 or not match:
        sys.stderr.write(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stdout}{done.stderr[-2000:]}\n")
        return None
    rss = re.search(r"peak_rss_mib=([0-9.]+)", done.stdout)
    per_rank = re.search(r"peak_tensor_mib_per_rank=([0-9.]+)", done.stdout)
    return (float(match.group(1)), float(rss.group(1)) if rss else None,
            float(per_rank.group(1)) if per_rank else None)


DISPATCH_OPS = ["add", "matmul", "softmax", "reshape"]


def run_json(cmd, json_path=None, key="rows"):
    """Runs one dispatch (or planner) measurement; returns its JSON object (read from json_path, or
    the last line of stdout that is a JSON object), or None (with the reason on stderr)."""
    done = subprocess.run(cmd, env=one_thread_env(), capture_output=True, text=True, timeout=1800)
    result = None
    try:
        if json_path is not None:
            with open(json_path) as f:
                result = json.load(f)
        else:
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            result = json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        result = None
    if done.returncode != 0 or result is None or key not in result:
        sys.stderr.write(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stdout[-2000:]}{done.stderr[-2000:]}\n")
        return None
    return result


def dispatch_table(args):
    """Tessera's dispatch bench and torch_dispatch.py, interleaved for --rounds rounds."""
    overheads = {(system, op): [] for system in ("Tessera", "PyTorch", "PyTorch CPU") for op in DISPATCH_OPS}
    collectives = {}  # op -> the largest collective count torch_dispatch.py saw in one DTensor call
    torch_version = None
    with tempfile.TemporaryDirectory() as tmp:
        json_path = os.path.join(tmp, "dispatch.json")
        for r in range(args.rounds):
            commands = {
                "Tessera": ([args.dispatch, "--iters", "5000", "--json", json_path], json_path),
                "PyTorch": ([args.python, os.path.join(HERE, "torch_dispatch.py")], None),
            }
            for system, (cmd, path) in commands.items():
                if path is not None and os.path.exists(path):
                    os.remove(path)  # a failed run must not read the last round's file
                result = run_json(cmd, path)
                rows = {row["op"]: row for row in result["rows"]} if result else {}
                for op in DISPATCH_OPS:
                    if op in rows:
                        overheads[(system, op)].append(rows[op]["overhead_ns"])
                        if system == "PyTorch" and "overhead_cpu_ns" in rows[op]:
                            overheads[("PyTorch CPU", op)].append(rows[op]["overhead_cpu_ns"])
                        if system == "PyTorch":
                            collectives[op] = max(collectives.get(op, 0), rows[op].get("collectives", 0))
                if system == "PyTorch" and result:
                    torch_version = result.get("torch")
                summary = " ".join(f"{op}={rows[op]['overhead_ns']:.0f}" for op in DISPATCH_OPS if op in rows)
                print(f"round {r + 1} dispatch {system:10s} {summary or 'failed'} (overhead ns)", file=sys.stderr)

    def median(system, op):
        values = overheads[(system, op)]
        return statistics.median(values) if values else float("nan")

    print(f"\nDTensor op dispatch overhead (hit - local), 1-d mesh of 4 ranks, median of {args.rounds} "
          f"interleaved rounds:\n")
    header = (f"{'op':10s} {'Tessera overhead (ns)':>22s} {'PyTorch DTensor overhead (us)':>30s} "
              f"{'PyTorch/Tessera':>16s} {'PyTorch CPU (us)':>17s}")
    print(header)
    print("-" * len(header))
    for op in DISPATCH_OPS:
        t, p = median("Tessera", op), median("PyTorch", op)
        ratio = p / t if t > 0 else float("nan")
        c = median("PyTorch CPU", op)
        print(f"{op:10s} {t:22.0f} {p / 1e3:30.2f} {ratio:15.1f}x {c / 1e3:17.2f}")
    comm = ", ".join(f"{op} {collectives[op]}" for op in DISPATCH_OPS if op in collectives)
    print(f"\n(PyTorch {torch_version or '?'}; collectives per DTensor call, CommDebugMode: {comm or '?'}."
          f"\n Tessera: rank threads, 5000 calls per repetition; PyTorch: rank processes over gloo, 2000."
          f"\n Overheads are wall clock on rank 0. PyTorch CPU: the same from rank 0's thread CPU time, which"
          f"\n leaves out time descheduled; a loaded machine inflates PyTorch's long loops more than short ones.)")


def plan_scale_table(args):
    """tessera_plan_scale_bench (plans only) and torch_planner.py on the same pairs, one run each."""
    common = ["--max-ranks", str(args.plan_max_ranks), "--cap-s", str(args.plan_cap_s)]
    if args.plan_cpu_time:
        common.append("--cpu-time")
    with tempfile.TemporaryDirectory() as tmp:
        json_path = os.path.join(tmp, "plan_scale.json")
        tessera = run_json([args.plan_scale, "--no-dispatch", "--json", json_path] + common, json_path, key="plans")
    torch_result = run_json([args.python, os.path.join(HERE, "torch_planner.py")] + common)
    if tessera is None or torch_result is None:
        print("\nplanner at scale: a run failed (see stderr)")
        return

    def key(row):
        return (tuple(row["mesh"]), row["tensor"], row["src"].replace(" ", ""), row["dst"].replace(" ", ""))

    torch_rows = {key(row): row for row in torch_result["rows"]}
    cap_ms = tessera["cap_s"] * 1e3
    print(f"\nRedistribute planner at scale, one thread, no ranks: Tessera plan() against PyTorch "
          f"{torch_result.get('torch', '?')} DTensor's planner (_gen_transform_infos + _optimize_transform_infos,"
          f"\n{torch_result.get('planner', 'default')} planner, fake process group of as many ranks). ms: first plan;"
          f" median: of the repeats. PyTorch's first plan\nbuilds its per-mesh planner object, its repeats reuse it."
          f" ratio: PyTorch / Tessera medians (>= 1: Tessera no slower).\n")
    header = (f"{'mesh':12s} {'tensor':7s} {'pair':52s} {'Tessera ms':>11s} {'median':>9s} {'PyTorch ms':>11s}"
              f" {'median':>9s} {'ratio':>8s} {'steps T/P':>10s} {'recv/bound':>10s}")
    print(header)
    print("-" * len(header))
    compared = no_slower = 0
    for row in tessera["plans"]:
        peer = torch_rows.get(key(row), {})
        pair = f"{row['src']} -> {row['dst']}"
        t_ok, p_ok = row.get("status") in ("ok", "partial"), peer.get("status") == "ok"
        p_first = f"{peer['first_ms']:11.3f}" if p_ok else f"{peer.get('status', 'missing'):>11s}"
        p_median = f"{peer['median_ms']:9.3f}" if p_ok else f"{'':9s}"
        if t_ok:
            t_first, t_median = f"{row['first_ms']:11.3f}", f"{row.get('median_ms', row['first_ms']):9.3f}"
        else:
            t_first = f"> {cap_ms:.0f}".rjust(11) if row.get("status") == "stopped" else f"{row.get('status'):>11s}"
            t_median = f"{'':9s}"
        ratio = ""
        if p_ok and t_ok:
            value = peer["median_ms"] / row.get("median_ms", row["first_ms"])
            ratio = f"{value:.2f}x" if value >= 0.01 else f"{value:.0e}x"
            compared += 1
            no_slower += value >= 1
        elif p_ok and row.get("status") == "stopped":
            ratio = f"<{peer['median_ms'] / cap_ms:.0e}x"
        steps = f"{row.get('steps', '-')}/{peer.get('collectives', '-')}"
        recv = f"{row['ratio']:.2f}" if "ratio" in row else "n/a"
        print(f"{'x'.join(map(str, row['mesh'])):12s} {row['tensor']:7s} {pair:52s} {t_first} {t_median} {p_first}"
              f" {p_median} {ratio:>8s} {steps:>10s} {recv:>10s}")
    unplanned = sum(1 for row in tessera["plans"] if row.get("status") not in ("ok", "partial"))
    print(f"\nTessera no slower than PyTorch (median) on {no_slower} of {compared} pairs both planned; {unplanned} of"
          f" {len(tessera['plans'])} Tessera cases stopped at the {tessera['cap_s']:g} s cap, skipped after one, or"
          f" failed.\n(steps T/P: Tessera's plan steps / PyTorch's collectives after merging; recv/bound: Tessera's"
          f" busiest rank's bytes over the lower bound.)")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tessera", help="the tessera_train_bench binary (the training table; needed unless only "
                        "--plan-scale is given)")
    parser.add_argument("--python", required=True, help="the venv's python with torch and jax")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--setups", default=",".join(SETUPS))
    parser.add_argument("--dispatch", help="the tessera_dispatch_bench binary: also compare DTensor op-dispatch "
                        "overhead with torch_dispatch.py (a second table)")
    parser.add_argument("--plan-scale", help="the tessera_plan_scale_bench binary: also compare the redistribute "
                        "planners at scale with torch_planner.py (a third table)")
    parser.add_argument("--plan-max-ranks", type=int, default=16384, help="largest mesh of the planner table")
    parser.add_argument("--plan-cap-s", type=float, default=2.0,
                        help="a first plan slower than this skips the pair's larger meshes (both sides)")
    parser.add_argument("--plan-cpu-time", action="store_true",
                        help="time both planners by their thread's CPU time (a machine busy with other work)")
    args = parser.parse_args()
    if not args.tessera and not args.plan_scale:
        parser.error("give --tessera (the training table), --plan-scale, or both")
    if args.tessera:
        training_table(args)
    if args.dispatch:
        dispatch_table(args)
    if args.plan_scale:
        plan_scale_table(args)


def training_table(args):
    setups = args.setups.split(",")
    systems = {
        "Tessera": lambda s: [args.tessera, "--setup", s, "--steps", str(args.steps)],
        "PyTorch": lambda s: [args.python, os.path.join(HERE, "torch_lm.py"), "--setup", s, "--steps",
                              str(args.steps), "--warmup", "2"],
        "JAX (jit)": lambda s: [args.python, os.path.join(HERE, "jax_lm.py"), "--setup", s, "--steps",
                                str(args.steps), "--warmup", "2"],
    }
    times = {(system, s): [] for system in systems for s in setups}
    memory = {(system, s): [] for system in systems for s in setups}
    per_rank = {s: [] for s in setups}  # Tessera's memory_stats: the largest rank's peak of live tensors
    floors = []  # Tessera's 1-rank step's matrix products alone (tessera_train_bench --setup floor)
    for r in range(args.rounds):
        result = run([args.tessera, "--setup", "floor", "--steps", str(args.steps)])
        if result is not None:
            floors.append(result[0])
        print(f"round {r + 1} floor    Tessera    {result[0] if result else 'failed'}", file=sys.stderr)
        for s in setups:
            base, threads = split_setup(s)
            for system, command in systems.items():
                result = run(command(base), threads)
                ms = result[0] if result else None
                if result is not None:
                    times[(system, s)].append(result[0])
                    if result[1] is not None:
                        memory[(system, s)].append(result[1])
                    if result[2] is not None:
                        per_rank[s].append(result[2])
                print(f"round {r + 1} {s:8s} {system:10s} {ms if ms is not None else 'failed'}", file=sys.stderr)

    def median(system, s):
        values = times[(system, s)]
        return statistics.median(values) if values else float("nan")

    print(f"\nTraining step (ms), median of {args.rounds} interleaved rounds, one intra-op thread per rank "
          "unless the setup says otherwise:\n")
    header = f"{'setup':24s} {'Tessera':>9s} {'PyTorch':>9s} {'JAX jit':>9s} {'PyTorch/Tessera':>16s} {'JAX/Tessera':>12s}"
    print(header)
    print("-" * len(header))
    for s in setups:
        t, p, j = median("Tessera", s), median("PyTorch", s), median("JAX (jit)", s)
        print(f"{LABELS.get(s, s):24s} {t:9.1f} {p:9.1f} {j:9.1f} {p / t:15.2f}x {j / t:11.2f}x")
    print("\n(> 1x: Tessera is faster. 4-rank setups share this machine's cores.)")
    if "1rank" in setups and floors:
        floor, step = statistics.median(floors), median("Tessera", "1rank")
        print(f"\nTessera's 1-rank step against its sgemm-bound floor (the step's matrix products alone, back to"
              f" back:\ntessera_train_bench --setup floor): {step:.1f} / {floor:.1f} ms = {step / floor:.2f}x")
    print("\nPeak resident memory of all ranks together (MiB; Tessera's and JAX's ranks share one process,"
          " PyTorch's are 4 processes, each with its own copy of the runtime):\n")
    print(f"{'setup':24s} {'Tessera':>9s} {'PyTorch':>9s} {'JAX jit':>9s}")
    for s in setups:
        row = [statistics.median(memory[(system, s)]) if memory[(system, s)] else float("nan") for system in systems]
        print(f"{LABELS.get(s, s):24s} {row[0]:9.0f} {row[1]:9.0f} {row[2]:9.0f}")
    print("\nTessera's tensor memory per rank (MiB; the largest rank's peak of live tensors during the steps,"
          " memory_stats):\n")
    for s in setups:
        value = statistics.median(per_rank[s]) if per_rank[s] else float("nan")
        print(f"{LABELS.get(s, s):24s} {value:9.1f}")


if __name__ == "__main__":
    main()
