/* cpu_internal.h - what the two CPU backends share (not installed): an owned
 * deep copy of the layer's weights, and the fast path's GEMM kernels. */
#ifndef FM_CPU_INTERNAL_H
#define FM_CPU_INTERNAL_H

#include "backend.h"

/* A deep copy of fm_moe_weights in one 64-byte-aligned allocation; `w` holds
 * views into it (same layouts as the caller's: row-major data and scales). */
typedef struct {
    fm_moe_weights w;
    fm_qtensor    *w13, *w2; /* [n_local] each, pointed to by w.w13 / w.w2 */
    void          *blob;
    size_t         bytes;    /* size of blob */
} fm_cpu_weights;

/* Copy validated weights (layer.c has checked shapes): the router over cfg->n_experts
 * global experts, the n_local experts of the shard (w->w13/w2/a1/a2, w13_up_global). FM_OK or FM_ERR_OOM. */
fm_status fm_cpu_weights_copy(const fm_moe_config *cfg, int n_local, const fm_moe_weights *w, fm_cpu_weights *out);
void      fm_cpu_weights_free(fm_cpu_weights *cw);

/* ---- fast-path kernels (kernels*.c) ---------------------------------------
 * kernels.c          lookup tables, the portable path, run-time ISA choice
 * kernels_avx2.c     AVX2+FMA: register path (M <= 4) and buffered path
 * kernels_avx512.c   AVX-512 decode regime (M <= 3 rows per expert): register path
 * kernels_prefill512.c  AVX-512 prefill regime (M > 3, and BF16): dequantized
 *                    panel in L2, K-blocked 4 x 6 register tiles out of L1
 * All of them sum every output in the same lane structure (16 interleaved
 * lanes over K, folded by a fixed tree), see kernels.c. */

/* Lookup tables built once per layer from the format codecs. */
typedef struct {
    int8_t e2m1_x2[16];  /* 2 * E2M1 value of each code: integers, one pshufb away */
    float  scale[256];   /* 0.5 * decoded block scale (the 0.5 undoes the x2 above) */
} fm_cpu_luts;

void fm_cpu_luts_init(fm_cpu_luts *L, fm_format f);
int  fm_cpu_fmt_block(fm_format f); /* elements per scale block; 1 for BF16 */

/* Y[m*ldy + n] = global * sum_k W[n][k] * A[m*lda + k] for n in [n0, n1),
 * m in [0, M). W is a weight matrix of w's format; work holds
 * fm_cpu_work_floats(w->cols) floats, 64-byte aligned (per thread). Every
 * output is summed by one call in a fixed order. */
typedef void (*fm_cpu_gemm_fn)(const fm_qtensor *w, const fm_cpu_luts *L, int64_t n0, int64_t n1, const float *A,
                               int64_t lda, int M, float *Y, int64_t ldy, float *work);

/* Prefill panel geometry (kernels_prefill512.c): weight rows decoded at once,
 * activation rows per pass over the panel (bounds the accumulator spill
 * area), and 16-lane accumulators per (row, weight row) pair spilled. */
#define FM_CPU_PANEL_ROWS 16
#define FM_CPU_PANEL_MC   48
#define FM_CPU_PANEL_KC   512 /* K block: panel slice 16 x 512 floats = 32 KB + a packed 6-row tile 12 KB: L1 (48 KB); measured 256..768, 512-768 best */
#define fm_cpu_work_floats(max_k)                                                                         \
    ((size_t)FM_CPU_PANEL_ROWS * (size_t)(max_k) + (size_t)FM_CPU_PANEL_MC * FM_CPU_PANEL_ROWS * 16 + \
     6 * (size_t)FM_CPU_PANEL_KC + 16)

void fm_cpu_gemm_scalar(const fm_qtensor *w, const fm_cpu_luts *L, int64_t n0, int64_t n1, const float *A,
                        int64_t lda, int M, float *Y, int64_t ldy, float *work);
#if defined(__x86_64__) && defined(__GNUC__)
void fm_cpu_gemm_avx2(const fm_qtensor *w, const fm_cpu_luts *L, int64_t n0, int64_t n1, const float *A,
                      int64_t lda, int M, float *Y, int64_t ldy, float *work);
void fm_cpu_gemm_avx512(const fm_qtensor *w, const fm_cpu_luts *L, int64_t n0, int64_t n1, const float *A,
                        int64_t lda, int M, float *Y, int64_t ldy, float *work);
/* The prefill kernel; needs w->cols % 16 == 0 (FP4 always, BF16 usually). */
void fm_cpu_prefill512(const fm_qtensor *w, const fm_cpu_luts *L, int64_t n0, int64_t n1, const float *A,
                       int64_t lda, int M, float *Y, int64_t ldy, float *work);
#endif

/* The best kernel this CPU runs ("avx512", "avx2" or "scalar"); $FM_CPU_ISA
 * = avx2 or scalar caps the choice (tests use it to cover every path). *name
 * may be NULL. */
fm_cpu_gemm_fn fm_cpu_gemm_select(const char **name);

#endif
