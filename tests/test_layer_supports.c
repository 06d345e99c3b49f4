/* test_layer_supports.c - fm_layer_supports answers as fm_layer_create_desc does.
 *
 * For every refusal create makes that depends on the description and configuration
 * (src/layer.c's checks, fm_moe_config_check's, the backend's presence and the
 * backends' own: cuda's act_nvfp4, BF16 experts, grid limits), and for
 * configurations every backend (gpt-oss's routing, activation and expert biases among
 * them) or only some take,
 * on every backend of this build: supports gives the status create gives and the same
 * message, and FM_OK exactly when create makes the layer. The weights given to create
 * are fresh random ones of the case's shape (fm_quantize of N(0, 1/K)), with the
 * optional tensors the case's features name, so create's weight checks pass and what
 * differs is only what supports judges. With a CUDA device the cuda cases also run
 * with desc.device set. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_moe_fixture.h"

typedef struct {
    const char     *name;
    fm_moe_config   cfg;
    fm_layer_desc   desc;
    unsigned        features;
    int             cpu_only;   /* sets desc.device to a non-device pointer: CPU backends only */
    int             no_weights; /* sizes no weights can be built for: create must refuse before reading them */
} sup_case;

static fm_moe_config base_cfg(void)
{
    fm_moe_config c = fx_config(8, 2, 64, 32, FM_FORMAT_NVFP4);
    c.score = FM_SCORE_SOFTMAX;
    return c;
}

enum { NCASE_MAX = 64 };

static int make_cases(sup_case *cs)
{
    int n = 0;
#define CASE(nm) (cs[n] = (sup_case){.name = nm, .cfg = base_cfg(), .desc = {.max_tokens = 4}}, &cs[n++])
    sup_case *k;
    CASE("accepted");
    k = CASE("router bias and static input scales"), k->features = FM_FEATURE_ROUTER_BIAS | FM_FEATURE_A_SCALE;
    k = CASE("max_tokens 0"), k->desc.max_tokens = 0;
    k = CASE("out_dtype 7"), k->desc.out_dtype = (fm_out_dtype)7;
    k = CASE("out_dtype bf16"), k->desc.out_dtype = FM_OUT_BF16;
    k = CASE("decode_work_list 2"), k->desc.decode_work_list = 2;
    k = CASE("row_quantile 0.3"), k->desc.row_quantile = 0.3f;
    k = CASE("pdl_chain 1"), k->desc.pdl_chain = 1;
    k = CASE("act_fp8_path 2"), k->desc.act_fp8_path = 2;
    k = CASE("act_fp8_path faster"), k->desc.act_fp8_path = FM_FP8_PATH_FASTER;
    k = CASE("act_fp8_path faster, W4A8"), k->desc.act_fp8_path = FM_FP8_PATH_FASTER, k->cfg.act_fp8 = FM_ACT_FP8_BLOCK128;
    k = CASE("caller_workspace 2"), k->desc.caller_workspace = 2;
    k = CASE("caller_workspace 1"), k->desc.caller_workspace = 1;
    k = CASE("unknown format"), k->cfg.wfmt = (fm_format)99, k->no_weights = 1;
    k = CASE("n_experts 0"), k->cfg.n_experts = 0, k->no_weights = 1;
    k = CASE("top_k > n_experts"), k->cfg.top_k = 9;
    k = CASE("unknown score"), k->cfg.score = (fm_score_func)7;
    k = CASE("routed_scale NaN"), k->cfg.routed_scale = NAN;
    k = CASE("shared_inter -1"), k->cfg.shared_inter = -1;
    k = CASE("n_group not dividing"), k->cfg.n_group = 3, k->cfg.topk_group = 1;
    k = CASE("topk_group > n_group"), k->cfg.n_group = 4, k->cfg.topk_group = 5;
    k = CASE("groups accepted"), k->cfg.n_group = 4, k->cfg.topk_group = 2, k->cfg.score = FM_SCORE_SIGMOID;
    k = CASE("hidden not a block multiple"), k->cfg.hidden = 40, k->no_weights = 1;
    k = CASE("unknown activation"), k->cfg.activation = (fm_activation)5;
    k = CASE("gpt-oss activation without a limit"), k->cfg.activation = FM_ACT_SWIGLU_GPTOSS;
    k = CASE("swiglu with a limit"), k->cfg.swiglu_limit = 7.0f;
    k = CASE("shared_inter 8"), k->cfg.shared_inter = 8;
    k = CASE("shared expert"), k->cfg.shared_inter = 32;
    k = CASE("max_tokens x hidden > 2^31"), k->desc.max_tokens = 1 << 26;
    k = CASE("shard past the experts"), k->desc.first_expert = 8;
    k = CASE("shard too long"), k->desc.first_expert = 2, k->desc.n_local = 7;
    k = CASE("shard accepted"), k->desc.first_expert = 2, k->desc.n_local = 4;
    k = CASE("unknown backend"), k->desc.backend = (fm_backend_kind)99;
    k = CASE("device given to a CPU backend"), k->cpu_only = 1;
    /* gpt-oss: every backend takes it (cuda since issue 32) */
    k = CASE("softmax-topk routing"), k->cfg.score = FM_SCORE_SOFTMAX_TOPK, k->features = FM_FEATURE_ROUTER_BIAS;
    k = CASE("gpt-oss activation"), k->cfg.activation = FM_ACT_SWIGLU_GPTOSS, k->cfg.swiglu_limit = 7.0f;
    k = CASE("expert biases"), k->features = FM_FEATURE_EXPERT_BIAS;
    k = CASE("gpt-oss layer"), k->cfg.score = FM_SCORE_SOFTMAX_TOPK, k->cfg.activation = FM_ACT_SWIGLU_GPTOSS,
    k->cfg.swiglu_limit = 7.0f, k->cfg.wfmt = FM_FORMAT_MXFP4, k->features = FM_FEATURE_ALL;
    /* what the CPU backends take and cuda refuses */
    k = CASE("act_nvfp4"), k->cfg.act_nvfp4 = 1, k->features = FM_FEATURE_A_SCALE;
    k = CASE("act_fp8 block128"), k->cfg.act_fp8 = FM_ACT_FP8_BLOCK128;
    k = CASE("act_fp8 token"), k->cfg.act_fp8 = FM_ACT_FP8_TOKEN;
    k = CASE("unknown act_fp8"), k->cfg.act_fp8 = (fm_act_fp8)9;
    k = CASE("act_fp8 with act_nvfp4"), k->cfg.act_fp8 = FM_ACT_FP8_TOKEN, k->cfg.act_nvfp4 = 1;
    k = CASE("BF16 experts"), k->cfg.wfmt = FM_FORMAT_BF16;
    k = CASE("MXFP4 experts"), k->cfg.wfmt = FM_FORMAT_MXFP4;
    k = CASE("max_tokens x top_k > 65,535"), k->desc.max_tokens = 40000;
    k = CASE("n_experts > 65,535"), k->cfg.n_experts = 65536, k->cfg.top_k = 1, k->cfg.hidden = 16,
    k->cfg.inter = 16;
#undef CASE
    assert_true(n <= NCASE_MAX);
    return n;
}

/* Random weights for c (its global experts; create reads the shard's first n_local). */
typedef struct {
    fx_layer L;
    float   *b13, *b2;
} sup_weights;

static void build(sup_weights *W, const fm_moe_config *c, unsigned features, fm_rng *r)
{
    memset(W, 0, sizeof *W);
    fx_build(&W->L, c, r, (features & FM_FEATURE_ROUTER_BIAS) != 0, (features & FM_FEATURE_A_SCALE) != 0);
    if (features & FM_FEATURE_EXPERT_BIAS) {
        W->b13 = malloc(sizeof(float) * c->n_experts * 2 * c->inter);
        W->b2 = malloc(sizeof(float) * c->n_experts * c->hidden);
        assert_non_null(W->b13), assert_non_null(W->b2);
        fm_rng_fill_normal(r, W->b13, (size_t)c->n_experts * 2 * c->inter, 0.5f);
        fm_rng_fill_normal(r, W->b2, (size_t)c->n_experts * c->hidden, 0.5f);
        W->L.w.w13_bias = W->b13, W->L.w.w2_bias = W->b2;
    }
}

static void unbuild(sup_weights *W)
{
    fx_free(&W->L);
    free(W->b13), free(W->b2);
}

/* One case on one backend (and device): supports and create agree. Returns the status. */
static fm_status agree(const sup_case *k, fm_backend_kind b, fm_cuda_device *dev, const fm_moe_weights *w)
{
    fm_layer_desc d = k->desc;
    d.backend = b;
    if (dev) d.device = dev;
    if (k->cpu_only) d.device = (fm_cuda_device *)(uintptr_t)0x10; /* never read: refused first */
    char      why[512];
    fm_status s1 = fm_layer_supports(&d, &k->cfg, k->features, why, sizeof why);
    if (s1 == FM_OK) assert_string_equal(why, "");
    fm_layer *l = (fm_layer *)(uintptr_t)1;
    fm_status s2 = fm_layer_create_desc(&d, &k->cfg, w, &l);
    if (s1 != s2 || (s2 != FM_OK && strcmp(why, fm_last_error()) != 0)) {
        print_error("case '%s' on %s%s: supports %s (%s), create %s (%s)\n", k->name, fm_backend_name(b),
                    dev ? " with a device" : "", fm_status_name(s1), why, fm_status_name(s2), fm_last_error());
        fail();
    }
    if (s2 == FM_OK) {
        assert_non_null(l);
        fm_layer_destroy(l);
    } else {
        assert_null(l);
    }
    return s2;
}

static void supports_matches_create(void **st)
{
    (void)st;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed());
    static sup_case cs[NCASE_MAX];
    int             n = make_cases(cs);
    const fm_moe_config base = base_cfg();
    sup_weights          bw;
    build(&bw, &base, 0, &r);
    fm_cuda_device *dev = NULL;
    if (fm_backend_available(FM_BACKEND_CUDA) == FM_OK) assert_int_equal(fm_cuda_device_open(0, &dev), FM_OK);
    int refused_cpu = 0, refused_cuda_only = 0;
    for (int i = 0; i < n; i++) {
        const sup_case *k = &cs[i];
        sup_weights     W;
        int built = !k->no_weights && fm_moe_config_check(&k->cfg) == FM_OK;
        if (built) build(&W, &k->cfg, k->features, &r);
        const fm_moe_weights *w = built ? &W.L.w : &bw.L.w;
        fm_status sc = FM_OK;
        for (int b = 0; b < FM_BACKEND_COUNT; b++) {
            if (k->cpu_only && b != FM_BACKEND_CPU_REF && b != FM_BACKEND_CPU) continue;
            fm_status s = agree(k, (fm_backend_kind)b, NULL, w);
            if (b == FM_BACKEND_CPU) sc = s;
            if (b == FM_BACKEND_CUDA && s == FM_ERR_UNSUPPORTED && sc == FM_OK) refused_cuda_only++;
            if (dev && !k->cpu_only && (b == FM_BACKEND_CUDA || b == FM_BACKEND_AUTO))
                (void)agree(k, (fm_backend_kind)b, dev, w);
        }
        if (k->desc.backend == FM_BACKEND_AUTO && sc != FM_OK) refused_cpu++;
        if (built) unbuild(&W);
    }
    /* the case list reaches what it claims: refusals in layer.c / the config check, and
     * (with the cuda backend present) the backend's own */
    assert_true(refused_cpu >= 20);
    if (dev) assert_true(refused_cuda_only >= 3); /* act_nvfp4, BF16 experts, max_tokens x top_k (act_fp8 runs) */
    fm_cuda_device_close(dev);
    unbuild(&bw);
}

/* The call's own arguments: NULLs, unknown feature bits, why cut to its length, and
 * why / fm_last_error on a refusal. */
static void supports_arguments(void **st)
{
    (void)st;
    fm_moe_config c = base_cfg();
    fm_layer_desc d = {.backend = FM_BACKEND_CPU, .max_tokens = 4};
    char          why[16];
    memset(why, 'x', sizeof why);
    assert_int_equal(fm_layer_supports(&d, &c, 0, why, sizeof why), FM_OK);
    assert_string_equal(why, "");
    assert_int_equal(fm_layer_supports(&d, &c, FM_FEATURE_ALL, NULL, 0), FM_OK);
    assert_int_equal(fm_layer_supports(NULL, &c, 0, why, sizeof why), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_layer_supports(&d, NULL, 0, why, sizeof why), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_layer_supports(&d, &c, 0x80, NULL, 0), FM_ERR_INVALID_ARG);
    assert_non_null(strstr(fm_last_error(), "features=0x80"));
    c.top_k = 9;
    memset(why, 'x', sizeof why);
    assert_int_equal(fm_layer_supports(&d, &c, 0, why, sizeof why), FM_ERR_INVALID_ARG);
    assert_int_equal(strlen(why), sizeof why - 1); /* cut, terminated */
    assert_true(strncmp(why, fm_last_error(), sizeof why - 1) == 0);
    assert_non_null(strstr(fm_last_error(), "top_k=9"));
    char one[1] = {'x'};
    assert_int_equal(fm_layer_supports(&d, &c, 0, one, 1), FM_ERR_INVALID_ARG);
    assert_int_equal(one[0], '\0');
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(supports_matches_create),
        cmocka_unit_test(supports_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
