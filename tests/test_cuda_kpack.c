/* test_cuda_kpack.c - the K order that ties the prepacked weights to the packed X
 * the wgmma kernels read (no GPU needed; the CUDA build only).
 *
 * src/cuda/prepack.c documents where a code lands: lane (g, t), word s (MMA step),
 * register j, half h hold row g + 8*(j&1), K = 16t + 4s + 2*(j>>1) + h of a 64-K
 * chunk, at the bit positions listed there. The m16n8k16 / wgmma A fragment reads
 * register j as logical k = 2t + h (j < 2) or 8 + 2t + h (j >= 2) of step s, so the
 * token row the tensor cores multiply it with must hold, at position 16s + that
 * logical k, the natural column 16t + 4s + 2*(j>>1) + h: that is fm_cuda_kpack_col.
 * Checked here three ways: the formula for every (s, t, half, h), the bijection on
 * each 64-column block, and on real prepacked bits (every code of an NVFP4 matrix
 * found at the documented place, then its K mapped by fm_cuda_kpack_col onto the
 * logical k its register feeds). A wrong map fails the GPU tests with NMSE ~2;
 * this catches it without a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#ifdef FM_HAVE_CUDA
#include "cuda/cuda_internal.h"

static void kpack_formula(void **state)
{
    (void)state;
    for (int blk = 0; blk < 3; blk++)
        for (int s = 0; s < 4; s++)
            for (int t = 0; t < 4; t++)
                for (int half = 0; half < 2; half++)
                    for (int h = 0; h < 2; h++) {
                        int64_t natural = blk * 64 + 16 * t + 4 * s + 2 * half + h;
                        int64_t logical = 8 * half + 2 * t + h; /* k inside MMA step s */
                        assert_int_equal(fm_cuda_kpack_col(natural), blk * 64 + 16 * s + logical);
                    }
}

static void kpack_bijection(void **state)
{
    (void)state;
    int seen[128] = {0};
    for (int c = 0; c < 128; c++) {
        int64_t q = fm_cuda_kpack_col(c);
        assert_true(q >= (c / 64) * 64 && q < (c / 64) * 64 + 64); /* stays in its block */
        seen[q]++;
    }
    for (int c = 0; c < 128; c++) assert_int_equal(seen[c], 1);
}

/* Source bit of code bit b (m, e0, e1, sign) of register j, half h: prepack.c's table. */
static const int k_bits[4][2][4] = {
    {{6, 7, 0, 15}, {22, 23, 16, 31}},
    {{2, 3, 4, 11}, {18, 19, 20, 27}},
    {{24, 25, 26, 1}, {8, 9, 10, 17}},
    {{28, 29, 30, 5}, {12, 13, 14, 21}},
};

static void kpack_matches_prepacked_bits(void **state)
{
    (void)state;
    enum { N = 32, K = 128 };
    fm_rng r;
    fm_rng_init(&r, fm_test_seed());
    uint8_t data[N * K / 2], scales[N * K / 16];
    uint8_t code[N][K];
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
            uint8_t c = (uint8_t)(1 + (uint32_t)fm_rng_u64(&r) % 7); /* magnitudes 0.5..6, no zero */
            if ((uint32_t)fm_rng_u64(&r) & 1) c |= 8;                /* sign */
            code[n][k] = c;
        }
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k += 2) data[n * (K / 2) + k / 2] = (uint8_t)(code[n][k] | (code[n][k + 1] << 4));
    for (size_t i = 0; i < sizeof scales; i++) scales[i] = 0x38; /* E4M3 1.0: no block is zeroed */
    fm_qtensor w = {.fmt = FM_FORMAT_NVFP4, .rows = N, .cols = K, .data = data, .scales = scales, .global_scale = 1.0f};
    size_t db, sb;
    fm_cuda_prepack_sizes(N, K, &db, &sb);
    uint8_t *pd = malloc(db), *ps = malloc(sb);
    float    osc = 0;
    assert_int_equal(fm_cuda_prepack(&w, pd, ps, &osc), FM_OK);
    int checked = 0;
    for (int band = 0; band < N / 16; band++)
        for (int chunk = 0; chunk < K / 64; chunk++)
            for (int lane = 0; lane < 32; lane++) {
                int g = lane / 4, t = lane % 4;
                const uint8_t *p = pd + ((size_t)(band * (K / 64) + chunk) * 32 + lane) * 16;
                for (int s = 0; s < 4; s++) {
                    uint32_t word;
                    memcpy(&word, p + 4 * s, 4);
                    for (int j = 0; j < 4; j++)
                        for (int h = 0; h < 2; h++) {
                            int c = 0;
                            for (int b = 0; b < 4; b++) c |= (int)((word >> k_bits[j][h][b]) & 1u) << b;
                            int row = band * 16 + g + 8 * (j & 1);
                            int k = chunk * 64 + 16 * t + 4 * s + 2 * (j >> 1) + h; /* prepack.c's claim */
                            assert_int_equal(c, code[row][k]);
                            /* the packed X position of that K is the logical k register j feeds */
                            int logical = (j >= 2 ? 8 : 0) + 2 * t + h;
                            assert_int_equal(fm_cuda_kpack_col(k), chunk * 64 + 16 * s + logical);
                            checked++;
                        }
                }
            }
    assert_int_equal(checked, N * K);
    free(pd);
    free(ps);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kpack_formula),
        cmocka_unit_test(kpack_bijection),
        cmocka_unit_test(kpack_matches_prepacked_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void)
{
    printf("SKIP: built without CUDA (fm_cuda_kpack_col and the prepacker are part of the CUDA build)\n");
    return 77;
}
#endif
