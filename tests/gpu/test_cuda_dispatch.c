/* test_cuda_dispatch.c - fm_layer_run_dispatched on the cuda backend: rows an expert-parallel
 * dispatch left in place, on the device, counts / offsets in device memory.
 *
 * Oracles:
 *  - the cpu-ref backend's fm_layer_run_dispatched on the same rows (host copies): every
 *    received row within the cuda backend's NMSE bound (fm_layer_accuracy: the GPU rounds h
 *    to BF16 before FC2, as in fm_layer_run);
 *  - the cuda layer's own fm_layer_run of the same routing (token order, external routing,
 *    both run the chain with the same bucket plan: max_tokens = T,
 *    so every run here takes the last bucket): with weights, each token's dispatched rows
 *    summed in slot order from 0 (FP32) = its run output bit for bit (both are the FC2
 *    epilogue's weight x row, summed in that order); without weights the combine's weight x
 *    row rounds once more than the epilogue's row x (weight x scale): each unweighted row
 *    times its weight is within 2^-21 relative of the weighted row (plus 1e-30 absolute);
 *  - BF16 output = the FP32 output rounded to nearest even, element by element;
 *  - graph capture + replay = eager, byte for byte over the whole output (unreceived rows
 *    too).
 * Both layouts; NVFP4 and MXFP4 with gpt-oss's biased experts (the epilogues' other path);
 * with and without weights; layer-owned and caller workspace. Every slot of x the dispatch
 * did not fill is a BF16 NaN (a read past counts[e] shows up as a non-finite output or an
 * fm_layer_errors report), the outputs are poisoned (0xFF bytes) before each run, NaN/Inf
 * checked first, and the rows nobody sent must still hold the poison.
 * Then the device's checks: bad counts / offsets (FM_ERR_BAD_SHAPE from fm_layer_errors,
 * bad_experts / first_bad_expert, the bad experts' rows untouched, the good experts' rows
 * still right), more rows than the layer holds or than the args' max_rows, NaN in a received
 * row and weight; max_rows choosing the plan of the rows' own bucket; and the
 * host's refusals (FP8 rows on a W4A16 layer; a W4A8 layer's rows where the build does not
 * enable them; a shared expert). W4A8 layers (per 128 and per token, BF16 rows; per 128, FP8
 * rows quantized on the host by the oracle's rule, every unsent slot a NaN code and scale) go
 * through the same checks where the build enables them (cmake -DFM_CUDA_W4A8_DISPATCH=ON; the
 * W4A8 run quantizes the same rows to the same codes, so the combined rows still equal the
 * layer's own run bit for bit); elsewhere they check the refusal and print SKIP.
 * Compiled without a GPU; skips (exit 77) where there is none. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "fp4moe.h"
#include "gpu_common.h"
#include "test_moe_fixture.h"

enum { POISON = 0xFF }; /* FP32 0xFFFFFFFF: a NaN; BF16 0xFFFF: a NaN */

/* 32 experts top-4, hidden 256, inter 128; 40 tokens; the shard of experts 8..15 */
enum { E = 32, K = 4, H = 256, I = 128, T = 40, FIRST = 8, NL = 8 };

static fm_cuda_device *g_dev;

static void *dmalloc(size_t n)
{
    void *p = NULL;
    CK(cudaMalloc(&p, n ? n : 16));
    return p;
}

/* Host -> device, then wait (a pageable cudaMemcpy may return before its DMA lands, and the
 * test's non-blocking stream does not wait for the legacy stream) */
static void h2d(void *dst, const void *src, size_t bytes)
{
    CK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
}

/* The shard [first, first + nl) of L on backend b; cuda: the test's device, caller workspace
 * when cw. */
static fm_layer *make(fm_backend_kind b, const fx_layer *L, int max_tokens, int first, int nl, fm_out_dtype od, int cw)
{
    fm_moe_weights w = L->w;
    w.w13 = L->w13 + first;
    w.w2 = L->w2 + first;
    if (w.w13_bias) w.w13_bias += (size_t)first * 2 * L->cfg.inter;
    if (w.w2_bias) w.w2_bias += (size_t)first * L->cfg.hidden;
    fm_layer_desc d = {.backend = b, .device = b == FM_BACKEND_CUDA ? g_dev : NULL, .max_tokens = max_tokens,
                       .out_dtype = od, .first_expert = first, .n_local = nl,
                       .caller_workspace = b == FM_BACKEND_CUDA && cw,
                       /* the chain: the dispatched rows run it, and the token-order run they are
                        * compared with bit for bit must too */
                       .decode_path = FM_DECODE_PATH_OFF};
    fm_layer *l = NULL;
    fm_status s = fm_layer_create_desc(&d, &L->cfg, &w, &l);
    if (s != FM_OK) fail_msg("create %s: %s: %s", fm_backend_name(b), fm_status_name(s), fm_last_error());
    return l;
}

/* A dispatch of one routing to the shard [first, first + nl), on the host (as
 * tests/test_layer_dispatch.c builds it): rows in token order, then slot order, per expert;
 * every unfilled slot of x a BF16 NaN, of w a NaN. where[t*K + j]: the row of slot (t, j). */
typedef struct {
    fm_dispatch_layout layout;
    int                nl, cap, rows;
    size_t             slots; /* rows of x / out in the layout */
    int32_t           *counts, *offsets, *where;
    uint16_t          *x;
    float             *w;
} dispatch;

static void dispatch_make(dispatch *d, fm_dispatch_layout layout, const uint16_t *x, const int32_t *ids,
                          const float *wts, int first, int nl)
{
    memset(d, 0, sizeof *d);
    d->layout = layout;
    d->nl = nl;
    d->cap = T + 2; /* a token reaches an expert once */
    d->counts = calloc((size_t)nl, sizeof(int32_t));
    d->offsets = calloc((size_t)nl + 1, sizeof(int32_t));
    d->where = malloc(sizeof(int32_t) * T * K);
    assert_true(d->counts && d->offsets && d->where);
    for (int i = 0; i < T * K; i++)
        if (ids[i] >= first && ids[i] < first + nl) d->counts[ids[i] - first]++;
    for (int e = 0; e < nl; e++) d->offsets[e + 1] = d->offsets[e] + d->counts[e];
    d->rows = d->offsets[nl];
    d->slots = layout == FM_DISPATCH_EXPERT_MAJOR ? (size_t)nl * d->cap : (size_t)d->rows + 1;
    d->x = fx_aligned(sizeof(uint16_t) * d->slots * H);
    d->w = fx_aligned(sizeof(float) * d->slots);
    for (size_t i = 0; i < d->slots * H; i++) d->x[i] = 0x7fc0;
    for (size_t i = 0; i < d->slots; i++) d->w[i] = NAN;
    int *fill = calloc((size_t)nl, sizeof(int));
    assert_non_null(fill);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) {
            const int e = ids[t * K + j] - first;
            d->where[t * K + j] = -1;
            if (e < 0 || e >= nl) continue;
            const int row = layout == FM_DISPATCH_EXPERT_MAJOR ? e * d->cap + fill[e] : d->offsets[e] + fill[e];
            fill[e]++;
            memcpy(d->x + (size_t)row * H, x + (size_t)t * H, sizeof(uint16_t) * H);
            d->w[row] = wts[t * K + j];
            d->where[t * K + j] = row;
        }
    free(fill);
}

static void dispatch_free(dispatch *d) { free(d->counts), free(d->offsets), free(d->where), free(d->x), free(d->w); }

/* owner[row]: the local expert whose received row the layout row is, among the experts with
 * good[e] (NULL: all), or -1. counts: the rows each expert received (expert-major), offsets:
 * their ranges (expert-rows; a good expert's range is the same in good and bad offsets). */
static int *owners(const dispatch *d, const int32_t *counts, const int32_t *offsets, const unsigned char *good)
{
    int *o = malloc(sizeof(int) * d->slots);
    assert_non_null(o);
    for (size_t r = 0; r < d->slots; r++) o[r] = -1;
    for (int e = 0; e < d->nl; e++) {
        if (good && !good[e]) continue;
        const size_t lo = d->layout == FM_DISPATCH_EXPERT_MAJOR ? (size_t)e * d->cap : (size_t)offsets[e];
        const size_t hi = d->layout == FM_DISPATCH_EXPERT_MAJOR ? lo + (size_t)counts[e] : (size_t)offsets[e + 1];
        for (size_t r = lo; r < hi; r++) o[r] = e;
    }
    return o;
}

/* The same dispatch on the device */
typedef struct {
    uint16_t *x;
    int32_t  *counts, *offsets;
    float    *w;
    void     *out, *ws;
} dev_dispatch;

static void dev_make(dev_dispatch *g, const dispatch *d, size_t ws_bytes)
{
    g->x = dmalloc(sizeof(uint16_t) * d->slots * H);
    g->counts = dmalloc(sizeof(int32_t) * d->nl);
    g->offsets = dmalloc(sizeof(int32_t) * (d->nl + 1));
    g->w = dmalloc(sizeof(float) * d->slots);
    g->out = dmalloc(sizeof(float) * d->slots * H);
    g->ws = ws_bytes ? dmalloc(ws_bytes) : NULL;
    h2d(g->x, d->x, sizeof(uint16_t) * d->slots * H);
    h2d(g->counts, d->counts, sizeof(int32_t) * d->nl);
    h2d(g->offsets, d->offsets, sizeof(int32_t) * (d->nl + 1));
    h2d(g->w, d->w, sizeof(float) * d->slots);
}

static void dev_free(dev_dispatch *g)
{
    CK(cudaFree(g->x));
    CK(cudaFree(g->counts));
    CK(cudaFree(g->offsets));
    CK(cudaFree(g->w));
    CK(cudaFree(g->out));
    if (g->ws) CK(cudaFree(g->ws));
}

static fm_layer_dispatch_args args_of(const dispatch *d, const uint16_t *x, const int32_t *counts,
                                      const int32_t *offsets, const float *w, void *out)
{
    fm_layer_dispatch_args a = {.layout = d->layout, .x = x, .weights = w, .out = out};
    if (d->layout == FM_DISPATCH_EXPERT_MAJOR) a.counts = counts, a.capacity = d->cap;
    else a.offsets = offsets;
    return a;
}

/* One cuda dispatched run into host memory (out poisoned first); fm_layer_errors' status. */
static fm_status run_cuda(fm_layer *l, fm_layer_dispatch_args a, cudaStream_t st, size_t bytes, void *host,
                          fm_layer_error_info *info)
{
    a.stream = st;
    CK(cudaMemsetAsync(a.out, POISON, bytes, st));
    fm_status s = fm_layer_run_dispatched(l, &a);
    if (s != FM_OK) fail_msg("cuda fm_layer_run_dispatched: %s: %s", fm_status_name(s), fm_last_error());
    CK(cudaMemcpyAsync(host, a.out, bytes, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    return fm_layer_errors(l, st, info);
}

static int all_poison(const void *p, size_t bytes)
{
    for (size_t i = 0; i < bytes; i++)
        if (((const unsigned char *)p)[i] != POISON) return 0;
    return 1;
}

/* Received rows of the good experts (owner[row] >= 0): finite first, then within bound of the
 * oracle's rows (NMSE over them all); every other row: the poison. */
static void check_rows(const dispatch *d, const int *owner, const float *got, const float *oracle, double bound,
                       const char *what)
{
    size_t n = 0;
    float *g = malloc(sizeof(float) * d->slots * H), *o = malloc(sizeof(float) * d->slots * H);
    assert_true(g && o);
    for (size_t row = 0; row < d->slots; row++) {
        const float *gr = got + row * H;
        if (owner[row] >= 0) {
            long bad = fm_first_nonfinite(gr, (size_t)H);
            if (bad >= 0) fail_msg("%s: row %zu (local expert %d) element %ld is not finite", what, row, owner[row], bad);
            memcpy(g + n, gr, sizeof(float) * H), memcpy(o + n, oracle + row * H, sizeof(float) * H);
            n += (size_t)H;
        } else if (!all_poison(gr, sizeof(float) * H)) {
            fail_msg("%s: row %zu (no good expert's received row) was written", what, row);
        }
    }
    if (n) fm_assert_close(g, o, n, bound, what);
    free(g), free(o);
}

typedef struct {
    fm_format   fmt;
    int         gptoss;
    const char *name;
    fm_act_fp8  act;      /* W4A8 (FM_ACT_FP8_BLOCK128 / _TOKEN) or not */
    int         fp8_rows; /* the rows sent as FP8 (x_fp8 + x_scales), as an FP8 dispatch sends them */
} variant;

static void layer_make(fx_layer *L, const variant *v, fm_rng *r, float **b13, float **b2)
{
    fm_moe_config cfg = fx_config(E, K, H, I, v->fmt);
    cfg.act_fp8 = v->act;
    *b13 = *b2 = NULL;
    if (v->gptoss) cfg.activation = FM_ACT_SWIGLU_GPTOSS, cfg.swiglu_limit = 0.5f;
    fx_build(L, &cfg, r, 1, 0);
    if (v->gptoss) {
        *b13 = malloc(sizeof(float) * E * 2 * I), *b2 = malloc(sizeof(float) * E * H);
        for (int i = 0; i < E * 2 * I; i++) (*b13)[i] = 0.5f * fm_rng_normal(r);
        for (int i = 0; i < E * H; i++) (*b2)[i] = 0.5f * fm_rng_normal(r);
        L->w.w13_bias = *b13, L->w.w2_bias = *b2;
    }
}

/* Fresh x [T][H] and a routing with token 0's first slot on the shard's first expert */
static void inputs(fm_rng *r, uint16_t **x, int32_t **ids, float **wts)
{
    *x = fx_bf16(r, (size_t)T * H, 1.0f);
    *ids = fx_aligned(sizeof(int32_t) * T * K);
    *wts = fx_aligned(sizeof(float) * T * K);
    fx_random_routing(r, T, K, E, 0.1, *ids, *wts);
    (*ids)[0] = FIRST;
    for (int j = 1; j < K; j++)
        if ((*ids)[j] == FIRST) (*ids)[j] = -1;
}

/* The cuda layer's own token-order run of the routing (external routing, FP32 out), into a
 * new host buffer of T x H floats, errors word clean, every output finite. */
static float *token_run(fm_layer *gl, const uint16_t *x, const int32_t *ids, const float *wts, cudaStream_t st)
{
    float    *run = malloc(sizeof(float) * T * H);
    uint16_t *dx = dmalloc(sizeof(uint16_t) * T * H);
    int32_t  *di = dmalloc(sizeof(int32_t) * T * K);
    float    *dw = dmalloc(sizeof(float) * T * K), *dout = dmalloc(sizeof(float) * T * H);
    h2d(dx, x, sizeof(uint16_t) * T * H), h2d(di, ids, sizeof(int32_t) * T * K), h2d(dw, wts, sizeof(float) * T * K);
    CK(cudaMemsetAsync(dout, POISON, sizeof(float) * T * H, st));
    fm_layer_run_args ra = {.x = dx, .T = T, .topk_ids = di, .topk_weights = dw, .out = dout, .stream = st};
    assert_int_equal(fm_layer_run(gl, &ra), FM_OK);
    CK(cudaMemcpyAsync(run, dout, sizeof(float) * T * H, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    assert_int_equal(fm_layer_errors(gl, st, NULL), FM_OK);
    assert_int_equal(fm_first_nonfinite(run, (size_t)T * H), -1);
    CK(cudaFree(dx));
    CK(cudaFree(di));
    CK(cudaFree(dw));
    CK(cudaFree(dout));
    return run;
}

/* How many of the T x H outputs, each token's received rows (got, d's layout) summed in slot
 * order from 0 in FP32, differ from run's bits; with `strict` the first one fails the test. */
static long long combined_diff(const dispatch *d, const float *got, const float *run, int strict, const char *what)
{
    long long diff = 0;
    for (int t = 0; t < T; t++)
        for (int c = 0; c < H; c++) {
            float o = 0.0f;
            for (int j = 0; j < K; j++)
                if (d->where[t * K + j] >= 0) o += got[(size_t)d->where[t * K + j] * H + c];
            if (!memcmp(&o, &run[(size_t)t * H + c], sizeof o)) continue;
            if (strict)
                fail_msg("%s: combined out[%d][%d] = %.9g, the cuda run gives %.9g (must be bit-identical)", what, t,
                         c, (double)o, (double)run[(size_t)t * H + c]);
            diff++;
        }
    return diff;
}

/* The dispatch's rows as FP8 (the oracle's rule: per 128 columns s = amax / 448, 1 below
 * FLT_MIN, codes E4M3(v / s)): codes [slots][H] and scales [slots][H / 128] on the device;
 * every unfilled slot a NaN code and a NaN scale (a read of one shows) */
static void fp8_rows_make(const dispatch *d, const int *owner, uint8_t **dq, float **ds)
{
    const int nb = H / 128;
    uint8_t  *q = malloc(d->slots * H);
    float    *sc = malloc(sizeof(float) * d->slots * nb);
    assert_true(q && sc);
    memset(q, 0x7f, d->slots * H);
    for (size_t i = 0; i < d->slots * nb; i++) sc[i] = NAN;
    for (size_t row = 0; row < d->slots; row++) {
        if (owner[row] < 0) continue;
        for (int b = 0; b < nb; b++) {
            float amax = 0;
            for (int c = b * 128; c < b * 128 + 128; c++) amax = fmaxf(amax, fabsf(fm_bf16_decode(d->x[row * H + c])));
            float s8 = amax / 448.0f;
            if (!(s8 >= FLT_MIN)) s8 = 1.0f;
            sc[row * nb + b] = s8;
            for (int c = b * 128; c < b * 128 + 128; c++) q[row * H + c] = fm_e4m3_encode(fm_bf16_decode(d->x[row * H + c]) / s8);
        }
    }
    *dq = dmalloc(d->slots * H), *ds = dmalloc(sizeof(float) * d->slots * nb);
    h2d(*dq, q, d->slots * H), h2d(*ds, sc, sizeof(float) * d->slots * nb);
    free(q), free(sc);
}

/* A W4A8 layer's dispatched rows on a build that does not enable them (FM_CUDA_W4A8_DISPATCH
 * off, the default until a GPU has run this test with it on): refused by name, nothing
 * launched; true when refused (the caller skips its checks) */
static int w4a8_refused(fm_layer *gl, fm_layer_dispatch_args a, cudaStream_t st, const char *what)
{
    a.stream = st;
    fm_status s = fm_layer_run_dispatched(gl, &a);
    if (s == FM_OK) {
        CK(cudaStreamSynchronize(st));
        assert_int_equal(fm_layer_errors(gl, st, NULL), FM_OK);
        return 0;
    }
    if (s != FM_ERR_UNSUPPORTED || !strstr(fm_last_error(), "FM_CUDA_W4A8_DISPATCH"))
        fail_msg("%s: %s: %s", what, fm_status_name(s), fm_last_error());
    printf("  SKIP %s: this build refuses a W4A8 layer's dispatched rows (cmake -DFM_CUDA_W4A8_DISPATCH=ON)\n", what);
    return 1;
}

static void check_variant(const variant *v, fm_rng *r, cudaStream_t st)
{
    fx_layer L;
    float   *b13, *b2;
    layer_make(&L, v, r, &b13, &b2);
    uint16_t *x;
    int32_t  *ids;
    float    *wts;
    inputs(r, &x, &ids, &wts);
    double bound = -1; /* the cuda backend's bound against cpu-ref */
    assert_int_equal(fm_layer_accuracy(FM_BACKEND_CUDA, &L.cfg, &bound), FM_OK);
    fm_layer *cl = make(FM_BACKEND_CPU_REF, &L, T, FIRST, NL, FM_OUT_F32, 0);
    fm_layer *gl[2] = {make(FM_BACKEND_CUDA, &L, T, FIRST, NL, FM_OUT_F32, 0),
                       make(FM_BACKEND_CUDA, &L, T, FIRST, NL, FM_OUT_F32, 1)}; /* caller workspace */
    fm_layer *gb = make(FM_BACKEND_CUDA, &L, T, FIRST, NL, FM_OUT_BF16, 0);
    size_t    wsb = 0;
    assert_int_equal(fm_layer_workspace_size(gl[1], &wsb), FM_OK);
    assert_true(wsb > 0);

    /* the cuda layer's own token-order run of this routing */
    float *run = token_run(gl[0], x, ids, wts, st);

    const fm_dispatch_layout layouts[2] = {FM_DISPATCH_EXPERT_MAJOR, FM_DISPATCH_EXPERT_ROWS};
    for (int li = 0; li < 2; li++) {
        dispatch d;
        dispatch_make(&d, layouts[li], x, ids, wts, FIRST, NL);
        dev_dispatch g;
        dev_make(&g, &d, wsb);
        int *owner = owners(&d, d.counts, d.offsets, NULL);
        const size_t n = d.slots * H, bytes = sizeof(float) * n;
        float *oracle = fx_aligned(bytes), *got = malloc(bytes), *plain = malloc(bytes), *again = malloc(bytes);
        uint16_t *gotb = malloc(sizeof(uint16_t) * n);
        uint8_t  *hq8 = NULL, *dq8 = NULL; /* the FP8 rows (fp8_rows): host and device */
        float    *hs8 = NULL, *ds8 = NULL;
        if (v->fp8_rows) {
            fp8_rows_make(&d, owner, &dq8, &ds8);
            hq8 = malloc(d.slots * H), hs8 = malloc(sizeof(float) * d.slots * (H / 128));
            CK(cudaMemcpy(hq8, dq8, d.slots * H, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hs8, ds8, sizeof(float) * d.slots * (H / 128), cudaMemcpyDeviceToHost));
        }
        int skip = 0;
        for (int weighted = 0; weighted < 2; weighted++) {
            char what[160];
            snprintf(what, sizeof what, "%s, %s layout, weights %s", v->name,
                     d.layout == FM_DISPATCH_EXPERT_MAJOR ? "expert-major" : "expert-rows",
                     weighted ? "by the layer" : "by the combine");
            /* the oracle: cpu-ref on the host copies */
            fm_layer_dispatch_args ha = args_of(&d, d.x, d.counts, d.offsets, weighted ? d.w : NULL, oracle);
            if (v->fp8_rows) ha.x = NULL, ha.x_fp8 = hq8, ha.x_scales = hs8;
            memset(oracle, POISON, bytes);
            fm_status s = fm_layer_run_dispatched(cl, &ha);
            if (s != FM_OK) fail_msg("%s: cpu-ref: %s: %s", what, fm_status_name(s), fm_last_error());

            fm_layer_dispatch_args da = args_of(&d, g.x, g.counts, g.offsets, weighted ? g.w : NULL, g.out);
            if (v->fp8_rows) da.x = NULL, da.x_fp8 = dq8, da.x_scales = ds8;
            if (v->act != FM_ACT_FP8_OFF && w4a8_refused(gl[0], da, st, what)) {
                skip = 1;
                break;
            }
            for (int cw = 0; cw < 2; cw++) {
                fm_layer_dispatch_args a = da;
                a.workspace = cw ? g.ws : NULL;
                fm_status es = run_cuda(gl[cw], a, st, bytes, cw ? again : got, NULL);
                if (es != FM_OK) fail_msg("%s: fm_layer_errors: %s: %s", what, fm_status_name(es), fm_last_error());
            }
            check_rows(&d, owner, got, oracle, bound, what);
            if (memcmp(got, again, bytes)) fail_msg("%s: caller workspace gives other bytes", what);

            /* against the layer's own run of the routing */
            if (weighted) {
                combined_diff(&d, got, run, 1, what);
                for (size_t row = 0; row < d.slots; row++) /* plain rows x weight ~ weighted rows */
                    if (owner[row] >= 0)
                        for (int c = 0; c < H; c++) {
                            const float p = d.w[row] * plain[row * H + c], q = got[row * H + c];
                            if (!(fabsf(p - q) <= ldexpf(fabsf(q), -21) + 1e-30f))
                                fail_msg("%s: row %zu [%d]: plain x weight %.9g, weighted %.9g", what, row, c,
                                         (double)p, (double)q);
                        }
            } else {
                memcpy(plain, got, bytes);
            }

            /* BF16 out: the FP32 rows rounded to nearest even, the other rows untouched */
            CK(cudaMemsetAsync(g.out, POISON, sizeof(uint16_t) * n, st));
            fm_layer_dispatch_args ab = da;
            ab.stream = st;
            assert_int_equal(fm_layer_run_dispatched(gb, &ab), FM_OK);
            CK(cudaMemcpyAsync(gotb, g.out, sizeof(uint16_t) * n, cudaMemcpyDeviceToHost, st));
            CK(cudaStreamSynchronize(st));
            assert_int_equal(fm_layer_errors(gb, st, NULL), FM_OK);
            for (size_t row = 0; row < d.slots; row++) {
                const int rec = owner[row] >= 0;
                for (int c = 0; c < H; c++) {
                    const size_t k = row * H + c;
                    if (rec ? gotb[k] != fm_bf16_encode(got[k]) : gotb[k] != 0xFFFF)
                        fail_msg("%s, BF16 out: row %zu element %d = 0x%04x (FP32 %.9g)", what, row, c, gotb[k],
                                 (double)got[k]);
                }
            }

            /* graph capture + replay = eager, every byte */
            cudaGraph_t     gr;
            cudaGraphExec_t ge;
            fm_layer_dispatch_args ac = da;
            ac.stream = st;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            fm_status cs = fm_layer_run_dispatched(gl[0], &ac);
            CK(cudaStreamEndCapture(st, &gr));
            if (cs != FM_OK) fail_msg("%s: captured run: %s: %s", what, fm_status_name(cs), fm_last_error());
            CK(cudaGraphInstantiate(&ge, gr, 0));
            for (int rep = 0; rep < 2; rep++) {
                CK(cudaMemsetAsync(g.out, POISON, bytes, st));
                CK(cudaGraphLaunch(ge, st));
                CK(cudaMemcpyAsync(again, g.out, bytes, cudaMemcpyDeviceToHost, st));
                CK(cudaStreamSynchronize(st));
                if (memcmp(got, again, bytes)) fail_msg("%s: graph replay %d differs from the eager run", what, rep);
            }
            assert_int_equal(fm_layer_errors(gl[0], st, NULL), FM_OK);
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(gr));
        }
        free(oracle), free(got), free(plain), free(again), free(gotb), free(owner), free(hq8), free(hs8);
        if (dq8) CK(cudaFree(dq8));
        if (ds8) CK(cudaFree(ds8));
        dev_free(&g);
        dispatch_free(&d);
        if (skip) break;
    }
    fm_layer_destroy(cl), fm_layer_destroy(gl[0]), fm_layer_destroy(gl[1]), fm_layer_destroy(gb);
    free(run), free(x), free(ids), free(wts), free(b13), free(b2);
    fx_free(&L);
}

static fm_cuda_device *gpu_setup(fm_rng *r, unsigned off)
{
    fm_test_require_gpu();
    fm_rng_init(r, fm_test_seed() + off);
    CK(cudaSetDevice(0));
    fm_cuda_device *dev = NULL;
    assert_int_equal(fm_cuda_device_open(0, &dev), FM_OK);
    return dev;
}

static void test_dispatch_vs_oracle(void **st_)
{
    (void)st_;
    fm_rng r;
    g_dev = gpu_setup(&r, 0xd15);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const variant vs[] = {{FM_FORMAT_NVFP4, 0, "NVFP4", FM_ACT_FP8_OFF, 0},
                          {FM_FORMAT_MXFP4, 1, "MXFP4, gpt-oss experts", FM_ACT_FP8_OFF, 0},
                          {FM_FORMAT_NVFP4, 0, "NVFP4 W4A8 per 128, BF16 rows", FM_ACT_FP8_BLOCK128, 0},
                          {FM_FORMAT_MXFP4, 1, "MXFP4 gpt-oss W4A8 per token, BF16 rows", FM_ACT_FP8_TOKEN, 0},
                          {FM_FORMAT_NVFP4, 0, "NVFP4 W4A8 per 128, FP8 rows", FM_ACT_FP8_BLOCK128, 1},
                          {FM_FORMAT_MXFP4, 1, "MXFP4 gpt-oss W4A8 per 128, FP8 rows", FM_ACT_FP8_BLOCK128, 1}};
    for (size_t v = 0; v < sizeof vs / sizeof vs[0]; v++) check_variant(&vs[v], &r, st);
    CK(cudaStreamDestroy(st));
    fm_cuda_device_close(g_dev);
}

/* The device's counts / offsets checks (host replica of the expert-rows rule: expert e's
 * range [lo, hi) is read when 0 <= lo <= hi, lo >= every earlier offset, hi <= every later
 * one, and offsets[0] = 0 for e = 0). */
static int rows_range_ok(const int32_t *off, int nl, int e)
{
    const int lo = off[e], hi = off[e + 1];
    if (e == 0 && lo != 0) return 0;
    if (lo < 0 || hi < lo) return 0;
    for (int q = 0; q <= e; q++)
        if (off[q] > lo) return 0;
    for (int q = e + 1; q <= nl; q++)
        if (off[q] < hi) return 0;
    return 1;
}

static void expect_bad(fm_layer *gl, fm_layer *cl, const dispatch *d, const dev_dispatch *g, const int32_t *counts,
                       const int32_t *offsets, const unsigned char *good, long long n_bad, long long first_bad,
                       cudaStream_t st, double bound, const char *what)
{
    const size_t bytes = sizeof(float) * d->slots * H;
    float       *got = malloc(bytes), *oracle = fx_aligned(bytes);
    /* the oracle: the clean dispatch (the good experts' ranges are the same there) */
    fm_layer_dispatch_args ha = args_of(d, d->x, d->counts, d->offsets, d->w, oracle);
    memset(oracle, POISON, bytes);
    assert_int_equal(fm_layer_run_dispatched(cl, &ha), FM_OK);
    /* the bad counts / offsets, on the device */
    if (d->layout == FM_DISPATCH_EXPERT_MAJOR) h2d(g->counts, counts, sizeof(int32_t) * d->nl);
    else h2d(g->offsets, offsets, sizeof(int32_t) * (d->nl + 1));
    fm_layer_error_info info;
    fm_status           s = run_cuda(gl, args_of(d, g->x, g->counts, g->offsets, g->w, g->out), st, bytes, got, &info);
    if (s != FM_ERR_BAD_SHAPE) fail_msg("%s: fm_layer_errors %s (%s), want FM_ERR_BAD_SHAPE", what, fm_status_name(s),
                                        fm_last_error());
    printf("  %s: %s\n", what, fm_last_error());
    if (info.bad_experts != n_bad || info.first_bad_expert != first_bad)
        fail_msg("%s: bad_experts %lld (want %lld), first_bad_expert %lld (want %lld)", what, info.bad_experts, n_bad,
                 info.first_bad_expert, first_bad);
    assert_int_equal(fm_layer_errors(gl, st, NULL), FM_OK); /* cleared */
    /* the good experts' rows: the clean counts (expert-major), the bad offsets (expert-rows) */
    int *owner = owners(d, d->counts, offsets, good);
    check_rows(d, owner, got, oracle, bound, what);
    free(owner);
    /* restore */
    h2d(g->counts, d->counts, sizeof(int32_t) * d->nl);
    h2d(g->offsets, d->offsets, sizeof(int32_t) * (d->nl + 1));
    free(got), free(oracle);
}

/* The NVFP4 layer, routing and stream the device-check tests share; nv_free undoes it. */
typedef struct {
    fm_rng       r;
    cudaStream_t st;
    fx_layer     L;
    float       *b13, *b2;
    double       bound; /* the cuda backend's NMSE bound against cpu-ref */
    uint16_t    *x;
    int32_t     *ids;
    float       *wts;
} nv_fx;

static void nv_make(nv_fx *f, unsigned seed_off)
{
    g_dev = gpu_setup(&f->r, seed_off);
    CK(cudaStreamCreateWithFlags(&f->st, cudaStreamNonBlocking));
    const variant v = {FM_FORMAT_NVFP4, 0, "NVFP4", FM_ACT_FP8_OFF, 0};
    layer_make(&f->L, &v, &f->r, &f->b13, &f->b2);
    f->bound = -1;
    assert_int_equal(fm_layer_accuracy(FM_BACKEND_CUDA, &f->L.cfg, &f->bound), FM_OK);
    inputs(&f->r, &f->x, &f->ids, &f->wts);
}

static void nv_free(nv_fx *f)
{
    free(f->x), free(f->ids), free(f->wts), free(f->b13), free(f->b2);
    fx_free(&f->L);
    CK(cudaStreamDestroy(f->st));
    fm_cuda_device_close(g_dev);
}

static void test_dispatch_device_checks(void **st_)
{
    (void)st_;
    nv_fx f;
    nv_make(&f, 0xbad);
    fm_layer *cl = make(FM_BACKEND_CPU_REF, &f.L, T, FIRST, NL, FM_OUT_F32, 0);
    fm_layer *gl = make(FM_BACKEND_CUDA, &f.L, T, FIRST, NL, FM_OUT_F32, 0);
    int32_t   cnt[NL], off[NL + 1];
    unsigned char good[NL];

    /* expert-major: a count past the capacity and a negative one */
    dispatch d;
    dispatch_make(&d, FM_DISPATCH_EXPERT_MAJOR, f.x, f.ids, f.wts, FIRST, NL);
    dev_dispatch g;
    dev_make(&g, &d, 0);
    memcpy(cnt, d.counts, sizeof cnt);
    memset(good, 1, sizeof good);
    cnt[0] = d.cap + 1, cnt[5] = -1, good[0] = good[5] = 0;
    expect_bad(gl, cl, &d, &g, cnt, NULL, good, 2, 0, f.st, f.bound, "counts[0] = capacity + 1, counts[5] = -1");

    /* more rows than the layer holds: a layer of max_tokens 8 (32 rows) and 9 rows each */
    {
        fm_layer *small = make(FM_BACKEND_CUDA, &f.L, 8, FIRST, NL, FM_OUT_F32, 0);
        fm_layer *csmall = make(FM_BACKEND_CPU_REF, &f.L, 8, FIRST, NL, FM_OUT_F32, 0);
        dispatch  dm = d;
        dm.counts = cnt;
        for (int e = 0; e < NL; e++) cnt[e] = 9;
        uint16_t *xf = fx_bf16(&f.r, d.slots * H, 1.0f); /* every slot finite: all of them may be read */
        float    *wf = fx_aligned(sizeof(float) * d.slots);
        for (size_t i = 0; i < d.slots; i++) wf[i] = 0.5f;
        dm.x = xf, dm.w = wf;
        dev_dispatch gm;
        dev_make(&gm, &dm, 0);
        /* experts 0..2 fit (27 rows), 3..7 do not: the oracle gets their counts as 0 */
        int32_t ocnt[NL];
        for (int e = 0; e < NL; e++) ocnt[e] = e < 3 ? 9 : 0, good[e] = e < 3;
        dispatch od = dm;
        od.counts = ocnt;
        const size_t bytes = sizeof(float) * dm.slots * H;
        float *got = malloc(bytes), *oracle = fx_aligned(bytes);
        fm_layer_dispatch_args ha = args_of(&od, xf, ocnt, NULL, wf, oracle);
        memset(oracle, POISON, bytes);
        assert_int_equal(fm_layer_run_dispatched(csmall, &ha), FM_OK);
        /* the layer of 32 rows, then the layer of T x K rows told max_rows = 27 (the args' bound) */
        for (int by_args = 0; by_args < 2; by_args++) {
            fm_layer_dispatch_args a = args_of(&dm, gm.x, gm.counts, NULL, gm.w, gm.out);
            a.max_rows = by_args ? 27 : 0;
            fm_layer_error_info info;
            fm_status s = run_cuda(by_args ? gl : small, a, f.st, bytes, got, &info);
            if (s != FM_ERR_BAD_SHAPE) fail_msg("too many rows: %s (%s)", fm_status_name(s), fm_last_error());
            printf("  too many rows%s: %s\n", by_args ? " (max_rows 27)" : "", fm_last_error());
            assert_int_equal(info.bad_experts, 5);
            assert_int_equal(info.first_bad_expert, 3);
            int *owner = owners(&dm, cnt, NULL, good);
            check_rows(&dm, owner, got, oracle, f.bound,
                       by_args ? "9 rows for each of 8 experts, max_rows 27" : "9 rows for each of 8 experts, 32 held");
            free(owner);
        }
        free(got), free(oracle), free(xf), free(wf);
        dev_free(&gm);
        fm_layer_destroy(small), fm_layer_destroy(csmall);
    }

    /* NaN in a received row (row 0: local expert 0's first, token 0), then a NaN weight */
    {
        const size_t bytes = sizeof(float) * d.slots * H;
        float       *got = malloc(bytes);
        fm_layer_error_info info;
        uint16_t nanv = 0x7fc0;
        h2d(g.x + 5, &nanv, 2);
        fm_status s = run_cuda(gl, args_of(&d, g.x, g.counts, NULL, NULL, g.out), f.st, bytes, got, &info);
        assert_int_equal(s, FM_ERR_NONFINITE);
        assert_int_equal(info.nonfinite_x, 1);
        assert_int_equal(info.first_nonfinite, 5);
        h2d(g.x + 5, d.x + 5, 2);
        float nanw = NAN;
        h2d(g.w, &nanw, sizeof nanw);
        s = run_cuda(gl, args_of(&d, g.x, g.counts, NULL, g.w, g.out), f.st, bytes, got, &info);
        assert_int_equal(s, FM_ERR_NONFINITE);
        assert_int_equal(info.nonfinite_weights, 1);
        h2d(g.w, d.w, sizeof(float));
        free(got);
    }
    dev_free(&g);
    dispatch_free(&d);

    /* expert-rows: offsets[0] = 1; offsets decreasing at 4 (experts 3, 4, 5 lose their ranges) */
    dispatch_make(&d, FM_DISPATCH_EXPERT_ROWS, f.x, f.ids, f.wts, FIRST, NL);
    dev_make(&g, &d, 0);
    memcpy(off, d.offsets, sizeof off);
    off[0] = 1;
    long long nbad = 0, fbad = -1;
    for (int e = 0; e < NL; e++) {
        good[e] = (unsigned char)rows_range_ok(off, NL, e);
        if (!good[e]) nbad++, fbad = fbad < 0 ? e : fbad;
    }
    expect_bad(gl, cl, &d, &g, NULL, off, good, nbad, fbad, f.st, f.bound, "offsets[0] = 1");
    memcpy(off, d.offsets, sizeof off);
    off[4] = off[5] + 1;
    nbad = 0, fbad = -1;
    for (int e = 0; e < NL; e++) {
        good[e] = (unsigned char)rows_range_ok(off, NL, e);
        if (!good[e]) nbad++, fbad = fbad < 0 ? e : fbad;
    }
    assert_true(nbad >= 2 && !good[3] && !good[4]);
    expect_bad(gl, cl, &d, &g, NULL, off, good, nbad, fbad, f.st, f.bound, "offsets[4] = offsets[5] + 1");
    dev_free(&g);
    dispatch_free(&d);

    fm_layer_destroy(cl), fm_layer_destroy(gl);
    nv_free(&f);
}

/* max_rows: a layer of 1,100 tokens told the rows of T tokens runs T's bucket plan, the plan
 * of its own token-order run: each token's weighted rows summed in slot order = that run's
 * output bit for bit (without max_rows it runs the plan of the last bucket: within the bound
 * of cpu-ref only, checked too). Both layouts; the rows placed by the layout kernel's CTA
 * (a bound up to 4,096 rows) and by the separate placing launch (the expert-rows bound
 * without max_rows, 4,400). */
static void test_dispatch_max_rows(void **st_)
{
    (void)st_;
    nv_fx f;
    nv_make(&f, 0x3a);
    /* MAXT x K = 4,400 rows: past the 4,096 up to which the layout kernel places the rows
     * itself, so the run without max_rows takes the separate placing launch */
    enum { MAXT = 1100 };
    fm_layer *cl = make(FM_BACKEND_CPU_REF, &f.L, MAXT, FIRST, NL, FM_OUT_F32, 0);
    fm_layer *gl = make(FM_BACKEND_CUDA, &f.L, MAXT, FIRST, NL, FM_OUT_F32, 0);
    fm_layer_plan_info pt, pb;
    assert_int_equal(fm_layer_plan(gl, T, &pt), FM_OK);
    assert_int_equal(fm_layer_plan(gl, MAXT, &pb), FM_OK);
    printf("  buckets: T = %d -> %d, max_tokens %d -> %d\n", T, pt.bucket_tokens, MAXT, pb.bucket_tokens);
    assert_true(pt.bucket_tokens < pb.bucket_tokens);
    float *run = token_run(gl, f.x, f.ids, f.wts, f.st);
    const fm_dispatch_layout layouts[2] = {FM_DISPATCH_EXPERT_MAJOR, FM_DISPATCH_EXPERT_ROWS};
    for (int li = 0; li < 2; li++) {
        dispatch d;
        dispatch_make(&d, layouts[li], f.x, f.ids, f.wts, FIRST, NL);
        dev_dispatch g;
        dev_make(&g, &d, 0);
        int *owner = owners(&d, d.counts, d.offsets, NULL);
        const size_t bytes = sizeof(float) * d.slots * H;
        float *oracle = fx_aligned(bytes), *got = malloc(bytes);
        fm_layer_dispatch_args ha = args_of(&d, d.x, d.counts, d.offsets, d.w, oracle);
        memset(oracle, POISON, bytes);
        assert_int_equal(fm_layer_run_dispatched(cl, &ha), FM_OK);
        for (int told = 0; told < 2; told++) {
            char what[96];
            snprintf(what, sizeof what, "%s layout, max_rows %s", li ? "expert-rows" : "expert-major",
                     told ? "T x K" : "not given");
            fm_layer_dispatch_args a = args_of(&d, g.x, g.counts, g.offsets, g.w, g.out);
            a.max_rows = told ? T * K : 0;
            fm_status es = run_cuda(gl, a, f.st, bytes, got, NULL);
            if (es != FM_OK) fail_msg("%s: fm_layer_errors: %s: %s", what, fm_status_name(es), fm_last_error());
            check_rows(&d, owner, got, oracle, f.bound, what);
            if (!told && li == 0) continue; /* expert-major without max_rows: the bucket of NL x capacity rows */
            const long long diff = combined_diff(&d, got, run, 0, what);
            printf("  %s: %lld of %d combined outputs differ from the token-order run's bits\n", what, diff, T * H);
            if (told) { /* the bucket it ran: ceil(bound / K) tokens, bound the smallest the host knows */
                int bnd = T * K;
                if (li == 0 && NL * d.cap < bnd) bnd = NL * d.cap;
                fm_layer_plan_info pd;
                assert_int_equal(fm_layer_plan(gl, (bnd + K - 1) / K, &pd), FM_OK);
                if (pd.bucket_tokens == pt.bucket_tokens && diff)
                    fail_msg("%s: the combined rows must equal the token-order run bit for bit", what);
            }
        }
        free(oracle), free(got), free(owner);
        dev_free(&g);
        dispatch_free(&d);
    }
    fm_layer_destroy(cl), fm_layer_destroy(gl);
    free(run);
    nv_free(&f);
}

/* What the host refuses: FP8 rows on a W4A16 layer, FP8 rows on a W4A8 layer (not built on
 * cuda yet), a shared expert; nothing launched, out untouched. */
static void test_dispatch_refusals(void **st_)
{
    (void)st_;
    fm_rng r;
    g_dev = gpu_setup(&r, 0xf8);
    const variant v = {FM_FORMAT_NVFP4, 0, "NVFP4", FM_ACT_FP8_OFF, 0};
    fx_layer      L;
    float        *b13, *b2;
    layer_make(&L, &v, &r, &b13, &b2);
    fm_layer *gl = make(FM_BACKEND_CUDA, &L, T, FIRST, NL, FM_OUT_F32, 0);
    const int nb = (H + 127) / 128, cap = 4;
    uint8_t  *q = dmalloc((size_t)NL * cap * H);
    float    *sc = dmalloc(sizeof(float) * NL * cap * nb), *out = dmalloc(sizeof(float) * NL * cap * H);
    int32_t  *cnt = dmalloc(sizeof(int32_t) * NL);
    CK(cudaMemset(cnt, 0, sizeof(int32_t) * NL));
    CK(cudaMemset(out, POISON, sizeof(float) * NL * cap * H));
    fm_layer_dispatch_args a = {.layout = FM_DISPATCH_EXPERT_MAJOR, .x_fp8 = q, .x_scales = sc, .counts = cnt,
                                .capacity = cap, .out = out};
    fm_status s = fm_layer_run_dispatched(gl, &a);
    printf("  FP8 rows, W4A16 layer: %s\n", fm_last_error());
    assert_int_equal(s, FM_ERR_INVALID_ARG); /* the cuda backend runs W4A8: this layer is the wrong one */
    assert_non_null(strstr(fm_last_error(), "W4A8"));
    { /* a W4A8 layer (per 128): its dispatched rows, refused by name where the build does not
       * enable them (FM_CUDA_W4A8_DISPATCH); where it does, no rows (counts 0) run and write nothing */
        fx_layer L8;
        float   *c13, *c2;
        fm_rng   r8;
        fm_rng_init(&r8, fm_test_seed() ^ 0x8a8);
        layer_make(&L8, &v, &r8, &c13, &c2);
        L8.cfg.act_fp8 = FM_ACT_FP8_BLOCK128;
        fm_layer *g8 = make(FM_BACKEND_CUDA, &L8, T, FIRST, NL, FM_OUT_F32, 0);
        s = fm_layer_run_dispatched(g8, &a);
        printf("  FP8 rows, W4A8 layer: %s\n", s == FM_OK ? "run (enabled in this build)" : fm_last_error());
        if (s != FM_OK) {
            assert_int_equal(s, FM_ERR_UNSUPPORTED);
            assert_non_null(strstr(fm_last_error(), "FM_CUDA_W4A8_DISPATCH"));
        } else {
            assert_int_equal(fm_layer_errors(g8, NULL, NULL), FM_OK);
        }
        fm_layer_destroy(g8);
        fx_free(&L8);
    }
    fm_layer_dispatch_args b = a;
    b.x_fp8 = NULL, b.x_scales = NULL, b.x = (const uint16_t *)q, b.capacity = 0;
    assert_int_equal(fm_layer_run_dispatched(gl, &b), FM_ERR_INVALID_ARG);
    CK(cudaDeviceSynchronize());
    float *h = malloc(sizeof(float) * NL * cap * H);
    CK(cudaMemcpy(h, out, sizeof(float) * NL * cap * H, cudaMemcpyDeviceToHost));
    assert_true(all_poison(h, sizeof(float) * NL * cap * H));
    fm_layer_destroy(gl);
    fx_free(&L);

    /* a shared expert: refused (run it apart) */
    fm_moe_config cs = fx_config(E, K, H, I, FM_FORMAT_NVFP4);
    cs.shared_inter = 32;
    fx_build(&L, &cs, &r, 0, 0);
    fm_layer *sl = make(FM_BACKEND_CUDA, &L, T, 0, NL, FM_OUT_F32, 0);
    b.capacity = cap;
    assert_int_equal(fm_layer_run_dispatched(sl, &b), FM_ERR_UNSUPPORTED);
    fm_layer_destroy(sl);
    fx_free(&L);
    CK(cudaFree(q));
    CK(cudaFree(sc));
    CK(cudaFree(out));
    CK(cudaFree(cnt));
    free(h), free(b13), free(b2);
    fm_cuda_device_close(g_dev);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_dispatch_vs_oracle),
                                       cmocka_unit_test(test_dispatch_device_checks),
                                       cmocka_unit_test(test_dispatch_max_rows),
                                       cmocka_unit_test(test_dispatch_refusals)};
    fm_test_require_gpu(); /* exit 77 (skipped) with a message where there is no GPU */
    return cmocka_run_group_tests(tests, NULL, NULL);
}
