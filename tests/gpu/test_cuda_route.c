/* test_cuda_route.c - routing on the device (src/cuda/route.cu) against
 * the CPU functions it replaces, step by step, for many configurations:
 *   logits   fm_moe_router_logits_launch vs fm_moe_router_logits: BIT-EXACT
 *            (same products, same 8 partial sums, same fold, no FMA);
 *   route    fm_moe_route_launch vs fm_moe_route on the same logits: ids EXACT;
 *            weights BIT-EXACT for every token whose libm expf agrees with the
 *            correctly rounded exp at all of its arguments (checked here, per
 *            token, with the host's expf), else within 16 ulp (relative 2e-6;
 *            a wrong expert or normalisation is off by far more): the device
 *            computes exp correctly rounded, glibc's expf misses that in ~4e-4
 *            of inputs (0.502 ulp bound); a 1-ulp score moves the softmax sum,
 *            the quotient and the scaled weight by a few roundings;
 *   permute  fm_moe_permute_launch vs fm_moe_permute: offsets, perm, row_token,
 *            row_weight, token_slots EXACT;
 *   chain    device logits -> route -> permute vs fm_moe_route_tokens' steps.
 * E = 8, 32, 256; top_k 1, 2, 8; groups on/off; softmax/sigmoid; bias on/off;
 * T = 1, 3, 64, 1000; adversarial ties (duplicated router rows + biases, across
 * warp lanes and groups; all-equal logits); NaN/Inf logits flagged at the first
 * index; the logits kernels (the oneshot ones included) at odd shapes and with NaN/Inf
 * inputs (the CPU's class: NaN, the same infinity, finite bits). Fresh random inputs (seed printed, FM_SEED replays), outputs poisoned
 * before every run. */
#include <math.h>

#include "gpu_common.h"

#include "cuda/moe_kernels.h"
#include "moe/moe_internal.h"

static uint32_t f32_bits(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}

/* Distance in ulps of two finite floats of the same sign (UINT32_MAX otherwise). */
static uint32_t ulp_diff(float a, float b)
{
    if (a == b) return 0;
    uint32_t ua = f32_bits(a), ub = f32_bits(b);
    if ((ua ^ ub) >> 31 || !isfinite(a) || !isfinite(b)) return UINT32_MAX;
    return ua > ub ? ua - ub : ub - ua;
}

/* 1 when the host's expf is correctly rounded at v (the device's exp is). */
static int expf_is_cr(float v)
{
    float a = expf(v), b = (float)exp((double)v);
    return f32_bits(a) == f32_bits(b);
}

/* 1 when every expf the CPU router evaluates for this token is correctly rounded. */
static int token_expf_clean(const fm_moe_config *c, const float *lg)
{
    int   E = c->n_experts;
    float mx = lg[0];
    for (int e = 1; e < E; e++) mx = lg[e] > mx ? lg[e] : mx;
    for (int e = 0; e < E; e++)
        if (!expf_is_cr(c->score == FM_SCORE_SOFTMAX ? lg[e] - mx : -lg[e])) return 0;
    return 1;
}

static long g_oneshot_runs; /* check_logits calls where a oneshot kernel really ran */

typedef struct {
    long cases, tokens, tokens_exact, weights_off_by_ulp;
    uint32_t max_ulp;
} route_tally;

static route_tally g_tally;
static long        g_fused_runs; /* fm_moe_route_fused_launch checks that ran (run_case) */

/* Device routing of `logits` vs fm_moe_route; returns nothing, asserts. */
static void check_route(const fm_moe_config *c, const float *bias, const float *logits, int T, const char *what)
{
    const int E = c->n_experts, K = c->top_k, R = T * K;
    int32_t  *ids = malloc(sizeof(int32_t) * R), *gids = malloc(sizeof(int32_t) * R);
    float    *wts = malloc(sizeof(float) * R), *gwts = malloc(sizeof(float) * R);
    assert_int_equal(fm_moe_route(c, bias, logits, T, ids, wts), FM_OK);

    float *dlog = dev_upload(logits, sizeof(float) * (size_t)T * E);
    float *dbias = bias ? dev_upload(bias, sizeof(float) * E) : NULL;
    int32_t *dids;
    float   *dwts;
    void    *dscr;
    unsigned long long *dbad, bad = 0;
    CK(cudaMalloc((void **)&dids, sizeof(int32_t) * R));
    CK(cudaMalloc((void **)&dwts, sizeof(float) * R));
    CK(cudaMalloc(&dscr, fm_moe_route_scratch_bytes(c, T)));
    CK(cudaMalloc((void **)&dbad, sizeof bad));
    CK(cudaMemset(dids, 0xA5, sizeof(int32_t) * R)); /* poison: ids 0xA5A5A5A5 (negative) */
    CK(cudaMemset(dwts, 0xFF, sizeof(float) * R));   /* weights NaN */
    CK(cudaMemset(dscr, 0xFF, fm_moe_route_scratch_bytes(c, T)));
    CK(cudaMemset(dbad, 0, sizeof bad));
    assert_int_equal(fm_moe_route_launch(c, dbias, dlog, T, dids, dwts, dscr, dbad, NULL), 0);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(gids, dids, sizeof(int32_t) * R, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gwts, dwts, sizeof(float) * R, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&bad, dbad, sizeof bad, cudaMemcpyDeviceToHost));
    if (bad != ~0ull) fail_msg("%s: finite logits flagged as bad at %llu", what, bad);

    for (int t = 0; t < T; t++) {
        const int32_t *ci = ids + (size_t)t * K, *gi = gids + (size_t)t * K;
        for (int j = 0; j < K; j++)
            if (ci[j] != gi[j]) {
                fprintf(stderr, "%s: token %d: ids differ at slot %d\n  cpu:", what, t, j);
                for (int i = 0; i < K; i++) fprintf(stderr, " %d", ci[i]);
                fprintf(stderr, "\n  gpu:");
                for (int i = 0; i < K; i++) fprintf(stderr, " %d", gi[i]);
                fprintf(stderr, "\n");
                fail_msg("%s: device routing chose other experts (token %d)", what, t);
            }
        int exact_expected = token_expf_clean(c, logits + (size_t)t * E), exact = 1;
        for (int j = 0; j < K; j++) {
            float    a = wts[(size_t)t * K + j], b = gwts[(size_t)t * K + j];
            uint32_t d = ulp_diff(a, b);
            if (d) exact = 0;
            if (d > g_tally.max_ulp) g_tally.max_ulp = d;
            if (d) g_tally.weights_off_by_ulp++;
            if ((exact_expected && d) || d > 16)
                fail_msg("%s: token %d slot %d weight gpu %a cpu %a (%u ulp; token's expf %s)", what, t, j, (double)b,
                         (double)a, d, exact_expected ? "correctly rounded: must be bit-exact" : "not CR: <= 16 ulp");
        }
        g_tally.tokens++;
        g_tally.tokens_exact += exact;
    }
    g_tally.cases++;
    cudaFree(dlog);
    cudaFree(dbias);
    cudaFree(dids);
    cudaFree(dwts);
    cudaFree(dscr);
    cudaFree(dbad);
    free(ids);
    free(gids);
    free(wts);
    free(gwts);
}

/* Device permutation of ids/weights vs fm_moe_permute + the derived arrays. */
static void check_permute(const int32_t *ids, const float *wts, int T, int K, int E, const char *what)
{
    const int R = T * K;
    int32_t  *off = malloc(sizeof(int32_t) * (E + 1)), *perm = malloc(sizeof(int32_t) * R);
    int32_t  *goff = malloc(sizeof(int32_t) * (E + 1)), *gperm = malloc(sizeof(int32_t) * R);
    int32_t  *gslot = malloc(sizeof(int32_t) * R), *gtok = malloc(sizeof(int32_t) * R);
    float    *grw = malloc(sizeof(float) * R);
    assert_int_equal(fm_moe_permute(ids, T, K, E, off, perm), FM_OK);
    int32_t *dids = dev_upload(ids, sizeof(int32_t) * R), *doff, *dperm, *dslot, *dtok;
    float   *dw = dev_upload(wts, sizeof(float) * R), *drw;
    CK(cudaMalloc((void **)&doff, sizeof(int32_t) * (E + 1)));
    CK(cudaMalloc((void **)&dperm, sizeof(int32_t) * R));
    CK(cudaMalloc((void **)&dslot, sizeof(int32_t) * R));
    CK(cudaMalloc((void **)&dtok, sizeof(int32_t) * R));
    CK(cudaMalloc((void **)&drw, sizeof(float) * R));
    CK(cudaMemset(doff, 0xA5, sizeof(int32_t) * (E + 1))); /* poison everything */
    CK(cudaMemset(dperm, 0xA5, sizeof(int32_t) * R));
    CK(cudaMemset(dslot, 0xA5, sizeof(int32_t) * R));
    CK(cudaMemset(dtok, 0xA5, sizeof(int32_t) * R));
    CK(cudaMemset(drw, 0xFF, sizeof(float) * R));
    void *pscr = NULL; /* the chunked placement's per-chunk counts */
    CK(cudaMalloc(&pscr, fm_moe_permute_scratch_bytes(T, K, E) + 4));
    int32_t *dact = NULL, *gact = malloc(sizeof(int32_t) * (E + 1));
    CK(cudaMalloc((void **)&dact, sizeof(int32_t) * (E + 1)));
    CK(cudaMemset(dact, 0xA5, sizeof(int32_t) * (E + 1)));
    assert_int_equal(fm_moe_permute_launch(dids, dw, T, K, E, 0, E, doff, dperm, dslot, drw, dtok, pscr, NULL, NULL,
                                           dact, NULL),
                     0);
    CK(cudaDeviceSynchronize());
    /* the active list: the experts with rows, ascending; from both permutation paths
     * (per-chunk counts; no scratch: count + scan + place kernels) */
    for (int pass = 0; pass < 2; pass++) {
        CK(cudaMemcpy(gact, dact, sizeof(int32_t) * (E + 1), cudaMemcpyDeviceToHost));
        int n = 0;
        for (int e = 0; e < E; e++)
            if (off[e + 1] > off[e]) {
                if (n >= gact[0] || gact[1 + n] != e) fail_msg("%s: active list[%d] (of %d) != expert %d", what, n, gact[0], e);
                n++;
            }
        if (gact[0] != n) fail_msg("%s: active list holds %d experts, %d have rows", what, gact[0], n);
        if (pass) break;
        CK(cudaMemset(dact, 0xA5, sizeof(int32_t) * (E + 1)));
        assert_int_equal(fm_moe_permute_launch(dids, dw, T, K, E, 0, E, doff, dperm, dslot, drw, dtok, NULL, NULL,
                                               NULL, dact, NULL),
                         0);
        CK(cudaDeviceSynchronize());
    }
    cudaFree(dact);
    free(gact);
    CK(cudaMemcpy(goff, doff, sizeof(int32_t) * (E + 1), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gperm, dperm, sizeof(int32_t) * R, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gslot, dslot, sizeof(int32_t) * R, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gtok, dtok, sizeof(int32_t) * R, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(grw, drw, sizeof(float) * R, cudaMemcpyDeviceToHost));
    for (int e = 0; e <= E; e++)
        if (off[e] != goff[e]) fail_msg("%s: offsets[%d] gpu %d cpu %d", what, e, goff[e], off[e]);
    for (int p = 0; p < R; p++) {
        if (perm[p] != gperm[p]) fail_msg("%s: perm[%d] gpu %d cpu %d", what, p, gperm[p], perm[p]);
        if (gtok[p] != perm[p] / K) fail_msg("%s: row_token[%d] gpu %d want %d", what, p, gtok[p], perm[p] / K);
        if (f32_bits(grw[p]) != f32_bits(wts[perm[p]]))
            fail_msg("%s: row_weight[%d] gpu %a want %a", what, p, (double)grw[p], (double)wts[perm[p]]);
        if (gslot[perm[p]] != p) fail_msg("%s: token_slots[%d] gpu %d want %d", what, perm[p], gslot[perm[p]], p);
    }
    cudaFree(dids);
    cudaFree(dw);
    cudaFree(doff);
    cudaFree(dperm);
    cudaFree(dslot);
    cudaFree(pscr);
    cudaFree(dtok);
    cudaFree(drw);
    free(off);
    free(perm);
    free(goff);
    free(gperm);
    free(gslot);
    free(gtok);
    free(grw);
}

/* Device logits vs fm_moe_router_logits, bit for bit, from every kernel (the layer's
 * dispatch last); returns the device logits (caller frees). */
static float *check_logits(const fm_moe_config *c, const float *router, const uint16_t *x, int T, const char *what)
{
    const int E = c->n_experts, H = c->hidden;
    float    *ref = malloc(sizeof(float) * (size_t)T * E), *got = malloc(sizeof(float) * (size_t)T * E);
    fm_moe_router_logits(c, router, x, T, ref);
    uint16_t *dx = dev_upload(x, sizeof(uint16_t) * (size_t)T * H);
    float    *dw = dev_upload(router, sizeof(float) * (size_t)E * H), *dl;
    CK(cudaMalloc((void **)&dl, sizeof(float) * (size_t)T * E));
    const int kinds[] = {FM_ROUTER_WARP16, FM_ROUTER_WARP48, FM_ROUTER_TILED,   FM_ROUTER_STAGED,
                         FM_ROUTER_ONESHOT, FM_ROUTER_ONESHOT4, FM_ROUTER_AUTO};
    const char *const names[] = {"warp16", "warp48", "tiled", "staged", "oneshot", "oneshot4", "auto"};
    for (int ki = 0; ki < (int)(sizeof kinds / sizeof kinds[0]); ki++) {
        if (kinds[ki] == FM_ROUTER_ONESHOT || kinds[ki] == FM_ROUTER_ONESHOT4) {
            const int ran = fm_moe_router_logits_kind(dx, dw, T, E, H, kinds[ki]);
            if (ran == kinds[ki]) g_oneshot_runs++;
            else if (H % 8 == 0 && H <= 6144 && T <= 2) /* 74-99 KB: every device fp4moe runs on has it */
                fail_msg("%s H=%d: the %s kernel fell back to kind %d", what, H, names[ki], ran);
        }
        CK(cudaMemset(dl, 0xFF, sizeof(float) * (size_t)T * E)); /* NaN poison */
        if (kinds[ki] == FM_ROUTER_AUTO)
            assert_int_equal(fm_moe_router_logits_launch(dx, dw, T, E, H, dl, NULL), 0);
        else
            assert_int_equal(fm_moe_router_logits_launch_kind(dx, dw, T, E, H, dl, NULL, kinds[ki]), 0);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(got, dl, sizeof(float) * (size_t)T * E, cudaMemcpyDeviceToHost));
        /* NaN: any NaN (payloads differ between x86 and the GPU), except the poison's bits
         * 0xFFFFFFFF (GPU arithmetic gives 0x7FFFFFFF): a logit left unwritten stays a failure
         * where the CPU's is NaN */
        for (size_t i = 0; i < (size_t)T * E; i++)
            if (f32_bits(got[i]) != f32_bits(ref[i]) &&
                !(isnan(got[i]) && isnan(ref[i]) && f32_bits(got[i]) != 0xFFFFFFFFu))
                fail_msg("%s H=%d, %s kernel: logit [%zu][%zu] gpu %a cpu %a (must be bit-identical)", what, H,
                         names[ki], i / E, i % E, (double)got[i], (double)ref[i]);
    }
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(dl);
    free(ref);
    return got;
}

/* One configuration: random inputs with duplicated router rows (exact logit
 * ties across lanes and groups), every step checked, then the chain. */
/* The fused launch's ids / weights (fids, fw) = the two launches' (ids, w), slot by slot, bit for bit */
static void fused_route_equals(const char *what, int R, const int32_t *fids, const float *fw, const int32_t *ids,
                               const float *w)
{
    for (int i = 0; i < R; i++)
        if (fids[i] != ids[i] || memcmp(&fw[i], &w[i], sizeof(float)))
            fail_msg("%s fused: slot %d id %d weight %a, the two launches %d %a", what, i, fids[i], (double)fw[i], ids[i],
                     (double)w[i]);
}

static void run_case(fm_rng *r, int E, int K, int grouped, fm_score_func score, int with_bias, int T, int H)
{
    fm_moe_config c;
    fm_moe_config_default(&c);
    c.n_experts = E;
    c.top_k = K;
    c.hidden = H;
    c.wfmt = FM_FORMAT_BF16; /* no block constraint on H: odd H tests the tails */
    c.score = score;
    c.renormalize = (int)(fm_rng_u64(r) & 1);
    c.routed_scale = (fm_rng_u64(r) & 1) ? 2.5f : 1.0f;
    if (grouped) {
        c.n_group = E / 4 > 8 ? 8 : E / 4; /* 8 -> 2 groups of 4, 32 -> 8 of 4, 256 -> 8 of 32 */
        int gs = E / c.n_group, need = (K + gs - 1) / gs;
        c.topk_group = need > c.n_group / 2 ? need : c.n_group / 2;
    }
    assert_int_equal(fm_moe_config_check(&c), FM_OK);
    char what[160];
    snprintf(what, sizeof what, "E=%d K=%d groups=%d/%d %s bias=%d renorm=%d scale=%g T=%d", E, K, c.n_group,
             c.topk_group, score == FM_SCORE_SOFTMAX ? "softmax" : "sigmoid", with_bias, c.renormalize,
             (double)c.routed_scale, T);

    float    *router = malloc(sizeof(float) * (size_t)E * H), *bias = malloc(sizeof(float) * E);
    uint16_t *x = malloc(sizeof(uint16_t) * (size_t)T * H);
    fm_rng_fill_normal(r, router, (size_t)E * H, 0.05f);
    fm_rng_fill_normal(r, bias, (size_t)E, 0.1f);
    for (size_t i = 0; i < (size_t)T * H; i++) x[i] = fm_bf16_encode(fm_rng_normal(r));
    /* adversarial ties: equal rows and biases give equal logits and scores */
    const int pairs[][2] = {{1, 2}, {0, E - 1}, {3, 3 + 32}, {5, 5 + 64}, {E / 2 - 1, E / 2}};
    for (size_t i = 0; i < FM_ARRAY_LEN(pairs); i++) {
        int a = pairs[i][0], b = pairs[i][1];
        if (b >= E || a == b) continue;
        memcpy(router + (size_t)b * H, router + (size_t)a * H, sizeof(float) * H);
        bias[b] = bias[a];
    }
    const float *bp = with_bias ? bias : NULL;

    float *logits = check_logits(&c, router, x, T, what);
    check_route(&c, bp, logits, T, what);

    /* chain: device logits -> device route -> device permute, vs the CPU steps
     * of fm_moe_route_tokens (logits are bit-identical, so all must match) */
    const int R = T * K;
    int32_t  *ids = malloc(sizeof(int32_t) * R);
    float    *wts = malloc(sizeof(float) * R);
    assert_int_equal(fm_moe_route(&c, bp, logits, T, ids, wts), FM_OK);
    check_permute(ids, wts, T, K, E, what);

    uint16_t *dx = dev_upload(x, sizeof(uint16_t) * (size_t)T * H);
    float    *dw = dev_upload(router, sizeof(float) * (size_t)E * H), *dbias = bp ? dev_upload(bp, sizeof(float) * E) : NULL;
    float    *dl, *dwts, *drw;
    int32_t  *dids, *doff, *dperm, *dslot;
    void     *dscr;
    unsigned long long *dbad;
    CK(cudaMalloc((void **)&dl, sizeof(float) * (size_t)T * E));
    CK(cudaMalloc((void **)&dwts, sizeof(float) * R));
    CK(cudaMalloc((void **)&drw, sizeof(float) * R));
    CK(cudaMalloc((void **)&dids, sizeof(int32_t) * R));
    CK(cudaMalloc((void **)&doff, sizeof(int32_t) * (E + 1)));
    CK(cudaMalloc((void **)&dperm, sizeof(int32_t) * R));
    CK(cudaMalloc((void **)&dslot, sizeof(int32_t) * R));
    CK(cudaMalloc(&dscr, fm_moe_route_scratch_bytes(&c, T)));
    void *pscr = NULL; /* the chunked placement's counts */
    CK(cudaMalloc(&pscr, fm_moe_permute_scratch_bytes(T, K, E) + 4));
    CK(cudaMalloc((void **)&dbad, sizeof *dbad));
    CK(cudaMemset(doff, 0xA5, sizeof(int32_t) * (E + 1)));
    CK(cudaMemset(dperm, 0xA5, sizeof(int32_t) * R));
    assert_int_equal(fm_moe_router_logits_launch(dx, dw, T, E, H, dl, NULL), 0);
    assert_int_equal(fm_moe_route_launch(&c, dbias, dl, T, dids, dwts, dscr, dbad, NULL), 0);
    assert_int_equal(fm_moe_permute_launch(dids, dwts, T, K, E, 0, E, doff, dperm, dslot, drw, NULL, pscr, NULL, NULL, NULL,
                                           NULL),
                     0);
    CK(cudaDeviceSynchronize());
    int32_t *off = malloc(sizeof(int32_t) * (E + 1)), *perm = malloc(sizeof(int32_t) * R);
    int32_t *goff = malloc(sizeof(int32_t) * (E + 1)), *gperm = malloc(sizeof(int32_t) * R);
    assert_int_equal(fm_moe_permute(ids, T, K, E, off, perm), FM_OK);
    CK(cudaMemcpy(goff, doff, sizeof(int32_t) * (E + 1), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gperm, dperm, sizeof(int32_t) * R, cudaMemcpyDeviceToHost));
    for (int e = 0; e <= E; e++)
        if (goff[e] != off[e]) fail_msg("%s chain: offsets[%d] gpu %d cpu %d", what, e, goff[e], off[e]);
    for (int p = 0; p < R; p++)
        if (gperm[p] != perm[p]) fail_msg("%s chain: perm[%d] gpu %d cpu %d", what, p, gperm[p], perm[p]);

    /* the fused launch (T <= 4, where the oneshot logits kernel applies): the same logits, ids,
     * weights and bad word as the two launches above, bit for bit, twice (its ticket must be
     * back at 0 after each), from poisoned outputs and a bad word that says "index 0" */
    if (T <= 4) {
        int32_t *gids = malloc(sizeof(int32_t) * R), *fids = malloc(sizeof(int32_t) * R);
        float   *gwts = malloc(sizeof(float) * R), *fwts = malloc(sizeof(float) * R);
        float   *fl = malloc(sizeof(float) * (size_t)T * E);
        unsigned *dtk, tk = 1;
        CK(cudaMemcpy(gids, dids, sizeof(int32_t) * R, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(gwts, dwts, sizeof(float) * R, cudaMemcpyDeviceToHost));
        CK(cudaMalloc((void **)&dtk, sizeof *dtk));
        CK(cudaMemset(dtk, 0, sizeof *dtk));
        for (int rep = 0; rep < 2; rep++) {
            unsigned long long gbad = 0;
            CK(cudaMemset(dl, 0xFF, sizeof(float) * (size_t)T * E));
            CK(cudaMemset(dids, 0xFF, sizeof(int32_t) * R));
            CK(cudaMemset(dwts, 0xFF, sizeof(float) * R));
            CK(cudaMemset(dbad, 0, sizeof *dbad));
            const int rc = fm_moe_route_fused_launch(&c, dbias, dx, dw, T, dl, dids, dwts, dbad, dtk, NULL);
            if (rc == -1) break; /* not its case (H % 8, shared memory): the two launches are the path */
            assert_int_equal(rc, 0);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(fl, dl, sizeof(float) * (size_t)T * E, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(fids, dids, sizeof(int32_t) * R, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(fwts, dwts, sizeof(float) * R, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(&gbad, dbad, sizeof gbad, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(&tk, dtk, sizeof tk, cudaMemcpyDeviceToHost));
            if (tk != 0) fail_msg("%s fused: ticket %u after the launch (expected 0)", what, tk);
            if (gbad != ~0ull) fail_msg("%s fused: bad word %llu (finite logits: expected none)", what, gbad);
            if (memcmp(fl, logits, sizeof(float) * (size_t)T * E))
                fail_msg("%s fused: logits differ from the CPU's", what);
            fused_route_equals(what, R, fids, fwts, gids, gwts);
            g_fused_runs++;
        }
        cudaFree(dtk);
        free(gids);
        free(fids);
        free(gwts);
        free(fwts);
        free(fl);
    }

    cudaFree(dx);
    cudaFree(dw);
    cudaFree(dbias);
    cudaFree(dl);
    cudaFree(dwts);
    cudaFree(drw);
    cudaFree(dids);
    cudaFree(doff);
    cudaFree(dperm);
    cudaFree(dslot);
    cudaFree(pscr);
    cudaFree(dscr);
    cudaFree(dbad);
    free(off);
    free(perm);
    free(goff);
    free(gperm);
    free(ids);
    free(wts);
    free(logits);
    free(router);
    free(bias);
    free(x);
}

static void test_route_matrix(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed());
    memset(&g_tally, 0, sizeof g_tally);
    const int Es[] = {8, 32, 256}, Ks[] = {1, 2, 8}, Ts[] = {1, 3, 64, 1000};
    for (size_t ie = 0; ie < FM_ARRAY_LEN(Es); ie++)
        for (size_t ik = 0; ik < FM_ARRAY_LEN(Ks); ik++)
            for (int grouped = 0; grouped < 2; grouped++)
                for (int sc = 0; sc < 2; sc++)
                    for (int b = 0; b < 2; b++)
                        for (size_t it = 0; it < FM_ARRAY_LEN(Ts); it++) {
                            /* H: short, odd (tails of the 32-wide step and of the 8 chains), or GLM-5's 6144 once */
                            int H = 1 + (int)(fm_rng_u64(&r) % 300);
                            if (fm_rng_u64(&r) & 1) H = (H + 7) / 8 * 8; /* the staged kernel's H % 8 == 0 */
                            if (Es[ie] == 32 && Ks[ik] == 8 && it == 2 && !grouped && b && sc) H = 6144;
                            run_case(&r, Es[ie], Ks[ik], grouped, sc ? FM_SCORE_SIGMOID : FM_SCORE_SOFTMAX, b, Ts[it],
                                     H);
                        }
    printf("# route: %ld cases, %ld tokens, %ld with bit-exact weights; %ld weights off (max %u ulp, tokens where "
           "libm expf is not correctly rounded)\n",
           g_tally.cases, g_tally.tokens, g_tally.tokens_exact, g_tally.weights_off_by_ulp, g_tally.max_ulp);
    printf("# route: the fused launch (logits + routing, T <= 4) ran in %ld of the checks\n", g_fused_runs);
    assert_true(g_fused_runs > 0);
}

/* A logits-only config (E experts, top-1, hidden H, BF16 weights: no block constraint on H) and
 * random router rows and token rows (the caller frees both) */
static void logits_inputs(fm_rng *r, int E, int T, int H, fm_moe_config *c, float **router, uint16_t **x)
{
    fm_moe_config_default(c);
    c->n_experts = E;
    c->top_k = 1;
    c->hidden = H;
    c->wfmt = FM_FORMAT_BF16;
    *router = malloc(sizeof(float) * (size_t)E * H);
    *x = malloc(sizeof(uint16_t) * (size_t)T * H);
    assert_non_null(*router);
    assert_non_null(*x);
    fm_rng_fill_normal(r, *router, (size_t)E * H, 0.05f);
    for (size_t j = 0; j < (size_t)T * H; j++) (*x)[j] = fm_bf16_encode(fm_rng_normal(r));
}

/* Many experts: route_kernel keeps a warp's working set in shared memory where 4 warps' fit in
 * 48 KB (E <= ~1,300) and in global scratch above; the matrix reaches only the first. E = 2,048
 * (74 KB for 4 warps: the global path) and 1,024 (37 KB: shared), plain and grouped, softmax
 * and sigmoid, T past one CTA of 4 warps. */
static void test_route_many_experts(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0x5eedu);
    memset(&g_tally, 0, sizeof g_tally);
    const int Es[] = {1024, 2048};
    for (size_t ie = 0; ie < FM_ARRAY_LEN(Es); ie++)
        for (int grouped = 0; grouped < 2; grouped++)
            for (int sc = 0; sc < 2; sc++)
                run_case(&r, Es[ie], 8, grouped, sc ? FM_SCORE_SIGMOID : FM_SCORE_SOFTMAX, 1, 5, 64);
    printf("# route, many experts: %ld cases, %ld tokens, %ld with bit-exact weights\n", g_tally.cases,
           g_tally.tokens, g_tally.tokens_exact);
}

/* The logits kernels at shapes the matrix does not reach: an odd E (the staged and oneshot
 * kernels' expert pairs, the tiled kernel's 32-expert tiles cut), a last slice shorter than the
 * staged kernel's 1,024, x and router rows not 16-byte aligned (its fallback), T not a
 * multiple of any tile; for the oneshot kernels T = 1-4 at GLM-5's 6,144 and around it
 * (H / 8 not a multiple of their 16-wide blocks: 6,136 = 767 x 8; fewer than one block:
 * 24, 8), several token rows of CTAs (T = 5, 9, 17), and H too large for shared memory at
 * 4 tokens (12,288: their fallback, the staged kernel). */
static void test_logits_shapes(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() + 3);
    const long runs0 = g_oneshot_runs;
    const int  shapes[][3] = {{7, 5, 2056},  {1, 1, 8},      {33, 17, 3080}, {256, 2, 6152}, {5, 130, 1028},
                              {3, 9, 6},     {9, 1, 6144},   {257, 2, 6136}, {3, 3, 1032},   {5, 4, 2056},
                              {2, 4, 24},    {1, 2, 136},    {256, 1, 6144}, {256, 4, 6144}, {3, 4, 12288},
                              {3, 1, 12288}, {11, 3, 4104}};
    for (size_t i = 0; i < FM_ARRAY_LEN(shapes); i++) {
        const int     E = shapes[i][0], T = shapes[i][1], H = shapes[i][2];
        fm_moe_config c;
        float        *router;
        uint16_t     *x;
        logits_inputs(&r, E, T, H, &c, &router, &x);
        char what[64];
        snprintf(what, sizeof what, "E=%d T=%d", E, T);
        free(check_logits(&c, router, x, T, what));
        free(router);
        free(x);
    }
    printf("# logits shapes: the oneshot kernels ran in %ld of the checks\n", g_oneshot_runs - runs0);
    assert_true(g_oneshot_runs > runs0);
}

/* NaN / Inf in x or the router: every kernel gives the CPU's logit class (NaN where the CPU
 * has NaN, the same infinity, the same bits where finite); T = 1-4, the oneshot kernels' T. */
static void test_logits_nonfinite(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() + 5);
    const int Ts[] = {1, 2, 3, 4};
    for (size_t it = 0; it < FM_ARRAY_LEN(Ts); it++) {
        const int     E = 5, T = Ts[it], H = 1032;
        fm_moe_config c;
        float        *router;
        uint16_t     *x;
        logits_inputs(&r, E, T, H, &c, &router, &x);
        router[(size_t)1 * H + 100] = NAN;       /* expert 1: NaN for every token */
        router[(size_t)2 * H + 7] = INFINITY;    /* expert 2: +-Inf (x[7] != 0), or NaN (0 x Inf) */
        router[(size_t)3 * H + 1031] = 3.0e38f; /* expert 3: an overflowing product where x is large */
        x[7] = 0;                                /* token 0: 0 x Inf = NaN on expert 2 */
        x[(size_t)(T - 1) * H + 1031] = 0x7F00;  /* the last token: 2^127 x 3e38 = +Inf on expert 3 */
        if (T > 1) x[(size_t)1 * H + 500] = 0xFF80; /* token 1: -Inf x w */
        char what[64];
        snprintf(what, sizeof what, "nonfinite E=%d T=%d", E, T);
        free(check_logits(&c, router, x, T, what));
        free(router);
        free(x);
    }
}

/* Routing of hand-made logits: all equal (every expert ties: the lowest ids,
 * inside the lowest groups, must win), one group of one expert each (gs = 1),
 * and huge-but-finite logits (sigmoid saturates to exact 1.0 and 0.0 ties). */
static void test_route_ties(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() + 7);
    const int Es[] = {8, 32, 256, 300};
    for (size_t ie = 0; ie < FM_ARRAY_LEN(Es); ie++)
        for (int mode = 0; mode < 4; mode++) {
            const int     E = Es[ie], T = 5;
            fm_moe_config c;
            fm_moe_config_default(&c);
            c.n_experts = E;
            c.top_k = E >= 8 ? 8 : E;
            c.hidden = 64;
            c.score = mode & 1 ? FM_SCORE_SOFTMAX : FM_SCORE_SIGMOID;
            if (mode >= 2) { /* groups: E groups of one expert (top-1 group score), or 4 groups */
                c.n_group = mode == 2 ? E : 4;
                int gs = E / c.n_group, need = (c.top_k + gs - 1) / gs;
                c.topk_group = mode == 2 ? (c.top_k + 1 < E ? c.top_k + 1 : E) : (need > 2 ? need : 2);
            }
            c.wfmt = FM_FORMAT_BF16;
            assert_int_equal(fm_moe_config_check(&c), FM_OK);
            float *lg = malloc(sizeof(float) * (size_t)T * E);
            for (int t = 0; t < T; t++)
                for (int e = 0; e < E; e++) {
                    float *v = &lg[(size_t)t * E + e];
                    switch (t) {
                    case 0: *v = 0.0f; break;                              /* all tie */
                    case 1: *v = (e % 3) ? 1.5f : -0.0f; break;            /* tie classes, signed zero */
                    case 2: *v = e % 2 ? 100.0f : -100.0f; break;          /* sigmoid: exact 1.0 / 0.0 */
                    case 3: *v = (float)(e % 5) * 0.25f; break;            /* five tie classes */
                    default: *v = fm_rng_normal(&r); break;                /* one ordinary token */
                    }
                }
            char what[96];
            snprintf(what, sizeof what, "ties E=%d %s groups=%d/%d", E, mode & 1 ? "softmax" : "sigmoid", c.n_group,
                     c.topk_group);
            check_route(&c, NULL, lg, T, what);
            float *bias = malloc(sizeof(float) * E); /* bias in classes too: ties survive it */
            for (int e = 0; e < E; e++) bias[e] = (float)(e % 4) * 0.125f;
            check_route(&c, bias, lg, T, what);
            free(bias);
            free(lg);
        }
}

/* The permutation alone on arbitrary ids (repeats inside a token allowed, as
 * fm_moe_permute allows): every slot on one expert, random, more experts than
 * the scan's 1024-wide step, rows around the 128-slot step of the placement. */
static void test_permute_edges(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() + 11);
    const struct {
        int T, K, E, mode; /* mode 0 random, 1 all on expert E-1, 2 only even experts */
    } cs[] = {{1, 1, 1, 0},     {1, 8, 256, 0},   {16, 8, 8, 0},    {16, 8, 8, 1},   {127, 1, 3, 0},
              {128, 1, 3, 0},   {129, 1, 3, 0},   {43, 3, 2000, 0}, {1000, 8, 256, 2}, {700, 16, 5000, 0},
              {4096, 8, 32, 0}, {8191, 8, 1, 0},  {5, 2, 1025, 1}};
    for (size_t i = 0; i < FM_ARRAY_LEN(cs); i++) {
        const int R = cs[i].T * cs[i].K;
        int32_t  *ids = malloc(sizeof(int32_t) * R);
        float    *w = malloc(sizeof(float) * R);
        for (int s = 0; s < R; s++) {
            int e = (int)(fm_rng_u64(&r) % (uint64_t)cs[i].E);
            if (cs[i].mode == 1) e = cs[i].E - 1;
            if (cs[i].mode == 2) e &= ~1;
            ids[s] = e;
            w[s] = fm_rng_normal(&r);
        }
        char what[64];
        snprintf(what, sizeof what, "permute T=%d K=%d E=%d mode=%d", cs[i].T, cs[i].K, cs[i].E, cs[i].mode);
        check_permute(ids, w, cs[i].T, cs[i].K, cs[i].E, what);
        free(ids);
        free(w);
    }
}

/* A NaN/Inf logit is flagged at the smallest t*E+e, ids stay valid experts. */
static void test_route_nonfinite(void **state)
{
    (void)state;
    fm_moe_config c;
    fm_moe_config_default(&c); /* 32 experts, top-8, sigmoid */
    const int T = 6, E = c.n_experts, K = c.top_k;
    float     lg[6 * 32];
    for (int i = 0; i < T * E; i++) lg[i] = (float)(i % 7) - 3.0f;
    lg[4 * E + 9] = NAN;
    lg[2 * E + 31] = INFINITY;
    lg[5 * E + 0] = -INFINITY;
    int32_t ids[6 * 8];
    float   w[6 * 8];
    assert_int_equal(fm_moe_route(&c, NULL, lg, T, ids, w), FM_ERR_NONFINITE); /* the CPU refuses */
    float   *dlog = dev_upload(lg, sizeof lg);
    int32_t *dids;
    float   *dw;
    void    *dscr;
    unsigned long long *dbad, bad = 0;
    CK(cudaMalloc((void **)&dids, sizeof ids));
    CK(cudaMalloc((void **)&dw, sizeof w));
    CK(cudaMalloc(&dscr, fm_moe_route_scratch_bytes(&c, T)));
    CK(cudaMalloc((void **)&dbad, sizeof bad));
    CK(cudaMemset(dids, 0xA5, sizeof ids));
    assert_int_equal(fm_moe_route_launch(&c, NULL, dlog, T, dids, dw, dscr, dbad, NULL), 0);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(&bad, dbad, sizeof bad, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(ids, dids, sizeof ids, cudaMemcpyDeviceToHost));
    assert_int_equal(bad, (unsigned long long)(2 * E + 31));
    for (int s = 0; s < T * K; s++) assert_in_range(ids[s], 0, E - 1);
    cudaFree(dlog);
    cudaFree(dids);
    cudaFree(dw);
    cudaFree(dscr);
    cudaFree(dbad);
}

/* The fused launch with a non-finite logit: expert 5's router row holds +Inf at k = 3 and
 * token 1's x[3] is 0 (0 x Inf = NaN there, +-Inf elsewhere): the bad word (reset by the
 * fused kernel itself before its routing's atomicMin) is the two launches' smallest t*E + e,
 * and ids / weights are theirs bit for bit; T = 2-4 (token 1 exists). */
static void test_fused_nonfinite(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() + 11);
    long ran = 0;
    for (int T = 2; T <= 4; T++) {
        const int H = 1024;
        fm_moe_config c;
        float        *router;
        uint16_t     *x;
        logits_inputs(&r, 32, T, H, &c, &router, &x);
        c.top_k = 4;
        router[(size_t)5 * H + 3] = INFINITY;
        x[(size_t)1 * H + 3] = 0;
        const int E = c.n_experts, R = T * c.top_k;
        uint16_t *dx = dev_upload(x, sizeof(uint16_t) * (size_t)T * H);
        float    *dw = dev_upload(router, sizeof(float) * (size_t)E * H), *dl, *dwts;
        int32_t  *dids;
        void     *dscr;
        unsigned *dtk;
        unsigned long long *dbad, bad2 = 0, badf = 0;
        CK(cudaMalloc((void **)&dl, sizeof(float) * (size_t)T * E));
        CK(cudaMalloc((void **)&dwts, sizeof(float) * R));
        CK(cudaMalloc((void **)&dids, sizeof(int32_t) * R));
        CK(cudaMalloc(&dscr, fm_moe_route_scratch_bytes(&c, T)));
        CK(cudaMalloc((void **)&dbad, sizeof bad2));
        CK(cudaMalloc((void **)&dtk, sizeof *dtk));
        CK(cudaMemset(dtk, 0, sizeof *dtk));
        int32_t *ids2 = malloc(sizeof(int32_t) * R), *idsf = malloc(sizeof(int32_t) * R);
        float   *w2 = malloc(sizeof(float) * R), *wf = malloc(sizeof(float) * R);
        assert_int_equal(fm_moe_router_logits_launch(dx, dw, T, E, H, dl, NULL), 0);
        assert_int_equal(fm_moe_route_launch(&c, NULL, dl, T, dids, dwts, dscr, dbad, NULL), 0);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(&bad2, dbad, sizeof bad2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(ids2, dids, sizeof(int32_t) * R, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(w2, dwts, sizeof(float) * R, cudaMemcpyDeviceToHost));
        CK(cudaMemset(dids, 0xFF, sizeof(int32_t) * R));
        CK(cudaMemset(dwts, 0xFF, sizeof(float) * R));
        CK(cudaMemset(dbad, 0, sizeof badf));
        const int rc = fm_moe_route_fused_launch(&c, NULL, dx, dw, T, dl, dids, dwts, dbad, dtk, NULL);
        if (rc != -1) {
            assert_int_equal(rc, 0);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(&badf, dbad, sizeof badf, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(idsf, dids, sizeof(int32_t) * R, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(wf, dwts, sizeof(float) * R, cudaMemcpyDeviceToHost));
            assert_true(bad2 != ~0ull); /* the Inf row makes some logit non-finite */
            if (badf != bad2) fail_msg("T=%d fused: bad word %llu, the two launches %llu", T, badf, bad2);
            char tn[16];
            snprintf(tn, sizeof tn, "T=%d", T);
            fused_route_equals(tn, R, idsf, wf, ids2, w2);
            ran++;
        }
        cudaFree(dx);
        cudaFree(dw);
        cudaFree(dl);
        cudaFree(dwts);
        cudaFree(dids);
        cudaFree(dscr);
        cudaFree(dbad);
        cudaFree(dtk);
        free(ids2);
        free(idsf);
        free(w2);
        free(wf);
        free(router);
        free(x);
    }
    assert_true(ran > 0); /* H = 1,024, aligned buffers: the fused kernel's case */
}

int main(void)
{
    fm_test_require_gpu();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route_matrix),
        cmocka_unit_test(test_route_many_experts),
        cmocka_unit_test(test_logits_shapes),
        cmocka_unit_test(test_logits_nonfinite),
        cmocka_unit_test(test_route_ties),
        cmocka_unit_test(test_permute_edges),
        cmocka_unit_test(test_route_nonfinite),
        cmocka_unit_test(test_fused_nonfinite),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
