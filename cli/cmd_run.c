/* cmd_run.c - `fp4moe run`: the main job.
 *
 * Builds a MoE layer (GLM-5 EP8 shard by default: 32 experts, top-8, hidden 6144,
 * intermediate 2048, NVFP4), quantizes random Gaussian weights (sigma 1/sqrt(K), as
 * trained layers roughly are), runs it on the best backend present (CUDA when a GPU
 * is visible, else the fast CPU path), and with --check compares it against the CPU
 * reference on the same input. Prints time (median of --iters), the bytes the layer
 * must read (active experts' weights and scales + activations, each once), the
 * achieved bandwidth, and the error. On the cuda backend the layer runs as an
 * engine calls it (run_cuda.c: device x, ids and weights, fm_layer_run on a
 * stream of its own), eager and replayed from a captured CUDA graph, both timed.
 */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli.h"
#include "fm_file.h" /* fm_file_out: --output checked before the run */
#include "fp4moe/cuda.h" /* FM_CUDA_MAX_K_SPLITS (--plan); plain C, in builds without CUDA too */
#include "run_cuda.h"
#include "run_model.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fp4moe run [flags]\n"
            "Build a MoE layer with random quantized weights, run it, optionally check it.\n\n"
            "  --experts N        routed experts in the layer          (default 32: GLM-5 EP8 shard)\n"
            "  --topk N           experts per token                    (default 8)\n"
            "  --hidden N         model dimension                      (default 6144)\n"
            "  --inter N          expert intermediate size             (default 2048)\n"
            "  --tokens N         tokens in the batch                  (default 4)\n"
            "  --format F         nvfp4 | mxfp4 | bf16                 (default nvfp4)\n"
            "  --score S          sigmoid | softmax | softmax-topk     (default sigmoid)\n"
            "  --groups G         expert groups for group-limited top-k (default 0: off)\n"
            "  --topk-group N     groups kept with --groups            (default 1)\n"
            "  --renormalize B    1: top-k weights renormalised to sum 1, 0: not (default 1)\n"
            "  --routed-scale X   routed scaling factor                (default 2.5)\n"
            "  --shared-inter N   BF16 shared expert size, 0 = none    (default 0)\n"
            "  --act-nvfp4        quantize activations to NVFP4 (W4A4)\n"
            "  --backend B        auto | cuda | cpu | cpu-ref          (default auto)\n"
            "  --iters N          timed repetitions, median reported   (default 5)\n"
            "  --seed S           random seed                          (default 1)\n"
            "  --check            compare with the CPU reference (exit 4 when outside the bound)\n"
            "  --weights PATH     run a real layer from a safetensors checkpoint (with --layer);\n"
            "                     routing comes from its config.json; --topk --score --groups --topk-group\n"
            "                     --renormalize --routed-scale override it (said on stderr), --act-nvfp4\n"
            "                     runs it W4A4; shape flags are rejected\n"
            "  --layer L          layer index in the checkpoint\n"
            "  --input X.npy      the input: [T][hidden] BF16 ('<u2' bits or ml_dtypes '<V2') or float32\n"
            "                     ('<f4', rounded to BF16 RNE); T replaces --tokens\n"
            "  --output Y.npy     write the layer's output: float32 [T][hidden]\n"
            "  --shard F:C        hold experts [F, F+C) of the layer's experts only (an expert-parallel\n"
            "                     rank): routing stays over all of them, the output is the shard's partial\n"
            "                     sum; --check compares with the reference holding the same shard\n"
            "  --global-experts N the layer is a shard of a model with N routed experts: router and top-k\n"
            "                     over N, weights made for the held experts only (--shard F:C, default\n"
            "                     0:--experts; expert i's weights as in the whole model's)\n"
            "  --routing R        internal (router + top-k inside the layer) | external (the top-k ids and\n"
            "                     weights computed here from the router, passed in as an engine does;\n"
            "                     on cuda in device memory)            (default internal)\n"
            "  --work-list W      cuda: auto | on | off, the experts' work list and split K in decode\n"
            "                     buckets (fm_layer_desc.decode_work_list) (default auto)\n"
            "  --row-quantile Q   cuda: auto | mean | Q in [0.5, 1): the rows per expert tiles are chosen\n"
            "                     for (fm_layer_desc.row_quantile; auto: the 0.9-quantile from 32\n"
            "                     tokens, the mean below)                (default auto)\n"
            "  --plan SPEC        cuda: run T's bucket with another plan (fm_layer_set_plan): comma-\n"
            "                     separated fc1=TILE[/SPLITS], fc2=TILE[/SPLITS], list[=N] | nolist, e.g.\n"
            "                     fc1=swapab_w4m2n1k256s3/8,fc2=swapab_w4m1n1k256s3/4,list; what is not\n"
            "                     named stays the planner's; refused before any run if the device or the\n"
            "                     GEMM cannot run it (wgmma tiles take packed X)\n"
            "  --tune             cuda: tune T's bucket first (fm_layer_tune: other plans timed on the\n"
            "                     device, the fastest kept if >= 3 %% faster), then run: the tune\n"
            "                     line says what it tried and kept\n");
    fprintf(f, "  --plans FILE       cuda: take the buckets' plans from a plan file (fm_layer_desc.plans), used\n"
            "                     only where its device/driver/library metadata and the layer's shape\n"
            "                     match (a warning says why not); a corrupt file is refused (exit 1)\n"
            "  --save-plans FILE  cuda: after --tune (or --plans), write every bucket's plan into FILE\n"
            "                     (fm_layer_save_plans: this device's section, other sections kept)\n"
            "  --json             machine-readable output on stdout\n"
            "  --help             this text\n");
}

enum { OPT_EXPERTS = 256, OPT_TOPK, OPT_HIDDEN, OPT_INTER, OPT_TOKENS, OPT_FORMAT, OPT_SCORE, OPT_GROUPS,
       OPT_TOPK_GROUP, OPT_SHARED, OPT_ACT, OPT_BACKEND, OPT_ITERS, OPT_SEED, OPT_CHECK, OPT_WEIGHTS, OPT_LAYER,
       OPT_JSON, OPT_HELP, OPT_RENORM, OPT_RSCALE, OPT_INPUT, OPT_OUTPUT, OPT_SHARD, OPT_ROUTING, OPT_GLOBAL,
       OPT_WORK_LIST, OPT_ROW_Q, OPT_PLAN, OPT_TUNE, OPT_PLANS, OPT_SAVE_PLANS };

static const struct option k_opts[] = {
    {"experts", required_argument, 0, OPT_EXPERTS}, {"topk", required_argument, 0, OPT_TOPK},
    {"hidden", required_argument, 0, OPT_HIDDEN},   {"inter", required_argument, 0, OPT_INTER},
    {"tokens", required_argument, 0, OPT_TOKENS},   {"format", required_argument, 0, OPT_FORMAT},
    {"score", required_argument, 0, OPT_SCORE},     {"groups", required_argument, 0, OPT_GROUPS},
    {"topk-group", required_argument, 0, OPT_TOPK_GROUP}, {"shared-inter", required_argument, 0, OPT_SHARED},
    {"act-nvfp4", no_argument, 0, OPT_ACT},         {"backend", required_argument, 0, OPT_BACKEND},
    {"iters", required_argument, 0, OPT_ITERS},     {"seed", required_argument, 0, OPT_SEED},
    {"check", no_argument, 0, OPT_CHECK},           {"weights", required_argument, 0, OPT_WEIGHTS},
    {"layer", required_argument, 0, OPT_LAYER},     {"json", no_argument, 0, OPT_JSON},
    {"help", no_argument, 0, OPT_HELP},             {"renormalize", required_argument, 0, OPT_RENORM},
    {"routed-scale", required_argument, 0, OPT_RSCALE}, {"input", required_argument, 0, OPT_INPUT},
    {"output", required_argument, 0, OPT_OUTPUT},   {"shard", required_argument, 0, OPT_SHARD},
    {"routing", required_argument, 0, OPT_ROUTING}, {"global-experts", required_argument, 0, OPT_GLOBAL},
    {"work-list", required_argument, 0, OPT_WORK_LIST}, {"row-quantile", required_argument, 0, OPT_ROW_Q},
    {"plan", required_argument, 0, OPT_PLAN},       {"tune", no_argument, 0, OPT_TUNE},
    {"plans", required_argument, 0, OPT_PLANS},     {"save-plans", required_argument, 0, OPT_SAVE_PLANS},
    {0, 0, 0, 0}};

/* --plan SPEC: what replaces the planner's choice for T's bucket */
typedef struct {
    int     given;             /* --plan seen */
    int     have[2], ks[2];    /* fc1 / fc2 named, their K splits */
    fm_tile tile[2];
    int     list, list_n;      /* -1 unchanged, 0 nolist, 1 list (list_n experts, 0: the planner's count) */
} plan_spec;

/* Parse SPEC into *ps; 0 (message printed) on a malformed item. */
static int parse_plan(const char *spec, plan_spec *ps)
{
    *ps = (plan_spec){.given = 1, .ks = {1, 1}, .list = -1};
    char buf[256];
    if (strlen(spec) >= sizeof buf || !*spec) {
        fprintf(stderr, "fp4moe run: --plan expects fc1=TILE[/SPLITS],fc2=TILE[/SPLITS],list[=N]|nolist, got '%s'\n",
                spec);
        return 0;
    }
    strcpy(buf, spec);
    for (char *it = buf, *next; it; it = next) { /* the comma-separated items */
        next = strchr(it, ',');
        if (next) *next++ = 0;
        int g = !strncmp(it, "fc1=", 4) ? 0 : !strncmp(it, "fc2=", 4) ? 1 : -1;
        if (g >= 0) {
            char *name = it + 4, *sl = strchr(name, '/');
            long  ks = 1;
            if (sl) {
                char *end = NULL;
                *sl = 0;
                ks = strtol(sl + 1, &end, 10);
                if (end == sl + 1 || *end || ks < 1 || ks > FM_CUDA_MAX_K_SPLITS) {
                    fprintf(stderr, "fp4moe run: --plan: fc%d's K splits must be an integer in [1, %d], got '%s'\n",
                            g + 1, FM_CUDA_MAX_K_SPLITS, sl + 1);
                    return 0;
                }
            }
            if (fm_tile_parse(name, &ps->tile[g]) != FM_OK) {
                fprintf(stderr, "fp4moe run: --plan: '%s' is not a tile name (swapab_w4m2n1k256s3, wgmma_w8m2n8k64s8, "
                                "...: `fp4moe run --json` prints the planner's)\n",
                        name);
                return 0;
            }
            ps->have[g] = 1, ps->ks[g] = (int)ks;
        } else if (!strcmp(it, "list") || !strncmp(it, "list=", 5)) {
            ps->list = 1;
            if (it[4] == '=') {
                char *end = NULL;
                long  nl = strtol(it + 5, &end, 10);
                if (end == it + 5 || *end || nl < 1 || nl > 1 << 20) {
                    fprintf(stderr, "fp4moe run: --plan: list=N expects N >= 1 experts, got '%s'\n", it + 5);
                    return 0;
                }
                ps->list_n = (int)nl;
            }
        } else if (!strcmp(it, "nolist")) {
            ps->list = 0;
        } else {
            fprintf(stderr, "fp4moe run: --plan: unknown item '%s' (fc1=TILE[/SPLITS], fc2=TILE[/SPLITS], list[=N], "
                            "nolist)\n",
                    it);
            return 0;
        }
    }
    return 1;
}

/* The planner's plan of T's bucket with what ps names replaced, set on the layer. */
static fm_status apply_plan(fm_layer *layer, int T, const plan_spec *ps)
{
    fm_layer_plan_info pi;
    fm_status          st = fm_layer_plan(layer, T, &pi);
    if (st != FM_OK) return st;
    for (int g = 0; g < 2; g++) {
        if (!ps->have[g]) continue;
        pi.tile[g] = ps->tile[g], pi.k_splits[g] = ps->ks[g], pi.feature_blocks[g] = 1;
        pi.x_packed[g] = ps->tile[g].family == FM_FAMILY_FP4MOE_WGMMA;
    }
    if (ps->list >= 0) pi.work_list = ps->list;
    if (ps->list_n) pi.active_experts = ps->list_n;
    return fm_layer_set_plan(layer, T, &pi);
}

/* "F:C" -> first F >= 0, count C >= 1 (checked against the layer's experts later). */
static int parse_shard(const char *a, int *first, int *count)
{
    char *e1 = NULL, *e2 = NULL;
    long  f = strtol(a, &e1, 10);
    if (e1 == a || *e1 != ':') return 0;
    long c = strtol(e1 + 1, &e2, 10);
    if (e2 == e1 + 1 || *e2 || f < 0 || c < 1 || f > 1 << 24 || c > 1 << 24) return 0;
    *first = (int)f;
    *count = (int)c;
    return 1;
}

/* External routing as an engine would give it: the router's logits (the CPU's
 * summation order) and fm_moe_route, ids/weights [T][top_k]. */
static fm_status host_routing(const fm_moe_config *c, const fm_moe_weights *w, const uint16_t *x, int T, int32_t *ids,
                              float *wts)
{
    const int E = c->n_experts, H = c->hidden;
    float    *logits = malloc(sizeof(float) * (size_t)T * E);
    if (!logits) return FM_ERR_OOM;
    for (long i = 0; i < (long)T * E; i++) {
        const uint16_t *xt = x + (size_t)(i / E) * H;
        const float    *we = w->router_w + (size_t)(i % E) * H;
        float           part[8] = {0};
        for (int k = 0; k < H; k++) part[k % 8] += fm_bf16_decode(xt[k]) * we[k];
        logits[i] = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    }
    fm_status s = fm_moe_route(c, w->router_bias, logits, T, ids, wts);
    free(logits);
    return s;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Error bound of a backend against the reference (NMSE), from docs/accuracy.md:
 * the CPU paths differ from the reference only in FP32 accumulation order; the
 * CUDA path rounds the SwiGLU output to BF16 before FC2 (as every BF16 tensor-core
 * MoE kernel does), which costs ~2^-9 relative per element. With NVFP4
 * activations an accumulation-order difference can flip one E2M1 rounding step
 * of an activation, so the bound is that of activation quantization itself. */
static double nmse_bound(fm_backend_kind k, const fm_moe_config *cfg)
{
    if (k == FM_BACKEND_CPU_REF) return 0.0;
    if (cfg->act_nvfp4) return 2e-3;
    return k == FM_BACKEND_CPU ? 1e-9 : 1e-4;
}

int fm_cmd_run(int argc, char **argv)
{
    fm_run_opts o;
    fm_run_opts_default(&o);
    long v;
    double dv;
    const char *shape_flag = NULL; /* a flag that sets the layer's shape: not with --weights */
    int topk_group_flag = 0;       /* --topk-group: with --weights only together with --groups */
    int shard_first = 0, shard_count = 0, external = 0; /* --shard F:C (0 count: all), --routing external */
    int global = 0, experts_set = 0;                     /* --global-experts N, --experts given */
    int work_list = FM_WORK_LIST_AUTO;                   /* --work-list */
    double row_q = FM_ROW_QUANTILE_AUTO;                 /* --row-quantile */
    plan_spec pspec = {0};                               /* --plan */
    int tune = 0;                                        /* --tune */
    const char *plans_in = NULL, *plans_out = NULL;      /* --plans, --save-plans */
    optind = 1;
    opterr = 0;
    for (int c; (c = getopt_long(argc, argv, "", k_opts, NULL)) != -1;) {
        for (const struct option *op = k_opts; op->name; op++)
            if (op->val == c && (c == OPT_EXPERTS || c == OPT_HIDDEN || c == OPT_INTER || c == OPT_FORMAT ||
                                 c == OPT_SHARED || c == OPT_GLOBAL))
                shape_flag = op->name;
        switch (c) {
        case OPT_EXPERTS: if (!fm_cli_int("run", "--experts", optarg, 1, 4096, &v)) return FM_EXIT_USAGE; o.cfg.n_experts = (int)v; experts_set = 1; break;
        case OPT_TOPK: if (!fm_cli_int("run", "--topk", optarg, 1, 4096, &v)) return FM_EXIT_USAGE; o.cfg.top_k = (int)v; o.route_set |= 1u << FM_ROUTE_TOP_K; break;
        case OPT_HIDDEN: if (!fm_cli_int("run", "--hidden", optarg, 1, 1 << 20, &v)) return FM_EXIT_USAGE; o.cfg.hidden = (int)v; break;
        case OPT_INTER: if (!fm_cli_int("run", "--inter", optarg, 1, 1 << 20, &v)) return FM_EXIT_USAGE; o.cfg.inter = (int)v; break;
        case OPT_TOKENS: if (!fm_cli_int("run", "--tokens", optarg, 1, 1 << 20, &v)) return FM_EXIT_USAGE; o.tokens = (int)v; o.tokens_set = 1; break;
        case OPT_FORMAT:
            if (fm_format_parse(optarg, &o.cfg.wfmt) != FM_OK) {
                fprintf(stderr, "fp4moe run: --format expects nvfp4, mxfp4 or bf16, got '%s'\n", optarg);
                return FM_EXIT_USAGE;
            }
            break;
        case OPT_SCORE:
            if (!strcasecmp(optarg, "sigmoid")) o.cfg.score = FM_SCORE_SIGMOID;
            else if (!strcasecmp(optarg, "softmax")) o.cfg.score = FM_SCORE_SOFTMAX;
            else if (!strcasecmp(optarg, "softmax-topk")) o.cfg.score = FM_SCORE_SOFTMAX_TOPK;
            else {
                fprintf(stderr, "fp4moe run: --score expects sigmoid, softmax or softmax-topk, got '%s'\n", optarg);
                return FM_EXIT_USAGE;
            }
            o.route_set |= 1u << FM_ROUTE_SCORE;
            break;
        case OPT_GROUPS: if (!fm_cli_int("run", "--groups", optarg, 0, 4096, &v)) return FM_EXIT_USAGE; o.cfg.n_group = (int)v; o.route_set |= 1u << FM_ROUTE_GROUPS; break;
        case OPT_TOPK_GROUP: if (!fm_cli_int("run", "--topk-group", optarg, 1, 4096, &v)) return FM_EXIT_USAGE; o.cfg.topk_group = (int)v; topk_group_flag = 1; break;
        case OPT_RENORM: if (!fm_cli_int("run", "--renormalize", optarg, 0, 1, &v)) return FM_EXIT_USAGE; o.cfg.renormalize = (int)v; o.route_set |= 1u << FM_ROUTE_RENORMALIZE; break;
        case OPT_RSCALE: if (!fm_cli_double("run", "--routed-scale", optarg, 1e-30, 1e30, &dv)) return FM_EXIT_USAGE; o.cfg.routed_scale = (float)dv; o.route_set |= 1u << FM_ROUTE_SCALE; break;
        case OPT_INPUT: o.input_path = optarg; break;
        case OPT_OUTPUT: o.output_path = optarg; break;
        case OPT_SHARD:
            if (!parse_shard(optarg, &shard_first, &shard_count)) {
                fprintf(stderr, "fp4moe run: --shard expects FIRST:COUNT (FIRST >= 0, COUNT >= 1), got '%s'\n", optarg);
                return FM_EXIT_USAGE;
            }
            break;
        case OPT_GLOBAL: if (!fm_cli_int("run", "--global-experts", optarg, 1, 4096, &v)) return FM_EXIT_USAGE; global = (int)v; break;
        case OPT_ROUTING:
            if (strcmp(optarg, "internal") && strcmp(optarg, "external")) {
                fprintf(stderr, "fp4moe run: --routing expects internal or external, got '%s'\n", optarg);
                return FM_EXIT_USAGE;
            }
            external = !strcmp(optarg, "external");
            break;
        case OPT_WORK_LIST:
            if (!strcmp(optarg, "auto")) work_list = FM_WORK_LIST_AUTO;
            else if (!strcmp(optarg, "on")) work_list = FM_WORK_LIST_ON;
            else if (!strcmp(optarg, "off")) work_list = FM_WORK_LIST_OFF;
            else {
                fprintf(stderr, "fp4moe run: --work-list expects auto, on or off, got '%s'\n", optarg);
                return FM_EXIT_USAGE;
            }
            break;
        case OPT_PLAN:
            if (!parse_plan(optarg, &pspec)) return FM_EXIT_USAGE;
            break;
        case OPT_TUNE: tune = 1; break;
        case OPT_PLANS:
        case OPT_SAVE_PLANS:
            if (!*optarg) {
                fprintf(stderr, "fp4moe run: --%s expects a file name\n", c == OPT_PLANS ? "plans" : "save-plans");
                return FM_EXIT_USAGE;
            }
            *(c == OPT_PLANS ? &plans_in : &plans_out) = optarg;
            break;
        case OPT_ROW_Q:
            if (!strcmp(optarg, "auto")) row_q = FM_ROW_QUANTILE_AUTO;
            else if (!strcmp(optarg, "mean")) row_q = FM_ROW_QUANTILE_MEAN;
            else {
                char  *end = NULL;
                double q = strtod(optarg, &end);
                if (end == optarg || *end || !(q >= 0.5 && q < 1.0)) {
                    fprintf(stderr, "fp4moe run: --row-quantile expects auto, mean or a quantile in [0.5, 1), got '%s'\n",
                            optarg);
                    return FM_EXIT_USAGE;
                }
                row_q = q;
            }
            break;
        case OPT_SHARED: if (!fm_cli_int("run", "--shared-inter", optarg, 0, 1 << 20, &v)) return FM_EXIT_USAGE; o.cfg.shared_inter = (int)v; break;
        case OPT_ACT: o.cfg.act_nvfp4 = 1; break;
        case OPT_BACKEND:
            if (fm_backend_parse(optarg, &o.backend) != FM_OK) {
                fprintf(stderr, "fp4moe run: --backend expects auto, cuda, cpu or cpu-ref, got '%s'\n", optarg);
                return FM_EXIT_USAGE;
            }
            break;
        case OPT_ITERS: if (!fm_cli_int("run", "--iters", optarg, 1, 100000, &v)) return FM_EXIT_USAGE; o.iters = (int)v; break;
        case OPT_SEED: if (!fm_cli_double("run", "--seed", optarg, 0, 1.8e19, &dv)) return FM_EXIT_USAGE; o.seed = (uint64_t)dv; break;
        case OPT_CHECK: o.check = 1; break;
        case OPT_WEIGHTS: o.weights_path = optarg; break;
        case OPT_LAYER: if (!fm_cli_int("run", "--layer", optarg, 0, 100000, &v)) return FM_EXIT_USAGE; o.layer = (int)v; break;
        case OPT_JSON: o.json = 1; break;
        case OPT_HELP: usage(stdout); return FM_EXIT_OK;
        default:
            fprintf(stderr, "fp4moe run: unknown or incomplete flag '%s'\n", argv[optind - 1]);
            usage(stderr);
            return FM_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "fp4moe run: unexpected argument '%s'\n", argv[optind]);
        return FM_EXIT_USAGE;
    }
    if (o.weights_path && shape_flag) {
        fprintf(stderr, "fp4moe run: --%s sets the layer's shape, which --weights takes from the checkpoint\n",
                shape_flag);
        return FM_EXIT_USAGE;
    }
    if ((long long)o.tokens * o.cfg.top_k > 2147483647LL) {
        fprintf(stderr, "fp4moe run: --tokens x --topk = %lld routed rows exceeds 2^31-1\n",
                (long long)o.tokens * o.cfg.top_k);
        return FM_EXIT_USAGE;
    }
    if (o.layer >= 0 && !o.weights_path) {
        fprintf(stderr, "fp4moe run: --layer needs --weights PATH\n");
        return FM_EXIT_USAGE;
    }
    if (o.cfg.n_group > 1 && o.cfg.topk_group == 0) o.cfg.topk_group = 1;
    if (o.weights_path && topk_group_flag && !(o.route_set & (1u << FM_ROUTE_GROUPS))) {
        fprintf(stderr, "fp4moe run: with --weights, --topk-group overrides the groups only together with --groups\n");
        return FM_EXIT_USAGE;
    }
    if (o.weights_path && (o.route_set & (1u << FM_ROUTE_GROUPS)) && o.cfg.n_group < 2) o.cfg.topk_group = 0;

    if (global) { /* a shard of a bigger model: --experts (or the shard's count) experts held of N */
        if (!shard_count) shard_count = o.cfg.n_experts;
        else if (experts_set && o.cfg.n_experts != shard_count) {
            fprintf(stderr, "fp4moe run: --experts %d contradicts --shard %d:%d (with --global-experts, --experts is "
                            "the number of experts held: give one of them)\n", o.cfg.n_experts, shard_first,
                    shard_count);
            return FM_EXIT_USAGE;
        }
        if ((long long)shard_first + shard_count > global) {
            fprintf(stderr, "fp4moe run: --shard %d:%d is not a range of the layer's %d experts (--global-experts)\n",
                    shard_first, shard_count, global);
            return FM_EXIT_USAGE;
        }
        o.cfg.n_experts = global;
        o.global_experts = global;
    }
    o.shard_first = shard_first, o.shard_count = shard_count;
    /* cuda: the device path (run_cuda.c), on ordinal 0 opened here */
    const int use_cuda = o.backend == FM_BACKEND_CUDA ||
                         (o.backend == FM_BACKEND_AUTO && fm_backend_available(FM_BACKEND_CUDA) == FM_OK);
    /* Say "no GPU" before spending seconds on quantizing weights. */
    fm_status s = fm_backend_available(o.backend);
    if (s != FM_OK) return fm_cli_fail("run", s);
    /* and refuse an --output path that is a link, FIFO, device or read-only file before
     * the run, not after it (fm_file.h's rule; checked again when the output is written) */
    if (o.output_path) {
        fm_file_out probe;
        if ((s = fm_file_out_begin(o.output_path, &probe)) != FM_OK) return fm_cli_fail("run", s);
        fm_file_out_abort(&probe);
    }
    fm_run_model m;
    s = fm_run_model_build(&o, &m);
    if (s != FM_OK) { /* settings from flags that do not make a layer are usage errors; a bad checkpoint or
                       * --input file is not (exit 1 whatever is wrong with the file, with or without --weights) */
        int rc0 = fm_cli_fail("run", s);
        const char *d = fm_last_error();
        if (o.weights_path && d && strstr(d, "give ")) /* routing the checkpoint does not say */
            fprintf(stderr, "fp4moe run: the routing flags are --topk, --score, --renormalize, --routed-scale "
                            "and --groups/--topk-group\n");
        return !o.weights_path && !m.bad_input && (s == FM_ERR_INVALID_ARG || s == FM_ERR_BAD_SHAPE) ? FM_EXIT_USAGE
                                                                                                  : rc0;
    }
    const fm_moe_config *cfg = &m.cfg;
    int T = m.tokens; /* --tokens, or the rows of --input */
    if (shard_count && (long long)shard_first + shard_count > cfg->n_experts) {
        fprintf(stderr, "fp4moe run: --shard %d:%d is not a range of the layer's %d experts\n", shard_first,
                shard_count, cfg->n_experts);
        fm_run_model_free(&m);
        return FM_EXIT_USAGE;
    }
    size_t n_out = (size_t)T * cfg->hidden;
    float *out = malloc(n_out * sizeof *out), *ref = NULL;
    int32_t *ids = NULL;
    float   *wts = NULL;
    /* the shard's view of the weights: its experts; the router stays global */
    fm_moe_weights sw = m.w;
    const int      off = shard_first - m.first_held; /* with --global-experts m holds the shard's experts only */
    sw.w13 += off, sw.w2 += off;
    if (sw.a1_scale) sw.a1_scale += off;
    if (sw.a2_scale) sw.a2_scale += off;
    fm_cuda_device *dev = NULL;
    fm_layer_desc desc = {.backend = o.backend, .max_tokens = T, .first_expert = shard_first, .n_local = shard_count,
                          .decode_work_list = work_list, .row_quantile = (float)row_q, .plans = plans_in};
    fm_run_cuda_times ct = {0};
    fm_layer_run_args run = {.x = m.x, .T = T, .out = out};
    double *ms = calloc((size_t)o.iters, sizeof *ms);
    int rc = FM_EXIT_OK;
    fm_layer *layer = NULL;
    if (!out || !ms) {
        fprintf(stderr, "fp4moe run: out of host memory\n");
        rc = FM_EXIT_FAIL;
        goto done;
    }

    if (external) {
        ids = malloc(sizeof(int32_t) * (size_t)T * cfg->top_k);
        wts = malloc(sizeof(float) * (size_t)T * cfg->top_k);
        if (!ids || !wts || (s = host_routing(cfg, &m.w, m.x, T, ids, wts)) != FM_OK) {
            rc = fm_cli_fail("run", ids && wts ? s : FM_ERR_OOM);
            goto done;
        }
        run.topk_ids = ids, run.topk_weights = wts;
    }
    fm_cli_progress("fp4moe run: preparing backend...\n");
    /* cold start, apart from making the random weights: opening the device (which learns the
     * kernels it has code for; a PTX build JIT-compiles here) and creating the layer */
    double            open_ms = 0, create_ms = 0, t_start = fm_cli_now_ms();
    fm_cuda_code_info code;
    memset(&code, 0, sizeof code);
    if (use_cuda) {
        if ((s = fm_cuda_device_open(0, &dev)) != FM_OK) {
            rc = fm_cli_fail("run", s);
            goto done;
        }
        (void)fm_cuda_device_code(dev, &code);
        open_ms = fm_cli_now_ms() - t_start;
        desc.backend = FM_BACKEND_CUDA, desc.device = dev;
    }
    t_start = fm_cli_now_ms();
    s = fm_layer_create_desc(&desc, cfg, &sw, &layer);
    create_ms = fm_cli_now_ms() - t_start;
    if (s != FM_OK) {
        rc = fm_cli_fail("run", s);
        goto done;
    }
    fm_backend_kind bk = fm_layer_backend(layer);
    if ((pspec.given || tune || plans_out) && bk != FM_BACKEND_CUDA) {
        fprintf(stderr, "fp4moe run: %s applies to the cuda backend (%s); the %s backend has no tile plan\n",
                pspec.given ? "--plan" : tune ? "--tune" : "--save-plans",
                pspec.given ? "fm_layer_set_plan" : tune ? "fm_layer_tune" : "fm_layer_save_plans",
                fm_backend_name(bk));
        rc = FM_EXIT_USAGE;
        goto done;
    }
    if (pspec.given && (s = apply_plan(layer, T, &pspec)) != FM_OK) { /* before any run: nothing ran */
        rc = fm_cli_fail("run", s);
        goto done;
    }
    if (*fm_layer_plans_note(layer)) fprintf(stderr, "fp4moe run: %s\n", fm_layer_plans_note(layer));
    fm_layer_tune_info tinfo = {0};
    if (tune) { /* from the planner's plan, or --plan's */
        fm_cli_progress("fp4moe run: tuning the plan of %d tokens...\n", T);
        if ((s = fm_layer_tune(layer, T, NULL, &tinfo)) != FM_OK) {
            rc = fm_cli_fail("run", s);
            goto done;
        }
    }
    if (plans_out && (s = fm_layer_save_plans(layer, plans_out)) != FM_OK) { /* before the runs: nothing timed lost */
        rc = fm_cli_fail("run", s);
        goto done;
    }
    /* one warm-up, then the timed repetitions; external routing through fm_layer_run
     * (host pointers on the CPU backends), timed on the host clock */
    fm_run_stats st;
    if (bk == FM_BACKEND_CUDA) { /* device x (ids, weights), a stream of ours, eager + graph replay */
        fm_cli_progress("fp4moe run: cuda, %d eager runs and %d graph replays...\n", o.iters, o.iters);
        fm_run_cuda_in ci = {.x = m.x, .T = T, .hidden = cfg->hidden, .top_k = cfg->top_k, .ids = ids, .wts = wts,
                             .iters = o.iters};
        s = fm_run_cuda(layer, 0, &ci, out, &ct);
        for (int i = 0; i < o.iters; i++) ms[i] = ct.eager_ms;
    }
    for (int i = -1; bk != FM_BACKEND_CUDA && i < o.iters; i++) {
        if (i >= 0) fm_cli_progress("\rfp4moe run: %s iteration %d/%d", fm_backend_name(bk), i + 1, o.iters);
        double t0 = fm_cli_now_ms();
        s = external ? fm_layer_run(layer, &run) : fm_layer_forward(layer, m.x, T, out, &st);
        if (s != FM_OK) break;
        if (i >= 0) ms[i] = external ? fm_cli_now_ms() - t0 : st.ms;
    }
    fm_cli_progress("\n");
    if (s != FM_OK) {
        rc = fm_cli_fail("run", s);
        goto done;
    }
    s = fm_run_write_output(&o, &m, out); /* the backend's output of the last iteration */
    if (s != FM_OK) {
        rc = fm_cli_fail("run", s);
        goto done;
    }
    qsort(ms, (size_t)o.iters, sizeof *ms, cmp_double);
    double med = ms[o.iters / 2];
    /* cuda: the plan of T's bucket (tiles, splits, layouts the run launched) */
    fm_layer_plan_info pi;
    const int          have_plan = bk == FM_BACKEND_CUDA && fm_layer_plan(layer, T, &pi) == FM_OK;
    char               tn[2][48] = {"", ""};
    if (have_plan)
        for (int g = 0; g < 2; g++) fm_tile_name(&pi.tile[g], tn[g], sizeof tn[g]);
    double bytes = fm_run_model_bytes(&m, T);
    double flops = fm_run_model_flops(&m, T);

    double nmse = -1, maxabs = 0, bound = nmse_bound(bk, cfg);
    long bad = -1;
    if (o.check) {
        fm_cli_progress("fp4moe run: running the CPU reference for --check...\n");
        ref = malloc(n_out * sizeof *ref);
        if (!ref) {
            fprintf(stderr, "fp4moe run: out of host memory\n");
            rc = FM_EXIT_FAIL;
            goto done;
        }
        if (shard_count || external) { /* the reference holding the same shard, given the same routing */
            fm_layer     *rl = NULL;
            fm_layer_desc rd = desc;
            rd.backend = FM_BACKEND_CPU_REF, rd.device = NULL;
            fm_layer_run_args ra = run;
            ra.out = ref;
            s = fm_layer_create_desc(&rd, cfg, &sw, &rl);
            if (s == FM_OK) s = fm_layer_run(rl, &ra);
            fm_layer_destroy(rl);
        } else {
            s = fm_moe_forward_ref(cfg, &m.w, m.x, T, ref);
        }
        if (s != FM_OK) {
            rc = fm_cli_fail("run", s);
            goto done;
        }
        double num = 0, den = 0;
        for (size_t i = 0; i < n_out; i++) {
            if (!isfinite(out[i]) && bad < 0) bad = (long)i;
            double d = (double)out[i] - ref[i];
            num += d * d;
            den += (double)ref[i] * ref[i];
            if (fabs(d) > maxabs) maxabs = fabs(d);
        }
        nmse = den > 0 ? num / den : num;
        if (bad >= 0 || !(nmse <= bound)) rc = FM_EXIT_MISMATCH;
        if (bk == FM_BACKEND_CUDA && !ct.graph_bitexact) rc = FM_EXIT_MISMATCH; /* replay must equal eager */
    }

    if (o.json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "backend", fm_backend_name(bk));
        cJSON_AddNumberToObject(j, "device_open_ms", open_ms);
        cJSON_AddNumberToObject(j, "layer_create_ms", create_ms);
        if (dev) {
            cJSON_AddStringToObject(j, "code_target", code.running);
            cJSON_AddBoolToObject(j, "jit", code.jit);
        }
        cJSON_AddStringToObject(j, "format", fm_format_traits_get(cfg->wfmt)->name);
        cJSON_AddNumberToObject(j, "experts", cfg->n_experts);
        cJSON_AddNumberToObject(j, "top_k", cfg->top_k);
        cJSON_AddNumberToObject(j, "hidden", cfg->hidden);
        cJSON_AddNumberToObject(j, "inter", cfg->inter);
        cJSON_AddNumberToObject(j, "tokens", T);
        cJSON_AddNumberToObject(j, "active_experts", m.active_experts);
        cJSON_AddNumberToObject(j, "shard_first", shard_first);
        cJSON_AddNumberToObject(j, "shard_count", shard_count ? shard_count : cfg->n_experts - shard_first);
        cJSON_AddStringToObject(j, "routing", external ? "external" : "internal");
        /* device: fm_layer_run on device buffers and a stream (cuda); host: host pointers (CPU backends) */
        cJSON_AddStringToObject(j, "path", bk == FM_BACKEND_CUDA ? "device" : "host");
        cJSON_AddNumberToObject(j, "time_ms", med);
        cJSON_AddNumberToObject(j, "eager_ms", med);
        if (bk == FM_BACKEND_CUDA) {
            cJSON_AddNumberToObject(j, "graph_ms", ct.graph_ms);
            cJSON_AddNumberToObject(j, "graph_gbps", bytes / (ct.graph_ms * 1e6));
            cJSON_AddBoolToObject(j, "graph_matches_eager", ct.graph_bitexact);
            if (have_plan) { /* fm_layer_plan_info of T's bucket */
                cJSON *pj = cJSON_AddObjectToObject(j, "plan");
                cJSON_AddNumberToObject(pj, "bucket_tokens", pi.bucket_tokens);
                cJSON_AddNumberToObject(pj, "expected_rows", pi.expected_rows);
                cJSON_AddNumberToObject(pj, "active_experts", pi.active_experts);
                cJSON_AddBoolToObject(pj, "work_list", pi.work_list);
                if (tune) {
                    cJSON *tj = cJSON_AddObjectToObject(j, "tune");
                    cJSON_AddNumberToObject(tj, "plans_tried", tinfo.plans_tried);
                    cJSON_AddNumberToObject(tj, "plans_refused", tinfo.plans_refused);
                    cJSON_AddNumberToObject(tj, "before_us", tinfo.before_us);
                    cJSON_AddNumberToObject(tj, "after_us", tinfo.after_us);
                    cJSON_AddBoolToObject(tj, "changed", tinfo.changed);
                }
                const char *gn[2] = {"fc1", "fc2"};
                for (int g = 0; g < 2; g++) {
                    cJSON *gj = cJSON_AddObjectToObject(pj, gn[g]);
                    cJSON_AddStringToObject(gj, "tile", tn[g]);
                    cJSON_AddNumberToObject(gj, "k_splits", pi.k_splits[g]);
                    cJSON_AddBoolToObject(gj, "x_packed", pi.x_packed[g]);
                    cJSON_AddNumberToObject(gj, "feature_blocks", pi.feature_blocks[g]);
                }
            }
        } else {
            cJSON_AddNullToObject(j, "graph_ms");
        }
        cJSON_AddNumberToObject(j, "bytes", bytes);
        cJSON_AddNumberToObject(j, "gbps", bytes / (med * 1e6));
        cJSON_AddNumberToObject(j, "tflops", flops / (med * 1e9));
        if (o.check) {
            cJSON_AddNumberToObject(j, "nmse", nmse);
            cJSON_AddNumberToObject(j, "max_abs_err", maxabs);
            cJSON_AddNumberToObject(j, "nmse_bound", bound);
            cJSON_AddBoolToObject(j, "check_passed", rc == FM_EXIT_OK);
        }
        fm_cli_print_json(j);
    } else {
        printf("fp4moe run: %s backend, %s weights, %d experts (top-%d), hidden %d, inter %d, %d token%s%s\n",
               fm_backend_name(bk), fm_format_traits_get(cfg->wfmt)->name, cfg->n_experts, cfg->top_k, cfg->hidden,
               cfg->inter, T, T == 1 ? "" : "s", cfg->act_nvfp4 ? ", NVFP4 activations" : "");
        printf("  active experts   %d of %d%s\n", m.active_experts, shard_count ? shard_count : cfg->n_experts,
               shard_count ? " held" : "");
        if (shard_count || external)
            printf("  shard / routing  experts [%d, %d) held, %s routing\n", shard_first,
                   shard_count ? shard_first + shard_count : cfg->n_experts, external ? "external" : "internal");
        if (bk == FM_BACKEND_CUDA) {
            printf("  startup          device open %.1f ms (code %s%s), layer create %.1f ms\n", open_ms,
                   code.running, code.jit ? ", PTX JIT-compiled at open" : ", SASS", create_ms);
            printf("  path             device: fm_layer_run on device x%s, a stream of its own\n",
                   external ? ", ids and weights" : "");
            printf("  time (median)    %.3f ms eager, %.3f ms CUDA graph replay, over %d iterations each\n", med,
                   ct.graph_ms, o.iters);
            printf("  graph replay     %s the eager output bit for bit\n", ct.graph_bitexact ? "equals" : "DIFFERS from");
            if (have_plan)
                printf("  plan             bucket of %d token%s, tiles for %d row%s x %d experts%s: FC1 %s (K split %d%s), "
                       "FC2 %s (K split %d%s)\n",
                       pi.bucket_tokens, pi.bucket_tokens == 1 ? "" : "s", pi.expected_rows, pi.expected_rows == 1 ? "" : "s", pi.active_experts, pi.work_list ? ", work list" : "", tn[0],
                       pi.k_splits[0], pi.x_packed[0] ? ", packed X" : "", tn[1], pi.k_splits[1],
                       pi.x_packed[1] ? ", packed X" : "");
            if (tune)
                printf("  tune             %d plans tried (%d refused): %.1f -> %.1f us per graph replay "
                       "(synthetic routing), %s\n",
                       tinfo.plans_tried, tinfo.plans_refused, tinfo.before_us, tinfo.after_us,
                       tinfo.changed ? "a faster plan kept" : "the plan kept (none >= 3 % faster)");
        } else {
            printf("  time (median)    %.3f ms over %d iterations\n", med, o.iters);
        }
        printf("  bytes read       %.1f MB (active experts' weights + scales + activations)\n", bytes / 1e6);
        if (bk == FM_BACKEND_CUDA)
            printf("  bandwidth        %.1f GB/s eager, %.1f GB/s graph replay\n", bytes / (med * 1e6),
                   bytes / (ct.graph_ms * 1e6));
        else
            printf("  bandwidth        %.1f GB/s\n", bytes / (med * 1e6));
        printf("  compute          %.3f TFLOP/s\n", flops / (med * 1e9));
        if (o.check) {
            if (bad >= 0) printf("  check            FAILED: non-finite output at index %ld\n", bad);
            else
                printf("  check            nmse %.3e, max |err| %.3e vs CPU reference (bound %.0e): %s\n", nmse,
                       maxabs, bound, rc == FM_EXIT_OK ? "passed" : "FAILED");
        }
    }
done:
    free(ids);
    free(wts);
    fm_layer_destroy(layer);
    fm_cuda_device_close(dev); /* after its layer */
    fm_run_model_free(&m);
    free(out);
    free(ref);
    free(ms);
    return rc;
}
