"""PyTorch peer of Tessera's dispatch_bench: what a DTensor op costs beyond the local op it runs.

python torch_dispatch.py [--iters 2000]
prints one JSON object on stdout:
  {"rows": [{"op", "local_ns", "hit_ns", "overhead_ns", "collectives", ...}, ...], "torch": version, ...}
everything else goes to stderr.

The same four ops as bench/dispatch_bench.cpp, on a 1-d DeviceMesh("cpu", [0, 1, 2, 3]), with the
inputs already where the op wants them (no communication):

   add       [64, 64] Shard(0) + [64, 64] Shard(0)
   matmul    [64, 32] Shard(0) @ [32, 16] Replicate
   softmax   [64, 64] Shard(0), dim 1
   reshape   [64, 64] Shard(0) -> [4096]            (DTensor.reshape)

Per op: local = the same torch op on this rank's shards; hit = the DTensor op, warmed by a few
calls so DTensor's sharding-propagation cache holds the decision; overhead = hit - local.
Timing as in Tessera: the median of 7 repetitions of the per-iteration mean (perf_counter_ns),
on rank 0, with a barrier before every repetition; local and hit repetitions alternate; every rank
runs the same loops. Each rank is a process (torch.multiprocessing spawn, gloo over 127.0.0.1)
with one intra-op thread. "collectives" is CommDebugMode's count of collectives in one DTensor
call (0: the op ran without communication); "redistribute_calls" counts DTensor's redistribute step
in that call (torch 2.15 takes it for reshape, only to rewrite the view's size to the local shape).
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch starts its pools

import torch
import torch.distributed as dist

from torch_lm import free_port  # the same loopback port picking (this folder is on sys.path)

REPETITIONS = 7
WORLD = 4
WARMUP_CALLS = 10


def mean_ns(iters, op):
    """One repetition: the mean ns per call of op over iters calls, every rank starting together.
    Returns (wall, this thread's CPU time)."""
    dist.barrier()
    c0 = time.thread_time_ns()
    t0 = time.perf_counter_ns()
    for _ in range(iters):
        op()
    t1 = time.perf_counter_ns()
    return (t1 - t0) / iters, (time.thread_time_ns() - c0) / iters


@contextlib.contextmanager
def redistribute_spy():
    """Counts DTensor's redistribute step (OpDispatcher.redistribute_local_args, a private API)
    while active: calls, input tensors whose placements it changes, and the rewritten schema.
    Yields an empty dict if torch no longer has that method."""
    found = {}
    try:
        from torch.distributed.tensor._dispatch import OpDispatcher
        original = OpDispatcher.__dict__["redistribute_local_args"]
    except (ImportError, KeyError):
        yield found
        return
    found.update(calls=0, tensors=0, schema=None)

    def spy(op_info, schema, *rest):
        found["calls"] += 1
        found["tensors"] += sum(
            1 for old, new in zip(op_info.flat_args_schema, schema.args_schema)
            if hasattr(old, "placements") and old != new)
        found["schema"] = f"{op_info.schema} -> {schema}"
        return original.__func__(op_info, schema, *rest)

    OpDispatcher.redistribute_local_args = staticmethod(spy)
    try:
        yield found
    finally:
        OpDispatcher.redistribute_local_args = original


def worker(rank, iters, port):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode

    mesh = DeviceMesh("cpu", list(range(WORLD)))
    torch.manual_seed(0)  # the same global tensors on every rank
    a = distribute_tensor(torch.rand(64, 64), mesh, [Shard(0)])
    b = distribute_tensor(torch.rand(64, 64), mesh, [Shard(0)])
    m = distribute_tensor(torch.rand(64, 32), mesh, [Shard(0)])
    w = distribute_tensor(torch.rand(32, 16), mesh, [Replicate()])
    la, lb, lm, lw = a.to_local(), b.to_local(), m.to_local(), w.to_local()
    flat_local = la.numel()  # the local shard flattened, as the DTensor reshape does

    # Results are returned and dropped, so each call allocates and frees its output as in use.
    cases = [
        ("add", lambda: torch.add(la, lb), lambda: torch.add(a, b)),
        ("matmul", lambda: torch.matmul(lm, lw), lambda: torch.matmul(m, w)),
        ("softmax", lambda: torch.softmax(la, 1), lambda: torch.softmax(a, 1)),
        ("reshape", lambda: la.reshape(flat_local), lambda: a.reshape(64 * 64)),
    ]

    rows = []
    for name, local, dtensor in cases:
        # One call under CommDebugMode: does the op communicate (redistribute its inputs)?
        with CommDebugMode() as comm, redistribute_spy() as spy:
            out = dtensor()
        collectives = comm.get_total_counts()
        for _ in range(WARMUP_CALLS):  # fills the sharding-propagation cache
            dtensor()
        local_reps, hit_reps = [], []
        for _ in range(REPETITIONS):  # alternate, so both see the same machine
            local_reps.append(mean_ns(iters, local))
            hit_reps.append(mean_ns(iters, dtensor))
        local_ns, hit_ns = (statistics.median(r[0] for r in reps) for reps in (local_reps, hit_reps))
        local_cpu, hit_cpu = (statistics.median(r[1] for r in reps) for reps in (local_reps, hit_reps))
        lo = out.to_local()
        rows.append({
            "op": name,
            "local_ns": local_ns,
            "hit_ns": hit_ns,
            "overhead_ns": hit_ns - local_ns,
            # rank 0's thread CPU time per call: excludes time spent descheduled, which a loaded
            # machine (or 4 rank processes on fewer cores) adds to the wall-clock numbers above
            "local_cpu_ns": local_cpu,
            "hit_cpu_ns": hit_cpu,
            "overhead_cpu_ns": hit_cpu - local_cpu,
            "collectives": collectives,
            # DTensor's redistribute step in that call (None: torch's internals have moved).
            # reshape takes it only to rewrite the view's size [4096] to the local (1024,).
            "redistribute_calls": spy.get("calls"),
            "redistributed_tensors": spy.get("tensors"),
            "redistribute_schema": spy.get("schema"),
            "comm_counts": {str(k): v for k, v in comm.get_comm_counts().items()},
            "out_shape": list(out.shape),
            "out_placements": [str(p) for p in out.placements],
            "out_local_shape": list(lo.shape),
            # reshape: does the output share the input shard's storage (a view, no copy)?
            "out_aliases_input": name == "reshape" and lo.untyped_storage().data_ptr() == la.untyped_storage().data_ptr(),
        })
        if rank == 0:
            print(f"[torch_dispatch] {name:8s} local {local_ns:9.0f} ns  hit {hit_ns:9.0f} ns  "
                  f"overhead {hit_ns - local_ns:9.0f} ns (cpu {hit_cpu - local_cpu:7.0f})  collectives {collectives}  "
                  f"redistribute calls {spy.get('calls')} (tensors moved {spy.get('tensors')})  "
                  f"out {rows[-1]['out_placements']}", file=sys.stderr)
    if rank == 0:
        print(json.dumps({"rows": rows, "torch": torch.__version__, "ranks": WORLD, "iters": iters,
                          "repetitions": REPETITIONS, "backend": "gloo, one process per rank"}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=2000, help="calls per repetition, local and DTensor")
    a = parser.parse_args()
    import torch.multiprocessing as mp

    mp.spawn(worker, args=(a.iters, free_port()), nprocs=WORLD)


if __name__ == "__main__":
    main()
