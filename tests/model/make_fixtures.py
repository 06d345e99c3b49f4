#!/usr/bin/env python3
"""Make the real-checkpoint fixtures of tests/model/: tiny random Qwen3-MoE and
DeepSeek-V3 models quantized and exported by the real tools (NVIDIA ModelOpt NVFP4,
llmcompressor / compressed-tensors NVFP4 and NVFP4A16), and a tiny gpt-oss in OpenAI's
MXFP4 checkpoint layout, each with an input of one MoE layer and that layer's output
computed by the model's own transformers code on the checkpoint's dequantized weights
(gpt-oss: transformers reads the MXFP4 checkpoint itself, Mxfp4Config(dequantize=True)).

    python3 tests/model/make_fixtures.py [--out tests/model/fixtures] [--venv build/model-venv]

Runs on a CPU (no GPU needed) in a few minutes. Without the pinned tools importable it
creates the virtual environment --venv, installs PINS into it (about 6 GB: PyPI's torch
wheel pulls in CUDA libraries even for CPU use) and re-runs itself there. Everything
random comes from --seed. See tests/model/README.md.
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from nvfp4_np import bf16_bits, bf16_value, dequant_nvfp4, read_checkpoint, to_f64  # noqa: E402
ROOT = os.path.dirname(os.path.dirname(HERE))
PINS = ["torch==2.14.0", "transformers==5.17.0", "nvidia-modelopt==0.47.0", "llmcompressor==0.14.0.1",
        "compressed-tensors==0.19.0", "numpy==2.4.6", "datasets==5.2.0", "safetensors==0.8.0"]
# (fixture name prefix, tool, scheme): the three layouts a user meets.
TOOLS = [("modelopt-nvfp4", "modelopt", "NVFP4_DEFAULT_CFG"),
         ("ct-nvfp4", "llmcompressor", "NVFP4"),
         ("ct-nvfp4a16", "llmcompressor", "NVFP4A16")]


# the gpt-oss fixture needs only these (no quantization tool: the checkpoint layout is OpenAI's)
GPTOSS = "mxfp4-gptoss"
GPTOSS_PINS = [p for p in PINS if p.split("==")[0] in ("torch", "transformers", "numpy", "safetensors")]


def have_pins(pins=None):
    try:
        from importlib.metadata import version
        return all(version(p.split("==")[0]) == p.split("==")[1] for p in pins or PINS)
    except Exception:
        return False


def bootstrap(venv):
    """Re-run this script in a venv holding PINS (created when missing)."""
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        print(f"make_fixtures: creating {venv}", flush=True)
        subprocess.check_call([sys.executable, "-m", "venv", venv])
    if subprocess.call([py, "-c", f"import sys; sys.path.insert(0, {HERE!r}); import make_fixtures as m; "
                        "sys.exit(0 if m.have_pins() else 1)"]) != 0:
        print("make_fixtures: installing " + " ".join(PINS), flush=True)
        subprocess.check_call([py, "-m", "pip", "install", "-q", *PINS])
    os.execv(py, [py, os.path.abspath(__file__), *sys.argv[1:]])


# ---- the models ---------------------------------------------------------------------------
def model_specs():
    from transformers import DeepseekV3Config, Qwen3MoeConfig
    qwen = Qwen3MoeConfig(vocab_size=256, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                          num_experts=12, num_experts_per_tok=3, norm_topk_prob=True, decoder_sparse_step=1,
                          max_position_embeddings=256, tie_word_embeddings=False,
                          architectures=["Qwen3MoeForCausalLM"])
    dsv3 = DeepseekV3Config(vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=64,
                            num_hidden_layers=3, first_k_dense_replace=1, num_attention_heads=4,
                            num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=16,
                            qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=16, n_shared_experts=1,
                            num_experts_per_tok=4, n_group=4, topk_group=2, routed_scaling_factor=2.5,
                            norm_topk_prob=True, num_nextn_predict_layers=0, max_position_embeddings=256,
                            tie_word_embeddings=False, architectures=["DeepseekV3ForCausalLM"])
    return [("qwen3moe", qwen), ("dsv3", dsv3)]


def build_base(name, cfg, seed, folder):
    """A random BF16 model saved as a plain HF folder (what a user would quantize). Routers get
    weights large enough that routing is decisive (logits ~ N(0, 1)), experts and the shared expert
    weights of std 1/sqrt(K) (outputs ~ the input's size); DeepSeek-V3 gets a random
    e_score_correction_bias, so that the bias and the group limit both change choices."""
    import torch
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    m = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for lyr in m.model.layers:
            g = getattr(lyr.mlp, "gate", None)
            if g is None or not hasattr(lyr.mlp, "experts"):
                continue
            g.weight.normal_(0.0, cfg.hidden_size ** -0.5)
            lyr.mlp.experts.gate_up_proj.normal_(0.0, cfg.hidden_size ** -0.5)
            lyr.mlp.experts.down_proj.normal_(0.0, cfg.moe_intermediate_size ** -0.5)
            sh = getattr(lyr.mlp, "shared_experts", None)
            if sh is not None:  # as large as a routed expert, so that dropping it shows
                for lin in (sh.gate_proj, sh.up_proj, sh.down_proj):
                    lin.weight.normal_(0.0, lin.in_features ** -0.5)
            if hasattr(g, "e_score_correction_bias"):
                g.e_score_correction_bias.normal_(0.0, 0.15)
    m = m.to(torch.bfloat16)
    m.save_pretrained(folder)


def calib_batches(seed, vocab, n=8, seq=24):
    import torch
    gen = torch.Generator().manual_seed(seed + 1)
    return [torch.randint(0, vocab, (seq,), generator=gen) for _ in range(n)]


def export_modelopt(base, out, seed, vocab):
    import torch
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16).eval()
    batches = calib_batches(seed, vocab)

    def loop(model):
        with torch.no_grad():
            for b in batches:
                model(b[None])
    mtq.quantize(m, mtq.NVFP4_DEFAULT_CFG, forward_loop=loop)
    export_hf_checkpoint(m, export_dir=out)
    return {"recipe": "mtq.NVFP4_DEFAULT_CFG", "export": "modelopt.torch.export.export_hf_checkpoint"}


def export_llmcompressor(base, out, seed, vocab, scheme):
    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    # oneshot wants a processor; a word-level tokenizer over the tiny vocabulary (the data are
    # token ids already, it only travels along).
    tk = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="t0", pad_token="t0")
    m = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16).eval()
    ds = Dataset.from_dict({"input_ids": [b.tolist() for b in calib_batches(seed, vocab)],
                            "attention_mask": [[1] * 24 for _ in range(8)]})
    ignore = ["lm_head", "re:.*mlp.gate$"]
    recipe = QuantizationModifier(targets="Linear", scheme=scheme, ignore=ignore)
    oneshot(model=m, processor=tok, dataset=ds, recipe=recipe, num_calibration_samples=8, max_seq_length=24)
    m.save_pretrained(out, save_compressed=True)
    return {"recipe": f"QuantizationModifier(targets='Linear', scheme='{scheme}', ignore={ignore})",
            "export": "llmcompressor.oneshot + save_pretrained(save_compressed=True)"}


# ---- the reference: the model's own MoE block on the checkpoint's values ------------------
def moe_layers(cfg):
    if cfg.model_type == "deepseek_v3":
        return list(range(cfg.first_k_dense_replace, cfg.num_hidden_layers))
    return [i for i in range(cfg.num_hidden_layers)
            if i not in cfg.mlp_only_layers and (i + 1) % cfg.decoder_sparse_step == 0]


def reference(base, ck, layout, layer, x32):
    """Load the base model in FP32 (transformers' own classes), overwrite layer L's MoE block with
    the checkpoint's values (dequantized NVFP4 experts and shared expert, router and bias as
    stored), run the block on x. Returns y [T][hidden] float32; with a shared expert also y once
    more with the shared expert's weights rounded to BF16 (what fp4moe's layer holds, see
    docs/checkpoints.md), else None; the model's top-k ids and weights; the worst expert weight
    NMSE against the unquantized base model."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    blk = m.model.layers[layer].mlp
    pre = f"model.layers.{layer}.mlp."
    E = blk.experts.num_experts
    wnmse = []
    with torch.no_grad():
        for e in range(E):
            gate = dequant_nvfp4(ck, f"{pre}experts.{e}.gate_proj", layout)
            up = dequant_nvfp4(ck, f"{pre}experts.{e}.up_proj", layout)
            down = dequant_nvfp4(ck, f"{pre}experts.{e}.down_proj", layout)
            new13 = np.concatenate([gate, up], 0)
            old13, old2 = blk.experts.gate_up_proj[e].double().numpy(), blk.experts.down_proj[e].double().numpy()
            wnmse.append(float(((new13 - old13) ** 2).sum() / (old13 ** 2).sum()))
            wnmse.append(float(((down - old2) ** 2).sum() / (old2 ** 2).sum()))
            blk.experts.gate_up_proj[e].copy_(torch.from_numpy(new13))
            blk.experts.down_proj[e].copy_(torch.from_numpy(down))
        blk.gate.weight.copy_(torch.from_numpy(to_f64(ck[pre + "gate.weight"])))
        if hasattr(blk.gate, "e_score_correction_bias"):
            blk.gate.e_score_correction_bias.copy_(torch.from_numpy(to_f64(ck[pre + "gate.e_score_correction_bias"])))
        if hasattr(blk, "shared_experts"):
            for p in ("gate_proj", "up_proj", "down_proj"):
                getattr(blk.shared_experts, p).weight.copy_(
                    torch.from_numpy(dequant_nvfp4(ck, f"{pre}shared_experts.{p}", layout)))
        xt = torch.from_numpy(x32)[None]
        _, tw, ti = blk.gate(xt.view(-1, xt.shape[-1]))
        y = blk(xt)[0].float().numpy()
        y_sb = None
        if hasattr(blk, "shared_experts"):  # fp4moe's documented shared expert: BF16 weights
            for p in ("gate_proj", "up_proj", "down_proj"):
                w = getattr(blk.shared_experts, p).weight
                w.copy_(w.bfloat16().float())
            y_sb = blk(xt)[0].float().numpy()
    return y, y_sb, ti.numpy().astype(np.int32), tw.float().numpy(), max(wnmse)


def routing_settings(cfg):
    """What the model's router does (transformers' code for this model_type), for the record."""
    if cfg.model_type == "deepseek_v3":
        return {"family": "deepseek_v3", "score": "sigmoid", "top_k": cfg.num_experts_per_tok,
                "n_experts": cfg.n_routed_experts, "n_group": cfg.n_group, "topk_group": cfg.topk_group,
                "group_score": "sum of the top-2 biased scores", "correction_bias": True,
                "renormalize": bool(cfg.norm_topk_prob), "renorm_eps": 1e-20,
                "routed_scaling_factor": cfg.routed_scaling_factor, "shared_experts": cfg.n_shared_experts}
    return {"family": "qwen3_moe", "score": "softmax over all experts", "top_k": cfg.num_experts_per_tok,
            "n_experts": cfg.num_experts, "n_group": 1, "topk_group": 1, "correction_bias": False,
            "renormalize": bool(cfg.norm_topk_prob), "routed_scaling_factor": 1.0, "shared_experts": 0}


def exercised(cfg, ck, layer, x32):
    """How many tokens' expert sets change when the bias or the group limit is dropped (numpy
    re-implementation; proves the fixture really exercises those settings)."""
    import numpy as np
    if cfg.model_type != "deepseek_v3":
        return {}
    pre = f"model.layers.{layer}.mlp.gate."
    w, b = to_f64(ck[pre + "weight"]), to_f64(ck[pre + "e_score_correction_bias"])
    s = 1 / (1 + np.exp(-(x32.astype(np.float64) @ w.T)))
    E, G, k, tg = s.shape[1], cfg.n_group, cfg.num_experts_per_tok, cfg.topk_group

    def pick(sc, groups):
        out = []
        for r in sc:
            if groups:
                gs = np.sort(r.reshape(G, E // G), axis=1)[:, -2:].sum(1)
                keep = np.argsort(-gs)[:tg]
                r = np.where(np.isin(np.arange(E) // (E // G), keep), r, -np.inf)
            out.append(frozenset(np.argsort(-r)[:k].tolist()))
        return out
    full = pick(s + b, True)
    return {"tokens": len(full),
            "tokens_changed_without_bias": sum(a != c for a, c in zip(full, pick(s, True))),
            "tokens_changed_without_groups": sum(a != c for a, c in zip(full, pick(s + b, False)))}


def ct_crosscheck(ck, ckdir, layer):
    """compressed-tensors' own decompression (NVFP4PackedCompressor.decompress, which dequantizes into
    BF16) of every expert linear of the layer against dequant_nvfp4: the worst NMSE. BF16 rounding
    alone gives ~2e-6; any misread of the format (nibble order, scales, the reciprocal) >= 1e-2."""
    import torch
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationScheme
    g = json.load(open(os.path.join(ckdir, "config.json")))["quantization_config"]["config_groups"]["group_0"]
    sch = QuantizationScheme(targets=g["targets"], weights=g["weights"], input_activations=g.get("input_activations"))
    tdt = {"U8": torch.uint8, "F8_E4M3": torch.float8_e4m3fn, "F32": torch.float32}

    def tens(t):
        return torch.frombuffer(bytearray(t[2]), dtype=tdt[t[0]]).reshape(t[1])
    worst = 0.0
    pre = f"model.layers.{layer}.mlp."
    for k in sorted(ck):
        if k.startswith(pre) and k.endswith(".weight_packed"):
            p = k[: -len(".weight_packed")]
            sd = {n: tens(ck[f"{p}.{n}"]) for n in ("weight_packed", "weight_scale", "weight_global_scale")}
            tool = NVFP4PackedCompressor.decompress(sd, sch)["weight"].double().numpy()
            mine = dequant_nvfp4(ck, p, "compressed-tensors")
            worst = max(worst, float(((tool - mine) ** 2).sum() / (mine ** 2).sum()))
    return worst


# ---- gpt-oss: OpenAI's MXFP4 layout, read back by transformers itself -----------------------
def gptoss_spec():
    """Tiny gpt-oss: 2 layers (both MoE), 8 experts, top-2, hidden 64, expert dim 64 (MXFP4
    needs multiples of 32). swiglu_limit 7.0, the released models' value, which transformers'
    GptOssExperts hard-codes (it does not read config.swiglu_limit); the weights and biases
    below are large enough that the clamps at 7 bite."""
    from transformers import GptOssConfig
    return GptOssConfig(vocab_size=256, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=8,
                        num_experts_per_tok=2, swiglu_limit=7.0, max_position_embeddings=256,
                        tie_word_embeddings=False, architectures=["GptOssForCausalLM"])


def export_gptoss(cfg, seed, ckdir):
    """A random BF16 gpt-oss saved by transformers, its experts then replaced by random MXFP4
    tensors in the released checkpoints' layout: *_blocks U8 [E][N][K/32][16] (two E2M1 per
    byte), *_scales U8 [E][N][K/32] (UE8M0 2^-3 or 2^-2: weights of std ~3/sqrt(K), so FC1
    outputs of std ~3), gate_up rows interleaved (the model splits gate_up[..., ::2],
    [..., 1::2]), BF16 biases of std 2 (FC1 outputs past the clamp at 7 in a few % of the
    elements), router weight std 1/sqrt(H) and bias std 0.5; config.json gets
    quantization_config {quant_method: mxfp4}."""
    import numpy as np
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    m = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    m.to(torch.bfloat16).save_pretrained(ckdir)
    path = os.path.join(ckdir, "model.safetensors")
    sd = load_file(path)
    rng = np.random.default_rng(seed)
    H, I, E = cfg.hidden_size, cfg.intermediate_size, cfg.num_local_experts
    bf = lambda a: torch.from_numpy(np.asarray(a, np.float32)).bfloat16()  # noqa: E731
    for L in range(cfg.num_hidden_layers):
        pre = f"model.layers.{L}.mlp."
        for k in [k for k in sd if k.startswith(pre + "experts.") or k.startswith(pre + "router.")]:
            del sd[k]
        sd[pre + "router.weight"] = bf(rng.normal(0.0, H ** -0.5, (E, H)))
        sd[pre + "router.bias"] = bf(rng.normal(0.0, 0.5, E))
        for proj, N, K in (("gate_up_proj", 2 * I, H), ("down_proj", H, I)):
            sd[pre + f"experts.{proj}_blocks"] = torch.from_numpy(rng.integers(0, 256, (E, N, K // 32, 16),
                                                                               dtype=np.uint8))
            sd[pre + f"experts.{proj}_scales"] = torch.from_numpy(rng.integers(124, 126, (E, N, K // 32),
                                                                               dtype=np.uint8))
            sd[pre + f"experts.{proj}_bias"] = bf(rng.normal(0.0, 2.0, (E, N)))
    save_file(sd, path, metadata={"format": "pt"})
    c = json.load(open(os.path.join(ckdir, "config.json")))
    c["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    with open(os.path.join(ckdir, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    return {"recipe": "random E2M1 codes, UE8M0 scales 124-125, BF16 biases, in OpenAI's gpt-oss MXFP4 layout",
            "export": "transformers save_pretrained (BF16), experts replaced (safetensors.torch.save_file)"}


def mxfp4_np(ck, name, N, K):
    """float64 [E][N][K] from *_blocks / *_scales as the layout defines them (low nibble first)."""
    import numpy as np
    from nvfp4_np import e2m1_unpack
    dt, shp, raw = ck[name + "_blocks"]
    E = shp[0]
    vals = e2m1_unpack(raw, (E * N, K // 2)).reshape(E, N, K)
    sc = np.frombuffer(ck[name + "_scales"][2], np.uint8).reshape(E, N, K // 32).astype(np.float64)
    return vals * np.repeat(2.0 ** (sc - 127), 32, axis=2)


def reference_gptoss(ckdir, ck, cfg, layer, x32):
    """transformers' GptOssForCausalLM.from_pretrained(ckdir, Mxfp4Config(dequantize=True)), the
    experts then cast to FP32 (exact): its own reading of the MXFP4 checkpoint and its MoE block (router with logit bias,
    softmax over the top-k, experts with biases and the clamped SwiGLU) on x. Also checks
    that its dequantized experts equal the layout's definition read here (mxfp4_np)."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, Mxfp4Config
    m = AutoModelForCausalLM.from_pretrained(ckdir, quantization_config=Mxfp4Config(dequantize=True),
                                             dtype=torch.float32).eval()
    blk = m.model.layers[layer].mlp
    # Mxfp4Config(dequantize=True) leaves the experts in BF16 (exact: E2M1 x 2^k fits) and its
    # grouped GEMM then casts the activations to BF16 too; in FP32, as the other fixtures'
    # references run, the same code computes the layer without those roundings
    blk.experts.float()
    H, I = cfg.hidden_size, cfg.intermediate_size
    pre = f"model.layers.{layer}.mlp.experts."
    gu = mxfp4_np(ck, pre + "gate_up_proj", 2 * I, H)  # [E][2I (interleaved)][H]
    dn = mxfp4_np(ck, pre + "down_proj", H, I)
    theirs13 = blk.experts.gate_up_proj.detach().double().numpy()  # [E][H][2I]
    theirs2 = blk.experts.down_proj.detach().double().numpy()       # [E][I][H]
    wdiff = max(float(np.abs(theirs13 - gu.transpose(0, 2, 1)).max()), float(np.abs(theirs2 - dn.transpose(0, 2, 1)).max()))
    assert wdiff == 0.0, f"transformers' dequantized experts differ from the MXFP4 definition by {wdiff}"
    assert float(blk.experts.limit) == cfg.swiglu_limit
    with torch.no_grad():
        xt = torch.from_numpy(x32)[None]
        logits, tw, ti = blk.router(xt.view(-1, H))
        y = blk(xt)[0][0].float().numpy()
        # the routed (token, expert) pairs' FC1 outputs: how many elements the clamps change
        x64, w13, b13 = xt.view(-1, H).double(), blk.experts.gate_up_proj.double(), blk.experts.gate_up_proj_bias.double()
        g = torch.stack([x64[t] @ w13[e] + b13[e] for t in range(x64.shape[0]) for e in ti[t].tolist()])
        clamped = {"gate_above_limit": int((g[:, ::2] > cfg.swiglu_limit).sum()),
                   "up_outside_limit": int((g[:, 1::2].abs() > cfg.swiglu_limit).sum()),
                   "elements": int(g[:, ::2].numel())}
    return y, ti.numpy().astype(np.int32), tw.float().numpy(), clamped


def make_gptoss_fixture(out_root, seed, versions, cmdline):
    import numpy as np
    cfg = gptoss_spec()
    name = GPTOSS
    fx = os.path.join(out_root, name)
    ckdir = os.path.join(fx, "checkpoint")
    shutil.rmtree(fx, ignore_errors=True)
    os.makedirs(fx)
    how = export_gptoss(cfg, seed, ckdir)
    ck = read_checkpoint(ckdir)
    rng = np.random.default_rng(seed + 7)
    layers = []
    for L in range(cfg.num_hidden_layers):
        T = int(rng.integers(5, 17))
        xb = bf16_bits(rng.standard_normal((T, cfg.hidden_size)).astype(np.float32))
        x32 = bf16_value(xb)
        y, ti, tw, clamped = reference_gptoss(ckdir, ck, cfg, L, x32)
        assert np.all(np.isfinite(y)), (name, L)
        assert clamped["gate_above_limit"] > 0 and clamped["up_outside_limit"] > 0, clamped
        d = os.path.join(fx, f"layer{L}")
        os.makedirs(d)
        np.save(os.path.join(d, "x_bf16.npy"), xb.astype("<u2"))
        np.save(os.path.join(d, "x_f32.npy"), x32.astype("<f4"))
        np.save(os.path.join(d, "y_ref.npy"), y.astype("<f4"))
        np.save(os.path.join(d, "topk_ids.npy"), ti.astype("<i4"))
        np.save(os.path.join(d, "topk_weights.npy"), tw.astype("<f4"))
        layers.append({"layer": L, "tokens": T, "exercised": {"swiglu_clamps": clamped}})
    meta = {"name": name, "model": "gptoss", "model_type": cfg.model_type, "tool": "none (OpenAI's layout)",
            "scheme": "mxfp4", "layout": "gpt-oss", "quantization_config_format": None, "input_scales": False,
            "hidden": cfg.hidden_size, "moe_intermediate": cfg.intermediate_size,
            "routing": {"family": "gpt_oss", "score": "softmax-topk (softmax over the top-k logits)",
                        "top_k": cfg.num_experts_per_tok, "n_experts": cfg.num_local_experts, "n_group": 1,
                        "topk_group": 1, "correction_bias": True, "renormalize": False,
                        "routed_scaling_factor": 1.0, "shared_experts": 0,
                        "router_logit_bias": True, "expert_biases": True, "swiglu_limit": cfg.swiglu_limit,
                        "swiglu_alpha": 1.702},
            "layers": layers, "seed": seed, "versions": versions, "how": how,
            "reference": "transformers' GptOssForCausalLM loaded from the checkpoint with "
                         "Mxfp4Config(dequantize=True) (its own MXFP4 reading, checked equal to the "
                         "layout's definition), FP32, layer L's GptOssMLP on x; input x = the BF16 "
                         "values of x_bf16.npy"}
    with open(os.path.join(fx, "fixture.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    files = sorted(os.path.relpath(os.path.join(dp, fn), fx) for dp, _, fns in os.walk(fx) for fn in fns)
    with open(os.path.join(fx, "MANIFEST"), "w") as f:
        f.write(f"# {name}: written by tests/model/make_fixtures.py; checkpoint/ as made by export_gptoss\n")
        f.write(f"command {cmdline}\nseed {seed}\n")
        for k, v in versions.items():
            f.write(f"version {k} {v}\n")
        for fn in files:
            f.write(f"sha256 {sha256(os.path.join(fx, fn))} {fn}\n")
    print(f"make_fixtures: {name}: {len(files)} files, layers {[l['layer'] for l in layers]}", flush=True)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


def make_fixture(name, tool, scheme, mname, cfg, base, out_root, seed, versions, cmdline):
    import numpy as np
    fx = os.path.join(out_root, name)
    ckdir = os.path.join(fx, "checkpoint")
    shutil.rmtree(fx, ignore_errors=True)
    os.makedirs(fx)
    vocab = cfg.vocab_size
    if tool == "modelopt":
        how = export_modelopt(base, ckdir, seed, vocab)
    else:
        how = export_llmcompressor(base, ckdir, seed, vocab, scheme)
    ck = read_checkpoint(ckdir)
    layout = "modelopt" if any(k.endswith(".weight_scale_2") for k in ck) else "compressed-tensors"
    rng = np.random.default_rng(seed + 7)
    layers = []
    for L in moe_layers(cfg):
        T = int(rng.integers(5, 17))
        xb = bf16_bits(rng.standard_normal((T, cfg.hidden_size)).astype(np.float32))
        x32 = bf16_value(xb)
        y, y_sb, ti, tw, wn = reference(base, ck, layout, L, x32)
        assert np.all(np.isfinite(y)), (name, L)
        # NVFP4 of Gaussian weights costs NMSE ~1e-2; a misread format (nibble order, a global
        # scale not inverted) gives >= 1: the reference would be meaningless.
        assert wn < 0.05, f"{name} layer {L}: dequantized weights NMSE {wn} vs the unquantized model"
        cross = ct_crosscheck(ck, ckdir, L) if layout == "compressed-tensors" else None
        assert cross is None or cross < 1e-5, f"{name} layer {L}: compressed-tensors' decompression differs: {cross}"
        d = os.path.join(fx, f"layer{L}")
        os.makedirs(d)
        np.save(os.path.join(d, "x_bf16.npy"), xb.astype("<u2"))
        np.save(os.path.join(d, "x_f32.npy"), x32.astype("<f4"))
        np.save(os.path.join(d, "y_ref.npy"), y.astype("<f4"))
        if y_sb is not None:
            np.save(os.path.join(d, "y_ref_shared_bf16.npy"), y_sb.astype("<f4"))
        np.save(os.path.join(d, "topk_ids.npy"), ti.astype("<i4"))
        np.save(os.path.join(d, "topk_weights.npy"), tw.astype("<f4"))
        layers.append({"layer": L, "tokens": T, "weight_nmse_vs_unquantized": wn,
                       "weight_nmse_vs_compressed_tensors_decompress_bf16": cross,
                       "exercised": exercised(cfg, ck, L, x32)})
    c = json.load(open(os.path.join(ckdir, "config.json")))
    qc = c.get("quantization_config", {})
    meta = {"name": name, "model": mname, "model_type": cfg.model_type, "tool": tool, "scheme": scheme,
            "layout": layout, "quantization_config_format": qc.get("format"),
            "input_scales": any(k.endswith((".input_scale", ".input_global_scale")) for k in ck),
            "hidden": cfg.hidden_size, "moe_intermediate": cfg.moe_intermediate_size,
            "routing": routing_settings(cfg), "layers": layers, "seed": seed, "versions": versions,
            "how": how,
            "reference": "transformers' own MoE block of this model (FP32), its experts, shared expert, "
                         "router and bias set from the checkpoint (NVFP4 dequantized exactly, in float64, "
                         "then FP32); activations not quantized; input x = the BF16 values of x_bf16.npy"}
    with open(os.path.join(fx, "fixture.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    files = sorted(os.path.relpath(os.path.join(dp, fn), fx) for dp, _, fns in os.walk(fx) for fn in fns)
    with open(os.path.join(fx, "MANIFEST"), "w") as f:
        f.write(f"# {name}: written by tests/model/make_fixtures.py; checkpoint/ is the tool's output, unmodified\n")
        f.write(f"command {cmdline}\nseed {seed}\n")
        for k, v in versions.items():
            f.write(f"version {k} {v}\n")
        for fn in files:
            f.write(f"sha256 {sha256(os.path.join(fx, fn))} {fn}\n")
    print(f"make_fixtures: {name}: {len(files)} files, layers {[l['layer'] for l in layers]}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(HERE, "fixtures"))
    ap.add_argument("--venv", default=os.path.join(ROOT, "build", "model-venv"))
    ap.add_argument("--work", default=None, help="folder for the unquantized base models (default: a temp dir)")
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--only", nargs="*", default=None, help="fixture names to (re)make")
    a = ap.parse_args()
    names = [f"{pfx}-{m}" for m in ("qwen3moe", "dsv3") for pfx, _, _ in TOOLS] + [GPTOSS]
    unknown = sorted(set(a.only or []) - set(names))
    if unknown:
        ap.error(f"--only: unknown fixture(s) {unknown}; known: {names}")
    pins = GPTOSS_PINS if a.only == [GPTOSS] else PINS  # gpt-oss alone needs no quantization tool
    if not have_pins(pins):
        bootstrap(a.venv)
    import tempfile
    from importlib.metadata import version
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    versions = {p.split("==")[0]: version(p.split("==")[0]) for p in pins}
    versions["python"] = sys.version.split()[0]
    cmdline = "python3 tests/model/make_fixtures.py " + " ".join(sys.argv[1:])
    work = a.work or tempfile.mkdtemp(prefix="fp4moe-model-")
    for i, (mname, cfg) in enumerate(model_specs()):
        base = os.path.join(work, "base-" + mname)
        seed = a.seed * 100 + i
        todo = [(f"{pfx}-{mname}", tool, scheme) for pfx, tool, scheme in TOOLS]
        todo = [t for t in todo if a.only is None or t[0] in a.only]
        if not todo:
            continue
        build_base(mname, cfg, seed, base)
        for name, tool, scheme in todo:
            make_fixture(name, tool, scheme, mname, cfg, base, a.out, seed, versions, cmdline)
    if a.only is None or GPTOSS in a.only:
        make_gptoss_fixture(a.out, a.seed * 100 + 2, versions, cmdline)


if __name__ == "__main__":
    main()
