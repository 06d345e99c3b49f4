"""close() from one thread while another calls: the call in flight completes and close waits
for it, or the call raises fp4moe.ClosedError naming the object; never a call on a freed
library object (which segfaulted, or read freed weights unseen). Each object holds a lock
across every C call that uses its handle, and close takes it too (docs/python.md)."""

import threading

import numpy as np
import pytest

import fp4moe
from conftest import closed, make_layer, make_x, race, write_modelopt

ROUNDS = 12  # close at a different moment each round


@pytest.mark.parametrize("backend", ["cpu", "cpu-ref"])
def test_layer_close_during_run(rng, backend):
    cfg, W, _ = make_layer(rng, "nvfp4", E=16, k=4, H=256, I=256)
    bits, _ = make_x(rng, 8, cfg.hidden)
    with fp4moe.Layer(cfg, W, backend=backend, max_tokens=8) as L:
        want = L.run(bits)
    for _ in range(ROUNDS):
        L = fp4moe.Layer(cfg, W, backend=backend, max_tokens=8)
        n, exc = race(lambda: L.run(bits), L.close, lambda y: np.testing.assert_array_equal(y, want))
        closed(exc, "Layer")
        assert n >= 1
        with pytest.raises(fp4moe.ClosedError, match="^Layer is closed$"):
            L.run(bits)
        with pytest.raises(fp4moe.ClosedError, match="^Layer is closed$"):
            L.plan(1)
        L.close()  # twice: nothing


def test_layer_runs_from_threads(rng):
    """Several threads on one layer: the calls take turns (its run arguments and buffers are
    shared), each gets its own output."""
    cfg, W, _ = make_layer(rng, "nvfp4", E=8, k=2)
    xs = [make_x(rng, 1 + i % 4, cfg.hidden)[0] for i in range(4)]
    with fp4moe.Layer(cfg, W, backend="cpu", max_tokens=4) as L:
        want = [L.run(x) for x in xs]
        bad = []

        def work(i):
            for _ in range(200):
                if not np.array_equal(L.run(xs[i]), want[i]):
                    bad.append(i)
        ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        assert not bad


@pytest.fixture
def ckpt(rng, tmp_path):
    cfg, W, _ = make_layer(rng, "nvfp4", E=8, k=2, H=128, I=64)
    path = tmp_path / "model.safetensors"
    write_modelopt(path, cfg, W)
    return str(path), cfg, W


def test_checkpoint_close_during_calls(ckpt):
    path, cfg, W = ckpt
    name = "model.layers.0.mlp.experts.3.down_proj.weight"
    calls = [lambda ck: ck.tensor(name), lambda ck: ck.names(), lambda ck: ck.scan(),
             lambda ck: ck.load_layer(0, routing=cfg).close(), lambda ck: ck.load_shard(0, 2, 4, routing=cfg)]
    for i in range(ROUNDS):
        ck = fp4moe.Checkpoint(path)
        call = calls[i % len(calls)]
        n, exc = race(lambda: call(ck), ck.close)
        closed(exc, "Checkpoint")
        with pytest.raises(fp4moe.ClosedError, match="^Checkpoint is closed$"):
            ck.tensor(name)
    with fp4moe.Checkpoint(path) as ck:
        assert np.array_equal(ck.tensor(name), W.w2_data[3])


def test_loaded_layer_close_during_use(ckpt, rng):
    path, cfg, W = ckpt
    bits, _ = make_x(rng, 2, cfg.hidden)
    with fp4moe.Checkpoint(path) as ck:
        lw = ck.load_layer(0, routing=cfg)
        with fp4moe.Layer(None, lw, max_tokens=2) as L:
            want = L.run(bits)
        lw.close()
        for i in range(ROUNDS):
            lw = ck.load_layer(0, routing=cfg)
            if i % 2:
                def make():
                    with fp4moe.Layer(None, lw, max_tokens=2) as L:
                        return L.run(bits)
                n, exc = race(make, lw.close, lambda y: np.testing.assert_array_equal(y, want))
            else:
                n, exc = race(lw.weights, lw.close, lambda w: np.testing.assert_array_equal(w.w2_data, W.w2_data))
            closed(exc, "LoadedLayer")
            with pytest.raises(fp4moe.ClosedError, match="^LoadedLayer is closed$"):
                lw.weights()
            with pytest.raises(fp4moe.ClosedError, match="^LoadedLayer is closed$"):
                fp4moe.Layer(None, lw)
