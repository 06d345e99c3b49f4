/* measured.c - measured grouped-GEMM times, so predictions can come from the
 * GPU itself instead of the roofline.
 *
 * CSV, one grouped GEMM per line ('#' comments and blank lines skipped):
 *   gpu,format,gemm,experts,n,k,rows_per_expert,us
 *   h200,nvfp4,fc1,32,4096,6144,8,131.2
 * column    meaning
 * gpu       GPU short name as in the GPU table (fm_gpu_find), case-insensitive
 * format    bf16 | nvfp4 | mxfp4 (weights)
 * gemm      free label (fc1, fc2, ...; < 16 characters), not used for matching
 * experts   experts in the grouped GEMM, every one given rows_per_expert rows
 * n, k      per-expert GEMM shape (out features, in features)
 * rows_per_expert  rows each expert gets (>= 1)
 * us        microseconds for the whole grouped GEMM
 * The simulator uses us / experts as the time one expert with that many rows
 * adds (a grouped GEMM's time is close to linear in active experts at a
 * fixed rows count: each expert streams its own weights).
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fm_file.h"
#include "fm_internal.h"
#include "sim_internal.h"

typedef struct {
    char      gpu[64];
    fm_format fmt;
    char      gemm[16];
    int       experts, n, k;
    double    rows, us;
} meas_row;

struct fm_sim_measured {
    int       n, cap;
    meas_row *rows;
};

static const char k_header[] = "gpu,format,gemm,experts,n,k,rows_per_expert,us";

static char *trim(char *s)
{
    while (isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = 0;
    return s;
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) return 0;
    *out = (int)v;
    return 1;
}

static int parse_pos(const char *s, double lo, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !(v >= lo && v < 1e12)) return 0;
    *out = v;
    return 1;
}

static fm_status parse_row(char *line, const char *path, int lineno, meas_row *r)
{
    char *f[8];
    int nf = 0;
    for (char *p = line; nf < 8;) {
        f[nf++] = p;
        if (nf == 8) break; /* the last field keeps any further comma: caught below */
        char *comma = strchr(p, ',');
        if (!comma) break;
        *comma = 0;
        p = comma + 1;
    }
    if (nf != 8 || strchr(f[7], ','))
        return fm_fail(FM_ERR_FORMAT, "%s:%d: expected 8 comma-separated fields (%s)", path, lineno, k_header);
    for (int i = 0; i < 8; i++) f[i] = trim(f[i]);
    if (!*f[0] || strlen(f[0]) >= sizeof r->gpu)
        return fm_fail(FM_ERR_FORMAT, "%s:%d: gpu name empty or longer than 63 characters", path, lineno);
    strcpy(r->gpu, f[0]);
    if (strlen(f[2]) >= sizeof r->gemm)
        return fm_fail(FM_ERR_FORMAT, "%s:%d: gemm label '%s' longer than 15 characters", path, lineno, f[2]);
    strcpy(r->gemm, f[2]);
    if (fm_format_parse(f[1], &r->fmt) != FM_OK)
        return fm_fail(FM_ERR_FORMAT, "%s:%d: unknown format '%s' (bf16, nvfp4, mxfp4)", path, lineno, f[1]);
    if (!parse_int(f[3], 1, FM_SIM_MAX_EXPERTS, &r->experts))
        return fm_fail(FM_ERR_FORMAT, "%s:%d: experts '%s' is not an integer in [1, %d]", path, lineno, f[3],
                       FM_SIM_MAX_EXPERTS);
    if (!parse_int(f[4], 1, 1 << 20, &r->n) || !parse_int(f[5], 1, 1 << 20, &r->k))
        return fm_fail(FM_ERR_FORMAT, "%s:%d: n '%s' / k '%s' must be integers in [1, 1048576]", path, lineno, f[4],
                       f[5]);
    if (!parse_pos(f[6], 1.0, &r->rows))
        return fm_fail(FM_ERR_FORMAT, "%s:%d: rows_per_expert '%s' must be a number >= 1", path, lineno, f[6]);
    if (!parse_pos(f[7], 1e-9, &r->us))
        return fm_fail(FM_ERR_FORMAT, "%s:%d: us '%s' must be a positive number", path, lineno, f[7]);
    return FM_OK;
}

fm_status fm_sim_measured_load(const char *path, fm_sim_measured **out)
{
    fm_clear_error();
    if (!path || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_sim_measured_load: NULL argument");
    FILE *fp; /* fm_file_fopen: a FIFO or device is FM_ERR_IO at once, not a blocked open() */
    if (fm_file_fopen(path, &fp) != FM_OK) return fm_fail(FM_ERR_IO, "measured table: %s", fm_last_error());
    fm_sim_measured *m = calloc(1, sizeof *m);
    fm_status st = m ? FM_OK : fm_fail(FM_ERR_OOM, "no memory for the measured table");
    char buf[1024];
    int lineno = 0, have_header = 0;
    while (st == FM_OK && fgets(buf, sizeof buf, fp)) {
        lineno++;
        if (!strchr(buf, '\n') && !feof(fp)) {
            st = fm_fail(FM_ERR_FORMAT, "%s:%d: line longer than %d characters", path, lineno, (int)sizeof buf - 2);
            break;
        }
        char *s = trim(buf);
        if (!*s || *s == '#') continue;
        if (!have_header) {
            if (strcasecmp(s, k_header))
                st = fm_fail(FM_ERR_FORMAT, "%s:%d: expected the header '%s', got '%s'", path, lineno, k_header, s);
            have_header = 1;
            continue;
        }
        if (m->n == m->cap) {
            int cap = m->cap ? 2 * m->cap : 64;
            meas_row *nr = realloc(m->rows, sizeof(meas_row) * (size_t)cap);
            if (!nr) {
                st = fm_fail(FM_ERR_OOM, "no memory for the measured table");
                break;
            }
            m->rows = nr;
            m->cap = cap;
        }
        st = parse_row(s, path, lineno, &m->rows[m->n]);
        if (st == FM_OK) m->n++;
    }
    if (st == FM_OK && ferror(fp)) st = fm_fail(FM_ERR_IO, "error reading '%s'", path);
    if (st == FM_OK && !have_header) st = fm_fail(FM_ERR_FORMAT, "%s: empty (no header '%s')", path, k_header);
    if (st == FM_OK && m->n == 0) st = fm_fail(FM_ERR_FORMAT, "%s: header but no rows", path);
    fclose(fp);
    if (st != FM_OK) {
        fm_sim_measured_free(m);
        return st;
    }
    *out = m;
    return FM_OK;
}

void fm_sim_measured_free(fm_sim_measured *m)
{
    if (!m) return;
    free(m->rows);
    free(m);
}

int fm_sim_measured_rows(const fm_sim_measured *m) { return m ? m->n : 0; }

fm_status fm_sim_measured_get(const fm_sim_measured *m, int i, fm_sim_measured_point *out)
{
    fm_clear_error();
    if (!m || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_sim_measured_get: NULL argument");
    if (i < 0 || i >= m->n)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_sim_measured_get: row %d not in [0, %d)", i, m->n);
    const meas_row *r = &m->rows[i];
    fm_sim_measured_point p;
    memset(&p, 0, sizeof p);
    memcpy(p.gpu, r->gpu, sizeof p.gpu);
    memcpy(p.gemm, r->gemm, sizeof p.gemm);
    p.fmt = r->fmt;
    p.experts = r->experts;
    p.n = r->n;
    p.k = r->k;
    p.rows = r->rows;
    p.us = r->us;
    *out = p;
    return FM_OK;
}

fm_status fm_sim_measured_curve(const fm_sim_measured *m, const char *gpu, fm_format fmt, int n, int k,
                                fm_sim_curve *cv)
{
    double cnt[FM_SIM_CURVE_MAX];
    cv->n = 0;
    for (int i = 0; i < m->n; i++) {
        const meas_row *r = &m->rows[i];
        if (strcasecmp(r->gpu, gpu) || r->fmt != fmt || r->n != n || r->k != k) continue;
        int j = 0;
        while (j < cv->n && cv->rows[j] != r->rows) j++;
        if (j == cv->n) {
            if (cv->n == FM_SIM_CURVE_MAX)
                return fm_fail(FM_ERR_UNSUPPORTED, "measured table: more than %d row counts for %s N=%d K=%d",
                               FM_SIM_CURVE_MAX, gpu, n, k);
            cv->rows[j] = r->rows;
            cv->us[j] = 0;
            cnt[j] = 0;
            cv->n++;
        }
        cv->us[j] += r->us / r->experts; /* repeated points are averaged */
        cnt[j] += 1;
    }
    if (!cv->n)
        return fm_fail(FM_ERR_NOT_FOUND, "measured table has no %s rows for gpu '%s' with N=%d K=%d",
                       fm_format_traits_get(fmt) ? fm_format_traits_get(fmt)->name : "?", gpu, n, k);
    for (int j = 0; j < cv->n; j++) cv->us[j] /= cnt[j];
    for (int i = 1; i < cv->n; i++) /* insertion sort by rows */
        for (int j = i; j > 0 && cv->rows[j - 1] > cv->rows[j]; j--) {
            double t = cv->rows[j];
            cv->rows[j] = cv->rows[j - 1];
            cv->rows[j - 1] = t;
            t = cv->us[j];
            cv->us[j] = cv->us[j - 1];
            cv->us[j - 1] = t;
        }
    return FM_OK;
}

/* Below the first point the time is held flat (small batches are bandwidth
 * bound: fewer rows do not make the weights cheaper to stream); beyond the
 * last it follows the last segment's slope (never decreasing). */
double fm_sim_curve_eval(const fm_sim_curve *cv, double r)
{
    int n = cv->n;
    if (n == 0) return 0;
    if (n == 1 || r <= cv->rows[0]) return cv->us[0];
    for (int j = 1; j < n; j++)
        if (r <= cv->rows[j]) {
            double t = (r - cv->rows[j - 1]) / (cv->rows[j] - cv->rows[j - 1]);
            return cv->us[j - 1] + t * (cv->us[j] - cv->us[j - 1]);
        }
    double slope = (cv->us[n - 1] - cv->us[n - 2]) / (cv->rows[n - 1] - cv->rows[n - 2]);
    return cv->us[n - 1] + fmax(slope, 0.0) * (r - cv->rows[n - 1]);
}

fm_status fm_sim_measured_us(const fm_sim_measured *m, const char *gpu, fm_format fmt, int n, int k, double rows,
                             double *us_per_expert)
{
    fm_clear_error();
    if (!m || !gpu || !us_per_expert || !(rows >= 0 && rows < 1e12))
        return fm_fail(FM_ERR_INVALID_ARG, "fm_sim_measured_us: NULL argument or rows=%g < 0", rows);
    fm_sim_curve cv;
    FM_CHECK(fm_sim_measured_curve(m, gpu, fmt, n, k, &cv));
    *us_per_expert = rows == 0 ? 0.0 : fm_sim_curve_eval(&cv, rows);
    return FM_OK;
}
