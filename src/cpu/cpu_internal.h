/* cpu_internal.h - what the two CPU backends share (not installed): an owned
 * deep copy of the layer's weights, and the fast path's GEMM kernels. */
#ifndef FM_CPU_INTERNAL_H
#define FM_CPU_INTERNAL_H

#include "backend.h"

/* A deep copy of fm_moe_weights in one 64-byte-aligned allocation; `w` holds
 * views into it (same layouts as the caller's: row-major data and scales). */
typedef struct {
    fm_moe_weights w;
    fm_qtensor    *w13, *w2; /* [n_experts] each, pointed to by w.w13 / w.w2 */
    void          *blob;
    size_t         bytes;    /* size of blob */
} fm_cpu_weights;

/* Copy validated weights (layer.c has checked shapes). FM_OK or FM_ERR_OOM. */
fm_status fm_cpu_weights_copy(const fm_moe_config *cfg, const fm_moe_weights *w, fm_cpu_weights *out);
void      fm_cpu_weights_free(fm_cpu_weights *cw);

/* ---- fast-path kernels (kernels.c) ---------------------------------------- */

/* Lookup tables built once per layer from the format codecs. */
typedef struct {
    int8_t e2m1_x2[16];  /* 2 * E2M1 value of each code: integers, one pshufb away */
    float  scale[256];   /* 0.5 * decoded block scale (the 0.5 undoes the x2 above) */
} fm_cpu_luts;

void fm_cpu_luts_init(fm_cpu_luts *L, fm_format f);

/* Y[m*ldy + n] = global * sum_k W[n][k] * A[m*lda + k] for n in [n0, n1),
 * m in [0, M). W is a weight matrix of w's format; rowbuf holds
 * FM_CPU_ROWBUF_ROWS * w->cols floats (per thread). Every output is summed by
 * one call in a fixed order. */
#define FM_CPU_ROWBUF_ROWS 4
typedef void (*fm_cpu_gemm_fn)(const fm_qtensor *w, const fm_cpu_luts *L, int64_t n0, int64_t n1, const float *A,
                               int64_t lda, int M, float *Y, int64_t ldy, float *rowbuf);

/* The best kernel this CPU runs ("avx512", "avx2" or "scalar"); $FM_CPU_ISA
 * = avx2 or scalar caps the choice (tests use it to cover every path). *name
 * may be NULL. */
fm_cpu_gemm_fn fm_cpu_gemm_select(const char **name);

#endif
