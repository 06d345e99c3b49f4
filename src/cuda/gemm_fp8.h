/* gemm_fp8.h - the W4A8 grouped GEMM on mma.sync E4M3 (issue 34, docs/formats.md "The GPU
 * path"): Y_e = X_e . W_e^T with X in E4M3 codes and FP32 scales (act_fp8.cu's output: per 128
 * columns or per row) and W MXFP4 (UE8M0 block scales per 32) or NVFP4 (E4M3 block scales per
 * 16, the global scale through oscale), rows of expert e = [offsets[e], offsets[e+1]).
 * The pipelined kernels (the default) decode the E2M1 codes to the E4M3 codes of their exact
 * values (one constant table), run one MMA per 32 of K (MXFP4) or one per 16 (NVFP4: the other
 * half's A operand zero, half the FP8 rate) from zero, and add its FP32 result times the block
 * scale to the 128-K group's sum (NVFP4 on sm_90 .. sm_11x, which have no FP8 mma.sync: the
 * block scale folded into F16 weights, exact, and one F16 m16n8k16 MMA per 16-block into the
 * group's FP32 sum; gemm_fp8.cu kNvF16), which the activation's scale then promotes (per 128) or the
 * epilogue scales (per row): exact in the weights for every scale of both formats (the FP32
 * products aside). The first kernel (MXFP4 only, kept for the A/B) folds the block exponents
 * into the codes: exact where a row's block exponents within one 128-K group lie within 14
 * binades of its largest. Runs on sm_89+ (FP8 mma); on an older device the launcher returns
 * cudaErrorNotSupported. Tested against an FP64 oracle (tests/gpu/test_cuda_fp8mma.c).
 * The staged kernels (FM_FP8MMA_STAGED*, opt-in: compiled for every target, run on the H100
 * 2026-12-07) decode each weight tile once for 16 / 32 / 64 rows: weights, their packed scales
 * (fm_fp8mma_pack_scales) and the rows' E4M3 tile go global -> shared by cp.async, several
 * stages deep, as the W4A16 mma kernels; see gemm_fp8.cu. The wgmma kernels (FM_FP8MMA_WG*,
 * opt-in, MXFP4 only, sm_90a only: cudaErrorNotSupported elsewhere, and where the build has no
 * sm_90a code; run on the H100 2026-12-07) take the staged kernels' stages to wgmma E4M3 with the
 * A operand (the decoded weights) in registers, up to 128 tokens a pass. The warp-specialized
 * wgmma kernels (FM_FP8MMA_WS*, opt-in only, MXFP4, sm_90a, refused as the wg kernels are; not
 * yet run on a GPU) decode in a producer warpgroup into shared memory for consumer warpgroups on
 * SS wgmma (src/cuda/wgmma_ws_fp8.cuh). */
#ifndef FM_CUDA_GEMM_FP8_H
#define FM_CUDA_GEMM_FP8_H

#include <stddef.h>
#include <stdint.h>

#include "fp4moe/format.h"
#include "fp4moe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of one expert's packed data: [N / 16 bands][K / 64 chunks][32 lanes][16 B]. */
size_t fm_fp8mma_pack_bytes(int64_t N, int64_t K);

/* Host: MXFP4 or NVFP4 expert w's codes (N % 16 == 0, K % 64 == 0) into dst (fm_fp8mma_pack_bytes). Lane
 * l = 4g + t's 16 bytes of a chunk are the A fragments of the chunk's two m16n8k32 MMAs
 * (bytes 8s..8s+7: K32 block 2 x chunk + s): four 16-bit words, rows g / g + 8 at K 4t..4t+3,
 * then rows g / g + 8 at K 16+4t..16+4t+3 of the block, nibble i = the code at K + i.
 * Returns FM_OK, FM_ERR_INVALID_ARG (NULL), FM_ERR_FORMAT (neither), FM_ERR_BAD_SHAPE. */
fm_status fm_fp8mma_pack(const fm_qtensor *w, uint8_t *dst);

/* The pipelined kernels' decode, shared with the host test (test_cuda_fp8pack):
 * FM_FP8MMA_TLO / TLO_HI: the E4M3 codes of the E2M1 magnitudes 0, 0.5, 1, 1.5 | 2, 3, 4, 6 (byte
 * i of {hi:lo} = magnitude code i, a prmt table); fm_fp8mma_ue8m0 / fm_fp8mma_e4m3: a block
 * scale code as FP32 (UE8M0 0 = 2^-127, 0xFF = NaN; E4M3 0x7F / 0xFF = NaN, subnormals exact). */
#define FM_FP8MMA_TLO 0x3C383000u
#define FM_FP8MMA_THI 0x4C484440u
#ifdef __CUDACC__
#define FM_FP8MMA_HD __host__ __device__
#else
#define FM_FP8MMA_HD
#endif
static inline FM_FP8MMA_HD float fm_fp8mma_bits(uint32_t u)
{
    union {
        uint32_t u;
        float    f;
    } v;
    v.u = u;
    return v.f;
}
static inline FM_FP8MMA_HD float fm_fp8mma_ue8m0(uint32_t c)
{
    return c == 0 ? fm_fp8mma_bits(0x00400000u) : c == 255 ? fm_fp8mma_bits(0x7fc00000u) : fm_fp8mma_bits(c << 23);
}
static inline FM_FP8MMA_HD float fm_fp8mma_e4m3(uint32_t c)
{
    const uint32_t m = c & 0x7fu;
    if (m == 0x7fu) return fm_fp8mma_bits(0x7fc00000u);
    const float v = m >= 8 ? fm_fp8mma_bits(((m >> 3) + 120u) << 23 | (m & 7u) << 20) : (float)m * 0.001953125f;
    return c & 0x80u ? -v : v;
}

/* The staged kernels' MXFP4 fold: the E4M3 codes of the E2M1 magnitudes times 2^j, j in
 * [FM_FP8MMA_FOLD_MIN, 6] (6 x 2^6 = 384 <= 448; 0.5 x 2^-5 = 2^-6, E4M3's smallest normal):
 * the j = 0 table with j added to the exponent field of bytes 1..7 (byte 0, the zero, stays
 * 0). Exact for every code (test_cuda_fp8pack checks each j and magnitude). A 128-K group
 * folds when each of its rows' block codes lies within 11 binades of the row's largest
 * (j = code - max + 6 >= -5) and no code is 255 (NaN): one MMA chain over the group's four
 * blocks, times 2^(max - 133) once. Else its blocks go one MMA each from zero, times their
 * scale (exact for every code, as the pipelined kernels). */
#define FM_FP8MMA_FOLD_MIN (-5)
static inline FM_FP8MMA_HD void fm_fp8mma_fold_table(int j, uint32_t *lo, uint32_t *hi)
{
    const uint32_t d = (uint32_t)(j * 8); /* two's complement: the bytes never borrow (each >= 0x30 - 0x28) */
    *lo = FM_FP8MMA_TLO + d * 0x01010100u;
    *hi = FM_FP8MMA_THI + d * 0x01010101u;
}
/* The smallest and largest byte of a word (the staged kernels' fold test on 4 UE8M0 codes) */
static inline FM_FP8MMA_HD uint32_t fm_fp8mma_maxb(uint32_t w)
{
    uint32_t a = w & 0xffu, b = w >> 8 & 0xffu, c = w >> 16 & 0xffu, d = w >> 24;
    a = a > b ? a : b, c = c > d ? c : d;
    return a > c ? a : c;
}
static inline FM_FP8MMA_HD uint32_t fm_fp8mma_minb(uint32_t w)
{
    uint32_t a = w & 0xffu, b = w >> 8 & 0xffu, c = w >> 16 & 0xffu, d = w >> 24;
    a = a < b ? a : b, c = c < d ? c : d;
    return a < c ? a : c;
}
/* Does a row's 128-K group of 4 UE8M0 codes fold (see FM_FP8MMA_FOLD_MIN)? */
static inline FM_FP8MMA_HD int fm_fp8mma_folds(uint32_t codes)
{
    const uint32_t mx = fm_fp8mma_maxb(codes);
    return mx < 255u && (int)fm_fp8mma_minb(codes) - (int)mx + 6 >= FM_FP8MMA_FOLD_MIN;
}

/* The staged kernels' scale layout (fm_fp8mma_pack_scales): per expert, per band of 16
 * rows, per 128-K group, the 16 rows' codes of the group: MXFP4 4 UE8M0 codes a row (64 B),
 * NVFP4 8 E4M3 codes a row (128 B); row r at r x 4 (8). A last group of 64 K (K % 128 == 64)
 * pads MXFP4 with the row's first code of the group (the fold test sees the same largest and
 * smallest code) and NVFP4 with 0 (its weights are zero there). */
size_t fm_fp8mma_scales_bytes(fm_format fmt, int64_t N, int64_t K);
/* Host: w's block scales into dst (fm_fp8mma_scales_bytes). FM_OK, FM_ERR_INVALID_ARG (NULL),
 * FM_ERR_FORMAT (neither MXFP4 nor NVFP4), FM_ERR_BAD_SHAPE (N % 16, K % 64). */
fm_status fm_fp8mma_pack_scales(const fm_qtensor *w, uint8_t *dst);

/* fm_fp8mma_args.kernel: which kernel runs (an A/B knob of the benchmark and the test) */
enum {
    FM_FP8MMA_AUTO = 0,      /* MXFP4 on sm_90 (sm_90a code, wsp, 16-byte rows): ws128 where max_rows >= 96 x E,
                                wg64 where >= 48 x E, else wg32; otherwise the pipelined kernel: NVFP4 32 tokens a pass where
                                max_rows >= 24 x E, else 16 */
    FM_FP8MMA_FIRST = 1,     /* the first kernel: block exponents folded into the codes, no pipeline */
    FM_FP8MMA_PIPE16 = 2,    /* pipelined, 16 tokens a pass */
    FM_FP8MMA_PIPE32 = 3,    /* pipelined, 32 tokens a pass */
    FM_FP8MMA_STAGED16 = 4,  /* staged through shared memory (needs wsp), 16 tokens a pass, 4 stages */
    FM_FP8MMA_STAGED32 = 5,  /* 32 tokens a pass, 3 stages */
    FM_FP8MMA_STAGED64 = 6,  /* 64 tokens a pass, 3 stages (> 48 KB: the launcher opts in) */
    FM_FP8MMA_WG32 = 7,      /* wgmma (sm_90a, MXFP4; needs wsp), 2 m64 tiles x 32 tokens a pass, 4 stages */
    FM_FP8MMA_WG64 = 8,      /* 2 m64 tiles x 64 tokens a pass, 4 stages */
    FM_FP8MMA_WG128 = 9,     /* 1 m64 tile x 128 tokens a pass, 4 stages */
    FM_FP8MMA_WS64 = 10,     /* warp-specialized wgmma (sm_90a, MXFP4; needs wsp; opt-in): a producer
                                warpgroup decodes to E4M3 in shared memory, 2 consumer warpgroups (SS wgmma) of an
                                m64 tile each, 64 tokens a pass, 6 stages */
    FM_FP8MMA_WS128 = 11,    /* the same, 128 tokens a pass, 5 stages */
    FM_FP8MMA_KERNELS = 12   /* the count */
};

/* A kernel's name ("auto" "first" "pipe16" "pipe32" "staged16" "staged32" "staged64" "wg32" "wg64"
 * "wg128" "ws64" "ws128"; NULL
 * outside [0, FM_FP8MMA_KERNELS)), and the kernel a name names (-1: none) */
const char *fm_fp8mma_kernel_name(int kernel);
int         fm_fp8mma_kernel_of(const char *name);

/* Whether `kernel` can run on the current device with this build's code: 0 if so;
 * cudaErrorNotSupported before sm_89 (no FP8 mma), and for a wgmma kernel off sm_90 or without
 * sm_90a code (a build with only another target's PTX); cudaErrorInvalidValue for no kernel;
 * else the CUDA error of the query. fm_fp8mma_launch refuses the same cases. */
int fm_fp8mma_kernel_here(int kernel);

/* Dynamic shared memory of a staged or wgmma kernel for fmt (0 for the others; a wgmma
 * kernel's MXFP4 size whatever fmt): 3-4 stages of the row tile [tokens][128 + 16 B] (wgmma:
 * [tokens][128 B] swizzled, stages rounded to 1 KB), 4 warps x 2 bands x 2 chunks x 512 B of
 * weights and 8 bands' group scales. The launcher refuses (cudaErrorInvalidConfiguration) a device whose opt-in
 * limit is smaller; every staged kernel fits SM120's 101,376 B (test_cuda_fp8pack). */
size_t fm_fp8mma_smem_bytes(int kernel, fm_format fmt);

typedef struct {
    const uint8_t *wq;      /* [E] experts of fm_fp8mma_pack's layout, back to back */
    const uint8_t *wexp;    /* [E][N][K / 32] UE8M0 codes (MXFP4) or [E][N][K / 16] E4M3 codes (NVFP4), the
                               checkpoint's layout (4-byte aligned) */
    const float   *oscale;  /* [E] output scale per expert (NVFP4: its global scale), or NULL (1) */
    const uint8_t *xq;      /* [rows][ldx] E4M3 codes (ldx % 4 == 0, ldx >= K) */
    const float   *xs;      /* [rows][ldxs] FP32 scales: per 128 columns (xs_per_128) or one per row */
    const int32_t *offsets; /* [E + 1] device */
    float         *y;       /* [rows][N] FP32 */
    int            E, N, K, ldx, ldxs, xs_per_128, max_rows;
    int            kernel;  /* FM_FP8MMA_*: 0 = automatic */
    fm_format      fmt;     /* FM_FORMAT_MXFP4 (or 0) or FM_FORMAT_NVFP4 (the pipelined kernels only) */
    const float   *bias;       /* [E][N] added after the output scale, or NULL (gpt-oss's FC2 bias) */
    const float   *row_weight; /* [rows] each row's result times it, after the bias, or NULL (the routing
                                  weight: y[r] = w[r] x (acc x oscale + bias), the layer's FC2) */
    const uint8_t *wsp;        /* [E] experts of fm_fp8mma_pack_scales' layout (16-byte aligned): the staged
                                  kernels need it (and xq 16-byte aligned, ldx % 16 == 0); the others ignore it */
} fm_fp8mma_args;

/* Launch on stream. Returns a cudaError_t value (0: launched; cudaErrorInvalidValue for bad
 * arguments, cudaErrorMisalignedAddress for wq not 16-byte or xq / xs / y not 4-byte aligned (a
 * staged kernel: wsp and xq 16-byte, ldx % 16), cudaErrorInvalidConfiguration where its shared
 * memory is past the device's limit,
 * cudaErrorNotSupported before sm_89). */
int fm_fp8mma_launch(const fm_fp8mma_args *a, void *stream);

#ifdef __cplusplus
}
#endif
#endif
