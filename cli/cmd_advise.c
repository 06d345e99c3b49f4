/* cmd_advise.c - `fp4moe advise`: the three levers of the field problem in one report.
 *  1. which of the serving engine's MoE tactics die on this GPU, and the fix (fm_tactics_check);
 *  2. rows per expert at these settings, and the max-running / tokens-per-step settings that
 *     reach 8, 16 and 32 rows (the simulator, fm_sim_find_crossings);
 *  3. the time of the engine's surviving tiles against fp4moe's own kernels at those rows,
 *     and the predicted tokens/s for each (fm_sim_run with the tile's M, and with fp4moe's kernel).
 * Everything is a model (docs/advise.md): nothing here needs a GPU. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "flags.h"

typedef struct {
    const char *model, *gpu, *engine, *format, *parallel;
    int         gpus, running, tps, steps, json, plot, help;
} advise_opts;

/* --tokens-per-step: the simulator's range (its own row) */
static int parse_tps(const char *cmd, const char *flag, const char *v, void *field)
{
    const fm_sim_range *rg = fm_sim_range_get(FM_SIM_SET_TOKENS_PER_STEP);
    long                lv;
    if (!fm_cli_int(cmd, flag, v, (long)rg->lo, (long)rg->hi, &lv)) return FM_EXIT_USAGE;
    *(int *)field = (int)lv;
    return FM_FLAGS_GO;
}

/* no usage lines of their own: the usage's head says them */
#define O(f) offsetof(advise_opts, f)
static const fm_flag k_advise_flags[] = {
    {"json", NULL, FM_FLAG_SWITCH, O(json), .help = NULL},
    {"plot", NULL, FM_FLAG_SWITCH, O(plot), .help = NULL},
    {"model", "M", FM_FLAG_STRING, O(model), .help = NULL},
    {"gpu", "G", FM_FLAG_STRING, O(gpu), .help = NULL},
    {"engine", "E", FM_FLAG_STRING, O(engine), .help = NULL},
    {"format", "F", FM_FLAG_STRING, O(format), .help = NULL},
    {"parallel", "P", FM_FLAG_STRING, O(parallel), .help = NULL},
    {"gpus", "N", FM_FLAG_INT, O(gpus), 1, 4096, .help = NULL},
    {"max-running", "R", FM_FLAG_INT, O(running), 1, 1 << 16, .help = NULL},
    {"tokens-per-step", "T", FM_FLAG_CUSTOM, O(tps), .parse = parse_tps, .help = NULL},
    {"decode-steps", "S", FM_FLAG_INT, O(steps), 1, 1024, .help = NULL},
    {"help", NULL, FM_FLAG_HELP, O(help), .help = NULL},
};
#undef O

static const fm_flag_cmd k_advise_cmd = {
    .cmd = "advise",
    .flags = k_advise_flags,
    .n_flags = sizeof k_advise_flags / sizeof k_advise_flags[0],
    .head = {"usage: fp4moe advise --model M --gpu G --gpus N [--engine trtllm|flashinfer|sglang|vllm]\n"
             "                     [--format nvfp4|mxfp4|fp8xfp4] [--parallel ep|tp] [--max-running R]\n"
             "                     [--tokens-per-step T] [--decode-steps S] [--json | --plot]\n"
             "  (1) the engine's tactics that die on the GPU and the fix; (2) rows per expert at the settings\n"
             "  and the settings that reach 8/16/32 rows; (3) the engine's surviving tiles vs fp4moe's kernels\n"
             "  at those rows, predicted MoE tokens/s (a model: docs/advise.md). --plot draws tokens/s against\n"
             "  max-running for each. Defaults: engine trtllm, nvfp4, EP, 64 requests, 1 token/step, 1 step.\n"
             "exit: 0, 2 usage (unknown model/GPU/engine: the message lists the known ones), 1 failure\n"},
    .short_help = 1,
    .strict = 1,
    .unknown = {"unknown flag ", " (see --help)"},
    .missing = {"", " needs a value (or unknown flag)"},
    /* '' is not "not given": a script's empty variable must not pick the default */
    .empty_post = " expects a value, got '' (an empty string)",
};

#define NSET 4 /* the settings compared: now, and the max-running reaching 8, 16, 32 rows */
typedef struct {
    char   label[48];
    int    tile_m; /* 0: fp4moe's kernel */
    int    same_as;      /* >= 0: the model gives exactly the figures of that row (printed as one) */
    double us[NSET], tps[NSET];
} option;

static fm_status sim_with(const fm_sim_config *base, const option *o, int max_running, fm_sim_result *r)
{
    fm_sim_config c = *base;
    c.max_running = max_running;
    c.kernel = o->tile_m ? FM_SIM_KERNEL_CUTLASS : FM_SIM_KERNEL_FP4MOE;
    c.tile_m = o->tile_m;
    return fm_sim_run(&c, r);
}

/* Where a row's figures come from: every figure of (3) is modelled. fp4moe's kernels are
 * measured on the H200 only (their fitted efficiencies: include/fp4moe/sim.h), where no
 * engine in the table has an FP4 grouped-GEMM tactic, so advise never reaches it. */
static const char *const k_source = "modelled: roofline (no measurement of this kernel on this GPU)";

int fm_cmd_advise(int argc, char **argv)
{
    advise_opts fl = {.engine = "trtllm", .format = "nvfp4", .parallel = "ep", .running = 64, .tps = 1, .steps = 1};
    fm_flags_result fr;
    int             rc = fm_flags_parse(&k_advise_cmd, argc, argv, &fl, &fr);
    if (rc != FM_FLAGS_GO) return rc;
    const char *model_s = fl.model, *gpu_s = fl.gpu, *engine = fl.engine, *format = fl.format;
    const char *parallel = fl.parallel;
    const long  gpus = fl.gpus, running = fl.running, tps = fl.tps, steps = fl.steps;
    const int   json = fl.json, plot = fl.plot;
    if (!model_s || !gpu_s || !gpus) {
        fprintf(stderr, "fp4moe advise: --model, --gpu and --gpus are required\n");
        fm_flags_usage(&k_advise_cmd, stderr);
        return FM_EXIT_USAGE;
    }
    if (json && plot) {
        fprintf(stderr, "fp4moe advise: --json and --plot: give one\n");
        return FM_EXIT_USAGE;
    }
    if (strcmp(parallel, "ep") && strcmp(parallel, "tp")) {
        fprintf(stderr, "fp4moe advise: --parallel expects ep or tp, got '%s'\n", parallel);
        return FM_EXIT_USAGE;
    }
    fm_sim_config cfg;
    fm_sim_config_default(&cfg);
    fm_status st;
    if ((st = fm_sim_model_find(model_s, &cfg.model)) != FM_OK) return fm_cli_usage_status("advise", "--model", st);
    const fm_gpu_info *g = NULL;
    if ((st = fm_tactics_check(engine, NULL, gpu_s, format, NULL, 0, &(size_t){0}, NULL)) != FM_OK)
        return fm_cli_usage_status("advise", "--engine/--gpu/--format", st);
    if ((st = fm_gpu_find(gpu_s, &g)) != FM_OK) return fm_cli_usage_status("advise", "--gpu", st);
    cfg.gpu = *g;
    cfg.gpus = (int)gpus;
    cfg.parallel = strcmp(parallel, "tp") ? FM_PARALLEL_EP : FM_PARALLEL_TP;
    cfg.max_running = (int)running;
    cfg.tokens_per_step = (int)tps;
    cfg.decode_steps = (int)steps;
    if ((st = fm_sim_config_check(&cfg)) != FM_OK) return fm_cli_usage_status("advise", "--gpus/--parallel", st);

    /* (1) the engine's tactics on this GPU */
    fm_tactic_check tc[64];
    size_t nt = 0;
    if ((st = fm_tactics_check(engine, NULL, gpu_s, format, tc, 64, &nt, NULL)) != FM_OK) return fm_cli_fail("advise", st);
    /* (2) rows per expert now, and the settings that reach 8/16/32 */
    fm_sim_result now;
    if ((st = fm_sim_run(&cfg, &now)) != FM_OK) return fm_cli_fail("advise", st);
    fm_sim_crossings cr, cr2 = {0};
    fm_sim_config mtp = cfg; /* the same with twice the tokens per step (MTP / speculative drafts) */
    mtp.tokens_per_step = 2 * cfg.tokens_per_step;
    /* twice a --tokens-per-step above half the simulator's range is outside it: that case
     * is left out (said in the report) rather than refused with a value the user never gave */
    const int have_mtp = mtp.tokens_per_step <= fm_sim_range_get(FM_SIM_SET_TOKENS_PER_STEP)->hi;
    if ((st = fm_sim_find_crossings(&cfg, 1 << 14, &cr)) != FM_OK ||
        (have_mtp && (st = fm_sim_find_crossings(&mtp, 1 << 14, &cr2)) != FM_OK))
        return fm_cli_fail("advise", st);
    /* (3) surviving tile heights (fc1 list: the M of each distinct fitting tile) and fp4moe's kernel */
    option opt[16];
    int no = 0;
    for (size_t i = 0; i < nt && no < 15; i++) {
        if (tc[i].verdict != FM_TACTIC_FITS) continue;
        int m = tc[i].tactic->cfg.tile_m, dup = 0;
        for (int j = 0; j < no; j++) dup |= opt[j].tile_m == m;
        if (dup) continue;
        snprintf(opt[no].label, sizeof opt[no].label, "%s %d-row tiles", engine, m);
        opt[no++].tile_m = m;
    }
    snprintf(opt[no].label, sizeof opt[no].label, "fp4moe kernels");
    opt[no++].tile_m = 0;
    int set[NSET] = {cfg.max_running, cr.rows_at[0], cr.rows_at[1], cr.rows_at[2]};
    for (int j = 0; j < no; j++) {
        opt[j].same_as = -1;
        for (int s = 0; s < NSET; s++) {
            fm_sim_result r = {0};
            if (set[s] && (st = sim_with(&cfg, &opt[j], set[s], &r)) != FM_OK) return fm_cli_fail("advise", st);
            opt[j].us[s] = r.fc1_us + r.fc2_us, opt[j].tps[s] = r.tokens_per_s;
        }
        /* two kernels the model cannot tell apart (both at the same roofline bound, neither
         * measured here) are one row, never two rows that look like a comparison */
        for (int k = 0; k < j && opt[j].same_as < 0; k++) {
            int same = opt[k].same_as < 0;
            for (int s = 0; s < NSET && same; s++)
                same = fabs(opt[k].us[s] - opt[j].us[s]) <= 1e-9 * (1 + opt[k].us[s]) &&
                       fabs(opt[k].tps[s] - opt[j].tps[s]) <= 1e-9 * (1 + opt[k].tps[s]);
            if (same) opt[j].same_as = k;
        }
    }
    static const int targets[3] = {8, 16, 32};
    if (json) {
        cJSON *o = cJSON_CreateObject(), *a = cJSON_CreateArray();
        cJSON_AddStringToObject(o, "model", cfg.model.name);
        cJSON_AddStringToObject(o, "gpu", g->name);
        cJSON_AddNumberToObject(o, "gpus", cfg.gpus);
        cJSON_AddStringToObject(o, "engine", engine);
        for (size_t i = 0; i < nt; i++) {
            cJSON *t = cJSON_CreateObject();
            char tile[40];
            snprintf(tile, sizeof tile, "%dx%dx%d", tc[i].tactic->cfg.tile_m, tc[i].tactic->cfg.tile_n,
                     tc[i].tactic->cfg.tile_k);
            cJSON_AddStringToObject(t, "gemm", tc[i].tactic->gemm);
            cJSON_AddStringToObject(t, "tile", tile);
            cJSON_AddStringToObject(t, "epilogue", fm_epilogue_name(tc[i].tactic->cfg.epilogue));
            cJSON_AddStringToObject(t, "verdict", fm_tactic_verdict_name(tc[i].verdict));
            cJSON_AddNumberToObject(t, "total_bytes", (double)tc[i].res.bytes.total);
            cJSON_AddStringToObject(t, "fix", tc[i].fix);
            cJSON_AddItemToArray(a, t);
        }
        cJSON_AddItemToObject(o, "tactics", a);
        cJSON_AddNumberToObject(o, "rows_per_active_expert", now.rows_per_active);
        cJSON *reach = cJSON_CreateObject();
        for (int j = 0; j < 3; j++) {
            char key[16];
            snprintf(key, sizeof key, "%d", targets[j]);
            cJSON_AddNumberToObject(reach, key, cr.rows_at[j]);
            snprintf(key, sizeof key, "%d_mtp", targets[j]);
            if (have_mtp) cJSON_AddNumberToObject(reach, key, cr2.rows_at[j]);
            else cJSON_AddNullToObject(reach, key); /* twice the tokens per step: beyond the simulator */
        }
        cJSON_AddItemToObject(o, "max_running_for_rows", reach);
        cJSON *ops = cJSON_CreateArray();
        for (int j = 0; j < no; j++) {
            cJSON *p = cJSON_CreateObject();
            cJSON_AddStringToObject(p, "kernel", opt[j].label);
            cJSON_AddNumberToObject(p, "tile_m", opt[j].tile_m);
            cJSON_AddStringToObject(p, "source", k_source);
            if (opt[j].same_as >= 0) cJSON_AddStringToObject(p, "same_as", opt[opt[j].same_as].label);
            else cJSON_AddNullToObject(p, "same_as");
            cJSON *at = cJSON_CreateArray();
            for (int s = 0; s < NSET; s++) {
                if (!set[s]) continue;
                cJSON *q = cJSON_CreateObject();
                cJSON_AddNumberToObject(q, "max_running", set[s]);
                cJSON_AddNumberToObject(q, "moe_gemm_us_per_layer", opt[j].us[s]);
                cJSON_AddNumberToObject(q, "tokens_per_s", opt[j].tps[s]);
                cJSON_AddItemToArray(at, q);
            }
            cJSON_AddItemToObject(p, "at", at);
            cJSON_AddItemToArray(ops, p);
        }
        cJSON_AddItemToObject(o, "kernels", ops);
        fm_cli_print_json(o);
        return FM_EXIT_OK;
    }
    if (plot) { /* tokens/s against max-running, one column per option, bars of '#' scaled to the best */
        static const int rs[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
        double best = 0, v[10][16];
        for (int i = 0; i < 10; i++)
            for (int j = 0; j < no; j++) {
                fm_sim_result r;
                if ((st = sim_with(&cfg, &opt[j], rs[i], &r)) != FM_OK) return fm_cli_fail("advise", st);
                v[i][j] = r.tokens_per_s;
                if (v[i][j] > best) best = v[i][j];
            }
        printf("predicted MoE tokens/s (ceiling) of %s on %d x %s, by max-running (each bar: one kernel choice)\n",
               cfg.model.name, cfg.gpus, g->name);
        for (int i = 0; i < 10; i++)
            for (int j = 0; j < no; j++) {
                int w = best > 0 ? (int)(50 * v[i][j] / best + 0.5) : 0;
                printf("%5d %-22s %10.0f |%.*s\n", rs[i], opt[j].label, v[i][j], w,
                       "##################################################");
            }
        return FM_EXIT_OK;
    }
    printf("advise: %s on %d x %s (%s), %s %s, %d requests x %d token(s)/step, %d decode step(s)/round\n",
           cfg.model.name, cfg.gpus, g->full_name, cfg.parallel == FM_PARALLEL_EP ? "EP" : "TP", engine, format,
           cfg.max_running, cfg.tokens_per_step, cfg.decode_steps);
    printf("\n(1) %s's MoE tactics on this GPU (%s @ %.12s):\n", engine, tc[0].tactic->source, tc[0].tactic->commit);
    int dead = 0;
    for (size_t i = 0; i < nt; i++) {
        const fm_kernel_config *k = &tc[i].tactic->cfg;
        printf("  %-7s %dx%dx%d %-8s %7zu B  %s\n", tc[i].tactic->gemm, k->tile_m, k->tile_n, k->tile_k,
               fm_epilogue_name(k->epilogue), tc[i].res.bytes.total, fm_tactic_verdict_name(tc[i].verdict));
        if (tc[i].verdict != FM_TACTIC_FITS) {
            dead++;
            printf("      why: %s\n      fix: %s\n", tc[i].why, tc[i].fix);
        }
    }
    if (!dead) printf("  every tactic fits\n");
    printf("\n(2) rows per active expert at %d requests: %.1f (p50 %d, p90 %d); %.0f%% of the 128-row tile is "
           "padding\n", cfg.max_running, now.rows_per_active, now.rows_p50, now.rows_p90, 100 * now.waste);
    for (int j = 0; j < 3; j++) {
        if (cr.rows_at[j] && have_mtp)
            printf("  %2d rows: max-running %d at %d token(s)/step, or %d with %d tokens/step (MTP)\n", targets[j],
                   cr.rows_at[j], cfg.tokens_per_step, cr2.rows_at[j], mtp.tokens_per_step);
        else if (cr.rows_at[j])
            printf("  %2d rows: max-running %d at %d token(s)/step (MTP at %d tokens/step: beyond the simulator's "
                   "%g, not computed)\n",
                   targets[j], cr.rows_at[j], cfg.tokens_per_step, mtp.tokens_per_step,
                   fm_sim_range_get(FM_SIM_SET_TOKENS_PER_STEP)->hi);
        else
            printf("  %2d rows: not reached below %d requests\n", targets[j], 1 << 14);
    }
    char labels[16][160]; /* each printed row: a kernel and those the model cannot tell from it */
    int  width = 22, merged = 0;
    for (int j = 0; j < no; j++) {
        int n = snprintf(labels[j], sizeof labels[j], "%s", opt[j].label);
        for (int k = j + 1; k < no; k++)
            if (opt[j].same_as < 0 && opt[k].same_as == j && n > 0 && (size_t)n < sizeof labels[j]) {
                n += snprintf(labels[j] + n, sizeof labels[j] - (size_t)n, " = %s", opt[k].label);
                merged = 1;
            }
        if (opt[j].same_as < 0 && n > width) width = n;
    }
    printf("\n(3) routed-GEMM time per layer (us) / predicted MoE tokens/s, by max-running:\n  %-*s", width, "kernel");
    for (int s = 0; s < NSET; s++)
        if (set[s]) printf(" %9d%s%-9s", set[s], s ? "" : "", s ? (s == 1 ? " (8 r)" : s == 2 ? " (16 r)" : " (32 r)") : " (now)");
    printf("\n");
    for (int j = 0; j < no; j++) {
        if (opt[j].same_as >= 0) continue;
        printf("  %-*s", width, labels[j]);
        for (int s = 0; s < NSET; s++)
            if (set[s]) printf(" %6.0f/%-11.0f", opt[j].us[s], opt[j].tps[s]);
        printf("\n    %s\n", k_source);
    }
    if (merged)
        printf("  (rows joined by '=': the model gives them the same figures here: each is at the same roofline bound "
               "at these rows and none is measured on this GPU, so it cannot tell the kernels apart)\n");
    if (g->cc == 120 || g->cc == 121)
        printf("  published (docs/background.md, the field report of this deployment): CUTLASS's 128-row FP4 tiles "
               "ran at 0.8-55 TFLOP/s during\n  decode on the RTX PRO 6000, against ~1,300 TFLOP/s on large FP4 GEMMs "
               "(~235 W of 600 W): far under the roofline above\n");
    printf("(model figures: the simulator's roofline with the GPU table; docs/simulate.md, docs/advise.md)\n");
    return FM_EXIT_OK;
}
