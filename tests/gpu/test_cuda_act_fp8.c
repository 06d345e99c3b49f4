/* test_cuda_act_fp8.c - FP8 activations on the device (src/cuda/act_fp8.cu, W4A8's GEMM
 * inputs) against the CPU oracle's quantization (fm_moe_act_fp8_row, src/moe/shared.c):
 *   scales: amax / 448 of each 128-column block (or of the row), 1 for a zero or
 *           underflowing block: BIT-EXACT;
 *   codes:  E4M3(v / s), nearest even, saturating: BIT-EXACT against fm_e4m3_encode of the
 *           same FP32 quotient;
 *   values: dec(q) x s equal (==) to fm_moe_act_fp8_row's output, element by element.
 * Rows: N(0, 1) times a random power of two in [2^-40, 2^40] per 128-column block (so
 * blocks of very different magnitude share a token row: the per-token mode then underflows
 * the small ones to E4M3 subnormals and zeros, the case that separates the two modes), a
 * zero block, a block of values below 448 x 2^-126 (scale 1, all codes 0 or subnormal),
 * exact E4M3 ties (v / s on a midpoint), a single outlier, -448, and a block spanning 24
 * binades (E4M3 subnormal codes in every mode).
 * Both modes, BF16 token rows through a gather (perm, top_k 4; the device row count cuts
 * the rows) and FP32 rows in place; n = 6144 (GLM-5's hidden), 2880 (gpt-oss: a last block
 * of 64) and 132 (a last block of 4). Outputs are poisoned before each run (codes 0xFF,
 * scales NaN), rows past the device count must keep the poison. NaN/Inf: a NaN and an Inf
 * in the source are reported at their first index (t x n + c). Compiled without a GPU;
 * skips (exit 77) where there is none. */
#include <float.h>
#include <math.h>

#include "gpu_common.h"

#include "cuda/moe_kernels.h"
#include "fp4moe/format.h"
#include "moe/moe_internal.h"

enum { TOPK = 4 };

static void *dmalloc(size_t n)
{
    void *p = NULL;
    CK(cudaMalloc(&p, n ? n : 1));
    return p;
}

static float bf16_round(float v) { return fm_bf16_decode(fm_bf16_encode(v)); }

/* A token row of n columns (already BF16-exact when bf16), blocks of varied magnitude. */
static void make_row(fm_rng *r, float *v, int n, int kind, int bf16)
{
    for (int b0 = 0, b = 0; b0 < n; b0 += 128, b++) {
        const int   b1 = b0 + 128 < n ? b0 + 128 : n;
        const int   what = (kind + b) % 7;
        const float mag = ldexpf(1.0f, (int)(fm_rng_uniform(r) * 81.0f) - 40);
        for (int i = b0; i < b1; i++) {
            float x = fm_rng_normal(r) * mag;
            if (what == 1) x = 0.0f;                                         /* a zero block */
            if (what == 2) x = fm_rng_normal(r) * 1e-37f;                    /* below 448 x 2^-126 */
            if (what == 3) x = (float)((int)(fm_rng_uniform(r) * 33) - 16) * 0.03125f * 448.0f / 32.0f; /* ties */
            if (what == 4 && i == b0 + (b1 - b0) / 2) x = 1e4f * mag;        /* an outlier */
            if (what == 5 && i == b0) x = -448.0f;                           /* the block's max exactly */
            if (what == 6) x = ldexpf(mag, -((i - b0) % 24));                /* 24 binades: subnormal codes */
            v[i] = bf16 ? bf16_round(x) : x;
        }
    }
}

/* The oracle's scale of v[b0..b1), as fm_moe_act_fp8_row computes it */
static float oracle_scale(const float *v, int b0, int b1)
{
    float amax = 0.0f;
    for (int i = b0; i < b1; i++) amax = fmaxf(amax, fabsf(v[i]));
    float s = amax / 448.0f;
    return s >= FLT_MIN ? s : 1.0f;
}

static void check_case(fm_rng *r, int n, int mode, int bf16, cudaStream_t st)
{
    const int   T = 37, rows = T * TOPK, live = rows - 9; /* the device count cuts the last 9 rows */
    const int   nsc = mode == FM_ACT_FP8_MODE_BLOCK128 ? (n + 127) / 128 : 1;
    const int   ldq = (n + 15) / 16 * 16;
    float      *src = malloc(sizeof(float) * (size_t)(bf16 ? T : rows) * n);
    uint16_t   *xb = malloc(sizeof(uint16_t) * (size_t)T * n);
    int32_t    *perm = malloc(sizeof(int32_t) * rows);
    const int   nsrc = bf16 ? T : rows;
    for (int t = 0; t < nsrc; t++) make_row(r, src + (size_t)t * n, n, t, bf16);
    if (bf16)
        for (size_t i = 0; i < (size_t)T * n; i++) xb[i] = fm_bf16_encode(src[i]);
    for (int p = 0; p < rows; p++) perm[p] = (int32_t)((p * 7919) % rows); /* a permutation of the slots */
    uint8_t  *dq = dmalloc((size_t)rows * ldq);
    float    *ds = dmalloc(sizeof(float) * (size_t)rows * nsc), *dxf = NULL;
    uint16_t *dxb = NULL;
    int32_t  *dperm = NULL, *dlive = dmalloc(sizeof(int32_t));
    unsigned long long *dbad = dmalloc(sizeof(unsigned long long)), bad = ~0ull;
    CK(cudaMemcpy(dlive, &live, sizeof live, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dbad, &bad, sizeof bad, cudaMemcpyHostToDevice));
    if (bf16) {
        dxb = dmalloc(sizeof(uint16_t) * (size_t)T * n);
        dperm = dmalloc(sizeof(int32_t) * rows);
        CK(cudaMemcpy(dxb, xb, sizeof(uint16_t) * (size_t)T * n, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dperm, perm, sizeof(int32_t) * rows, cudaMemcpyHostToDevice));
    } else {
        dxf = dmalloc(sizeof(float) * (size_t)rows * n);
        CK(cudaMemcpy(dxf, src, sizeof(float) * (size_t)rows * n, cudaMemcpyHostToDevice));
    }
    CK(cudaMemsetAsync(dq, 0xFF, (size_t)rows * ldq, st));
    CK(cudaMemsetAsync(ds, 0xFF, sizeof(float) * (size_t)rows * nsc, st));
    assert_int_equal(fm_act_fp8_launch(dxb, dxf, dperm, TOPK, rows, dlive, n, mode, dq, ldq, ds, nsc, dbad, st), 0);
    uint8_t *q = malloc((size_t)rows * ldq);
    float   *sc = malloc(sizeof(float) * (size_t)rows * nsc), *want = malloc(sizeof(float) * n);
    CK(cudaMemcpyAsync(q, dq, (size_t)rows * ldq, cudaMemcpyDeviceToHost, st));
    CK(cudaMemcpyAsync(sc, ds, sizeof(float) * (size_t)rows * nsc, cudaMemcpyDeviceToHost, st));
    CK(cudaMemcpyAsync(&bad, dbad, sizeof bad, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    const char *what = bf16 ? "BF16 gather" : "FP32 rows";
    const char *mname = mode == FM_ACT_FP8_MODE_BLOCK128 ? "block128" : "token";
    if (bad != ~0ull) fail_msg("n=%d %s %s: finite rows reported non-finite at %llu", n, what, mname, bad);
    long long subn = 0, sat = 0;
    for (int p = 0; p < rows; p++) {
        const float *v = src + (size_t)(bf16 ? perm[p] / TOPK : p) * n;
        const uint8_t *qr = q + (size_t)p * ldq;
        const float   *sr = sc + (size_t)p * nsc;
        if (p >= live) { /* past the device count: untouched */
            for (int c = 0; c < n; c++)
                if (qr[c] != 0xFF) fail_msg("n=%d %s %s: row %d past the count written", n, what, mname, p);
            continue;
        }
        assert_int_equal(fm_moe_act_fp8_row(v, n, mode == FM_ACT_FP8_MODE_BLOCK128 ? FM_ACT_FP8_BLOCK128
                                                                                    : FM_ACT_FP8_TOKEN, want),
                         FM_OK);
        const int blk = mode == FM_ACT_FP8_MODE_BLOCK128 ? 128 : n;
        for (int b0 = 0, b = 0; b0 < n; b0 += blk, b++) {
            const int   b1 = b0 + blk < n ? b0 + blk : n;
            const float s = oracle_scale(v, b0, b1);
            if (memcmp(&s, &sr[b], 4))
                fail_msg("n=%d %s %s: row %d block %d: scale %.9g, the oracle's %.9g", n, what, mname, p, b,
                         (double)sr[b], (double)s);
            for (int c = b0; c < b1; c++) {
                const uint8_t code = fm_e4m3_encode(v[c] / s);
                if (qr[c] != code)
                    fail_msg("n=%d %s %s: row %d col %d: v %.9g / s %.9g: code 0x%02x, the oracle's 0x%02x", n, what,
                             mname, p, c, (double)v[c], (double)s, qr[c], code);
                const float got = fm_e4m3_decode(qr[c]) * sr[b];
                if (!(got == want[c]))
                    fail_msg("n=%d %s %s: row %d col %d: dec(q) x s = %.9g, fm_moe_act_fp8_row %.9g", n, what, mname,
                             p, c, (double)got, (double)want[c]);
                subn += (qr[c] & 0x78) == 0 && (qr[c] & 7);
                sat += (qr[c] & 0x7f) == 0x7e;
            }
        }
    }
    printf("  n=%-5d %-11s %-8s: %d rows bit-exact (%lld subnormal codes, %lld at +-448)\n", n, what, mname, live,
           subn, sat);
    assert_true(subn > 0); /* the cases above reach the subnormal codes */

    /* NaN and Inf: the first index reported (x: t x n + c of the token row) */
    if (bf16) {
        const int t1 = perm[3] / TOPK, t2 = perm[1] / TOPK, c1 = n - 1, c2 = n / 2;
        uint16_t  nanb = 0x7fc0, infb = 0x7f80;
        CK(cudaMemcpy(dxb + (size_t)t1 * n + c1, &nanb, 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dxb + (size_t)t2 * n + c2, &infb, 2, cudaMemcpyHostToDevice));
        bad = ~0ull;
        CK(cudaMemcpy(dbad, &bad, sizeof bad, cudaMemcpyHostToDevice));
        assert_int_equal(fm_act_fp8_launch(dxb, NULL, dperm, TOPK, rows, dlive, n, mode, dq, ldq, ds, nsc, dbad, st),
                         0);
        CK(cudaMemcpyAsync(&bad, dbad, sizeof bad, cudaMemcpyDeviceToHost, st));
        CK(cudaStreamSynchronize(st));
        const unsigned long long a = (unsigned long long)t1 * n + c1, b = (unsigned long long)t2 * n + c2;
        assert_true(bad == (a < b ? a : b));
    }
    /* arguments the launcher refuses */
    assert_int_not_equal(fm_act_fp8_launch(dxb ? dxb : (uint16_t *)dq, dxf ? dxf : (float *)dq, NULL, TOPK, rows,
                                           NULL, n, mode, dq, ldq, ds, nsc, NULL, st), 0); /* both sources */
    assert_int_not_equal(fm_act_fp8_launch(bf16 ? dxb : NULL, dxf, dperm, TOPK, rows, NULL, n, 3, dq, ldq, ds, nsc,
                                           NULL, st), 0); /* mode 3 */
    assert_int_not_equal(fm_act_fp8_launch(bf16 ? dxb : NULL, dxf, dperm, TOPK, rows, NULL, n, mode, dq, n - 4, ds,
                                           nsc, NULL, st), 0); /* ldq < n */
    free(src), free(xb), free(perm), free(q), free(sc), free(want);
    CK(cudaFree(dq));
    CK(cudaFree(ds));
    CK(cudaFree(dlive));
    CK(cudaFree(dbad));
    if (dxb) CK(cudaFree(dxb));
    if (dxf) CK(cudaFree(dxf));
    if (dperm) CK(cudaFree(dperm));
}

static void test_act_fp8_vs_oracle(void **state)
{
    (void)state;
    fm_test_require_gpu();
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0xf8);
    CK(cudaSetDevice(0));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const int ns[3] = {6144, 2880, 132};
    for (int i = 0; i < 3; i++)
        for (int mode = FM_ACT_FP8_MODE_BLOCK128; mode <= FM_ACT_FP8_MODE_TOKEN; mode++)
            for (int bf16 = 1; bf16 >= 0; bf16--) check_case(&r, ns[i], mode, bf16, st);
    CK(cudaStreamDestroy(st));
}

/* W4A8's activation quantized in one pass (fm_w4a8_act_fp8_launch, what the W4A8 layer runs
 * between its GEMMs) against the oracle: h from
 * FC1's FP32 output by fm_moe_expert_act (the expert's global scales applied first, its bias
 * when given), then fm_moe_act_fp8_row; both activations, both modes, with and without biases;
 * I = 2,048 (GLM-5), 2,880 (gpt-oss: a last block of 64), 132 and 14,336 (Mixtral: a row of h
 * is 56 KB in FP32, more than a CTA's default shared memory; the token mode must not need it). The device's expf is not the
 * host's (within 2 ulp), so an h may differ in its last bits and, at an E4M3 rounding midpoint,
 * its code by one step: scales within 1e-6 relative, every element within one E4M3 step (2^-3
 * relative, or a subnormal step of the scale), at most 1 % of the codes differing. Rows past
 * the device count off[L] keep their poison; a NaN h reports its expert (the smallest). */
static void check_act(fm_rng *r, int I, int mode, int act, int bias, cudaStream_t st)
{
    enum { L = 3 };
    const int rows = 37, live = 33, off[L + 1] = {0, 11, 11, live}; /* expert 1 has no rows */
    const int nsc = fm_act_fp8_nscales(mode, I);
    fm_moe_config c;
    fm_moe_config_default(&c);
    c.inter = I, c.activation = (fm_activation)act, c.swiglu_limit = 7.0f;
    float *y1 = malloc(sizeof(float) * rows * 2 * I), *b13 = malloc(sizeof(float) * L * 2 * I);
    float  gs[L], us[L];
    for (int e = 0; e < L; e++) gs[e] = 0.5f + fm_rng_uniform(r), us[e] = 0.5f + fm_rng_uniform(r);
    for (size_t i = 0; i < (size_t)rows * 2 * I; i++) y1[i] = fm_rng_normal(r) * (act ? 6.0f : 2.0f); /* clamps bite */
    for (size_t i = 0; i < (size_t)L * 2 * I; i++) b13[i] = fm_rng_normal(r) * 0.5f;
    float   *dy = dmalloc(sizeof(float) * rows * 2 * I), *db = dmalloc(sizeof(float) * L * 2 * I);
    float   *dgs = dmalloc(sizeof gs), *dus = dmalloc(sizeof us), *ds = dmalloc(sizeof(float) * rows * nsc);
    int32_t *doff = dmalloc(sizeof off);
    uint8_t *dq = dmalloc((size_t)rows * I);
    unsigned long long *dbad = dmalloc(sizeof(unsigned long long));
    CK(cudaMemcpy(dy, y1, sizeof(float) * rows * 2 * I, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, b13, sizeof(float) * L * 2 * I, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dgs, gs, sizeof gs, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dus, us, sizeof us, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(doff, off, sizeof off, cudaMemcpyHostToDevice));
    CK(cudaMemset(dq, 0xFF, (size_t)rows * I));
    CK(cudaMemset(ds, 0xFF, sizeof(float) * rows * nsc));
    CK(cudaMemset(dbad, 0xFF, sizeof(unsigned long long)));
    CK(cudaDeviceSynchronize());
    assert_int_equal(fm_w4a8_act_fp8_launch(dy, doff, L, rows, I, dgs, dus, bias ? db : NULL, act, 7.0f, mode, dq, ds,
                                            nsc, dbad, st),
                     0);
    CK(cudaStreamSynchronize(st));
    uint8_t *q = malloc((size_t)rows * I);
    float   *sc = malloc(sizeof(float) * rows * nsc), *g = malloc(sizeof(float) * 2 * I), *h = malloc(sizeof(float) * I);
    float   *hq = malloc(sizeof(float) * I);
    unsigned long long bad = 0;
    CK(cudaMemcpy(q, dq, (size_t)rows * I, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(sc, ds, sizeof(float) * rows * nsc, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&bad, dbad, sizeof bad, cudaMemcpyDeviceToHost));
    assert_true(bad == ~0ull); /* nothing non-finite */
    long differ = 0;
    for (int p = 0; p < rows; p++) {
        if (p >= live) { /* past the device count: the poison kept */
            for (int j = 0; j < I; j++) assert_int_equal(q[(size_t)p * I + j], 0xFF);
            continue;
        }
        const int e = p < off[1] ? 0 : 2;
        for (int j = 0; j < I; j++) g[j] = y1[(size_t)p * 2 * I + j] * gs[e], g[I + j] = y1[(size_t)p * 2 * I + I + j] * us[e];
        fm_moe_expert_act(&c, bias ? b13 + (size_t)e * 2 * I : NULL, g, h);
        assert_int_equal(fm_moe_act_fp8_row(h, I, (fm_act_fp8)mode, hq), FM_OK);
        float so = 0; /* the oracle's scale of the element's block, from its own h: once a block */
        for (int j = 0; j < I; j++) {
            const float s = sc[(size_t)p * nsc + (mode == FM_ACT_FP8_MODE_BLOCK128 ? j / 128 : 0)];
            const float v = fm_e4m3_decode(q[(size_t)p * I + j]) * s;
            if (mode == FM_ACT_FP8_MODE_BLOCK128 ? j % 128 == 0 : j == 0)
                so = mode == FM_ACT_FP8_MODE_BLOCK128 ? oracle_scale(h, j, j + 128 < I ? j + 128 : I) : oracle_scale(h, 0, I);
            if (!(fabsf(s - so) <= 1e-6f * so)) fail_msg("I=%d mode %d act %d row %d col %d: scale %g, oracle %g", I, mode, act, p, j, s, so);
            /* codes compared with the oracle's own code E4M3(h / so): a scale one ulp off (its
             * block's largest h through the device's expf) moves every value of the block by an
             * ulp, not its codes */
            differ += q[(size_t)p * I + j] != fm_e4m3_encode(h[j] / so);
            if (v != hq[j]) {
                const float tol = fmaxf(0.125f * fabsf(hq[j]), ldexpf(so, -9)) * 1.01f;
                if (!(fabsf(v - hq[j]) <= tol))
                    fail_msg("I=%d mode %d act %d bias %d row %d col %d: %g, oracle %g (h %g)", I, mode, act, bias, p,
                             j, v, hq[j], h[j]);
            }
        }
    }
    if (differ > (long)live * I / 100) fail_msg("I=%d mode %d act %d: %ld codes differ from the oracle's", I, mode, act, differ);
    printf("  I=%d %s %s%s: %ld of %d codes one step off the host's (expf)\n", I, mode == 1 ? "block128" : "token",
           act ? "gpt-oss" : "swiglu", bias ? " + bias" : "", differ, live * I);
    /* a NaN in expert 2's row: expert 2 reported */
    const float nan = NAN;
    CK(cudaMemcpy(dy + (size_t)(live - 1) * 2 * I + 5, &nan, sizeof nan, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
    assert_int_equal(fm_w4a8_act_fp8_launch(dy, doff, L, rows, I, dgs, dus, bias ? db : NULL, act, 7.0f, mode, dq, ds,
                                            nsc, dbad, st),
                     0);
    CK(cudaMemcpyAsync(&bad, dbad, sizeof bad, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    assert_true(bad == 2);
    /* refusals, nothing launched */
    assert_int_equal(fm_w4a8_act_fp8_launch(dy, doff, L, rows, I, dgs, dus, NULL, act, 7.0f, 3, dq, ds, nsc, dbad, st),
                     (int)cudaErrorInvalidValue);
    assert_int_equal(fm_w4a8_act_fp8_launch(dy + 1, doff, L, rows, I, dgs, dus, NULL, act, 7.0f, mode, dq, ds, nsc,
                                            dbad, st),
                     (int)cudaErrorMisalignedAddress);
    assert_int_equal(fm_w4a8_act_fp8_launch(dy, doff, L, rows, I, dgs, dus, NULL, act, 7.0f, mode, dq, ds, nsc - 1,
                                            dbad, st),
                     (int)cudaErrorInvalidValue);
    free(y1), free(b13), free(q), free(sc), free(g), free(h), free(hq);
    void *dev[] = {dy, db, dgs, dus, ds, doff, dq, dbad};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) CK(cudaFree(dev[i]));
}

static void test_w4a8_act_fp8(void **state)
{
    (void)state;
    fm_test_require_gpu();
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0xac7);
    CK(cudaSetDevice(0));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const int Is[4] = {2048, 2880, 132, 14336};
    for (int i = 0; i < 4; i++)
        for (int mode = FM_ACT_FP8_MODE_BLOCK128; mode <= FM_ACT_FP8_MODE_TOKEN; mode++)
            for (int act = 0; act < 2; act++)
                for (int bias = 0; bias < 2; bias++)
                    check_act(&r, Is[i], mode, act ? FM_ACT_SWIGLU_GPTOSS : FM_ACT_SWIGLU, bias, st);
    CK(cudaStreamDestroy(st));
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_act_fp8_vs_oracle), cmocka_unit_test(test_w4a8_act_fp8)};
    fm_test_require_gpu(); /* exit 77 (skipped) with a message where there is no GPU */
    return cmocka_run_group_tests(tests, NULL, NULL);
}
