/* decode.h - the one-launch decode layer (src/cuda/decode.cu; design and protocol in
 * docs/decode-kernel.md): routing per CTA from the ids, FC1 + SwiGLU reading x rows in
 * place, FC2 handed h through ready counters in global memory, the deterministic
 * finalize, all in one persistent grid whose CTAs are all resident (a cooperative
 * launch: the runtime refuses a grid that cannot be). Plain C, not installed. */
#ifndef FM_CUDA_DECODE_H
#define FM_CUDA_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "cuda/moe_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Routed slots (T x top_k) one launch takes: every CTA sorts them in shared memory with
 * O(slots) work a thread, and the tile's 8-token passes suit a few rows per expert. 128
 * covers GLM-5 / DeepSeek-V3 (top-8) up to T = 16, the decode range. */
#define FM_DECODE_MAX_SLOTS 128
/* decode_path AUTO takes the decode kernel in the buckets that expect at most
 * FM_DECODE_AUTO_LOCAL_SLOTS routed slots on the layer's experts (T x top_k x n_local /
 * n_experts) and route at most FM_DECODE_AUTO_MAX_SLOTS slots in all (T x top_k), on sm_90
 * only: where it measured faster than the chain (layer_plan.c decode_auto has the figures) */
#define FM_DECODE_AUTO_LOCAL_SLOTS 1.0
#define FM_DECODE_AUTO_MAX_SLOTS 8
/* fm_decode_params.dynamic in the decode buckets whose runs have at least this many tokens
 * (layer_plan.c; $FM_DECODE_UNITS = static / counter overrides it, an A/B knob): measured
 * 2026-12-07 as a build-time knob (H100, graph replay, bench/RESULTS.md), the counter was
 * 1.1-1.3 us slower at T = 1 (GLM-5 EP8 17.7 -> 18.8, gpt-oss-120b EP8 10.8 -> 12.1; presumably
 * its atomics on one address, not profiled) and faster from T = 2 (GLM-5 EP8 T = 2 / 4 / 8 /
 * 16: 40.0 / 65.7 / 116.4 / 181.0 -> 36.4 / 63.3 / 110.8 / 149.1). */
#define FM_DECODE_COUNTER_MIN_T 2
/* The kernel's one tile: 4 warps, 2 bands a warp (FC1: a gate band and its up band), 8
 * tokens a pass, K stages of 128, 4 stages in flight: FC1 feature blocks of 64 h columns,
 * FC2 output blocks of 128 columns (the catalogue's mma_w4m2n1k128s4 geometry, so its
 * sums match that tile's in the chain bit for bit at equal K splits). */
#define FM_DECODE_THREADS 128
#define FM_DECODE_FC1_COLS 64
#define FM_DECODE_FC2_COLS 128
#define FM_DECODE_KC 128
#define FM_DECODE_MAX_K_SPLITS 32

typedef struct {
    /* FC1 (w13: n1 = 2 * inter rows, k1 = hidden) and FC2 (w2: n2 = hidden, k2 = inter),
     * prepacked (cuda_internal.h); kp = K padded to 64 */
    const void  *w1data, *w1scale, *w2data, *w2scale;
    const float *w1osc, *w2osc;
    int          n1, k1, kp1, n2, k2, kp2;
    unsigned     sc_mul, sc_add; /* the scale decode (fm_pack_format), both GEMMs */
    /* routing: ids / weights [T][top_k] of global experts; local expert e = global first + e */
    const uint16_t *x;
    const int32_t  *ids;
    const float    *weights;
    int             T, top_k, n_local, first, n_global;
    int             ks1, ks2; /* K splits of FC1 / FC2 (1: none) */
    /* per-run buffers (the layer's workspace): h [T*top_k][k2] BF16, scratch [T*top_k][n2] FP32 */
    uint16_t *h;
    float    *scratch;
    /* out[t][c] = init[t][c] (NULL: 0) + the token's weighted rows in slot order; FP32 into out
     * or BF16 into out_bf16 (one of them) */
    const float *init;
    float       *out;
    uint16_t    *out_bf16;
    fm_moe_dev_errors        *err;       /* ids out of range, NaN weights, NaN x */
    const unsigned long long *bad_logit; /* internal routing: folded into err (NULL: external) */
    /* the layer's decode buffer (fm_decode_buffer_bytes, zero at rest: every launch leaves it
     * zero): counters, then FC1 and FC2 split partials */
    void  *buf;
    size_t buf_bytes;
    /* gpt-oss (the chain's fm_gemm_oss, cuda_internal.h): FC1's activation act (FM_ACT_SWIGLU or
     * FM_ACT_SWIGLU_GPTOSS with its clamp act_limit) and the local experts' FP32 biases, each
     * NULL when the layer has none: b1 [n_local][n1] (gate rows, then up rows) added to FC1's
     * output before the activation, b2 [n_local][n2] added to FC2's before the row weight (so the
     * bias is weighted as the model weighs it). Any of them (fm_decode_oss): the gpt-oss twin
     * kernel, whose epilogues are the chain's OSS epilogues operation for operation. */
    const float *b1, *b2;
    int          act;
    float        act_limit;
    /* how CTAs find their units (decode.cu): 0 by strides of the grid, 1 from a counter in buf
     * (the free CTAs take the next; reset by the launch's last CTA) */
    int dynamic;
} fm_decode_params;

/* Bytes of the decode buffer for runs of at most `slots` routed slots with K splits ks1 /
 * ks2 (>= 1) and n_local local experts. */
size_t fm_decode_buffer_bytes(int slots, int n_local, int n1, int n2, int ks1, int ks2);
/* Dynamic shared memory of the kernel. */
size_t fm_decode_smem_bytes(void);
/* Whether a launch runs the gpt-oss twin (fm_decode_params act / b1 / b2): FC1's activation is
 * not plain SwiGLU, or an expert bias is set. The plain kernel is then never launched, so that
 * its machine code stays what it was without gpt-oss (as the chain's *_oss_* twins). */
static inline int fm_decode_oss(int act, const void *b1, const void *b2)
{
    return act != FM_ACT_SWIGLU || b1 != NULL || b2 != NULL;
}
/* CTAs per SM the kernel (oss: the gpt-oss twin, fm_decode_oss) can keep resident (occupancy
 * query with its launch attributes), and its registers per thread; a cudaError_t
 * (cudaErrorInvalidDeviceFunction / NoKernelImage: no code for the current device in this
 * build). */
int fm_decode_occupancy(int oss, int *blocks_per_sm, int *regs);
/* Launch on stream with `grid` CTAs (1 <= grid <= blocks_per_sm x SMs of the kernel that
 * fm_decode_oss picks for p: a cooperative launch, which the runtime refuses when its CTAs
 * cannot all be resident, cudaErrorCooperativeLaunchTooLarge). cudaErrorInvalidValue for an
 * act other than FM_ACT_SWIGLU / FM_ACT_SWIGLU_GPTOSS. Returns a cudaError_t as int. */
int fm_decode_launch(const fm_decode_params *p, int grid, void *stream);
/* K splits that give about `grid` units per GEMM for `active` experts with rows (powers of
 * two, at most each GEMM's K stages and FM_DECODE_MAX_K_SPLITS). */
void fm_decode_auto_splits(int grid, int active, int n1, int k1, int n2, int k2, int *ks1, int *ks2);
/* The kernel's handle (the device's code probe). */
const void *fm_decode_generic_kernel(void);
/* A probe build's phase timeline of the last launch (-DFM_DECODE_DEFS="FM_DECODE_TL=1"): per
 * CTA < cap, 8 values: %globaltimer ns at entry, after the routing, after its FC1 units, after
 * its FC2 units, at exit; ns in FC2's flag waits; SM; FC1 units | FC2 units << 16. Copies
 * min(cap, the record's capacity) rows into rec (synchronous) and returns that count (rows at
 * or past the last launch's grid are stale: pass its grid); rec NULL: returns the record's
 * capacity; 0: not a probe build; < 0: -cudaError_t. */
int fm_decode_timeline(unsigned long long *rec, int cap);

#ifdef __cplusplus
}
#endif
#endif
