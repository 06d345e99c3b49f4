/* gpu_common.h - helpers the GPU tests share: random FP4 experts, BF16 token
 * rows, device buffers with checked CUDA calls, and an FP64 reference GEMM. */
#ifndef FM_GPU_COMMON_H
#define FM_GPU_COMMON_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp4moe/cuda.h"
#include "testutil.h"

#define CK(call)                                                                              \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) fail_msg("%s: %s", #call, cudaGetErrorString(e_));             \
    } while (0)

typedef struct {
    fm_qtensor *w;    /* [E] */
    float      *deq;  /* [E][N][K] dequantized (the reference weights) */
    int         E, N, K;
} gpu_experts;

static inline void gpu_experts_make(gpu_experts *x, fm_rng *r, fm_format f, int E, int N, int K)
{
    x->E = E;
    x->N = N;
    x->K = K;
    x->w = calloc((size_t)E, sizeof *x->w);
    x->deq = malloc(sizeof(float) * (size_t)E * N * K);
    float *src = malloc(sizeof(float) * (size_t)N * K);
    assert_non_null(x->w);
    assert_non_null(x->deq);
    assert_non_null(src);
    for (int e = 0; e < E; e++) {
        size_t db, sb;
        assert_int_equal(fm_qtensor_bytes(f, N, K, &db, &sb), FM_OK);
        fm_qtensor *q = &x->w[e];
        *q = (fm_qtensor){.fmt = f, .rows = N, .cols = K, .data = malloc(db), .scales = malloc(sb)};
        /* rows of different magnitude so block scales spread over many binades */
        for (int n = 0; n < N; n++) fm_rng_fill_normal(r, src + (size_t)n * K, (size_t)K, 0.02f * (float)(1 + n % 7));
        assert_int_equal(fm_quantize(src, NULL, q), FM_OK);
        assert_int_equal(fm_dequantize(q, x->deq + (size_t)e * N * K), FM_OK);
    }
    free(src);
}

static inline void gpu_experts_free(gpu_experts *x)
{
    for (int e = 0; e < x->E; e++) {
        free(x->w[e].data);
        free(x->w[e].scales);
    }
    free(x->w);
    free(x->deq);
}

/* y[r][n] = sum_k deq_e[n][k] * x[r][k] in FP64, e the expert owning row r. */
static inline void gpu_ref_gemm(const gpu_experts *w, const int32_t *offsets, const float *xf, double *y)
{
    for (int e = 0; e < w->E; e++)
        for (int r = offsets[e]; r < offsets[e + 1]; r++)
            for (int n = 0; n < w->N; n++) {
                const float *wr = w->deq + ((size_t)e * w->N + n) * w->K;
                const float *xr = xf + (size_t)r * w->K;
                double       s = 0;
                for (int k = 0; k < w->K; k++) s += (double)wr[k] * xr[k];
                y[(size_t)r * w->N + n] = s;
            }
}

static inline void *dev_upload(const void *h, size_t bytes)
{
    void *d = NULL;
    CK(cudaMalloc(&d, bytes ? bytes : 16));
    if (bytes) CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

#endif
