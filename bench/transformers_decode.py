"""transformers_decode.py - issue 33's measurement: decode tokens/s and GPU memory of a real-shape
MoE model slice in Hugging Face transformers, its experts run by fp4moe (FP4 in memory) against
transformers' own experts (BF16 weights: what transformers does with an NVFP4 checkpoint on Hopper,
it dequantizes), in the same process, on the same weights.

The model: a Qwen3-MoE slice of --layers decoder layers with Qwen3-30B-A3B's MoE shapes by default
(hidden 2048, 128 experts, top-8, expert intermediate 768, 32 heads / 4 KV heads of 128), random
weights (transformers' init, BF16). Its experts are quantized to NVFP4 by fp4moe's quantizer
(fp4moe.transformers_experts.quantize_experts). The BF16 model holds the same FP4 values
dequantized (fp4moe.dequantize), so both models compute with the same weights and their greedy
tokens are compared too (reported, not asserted: the BF16 rounding of x inside fp4moe may break a
near-tie of the logits). Each transformers experts implementation named by --impl runs on the BF16
model ("eager": a loop over the hit experts; "grouped_mm": torch's grouped GEMM; "batched_mm").

Timing: generate() of --new tokens after a --prompt-token prompt (min_new_tokens = max_new_tokens,
greedy, the default dynamic cache), warmed up once, timed with CUDA events, the median of --reps;
decode tokens/s = batch * (new - 1) / (time(new) - time(1)), so the prompt's prefill and the first
token are taken out. Memory: the device's used bytes (torch.cuda.mem_get_info, so fp4moe's own
cudaMalloc'd layers count) after the model is built, less before, and the peak of torch's
allocator during generate (fp4moe's workspace is allocated at create, so it is in the first
figure). Prints one table; --csv FILE also writes it.

Usage (GPU machine, repo root, FP4MOE_LIBRARY pointing at a CUDA build's libfp4moe.so):
    PYTHONPATH=python FP4MOE_LIBRARY=build/python/libfp4moe.so python3 bench/transformers_decode.py
"""
import argparse
import gc
import statistics
import sys
import time

import numpy as np
import torch

import fp4moe
from fp4moe import transformers_experts as fx


def build_model(a, device):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
                         num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
                         intermediate_size=a.inter * 4, moe_intermediate_size=a.inter, num_experts=a.experts,
                         num_experts_per_tok=a.topk, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                         max_position_embeddings=4096, tie_word_embeddings=False)
    torch.manual_seed(a.seed)
    with torch.device(device):
        m = Qwen3MoeForCausalLM(cfg).to(torch.bfloat16)
    m.eval()
    return m


def used_bytes():
    if not torch.cuda.is_available():
        return 0
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return total - free


def peak_alloc():
    return torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0


def reset_peak():
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def time_generate(m, ids, new, reps):
    def one(n):
        if ids.device.type != "cuda":  # --device cpu: the script's smoke test, wall clock
            t0 = time.perf_counter()
            out = m.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
            return (time.perf_counter() - t0) * 1e3, out
        ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ev0.record()
        out = m.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        ev1.record()
        torch.cuda.synchronize()
        return ev0.elapsed_time(ev1), out

    one(4)  # warm-up (kernels loaded, allocator primed)
    full, first, out = [], [], None
    for _ in range(reps):
        t, out = one(new)
        full.append(t)
        first.append(one(1)[0])
    tf, t1 = statistics.median(full), statistics.median(first)
    return tf, t1, out[:, ids.shape[1]:]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--inter", type=int, default=768, help="expert intermediate size")
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--batch", type=str, default="1,8", help="comma-separated batch sizes")
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    p.add_argument("--new", type=int, default=64, help="tokens generated")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--impl", type=str, default="eager,grouped_mm", help="transformers' experts implementations")
    p.add_argument("--max-tokens", type=int, default=256, help="fp4moe layer's max_tokens")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--csv", type=str, default=None)
    p.add_argument("--device", type=str, default="cuda", help="cuda; cpu only for a smoke test of this script")
    a = p.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print("transformers_decode: no CUDA device (this benchmark runs on the GPU machine)")
        return 77
    import transformers
    dev = torch.device(a.device)
    name = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    print(f"# {name} torch {torch.__version__} transformers {transformers.__version__} "
          f"fp4moe {fp4moe.__version__ if hasattr(fp4moe, '__version__') else '?'}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"# Qwen3-MoE slice: {a.layers} layers, hidden {a.hidden}, {a.experts} experts top-{a.topk}, "
          f"expert inter {a.inter}, vocab {a.vocab}; prompt {a.prompt}, {a.new} new tokens, median of {a.reps}")
    batches = [int(b) for b in a.batch.split(",")]
    rows = []

    # fp4moe model first: its quantized weights also give the BF16 model's dequantized experts
    base = used_bytes()
    m = build_model(a, dev)
    t0 = time.time()
    held = fx.quantize_experts(m, "nvfp4", device=dev, max_tokens=a.max_tokens)
    qsecs = time.time() - t0
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    mem_fp4 = used_bytes() - base
    print(f"# experts quantized to NVFP4 and moved into fp4moe layers in {qsecs:.1f} s")
    deq = {name: (torch.from_numpy(np.stack([fp4moe.dequantize(q) for q in q13])).to(torch.bfloat16),
                  torch.from_numpy(np.stack([fp4moe.dequantize(q) for q in q2])).to(torch.bfloat16))
           for name, (q13, q2) in held.items()}
    del held
    g = torch.Generator().manual_seed(a.seed + 1)
    prompts = {b: torch.randint(0, a.vocab, (b, a.prompt), generator=g).to(dev) for b in batches}
    toks = {}
    for b in batches:
        reset_peak()
        tf, t1, out = time_generate(m, prompts[b], a.new, a.reps)
        toks[b] = out
        rows.append(("fp4moe", b, tf, t1, mem_fp4, peak_alloc(), None))
    del m
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()

    base = used_bytes()
    m = build_model(a, dev)
    for name, mod in m.named_modules():
        if name in deq:
            w13, w2 = deq[name]
            with torch.no_grad():
                mod.gate_up_proj.copy_(w13.to(dev))
                mod.down_proj.copy_(w2.to(dev))
    del deq
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    mem_bf16 = used_bytes() - base
    for impl in a.impl.split(","):
        try:
            m.set_experts_implementation(impl)
        except Exception as e:  # noqa: BLE001 - an implementation this transformers lacks is reported
            print(f"# transformers experts implementation {impl!r}: {e}")
            continue
        for b in batches:
            reset_peak()
            tf, t1, out = time_generate(m, prompts[b], a.new, a.reps)
            same = int((out == toks[b]).all(dim=0).cumprod(0).sum())  # tokens equal from the start, all rows
            rows.append((f"transformers {impl}", b, tf, t1, mem_bf16, peak_alloc(), same))

    hdr = f"{'experts':<26} {'batch':>5} {'gen ms':>9} {'1-tok ms':>9} {'decode tok/s':>13} {'ms/token':>9} " \
          f"{'model GiB':>10} {'peak alloc GiB':>15} {'same greedy tokens':>19}"
    print(hdr)
    lines = []
    ref = {r[1]: r for r in rows if r[0] == "fp4moe"}
    for name, b, tf, t1, mem, peak, same in rows:
        per = (tf - t1) / (a.new - 1)
        tps = b * 1000.0 / per
        fp4_per = (ref[b][2] - ref[b][3]) / (a.new - 1)
        sp = "" if name == "fp4moe" else f"  fp4moe {per / fp4_per:.2f}x"
        print(f"{name:<26} {b:>5} {tf:>9.1f} {t1:>9.1f} {tps:>13.1f} {per:>9.2f} {mem / 2**30:>10.2f} "
              f"{peak / 2**30:>15.2f} {'' if same is None else f'{same}/{a.new}':>19}{sp}")
        lines.append(f"{name},{b},{tf:.3f},{t1:.3f},{tps:.2f},{per:.4f},{mem},{peak},{'' if same is None else same}")
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("experts,batch,gen_ms,first_token_ms,decode_tok_s,ms_per_token,model_bytes,peak_alloc_bytes,same_tokens\n")
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
