/* cmd_simulate.c - `fp4moe simulate`: from server settings to rows per expert,
 * grouped-GEMM time, efficiency and a tokens/s ceiling (docs/simulate.md).
 *
 * Flags fill an fm_sim_config (model preset, then explicit overrides), the
 * library validates it (bad settings: a specific message and exit 2), then one
 * point, a sweep table, CSV or JSON is printed and optionally a PNG plotted.
 * Crossings and the plot always use the dense exact sweep 1..--sweep-max.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli.h"

static const char k_cmd[] = "simulate";

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fp4moe simulate [flags]\n"
            "model    --model glm5|deepseek-v3|qwen3-235b|gpt-oss-120b (default glm5); overrides:\n"
            "         --experts N --topk N --hidden N --intermediate N --layers N (MoE layers)\n"
            "         --shared-experts N --shared-intermediate N --format nvfp4|mxfp4|bf16\n"
            "cluster  --gpu NAME|local (default h200; `fp4moe plan --help` lists names) --gpus N (8)\n"
            "         --parallel ep|tp (ep)\n"
            "serving  --max-running-requests N (64) --tokens-per-step N (1 + MTP/speculative drafts)\n"
            "         --accepted X (tokens kept per request per step; default all) --decode-steps N (1)\n"
            "         --round-overhead-us X (scheduler overhead per round, 0)\n"
            "routing  --skew S (Zipf exponent of expert popularity, 0 = uniform, <= 2) --seed N (1)\n"
            "         --mc N (Monte-Carlo steps for the straggler GPU, 0 = exact expectations)\n"
            "kernel   --kernel cutlass|fp4moe (whose tiles pad the rows: the planner's CUTLASS pick, or\n"
            "         fp4moe's swap-AB kernel) --tile-m N (override) --measured FILE.csv (measured times)\n"
            "         --bw-eff X (0.85) --compute-eff X (0.75) --launch-us X (5)\n"
            "         --calibrated-h200 (fp4moe's kernel on the H200 with efficiencies fitted to bench data)\n"
            "validate --validate FILE.csv (roofline vs every measured row of --gpu; --csv for CSV)\n"
            "         --fit (also fit --bw-eff/--compute-eff to that table and show the fitted errors)\n"
            "output   --sweep (table over 1..--sweep-max requests) --sweep-max N (512)\n"
            "         --csv | --json, --plot FILE.png (gnuplot)\n"
            "exit: 0 ok, 1 failed, 2 bad flags or settings, 3 no GPU (--gpu local)\n");
}

typedef struct {
    const char *model, *gpu, *measured, *plot, *validate;
    int         sweep, sweep_max, csv, json;
    int         fit, calibrated, eff_given, kernel_given;
} opts;

/* Fill c->gpu from the local device: the table row with the same CC and SMs. */
static int local_gpu(fm_sim_config *c)
{
    fm_device_info d;
    fm_status st = fm_device_query(0, &d);
    if (st != FM_OK) return fm_cli_fail(k_cmd, st);
    for (size_t i = 0; i < fm_gpu_count(); i++) {
        const fm_gpu_info *g = fm_gpu_at(i);
        if (g && g->cc == d.cc && g->sms == d.sms) {
            c->gpu = *g;
            if (d.mem_gbs > 0) c->gpu.mem_gbs = d.mem_gbs; /* the device's own figure */
            return FM_EXIT_OK;
        }
    }
    fprintf(stderr, "fp4moe simulate: the local device '%s' (cc %d, %d SMs) is not in the GPU table; its tensor rates "
                    "are unknown: pass --gpu NAME\n", d.name, d.cc, d.sms);
    return FM_EXIT_USAGE;
}

#define INTFLAG(name, lo, hi, dst)                                                  \
    if (!strcmp(a, name)) {                                                         \
        long v_;                                                                    \
        if (!val || !fm_cli_int(k_cmd, name, val, lo, hi, &v_)) return FM_EXIT_USAGE; \
        dst = (int)v_;                                                              \
        i++;                                                                        \
        continue;                                                                   \
    }
#define DBLFLAG(name, lo, hi, dst)                                                     \
    if (!strcmp(a, name)) {                                                            \
        if (!val || !fm_cli_double(k_cmd, name, val, lo, hi, &dst)) return FM_EXIT_USAGE; \
        i++;                                                                           \
        continue;                                                                      \
    }

static int parse(int argc, char **argv, fm_sim_config *c, opts *o)
{
    fm_sim_model ov; /* explicit model flags, -1 = not given */
    memset(&ov, 0, sizeof ov);
    ov.n_experts = ov.top_k = ov.hidden = ov.inter = ov.moe_layers = ov.shared_experts = ov.shared_inter = -1;
    const char *fmt = NULL, *parallel = NULL, *kernel = NULL;
    long seed = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return -1;
        }
        if (!strcmp(a, "--sweep")) { o->sweep = 1; continue; }
        if (!strcmp(a, "--csv")) { o->csv = 1; continue; }
        if (!strcmp(a, "--json")) { o->json = 1; continue; }
        if (!strcmp(a, "--fit")) { o->fit = 1; continue; }
        if (!strcmp(a, "--calibrated-h200")) { o->calibrated = 1; continue; }
        if (!strcmp(a, "--bw-eff") || !strcmp(a, "--compute-eff")) o->eff_given = 1;
        const char **sp = !strcmp(a, "--model") ? &o->model : !strcmp(a, "--gpu") ? &o->gpu
                        : !strcmp(a, "--measured") ? &o->measured : !strcmp(a, "--plot") ? &o->plot
                        : !strcmp(a, "--validate") ? &o->validate
                        : !strcmp(a, "--format") ? &fmt : !strcmp(a, "--parallel") ? &parallel
                        : !strcmp(a, "--kernel") ? &kernel : NULL;
        if (sp) {
            if (!val) {
                fprintf(stderr, "fp4moe simulate: %s needs a value\n", a);
                return FM_EXIT_USAGE;
            }
            *sp = val;
            i++;
            continue;
        }
        INTFLAG("--experts", 1, 100000, ov.n_experts)
        INTFLAG("--topk", 1, 100000, ov.top_k)
        INTFLAG("--hidden", 1, 1 << 20, ov.hidden)
        INTFLAG("--intermediate", 1, 1 << 20, ov.inter)
        INTFLAG("--layers", 1, 100000, ov.moe_layers)
        INTFLAG("--shared-experts", 0, 64, ov.shared_experts)
        INTFLAG("--shared-intermediate", 0, 1 << 20, ov.shared_inter)
        INTFLAG("--gpus", 0, 100000, c->gpus)
        INTFLAG("--max-running-requests", 1, 1 << 20, c->max_running)
        INTFLAG("--max-running", 1, 1 << 20, c->max_running)
        INTFLAG("--tokens-per-step", 1, 1024, c->tokens_per_step)
        INTFLAG("--decode-steps", 1, 1 << 20, c->decode_steps)
        INTFLAG("--mc", 0, 1 << 20, c->mc_steps)
        INTFLAG("--tile-m", 1, 1 << 20, c->tile_m)
        INTFLAG("--sweep-max", 1, 65536, o->sweep_max)
        DBLFLAG("--accepted", 0, 1024, c->accepted)
        DBLFLAG("--round-overhead-us", 0, 1e9, c->round_us)
        DBLFLAG("--skew", 0, 1e9, c->skew)
        DBLFLAG("--bw-eff", 0, 1e9, c->bw_eff)
        DBLFLAG("--compute-eff", 0, 1e9, c->compute_eff)
        DBLFLAG("--launch-us", 0, 1e9, c->launch_us)
        if (!strcmp(a, "--seed")) {
            if (!val || !fm_cli_int(k_cmd, a, val, 0, 0x7fffffffL, &seed)) return FM_EXIT_USAGE;
            c->seed = (uint64_t)seed;
            i++;
            continue;
        }
        fprintf(stderr, "fp4moe simulate: unknown flag '%s' (fp4moe simulate --help)\n", a);
        return FM_EXIT_USAGE;
    }
    if (o->model && fm_sim_model_find(o->model, &c->model) != FM_OK) {
        fprintf(stderr, "fp4moe simulate: %s\n", fm_last_error());
        return FM_EXIT_USAGE;
    }
    int custom = 0;
#define OVR(f)                 \
    if (ov.f >= 0) {           \
        c->model.f = ov.f;     \
        custom = 1;            \
    }
    OVR(n_experts) OVR(top_k) OVR(hidden) OVR(inter) OVR(moe_layers) OVR(shared_experts) OVR(shared_inter)
#undef OVR
    if (ov.shared_experts == 0 && ov.shared_inter < 0) c->model.shared_inter = 0;
    if (fmt) {
        if (fm_format_parse(fmt, &c->model.wfmt) != FM_OK) {
            fprintf(stderr, "fp4moe simulate: --format: %s\n", fm_last_error());
            return FM_EXIT_USAGE;
        }
        custom = 1;
    }
    if (custom) {
        c->model.source = NULL;
        size_t n = strlen(c->model.name);
        if (n + 8 < sizeof c->model.name) strcat(c->model.name, "+custom");
    }
    if (parallel) {
        if (!strcmp(parallel, "ep"))
            c->parallel = FM_PARALLEL_EP;
        else if (!strcmp(parallel, "tp"))
            c->parallel = FM_PARALLEL_TP;
        else {
            fprintf(stderr, "fp4moe simulate: --parallel expects ep or tp, got '%s'\n", parallel);
            return FM_EXIT_USAGE;
        }
    }
    o->kernel_given = kernel != NULL;
    if (kernel) {
        if (!strcmp(kernel, "cutlass"))
            c->kernel = FM_SIM_KERNEL_CUTLASS;
        else if (!strcmp(kernel, "fp4moe"))
            c->kernel = FM_SIM_KERNEL_FP4MOE;
        else {
            fprintf(stderr, "fp4moe simulate: --kernel expects cutlass or fp4moe, got '%s'\n", kernel);
            return FM_EXIT_USAGE;
        }
    }
    if (o->gpu && !strcmp(o->gpu, "local")) {
        int rc = local_gpu(c);
        if (rc) return rc;
    } else if (o->gpu) {
        const fm_gpu_info *g = NULL;
        if (fm_gpu_find(o->gpu, &g) != FM_OK) {
            fprintf(stderr, "fp4moe simulate: --gpu: %s\n", fm_last_error());
            return FM_EXIT_USAGE;
        }
        c->gpu = *g;
    }
    if (o->calibrated) {
        /* the fitted efficiencies describe one kernel on one GPU: refuse to mix them */
        if (o->gpu && strcasecmp(c->gpu.name ? c->gpu.name : "", "h200")) {
            fprintf(stderr, "fp4moe simulate: --calibrated-h200 was fitted on the H200; it cannot be used with --gpu %s "
                            "(pass --bw-eff/--compute-eff instead)\n", o->gpu);
            return FM_EXIT_USAGE;
        }
        if (o->eff_given) {
            fprintf(stderr, "fp4moe simulate: --calibrated-h200 sets --bw-eff and --compute-eff; give one or the "
                            "other\n");
            return FM_EXIT_USAGE;
        }
        if (o->kernel_given && c->kernel != FM_SIM_KERNEL_FP4MOE) {
            fprintf(stderr, "fp4moe simulate: --calibrated-h200 describes fp4moe's kernel; it cannot be used with "
                            "--kernel cutlass\n");
            return FM_EXIT_USAGE;
        }
        const fm_gpu_info *g = NULL;
        if (fm_gpu_find("h200", &g) != FM_OK) {
            fprintf(stderr, "fp4moe simulate: --calibrated-h200: %s\n", fm_last_error());
            return FM_EXIT_USAGE;
        }
        c->gpu = *g;
        c->kernel = FM_SIM_KERNEL_FP4MOE;
        c->bw_eff = FM_SIM_H200_FP4MOE_BW_EFF;
        c->compute_eff = FM_SIM_H200_FP4MOE_COMPUTE_EFF;
    }
    if (o->fit && !o->validate) {
        fprintf(stderr, "fp4moe simulate: --fit needs --validate FILE.csv\n");
        return FM_EXIT_USAGE;
    }
    if (o->validate && (o->json || o->plot || o->sweep || o->measured)) {
        fprintf(stderr, "fp4moe simulate: --validate prints a table or --csv; it takes no --json, --plot, --sweep "
                        "or --measured\n");
        return FM_EXIT_USAGE;
    }
    if (o->csv && o->json) {
        fprintf(stderr, "fp4moe simulate: --csv and --json are exclusive\n");
        return FM_EXIT_USAGE;
    }
    return FM_EXIT_OK;
}

/* Settings the caller can fix give exit 2; anything else 1 (or 3 for no GPU). */
static int fail(fm_status st)
{
    if (st == FM_ERR_INVALID_ARG || st == FM_ERR_BAD_SHAPE || st == FM_ERR_FORMAT || st == FM_ERR_NOT_FOUND ||
        st == FM_ERR_ARCH_MISMATCH || st == FM_ERR_UNSUPPORTED) { /* settings that describe no valid setup */
        fprintf(stderr, "fp4moe simulate: %s: %s\n", fm_status_name(st), fm_last_error());
        return FM_EXIT_USAGE;
    }
    return fm_cli_fail(k_cmd, st);
}

static int output(const fm_sim_config *c, const opts *o)
{
    int hi = o->sweep_max;
    fm_sim_config dense = *c;
    dense.mc_steps = 0; /* crossings and the plot: exact, every integer */
    fm_sim_crossings x;
    fm_status st = fm_sim_find_crossings(&dense, hi, &x);
    if (st != FM_OK) return fail(st);

    int npts = 1;
    int *mr = malloc(sizeof(int) * (size_t)(hi + 32));
    fm_sim_result *res = NULL;
    if (!mr) return fm_cli_fail(k_cmd, FM_ERR_OOM);
    if (o->sweep) {
        static const int k_pts[] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
                                    1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152, 65536};
        npts = 0;
        for (size_t i = 0; i < sizeof k_pts / sizeof k_pts[0] && k_pts[i] <= hi; i++) mr[npts++] = k_pts[i];
        if (mr[npts - 1] != hi) mr[npts++] = hi;
    } else {
        mr[0] = c->max_running;
    }
    res = malloc(sizeof(fm_sim_result) * (size_t)npts);
    st = res ? fm_sim_sweep(c, mr, npts, res) : FM_ERR_OOM;
    int rc = FM_EXIT_OK;
    if (st != FM_OK) {
        rc = fail(st);
    } else if (o->csv) {
        st = fm_sim_write_csv(stdout, res, npts);
    } else if (o->json) {
        st = fm_sim_write_json(stdout, c, res, npts, &x);
    } else if (o->sweep) {
        fm_sim_result one;
        st = fm_sim_run(c, &one);
        if (st == FM_OK) st = fm_sim_write_text(stdout, c, &one, &x);
        if (st == FM_OK) printf("\nsweep over max running requests (slowest GPU, per MoE layer):\n");
        if (st == FM_OK) st = fm_sim_write_sweep_text(stdout, res, npts);
    } else {
        st = fm_sim_write_text(stdout, c, &res[0], &x);
    }
    if (rc == FM_EXIT_OK && st != FM_OK) rc = fm_cli_fail(k_cmd, st);
    if (rc == FM_EXIT_OK && o->plot) {
        fm_sim_result *dr = realloc(res, sizeof(fm_sim_result) * (size_t)hi);
        if (!dr) {
            rc = fm_cli_fail(k_cmd, FM_ERR_OOM);
        } else {
            res = dr;
            for (int i = 0; i < hi; i++) mr[i] = i + 1;
            st = fm_sim_sweep(&dense, mr, hi, res);
            if (st == FM_OK) st = fm_sim_plot(o->plot, c, res, hi, &x);
            if (st != FM_OK) rc = fm_cli_fail(k_cmd, st);
            else if (!o->csv && !o->json) printf("plot written to %s\n", o->plot);
        }
    }
    free(mr);
    free(res);
    return rc;
}

/* --validate: the roofline against every measured row of the GPU (and, with
 * --fit, again with the efficiencies fitted to those rows). */
static int validate(fm_sim_config *c, const opts *o)
{
    fm_sim_measured *m = NULL;
    fm_status st = fm_sim_measured_load(o->validate, &m);
    if (st != FM_OK) return st == FM_ERR_IO ? fm_cli_fail(k_cmd, st) : fail(st);
    int cap = fm_sim_measured_rows(m), n = 0;
    fm_sim_check_point *p = malloc(sizeof *p * (size_t)cap);
    fm_sim_check_summary s;
    st = p ? FM_OK : FM_ERR_OOM;
    for (int pass = 0; pass < 1 + o->fit && st == FM_OK; pass++) {
        if (pass == 1) {
            st = fm_sim_fit_eff(c, m, &c->bw_eff, &c->compute_eff);
            if (st != FM_OK) break;
            printf("\nfitted: --bw-eff %.3f --compute-eff %.3f (minimum mean |log(pred/meas)|)\n", c->bw_eff,
                   c->compute_eff);
        }
        st = fm_sim_validate(c, m, p, cap, &n, &s);
        if (st == FM_OK && o->csv) st = fm_sim_write_validation_csv(stdout, p, n);
        else if (st == FM_OK) st = fm_sim_write_validation(stdout, c, p, n, &s);
    }
    int rc = st == FM_OK ? FM_EXIT_OK : st == FM_ERR_IO || st == FM_ERR_OOM ? fm_cli_fail(k_cmd, st) : fail(st);
    free(p);
    fm_sim_measured_free(m);
    return rc;
}

int fm_cmd_simulate(int argc, char **argv)
{
    fm_sim_config c;
    fm_sim_config_default(&c);
    opts o = {NULL, NULL, NULL, NULL, NULL, 0, 512, 0, 0, 0, 0, 0, 0};
    int rc = parse(argc, argv, &c, &o);
    if (rc) return rc < 0 ? FM_EXIT_OK : rc;
    if (o.validate) {
        fm_status st = fm_sim_config_check(&c);
        return st == FM_OK ? validate(&c, &o) : fail(st);
    }
    fm_sim_measured *m = NULL;
    if (o.measured) {
        fm_status st = fm_sim_measured_load(o.measured, &m);
        if (st != FM_OK) return st == FM_ERR_IO ? fm_cli_fail(k_cmd, st) : fail(st);
        c.measured = m;
    }
    fm_status st = fm_sim_config_check(&c);
    if (st == FM_OK && o.sweep_max * (long)c.tokens_per_step > (1 << 20)) {
        fprintf(stderr, "fp4moe simulate: --sweep-max %d x %d tokens per step is too many tokens\n", o.sweep_max,
                c.tokens_per_step);
        rc = FM_EXIT_USAGE;
    } else if (st != FM_OK) {
        rc = fail(st);
    } else {
        rc = output(&c, &o);
    }
    fm_sim_measured_free(m);
    return rc;
}
