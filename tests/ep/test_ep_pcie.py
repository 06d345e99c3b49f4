"""The PCIe expert-parallel step of examples/ep_pcie.py (issue 35, item 4) over 1, 2 and 4 ranks:
spawned processes, torch.distributed with gloo on the CPU, fp4moe's CPU backend.

Each rank builds the example's PcieStep for its shard (experts [r*E/W, (r+1)*E/W)) and runs it in
both modes (replicate: every rank holds the whole batch; allgather: T/W tokens each, gathered),
with the layer's own routing and with an engine's routing (external ids / weights that travel
with the tokens). Weights and tokens are fresh each run (FM_SEED printed; FM_SEED=<n> replays).
Before each run the step's output buffer (and the all-gather buffer) is filled with NaN, so an
element the step does not write fails. The oracle is the whole layer in one process, through
fp4moe.Layer (the numpy API, not the example's torch path), on the same tokens and routing.

Checks, in order: NaN/Inf in a rank's output; then NMSE vs the whole layer <= 1e-9, the bound
docs/accuracy.md gives where only the FP32 summation order differs (row "fast cpu vs cpu-ref";
fm_layer_accuracy's cpu entry): a rank's shard sums its slots of a token, the all-reduce sums
the ranks, the whole layer sums all slots in one pass; seen ~5e-15. In replicate mode every
rank's result must be the same bits (gloo's all-reduce hands every rank one reduction). One
shard's partial sum alone (no all-reduce) must be far outside the bound (NMSE > 1e-3), so the
check sees a missing rank. Bad input: experts not divisible by the world size, tokens not
divisible in allgather mode, unknown mode / routing are ValueErrors naming the argument, raised
on every rank before any collective (the group still answers a barrier afterwards: no hang), and
the example's command line exits 2 with the message before starting any process.
"""
import os
import queue as queue_mod
import subprocess
import sys
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.multiprocessing as mp  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "examples")
sys.path.insert(0, EXAMPLES)
import ep_pcie  # noqa: E402

import fp4moe  # noqa: E402

H, I, E, K = 128, 64, 8, 4
BOUND = 1e-9  # docs/accuracy.md, see the module docstring
CASES = [("replicate", "internal", 7), ("replicate", "external", 1), ("allgather", "internal", 12),
         ("allgather", "external", 4)]
TIMEOUT = int(os.environ.get("FM_EP_TIMEOUT", 150))


def _seed():
    seed = int(os.environ.get("FM_SEED", np.random.SeedSequence().entropy % 2**31))
    print(f"FM_SEED={seed}")
    return seed


def _cfg():
    return ep_pcie.make_config(H, I, E, K)


def _rank(rank, world, init, seed, queue):
    """One spawned rank: every case through the example's PcieStep, then the bad shard."""
    import datetime

    import torch.distributed as dist

    torch.set_num_threads(1)
    out = []
    try:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60))
        cfg = _cfg()
        first, n_local = ep_pcie.shard_of(E, world, rank)
        W = ep_pcie.make_weights(cfg, seed, first, n_local)
        for mode, routing, T in CASES:
            step = ep_pcie.PcieStep(cfg, W, rank=rank, world=world, mode=mode, tokens=T, routing=routing)
            x_all = ep_pcie.make_tokens(seed + T, T, H)
            own = slice(0, T) if mode == "replicate" else slice(rank * (T // world), (rank + 1) * (T // world))
            x = x_all[own].contiguous()
            route = ep_pcie.gate(cfg, seed, x) if routing == "external" else None
            step.out.fill_(float("nan"))
            if mode == "allgather":
                step.x_all.fill_(float("nan"))
            y, times = step(x, *(route or ()))
            partial = None
            if rank == 0 and world > 1:  # the shard alone on the whole batch, not all-reduced
                full = None
                if routing == "external":
                    full = ep_pcie.gate(cfg, seed, x_all)
                partial = step.moe(x_all, *(full or ())).numpy().copy()
            out.append((mode, routing, T, y.numpy().copy(), None if route is None else [t.numpy() for t in route],
                        partial, times))
            step.close()
        bad = None
        if world > 1:  # a shard that does not divide: every rank refuses before any collective
            try:
                ep_pcie.PcieStep(ep_pcie.make_config(H, I, E * world + 1, K), W, rank=rank, world=world,
                                 mode="replicate", tokens=4)
                bad = "no error"
            except ValueError as ex:
                bad = str(ex)
        dist.barrier()  # the group still answers: nobody is left waiting in a collective
        dist.destroy_process_group()
        queue.put((rank, out, bad, None))
    except BaseException as ex:  # noqa: BLE001 - reported to the test
        queue.put((rank, None, None, f"{type(ex).__name__}: {ex}"))
        raise


def _spawn(world, seed):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    init = f"tcp://127.0.0.1:{ep_pcie.free_port()}"
    old = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # the children's fp4moe: one thread a rank on 2 cores
    try:
        procs = [ctx.Process(target=_rank, args=(r, world, init, seed, queue)) for r in range(world)]
        for p in procs:
            p.start()
    finally:
        if old is None:
            os.environ.pop("OMP_NUM_THREADS")
        else:
            os.environ["OMP_NUM_THREADS"] = old
    got, deadline = {}, time.monotonic() + TIMEOUT
    try:
        while len(got) < world:  # a rank that dies or hangs fails the test, never blocks it
            try:
                r, out, bad, err = queue.get(timeout=1)
            except queue_mod.Empty:
                dead = [(i, p.exitcode) for i, p in enumerate(procs) if p.exitcode not in (None, 0) and i not in got]
                assert not dead, f"rank(s) exited without a result (rank, exit code): {dead}"
                assert time.monotonic() < deadline, f"no result from ranks {sorted(set(range(world)) - set(got))} " \
                                                    f"after {TIMEOUT} s"
                continue
            assert err is None, f"rank {r} of {world} failed: {err}"
            got[r] = (out, bad)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return got


def _bits(x):
    return x.view(torch.int16).numpy().view(np.uint16)


def _whole(seed, x, route):
    """The oracle: every expert in one fp4moe.Layer (numpy API), FP32 output."""
    cfg = _cfg()
    with fp4moe.Layer(cfg, ep_pcie.make_weights(cfg, seed, 0, E), backend="cpu", max_tokens=x.shape[0],
                      out_dtype="f32") as layer:
        return layer.run(_bits(x), *(route or ())).astype(np.float64)


def _nmse(got, want):
    return float(((got.astype(np.float64) - want) ** 2).sum() / (want ** 2).sum())


@pytest.mark.parametrize("world", [1, 2, 4])
def test_pcie_step_equals_whole_layer(world):
    seed = _seed()
    got = _spawn(world, seed)
    for c, (mode, routing, T) in enumerate(CASES):
        ys = [got[r][0][c][3] for r in range(world)]
        for r, y in enumerate(ys):  # NaN / Inf first: a poisoned element left unwritten shows here
            assert np.isfinite(y).all(), f"world {world} {mode}/{routing} T={T}: rank {r}'s output has NaN/Inf"
        x_all = ep_pcie.make_tokens(seed + T, T, H)
        if mode == "replicate":
            for r in range(1, world):
                assert np.array_equal(ys[r], ys[0]), f"{mode}/{routing}: rank {r}'s result differs from rank 0's"
            y, route = ys[0], got[0][0][c][4]
        else:
            y = np.concatenate(ys)
            route = None if routing == "internal" else \
                [np.concatenate([got[r][0][c][4][i] for r in range(world)]) for i in (0, 1)]
        want = _whole(seed, x_all, route)
        e = _nmse(y, want)
        times = got[0][0][c][6]
        print(f"world {world} {mode:9s} {routing:8s} T={T:2d}: NMSE {e:.3g} (bound {BOUND:g}); rank 0 ms "
              + ", ".join(f"{p} {times[p] * 1e3:.2f}" for p in ep_pcie.PHASES))
        assert e <= BOUND, f"world {world} {mode}/{routing} T={T}: all-reduced shards vs the whole layer NMSE {e:.3g}"
        partial = got[0][0][c][5]
        if world > 1:
            ep = _nmse(partial, want)
            assert ep > 1e-3, f"rank 0's shard alone is within {ep:.3g} of the whole layer: the check sees nothing"
    for r in range(world if world > 1 else 0):
        bad = got[r][1]
        assert "do not split evenly over world size" in bad, f"rank {r}: {bad}"


def test_bad_input_refused_before_any_collective():
    cfg = _cfg()
    with pytest.raises(ValueError, match=r"experts: 30 experts do not split evenly over world size 4"):
        ep_pcie.shard_of(30, 4, 0)
    with pytest.raises(ValueError, match=r"tokens: 6 tokens do not split evenly over world size 4"):
        ep_pcie.check_args(8, 4, "allgather", 6)
    ep_pcie.check_args(8, 4, "replicate", 6)  # replicate: any T
    with pytest.raises(ValueError, match="mode: expected one of"):
        ep_pcie.check_args(8, 2, "alltoall", 4)
    with pytest.raises(ValueError, match="routing: expected one of"):
        ep_pcie.check_args(8, 2, "replicate", 4, "engine")
    with pytest.raises(ValueError, match="rank 2 of world size 2"):
        ep_pcie.shard_of(8, 2, 2)
    W = ep_pcie.make_weights(cfg, 1, 0, E // 3 + 1)
    # no process group exists here: the constructor refuses before it could reach one
    with pytest.raises(ValueError, match="8 experts do not split evenly over world size 3"):
        ep_pcie.PcieStep(cfg, W, rank=0, world=3, mode="replicate", tokens=4)
    step = ep_pcie.PcieStep(cfg, ep_pcie.make_weights(cfg, 1, 0, E), rank=0, world=1, mode="replicate", tokens=4)
    try:
        with pytest.raises(ValueError, match=r"x: expected this rank's 4 tokens \[4\]\[128\]"):
            step(ep_pcie.make_tokens(1, 3, H))
        with pytest.raises(ValueError, match="internal routing takes neither"):
            x = ep_pcie.make_tokens(1, 4, H)
            step(x, *ep_pcie.gate(cfg, 1, x))
    finally:
        step.close()


def test_command_line_refuses_before_spawning():
    env = dict(os.environ)
    for argv, msg in ((["--world", "3", "--experts", "8"], "8 experts do not split evenly over world size 3"),
                      (["--world", "4", "--tokens", "6", "--mode", "allgather"],
                       "6 tokens do not split evenly over world size 4")):
        p = subprocess.run([sys.executable, os.path.join(EXAMPLES, "ep_pcie.py"), *argv], env=env,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and msg in p.stderr, (p.returncode, p.stdout, p.stderr)
