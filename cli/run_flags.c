/* run_flags.c - `fp4moe run`'s flags: one table (flags.h) gives the parse and
 * the --help; the custom values (--plan SPEC, --shard F:C, --row-quantile) have
 * their parsers here; run_flags_check refuses the combinations that cannot run. */
#define _POSIX_C_SOURCE 200809L
#include "run_flags.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "flags.h"
#include "fp4moe/cuda.h" /* FM_CUDA_MAX_K_SPLITS (--plan); plain C, in builds without CUDA too */

/* Parse SPEC into *ps; 0 (message printed) on a malformed item. */
static int parse_plan(const char *spec, fm_run_plan_spec *ps)
{
    *ps = (fm_run_plan_spec){.given = 1, .ks = {1, 1}, .list = -1};
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
                fprintf(stderr, "fp4moe run: --plan: '%s' is not a tile name (mma_w4m2n1k256s3, wgmma_w8m2n8k64s8, "
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

/* "F:C" -> first F >= 0, count C >= 1 (checked against the layer's experts later). */
static int parse_shard(const char *cmd, const char *flag, const char *a, void *field)
{
    fm_run_shard *sh = field;
    char         *e1 = NULL, *e2 = NULL;
    long          f = strtol(a, &e1, 10), c = 0;
    int           ok = e1 != a && *e1 == ':';
    if (ok) c = strtol(e1 + 1, &e2, 10);
    if (!ok || e2 == e1 + 1 || *e2 || f < 0 || c < 1 || f > 1 << 24 || c > 1 << 24) {
        fprintf(stderr, "fp4moe %s: %s expects FIRST:COUNT (FIRST >= 0, COUNT >= 1), got '%s'\n", cmd, flag, a);
        return FM_EXIT_USAGE;
    }
    sh->first = (int)f, sh->count = (int)c;
    return FM_FLAGS_GO;
}

/* auto | mean | a quantile in [0.5, 1) */
static int parse_row_quantile(const char *cmd, const char *flag, const char *a, void *field)
{
    double *q = field;
    if (!strcmp(a, "auto")) *q = FM_ROW_QUANTILE_AUTO;
    else if (!strcmp(a, "mean")) *q = FM_ROW_QUANTILE_MEAN;
    else {
        char  *end = NULL;
        double v = strtod(a, &end);
        if (end == a || *end || !(v >= 0.5 && v < 1.0)) {
            fprintf(stderr, "fp4moe %s: %s expects auto, mean or a quantile in [0.5, 1), got '%s'\n", cmd, flag, a);
            return FM_EXIT_USAGE;
        }
        *q = v;
    }
    return FM_FLAGS_GO;
}

static int parse_plan_flag(const char *cmd, const char *flag, const char *a, void *field)
{
    (void)cmd, (void)flag;
    return parse_plan(a, field) ? FM_FLAGS_GO : FM_EXIT_USAGE;
}


static const fm_flag_choice k_formats[] = {{"nvfp4", FM_FORMAT_NVFP4}, {"mxfp4", FM_FORMAT_MXFP4},
                                           {"bf16", FM_FORMAT_BF16}, {NULL, 0}};
static const fm_flag_choice k_scores[] = {{"sigmoid", FM_SCORE_SIGMOID}, {"softmax", FM_SCORE_SOFTMAX},
                                          {"softmax-topk", FM_SCORE_SOFTMAX_TOPK}, {NULL, 0}};
static const fm_flag_choice k_backends[] = {{"auto", FM_BACKEND_AUTO}, {"cuda", FM_BACKEND_CUDA},
                                            {"cpu", FM_BACKEND_CPU}, {"cpu-ref", FM_BACKEND_CPU_REF}, {NULL, 0}};
static const fm_flag_choice k_act_fp8[] = {{"off", FM_ACT_FP8_OFF}, {"block128", FM_ACT_FP8_BLOCK128},
                                           {"token", FM_ACT_FP8_TOKEN}, {NULL, 0}};
static const fm_flag_choice k_routings[] = {{"internal", 0}, {"external", 1}, {NULL, 0}};
static const fm_flag_choice k_work_lists[] = {{"auto", FM_WORK_LIST_AUTO}, {"on", FM_WORK_LIST_ON},
                                              {"off", FM_WORK_LIST_OFF}, {NULL, 0}};
static const fm_flag_choice k_decode_paths[] = {{"auto", FM_DECODE_PATH_AUTO}, {"on", FM_DECODE_PATH_ON},
                                                {"off", FM_DECODE_PATH_OFF}, {NULL, 0}};
static const fm_flag_choice k_fp8_paths[] = {{"every", FM_FP8_PATH_EVERY}, {"faster", FM_FP8_PATH_FASTER}, {NULL, 0}};

#define O(f) offsetof(fm_run_cli, f)
static const fm_flag k_run_flags[] = {
    /* name, value placeholder, kind, field, then the range (INT, DOUBLE), choices or parser, and the help */
    {"experts", "N", FM_FLAG_INT, O(o.cfg.n_experts), 1, 4096,
     .help = "routed experts in the layer          (default 32: GLM-5 EP8 shard)"},
    {"topk", "N", FM_FLAG_INT, O(o.cfg.top_k), 1, 4096, .help = "experts per token                    (default 8)"},
    {"hidden", "N", FM_FLAG_INT, O(o.cfg.hidden), 1, 1 << 20,
     .help = "model dimension                      (default 6144)"},
    {"inter", "N", FM_FLAG_INT, O(o.cfg.inter), 1, 1 << 20,
     .help = "expert intermediate size             (default 2048)"},
    {"tokens", "N", FM_FLAG_INT, O(o.tokens), 1, 1 << 20, .help = "tokens in the batch                  (default 4)"},
    {"format", "F", FM_FLAG_CHOICE, O(format), .choices = k_formats, .nocase = 1,
     .help = "nvfp4 | mxfp4 | bf16                 (default nvfp4)"},
    {"score", "S", FM_FLAG_CHOICE, O(score), .choices = k_scores, .nocase = 1,
     .help = "sigmoid | softmax | softmax-topk     (default sigmoid)"},
    {"groups", "G", FM_FLAG_INT, O(o.cfg.n_group), 0, 4096,
     .help = "expert groups for group-limited top-k (default 0: off)"},
    {"topk-group", "N", FM_FLAG_INT, O(o.cfg.topk_group), 1, 4096,
     .help = "groups kept with --groups            (default 1)"},
    {"renormalize", "B", FM_FLAG_INT, O(o.cfg.renormalize), 0, 1,
     .help = "1: top-k weights renormalised to sum 1, 0: not (default 1)"},
    {"routed-scale", "X", FM_FLAG_DOUBLE, O(routed_scale), 1e-30, 1e29, /* the layer takes < 1e30 */
     .help = "routed scaling factor                (default 2.5)"},
    {"shared-inter", "N", FM_FLAG_INT, O(o.cfg.shared_inter), 0, 1 << 20,
     .help = "BF16 shared expert size, 0 = none    (default 0)"},
    {"act-nvfp4", NULL, FM_FLAG_SWITCH, O(o.cfg.act_nvfp4), .help = "quantize activations to NVFP4 (W4A4)"},
    {"act-fp8", "S", FM_FLAG_CHOICE, O(o.cfg.act_fp8), .choices = k_act_fp8,
     .help = "FP8 activations (W4A8), scales per 128 or per token:\n"
             "block128 | token | off               (default off)"},
    {"backend", "B", FM_FLAG_CHOICE, O(backend), .choices = k_backends, .nocase = 1,
     .help = "auto | cuda | cpu | cpu-ref          (default auto)"},
    {"iters", "N", FM_FLAG_INT, O(o.iters), 1, 100000, .help = "timed repetitions, median reported   (default 5)"},
    {"seed", "S", FM_FLAG_DOUBLE, O(seed), 0, 1.8e19, .help = "random seed                          (default 1)"},
    {"check", NULL, FM_FLAG_SWITCH, O(o.check),
     .help = "compare with the CPU reference (exit 4 when outside the bound)"},
    {"weights", "PATH", FM_FLAG_FILE, O(o.weights_path),
     .help = "run a real layer from a safetensors checkpoint (with --layer);\n"
             "routing comes from its config.json; --topk --score --groups --topk-group\n"
             "--renormalize --routed-scale override it (said on stderr), --act-nvfp4\n"
             "runs it W4A4; shape flags are rejected"},
    {"layer", "L", FM_FLAG_INT, O(o.layer), 0, 100000, .help = "layer index in the checkpoint"},
    {"input", "X.npy", FM_FLAG_FILE, O(o.input_path),
     .help = "the input: [T][hidden] BF16 ('<u2' bits or ml_dtypes '<V2') or float32\n"
             "('<f4', rounded to BF16 RNE); T replaces --tokens"},
    {"output", "Y.npy", FM_FLAG_FILE, O(o.output_path), .help = "write the layer's output: float32 [T][hidden]"},
    {"shard", "F:C", FM_FLAG_CUSTOM, O(shard), .parse = parse_shard,
     .help = "hold experts [F, F+C) of the layer's experts only (an expert-parallel\n"
             "rank): routing stays over all of them, the output is the shard's partial\n"
             "sum; --check compares with the reference holding the same shard"},
    {"global-experts", "N", FM_FLAG_INT, O(global), 1, 4096,
     .help = "the layer is a shard of a model with N routed experts: router and top-k\n"
             "over N, weights made for the held experts only (--shard F:C, default\n"
             "0:--experts; expert i's weights as in the whole model's)"},
    {"routing", "R", FM_FLAG_CHOICE, O(external), .choices = k_routings,
     .help = "internal (router + top-k inside the layer) | external (the top-k ids and\n"
             "weights computed here from the router, passed in as an engine does;\n"
             "on cuda in device memory)            (default internal)"},
    {"work-list", "W", FM_FLAG_CHOICE, O(work_list), .choices = k_work_lists,
     .help = "cuda: auto | on | off, the experts' work list and split K in decode\n"
             "buckets (fm_layer_desc.decode_work_list) (default auto)"},
    {"decode", "D", FM_FLAG_CHOICE, O(decode), .choices = k_decode_paths,
     .help = "cuda: auto | on | off, the one-launch decode kernel in the buckets of\n"
             "at most 128 routed slots (fm_layer_desc.decode_path; auto: where it\n"
             "measured faster: <= 1 local routed slot, sm_90)  (default auto)"},
    {"fp8-path", "P", FM_FLAG_CHOICE, O(fp8_path), .choices = k_fp8_paths,
     .help = "cuda, with --act-fp8: every | faster, W4A8 in every bucket, or only\n"
             "where the plan expects it faster than W4A16\n"
             "(fm_layer_desc.act_fp8_path)           (default every)"},
    {"row-quantile", "Q", FM_FLAG_CUSTOM, O(row_q), .parse = parse_row_quantile,
     .help = "cuda: auto | mean | Q in [0.5, 1): the rows per expert tiles are chosen\n"
             "for (fm_layer_desc.row_quantile; auto: the 0.9-quantile from 32\n"
             "tokens, the mean below)                (default auto)"},
    {"plan", "SPEC", FM_FLAG_CUSTOM, O(plan), .parse = parse_plan_flag,
     .help = "cuda: run T's bucket with another plan (fm_layer_set_plan): comma-\n"
             "separated fc1=TILE[/SPLITS], fc2=TILE[/SPLITS], list[=N] | nolist, e.g.\n"
             "fc1=mma_w4m2n1k256s3/8,fc2=mma_w4m1n1k256s3/4,list; what is not\n"
             "named stays the planner's; refused before any run if the device or the\n"
             "GEMM cannot run it (wgmma tiles take packed X)"},
    {"tune", NULL, FM_FLAG_SWITCH, O(tune),
     .help = "cuda: tune T's bucket first (fm_layer_tune: other plans timed on the\n"
             "device, the fastest kept if >= 3 % faster), then run: the tune\n"
             "line says what it tried and kept"},
    {"plans", "FILE", FM_FLAG_FILE, O(plans_in),
     .help = "cuda: take the buckets' plans from a plan file (fm_layer_desc.plans), used\n"
             "only where its device/driver/library metadata and the layer's shape\n"
             "match (a warning says why not); a corrupt file is refused (exit 1)"},
    {"save-plans", "FILE", FM_FLAG_FILE, O(plans_out),
     .help = "cuda: after --tune (or --plans), write every bucket's plan into FILE\n"
             "(fm_layer_save_plans: this device's section, other sections kept)"},
    {"json", NULL, FM_FLAG_SWITCH, O(o.json), .help = "machine-readable output on stdout"},
    {"help", NULL, FM_FLAG_HELP, .help = "this text"},
};
#undef O

static const fm_flag_cmd k_run_cmd = {
    .cmd = "run",
    .flags = k_run_flags,
    .n_flags = sizeof k_run_flags / sizeof k_run_flags[0],
    .head = {"usage: fp4moe run [flags]\n"
             "Build a MoE layer with random quantized weights, run it, optionally check it.\n\n"},
    .col = 18,
    .unknown = {"unknown or incomplete flag '", "'"},
    .usage_on_unknown = 1,
};

/* Was --name given? Its argv index (the last time), 0 not. */
static int given(const fm_flags_result *r, const char *name)
{
    return r->seen[fm_flags_index(&k_run_cmd, name)];
}

/* The flags that set the layer's shape (not with --weights): the last one given, or NULL. */
static const char *shape_flag(const fm_flags_result *r)
{
    static const char *const k_shape[] = {"experts", "hidden", "inter", "format", "shared-inter", "global-experts"};
    const char              *last = NULL;
    for (int i = 0, at = 0; i < 6; i++)
        if (given(r, k_shape[i]) > at) at = given(r, k_shape[i]), last = k_shape[i];
    return last;
}

/* The combinations of flags that cannot run; FM_FLAGS_GO or FM_EXIT_USAGE (message printed). */
static int run_flags_check(fm_run_cli *cl, const fm_flags_result *r)
{
    fm_run_opts *o = &cl->o;
    const char  *shape = shape_flag(r);
    if (o->weights_path && shape) {
        fprintf(stderr, "fp4moe run: --%s sets the layer's shape, which --weights takes from the checkpoint\n", shape);
        return FM_EXIT_USAGE;
    }
    if ((long long)o->tokens * o->cfg.top_k > 2147483647LL) {
        fprintf(stderr, "fp4moe run: --tokens x --topk = %lld routed rows exceeds 2^31-1\n",
                (long long)o->tokens * o->cfg.top_k);
        return FM_EXIT_USAGE;
    }
    if (o->layer >= 0 && !o->weights_path) {
        fprintf(stderr, "fp4moe run: --layer needs --weights PATH\n");
        return FM_EXIT_USAGE;
    }
    if (o->cfg.n_group > 1 && o->cfg.topk_group == 0) o->cfg.topk_group = 1;
    if (o->weights_path && given(r, "topk-group") && !given(r, "groups")) {
        fprintf(stderr, "fp4moe run: with --weights, --topk-group overrides the groups only together with --groups\n");
        return FM_EXIT_USAGE;
    }
    if (o->weights_path && given(r, "groups") && o->cfg.n_group < 2) o->cfg.topk_group = 0;
    fm_run_shard *sh = &cl->shard;
    if (cl->global) { /* a shard of a bigger model: --experts (or the shard's count) experts held of N */
        if (!sh->count) sh->count = o->cfg.n_experts;
        else if (given(r, "experts") && o->cfg.n_experts != sh->count) {
            fprintf(stderr, "fp4moe run: --experts %d contradicts --shard %d:%d (with --global-experts, --experts is "
                            "the number of experts held: give one of them)\n",
                    o->cfg.n_experts, sh->first, sh->count);
            return FM_EXIT_USAGE;
        }
        if ((long long)sh->first + sh->count > cl->global) {
            fprintf(stderr, "fp4moe run: --shard %d:%d is not a range of the layer's %d experts (--global-experts)\n",
                    sh->first, sh->count, cl->global);
            return FM_EXIT_USAGE;
        }
        o->cfg.n_experts = cl->global;
        o->global_experts = cl->global;
    }
    o->shard_first = sh->first, o->shard_count = sh->count;
    return FM_FLAGS_GO;
}

/* argv -> cl: the table, then what the flags say together. FM_FLAGS_GO or the exit code. */
int fm_run_options(int argc, char **argv, fm_run_cli *cl)
{
    fm_run_opts *o = &cl->o;
    fm_run_opts_default(o);
    cl->format = (int)o->cfg.wfmt, cl->score = (int)o->cfg.score, cl->backend = (int)o->backend;
    cl->routed_scale = o->cfg.routed_scale, cl->seed = (double)o->seed;
    cl->work_list = FM_WORK_LIST_AUTO, cl->row_q = FM_ROW_QUANTILE_AUTO, cl->decode = FM_DECODE_PATH_AUTO;
    cl->fp8_path = FM_FP8_PATH_EVERY;
    fm_flags_result r;
    int             rc = fm_flags_parse(&k_run_cmd, argc, argv, cl, &r);
    if (rc != FM_FLAGS_GO) return rc;
    if (r.n_args) {
        fprintf(stderr, "fp4moe run: unexpected argument '%s'\n", r.args[0]);
        return FM_EXIT_USAGE;
    }
    o->cfg.wfmt = (fm_format)cl->format, o->cfg.score = (fm_score_func)cl->score;
    o->backend = (fm_backend_kind)cl->backend;
    o->cfg.routed_scale = (float)cl->routed_scale, o->seed = (uint64_t)cl->seed;
    o->tokens_set = given(&r, "tokens") != 0;
    static const struct {
        const char *flag;
        int         bit;
    } k_route[] = {{"topk", FM_ROUTE_TOP_K},
                   {"score", FM_ROUTE_SCORE},
                   {"groups", FM_ROUTE_GROUPS},
                   {"renormalize", FM_ROUTE_RENORMALIZE},
                   {"routed-scale", FM_ROUTE_SCALE}};
    for (int i = 0; i < 5; i++)
        if (given(&r, k_route[i].flag)) o->route_set |= 1u << k_route[i].bit;
    return run_flags_check(cl, &r);
}

