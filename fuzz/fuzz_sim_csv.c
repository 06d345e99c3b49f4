/* fuzz_sim_csv.c - libFuzzer target over the simulator's CSV inputs: the
 * measured-times table that `simulate --measured` and `--validate` load
 * (fm_sim_measured_load) and everything that reads it (the per-shape curves
 * and their interpolation, the validation, the efficiency fit, a simulated
 * point with measured times).
 *
 * Any byte string must either fail with a status that leaves the out pointer
 * untouched, or load rows within the documented ranges from which every
 * figure computed is finite; the target aborts otherwise, and ASan/UBSan
 * (fuzz/run.sh builds them in) report any bad access or overflow.  The loader
 * takes a path, so each input goes through one temporary file, rewritten in
 * place.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "fp4moe/tools.h"
#include "fp4moe/sim.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_path[64];
static int  g_fd = -1;

static void check_finite(double v)
{
    if (!isfinite(v)) abort();
}

/* The curve of row 0's GPU/format/shape at rows around its points. */
static void curves(const fm_sim_measured *m, const fm_sim_measured_point *p)
{
    const double at[] = {0, 0.5, 1, p->rows, p->rows * 2, 1e6};
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        double us = -1;
        fm_status st = fm_sim_measured_us(m, p->gpu, p->fmt, p->n, p->k, at[i], &us);
        if (st == FM_ERR_UNSUPPORTED) return; /* more row counts than a curve holds: a stated limit */
        if (st != FM_OK || !isfinite(us) || us < 0) abort(); /* the row itself is in the table */
    }
}

/* --validate (and --fit when small) on row 0's GPU and format. */
static void validation(const fm_sim_measured *m, const fm_sim_measured_point *p, int kernel)
{
    const fm_gpu_info *g = NULL;
    /* a GPU not in the table stops the CLI at --gpu; an alias (h100 -> h100-sxm) matches no row */
    if (fm_gpu_find(p->gpu, &g) != FM_OK || !g || strcasecmp(g->name, p->gpu)) return;
    fm_sim_config c;
    fm_sim_config_default(&c);
    c.gpu = *g;
    c.model.wfmt = p->fmt;
    c.kernel = kernel ? FM_SIM_KERNEL_FP4MOE : FM_SIM_KERNEL_CUTLASS;
    int rows = fm_sim_measured_rows(m), n = 0;
    fm_sim_check_point *out = malloc(sizeof *out * (size_t)rows);
    if (!out) return;
    fm_sim_check_summary s;
    fm_status st = fm_sim_validate(&c, m, out, rows, &n, &s);
    if (st == FM_OK) {
        if (n < 1 || n > rows) abort();
        for (int i = 0; i < n; i++) {
            check_finite(out[i].pred_us);
            check_finite(out[i].rel_err);
            if (out[i].tile_m < 1) abort();
        }
        for (int r = 0; r <= FM_SIM_REGIMES; r++) check_finite(s.median_abs[r] + s.max_abs[r] + s.mean_bias[r]);
        double be = -1, ce = -1;
        if (rows <= 64) {
            if (fm_sim_fit_eff(&c, m, &be, &ce) != FM_OK || !(be > 0 && be <= 1) || !(ce > 0 && ce <= 1)) abort();
        }
    } else if (st != FM_ERR_NONFINITE && st != FM_ERR_OOM) {
        abort(); /* the table matched row 0: no other failure is documented */
    }
    free(out);
}

/* --measured: a model whose FC1 is row 0's shape; FC2 may be missing (NOT_FOUND). */
static void simulated(const fm_sim_measured *m, const fm_sim_measured_point *p)
{
    const fm_gpu_info *g = NULL;
    if (fm_gpu_find(p->gpu, &g) != FM_OK || !g || strcasecmp(g->name, p->gpu) || p->n % 2) return;
    fm_sim_config c;
    fm_sim_config_default(&c);
    c.gpu = *g;
    c.gpus = 1;
    c.model.wfmt = p->fmt;
    c.model.hidden = p->k;
    c.model.inter = p->n / 2;
    c.model.n_experts = p->experts;
    c.model.top_k = 1;
    c.model.shared_experts = c.model.shared_inter = 0;
    c.max_running = 1 + p->experts % 64;
    c.measured = m;
    if (fm_sim_config_check(&c) != FM_OK) return;
    fm_sim_result r;
    fm_status st = fm_sim_run(&c, &r);
    if (st == FM_OK) {
        check_finite(r.layer_us + r.fc1_us + r.fc2_us + r.tokens_per_s + r.step_us);
        if (!r.measured) abort();
    } else if (st != FM_ERR_NOT_FOUND && st != FM_ERR_UNSUPPORTED && st != FM_ERR_NONFINITE) {
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (g_fd < 0) {
        const char *t = getenv("TMPDIR");
        snprintf(g_path, sizeof g_path, "%s/fm-fuzz-csv-XXXXXX", t && *t && strlen(t) < 40 ? t : "/tmp");
        g_fd = mkstemp(g_path);
        if (g_fd < 0) abort();
    }
    if (ftruncate(g_fd, 0) || pwrite(g_fd, data, size, 0) != (ssize_t)size) abort();
    fm_sim_measured *sentinel = (fm_sim_measured *)&g_fd, *m = sentinel;
    fm_status st = fm_sim_measured_load(g_path, &m);
    if (st != FM_OK) {
        if (m != sentinel) abort(); /* *out untouched on failure */
        if (st != FM_ERR_FORMAT && st != FM_ERR_IO && st != FM_ERR_OOM) abort();
        return 0;
    }
    int rows = fm_sim_measured_rows(m);
    if (rows < 1) abort();
    fm_sim_measured_point p0 = {0};
    for (int i = 0; i < rows; i++) {
        fm_sim_measured_point p;
        if (fm_sim_measured_get(m, i, &p) != FM_OK) abort();
        if (p.experts < 1 || p.experts > 4096 || p.n < 1 || p.n > (1 << 20) || p.k < 1 || p.k > (1 << 20) ||
            !(p.rows >= 1 && p.rows < 1e12) || !(p.us > 0 && p.us < 1e12) || !memchr(p.gpu, 0, sizeof p.gpu) ||
            !memchr(p.gemm, 0, sizeof p.gemm))
            abort();
        if (i == 0) p0 = p;
    }
    curves(m, &p0);
    validation(m, &p0, size > 0 && (data[0] & 1));
    simulated(m, &p0);
    fm_sim_measured_free(m);
    return 0;
}
