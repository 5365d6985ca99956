"""JAX peer of Tessera's train_bench: one training step of the same 2-layer LM, as one jit.

python jax_lm.py --setup {1rank,dp4,tp4,dp2xtp2} --steps N --warmup W
prints `setup=<name> step_ms=<median> peak_rss_mib=<process>` on stdout; everything else goes to stderr.
"""
import argparse
import os
import resource
import statistics
import sys
import time

VOCAB, DIM, HEADS, HIDDEN, MAX_SEQ, LAYERS, BATCH = 256, 128, 8, 512, 64, 2, 16
MESHES = {"1rank": (1, 1), "dp4": (4, 1), "tp4": (1, 4), "dp2xtp2": (2, 2)}  # (dp, tp)


def parse():
    parser = argparse.ArgumentParser()
    parser.add_argument("--setup", choices=list(MESHES), required=True)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    return parser.parse_args()


args = parse()
# One thread per device (unless PEERS_THREADS > 1: XLA's thread pool over every core), and 4
# host devices for the 4-device setups: XLA reads these at import.
# intra_op_parallelism_threads=1 is no --flag: XLA stops parsing at it, so it must come last.
one_thread = int(os.environ.get("PEERS_THREADS", "1")) <= 1
flags = ["--xla_cpu_multi_thread_eigen=false"] if one_thread else []
if args.setup != "1rank":
    flags.append("--xla_force_host_platform_device_count=4")
if one_thread:
    flags.append("intra_op_parallelism_threads=1")
os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", "")] + flags).strip()
os.environ["JAX_PLATFORMS"] = "cpu"

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


def map_specs(f, *trees):
    return jax.tree.map(f, *trees, is_leaf=lambda x: isinstance(x, P))


def init(key):
    """Parameters in torch's layouts ([out, in] weights) with torch's default init distributions,
    each paired with its tensor-parallel spec (Tessera's transformer_tp_plan)."""
    keys = iter(jax.random.split(key, 64))
    uniform = lambda shape, fan_in: jax.random.uniform(next(keys), shape, jnp.float32, -1, 1) / np.sqrt(fan_in)

    def linear(n_in, n_out, style, bias=True):
        w_spec = P("tp", None) if style == "col" else P(None, "tp")  # col: out features split; row: in
        p = {"w": (uniform((n_out, n_in), n_in), w_spec)}
        if bias:
            p["b"] = (uniform((n_out,), n_in), P("tp") if style == "col" else P(None))
        return p

    norm = lambda: {"w": (jnp.ones((DIM,), jnp.float32), P(None))}
    blocks = [{
        "norm1": norm(), "norm2": norm(),
        "q": linear(DIM, DIM, "col"), "k": linear(DIM, DIM, "col"), "v": linear(DIM, DIM, "col"),
        "o": linear(DIM, DIM, "row"), "fc1": linear(DIM, HIDDEN, "col"), "fc2": linear(HIDDEN, DIM, "row"),
    } for _ in range(LAYERS)]
    return {
        "tok": {"w": (jax.random.normal(next(keys), (VOCAB, DIM)), P("tp", None))},  # vocabulary-parallel
        "pos": {"w": (jax.random.normal(next(keys), (MAX_SEQ, DIM)), P(None, None))},
        "blocks": blocks, "norm": norm(),
        "head": linear(DIM, VOCAB, "col", bias=False),  # vocabulary-split logits
    }


def fsdp(spec):
    """Tessera's fully_shard: dim 0 also split over dp, nested inside any tp split of dim 0."""
    first = spec[0] if len(spec) else None
    return P("dp" if first is None else (first, "dp"), *spec[1:])


def unzip(tree):
    is_pair = lambda x: isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], P)
    values = jax.tree.map(lambda pair: pair[0], tree, is_leaf=is_pair)
    specs = jax.tree.map(lambda pair: pair[1], tree, is_leaf=is_pair)
    return values, specs


def main():
    dp, tp = MESHES[args.setup]
    mesh = Mesh(np.array(jax.devices()[:dp * tp]).reshape(dp, tp), ("dp", "tp"))
    params, compute_specs = unzip(init(jax.random.key(1)))
    # Storage: FSDP-sharded over dp in the 2-D setup; dp4 replicates parameters (DDP).
    storage_specs = map_specs(fsdp, compute_specs) if args.setup == "dp2xtp2" else compute_specs
    sharding = lambda spec: NamedSharding(mesh, spec)
    constrain = lambda x, spec: jax.lax.with_sharding_constraint(x, sharding(spec))
    act = lambda *tail: P("dp", None, *tail)  # activations [b, s, ...]: batch over dp

    def rms_norm(x, w):
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * w

    def linear(x, p, out_spec):
        y = x @ p["w"].T + p["b"] if "b" in p else x @ p["w"].T
        return constrain(y, out_spec)

    def loss_fn(params, ids, targets):
        # All-gather FSDP shards back to the tensor-parallel layout at use (a no-op without FSDP);
        # the gradients come back reduce-scattered to the storage layout.
        params = map_specs(lambda x, spec: constrain(x, spec), params, compute_specs)
        b, s = ids.shape
        x = constrain(params["tok"]["w"][ids] + params["pos"]["w"][jnp.arange(s)], act(None))
        for p in params["blocks"]:
            h = rms_norm(x, p["norm1"]["w"])
            heads = lambda t: constrain(t.reshape(b, s, HEADS, DIM // HEADS), act("tp", None))  # heads over tp
            q, k, v = (heads(linear(h, p[n], act("tp"))) for n in "qkv")
            # Causal, scale 1/sqrt(16); [b, s, heads, head_dim] layout, so no transposes needed.
            y = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(b, s, DIM)
            x = x + linear(constrain(y, act("tp")), p["o"], act(None))
            h = jax.nn.gelu(linear(rms_norm(x, p["norm2"]["w"]), p["fc1"], act("tp")), approximate=False)
            x = x + linear(h, p["fc2"], act(None))
        logits = linear(rms_norm(x, params["norm"]["w"]), params["head"], act("tp"))
        # Cross-entropy on vocabulary-split logits: logsumexp and a one-hot sum reduce over the split
        # (like loss_parallel); gathering the target column would gather the logits.
        picked = jnp.sum(logits * jax.nn.one_hot(targets, VOCAB, dtype=logits.dtype), -1)
        return jnp.mean(jax.nn.logsumexp(logits, -1) - picked)

    def step(params, opt, ids, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, ids, targets)
        leaves = jax.tree.leaves(grads)
        norm = jnp.sqrt(sum(jnp.sum(g * g) for g in leaves))
        grads = jax.tree.map(lambda g: g * jnp.minimum(1.0, 1.0 / (norm + 1e-6)), grads)  # clip_grad_norm_(1.0)
        # AdamW as torch.optim.AdamW: decoupled decay, bias-corrected moments.
        lr, b1, b2, eps, wd = 1e-3, 0.9, 0.999, 1e-8, 0.01
        t = opt["t"] + 1
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, opt["m"], grads)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, opt["v"], grads)
        c1, c2 = 1 - b1 ** t, 1 - b2 ** t
        params = jax.tree.map(lambda p, m, v: p * (1 - lr * wd) - lr * (m / c1) / (jnp.sqrt(v / c2) + eps),
                              params, m, v)
        return params, {"m": m, "v": v, "t": t}, loss

    param_sh = map_specs(sharding, storage_specs)
    opt_sh = {"m": param_sh, "v": param_sh, "t": sharding(P())}
    data_sh = sharding(P("dp", None))
    params = jax.device_put(params, param_sh)
    zeros = lambda: jax.tree.map(jnp.zeros_like, params)  # m and v apart: both are donated
    opt = jax.device_put({"m": zeros(), "v": zeros(), "t": jnp.zeros((), jnp.float32)}, opt_sh)
    i = np.arange(BATCH * MAX_SEQ)
    ids = jax.device_put(((i * 31 + 7) % VOCAB).reshape(BATCH, MAX_SEQ).astype(np.int32), data_sh)
    targets = jax.device_put(((i * 31 + 38) % VOCAB).reshape(BATCH, MAX_SEQ).astype(np.int32), data_sh)
    train_step = jax.jit(step, in_shardings=(param_sh, opt_sh, data_sh, data_sh),
                         out_shardings=(param_sh, opt_sh, sharding(P())), donate_argnums=(0, 1))

    times = []
    total = args.warmup + args.steps
    for n in range(total):  # the first (warmup) step compiles
        start = time.perf_counter()
        params, opt, loss = train_step(params, opt, ids, targets)
        jax.block_until_ready((params, opt, loss))  # dispatch is async: the step ends when all devices do
        elapsed = time.perf_counter() - start
        if n >= args.warmup:
            times.append(elapsed * 1e3)
        if n in (0, total - 1):
            print(f"[jax {args.setup}] step {n} loss {float(loss):.4f}", file=sys.stderr)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # one process: every device
    print(f"setup={args.setup} step_ms={statistics.median(times):.2f} peak_rss_mib={peak_mib:.0f}", flush=True)


if __name__ == "__main__":
    main()
