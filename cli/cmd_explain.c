/* cmd_explain.c - `fp4moe explain`: byte-by-byte shared memory of one tile, the
 * verdict (cuBLASLt-style check) and the fix, as text or --json.
 * Every flag that changes the bytes is a flag here (see --help). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "flags.h"
#include "kernels/fm_tile_layout.h" /* the W4A8 staged kernels' layout (FM_FP8S_*) */
#include "plan/plan_internal.h" /* fm_plan_resolve: the family and schedule it checked */

/* "MxN": two whole numbers in [1, 16] (a cluster has at most 16 CTAs), digits only,
 * so an overflowing "99999999999x1" is an error instead of a wrapped int. */
static int cluster_parse(const char *s, int *m, int *n)
{
    int v[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        int d = 0;
        for (; *s >= '0' && *s <= '9'; s++, d++)
            if (d >= 2 || (v[i] = v[i] * 10 + (*s - '0')) > 16) return 0;
        if (!d || v[i] < 1 || *s != (i ? '\0' : 'x')) return 0;
        s++;
    }
    *m = v[0], *n = v[1];
    return 1;
}

typedef struct {
    fm_kernel_config cfg;
    const char      *arch, *gpu, *tile;
    int              json, k, help, w4a8;
    int              sched_set; /* a --schedule other than auto was given */
} explain_opts;

/* A value the library parses: its refusal is a usage error naming the flag (fm_cli_usage_status). */
static int lib(const char *cmd, const char *flag, fm_status st)
{
    return st == FM_OK ? FM_FLAGS_GO : fm_cli_usage_status(cmd, flag, st);
}
static int parse_elem(const char *cmd, const char *flag, const char *v, void *field)
{
    return lib(cmd, flag, fm_elem_parse(v, field));
}
static int parse_format(const char *cmd, const char *flag, const char *v, void *field) /* --a and --b */
{
    fm_kernel_config *c = field;
    fm_status         st = fm_elem_parse(v, &c->a);
    if (st == FM_OK) c->b = c->a;
    return lib(cmd, flag, st);
}
static int parse_epilogue(const char *cmd, const char *flag, const char *v, void *field)
{
    return lib(cmd, flag, fm_epilogue_parse(v, field));
}
static int parse_epi_tile(const char *cmd, const char *flag, const char *v, void *field)
{
    fm_kernel_config *c = field;
    return lib(cmd, flag, fm_epi_tile_parse(v, &c->epi_tile_m, &c->epi_tile_n));
}
static int parse_schedule(const char *cmd, const char *flag, const char *v, void *field)
{
    explain_opts *o = field;
    if (strcmp(v, "auto")) o->sched_set = 1;
    return lib(cmd, flag, fm_schedule_parse(v, &o->cfg.schedule));
}
static int parse_family(const char *cmd, const char *flag, const char *v, void *field)
{
    return lib(cmd, flag, fm_family_parse(v, field));
}
static int parse_cutlass(const char *cmd, const char *flag, const char *v, void *field)
{
    return lib(cmd, flag, fm_cutlass_version_parse(v, field));
}
static int parse_cluster(const char *cmd, const char *flag, const char *v, void *field)
{
    fm_kernel_config *c = field;
    if (cluster_parse(v, &c->cluster_m, &c->cluster_n)) return FM_FLAGS_GO;
    fprintf(stderr, "fp4moe %s: %s expects MxN with M, N in [1, 16] (e.g. 2x1), got '%s'\n", cmd, flag, v);
    return FM_EXIT_USAGE;
}
static int parse_stages(const char *cmd, const char *flag, const char *v, void *field) /* auto = 0 */
{
    long st = 0;
    if (strcmp(v, "auto") && !fm_cli_int(cmd, flag, v, 1, 32, &st)) return FM_EXIT_USAGE;
    *(int *)field = (int)st;
    return FM_FLAGS_GO;
}

static const fm_flag_choice k_kernels[] = {{"grouped", 0}, {"plain", 1}, {NULL, 0}};

#define O(f) offsetof(explain_opts, f)
static const fm_flag k_explain_flags[] = {
    {"arch", "A", FM_FLAG_STRING, O(arch), .help = "sm_90 | sm_100 | sm_120 | sm_121 ... (or --gpu NAME)"},
    {"family", "F", FM_FLAG_CUSTOM, O(cfg.family), .parse = parse_family,
     .help = "auto (CUTLASS of the arch) | cutlass-sm90 | cutlass-sm100 | cutlass-sm120 |\n"
             "fp4moe-mma (fp4moe's small-M kernel: tile = tokens-per-pass x features x K) |\n"
             "fp4moe-wgmma (the same tile on warpgroup MMAs, sm_90 only)"},
    {"warps", "W", FM_FLAG_INT, O(cfg.warps), 1, 12, /* the family says which */
     .help = "fp4moe kernels only: warps per CTA (fp4moe-mma 1..8, default 4;\n"
             "fp4moe-wgmma 4, 8 or 12 consumer warps, default 8)"},
    {"persistent", NULL, FM_FLAG_SWITCH, O(cfg.persistent),
     .help = "fp4moe-wgmma: the persistent kernel (one CTA per SM over the tiles, its\n"
             "output tile in a buffer of its own: counted as epilogue D)"},
    {"gpu", "NAME", FM_FLAG_STRING, O(gpu),
     .help = "a named GPU (fp4moe plan --help lists them); sets --arch (with --arch too,\n"
             "both must name the same architecture) and the SM count for waves"},
    {"tile", "MxNxK", FM_FLAG_STRING, O(tile), .help = "CTA tile"},
    {"format", "F", FM_FLAG_CUSTOM, O(cfg), .parse = parse_format,
     .help = "nvfp4 | mxfp4 | bf16 | fp8 (sets --a and --b; default nvfp4)"},
    {"a", "T", FM_FLAG_CUSTOM, O(cfg.a), .parse = parse_elem, .shown = "--a T --b T",
     .help = "operand types separately (fp8 x mxfp4 on sm_120)"},
    {"b", "T", FM_FLAG_CUSTOM, O(cfg.b), .parse = parse_elem, .help = NULL},
    {"c", "T", FM_FLAG_CUSTOM, O(cfg.c), .parse = parse_elem, .shown = "--c T --d T",
     .help = "epilogue source/destination: bf16 fp16 fp32 void (default bf16)"},
    {"d", "T", FM_FLAG_CUSTOM, O(cfg.d), .parse = parse_elem, .help = NULL},
    {"epilogue", "E", FM_FLAG_CUSTOM, O(cfg.epilogue), .parse = parse_epilogue,
     .help = "tma (default; TensorRT-LLM default, C reused for D) | nosmem | finalize"},
    {"epilogue-tile", "MxN", FM_FLAG_CUSTOM, O(cfg), .parse = parse_epi_tile,
     .help = "the epilogue builder's tile (EpilogueTileType Shape<_M,_N>, as SGLang's\n"
             "and vLLM's SM100 kernels pass 128x64) or auto (default: EpilogueTileAuto)"},
    {"swap-ab", NULL, FM_FLAG_SWITCH, O(cfg.swap_ab),
     .help = "TensorRT-LLM swap-AB variant (FINALIZE bytes change)\n"
             "(--swap-ab, --schedule, --cutlass, --epilogue, --epilogue-tile, --c, --d: CUTLASS\n"
             "families only;\n"
             "given with an fp4moe family they are an error, exit 2)"},
    {"schedule", "S", FM_FLAG_CUSTOM, 0, .parse = parse_schedule,
     .help = "auto | coop | pingpong (sm_90/sm_120) | 1sm | 2sm (sm_100)"},
    {"cluster", "MxN", FM_FLAG_CUSTOM, O(cfg), .parse = parse_cluster, .help = "cluster shape (default 1x1)"},
    {"stages", "N", FM_FLAG_CUSTOM, O(cfg.stages), .parse = parse_stages, .help = "pipeline stages, or auto (default)"},
    {"cutlass", "V", FM_FLAG_CUSTOM, O(cfg.cutlass), .parse = parse_cutlass,
     .help = "CUTLASS version of the kernel: 4.2, 4.4, 4.5, 4.7 (default: the newest measured)"},
    {"kernel", "K", FM_FLAG_CHOICE, O(cfg.plain), .choices = k_kernels,
     .help = "grouped (ptr-array, default: what MoE engines run) | plain (one GEMM)"},
    {"k", "K", FM_FLAG_INT, O(k), 1, 1 << 30, .help = "problem K (must be a multiple of the tile's K)"},
    {"w4a8", NULL, FM_FLAG_SWITCH, O(w4a8),
     .help = "the W4A8 GEMM's staged kernels (src/cuda/gemm_fp8.cu) instead of a tile: each\n"
             "one's shared memory, byte by byte, against the arch's opt-in limit\n"
             "(--format nvfp4 | mxfp4; with --arch or --gpu, --json; no other flag)"},
    {"json", NULL, FM_FLAG_SWITCH, O(json), .help = "machine-readable output"},
    {"help", NULL, FM_FLAG_HELP, O(help), .help = NULL},
};
#undef O

static const fm_flag_cmd k_explain_cmd = {
    .cmd = "explain",
    .flags = k_explain_flags,
    .n_flags = sizeof k_explain_flags / sizeof k_explain_flags[0],
    .head = {"usage: fp4moe explain --arch sm120 --tile 128x256x128 [flags]\n"},
    .tail = {"exit: 0 fits, 5 rejected, 2 usage (a bad flag value, or flags that describe no valid kernel),\n"
             "      1 failure\n"},
    .col = 15,
    .short_help = 1,
    .strict = 1,
    .unknown = {"unknown flag ", " (see --help)"},
    .missing = {"", " needs a value (or unknown flag)"},
};

/* The flag only the CUTLASS families read that was given last (NULL: none), to refuse it
 * with an fp4moe family instead of ignoring it. */
static const char *cutlass_only(const explain_opts *o, const fm_flags_result *r)
{
    static const char *const k_only[] = {"swap-ab", "epilogue", "epilogue-tile", "c", "d", "cutlass", "schedule"};
    static char              name[32];
    int                      at = 0;
    for (size_t i = 0; i < sizeof k_only / sizeof k_only[0]; i++) {
        int k = fm_flags_index(&k_explain_cmd, k_only[i]);
        if (r->seen[k] > at && (strcmp(k_only[i], "schedule") || o->sched_set)) {
            at = r->seen[k];
            snprintf(name, sizeof name, "--%s", k_only[i]);
        }
    }
    return at ? name : NULL;
}

/* Whether the arch's mma.sync runs E4M3 natively: sm_89 and sm_120 / sm_121 issue QMMA; sm_90 to
 * sm_11x have no FP8 mma.sync (ptxas lowers it to F2FP conversions, FP16 HMMAs and FADDs: seen in
 * the SASS, ctest sass_fp8_mma), their FP8 rate being wgmma's (sm_90) or tcgen05's (sm_100) */
static int fp8_mma_native(int cc) { return cc == 89 || cc >= 120; }
static const char *fp8_mma_sync(int cc) { return cc < 89 ? "none" : fp8_mma_native(cc) ? "native" : "lowered"; }
#define FM_LOWERED                                                                                                     \
    "lowered by ptxas to FP16 HMMAs with conversions: the staged and pipelined kernels run at the FP16 rate at "      \
    "best, below W4A16; "

/* explain --w4a8: the rows' common output (text or JSON) and the verdict */
typedef struct {
    int    json;
    cJSON *ks;    /* the JSON "kernels" array */
    size_t limit; /* the device's opt-in shared memory per block */
    int   *all;   /* every applying kernel fits */
} w4a8_rows;

/* One kernel's row: `applies` 0 = the kernel does not run on this target / format (outside the
 * verdict; `na` says why, and JSON carries "applies"); na NULL = a kernel every FP8 target runs
 * (no "applies" field; where there is no FP8 MMA, applies = 0 and it reads REJECTED). */
static void w4a8_row(const w4a8_rows *t, const char *family, int tok, int st, size_t rows, size_t codes,
                     size_t scales, size_t stage, size_t total, int applies, const char *na)
{
    char name[24];
    snprintf(name, sizeof name, "%s%d", family, tok);
    const int fits = applies && total <= t->limit;
    if (applies || !na) *t->all &= fits;
    if (t->json) {
        cJSON *k = cJSON_CreateObject();
        cJSON_AddStringToObject(k, "kernel", name);
        cJSON_AddNumberToObject(k, "tokens", tok);
        cJSON_AddNumberToObject(k, "stages", st);
        cJSON_AddNumberToObject(k, "rows_bytes", (double)rows);
        cJSON_AddNumberToObject(k, "codes_bytes", (double)codes);
        cJSON_AddNumberToObject(k, "scales_bytes", (double)scales);
        cJSON_AddNumberToObject(k, "stage_bytes", (double)stage);
        cJSON_AddNumberToObject(k, "total_bytes", (double)total);
        if (na) cJSON_AddBoolToObject(k, "applies", applies);
        cJSON_AddBoolToObject(k, "fits", fits);
        cJSON_AddItemToArray(t->ks, k);
    } else {
        printf("  %-9s %6d %6d %8zu %8zu %8zu %8zu %9zu %9zu  %s\n", name, tok, st, rows, codes, scales, stage, total,
               t->limit, !applies && na ? na : fits ? "FITS" : "REJECTED");
    }
}

/* `explain --w4a8`: the W4A8 GEMM's staged kernels (fm_tile_layout.h FM_FP8S_LIST, the list
 * the launcher instantiates), each stage's parts and the total the launcher asks for, against
 * the arch's opt-in limit. The pipelined kernels use no shared memory. Needs FP8 MMA (sm_89+). */
static int explain_w4a8(const fm_arch_info *arch, fm_elem w, int json)
{
    const int nv = w == FM_ELEM_NVFP4;
    if (w != FM_ELEM_NVFP4 && w != FM_ELEM_MXFP4) {
        fprintf(stderr, "fp4moe explain --w4a8: the W4A8 GEMM takes nvfp4 or mxfp4 weights, not %s\n", fm_elem_name(w));
        return FM_EXIT_USAGE;
    }
    const size_t limit = arch->smem_block_optin;
    const int    fp8 = arch->cc >= 89;
    int          all = fp8;
    cJSON       *o = json ? cJSON_CreateObject() : NULL, *ks = json ? cJSON_AddArrayToObject(o, "kernels") : NULL;
    if (json) {
        cJSON_AddStringToObject(o, "arch", arch->name);
        cJSON_AddStringToObject(o, "weights", fm_elem_name(w));
        cJSON_AddBoolToObject(o, "fp8_mma", fp8);
        cJSON_AddStringToObject(o, "fp8_mma_sync", fp8_mma_sync(arch->cc));
        cJSON_AddNumberToObject(o, "limit_bytes", (double)limit);
    } else {
        printf("%s W4A8 GEMM, %s weights x E4M3 rows: the staged kernels (%d warps x %d bands = %d features a CTA, "
               "%d of K a stage); the launcher sizes shared memory with the same macros\n",
               arch->name, fm_elem_name(w), FM_FP8S_WARPS, FM_FP8S_BANDS, FM_FP8S_WARPS * FM_FP8S_BANDS * 16, FM_FP8S_KC);
        printf("  %-9s %6s %6s %8s %8s %8s %8s %9s %9s  %s\n", "kernel", "tokens", "stages", "rows B", "codes B",
               "scales B", "stage B", "total B", "limit B", "verdict");
    }
    const w4a8_rows t = {json, ks, limit, &all};
#define FM_FP8S_ROW(tok, nt, st)                                                                                      \
    {                                                                                                                 \
        const size_t rows = (size_t)FM_FP8S_W_OFF(nt), codes = (size_t)FM_FP8S_S_OFF(FM_FP8S_WARPS, FM_FP8S_BANDS, nt) - rows; \
        const size_t stage = (size_t)FM_FP8S_STAGE_BYTES(FM_FP8S_WARPS, FM_FP8S_BANDS, nt, nv);                        \
        w4a8_row(&t, "staged", tok, st, rows, codes, stage - rows - codes, stage,                                     \
                 (size_t)FM_FP8S_SMEM(FM_FP8S_WARPS, FM_FP8S_BANDS, nt, st, nv), fp8, NULL);                           \
    }
    FM_FP8S_LIST(FM_FP8S_ROW)
#undef FM_FP8S_ROW
    /* the wgmma kernels (FM_FP8W_LIST): opt-in, sm_90a and MXFP4 only; elsewhere listed as not
     * applying, outside the verdict (the staged kernels are what every FP8 target runs) */
    const int wg_applies = arch->cc == 90 && !nv;
    const char *wg_na = arch->cc != 90 ? "n/a (sm_90a only)" : "n/a (MXFP4 only)";
#define FM_FP8W_ROW(tok, mt, st)                                                                                      \
    {                                                                                                                 \
        const size_t rows = (size_t)FM_FP8W_W_OFF(tok), codes = (size_t)FM_FP8W_S_OFF(mt, tok) - rows;                \
        w4a8_row(&t, "wg", tok, st, rows, codes, (size_t)4 * (mt) * FM_FP8S_SF_BYTES(0),                              \
                 (size_t)FM_FP8W_STAGE_BYTES(mt, tok), (size_t)FM_FP8W_SMEM(mt, tok, st), wg_applies, wg_na);         \
    }
    FM_FP8W_LIST(FM_FP8W_ROW)
#undef FM_FP8W_ROW
    /* the warp-specialized wgmma kernels (FM_FP8WS_LIST): the same rule as the wg kernels */
#define FM_FP8WS_ROW(tok, cw, st)                                                                                     \
    {                                                                                                                 \
        const size_t rows = (size_t)FM_FP8WS_A_OFF(tok), codes = (size_t)FM_FP8WS_S_OFF(cw, tok) - rows;              \
        w4a8_row(&t, "ws", tok, st, rows, codes, (size_t)FM_FP8WS_F_OFF(cw, tok) + 16 - (size_t)FM_FP8WS_S_OFF(cw, tok), \
                 (size_t)FM_FP8WS_STAGE_BYTES(cw, tok), (size_t)FM_FP8WS_SMEM(cw, tok, st), wg_applies, wg_na);       \
    }
    FM_FP8WS_LIST(FM_FP8WS_ROW)
#undef FM_FP8WS_ROW
    const char *why = !fp8 ? "no FP8 MMA before sm_89: the layer runs W4A16 there (the launcher refuses)"
                      : all ? "every staged kernel fits; the pipelined kernels (pipe16, pipe32, first) use no shared memory"
                            : "a staged kernel is past the opt-in limit: its launch is refused (cudaErrorInvalidConfiguration)";
    if (json) {
        cJSON_AddBoolToObject(o, "fits", all);
        cJSON_AddStringToObject(o, "reason", why);
        fm_cli_print_json(o);
    } else {
        printf("  rows B = tokens x (128 + 16) E4M3 row tile; codes B = %d bands x 2 chunks x 512; scales B = %d bands x "
               "16 rows x %d codes\n", FM_FP8S_WARPS * FM_FP8S_BANDS, FM_FP8S_WARPS * FM_FP8S_BANDS, nv ? 8 : 4);
        printf("  wg*: one warpgroup on wgmma (sm_90a, MXFP4; auto's pick there): rows B = tokens x 128 swizzled, "
               "codes B = 4 x m64 tiles x 2 x 512, a stage rounded up to 1 KB\n");
        printf("  ws*: a producer warpgroup decoding into shared memory + 2 consumer warpgroups on SS wgmma (opt-in, "
               "sm_90a, MXFP4): codes B = decoded 128 x 128 E4M3 + 8 bands x 2 x 512 packed; scales B = group, "
               "activation scales and flag; + 16 B of mbarriers a stage\n");
        if (fp8)
            printf("  FP8 mma.sync on %s: %s\n", arch->name,
                   fp8_mma_native(arch->cc) ? "native (QMMA): the staged and pipelined kernels run at the FP8 tensor rate"
                   : arch->cc == 90 ? FM_LOWERED "the FP8 rate is the wg* kernels' (wgmma)"
                                    : FM_LOWERED "this arch's FP8 rate is tcgen05's, which fp4moe does not use yet");
        printf("verdict: %s\n%s\n", all ? "FITS" : "REJECTED", why);
    }
    return all ? FM_EXIT_OK : FM_EXIT_REJECTED;
}

int fm_cmd_explain(int argc, char **argv)
{
    explain_opts fl = {0};
    fm_kernel_config_init(&fl.cfg);
    fl.cfg.a = fl.cfg.b = FM_ELEM_NVFP4;
    fl.cfg.cutlass = FM_CUTLASS_NEWEST;
    fm_flags_result fr;
    int             rc0 = fm_flags_parse(&k_explain_cmd, argc, argv, &fl, &fr);
    if (rc0 != FM_FLAGS_GO) return rc0;
    fm_kernel_config cfg = fl.cfg;
    const char      *arch_s = fl.arch, *gpu_s = fl.gpu, *tile_s = fl.tile;
    const int        json = fl.json;
    const long       k = fl.k;
    /* flags that only one kind of family reads, as given (NULL = not given): each
     * is rejected for the other kind instead of silently ignored */
    const char *warps_s = fr.seen[fm_flags_index(&k_explain_cmd, "warps")] ? "--warps" : NULL;
    const char *cutlass_s = cutlass_only(&fl, &fr);
    fm_status   st = FM_OK;
    if (fl.w4a8) /* the W4A8 kernels: --arch / --gpu, --format, --json only */
        for (int i = 0; i < (int)(sizeof k_explain_flags / sizeof k_explain_flags[0]); i++) {
            const char *n = k_explain_flags[i].name;
            if (fr.seen[i] && strcmp(n, "w4a8") && strcmp(n, "arch") && strcmp(n, "gpu") && strcmp(n, "format") &&
                strcmp(n, "json")) {
                fprintf(stderr, "fp4moe explain: --w4a8 takes --arch or --gpu, --format and --json only, not --%s\n", n);
                return FM_EXIT_USAGE;
            }
        }
    if ((!arch_s && !gpu_s) || (!tile_s && !fl.w4a8)) {
        fprintf(stderr, fl.w4a8 ? "fp4moe explain --w4a8: --arch (or --gpu) is required\n"
                                : "fp4moe explain: --arch (or --gpu) and --tile are required\n");
        fm_flags_usage(&k_explain_cmd, stderr);
        return FM_EXIT_USAGE;
    }
    const fm_arch_info *arch = NULL;
    const fm_gpu_info *gpu = NULL;
    if (gpu_s) {
        if ((st = fm_gpu_find(gpu_s, &gpu)) != FM_OK) return fm_cli_usage_status("explain", "--gpu", st);
        cfg.cc = gpu->cc;
    }
    if (arch_s) {
        if ((st = fm_arch_find(arch_s, &arch)) != FM_OK) return fm_cli_usage_status("explain", "--arch", st);
        if (gpu && gpu->cc != arch->cc) { /* not silently one for the bytes, the other for the waves */
            fprintf(stderr, "fp4moe explain: --arch %s and --gpu %s (sm_%d) name different architectures: give one, "
                            "or both for the same one\n", arch_s, gpu->name, gpu->cc);
            return FM_EXIT_USAGE;
        }
        cfg.cc = arch->cc;
    }
    if ((st = fm_arch_get(cfg.cc, &arch)) != FM_OK) return fm_cli_usage_status("explain", "--arch", st);
    if (fl.w4a8) return explain_w4a8(arch, cfg.a, json);
    if ((st = fm_tile_shape_parse(tile_s, &cfg.tile_m, &cfg.tile_n, &cfg.tile_k)) != FM_OK)
        return fm_cli_usage_status("explain", "--tile", st);
    if (cfg.epilogue == FM_EPI_FINALIZE) cfg.d = FM_ELEM_VOID;
    fm_plan_result r;
    fm_kernel_config rc; /* what was checked, AUTO fields resolved by the library */
    fm_kernel_config fam_cfg = cfg; /* the family, whatever the epilogue tile (refused below by flag name) */
    fam_cfg.epi_tile_m = fam_cfg.epi_tile_n = 0;
    if (fm_plan_resolve(&fam_cfg, &rc) == FM_OK) { /* else the check below says why */
        int own = rc.family == FM_FAMILY_FP4MOE_MMA || rc.family == FM_FAMILY_FP4MOE_WGMMA;
        if (!own && warps_s) {
            fprintf(stderr, "fp4moe explain: --warps applies to the fp4moe kernel families only (--family "
                            "fp4moe-mma or fp4moe-wgmma), not to %s\n", fm_family_name(rc.family));
            return FM_EXIT_USAGE;
        }
        if (own && cutlass_s) {
            fprintf(stderr, "fp4moe explain: %s applies to the CUTLASS families only, not to %s (its epilogue "
                            "writes BF16 straight to global memory; it has no schedule, swap-AB variant or CUTLASS "
                            "version)\n", cutlass_s, fm_family_name(rc.family));
            return FM_EXIT_USAGE;
        }
    }
    fm_clear_error();
    if ((st = fm_plan_check(&cfg, 0, 0, k, 0, gpu ? gpu->sms : 0, &r)) != FM_OK ||
        (st = fm_plan_resolve(&cfg, &rc)) != FM_OK)
        return fm_cli_usage_status("explain", "the flags describe no valid kernel", st);
    const fm_smem_breakdown *b = &r.bytes;
    int mma = rc.family == FM_FAMILY_FP4MOE_MMA || rc.family == FM_FAMILY_FP4MOE_WGMMA; /* fp4moe's own */
    int wgmma = rc.family == FM_FAMILY_FP4MOE_WGMMA;
    fm_kernel_family fam = rc.family;
    fm_schedule sched = rc.schedule;
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "arch", arch->name);
        cJSON_AddStringToObject(o, "family", fm_family_name(fam));
        if (mma) cJSON_AddNumberToObject(o, "warps", rc.warps); /* resolved: the family's default if not given */
        if (wgmma) cJSON_AddBoolToObject(o, "persistent", rc.persistent);
        cJSON_AddStringToObject(o, "a", fm_elem_name(cfg.a));
        cJSON_AddStringToObject(o, "b", fm_elem_name(cfg.b));
        cJSON_AddStringToObject(o, "epilogue", fm_epilogue_name(cfg.epilogue));
        char tile[48];
        snprintf(tile, sizeof tile, "%dx%dx%d", cfg.tile_m, cfg.tile_n, cfg.tile_k);
        cJSON_AddStringToObject(o, "tile", tile);
        if (!mma) {
            char et[32] = "auto";
            if (cfg.epi_tile_m) snprintf(et, sizeof et, "%dx%d", cfg.epi_tile_m, cfg.epi_tile_n);
            cJSON_AddStringToObject(o, "epilogue_tile", et);
        }
        cJSON_AddBoolToObject(o, "fits", r.fits);
        cJSON_AddNumberToObject(o, "total_bytes", (double)b->total);
        cJSON_AddNumberToObject(o, "limit_bytes", (double)r.limit_bytes);
        cJSON_AddNumberToObject(o, "stages", b->stages);
        cJSON_AddNumberToObject(o, "mainloop_bytes", (double)b->mainloop);
        cJSON_AddNumberToObject(o, "epilogue_bytes", (double)b->epilogue);
        cJSON_AddNumberToObject(o, "a_bytes", (double)b->a);
        cJSON_AddNumberToObject(o, "b_bytes", (double)b->b);
        cJSON_AddNumberToObject(o, "sf_bytes", (double)b->sf);
        cJSON_AddNumberToObject(o, "barrier_bytes", (double)b->barriers);
        cJSON_AddNumberToObject(o, "epi_c_bytes", (double)b->epi_c);
        cJSON_AddNumberToObject(o, "epi_d_bytes", (double)b->epi_d);
        cJSON_AddNumberToObject(o, "epi_other_bytes", (double)b->epi_other);
        cJSON_AddNumberToObject(o, "tensormap_bytes", (double)b->tensormaps);
        cJSON_AddNumberToObject(o, "scheduler_bytes", (double)b->scheduler);
        cJSON_AddNumberToObject(o, "padding_bytes", (double)b->padding);
        cJSON_AddNumberToObject(o, "auto_stages", r.auto_stages);
        cJSON_AddNumberToObject(o, "builder_bytes", (double)r.builder_bytes);
        cJSON_AddBoolToObject(o, "builder_fits", r.builder_fits);
        cJSON_AddNumberToObject(o, "best_stages", r.best_stages);
        cJSON_AddNumberToObject(o, "best_bytes", (double)r.best_bytes);
        cJSON_AddStringToObject(o, "reason", r.reason);
        fm_cli_print_json(o);
    } else {
        if (mma)
            printf("%s %s%s, %s weights, %d tokens a pass x %d features x K %d, %d warps, %d stages (%s); "
                   "the launcher sizes shared memory with the same function\n",
                   arch->name, fm_family_name(fam), rc.persistent ? " (persistent)" : "", fm_elem_name(cfg.a),
                   cfg.tile_m, cfg.tile_n, cfg.tile_k, rc.warps, b->stages, cfg.stages ? "fixed" : "compiled");
        else {
            char et[48] = "";
            if (cfg.epi_tile_m) snprintf(et, sizeof et, " (tile %dx%d given)", cfg.epi_tile_m, cfg.epi_tile_n);
            printf("%s %s %s x %s tile %dx%dx%d, %s schedule, epilogue %s%s%s, %d stages (%s), CUTLASS %d.%d model\n",
                   arch->name, fm_family_name(fam), fm_elem_name(cfg.a), fm_elem_name(cfg.b), cfg.tile_m, cfg.tile_n,
                   cfg.tile_k, fm_schedule_name(sched), fm_epilogue_name(cfg.epilogue), et,
                   cfg.swap_ab ? " (swap-AB)" : "", b->stages, cfg.stages ? "fixed" : "auto", cfg.cutlass / 100,
                   cfg.cutlass / 10 % 10);
        }
        printf("  %-34s %9s\n", "part", "bytes");
        printf("  %-34s %9zu\n", mma ? "FP4 weight tiles (all stages)" : "A tiles (all stages)", b->a);
        printf("  %-34s %9zu\n",
               wgmma ? "X (token) tiles, BF16 core matrices" : mma ? "X (token) tiles, BF16" : "B tiles", b->b);
        printf("  %-34s %9zu\n", "scale-factor tiles (SFA + SFB)", b->sf);
        printf("  %-34s %9zu\n", "pipeline barriers", b->barriers);
        printf("  %-34s %9zu\n", "epilogue C buffers", b->epi_c);
        printf("  %-34s %9zu\n", "epilogue D buffers", b->epi_d);
        printf("  %-34s %9zu\n", "broadcast storage (router/bias)", b->epi_other);
        printf("  %-34s %9zu\n", "tensor maps", b->tensormaps);
        printf("  %-34s %9zu\n", "scheduler pipeline + responses", b->scheduler);
        printf("  %-34s %9zu\n", "alignment padding", b->padding);
        printf("  %-34s %9zu   (limit %zu B opt-in)\n", "TOTAL sizeof(SharedStorage)", b->total, r.limit_bytes);
        if (wgmma)
            printf("  (all dynamic, from fm_smem_wgmma - the launcher's own function; X in the 128-byte-swizzled\n"
                   "   core-matrix layout, each stage on a 1 KB boundary (the padding), two mbarriers per stage%s)\n",
                   rc.persistent ? ";\n   epilogue D = the persistent kernel's output tile, tokens x (2 x features + 16) B" : "");
        else if (mma)
            printf("  (all dynamic, from fm_smem_mma - the launcher's own function; padding = 16 B per X row)\n");
        else
            printf("  collective sizes as CUTLASS reports them: mainloop %zu B, epilogue %zu B\n", b->mainloop,
                   b->epilogue);
        if (!cfg.stages && !mma)
            printf("  the builder's arithmetic: %d stages, %zu B (%s)\n", r.auto_stages, r.builder_bytes,
                   r.builder_fits ? "it believes the tile fits" : "it finds no room");
        printf("verdict: %s\n", r.fits ? "FITS" : "REJECTED");
        printf("%s\n", r.reason);
        if (!r.fits && r.best_stages && !mma)
            printf("fix: pass --stages %d (StageCount<%d> instead of StageCountAutoCarveout) -> %zu B\n",
                   r.best_stages, r.best_stages, r.best_bytes);
    }
    return r.fits ? FM_EXIT_OK : FM_EXIT_REJECTED;
}
