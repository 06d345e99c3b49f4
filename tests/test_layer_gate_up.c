/* test_layer_gate_up.c - separate gate and up global scales per expert
 * (fm_moe_weights.w13_up_global), as real NVFP4 checkpoints store them, taken as they
 * are on the CPU backends.
 *
 * - cpu-ref and the fast cpu backend (every ISA path it has here: scalar, AVX2,
 *   AVX-512 when the CPU runs them; decode-sized and prefill-sized batches; a shard)
 *   against this file's own float64 model of the layer whose up rows are
 *   e2m1 x E4M3 x g_up and gate rows e2m1 x E4M3 x g_gate: within the CPU bounds of
 *   docs/accuracy.md (reference vs float64 oracle 1e-10, fast vs reference 1e-9).
 * - For contrast, the re-encoded path (the smaller half's block scales re-expressed
 *   against the larger global, fm_w13_one_global: what the loader did before and
 *   the cuda backend did until 2026-12-06) on the same layer: its NMSE against the
 *   model is printed and asserted far larger (and within the old 1e-3 bound);
 *   fm_w13_one_global is checked bit for bit against an independent re-encoding.
 * - Refusals at create and by fm_moe_forward_ref: an up global that is NaN, +-Inf,
 *   0, negative or subnormal, or that makes an up row overflow FP32
 *   (FM_ERR_NONFINITE naming the entry), and up globals for MXFP4 / BF16 weights
 *   (FM_ERR_FORMAT); nothing is made (*out NULL) and the output is left untouched.
 */
#define _POSIX_C_SOURCE 200112L /* setenv */
#include "test_moe_fixture.h"

#include "format/format_internal.h"

#include <float.h>

enum { E = 4, TOPK = 2, H = 128, I = 64, TMAX = 48 };

static double d_e2m1(uint8_t c)
{
    static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return (c & 8) ? -mag[c & 7] : mag[c & 7];
}

static double d_e4m3(uint8_t c)
{
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return s ? -v : v;
}

static double d_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Element [n][k] of an NVFP4 matrix without its global: e2m1 x E4M3, in double. */
static double d_elem(const fm_qtensor *q, int64_t n, int64_t k)
{
    uint8_t byte = ((const uint8_t *)q->data)[n * (q->cols / 2) + k / 2];
    return d_e2m1((k & 1) ? byte >> 4 : byte & 15) * d_e4m3(q->scales[n * (q->cols / 16) + k / 16]);
}

/* out[T][H] of the layer in double under external routing (ids, wts): gate rows times
 * w13's global, up rows times up[e] (NULL: w13's global), SwiGLU, FC2. */
static void model(const fm_qtensor *w13, const fm_qtensor *w2, const float *up, const uint16_t *x, int T,
                  const int32_t *ids, const float *wts, double *out)
{
    double g[2 * I], h[I];
    for (int t = 0; t < T; t++) {
        double *o = out + (size_t)t * H;
        for (int n = 0; n < H; n++) o[n] = 0;
        for (int j = 0; j < TOPK; j++) {
            const int e = ids[t * TOPK + j];
            if (e < 0) continue;
            for (int n = 0; n < 2 * I; n++) {
                double acc = 0;
                for (int k = 0; k < H; k++) acc += d_elem(&w13[e], n, k) * d_bf16(x[(size_t)t * H + k]);
                g[n] = acc * (n >= I && up ? (double)up[e] : (double)w13[e].global_scale);
            }
            for (int i = 0; i < I; i++) h[i] = g[i] / (1.0 + exp(-g[i])) * g[I + i];
            for (int n = 0; n < H; n++) {
                double acc = 0;
                for (int k = 0; k < I; k++) acc += d_elem(&w2[e], n, k) * h[k];
                o[n] += (double)wts[t * TOPK + j] * acc * (double)w2[e].global_scale;
            }
        }
    }
}

/* A layer whose experts' up globals are their w13 global times these factors (expert 3's
 * equal: a split layer may mix both kinds). */
static const float k_up_factor[E] = {1.7f, 0.45f, 0.3f, 1.0f};

static void build(fx_layer *L, fm_rng *r, float *up)
{
    fm_moe_config c = fx_config(E, TOPK, H, I, FM_FORMAT_NVFP4);
    fx_build(L, &c, r, 0, 0);
    for (int e = 0; e < E; e++) up[e] = L->w13[e].global_scale * k_up_factor[e];
    L->w.w13_up_global = up;
}

/* Run backend b on T tokens of x with external routing into out (FP32). */
static void run_layer(fm_backend_kind b, const fm_moe_config *c, const fm_moe_weights *w, const uint16_t *x, int T,
                      const int32_t *ids, const float *wts, float *out)
{
    fm_layer *l = NULL;
    fm_status s = fm_layer_create(b, c, w, TMAX, &l);
    if (s != FM_OK) fail_msg("create: %s: %s", fm_status_name(s), fm_last_error());
    fm_layer_run_args a = {.x = x, .T = T, .topk_ids = ids, .topk_weights = wts, .out = out};
    s = fm_layer_run(l, &a);
    if (s != FM_OK) fail_msg("run: %s: %s", fm_status_name(s), fm_last_error());
    fm_layer_destroy(l);
}

/* fm_w13_one_global against an independent re-encoding: the smaller-global half's codes
 * become E4M3(decode * g_half / g_max), the other half's are copied, global g_max. */
static void check_one_global(const fm_qtensor *w13, float g_up, const fm_qtensor *got)
{
    const float g_gate = w13->global_scale, g = g_gate > g_up ? g_gate : g_up;
    assert_true(got->global_scale == g);
    assert_ptr_equal(got->data, w13->data);
    const size_t half = (size_t)I * (H / 16);
    for (int h = 0; h < 2; h++) {
        const float gh = h ? g_up : g_gate;
        for (size_t i = 0; i < half; i++) {
            const uint8_t c = w13->scales[h * half + i];
            const uint8_t want = gh == g ? c : fm_e4m3_encode(fm_e4m3_decode(c) * (gh / g));
            if (got->scales[h * half + i] != want)
                fail_msg("half %d scale %zu: 0x%02X, want 0x%02X", h, i, got->scales[h * half + i], want);
        }
    }
}

static void test_cpu_vs_model(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed());
    fx_layer L;
    float up[E];
    build(&L, &r, up);
    const fm_moe_config *c = &L.cfg;

    /* the re-encoded weights: one global per w13 (the old loader's / the old cuda backend's) */
    fm_qtensor one[E];
    uint8_t *sc = malloc((size_t)E * 2 * I * (H / 16));
    assert_non_null(sc);
    for (int e = 0; e < E; e++) {
        fm_w13_one_global(&L.w13[e], up[e], sc + (size_t)e * 2 * I * (H / 16), &one[e]);
        check_one_global(&L.w13[e], up[e], &one[e]);
    }
    fm_moe_weights w_one = L.w;
    w_one.w13 = one;
    w_one.w13_up_global = NULL;

    const int Ts[2] = {1, 37}; /* decode-sized (register kernels), prefill-sized (panel kernel) */
    const char *isas[3] = {"scalar", "avx2", NULL};
    const char *saved = getenv("FM_CPU_ISA");
    for (int ti = 0; ti < 2; ti++) {
        const int T = Ts[ti];
        uint16_t *x = fx_aligned(sizeof(uint16_t) * (size_t)T * H);
        for (size_t i = 0; i < (size_t)T * H; i++) x[i] = fm_bf16_encode(fm_rng_normal(&r));
        int32_t ids[TMAX * TOPK];
        float wts[TMAX * TOPK];
        fx_random_routing(&r, T, TOPK, E, 0.05, ids, wts);
        if (T == 1) ids[0] = 0, ids[1] = 2; /* one token: two experts whose globals differ */
        double *want = malloc(sizeof(double) * (size_t)T * H);
        float *ref = fx_aligned(sizeof(float) * (size_t)T * H), *got = fx_aligned(sizeof(float) * (size_t)T * H);
        assert_non_null(want);
        model(L.w13, L.w2, up, x, T, ids, wts, want);

        run_layer(FM_BACKEND_CPU_REF, c, &L.w, x, T, ids, wts, ref);
        const double e_ref = fm_nmse64(ref, want, (size_t)T * H);
        for (int k = 0; k < 3; k++) {
            if (isas[k]) setenv("FM_CPU_ISA", isas[k], 1);
            else if (saved) setenv("FM_CPU_ISA", saved, 1);
            else unsetenv("FM_CPU_ISA");
            run_layer(FM_BACKEND_CPU, c, &L.w, x, T, ids, wts, got);
            const double e_fast = fm_nmse64(got, want, (size_t)T * H);
            printf("  T=%-2d cpu (%s): NMSE vs float64 model %.3g; vs cpu-ref %.3g\n", T, isas[k] ? isas[k] : "best",
                   e_fast, fm_nmse(got, ref, (size_t)T * H));
            assert_true(e_fast <= 1e-10);
            fm_assert_close(got, ref, (size_t)T * H, 1e-9, "cpu vs cpu-ref, split globals");
        }
        if (saved) setenv("FM_CPU_ISA", saved, 1);
        else unsetenv("FM_CPU_ISA");

        /* the re-encoded path on the same layer, for contrast */
        run_layer(FM_BACKEND_CPU_REF, c, &w_one, x, T, ids, wts, got);
        const double e_one = fm_nmse64(got, want, (size_t)T * H);
        printf("  T=%-2d cpu-ref: NMSE vs float64 model: globals as stored %.3g, re-encoded to one global %.3g\n", T,
               e_ref, e_one);
        assert_true(e_ref <= 1e-10);
        /* still the same layer, far from exact: ratios of 0.3 push block scales into E4M3's
         * subnormals, so this can exceed the 1e-3 the re-encoding was held to (seen 6e-4 .. 2e-3) */
        assert_true(e_one <= 1e-2);
        assert_true(e_one > 1e3 * (e_ref + 1e-16));

        /* without the up globals, the layer is another one: the up half 0.3x .. 1.7x off */
        fm_moe_weights w_none = L.w;
        w_none.w13_up_global = NULL;
        run_layer(FM_BACKEND_CPU_REF, c, &w_none, x, T, ids, wts, got);
        assert_true(fm_nmse64(got, want, (size_t)T * H) > 1e-2);
        free(x), free(want), free(ref), free(got);
    }
    free(sc);
    fx_free(&L);
}

/* An expert-parallel shard [1, 3): its experts' up globals from w13_up_global + first. */
static void test_shard(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0x5a4d);
    fx_layer L;
    float up[E];
    build(&L, &r, up);
    enum { T = 9 };
    const int first = 1, n_local = 2;
    uint16_t *x = fx_aligned(sizeof(uint16_t) * (size_t)T * H);
    for (size_t i = 0; i < (size_t)T * H; i++) x[i] = fm_bf16_encode(fm_rng_normal(&r));
    int32_t ids[T * TOPK];
    float wts[T * TOPK];
    fx_random_routing(&r, T, TOPK, E, 0.0, ids, wts);
    /* the model of the shard: only its experts' slots */
    int32_t sids[T * TOPK];
    for (int i = 0; i < T * TOPK; i++) sids[i] = ids[i] >= first && ids[i] < first + n_local ? ids[i] : -1;
    double want[T * H];
    model(L.w13, L.w2, up, x, T, sids, wts, want);
    float *got = fx_aligned(sizeof(float) * (size_t)T * H);
    const fm_backend_kind kinds[2] = {FM_BACKEND_CPU_REF, FM_BACKEND_CPU};
    for (int k = 0; k < 2; k++) {
        fm_layer *l = fx_shard_layer(kinds[k], &L, T, first, n_local, FM_OUT_F32);
        fm_layer_run_args a = {.x = x, .T = T, .topk_ids = ids, .topk_weights = wts, .out = got};
        assert_int_equal(fm_layer_run(l, &a), FM_OK);
        const double e = fm_nmse64(got, want, (size_t)T * H);
        printf("  shard [1, 3) %s: NMSE vs float64 model %.3g\n", k ? "cpu" : "cpu-ref", e);
        assert_true(e <= 1e-10);
        fm_layer_destroy(l);
    }
    free(x), free(got);
    fx_free(&L);
}

static int create_status(fm_backend_kind k, const fm_moe_config *c, const fm_moe_weights *w)
{
    fm_layer *l = (fm_layer *)(uintptr_t)1; /* must come back NULL on failure */
    fm_status s = fm_layer_create(k, c, w, TMAX, &l);
    if (s == FM_OK) fm_layer_destroy(l);
    else assert_null(l);
    return s;
}

static void test_refusals(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0xbad);
    fx_layer L;
    float up[E];
    build(&L, &r, up);
    const fm_moe_config *c = &L.cfg;
    const int T = 3;
    uint16_t *x = fx_aligned(sizeof(uint16_t) * (size_t)T * H);
    for (size_t i = 0; i < (size_t)T * H; i++) x[i] = fm_bf16_encode(fm_rng_normal(&r));
    float *out = fx_aligned(sizeof(float) * (size_t)T * H), *poison = fx_aligned(sizeof(float) * (size_t)T * H);
    fm_poison_f32(poison, (size_t)T * H);
    const fm_backend_kind kinds[2] = {FM_BACKEND_CPU_REF, FM_BACKEND_CPU};
    const float bad[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, -1.0f, 1e-40f, nextafterf(FLT_MIN, 0.0f)};
    const float keep = up[2];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        up[2] = bad[i];
        for (int k = 0; k < 2; k++) {
            assert_int_equal(create_status(kinds[k], c, &L.w), FM_ERR_NONFINITE);
            assert_non_null(strstr(fm_last_error(), "w13_up_global[2] = "));
            assert_non_null(strstr(fm_last_error(), "finite, normal, positive"));
        }
        memcpy(out, poison, sizeof(float) * (size_t)T * H);
        assert_int_equal(fm_moe_forward_ref(c, &L.w, x, T, out), FM_ERR_NONFINITE);
        assert_non_null(strstr(fm_last_error(), "w13_up_global[2] = "));
        assert_memory_equal(out, poison, sizeof(float) * (size_t)T * H);
        assert_true(up[2] == bad[i] || (isnan(up[2]) && isnan(bad[i]))); /* the caller's array untouched */
    }
    /* a finite, normal up global under which an up row decodes to Inf */
    up[2] = 3e38f;
    for (int k = 0; k < 2; k++) {
        assert_int_equal(create_status(kinds[k], c, &L.w), FM_ERR_NONFINITE);
        assert_non_null(strstr(fm_last_error(), "w13[2] (expert 2) up rows: w13_up_global too large"));
    }
    /* the smallest normal up global is taken, and the layer runs */
    up[2] = FLT_MIN;
    for (int k = 0; k < 2; k++) assert_int_equal(create_status(kinds[k], c, &L.w), FM_OK);
    up[2] = keep;
    fx_free(&L);

    /* formats without global scales: an up global is an error, not ignored */
    const fm_format fmts[2] = {FM_FORMAT_MXFP4, FM_FORMAT_BF16};
    for (int f = 0; f < 2; f++) {
        fm_moe_config cf = fx_config(E, TOPK, H, I, fmts[f]);
        fx_build(&L, &cf, &r, 0, 0);
        float ones[E] = {1, 1, 1, 1};
        L.w.w13_up_global = ones;
        for (int k = 0; k < 2; k++) {
            assert_int_equal(create_status(kinds[k], &cf, &L.w), FM_ERR_FORMAT);
            assert_non_null(strstr(fm_last_error(), "w13_up_global"));
        }
        memcpy(out, poison, sizeof(float) * (size_t)T * H);
        assert_int_equal(fm_moe_forward_ref(&cf, &L.w, x, T, out), FM_ERR_FORMAT);
        assert_memory_equal(out, poison, sizeof(float) * (size_t)T * H);
        fx_free(&L);
    }
    free(x), free(out), free(poison);
}

/* Up globals equal to w13's: the same layer as none, bit for bit, on both backends. */
static void test_equal_globals(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0xe9);
    fm_moe_config c = fx_config(E, TOPK, H, I, FM_FORMAT_NVFP4);
    fx_layer L;
    fx_build(&L, &c, &r, 0, 0);
    float up[E];
    for (int e = 0; e < E; e++) up[e] = L.w13[e].global_scale;
    enum { T = 21 };
    uint16_t *x = fx_aligned(sizeof(uint16_t) * (size_t)T * H);
    for (size_t i = 0; i < (size_t)T * H; i++) x[i] = fm_bf16_encode(fm_rng_normal(&r));
    int32_t ids[T * TOPK];
    float wts[T * TOPK];
    fx_random_routing(&r, T, TOPK, E, 0.0, ids, wts);
    float *a = fx_aligned(sizeof(float) * (size_t)T * H), *b = fx_aligned(sizeof(float) * (size_t)T * H);
    const fm_backend_kind kinds[2] = {FM_BACKEND_CPU_REF, FM_BACKEND_CPU};
    for (int k = 0; k < 2; k++) {
        L.w.w13_up_global = NULL;
        run_layer(kinds[k], &c, &L.w, x, T, ids, wts, a);
        L.w.w13_up_global = up;
        run_layer(kinds[k], &c, &L.w, x, T, ids, wts, b);
        assert_memory_equal(a, b, sizeof(float) * (size_t)T * H);
    }
    free(x), free(a), free(b);
    fx_free(&L);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_vs_model),
        cmocka_unit_test(test_shard),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_equal_globals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
