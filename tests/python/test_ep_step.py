"""An expert-parallel MoE step across ranks on the CPU: dispatch -> fp4moe -> combine, and the
PCIe mode (all-gather, the shard, all-reduce: test_pcie_mode_equals_whole_layer).

R ranks are R processes (spawned); queues between them stand in for the communication
library's all-to-all (NCCL EP / DeepEP: what fp4moe never does itself). Every rank holds the
same random layer's shard of E / R experts (Layer(first_expert, n_local)) and T_r tokens of
its own. A step, as an EP engine runs it:
  1. route: the shard's own router on the rank's tokens (the router is global; ids global);
  2. dispatch: each (token, slot) row to the rank that holds its expert, in the low-latency
     layout (expert-major [n_local][capacity][hidden] with counts) or the high-throughput one
     (rows contiguous by expert, offsets), built from what arrived, source ranks in order;
  3. the rank's layer on the dispatched rows (run_dispatched), weights left to the combine;
  4. combine: rows back to their token's rank, summed there per token in ascending slot
     order, weight x row in float32 (what the layer's own finalize does).
Oracle: the whole layer (every expert, one process) on the rank's tokens. The combined output
must equal it bit for bit: FP32 on both sides, the same products, the same order (summing the
slots in descending order instead fails it by ~2e-6).
"""
import multiprocessing as mp
import os

import numpy as np
import pytest

import fp4moe

R, E, K, H, I = 3, 12, 4, 64, 32
NL = E // R


def _layer_parts(seed):
    rng = np.random.default_rng(seed)
    cfg = fp4moe.MoEConfig(n_experts=E, top_k=K, hidden=H, inter=I, score="sigmoid", renormalize=True,
                           routed_scale=2.5)
    router = (rng.standard_normal((E, H)) / np.sqrt(H)).astype(np.float32)
    w13 = (rng.standard_normal((E, 2 * I, H)) * 0.2).astype(np.float32)
    w2 = (rng.standard_normal((E, H, I)) * 0.2).astype(np.float32)
    bias = (rng.standard_normal(E) * 0.1).astype(np.float32)
    return cfg, fp4moe.MoEWeights.quantize(cfg, router, w13, w2, router_bias=bias)


def _tokens(seed, rank):
    rng = np.random.default_rng(seed * 31 + rank)
    T = 5 + 3 * rank
    return (rng.standard_normal((T, H)).astype(np.float32) * 1.5)


def _shard_weights(W, r):
    """The weights of experts [r * NL, (r + 1) * NL), router global."""
    sl = slice(r * NL, (r + 1) * NL)
    return fp4moe.MoEWeights(router_w=W.router_w, router_bias=W.router_bias, w13_data=W.w13_data[sl],
                             w13_scales=W.w13_scales[sl], w13_global=W.w13_global[sl], w2_data=W.w2_data[sl],
                             w2_scales=W.w2_scales[sl], w2_global=W.w2_global[sl])


def _rank(r, seed, layout, inboxes, backboxes, results):
    cfg, W = _layer_parts(seed)
    x = _tokens(seed, r)
    T = x.shape[0]
    with fp4moe.Layer(cfg, _shard_weights(W, r), backend="cpu", max_tokens=R * 16, first_expert=r * NL,
                      n_local=NL) as layer:
        _, ids, wts = layer.run(x, return_routing=True)  # 1. routing (global ids)
        # 2. dispatch: to each rank, its (token, slot, expert) rows
        for q in range(R):
            sel = [(t, j, int(ids[t, j])) for t in range(T) for j in range(K)
                   if q * NL <= ids[t, j] < (q + 1) * NL]
            rows = np.stack([x[t] for t, _, _ in sel]) if sel else np.zeros((0, H), np.float32)
            inboxes[q].put(("dispatch", r, sel, rows))
        got = sorted((inboxes[r].get(timeout=120) for _ in range(R)), key=lambda m: m[1])
        # received rows, source ranks in order, then the order each source sent them
        recv = [(src, t, j, e, row) for _, src, sel, rows in got for (t, j, e), row in zip(sel, rows)]
        counts = np.zeros(NL, np.int32)
        for _, _, _, e, _ in recv:
            counts[e - r * NL] += 1
        fill = np.zeros(NL, np.int64)
        where = []
        if layout == "expert-major":
            cap = max(1, int(counts.max()))
            xd = np.zeros((NL, cap, H), np.float32)
            for src, t, j, e, row in recv:
                le = e - r * NL
                xd[le, fill[le]] = row
                where.append((src, t, j, (le, int(fill[le]))))
                fill[le] += 1
            y = layer.run_dispatched(xd, counts=counts)  # 3.
        else:
            offs = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
            xd = np.zeros((max(1, int(offs[-1])), H), np.float32)
            for src, t, j, e, row in recv:
                le = e - r * NL
                i = int(offs[le] + fill[le])
                xd[i] = row
                where.append((src, t, j, (i,)))
                fill[le] += 1
            xd = xd[: int(offs[-1])] if offs[-1] else xd[:0]
            y = layer.run_dispatched(xd, offsets=offs) if offs[-1] else np.zeros((0, H), np.float32)
        # 4. combine: each row back to its token's rank
        for q in range(R):
            back = [(t, j, y[pos]) for src, t, j, pos in where if src == q]
            backboxes[q].put(("combine", r, back))  # its own queues: a fast rank may combine before a slow one
        parts = [backboxes[r].get(timeout=120) for _ in range(R)]  # has read its dispatch
    rows = {(t, j): yr for _, _, back in parts for t, j, yr in back}
    out = np.zeros((T, H), np.float32)
    for t in range(T):
        for j in range(K):
            if (t, j) in rows:
                out[t] += np.float32(wts[t, j]) * rows[(t, j)]
    with fp4moe.Layer(cfg, W, backend="cpu", max_tokens=64) as whole:
        want = whole.run(x, topk_ids=ids, topk_weights=wts)
    results.put((r, out, want, counts.tolist()))


@pytest.mark.parametrize("layout", ["expert-major", "expert-rows"])
def test_ep_step_equals_whole_layer(layout):
    seed = int(os.environ.get("FM_SEED", np.random.SeedSequence().entropy % 2**31))
    print(f"FM_SEED={seed}")
    ctx = mp.get_context("spawn")
    inboxes = [ctx.Queue() for _ in range(R)]
    backboxes = [ctx.Queue() for _ in range(R)]
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, seed, layout, inboxes, backboxes, results)) for r in range(R)]
    for p in procs:
        p.start()
    got = {}
    try:
        for _ in range(R):
            r, out, want, counts = results.get(timeout=180)
            got[r] = (out, want, counts)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    for r in range(R):
        out, want, counts = got[r]
        assert np.isfinite(out).all()
        assert sum(counts) > 0
        if not np.array_equal(out, want):
            d = np.abs(out.astype(np.float64) - want).max()
            pytest.fail(f"rank {r} ({layout}): the EP step differs from the whole layer (max |diff| {d:.3g}); "
                        f"rows received per local expert {counts}")


def test_run_dispatched_arguments():
    cfg, W = _layer_parts(7)
    with fp4moe.Layer(cfg, _shard_weights(W, 1), backend="cpu", max_tokens=8, first_expert=NL, n_local=NL) as layer:
        x = np.zeros((NL, 2, H), np.float32)
        with pytest.raises(ValueError, match="one of them"):
            layer.run_dispatched(x, counts=np.zeros(NL, np.int32), offsets=np.zeros(NL + 1, np.int32))
        with pytest.raises(ValueError, match="capacity"):
            layer.run_dispatched(x[0], counts=np.zeros(NL, np.int32))
        bad = np.array([3] + [0] * (NL - 1), np.int32)  # 3 rows in a capacity of 2
        with pytest.raises(fp4moe.Error, match="capacity"):
            layer.run_dispatched(x, counts=bad)
        # offsets past the rows x holds: refused (the rows of x bound the call), never read
        xr = np.ones((3, H), np.float32)
        off = np.array([0] * NL + [5], np.int32)
        out = np.full((3, H), 7.0, np.float32)
        with pytest.raises(fp4moe.Error, match="max_rows = 3"):
            layer.run_dispatched(xr, offsets=off, out=out)
        assert (out == 7.0).all()  # the caller's buffer untouched
        off[-1] = 3
        assert np.isfinite(layer.run_dispatched(xr, offsets=off)).all()  # exactly the rows x holds: runs
        with pytest.raises(fp4moe.Error, match="W4A8"):  # FP8 rows need a W4A8 layer
            layer.run_dispatched(np.zeros((NL, 2, H), np.uint8), counts=np.ones(NL, np.int32),
                                 x_scales=np.ones((NL, 2, 1), np.float32))


def _rank_pcie(r, seed, inboxes, results):
    """The PCIe mode (no all-to-all): all-gather the batch, the rank's shard on all of it,
    all-reduce the partial sums (rank order)."""
    cfg, W = _layer_parts(seed)
    x = _tokens(seed, r)
    for q in range(R):
        inboxes[q].put((r, x))
    batch = np.concatenate([m[1] for m in sorted((inboxes[r].get(timeout=120) for _ in range(R)),
                                                 key=lambda m: m[0])])
    with fp4moe.Layer(cfg, _shard_weights(W, r), backend="cpu", max_tokens=R * 16, first_expert=r * NL,
                      n_local=NL) as layer:
        results.put((r, layer.run(batch)))


def test_pcie_mode_equals_whole_layer():
    """What 8 PCIe GPUs run instead of an all-to-all: the shards' partial sums, all-reduced,
    equal the whole layer up to the FP32 order of the sum (NMSE <= 1e-11; a missing or doubled
    shard gives ~1e-1)."""
    seed = int(os.environ.get("FM_SEED", np.random.SeedSequence().entropy % 2**31))
    print(f"FM_SEED={seed}")
    ctx = mp.get_context("spawn")
    inboxes, results = [ctx.Queue() for _ in range(R)], ctx.Queue()
    procs = [ctx.Process(target=_rank_pcie, args=(r, seed, inboxes, results)) for r in range(R)]
    for p in procs:
        p.start()
    parts = {}
    try:
        for _ in range(R):
            r, y = results.get(timeout=180)
            parts[r] = y.astype(np.float64)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs)
    total = sum(parts[r] for r in range(R))  # the all-reduce
    cfg, W = _layer_parts(seed)
    batch = np.concatenate([_tokens(seed, r) for r in range(R)])
    with fp4moe.Layer(cfg, W, backend="cpu", max_tokens=R * 16) as whole:
        want = whole.run(batch).astype(np.float64)
    e = float(((total - want) ** 2).sum() / (want ** 2).sum())
    assert np.isfinite(total).all() and e <= 1e-11, f"all-reduced shards vs the whole layer: NMSE {e:.3g}"
