/* cmd_simulate.c - `fp4moe simulate`: from server settings to rows per expert,
 * grouped-GEMM time, efficiency and a tokens/s ceiling (docs/simulate.md).
 *
 * Flags fill an fm_sim_config (model preset, then explicit overrides), the
 * library validates it (bad settings: a specific message and exit 2), then one
 * point, a sweep table, CSV or JSON is printed and optionally a PNG plotted.
 * Crossings and the plot always use the dense exact sweep 1..--sweep-max.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "cli.h"
#include "flags.h"
#include "simulate_flags.h"

static const char k_cmd[] = "simulate";

typedef struct {
    const char *model, *gpu, *measured, *plot, *validate;
    int         sweep, sweep_max, csv, json;
    int         fit, calibrated, eff_given, kernel_given;
    unsigned    given;            /* bit s: numeric setting s was given */
    const char *model_flag;       /* a model/serving string flag given (--model, --parallel, --format) */
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

static int parse(int argc, char **argv, fm_sim_config *c, opts *o)
{
    fm_sim_model ov; /* explicit model flags, -1 = not given */
    memset(&ov, 0, sizeof ov);
    ov.n_experts = ov.top_k = ov.hidden = ov.inter = ov.moe_layers = ov.shared_experts = ov.shared_inter = -1;
    fm_sim_flags       fl;
    fm_flags_result    r;
    const fm_flag_cmd *cmd = fm_cli_simulate_cmd();
    memset(&fl, 0, sizeof fl);
    int prc = fm_flags_parse(cmd, argc, argv, &fl, &r);
    if (prc == FM_EXIT_OK) return -1; /* --help */
    if (prc != FM_FLAGS_GO) return prc;
    o->model = fl.model, o->gpu = fl.gpu, o->measured = fl.measured, o->plot = fl.plot, o->validate = fl.validate;
    o->sweep = fl.sweep, o->csv = fl.csv, o->json = fl.json, o->fit = fl.fit, o->calibrated = fl.calibrated;
    o->eff_given = r.seen[fm_flags_index(cmd, "bw-eff")] || r.seen[fm_flags_index(cmd, "compute-eff")];
    if (fl.parallel) o->model_flag = "--parallel"; /* --model and --format choose the rows (their format) */
    const char *fmt = fl.format, *parallel = fl.parallel, *kernel = fl.kernel;
    fm_cli_simulate_apply(&fl, &r, c, &ov, &o->sweep_max, &o->given);
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
    /* --validate asks the roofline about single grouped GEMMs, each row bringing its
     * own shape: model, cluster, serving and routing settings would be ignored */
    const unsigned validate_reads = 1u << FM_SIM_SET_TILE_M | 1u << FM_SIM_SET_BW_EFF | 1u << FM_SIM_SET_COMPUTE_EFF |
                                    1u << FM_SIM_SET_LAUNCH_US;
    if (o->validate && ((o->given & ~validate_reads) || o->model_flag)) {
        const char *which = o->model_flag;
        for (int i = 0; !which && i < FM_SIM_SET_COUNT; i++)
            if ((o->given & ~validate_reads) >> i & 1) which = fm_sim_range_get((fm_sim_setting)i)->flag;
        fprintf(stderr, "fp4moe simulate: --validate compares single grouped GEMMs, each row with its own shape; "
                        "it reads only --gpu, --kernel, --tile-m, --bw-eff, --compute-eff, --launch-us (or "
                        "--calibrated-h200), --format (or --model: its format) and --fit, not %s\n", which);
        return FM_EXIT_USAGE;
    }
    if (o->validate && (o->json || o->plot || o->sweep || o->measured)) {
        fprintf(stderr, "fp4moe simulate: --validate prints a table or --csv; it takes no --json, --plot, --sweep "
                        "or --measured\n");
        return FM_EXIT_USAGE;
    }
    if (o->plot && (!*o->plot || strchr(o->plot, '\n') || strlen(o->plot) > 4000)) {
        /* gnuplot's script takes the path as a quoted string: a newline cannot be in one */
        fprintf(stderr, "fp4moe simulate: --plot expects a file name without a newline, 1 to 4000 bytes long\n");
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
        st == FM_ERR_ARCH_MISMATCH || st == FM_ERR_UNSUPPORTED ||
        st == FM_ERR_NONFINITE) { /* settings that describe no valid setup, or give no finite figures */
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
    fm_status st = FM_OK;
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
    /* the whole invocation against the work bound, before anything runs or prints */
    double secs = 0, part = 0;
    char what[400] = "";
    st = fm_sim_estimate_seconds(c, mr, npts, 0, &part, what, sizeof what);
    secs += part;
    if (st == FM_OK) st = fm_sim_estimate_seconds(&dense, NULL, 0, hi, &part, NULL, 0), secs += part;
    if (st == FM_OK && o->sweep) st = fm_sim_estimate_seconds(c, &c->max_running, 1, 0, &part, NULL, 0), secs += part;
    if (st == FM_OK && o->plot) st = fm_sim_estimate_seconds(&dense, NULL, 0, hi, &part, NULL, 0), secs += 2 * part;
    if (st == FM_OK && secs > FM_SIM_MAX_SECONDS) {
        fprintf(stderr, "fp4moe simulate: refusing about %.*f %s of work (the limit is %.0f min): %s\n",
                secs < 7200 ? 0 : 1, secs < 7200 ? secs / 60 : secs / 3600, secs < 7200 ? "min" : "h",
                FM_SIM_MAX_SECONDS / 60, what);
        free(mr);
        return FM_EXIT_USAGE;
    }
    if (st != FM_OK) {
        free(mr);
        return fail(st);
    }
    st = fm_sim_find_crossings(&dense, hi, &x);
    if (st != FM_OK) {
        free(mr);
        return fail(st);
    }
    res = malloc(sizeof(fm_sim_result) * (size_t)npts);
    st = res ? fm_sim_sweep(c, mr, npts, res) : FM_ERR_OOM;
    /* the plot's dense sweep before anything is printed: a failure leaves stdout empty */
    fm_sim_result *dr = NULL;
    if (st == FM_OK && o->plot) {
        int *dm = malloc(sizeof(int) * (size_t)hi);
        dr = malloc(sizeof(fm_sim_result) * (size_t)hi);
        if (!dm || !dr) st = FM_ERR_OOM;
        for (int i = 0; st == FM_OK && i < hi; i++) dm[i] = i + 1;
        if (st == FM_OK) st = fm_sim_sweep(&dense, dm, hi, dr);
        free(dm);
    }
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
        fflush(stdout);
        st = fm_sim_plot(o->plot, c, dr, hi, &x);
        /* a path gnuplot cannot take is the caller's to fix (2); gnuplot missing or failing is 1 */
        if (st == FM_ERR_INVALID_ARG) rc = fm_cli_usage_status(k_cmd, "--plot", st);
        else if (st != FM_OK) rc = fm_cli_fail(k_cmd, st);
        else if (!o->csv && !o->json) printf("plot written to %s\n", o->plot);
    }
    free(dr);
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

/* Progress of long runs on stderr: nothing in the first 2 s, then a line at most
 * twice a second (fm_cli_progress: a terminal, or FM_PROGRESS=1). */
typedef struct {
    double t0, last;
    int    shown;
} progress_state;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void on_progress(void *ctx, const char *phase, double done)
{
    progress_state *p = ctx;
    double t = now_s();
    if (t - p->t0 < 2.0 || t - p->last < 0.5) return;
    p->last = t;
    p->shown = 1;
    fm_cli_progress("\rfp4moe simulate: %s %3.0f %% (%.0f s)   ", phase, 100 * done, t - p->t0);
}

static int simulate_main(int argc, char **argv, progress_state *ps)
{
    fm_sim_config c;
    fm_sim_config_default(&c);
    c.progress = on_progress;
    c.progress_ctx = ps;
    opts o = {NULL, NULL, NULL, NULL, NULL, 0, 512, 0, 0, 0, 0, 0, 0, 0, NULL};
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
    if (st == FM_OK && o.sweep_max * (long)c.tokens_per_step > FM_SIM_MAX_STEP_TOKENS) {
        fprintf(stderr, "fp4moe simulate: --sweep-max %d x --tokens-per-step %d must be <= %d tokens a step\n",
                o.sweep_max, c.tokens_per_step, FM_SIM_MAX_STEP_TOKENS);
        rc = FM_EXIT_USAGE;
    } else if (st != FM_OK) {
        rc = fail(st);
    } else {
        rc = output(&c, &o);
    }
    fm_sim_measured_free(m);
    return rc;
}

int fm_cmd_simulate(int argc, char **argv)
{
    progress_state ps = {now_s(), 0, 0};
    int rc = simulate_main(argc, argv, &ps);
    if (ps.shown) fm_cli_progress("\n");
    return rc;
}
