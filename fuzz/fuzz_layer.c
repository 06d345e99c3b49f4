/* fuzz_layer.c - libFuzzer target over the layer API on the CPU backends (cpu-ref and cpu):
 * the input drives a configuration (sizes, format, scoring, groups, routed scale, activation
 * and its limit, shared expert, W4A4 / W4A8, a bad value now and then), a layer descriptor
 * (backend, max_tokens, shard, output type) and weights quantized with fm_quantize (NaN / Inf
 * planted in the router, its bias, the expert biases or the shared expert at times, NULL
 * tensors at times), then runs of the layer with internal or external routing (ids in
 * [-2, n_experts + 1], weights with NaN at times, NaN / Inf / huge x at times). What must hold:
 *  - create returns a status; on failure the layer pointer stays NULL;
 *  - every run returns a status; on failure out, routed_ids and routed_weights are byte for
 *    byte what the caller put there (layer.h: "CPU backends ... leave out untouched");
 *  - the same for a run of dispatched rows (fm_layer_run_dispatched: expert-major with counts
 *    and capacity, or expert rows with offsets, hostile at times), whose received rows are
 *    written and finite on success;
 *  - on success out holds no poison (every element written) and no NaN / Inf (the CPU
 *    backends report an overflowed output as FM_ERR_NONFINITE);
 *  - nothing leaks, reads or writes out of bounds or hits undefined behaviour (ASan, UBSan,
 *    LeakSanitizer: fuzz/run.sh builds with them).
 * Any breach aborts (a finding). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp4moe/tools.h"
#include "fm_rng.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
    const uint8_t *p;
    size_t         n, i;
} rd;

static unsigned take(rd *r) { return r->i < r->n ? r->p[r->i++] : 0u; }
static unsigned pick(rd *r, unsigned n) { return take(r) % n; }
/* a rare branch: 1 in n, never on a zero byte (a short input reads zeros: the usual path) */
static int rare(rd *r, unsigned n) { return take(r) % n == n - 1; }

#define POISON 0xA5

static int all_poison(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != POISON) return 0;
    return 1;
}

/* elements [i0, i0 + n) of out (dtype dt) written and finite: none left as the poison, no NaN / Inf */
static int written(const void *out, size_t i0, size_t n, fm_out_dtype dt)
{
    for (size_t i = i0; i < i0 + n; i++) {
        if (dt == FM_OUT_BF16) {
            const uint16_t v = ((const uint16_t *)out)[i];
            if ((v & 0x7f80u) == 0x7f80u || v == 0xA5A5u) return 0;
        } else if (!isfinite(((const float *)out)[i]) || ((const uint32_t *)out)[i] == 0xA5A5A5A5u)
            return 0;
    }
    return 1;
}

/* one float of a small menu: ordinary values and the ones a layer must refuse */
static float odd_float(rd *r, float usual)
{
    static const float menu[] = {0.0f, -1.0f, 1e-40f, 3.0e38f, 0.5f, 2.5f, 7.0f};
    const unsigned     k = pick(r, 12);
    if (k < 5) return usual;
    if (k == 5) return NAN;
    if (k == 6) return INFINITY;
    return menu[k - 7];
}

/* n quantized experts of rows x cols in format f, or NULL when the shape cannot be quantized */
static fm_qtensor *experts(fm_rng *g, fm_format f, int n, int rows, int cols)
{
    size_t db = 0, sb = 0;
    if (n <= 0 || rows <= 0 || cols <= 0 || fm_qtensor_bytes(f, rows, cols, &db, &sb) != FM_OK) return NULL;
    fm_qtensor *q = calloc((size_t)n, sizeof *q);
    float      *src = malloc(sizeof(float) * (size_t)rows * cols);
    if (!q || !src) abort();
    for (int e = 0; e < n; e++) {
        fm_rng_fill_normal(g, src, (size_t)rows * cols, 1.0f / sqrtf((float)cols));
        q[e] = (fm_qtensor){.fmt = f, .rows = rows, .cols = cols, .data = malloc(db), .scales = sb ? malloc(sb) : NULL};
        if (!q[e].data || (sb && !q[e].scales)) abort();
        if (fm_quantize(src, NULL, &q[e]) != FM_OK) abort(); /* finite N(0, 1/K) values: always quantizable */
    }
    free(src);
    return q;
}

static void experts_free(fm_qtensor *q, int n)
{
    if (!q) return;
    for (int e = 0; e < n; e++) free(q[e].data), free(q[e].scales);
    free(q);
}

static float *floats(fm_rng *g, size_t n, float sigma, rd *r)
{
    if (!n) return NULL;
    float *v = malloc(sizeof(float) * n);
    if (!v) abort();
    fm_rng_fill_normal(g, v, n, sigma);
    if (rare(r, 8)) v[take(r) % n] = odd_float(r, NAN); /* a planted bad value, at times */
    return v;
}

static uint16_t *bf16s(fm_rng *g, size_t n, float sigma)
{
    if (!n) return NULL;
    uint16_t *v = malloc(sizeof(uint16_t) * n);
    if (!v) abort();
    for (size_t i = 0; i < n; i++) v[i] = fm_bf16_encode(sigma * fm_rng_normal(g));
    return v;
}

/* FM_FUZZ_STATS=1: at exit, how many inputs created a layer and how many runs passed (the
 * target's reach: a fuzzer whose layers are all refused tests only the refusals) */
static unsigned long n_in, n_created, n_runs, n_ok, n_disp, n_disp_ok;
static void stats(void)
{
    fprintf(stderr, "fuzz_layer: %lu inputs, %lu layers, %lu runs (%lu FM_OK), %lu dispatched runs (%lu FM_OK)\n", n_in,
            n_created, n_runs, n_ok, n_disp, n_disp_ok);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int once;
    if (!once++ && getenv("FM_FUZZ_STATS")) atexit(stats);
    n_in++;
    rd     r = {data, size, 0};
    fm_rng g;
    fm_rng_init(&g, take(&r) | take(&r) << 8);

    /* the configuration: mostly valid, now and then not */
    static const int   hs[] = {32, 64, 128, 96, 16, 0, 33, 48};
    static const int   is[] = {16, 32, 64, 8, 0, 17};
    fm_moe_config      c;
    fm_moe_config_default(&c);
    c.n_experts = 1 + (int)pick(&r, 12);
    c.top_k = !rare(&r, 8) ? 1 + (int)pick(&r, (unsigned)c.n_experts) : (int)pick(&r, (unsigned)c.n_experts + 3);
    c.hidden = hs[pick(&r, 8)];
    c.inter = is[pick(&r, 6)];
    c.wfmt = !rare(&r, 16) ? (fm_format)(pick(&r, 2) ? FM_FORMAT_MXFP4 : FM_FORMAT_NVFP4) : (fm_format)(take(&r) % 9);
    c.score = !rare(&r, 16) ? (fm_score_func)pick(&r, 3) : (fm_score_func)(take(&r) % 7);
    if (rare(&r, 4)) c.n_group = (int)pick(&r, 5), c.topk_group = (int)pick(&r, 5);
    c.renormalize = !rare(&r, 8) ? (int)pick(&r, 2) : (int)pick(&r, 4);
    c.routed_scale = odd_float(&r, pick(&r, 2) ? 1.0f : 2.5f);
    if (rare(&r, 3)) {
        c.activation = !rare(&r, 8) ? FM_ACT_SWIGLU_GPTOSS : (fm_activation)(take(&r) % 4);
        c.swiglu_limit = odd_float(&r, 7.0f);
    }
    if (rare(&r, 4)) c.shared_inter = (int)(8 * pick(&r, 5) + rare(&r, 8));
    const unsigned act = pick(&r, 8);
    if (act == 1) c.act_nvfp4 = 1;
    if (act == 2) c.act_fp8 = (fm_act_fp8)(1 + pick(&r, 2));
    if (act == 3) c.act_fp8 = (fm_act_fp8)(take(&r) % 5);

    /* the descriptor: shards, output type, backend */
    fm_layer_desc d;
    memset(&d, 0, sizeof d);
    d.backend = pick(&r, 2) ? FM_BACKEND_CPU : FM_BACKEND_CPU_REF;
    d.max_tokens = !rare(&r, 16) ? 1 + (int)pick(&r, 8) : (int)pick(&r, 3) - 1;
    d.out_dtype = !rare(&r, 4) ? FM_OUT_F32 : (fm_out_dtype)pick(&r, 3);
    if (rare(&r, 3)) {
        d.first_expert = (int)pick(&r, (unsigned)c.n_experts + 1);
        d.n_local = (int)pick(&r, (unsigned)c.n_experts + 2);
        if (rare(&r, 16)) d.first_expert = -1;
    }
    /* the experts the weights hold: n_local, or (0) those from first_expert on (layer.h) */
    const int nl = d.n_local ? d.n_local : c.n_experts - d.first_expert;

    /* the weights (a NULL tensor at times) */
    const int H = c.hidden, I = c.inter, E = c.n_experts, S = c.shared_inter;
    const int fmt_ok = c.wfmt == FM_FORMAT_NVFP4 || c.wfmt == FM_FORMAT_MXFP4;
    fm_qtensor *w13 = fmt_ok && !rare(&r, 32) ? experts(&g, c.wfmt, nl, 2 * I, H) : NULL;
    fm_qtensor *w2 = fmt_ok && !rare(&r, 32) ? experts(&g, c.wfmt, nl, H, I) : NULL;
    float      *router = H > 0 && !rare(&r, 32) ? floats(&g, (size_t)E * H, 0.1f, &r) : NULL;
    float      *rbias = H > 0 && rare(&r, 2) ? floats(&g, (size_t)E, 0.3f, &r) : NULL;
    float      *b13 = I > 0 && nl > 0 && rare(&r, 4) ? floats(&g, (size_t)nl * 2 * I, 0.1f, &r) : NULL;
    float      *b2 = H > 0 && nl > 0 && rare(&r, 4) ? floats(&g, (size_t)nl * H, 0.1f, &r) : NULL;
    uint16_t   *sw13 = S > 0 && H > 0 && !rare(&r, 16) ? bf16s(&g, (size_t)2 * S * H, 0.05f) : NULL;
    uint16_t   *sw2 = S > 0 && H > 0 && !rare(&r, 16) ? bf16s(&g, (size_t)S * H, 0.05f) : NULL;
    if (sw13 && rare(&r, 16)) sw13[take(&r) % ((size_t)2 * S * H)] = 0x7fc0; /* NaN */
    fm_moe_weights w = {.router_w = router, .router_bias = rbias, .w13 = w13, .w2 = w2, .shared_w13 = sw13,
                        .shared_w2 = sw2, .w13_bias = b13, .w2_bias = b2};

    fm_layer *l = NULL;
    fm_status s = fm_layer_create_desc(&d, &c, &w, &l);
    if ((s == FM_OK) != (l != NULL)) abort();
    n_created += l != NULL;
    const int disp = rare(&r, 2); /* then a run of dispatched rows after the runs */

    /* runs */
    for (int run = 0; l && run < (disp ? 1 : 3) && r.i < r.n; run++) {
        const int T = !rare(&r, 16) ? 1 + (int)pick(&r, (unsigned)d.max_tokens) : (int)pick(&r, (unsigned)d.max_tokens + 3) - 1;
        const int K = c.top_k, Tn = T > 0 ? T : 1;
        const size_t ob = (size_t)Tn * H * (d.out_dtype == FM_OUT_BF16 ? 2 : 4);
        uint16_t    *x = bf16s(&g, (size_t)Tn * H, 1.0f);
        void        *out = malloc(ob);
        int32_t     *ids = NULL, *rids = NULL;
        float       *wts = NULL, *rw = NULL;
        if (!x || !out) abort();
        if (rare(&r, 6)) x[take(&r) % ((size_t)Tn * H)] = pick(&r, 2) ? 0x7fc0 : 0x7f80; /* NaN / Inf */
        if (rare(&r, 12)) x[take(&r) % ((size_t)Tn * H)] = fm_bf16_encode(3.0e38f);     /* overflows */
        const int external = pick(&r, 2);
        if (external && K > 0) {
            ids = malloc(sizeof(int32_t) * Tn * K), wts = malloc(sizeof(float) * Tn * K);
            if (!ids || !wts) abort();
            for (int i = 0; i < Tn * K; i++) {
                ids[i] = !rare(&r, 16) ? (int)pick(&r, (unsigned)E) : (int)pick(&r, (unsigned)E + 4) - 2;
                wts[i] = !rare(&r, 32) ? 0.1f + 0.2f * fm_rng_uniform(&g) : odd_float(&r, NAN);
            }
        } else if (K > 0 && rare(&r, 3)) { /* internal routing reporting its choice */
            rids = malloc(sizeof(int32_t) * Tn * K), rw = malloc(sizeof(float) * Tn * K);
            if (!rids || !rw) abort();
            memset(rids, POISON, sizeof(int32_t) * Tn * K), memset(rw, POISON, sizeof(float) * Tn * K);
        }
        memset(out, POISON, ob);
        fm_layer_run_args a = {.x = x, .T = T, .out = out, .topk_ids = ids, .topk_weights = wts,
                               .routed_ids = rids, .routed_weights = rw};
        s = fm_layer_run(l, &a);
        n_runs++, n_ok += s == FM_OK;
        if (s != FM_OK) {
            if (!all_poison(out, ob)) abort(); /* out untouched on failure */
            if (rids && (!all_poison(rids, sizeof(int32_t) * Tn * K) || !all_poison(rw, sizeof(float) * Tn * K)))
                abort();
        } else if (!written(out, 0, (size_t)T * H, d.out_dtype))
            abort();
        free(x), free(out), free(ids), free(wts), free(rids), free(rw);
    }

    /* dispatched rows (expert parallelism): counts / offsets / capacity / max_rows hostile at
     * times; CPU backends check all before writing: out untouched on failure */
    if (l && disp) {
        const int     major = !rare(&r, 2), cap = !rare(&r, 8) ? 1 + (int)pick(&r, 4) : (int)pick(&r, 3) - 1;
        const int     nrows = major ? nl * (cap > 0 ? cap : 1) : (int)pick(&r, 12);
        const size_t  nr1 = (size_t)(nrows > 0 ? nrows : 1), elems = nr1 * (size_t)(H > 0 ? H : 1); /* buffers' */
        const size_t  ob = elems * (d.out_dtype == FM_OUT_BF16 ? 2 : 4);
        uint16_t     *x = bf16s(&g, elems, 1.0f);
        int32_t      *cnt = malloc(sizeof(int32_t) * (size_t)nl), *off = malloc(sizeof(int32_t) * (size_t)(nl + 1));
        float        *dw = rare(&r, 2) ? floats(&g, nr1, 0.2f, &r) : NULL;
        void         *out = malloc(ob);
        if (!x || !cnt || !off || !out) abort();
        for (int e = 0; e < nl; e++) cnt[e] = !rare(&r, 16) ? (int)pick(&r, (unsigned)(cap > 0 ? cap + 1 : 1)) : (int)pick(&r, 8) - 3;
        off[0] = rare(&r, 16) ? 1 : 0;
        /* non-decreasing up to nrows (x's rows: offsets[n_local] is the rows x holds, which the
         * layer cannot check), or decreasing at times */
        for (int e = 0; e < nl; e++) {
            const int room = nrows - off[e];
            off[e + 1] = off[e] + (room > 0 ? (int)pick(&r, (unsigned)room + 1) : 0);
            if (rare(&r, 16)) off[e + 1] = off[e] - 1;
        }
        memset(out, POISON, ob);
        fm_layer_dispatch_args da = {.layout = rare(&r, 32) ? (fm_dispatch_layout)7
                                               : major ? FM_DISPATCH_EXPERT_MAJOR : FM_DISPATCH_EXPERT_ROWS,
                                     .x = x, .counts = major ? cnt : NULL, .capacity = cap,
                                     .offsets = major ? NULL : off, .weights = dw, .out = out,
                                     .max_rows = rare(&r, 8) ? (int)pick(&r, 6) - 1 : 0};
        s = fm_layer_run_dispatched(l, &da);
        n_disp++, n_disp_ok += s == FM_OK;
        if (s != FM_OK && !all_poison(out, ob)) abort(); /* out untouched on failure */
        if (s == FM_OK && d.out_dtype == FM_OUT_F32) /* every received row written and finite */
            for (int e = 0; e < nl; e++) {
                const int b0 = major ? e * cap : off[e], n = major ? cnt[e] : off[e + 1] - off[e];
                if (!written(out, (size_t)b0 * H, (size_t)n * H, FM_OUT_F32)) abort();
            }
        free(x), free(cnt), free(off), free(dw), free(out);
    }
    fm_layer_destroy(l);
    experts_free(w13, nl), experts_free(w2, nl);
    free(router), free(rbias), free(b13), free(b2), free(sw13), free(sw2);
    return 0;
}
