/* gemm_fp8.h - the W4A8 grouped GEMM on mma.sync E4M3 (issue 34, docs/formats.md "The GPU
 * path"): Y_e = X_e . W_e^T with X in E4M3 codes and FP32 scales (act_fp8.cu's output: per 128
 * columns or per row) and W MXFP4 (UE8M0 block scales per 32), rows of expert e =
 * [offsets[e], offsets[e+1]). Weights decoded to E4M3 in registers with the block's power of
 * two folded in (exact: e2m1 x 2^j is E4M3 for j in [-8, 6]), the rest of the scale and the
 * activation's scale applied to each 128-K group's FP32 partial sum (per-128 promotion).
 * Exact in the weights where a row's block exponents within one 128-K group lie within 14
 * binades of its largest (further below, E4M3 subnormals round them). Runs on sm_89+ (FP8
 * mma); on an older device the launcher returns cudaErrorNotSupported.
 * Not yet wired into the layer: tested against an FP64 oracle (tests/gpu/test_cuda_fp8mma.c). */
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

/* Host: MXFP4 expert w (N % 16 == 0, K % 64 == 0) into dst (fm_fp8mma_pack_bytes). Lane
 * l = 4g + t's 16 bytes of a chunk are the A fragments of the chunk's two m16n8k32 MMAs
 * (bytes 8s..8s+7: K32 block 2 x chunk + s): four 16-bit words, rows g / g + 8 at K 4t..4t+3,
 * then rows g / g + 8 at K 16+4t..16+4t+3 of the block, nibble i = the code at K + i.
 * Returns FM_OK, FM_ERR_INVALID_ARG (NULL), FM_ERR_FORMAT (not MXFP4), FM_ERR_BAD_SHAPE. */
fm_status fm_fp8mma_pack(const fm_qtensor *w, uint8_t *dst);

/* fm_fp8mma_args.kernel: which kernel runs (an A/B knob of the benchmark and the test) */
enum {
    FM_FP8MMA_AUTO = 0,   /* the pipelined kernel, 32 tokens a pass where max_rows >= 24 x E, else 16 */
    FM_FP8MMA_FIRST = 1,  /* the first kernel: block exponents folded into the codes, no pipeline */
    FM_FP8MMA_PIPE16 = 2, /* pipelined, 16 tokens a pass */
    FM_FP8MMA_PIPE32 = 3  /* pipelined, 32 tokens a pass */
};

typedef struct {
    const uint8_t *wq;      /* [E] experts of fm_fp8mma_pack's layout, back to back */
    const uint8_t *wexp;    /* [E][N][K / 32] UE8M0 codes, the checkpoint's layout */
    const float   *oscale;  /* [E] output scale per expert, or NULL (1) */
    const uint8_t *xq;      /* [rows][ldx] E4M3 codes (ldx % 4 == 0, ldx >= K) */
    const float   *xs;      /* [rows][ldxs] FP32 scales: per 128 columns (xs_per_128) or one per row */
    const int32_t *offsets; /* [E + 1] device */
    float         *y;       /* [rows][N] FP32 */
    int            E, N, K, ldx, ldxs, xs_per_128, max_rows;
    int            kernel;  /* FM_FP8MMA_*: 0 = automatic */
} fm_fp8mma_args;

/* Launch on stream. Returns a cudaError_t value (0: launched; cudaErrorInvalidValue for bad
 * arguments, cudaErrorMisalignedAddress for wq not 16-byte or xq / xs / y not 4-byte aligned,
 * cudaErrorNotSupported before sm_89). */
int fm_fp8mma_launch(const fm_fp8mma_args *a, void *stream);

#ifdef __cplusplus
}
#endif
#endif
