/* plot.c - rows per expert, efficiency and tile waste against concurrency, as a
 * PNG drawn by gnuplot (Debian gnuplot-nox; scripts/deps.sh installs it).
 *
 * gnuplot is an optional run-time tool, not a link dependency: it is looked up
 * in PATH (or $FM_GNUPLOT) first, so its absence is a clear FM_ERR_NOT_FOUND
 * instead of a shell's "command not found".  The data go through a temporary
 * file; the script through gnuplot's stdin.  The output is proved writable before
 * gnuplot starts: fm_file_out (fm_file.h) refuses a PNG path that is a link,
 * device, FIFO or read-only file and creates the exclusive temporary that gnuplot
 * then writes by name and that is renamed over the path only when gnuplot
 * succeeded.  gnuplot's stdout goes to
 * /dev/null: when `set output` fails gnuplot falls back to stdout, which would
 * pour the PNG into the caller's terminal or pipe.  Paths go into the script as
 * quoted strings (quotes doubled, backslashes as they are); a path with a
 * newline cannot be quoted and is FM_ERR_INVALID_ARG.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fm_file.h"
#include "fm_internal.h"
#include "sim_internal.h"

/* Full path of gnuplot into buf, or 0. */
static int find_gnuplot(char *buf, size_t n)
{
    const char *env = getenv("FM_GNUPLOT");
    if (env && *env) {
        if (strlen(env) >= n || access(env, X_OK)) return 0;
        strcpy(buf, env);
        return 1;
    }
    const char *path = getenv("PATH");
    if (!path) path = "/usr/bin:/bin";
    while (*path) {
        size_t len = strcspn(path, ":");
        if (len && len + 9 < n) {
            memcpy(buf, path, len);
            strcpy(buf + len, "/gnuplot");
            if (!access(buf, X_OK)) return 1;
        }
        path += len;
        if (*path == ':') path++;
    }
    return 0;
}

/* A gnuplot '...' string takes every byte as it is (a backslash too) except
 * the quote itself, written doubled, and a newline, which ends the command:
 * only that cannot be quoted. */
static int quotable(const char *s) { return !strchr(s, '\n'); }

static void gp_quoted(FILE *p, const char *s)
{
    fputc('\'', p);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', p);
        fputc(*s, p);
    }
    fputc('\'', p);
}

/* The same for sh's '...' (gnuplot is started through popen): ' becomes '\''. */
static int sh_quoted(char *buf, size_t n, const char *s)
{
    size_t o = 0;
    buf[o++] = '\'';
    for (; *s; s++) {
        if (o + 5 >= n) return 0;
        if (*s == '\'') {
            memcpy(buf + o, "'\\''", 4);
            o += 4;
        } else
            buf[o++] = *s;
    }
    if (o + 2 >= n) return 0;
    buf[o++] = '\'';
    buf[o] = 0;
    return 1;
}

fm_status fm_sim_plot(const char *png, const fm_sim_config *c, const fm_sim_result *r, int n,
                      const fm_sim_crossings *x)
{
    fm_clear_error();
    if (!png || !*png || !c || !r || n < 1) return fm_fail(FM_ERR_INVALID_ARG, "fm_sim_plot: NULL argument or no points");
    if (!quotable(png) || strlen(png) > 4000)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_sim_plot: the output path is longer than 4000 bytes or holds a newline "
                                           "(gnuplot's script cannot quote one)");
    char gp[4096];
    if (!find_gnuplot(gp, sizeof gp))
        return fm_fail(FM_ERR_NOT_FOUND, "gnuplot not found (PATH%s); install it: apt-get install gnuplot-nox, "
                       "or run scripts/deps.sh",
                       getenv("FM_GNUPLOT") ? ", $FM_GNUPLOT" : "");
    /* draw into the temporary and rename on success: a failed plot leaves an
     * existing file of the caller's untouched.  Create it now: an unwritable or
     * refused path is an FM_ERR_IO naming it, before any work */
    fm_file_out out;
    if (fm_file_out_begin(png, &out) != FM_OK)
        return fm_fail(FM_ERR_IO, "cannot write the plot: %s", fm_last_error());
    const char *part = out.tmp;
    const char *tmpdir = getenv("TMPDIR");
    char data[4096];
    snprintf(data, sizeof data, "%s/fp4moe-sim-XXXXXX", tmpdir && *tmpdir && quotable(tmpdir) ? tmpdir : "/tmp");
    int fd = mkstemp(data);
    if (fd < 0) {
        int e = errno;
        fm_file_out_abort(&out);
        return fm_fail(FM_ERR_IO, "fm_sim_plot: cannot create a temporary file: %s", strerror(e));
    }
    FILE *df = fdopen(fd, "w");
    if (!df) {
        close(fd);
        unlink(data);
        fm_file_out_abort(&out);
        return fm_fail(FM_ERR_IO, "fm_sim_plot: fdopen failed");
    }
    /* columns: requests, rows/active, rows/expert, efficiency %, waste %, bandwidth % */
    for (int i = 0; i < n; i++)
        fprintf(df, "%d %.6g %.6g %.6g %.6g %.6g\n", r[i].max_running, r[i].rows_per_active, r[i].rows_per_expert,
                100 * r[i].efficiency, 100 * r[i].waste, 100 * r[i].bw_util);
    int bad = ferror(df);
    fclose(df);
    if (bad) {
        unlink(data);
        fm_file_out_abort(&out);
        return fm_fail(FM_ERR_IO, "fm_sim_plot: writing %s failed", data);
    }
    char cmd[4200], qgp[4150];
    int okq = sh_quoted(qgp, sizeof qgp, gp);
    snprintf(cmd, sizeof cmd, "%s >/dev/null", qgp);
    FILE *p = okq ? popen(cmd, "w") : NULL;
    if (!p) {
        unlink(data);
        fm_file_out_abort(&out);
        return fm_fail(FM_ERR_IO, "fm_sim_plot: cannot start %s", gp);
    }
    fprintf(p, "set terminal pngcairo size 1000,800 noenhanced\nset output ");
    gp_quoted(p, part);
    char title[256];
    snprintf(title, sizeof title, "%s, %d x %s %s, %d tokens/request/step%s", c->model.name, c->gpus,
             c->gpu.name && quotable(c->gpu.name) ? c->gpu.name : "gpu", c->parallel == FM_PARALLEL_EP ? "EP" : "TP",
             c->tokens_per_step, c->skew > 0 ? ", skewed routing" : "");
    fprintf(p, "\nset multiplot layout 2,1 title ");
    gp_quoted(p, quotable(title) ? title : "fp4moe simulate");
    fprintf(p, "\n");
    fprintf(p, "set logscale x 2\nset logscale y 2\nset grid\nset key top left\nset xlabel 'max running requests'\n");
    fprintf(p, "set ylabel 'rows per expert per step'\nset yrange [:128]\n");
    for (int i = 0; x && i < 4; i++)
        if (x->rows_at[i]) fprintf(p, "set arrow from %d, graph 0 to %d, graph 1 nohead dt 3\n", x->rows_at[i], x->rows_at[i]);
    fprintf(p, "plot ");
    gp_quoted(p, data);
    fprintf(p, " u 1:2 w l lw 2 t 'rows per active expert', '' u 1:3 w l lw 2 t 'rows per expert (all)', "
               "8 dt 2 t '8/16/32/64', 16 dt 2 notitle, 32 dt 2 notitle, 64 dt 2 notitle\n");
    fprintf(p, "unset arrow\nunset logscale y\nset yrange [0:100]\nset ylabel 'percent'\n");
    if (x && x->compute_bound_at)
        fprintf(p, "set arrow from %d, graph 0 to %d, graph 1 nohead lw 2 dt 4\n"
                   "set label 'compute-bound' at %d, graph 0.9 left offset 1,0\n",
                x->compute_bound_at, x->compute_bound_at, x->compute_bound_at);
    fprintf(p, "plot ");
    gp_quoted(p, data);
    fprintf(p, " u 1:4 w l lw 2 t 'efficiency (%% of tensor rate)', '' u 1:5 w l lw 2 t 'tile rows wasted', "
               "'' u 1:6 w l lw 2 t 'bandwidth (%% of listed)'\n");
    fprintf(p, "unset multiplot\n");
    int rc = pclose(p);
    unlink(data);
    struct stat sb;
    if (rc == -1 || !WIFEXITED(rc) || WEXITSTATUS(rc) != 0) {
        fm_status s = fm_fail(FM_ERR_IO, "gnuplot (%s) failed with status %d writing '%s'", gp,
                              rc == -1 ? -1 : (WIFEXITED(rc) ? WEXITSTATUS(rc) : 128), part);
        fm_file_out_abort(&out);
        return s;
    }
    /* fstat of our descriptor: gnuplot's fopen("w") truncated and wrote the same file */
    if (fstat(out.fd, &sb) || sb.st_size == 0) {
        fm_status s = fm_fail(FM_ERR_IO, "gnuplot wrote nothing to '%s'", part);
        fm_file_out_abort(&out);
        return s;
    }
    return fm_file_out_commit(&out);
}
