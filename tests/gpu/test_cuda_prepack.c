/* test_cuda_prepack.c - the prepacked weight layout (src/cuda/prepack.c), on the
 * host: decoding the prepacked bytes the way the kernel does (bit extraction,
 * BF16 scale from the byte code, output multiplier) must give back fm_dequantize's
 * values (relative 1e-6: both are exact products, only the order of the FP32
 * multiplications by the global scale may differ), including zero blocks,
 * subnormal E4M3 scales, padded K and MXFP4 exponent offsets, on small matrices and on
 * ones large enough for the threaded band loop. Needs no GPU: labelled cpu too. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_internal.h"
#include "testutil.h"

static void check_format(fm_rng *r, fm_format f, int N, int K)
{
    size_t db, sb, pdb, psb;
    assert_int_equal(fm_qtensor_bytes(f, N, K, &db, &sb), FM_OK);
    fm_qtensor q = {.fmt = f, .rows = N, .cols = K, .data = malloc(db), .scales = malloc(sb)};
    float     *src = malloc(sizeof(float) * (size_t)N * K), *want = malloc(sizeof(float) * (size_t)N * K);
    float     *got = malloc(sizeof(float) * (size_t)N * K);
    for (int n = 0; n < N; n++) fm_rng_fill_normal(r, src + (size_t)n * K, (size_t)K, ldexpf(1.0f, n % 9 - 4));
    assert_int_equal(fm_quantize(src, NULL, &q), FM_OK);
    int nsb = (int)(sb / N);
    if (f == FM_FORMAT_NVFP4)
        for (int i = 0; i < 8; i++) q.scales[i * 3] = (uint8_t)i; /* zero and the 7 subnormal E4M3 scales */
    else
        q.scales[5] = 0; /* 2^-127 next to normal scales: its block must be all zero to be accepted */
    if (f == FM_FORMAT_MXFP4) {
        uint8_t *d = q.data;
        for (int k = 5 * 32; k < 6 * 32; k++) d[k / 2] &= (uint8_t)(k & 1 ? 0x0F : 0xF0);
    }
    (void)nsb;
    assert_int_equal(fm_dequantize(&q, want), FM_OK);
    fm_cuda_prepack_sizes(N, K, &pdb, &psb);
    uint8_t *pd = malloc(pdb), *ps = malloc(psb);
    fm_poison_bytes(pd, pdb);
    fm_poison_bytes(ps, psb);
    float os = 0;
    assert_int_equal(fm_cuda_prepack(&q, pd, ps, &os), FM_OK);
    fm_poison_f32(got, (size_t)N * K);
    fm_cuda_unpack(pd, ps, os, f, N, K, got);
    assert_true(fm_first_nonfinite(got, (size_t)N * K) < 0);
    for (size_t i = 0; i < (size_t)N * K; i++)
        if (fabsf(got[i] - want[i]) > 1e-6f * fabsf(want[i]))
            fail_msg("%s [%d x %d]: element %zu (row %zu col %zu) = %g, fm_dequantize gives %g",
                     fm_format_traits_get(f)->name, N, K, i, i / K, i % K, (double)got[i], (double)want[i]);
    free(q.data);
    free(q.scales);
    free(src);
    free(want);
    free(got);
    free(pd);
    free(ps);
}

static void test_layout_roundtrip(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed());
    check_format(&r, FM_FORMAT_NVFP4, 48, 208); /* K % 64 == 16: a padded chunk */
    check_format(&r, FM_FORMAT_NVFP4, 16, 64);
    check_format(&r, FM_FORMAT_MXFP4, 32, 224);
    check_format(&r, FM_FORMAT_MXFP4, 16, 512);
    /* large enough for prepack's threaded band loop (N * K >= 2^22), with a padded chunk */
    check_format(&r, FM_FORMAT_NVFP4, 1024, 4112);
    check_format(&r, FM_FORMAT_MXFP4, 2048, 2080);
}

static void test_refusals(void **state)
{
    (void)state;
    uint8_t    data[16 * 32], sc[16 * 2], pd[2048], ps[256];
    float      os;
    fm_qtensor q = {.fmt = FM_FORMAT_NVFP4, .rows = 16, .cols = 32, .data = data, .scales = sc, .global_scale = 1};
    memset(data, 0x22, sizeof data);
    memset(sc, 0x38, sizeof sc);
    assert_int_equal(fm_cuda_prepack(&q, pd, ps, &os), FM_OK);
    sc[4] = 0xB8; /* negative block scale */
    assert_int_equal(fm_cuda_prepack(&q, pd, ps, &os), FM_ERR_FORMAT);
    sc[4] = 0x38;
    q.rows = 8; /* N must be a multiple of 16 */
    assert_int_equal(fm_cuda_prepack(&q, pd, ps, &os), FM_ERR_BAD_SHAPE);
    q.rows = 16;
    q.fmt = FM_FORMAT_MXFP4;
    sc[0] = 1;
    sc[1] = 200; /* 199 binades apart */
    assert_int_equal(fm_cuda_prepack(&q, pd, ps, &os), FM_ERR_UNSUPPORTED);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_roundtrip),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
