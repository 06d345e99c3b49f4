/* test_cuda_fp8mma.c - the W4A8 mma GEMM (src/cuda/gemm_fp8.cu, MXFP4 and NVFP4 weights, E4M3
 * activations with FP32 scales), each kernel (the first, MXFP4 only; the pipelined ones, 16 and
 * 32 tokens a pass; the automatic pick; the staged ones, 16 / 32 / 64 tokens a pass, with the
 * packed scales of fm_fp8mma_pack_scales; the wgmma ones, 32 / 64 / 128 tokens a pass, and the
 * warp-specialized wgmma ones (ws64 / ws128: a producer warpgroup decodes into shared memory), MXFP4
 * on sm_90 only: elsewhere their refusal, cudaErrorNotSupported) against an FP64 oracle of the
 * same operands:
 *   y[r][n] = sum_k deq(W_e)[n][k] x dec(q[r][k]) x s[r][k / 128 or 0]
 * (the W4A8 numerics of docs/formats.md with exact weights: the oracle multiplies the MXFP4
 * values, the GPU their E4M3 re-encoding, which is exact for these weights: a row's block
 * exponents span a few binades). Bounds: NMSE <= 1e-6 over all outputs and, per element,
 * |y - ref| <= 2^-10 x sum_k |w x| + 1e-30: FP32 accumulation of the FP8 MMA inside a 128-K
 * group and of the promoted sums; a wrong fragment, table or scale is off by O(1).
 * Shapes: N 64 / 96 / 48 (a CTA with an idle warp) x K 2880 (gpt-oss) / 256 / 192 (a last
 * group of 64); 4 experts with 0, 5, 37 and 130 rows (passes of 16 / 32 / 64 / 128 cut short:
 * every kernel runs more than one pass, so a row index taken from the wrong pass shows), both scale
 * modes (per 128, per row; the per-row runs with the FC2 epilogue's bias and row weight),
 * rows N(0,1) x 2^[-8, 8] per 128-block. MXFP4: every fifth weight
 * row has its second block 14 binades down (code - 14, its values x 2^-14 in the oracle), so
 * that the staged and wgmma kernels' groups that hold it do not fold (gemm_fp8.h) and take the
 * per-block path while the others fold: both paths in every run. Output poisoned (NaN)
 * before each run; the rows of no expert must keep it; NaN/Inf checked first. Then the
 * launcher's refusals (bad shapes); the pack's are test_cuda_fp8pack's (host only). Compiled without a GPU;
 * skips (exit 77) where there is none, and where the GPU has no FP8 mma (before sm_89). */
#include <float.h>
#include <math.h>

#include "gpu_common.h"

#include "cuda/gemm_fp8.h"
#include "fp4moe/format.h"

enum { E = 4 };

static void check_shape(fm_rng *r, fm_format fmt, int N, int K, int per128, int kernel, cudaStream_t st)
{
    gpu_experts w;
    gpu_experts_make(&w, r, fmt, E, N, K);
    const int nv = fmt == FM_FORMAT_NVFP4, nsb = nv ? K / 16 : K / 32; /* block scales per row */
    if (!nv) /* groups that do not fold: see the header */
        for (int e = 0; e < E; e++)
            for (int n = 0; n < N; n += 5) {
                uint8_t *c = (uint8_t *)w.w[e].scales + (size_t)n * nsb + 1;
                if (*c < 20 || *c == 255) continue;
                *c -= 14;
                for (int k = 32; k < 64; k++) w.deq[((size_t)e * N + n) * K + k] *= 0x1p-14f;
            }
    const int32_t off[E + 1] = {0, 0, 5, 42, 172};
    const int     rows = off[E], extra = 3; /* 3 rows past the experts' rows: never written */
    const int     ngrp = (K + 127) / 128, ldxs = per128 ? ngrp : 1;
    /* activations: quantized on the host the oracle's way (amax / 448, E4M3 nearest even) */
    float   *xf = malloc(sizeof(float) * (size_t)rows * K), *xs = malloc(sizeof(float) * (size_t)(rows + extra) * ldxs);
    uint8_t *xq = malloc((size_t)(rows + extra) * K);
    for (int i = 0; i < rows; i++) {
        for (int b0 = 0; b0 < K; b0 += 128) {
            const float mag = ldexpf(1.0f, (int)(fm_rng_uniform(r) * 17.0) - 8);
            for (int k = b0; k < K && k < b0 + 128; k++) xf[(size_t)i * K + k] = fm_rng_normal(r) * mag;
        }
        const int blk = per128 ? 128 : K;
        for (int b0 = 0, b = 0; b0 < K; b0 += blk, b++) {
            float amax = 0;
            for (int k = b0; k < K && k < b0 + blk; k++) amax = fmaxf(amax, fabsf(xf[(size_t)i * K + k]));
            float s = amax / 448.0f;
            if (!(s >= FLT_MIN)) s = 1.0f;
            xs[(size_t)i * ldxs + b] = s;
            for (int k = b0; k < K && k < b0 + blk; k++) xq[(size_t)i * K + k] = fm_e4m3_encode(xf[(size_t)i * K + k] / s);
        }
    }
    memset(xq + (size_t)rows * K, 0x38, (size_t)extra * K); /* 1.0: a read of these rows would show */
    for (int i = rows * ldxs; i < (rows + extra) * ldxs; i++) xs[i] = 1.0f;
    /* the oracle */
    double *ref = malloc(sizeof(double) * (size_t)rows * N), *mag = malloc(sizeof(double) * (size_t)rows * N);
    for (int e = 0; e < E; e++)
        for (int i = off[e]; i < off[e + 1]; i++)
            for (int n = 0; n < N; n++) {
                const float *wr = w.deq + ((size_t)e * N + n) * K;
                double       s = 0, m = 0;
                for (int k = 0; k < K; k++) {
                    const double x = (double)fm_e4m3_decode(xq[(size_t)i * K + k]) * xs[(size_t)i * ldxs + (per128 ? k / 128 : 0)];
                    s += (double)wr[k] * x, m += fabs((double)wr[k] * x);
                }
                ref[(size_t)i * N + n] = s, mag[(size_t)i * N + n] = m;
            }
    /* device operands */
    const size_t pb = fm_fp8mma_pack_bytes(N, K), psb = fm_fp8mma_scales_bytes(fmt, N, K);
    uint8_t     *wq = malloc(pb * E), *wexp = malloc((size_t)E * N * nsb), *wsp = malloc(psb * E);
    for (int e = 0; e < E; e++) {
        assert_int_equal(fm_fp8mma_pack(&w.w[e], wq + pb * e), FM_OK);
        assert_int_equal(fm_fp8mma_pack_scales(&w.w[e], wsp + psb * e), FM_OK);
        memcpy(wexp + (size_t)e * N * nsb, w.w[e].scales, (size_t)N * nsb);
    }
    /* the expert's output scale: a factor of the test's times NVFP4's global scale (the
     * oracle's deq holds the global scale; the kernel gets it through oscale) */
    float osc[E] = {1.0f, 0.5f, 2.0f, 0.25f}, dosc[E];
    for (int e = 0; e < E; e++) dosc[e] = osc[e] * w.w[e].global_scale;
    /* the per-row runs add a bias per expert and feature, then weigh each row (the layer's FC2
     * epilogue for gpt-oss: y = w[r] x (acc x oscale + bias)) */
    const int epi = !per128;
    float    *bias = malloc(sizeof(float) * (size_t)E * N), *rw = malloc(sizeof(float) * (size_t)(rows + extra));
    for (int i = 0; i < E * N; i++) bias[i] = fm_rng_normal(r);
    for (int i = 0; i < rows + extra; i++) rw[i] = 0.25f + 0.75f * (float)fm_rng_uniform(r);
    fm_fp8mma_args a = {.wq = dev_upload(wq, pb * E), .wexp = dev_upload(wexp, (size_t)E * N * nsb),
                        .bias = epi ? dev_upload(bias, sizeof(float) * (size_t)E * N) : NULL,
                        .row_weight = epi ? dev_upload(rw, sizeof(float) * (size_t)(rows + extra)) : NULL,
                        .oscale = dev_upload(dosc, sizeof dosc), .fmt = fmt, .xq = dev_upload(xq, (size_t)(rows + extra) * K),
                        .xs = dev_upload(xs, sizeof(float) * (size_t)(rows + extra) * ldxs),
                        .offsets = dev_upload(off, sizeof off), .E = E, .N = N, .K = K, .ldx = K, .ldxs = ldxs,
                        .xs_per_128 = per128, .max_rows = rows + extra, .kernel = kernel,
                        .wsp = dev_upload(wsp, psb * E)};
    float *dy = NULL, *y = malloc(sizeof(float) * (size_t)(rows + extra) * N);
    CK(cudaMalloc((void **)&dy, sizeof(float) * (size_t)(rows + extra) * N));
    a.y = dy;
    CK(cudaMemsetAsync(dy, 0xFF, sizeof(float) * (size_t)(rows + extra) * N, st));
    assert_int_equal(fm_fp8mma_launch(&a, st), 0);
    CK(cudaMemcpyAsync(y, dy, sizeof(float) * (size_t)(rows + extra) * N, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    for (int i = 0; i < rows * N; i++)
        if (!isfinite(y[i])) fail_msg("N=%d K=%d: y[%d][%d] is not finite (%g): unwritten or overflowed", N, K, i / N,
                                      i % N, (double)y[i]);
    for (int i = rows * N; i < (rows + extra) * N; i++)
        if (!isnan(y[i])) fail_msg("N=%d K=%d: row %d of no expert written", N, K, i / N);
    double num = 0, den = 0, worst = 0;
    for (int e = 0; e < E; e++)
        for (int i = off[e]; i < off[e + 1]; i++)
            for (int n = 0; n < N; n++) {
                const size_t j = (size_t)i * N + n;
                const double rwi = epi ? rw[i] : 1.0, want = (ref[j] * osc[e] + (epi ? bias[(size_t)e * N + n] : 0)) * rwi;
                const double d = (double)y[j] - want, m = mag[j] * osc[e] * rwi;
                num += d * d, den += want * want;
                const double rel = fabs(d) / (m + 1e-30);
                if (rel > worst) worst = rel;
                /* + the bias add's and the weight's FP32 roundings */
                if (fabs(d) > ldexp(m, -10) + ldexp(fabs(want), -21) + 1e-30)
                    fail_msg("%s kernel %d N=%d K=%d %s: y[%d][%d] = %.9g, the oracle %.9g (|diff| / sum|w x| = %.3g)",
                             nv ? "nvfp4" : "mxfp4", kernel, N, K, per128 ? "per 128" : "per row", i, n, (double)y[j],
                             want, rel);
            }
    const double nmse = num / den;
    printf("  %s kernel %d N=%-3d K=%-4d x scales %-7s: NMSE %.3g, worst |diff| / sum|w x| %.3g\n", nv ? "nvfp4" : "mxfp4",
           kernel, N, K, per128 ? "per 128" : "per row", nmse, worst);
    assert_true(nmse <= 1e-6);
    /* launcher refusals */
    fm_fp8mma_args b = a;
    b.N = N + 8, assert_int_not_equal(fm_fp8mma_launch(&b, st), 0);
    b = a, b.K = K + 32, assert_int_not_equal(fm_fp8mma_launch(&b, st), 0);
    b = a, b.ldx = K - 4, assert_int_not_equal(fm_fp8mma_launch(&b, st), 0);
    b = a, b.xs = NULL, assert_int_not_equal(fm_fp8mma_launch(&b, st), 0);
    b = a, b.kernel = FM_FP8MMA_KERNELS, assert_int_equal(fm_fp8mma_launch(&b, st), (int)cudaErrorInvalidValue);
    b = a, b.kernel = FM_FP8MMA_STAGED16, b.wsp = NULL;
    assert_int_equal(fm_fp8mma_launch(&b, st), (int)cudaErrorInvalidValue);
    b = a, b.fmt = FM_FORMAT_BF16 + 7, assert_int_equal(fm_fp8mma_launch(&b, st), (int)cudaErrorInvalidValue);
    b = a, b.fmt = FM_FORMAT_NVFP4, b.kernel = FM_FP8MMA_FIRST; /* the first kernel takes MXFP4 only */
    assert_int_equal(fm_fp8mma_launch(&b, st), (int)cudaErrorInvalidValue);
    b = a, b.fmt = FM_FORMAT_NVFP4, b.kernel = FM_FP8MMA_WG64; /* so do the wgmma kernels */
    assert_int_equal(fm_fp8mma_launch(&b, st), (int)cudaErrorInvalidValue);
    b = a, b.kernel = FM_FP8MMA_WG64, b.wsp = NULL; /* and they need the packed scales */
    assert_int_equal(fm_fp8mma_launch(&b, st), (int)cudaErrorInvalidValue);
    b = a, b.fmt = FM_FORMAT_NVFP4, b.kernel = FM_FP8MMA_WS64; /* the warp-specialized ones too */
    assert_int_equal(fm_fp8mma_launch(&b, st), (int)cudaErrorInvalidValue);
    b = a, b.kernel = FM_FP8MMA_WS128, b.wsp = NULL;
    assert_int_equal(fm_fp8mma_launch(&b, st), (int)cudaErrorInvalidValue);
    CK(cudaFree((void *)a.wq));
    CK(cudaFree((void *)a.wexp));
    CK(cudaFree((void *)a.wsp));
    CK(cudaFree((void *)a.oscale));
    CK(cudaFree((void *)a.bias));
    CK(cudaFree((void *)a.row_weight));
    free(bias), free(rw);
    CK(cudaFree((void *)a.xq));
    CK(cudaFree((void *)a.xs));
    CK(cudaFree((void *)a.offsets));
    CK(cudaFree(dy));
    free(xf), free(xs), free(xq), free(ref), free(mag), free(wq), free(wexp), free(wsp), free(y);
    gpu_experts_free(&w);
}

static void test_fp8mma_vs_oracle(void **state)
{
    (void)state;
    fm_test_require_gpu();
    CK(cudaSetDevice(0));
    int major = 0, minor = 0;
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    CK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
    if (major * 10 + minor < 89) {
        printf("SKIP: sm_%d%d has no FP8 mma (sm_89+)\n", major, minor);
        exit(77);
    }
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0x4a8);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const int shapes[3][2] = {{64, 2880}, {96, 256}, {48, 192}};
    const int wg = major * 10 + minor == 90; /* the wgmma kernels run on sm_90 (sm_90a code) only */
    if (!wg) {
        int32_t *doff = NULL; /* one buffer for every pointer: the launcher refuses before any read */
        CK(cudaMalloc((void **)&doff, 64));
        const uint8_t *p8 = (const uint8_t *)doff;
        fm_fp8mma_args b = {.wq = p8, .wexp = p8, .xq = p8, .wsp = p8, .xs = (const float *)doff, .offsets = doff,
                            .y = (float *)doff, .E = 1, .N = 16, .K = 64, .ldx = 64, .ldxs = 1, .xs_per_128 = 1,
                            .max_rows = 1, .kernel = FM_FP8MMA_WG64, .fmt = FM_FORMAT_MXFP4};
        assert_int_equal(fm_fp8mma_launch(&b, st), (int)cudaErrorNotSupported);
        assert_int_equal(fm_fp8mma_kernel_here(FM_FP8MMA_WG64), (int)cudaErrorNotSupported);
        b.kernel = FM_FP8MMA_WS64, assert_int_equal(fm_fp8mma_launch(&b, st), (int)cudaErrorNotSupported);
        assert_int_equal(fm_fp8mma_kernel_here(FM_FP8MMA_WS128), (int)cudaErrorNotSupported);
        printf("  sm_%d%d: the wgmma kernels refused (cudaErrorNotSupported), as they should be; not run\n", major, minor);
        CK(cudaFree(doff));
    }
    /* what the layer asks at create: every mma.sync kernel runs here, the wgmma ones on sm_90
     * (this test's build carries sm_90a code there: FM_CUDA_ARCHS native or all) */
    assert_int_equal(fm_fp8mma_kernel_here(FM_FP8MMA_KERNELS), (int)cudaErrorInvalidValue);
    for (int k = FM_FP8MMA_AUTO; k < FM_FP8MMA_KERNELS; k++)
        assert_int_equal(fm_fp8mma_kernel_here(k), k < FM_FP8MMA_WG32 || wg ? 0 : (int)cudaErrorNotSupported);
    for (int i = 0; i < 3; i++)
        for (int per128 = 1; per128 >= 0; per128--)
            for (int f = FM_FORMAT_NVFP4; f <= FM_FORMAT_MXFP4; f++)
                for (int k = FM_FP8MMA_AUTO; k < FM_FP8MMA_KERNELS; k++) {
                    const int mx_only = k == FM_FP8MMA_FIRST || k >= FM_FP8MMA_WG32;
                    if ((f == FM_FORMAT_MXFP4 || !mx_only) && (k < FM_FP8MMA_WG32 || wg))
                        check_shape(&r, (fm_format)f, shapes[i][0], shapes[i][1], per128, k, st);
                }
    CK(cudaStreamDestroy(st));
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fp8mma_vs_oracle)};
    fm_test_require_gpu(); /* exit 77 (skipped) with a message where there is no GPU */
    return cmocka_run_group_tests(tests, NULL, NULL);
}
