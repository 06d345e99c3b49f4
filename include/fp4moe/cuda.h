/* fp4moe/cuda.h - the GPU grouped GEMM with FP4 weights (present when the
 * library is built with nvcc: FM_HAVE_CUDA).
 *
 * For every expert e:  Y_e[m_e x N] = X_e[m_e x K] . W_e^T
 *   X   BF16, the rows of all experts contiguous in expert order; expert e owns
 *       rows [offsets[e], offsets[e+1]) where `offsets` lives in DEVICE memory
 *       (the host never needs the counts: a launch is CUDA-graph capturable);
 *   W   NVFP4 or MXFP4, prepacked once by fm_cuda_weights_create;
 *   FP32 accumulation; the epilogue chooses the output:
 *     FM_CUDA_EPI_NONE      y: BF16 [rows][N]
 *     FM_CUDA_EPI_SWIGLU    y: BF16 [rows][N/2] = silu(gate) * up, gate = features
 *                      [0, N/2), up = [N/2, N) (FC1 of an MoE expert)
 *     FM_CUDA_EPI_FINALIZE  y: FP32 [n_tokens][N]; out[row_token[r]] += row_weight[r] * Y[r],
 *                      by atomicAdd (the summation order varies run to run)
 *     FM_CUDA_EPI_FINALIZE_DET  same sum, deterministic: Y rows go to `scratch`
 *                      (FP32 [rows][N]) and a second kernel adds, for each token,
 *                      its slots in ascending slot order (token_slots).
 *
 * Prepacked weight layout (documented in src/cuda/prepack.c, tested by
 * tests/gpu/test_cuda_prepack.c): per expert, per 16-row band, per 64-column
 * chunk, 512 bytes = 32 lanes x 16 bytes, each lane's 16 bytes being exactly its
 * mma.sync A fragments for that chunk; K is zero-padded to a multiple of 64.
 * Scales become one byte each in an exponent-offset code that the kernel turns
 * into a BF16 multiplier with one integer multiply-add.
 */
#ifndef FP4MOE_CUDA_H
#define FP4MOE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "fp4moe/format.h"
#include "fp4moe/kernels.h"
#include "fp4moe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A tile is an fm_tile (fp4moe/kernels.h: fields, fm_tile_name / fm_tile_parse /
 * fm_tile_equal; src/kernels/fm_tiles.def lists the compiled ones). Which kernel runs it:
 *   family FM_FAMILY_FP4MOE_MMA   mma.sync m16n8k16 (gemm_mma.cuh): sm_80 and later,
 *                                    SM120 within 99 KB
 *   family FM_FAMILY_FP4MOE_WGMMA    wgmma m64nNk16, weights from registers (gemm_wgmma.cu):
 *                                    sm_90a (H100/H200) only; persist = 1: the persistent
 *                                    kernel (one CTA per SM loops over the tiles, loading the
 *                                    next tile while the last one's output leaves, from an
 *                                    output buffer of its own that fm_smem_wgmma counts;
 *                                    packed X only; names ending in "p")
 *   family FM_FAMILY_AUTO (0)        a tile written by its first five fields: mma.sync
 * Any other family is FM_ERR_INVALID_ARG. The former fm_cuda_tile (a kernel enum,
 * FM_CUDA_KERNEL_*, as its sixth field) is removed, not aliased: an initializer written
 * for it, {w, mt, nt, kc, st, FM_CUDA_KERNEL_WGMMA}, would compile against fm_tile as
 * persist = 1, family AUTO, and launch another kernel; without the names it fails to
 * compile instead. */

/* The operation on the GEMM's output (the table at the top of this file); the planner's
 * fm_epilogue (fp4moe/plan.h) is a different question, how a CUTLASS epilogue uses
 * shared memory. */
typedef enum {
    FM_CUDA_EPI_NONE = 0,
    FM_CUDA_EPI_SWIGLU = 1,
    FM_CUDA_EPI_FINALIZE = 2,
    FM_CUDA_EPI_FINALIZE_DET = 3,
} fm_cuda_epilogue;

/* Prepacked device weights of n_experts experts, each [N][K]. */
typedef struct fm_cuda_weights fm_cuda_weights;

/* Prepack w[0..n_experts) (host fm_qtensor, all NVFP4 or all MXFP4, same N and K,
 * K a multiple of 16 (NVFP4) or 32 (MXFP4)) and upload them to the current device.
 * Returns FM_OK, FM_ERR_INVALID_ARG (NULL, n_experts < 1), FM_ERR_FORMAT (BF16 or
 * mixed formats, a negative block scale), FM_ERR_BAD_SHAPE (N not a multiple of 16,
 * shapes differ), FM_ERR_NONFINITE (a NaN scale code or global scale),
 * FM_ERR_UNSUPPORTED (MXFP4 scales of one expert spanning more than 2^120),
 * FM_ERR_NO_DEVICE, FM_ERR_OOM, FM_ERR_CUDA. *out is NULL on failure. */
fm_status fm_cuda_weights_create(const fm_qtensor *w, int n_experts, fm_cuda_weights **out);
/* The same for FC1 weights [2I][K] (gate rows [0, I), up rows [I, 2I)) whose halves have
 * global scales of their own, as NVFP4 checkpoints store them (fm_moe_weights.w13_up_global):
 * the gate rows under w[e].global_scale, the up rows under up_global[e]; block scales taken
 * as they are (no re-encoding). The FM_CUDA_EPI_SWIGLU epilogue applies each half's global;
 * the other epilogues apply w[e].global_scale to every row. up_global NULL = one global per
 * expert (fm_cuda_weights_create). Statuses as fm_cuda_weights_create, and FM_ERR_FORMAT
 * (up_global for MXFP4 weights, which have no global scale), FM_ERR_NONFINITE (an up global
 * that is not finite, positive and normal), FM_ERR_BAD_SHAPE (N not a multiple of 32). */
fm_status fm_cuda_weights_create_gate_up(const fm_qtensor *w, int n_experts, const float *up_global,
                                         fm_cuda_weights **out);
void      fm_cuda_weights_destroy(fm_cuda_weights *w);
/* Shape of prepacked weights (any pointer may be NULL). */
void fm_cuda_weights_shape(const fm_cuda_weights *w, int *n_experts, int *n, int *k, fm_format *fmt);
/* Bytes the kernel streams per full pass: FP4 data + scale bytes, padded K. */
size_t fm_cuda_weights_bytes(const fm_cuda_weights *w);

typedef struct {
    const fm_cuda_weights *w;
    const uint16_t *x;         /* device BF16 [rows][K] (16-byte aligned, K as in w) */
    const int32_t  *offsets;   /* device [n_experts+1], offsets[0] = 0, non-decreasing */
    int             max_rows;  /* rows the buffers hold: offsets[E] <= max_rows (checked on device: rows past it are skipped) */
    fm_cuda_epilogue     epi;
    void           *y;         /* device output, see the epilogue table */
    /* FINALIZE / FINALIZE_DET */
    const float    *row_weight;  /* device [rows] router weight of each permuted row */
    const int32_t  *row_token;   /* device [rows] token of each permuted row (FINALIZE); must be in
                                    [0, n_tokens): the device does not check it (FINALIZE_DET does) */
    int             n_tokens;    /* tokens in y */
    int             top_k;       /* FINALIZE_DET: slots per token */
    const int32_t  *token_slots; /* FINALIZE_DET: device [n_tokens*top_k] permuted row of each slot */
    float          *scratch;     /* FINALIZE_DET: device FP32 [max_rows][N] */
    int             y_zero_init; /* FINALIZE_DET: 1 = the sums start from 0, not from y's contents */
    uint16_t       *y_bf16;      /* FINALIZE_DET: non-NULL = the sums go here as BF16 [n_tokens][N] (RNE),
                                    not to y (y is then only read, and may be NULL with y_zero_init) */
    /* tile: NULL launches the planner's first candidate for expected_rows rows per
     * expert within the shared-memory limit (fm_cuda_gemm_choose says which) */
    /* x_packed: the columns of X are in the prepack's K order (fm_cuda_x_pack;
     * K % 64 == 0): the wgmma tiles then stream X with 16-byte copies into the
     * layout the tensor cores read (the fast path); the mma tiles refuse it.
     * y_packed (NONE, SWIGLU): write the BF16 output columns in that order, so that
     * Y can be the packed X of the next GEMM (its column count % 64 == 0). */
    int             x_packed, y_packed;
    const fm_tile  *tile;
    int             expected_rows; /* average rows per expert, for the tile choice (< 1 counts as 1) */
    int             active_experts; /* experts expected to have rows, for the tile choice (0 or > n_experts:
                                       all; decode: min(experts, tokens x top_k)) */
    size_t          smem_limit;    /* 0: the device's opt-in limit; else min(this, device) (e.g. 101376 = SM120) */
    void           *stream;        /* cudaStream_t, NULL = default stream */
    /* feature_blocks (the mma tiles of one token group that have a multi-block
     * kernel: the rows of src/kernels/fm_tiles.def with mb = 1, e.g. w8m1n1k64s4,
     * w4m1n1k128s4, w4m2n1k256s3; fm_mma_tile_has_mb): consecutive feature blocks one CTA computes,
     * its K pipeline running across them (short K has too few stages per block
     * to keep bytes in flight).
     * 0 = automatic (no tile given: the planner's choice, one block or the count
     * below; a tile given: K <= 512 and enough blocks, up to 8), 1 = one block per CTA,
     * > 1 = that many (FM_ERR_UNSUPPORTED for a tile without that kernel). */
    int             feature_blocks;
    /* pdl = 1: programmatic dependent launch (compute capability 9.0+; elsewhere a plain
     * launch). The kernel may be scheduled while the previous kernel in the stream
     * finishes: its CTAs take the SM slots that kernel's last CTAs free and wait there
     * (griddepcontrol.wait) until it has completed and its writes are visible, before
     * reading or writing anything; so stream order holds for all data as with a plain
     * launch, and the launch latency is off the critical path. Each kernel lets the next
     * one do the same (it triggers at its start). Graph-capturable (a programmatic edge).
     * 0 = plain launch. */
    int             pdl;
    /* k_splits: split K over this many CTAs per (expert, feature block), for calls
     * whose experts x feature blocks leave most SMs idle (decode on the few experts of
     * a shard that received rows). The mma tiles' plain kernel only (one feature block
     * per CTA). Each CTA streams a contiguous share of the K stages and stores FP32
     * partials; the last CTA of each (row pass, feature block) sums them in split order
     * (deterministic: the same bits on every run, though not the unsplit kernel's
     * rounding) and runs the epilogue. 0 or 1: no split; 2..FM_CUDA_MAX_K_SPLITS: that
     * many (at most the tile's K stages, ceil(kp / kc)); FM_CUDA_K_SPLITS_AUTO with no
     * tile given: the planner's choice (fm_cuda_gemm_choose), which needs split_ws.
     * split_ws / split_ws_bytes: device memory of at least
     * fm_cuda_gemm_split_ws_bytes(w, max_rows, k_splits) bytes, 16-byte aligned,
     * zero-filled before its first use. The arrival counters sit at its start, the
     * partials at its end, so one buffer serves calls of several shapes and row
     * counts when it is as large as the largest counter part plus the largest
     * partial part among them; every launch leaves its counters at zero again.
     * Launches in flight at once need their own. */
    int             k_splits;
    void           *split_ws;
    size_t          split_ws_bytes;
    /* expert_list (device int32 [1 + n_experts], or NULL): [0] = n, then n distinct
     * experts in [0, n_experts) that must include every expert with rows (those left
     * out are not computed); fm_moe's permutation writes it. The mma tiles then launch
     * CTAs for expert_slots experts (0 or > n_experts: all) that loop over the n x
     * (feature blocks x k_splits) units of the list: a grid sized for the experts
     * expected to have rows (decode on a shard: 1-8 of 32), not for all of them, whose
     * empty CTAs would only queue. More listed experts than slots: the CTAs take several
     * units each (correct, slower). The wgmma tiles ignore it (they compute every
     * expert with rows, the same result). */
    const int32_t  *expert_list;
    int             expert_slots;
    /* FINALIZE_DET: 1 = its reduce (the slot-order sum into y) is launched with PDL too
     * (compute capability 9.0+, with pdl): it starts as this GEMM drains instead of after.
     * 0 = a plain launch. fm_layer sets it on cc 9.0+ unless fm_layer_desc.pdl_chain is OFF. */
    int             pdl_reduce;
    /* The device (fm_cuda_device_open; it must be current): its limits and the kernels
     * it has code for decide the tile. NULL: the current device, opened once by the
     * library and kept. */
    const struct fm_cuda_device *device;
} fm_cuda_gemm_args;

#define FM_CUDA_MAX_K_SPLITS 32
#define FM_CUDA_K_SPLITS_AUTO (-1)

/* Bytes of fm_cuda_gemm_args.split_ws for weights w, max_rows rows and k_splits splits
 * (0 when k_splits < 2 or w is NULL): the arrival counters, (max_rows / 8 + n_experts
 * + 1) x N / 16 int32 rounded up to 256 B, then the FP32 partials
 * [k_splits][max_rows][N]. */
size_t fm_cuda_gemm_split_ws_bytes(const fm_cuda_weights *w, int max_rows, int k_splits);
/* The counter part of it (the same for every k_splits > 1). */
size_t fm_cuda_split_counter_bytes(const fm_cuda_weights *w, int max_rows);

/* Launch the grouped GEMM (asynchronous on a->stream).
 * Returns FM_OK, FM_ERR_INVALID_ARG (NULL pointers the epilogue needs, max_rows < 0,
 * unknown epilogue, feature_blocks < 0, a tile family other than the two fp4moe kernels
 * and AUTO, k_splits < -1 or > FM_CUDA_MAX_K_SPLITS, k_splits > 1 without split_ws,
 * expert_slots < 0; expert_list not 4-byte aligned: FM_ERR_MISALIGNED),
 * FM_ERR_MISALIGNED (x not 16-byte aligned; FINALIZE_DET: y or
 * scratch not 16-byte aligned; split_ws not 16-byte aligned), FM_ERR_UNSUPPORTED (k_splits > 1
 * with a wgmma tile, with more than one feature block per CTA, or above the tile's K
 * stages; x_packed with an mma
 * tile or K % 64 != 0, y_packed with an output width % 64 != 0 or a FINALIZE
 * epilogue, a tile that is not compiled in,
 * a wgmma tile on a device other than compute capability 9.0, a wgmma grid over 2^31-1 CTAs,
 * SwiGLU with an odd mt or N not a multiple of 32, feature_blocks > 1 with a
 * tile that has no multi-block kernel, more than 65,535 experts, or
 * FINALIZE_DET over more than 65,535 tokens), FM_ERR_SMEM_EXCEEDED (the tile's
 * shared memory, from fm_smem_mma, exceeds the limit; nothing launched),
 * FM_ERR_NO_DEVICE, FM_ERR_CUDA (launch failure). */
fm_status fm_cuda_gemm(const fm_cuda_gemm_args *a);

/* The prepack's K order: within each block of 64 columns, natural column
 * 2P + lo (pair P = 8t + 2s + h, t < 4, s < 4, h < 2) goes to position
 * (2s + h)*8 + 2t + lo: the order in which one MMA step's A fragment holds K
 * (src/cuda/prepack.c), so that a token row can be copied 16 bytes at a time
 * into wgmma's B layout. fm_cuda_kpack_col gives the position of column c. */
int64_t fm_cuda_kpack_col(int64_t c);
/* out[r][fm_cuda_kpack_col(c)] = x[r][c] for a device BF16 [rows][k] matrix
 * (k % 64 == 0; out != x, both 16-byte aligned), asynchronous on stream.
 * Returns FM_OK, FM_ERR_INVALID_ARG, FM_ERR_BAD_SHAPE (k % 64), FM_ERR_MISALIGNED,
 * FM_ERR_CUDA. */
fm_status fm_cuda_x_pack(const uint16_t *x, uint16_t *out, int rows, int k, void *stream);

/* The tile (and feature blocks per CTA) fm_cuda_gemm launches when a->tile is
 * NULL: the first candidate of the planner's ranking fm_plan_fp4moe (fp4moe/kernels.h)
 * (its family set: mma or wgmma, persist for the persistent kernel)
 * for this call on the current device: a->w's format and shape, a->expected_rows
 * rows per expert (< 1: 1) on a->active_experts experts (0: all), a->epi (SwiGLU:
 * gate/up pairs), a->x_packed,
 * a->feature_blocks and the shared-memory limit (the device's opt-in limit, or
 * a->smem_limit when lower). The device is matched to the planner's GPU table by
 * compute capability, SMs and memory bandwidth. With a->k_splits ==
 * FM_CUDA_K_SPLITS_AUTO the ranking also holds the plain mma kernel with K split
 * (up to FM_CUDA_MAX_K_SPLITS) where its grid would leave SMs idle; *k_splits gets
 * the choice (1 = none). Only a, a->w and tile are read (feature_blocks, k_splits and
 * est_us, the planner's estimate in microseconds, may be NULL). Returns FM_OK, FM_ERR_INVALID_ARG (NULL,
 * feature_blocks < 0), FM_ERR_NO_DEVICE, and fm_plan_fp4moe's statuses
 * (FM_ERR_UNSUPPORTED: no tile fits the limit, ...). */
fm_status fm_cuda_gemm_choose(const fm_cuda_gemm_args *a, fm_tile *tile, int *feature_blocks, int *k_splits,
                              double *est_us);

/* Shared memory the compiled kernel of `t` was given at its last launch and its
 * static size, from cudaFuncGetAttributes (for the planner conformance test).
 * Returns FM_OK, FM_ERR_UNSUPPORTED (not compiled in), FM_ERR_CUDA. */
fm_status fm_cuda_tile_attributes(const fm_tile *t, fm_format fmt, size_t *static_smem, size_t *max_dynamic_smem);

#ifdef __cplusplus
}
#endif
#endif
