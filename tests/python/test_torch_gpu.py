"""The torch ops on the GPU (ctest label gpu: python_gpu; the coordinator runs it
on the device). Skips with a message without torch, CUDA, a device or the
library's device-resident layer API.

Oracle: a MoE in torch (float32, on the GPU) on the dequantized weights
(moe_ref.dequant, independent of fp4moe), routing from the formula.
Bound, every format: NMSE <= 5e-5 with BF16 output. The weights decode exactly
in every format (E2M1 x scale products are exact in FP32), so what differs is
the output's BF16 rounding (unit roundoff 2^-9: NMSE ~1.3e-6), a BF16 rounding
of the FC2 input on the tensor-core path (another ~1.3e-6) and FP32 summation
order (~1e-12); 5e-5 is ~20x that and still far below what a wrong expert,
scale or routing weight gives (>= 1e-3). FP32 output (shards): 1e-5.
"""

import numpy as np
import pytest

import fp4moe
from conftest import make_layer

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)
if not fp4moe.backend_available("cuda"):
    pytest.skip("libfp4moe was built without the CUDA backend (no nvcc) or sees no device", allow_module_level=True)
from fp4moe.torch_ops import MoE  # noqa: E402

DEV = torch.device("cuda", 0)
BOUND_BF16, BOUND_F32 = 5e-5, 1e-5


def t_route(logits, cfg, bias):
    s = torch.softmax(logits, 1) if cfg.score == "softmax" else torch.sigmoid(logits)
    rank = s + (0 if bias is None else bias)
    top = torch.topk(rank, cfg.top_k + 1, 1)
    # per token: the gap between the k-th and (k+1)-th ranked scores (a token whose
    # gap is within FP32 noise may be routed differently by any two implementations)
    margin = (top.values[:, cfg.top_k - 1] - top.values[:, cfg.top_k]) \
        if cfg.top_k < cfg.n_experts else np.inf
    ids = top.indices[:, :cfg.top_k]
    w = torch.gather(s, 1, ids)
    if cfg.renormalize:
        w = w / w.sum(1, keepdim=True)
    return ids.int(), (w * cfg.routed_scale).float(), margin


def t_moe(x, ref, cfg, ids=None, w=None):
    """out [T][H] float32, and the routing margin (small: the choice is fragile)."""
    xf = x.float()
    w13 = torch.from_numpy(ref["w13"]).to(DEV)
    w2 = torch.from_numpy(ref["w2"]).to(DEV)
    margin = np.inf
    if ids is None:
        bias = None if ref["bias"] is None else torch.from_numpy(ref["bias"]).to(DEV)
        ids, w, margin = t_route(xf @ torch.from_numpy(ref["router"]).to(DEV).T, cfg, bias)
    y = torch.zeros(x.shape[0], cfg.hidden, device=DEV)
    for e in range(cfg.n_experts):
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        g = xf[tok] @ w13[e].T
        h = torch.nn.functional.silu(g[:, :cfg.inter]) * g[:, cfg.inter:]
        y.index_add_(0, tok, (h @ w2[e].T) * w[tok, slot][:, None])
    return y, margin


def nmse(a, b):
    a, b = a.double(), b.double()
    return ((a - b) ** 2).sum().item() / max((b ** 2).sum().item(), 1e-300)


def check(y, want, bound, margin=np.inf):
    """NaN/Inf first, then NMSE over the tokens whose routing is not within FP32 noise
    of a tie (margin per token, from t_route; inf: every token): random routers at
    T >= 64 always have a few such tokens, which the comparison leaves out (at most
    a tenth of them, else re-run with another seed)."""
    assert torch.isfinite(y).all(), "NaN/Inf in the output (an element left unwritten?)"
    keep = slice(None)
    if torch.is_tensor(margin):
        keep = margin > 1e-5
        assert keep.float().mean().item() >= 0.9, "routing near a tie for over a tenth of the tokens: re-run"
    err = nmse(y.float()[keep], want[keep])
    assert err <= bound, f"NMSE {err:.3e} > {bound}"


def matches_ref(moe, ref, cfg, x):
    """The layer's output of x (internal routing) against the torch reference, and no device error."""
    y = moe(x)
    torch.cuda.synchronize()
    want, margin = t_moe(x, ref, cfg)
    check(y, want, BOUND_BF16, margin)
    moe.errors()


def layer(rng, fmt="nvfp4", max_tokens=1024, **kw):
    cfg, W, ref = make_layer(rng, fmt, E=16, k=4, H=256, I=128, **kw)
    return cfg, ref, MoE(cfg, W, device=DEV, max_tokens=max_tokens)


def x_of(rng, T, H):
    return torch.from_numpy(rng.standard_normal((T, H)).astype(np.float32)).to(DEV).bfloat16()


def test_bf16_experts_refused(rng):
    """BF16 routed experts: the cuda backend runs FP4 only, and says so."""
    with pytest.raises(fp4moe.Error, match="FM_ERR_UNSUPPORTED"):
        layer(rng, "bf16")


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("T", [1, 7, 64, 300])
def test_internal_routing_vs_torch(rng, fmt, T):
    cfg, ref, m = layer(rng, fmt)
    x = x_of(rng, T, cfg.hidden)
    y = m(x)
    torch.cuda.synchronize()
    assert y.dtype == torch.bfloat16 and y.device == DEV
    want, margin = t_moe(x, ref, cfg)
    check(y, want, BOUND_BF16, margin)
    m.errors()


def test_sigmoid_bias_routing(rng):
    cfg, ref, m = layer(rng, "nvfp4", score="sigmoid", bias=True, routed_scale=2.5)
    x = x_of(rng, 33, cfg.hidden)
    want, margin = t_moe(x, ref, cfg)
    check(m(x), want, BOUND_BF16, margin)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_external_routing(rng, fmt):
    cfg, ref, m = layer(rng, fmt)
    T = 40
    x = x_of(rng, T, cfg.hidden)
    ids = torch.stack([torch.randperm(cfg.n_experts)[:cfg.top_k] for _ in range(T)]).int().to(DEV)
    ids[3, 2] = -1
    w = torch.rand(T, cfg.top_k, device=DEV)
    out = torch.full((T, cfg.hidden), float("nan"), dtype=torch.bfloat16, device=DEV)
    r = m(x, ids, w, out=out)
    assert r is out
    want, _ = t_moe(x, ref, cfg, ids, w)
    check(out, want, BOUND_BF16)


def test_cuda_graph_capture_and_replay(rng):
    cfg, ref, m = layer(rng, "nvfp4", max_tokens=64)
    T = 16
    x = x_of(rng, T, cfg.hidden)
    ids = torch.stack([torch.randperm(cfg.n_experts)[:cfg.top_k] for _ in range(T)]).int().to(DEV)
    w = torch.rand(T, cfg.top_k, device=DEV)
    out = torch.empty(T, cfg.hidden, dtype=torch.bfloat16, device=DEV)
    m(x, ids, w, out=out)  # warm-up outside capture
    y_int = m(x)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        m(x, ids, w, out=out)
        y_graph = m(x)  # internal routing, output from the graph's pool
    for _ in range(3):
        x.copy_(x_of(rng, T, cfg.hidden))
        ids.copy_(torch.stack([torch.randperm(cfg.n_experts)[:cfg.top_k] for _ in range(T)]).int())
        w.copy_(torch.rand(T, cfg.top_k))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        want_ext, _ = t_moe(x, ref, cfg, ids, w)
        check(out, want_ext, BOUND_BF16)
        want_int, margin = t_moe(x, ref, cfg)
        check(y_graph, want_int, BOUND_BF16, margin)
        assert torch.equal(y_graph, m(x)), "replay differs from an eager run on the same input"
    del y_int
    m.errors()


def test_return_routing(rng):
    """moe(x, return_routing=True) on the device: the torch reference's experts per
    token (where not within FP32 noise of a tie), the reference's output, the same
    output bit for bit when the ids / weights are passed back as external routing,
    and captured into a CUDA graph with the eager run's bits."""
    cfg, ref, m = layer(rng, "nvfp4", max_tokens=64)
    T = 24
    x = x_of(rng, T, cfg.hidden)
    y, ids, w = m(x, return_routing=True)
    torch.cuda.synchronize()
    assert ids.device == DEV and ids.dtype == torch.int32 and w.dtype == torch.float32
    assert ids.shape == (T, cfg.top_k) and w.shape == (T, cfg.top_k) and torch.isfinite(w).all()
    want, margin = t_moe(x, ref, cfg)
    check(y, want, BOUND_BF16, margin)
    bias = None if ref["bias"] is None else torch.from_numpy(ref["bias"]).to(DEV)
    rids, rw, _ = t_route(x.float() @ torch.from_numpy(ref["router"]).to(DEV).T, cfg, bias)
    for t in range(T):
        if margin[t] > 1e-5:
            assert set(ids[t].tolist()) == set(rids[t].tolist()), f"token {t}: experts differ from the reference"
    assert torch.equal(m(x, ids, w), y), "the routing passed back gives another output"
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        yg, idg, wg = m(x, return_routing=True)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(yg, y) and torch.equal(idg, ids) and torch.equal(wg, w)
    m.errors()


def test_compile_fullgraph(rng):
    cfg, ref, m = layer(rng, "nvfp4")
    x = x_of(rng, 9, cfg.hidden)

    def f(x):
        return m(x).float() * 2 + 1

    eager = f(x)
    assert torch.equal(torch.compile(f, fullgraph=True)(x), eager)
    assert torch.equal(torch.compile(f, fullgraph=True, mode="reduce-overhead")(x), eager)  # cudagraphs
    ids = torch.stack([torch.randperm(cfg.n_experts)[:cfg.top_k] for _ in range(9)]).int().to(DEV)
    w = torch.rand(9, cfg.top_k, device=DEV)

    def g(x, ids, w, out):
        m(x, ids, w, out=out)
        return out.float().sum(1)

    o1, o2 = (torch.empty(9, cfg.hidden, dtype=torch.bfloat16, device=DEV) for _ in range(2))
    r = torch.compile(g, fullgraph=True)(x, ids, w, o1)
    assert torch.equal(r, g(x, ids, w, o2)) and torch.equal(o1, o2)


def test_side_stream(rng):
    """The op runs on torch.cuda.current_stream(): queued behind a long sleep on a side
    stream, its output is not there yet when the default stream looks (an op on
    any other stream would have written it by then)."""
    cfg, ref, m = layer(rng, "nvfp4")
    x = x_of(rng, 8, cfg.hidden)
    want = m(x)
    out = torch.full_like(want, float("nan"))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU cycles
        m(x, out=out)
    early = out.clone()  # on the default stream, not ordered after s
    s.synchronize()
    torch.cuda.synchronize()
    assert torch.isnan(early.float()).all(), "output written before the side stream reached the op"
    assert torch.equal(out, want)


def test_expert_shard_partial_sums(rng):
    E = 16
    cfg, W, ref = make_layer(rng, "nvfp4", E=E, k=4, H=256, I=128)
    full = MoE(cfg, W, device=DEV, max_tokens=32, out_dtype=torch.float32)
    parts = []
    for first in (0, 8):
        sl = slice(first, first + 8)
        Ws = fp4moe.MoEWeights(W.router_w, W.w13_data[sl], W.w13_scales[sl], W.w13_global[sl], W.w2_data[sl],
                               W.w2_scales[sl], W.w2_global[sl])
        parts.append(MoE(cfg, Ws, device=DEV, max_tokens=32, out_dtype=torch.float32, first_expert=first,
                         n_local=8))
    x = x_of(rng, 20, cfg.hidden)
    ids = torch.stack([torch.randperm(E)[:4] for _ in range(20)]).int().to(DEV)
    w = torch.rand(20, 4, device=DEV)
    want, margin = t_moe(x, ref, cfg)
    check(parts[0](x) + parts[1](x), want, BOUND_F32, margin)
    check(parts[0](x, ids, w) + parts[1](x, ids, w), full(x, ids, w), BOUND_F32)


def test_plan(rng):
    """Layer.plan on a cuda layer: T's bucket, the rows the tiles were chosen for, both GEMMs' tiles."""
    cfg, ref, moe = layer(rng, max_tokens=64)
    p = moe.layer.plan(5)
    assert p["bucket_tokens"] == 8 and p["expected_rows"] >= 1 and 1 <= p["active_experts"] <= cfg.n_experts
    for g in ("fc1", "fc2"):
        assert p[g]["tile"].startswith(("mma_", "wgmma_")), p[g]
        assert p[g]["k_splits"] >= 1 and p[g]["feature_blocks"] >= 1
    assert moe.layer.plan(64)["bucket_tokens"] == 64
    with pytest.raises(fp4moe.Error, match="FM_ERR_BAD_SHAPE"):
        moe.layer.plan(65)


def test_set_plan(rng):
    """Layer.set_plan: another plan for T's bucket, reported back by plan() and run against the
    reference; a plan the GEMM cannot run refused with its status, the old plan kept."""
    cfg, ref, moe = layer(rng, max_tokens=64)
    p = moe.layer.plan(2)
    q = {**p, "work_list": True, "active_experts": max(1, p["active_experts"]),
         "fc1": {"tile": "mma_w4m2n1k128s4", "k_splits": 2, "x_packed": False, "feature_blocks": 1},
         "fc2": {"tile": "mma_w4m1n1k128s4", "k_splits": 1, "x_packed": False, "feature_blocks": 1}}
    moe.layer.set_plan(2, q)
    got = moe.layer.plan(2)
    assert got["fc1"] == q["fc1"] and got["fc2"] == q["fc2"] and got["work_list"]
    x = x_of(rng, 2, cfg.hidden)
    matches_ref(moe, ref, cfg, x)
    bad = {**q, "fc1": {**q["fc1"], "tile": "mma_w4m1n1k128s4"}}  # one band: no SwiGLU pairs
    with pytest.raises(fp4moe.Error, match="SwiGLU") as e:
        moe.layer.set_plan(2, bad)
    assert e.value.status == "FM_ERR_UNSUPPORTED"
    assert moe.layer.plan(2) == got


def test_tune(rng):
    """Layer.tune on the caller's torch stream: the search ran, the kept plan is no slower by its
    own interleaved timing (the rule), and the layer still matches the reference."""
    cfg, ref, moe = layer(rng, max_tokens=64)
    s = torch.cuda.Stream()
    t = moe.layer.tune(4, stream=s.cuda_stream)
    assert t["plans_tried"] > 0 and 0 <= t["plans_refused"] <= t["plans_tried"], t
    assert 0 < t["after_us"] <= t["before_us"], t
    x = x_of(rng, 4, cfg.hidden)
    matches_ref(moe, ref, cfg, x)


def test_device_side_errors(rng):
    cfg, ref, m = layer(rng, "nvfp4")
    x = x_of(rng, 4, cfg.hidden)
    ids = torch.tensor([[0, 1, 2, 3], [4, 99, 5, 6], [7, 8, 9, 10], [11, 12, 13, 14]], dtype=torch.int32,
                       device=DEV)
    w = torch.rand(4, 4, device=DEV)
    y = m(x, ids, w)  # asynchronous: the bad id is only seen on the device
    with pytest.raises(fp4moe.Error) as e:
        m.errors()
    assert e.value.status == "FM_ERR_OUT_OF_RANGE"
    assert torch.isfinite(y.float()).all()
    m.errors()  # cleared


def test_wrong_device_raises(rng):
    cfg, ref, m = layer(rng, "nvfp4")
    with pytest.raises(ValueError, match="x: expected .* on cuda:0, got .* on cpu"):
        m(torch.zeros(2, cfg.hidden, dtype=torch.bfloat16))
    x = x_of(rng, 2, cfg.hidden)
    with pytest.raises(ValueError, match="topk_ids: expected .* on cuda:0"):
        m(x, torch.zeros(2, 4, dtype=torch.int32), torch.ones(2, 4, device=DEV))


def test_object_and_op_paths_agree(rng):
    """moe(...) in eager mode skips the dispatcher (issue 18); the op and the object
    give the same bits eagerly and from one captured graph, on the current stream,
    and the object's bad arguments still raise naming them."""
    cfg, ref, m = layer(rng, "nvfp4", max_tokens=64)
    T = 8
    x = x_of(rng, T, cfg.hidden)
    ids = torch.stack([torch.randperm(cfg.n_experts)[:cfg.top_k] for _ in range(T)]).int().to(DEV)
    w = torch.rand(T, cfg.top_k, device=DEV)
    for routing in ((), (ids, w)):
        a, b = m(x, *routing), torch.ops.fp4moe.moe(m.id, x, *routing)
        assert torch.equal(a, b)
    o1, o2 = (torch.full((T, cfg.hidden), float("nan"), dtype=torch.bfloat16, device=DEV) for _ in range(2))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        m(x, ids, w, out=o1)
        torch.ops.fp4moe.moe_out(m.id, x, ids, w, o2)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(o1, o2) and torch.equal(o1, m(x, ids, w))
    with pytest.raises(ValueError, match="out: expected .* on cuda:0"):
        m(x, out=torch.empty(T, cfg.hidden, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="topk_weights: expected a contiguous torch.float32"):
        m(x, ids, w.half())
    with pytest.raises(ValueError, match=r"T=65 outside \[1, max_tokens=64\]"):
        m(x_of(rng, 65, cfg.hidden))
    m.errors()
