/* cmd_plan_engine.c - `fp4moe plan --engine E --gpu G --format F`: the MoE grouped-GEMM
 * tactics that engine compiles, each checked on the GPU: fits / dies in initialize() /
 * rejected at compile time, its bytes, and the fix (fm_tactics_check). */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "flags.h"

typedef struct {
    const char *engine, *version, *gpu, *format;
    int         cutlass, json, help;
} engine_opts;

/* --cutlass V: the library's parse, its refusal a usage error naming the versions */
static int parse_cutlass(const char *cmd, const char *flag, const char *v, void *field)
{
    fm_status st = fm_cutlass_version_parse(v, field);
    return st == FM_OK ? FM_FLAGS_GO : fm_cli_usage_status(cmd, flag, st);
}

/* no usage lines of their own: the usage's head says them */
#define O(f) offsetof(engine_opts, f)
static const fm_flag k_engine_flags[] = {
    {"engine", "E", FM_FLAG_STRING, O(engine), .help = NULL},
    {"engine-version", "COMMIT", FM_FLAG_STRING, O(version), .help = NULL},
    {"gpu", "NAME", FM_FLAG_STRING, O(gpu), .help = NULL},
    {"format", "F", FM_FLAG_STRING, O(format), .help = NULL},
    {"cutlass", "V", FM_FLAG_CUSTOM, O(cutlass), .parse = parse_cutlass, .help = NULL},
    {"json", NULL, FM_FLAG_SWITCH, O(json), .help = NULL},
    {"help", NULL, FM_FLAG_HELP, O(help), .help = NULL},
};
#undef O

static const fm_flag_cmd k_engine_cmd = {
    .cmd = "plan",
    .flags = k_engine_flags,
    .n_flags = sizeof k_engine_flags / sizeof k_engine_flags[0],
    .head = {"usage: fp4moe plan --engine trtllm|flashinfer|sglang|vllm [--engine-version COMMIT] --gpu NAME\n"
             "                   [--format nvfp4|mxfp4|fp8xfp4] [--cutlass V] [--json]\n"
             "The engine's own MoE grouped-GEMM tactic list (a data table: each row names the engine source file\n"
             "and commit it was read from), every tactic checked on the GPU with the CUTLASS version the engine\n"
             "build used (--cutlass to ask another): fits, dies in initialize() (passes can_implement, its\n"
             "SharedStorage is over the opt-in limit), or rejected at compile time; its bytes and the fix.\n"
             "exit: 0 every tactic fits, 5 some tactic dies or is rejected, 2 usage (unknown engine, version,\n"
             "GPU or format: the message lists the known ones), 1 failure\n"},
    .short_help = 1,
    .strict = 1,
    .unknown = {"", " does not go with --engine (see plan --engine --help)"},
    .missing = {"", " needs a value (or unknown flag)"},
    /* '' is not "not given": a script's empty variable must not pick the default */
    .empty_post = " expects a value, got '' (an empty string)",
};

static void print_text(const fm_gpu_info *g, const char *engine, const char *format, const fm_tactic_check *c,
                       size_t n)
{
    printf("%s MoE tactics on %s (sm_%d, opt-in limit %zu B per block), %s\n", engine, g->full_name, g->cc,
           n ? c[0].res.limit_bytes : (size_t)0, format);
    printf("  source: %s @ %.12s\n", c[0].tactic->source, c[0].tactic->commit);
    printf("  %-7s %-13s %-8s %-8s %-6s %8s %6s  %s\n", "gemm", "tile", "sched", "epilogue", "CUTLASS", "bytes",
           "stages", "verdict");
    for (size_t i = 0; i < n; i++) {
        const fm_kernel_config *k = &c[i].tactic->cfg;
        char tile[40], cut[32];
        snprintf(tile, sizeof tile, "%dx%dx%d", k->tile_m, k->tile_n, k->tile_k);
        snprintf(cut, sizeof cut, "%d.%d", k->cutlass / 100, k->cutlass / 10 % 10);
        printf("  %-7s %-13s %-8s %-8s %-6s %8zu %6d  %s\n", c[i].tactic->gemm, tile, fm_schedule_name(k->schedule),
               fm_epilogue_name(k->epilogue), cut, c[i].res.bytes.total, c[i].res.bytes.stages,
               fm_tactic_verdict_name(c[i].verdict));
        printf("      (%s)\n", c[i].tactic->note);
        if (c[i].verdict != FM_TACTIC_FITS) {
            printf("      why: %s\n", c[i].why);
            printf("      fix: %s\n", c[i].fix);
        }
    }
}

int fm_cmd_plan_engine(int argc, char **argv)
{
    engine_opts     opt = {.format = "nvfp4"};
    fm_flags_result r;
    int             rc = fm_flags_parse(&k_engine_cmd, argc, argv, &opt, &r);
    if (rc != FM_FLAGS_GO) return rc;
    const char *engine = opt.engine, *version = opt.version, *gpu_s = opt.gpu, *format = opt.format;
    const int   json = opt.json, cut = opt.cutlass;
    if (!engine || !gpu_s) {
        fprintf(stderr, "fp4moe plan: --engine and --gpu are required\n");
        fm_flags_usage(&k_engine_cmd, stderr);
        return FM_EXIT_USAGE;
    }
    fm_tactic_check c[64];
    size_t n = 0;
    fm_status st = fm_tactics_check(engine, version, gpu_s, format, c, 64, &n, NULL);
    if (st != FM_OK) return fm_cli_usage_status("plan", "--engine/--engine-version/--gpu/--format", st);
    const fm_gpu_info *g = NULL;
    if ((st = fm_gpu_find(gpu_s, &g)) != FM_OK) return fm_cli_fail("plan", st);
    fm_tactic copies[64];
    if (cut) { /* the same tactics under another CUTLASS version's builder */
        for (size_t i = 0; i < n; i++) {
            copies[i] = *c[i].tactic;
            copies[i].cfg.cutlass = cut;
        }
        if ((st = fm_tactics_recheck(g, copies, c, n)) != FM_OK) return fm_cli_fail("plan", st);
    }
    int all = 1;
    for (size_t i = 0; i < n; i++) all &= c[i].verdict == FM_TACTIC_FITS;
    if (json) {
        cJSON *arr = cJSON_CreateArray();
        for (size_t i = 0; i < n; i++) {
            const fm_tactic *t = c[i].tactic;
            cJSON *o = cJSON_CreateObject();
            char tile[40];
            snprintf(tile, sizeof tile, "%dx%dx%d", t->cfg.tile_m, t->cfg.tile_n, t->cfg.tile_k);
            cJSON_AddStringToObject(o, "engine", t->engine);
            cJSON_AddStringToObject(o, "gemm", t->gemm);
            cJSON_AddStringToObject(o, "tile", tile);
            cJSON_AddStringToObject(o, "schedule", fm_schedule_name(t->cfg.schedule));
            cJSON_AddStringToObject(o, "epilogue", fm_epilogue_name(t->cfg.epilogue));
            cJSON_AddNumberToObject(o, "cluster_m", t->cfg.cluster_m);
            cJSON_AddBoolToObject(o, "swap_ab", t->cfg.swap_ab != 0);
            cJSON_AddNumberToObject(o, "cutlass", t->cfg.cutlass);
            cJSON_AddStringToObject(o, "verdict", fm_tactic_verdict_name(c[i].verdict));
            cJSON_AddNumberToObject(o, "total_bytes", (double)c[i].res.bytes.total);
            cJSON_AddNumberToObject(o, "limit_bytes", (double)c[i].res.limit_bytes);
            cJSON_AddNumberToObject(o, "stages", c[i].res.bytes.stages);
            cJSON_AddStringToObject(o, "why", c[i].why);
            cJSON_AddStringToObject(o, "fix", c[i].fix);
            cJSON_AddStringToObject(o, "source", t->source);
            cJSON_AddStringToObject(o, "commit", t->commit);
            cJSON_AddStringToObject(o, "note", t->note);
            cJSON_AddItemToArray(arr, o);
        }
        fm_cli_print_json(arr);
    } else
        print_text(g, engine, format, c, n);
    return all ? FM_EXIT_OK : FM_EXIT_REJECTED;
}
