/* test_io_fixture.h - what the checkpoint tests share (tests/test_io_*.c):
 * a temp folder per program, an in-memory random layer quantized with
 * fm_quantize, a list of tensors assigned to two shards that a test can
 * corrupt before writing, and the bit-exact comparisons.  Functions are
 * static inline so a program that uses only some of them stays warning-free.
 */
#ifndef FM_TEST_IO_FIXTURE_H
#define FM_TEST_IO_FIXTURE_H

#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { E = 4, H = 64, I = 32, SI = 32, T = 16, LAYER = 1, MAXI = 320 };

static char g_dir[256];

static inline int setup(void **state)
{
    (void)state;
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/fm_io_ck_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    return mkdtemp(g_dir) ? 0 : -1;
}

static inline int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* A fresh sub-folder of the test's temp dir. */
static inline const char *subdir(const char *name)
{
    static char p[300];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", p, p);
    assert_int_equal(system(cmd), 0);
    return p;
}

/* ---- an in-memory layer ---------------------------------------------------- */

typedef struct {
    fm_moe_config cfg;
    fm_qtensor    w13[E], w2[E];
    uint8_t      *buf[2 * E][2];
    uint16_t      router_bf16[E * H];
    float         router_w[E * H], bias[E], a1[E], a2[E], g_in[E];
    uint16_t      sh13[2 * SI * H], sh2[H * SI];
    /* gpt-oss expert biases: as the checkpoint holds them (BF16, gate_up rows interleaved)
     * and as fp4moe's layer takes them (FP32, gate rows then up rows) */
    uint16_t      gu_bias_bf16[E * 2 * I], dn_bias_bf16[E * H];
    float         b13[E * 2 * I], b2[E * H];
    fm_moe_weights w;
} model;

static inline void quantize_into(fm_rng *r, fm_format f, int64_t rows, int64_t cols, fm_qtensor *q, uint8_t **bufs)
{
    size_t db, sb;
    assert_int_equal(fm_qtensor_bytes(f, rows, cols, &db, &sb), FM_OK);
    float *src = malloc((size_t)(rows * cols) * sizeof *src);
    fm_rng_fill_normal(r, src, (size_t)(rows * cols), 0.05f);
    bufs[0] = malloc(db);
    bufs[1] = sb ? malloc(sb) : NULL;
    *q = (fm_qtensor){.fmt = f, .rows = rows, .cols = cols, .data = bufs[0], .scales = bufs[1], .global_scale = 1.0f};
    assert_int_equal(fm_quantize(src, NULL, q), FM_OK);
    free(src);
}

static inline model *model_new(fm_rng *r, fm_format f, int gptoss)
{
    model *m = calloc(1, sizeof *m);
    fm_moe_config_default(&m->cfg);
    m->cfg.n_experts = E;
    m->cfg.hidden = H;
    m->cfg.inter = I;
    m->cfg.wfmt = f;
    if (gptoss) { /* the gpt_oss family's routing (k_config_gptoss) and experts */
        m->cfg.top_k = 4;
        m->cfg.score = FM_SCORE_SOFTMAX_TOPK;
        m->cfg.routed_scale = 1.0f;
        m->cfg.activation = FM_ACT_SWIGLU_GPTOSS;
        m->cfg.swiglu_limit = 7.0f; /* GptOssConfig's default: k_config_gptoss has no swiglu_limit */
    } else { /* what config.json says below */
        m->cfg.top_k = 2;
        m->cfg.n_group = 2;
        m->cfg.topk_group = 1;
        m->cfg.shared_inter = SI;
    }
    for (int e = 0; e < E; e++) {
        quantize_into(r, f, 2 * I, H, &m->w13[e], m->buf[2 * e]);
        quantize_into(r, f, H, I, &m->w2[e], m->buf[2 * e + 1]);
        m->a1[e] = 0.01f + (float)fm_rng_uniform(r);
        m->a2[e] = 0.01f + (float)fm_rng_uniform(r);
        m->bias[e] = 0.1f * fm_rng_normal(r);
    }
    for (int i = 0; i < E * H; i++) { /* the checkpoint holds BF16: use the BF16 values */
        m->router_bf16[i] = fm_bf16_encode(fm_rng_normal(r));
        m->router_w[i] = fm_bf16_decode(m->router_bf16[i]);
    }
    for (int i = 0; i < 2 * SI * H; i++) m->sh13[i] = fm_bf16_encode(0.05f * fm_rng_normal(r));
    for (int i = 0; i < H * SI; i++) m->sh2[i] = fm_bf16_encode(0.05f * fm_rng_normal(r));
    for (int e = 0; e < E; e++) {
        for (int n = 0; n < 2 * I; n++) { /* fused row n: gate row n/2 (even n) or up row n/2 (odd) */
            uint16_t b = fm_bf16_encode(0.1f * fm_rng_normal(r));
            m->gu_bias_bf16[e * 2 * I + n] = b;
            m->b13[e * 2 * I + ((n & 1) ? I + n / 2 : n / 2)] = fm_bf16_decode(b);
        }
        for (int n = 0; n < H; n++) {
            m->dn_bias_bf16[e * H + n] = fm_bf16_encode(0.1f * fm_rng_normal(r));
            m->b2[e * H + n] = fm_bf16_decode(m->dn_bias_bf16[e * H + n]);
        }
    }
    int nv = f == FM_FORMAT_NVFP4 && !gptoss;
    m->w = (fm_moe_weights){.router_w = m->router_w, .router_bias = gptoss ? NULL : m->bias, .w13 = m->w13,
                            .w2 = m->w2, .a1_scale = nv ? m->a1 : NULL, .a2_scale = nv ? m->a2 : NULL,
                            .shared_w13 = gptoss ? NULL : m->sh13, .shared_w2 = gptoss ? NULL : m->sh2,
                            .w13_bias = gptoss ? m->b13 : NULL, .w2_bias = gptoss ? m->b2 : NULL};
    return m;
}

static inline void model_free(model *m)
{
    for (int i = 0; i < 2 * E; i++) free(m->buf[i][0]), free(m->buf[i][1]);
    free(m);
}

/* ---- a checkpoint under construction: items, each assigned to shard 0 or 1 ---- */

typedef struct {
    fm_st_write_item it[MAXI];
    int              file[MAXI];
    char             names[MAXI][128];
    int              n;
} itemset;

static inline void add(itemset *s, int file, const char *name, fm_dtype d, int ndim, int64_t d0, int64_t d1, int64_t d2,
                int64_t d3, const void *data)
{
    assert_true(s->n < MAXI);
    assert_true(strlen(name) < sizeof s->names[0]); /* never truncated (and gcc -Wformat-truncation sees the bound) */
    memcpy(s->names[s->n], name, strlen(name) + 1);
    s->it[s->n] = (fm_st_write_item){s->names[s->n], d, ndim, {d0, d1, d2, d3}, data};
    s->file[s->n++] = file;
}

static inline int find_item(itemset *s, const char *name)
{
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->names[i], name)) return i;
    fail_msg("no item %s", name);
    return -1;
}

static inline void remove_item(itemset *s, const char *name)
{
    int i = find_item(s, name);
    s->it[i] = s->it[s->n - 1];
    s->file[i] = s->file[s->n - 1];
    memcpy(s->names[i], s->names[s->n - 1], sizeof s->names[0]);
    s->it[i].name = s->names[i];
    s->n--;
}

static const float k_one __attribute__((unused)) = 1.0f;

/* ModelOpt layout of layer L: experts < E/2 and the router in shard 0, the rest in shard 1. */
static inline void build_modelopt(itemset *s, const model *m, int L)
{
    static const char *proj[3] = {"gate_proj", "up_proj", "down_proj"};
    char nm[128];
    int nv = m->cfg.wfmt == FM_FORMAT_NVFP4;
    for (int e = 0; e < E; e++) {
        int f = e >= E / 2;
        for (int p = 0; p < 3; p++) {
            const fm_qtensor *q = p < 2 ? &m->w13[e] : &m->w2[e];
            int64_t N = p < 2 ? I : H, K = p < 2 ? H : I, r0 = p == 1 ? I : 0;
            size_t rb = fm_format_row_bytes(q->fmt, K), sb = fm_format_row_scale_bytes(q->fmt, K);
            snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.%s.weight", L, e, proj[p]);
            add(s, f, nm, nv ? FM_DTYPE_U8 : FM_DTYPE_BF16, 2, N, nv ? K / 2 : K, 0, 0,
                (const uint8_t *)q->data + r0 * rb);
            if (!nv) continue;
            snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.%s.weight_scale", L, e, proj[p]);
            add(s, f, nm, FM_DTYPE_F8_E4M3, 2, N, K / 16, 0, 0, q->scales + r0 * sb);
            snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.%s.weight_scale_2", L, e, proj[p]);
            add(s, f, nm, FM_DTYPE_F32, 0, 0, 0, 0, 0, &q->global_scale);
            snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.%s.input_scale", L, e, proj[p]);
            add(s, f, nm, FM_DTYPE_F32, 1, 1, 0, 0, 0, p < 2 ? &m->a1[e] : &m->a2[e]);
        }
    }
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.gate.weight", L);
    add(s, 0, nm, FM_DTYPE_BF16, 2, E, H, 0, 0, m->router_bf16);
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.gate.e_score_correction_bias", L);
    add(s, 0, nm, FM_DTYPE_F32, 1, E, 0, 0, 0, m->bias);
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.shared_experts.gate_proj.weight", L);
    add(s, 1, nm, FM_DTYPE_BF16, 2, SI, H, 0, 0, m->sh13);
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.shared_experts.up_proj.weight", L);
    add(s, 1, nm, FM_DTYPE_BF16, 2, SI, H, 0, 0, m->sh13 + SI * H);
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.shared_experts.down_proj.weight", L);
    add(s, 1, nm, FM_DTYPE_BF16, 2, H, SI, 0, 0, m->sh2);
    snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", L);
    add(s, 0, nm, FM_DTYPE_F32, 1, 1, 0, 0, 0, &k_one); /* a non-MoE tensor */
}

static const char *k_shards[2] __attribute__((unused)) = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};

/* Write both shards and (with_index) the index into dir. */
static inline void write_set(const char *dir, const itemset *s, int with_index)
{
    for (int f = 0; f < 2; f++) {
        fm_st_write_item sub[MAXI];
        size_t n = 0;
        for (int i = 0; i < s->n; i++)
            if (s->file[i] == f) sub[n++] = s->it[i];
        char p[400];
        snprintf(p, sizeof p, "%s/%s", dir, k_shards[f]);
        fm_status st = fm_safetensors_write(p, sub, n, NULL, NULL, 0);
        if (st != FM_OK) fail_msg("write %s: %s: %s", p, fm_status_name(st), fm_last_error());
    }
    if (!with_index) return;
    const char *names[MAXI], *files[MAXI];
    for (int i = 0; i < s->n; i++) names[i] = s->names[i], files[i] = k_shards[s->file[i]];
    char p[400];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    assert_int_equal(fm_safetensors_write_index(p, names, files, (size_t)s->n, 0), FM_OK);
}

static inline void write_text(const char *dir, const char *name, const char *text)
{
    char p[400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* The routing of model_new's non-gpt-oss layer, every key given (a model type
 * fp4moe does not know must give them all). */
static const char *k_config __attribute__((unused)) = "{\"num_experts_per_tok\": 2, \"scoring_func\": \"sigmoid\", \"norm_topk_prob\": true,"
                              " \"routed_scaling_factor\": 2.5, \"n_group\": 2, \"topk_group\": 1}";
/* gpt-oss: the family's defaults (softmax over the top-4 logits). */
static const char *k_config_gptoss __attribute__((unused)) = "{\"model_type\": \"gpt_oss\", \"architectures\": [\"GptOssForCausalLM\"]}";

static inline void assert_qtensor_equal(const fm_qtensor *a, const fm_qtensor *b)
{
    size_t db, sb;
    assert_int_equal(a->fmt, b->fmt);
    assert_int_equal(a->rows, b->rows);
    assert_int_equal(a->cols, b->cols);
    assert_true(a->global_scale == b->global_scale);
    assert_int_equal(fm_qtensor_bytes(a->fmt, a->rows, a->cols, &db, &sb), FM_OK);
    assert_memory_equal(a->data, b->data, db);
    if (sb) assert_memory_equal(a->scales, b->scales, sb);
}

/* Same layer output, bit for bit, from memory and from the loaded checkpoint. */
static inline void assert_same_output(fm_rng *r, const fm_moe_config *c0, const fm_moe_weights *w0, const fm_moe_config *c1,
                               const fm_moe_weights *w1)
{
    uint16_t x[T * H];
    for (int i = 0; i < T * H; i++) x[i] = fm_bf16_encode(fm_rng_normal(r));
    float *o0 = malloc(sizeof(float) * T * H), *o1 = malloc(sizeof(float) * T * H);
    fm_poison_f32(o0, T * H);
    fm_poison_f32(o1, T * H);
    assert_int_equal(fm_moe_forward_ref(c0, w0, x, T, o0), FM_OK);
    fm_status s = fm_moe_forward_ref(c1, w1, x, T, o1);
    if (s != FM_OK) fail_msg("forward on the loaded layer: %s: %s", fm_status_name(s), fm_last_error());
    assert_int_equal(fm_first_nonfinite(o0, T * H), -1);
    assert_int_equal(fm_first_nonfinite(o1, T * H), -1);
    double norm = 0;
    for (int i = 0; i < T * H; i++) norm += (double)o0[i] * o0[i];
    assert_true(norm > 0); /* a layer that outputs zeros would make the comparison vacuous */
    assert_memory_equal(o0, o1, sizeof(float) * T * H);
    free(o0);
    free(o1);
}

static inline fm_ckpt_layer *load_ok(const char *path, int layer, const fm_ckpt_load_opts *o)
{
    fm_checkpoint *ck = NULL;
    fm_status s = fm_checkpoint_open(path, &ck);
    if (s != FM_OK) fail_msg("open %s: %s: %s", path, fm_status_name(s), fm_last_error());
    fm_ckpt_layer *l = NULL;
    s = fm_checkpoint_load_layer(ck, layer, o, &l);
    if (s != FM_OK) fail_msg("load %s: %s: %s", path, fm_status_name(s), fm_last_error());
    fm_checkpoint_close(ck); /* the layer owns copies: it must outlive the checkpoint */
    return l;
}

/* gpt-oss layout of layer L: fused [E] tensors, gate/up rows interleaved
 * (fused row 2i = gate row i, 2i+1 = up row i). gate_up in shard 0, down in 1.
 * The caller owns bufs: gu_b, gu_s, dn_b, dn_s sized by gptoss_sizes. */
static uint16_t g_zero_bias[E * 2 * I] __attribute__((unused));

static inline void build_gptoss(itemset *s, const model *m, int L, uint8_t *gu_b, uint8_t *gu_s, uint8_t *dn_b,
                                uint8_t *dn_s)
{
    const size_t rb = H / 2, sb = H / 32, d2 = (size_t)H * I / 2, s2 = (size_t)H * I / 32;
    for (int e = 0; e < E; e++) {
        const fm_qtensor *q = &m->w13[e];
        for (int r = 0; r < 2 * I; r++) {
            int src = (r & 1) ? I + r / 2 : r / 2; /* fp4moe row holding fused row r */
            memcpy(gu_b + ((size_t)e * 2 * I + r) * rb, (const uint8_t *)q->data + src * rb, rb);
            memcpy(gu_s + ((size_t)e * 2 * I + r) * sb, q->scales + src * sb, sb);
        }
        memcpy(dn_b + e * d2, m->w2[e].data, d2);
        memcpy(dn_s + e * s2, m->w2[e].scales, s2);
    }
    char nm[128];
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.gate_up_proj_blocks", L);
    add(s, 0, nm, FM_DTYPE_U8, 4, E, 2 * I, H / 32, 16, gu_b);
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.gate_up_proj_scales", L);
    add(s, 0, nm, FM_DTYPE_U8, 3, E, 2 * I, H / 32, 0, gu_s);
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.gate_up_proj_bias", L);
    add(s, 0, nm, FM_DTYPE_BF16, 2, E, 2 * I, 0, 0, m->gu_bias_bf16);
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.down_proj_blocks", L);
    add(s, 1, nm, FM_DTYPE_U8, 4, E, H, I / 32, 16, dn_b);
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.down_proj_scales", L);
    add(s, 1, nm, FM_DTYPE_F8_E8M0, 3, E, H, I / 32, 0, dn_s);
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.down_proj_bias", L);
    add(s, 1, nm, FM_DTYPE_BF16, 2, E, H, 0, 0, m->dn_bias_bf16);
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.router.weight", L);
    add(s, 0, nm, FM_DTYPE_BF16, 2, E, H, 0, 0, m->router_bf16);
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.router.bias", L);
    add(s, 0, nm, FM_DTYPE_BF16, 1, E, 0, 0, 0, g_zero_bias);
}

enum { GU_B = E * 2 * I * H / 2, GU_S = E * 2 * I * H / 32, DN_B = E * H * I / 2, DN_S = E * H * I / 32 };

#endif
