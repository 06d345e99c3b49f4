/* names.c - tensor-name patterns ({L} layer, {E} expert, {P} projection),
 * the default patterns of each layout, and the scan that finds which layers
 * of a checkpoint hold routed experts.
 *
 * Matching is a small backtracking matcher over the pattern plus a fixed
 * suffix: literal bytes must match, {L}/{E} take 1-9 decimal digits, {P} a
 * non-empty run without '.', and a trailing '*' anything. Names are short
 * (< 200 bytes) and patterns have at most a few placeholders, so backtracking
 * is cheap even over a 100k-tensor checkpoint.
 */
#include "io_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAT_MAX 512

typedef struct {
    int    layer, expert;
    char  *proj;
    size_t proj_len;
} caps;

static int match_rec(const char *p, const char *n, caps *c)
{
    while (*p) {
        if (p[0] == '*' && !p[1]) return 1;
        if (p[0] == '{' && (p[1] == 'L' || p[1] == 'E') && p[2] == '}') {
            int v = 0, k = 0;
            while (n[k] >= '0' && n[k] <= '9' && k < 9) v = v * 10 + (n[k++] - '0');
            if (!k || (n[k] >= '0' && n[k] <= '9')) return 0;
            if (p[1] == 'L') c->layer = v;
            else c->expert = v;
            p += 3;
            n += k;
            continue;
        }
        if (p[0] == '{' && p[1] == 'P' && p[2] == '}') {
            size_t run = strcspn(n, ".");
            for (size_t k = run; k >= 1; k--) { /* longest first, back off */
                if (match_rec(p + 3, n + k, c)) {
                    if (c->proj && c->proj_len) {
                        size_t m = k < c->proj_len - 1 ? k : c->proj_len - 1;
                        memcpy(c->proj, n, m);
                        c->proj[m] = '\0';
                    }
                    return 1;
                }
            }
            return 0;
        }
        if (*p != *n) return 0;
        p++;
        n++;
    }
    return *n == '\0';
}

int fm_pat_match(const char *pat, const char *suffix, const char *name, int *layer, int *expert, char *proj,
                 size_t proj_len)
{
    char full[PAT_MAX];
    if (snprintf(full, sizeof full, "%s%s", pat, suffix ? suffix : "") >= (int)sizeof full) return 0;
    caps c = {-1, -1, proj, proj_len};
    if (!match_rec(full, name, &c)) return 0;
    if (layer) *layer = c.layer;
    if (expert) *expert = c.expert;
    return 1;
}

int fm_pat_format(char *buf, size_t len, const char *pat, int layer, int expert, const char *proj, const char *suffix)
{
    size_t o = 0;
    for (const char *p = pat; *p;) {
        char tmp[32];
        const char *ins = NULL;
        if (p[0] == '{' && p[1] && p[2] == '}' && (p[1] == 'L' || p[1] == 'E' || p[1] == 'P')) {
            if (p[1] == 'P') ins = proj ? proj : "";
            else {
                snprintf(tmp, sizeof tmp, "%d", p[1] == 'L' ? layer : expert);
                ins = tmp;
            }
            p += 3;
        } else {
            tmp[0] = *p++;
            tmp[1] = '\0';
            ins = tmp;
        }
        size_t k = strlen(ins);
        if (o + k >= len) return 0;
        memcpy(buf + o, ins, k);
        o += k;
    }
    size_t k = suffix ? strlen(suffix) : 0;
    if (o + k >= len) return 0;
    memcpy(buf + o, suffix ? suffix : "", k);
    buf[o + k] = '\0';
    return 1;
}

const char *fm_ckpt_layout_name(fm_ckpt_layout l)
{
    switch (l) {
    case FM_LAYOUT_AUTO: return "auto";
    case FM_LAYOUT_MODELOPT: return "modelopt";
    case FM_LAYOUT_GPT_OSS: return "gpt-oss";
    case FM_LAYOUT_COMPRESSED_TENSORS: return "compressed-tensors";
    }
    return "?";
}

fm_status fm_ckpt_names_default(fm_ckpt_layout layout, fm_ckpt_names *out)
{
    if (!out) return fm_fail(FM_ERR_INVALID_ARG, "fm_ckpt_names_default: out is NULL");
    switch (layout) {
    case FM_LAYOUT_AUTO:
    case FM_LAYOUT_MODELOPT:
        *out = (fm_ckpt_names){
            .layout = FM_LAYOUT_MODELOPT,
            .expert = "model.layers.{L}.mlp.experts.{E}.{P}",
            .proj_gate = "gate_proj",
            .proj_up = "up_proj",
            .proj_down = "down_proj",
            .router = "model.layers.{L}.mlp.gate.weight",
            .router_bias = "model.layers.{L}.mlp.gate.e_score_correction_bias",
            .shared = "model.layers.{L}.mlp.shared_experts.{P}",
        };
        return FM_OK;
    case FM_LAYOUT_COMPRESSED_TENSORS: /* ModelOpt's names; the suffixes differ (weight_suffix) */
        FM_CHECK(fm_ckpt_names_default(FM_LAYOUT_MODELOPT, out));
        out->layout = FM_LAYOUT_COMPRESSED_TENSORS;
        return FM_OK;
    case FM_LAYOUT_GPT_OSS:
        *out = (fm_ckpt_names){
            .layout = FM_LAYOUT_GPT_OSS,
            .expert = "model.layers.{L}.mlp.experts.{P}",
            .proj_gate = "gate_up_proj",
            .proj_up = NULL,
            .proj_down = "down_proj",
            .router = "model.layers.{L}.mlp.router.weight",
            .router_bias = NULL,
            .shared = NULL,
        };
        return FM_OK;
    }
    return fm_fail(FM_ERR_INVALID_ARG, "unknown checkpoint layout %d", (int)layout);
}

void fm_ckpt_scan_free(fm_ckpt_scan *s)
{
    if (!s) return;
    free(s->layers);
    free(s->experts);
    free(s->found);
    memset(s, 0, sizeof *s);
}

typedef struct {
    int l, e;
} lepair;

static int cmp_le(const void *a, const void *b)
{
    const lepair *x = a, *y = b;
    if (x->l != y->l) return x->l < y->l ? -1 : 1;
    return (x->e > y->e) - (x->e < y->e);
}

static int is_proj(const fm_ckpt_names *nm, const char *p)
{
    return (nm->proj_gate && !strcmp(p, nm->proj_gate)) || (nm->proj_up && !strcmp(p, nm->proj_up)) ||
           (nm->proj_down && !strcmp(p, nm->proj_down));
}

/* The weight tensor suffix that marks an expert in each layout. */
static const char *weight_suffix(fm_ckpt_layout l)
{
    return l == FM_LAYOUT_GPT_OSS ? "_blocks" : l == FM_LAYOUT_COMPRESSED_TENSORS ? ".weight_packed" : ".weight";
}

static size_t count_matches(const fm_checkpoint *ck, const fm_ckpt_names *nm)
{
    size_t n = 0;
    char proj[64];
    for (size_t i = 0; i < fm_checkpoint_tensor_count(ck); i++)
        if (fm_pat_match(nm->expert, weight_suffix(nm->layout), fm_checkpoint_tensor_at(ck, i)->name, NULL, NULL, proj,
                         sizeof proj) &&
            is_proj(nm, proj))
            n++;
    return n;
}

/* Longest suffix the loader appends to a pattern (".weight_scale_2"), with room. */
#define SUFFIX_MAX 16
/* Longest projection name: {P} captures into 64-byte buffers. */
#define PROJ_MAX 63

/* A projection name {P} can match: 1..PROJ_MAX bytes, no '.'. */
static fm_status check_proj(const char *what, const char *p)
{
    if (!p) return FM_OK;
    size_t n = strlen(p);
    if (!n || n > PROJ_MAX || strchr(p, '.'))
        return fm_fail(FM_ERR_INVALID_ARG,
                       "checkpoint names: %s '%.80s%s' (%zu bytes) must be 1-%d bytes without '.'", what, p,
                       n > 80 ? "..." : "", n, PROJ_MAX);
    return FM_OK;
}

/* Every name a pattern can produce ({L}/{E} at most 11 characters, {P} at
 * most PROJ_MAX, plus a suffix) must fit the PAT_MAX-byte name buffers:
 * otherwise lookups would fail as "not found" rather than as the bad
 * argument they are. */
static fm_status check_pattern(const char *what, const char *pat)
{
    if (!pat) return FM_OK;
    size_t n = SUFFIX_MAX, raw = strlen(pat);
    for (const char *p = pat; *p;) {
        if (p[0] == '{' && (p[1] == 'L' || p[1] == 'E' || p[1] == 'P') && p[2] == '}') {
            n += p[1] == 'P' ? PROJ_MAX : 11;
            p += 3;
        } else {
            n++;
            p++;
        }
    }
    if (!raw || n >= PAT_MAX || raw + SUFFIX_MAX >= PAT_MAX)
        return fm_fail(FM_ERR_INVALID_ARG,
                       "checkpoint names: %s pattern '%.80s%s' (%zu bytes) is empty or can make names longer than %d "
                       "bytes",
                       what, pat, raw > 80 ? "..." : "", raw, PAT_MAX - 1);
    return FM_OK;
}

/* Resolve names: given ones, or the layout whose weight pattern matches. */
fm_status fm_ckpt_names_resolve(const fm_checkpoint *ck, const fm_ckpt_names *given, fm_ckpt_names *nm)
{
    if (given && given->layout != FM_LAYOUT_AUTO) {
        if (given->layout != FM_LAYOUT_MODELOPT && given->layout != FM_LAYOUT_GPT_OSS &&
            given->layout != FM_LAYOUT_COMPRESSED_TENSORS)
            return fm_fail(FM_ERR_INVALID_ARG, "checkpoint names: unknown layout %d", (int)given->layout);
        if (!given->expert || !given->proj_gate || !given->proj_down || !given->router)
            return fm_fail(FM_ERR_INVALID_ARG, "checkpoint names: expert, proj_gate, proj_down and router are required");
        if ((given->layout == FM_LAYOUT_MODELOPT || given->layout == FM_LAYOUT_COMPRESSED_TENSORS) && !given->proj_up)
            return fm_fail(FM_ERR_INVALID_ARG, "checkpoint names: the modelopt layout needs proj_up");
        FM_CHECK(check_pattern("expert", given->expert));
        FM_CHECK(check_pattern("router", given->router));
        FM_CHECK(check_pattern("router_bias", given->router_bias));
        FM_CHECK(check_pattern("shared", given->shared));
        FM_CHECK(check_proj("proj_gate", given->proj_gate));
        FM_CHECK(check_proj("proj_up", given->proj_up));
        FM_CHECK(check_proj("proj_down", given->proj_down));
        *nm = *given;
        return FM_OK;
    }
    fm_ckpt_names mo, go, ct;
    fm_ckpt_names_default(FM_LAYOUT_MODELOPT, &mo);
    fm_ckpt_names_default(FM_LAYOUT_GPT_OSS, &go);
    fm_ckpt_names_default(FM_LAYOUT_COMPRESSED_TENSORS, &ct);
    size_t a = count_matches(ck, &mo), b = count_matches(ck, &go), d = count_matches(ck, &ct);
    if (!a && !b && !d)
        return fm_fail(FM_ERR_NOT_FOUND,
                       "no routed-expert tensors: none of %s.weight (ModelOpt), %s.weight_packed (compressed-tensors) "
                       "or %s_blocks (gpt-oss) matches any of the %zu tensors",
                       mo.expert, ct.expert, go.expert, fm_checkpoint_tensor_count(ck));
    *nm = d > a && d >= b ? ct : a >= b ? mo : go;
    return FM_OK;
}

fm_status fm_checkpoint_scan(const fm_checkpoint *ck, const fm_ckpt_names *names, fm_ckpt_scan *out)
{
    fm_clear_error();
    if (!ck || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_checkpoint_scan: NULL argument");
    memset(out, 0, sizeof *out);
    fm_ckpt_names nm;
    FM_CHECK(fm_ckpt_names_resolve(ck, names, &nm));
    size_t nt = fm_checkpoint_tensor_count(ck), np = 0;
    lepair *pairs = malloc((nt + 1) * sizeof *pairs);
    if (!pairs) return fm_fail(FM_ERR_OOM, "out of memory scanning %zu tensors", nt);
    const char *wsuf = weight_suffix(nm.layout);
    int fmt_set = 0;
    fm_ckpt_scan r = {.layout = nm.layout};
    char proj[64], any[PAT_MAX];
    snprintf(any, sizeof any, "%s*", nm.layout == FM_LAYOUT_GPT_OSS ? "_" : ".");
    for (size_t i = 0; i < nt; i++) {
        const fm_st_tensor *t = fm_checkpoint_tensor_at(ck, i);
        int L, E;
        if (!fm_pat_match(nm.expert, any, t->name, &L, &E, proj, sizeof proj) || !is_proj(&nm, proj)) continue;
        r.expert_bytes += t->nbytes;
        if (!fm_pat_match(nm.expert, wsuf, t->name, &L, &E, proj, sizeof proj)) continue;
        fm_format f;
        if (nm.layout == FM_LAYOUT_GPT_OSS) {
            if (t->dtype != FM_DTYPE_U8 || t->ndim != 4) {
                free(pairs);
                return fm_fail(FM_ERR_FORMAT, "%s: tensor '%s' is %s with %d dims, expected U8 [E][N][K/32][16]",
                               t->file, t->name, fm_dtype_name(t->dtype), t->ndim);
            }
            f = FM_FORMAT_MXFP4;
            E = (int)(t->shape[0] < 65536 ? t->shape[0] : 65536) - 1; /* fused: dim 0 holds the experts */
        } else if (t->dtype == FM_DTYPE_U8) {
            f = FM_FORMAT_NVFP4;
        } else if (t->dtype == FM_DTYPE_BF16) {
            f = FM_FORMAT_BF16;
        } else {
            free(pairs);
            return fm_fail(FM_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected U8 (NVFP4) or BF16", t->file, t->name,
                           fm_dtype_name(t->dtype));
        }
        if (!fmt_set) r.wfmt = f, fmt_set = 1;
        pairs[np].l = L;
        pairs[np++].e = E;
    }
    if (!np) {
        free(pairs);
        return fm_fail(FM_ERR_NOT_FOUND, "no tensor matches %s%s", nm.expert, wsuf);
    }
    qsort(pairs, np, sizeof *pairs, cmp_le);
    r.layers = calloc(np, sizeof *r.layers);
    r.experts = calloc(np, sizeof *r.experts);
    r.found = calloc(np, sizeof *r.found);
    if (!r.layers || !r.experts || !r.found) {
        free(pairs);
        fm_ckpt_scan_free(&r);
        return fm_fail(FM_ERR_OOM, "out of memory");
    }
    for (size_t i = 0; i < np; i++) {
        int newl = !r.n_layers || r.layers[r.n_layers - 1] != pairs[i].l;
        if (newl) r.layers[r.n_layers++] = pairs[i].l;
        int k = r.n_layers - 1;
        if (pairs[i].e + 1 > r.experts[k]) r.experts[k] = pairs[i].e + 1;
        if (newl || pairs[i].e != pairs[i - 1].e) r.found[k]++;
    }
    if (nm.layout == FM_LAYOUT_GPT_OSS)
        for (int k = 0; k < r.n_layers; k++) r.found[k] = r.experts[k];
    free(pairs);
    *out = r;
    return FM_OK;
}

/* The literal start of pattern `pat` for `layer`: the text before its first
 * {E} or {P}, with {L} substituted. 0 if it does not fit. */
static int pat_prefix(const char *pat, int layer, char *buf, size_t len)
{
    const char *e = strstr(pat, "{E}"), *p = strstr(pat, "{P}");
    const char *stop = !e ? p : !p ? e : e < p ? e : p;
    size_t k = stop ? (size_t)(stop - pat) : strlen(pat);
    char head[PAT_MAX];
    if (k >= sizeof head) return 0;
    memcpy(head, pat, k);
    head[k] = '\0';
    return fm_pat_format(buf, len, head, layer, 0, NULL, NULL);
}

fm_status fm_ckpt_check_expert_indices(const fm_checkpoint *ck, const fm_ckpt_names *nm, int layer, int n_total)
{
    if (!strstr(nm->expert, "{E}")) return FM_OK; /* fused layouts: dim 0 holds the experts, checked by shape */
    char pre[PAT_MAX], proj[64];
    if (!pat_prefix(nm->expert, layer, pre, sizeof pre)) return FM_OK; /* names were validated: cannot happen */
    const size_t pl = strlen(pre), nt = fm_checkpoint_tensor_count(ck);
    /* Names are sorted: the layer's expert tensors are the run starting with pre. */
    size_t lo = 0, hi = nt;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(fm_checkpoint_tensor_at(ck, mid)->name, pre) < 0) lo = mid + 1;
        else hi = mid;
    }
    const char *any = nm->layout == FM_LAYOUT_GPT_OSS ? "_*" : ".*";
    for (size_t i = lo; i < nt; i++) {
        const fm_st_tensor *t = fm_checkpoint_tensor_at(ck, i);
        if (strncmp(t->name, pre, pl)) break;
        int L, e;
        if (!fm_pat_match(nm->expert, any, t->name, &L, &e, proj, sizeof proj) || (L >= 0 && L != layer) ||
            !is_proj(nm, proj))
            continue;
        if (e >= n_total)
            return fm_fail(FM_ERR_FORMAT,
                           "%s: tensor '%s' has expert index %d, but layer %d's router has %d experts [0, %d): a "
                           "stray or misnumbered expert",
                           t->file, t->name, e, layer, n_total, n_total);
    }
    return FM_OK;
}
