#!/usr/bin/env python3
"""What the Python face costs per call (issue 18's benchmark).

Host part (any machine, no GPU):
  * the binding itself: one ctypes call vs one CPython-extension call of the
    same C function (a 25-line extension compiled here into a temporary folder
    with cc, for comparison only: the package uses ctypes), both on a call that
    returns at once, so only the crossing is timed;
  * the whole eager path on a tiny CPU layer: Layer.run and, with torch,
    torch.ops.fp4moe.moe / moe_out and the MoE object called (moe(x, out=)),
    each minus the same layer called by ctypes directly in the same rounds
    (*_minus_c_us: the Python face's own cost per call, the figure to compare
    before / after a change of the binding; the calls of one round alternate,
    so a load change on a shared machine shifts both sides alike).
GPU part (torch with CUDA; the coordinator runs it):
  * per-call host overhead of the op in eager mode at T = 1, on a small layer
    whose kernels are shorter than the calls: CUDA events around N back-to-back
    calls, the host time of issuing 8 calls into an idle queue (the op
    torch.ops.fp4moe.moe_out, the MoE object called, the C layer by ctypes:
    op_minus_c_host_us and call_minus_c_host_us), and a torch.profiler trace
    (--trace FILE, chrome);
  * the op's GPU time vs the C layer's (fm_layer_run by ctypes on the same
    stream, and the same calls replayed from a CUDA graph) at T = 1, 64, 1024.
Timings are printed, never asserted. Usage:
  FP4MOE_LIBRARY=build/python/libfp4moe.so PYTHONPATH=python python bench/py_overhead.py [--gpu] [--trace t.json]
"""

import argparse
import ctypes as C
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time

import numpy as np

# One OpenMP thread for the tiny host layer: a thread team's barriers would
# dominate (and vary with the machine's load); set before the library loads.
os.environ.setdefault("OMP_NUM_THREADS", "1")
import fp4moe  # noqa: E402
from fp4moe import _lib  # noqa: E402

EXT_SRC = r"""
#include <Python.h>
#include "fp4moe/layer.h"
typedef fm_status (*run_fn)(fm_layer *, const fm_layer_run_args *);
static run_fn run_p;
static PyObject *set_fns(PyObject *s, PyObject *a) {
    unsigned long long r; if (!PyArg_ParseTuple(a, "K", &r)) return NULL;
    run_p = (run_fn)(uintptr_t)r; Py_RETURN_NONE; }
/* run(layer, x, T, ids, weights, out, stream): the op's call as one C function */
static PyObject *run(PyObject *s, PyObject *const *a, Py_ssize_t n) {
    if (n != 7) { PyErr_SetString(PyExc_TypeError, "run: 7 arguments"); return NULL; }
    fm_layer_run_args r = {PyLong_AsVoidPtr(a[1]), (int)PyLong_AsLong(a[2]), PyLong_AsVoidPtr(a[3]),
                           PyLong_AsVoidPtr(a[4]), PyLong_AsVoidPtr(a[5]), NULL, PyLong_AsVoidPtr(a[6])};
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromLong(run_p(PyLong_AsVoidPtr(a[0]), &r)); }
static PyMethodDef m[] = {{"set_fns", set_fns, METH_VARARGS, ""},
                          {"run", (PyCFunction)(void (*)(void))run, METH_FASTCALL, ""}, {0}};
static struct PyModuleDef d = {PyModuleDef_HEAD_INIT, "fm_ext", 0, -1, m};
PyMODINIT_FUNC PyInit_fm_ext(void) { return PyModule_Create(&d); }
"""


def build_ext(repo):
    """The comparison extension, or None when no compiler / headers."""
    tmp = tempfile.mkdtemp(prefix="fm_ext_")
    src = os.path.join(tmp, "fm_ext.c")
    so = os.path.join(tmp, "fm_ext" + sysconfig.get_config_var("EXT_SUFFIX"))
    open(src, "w").write(EXT_SRC)
    cmd = ["cc", "-O2", "-shared", "-fPIC", "-I" + sysconfig.get_paths()["include"],
           "-I" + os.path.join(repo, "include"), src, "-o", so]
    if subprocess.run(cmd, capture_output=True).returncode:
        return None
    sys.path.insert(0, tmp)
    import fm_ext
    fm_ext.set_fns(C.cast(_lib.lib.fm_layer_run, C.c_void_p).value)
    return fm_ext


def per_call(fn, n, reps=5):
    """Median over reps of (wall time of n calls) / n, microseconds."""
    best = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best.append((time.perf_counter() - t0) / n * 1e6)
    return float(np.median(best))


def paired(fns, n, reps=7):
    """Per-call microseconds of each fn in fns (a dict), timed in rounds that
    call each in turn (n calls each); the median over rounds of each. The
    calling thread's CPU time (time.thread_time), not the wall clock: on a
    shared machine being descheduled does not count (nothing here waits)."""
    got = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t0 = time.thread_time()
            for _ in range(n):
                fn()
            got[name].append((time.thread_time() - t0) / n * 1e6)
    return {name: float(np.median(v)) for name, v in got.items()}


def tiny_layer(rng, E=4, k=2, H=64, I=32):
    cfg = fp4moe.MoEConfig(n_experts=E, top_k=k, hidden=H, inter=I)
    W = fp4moe.MoEWeights.quantize(cfg, rng.standard_normal((E, H)).astype(np.float32),
                                   rng.standard_normal((E, 2 * I, H)) * 0.1, rng.standard_normal((E, H, I)) * 0.1)
    return cfg, W


def host_part(args, res):
    rng = np.random.default_rng(0)
    n = args.calls
    lib = _lib.lib
    ext = build_ext(args.repo)
    x = np.zeros((1, 64), np.uint16)
    out = np.zeros((1, 64), np.float32)
    a = _lib.LayerRunArgs()
    # 1. the crossing alone: a call that fails its NULL-layer check at once.
    # Pointers as ints up front, as the torch op has them (tensor.data_ptr());
    # numpy's .ctypes.data alone costs a few us per access.
    xp, op = x.ctypes.data, out.ctypes.data
    def ct():
        a.x, a.T, a.out, a.topk_ids, a.topk_weights = xp, 1, op, None, None
        return lib.fm_layer_run(None, C.byref(a))
    res["ctypes_call_us"] = per_call(ct, n)
    res["ctypes_trivial_us"] = per_call(lambda: lib.fm_layer_backend(None), n)
    if ext:
        res["cext_call_us"] = per_call(lambda: ext.run(0, xp, 1, 0, 0, op, 0), n)
    # 2. the whole eager path on a tiny CPU layer (64 hidden, 4 experts): minus the C layer itself
    cfg, W = tiny_layer(rng)
    L = fp4moe.Layer(cfg, W, backend="cpu", max_tokens=4)
    h = L._handle()
    def raw():
        a.x, a.T, a.out, a.topk_ids, a.topk_weights = xp, 1, op, None, None
        return lib.fm_layer_run(h, C.byref(a))
    m = max(n // 50, 200)
    res["tiny_layer_ctypes_us"] = per_call(raw, m)
    res["tiny_layer_Layer.run_us"] = per_call(lambda: L.run(x, out=out), m)
    try:
        import torch
        from fp4moe.torch_ops import MoE
    except ImportError:
        print("torch not installed: no torch op timing on the host")
        return
    mo = MoE(cfg, W, device="cpu", max_tokens=4, out_dtype=torch.float32)
    xt = torch.zeros(1, 64, dtype=torch.bfloat16)
    ot = torch.empty(1, 64)
    ids = torch.tensor([[0, 3]], dtype=torch.int32)
    wt = torch.tensor([[0.6, 0.4]])
    op, op_new = torch.ops.fp4moe.moe_out.default, torch.ops.fp4moe.moe.default
    mh = mo._h  # the same layer by ctypes, as in raw() above, internal and external routing
    xq, oq, iq, wq = xt.data_ptr(), ot.data_ptr(), ids.data_ptr(), wt.data_ptr()

    def raw_t(ip=None, wp=None):
        a.x, a.T, a.out, a.topk_ids, a.topk_weights = xq, 1, oq, ip, wp
        return lib.fm_layer_run(mh, C.byref(a))

    fns = {"c": raw_t, "op_out": lambda: op(mo.id, xt, None, None, ot), "op": lambda: op_new(mo.id, xt),
           "call_out": lambda: mo(xt, out=ot), "c_ext": lambda: raw_t(iq, wq),
           "op_out_ext": lambda: op(mo.id, xt, ids, wt, ot), "call_out_ext": lambda: mo(xt, ids, wt, out=ot)}
    r = paired(fns, m)
    res["tiny_layer_torch_c_us"] = r["c"]
    res["tiny_layer_torch_op_out_us"] = r["op_out"]
    res["tiny_layer_torch_op_us"] = r["op"]
    res["tiny_layer_MoE_call_out_us"] = r["call_out"]
    # the Python face's own cost per call: minus the C layer timed in the same rounds
    res["tiny_layer_torch_op_out_minus_c_us"] = r["op_out"] - r["c"]
    res["tiny_layer_torch_op_minus_c_us"] = r["op"] - r["c"]
    res["tiny_layer_MoE_call_out_minus_c_us"] = r["call_out"] - r["c"]
    res["tiny_layer_torch_op_out_ext_minus_c_us"] = r["op_out_ext"] - r["c_ext"]
    res["tiny_layer_MoE_call_out_ext_minus_c_us"] = r["call_out_ext"] - r["c_ext"]
    res["torch_empty_op_us"] = per_call(lambda: torch.ops.aten.empty.memory_format([1, 64]), m)
    print("host, tiny CPU layer, per call minus the C layer by ctypes (us): op moe_out "
          f"{res['tiny_layer_torch_op_out_minus_c_us']:.2f}, op moe {res['tiny_layer_torch_op_minus_c_us']:.2f}, "
          f"MoE called {res['tiny_layer_MoE_call_out_minus_c_us']:.2f} (C layer {r['c']:.2f})", flush=True)


def big_layer(args, rng):
    """A layer of the given shape with one quantized expert's bytes repeated
    (contents do not change timing; routing is random)."""
    E, k, H, I = args.experts, args.topk, args.hidden, args.inter
    cfg = fp4moe.MoEConfig(n_experts=E, top_k=k, hidden=H, inter=I, score="sigmoid", routed_scale=2.5)
    q13 = fp4moe.quantize(rng.standard_normal((2 * I, H)).astype(np.float32) * 0.05, "nvfp4")
    q2 = fp4moe.quantize(rng.standard_normal((H, I)).astype(np.float32) * 0.05, "nvfp4")
    rep = lambda a: np.ascontiguousarray(np.broadcast_to(a, (E,) + a.shape))  # noqa: E731
    W = fp4moe.MoEWeights((rng.standard_normal((E, H)) * 0.05).astype(np.float32), rep(q13.data), rep(q13.scales),
                          np.full(E, q13.global_scale, np.float32), rep(q2.data), rep(q2.scales),
                          np.full(E, q2.global_scale, np.float32))
    return cfg, W


def gpu_measure(args, cfg, W, tokens, label, res):
    import torch
    from fp4moe.torch_ops import MoE

    rng = np.random.default_rng(2)
    dev = torch.device("cuda", 0)
    m = MoE(cfg, W, device=dev, max_tokens=max(tokens))
    lib, h = _lib.lib, m.layer._handle()
    H, k, E = cfg.hidden, cfg.top_k, cfg.n_experts
    op = torch.ops.fp4moe.moe_out.default
    ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
    for T in tokens:
        x = torch.from_numpy(rng.standard_normal((T, H)).astype(np.float32)).to(dev).bfloat16()
        ids = torch.stack([torch.randperm(E)[:k] for _ in range(T)]).int().to(dev)
        w = torch.rand(T, k, device=dev)
        out = torch.empty(T, H, dtype=torch.bfloat16, device=dev)
        cap = torch.cuda.Stream(dev)  # graphs are captured on a side stream

        def c_call(stream):
            a = _lib.LayerRunArgs(x.data_ptr(), T, ids.data_ptr(), w.data_ptr(), out.data_ptr(), None,
                                  stream.cuda_stream)
            ref = C.byref(a)
            return lambda: lib.fm_layer_run(h, ref)

        calls = {"op": (lambda: op(m.id, x, ids, w, out),) * 2,
                 "call": (lambda: m(x, ids, w, out=out),) * 2,  # the MoE object: no dispatcher in eager mode
                 "c_layer": (c_call(torch.cuda.current_stream(dev)), c_call(cap))}
        r = {}
        n = args.gpu_calls if T == 1 else max(args.gpu_calls // 10, 20)
        for name, (fn, fn_cap) in calls.items():
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
            # (a) CUDA events around n back-to-back calls: per-call time, host- or GPU-bound
            e0, e1 = ev(), ev()
            e0.record()
            for _ in range(n):
                fn()
            e1.record()
            torch.cuda.synchronize()
            r[name + "_eager_us"] = e0.elapsed_time(e1) / n * 1e3
            # (b) host time to issue 8 calls from an idle queue (their launches fit in
            # it, so the host never waits for the GPU), median of 50
            issue = []
            for _ in range(50):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(8):
                    fn()
                issue.append((time.perf_counter() - t0) / 8 * 1e6)
            r[name + "_host_issue_us"] = float(np.median(issue))
            # (c) the GPU time alone: the same call replayed from a graph
            g = torch.cuda.CUDAGraph()
            reps = 20
            with torch.cuda.graph(g, stream=cap):
                for _ in range(reps):
                    rc = fn_cap()
                    assert not isinstance(rc, int) or not rc, f"{name} failed under capture: {rc}"
            g.replay()
            torch.cuda.synchronize()
            e0.record()
            for _ in range(5):
                g.replay()
            e1.record()
            torch.cuda.synchronize()
            r[name + "_graph_us"] = e0.elapsed_time(e1) / (5 * reps) * 1e3
        r["op_minus_c_host_us"] = r["op_host_issue_us"] - r["c_layer_host_issue_us"]
        r["call_minus_c_host_us"] = r["call_host_issue_us"] - r["c_layer_host_issue_us"]
        r["op_vs_c_gpu_ratio"] = r["op_graph_us"] / r["c_layer_graph_us"]
        r["op_vs_c_eager_ratio"] = r["op_eager_us"] / r["c_layer_eager_us"]
        m.errors()
        res[f"gpu_{label}_T{T}"] = r
        print(f"{label} T={T}: " + ", ".join(f"{k_} {v:.2f}" for k_, v in r.items()), flush=True)
        if T == 1 and args.trace and label == "tiny":
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(50):
                    calls["op"][0]()
                torch.cuda.synchronize()
            prof.export_chrome_trace(args.trace)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
    m.close()


def gpu_part(args, res):
    import torch

    if not torch.cuda.is_available() or not fp4moe.backend_available("cuda"):
        print("GPU part skipped: no CUDA device, or a library without the CUDA backend")
        return
    rng = np.random.default_rng(1)
    # host overhead: a small layer whose kernels take less than the calls' host time
    cfg, W = tiny_layer(rng, 8, 2, 256, 128)
    gpu_measure(args, cfg, W, [1], "tiny", res)
    # GPU time vs the C layer on the real shape (default: GLM-5 EP8 shard)
    cfg, W = big_layer(args, rng)
    gpu_measure(args, cfg, W, args.tokens, "model", res)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=100000, help="host: calls per timing")
    p.add_argument("--gpu", action="store_true", help="run the GPU part too")
    p.add_argument("--gpu-calls", type=int, default=2000, help="GPU: back-to-back calls at T = 1")
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 64, 1024])
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--hidden", type=int, default=6144)
    p.add_argument("--inter", type=int, default=2048)
    p.add_argument("--trace", help="torch.profiler chrome trace of 50 eager calls at T = 1 (small layer)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--repo", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = p.parse_args()
    res = {"library": fp4moe.library_path}
    host_part(args, res)
    if args.gpu:
        gpu_part(args, res)
    print(json.dumps(res, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
