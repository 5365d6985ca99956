"""PyTorch peer of Tessera's train_bench: one training step of the same 2-layer LM.

python torch_lm.py --setup {1rank,dp4,tp4,dp2xtp2} --steps N --warmup W
prints `setup=<name> step_ms=<median> peak_rss_mib=<all ranks>` on stdout; everything else goes to stderr.
"""
import argparse
import math
import os
import resource
import socket
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch starts its pools

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

VOCAB, DIM, HEADS, HIDDEN, MAX_SEQ, LAYERS, BATCH = 256, 128, 8, 512, 64, 2, 16


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = HEADS  # tensor parallel divides it by the tp size (q/k/v outputs are local head slices)
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape
        split = lambda t: t.view(b, s, self.heads, -1).transpose(1, 2)  # [b, s, h, 16] -> [b, h, s, 16]
        y = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)), is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(DIM, HIDDEN), nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))  # exact (erf) GELU, the default


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.RMSNorm(DIM, eps=1e-6), nn.RMSNorm(DIM, eps=1e-6)
        self.attn, self.mlp = Attention(), MLP()

    def forward(self, x):
        h = x + self.attn(self.norm1(x))
        return h + self.mlp(self.norm2(h))


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, DIM), nn.Embedding(MAX_SEQ, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.RMSNorm(DIM, eps=1e-6)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def batch():
    i = torch.arange(BATCH * MAX_SEQ)
    return ((i * 31 + 7) % VOCAB).view(BATCH, MAX_SEQ), ((i * 31 + 38) % VOCAB).view(BATCH, MAX_SEQ)


def tensor_parallel(model, tp_mesh):
    """The Megatron plan of Tessera's transformer_tp_plan() (no sequence parallelism)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {
        "tok": RowwiseParallel(input_layouts=Replicate()),
        # Vocabulary-sharded logits stay a DTensor for loss_parallel (never gathered, as in Tessera).
        "head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
    }
    for i in range(LAYERS):
        for name in ("attn.q", "attn.k", "attn.v", "mlp.fc1"):
            plan[f"blocks.{i}.{name}"] = ColwiseParallel()
        for name in ("attn.o", "mlp.fc2"):
            plan[f"blocks.{i}.{name}"] = RowwiseParallel()
        model.blocks[i].attn.heads = HEADS // tp_mesh.size()  # local heads, as in PyTorch's TP tutorial
    parallelize_module(model, tp_mesh, plan)


def clip_grad_norm(params, max_norm):
    """clip_grad_norm_ for grads that mix plain tensors and DTensors on different meshes, which
    torch's version cannot stack: sums the squares of each local shard and all-reduces them once
    per (mesh, sharded dims) group, like Tessera's one all_reduce per mesh."""
    from torch.distributed.tensor import DTensor

    sums = {}
    for p in params:
        g, key = p.grad, None
        if isinstance(g, DTensor):
            # Not replicated: split (Shard, or FSDP's _StridedShard, for which is_shard() is False)
            # or partial; either way the squares add up over that mesh dim.
            dims = tuple(d for d, pl in enumerate(g.placements) if not pl.is_replicate())
            key = (g.device_mesh, dims) if dims else None
            g = g.to_local()
        sums[key] = sums.get(key, 0.0) + g.pow(2).sum()
    total = torch.zeros(())
    for key, sq in sums.items():
        if key is not None:
            mesh, dims = key
            # One sharded dim: its sub-group; every dim of a mesh that spans the world: the world.
            assert len(dims) == 1 or (len(dims) == mesh.ndim and mesh.size() == dist.get_world_size())
            dist.all_reduce(sq, group=mesh.get_group(dims[0]) if len(dims) == 1 else None)
        total += sq
    coef = min(1.0, max_norm / (math.sqrt(total.item()) + 1e-6))
    for p in params:
        p.grad.mul_(coef)


def worker(rank, setup, steps, warmup, world, port):
    torch.set_num_threads(int(os.environ.get("PEERS_THREADS", "1")))  # intra-op threads per rank
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(1)  # the same init on every rank
    model = LM()
    ids, targets = batch()
    loss_ctx = None
    if setup == "dp4":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model)
        rows = BATCH // world
        ids, targets = ids[rank * rows:(rank + 1) * rows], targets[rank * rows:(rank + 1) * rows]
    elif setup in ("tp4", "dp2xtp2"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import loss_parallel

        loss_ctx = loss_parallel
        if setup == "tp4":
            tensor_parallel(model, init_device_mesh("cpu", (world,), mesh_dim_names=("tp",)))
        else:
            try:
                from torch.distributed.fsdp import fully_shard
            except ImportError:  # before 2.6
                from torch.distributed._composable.fsdp import fully_shard
            mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
            tensor_parallel(model, mesh["tp"])
            for block in model.blocks:
                fully_shard(block, mesh=mesh["dp"])
            fully_shard(model, mesh=mesh["dp"])
            dp = mesh["dp"].get_local_rank()
            rows = BATCH // 2
            ids, targets = ids[dp * rows:(dp + 1) * rows], targets[dp * rows:(dp + 1) * rows]
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)

    times = []
    for step in range(warmup + steps):
        if world > 1:
            dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        if loss_ctx is None:
            loss = F.cross_entropy(model(ids).flatten(0, 1), targets.flatten())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
        else:
            with loss_ctx():  # cross-entropy on vocabulary-sharded logits; backward must run inside too
                loss = F.cross_entropy(model(ids).flatten(0, 1), targets.flatten())
                loss.backward()
            clip_grad_norm(params, 1.0)
        optimizer.step()
        elapsed = time.perf_counter() - start
        if step >= warmup:
            times.append(elapsed * 1e3)
        if rank == 0 and step in (0, warmup + steps - 1):
            value = loss.full_tensor() if hasattr(loss, "full_tensor") else loss
            print(f"[torch {setup}] step {step} loss {value.item():.4f}", file=sys.stderr)
    # Peak resident memory of all ranks together (each rank is a process): MiB.
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(rss)
    if rank == 0:
        print(f"setup={setup} step_ms={statistics.median(times):.2f} peak_rss_mib={rss.item():.0f}", flush=True)
    if world > 1:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--setup", choices=["1rank", "dp4", "tp4", "dp2xtp2"], required=True)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    a = parser.parse_args()
    if a.setup == "1rank":
        worker(0, a.setup, a.steps, a.warmup, 1, 0)
    else:
        import torch.multiprocessing as mp

        mp.spawn(worker, args=(a.setup, a.steps, a.warmup, 4, free_port()), nprocs=4)


if __name__ == "__main__":
    main()
