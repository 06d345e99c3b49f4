/* moe_internal.h - pieces of the MoE layer that every CPU backend shares (not
 * installed).
 *
 * Why shared: a backend is compared with the reference by NMSE, and routing is
 * discontinuous (a 1-ulp change in a logit can swap the 8th and 9th expert), so
 * every CPU backend computes the router logits with the SAME function, in the
 * same summation order, whatever the thread count; likewise the NVFP4
 * activation quantization (W4A4) goes through the format codecs in one place.
 * The GEMMs are where backends differ, and only in FP32 summation order.
 */
#ifndef FM_MOE_INTERNAL_H
#define FM_MOE_INTERNAL_H

#include "fm_internal.h"

/* logits[T][E] = x[T][hidden] (BF16) . router_w[E][hidden]^T, FP32.
 * Each logit is one thread's fixed-order dot product (8 interleaved partial
 * sums folded in a fixed tree), so the result does not depend on threads.
 * No checks: callers have validated shapes. */
void fm_moe_router_logits(const fm_moe_config *cfg, const float *router_w, const uint16_t *x, int T, float *logits);

/* Router logits -> top-k -> stable permutation: the routing steps every CPU
 * backend runs through this one function, so routing cannot differ between
 * them. A logit that overflowed is FM_ERR_NONFINITE; `who` prefixes the detail. */
fm_status fm_moe_route_tokens(const fm_moe_config *cfg, const fm_moe_weights *w, const uint16_t *x, int T,
                              const char *who, float *logits, int32_t *ids, float *wts, int32_t *offsets,
                              int32_t *perm);

/* Bytes of scratch fm_moe_act_quant_row needs for a row of n elements. */
size_t fm_moe_act_quant_scratch(int n);

/* W4A4: dst[n] = dequant(NVFP4(src[n])), one row of n (a multiple of 16)
 * quantized with global scale *gscale, or dynamically (amax/(6*448) of the
 * row) when gscale is NULL. src and dst may alias. scratch: see above.
 * Returns FM_OK or FM_ERR_NONFINITE (NaN/Inf in src; dst untouched). */
fm_status fm_moe_act_quant_row(const float *src, int n, const float *gscale, void *scratch, float *dst);

/* W4A8: dst[n] = the FP8 round trip of src[n] (fm_act_fp8 in include/fp4moe/moe.h): per
 * block of 128 (the last one may be shorter) or per row, s = amax / 448 in FP32 (1 where that
 * is below FLT_MIN: zeros, or values that all quantize to 0), dst = E4M3(src / s) * s. src and
 * dst may alias. Returns FM_OK or FM_ERR_NONFINITE (NaN/Inf in src; dst untouched). */
fm_status fm_moe_act_fp8_row(const float *src, int n, fm_act_fp8 mode, float *dst);

/* NaN scale codes (E4M3 0x7F/0xFF, UE8M0 0xFF) in any expert weight:
 * FM_ERR_NONFINITE naming the first one, else FM_OK. */
fm_status fm_moe_weights_check_scales(const fm_moe_config *cfg, const fm_moe_weights *w);

/* SwiGLU of one row: h[i] = silu(g[i]) * u[i], silu(v) = v / (1 + exp(-v)). */
void fm_moe_swiglu(const float *gate, const float *up, int n, float *h);

/* An expert's activation of one row of FC1 output g[2*inter] (gate then up) into
 * h[inter]: the expert bias (bias[2*inter], or NULL) added to g in place, then
 * c->activation (SwiGLU, or gpt-oss's clamped form with c->swiglu_limit). */
void fm_moe_expert_act(const fm_moe_config *c, const float *bias, float *g, float *h);

/* First index of a NaN/Inf in x[n], or -1. */
long fm_moe_first_nonfinite(const float *x, size_t n);

/* The rows of one run on a CPU backend, whatever the routing and the shard:
 * internal routing (ext_ids NULL: router logits + fm_moe_route over the global
 * experts) or external (ext_ids/ext_wts [T*top_k]: ids in [-1, n_experts),
 * -1 = no expert, weights finite, used as given); then the slots whose expert
 * is local (in [first, first + n_local)) are put in the stable expert order of
 * fm_moe_permute over the local experts: offsets[n_local+1], perm[rows] = slot,
 * pos[slot] = its row or -1 (not computed here), *rows. ids/wts [T*top_k] hold
 * the global ids and weights; logits [T][n_experts] is scratch (internal only).
 * Returns FM_OK, FM_ERR_OUT_OF_RANGE (an external id outside [-1, n_experts)),
 * FM_ERR_NONFINITE (an external weight or a router logit not finite).
 * `who` prefixes the detail. */
fm_status fm_moe_plan_rows(const fm_moe_config *cfg, const fm_moe_weights *w, const uint16_t *x, int T,
                           const int32_t *ext_ids, const float *ext_wts, int first, int n_local, const char *who,
                           float *logits, int32_t *ids, float *wts, int32_t *offsets, int32_t *perm, int32_t *pos,
                           int *rows);

/* fm_moe_forward_ref for one run of a layer (src/cpu/ref.c): external routing
 * (ext_ids/ext_wts, or NULL) and a shard [first, first + n_local) whose experts
 * are w->w13/w2[0..n_local); the shared expert only when first == 0. cfg and w
 * already checked; x is checked for NaN/Inf. routed_ids/routed_wts (or NULL): the
 * internal routing's [T][top_k] ids and weights. Outputs untouched on failure. */
fm_status fm_moe_forward_ref_run(const fm_moe_config *cfg, const fm_moe_weights *w, const uint16_t *x, int T,
                                 const int32_t *ext_ids, const float *ext_wts, int first, int n_local, float *out,
                                 int32_t *routed_ids, float *routed_wts);
/* The oracle on dispatched rows (fm_layer_run_dispatched): checks a's counts / offsets
 * (fm_dispatch_rows: offsets gets the packed ranges, *rows the total) and the received rows
 * and weights, then y_rows[p] = the expert output of packed row p (times its weight when
 * a->weights), FP32 [max_rows][hidden]. */
fm_status fm_moe_dispatched_ref(const fm_moe_config *cfg, const fm_moe_weights *w, const fm_layer_dispatch_args *a,
                                int n_local, int64_t max_rows, float *y_rows, int32_t *offsets, int *rows);

#endif
