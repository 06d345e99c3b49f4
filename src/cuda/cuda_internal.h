/* cuda_internal.h - what the CUDA parts of fp4moe share (not installed): the
 * prepacked weight object, the host-side prepacker (plain C, testable without a
 * GPU) and the extern "C" launchers of the .cu files. */
#ifndef FM_CUDA_INTERNAL_H
#define FM_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "fp4moe/cuda.h"
#include "fp4moe/layer.h"
#include "kernels/fm_kernels_smem.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FM_PACK_KCHUNK 64   /* K per prepacked chunk: 4 mma k16 steps */
#define FM_PACK_BAND 16     /* output features per band: the mma M */
#define FM_PACK_CHUNK_BYTES 512 /* 32 lanes x 16 bytes of FP4 codes */
#define FM_PACK_SCALE_BYTES 64  /* 32 lanes x 2 scale bytes */

/* Per weight format, what the prepack writes and the kernels decode: one row each
 * (prepack.c k_pack_formats), so the prepack and the launcher ask the row, never the
 * format. Adding a 4-bit block format = a row here (and its code in prepack.c).
 *   code    the scale byte the prepack writes (prepack.c's header has the arithmetic):
 *           E5M3 = an E4M3 scale as an unsigned E5M3 exponent-offset byte (NVFP4);
 *           EXP_REBASED = a UE8M0 exponent minus the expert's smallest + 1 (MXFP4)
 *   sc_mul, sc_add  the kernel's decode of that byte: bf16x2 = byte * mul + add (both halves) */
typedef enum { FM_PACK_SCALE_E5M3 = 0, FM_PACK_SCALE_EXP_REBASED } fm_pack_scale_code;
typedef struct {
    fm_format          format;
    fm_elem            elem; /* the planner's operand type (fm_fp4moe_query.weights) */
    fm_pack_scale_code code;
    unsigned           sc_mul, sc_add;
} fm_pack_format;
/* The row of format f; NULL if the prepack does not take it (only NVFP4 and MXFP4). */
const fm_pack_format *fm_pack_format_get(fm_format f);

struct fm_cuda_weights {
    fm_format fmt;
    int       n_experts, n, k, kp; /* kp = K padded to a multiple of 64 */
    void     *d_data;   /* device [E][N/16][kp/64][32][16 B] */
    void     *d_scale;  /* device [E][N/16][kp/64][32][2 B] */
    float    *d_oscale; /* device [2][E] FP32 output multipliers (global scale x code folds): [0][e] of
                         * every row (SWIGLU: the gate rows), [1][e] of the up rows under SWIGLU (=
                         * [0][e] unless fm_cuda_weights_create_gate_up got an up global) */
    size_t    data_bytes, scale_bytes; /* per expert */
};

/* Prepack one expert on the host: data[n/16 * kp/64 * 512], scale[n/16 * kp/64 * 64],
 * *oscale. w is NVFP4 or MXFP4, rows % 16 == 0. Statuses as fm_cuda_weights_create. */
fm_status fm_cuda_prepack(const fm_qtensor *w, uint8_t *data, uint8_t *scale, float *oscale);
/* Bytes fm_cuda_prepack writes for an n x k matrix. */
void fm_cuda_prepack_sizes(int64_t n, int64_t k, size_t *data_bytes, size_t *scale_bytes);
/* Decode a prepacked expert back to dst[n][k] FP32 exactly the way the kernel
 * does (bit extraction, BF16 scale multiply, output multiplier): the layout's test. */
void fm_cuda_unpack(const uint8_t *data, const uint8_t *scale, float oscale, fm_format fmt, int64_t n, int64_t k,
                    float *dst);

/* ---- the device context (device.c) ---- */
int fm_cuda_device_ordinal(const fm_cuda_device *d);
/* Make d current; *prev = the caller's current device, restored by
 * fm_cuda_device_leave (nothing is switched when it already is d). */
fm_status fm_cuda_device_enter(const fm_cuda_device *d, int *prev);
void      fm_cuda_device_leave(const fm_cuda_device *d, int prev);
/* The device current on the calling thread, opened once per ordinal and kept (the GEMM
 * API runs on the current device): the only place the library asks which one it is. */
fm_status fm_cuda_device_current(const fm_cuda_device **out);
/* The GPU row the planner ranks tiles for (the table's, else the device's figures). */
const fm_gpu_info *fm_cuda_device_plan_gpu(const fm_cuda_device *d);
/* Whether catalogue row idx of a family (wgmma 0/1) has code on d. */
int  fm_cuda_device_has_tile(const fm_cuda_device *d, int wgmma, int idx);
void fm_cuda_device_rows(const fm_cuda_device *d, unsigned long long *mma_rows, unsigned long long *wgmma_rows);
/* One kernel of each hand-written unit, for the device's code probe. */
const void *fm_mma_generic_kernel(void);
const void *fm_wgmma_generic_kernel(void);
const void *fm_route_generic_kernel(void);
const void *fm_moe_generic_kernel(void);

/* ---- the kernels' parameters: what both families (gemm_mma.cuh's mma.sync kernel
 * and gemm_wgmma.cu's wgmma kernels) take, filled by fm_cuda_gemm (gemm_launch.c) ---- */
typedef struct {
    const void     *wdata, *wscale;
    const float    *oscale;
    const uint16_t *x;
    const int32_t  *offsets;
    int             max_rows, n_experts, n, k, kp;
    unsigned        sc_mul, sc_add;
    int             epi;
    int             x_packed, y_packed; /* X / BF16 Y columns in the prepack K order (fm_cuda_x_pack) */
    int             nb;                 /* mma tiles: feature blocks per CTA (> 1: the multi-block kernel) */
    void           *y;
    const float    *row_weight;
    const int32_t  *row_token;
    float          *scratch;
    int             pdl; /* launch with programmatic stream serialization (fm_cuda_gemm_args.pdl, cc 9.0+) */
} fm_gemm_params;

/* gpt-oss's experts (moe.h), a parameter of the gpt-oss twin of each kernel only
 * (kernel_common.cuh's OSS: the *_oss_* kernels, launched when bias is set or act is not
 * FM_ACT_SWIGLU), read by the epilogues, so that every kernel family, the work list, split
 * K and the multi-block kernel take them alike. A struct of its own, as fm_gemm_work:
 * 16 more bytes of fm_gemm_params alone moved ptxas's register allocation of the plain
 * kernels (mma 4x1x1 k128 s8: 118 -> 70 registers, others up, new spills).
 *   bias: FP32 [n_experts][n] added to the GEMM's output in FP32 (SWIGLU: gate then up,
 *         before the activation; FINALIZE / FINALIZE_DET: before the row weight, so the
 *         bias is weighted as the model weighs it; NONE: not read), or NULL;
 *   act:  FM_ACT_SWIGLU or FM_ACT_SWIGLU_GPTOSS with its clamp act_limit (SWIGLU only). */
typedef struct {
    const float *bias;
    int          act;
    float        act_limit;
} fm_gemm_oss;

/* The mma work-list kernel's extra parameters (gemm_mma.cuh mma_list_kernel; a
 * struct of its own so that fm_gemm_params, and with it every other kernel, stays as
 * it was):
 *  - split K (fm_cuda_gemm_args.k_splits): ksplit CTAs per (expert, feature block) each
 *    take a contiguous share of the K stages; FP32 partials go to
 *    split_part[ksplit][max_rows][n], split_cnt counts arrivals per (row pass, feature
 *    block) (index (row0 / tokens per pass + expert + pass) x nbx + block) and the last
 *    CTA sums the partials in split order and runs the epilogue (deterministic), then
 *    resets its counter to 0;
 *  - the experts' work list (fm_cuda_gemm_args.expert_list): active[0] experts
 *    active[1..]; the grid is upe units (feature blocks x ksplit) x slots experts and its
 *    CTAs loop over active[0] x upe units. NULL: a grid of every expert's units.
 * nbx and upe are filled by fm_mma_launch. */
typedef struct {
    int            ksplit; /* 1: no split */
    float         *split_part;
    int           *split_cnt;
    const int32_t *active;
    int            slots;
    int            nbx, upe;
} fm_gemm_work;

/* ---- launchers (gemm_mma.cu) ---- */
/* Launch the X-packing kernel (gemm_wgmma.cu): out[r][kpack(c)] = x[r][c]. */
int fm_x_pack_launch(const uint16_t *x, uint16_t *out, int rows, int k, void *stream);

/* Launch compiled tile `idx` (its index in fm_mma_tiles(): fm_mma_tile_index)
 * with `smem` dynamic bytes on device ordinal dev (current); work (or NULL): the
 * work-list kernel with its split K / expert list (one feature block per CTA:
 * p->nb <= 1); oss (or NULL): gpt-oss's epilogues, the twin kernels launched when it has a
 * bias or act is not FM_ACT_SWIGLU. Returns a cudaError_t as int. */
int fm_mma_launch(int dev, int idx, const fm_gemm_params *p, const fm_gemm_work *work, const fm_gemm_oss *oss,
                  size_t smem, void *stream);
/* 1 if tile idx has a multi-block kernel (p->nb > 1 may be launched) */
int fm_mma_has_mb(int idx);
/* Probe builds (-DFM_PROBE_TIMELINE=ON) only: every mma-kernel CTA writes {SM, start ns,
 * end ns} into buf (4 launch slots of cap CTAs x 3 uint64, launch by launch; buf NULL =
 * off). Returns 0, a cudaError_t, or -1 when the library is not a probe build. */
int fm_mma_probe_timeline(void *buf, unsigned cap);
int fm_mma_attributes(int idx, size_t *static_smem, size_t *max_dyn);
/* CTAs per SM (cudaOccupancyMaxActiveBlocksPerMultiprocessor with the launch's
 * attributes) and registers per thread of kernel idx (mb: its multi-block kernel;
 * wgmma: x_packed = the warp-specialized one); a cudaError_t. For the planner's
 * occupancy conformance test. */
int fm_mma_occupancy(int idx, int mb, size_t smem, int *blocks, int *regs);
int fm_wgmma_occupancy(int idx, int x_packed, size_t smem, int *blocks, int *regs);
/* ---- launchers (gemm_wgmma.cu, sm_90a units): same parameters, idx in fm_wgmma_tiles()
 * (fm_wgmma_tile_index) ---- */
/* CTAs the launch needs (upper bound; the persistent kernel: at most sms), -1: not in the build */
long long fm_wgmma_grid(int idx, const fm_gemm_params *p, int sms);
int       fm_wgmma_persistent(int idx); /* 1: the persistent kernel (packed X only) */
int       fm_wgmma_launch(int dev, int sms, int idx, const fm_gemm_params *p, const fm_gemm_oss *oss, size_t smem,
                          void *stream);
int       fm_wgmma_attributes(int idx, int x_packed, size_t *static_smem, size_t *max_dyn);
/* v = init[t][n] (init NULL: 0) + sum_j scratch[token_slots[t*top_k+j]][n] in j
 * order, into out[t][n] FP32 or, when out_bf16 is not NULL, out_bf16[t][n] BF16 (RNE). */
/* pdl (sm_90+): launched with programmatic stream serialization (the kernel waits for
 * the previous grid before reading anything). */
int fm_finalize_reduce_launch(const float *scratch, const int32_t *token_slots, int n_tokens, int top_k, int n,
                              int max_rows, const float *init, float *out, uint16_t *out_bf16, int pdl, void *stream);

#ifdef __cplusplus
}
#endif
#endif
