#!/usr/bin/env python3
"""Expert parallelism the PCIe way (issue 35, item 3): no all-to-all. Every rank sees the whole
batch (replicated, or all-gathered from T/W tokens per rank), runs its shard of the experts on
all of it through fp4moe, and the ranks all-reduce (sum) the partial outputs; each rank keeps
its own tokens. This is what engines run on PCIe boxes without NVLink (8x RTX PRO 6000).

    python examples/ep_pcie.py --world 4                     # 4 CPU processes, gloo, small layer
    python examples/ep_pcie.py --world 2 --mode allgather --routing external --tokens 64
    torchrun --nproc-per-node 8 examples/ep_pcie.py --device cuda --glm5   # nccl, GLM-5's shape

Rank r holds experts [r*E/W, (r+1)*E/W) (fp4moe.torch_ops.MoE(first_expert, n_local): global
router and ids, the output is the shard's partial sum). The layer applies the routing weights
(its finalize sums weight x expert output over the local slots of each token); the all-reduce
only sums. Routing: "internal" = every rank's layer routes the batch itself with the global
router (the same logits function everywhere, so the same experts on every rank); "external" =
the engine's gate: each rank routes its own tokens (logits by torch, top-k by fp4moe.route) and
the ids / weights travel with the tokens. Partial sums are FP32 (out_dtype float32) and so is
the all-reduce. Checked against the whole layer (every expert, one process) on the same tokens
and routing: NMSE within docs/accuracy.md's bound for a pure FP32 summation-order difference.
Timings: medians per phase (all-gather, layer, all-reduce); the all-reduce phase includes the
wait for the slowest rank's layer. On the CPU these are not performance figures.
"""
import argparse
import datetime
import os
import queue as queue_mod
import socket
import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

import fp4moe
from fp4moe.torch_ops import MoE

MODES = ("replicate", "allgather")
ROUTINGS = ("internal", "external")
GLM5 = {"hidden": 6144, "inter": 2048, "experts": 256, "top_k": 8}
# docs/accuracy.md: shards summed differ from the whole layer only in the FP32 order of the
# slot sum, the row "fast cpu vs cpu-ref" (1e-9, "only the FP32 summation order differs") and
# fm_layer_accuracy's cpu entry; the cuda backend's entry is 1e-4 (FC1 output rounded to BF16).
BOUND = {"cpu": 1e-9, "cuda": 1e-4}
PHASES = ("all-gather", "layer", "all-reduce")


def shard_of(n_experts, world, rank):
    """(first_expert, n_local) of rank's shard; ValueError unless the experts split evenly."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} of world size {world}: expected world >= 1 and 0 <= rank < world")
    if n_experts % world:
        raise ValueError(f"experts: {n_experts} experts do not split evenly over world size {world} "
                         f"(rank r holds experts [r*E/W, (r+1)*E/W): E must be a multiple of W)")
    n = n_experts // world
    return rank * n, n


def check_args(n_experts, world, mode, tokens, routing="internal"):
    """Every rank's arguments, checked before any process starts or any collective runs (a
    bad one raised on some ranks only would leave the others waiting in a collective)."""
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    if routing not in ROUTINGS:
        raise ValueError(f"routing: expected one of {ROUTINGS}, got {routing!r}")
    shard_of(n_experts, world, 0)
    if tokens < 1:
        raise ValueError(f"tokens: expected >= 1, got {tokens}")
    if mode == "allgather" and tokens % world:
        raise ValueError(f"tokens: {tokens} tokens do not split evenly over world size {world} "
                         "(allgather mode: every rank holds T/W tokens)")


def make_config(hidden, inter, experts, top_k):
    """GLM-5's routing (sigmoid scores with a correction bias, renormalised, x2.5) at these shapes."""
    return fp4moe.MoEConfig(n_experts=experts, top_k=top_k, hidden=hidden, inter=inter, score="sigmoid",
                            renormalize=True, routed_scale=2.5)


def make_router(cfg, seed):
    """The global router: float32 weights [n_experts][hidden] and correction bias [n_experts]."""
    g = np.random.default_rng([seed, 0])
    router = (g.standard_normal((cfg.n_experts, cfg.hidden), np.float32) / np.sqrt(cfg.hidden)).astype(np.float32)
    return router, (g.standard_normal(cfg.n_experts, np.float32) * 0.1).astype(np.float32)


def make_weights(cfg, seed, first, n_local):
    """NVFP4 weights of experts [first, first + n_local) and the global router: each expert's
    from its own generator (seed, expert), so a shard equals the same experts of the whole layer
    without making the others."""
    H, I = cfg.hidden, cfg.inter
    router, bias = make_router(cfg, seed)
    q13, q2 = [], []
    for e in range(first, first + n_local):
        ge = np.random.default_rng([seed, 1, e])
        q13.append(fp4moe.quantize(ge.standard_normal((2 * I, H), np.float32) / np.float32(np.sqrt(H)), cfg.wfmt))
        q2.append(fp4moe.quantize(ge.standard_normal((H, I), np.float32) / np.float32(np.sqrt(I)), cfg.wfmt))
    return fp4moe.MoEWeights.from_qtensors(router, q13, q2, router_bias=bias)


def make_tokens(seed, tokens, hidden):
    """The whole batch, BF16 [T][hidden] (every rank can make it; an engine has only its slice)."""
    x = np.random.default_rng([seed, 2]).standard_normal((tokens, hidden), np.float32)
    return torch.from_numpy(x).to(torch.bfloat16)


def gate(cfg, seed, x):
    """An engine's router on its own tokens: logits by torch (its own summation order), top-k by
    fp4moe.route (the library's routing). Returns (ids int32, weights float32) [T][top_k]."""
    router, bias = make_router(cfg, seed)
    logits = x.float().cpu() @ torch.from_numpy(router).t()
    ids, w = fp4moe.route(cfg, logits.contiguous().numpy(), bias)
    return torch.from_numpy(ids).to(x.device), torch.from_numpy(w).to(x.device)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class PcieStep:
    """One rank's MoE step in the PCIe mode. weights: the shard's (make_weights(cfg, seed,
    *shard_of(E, world, rank))). Call with the rank's own tokens x (BF16 [T_own][hidden]: the
    whole batch in replicate mode, its T/W slice in allgather mode) and, for external routing,
    their ids / weights; returns (y_own float32 [T_own][hidden], phase seconds). y_own is a
    view of a buffer the next call overwrites."""

    def __init__(self, cfg, weights, *, rank, world, mode, tokens, device="cpu", routing="internal", group=None):
        check_args(cfg.n_experts, world, mode, tokens, routing)
        self.first, self.n_local = shard_of(cfg.n_experts, world, rank)
        self.rank, self.world, self.mode, self.routing, self.group = rank, world, mode, routing, group
        self.device, self.tokens = torch.device(device), tokens
        self.own = tokens if mode == "replicate" else tokens // world
        self.moe = MoE(cfg, weights, device=self.device, max_tokens=tokens, out_dtype=torch.float32,
                       first_expert=self.first, n_local=self.n_local)
        H, k, dev = cfg.hidden, cfg.top_k, self.device
        self.out = torch.empty((tokens, H), dtype=torch.float32, device=dev)
        if mode == "allgather":
            self.x_all = torch.empty((tokens, H), dtype=torch.bfloat16, device=dev)
            if routing == "external":
                self.ids_all = torch.empty((tokens, k), dtype=torch.int32, device=dev)
                self.w_all = torch.empty((tokens, k), dtype=torch.float32, device=dev)

    def close(self):
        self.moe.close()

    def __call__(self, x, topk_ids=None, topk_weights=None):
        if tuple(x.shape) != (self.own, self.moe.hidden):
            raise ValueError(f"x: expected this rank's {self.own} tokens [{self.own}][{self.moe.hidden}] "
                             f"({self.mode} mode, world size {self.world}), got {list(x.shape)}")
        if (topk_ids is None) != (self.routing == "internal") or (topk_ids is None) != (topk_weights is None):
            raise ValueError(f"topk_ids, topk_weights: {self.routing} routing takes "
                             + ("neither" if self.routing == "internal" else "both"))
        t0 = _sync(self.device)
        if self.mode == "allgather":
            dist.all_gather_single(self.x_all, x.contiguous(), group=self.group)
            if topk_ids is not None:
                dist.all_gather_single(self.ids_all, topk_ids.contiguous(), group=self.group)
                dist.all_gather_single(self.w_all, topk_weights.contiguous(), group=self.group)
                topk_ids, topk_weights = self.ids_all, self.w_all
            x = self.x_all
        t1 = _sync(self.device)
        self.moe(x, topk_ids, topk_weights, out=self.out)  # the shard's partial sum, weights applied
        t2 = _sync(self.device)
        if self.world > 1:
            dist.all_reduce(self.out, op=dist.ReduceOp.SUM, group=self.group)
        t3 = _sync(self.device)
        lo = 0 if self.mode == "replicate" else self.rank * self.own
        return self.out[lo:lo + self.own], {"all-gather": t1 - t0, "layer": t2 - t1, "all-reduce": t3 - t2}


def whole_layer(cfg, seed, x, ids=None, w=None, device="cpu"):
    """The oracle: every expert in one layer (one process) on the whole batch, FP32 output."""
    moe = MoE(cfg, make_weights(cfg, seed, 0, cfg.n_experts), device=device, max_tokens=x.shape[0],
              out_dtype=torch.float32)
    try:
        return moe(x.to(device), ids, w)
    finally:
        moe.close()


def nmse(got, want):
    g, r = got.double().cpu(), want.double().cpu()
    return float(((g - r) ** 2).sum() / (r ** 2).sum())


def run_mode(cfg, weights, seed, rank, world, mode, routing, tokens, device, iters, warmup):
    """Build this rank's step on its shard's weights, run it warmup + iters times on the same
    tokens; returns (y_own on the CPU, {phase: [seconds per iteration]}, this rank's routing or None)."""
    dev = torch.device(device)
    x_all = make_tokens(seed, tokens, cfg.hidden).to(dev)
    step = PcieStep(cfg, weights, rank=rank, world=world, mode=mode, tokens=tokens, device=dev, routing=routing)
    own = slice(0, tokens) if mode == "replicate" else slice(rank * step.own, (rank + 1) * step.own)
    x = x_all[own].contiguous()
    route = gate(cfg, seed, x) if routing == "external" else None  # this rank's tokens only
    times = {p: [] for p in PHASES}
    try:
        for i in range(warmup + iters):
            step.out.fill_(float("nan"))  # poisoned: an element the step does not write fails the check
            if mode == "allgather":
                step.x_all.fill_(float("nan"))  # a slice the all-gather does not fill: the layer refuses NaN x
            y, t = step(x, *(route or ()))
            if i >= warmup:
                for p in PHASES:
                    times[p].append(t[p])
        y = y.cpu().clone()
    finally:
        step.close()
    return y, times, route


def _rank_main(rank, world, args, init):
    """One process: join the group, run each mode, rank 0 checks and prints; returns rank 0's report."""
    device = args.device if args.device == "cpu" else f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}"
    if device != "cpu":
        torch.cuda.set_device(torch.device(device))
    backend = "gloo" if device == "cpu" else "nccl"
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.timeout))
    cfg = make_config(args.hidden, args.inter, args.experts, args.top_k)
    report = []
    try:
        weights = make_weights(cfg, args.seed, *shard_of(cfg.n_experts, world, rank))
        for mode in args.mode:
            y, times, route = run_mode(cfg, weights, args.seed, rank, world, mode, args.routing, args.tokens,
                                       device, args.iters, args.warmup)
            ys = [torch.empty_like(y) for _ in range(world)]
            dist.all_gather_object(ys, y)
            med = {p: statistics.median(v) for p, v in times.items()}
            meds = [None] * world
            dist.all_gather_object(meds, med)
            if route is not None:
                routes = [None] * world
                dist.all_gather_object(routes, tuple(t.cpu() for t in route))
            if rank:
                continue
            ids = w = None
            if mode == "replicate":  # every rank holds the whole batch's result: the same bits
                got, same = ys[0], all(torch.equal(ys[0], yr) for yr in ys)
                if route is not None:
                    ids, w = routes[0]
            else:  # rank r holds tokens [r*T/W, (r+1)*T/W)
                got, same = torch.cat(ys), True
                if route is not None:
                    ids, w = torch.cat([r[0] for r in routes]), torch.cat([r[1] for r in routes])
            x_all = make_tokens(args.seed, args.tokens, cfg.hidden)
            want = whole_layer(cfg, args.seed, x_all, ids, w, "cpu" if device == "cpu" else device).cpu()
            finite = bool(torch.isfinite(got).all())
            e = nmse(got, want) if finite else float("nan")
            bound = BOUND["cpu" if device == "cpu" else "cuda"]
            report.append({"mode": mode, "nmse": e, "bound": bound, "finite": finite, "ranks_equal": same,
                           "ok": finite and same and e <= bound,
                           "median_s": {p: max(m[p] for m in meds) for p in PHASES},
                           "per_rank_s": meds})
    finally:
        dist.destroy_process_group()
    return report


def _spawned(rank, world, args, init, queue):
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world)))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    try:
        queue.put((rank, _rank_main(rank, world, args, init), None))
    except BaseException as ex:  # noqa: BLE001 - reported to the parent, which exits non-zero
        queue.put((rank, None, f"{type(ex).__name__}: {ex}"))
        raise


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def print_report(report, args, world, backend):
    print(f"ep_pcie: world {world} ({backend}), hidden {args.hidden}, inter {args.inter}, experts {args.experts} "
          f"({args.experts // world} per rank), top-{args.top_k}, {args.tokens} tokens, routing {args.routing}, "
          f"seed {args.seed}, {args.iters} iterations")
    for r in report:
        m = r["median_s"]
        print(f"  {r['mode']:9s}  NMSE vs the whole layer {r['nmse']:.3g} (bound {r['bound']:g})"
              f"{'' if r['ranks_equal'] else '  RANKS DIFFER'}  {'ok' if r['ok'] else 'FAIL'}")
        print("             median ms (slowest rank): " + ", ".join(f"{p} {m[p] * 1e3:.3f}" for p in PHASES))


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--world", type=int, default=0, help="processes to spawn (default: torchrun's WORLD_SIZE, else 2)")
    p.add_argument("--mode", choices=MODES + ("both",), default="both")
    p.add_argument("--routing", choices=ROUTINGS, default="internal")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu: gloo; cuda: nccl, one GPU a rank")
    p.add_argument("--glm5", action="store_true", help="GLM-5's shape: hidden 6144, inter 2048, 256 experts, top-8")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--inter", type=int, default=256)
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--tokens", type=int, default=16, help="tokens in the whole batch")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=None, help="default: fresh, printed")
    p.add_argument("--timeout", type=float, default=120, help="seconds a collective may wait")
    a = p.parse_args(argv)
    if a.glm5:
        a.hidden, a.inter, a.experts, a.top_k = GLM5["hidden"], GLM5["inter"], GLM5["experts"], GLM5["top_k"]
    a.mode = list(MODES) if a.mode == "both" else [a.mode]
    if a.seed is None:
        a.seed = int(np.random.SeedSequence().entropy % 2**31)
    return a


def main(argv=None):
    args = parse(argv)
    under_torchrun = "WORLD_SIZE" in os.environ and "RANK" in os.environ and not args.world
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun else (args.world or 2)
    try:
        for mode in args.mode:
            check_args(args.experts, world, mode, args.tokens, args.routing)
    except ValueError as ex:
        print(f"ep_pcie: {ex}", file=sys.stderr)
        return 2
    backend = "gloo" if args.device == "cpu" else "nccl"
    if under_torchrun:
        report = _rank_main(int(os.environ["RANK"]), world, args, "env://")
        if int(os.environ["RANK"]):
            return 0
    else:
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        queue, init = ctx.Queue(), f"tcp://127.0.0.1:{free_port()}"
        procs = [ctx.Process(target=_spawned, args=(r, world, args, init, queue)) for r in range(world)]
        for pr in procs:
            pr.start()
        report, errors, heard = None, [], set()
        while len(heard) < world:  # a rank that dies without a word ends the wait
            try:
                r, rep, err = queue.get(timeout=1)
            except queue_mod.Empty:
                dead = [i for i, pr in enumerate(procs) if pr.exitcode not in (None, 0) and i not in heard]
                if dead:
                    errors += [f"rank {i} exited with {procs[i].exitcode} and no report" for i in dead]
                    break
                continue
            heard.add(r)
            report = rep if r == 0 else report
            errors += [f"rank {r}: {err}"] if err else []
        for pr in procs:
            pr.join(timeout=60)
            if pr.is_alive():
                pr.kill()
        if errors or report is None:
            print("ep_pcie: " + "; ".join(errors or ["rank 0 reported nothing"]), file=sys.stderr)
            return 1
    print_report(report, args, world, backend)
    return 0 if all(r["ok"] for r in report) else 1


if __name__ == "__main__":
    sys.exit(main())
