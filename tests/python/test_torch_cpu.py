"""The torch ops on CPU tensors (the CPU backends): same numbers as the numpy
Layer, torch.compile(fullgraph=True) traces them, out= is written in place,
bad tensors raise naming the argument. Skips when torch is not installed."""

import threading

import numpy as np
import pytest

import fp4moe
import moe_ref
from conftest import closed, make_layer, make_x, race, reference

torch = pytest.importorskip("torch", reason="torch is not installed: the torch ops are not tested here")
from fp4moe.torch_ops import MoE  # noqa: E402


def bf16(bits):
    return torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16)


@pytest.fixture
def setup(rng):
    cfg, W, ref = make_layer(rng, "nvfp4", E=8, k=2)
    m = MoE(cfg, W, device="cpu", out_dtype=torch.float32, max_tokens=8)
    yield cfg, W, ref, m
    m.close()


def test_op_equals_reference(setup, rng):
    cfg, W, ref, m = setup
    bits, xf = make_x(rng, 5, cfg.hidden)
    y = m(bf16(bits))
    assert y.dtype == torch.float32 and y.shape == (5, cfg.hidden)
    want, margin = reference(cfg, ref, xf)
    assert margin > 1e-6 and torch.isfinite(y).all()
    assert moe_ref.nmse(y.numpy(), want) <= 1e-9
    out = torch.full((5, cfg.hidden), float("nan"))
    r = m(bf16(bits), out=out)
    assert r is out and torch.equal(out, y)


def test_compile_fullgraph(setup, rng):
    cfg, W, ref, m = setup
    x = bf16(make_x(rng, 4, cfg.hidden)[0])
    eager = m(x)

    def f(x):
        return m(x) * 2

    def g(x, out):
        m(x, out=out)
        return out + 1

    assert torch.equal(torch.compile(f, fullgraph=True)(x), eager * 2)
    out = torch.empty(4, cfg.hidden)
    r = torch.compile(g, fullgraph=True)(x, out)
    assert torch.equal(out, eager) and torch.equal(r, eager + 1)


def test_external_routing_and_bf16_out(rng):
    cfg, W, ref = make_layer(rng, "mxfp4", E=8, k=2)
    m = MoE(cfg, W, device="cpu", max_tokens=8)  # BF16 out
    T = 3
    bits, xf = make_x(rng, T, cfg.hidden)
    ids = torch.tensor([[0, 5], [7, -1], [3, 2]], dtype=torch.int32)
    w = torch.rand(T, 2)
    y = m(bf16(bits), ids, w)
    assert y.dtype == torch.bfloat16
    want, _ = reference(cfg, ref, xf, ids.numpy(), w.numpy())
    assert moe_ref.nmse(y.float().numpy(), want) <= 1e-5  # one BF16 rounding of the output: ~1.3e-6


def test_bad_tensors_raise(setup, rng):
    cfg, W, ref, m = setup
    x = bf16(make_x(rng, 2, cfg.hidden)[0])
    ids = torch.zeros(2, 2, dtype=torch.int32)
    wts = torch.ones(2, 2)
    cases = [
        ((x.float(),), "x: expected a contiguous torch.bfloat16"),
        ((x[:, :32],), r"x: expected .* \[T\]\[64\]"),
        ((torch.cat([x, x], 1)[:, ::2],), "non-contiguous"),
        ((x.view(-1)[1:].view(-1)[:2 * 63].view(2, 63),), "x: expected"),
        ((torch.zeros(9, cfg.hidden, dtype=torch.bfloat16),), r"T=9 outside \[1, max_tokens=8\]"),
        ((x, ids, None), "give both"),
        ((x, ids.long(), wts), "topk_ids: expected a contiguous torch.int32"),
        ((x, ids, wts.double()), "topk_weights: expected a contiguous torch.float32"),
        ((x, ids[:, :1], wts[:, :1]), r"topk_ids: expected .* \[2\]\[2\]"),
    ]
    for args, msg in cases:
        with pytest.raises(ValueError, match=msg):
            m(*args)
    out = torch.empty(2, cfg.hidden, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="out: expected a contiguous torch.float32"):
        m(x, out=out)
    with pytest.raises(ValueError, match="not 16-byte aligned"):
        big = torch.empty(2 * cfg.hidden + 1)
        m(x, out=big[1:].view(2, cfg.hidden))
    with pytest.raises(ValueError, match="is not the id of a live"):
        torch.ops.fp4moe.moe(123456, x)
    nan = x.clone()
    nan[0, 0] = float("nan")
    with pytest.raises(fp4moe.Error, match="FM_ERR_NONFINITE"):
        m(nan)


def test_from_modelopt_tensors(rng):
    """Weights as a ModelOpt checkpoint stores them: uint8 packed, float8_e4m3fn scales, FP32 globals."""
    cfg, W, ref = make_layer(rng, "nvfp4", E=4, k=2)
    I = cfg.inter
    experts = []
    for e in range(cfg.n_experts):
        def proj(d, s, g):
            return {"weight": torch.from_numpy(d.copy()),
                    "weight_scale": torch.from_numpy(s.copy()).view(torch.float8_e4m3fn),
                    "weight_scale_2": torch.tensor(g, dtype=torch.float32)}
        experts.append({"gate_proj": proj(W.w13_data[e, :I], W.w13_scales[e, :I], W.w13_global[e]),
                        "up_proj": proj(W.w13_data[e, I:], W.w13_scales[e, I:], W.w13_global[e]),
                        "down_proj": proj(W.w2_data[e], W.w2_scales[e], W.w2_global[e])})
    router = torch.from_numpy(W.router_w).to(torch.float32)
    m = MoE.from_modelopt_experts(cfg, router, experts, device="cpu", out_dtype=torch.float32, max_tokens=4)
    bits, xf = make_x(rng, 3, cfg.hidden)
    want, margin = reference(cfg, ref, xf)
    assert margin > 1e-6 and moe_ref.nmse(m(bf16(bits)).numpy(), want) <= 1e-9
    # the same tensors stacked, as engines hold them: the same layer
    st = MoE.from_modelopt(cfg, router, torch.from_numpy(W.w13_data), torch.from_numpy(W.w13_scales),
                           torch.from_numpy(W.w13_global), torch.from_numpy(W.w2_data),
                           torch.from_numpy(W.w2_scales), torch.from_numpy(W.w2_global), device="cpu",
                           out_dtype=torch.float32, max_tokens=4)
    assert torch.equal(st(bf16(bits)), m(bf16(bits)))
    # gate and up globals that differ: taken as they are (no block scale re-encoded), so
    # the layer is exactly the one whose up rows carry their own global, per expert and
    # stacked ([E][2]: gate, up) alike, and through the numpy layer (MoEWeights) too
    up = W.w13_global.copy()
    up[1], up[2] = W.w13_global[1] * 2.3, W.w13_global[2] * 0.37
    experts[1]["up_proj"]["weight_scale_2"] = torch.tensor(up[1])
    experts[2]["up_proj"]["weight_scale_2"] = torch.tensor(up[2])
    ref_up = dict(ref, w13=ref["w13"].copy())
    ref_up["w13"][:, I:] *= (up / W.w13_global)[:, None, None]
    want_up, margin = reference(cfg, ref_up, xf)
    r = MoE.from_modelopt_experts(cfg, router, experts, device="cpu", out_dtype=torch.float32, max_tokens=4)
    got = r(bf16(bits))
    assert margin > 1e-6 and moe_ref.nmse(got.numpy(), want_up) <= 1e-9
    assert moe_ref.nmse(m(bf16(bits)).numpy(), want_up) > 1e-3  # without them: another layer
    g2 = torch.from_numpy(np.stack([W.w13_global, up], 1))
    st = MoE.from_modelopt(cfg, router, torch.from_numpy(W.w13_data), torch.from_numpy(W.w13_scales), g2,
                           torch.from_numpy(W.w2_data), torch.from_numpy(W.w2_scales),
                           torch.from_numpy(W.w2_global), device="cpu", out_dtype=torch.float32, max_tokens=4)
    assert torch.equal(st(bf16(bits)), got)
    import dataclasses

    nw = dataclasses.replace(W, w13_global=np.stack([W.w13_global, up], 1).astype(np.float32))
    nm = MoE(cfg, nw, device="cpu", out_dtype=torch.float32, max_tokens=4)
    try:
        assert torch.equal(nm(bf16(bits)), got)
    finally:
        nm.close()
    for b in ("cpu", "cpu-ref"):
        with fp4moe.Layer(cfg, dataclasses.replace(W, w13_up_global=up), backend=b, max_tokens=4) as L:
            assert moe_ref.nmse(L.run(bits), want_up) <= 1e-9
    experts[1]["up_proj"]["weight_scale_2"] = torch.tensor(W.w13_global[1])
    experts[2]["up_proj"]["weight_scale_2"] = torch.tensor(W.w13_global[2])
    experts[2]["down_proj"]["weight"] = experts[2]["down_proj"]["weight"].to(torch.int32)
    with pytest.raises(fp4moe.Error, match=r"experts\.2\.down_proj\.weight' has dtype I32") as e:
        MoE.from_modelopt_experts(cfg, router, experts, device="cpu")
    assert e.value.status == "FM_ERR_FORMAT"


def test_from_gpt_oss(rng):
    """MoE.from_gpt_oss with tensors as a gpt-oss checkpoint stores them (interleaved gate_up
    rows and bias, router logit bias): the model's layer (softmax over the top-k biased
    logits, clamped SwiGLU, both biases) against the numpy oracle; a cfg without gpt-oss's
    activation is refused, naming it."""
    import dataclasses

    cfg, W, ref = make_layer(rng, "mxfp4", E=8, k=2)
    E, I, H = cfg.n_experts, cfg.inter, cfg.hidden
    cfg = dataclasses.replace(cfg, score="softmax-topk", activation="swiglu-gptoss", swiglu_limit=0.75)
    inter = lambda a: np.stack([a[:, :I], a[:, I:]], 2).reshape(a.shape[0], 2 * I, *a.shape[2:])  # noqa: E731
    gub, gus = inter(W.w13_data), inter(W.w13_scales)
    b13 = (rng.standard_normal((E, 2 * I)) * 0.5).astype(np.float32)
    b2 = (rng.standard_normal((E, H)) * 0.5).astype(np.float32)
    rb = (rng.standard_normal(E) * 0.5).astype(np.float32)
    T = torch.from_numpy
    m = MoE.from_gpt_oss(cfg, T(W.router_w), T(gub.reshape(E, 2 * I, H // 32, 16)), T(gus),
                         T(W.w2_data.reshape(E, H, I // 32, 16)), T(W.w2_scales), gate_up_proj_bias=T(inter(b13)),
                         down_proj_bias=T(b2).bfloat16().float(), router_bias=T(rb), device="cpu",
                         out_dtype=torch.float32, max_tokens=8)
    try:
        bits, xf = make_x(rng, 5, H)
        y = m(bf16(bits))
        logits = xf.astype(np.float64) @ ref["router"].astype(np.float64).T
        ids, w, margin = moe_ref.route(logits, "softmax-topk", 2, rb)
        b2r = T(b2).bfloat16().float().numpy()
        want = moe_ref.moe(xf, ref["w13"], ref["w2"], ids, w, I, b13=b13, b2=b2r, limit=0.75)
        assert margin > 1e-6 and torch.isfinite(y).all()
        assert moe_ref.nmse(y.numpy(), want) <= 1e-9
    finally:
        m.close()
    with pytest.raises(ValueError, match="cfg.activation: gpt-oss's experts are 'swiglu-gptoss'"):
        MoE.from_gpt_oss(dataclasses.replace(cfg, activation="swiglu", swiglu_limit=0.0), T(W.router_w),
                         T(gub.reshape(E, 2 * I, H // 32, 16)), T(gus), T(W.w2_data.reshape(E, H, I // 32, 16)),
                         T(W.w2_scales), device="cpu")


def test_run_args_packer_matches_the_struct():
    """The op writes fm_layer_run_args with one struct.pack_into (issue 18): each
    field lands where ctypes (checked against the library at import) reads it."""
    from fp4moe import _lib, torch_ops

    a = _lib.LayerRunArgs()
    names = [n for n, _ in _lib.LayerRunArgs._fields_]
    assert names == ["x", "T", "topk_ids", "topk_weights", "out", "workspace", "stream", "routed_ids",
                     "routed_weights"], "fm_layer_run_args changed: update the op's pack calls and this test"
    vals = (0x1000, 77, 0x2000, 0x3000, 0x4000, 0, 0x5000, 0x6000, 0x7000)
    torch_ops._pack_args(a, 0, *vals)
    assert tuple(getattr(a, n) for n in names) == (0x1000, 77, 0x2000, 0x3000, 0x4000, None, 0x5000, 0x6000,
                                                   0x7000)
    torch_ops._pack_args(a, 0, 0x10, 1, 0, 0, 0x20, 0, 0, 0, 0)
    assert tuple(getattr(a, n) for n in names) == (0x10, 1, None, None, 0x20, None, None, None, None)


@pytest.mark.parametrize("backend", ["cpu-ref", "cpu"])
def test_return_routing(rng, backend):
    """moe(x, return_routing=True) / torch.ops.fp4moe.moe_routed: the layer's own
    routing handed back with the output: the oracle's experts and weights per token,
    the oracle's output, and passed back as external routing the same output bit for
    bit; the op, the object and torch.compile agree."""
    cfg, W, ref = make_layer(rng, "nvfp4", E=16, k=4)
    T = 5
    bits, xf = make_x(rng, T, cfg.hidden)
    m = MoE(cfg, W, device="cpu", out_dtype=torch.float32, max_tokens=8, backend=backend)
    try:
        x = bf16(bits)
        y, ids, w = m(x, return_routing=True)
        assert y.dtype == torch.float32 and y.shape == (T, cfg.hidden) and torch.isfinite(y).all()
        assert ids.dtype == torch.int32 and w.dtype == torch.float32
        assert ids.shape == (T, cfg.top_k) and w.shape == (T, cfg.top_k)
        want, margin = reference(cfg, ref, xf)
        assert margin > 1e-6 and moe_ref.nmse(y.numpy(), want) <= 1e-9
        logits = xf.astype(np.float64) @ ref["router"].astype(np.float64).T
        rids, rw, _ = moe_ref.route(logits, cfg.score, cfg.top_k, ref["bias"], cfg.renormalize, cfg.routed_scale,
                                    cfg.n_group, cfg.topk_group)
        for t in range(T):
            mine = dict(zip(ids[t].tolist(), w[t].tolist()))
            theirs = dict(zip(np.asarray(rids[t]).tolist(), np.asarray(rw[t]).tolist()))
            assert set(mine) == set(theirs), f"token {t}: experts {sorted(mine)} vs the oracle's {sorted(theirs)}"
            for e, v in theirs.items():
                assert abs(mine[e] - v) <= 1e-5 * abs(v), f"token {t} expert {e}: weight {mine[e]} vs {v}"
        assert torch.equal(m(x, ids, w), y)  # passed back: the same bits
        assert torch.equal(m(x), y)  # asking for the routing changes nothing
        y2, ids2, w2 = torch.ops.fp4moe.moe_routed(m.id, x)  # through the dispatcher
        assert torch.equal(y2, y) and torch.equal(ids2, ids) and torch.equal(w2, w)

        def f(x):
            o, i, v = m(x, return_routing=True)
            return o + 1, i, v

        o3, ids3, w3 = torch.compile(f, fullgraph=True)(x)
        assert torch.equal(o3, y + 1) and torch.equal(ids3, ids) and torch.equal(w3, w)
        with pytest.raises(ValueError, match="return_routing: only with internal routing"):
            m(x, ids, w, return_routing=True)
        with pytest.raises(ValueError, match="return_routing: out= is not taken"):
            m(x, out=torch.empty(T, cfg.hidden), return_routing=True)
        with pytest.raises(ValueError, match="x: expected"):
            m(x.float(), return_routing=True)
        with pytest.raises(ValueError, match="T=9 outside"):
            m(bf16(make_x(rng, 9, cfg.hidden)[0]), return_routing=True)
        nan = x.clone()
        nan[2, 3] = float("nan")
        with pytest.raises(fp4moe.Error):
            m(nan, return_routing=True)
    finally:
        m.close()


def test_call_paths_agree_and_modes_see_the_op(setup, rng):
    """moe(x) in plain eager mode skips the dispatcher; the op, the object and
    the object under a dispatch mode give the same bits, and a mode (FakeTensor,
    functionalization, a tracer) still sees fp4moe::moe / moe_out."""
    from torch.utils._python_dispatch import TorchDispatchMode

    cfg, W, ref, m = setup
    x = bf16(make_x(rng, 3, cfg.hidden)[0])
    ids = torch.tensor([[0, 5], [7, -1], [3, 2]], dtype=torch.int32)
    w = torch.rand(3, 2)

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    for routing in ((), (ids, w)):
        direct = m(x, *routing)
        via_op = torch.ops.fp4moe.moe(m.id, x, *routing)
        out = torch.full_like(direct, float("nan"))
        torch.ops.fp4moe.moe_out(m.id, x, *(routing or (None, None)), out)
        with Seen() as seen:
            moded = m(x, *routing)
            out2 = torch.empty_like(direct)
            m(x, *routing, out=out2)
        assert any("fp4moe.moe.default" in o for o in seen.ops), seen.ops
        assert any("fp4moe.moe_out.default" in o for o in seen.ops), seen.ops
        for y in (via_op, out, moded, out2):
            assert torch.equal(y, direct)


def test_bad_arguments_through_the_op(setup, rng):
    """The op called directly (the dispatcher's path) raises the same named errors."""
    cfg, W, ref, m = setup
    x = bf16(make_x(rng, 2, cfg.hidden)[0])
    ids = torch.zeros(2, 2, dtype=torch.int32)
    out = torch.empty(2, cfg.hidden)
    cases = [
        (lambda: torch.ops.fp4moe.moe(m.id, x.float()), "x: expected a contiguous torch.bfloat16"),
        (lambda: torch.ops.fp4moe.moe(m.id, x, ids, None), "give both"),
        (lambda: torch.ops.fp4moe.moe(m.id, x, ids, torch.ones(2, 3)), r"topk_weights: expected .* \[2\]\[2\]"),
        (lambda: torch.ops.fp4moe.moe_out(m.id, x, None, None, out.t()), "out: expected a contiguous"),
        (lambda: torch.ops.fp4moe.moe_out(m.id, x, None, None, out[:1]), r"out: expected .* \[2\]\[64\]"),
        (lambda: torch.ops.fp4moe.moe(m.id, torch.zeros(2, 64, 1, dtype=torch.bfloat16)), "x: expected"),
    ]
    for call, msg in cases:
        with pytest.raises(ValueError, match=msg):
            call()
    with pytest.raises((TypeError, RuntimeError)):
        m([[1.0] * cfg.hidden])  # not a tensor: the dispatcher's own error, no crash
    assert torch.equal(m(x), torch.ops.fp4moe.moe(m.id, x))  # still usable after the errors


@pytest.mark.parametrize("path", ["call", "op", "op_out", "routed"])
def test_close_during_calls(rng, path):
    """MoE.close() in one thread while another calls: each call completes (same output) or
    raises fp4moe.ClosedError, never runs on the destroyed layer; the op with the closed id
    then says the id is not live."""
    cfg, W, _ = make_layer(rng, "nvfp4", E=16, k=4, H=256, I=256)
    bits, _ = make_x(rng, 8, cfg.hidden)
    x = bf16(bits)
    for _ in range(8):
        m = MoE(cfg, W, device="cpu", out_dtype=torch.float32, max_tokens=8)
        want = m(x)
        out = torch.empty_like(want)
        call = {"call": lambda: m(x), "op": lambda: torch.ops.fp4moe.moe(m.id, x),
                "op_out": lambda: (torch.ops.fp4moe.moe_out(m.id, x, None, None, out), out)[1],
                "routed": lambda: m(x, return_routing=True)[0]}[path]
        n, exc = race(call, m.close, lambda y: torch.testing.assert_close(y, want, rtol=0, atol=0))
        if path.startswith("op") and not isinstance(exc, fp4moe.ClosedError):
            assert isinstance(exc, ValueError) and "is not the id of a live" in str(exc), repr(exc)
        else:
            closed(exc, "MoE")
        with pytest.raises(fp4moe.ClosedError, match="^MoE is closed$"):
            m(x)
        with pytest.raises(fp4moe.ClosedError, match="^MoE is closed$"):
            m.layer.run(bits)
        with pytest.raises(ValueError, match="is not the id of a live"):
            torch.ops.fp4moe.moe(m.id, x)


def test_calls_from_threads(setup, rng):
    """Calls from several threads on one MoE take turns (the run arguments are shared):
    each gets its own output."""
    cfg, W, ref, m = setup
    xs = [bf16(make_x(rng, 1 + i, cfg.hidden)[0]) for i in range(4)]
    want = [m(x) for x in xs]
    bad = []

    def work(i):
        for _ in range(200):
            if not torch.equal(m(xs[i]), want[i]):
                bad.append(i)
    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert not bad


def _dispatch(x, ids, first, nl, cap):
    """x's rows of the local experts [first, first + nl) in the expert-major layout (token
    order within an expert, as a dispatch that walks its tokens in order lays them out), the
    counts, and where each (token, slot) went."""
    T, K = ids.shape
    xd = torch.zeros((nl, cap, x.shape[1]), dtype=x.dtype)
    counts = torch.zeros(nl, dtype=torch.int32)
    where = {}
    for t in range(T):
        for j in range(K):
            e = int(ids[t, j]) - first
            if 0 <= e < nl:
                r = int(counts[e])
                xd[e, r] = x[t]
                where[(t, j)] = (e, r)
                counts[e] += 1
    return xd, counts, where


def test_dispatched_op(rng):
    """torch.ops.fp4moe.moe_dispatched (MoE.dispatched) on a shard: the rows' outputs, combined
    by hand in slot order, equal the shard's op on the tokens bit for bit; torch.compile traces
    it; the argument errors name the argument (the layouts' numerics: test_layer_dispatch.c)."""
    cfg, W, _ = make_layer(rng, "nvfp4", E=8, k=2)
    first, nl, T = 4, 4, 6
    sw = fp4moe.MoEWeights(router_w=W.router_w, router_bias=W.router_bias, w13_data=W.w13_data[first:],
                           w13_scales=W.w13_scales[first:], w13_global=W.w13_global[first:],
                           w2_data=W.w2_data[first:], w2_scales=W.w2_scales[first:], w2_global=W.w2_global[first:])
    m = MoE(cfg, sw, device="cpu", out_dtype=torch.float32, max_tokens=16, first_expert=first, n_local=nl)
    try:
        x = bf16(make_x(rng, T, cfg.hidden)[0])
        ids = torch.from_numpy(rng.integers(0, 8, (T, 2)).astype(np.int32))
        ids[:, 1] = (ids[:, 0] + 1 + torch.from_numpy(rng.integers(0, 7, T).astype(np.int32))) % 8  # distinct
        w = torch.from_numpy(rng.uniform(0.1, 1.0, (T, 2)).astype(np.float32))
        want = m(x, ids, w)
        xd, counts, where = _dispatch(x, ids, first, nl, T)
        y = m.dispatched(xd, counts=counts)
        assert y.shape == (nl, T, cfg.hidden) and y.dtype == torch.float32 and torch.isfinite(y).all()
        got = torch.zeros(T, cfg.hidden)
        for t in range(T):
            for j in range(2):
                if (t, j) in where:
                    got[t] += w[t, j] * y[where[(t, j)]]
        assert torch.equal(got, want)
        traced = torch.compile(lambda a, c: m.dispatched(a, counts=c) * 1, fullgraph=True)(xd, counts)
        assert torch.equal(traced, y)
        with pytest.raises(ValueError, match="counts"):
            m.dispatched(xd, counts=counts.to(torch.int64))
        with pytest.raises(ValueError, match="one of them"):
            m.dispatched(xd, counts=counts, offsets=torch.zeros(nl + 1, dtype=torch.int32))
        with pytest.raises(fp4moe.Error, match="capacity"):
            m.dispatched(xd, counts=torch.full((nl,), T + 1, dtype=torch.int32))
    finally:
        m.close()
