"""Real NVFP4 checkpoints (tests/model/fixtures, written by ModelOpt and llmcompressor) run in
transformers with fp4moe experts, on the CPU: Qwen3-MoE and DeepSeek-V3 (sigmoid routing with a
correction bias and group limits, a shared expert: all transformers' own, the routed experts
fp4moe's), each as ModelOpt NVFP4, compressed-tensors NVFP4 (W4A4) and NVFP4A16; and gpt-oss
MXFP4 (its interleaved, transposed, biased experts with the clamped SwiGLU: fp4moe's loader
de-interleaves them, the oracle dequantizes the stored blocks in transformers' layout).

The model is transformers' own class built from the fixture's config.json; its non-expert weights
come from the checkpoint (BF16 tensors as stored; the NVFP4 attention projections dequantized, the
same in both models). The fp4moe model's experts are the checkpoint's FP4 tensors as fp4moe's
loader takes them (fp4moe.Checkpoint.load_layer: nothing re-quantized; where an expert's gate and
up global scales differ, the loader re-encodes the block scales to one w13 global). The oracle is
transformers' own model with every expert linear dequantized from the checkpoint with its own
scales (E2M1 x E4M3 x global, numpy, exact in float32), "eager" experts.

Activations stay BF16 in fp4moe's experts (W4A16: the W4A4 fixture's input scales are not applied,
as transformers' dequantized model does not apply them either).

Bounds: the MoE block on BF16-valued inputs, NMSE <= 1e-10 against the oracle when every expert's
gate and up global scales agree (then the FP4 values are the same: only the FP32 summation order
differs); where they differ, the re-encoding of E4M3 block scales moves a block by up to 2^-4
relative, and the bound is 1e-3 (the fixture's measured value is printed). generate(): 32 greedy
tokens equal to the oracle's with the "bf16-input eager" experts (test_transformers_experts.py says
why), under the same tie rule as there.
"""
import copy
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/deps.sh --engines installs it)")
transformers = pytest.importorskip("transformers",
                                   reason="transformers is not installed (scripts/deps.sh --engines installs it)")

import fp4moe  # noqa: E402
from fp4moe import transformers_experts as fx  # noqa: E402

from test_transformers_experts import SEED, STEPS, _bf16_input_eager, _nmse  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "model", "fixtures")
CKPTS = ["modelopt-nvfp4-qwen3moe", "ct-nvfp4-qwen3moe", "ct-nvfp4a16-qwen3moe",
         "modelopt-nvfp4-dsv3", "ct-nvfp4-dsv3", "ct-nvfp4a16-dsv3", "mxfp4-gptoss"]


def _tensors(path):
    from safetensors import safe_open

    with safe_open(path, "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _dequant(t, prefix):
    """float32 [N][K] of one NVFP4 linear as stored (ModelOpt or compressed-tensors names)."""
    if prefix + ".weight_packed" in t:  # compressed-tensors: the global scale is the reciprocal
        data, g = t[prefix + ".weight_packed"], 1.0 / float(t[prefix + ".weight_global_scale"].reshape(-1)[0])
    else:
        data, g = t[prefix + ".weight"], float(t[prefix + ".weight_scale_2"].reshape(-1)[0])
    sc = t[prefix + ".weight_scale"].view(torch.uint8).numpy()
    q = fp4moe.qtensor("nvfp4", data.numpy(), sc, g)
    return torch.from_numpy(fp4moe.dequantize(q))


def _build(name, oracle):
    """(fp4moe model, oracle, gate/up global scales equal everywhere?)"""
    from transformers import AutoConfig, AutoModelForCausalLM

    ck = os.path.join(FIXTURES, name, "checkpoint")
    with open(os.path.join(ck, "config.json")) as f:
        c = json.load(f)
    c.pop("quantization_config", None)  # the model is built dequantized; fp4moe reads the FP4 experts
    cfg = AutoConfig.for_model(c.pop("model_type"), **{k: v for k, v in c.items()
                                                       if k not in ("architectures", "torch_dtype", "dtype")})
    torch.manual_seed(SEED)
    m = AutoModelForCausalLM.from_config(cfg).float().eval()
    t = _tensors(os.path.join(ck, "model.safetensors"))
    E = getattr(cfg, "num_experts", None) or getattr(cfg, "n_routed_experts", None) or cfg.num_local_experts
    sd, same_globals = {}, True
    for k, p in m.state_dict().items():
        if ".mlp.experts." in k:
            continue
        base = k[:-len(".weight")]
        sd[k] = _dequant(t, base) if base + ".weight_scale" in t else t[k].float()
    missing = [k for k in sd if k not in m.state_dict()]
    assert not missing, missing
    m.load_state_dict(sd, strict=False)
    ref = AutoModelForCausalLM.from_config(copy.deepcopy(cfg)).float().eval()  # its own config: experts_implementation is there
    ref.load_state_dict(sd, strict=False)
    with torch.no_grad():
        for li, _, e in fx.experts_modules(ref):
            pre = f"model.layers.{li}.mlp.experts"
            if pre + ".gate_up_proj_blocks" in t:  # gpt-oss MXFP4: stored as the model holds them, transposed
                for p in ("gate_up_proj", "down_proj"):
                    blk, sc = t[f"{pre}.{p}_blocks"], t[f"{pre}.{p}_scales"]
                    deq = [fp4moe.dequantize(fp4moe.qtensor("mxfp4", blk[x].reshape(blk.shape[1], -1).numpy(),
                                                            sc[x].numpy())) for x in range(E)]
                    getattr(e, p).copy_(torch.from_numpy(np.stack(deq)).transpose(1, 2))
                    getattr(e, p + "_bias").copy_(t[f"{pre}.{p}_bias"].float())
                continue
            gu = [torch.cat([_dequant(t, f"{pre}.{x}.gate_proj"), _dequant(t, f"{pre}.{x}.up_proj")]) for x in range(E)]
            e.gate_up_proj.copy_(torch.stack(gu))
            e.down_proj.copy_(torch.stack([_dequant(t, f"{pre}.{x}.down_proj") for x in range(E)]))
            for x in range(E):
                g = [t.get(f"{pre}.{x}.{p}.weight_scale_2", t.get(f"{pre}.{x}.{p}.weight_global_scale"))
                     for p in ("gate_proj", "up_proj")]
                same_globals &= bool(torch.equal(g[0].reshape(-1), g[1].reshape(-1)))
    if oracle != "eager":
        from transformers.integrations.moe import ExpertsInterface

        ExpertsInterface.register(oracle, _bf16_input_eager)
    ref.set_experts_implementation(oracle)
    ckpt = fp4moe.Checkpoint(ck)
    for li, _, e in fx.experts_modules(m):
        loaded = ckpt.load_layer(li)
        lcfg = loaded.cfg
        lcfg.act_nvfp4 = False  # W4A16, as the dequantized oracle
        lcfg.shared_inter = 0  # the block's shared expert (DeepSeek-V3) stays transformers'
        inter = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
        assert (lcfg.n_experts, lcfg.top_k, lcfg.hidden, lcfg.inter) == (E, cfg.num_experts_per_tok,
                                                                         cfg.hidden_size, inter)
        fx.attach(e, lcfg, loaded)
    fx.register()
    m.set_experts_implementation(fx.NAME)
    return m, ref, same_globals


@pytest.mark.parametrize("name", CKPTS)
def test_checkpoint_block(name):
    m, ref, same = _build(name, "eager")
    bound = 1e-10 if same else 1e-3
    g = torch.Generator().manual_seed(SEED + 5)
    for li, _, _ in fx.experts_modules(m):  # the MoE layers (DeepSeek-V3's first is dense)
        x = torch.randn(1, 9, m.config.hidden_size, generator=g).bfloat16().float()
        with torch.no_grad():
            y, yr = m.model.layers[li].mlp(x), ref.model.layers[li].mlp(x)
            y, yr = (y[0] if isinstance(y, tuple) else y), (yr[0] if isinstance(yr, tuple) else yr)  # gpt-oss
        e = _nmse(y, yr)
        print(f"# {name}: layer {li}: NMSE {e:.3g} (gate/up globals {'equal' if same else 'differ'}; bound {bound})")
        assert e <= bound, (name, li, e)


@pytest.mark.parametrize("name", CKPTS)
def test_checkpoint_generate(name):
    m, ref, _ = _build(name, "bf16-input eager")
    g = torch.Generator().manual_seed(SEED + 6)
    prompt = torch.randint(0, m.config.vocab_size, (1, 8), generator=g)
    with torch.no_grad():
        out = m.generate(prompt, max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False)
        out_ref = ref.generate(prompt, max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False)
    got, want = out[0, 8:].tolist(), out_ref[0, 8:].tolist()
    for s in range(STEPS):
        if got[s] != want[s]:
            with torch.no_grad():
                lr = ref(out_ref[:, :8 + s]).logits[0, -1].double()
                lf = m(out_ref[:, :8 + s]).logits[0, -1].double()
            d, span = float((lr - lf).abs().max()), float(lr.max() - lr.min())
            margin = float(lr[want[s]] - lr[got[s]])
            assert d <= 1e-2 * span and margin <= 2 * d, (name, s, d, span, margin)
            print(f"# {name}: tokens equal for {s} steps; step {s} is a tie (margin {margin:.3g} <= 2 x {d:.3g})")
            return
    print(f"# {name}: {STEPS} greedy tokens equal")
