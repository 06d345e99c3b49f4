/* test_layer_dispatch.c - the layer on rows an expert-parallel dispatch left in place
 * (fm_layer_run_dispatched), on the CPU backends.
 *
 * Oracle: the same shard of the same layer run on the tokens in their original order with
 * the same routing (fm_layer_run, external routing). The dispatched layouts are built by
 * hand from that routing, as a dispatch would leave them (expert-major with counts, and
 * rows contiguous by expert with offsets); the dispatched outputs are then combined by hand
 * (each token's slots in ascending j, weight times row, FP32) and must equal the shard's
 * output bit for bit: a row's expert output may not depend on where the row came from.
 * NVFP4 and MXFP4, plain SwiGLU, NVFP4 activations, gpt-oss's biased experts; weights
 * applied by the combine or by the layer; FP32 and BF16 output. Every received row's slot
 * around it is NaN (a read of a slot past counts[e] poisons the result) and the outputs
 * are poisoned bytes, so rows the layer must not write are checked untouched. Then every
 * bad input with its status, the output untouched.
 */
#include "test_moe_fixture.h"
#include "testutil.h"

#include "backend.h" /* fm_layer_test_hold */

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const fm_backend_kind k_cpu[2] = {FM_BACKEND_CPU_REF, FM_BACKEND_CPU};

enum { POISON = 0xA5 };

/* Token 0's first slot goes to the shard's first expert (its other slots elsewhere), so the
 * refusal tests that spoil a received row always have one (a random routing of a few tokens
 * may send none to a small shard). */
static void force_local(int32_t *ids, int K, int first)
{
    ids[0] = first;
    for (int j = 1; j < K; j++)
        if (ids[j] == first) ids[j] = -1;
}

/* A dispatch of one routing to the shard [first, first + nl): where slot (t, j) landed. */
typedef struct {
    fm_dispatch_layout layout;
    int                nl, cap, rows;
    int32_t           *counts, *offsets, *where; /* where[t*K + j]: the row of x/out, or -1 */
    uint16_t          *x;
    float             *w;
} dispatch;

static void dispatch_make(dispatch *d, fm_dispatch_layout layout, const uint16_t *x, int T, int H, int K,
                          const int32_t *ids, const float *wts, int first, int nl)
{
    memset(d, 0, sizeof *d);
    d->layout = layout;
    d->nl = nl;
    d->cap = T + 2; /* a token reaches an expert once: T rows at most, 2 slots to spare */
    d->counts = fx_aligned(sizeof(int32_t) * nl);
    d->offsets = fx_aligned(sizeof(int32_t) * (nl + 1));
    d->where = malloc(sizeof(int32_t) * T * K);
    assert_non_null(d->where);
    memset(d->counts, 0, sizeof(int32_t) * nl);
    for (int i = 0; i < T * K; i++) /* the counts first: the expert-rows layout packs by them */
        if (ids[i] >= first && ids[i] < first + nl) d->counts[ids[i] - first]++;
    d->offsets[0] = 0;
    for (int e = 0; e < nl; e++) d->offsets[e + 1] = d->offsets[e] + d->counts[e];
    d->rows = d->offsets[nl];
    const size_t slots = layout == FM_DISPATCH_EXPERT_MAJOR ? (size_t)nl * d->cap : (size_t)d->rows + 1;
    d->x = fx_aligned(sizeof(uint16_t) * slots * H);
    d->w = fx_aligned(sizeof(float) * slots);
    for (size_t i = 0; i < slots * H; i++) d->x[i] = 0x7fc0; /* BF16 NaN: a slot the layer must not read */
    for (size_t i = 0; i < slots; i++) d->w[i] = NAN;
    int *fill = calloc(nl, sizeof(int));
    assert_non_null(fill);
    for (int t = 0; t < T; t++) /* tokens in order, then slots: the order a run packs rows in */
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

static void dispatch_free(dispatch *d)
{
    free(d->counts), free(d->offsets), free(d->where), free(d->x), free(d->w);
}

static size_t dispatch_slots(const dispatch *d)
{
    return d->layout == FM_DISPATCH_EXPERT_MAJOR ? (size_t)d->nl * d->cap : (size_t)d->rows + 1;
}

static fm_layer_dispatch_args dispatch_args(const dispatch *d, int weighted, void *out)
{
    fm_layer_dispatch_args a = {.layout = d->layout, .x = d->x, .weights = weighted ? d->w : NULL, .out = out};
    if (d->layout == FM_DISPATCH_EXPERT_MAJOR) a.counts = d->counts, a.capacity = d->cap;
    else a.offsets = d->offsets;
    return a;
}

/* Is row `row` one the dispatch filled? */
static int received(const dispatch *d, int T, int K, int row)
{
    for (int i = 0; i < T * K; i++)
        if (d->where[i] == row) return 1;
    return 0;
}

typedef struct {
    fm_format fmt;
    int       act_nvfp4, gptoss;
    const char *name;
} variant;

static void check_one(fm_backend_kind b, const variant *v, fm_dispatch_layout layout, int weighted, fm_rng *r)
{
    const int E = 16, K = 4, H = 64, I = 32, T = fx_asan() ? 4 : 11, first = 4, nl = 6;
    fm_moe_config cfg = fx_config(E, K, H, I, v->fmt);
    cfg.act_nvfp4 = v->act_nvfp4;
    if (v->gptoss) cfg.activation = FM_ACT_SWIGLU_GPTOSS, cfg.swiglu_limit = 0.5f;
    fx_layer L;
    fx_build(&L, &cfg, r, 1, v->act_nvfp4);
    float *b13 = NULL, *b2 = NULL;
    if (v->gptoss) {
        b13 = malloc(sizeof(float) * E * 2 * I), b2 = malloc(sizeof(float) * E * H);
        for (int i = 0; i < E * 2 * I; i++) b13[i] = 0.5f * fm_rng_normal(r);
        for (int i = 0; i < E * H; i++) b2[i] = 0.5f * fm_rng_normal(r);
        L.w.w13_bias = b13, L.w.w2_bias = b2;
    }
    uint16_t *x = fx_aligned(sizeof(uint16_t) * T * H);
    uint16_t *xs = fx_bf16(r, (size_t)T * H, 1.0f);
    memcpy(x, xs, sizeof(uint16_t) * T * H);
    free(xs);
    int32_t *ids = fx_aligned(sizeof(int32_t) * T * K);
    float   *wts = fx_aligned(sizeof(float) * T * K), *ref = fx_aligned(sizeof(float) * T * H);
    fx_random_routing(r, T, K, E, 0.1, ids, wts);

    fm_layer *l = fx_shard_layer(b, &L, T, first, nl, FM_OUT_F32);
    fm_poison_f32(ref, (size_t)T * H);
    fm_layer_run_args ra = {.x = x, .T = T, .topk_ids = ids, .topk_weights = wts, .out = ref};
    assert_int_equal(fm_layer_run(l, &ra), FM_OK);

    dispatch d;
    dispatch_make(&d, layout, x, T, H, K, ids, wts, first, nl);
    const size_t slots = dispatch_slots(&d);
    float       *out = fx_aligned(sizeof(float) * slots * H);
    memset(out, POISON, sizeof(float) * slots * H);
    fm_layer_dispatch_args a = dispatch_args(&d, weighted, out);
    fm_status s = fm_layer_run_dispatched(l, &a);
    if (s != FM_OK) fail_msg("%s %s: %s: %s", fm_backend_name(b), v->name, fm_status_name(s), fm_last_error());

    char what[160];
    snprintf(what, sizeof what, "%s, %s, %s layout, weights %s", fm_backend_name(b), v->name,
             layout == FM_DISPATCH_EXPERT_MAJOR ? "expert-major" : "expert-rows", weighted ? "by the layer" : "by the combine");
    for (size_t row = 0; row < slots; row++) { /* received rows finite first, the others untouched */
        const unsigned char *o = (const unsigned char *)(out + row * H);
        if (received(&d, T, K, (int)row)) {
            long bad = fm_first_nonfinite(out + row * H, (size_t)H);
            if (bad >= 0) fail_msg("%s: row %zu element %ld is not finite", what, row, bad);
        } else {
            for (int i = 0; i < H * 4; i++)
                if (o[i] != POISON) fail_msg("%s: row %zu was not received but written", what, row);
        }
    }
    float *comb = malloc(sizeof(float) * T * H); /* the combine, in the finalize's order */
    assert_non_null(comb);
    for (int t = 0; t < T; t++) {
        float *o = comb + (size_t)t * H;
        for (int i = 0; i < H; i++) o[i] = 0.0f;
        for (int j = 0; j < K; j++) {
            const int row = d.where[t * K + j];
            if (row < 0) continue;
            const float *y = out + (size_t)row * H;
            const float  wt = wts[t * K + j];
            if (weighted)
                for (int i = 0; i < H; i++) o[i] += y[i];
            else
                for (int i = 0; i < H; i++) o[i] += wt * y[i];
        }
    }
    for (int i = 0; i < T * H; i++)
        if (memcmp(&comb[i], &ref[i], sizeof(float)))
            fail_msg("%s: combined out[%d][%d] = %.9g, the shard's run gives %.9g (must be bit-identical)", what,
                     i / H, i % H, (double)comb[i], (double)ref[i]);

    /* BF16 output: the FP32 rows rounded */
    fm_layer *lb = fx_shard_layer(b, &L, T, first, nl, FM_OUT_BF16);
    uint16_t *ob = fx_aligned(sizeof(uint16_t) * slots * H);
    memset(ob, POISON, sizeof(uint16_t) * slots * H);
    a.out = ob;
    assert_int_equal(fm_layer_run_dispatched(lb, &a), FM_OK);
    for (size_t row = 0; row < slots; row++)
        for (int i = 0; i < H; i++) {
            const size_t k = row * H + i;
            if (received(&d, T, K, (int)row) ? ob[k] != fm_bf16_encode(out[k]) : ob[k] != (POISON << 8 | POISON))
                fail_msg("%s, BF16 out: row %zu element %d = 0x%04x", what, row, i, ob[k]);
        }
    fm_layer_destroy(lb);
    fm_layer_destroy(l);
    free(ob), free(comb), free(out), free(x), free(ids), free(wts), free(ref), free(b13), free(b2);
    dispatch_free(&d);
    fx_free(&L);
}

static void test_dispatched_equals_shard(void **st)
{
    (void)st;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0xd15a);
    const variant vs[] = {
        {FM_FORMAT_NVFP4, 0, 0, "NVFP4"},
        {FM_FORMAT_MXFP4, 0, 0, "MXFP4"},
        {FM_FORMAT_NVFP4, 1, 0, "NVFP4, NVFP4 activations"},
        {FM_FORMAT_MXFP4, 0, 1, "MXFP4, gpt-oss experts"},
    };
    const fm_dispatch_layout ls[] = {FM_DISPATCH_EXPERT_MAJOR, FM_DISPATCH_EXPERT_ROWS};
    for (int b = 0; b < 2; b++)
        for (size_t v = 0; v < sizeof vs / sizeof vs[0]; v++)
            for (int li = 0; li < 2; li++)
                for (int weighted = 0; weighted < 2; weighted++) check_one(k_cpu[b], &vs[v], ls[li], weighted, &r);
}

/* One bad call: the status, a message, and out untouched. */
static void expect_bad(fm_layer *l, const fm_layer_dispatch_args *a, size_t out_bytes, fm_status want, const char *what)
{
    memset(a->out, POISON, out_bytes);
    fm_status s = fm_layer_run_dispatched(l, a);
    if (s != want)
        fail_msg("%s: got %s (%s), want %s", what, fm_status_name(s), fm_last_error(), fm_status_name(want));
    if (!*fm_last_error()) fail_msg("%s: no message", what);
    for (size_t i = 0; i < out_bytes; i++)
        if (((unsigned char *)a->out)[i] != POISON) fail_msg("%s: out written at byte %zu", what, i);
}

static void test_dispatch_refusals(void **st)
{
    (void)st;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0xbad);
    const int E = 8, K = 2, H = 64, I = 32, T = 5, first = 2, nl = 4;
    fm_moe_config cfg = fx_config(E, K, H, I, FM_FORMAT_NVFP4);
    fx_layer L;
    fx_build(&L, &cfg, &r, 0, 0);
    uint16_t *x = fx_bf16(&r, (size_t)T * H, 1.0f);
    int32_t  *ids = fx_aligned(sizeof(int32_t) * T * K);
    float    *wts = fx_aligned(sizeof(float) * T * K);
    fx_random_routing(&r, T, K, E, 0.1, ids, wts);
    force_local(ids, K, first);
    for (int b = 0; b < 2; b++) {
        fm_layer *l = fx_shard_layer(k_cpu[b], &L, T, first, nl, FM_OUT_F32);
        dispatch  dm, dr;
        dispatch_make(&dm, FM_DISPATCH_EXPERT_MAJOR, x, T, H, K, ids, wts, first, nl);
        dispatch_make(&dr, FM_DISPATCH_EXPERT_ROWS, x, T, H, K, ids, wts, first, nl);
        const size_t ob = sizeof(float) * dispatch_slots(&dm) * H + 64;
        float       *out = fx_aligned(ob);
        fm_layer_dispatch_args a = dispatch_args(&dm, 1, out), c;

        assert_int_equal(fm_layer_run_dispatched(NULL, &a), FM_ERR_INVALID_ARG);
        assert_int_equal(fm_layer_run_dispatched(l, NULL), FM_ERR_INVALID_ARG);
        c = a, c.x = NULL, expect_bad(l, &c, ob, FM_ERR_INVALID_ARG, "NULL x");
        c = a, c.layout = (fm_dispatch_layout)7, expect_bad(l, &c, ob, FM_ERR_INVALID_ARG, "layout 7");
        c = a, c.counts = NULL, expect_bad(l, &c, ob, FM_ERR_INVALID_ARG, "expert-major without counts");
        c = a, c.capacity = 0, expect_bad(l, &c, ob, FM_ERR_INVALID_ARG, "capacity 0");
        c = dispatch_args(&dr, 1, out), c.offsets = NULL;
        expect_bad(l, &c, ob, FM_ERR_INVALID_ARG, "expert-rows without offsets");
        c = a, c.x = (const uint16_t *)((const char *)a.x + 2), expect_bad(l, &c, ob, FM_ERR_MISALIGNED, "x + 2 bytes");
        c = a, c.out = (char *)out + 8;
        memset(out, POISON, ob);
        assert_int_equal(fm_layer_run_dispatched(l, &c), FM_ERR_MISALIGNED);
        c = a, c.weights = (const float *)((const char *)a.weights + 2);
        expect_bad(l, &c, ob, FM_ERR_MISALIGNED, "weights + 2 bytes");
        char ws[256];
        c = a, c.workspace = ws, expect_bad(l, &c, ob, FM_ERR_INVALID_ARG, "workspace to a layer that owns one");
        { /* a layer that takes the caller's workspace: 256-byte aligned, as fm_layer_run asks */
            fm_moe_weights w = L.w;
            w.w13 = L.w13 + first, w.w2 = L.w2 + first;
            fm_layer_desc d = {.backend = k_cpu[b], .max_tokens = T, .first_expert = first, .n_local = nl,
                               .caller_workspace = 1};
            fm_layer     *lw = NULL;
            assert_int_equal(fm_layer_create_desc(&d, &L.cfg, &w, &lw), FM_OK);
            unsigned char *wsb = aligned_alloc(256, 1024);
            assert_non_null(wsb);
            c = a, c.workspace = wsb + 64, expect_bad(lw, &c, ob, FM_ERR_MISALIGNED, "workspace + 64 bytes");
            assert_non_null(strstr(fm_last_error(), "256-byte aligned"));
            fm_layer_destroy(lw);
            free(wsb);
        }

        /* counts and offsets: copies changed one at a time */
        int32_t cnt[4], off[5];
        memcpy(cnt, dm.counts, sizeof cnt);
        cnt[1] = dm.cap + 1, c = a, c.counts = cnt, expect_bad(l, &c, ob, FM_ERR_BAD_SHAPE, "count > capacity");
        memcpy(cnt, dm.counts, sizeof cnt);
        cnt[2] = -1, c = a, c.counts = cnt, expect_bad(l, &c, ob, FM_ERR_BAD_SHAPE, "count -1");
        fm_layer_dispatch_args ar = dispatch_args(&dr, 0, out);
        memcpy(off, dr.offsets, sizeof off);
        off[0] = 1, c = ar, c.offsets = off, expect_bad(l, &c, ob, FM_ERR_BAD_SHAPE, "offsets[0] = 1");
        memcpy(off, dr.offsets, sizeof off);
        off[2] = off[3] + 1, c = ar, c.offsets = off, expect_bad(l, &c, ob, FM_ERR_BAD_SHAPE, "offsets decrease");
        memcpy(off, dr.offsets, sizeof off);
        off[4] = T * K + 1, c = ar, c.offsets = off; /* more rows than max_tokens x top_k (x holds none: not read) */
        expect_bad(l, &c, ob, FM_ERR_BAD_SHAPE, "rows > max_tokens x top_k");
        /* the args' bound: negative refused, the rows past it refused, a loose one runs */
        c = ar, c.max_rows = -1, expect_bad(l, &c, ob, FM_ERR_INVALID_ARG, "max_rows -1");
        if (dr.offsets[nl] > 1) { /* max_rows 0 would mean "not given" */
            c = ar, c.max_rows = dr.offsets[nl] - 1;
            expect_bad(l, &c, ob, FM_ERR_BAD_SHAPE, "rows > max_rows");
            c = a, c.max_rows = dr.offsets[nl] - 1; /* the expert-major layout's rows in all */
            expect_bad(l, &c, ob, FM_ERR_BAD_SHAPE, "expert-major rows > max_rows");
        }
        c = ar, c.max_rows = 1 << 30; /* past the layer's max_tokens x top_k: cut to it */
        assert_int_equal(fm_layer_run_dispatched(l, &c), FM_OK);
        c = ar, c.max_rows = dr.offsets[nl] > 0 ? dr.offsets[nl] : 1;
        assert_int_equal(fm_layer_run_dispatched(l, &c), FM_OK);
        fm_layer_dispatch_args big = a;
        int32_t                many[4] = {T, T, T, T}; /* capacity T + 2 each, 4T rows > T * K = 2T */
        big.counts = many, expect_bad(l, &big, ob, FM_ERR_BAD_SHAPE, "counts summing past max_tokens x top_k");

        /* a received row or weight not finite (the x slots past the counts are NaN already) */
        int e0 = 0;
        while (dm.counts[e0] == 0) e0++;
        const uint16_t keep = dm.x[(size_t)e0 * dm.cap * H + 3];
        dm.x[(size_t)e0 * dm.cap * H + 3] = 0x7f80; /* +Inf */
        expect_bad(l, &a, ob, FM_ERR_NONFINITE, "Inf in a received row");
        dm.x[(size_t)e0 * dm.cap * H + 3] = keep;
        const float wkeep = dm.w[(size_t)e0 * dm.cap];
        dm.w[(size_t)e0 * dm.cap] = NAN;
        expect_bad(l, &a, ob, FM_ERR_NONFINITE, "NaN weight of a received row");
        dm.w[(size_t)e0 * dm.cap] = wkeep;
        memset(out, POISON, ob);
        assert_int_equal(fm_layer_run_dispatched(l, &a), FM_OK); /* and the same call, mended, runs */

        /* the busy flag: a call while another holds the layer */
        assert_int_equal(fm_layer_test_hold(l, 1), FM_OK);
        expect_bad(l, &a, ob, FM_ERR_BUSY, "layer busy");
        assert_int_equal(fm_layer_test_hold(l, 0), FM_OK);
        fm_layer_destroy(l);
        dispatch_free(&dm), dispatch_free(&dr);
        free(out);
    }
    /* a layer with a shared expert (the shard at expert 0 holds it): refused */
    fm_moe_config cs = cfg;
    cs.shared_inter = 32;
    fx_layer S;
    fx_build(&S, &cs, &r, 0, 0);
    dispatch d0;
    dispatch_make(&d0, FM_DISPATCH_EXPERT_MAJOR, x, T, H, K, ids, wts, 0, nl);
    const size_t ob = sizeof(float) * dispatch_slots(&d0) * H;
    float       *out = fx_aligned(ob);
    for (int b = 0; b < 2; b++) {
        fm_layer              *l = fx_shard_layer(k_cpu[b], &S, T, 0, nl, FM_OUT_F32);
        fm_layer_dispatch_args a = dispatch_args(&d0, 0, out);
        expect_bad(l, &a, ob, FM_ERR_UNSUPPORTED, "a layer with a shared expert");
        fm_layer_destroy(l);
    }
    dispatch_free(&d0);
    free(out), free(x), free(ids), free(wts);
    fx_free(&S);
    fx_free(&L);
}

/* FP8 rows (x_fp8 + x_scales per 128 channels), as an FP8 dispatch sends them, into a W4A8
 * layer (act_fp8 = block128). With the layer's own scales (amax / 448 per block) the rows are
 * the numbers its own quantization of the BF16 rows makes: the output must be bit-identical
 * to the BF16 run. With power-of-two scales (UE8M0-style senders) the values differ a little:
 * cpu against cpu-ref within the accuracy table's W4A8 bound, and close to the BF16 run. The
 * slots no row was sent to hold E4M3 NaN codes and NaN scales: never read. Then the refusals. */
static void fp8_encode(const dispatch *d, int H, int pow2, uint8_t *q, float *sc)
{
    const int nb = (H + 127) / 128;
    for (size_t row = 0; row < dispatch_slots(d); row++) {
        const uint16_t *xr = d->x + row * H;
        if ((xr[0] & 0x7fff) == 0x7fc0) { /* a poisoned slot: NaN codes, NaN scales */
            memset(q + row * H, 0x7f, (size_t)H);
            for (int b = 0; b < nb; b++) sc[row * nb + b] = NAN;
            continue;
        }
        for (int b = 0; b < nb; b++) {
            const int b0 = b * 128, b1 = b0 + 128 < H ? b0 + 128 : H;
            float     amax = 0.0f;
            for (int i = b0; i < b1; i++) amax = fmaxf(amax, fabsf(fm_bf16_decode(xr[i])));
            float s = amax / 448.0f;
            if (!(s >= FLT_MIN)) s = 1.0f;
            if (pow2) s = ldexpf(1.0f, (int)ceilf(log2f(s)));
            sc[row * nb + b] = s;
            for (int i = b0; i < b1; i++) q[row * H + i] = fm_e4m3_encode(fm_bf16_decode(xr[i]) / s);
        }
    }
}

static void test_fp8_rows(void **st)
{
    (void)st;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0xf8d);
    const int E = 16, K = 4, H = 208, I = 64, T = fx_asan() ? 4 : 9, first = 4, nl = 6, nb = (H + 127) / 128;
    fm_moe_config cfg = fx_config(E, K, H, I, FM_FORMAT_NVFP4);
    cfg.act_fp8 = FM_ACT_FP8_BLOCK128; /* H = 208: a block of 128 and a short one of 80 */
    fx_layer L;
    fx_build(&L, &cfg, &r, 0, 0);
    uint16_t *x = fx_aligned(sizeof(uint16_t) * T * H), *xs = fx_bf16(&r, (size_t)T * H, 1.0f);
    memcpy(x, xs, sizeof(uint16_t) * T * H);
    free(xs);
    int32_t *ids = fx_aligned(sizeof(int32_t) * T * K);
    float   *wts = fx_aligned(sizeof(float) * T * K);
    fx_random_routing(&r, T, K, E, 0.1, ids, wts);
    force_local(ids, K, first);
    dispatch d;
    dispatch_make(&d, FM_DISPATCH_EXPERT_MAJOR, x, T, H, K, ids, wts, first, nl);
    const size_t slots = dispatch_slots(&d), ob = sizeof(float) * slots * H;
    uint8_t     *q = fx_aligned(slots * H);
    float       *sc = fx_aligned(sizeof(float) * slots * nb);
    float       *o16 = fx_aligned(ob), *o8 = fx_aligned(ob), *oref = fx_aligned(ob);
    for (int pow2 = 0; pow2 < 2; pow2++) {
        fp8_encode(&d, H, pow2, q, sc);
        for (int b = 0; b < 2; b++) {
            fm_layer              *l = fx_shard_layer(k_cpu[b], &L, T, first, nl, FM_OUT_F32);
            fm_layer_dispatch_args a = dispatch_args(&d, 0, o16);
            memset(o16, POISON, ob);
            assert_int_equal(fm_layer_run_dispatched(l, &a), FM_OK);
            a.x = NULL, a.x_fp8 = q, a.x_scales = sc, a.out = o8;
            memset(o8, POISON, ob);
            fm_status s = fm_layer_run_dispatched(l, &a);
            if (s != FM_OK) fail_msg("%s FP8 rows: %s: %s", fm_backend_name(k_cpu[b]), fm_status_name(s), fm_last_error());
            for (size_t row = 0; row < slots; row++) {
                const int got = received(&d, T, K, (int)row);
                for (int i = 0; i < H; i++) {
                    const float v = o8[row * H + i];
                    if (got && !isfinite(v)) fail_msg("FP8 rows: row %zu element %d not finite", row, i);
                    if (!got && memcmp(&o8[row * H + i], &o16[row * H + i], sizeof(float)))
                        fail_msg("FP8 rows: row %zu was not received but written", row);
                }
            }
            if (!pow2 && memcmp(o8, o16, ob))
                fail_msg("%s: FP8 rows with the layer's own scales differ from the BF16 rows' run",
                         fm_backend_name(k_cpu[b]));
            if (pow2) {
                double dd = 0, nn = 0;
                for (size_t row = 0; row < slots; row++)
                    if (received(&d, T, K, (int)row))
                        for (int i = 0; i < H; i++) {
                            const double u = o8[row * H + i], v = o16[row * H + i];
                            dd += (u - v) * (u - v), nn += v * v;
                        }
                print_message("# %s: FP8 rows with power-of-two scales vs the BF16 run: NMSE %.3g\n",
                              fm_backend_name(k_cpu[b]), dd / nn);
                assert_true(dd > 0 && dd / nn < 1e-2);
                if (b == 0) memcpy(oref, o8, ob);
                else {
                    double bound = -1;
                    assert_int_equal(fm_layer_accuracy(FM_BACKEND_CPU, &L.cfg, &bound), FM_OK);
                    for (size_t row = 0; row < slots; row++)
                        if (received(&d, T, K, (int)row)) {
                            char what[64];
                            snprintf(what, sizeof what, "FP8 rows, cpu vs cpu-ref, row %zu", row);
                            fm_assert_close(o8 + row * H, oref + row * H, (size_t)H, bound, what);
                        }
                }
            }
            fm_layer_destroy(l);
        }
    }

    /* refusals, out untouched */
    fp8_encode(&d, H, 0, q, sc);
    fm_layer              *l = fx_shard_layer(FM_BACKEND_CPU, &L, T, first, nl, FM_OUT_F32);
    fm_layer_dispatch_args a = dispatch_args(&d, 0, o8), c;
    a.x = NULL, a.x_fp8 = q, a.x_scales = sc;
    c = a, c.x = d.x, expect_bad(l, &c, ob, FM_ERR_INVALID_ARG, "x and x_fp8 both");
    c = a, c.x_fp8 = NULL, expect_bad(l, &c, ob, FM_ERR_INVALID_ARG, "neither x nor x_fp8");
    c = a, c.x_scales = NULL, expect_bad(l, &c, ob, FM_ERR_INVALID_ARG, "x_fp8 without x_scales");
    c = a, c.x_fp8 = q + 1, expect_bad(l, &c, ob, FM_ERR_MISALIGNED, "x_fp8 + 1 byte");
    c = a, c.x_scales = (const float *)((const char *)sc + 2), expect_bad(l, &c, ob, FM_ERR_MISALIGNED, "x_scales + 2");
    int e0 = 0;
    while (d.counts[e0] == 0) e0++;
    const size_t row0 = (size_t)e0 * d.cap; /* the first received row */
    const float  bad_scales[4] = {0.0f, -1.0f, NAN, INFINITY};
    for (int i = 0; i < 4; i++) {
        const float keep = sc[row0 * nb + 1];
        sc[row0 * nb + 1] = bad_scales[i];
        expect_bad(l, &a, ob, FM_ERR_NONFINITE, "a bad scale of a received row");
        if (!strstr(fm_last_error(), "x_scales")) fail_msg("the refusal should name x_scales: %s", fm_last_error());
        sc[row0 * nb + 1] = keep;
    }
    const uint8_t keepq = q[row0 * H + 130];
    q[row0 * H + 130] = 0xff; /* -NaN */
    expect_bad(l, &a, ob, FM_ERR_NONFINITE, "an E4M3 NaN code in a received row");
    q[row0 * H + 130] = keepq;
    fm_layer_destroy(l);
    for (int m = 0; m < 2; m++) { /* layers that are not W4A8 per 128 */
        fx_layer M = L;
        M.cfg.act_fp8 = m ? FM_ACT_FP8_TOKEN : FM_ACT_FP8_OFF;
        l = fx_shard_layer(FM_BACKEND_CPU, &M, T, first, nl, FM_OUT_F32);
        expect_bad(l, &a, ob, FM_ERR_INVALID_ARG, "FP8 rows to a layer not W4A8 per 128");
        if (!strstr(fm_last_error(), "FM_ACT_FP8_BLOCK128")) fail_msg("the refusal should say what: %s", fm_last_error());
        fm_layer_destroy(l);
    }
    free(q), free(sc), free(o16), free(o8), free(oref), free(x), free(ids), free(wts);
    dispatch_free(&d);
    fx_free(&L);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dispatched_equals_shard),
        cmocka_unit_test(test_dispatch_refusals),
        cmocka_unit_test(test_fp8_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
