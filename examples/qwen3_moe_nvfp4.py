#!/usr/bin/env python3
"""A tiny random-weight Qwen3-MoE (Hugging Face transformers) whose sparse-MoE
blocks run on fp4moe.

1. Build a 2-layer Qwen3MoeForCausalLM with random weights (no download).
2. Quantize every expert to NVFP4 with fp4moe's own quantizer and write the
   dequantized weights back into the model: that model is the reference (the
   original block, run by transformers on the dequantized weights, FP32).
3. A copy of it gets each Qwen3MoeSparseMoeBlock.forward replaced by fp4moe's
   op on the NVFP4 weights, routing either from the model's own router (the
   engine's routing: --routing external, the default) or inside fp4moe
   (--routing internal: softmax, top-k, renormalised as norm_topk_prob says).
4. Compare the logits of the two on the same tokens.

Each replaced block rounds its input to BF16 (what fp4moe takes), runs
fp4moe and the original block on it, and compares the outputs (NMSE bound
2e-5: FP32 summation order gives ~1e-13, the BF16 output ~3e-6 as measured on
the CPU backend, a BF16 FC2 input on the GPU's tensor-core path another
~1e-6; renormalising the top-k weights when the model does not gives 7e-5
on one block, a wrong expert or scale >= 1e-3). The final logits are compared too (1e-3: the BF16 rounding of each
block's input changes the model's path slightly; the residual stream dilutes
errors there, which is why the blocks are checked one by one). The router weights are scaled up so that top-k choices
are not near-ties (a random model's router is near-uniform, and a tie decided
differently by a BF16-rounded input would swap experts, which is not an error).

Runs on the GPU when torch sees one and the library has its CUDA backend,
else on the CPU backend. Needs torch and transformers (pip install torch
transformers) and the fp4moe package (pip install .).
    python examples/qwen3_moe_nvfp4.py [--routing internal] [--device cpu]
"""

import argparse
import copy
import sys

import numpy as np
import torch

import fp4moe
from fp4moe.torch_ops import MoE


BLOCK_BOUND, LOGIT_BOUND = 2e-5, 1e-3


def tiny_qwen3_moe():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(vocab_size=512, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                         num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                         mlp_only_layers=[], max_position_embeddings=256, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(cfg).float().eval()
    with torch.no_grad():  # random init is N(0, 0.02): give the weights some magnitude
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.08 if "experts" in name else 0.05)
            if name.endswith("mlp.gate.weight"):
                p.mul_(40)  # decisive routing (see the module doc)
    return model


def sparse_blocks(model):
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    return [m for m in model.modules() if isinstance(m, Qwen3MoeSparseMoeBlock)]


def quantize_block(block, mcfg):
    """NVFP4 weights of one block (fp4moe.quantize) and the dequantized values written back."""
    E, I, H = mcfg.num_experts, mcfg.moe_intermediate_size, mcfg.hidden_size
    ex = block.experts
    w13 = [fp4moe.quantize(ex.gate_up_proj[e].detach().numpy(), "nvfp4") for e in range(E)]  # gate rows, up rows
    w2 = [fp4moe.quantize(ex.down_proj[e].detach().numpy(), "nvfp4") for e in range(E)]
    with torch.no_grad():
        for e in range(E):
            ex.gate_up_proj[e].copy_(torch.from_numpy(fp4moe.dequantize(w13[e])))
            ex.down_proj[e].copy_(torch.from_numpy(fp4moe.dequantize(w2[e])))
    cfg = fp4moe.MoEConfig(n_experts=E, top_k=mcfg.num_experts_per_tok, hidden=H, inter=I, score="softmax",
                           renormalize=bool(mcfg.norm_topk_prob), routed_scale=1.0, wfmt="nvfp4")
    weights = fp4moe.MoEWeights.from_qtensors(block.gate.weight.detach().numpy().astype(np.float32), w13, w2)
    return cfg, weights


def use_fp4moe(block, moe, routing, errs):
    """Replace block.forward by fp4moe's op (the engine's routing or fp4moe's own);
    each call also runs the original forward on the same input and appends the
    NMSE of fp4moe's output against it to errs."""
    gate, original = block.gate, block.forward

    def forward(hidden_states):
        # fp4moe takes BF16 x: route and compare on the same rounded values
        hidden_states = hidden_states.to(torch.bfloat16).to(hidden_states.dtype)
        y = fp4moe_forward(hidden_states)
        want = original(hidden_states).double()
        errs.append((((y.double() - want) ** 2).sum() / (want ** 2).sum()).item())
        return y

    def fp4moe_forward(hidden_states):
        B, S, H = hidden_states.shape
        x = hidden_states.reshape(-1, H).to(torch.bfloat16).contiguous()
        if routing == "external":
            _, w, ids = gate(hidden_states.reshape(-1, H))
            y = moe(x, ids.to(torch.int32).contiguous(), w.to(torch.float32).contiguous())
        else:
            y = moe(x)
        return y.to(hidden_states.dtype).reshape(B, S, H)

    block.forward = forward


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--routing", choices=["external", "internal"], default="external")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--tokens", type=int, default=24)
    args = p.parse_args()
    gpu = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()
                                    and fp4moe.backend_available("cuda"))
    dev = torch.device("cuda" if gpu else "cpu")
    routing = args.routing
    out_dtype = torch.bfloat16

    ref = tiny_qwen3_moe()
    mcfg = ref.config
    layers = [quantize_block(b, mcfg) for b in sparse_blocks(ref)]  # ref now holds dequantized weights
    fm = copy.deepcopy(ref)
    moes, block_errs = [], []
    for block, (cfg, w) in zip(sparse_blocks(fm), layers):
        moe = MoE(cfg, w, device=dev, max_tokens=args.tokens, out_dtype=out_dtype)
        use_fp4moe(block, moe, routing, block_errs)
        moes.append(moe)
    ref.to(dev)
    fm.to(dev)

    ids = torch.randint(0, mcfg.vocab_size, (1, args.tokens), generator=torch.Generator().manual_seed(1)).to(dev)
    with torch.no_grad():
        want = ref(ids).logits.double()
        got = fm(ids).logits.double()
    assert torch.isfinite(got).all(), "NaN/Inf in fp4moe's logits"
    nmse = ((got - want) ** 2).sum().item() / (want ** 2).sum().item()
    agree = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    print(f"Qwen3-MoE tiny ({mcfg.num_hidden_layers} layers, {mcfg.num_experts} experts, top-"
          f"{mcfg.num_experts_per_tok}, hidden {mcfg.hidden_size}), NVFP4 experts on fp4moe "
          f"({moes[0].layer.backend}, {routing} routing) vs transformers on the dequantized weights:")
    print("  each sparse-MoE block vs the original block on the same input: NMSE "
          + ", ".join(f"{e:.2e}" for e in block_errs) + f" (bound {BLOCK_BOUND:g})")
    print(f"  logits NMSE {nmse:.3e} (bound {LOGIT_BOUND:g}), next-token argmax agreement {agree * 100:.1f} %")
    for m in moes:
        m.errors()
    ok = nmse <= LOGIT_BOUND and max(block_errs) <= BLOCK_BOUND
    print("OK" if ok else "FAIL: above the bound")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
