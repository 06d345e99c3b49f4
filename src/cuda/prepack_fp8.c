/* prepack_fp8.c - the weight layout of the W4A8 mma GEMM (gemm_fp8.h, gemm_fp8.cu), host
 * side: the FP4 codes rearranged so that one 16-byte copy per lane is the A operand of two
 * m16n8k32 E4M3 MMAs. Plain C (tested wherever the CUDA backend is built). */
#include <string.h>

#include "cuda/gemm_fp8.h"
#include "fm_internal.h"
#include "kernels/fm_tile_layout.h"

size_t fm_fp8mma_pack_bytes(int64_t N, int64_t K) { return (size_t)(N / 16) * (size_t)(K / 64) * 32 * 16; }

static unsigned code_at(const uint8_t *d, int64_t K, int64_t n, int64_t k)
{
    const uint8_t b = d[n * (K / 2) + k / 2];
    return k & 1 ? b >> 4 : b & 15u; /* low nibble: the even column */
}

/* what both packs take: MXFP4 or NVFP4, N % 16 == 0, K % 64 == 0 (`what`: the buffer that must be there) */
static fm_status packable(const fm_qtensor *w, const void *what, const uint8_t *dst, const char *who)
{
    if (!w || !dst || !what) return fm_fail(FM_ERR_INVALID_ARG, "%s: NULL weights or destination", who);
    if (w->fmt != FM_FORMAT_MXFP4 && w->fmt != FM_FORMAT_NVFP4)
        return fm_fail(FM_ERR_FORMAT, "%s: the W4A8 mma GEMM takes MXFP4 or NVFP4 weights (format %d)", who, (int)w->fmt);
    if (w->rows <= 0 || w->cols <= 0 || w->rows % 16 || w->cols % 64)
        return fm_fail(FM_ERR_BAD_SHAPE, "%s: %lld x %lld: N must be a multiple of 16 and K of 64", who,
                       (long long)w->rows, (long long)w->cols);
    return FM_OK;
}

fm_status fm_fp8mma_pack(const fm_qtensor *w, uint8_t *dst)
{
    FM_CHECK(packable(w, w ? w->data : NULL, dst, "fm_fp8mma_pack"));
    const int64_t N = w->rows, K = w->cols;
    const uint8_t *d = w->data;
    for (int64_t band = 0; band < N / 16; band++)
        for (int64_t c = 0; c < K / 64; c++)
            for (int lane = 0; lane < 32; lane++) {
                const int g = lane >> 2, t = lane & 3;
                uint8_t  *o = dst + ((band * (K / 64) + c) * 32 + lane) * 16;
                for (int s = 0; s < 2; s++)     /* the chunk's two K32 blocks */
                    for (int j = 0; j < 4; j++) { /* a0..a3: rows g, g+8 at 4t; rows g, g+8 at 16+4t */
                        const int64_t row = band * 16 + g + 8 * (j & 1);
                        const int64_t k0 = c * 64 + 32 * s + 4 * t + 16 * (j >> 1);
                        const unsigned v = code_at(d, K, row, k0) | code_at(d, K, row, k0 + 1) << 4 |
                                           code_at(d, K, row, k0 + 2) << 8 | code_at(d, K, row, k0 + 3) << 12;
                        o[8 * s + 2 * j] = (uint8_t)(v & 0xff);
                        o[8 * s + 2 * j + 1] = (uint8_t)(v >> 8);
                    }
            }
    return FM_OK;
}

size_t fm_fp8mma_scales_bytes(fm_format fmt, int64_t N, int64_t K)
{
    return (size_t)(N / 16) * (size_t)((K + 127) / 128) * 16 * (fmt == FM_FORMAT_NVFP4 ? 8 : 4);
}

fm_status fm_fp8mma_pack_scales(const fm_qtensor *w, uint8_t *dst)
{
    FM_CHECK(packable(w, w ? w->scales : NULL, dst, "fm_fp8mma_pack_scales"));
    const int64_t N = w->rows, K = w->cols;
    const int      nv = w->fmt == FM_FORMAT_NVFP4, per = nv ? 8 : 4; /* codes of a row in a 128-K group */
    const int64_t  nblk = K / (nv ? 16 : 32), ngrp = (K + 127) / 128;
    const uint8_t *sc = w->scales;
    for (int64_t band = 0; band < N / 16; band++)
        for (int64_t gi = 0; gi < ngrp; gi++)
            for (int r = 0; r < 16; r++) {
                const uint8_t *src = sc + (band * 16 + r) * nblk + gi * per;
                uint8_t       *o = dst + ((band * ngrp + gi) * 16 + r) * per;
                for (int b = 0; b < per; b++)
                    o[b] = gi * per + b < nblk ? src[b] : nv ? 0 : src[0]; /* a 64-K last group: see gemm_fp8.h */
            }
    return FM_OK;
}

/* each staged kernel fits SM120's 101,376 B (NVFP4, the larger), checked here */
#define FM_FP8S_FITS(tok, nt, st) _Static_assert(FM_FP8S_SMEM(FM_FP8S_WARPS, FM_FP8S_BANDS, nt, st, 1) <= 101376, \
                                                 "staged W4A8 kernel " #tok " past SM120's shared memory");
FM_FP8S_LIST(FM_FP8S_FITS)
#undef FM_FP8S_FITS

size_t fm_fp8mma_smem_bytes(int kernel, fm_format fmt)
{
    const int nv = fmt == FM_FORMAT_NVFP4;
    switch (kernel) {
#define FM_FP8S_CASE(tok, nt, st)                                                                                      \
    case FM_FP8MMA_STAGED##tok: return (size_t)FM_FP8S_SMEM(FM_FP8S_WARPS, FM_FP8S_BANDS, nt, st, nv);
        FM_FP8S_LIST(FM_FP8S_CASE)
#undef FM_FP8S_CASE
#define FM_FP8W_CASE(tok, mt, st) \
    case FM_FP8MMA_WG##tok: return (size_t)FM_FP8W_SMEM(mt, tok, st);
        FM_FP8W_LIST(FM_FP8W_CASE)
#undef FM_FP8W_CASE
#define FM_FP8WS_CASE(tok, cw, st) \
    case FM_FP8MMA_WS##tok: return (size_t)FM_FP8WS_SMEM(cw, tok, st);
        FM_FP8WS_LIST(FM_FP8WS_CASE)
#undef FM_FP8WS_CASE
    default: return 0;
    }
}

static const char *const k_kernel_names[FM_FP8MMA_KERNELS] = {"auto",     "first",    "pipe16", "pipe32",
                                                               "staged16", "staged32", "staged64", "wg32",
                                                               "wg64",     "wg128",    "ws64",     "ws128"};

const char *fm_fp8mma_kernel_name(int kernel)
{
    return kernel >= 0 && kernel < FM_FP8MMA_KERNELS ? k_kernel_names[kernel] : NULL;
}

int fm_fp8mma_kernel_of(const char *name)
{
    for (int k = 0; name && k < FM_FP8MMA_KERNELS; k++)
        if (!strcmp(name, k_kernel_names[k])) return k;
    return -1;
}
