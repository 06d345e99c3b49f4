/* test_sim_cli.c - `fp4moe simulate` end to end: JSON parsed with cJSON and
 * checked against closed forms, the CSV header against the JSON fields, the
 * sweep, exit code 2 with a specific message for bad settings, and the plot.
 * The CLI path comes from $FM_CLI (tests/sim.cmake sets it); without it the
 * test is skipped (77).
 */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

static fm_rng g_rng;
static const char *g_cli;

/* Run the CLI with args; stdout (and stderr when err) into *out; returns the exit code. */
static int run(const char *args, int err, char **out)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' simulate %s %s", g_cli, args, err ? "2>&1" : "2>/dev/null");
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += got;
        if (n + 1 == cap) buf = realloc(buf, cap *= 2);
    }
    buf[n] = 0;
    int rc = pclose(p);
    *out = buf;
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static double num(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!cJSON_IsNumber(v)) {
        print_error("JSON field '%s' missing or not a number\n", name);
        fail();
    }
    return v->valuedouble;
}

static void test_json_point(void **state)
{
    (void)state;
    static const struct { const char *name; int e, k; } k_models[] = {
        {"glm5", 256, 8}, {"deepseek-v3", 256, 8}, {"qwen3-235b", 128, 8}, {"gpt-oss-120b", 128, 4}};
    int mi = (int)(fm_rng_u64(&g_rng) % 4), mr = 1 + (int)(fm_rng_u64(&g_rng) % 300);
    int tps = 1 + (int)(fm_rng_u64(&g_rng) % 4), tp = (int)(fm_rng_u64(&g_rng) & 1);
    char args[256], *out;
    snprintf(args, sizeof args, "--model %s --gpus 8 --parallel %s --max-running-requests %d --tokens-per-step %d --json",
             k_models[mi].name, tp ? "tp" : "ep", mr, tps);
    assert_int_equal(run(args, 0, &out), 0);
    cJSON *root = cJSON_Parse(out);
    if (!root) {
        print_error("not JSON: %.300s\n", out);
        fail();
    }
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(root, "config");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(cfg, "model");
    assert_int_equal((int)num(model, "experts"), k_models[mi].e);
    assert_int_equal((int)num(model, "top_k"), k_models[mi].k);
    const cJSON *pts = cJSON_GetObjectItemCaseSensitive(root, "points");
    assert_int_equal(cJSON_GetArraySize(pts), 1);
    const cJSON *p = cJSON_GetArrayItem(pts, 0);
    int T = mr * tps, E = k_models[mi].e, k = k_models[mi].k;
    int loc = tp ? E : E / 8;
    double q = 1.0 - pow(1.0 - (double)k / E, T);
    assert_int_equal((int)num(p, "tokens"), T);
    assert_int_equal((int)num(p, "local_experts"), loc);
    assert_true(fabs(num(p, "rows_per_expert") - (double)T * k / E) < 1e-6 * T);
    assert_true(fabs(num(p, "active_experts") - loc * q) < 1e-6 * loc);
    assert_true(num(p, "layer_us") > 0 && num(p, "tokens_per_s") > 0);
    assert_true(num(p, "waste") >= 0 && num(p, "waste") < 1);
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, "crossings");
    assert_non_null(x);
    assert_true(num(x, "rows_8") >= 0);
    cJSON_Delete(root);
    free(out);
}

static void test_sweep_csv(void **state)
{
    (void)state;
    char *out;
    assert_int_equal(run("--model qwen3-235b --sweep --sweep-max 96 --csv", 0, &out), 0);
    /* header, then the sweep points 1 2 4 8 16 24 32 48 64 96 */
    char *save = NULL, *line = strtok_r(out, "\n", &save);
    assert_non_null(line);
    int cols = 1;
    for (char *c = line; *c; c++) cols += *c == ',';
    assert_non_null(strstr(line, "rows_per_active"));
    assert_non_null(strstr(line, "tokens_per_s"));
    static const int k_pts[] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96};
    int n = 0;
    while ((line = strtok_r(NULL, "\n", &save))) {
        int c2 = 1;
        for (char *c = line; *c; c++) c2 += *c == ',';
        assert_int_equal(c2, cols);
        assert_true(n < 10);
        assert_int_equal(atoi(line), k_pts[n]);
        n++;
    }
    assert_int_equal(n, 10);
    free(out);
}

static void test_bad_settings_exit_2(void **state)
{
    (void)state;
    static const struct { const char *args, *needle; } k_bad[] = {
        {"--topk 300", "top-k"},
        {"--gpus 0", "--gpus expects an integer in [1, 1024]"},
        {"--gpus 3", "EP degree 3 does not divide the 256 experts"},
        {"--model nope", "unknown model"},
        {"--gpu nope", "unknown GPU"},
        {"--parallel dp", "ep or tp"},
        {"--skew 7", "skew"},
        {"--max-running-requests 0", "--max-running-requests"},
        {"--frobnicate", "unknown flag"},
        {"--csv --json", "exclusive"},
        {"--hidden 6150", "block"},
        {"--measured ''", "--measured expects a file name"}, /* not FM_ERR_IO "': cannot open", exit 1 */
        {"--validate ''", "--validate expects a file name"},
    };
    for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
        char *out;
        int rc = run(k_bad[i].args, 1, &out);
        if (rc != 2 || !strstr(out, k_bad[i].needle)) {
            print_error("'%s': exit %d, output '%s' (want 2 and '%s')\n", k_bad[i].args, rc, out, k_bad[i].needle);
            fail();
        }
        free(out);
    }
}

/* Issue 15: every numeric flag's range is one row of fm_sim_range_get: a value
 * just outside is exit 2 with a message stating that very range (--launch-us 1e7
 * used to say "must be finite, >= 0" with a limit of 1e6 and a help of 1e9), the
 * help prints the row, and docs/simulate.md's table has it. */
static void test_flag_ranges(void **state)
{
    (void)state;
    char *help;
    assert_int_equal(run("--help", 0, &help), 0);
    const char *src = getenv("FM_SOURCE_DIR");
    char *doc = NULL;
    if (src) {
        char path[1024];
        snprintf(path, sizeof path, "%s/docs/simulate.md", src);
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        doc = calloc(1, 1 << 20);
        assert_true(fread(doc, 1, (1 << 20) - 1, f) > 0);
        fclose(f);
    } else {
        printf("# FM_SOURCE_DIR unset: docs/simulate.md not compared\n");
    }
    for (int i = 0; i < FM_SIM_SET_COUNT; i++) {
        const fm_sim_range *r = fm_sim_range_get((fm_sim_setting)i);
        assert_non_null(r);
        char rng[80], args[160], row[200], *out;
        snprintf(rng, sizeof rng, "[%.10g, %.10g]", r->lo, r->hi);
        /* above the top, and below the bottom (half of it for a fractional one) */
        double bad[2] = {r->integer ? r->hi + 1 : r->hi * 2 + 1, r->lo > 0 && !r->integer ? r->lo / 2 : r->lo - 1};
        for (int b = 0; b < 2; b++) {
            snprintf(args, sizeof args, "%s %.17g", r->flag, bad[b]);
            int rc = run(args, 1, &out);
            if (rc != 2 || !strstr(out, r->flag) || !strstr(out, rng)) {
                print_error("'%s': exit %d, '%s' (want 2 naming %s and %s)\n", args, rc, out, r->flag, rng);
                fail();
            }
            free(out);
        }
        char *h = strstr(help, r->flag);
        if (!h || !strstr(h, rng)) {
            print_error("--help lacks '%s %s'\n", r->flag, rng);
            fail();
        }
        snprintf(row, sizeof row, "| `%s` | %.10g | %.10g |", r->flag, r->lo, r->hi);
        if (doc && !strstr(doc, row)) {
            print_error("docs/simulate.md lacks the row '%s'\n", row);
            fail();
        }
    }
    free(help);
    free(doc);
    /* the cases, and efficiencies that used to print "inf us" and "-nan" */
    static const char *const k_bad[] = {"--launch-us 1e7", "--bw-eff 1e-307", "--compute-eff 1e-307",
                                        "--bw-eff nan", "--launch-us inf", "--tile-m 2000"};
    for (size_t i = 0; i < sizeof k_bad / sizeof *k_bad; i++) {
        char *out;
        int rc = run(k_bad[i], 1, &out);
        if (rc != 2 || strstr(out, "inf us") || strstr(out, "-nan") || strstr(out, "tokens/s")) {
            print_error("'%s': exit %d, '%s' (want 2 and no report)\n", k_bad[i], rc, out);
            fail();
        }
        free(out);
    }
}

/* --validate reads only the GPU, kernel, tile, efficiencies, launch cost and
 * format: model, cluster, serving and routing flags are refused, not ignored. */
static void test_validate_ignored_flags(void **state)
{
    (void)state;
    const char *src = getenv("FM_SOURCE_DIR");
    if (!src) skip();
    static const char *const k_flags[] = {"--mc 10", "--skew 1", "--max-running-requests 8", "--gpus 4",
                                          "--parallel tp", "--experts 128", "--tokens-per-step 2", "--sweep-max 8"};
    for (size_t i = 0; i < sizeof k_flags / sizeof *k_flags; i++) {
        char args[512], *out;
        snprintf(args, sizeof args, "--validate '%s/bench/h200_fp4moe_gemm.csv' %s", src, k_flags[i]);
        int rc = run(args, 1, &out);
        char flag[32];
        snprintf(flag, sizeof flag, "%.*s", (int)strcspn(k_flags[i], " "), k_flags[i]);
        if (rc != 2 || !strstr(out, "--validate") || !strstr(out, flag)) {
            print_error("'%s': exit %d, '%s' (want 2 naming %s)\n", args, rc, out, flag);
            fail();
        }
        free(out);
    }
    char args[512], *out;
    snprintf(args, sizeof args, "--validate '%s/bench/h200_fp4moe_gemm.csv' --kernel fp4moe --launch-us 4 --tile-m 64",
             src);
    assert_int_equal(run(args, 0, &out), 0);
    free(out);
}

/* Issue 15: `--mc 100000 --max-running-requests 65536 --tokens-per-step 16` was
 * accepted and ran ~11 h in silence.  Settings whose estimated work exceeds the
 * bound are refused up front (exit 2, the estimate and what to lower); `timeout`
 * turns a run that starts the work into exit 124. */
static void test_work_refused(void **state)
{
    (void)state;
    static const struct {
        const char *args, *needle;
    } k_cases[] = {
        {"--mc 100000 --max-running-requests 65536 --tokens-per-step 16", "--mc"},
        {"--mc 100000 --max-running-requests 65536 --tokens-per-step 16 --sweep", "--mc"},
        {"--experts 1024 --topk 1000 --skew 2 --gpus 1", "--topk"},
    };
    for (size_t i = 0; i < sizeof k_cases / sizeof *k_cases; i++) {
        char args[256], *out;
        snprintf(args, sizeof args, "%s", k_cases[i].args);
        char cmd[512];
        snprintf(cmd, sizeof cmd, "timeout 60 '%s' simulate %s 2>&1", g_cli, args);
        FILE *p = popen(cmd, "r");
        assert_non_null(p);
        out = calloc(1, 8192);
        size_t n = fread(out, 1, 8191, p);
        (void)n;
        int rc = pclose(p);
        rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
        if (rc != 2 || !strstr(out, "refusing about") || !strstr(out, k_cases[i].needle) ||
            !strstr(out, "the limit is 10 min")) {
            print_error("'%s': exit %d, '%s' (want 2: refusing ... %s)\n", args, rc, out, k_cases[i].needle);
            fail();
        }
        free(out);
    }
}

static void test_plot(void **state)
{
    (void)state;
    char dir[] = "/tmp/fm-sim-cli-XXXXXX", png[128], args[256], *out;
    assert_non_null(mkdtemp(dir));
    snprintf(png, sizeof png, "%s/sim.png", dir);
    snprintf(args, sizeof args, "--sweep-max 64 --plot %s", png);
    setenv("FM_GNUPLOT", "/nonexistent/gnuplot", 1);
    int rc = run(args, 1, &out);
    unsetenv("FM_GNUPLOT");
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "gnuplot not found"));
    free(out);
    struct stat sb;
    assert_int_not_equal(stat(png, &sb), 0);
    if (system("command -v gnuplot >/dev/null 2>&1") == 0) {
        assert_int_equal(run(args, 1, &out), 0);
        free(out);
        assert_int_equal(stat(png, &sb), 0);
        FILE *f = fopen(png, "rb");
        unsigned char magic[8];
        assert_int_equal(fread(magic, 1, 8, f), 8);
        fclose(f);
        assert_memory_equal(magic, "\x89PNG\r\n\x1a\n", 8);
        unlink(png);
    } else {
        printf("# gnuplot absent: only the failure path was checked\n");
    }
    rmdir(dir);
}

/* Issue 15: a --plot path with a quote exited 1.  Quotes and backslashes are
 * quoted into gnuplot's script (the PNG lands at exactly that path); a newline
 * cannot be and is a usage error (exit 2), before any work. */
static void test_plot_special_paths(void **state)
{
    (void)state;
    char *out;
    assert_int_equal(run("--sweep-max 16 --plot \"$(printf '/tmp/fm-sim-x\\nnl.png')\"", 1, &out), 2);
    assert_non_null(strstr(out, "--plot"));
    assert_non_null(strstr(out, "newline"));
    assert_null(strstr(out, "model ")); /* refused before the text report */
    free(out);
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        printf("# gnuplot absent: the quoted-path case needs it\n");
        return;
    }
    char dir[] = "/tmp/fm-sim-cli-XXXXXX", png[256], args[512];
    assert_non_null(mkdtemp(dir));
    snprintf(png, sizeof png, "%s/it's a \\back'slash %d.png", dir, (int)(fm_rng_u64(&g_rng) % 1000));
    /* the shell's "..." keeps ' and \ (a backslash before b or s stays) */
    snprintf(args, sizeof args, "--sweep-max 16 --plot \"%s\"", png);
    int rc = run(args, 1, &out);
    if (rc != 0) {
        print_error("'%s': exit %d, '%s'\n", args, rc, out);
        fail();
    }
    free(out);
    struct stat sb;
    assert_int_equal(stat(png, &sb), 0);
    assert_true(sb.st_size > 8);
    unlink(png);
    rmdir(dir);
}

/* An unwritable plot path: exit 1 naming the path, and no PNG on stdout (gnuplot
 * falls back to stdout when `set output` fails; it used to pour the image there). */
static void test_plot_unwritable(void **state)
{
    (void)state;
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        printf("# gnuplot absent: the unwritable-path case needs it to start\n");
        return;
    }
    char dir[] = "/tmp/fm-sim-cli-XXXXXX", args[256], *out;
    assert_non_null(mkdtemp(dir));
    snprintf(args, sizeof args, "--sweep-max %d --plot %s/no/such/dir/x.png",
             8 + (int)(fm_rng_u64(&g_rng) % 64), dir);
    assert_int_equal(run(args, 0, &out), 1);
    if (strstr(out, "PNG") || strstr(out, "IHDR")) {
        print_error("PNG bytes on stdout: %.200s\n", out);
        fail();
    }
    free(out);
    assert_int_equal(run(args, 1, &out), 1);
    assert_non_null(strstr(out, "FM_ERR_IO"));
    assert_non_null(strstr(out, "/no/such/dir/x.png"));
    free(out);
    rmdir(dir);
}

/* A --plot path that is a symbolic link, a FIFO or a read-only file (issue 30): exit 1
 * naming it, left as it was (the old writer renamed its .part file over it). */
static void test_plot_refused_targets(void **state)
{
    (void)state;
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        printf("# gnuplot absent: the refusals come after the gnuplot look-up\n");
        return;
    }
    char dir[] = "/tmp/fm-sim-cli-XXXXXX", p[3][64], tgt[64], args[256], *out;
    assert_non_null(mkdtemp(dir));
    snprintf(tgt, sizeof tgt, "%s/target", dir);
    FILE *f = fopen(tgt, "w");
    assert_non_null(f);
    fputs("keep", f);
    fclose(f);
    snprintf(p[0], sizeof p[0], "%s/link.png", dir);
    snprintf(p[1], sizeof p[1], "%s/fifo.png", dir);
    snprintf(p[2], sizeof p[2], "%s/ro.png", dir);
    assert_int_equal(symlink(tgt, p[0]), 0);
    assert_int_equal(mkfifo(p[1], 0666), 0);
    f = fopen(p[2], "w");
    assert_non_null(f);
    fputs("old", f);
    fclose(f);
    assert_int_equal(chmod(p[2], 0444), 0);
    const char *why[3] = {"symbolic link", "FIFO", "read-only"};
    for (int i = 0; i < 3; i++) {
        snprintf(args, sizeof args, "--sweep-max 16 --plot %s", p[i]);
        int rc = run(args, 1, &out);
        if (rc != 1 || !strstr(out, "FM_ERR_IO") || !strstr(out, p[i]) || !strstr(out, why[i])) {
            print_error("'%s': exit %d, '%s' (want 1 naming it, %s)\n", args, rc, out, why[i]);
            fail();
        }
        free(out);
    }
    struct stat sb;
    assert_int_equal(lstat(p[0], &sb), 0);
    assert_true(S_ISLNK(sb.st_mode));
    assert_int_equal(lstat(p[1], &sb), 0);
    assert_true(S_ISFIFO(sb.st_mode));
    assert_int_equal(lstat(p[2], &sb), 0);
    assert_true(S_ISREG(sb.st_mode) && sb.st_size == 3);
    assert_int_equal(lstat(tgt, &sb), 0);
    assert_true(sb.st_size == 4);
    for (int i = 0; i < 3; i++) unlink(p[i]);
    unlink(tgt);
    assert_int_equal(rmdir(dir), 0); /* nothing else left (no temporary) */
}

int main(void)
{
    g_cli = getenv("FM_CLI");
    if (!g_cli || access(g_cli, X_OK)) {
        printf("skipped: FM_CLI does not name the fp4moe binary\n");
        return 77;
    }
    fm_rng_init(&g_rng, fm_test_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_point),
        cmocka_unit_test(test_sweep_csv),
        cmocka_unit_test(test_bad_settings_exit_2),
        cmocka_unit_test(test_plot),
        cmocka_unit_test(test_plot_unwritable),
        cmocka_unit_test(test_plot_refused_targets),
        cmocka_unit_test(test_flag_ranges),
        cmocka_unit_test(test_work_refused),
        cmocka_unit_test(test_validate_ignored_flags),
        cmocka_unit_test(test_plot_special_paths),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
