/* test_cuda_fp8pack.c - the W4A8 mma GEMM's weight layout (src/cuda/prepack_fp8.c) and its
 * decode, on the host: the packed bytes are read back the way gemm_fp8.cu's lanes read them
 * (lane l = 4g + t, 16 bytes per 64 of K, four 16-bit words per MMA), turned into E4M3 codes the
 * way its lanes do (an 8-entry table of e2m1 x 2^(code - c + 6), c the largest UE8M0 code of the
 * row's 128-K group, a `prmt` byte select by the 3-bit magnitudes, the sign bits ORed in; the
 * E4M3 rounding of the table is fm_e4m3_encode's, which the device's cvt.rn.satfinite matches
 * bit for bit: test_cuda_act_fp8) and placed where mma.m16n8k32's A fragment puts them (rows g /
 * g + 8, K 4t..4t+3 / 16+4t..16+4t+3). Every weight must then come back as e2m1 x 2^(code -
 * 127) = fm_dequantize's value once the group's factor 2^(c - 133) is applied: EXACT for blocks
 * within 14 binades of their group's largest (every block of the N(0, 1) rows here), and for
 * blocks further below the E4M3 table rounds: their values are checked against the bound
 * |w' - w| <= 2^-10 x 2^(c - 127) (half E4M3's smallest subnormal step, scaled), the rounding
 * gemm_fp8.h states. Shapes: N 16 .. 96, K 64 .. 2,880 (gpt-oss), a group of 64 at the end; rows
 * whose block exponents span up to 30 binades. The refusals of the pack, and the W4A8
 * launchers' host-side argument checks. Needs no GPU: labelled cpu too (host code of the CUDA
 * backend). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "cuda/gemm_fp8.h"
#include "cuda/moe_kernels.h"
#include "fp4moe/format.h"
#include "testutil.h"

static uint32_t table_byte(int idx, int j)
{
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return fm_e4m3_encode(mag[idx] * ldexpf(1.0f, j));
}

/* what gemm_fp8.cu's decode4 gives for 4 E2M1 codes v (nibble i = element i) with the table of j */
static uint32_t decode4(uint32_t v, int j)
{
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) {
        const unsigned code = (v >> (4 * i)) & 15u;
        r |= (table_byte((int)(code & 7u), j) | (code & 8u ? 0x80u : 0u)) << (8 * i);
    }
    return r;
}

static void check(fm_rng *r, int N, int K, int spread)
{
    size_t db, sb;
    assert_int_equal(fm_qtensor_bytes(FM_FORMAT_MXFP4, N, K, &db, &sb), FM_OK);
    fm_qtensor q = {.fmt = FM_FORMAT_MXFP4, .rows = N, .cols = K, .data = malloc(db), .scales = malloc(sb)};
    float     *src = malloc(sizeof(float) * (size_t)N * K), *deq = malloc(sizeof(float) * (size_t)N * K);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) { /* each 32-block its own binade, within `spread` of the row's */
            const int b = k / 32, e = spread ? (int)((b * 7919u + (unsigned)n * 104729u) % (unsigned)(spread + 1)) : 0;
            src[(size_t)n * K + k] = fm_rng_normal(r) * ldexpf(1.0f, -e + n % 5);
        }
    assert_int_equal(fm_quantize(src, NULL, &q), FM_OK);
    assert_int_equal(fm_dequantize(&q, deq), FM_OK);
    uint8_t *pk = malloc(fm_fp8mma_pack_bytes(N, K));
    assert_int_equal(fm_fp8mma_pack(&q, pk), FM_OK);
    const int nblk = K / 32;
    long long exact = 0, rounded = 0;
    for (int band = 0; band < N / 16; band++)
        for (int k32 = 0; k32 < nblk; k32++) {
            const int kb0 = k32 / 4 * 4, nb = nblk - kb0 < 4 ? nblk - kb0 : 4;
            for (int lane = 0; lane < 32; lane++) {
                const int      g = lane >> 2, t = lane & 3;
                const uint8_t *w = pk + ((size_t)(band * (K / 64) + k32 / 2) * 32 + lane) * 16 + (k32 & 1) * 8;
                for (int j = 0; j < 4; j++) { /* a0..a3 */
                    const int      row = band * 16 + g + 8 * (j & 1), kk = k32 * 32 + 4 * t + 16 * (j >> 1);
                    const uint8_t *ex = q.scales + (size_t)row * nblk;
                    int            c = 0;
                    for (int b = 0; b < nb; b++) c = ex[kb0 + b] > c ? ex[kb0 + b] : c;
                    const uint32_t v = (uint32_t)w[2 * j] | (uint32_t)w[2 * j + 1] << 8;
                    const uint32_t a = decode4(v, (int)ex[k32] - c + 6);
                    for (int i = 0; i < 4; i++) {
                        const double got = (double)fm_e4m3_decode((uint8_t)(a >> (8 * i))) * ldexp(1.0, c - 133);
                        const double want = deq[(size_t)row * K + kk + i];
                        if (got == want) {
                            exact++;
                            continue;
                        }
                        if ((int)ex[k32] - c >= -14)
                            fail_msg("N=%d K=%d: w[%d][%d] = %.9g decoded as %.9g (block code %d, group max %d: must "
                                     "be exact)", N, K, row, kk + i, want, got, ex[k32], c);
                        if (fabs(got - want) > ldexp(1.0, c - 127 - 10))
                            fail_msg("N=%d K=%d: w[%d][%d] = %.9g decoded as %.9g, past the subnormal bound", N, K,
                                     row, kk + i, want, got);
                        rounded++;
                    }
                }
            }
        }
    printf("  N=%-3d K=%-4d block spread %2d binades: %lld weights exact, %lld rounded within the bound\n", N, K,
           spread, exact, rounded);
    assert_int_equal(exact + rounded, (long long)N * K);
    if (spread <= 8) assert_int_equal(rounded, 0);
    free(q.data), free(q.scales), free(src), free(deq), free(pk);
}

static void test_fp8pack_decode(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0xfb8);
    const int shapes[5][2] = {{16, 64}, {32, 192}, {48, 256}, {96, 2880}, {64, 320}};
    for (int i = 0; i < 5; i++) check(&r, shapes[i][0], shapes[i][1], 0);
    check(&r, 32, 512, 8);
    check(&r, 32, 512, 30); /* blocks far below their group's largest: E4M3 subnormals round them */
}

/* prmt.b32 d, a, b, sel as PTX defines it (default mode): byte i of d = byte (sel nibble i & 7)
 * of {b:a}, or, with the nibble's bit 3 set, that byte's sign bit replicated */
static uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel)
{
    const uint64_t ab = (uint64_t)b << 32 | a;
    uint32_t       d = 0;
    for (int i = 0; i < 4; i++) {
        const unsigned n = (sel >> (4 * i)) & 15u, byte = (unsigned)(ab >> (8 * (n & 7u))) & 0xffu;
        d |= (n & 8u ? (byte & 0x80u ? 0xffu : 0u) : byte) << (8 * i);
    }
    return d;
}

/* The pipelined kernels' decode (gemm_fp8.cu decode4c: two prmt with the constant table
 * FM_FP8MMA_TLO / THI) for every 16-bit input: byte i = the E4M3 code of the exact E2M1 value of
 * nibble i (fm_e4m3_encode of fm_e2m1's value, -0 for a negative zero as the sign bit says);
 * and the block scales' decodes (fm_fp8mma_ue8m0 / fm_fp8mma_e4m3) for every code against
 * ldexp / fm_e4m3_decode, bit for bit. */
static void test_fp8pipe_decode(void **state)
{
    (void)state;
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    for (int i = 0; i < 8; i++)
        assert_int_equal((i < 4 ? FM_FP8MMA_TLO >> (8 * i) : FM_FP8MMA_THI >> (8 * (i - 4))) & 0xffu,
                         fm_e4m3_encode(mag[i]));
    for (uint32_t v = 0; v < 65536; v++) {
        const uint32_t got = prmt(FM_FP8MMA_TLO, FM_FP8MMA_THI, v & 0x7777u) | prmt(0x8000u, 0u, (v >> 3) & 0x1111u);
        for (int i = 0; i < 4; i++) {
            const unsigned code = (v >> (4 * i)) & 15u, want = fm_e4m3_encode(mag[code & 7u]) | (code & 8u ? 0x80u : 0u);
            if (((got >> (8 * i)) & 0xffu) != want)
                fail_msg("decode of 0x%04x, element %d: 0x%02x, want 0x%02x", v, i, (got >> (8 * i)) & 0xffu, want);
        }
    }
    for (uint32_t c = 0; c < 256; c++) {
        const float u = fm_fp8mma_ue8m0(c), want_u = c == 255 ? NAN : ldexpf(1.0f, (int)c - 127);
        if (c == 255) assert_true(isnan(u));
        else assert_memory_equal(&u, &want_u, sizeof u);
        const float e = fm_fp8mma_e4m3(c), want_e = fm_e4m3_decode((uint8_t)c);
        if (isnan(want_e)) assert_true(isnan(e));
        else assert_memory_equal(&e, &want_e, sizeof e);
    }
}

static void test_fp8pack_refusals(void **state)
{
    (void)state;
    uint8_t    d[16 * 32], s[16 * 2], out[512]; /* one band, one chunk: 32 lanes x 16 B */
    fm_qtensor q = {.fmt = FM_FORMAT_MXFP4, .rows = 16, .cols = 64, .data = d, .scales = s, .global_scale = 1.0f};
    memset(d, 0, sizeof d), memset(s, 127, sizeof s);
    assert_int_equal(fm_fp8mma_pack_bytes(16, 64), sizeof out);
    assert_int_equal(fm_fp8mma_pack(&q, out), FM_OK);
    assert_int_equal(fm_fp8mma_pack(NULL, out), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_fp8mma_pack(&q, NULL), FM_ERR_INVALID_ARG);
    fm_qtensor b = q;
    b.fmt = FM_FORMAT_BF16, assert_int_equal(fm_fp8mma_pack(&b, out), FM_ERR_FORMAT);
    b = q, b.fmt = FM_FORMAT_NVFP4, assert_int_equal(fm_fp8mma_pack(&b, out), FM_OK); /* the same code layout */
    b = q, b.rows = 8, assert_int_equal(fm_fp8mma_pack(&b, out), FM_ERR_BAD_SHAPE);
    b = q, b.cols = 32, assert_int_equal(fm_fp8mma_pack(&b, out), FM_ERR_BAD_SHAPE);
}

/* The W4A8 launchers' argument checks, made on the host before any CUDA call (so they run
 * without a GPU): bad shapes and misaligned buffers refused, nothing launched. The pointers are
 * never dereferenced. */
static void test_fp8_launch_refusals(void **state)
{
    (void)state;
    unsigned char *base = (unsigned char *)(uintptr_t)0x10000000u; /* 256-byte aligned, never read */
    fm_fp8mma_args a = {.wq = base, .wexp = base, .xq = base, .xs = (const float *)base,
                        .offsets = (const int32_t *)base, .y = (float *)base, .E = 2, .N = 32, .K = 128, .ldx = 128,
                        .ldxs = 1, .max_rows = 8};
    fm_fp8mma_args b = a;
    b.wq = base + 8, assert_int_equal(fm_fp8mma_launch(&b, NULL), (int)cudaErrorMisalignedAddress);
    b = a, b.xq = base + 2, assert_int_equal(fm_fp8mma_launch(&b, NULL), (int)cudaErrorMisalignedAddress);
    b = a, b.y = (float *)(base + 2), assert_int_equal(fm_fp8mma_launch(&b, NULL), (int)cudaErrorMisalignedAddress);
    b = a, b.N = 24, assert_int_equal(fm_fp8mma_launch(&b, NULL), (int)cudaErrorInvalidValue);
    b = a, b.K = 96, assert_int_equal(fm_fp8mma_launch(&b, NULL), (int)cudaErrorInvalidValue);
    b = a, b.ldx = 124, assert_int_equal(fm_fp8mma_launch(&b, NULL), (int)cudaErrorInvalidValue);
    b = a, b.K = 256, b.ldx = 256, b.xs_per_128 = 1; /* 2 groups of scales, ldxs 1 */
    assert_int_equal(fm_fp8mma_launch(&b, NULL), (int)cudaErrorInvalidValue);
    b = a, b.xs = NULL, assert_int_equal(fm_fp8mma_launch(&b, NULL), (int)cudaErrorInvalidValue);
    assert_int_equal(fm_fp8mma_launch(NULL, NULL), (int)cudaErrorInvalidValue);
    const uint16_t *x = (const uint16_t *)base;
    uint8_t        *q = base;
    float          *sc = (float *)base;
    /* act_fp8: one source, a mode, ldq, alignment */
    assert_int_equal(fm_act_fp8_launch(x, (const float *)base, NULL, 1, 4, NULL, 64, FM_ACT_FP8_MODE_BLOCK128, q, 64,
                                       sc, 1, NULL, NULL), (int)cudaErrorInvalidValue);
    assert_int_equal(fm_act_fp8_launch(x, NULL, NULL, 1, 4, NULL, 64, 3, q, 64, sc, 1, NULL, NULL),
                     (int)cudaErrorInvalidValue);
    assert_int_equal(fm_act_fp8_launch(x, NULL, NULL, 1, 4, NULL, 64, FM_ACT_FP8_MODE_BLOCK128, q, 60, sc, 1, NULL,
                                       NULL), (int)cudaErrorInvalidValue);
    assert_int_equal(fm_act_fp8_launch(x + 1, NULL, NULL, 1, 4, NULL, 64, FM_ACT_FP8_MODE_TOKEN, q, 64, sc, 1, NULL,
                                       NULL), (int)cudaErrorMisalignedAddress);
    assert_int_equal(fm_act_fp8_launch(NULL, (const float *)(base + 4), NULL, 1, 4, NULL, 64, FM_ACT_FP8_MODE_TOKEN,
                                       q, 64, sc, 1, NULL, NULL), (int)cudaErrorMisalignedAddress);
    assert_int_equal(fm_act_fp8_launch(x, NULL, NULL, 1, 4, NULL, 64, FM_ACT_FP8_MODE_TOKEN, q + 1, 64, sc, 1, NULL,
                                       NULL), (int)cudaErrorMisalignedAddress);
}

/* The staged kernels' host-visible pieces (gemm_fp8.h): (1) the MXFP4 fold tables: for every
 * j in [FM_FP8MMA_FOLD_MIN, 6] and every 16-bit input, the two-prmt decode with the table of j
 * gives the E4M3 code of e2m1 x 2^j exactly (and j = FOLD_MIN - 1 does not: the bound is
 * tight); with 2^(max - 133) that is e2m1 x 2^(code - 127), the weight, for every pair of
 * codes the fold admits. (2) fm_fp8mma_folds against its definition for every code pair of a
 * group. (3) fm_fp8mma_pack_scales' layout read back the way the kernel's lanes read it, for
 * both formats, K % 128 = 0 and 64 (the pad rule). (4) the shared memory of each staged kernel
 * within SM120's 101,376 B, and 0 for the others. (5) the staged launch's refusals (no packed
 * scales, misaligned rows or scales), before any CUDA call. */
static void test_fp8_staged_host(void **state)
{
    (void)state;
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    for (int j = FM_FP8MMA_FOLD_MIN - 1; j <= 6; j++) {
        uint32_t lo, hi;
        fm_fp8mma_fold_table(j, &lo, &hi);
        int exact = 1;
        for (uint32_t v = 0; v < 65536; v++) {
            const uint32_t got = prmt(lo, hi, v & 0x7777u) | prmt(0x8000u, 0u, (v >> 3) & 0x1111u);
            for (int i = 0; i < 4; i++) {
                const unsigned code = (v >> (4 * i)) & 15u;
                const float    want = (code & 8u ? -1.0f : 1.0f) * mag[code & 7u] * ldexpf(1.0f, j);
                const float    dec = fm_e4m3_decode((uint8_t)(got >> (8 * i)));
                if (dec != want || (code & 8u) != ((got >> (8 * i + 4)) & 8u)) exact = 0;
            }
        }
        if (j >= FM_FP8MMA_FOLD_MIN && !exact) fail_msg("fold table j = %d is not exact", j);
        if (j < FM_FP8MMA_FOLD_MIN && exact) fail_msg("fold table j = %d is exact: FM_FP8MMA_FOLD_MIN could be lower", j);
    }
    for (uint32_t mx = 0; mx < 255; mx++) /* the group's factor: e2m1 x 2^j x 2^(max - 133) = e2m1 x 2^(code - 127) */
        for (int j = FM_FP8MMA_FOLD_MIN; j <= 6; j++) {
            const int code = (int)mx + j - 6;
            if (code < 0) continue;
            assert_true(ldexpf(ldexpf(1.5f, j), (int)mx - 133) == ldexpf(1.5f, code - 127) ||
                        ldexpf(1.5f, code - 127) < 0x1p-125f); /* FP32 subnormal products aside */
        }
    for (uint32_t a = 0; a < 256; a++) /* (2): two codes of a group, the others equal to the first */
        for (uint32_t b = 0; b < 256; b++) {
            const uint32_t w = a | b << 8 | a << 16 | a << 24;
            const uint32_t mx = a > b ? a : b, mn = a < b ? a : b;
            assert_int_equal(fm_fp8mma_folds(w), mx < 255 && mx - mn <= 11);
        }
    fm_rng r; /* (3) */
    fm_rng_init(&r, fm_test_seed() ^ 0x5ca1e);
    const int shapes[3][2] = {{32, 2880}, {16, 192}, {48, 256}};
    for (int f = 0; f < 2; f++)
        for (int si = 0; si < 3; si++) {
            const int        N = shapes[si][0], K = shapes[si][1], nv = f == 1, per = nv ? 8 : 4, nblk = K / (nv ? 16 : 32);
            const int        ngrp = (K + 127) / 128;
            uint8_t         *sc = malloc((size_t)N * nblk), *out = malloc(fm_fp8mma_scales_bytes(nv ? FM_FORMAT_NVFP4 : FM_FORMAT_MXFP4, N, K));
            uint8_t          d[1];
            for (int i = 0; i < N * nblk; i++) sc[i] = (uint8_t)(fm_rng_uniform(&r) * 255);
            fm_qtensor q = {.fmt = nv ? FM_FORMAT_NVFP4 : FM_FORMAT_MXFP4, .rows = N, .cols = K, .data = d, .scales = sc};
            assert_int_equal(fm_fp8mma_scales_bytes(q.fmt, N, K), (size_t)(N / 16) * ngrp * 16 * per);
            assert_int_equal(fm_fp8mma_pack_scales(&q, out), FM_OK);
            for (int band = 0; band < N / 16; band++)
                for (int gi = 0; gi < ngrp; gi++)
                    for (int lane = 0; lane < 32; lane++) /* the kernel's lane reads rows g and g + 8 */
                        for (int h = 0; h < 2; h++) {
                            const int      row = (lane >> 2) + 8 * h;
                            const uint8_t *got = out + (((size_t)band * ngrp + gi) * 16 + row) * per;
                            for (int b = 0; b < per; b++) {
                                const int blk = gi * per + b;
                                const int want = blk < nblk ? sc[(size_t)(band * 16 + row) * nblk + blk]
                                                 : nv        ? 0
                                                             : sc[(size_t)(band * 16 + row) * nblk + gi * per];
                                if (got[b] != want)
                                    fail_msg("%s N %d K %d band %d group %d row %d block %d: 0x%02x, want 0x%02x",
                                             nv ? "nvfp4" : "mxfp4", N, K, band, gi, row, b, got[b], want);
                            }
                        }
            fm_qtensor b = q;
            assert_int_equal(fm_fp8mma_pack_scales(NULL, out), FM_ERR_INVALID_ARG);
            b.scales = NULL, assert_int_equal(fm_fp8mma_pack_scales(&b, out), FM_ERR_INVALID_ARG);
            b = q, b.fmt = FM_FORMAT_BF16, assert_int_equal(fm_fp8mma_pack_scales(&b, out), FM_ERR_FORMAT);
            b = q, b.rows = 8, assert_int_equal(fm_fp8mma_pack_scales(&b, out), FM_ERR_BAD_SHAPE);
            b = q, b.cols = 96, assert_int_equal(fm_fp8mma_pack_scales(&b, out), FM_ERR_BAD_SHAPE);
            free(sc), free(out);
        }
    for (int k = 0; k < FM_FP8MMA_KERNELS; k++) /* (4) */
        for (int f = 0; f < 2; f++) {
            const size_t b = fm_fp8mma_smem_bytes(k, f ? FM_FORMAT_NVFP4 : FM_FORMAT_MXFP4);
            if (k < FM_FP8MMA_STAGED16) assert_int_equal(b, 0);
            else if (k < FM_FP8MMA_WG32) assert_true(b > 0 && b <= 101376); /* every target's */
            else assert_true(b > 0 && b <= 232448); /* sm_90's opt-in limit (227 KB) */
            if (k >= FM_FP8MMA_STAGED16) printf("  %s kernel %d %s: %zu B of shared memory\n", k < FM_FP8MMA_WG32 ? "staged" : "wgmma", k, f ? "nvfp4" : "mxfp4", b);
        }
    unsigned char *base = (unsigned char *)(uintptr_t)0x10000000u; /* (5): never read */
    fm_fp8mma_args a = {.wq = base, .wexp = base, .xq = base, .xs = (const float *)base, .wsp = base,
                        .offsets = (const int32_t *)base, .y = (float *)base, .E = 2, .N = 32, .K = 128, .ldx = 128,
                        .ldxs = 1, .max_rows = 8, .kernel = FM_FP8MMA_STAGED32};
    fm_fp8mma_args b = a;
    b.wsp = NULL, assert_int_equal(fm_fp8mma_launch(&b, NULL), (int)cudaErrorInvalidValue);
    b = a, b.wsp = base + 8, assert_int_equal(fm_fp8mma_launch(&b, NULL), (int)cudaErrorMisalignedAddress);
    b = a, b.xq = base + 4, assert_int_equal(fm_fp8mma_launch(&b, NULL), (int)cudaErrorMisalignedAddress);
    b = a, b.ldx = 136, assert_int_equal(fm_fp8mma_launch(&b, NULL), (int)cudaErrorMisalignedAddress);
    b = a, b.kernel = FM_FP8MMA_KERNELS, assert_int_equal(fm_fp8mma_launch(&b, NULL), (int)cudaErrorInvalidValue);
    /* the FP8 rows of a dispatch (fm_fp8_rows_launch): 16-byte codes, whole 16-byte pieces; the
     * refusals come before any CUDA call (nothing here is launched) */
    const int32_t *perm = (const int32_t *)base;
    float         *fs = (float *)base;
    assert_int_equal(fm_fp8_rows_launch(base, fs, perm, 0, NULL, 256, base, 256, fs, 2, NULL, NULL), 0); /* no rows */
    assert_int_equal(fm_fp8_rows_launch(NULL, fs, perm, 4, NULL, 256, base, 256, fs, 2, NULL, NULL),
                     (int)cudaErrorInvalidValue);
    assert_int_equal(fm_fp8_rows_launch(base, fs, NULL, 4, NULL, 256, base, 256, fs, 2, NULL, NULL),
                     (int)cudaErrorInvalidValue);
    assert_int_equal(fm_fp8_rows_launch(base, fs, perm, 4, NULL, 200, base, 256, fs, 2, NULL, NULL),
                     (int)cudaErrorInvalidValue); /* n % 16 */
    assert_int_equal(fm_fp8_rows_launch(base, fs, perm, 4, NULL, 256, base, 264, fs, 2, NULL, NULL),
                     (int)cudaErrorInvalidValue); /* ldq % 16 */
    assert_int_equal(fm_fp8_rows_launch(base, fs, perm, 4, NULL, 256, base, 256, fs, 1, NULL, NULL),
                     (int)cudaErrorInvalidValue); /* 2 scales a row */
    assert_int_equal(fm_fp8_rows_launch(base + 4, fs, perm, 4, NULL, 256, base, 256, fs, 2, NULL, NULL),
                     (int)cudaErrorMisalignedAddress);
    assert_int_equal(fm_fp8_rows_launch(base, fs, perm, 4, NULL, 256, base + 8, 256, fs, 2, NULL, NULL),
                     (int)cudaErrorMisalignedAddress);
    assert_int_equal(fm_fp8_rows_launch(base, (float *)(base + 2), perm, 4, NULL, 256, base, 256, fs, 2, NULL, NULL),
                     (int)cudaErrorMisalignedAddress);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fp8pack_decode), cmocka_unit_test(test_fp8pipe_decode),
                                       cmocka_unit_test(test_fp8pack_refusals),
                                       cmocka_unit_test(test_fp8_launch_refusals),
                                       cmocka_unit_test(test_fp8_staged_host)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
