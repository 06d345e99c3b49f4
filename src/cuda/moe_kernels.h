/* moe_kernels.h - extern "C" launchers of src/cuda/route.cu (router
 * logits, routing (scores, group limit, top-k, weights)), src/cuda/permute.cu (the
 * stable permutation, and the dispatched rows' layout turned into its offsets / rows)
 * and src/cuda/moe_kernels.cu (the row gather, the dispatched rows' store and the BF16
 * shared expert). Each launcher is
 * asynchronous on `stream` (a cudaStream_t, NULL = default stream), never
 * synchronises, never copies to the host (so a forward built from them can be
 * captured in a CUDA graph) and returns a cudaError_t as int (0 = launched).
 * All pointers are device pointers. What is bit-exact with the CPU code is
 * listed in docs/cuda-routing.md. */
#ifndef FM_MOE_KERNELS_H
#define FM_MOE_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "fp4moe/moe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* logits[T][E] = x[T][H] (BF16) . rw[E][H]^T (FP32), bit-identical to
 * fm_moe_router_logits (src/moe/shared.c): the same 8 partial sums, each added
 * in ascending k, folded ((p0+p1)+(p2+p3))+((p4+p5)+(p6+p7)); products and sums
 * rounded separately (no FMA contraction). The kernel by T (H200, bench_route, bench/RESULTS.md
 * "The router kernels", GLM-5's 256 x 6,144 router, us at T = 1 / 16 / 64 / 128 / 256 / 1,024):
 * the staged kernel below FM_ROUTER_TILED_MIN_T (17.5 / 21.3 / 55.9 / 103.5 / 192 / 731),
 * tiles of 16 tokens x 32 experts from there on (125 / 128 / 128 / 127 / 128 / 355: too
 * few CTAs at small T; the crossover, ~170 tokens, interpolated); where the staged kernel
 * cannot run (H % 8 != 0, unaligned rows), one warp per logit with 48 loads in flight per
 * lane up to FM_ROUTER_WARP48_MAX_T tokens (23.3 us at T = 1 against 32.8 with 16), 16
 * above (48 is slower from 16 tokens). Up to FM_ROUTER_ONESHOT_MAX_T tokens the ONESHOT
 * kernel below where it fits (H100, bench_route 2026-12-07, GLM-5's router: 11.3 / 11.5 /
 * 12.3 us at T = 1 / 2 / 4 against the staged kernel's 16.7 / 16.2 / 17.1; even at 8, slower
 * at 16). */
#define FM_ROUTER_ONESHOT_MAX_T 4
#define FM_ROUTER_WARP48_MAX_T 8
#define FM_ROUTER_TILED_MIN_T 160
int fm_moe_router_logits_launch(const uint16_t *x, const float *rw, int T, int E, int H, float *logits, void *stream);

/* The same with the kernel named (tests and bench/bench_route.c): AUTO = the layer's
 * dispatch above; WARP16 / WARP48: one warp per logit with 16 / 48 groups of 32 loads in
 * flight per lane; TILED: 16 x 32 tiles; STAGED: 4 tokens x 2 experts a CTA of 64 threads,
 * one chain a thread, slices double-buffered by cp.async (needs H % 8 == 0 and 16-byte
 * aligned x and rw, else WARP16); ONESHOT: 4 tokens x 2 experts a CTA of 256 threads,
 * every load of the CTA issued at once into dynamic shared memory (2 router rows + the
 * tokens' x rows: 148 KB at H = 6,144 and 4 tokens), one wait, then one chain a thread;
 * ONESHOT4: the same loads in 4 commit groups of k ranges, range g summed while the later
 * ones land. Both need what STAGED needs (else as STAGED) and the shared memory (else
 * STAGED); ONESHOT is AUTO's pick up to FM_ROUTER_ONESHOT_MAX_T tokens (ONESHOT4 measured
 * slower: 12.5 us at T = 1). All bit-identical
 * (test_cuda_route). */
enum {
    FM_ROUTER_AUTO = 0,
    FM_ROUTER_WARP16 = 1,
    FM_ROUTER_WARP48 = 2,
    FM_ROUTER_TILED = 3,
    FM_ROUTER_STAGED = 4,
    FM_ROUTER_ONESHOT = 5,
    FM_ROUTER_ONESHOT4 = 6
};
int fm_moe_router_logits_launch_kind(const uint16_t *x, const float *rw, int T, int E, int H, float *logits,
                                     void *stream, int kind);

/* The kernel fm_moe_router_logits_launch_kind runs for `kind` at this shape and these
 * pointers after its fallbacks (AUTO resolved; tests and bench_route check that a
 * variant really ran). Reads the current device's opt-in shared memory for ONESHOT*. */
int fm_moe_router_logits_kind(const uint16_t *x, const float *rw, int T, int E, int H, int kind);

/* Bytes of device scratch fm_moe_route_launch needs for T tokens of `cfg`. */
size_t fm_moe_route_scratch_bytes(const fm_moe_config *cfg, int T);

/* Routing on the device, the algorithm of fm_moe_route (src/moe/route.c) with
 * the same tie-breaking (lowest expert / group index) and the same FP32
 * operation order: ids[T][top_k], weights[T][top_k] from logits[T][E].
 * bias: [E] score-correction bias or NULL. scratch: fm_moe_route_scratch_bytes.
 * bad: one uint64; the launcher resets it to UINT64_MAX and the kernel leaves
 * there the smallest t*E+e whose logit is NaN/Inf (the CPU refuses those with
 * FM_ERR_NONFINITE; ids are still valid experts then, so later kernels stay in
 * bounds). cfg must pass fm_moe_config_check (not re-checked). */
int fm_moe_route_launch(const fm_moe_config *cfg, const float *bias, const float *logits, int T, int32_t *ids,
                        float *weights, void *scratch, unsigned long long *bad, void *stream);

/* fm_moe_router_logits_launch then fm_moe_route_launch in one launch, for T <= 4 tokens where
 * the ONESHOT logits kernel runs (fm_moe_router_logits_kind; x [T][hidden] BF16, rw [E][hidden]
 * FP32): the same logits (bit for bit), ids, weights and *bad. ticket: one unsigned int of
 * device memory, 0 before the first launch; every launch leaves it 0 (its CTAs take tickets,
 * the last one routes and resets it), so launches sharing a ticket must not overlap on the
 * device. Returns 0 or a CUDA error, or -1 without launching anything where the fused kernel
 * does not apply (T, H, alignment, shared memory): launch the two kernels then. */
int fm_moe_route_fused_launch(const fm_moe_config *cfg, const float *bias, const uint16_t *x, const float *rw, int T,
                              float *logits, int32_t *ids, float *weights, unsigned long long *bad, unsigned *ticket,
                              void *stream);

/* What the device records for fm_layer_errors; every field accumulates over
 * launches until the host clears it (set all bytes to 0xFF except the counts,
 * see fm_moe_dev_errors_reset_launch). */
typedef struct {
    unsigned long long bad_ids;           /* routed slots with an id outside [-1, n_global) */
    unsigned long long first_bad_slot;    /* smallest such slot, UINT64_MAX: none */
    unsigned long long first_nonfinite_x; /* smallest t*H + c of a NaN/Inf x element read, UINT64_MAX: none */
    unsigned long long bad_logit;         /* smallest t*E + e of a NaN/Inf router logit, UINT64_MAX: none */
    unsigned long long nonfinite_w;       /* external weights of local slots that are NaN/Inf */
    /* fm_layer_run_dispatched: local experts whose rows were skipped (bad counts / offsets,
     * more rows than the layer holds), and the smallest FM_DISPATCH_BAD_KEY of them
     * (UINT64_MAX: none) */
    unsigned long long bad_experts;
    unsigned long long first_bad_expert;
    /* W4A8 (act_fp8): the smallest local expert whose activation output (FC2's input) has a
     * NaN/Inf element, UINT64_MAX: none (no FP8 scale can be made from it) */
    unsigned long long nonfinite_h;
} fm_moe_dev_errors;

/* Why a dispatched expert's rows were skipped (fm_moe_dispatch_layout_launch), and the
 * key recorded for it: the smallest key is the smallest local expert e; value is what the
 * message prints (COUNT: counts[e]; OFFSET0: offsets[0]; ORDER: offsets[e]; TOO_MANY: the
 * rows received up to and including e). */
enum {
    FM_DISPATCH_BAD_COUNT = 1,    /* counts[e] outside [0, capacity] */
    FM_DISPATCH_BAD_OFFSET0 = 2,  /* offsets[0] != 0 (expert 0's rows skipped) */
    FM_DISPATCH_BAD_ORDER = 3,    /* [offsets[e], offsets[e+1]) not within what the offsets around it leave */
    FM_DISPATCH_BAD_TOO_MANY = 4, /* the rows up to e exceed the layer's max_tokens x top_k */
};
#define FM_DISPATCH_BAD_KEY(e, kind, value) \
    (((unsigned long long)(e) << 35) | ((unsigned long long)(kind) << 32) | (unsigned long long)(uint32_t)(value))
#define FM_DISPATCH_BAD_E(key) ((int)((key) >> 35))
#define FM_DISPATCH_BAD_KIND(key) ((int)(((key) >> 32) & 7))
#define FM_DISPATCH_BAD_VALUE(key) ((int32_t)(uint32_t)((key) & 0xffffffffu))

/* Clear err (asynchronous on stream). */
int fm_moe_dev_errors_reset_launch(fm_moe_dev_errors *err, void *stream);

/* The stable permutation of fm_moe_permute on the device over the local experts
 * of a shard, plus what the GEMMs need: slot s (= t*top_k + j) with global id g
 * is local when g - first is in [0, E) (E = local experts); offsets[E+1];
 * perm[p] = local slot of permuted row p, slots ascending within an expert;
 * token_slots[s] = p (its inverse), -1 for the slots left out (id -1, another
 * shard's expert, an id out of range); row_weight[p] = weights[s]; row_token[p]
 * = s / top_k (row_token may be NULL). err (or NULL): ids outside [-1,
 * n_global) are counted there, non-finite weights of local slots too, and
 * *bad_logit (or NULL: the routing kernel's word) is folded into it.
 * scratch: fm_moe_permute_scratch_bytes (per-chunk counts, so the placement runs
 * in parallel over slot chunks: at T x top_k = 32,768 one warp per expert walking
 * every slot took ~0.25 ms), or NULL (one chunk).
 * active (or NULL): [1 + E], active[0] = the experts with rows, active[1..] = them
 * ascending (the GEMMs' expert_list, fm_cuda_gemm_args).
 * Deterministic: no atomics decide an order. */
size_t fm_moe_permute_scratch_bytes(int T, int top_k, int E);
int    fm_moe_permute_launch(const int32_t *ids, const float *weights, int T, int top_k, int E, int first,
                             int n_global, int32_t *offsets, int32_t *perm, int32_t *token_slots, float *row_weight,
                             int32_t *row_token, void *scratch, fm_moe_dev_errors *err,
                             const unsigned long long *bad_logit, int32_t *active, void *stream);

/* Dispatched rows (fm_layer_run_dispatched) as the chain's permutation, on the device:
 * rows received by local expert e (layout FM_DISPATCH_EXPERT_MAJOR: counts[e] at rows
 * e*capacity.., FM_DISPATCH_EXPERT_ROWS: [offsets[e], offsets[e+1])) packed in the
 * layout's own order (expert, then row) into offsets[E+1]; perm[p] = the layout row of
 * packed row p (x's and out's: the same layout), row_weight[p] = weights[that row] or 1
 * (weights NULL); active (or NULL): as fm_moe_permute_launch's. The counts / offsets are
 * checked here, not on the host: an expert whose count is outside [0, capacity], or whose
 * offsets range is not within what the offsets before and after it leave (offsets[0] = 0,
 * ranges in order: so that every expert read lies in [0, offsets[E]) and no two overlap),
 * or whose rows would take the total past max_rows (the run's bound: the smallest the host
 * knows of the layer's max_tokens x top_k, the args' max_rows and n_local x capacity), gets
 * no rows: counted in err->bad_experts, its FM_DISPATCH_BAD_KEY atomicMin'ed into
 * err->first_bad_expert; NaN/Inf weights of packed rows are counted in err->nonfinite_w.
 * scratch: (E + 1) int32. One CTA of 1024 threads checks and scans, and places the rows
 * itself when max_rows <= 4,096; a second launch places them over max_rows otherwise. No
 * host synchronisation. E <= 65,535. */
int fm_moe_dispatch_layout_launch(int layout, const int32_t *counts, int capacity, const int32_t *offsets,
                                  const float *weights, int E, int max_rows, int32_t *offsets_out,
                                  int32_t *perm, float *row_weight, int32_t *active, int32_t *scratch,
                                  fm_moe_dev_errors *err, void *stream);

/* out[perm[p]] = scratch[p] (H FP32 columns; FP32 into out, or BF16 (RNE) into out_bf16)
 * for p < *n_rows (a device count) and p < rows; the layout's other rows are not written.
 * H % 4 == 0, 16-byte aligned rows. */
int fm_moe_dispatch_store_launch(const float *scratch, const int32_t *perm, const int32_t *n_rows, int rows, int H,
                                 float *out, uint16_t *out_bf16, void *stream);

/* out[t] += W2 . (silu(W13[0:S] . x[t]) * (W13[S:2S] . x[t])), BF16 weights, FP32 hs[T][S] scratch;
 * H % 8 == 0, S % 8 == 0, 16-byte aligned buffers. */
int fm_moe_shared_expert_launch(const uint16_t *x, const uint16_t *w13, const uint16_t *w2, int T, int H, int S,
                                float *hs, float *out, void *stream);
/* xp[p] = x[perm[p] / top_k] for p < rows (H % 8 == 0) and, when n_rows is not
 * NULL, p < *n_rows (a device count: the routed rows of this run); packed: columns
 * in the prepack K order (fm_cuda_kpack_col, H % 64 == 0), the X the wgmma tiles
 * stream. bad_x (or NULL): the smallest t*H + c of a NaN/Inf element copied is
 * atomicMin'ed there. pdl (sm_90+): launched with programmatic stream serialization
 * (the kernel waits for the previous grid before reading anything). */
int fm_moe_gather_launch(const uint16_t *x, const int32_t *perm, int rows, int top_k, int H, int packed, uint16_t *xp,
                         const int32_t *n_rows, unsigned long long *bad_x, int pdl, void *stream);

/* FP8 activations (W4A8; act_fp8.cu): row p of the source quantized to E4M3 codes
 * q[p * ldq + c] with FP32 scales scales[p * ldsc + b], one per 128 columns
 * (FM_ACT_FP8_MODE_BLOCK128, the last block may be shorter) or one per row (TOKEN): the
 * numbers of fm_moe_act_fp8_row bit for bit. Source: BF16 x (row p = x[perm[p] / top_k] with
 * perm, else x[p]; the gather's rows) or FP32 xf rows (no perm); exactly one of x / xf.
 * Rows p < rows and, when n_rows is not NULL, p < *n_rows (a device count). n % 4 == 0,
 * ldq >= n and % 4 == 0, x 8-byte / xf 16-byte / q 4-byte aligned (else
 * cudaErrorMisalignedAddress, nothing launched). bad (or NULL): the
 * smallest source row x n + c of a NaN/Inf element is atomicMin'ed there (its q then holds
 * the E4M3 NaN code or a saturated value: the caller reports it, as for the gather). */
enum { FM_ACT_FP8_MODE_BLOCK128 = 1, FM_ACT_FP8_MODE_TOKEN = 2 }; /* = fm_act_fp8's values */
/* FP32 scales per row of n columns in mode: one per 128 (the last may be shorter), or one */
static inline int fm_act_fp8_nscales(int mode, int n) { return mode == FM_ACT_FP8_MODE_BLOCK128 ? (n + 127) / 128 : 1; }
int fm_act_fp8_launch(const uint16_t *x, const float *xf, const int32_t *perm, int top_k, int rows,
                      const int32_t *n_rows, int n, int mode, uint8_t *q, long long ldq, float *scales, int ldsc,
                      unsigned long long *bad, void *stream);

/* FP8 rows a dispatch sent (DeepEP / NCCL EP low latency: E4M3 codes [rows][n], 16-byte
 * aligned, FP32 scales [rows][ceil(n / 128)]) into the W4A8 chain's buffers as they are: row p
 * < min(rows, *n_rows) = source row perm[p], its codes into q + p x ldq and its scales into
 * scales + p x ldsc. bad (or NULL): atomicMin of the smallest source element with a NaN code,
 * or of a block's first element where its scale is not finite and > 0 (the gather's NaN/Inf
 * report). n % 16 == 0, ldq % 16 == 0. cudaErrorInvalidValue / cudaErrorMisalignedAddress. */
int fm_fp8_rows_launch(const uint8_t *xq, const float *xs, const int32_t *perm, int rows, const int32_t *n_rows, int n,
                       uint8_t *q, long long ldq, float *scales, int ldsc, unsigned long long *bad, void *stream);

/* W4A8's activation between the GEMMs, quantized for FC2 in the same pass (act_fp8.cu): for
 * rows p < min(rows, off[L]) (off[L] a device count) of FC1's FP32 output y1[p][2I] (gate
 * columns [0, I), up [I, 2I)), row p of local expert e (off[e] <= p < off[e+1]):
 * g = y1[p][j] x gs[e] + b13[e][j], u = y1[p][I + j] x us[e] + b13[e][I + j] (gs / us the gate /
 * up global scales, b13 NULL: none), h[p][j] = silu(g) x u or gpt-oss's clamped form (act =
 * fm_activation, limit) as fm_moe_expert_act computes it, then h's row quantized as
 * fm_act_fp8_launch quantizes an FP32 row in mode (codes q[p * I + j], scales[p * ldsc + b]):
 * the same codes and scales as h written out and quantized apart. The smallest e with a
 * NaN/Inf h is atomicMin'ed into *bad_h. I % 4 == 0 (any I: the token mode holds no row in
 * shared memory), y1 and b13 16-byte aligned, q and scales 4-byte aligned;
 * cudaErrorInvalidValue / cudaErrorMisalignedAddress, nothing launched. */
int fm_w4a8_act_fp8_launch(const float *y1, const int32_t *off, int L, int rows, int I, const float *gs,
                           const float *us, const float *b13, int act, float limit, int mode, uint8_t *q,
                           float *scales, int ldsc, unsigned long long *bad_h, void *stream);

/* out[i] = BF16(in[i]) (round to nearest even), n % 4 == 0, 16-byte aligned. */
int fm_moe_store_bf16_launch(const float *in, long long n, uint16_t *out, void *stream);

#ifdef __cplusplus
}
#endif
#endif
