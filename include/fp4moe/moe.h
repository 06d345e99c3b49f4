/* fp4moe/moe.h - the mixture-of-experts layer: configuration, weights, routing,
 * permutation and the CPU reference forward pass (the oracle for every backend).
 *
 * The layer, for T tokens x[T][hidden] (BF16):
 *   logits = x . router_w^T                        (FP32, [T][E])
 *   scores = softmax(logits) or sigmoid(logits) (or, SOFTMAX_TOPK, logits + bias)
 *   choose top_k experts per token on (scores + router_bias) (bias only ranks;
 *     optional group limit: keep the topk_group best of n_group groups, a group
 *     scored by the sum of its top-2 biased scores, as DeepSeek-V3/GLM do)
 *   weights = scores of the chosen experts (unbiased), renormalised to sum 1 if
 *     `renormalize`, times routed_scale (SOFTMAX_TOPK: softmax of the chosen
 *     biased logits, times routed_scale)
 *   per expert e and routed row r: h = act(x_r . W13_e^T + b13_e) where W13_e has
 *     the gate rows [0, inter) then the up rows [inter, 2*inter); act = SwiGLU,
 *     silu(g) * u, or gpt-oss's (FM_ACT_SWIGLU_GPTOSS, below); b13_e the optional
 *     expert bias (w13_bias, gpt-oss), 0 without
 *   y_r = h . W2_e^T + b2_e ([hidden]); out[t] = sum over t's slots of weight * y_r
 *   plus, if shared_inter > 0, the BF16 shared expert's SwiGLU MLP of x[t].
 * With act_nvfp4 the inputs of FC1 and FC2 are quantized to NVFP4 (per-expert
 * input global scale from a1_scale / a2_scale when given, else dynamic per row
 * block amax) before the GEMM: W4A4 numerics as Blackwell runs them. With act_fp8
 * they are quantized to FP8 E4M3 (fm_act_fp8, below): W4A8.
 */
#ifndef FP4MOE_MOE_H
#define FP4MOE_MOE_H

#include <stdint.h>

#include "fp4moe/format.h"
#include "fp4moe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* SOFTMAX: softmax over all experts' logits (Qwen-MoE, Mixtral); SIGMOID:
 * per-expert sigmoid (DeepSeek-V3, GLM); SOFTMAX_TOPK: top-k on the logits, then
 * softmax over the k chosen logits only (gpt-oss). With SOFTMAX_TOPK the router
 * bias is ADDED TO THE LOGITS (gpt-oss's router Linear bias): it ranks and it
 * weighs; with the other two it only ranks (score-correction bias). */
typedef enum { FM_SCORE_SOFTMAX = 0, FM_SCORE_SIGMOID = 1, FM_SCORE_SOFTMAX_TOPK = 2 } fm_score_func;

/* "softmax", "sigmoid", "softmax-topk"; "?" for an invalid value. */
const char *fm_score_name(fm_score_func s);

/* The experts' gated activation of g = FC1 output (gate g[0, inter), up u[inter, 2*inter)):
 * SWIGLU: h = silu(g) * u (DeepSeek, GLM, Qwen, Mixtral).
 * SWIGLU_GPTOSS: gpt-oss's clamped form (transformers' GptOssExperts): g' = min(g, L),
 *   u' = clamp(u, -L, L), h = (u' + 1) * g' * sigmoid(1.702 g'), L = swiglu_limit (its
 *   config.json's swiglu_limit, 7.0); a NaN stays NaN. */
typedef enum { FM_ACT_SWIGLU = 0, FM_ACT_SWIGLU_GPTOSS = 1 } fm_activation;

/* "swiglu", "swiglu-gptoss"; "?" for an invalid value. */
const char *fm_activation_name(fm_activation a);

/* FP8 activations (W4A8): the inputs of FC1 and FC2 (x rows, the activation's output h)
 * quantized to E4M3 with a dynamic scale s = amax / 448 (FP32) per block of 128 elements
 * along K (FM_ACT_FP8_BLOCK128; the last block of a row may be shorter) or per row
 * (FM_ACT_FP8_TOKEN): q = E4M3(x / s), rounded to nearest even; the GEMM sees q * s. A block
 * of zeros has s = 1. Per 128 is what an FP8 dispatch sends (DeepEP / NCCL EP low latency,
 * DeepSeek-V3's activations) and costs a Hopper FP8 kernel nothing more than a row scale:
 * its main loop already scales FP32 partial sums per K block for the weights' block scales;
 * it is the more accurate of the two (an outlier costs only its block), so it is the one to
 * choose unless an engine hands per-token scales. docs/accuracy.md has the NMSE of each. */
typedef enum { FM_ACT_FP8_OFF = 0, FM_ACT_FP8_BLOCK128 = 1, FM_ACT_FP8_TOKEN = 2 } fm_act_fp8;

/* "off", "block128", "token"; "?" for an invalid value. */
const char *fm_act_fp8_name(fm_act_fp8 a);

typedef struct {
    int           n_experts;    /* routed experts held by this layer (E) */
    int           top_k;        /* experts per token, 1..n_experts */
    int           hidden;       /* model dimension (K of FC1, N of FC2) */
    int           inter;        /* expert intermediate size (FC1 N = 2*inter) */
    fm_score_func score;
    int           n_group;      /* expert groups for group-limited routing; 0 or 1 = off */
    int           topk_group;   /* groups kept when n_group > 1 */
    int           renormalize;  /* 1: top-k weights renormalised to sum 1 */
    float         routed_scale; /* routed scaling factor (GLM-5: 2.5) */
    int           shared_inter; /* shared expert intermediate size; 0 = none */
    fm_format     wfmt;         /* routed-expert weight format */
    int           act_nvfp4;    /* 1: quantize FC1/FC2 inputs to NVFP4 (W4A4) */
    fm_activation activation;   /* FM_ACT_SWIGLU (0, the default) or FM_ACT_SWIGLU_GPTOSS */
    float         swiglu_limit; /* SWIGLU_GPTOSS: the clamp L, finite and > 0; SWIGLU: 0 */
    fm_act_fp8    act_fp8;      /* FP8 FC1/FC2 inputs (W4A8), FM_ACT_FP8_OFF (0) = BF16; not with act_nvfp4 */
} fm_moe_config;

/* GLM-5 EP8 shard defaults: 32 experts, top-8, hidden 6144, inter 2048, sigmoid,
 * renormalize, routed_scale 2.5, no groups, no shared expert, NVFP4 weights. */
void fm_moe_config_default(fm_moe_config *cfg);

/* Check a configuration. FM_OK, FM_ERR_INVALID_ARG (NULL, top_k > n_experts,
 * bad group settings), FM_ERR_BAD_SHAPE (sizes <= 0 or K not a multiple of the
 * format's block), FM_ERR_FORMAT (bad wfmt). */
fm_status fm_moe_config_check(const fm_moe_config *cfg);

/* The layer's weights, host memory, not owned. */
typedef struct {
    const float    *router_w;    /* [n_experts][hidden] FP32 */
    const float    *router_bias; /* [n_experts] score-correction bias, or NULL */
    const fm_qtensor *w13;       /* [n_experts] each [2*inter][hidden], gate rows then up rows */
    const fm_qtensor *w2;        /* [n_experts] each [hidden][inter] */
    /* Static NVFP4 input global scales (a checkpoint's input_scale), or NULL (dynamic, per row).
     * Each must be a normal float whose NVFP4 grid's largest value, 6 x 448 x scale, is finite:
     * in [FLT_MIN, FLT_MAX / 2688] = [1.18e-38, 1.27e35] (fm_quantize's rule for a caller's
     * global; calibration gives amax / 2688 <= that); fm_layer_create refuses anything else
     * (also NaN, Inf, 0, negative) with FM_ERR_NONFINITE, naming the entry and the range. */
    const float    *a1_scale;    /* [n_experts] input global scale of FC1, or NULL */
    const float    *a2_scale;    /* [n_experts] same for FC2, or NULL */
    const uint16_t *shared_w13;  /* BF16 [2*shared_inter][hidden], or NULL */
    const uint16_t *shared_w2;   /* BF16 [hidden][shared_inter], or NULL */
    /* Expert biases (gpt-oss), FP32, finite, or NULL (none): added to FC1's output before the
     * activation (gate then up, as w13's rows) and to FC2's output before the routing weight. */
    const float    *w13_bias;    /* [n_experts][2*inter], or NULL */
    const float    *w2_bias;     /* [n_experts][hidden], or NULL */
    /* NVFP4 only: the global scale (weight_scale_2) of w13[e]'s up rows [inter, 2*inter), for
     * checkpoints whose gate and up projections have their own globals; w13[e].global_scale is
     * then the gate rows' [0, inter). NULL: one global per w13 (w13[e].global_scale for all
     * rows). Taken as stored: no block scale is re-encoded (the CPU backends apply each half's
     * global as they apply w13's; the cuda backend, whose epilogue applies one global per
     * matrix, re-expresses the half with the smaller global against the larger at create, as
     * docs/engines.md section 5 says). Each entry must be a finite, normal, positive float
     * (FLT_MIN or more) with the up rows' decoded values finite; fm_layer_create refuses
     * anything else (NaN, Inf, 0, negative, subnormal) with FM_ERR_NONFINITE naming the entry,
     * and a non-NULL array for a format without global scales (BF16, MXFP4) with
     * FM_ERR_FORMAT. */
    const float    *w13_up_global; /* [n_experts], or NULL */
} fm_moe_weights;

/* Route T tokens given logits[T][n_experts]: ids[T][top_k] (descending biased
 * score, ties to the lower expert id) and weights[T][top_k]. router_bias may be
 * NULL. A group that keeps fewer than 2 experts is scored by its best one; if
 * the chosen scores sum to 0 (sigmoid underflow) renormalisation is skipped.
 * Returns FM_OK, FM_ERR_INVALID_ARG (NULL pointer, or cfg rejected by
 * fm_moe_config_check, which may also give FM_ERR_BAD_SHAPE / FM_ERR_FORMAT),
 * FM_ERR_BAD_SHAPE (T < 1), FM_ERR_NONFINITE (NaN/Inf logit or bias),
 * FM_ERR_OOM. Nothing is written on failure. */
fm_status fm_moe_route(const fm_moe_config *cfg, const float *router_bias, const float *logits, int T,
                       int32_t *ids, float *weights);

/* Stable permutation of the T*top_k routed rows into expert order.
 * offsets[n_experts+1]: rows of expert e are [offsets[e], offsets[e+1]).
 * perm[T*top_k]: permuted row p came from routed slot perm[p] = t*top_k + j;
 * within an expert, slots ascend (an expert with no rows has an empty range).
 * Returns FM_OK, FM_ERR_INVALID_ARG (NULL pointer), FM_ERR_BAD_SHAPE (T, top_k
 * or n_experts < 1, or T*top_k beyond int32), FM_ERR_OUT_OF_RANGE (an id outside
 * [0, n_experts)). Nothing is written on failure. */
fm_status fm_moe_permute(const int32_t *ids, int T, int top_k, int n_experts, int32_t *offsets, int32_t *perm);

/* The reference forward pass, FP32 accumulation, simple loops: out[T][hidden].
 * `out` is written only when the whole pass succeeded. The shared expert sees
 * BF16 x unquantized even with act_nvfp4 / act_fp8 (only routed experts are W4A4 / W4A8).
 * Returns FM_OK, FM_ERR_INVALID_ARG (NULL pointer, bad cfg settings),
 * FM_ERR_BAD_SHAPE (T < 1, T*top_k beyond int32, bad cfg sizes, a weight tensor whose
 * rows/cols disagree with cfg), FM_ERR_FORMAT (a tensor's fmt differs from cfg->wfmt),
 * FM_ERR_NONFINITE (NaN/Inf in x: policy is to reject; a NaN block-scale code;
 * a non-positive or non-finite global/activation scale; router logits or the
 * output overflowing because x is too large), FM_ERR_OOM. */
fm_status fm_moe_forward_ref(const fm_moe_config *cfg, const fm_moe_weights *w, const uint16_t *x, int T, float *out);

#ifdef __cplusplus
}
#endif
#endif
