/* cmd_explain.c - `fp4moe explain`: byte-by-byte shared memory of one tile, the
 * verdict (cuBLASLt-style check) and the fix, as text or --json.
 * Every flag that changes the bytes is a flag here (see --help). */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "plan/plan_internal.h" /* fm_plan_resolve: the family and schedule it checked */

static void help(FILE *f)
{
    fprintf(f,
            "usage: fp4moe explain --arch sm120 --tile 128x256x128 [flags]\n"
            "  --arch A        sm_90 | sm_100 | sm_120 | sm_121 ... (or --gpu NAME)\n"
            "  --family F      auto (CUTLASS of the arch) | cutlass-sm90 | cutlass-sm100 | cutlass-sm120 |\n"
            "                  fp4moe-swapab (fp4moe's small-M kernel: tile = tokens-per-pass x features x K) |\n"
            "                  fp4moe-wgmma (the same tile on warpgroup MMAs, sm_90 only)\n"
            "  --warps W       fp4moe kernels only: warps per CTA (fp4moe-swapab 1..8, default 4;\n"
            "                  fp4moe-wgmma 4, 8 or 12 consumer warps, default 8)\n"
            "  --persistent    fp4moe-wgmma: the persistent kernel (one CTA per SM over the tiles, its\n"
            "                  output tile in a buffer of its own: counted as epilogue D)\n"
            "  --gpu NAME      a named GPU (fp4moe plan --help lists them); sets --arch (with --arch too,\n"
            "                  both must name the same architecture) and the SM count for waves\n"
            "  --tile MxNxK    CTA tile\n"
            "  --format F      nvfp4 | mxfp4 | bf16 | fp8 (sets --a and --b; default nvfp4)\n"
            "  --a T --b T     operand types separately (fp8 x mxfp4 on sm_120)\n"
            "  --c T --d T     epilogue source/destination: bf16 fp16 fp32 void (default bf16)\n"
            "  --epilogue E    tma (default; TensorRT-LLM default, C reused for D) | nosmem | finalize\n"
            "  --epilogue-tile MxN  the epilogue builder's tile (EpilogueTileType Shape<_M,_N>, as SGLang's\n"
            "                  and vLLM's SM100 kernels pass 128x64) or auto (default: EpilogueTileAuto)\n"
            "  --swap-ab       TensorRT-LLM swap-AB variant (FINALIZE bytes change)\n"
            "                  (--swap-ab, --schedule, --cutlass, --epilogue, --epilogue-tile, --c, --d: CUTLASS\n"
            "                  families only;\n"
            "                  given with an fp4moe family they are an error, exit 2)\n"
            "  --schedule S    auto | coop | pingpong (sm_90/sm_120) | 1sm | 2sm (sm_100)\n"
            "  --cluster MxN   cluster shape (default 1x1)\n"
            "  --stages N      pipeline stages, or auto (default)\n"
            "  --cutlass V     CUTLASS version of the kernel: 4.2, 4.4, 4.5, 4.7 (default: the newest measured)\n"
            "  --kernel K      grouped (ptr-array, default: what MoE engines run) | plain (one GEMM)\n"
            "  --k K           problem K (must be a multiple of the tile's K)\n"
            "  --json          machine-readable output\n"
            "exit: 0 fits, 5 rejected, 2 usage (a bad flag value, or flags that describe no valid kernel),\n"
            "      1 failure\n");
}

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

int fm_cmd_explain(int argc, char **argv)
{
    fm_kernel_config cfg;
    fm_kernel_config_init(&cfg);
    cfg.a = cfg.b = FM_ELEM_NVFP4;
    cfg.cutlass = FM_CUTLASS_NEWEST;
    const char *arch_s = NULL, *gpu_s = NULL, *tile_s = NULL;
    int json = 0;
    long k = 0;
    /* flags that only one kind of family reads, as given (NULL = not given): each
     * is rejected for the other kind instead of silently ignored */
    const char *warps_s = NULL, *cutlass_only = NULL;
    fm_status st = FM_OK;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            help(stdout);
            return FM_EXIT_OK;
        } else if (!strcmp(f, "--json")) json = 1;
        else if (!strcmp(f, "--swap-ab")) cfg.swap_ab = 1, cutlass_only = f;
        else if (!strcmp(f, "--persistent")) cfg.persistent = 1;
        else if (!v) {
            fprintf(stderr, "fp4moe explain: %s needs a value (or unknown flag)\n", f);
            return FM_EXIT_USAGE;
        } else {
            i++;
            if (!strcmp(f, "--epilogue") || !strcmp(f, "--epilogue-tile") || !strcmp(f, "--c") || !strcmp(f, "--d") ||
                !strcmp(f, "--cutlass") || (!strcmp(f, "--schedule") && strcmp(v, "auto")))
                cutlass_only = f;
            if (!strcmp(f, "--warps")) warps_s = f;
            if (!strcmp(f, "--arch")) arch_s = v;
            else if (!strcmp(f, "--gpu")) gpu_s = v;
            else if (!strcmp(f, "--tile")) tile_s = v;
            else if (!strcmp(f, "--format")) {
                if ((st = fm_elem_parse(v, &cfg.a)) == FM_OK) cfg.b = cfg.a;
            } else if (!strcmp(f, "--a")) st = fm_elem_parse(v, &cfg.a);
            else if (!strcmp(f, "--b")) st = fm_elem_parse(v, &cfg.b);
            else if (!strcmp(f, "--c")) st = fm_elem_parse(v, &cfg.c);
            else if (!strcmp(f, "--d")) st = fm_elem_parse(v, &cfg.d);
            else if (!strcmp(f, "--epilogue")) st = fm_epilogue_parse(v, &cfg.epilogue);
            else if (!strcmp(f, "--epilogue-tile")) st = fm_epi_tile_parse(v, &cfg.epi_tile_m, &cfg.epi_tile_n);
            else if (!strcmp(f, "--schedule")) st = fm_schedule_parse(v, &cfg.schedule);
            else if (!strcmp(f, "--family")) st = fm_family_parse(v, &cfg.family);
            else if (!strcmp(f, "--warps")) {
                long w = 0;
                if (!fm_cli_int("explain", "--warps", v, 1, 12, &w)) return FM_EXIT_USAGE; /* the family says which */
                cfg.warps = (int)w;
            }
            else if (!strcmp(f, "--cutlass")) st = fm_cutlass_version_parse(v, &cfg.cutlass);
            else if (!strcmp(f, "--kernel")) {
                if (!strcmp(v, "grouped")) cfg.plain = 0;
                else if (!strcmp(v, "plain")) cfg.plain = 1;
                else {
                    fprintf(stderr, "fp4moe explain: --kernel expects grouped or plain, got '%s'\n", v);
                    return FM_EXIT_USAGE;
                }
            }
            else if (!strcmp(f, "--cluster")) {
                if (!cluster_parse(v, &cfg.cluster_m, &cfg.cluster_n)) {
                    fprintf(stderr, "fp4moe explain: --cluster expects MxN with M, N in [1, 16] (e.g. 2x1), got '%s'\n",
                            v);
                    return FM_EXIT_USAGE;
                }
            } else if (!strcmp(f, "--stages")) {
                long s = 0;
                if (strcmp(v, "auto") && !fm_cli_int("explain", "--stages", v, 1, 32, &s)) return FM_EXIT_USAGE;
                cfg.stages = (int)s;
            } else if (!strcmp(f, "--k")) {
                if (!fm_cli_int("explain", "--k", v, 1, 1L << 30, &k)) return FM_EXIT_USAGE;
            } else {
                fprintf(stderr, "fp4moe explain: unknown flag %s (see --help)\n", f);
                return FM_EXIT_USAGE;
            }
            if (st != FM_OK) return fm_cli_usage_status("explain", f, st);
        }
    }
    if ((!arch_s && !gpu_s) || !tile_s) {
        fprintf(stderr, "fp4moe explain: --arch (or --gpu) and --tile are required\n");
        help(stderr);
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
    if ((st = fm_tile_shape_parse(tile_s, &cfg.tile_m, &cfg.tile_n, &cfg.tile_k)) != FM_OK)
        return fm_cli_usage_status("explain", "--tile", st);
    if (cfg.epilogue == FM_EPI_FINALIZE) cfg.d = FM_ELEM_VOID;
    fm_plan_result r;
    fm_kernel_config rc; /* what was checked, AUTO fields resolved by the library */
    fm_kernel_config fam_cfg = cfg; /* the family, whatever the epilogue tile (refused below by flag name) */
    fam_cfg.epi_tile_m = fam_cfg.epi_tile_n = 0;
    if (fm_plan_resolve(&fam_cfg, &rc) == FM_OK) { /* else the check below says why */
        int own = rc.family == FM_FAMILY_FP4MOE_SWAPAB || rc.family == FM_FAMILY_FP4MOE_WGMMA;
        if (!own && warps_s) {
            fprintf(stderr, "fp4moe explain: --warps applies to the fp4moe kernel families only (--family "
                            "fp4moe-swapab or fp4moe-wgmma), not to %s\n", fm_family_name(rc.family));
            return FM_EXIT_USAGE;
        }
        if (own && cutlass_only) {
            fprintf(stderr, "fp4moe explain: %s applies to the CUTLASS families only, not to %s (its epilogue "
                            "writes BF16 straight to global memory; it has no schedule, swap-AB variant or CUTLASS "
                            "version)\n", cutlass_only, fm_family_name(rc.family));
            return FM_EXIT_USAGE;
        }
    }
    fm_clear_error();
    if ((st = fm_plan_check(&cfg, 0, 0, k, 0, gpu ? gpu->sms : 0, &r)) != FM_OK ||
        (st = fm_plan_resolve(&cfg, &rc)) != FM_OK)
        return fm_cli_usage_status("explain", "the flags describe no valid kernel", st);
    const fm_smem_breakdown *b = &r.bytes;
    int swapab = rc.family == FM_FAMILY_FP4MOE_SWAPAB || rc.family == FM_FAMILY_FP4MOE_WGMMA; /* fp4moe's own */
    int wgmma = rc.family == FM_FAMILY_FP4MOE_WGMMA;
    fm_kernel_family fam = rc.family;
    fm_schedule sched = rc.schedule;
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "arch", arch->name);
        cJSON_AddStringToObject(o, "family", fm_family_name(fam));
        if (swapab) cJSON_AddNumberToObject(o, "warps", rc.warps); /* resolved: the family's default if not given */
        if (wgmma) cJSON_AddBoolToObject(o, "persistent", rc.persistent);
        cJSON_AddStringToObject(o, "a", fm_elem_name(cfg.a));
        cJSON_AddStringToObject(o, "b", fm_elem_name(cfg.b));
        cJSON_AddStringToObject(o, "epilogue", fm_epilogue_name(cfg.epilogue));
        char tile[48];
        snprintf(tile, sizeof tile, "%dx%dx%d", cfg.tile_m, cfg.tile_n, cfg.tile_k);
        cJSON_AddStringToObject(o, "tile", tile);
        if (!swapab) {
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
        if (swapab)
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
        printf("  %-34s %9zu\n", swapab ? "FP4 weight tiles (all stages)" : "A tiles (all stages)", b->a);
        printf("  %-34s %9zu\n",
               wgmma ? "X (token) tiles, BF16 core matrices" : swapab ? "X (token) tiles, BF16" : "B tiles", b->b);
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
        else if (swapab)
            printf("  (all dynamic, from fm_smem_swapab - the launcher's own function; padding = 16 B per X row)\n");
        else
            printf("  collective sizes as CUTLASS reports them: mainloop %zu B, epilogue %zu B\n", b->mainloop,
                   b->epilogue);
        if (!cfg.stages && !swapab)
            printf("  the builder's arithmetic: %d stages, %zu B (%s)\n", r.auto_stages, r.builder_bytes,
                   r.builder_fits ? "it believes the tile fits" : "it finds no room");
        printf("verdict: %s\n", r.fits ? "FITS" : "REJECTED");
        printf("%s\n", r.reason);
        if (!r.fits && r.best_stages && !swapab)
            printf("fix: pass --stages %d (StageCount<%d> instead of StageCountAutoCarveout) -> %zu B\n",
                   r.best_stages, r.best_stages, r.best_bytes);
    }
    return r.fits ? FM_EXIT_OK : FM_EXIT_REJECTED;
}
