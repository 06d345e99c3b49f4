/* cmd_plan_engine.c - `fp4moe plan --engine E --gpu G --format F`: the MoE grouped-GEMM
 * tactics that engine compiles, each checked on the GPU: fits / dies in initialize() /
 * rejected at compile time, its bytes, and the fix (fm_tactics_check). */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"

static void help(FILE *f)
{
    fprintf(f, "usage: fp4moe plan --engine trtllm|flashinfer|sglang|vllm [--engine-version COMMIT] --gpu NAME\n"
               "                   [--format nvfp4|mxfp4|fp8xfp4] [--cutlass V] [--json]\n"
               "The engine's own MoE grouped-GEMM tactic list (a data table: each row names the engine source file\n"
               "and commit it was read from), every tactic checked on the GPU with the CUTLASS version the engine\n"
               "build used (--cutlass to ask another): fits, dies in initialize() (passes can_implement, its\n"
               "SharedStorage is over the opt-in limit), or rejected at compile time; its bytes and the fix.\n"
               "exit: 0 every tactic fits, 5 some tactic dies or is rejected, 2 usage (unknown engine, version,\n"
               "GPU or format: the message lists the known ones), 1 failure\n");
}

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
    const char *engine = NULL, *version = NULL, *gpu_s = NULL, *format = "nvfp4";
    int json = 0, cut = 0;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            help(stdout);
            return FM_EXIT_OK;
        } else if (!strcmp(f, "--json")) json = 1;
        else if (!v) {
            fprintf(stderr, "fp4moe plan: %s needs a value (or unknown flag)\n", f);
            return FM_EXIT_USAGE;
        } else if (!*v) { /* '' is not "not given": a script's empty variable must not pick the default */
            fprintf(stderr, "fp4moe plan: %s expects a value, got '' (an empty string)\n", f);
            return FM_EXIT_USAGE;
        } else {
            i++;
            if (!strcmp(f, "--engine")) engine = v;
            else if (!strcmp(f, "--engine-version")) version = v;
            else if (!strcmp(f, "--gpu")) gpu_s = v;
            else if (!strcmp(f, "--format")) format = v;
            else if (!strcmp(f, "--cutlass")) {
                fm_status st = fm_cutlass_version_parse(v, &cut);
                if (st != FM_OK) return fm_cli_usage_status("plan", f, st);
            } else {
                fprintf(stderr, "fp4moe plan: %s does not go with --engine (see plan --engine --help)\n", f);
                return FM_EXIT_USAGE;
            }
        }
    }
    if (!engine || !gpu_s) {
        fprintf(stderr, "fp4moe plan: --engine and --gpu are required\n");
        help(stderr);
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
