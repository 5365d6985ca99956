"""PyTorch peer of Tessera's tessera_plan_scale_bench: DTensor's redistribute planner at scale.

python torch_planner.py [--max-ranks 16384] [--mesh 8x8x8 ...] [--ndims 1,2] [--tensors even,uneven]
                        [--family "P -> R"] [--repeats 5] [--cap-s 2] [--min-cost] [--json PATH]
prints one JSON object on stdout (the last line):
  {"torch": version, "rows": [{"mesh", "ranks", "tensor", "family", "src", "dst", "first_ms",
   "median_ms", "steps", "collectives", "status"}, ...]}
and a line per case on stderr.

The pairs, meshes and tensor shapes are bench/peers/plan_pairs.json, the file Tessera's bench
reads, so both sides plan the same cases. Per mesh, a fake process group of as many ranks
(torch.testing._internal.distributed.fake_pg: FakeStore, init_process_group("fake")) and a
DeviceMesh of that shape on it, rank 0 the caller; no data, no communication.

What is timed is what DTensor's redistribute does to plan a move (torch 2.15,
torch/distributed/tensor/_redistribute.py, redistribute_local_tensor):
_gen_transform_infos_non_cached(src, dst) (the planner under its @cache; greedy unless a shard
order asks for the graph search, or --min-cost) followed by _optimize_transform_infos (merging
consecutive collectives of one kind into one over a flattened mesh, where one exists).
- first_ms: the first plan of the pair, with DTensor's planner cache (one planner object per mesh
  and tensor metadata, get_redistribute_planner) cleared first: a miss in a fresh process.
- median_ms: the median of --repeats more, the planner object cached as it is in use after the
  first redistribute on that mesh; the per-spec @cache is bypassed, as a new pair misses it.
steps: the transform infos the planner returns; collectives: those left after
_optimize_transform_infos that move data (src != dst on a mesh dim of more than one rank).
"""
import argparse
import json
import logging
import os
import re
import statistics
import sys
import time
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch starts its pools

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor import _redistribute as redistribute
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.testing._internal.distributed.fake_pg import FakeStore

HERE = os.path.dirname(os.path.abspath(__file__))
PAIRS = os.path.join(HERE, "plan_pairs.json")
DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "f16": torch.float16}


def parse_placements(text):
    """Tessera's text form, "(S(0), R, P)" or "S(0)", as torch placements."""
    out = []
    for token in re.findall(r"S\(-?\d+\)|R|P(?:\(\w+\))?", text):
        if token == "R":
            out.append(Replicate())
        elif token.startswith("S"):
            out.append(Shard(int(token[2:-1])))
        else:
            op = token[2:-1] if "(" in token else "sum"
            out.append(Partial(op))
    if not out:
        raise ValueError(f"no placements in {text!r}")
    return tuple(out)


def mesh_text(shape):
    return "x".join(str(s) for s in shape)


def load_cases(args):
    """(config, meshes): the file's meshes that pass the filters, by mesh dims then size."""
    with open(args.pairs) as f:
        config = json.load(f)
    for name in args.tensors:
        if name not in config["tensors"]:
            raise SystemExit(f"unknown tensor {name!r}; expected one of {sorted(config['tensors'])}")
    meshes = [m for m in config["meshes"]
              if (not args.mesh or mesh_text(m) in args.mesh) and (not args.ndims or len(m) in args.ndims)
              and prod(m) <= args.max_ranks]
    meshes.sort(key=lambda m: (len(m), prod(m)))
    return config, meshes


def prod(values):
    out = 1
    for v in values:
        out *= v
    return out


def spec(mesh, placements, shape, dtype):
    stride, step = [], 1
    for size in reversed(shape):  # contiguous
        stride.insert(0, step)
        step *= size
    meta = TensorMeta(torch.Size(shape), tuple(stride), dtype)
    return DTensorSpec(mesh, placements, tensor_meta=meta)


def plan_once(src, dst, mesh, min_cost):
    infos = redistribute._gen_transform_infos_non_cached(src, dst, True if min_cost else None)
    merged = redistribute._optimize_transform_infos(infos, mesh, src.placements, dst.placements)
    return infos, merged


def moving(transform, mesh):
    current, target = transform.src_dst_placements
    size = getattr(transform, "mesh", mesh).size(mesh_dim=transform.mesh_dim)
    return current != target and size > 1


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", default=PAIRS)
    parser.add_argument("--max-ranks", type=int, default=16384)
    parser.add_argument("--mesh", action="append", default=[], help="only this mesh, e.g. 8x8x8 (repeatable)")
    parser.add_argument("--ndims", type=lambda t: [int(x) for x in t.split(",")], default=[])
    parser.add_argument("--tensors", type=lambda t: t.split(","), default=["even", "uneven"])
    parser.add_argument("--family", default="")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cap-s", type=float, default=2.0,
                        help="a first plan over this skips the pair's larger meshes")
    parser.add_argument("--min-cost", action="store_true",
                        help="the graph-based (min-cost) planner instead of DTensor's default greedy one")
    parser.add_argument("--json", help="also write the result here")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time plans by this thread's CPU time (time.thread_time), as a busy machine needs")
    args = parser.parse_args()
    clock = time.thread_time if args.cpu_time else time.perf_counter
    torch.set_num_threads(1)
    # _optimize_transform_infos warns (once per mesh and dims) where no flattened mesh lets it merge.
    warnings.filterwarnings("ignore")
    logging.getLogger(redistribute.__name__).setLevel(logging.ERROR)
    config, meshes = load_cases(args)
    dtype = DTYPES[config["dtype"]]
    rows, slow = [], set()
    for shape in meshes:
        ranks = prod(shape)
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=ranks)
        try:
            t0 = time.perf_counter()
            mesh = init_device_mesh("cpu", tuple(shape), mesh_dim_names=tuple("abcdef"[:len(shape)]))
            setup_ms = (time.perf_counter() - t0) * 1e3
            for tensor in args.tensors:
                tshape = config["tensors"][tensor]
                for index, pair in enumerate(config["pairs"]):
                    src_p, dst_p = parse_placements(pair["src"]), parse_placements(pair["dst"])
                    if len(src_p) != len(shape) or (args.family and pair["family"] != args.family):
                        continue
                    row = {"mesh": shape, "ranks": ranks, "tensor": tensor, "family": pair["family"],
                           "src": pair["src"], "dst": pair["dst"], "mesh_setup_ms": setup_ms}
                    key = (index, tensor)
                    if key in slow:
                        row["status"] = "skipped"
                        rows.append(row)
                        continue
                    try:
                        src, dst = spec(mesh, src_p, tshape, dtype), spec(mesh, dst_p, tshape, dtype)
                        redistribute.clear_redistribute_planner_cache()
                        redistribute._gen_transform_infos.cache_clear()
                        t0 = clock()
                        infos, merged = plan_once(src, dst, mesh, args.min_cost)
                        first = (clock() - t0) * 1e3
                        times, spent = [], 0.0
                        for _ in range(args.repeats):
                            if spent > args.cap_s * 1e3:
                                break
                            t0 = clock()
                            plan_once(src, dst, mesh, args.min_cost)
                            times.append((clock() - t0) * 1e3)
                            spent += times[-1]
                        row.update(status="ok", first_ms=first,
                                   median_ms=statistics.median(times) if times else first, repeats=len(times),
                                   steps=len(infos), collectives=sum(moving(t, mesh) for t in merged))
                        if first > args.cap_s * 1e3:
                            slow.add(key)
                    except Exception as e:  # a pair torch cannot plan is reported, not fatal
                        row.update(status="error", error=f"{type(e).__name__}: {e}")
                    rows.append(row)
                    detail = (f"{row['first_ms']:9.3f} {row['median_ms']:9.3f} ms  steps {row['steps']}"
                              f" collectives {row['collectives']}" if row["status"] == "ok"
                              else row.get("error", row["status"]))
                    print(f"{mesh_text(shape):12s} {ranks:6d} {tensor:7s} {pair['src']} -> {pair['dst']}: {detail}",
                          file=sys.stderr)
        finally:
            dist.destroy_process_group()
    result = {"torch": torch.__version__, "planner": "min-cost" if args.min_cost else "default", "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
