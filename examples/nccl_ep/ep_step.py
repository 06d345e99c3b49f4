#!/usr/bin/env python3
"""One rank's expert-parallel MoE step on NCCL EP from Python (issue 35, item 2, the Python side of
examples/nccl_ep/ep_step.c):

    handle.update -> handle.dispatch -> fp4moe MoE.dispatched -> handle.combine

on the current stream, run eagerly, timed per phase, then captured into one CUDA graph
(torch.cuda.graph) and replayed, for a GLM-5-shaped layer (flags shrink it), and checked against
fp4moe's whole layer (every expert, one GPU) on the same tokens and routing.

    torchrun --nproc-per-node 8 examples/nccl_ep/ep_step.py --mode ll --tokens 16
    torchrun --nproc-per-node 2 examples/nccl_ep/ep_step.py --mode ht --hidden 1024 --inter 512 --experts 16

Needs the project's NCCL EP venv (scripts/deps.sh --nccl-ep: nccl-extensions 0.1.0 with NCCL
2.30.7, the `nccl.ep` Python package) plus torch and fp4moe's Python package (PYTHONPATH=python,
FP4MOE_LIBRARY=<build>/python/libfp4moe.so of a CUDA build); one GPU per rank.

Modes, as in the C example (both with NCCL EP's expert-major layout, which is fp4moe's):
  ll  low latency: dispatch writes recv [n_local][W*T][H] BF16 and the per-expert counts
      (LayoutInfo.expert_counters, dispatch time) -> MoE.dispatched(recv, counts=...), capacity
      W*T; the combine applies the routing weights (CombineOutputs.topk_weights), so fp4moe
      returns the experts' plain rows.
  ht  high throughput: dispatch writes recv [S][H] (S = max_recv_tokens_per_rank = W*T*min(K,
      n_local)) with the per-slot routing weights; expert_offsets [n_local] and recv_total_counter
      [1] (handle time) are written into one int32 tensor of n_local + 1 = fp4moe's offsets, and
      fp4moe applies the weights (MoE.dispatched(recv, offsets=..., weights=...); the bindings pass
      S as max_rows, so the plan is that of S rows' bucket).
The expert rows fp4moe returns are new tensors (the torch op allocates its output); inside the
graph their addresses are the graph pool's, fixed at capture, and the combine's descriptor is
built from them there.

Status: NOT RUN. Written against nccl-extensions 0.1.0's Python API (its nccl/ep/*.py, read
from the wheel) on a machine without a GPU or NCCL EP; no multi-GPU machine was lent (issue 36
runs it). Expect to fix details when it first runs.
"""
import argparse
import os
import statistics
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ep_pcie import GLM5, make_config, make_tokens, make_weights, gate, shard_of, whole_layer, nmse  # noqa: E402

from fp4moe.torch_ops import MoE  # noqa: E402

BOUND = 1e-4  # the cuda backend's NMSE bound (fm_layer_accuracy, docs/accuracy.md); BF16 rows add ~1e-6


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("ll", "ht"), default="ll")
    p.add_argument("--tokens", type=int, default=16, help="tokens per rank (T)")
    p.add_argument("--hidden", type=int, default=GLM5["hidden"])
    p.add_argument("--inter", type=int, default=GLM5["inter"])
    p.add_argument("--experts", type=int, default=GLM5["experts"])
    p.add_argument("--topk", type=int, default=GLM5["top_k"])
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args(argv)


class Step:
    """The rank's NCCL EP group, handle and buffers, and fp4moe's shard."""

    def __init__(self, args, rank, world, device):
        import nccl.ep as ep
        from nccl.ep.interop.torch import get_nccl_comm_from_group

        self.ep, self.ll, self.device = ep, args.mode == "ll", device
        T, H, K = args.tokens, args.hidden, args.topk
        self.cfg = make_config(H, args.inter, args.experts, K)
        self.first, self.n_local = shard_of(args.experts, world, rank)
        # a rank receives at most W*T tokens' rows: max_tokens = W*T covers W*T*top_k rows
        self.moe = MoE(self.cfg, make_weights(self.cfg, args.seed, self.first, self.n_local), device=device,
                       max_tokens=world * T, out_dtype=torch.bfloat16, first_expert=self.first,
                       n_local=self.n_local)
        self.comm = get_nccl_comm_from_group()
        slots = world * T * min(K, self.n_local)
        gc = ep.GroupConfig(algorithm=ep.Algorithm.LOW_LATENCY if self.ll else ep.Algorithm.HIGH_THROUGHPUT,
                            num_experts=args.experts, max_dispatch_tokens_per_rank=T, max_token_bytes=2 * H,
                            max_recv_tokens_per_rank=0 if self.ll else slots, num_topk=K)
        self.group = ep.Group.create(self.comm, gc)
        self.x = torch.empty((T, H), dtype=torch.bfloat16, device=device)
        self.ids = torch.empty((T, K), dtype=torch.int64, device=device)  # NCCL EP takes int64 ids
        self.w = torch.empty((T, K), dtype=torch.float32, device=device)
        self.out = torch.empty((T, H), dtype=torch.bfloat16, device=device)
        s = torch.cuda.current_stream(device)
        if self.ll:
            self.recv = torch.empty((self.n_local, world * T, H), dtype=torch.bfloat16, device=device)
            self.counts = torch.zeros(self.n_local, dtype=torch.int32, device=device)
            self.handle = self.group.create_handle(ep.Layout.EXPERT_MAJOR, ep.Tensor(self.ids), stream=s)
        else:
            self.recv = torch.empty((slots, H), dtype=torch.bfloat16, device=device)
            self.recv_w = torch.empty(slots, dtype=torch.float32, device=device)
            self.offs = torch.zeros(self.n_local + 1, dtype=torch.int32, device=device)
            self.layout = ep.LayoutInfo(expert_offsets=ep.Tensor(self.offs[:self.n_local]),
                                        recv_total_counter=ep.Tensor(self.offs[self.n_local:]))
            self.handle = self.group.create_handle(ep.Layout.EXPERT_MAJOR, ep.Tensor(self.ids),
                                                   layout_info=self.layout, stream=s)

    def load(self, x, ids, w):
        self.x.copy_(x), self.ids.copy_(ids), self.w.copy_(w)

    def __call__(self, ev=None):
        """Enqueue the step on the current stream; ev: 4 CUDA events around its phases, or None."""
        ep, s = self.ep, torch.cuda.current_stream(self.device)
        if ev:
            ev[0].record(s)
        if self.ll:
            self.handle.update(ep.Tensor(self.ids), stream=s)
            self.handle.dispatch(ep.DispatchInputs(tokens=ep.Tensor(self.x)),
                                 ep.DispatchOutputs(tokens=ep.Tensor(self.recv)),
                                 layout_info=ep.LayoutInfo(expert_counters=ep.Tensor(self.counts)), stream=s)
        else:
            self.handle.update(ep.Tensor(self.ids), layout_info=self.layout, stream=s)
            self.handle.dispatch(ep.DispatchInputs(tokens=ep.Tensor(self.x), topk_weights=ep.Tensor(self.w)),
                                 ep.DispatchOutputs(tokens=ep.Tensor(self.recv), topk_weights=ep.Tensor(self.recv_w)),
                                 stream=s)
        if ev:
            ev[1].record(s)
        if self.ll:  # plain rows: NCCL EP LL's combine applies the routing weights
            y = self.moe.dispatched(self.recv, counts=self.counts)
        else:  # HT: fp4moe's FC2 epilogue multiplies each row by its weight
            y = self.moe.dispatched(self.recv, offsets=self.offs, weights=self.recv_w)
        if ev:
            ev[2].record(s)
        outs = ep.CombineOutputs(tokens=ep.Tensor(self.out), topk_weights=ep.Tensor(self.w) if self.ll else None)
        self.handle.combine(ep.CombineInputs(tokens=ep.Tensor(y)), outs, stream=s)
        if ev:
            ev[3].record(s)
        self._keep = y  # alive until the next step (the combine reads it asynchronously)
        return self.out


def main(argv=None):
    args = parse(argv)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count())))
    torch.cuda.set_device(device)
    step = Step(args, rank, world, device)
    T = args.tokens
    x_all = make_tokens(args.seed, world * T, args.hidden)  # every rank can make the whole batch
    ids_all, w_all = gate(step.cfg, args.seed, x_all)  # the engine's gate, the same on every rank
    lo = rank * T
    step.load(x_all[lo:lo + T].to(device), ids_all[lo:lo + T].to(device).long(), w_all[lo:lo + T].to(device))
    eager = step().clone()  # the first step also loads NCCL EP's kernels, outside any capture
    step.moe.errors()  # raises on bad counts / offsets or NaN rows the device recorded
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
    phases = {"dispatch": [], "fp4moe": [], "combine": []}
    for _ in range(args.replays):
        step(ev)
        ev[3].synchronize()
        for k, (a, b) in zip(phases, ((0, 1), (1, 2), (2, 3))):
            phases[k].append(ev[a].elapsed_time(ev[b]) * 1e3)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    t_graph = []
    for _ in range(args.replays):
        ev[0].record()
        graph.replay()
        ev[1].record()
        ev[1].synchronize()
        t_graph.append(ev[0].elapsed_time(ev[1]) * 1e3)
    replayed = step.out.clone()
    same = torch.equal(replayed, eager)
    want = whole_layer(step.cfg, args.seed, x_all, ids_all, w_all, device=device)[lo:lo + T]
    err = nmse(eager.float(), want)
    ok = same and err <= BOUND and bool(torch.isfinite(eager.float()).all())
    med = {k: statistics.median(v) for k, v in phases.items()}
    print(f"rank {rank}/{world} {args.mode}: dispatch {med['dispatch']:.1f} us, fp4moe {med['fp4moe']:.1f} us, "
          f"combine {med['combine']:.1f} us; graph step {statistics.median(t_graph):.1f} us; replay "
          f"{'=' if same else '!='} eager; NMSE vs the whole layer {err:.3e} (bound {BOUND:.0e}): "
          f"{'PASS' if ok else 'FAIL'}", flush=True)
    step.moe.close()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
