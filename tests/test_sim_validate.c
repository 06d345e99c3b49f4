/* test_sim_validate.c - the roofline against measured tables (src/sim/validate.c).
 *
 * 1. Each prediction equals the roofline written out independently here
 *    (weights at 4.5 bits/element for NVFP4 = 4-bit values + one E4M3 byte per
 *    16, BF16 activations in and out, rows padded to --tile-m) for random shapes,
 *    rows and efficiencies; the errors and the per-regime summary follow.
 * 2. A table generated from that roofline at known efficiencies is fitted back
 *    to them (grid 0.005).
 * 3. The committed bench/h200_fp4moe_gemm.csv fits to the efficiencies that
 *    --calibrated-h200 ships (so regenerating the CSV without refitting fails
 *    here), and they beat the defaults on it.
 * 4. Bad input: NULL, no rows for the GPU or format, too little room.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

static fm_rng g_rng;

static fm_sim_measured *load_text(const char *text)
{
    char *path = fm_test_write_tmp("sim-val", text);
    fm_sim_measured *m = NULL;
    assert_int_equal(fm_sim_measured_load(path, &m), FM_OK);
    unlink(path);
    return m;
}

/* The roofline of docs/simulate.md for `e` experts of N x K with `r` rows each. */
static double roofline(const fm_sim_config *c, int e, int n, int k, int r, int tile_m)
{
    double wbytes = (double)e * n * k * (0.5 + 1.0 / 16); /* NVFP4 values + E4M3 scales */
    double abytes = (double)e * r * (n + k) * 2.0;
    double issued = 2.0 * n * k * e * ceil((double)r / tile_m) * tile_m;
    double mem = (wbytes + abytes) / (c->gpu.mem_gbs * 1e9 * c->bw_eff);
    double cmp = issued / (c->gpu.bf16_tflops * 1e12 * c->compute_eff); /* H200: no FP4 MMA */
    return fmax(mem, cmp) * 1e6 + c->launch_us;
}

#define NPTS 24

static void test_prediction_closed_form(void **state)
{
    (void)state;
    fm_sim_config c;
    fm_sim_config_default(&c);
    c.bw_eff = 0.3 + 0.7 * fm_rng_uniform(&g_rng);
    c.compute_eff = 0.1 + 0.9 * fm_rng_uniform(&g_rng);
    c.launch_us = 10 * fm_rng_uniform(&g_rng);
    c.tile_m = 8 << (fm_rng_u64(&g_rng) % 5);
    char text[8192] = "gpu,format,gemm,experts,n,k,rows_per_expert,us\nb200,nvfp4,fc1,8,64,64,4,1\n";
    int e[NPTS], n[NPTS], k[NPTS], r[NPTS];
    double us[NPTS];
    for (int i = 0; i < NPTS; i++) {
        e[i] = 1 + (int)(fm_rng_u64(&g_rng) % 256);
        n[i] = 16 * (1 + (int)(fm_rng_u64(&g_rng) % 512));
        k[i] = 16 * (1 + (int)(fm_rng_u64(&g_rng) % 512));
        r[i] = 1 + (int)(fm_rng_u64(&g_rng) % 1024);
        us[i] = 10 + 1000 * fm_rng_uniform(&g_rng);
        size_t len = strlen(text);
        snprintf(text + len, sizeof text - len, "H200,nvfp4,g%d,%d,%d,%d,%d,%.9g\n", i, e[i], n[i], k[i], r[i], us[i]);
    }
    fm_sim_measured *m = load_text(text);
    fm_sim_check_point p[NPTS + 1];
    fm_sim_check_summary s;
    int got = -1;
    assert_int_equal(fm_sim_validate(&c, m, p, NPTS + 1, &got, &s), FM_OK);
    assert_int_equal(got, NPTS); /* the b200 row is another GPU's */
    double abs_err[FM_SIM_REGIMES + 1][NPTS];
    int cnt[FM_SIM_REGIMES + 1] = {0};
    for (int i = 0; i < NPTS; i++) {
        assert_int_equal(p[i].meas.experts, e[i]);
        assert_int_equal(p[i].tile_m, c.tile_m);
        double want = roofline(&c, e[i], n[i], k[i], r[i], c.tile_m);
        assert_true(fabs(p[i].pred_us - want) <= 1e-9 * want);
        assert_true(fabs(p[i].meas.us - us[i]) <= 1e-8 * us[i]); /* printed with 9 digits */
        double meas = p[i].meas.us;
        assert_true(fabs(p[i].rel_err - (want - meas) / meas) <= 1e-9 * fmax(1, fabs(p[i].rel_err)));
        assert_int_equal(p[i].bound == FM_SIM_COMPUTE_BOUND, p[i].compute_us > p[i].mem_us);
        int g = r[i] <= 32 ? 0 : r[i] <= 256 ? 1 : 2;
        abs_err[g][cnt[g]++] = fabs(p[i].rel_err);
        abs_err[FM_SIM_REGIMES][cnt[FM_SIM_REGIMES]++] = fabs(p[i].rel_err);
    }
    for (int g = 0; g <= FM_SIM_REGIMES; g++) {
        assert_int_equal(s.n[g], cnt[g]);
        if (!cnt[g]) continue;
        double mx = 0;
        int below = 0, above = 0; /* the median splits the points in half */
        for (int i = 0; i < cnt[g]; i++) {
            mx = fmax(mx, abs_err[g][i]);
            below += abs_err[g][i] <= s.median_abs[g] + 1e-12;
            above += abs_err[g][i] >= s.median_abs[g] - 1e-12;
        }
        assert_true(fabs(s.max_abs[g] - mx) < 1e-12);
        assert_true(2 * below >= cnt[g] && 2 * above >= cnt[g]);
    }
    fm_sim_measured_free(m);
}

static void test_fit_recovers(void **state)
{
    (void)state;
    fm_sim_config c;
    fm_sim_config_default(&c);
    c.kernel = FM_SIM_KERNEL_FP4MOE;
    /* true efficiencies on the fit's grid; points on both sides of the ridge */
    c.bw_eff = 0.005 * (60 + (int)(fm_rng_u64(&g_rng) % 100));
    c.compute_eff = 0.005 * (30 + (int)(fm_rng_u64(&g_rng) % 100));
    double truth_bw = c.bw_eff, truth_ce = c.compute_eff;
    static const int k_rows[] = {1, 2, 4, 8, 64, 128, 256, 512, 1024};
    char text[4096] = "gpu,format,gemm,experts,n,k,rows_per_expert,us\n";
    for (size_t i = 0; i < sizeof k_rows / sizeof k_rows[0]; i++) {
        int r = k_rows[i], tile = r <= 8 ? 8 : 64; /* the swap-AB passes these rows take */
        size_t len = strlen(text);
        snprintf(text + len, sizeof text - len, "h200,nvfp4,fc1,32,4096,6144,%d,%.12g\n", r,
                 roofline(&c, 32, 4096, 6144, r, tile));
    }
    fm_sim_measured *m = load_text(text);
    c.bw_eff = c.compute_eff = 0.85; /* the fit must not start from the truth */
    double bw = -1, ce = -1;
    assert_int_equal(fm_sim_fit_eff(&c, m, &bw, &ce), FM_OK);
    assert_true(fabs(bw - truth_bw) < 1e-9);
    assert_true(fabs(ce - truth_ce) < 1e-9);
    fm_sim_measured_free(m);
}

/* The fit's prefix/suffix search (issue 15: the plain scan took 0.44 ms a CSV
 * row) against that plain scan, written out here: 40,000 grid pairs, a log per
 * point, first of equals.  Random shapes, rows and noise put points on both
 * sides of the ridge at most pairs. */
static void test_fit_matches_scan(void **state)
{
    (void)state;
    fm_sim_config c;
    fm_sim_config_default(&c);
    c.kernel = FM_SIM_KERNEL_FP4MOE;
    c.launch_us = 1 + (double)(fm_rng_u64(&g_rng) % 10);
    static const int k_shapes[][2] = {{4096, 6144}, {6144, 2048}, {512, 6144}, {6144, 256}};
    static char text[1 << 16];
    strcpy(text, "gpu,format,gemm,experts,n,k,rows_per_expert,us\n");
    int npts = 30 + (int)(fm_rng_u64(&g_rng) % 60);
    for (int i = 0; i < npts; i++) {
        const int *sh = k_shapes[fm_rng_u64(&g_rng) % 4];
        int e = 1 + (int)(fm_rng_u64(&g_rng) % 256), r = 1 + (int)(fm_rng_u64(&g_rng) % 1024);
        int tile = r <= 8 ? 8 : r <= 16 ? 16 : r <= 32 ? 32 : 64;
        double us = roofline(&c, e, sh[0], sh[1], r, tile) * (0.5 + 1.5 * fm_rng_uniform(&g_rng));
        size_t len = strlen(text);
        snprintf(text + len, sizeof text - len, "h200,nvfp4,g%d,%d,%d,%d,%d,%.12g\n", i, e, sh[0], sh[1], r, us);
    }
    fm_sim_measured *m = load_text(text);
    /* the roofline terms at efficiency 1, from the validation itself */
    fm_sim_config one = c;
    one.bw_eff = one.compute_eff = 1.0;
    fm_sim_check_point *p = calloc((size_t)npts, sizeof *p);
    int n = 0;
    assert_int_equal(fm_sim_validate(&one, m, p, npts, &n, NULL), FM_OK);
    assert_int_equal(n, npts);
    double best = INFINITY, bb = 0, bc = 0;
    for (int i = 1; i <= 200; i++)
        for (int j = 1; j <= 200; j++) {
            double be = 0.005 * i, ce = 0.005 * j, err = 0;
            for (int q = 0; q < n; q++)
                err += fabs(log((fmax(p[q].mem_us / be, p[q].compute_us / ce) + c.launch_us) / p[q].meas.us));
            if (err < best - 1e-12) {
                best = err;
                bb = be;
                bc = ce;
            }
        }
    double bw = -1, ce = -1;
    assert_int_equal(fm_sim_fit_eff(&c, m, &bw, &ce), FM_OK);
    if (fabs(bw - bb) > 1e-12 || fabs(ce - bc) > 1e-12) {
        print_error("fit %.3f / %.3f, plain scan %.3f / %.3f (%d points)\n", bw, ce, bb, bc, n);
        fail();
    }
    free(p);
    fm_sim_measured_free(m);
}

/* Issue 15: a prediction that overflows (a caller's GPU figures so small that
 * the times pass 1e308) is FM_ERR_NONFINITE, not a table of "inf". */
static void test_nonfinite(void **state)
{
    (void)state;
    fm_sim_config c;
    fm_sim_config_default(&c);
    c.gpu.mem_gbs = 1e-307 * (1 + (double)(fm_rng_u64(&g_rng) % 50));
    fm_sim_measured *m = load_text("gpu,format,gemm,experts,n,k,rows_per_expert,us\nh200,nvfp4,fc1,32,4096,6144,8,125\n");
    fm_sim_check_point p[2];
    fm_poison_bytes(p, sizeof p);
    int n = -7;
    assert_int_equal(fm_sim_validate(&c, m, p, 2, &n, NULL), FM_ERR_NONFINITE);
    assert_non_null(strstr(fm_last_error(), "too small"));
    assert_int_equal(n, -7);
    double bw = -1, ce = -1;
    assert_int_equal(fm_sim_fit_eff(&c, m, &bw, &ce), FM_ERR_NONFINITE);
    assert_true(bw == -1 && ce == -1);
    fm_sim_measured_free(m);
}

static void test_bench_table(void **state)
{
    (void)state;
    const char *src = getenv("FM_SOURCE_DIR");
    if (!src) skip();
    char path[1024];
    snprintf(path, sizeof path, "%s/bench/h200_fp4moe_gemm.csv", src);
    fm_sim_measured *m = NULL;
    assert_int_equal(fm_sim_measured_load(path, &m), FM_OK);
    fm_sim_config c;
    fm_sim_config_default(&c);
    c.kernel = FM_SIM_KERNEL_FP4MOE;
    double bw, ce;
    assert_int_equal(fm_sim_fit_eff(&c, m, &bw, &ce), FM_OK);
    if (fabs(bw - FM_SIM_H200_FP4MOE_BW_EFF) > 1e-6 || fabs(ce - FM_SIM_H200_FP4MOE_COMPUTE_EFF) > 1e-6) {
        print_error("bench/h200_fp4moe_gemm.csv fits bw_eff %.3f compute_eff %.3f but sim.h ships %.3f / %.3f: "
                    "update FM_SIM_H200_FP4MOE_* and docs/simulate.md\n",
                    bw, ce, FM_SIM_H200_FP4MOE_BW_EFF, FM_SIM_H200_FP4MOE_COMPUTE_EFF);
        fail();
    }
    int cap = fm_sim_measured_rows(m), n = 0;
    fm_sim_check_point *p = malloc(sizeof *p * (size_t)cap);
    fm_sim_check_summary def, cal;
    assert_int_equal(fm_sim_validate(&c, m, p, cap, &n, &def), FM_OK);
    assert_true(n >= 4);
    c.bw_eff = bw;
    c.compute_eff = ce;
    assert_int_equal(fm_sim_validate(&c, m, p, cap, &n, &cal), FM_OK);
    assert_true(cal.median_abs[FM_SIM_REGIMES] < def.median_abs[FM_SIM_REGIMES]);
    free(p);
    fm_sim_measured_free(m);
}

static void test_errors(void **state)
{
    (void)state;
    fm_sim_measured *m = load_text("gpu,format,gemm,experts,n,k,rows_per_expert,us\n"
                                   "h200,nvfp4,fc1,32,4096,6144,1,150\n"
                                   "h200,nvfp4,fc2,32,6144,2048,1,90\n");
    fm_sim_config c;
    fm_sim_config_default(&c);
    fm_sim_check_point p[2], sentinel;
    fm_poison_bytes(p, sizeof p);
    memcpy(&sentinel, &p[0], sizeof sentinel);
    fm_sim_check_summary s;
    int n = 0;
    assert_int_equal(fm_sim_validate(&c, NULL, p, 2, &n, &s), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_sim_validate(NULL, m, p, 2, &n, &s), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_sim_validate(&c, m, NULL, 2, &n, &s), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_sim_validate(&c, m, p, 1, &n, &s), FM_ERR_INVALID_ARG);
    assert_int_equal(n, 2); /* says how many it needs */
    assert_non_null(strstr(fm_last_error(), "room for 1"));
    assert_memory_equal(&p[0], &sentinel, sizeof sentinel);
    c.model.wfmt = FM_FORMAT_MXFP4;
    assert_int_equal(fm_sim_validate(&c, m, p, 2, &n, &s), FM_ERR_NOT_FOUND);
    assert_non_null(strstr(fm_last_error(), "mxfp4"));
    fm_sim_config_default(&c);
    const fm_gpu_info *g = NULL;
    assert_int_equal(fm_gpu_find("b200", &g), FM_OK);
    c.gpu = *g;
    assert_int_equal(fm_sim_validate(&c, m, p, 2, &n, &s), FM_ERR_NOT_FOUND);
    assert_non_null(strstr(fm_last_error(), "b200"));
    double bw = -1, ce = -1;
    assert_int_equal(fm_sim_fit_eff(&c, m, &bw, &ce), FM_ERR_NOT_FOUND);
    assert_true(bw == -1 && ce == -1);
    fm_sim_config_default(&c);
    c.gpus = 0; /* the config is checked first */
    assert_int_equal(fm_sim_validate(&c, m, p, 2, &n, &s), FM_ERR_INVALID_ARG);
    assert_memory_equal(&p[0], &sentinel, sizeof sentinel);
    fm_sim_measured_point mp;
    assert_int_equal(fm_sim_measured_get(m, 2, &mp), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_sim_measured_get(m, -1, &mp), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_sim_measured_get(m, 1, &mp), FM_OK);
    assert_string_equal(mp.gemm, "fc2");
    assert_int_equal(mp.n, 6144);
    fm_sim_measured_free(m);
}

int main(void)
{
    fm_rng_init(&g_rng, fm_test_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prediction_closed_form),
        cmocka_unit_test(test_fit_recovers),
        cmocka_unit_test(test_fit_matches_scan),
        cmocka_unit_test(test_nonfinite),
        cmocka_unit_test(test_bench_table),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
