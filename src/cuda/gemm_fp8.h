/* gemm_fp8.h - the W4A8 grouped GEMM on mma.sync E4M3 (issue 34, docs/formats.md "The GPU
 * path"): Y_e = X_e . W_e^T with X in E4M3 codes and FP32 scales (act_fp8.cu's output: per 128
 * columns or per row) and W MXFP4 (UE8M0 block scales per 32) or NVFP4 (E4M3 block scales per
 * 16, the global scale through oscale), rows of expert e = [offsets[e], offsets[e+1]).
 * The pipelined kernels (the default) decode the E2M1 codes to the E4M3 codes of their exact
 * values (one constant table), run one MMA per 32 of K (MXFP4) or one per 16 (NVFP4: the other
 * half's A operand zero, half the FP8 rate) from zero, and add its FP32 result times the block
 * scale to the 128-K group's sum, which the activation's scale then promotes (per 128) or the
 * epilogue scales (per row): exact in the weights for every scale of both formats (the FP32
 * products aside). The first kernel (MXFP4 only, kept for the A/B) folds the block exponents
 * into the codes: exact where a row's block exponents within one 128-K group lie within 14
 * binades of its largest. Runs on sm_89+ (FP8 mma); on an older device the launcher returns
 * cudaErrorNotSupported. Not yet wired into the layer: tested against an FP64 oracle
 * (tests/gpu/test_cuda_fp8mma.c). */
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

/* fm_fp8mma_args.kernel: which kernel runs (an A/B knob of the benchmark and the test) */
enum {
    FM_FP8MMA_AUTO = 0,   /* the pipelined kernel: NVFP4 32 tokens a pass where max_rows >= 24 x E, else 16 */
    FM_FP8MMA_FIRST = 1,  /* the first kernel: block exponents folded into the codes, no pipeline */
    FM_FP8MMA_PIPE16 = 2, /* pipelined, 16 tokens a pass */
    FM_FP8MMA_PIPE32 = 3  /* pipelined, 32 tokens a pass */
};

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
} fm_fp8mma_args;

/* Launch on stream. Returns a cudaError_t value (0: launched; cudaErrorInvalidValue for bad
 * arguments, cudaErrorMisalignedAddress for wq not 16-byte or xq / xs / y not 4-byte aligned,
 * cudaErrorNotSupported before sm_89). */
int fm_fp8mma_launch(const fm_fp8mma_args *a, void *stream);

#ifdef __cplusplus
}
#endif
#endif
