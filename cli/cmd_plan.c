/* cmd_plan.c - `fp4moe plan`: every catalogue tile for a GPU/format/epilogue/shape,
 * checked (fits or not, bytes, stages) and ranked by an estimated cost; with
 * --launcher, fp4moe's own tiles ranked as fm_cuda_gemm chooses (fm_plan_fp4moe). */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "flags.h"

typedef struct {
    fm_fp4moe_query q; /* --packed-x, --swiglu */
    const char     *gpu;
    int             ab, epi, cutlass; /* --format (fm_elem), --epilogue (fm_epilogue), --cutlass: 0 = 4.2 */
    int             rows, n, k, experts, fb, lim, ksp;
    int             json, launcher, swap, help;
} plan_opts;

/* --format: the GEMM operand types only (void and fp32 are epilogue types) */
static int parse_format(const char *cmd, const char *flag, const char *v, void *field)
{
    fm_elem ab;
    if (fm_elem_parse(v, &ab) != FM_OK || ab == FM_ELEM_VOID || ab == FM_ELEM_FP32) {
        fprintf(stderr, "fp4moe %s: %s expects nvfp4, mxfp4, fp8, bf16 or fp16, got '%s'\n", cmd, flag, v);
        return FM_EXIT_USAGE;
    }
    *(int *)field = (int)ab;
    return FM_FLAGS_GO;
}
static int parse_epilogue(const char *cmd, const char *flag, const char *v, void *field)
{
    fm_epilogue e;
    fm_status   st = fm_epilogue_parse(v, &e);
    if (st != FM_OK) return fm_cli_usage_status(cmd, flag, st);
    *(int *)field = (int)e;
    return FM_FLAGS_GO;
}
static int parse_cutlass(const char *cmd, const char *flag, const char *v, void *field)
{
    fm_status st = fm_cutlass_version_parse(v, field);
    return st == FM_OK ? FM_FLAGS_GO : fm_cli_usage_status(cmd, flag, st);
}

static void gpu_names(FILE *f)
{
    for (size_t i = 0; i < fm_gpu_count(); i++) fprintf(f, " %s", fm_gpu_at(i)->name);
}

/* no usage lines of their own: the usage's synopsis says them */
#define O(f) offsetof(plan_opts, f)
static const fm_flag k_plan_flags[] = {
    {"json", NULL, FM_FLAG_SWITCH, O(json), .help = NULL},
    {"launcher", NULL, FM_FLAG_SWITCH, O(launcher), .help = NULL},
    {"packed-x", NULL, FM_FLAG_SWITCH, O(q.x_packed), .help = NULL},
    {"swiglu", NULL, FM_FLAG_SWITCH, O(q.swiglu), .help = NULL},
    {"swap-ab", NULL, FM_FLAG_SWITCH, O(swap), .help = NULL},
    {"gpu", "NAME", FM_FLAG_STRING, O(gpu), .help = NULL},
    {"format", "F", FM_FLAG_CUSTOM, O(ab), .parse = parse_format, .help = NULL},
    {"epilogue", "E", FM_FLAG_CUSTOM, O(epi), .parse = parse_epilogue, .help = NULL},
    {"cutlass", "V", FM_FLAG_CUSTOM, O(cutlass), .parse = parse_cutlass, .help = NULL},
    {"rows-per-expert", "N", FM_FLAG_INT, O(rows), 1, 1 << 20, .help = NULL},
    {"n", "N", FM_FLAG_INT, O(n), 1, 1 << 20, .help = NULL},
    {"k", "K", FM_FLAG_INT, O(k), 1, 1 << 20, .help = NULL},
    {"experts", "E", FM_FLAG_INT, O(experts), 1, 1 << 16, .help = NULL},
    {"feature-blocks", "N", FM_FLAG_INT, O(fb), 0, 64, .help = NULL},
    {"smem-limit", "BYTES", FM_FLAG_INT, O(lim), 0, 1L << 30, .help = NULL},
    {"k-splits", "N", FM_FLAG_INT, O(ksp), 1, 32, .help = NULL},
    {"help", NULL, FM_FLAG_HELP, O(help), .help = NULL},
};
#undef O

static const fm_flag_cmd k_plan_cmd = {
    .cmd = "plan",
    .flags = k_plan_flags,
    .n_flags = sizeof k_plan_flags / sizeof k_plan_flags[0],
    .head = {"usage: fp4moe plan --gpu NAME [--format nvfp4|mxfp4|fp8|bf16|fp16] [--epilogue tma|nosmem|finalize]\n"
             "                   [--swap-ab] [--cutlass 4.2|4.4|4.5|4.7 (default 4.2)] [--rows-per-expert 8] [--n 4096]\n"
             "                   [--k 6144] [--experts 32] [--json]\n"
             "GPUs:"},
    .more = gpu_names,
    .tail = {"\nTiles of the GPU's CUTLASS family and fp4moe's own kernels (FP4 weights: fp4moe-mma, and on\n"
             "sm_90 fp4moe-wgmma), ranked.\n"
             "est_us is a roofline estimate (max of bytes/bandwidth and padded FLOPs/rate; within 2% is a tie,\n"
             "less wasted rows first). exit: 0 some tile fits, 5 none fits, 2 usage (a bad flag value, or a --k\n"
             "that no tile's K divides), 1 failure\n"
             "\n"
             "fp4moe plan --launcher --gpu NAME [--format nvfp4|mxfp4] [--packed-x] [--swiglu] [--feature-blocks N]\n"
             "                   [--k-splits N] [--smem-limit BYTES] [--rows-per-expert 8] [--n 4096] [--k 6144]\n"
             "                   [--experts 32] [--json]\n",
             "fp4moe's compiled tiles ranked as fm_cuda_gemm picks them with no tile given (fm_plan_fp4moe: a cost\n"
             "model with the CUDA calculator's occupancy, fitted to every tile's H200 timing; on other GPUs scaled,\n"
             "unmeasured); the first row is what it launches. --k-splits N: also rank the plain mma kernel with K\n"
             "split over 2, 4, ... up to N CTAs where its grid leaves SMs idle (column splits).\n"
             "exit: 0, 5 no tile fits the limit, 2 usage, 1 failure\n"},
    .short_help = 1,
    .strict = 1,
    .unknown = {"unknown flag ", " (see --help)"},
    .missing = {"", " needs a value (or unknown flag)"},
};

static int launcher_rank(const fm_gpu_info *g, fm_elem ab, const fm_fp4moe_query *q, long rows, long n, long k,
                         long experts, int json)
{
    fm_fp4moe_choice c[256];
    size_t           cnt = 0;
    fm_fp4moe_query  qq = *q;
    qq.weights = ab;
    fm_status st = fm_plan_fp4moe(g, &qq, rows, n, k, experts, c, 256, &cnt, NULL);
    int       catalogue = 0;
    if (st == FM_ERR_NO_KERNEL) { /* this build has no code for the GPU: rank what an `all` build carries */
        qq.mma_rows = qq.wgmma_rows = ~0ull;
        catalogue = 1;
        st = fm_plan_fp4moe(g, &qq, rows, n, k, experts, c, 256, &cnt, NULL);
    }
    if (catalogue && st == FM_OK && !json)
        printf("note: this build carries no code for %s (its GPU targets: %s); ranking the tiles an "
               "FM_CUDA_ARCHS=all build carries for it\n",
               g->name, fm_cuda_build_targets());
    if (st == FM_ERR_SMEM_EXCEEDED) {
        fprintf(stderr, "fp4moe plan: %s\n", fm_last_error());
        return FM_EXIT_REJECTED;
    }
    if (st != FM_OK)
        return fm_cli_usage_status("plan", st == FM_ERR_BAD_SHAPE ? "--n/--k/--rows-per-expert" : "--gpu/--format/--packed-x",
                                   st);
    cJSON *arr = json ? cJSON_CreateArray() : NULL;
    if (!json)
        printf("%s (sm_%d, %d SMs), %s weights, %s X%s, %ld rows/expert, N=%ld K=%ld, %ld experts: fm_cuda_gemm's "
               "ranking\n  %4s %-6s %-22s %6s %6s %8s %8s %9s %6s\n",
               g->full_name, g->cc, g->sms, fm_elem_name(ab), q->x_packed ? "packed" : "natural",
               q->swiglu ? ", SwiGLU" : "", rows, n, k, experts, "rank", "kernel", "tile", "blocks", "splits", "CTAs/SM",
               "smem", "est_us", "eff");
    for (size_t i = 0; i < cnt; i++) {
        char name[64];
        int  wg = c[i].tile.family == FM_FAMILY_FP4MOE_WGMMA;
        fm_tile_name(&c[i].tile, name, sizeof name);
        if (json) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "rank", (double)(i + 1));
            cJSON_AddStringToObject(o, "family", fm_family_name(c[i].tile.family));
            cJSON_AddStringToObject(o, "tile", name);
            cJSON_AddNumberToObject(o, "feature_blocks", c[i].feature_blocks);
            cJSON_AddNumberToObject(o, "k_splits", c[i].k_splits);
            cJSON_AddStringToObject(o, "variant", fm_kernel_variant_name(c[i].variant));
            cJSON_AddNumberToObject(o, "ctas_per_sm", c[i].ctas_per_sm);
            cJSON_AddNumberToObject(o, "smem_bytes", (double)c[i].smem_bytes);
            cJSON_AddNumberToObject(o, "est_us", c[i].est_us);
            cJSON_AddNumberToObject(o, "efficiency", c[i].efficiency);
            cJSON_AddItemToArray(arr, o);
        } else
            printf("  %4zu %-6s %-22s %6d %6d %8d %8zu %9.1f %6.3f\n", i + 1, wg ? "wgmma" : "mma", name,
                   c[i].feature_blocks, c[i].k_splits, c[i].ctas_per_sm, c[i].smem_bytes, c[i].est_us,
                   c[i].efficiency);
    }
    if (json) {
        fm_cli_print_json(arr);
    }
    return FM_EXIT_OK;
}

int fm_cmd_plan(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) /* the engines' own tactic lists: cmd_plan_engine.c */
        if (!strcmp(argv[i], "--engine")) return fm_cmd_plan_engine(argc, argv);
    plan_opts fl = {.q = {.weights = FM_ELEM_NVFP4}, .ab = FM_ELEM_NVFP4, .epi = FM_EPI_TMA,
                    .rows = 8, .n = 4096, .k = 6144, .experts = 32};
    fm_flags_result fr;
    int             rc = fm_flags_parse(&k_plan_cmd, argc, argv, &fl, &fr);
    if (rc != FM_FLAGS_GO) return rc;
    fm_fp4moe_query   q = fl.q;
    const long        fb = fl.fb, lim = fl.lim, ksp = fl.ksp;
    const char       *gpu_s = fl.gpu;
    const fm_elem     ab = (fm_elem)fl.ab;
    const fm_epilogue epi = (fm_epilogue)fl.epi;
    const int         json = fl.json, launcher = fl.launcher, swap = fl.swap, cutlass = fl.cutlass;
    const int         epi_given = fr.seen[fm_flags_index(&k_plan_cmd, "epilogue")] != 0;
    const long        rows = fl.rows, n = fl.n, k = fl.k, experts = fl.experts;
    fm_status         st = FM_OK;
    if (!gpu_s) {
        fprintf(stderr, "fp4moe plan: --gpu is required\n");
        fm_flags_usage(&k_plan_cmd, stderr);
        return FM_EXIT_USAGE;
    }
    const fm_gpu_info *g = NULL;
    if ((st = fm_gpu_find(gpu_s, &g)) != FM_OK) return fm_cli_usage_status("plan", "--gpu", st);
    if (launcher) {
        if (swap || epi_given || cutlass) { /* fp4moe's kernels have none of them: not silently ignored */
            fprintf(stderr, "fp4moe plan: --swap-ab, --epilogue and --cutlass describe CUTLASS tiles; --launcher ranks "
                            "fp4moe's own kernels, which have none of them\n");
            return FM_EXIT_USAGE;
        }
        if (ab != FM_ELEM_NVFP4 && ab != FM_ELEM_MXFP4) {
            fprintf(stderr, "fp4moe plan: --launcher ranks fp4moe's FP4 kernels: --format nvfp4 or mxfp4, not %s\n",
                    fm_elem_name(ab));
            return FM_EXIT_USAGE;
        }
        q.feature_blocks = (int)fb;
        q.smem_limit = (size_t)lim;
        q.max_k_splits = (int)ksp;
        return launcher_rank(g, ab, &q, rows, n, k, experts, json);
    }
    if (q.x_packed || q.swiglu || fb || lim || ksp) {
        fprintf(stderr, "fp4moe plan: --packed-x, --swiglu, --feature-blocks, --k-splits and --smem-limit go with "
                        "--launcher\n");
        return FM_EXIT_USAGE;
    }
    fm_plan_candidate c[64];
    size_t cnt = 0;
    /* the flags are the whole input: a shape no tile takes (BAD_SHAPE: K) or a format the
     * GPU's families lack is a usage error, naming the flag(s) */
    if ((st = fm_plan_candidates_ver(0, cutlass, g, ab, epi, swap, rows, n, k, experts, c, 64, &cnt, NULL)) != FM_OK)
        return fm_cli_usage_status("plan", st == FM_ERR_BAD_SHAPE ? "--k" : "--gpu/--format/--epilogue", st);
    int any = 0;
    cJSON *arr = json ? cJSON_CreateArray() : NULL;
    if (!json)
        printf("%s (sm_%d, %d SMs%s), %s, epilogue %s%s, %ld rows/expert, N=%ld K=%ld, %ld experts\n"
               "  %-13s %-21s %-8s %-4s %8s %8s %6s %7s %7s %9s\n",
               g->full_name, g->cc, g->sms, g->estimated ? ", some figures ~estimates" : "", fm_elem_name(ab),
               fm_epilogue_name(epi), swap ? " swap-AB" : "", rows, n, k, experts, "family", "tile", "sched", "fits", "bytes",
               "stages", "waves", "wasted", "B/FLOP", "est_us");
    for (size_t i = 0; i < cnt; i++) {
        const fm_plan_candidate *p = &c[i];
        any |= p->res.fits;
        char tile[48];
        int own = p->cfg.family == FM_FAMILY_FP4MOE_MMA || p->cfg.family == FM_FAMILY_FP4MOE_WGMMA; /* fp4moe's */
        snprintf(tile, sizeof tile, "%dx%dx%d", p->cfg.tile_m, p->cfg.tile_n, p->cfg.tile_k);
        if (own) /* "/p": the persistent wgmma kernel (packed X only; its output tile counted) */
            snprintf(tile + strlen(tile), sizeof tile - strlen(tile), "/w%d%s", p->cfg.warps,
                     p->cfg.persistent ? "/p" : "");
        const char *sched = own ? "-" : fm_schedule_name(p->cfg.schedule);
        if (json) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "family", fm_family_name(p->cfg.family));
            cJSON_AddStringToObject(o, "tile", tile);
            if (own) cJSON_AddNumberToObject(o, "warps", p->cfg.warps);
            if (p->cfg.family == FM_FAMILY_FP4MOE_WGMMA) cJSON_AddBoolToObject(o, "persistent", p->cfg.persistent);
            cJSON_AddStringToObject(o, "schedule", sched);
            cJSON_AddBoolToObject(o, "fits", p->res.fits);
            cJSON_AddNumberToObject(o, "total_bytes", (double)p->res.bytes.total);
            cJSON_AddNumberToObject(o, "limit_bytes", (double)p->res.limit_bytes);
            cJSON_AddNumberToObject(o, "stages", p->res.bytes.stages);
            cJSON_AddBoolToObject(o, "auto_stages", p->cfg.stages == 0);
            cJSON_AddNumberToObject(o, "mainloop_bytes", (double)p->res.bytes.mainloop);
            cJSON_AddNumberToObject(o, "epilogue_bytes", (double)p->res.bytes.epilogue);
            cJSON_AddNumberToObject(o, "waves", p->res.waves);
            cJSON_AddNumberToObject(o, "wasted_rows", p->wasted_rows);
            cJSON_AddNumberToObject(o, "bytes_per_flop", p->bytes_per_flop);
            cJSON_AddNumberToObject(o, "est_us", p->est_us);
            cJSON_AddStringToObject(o, "reason", p->res.reason);
            cJSON_AddItemToArray(arr, o);
        } else {
            printf("  %-13s %-21s %-8s %-4s %8zu %5d%-3s %6.2f %6.0f%% %7.3f %9.1f\n", fm_family_name(p->cfg.family),
                   tile, sched, p->res.fits ? "yes" : "NO", p->res.bytes.total, p->res.bytes.stages,
                   p->cfg.stages && !own ? "" : "a",
                   p->res.waves, 100 * p->wasted_rows, p->bytes_per_flop, p->est_us);
            if (!p->res.fits) printf("      %s\n", p->res.reason);
        }
    }
    if (json) {
        fm_cli_print_json(arr);
    } else
        printf("  ('a' = automatic stage count - for fp4moe-mma/-wgmma the compiled one; a CUTLASS row without it\n"
               "   is the fix for the rejected row above; fp4moe tile = tokens a pass x features x K / warps)\n");
    return any ? FM_EXIT_OK : FM_EXIT_REJECTED;
}
