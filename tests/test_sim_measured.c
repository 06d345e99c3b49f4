/* test_sim_measured.c - the measured grouped-GEMM table: parsing, errors with
 * file:line, interpolation, and the simulator's use of it.
 *
 * With a per-expert time that is linear in rows, f(r) = a + b r for r >= 1,
 * interpolation is exact and the expected GEMM time has a closed form:
 * E[sum_e f(c_e) 1{c_e > 0}] = a * active + b * rows.  The simulator must hit
 * it to 1e-9 relative.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

static fm_rng g_rng;

static void test_interpolation(void **state)
{
    (void)state;
    double u1 = 50 + 100 * fm_rng_uniform(&g_rng), u8 = u1 * (1 + fm_rng_uniform(&g_rng));
    double u32 = u8 * (1 + fm_rng_uniform(&g_rng));
    char text[1024];
    snprintf(text, sizeof text,
             "# measured on the H200\n"
             "gpu,format,gemm,experts,n,k,rows_per_expert,us\n"
             "\n"
             "h200,nvfp4,fc1,32,4096,6144,8,%.9g\n"
             "H200, NVFP4 ,fc1,32,4096,6144,1,%.9g\n"
             "h200,nvfp4,fc1,16,4096,6144,32,%.9g\n"
             "h200,nvfp4,fc1,32,4096,6144,32,%.9g\n"
             "h200,mxfp4,fc1,32,4096,6144,1,1\n",
             u8 * 32, u1 * 32, u32 * 16, u32 * 32);
    char *path = fm_test_write_tmp("sim-meas", text);
    fm_sim_measured *m = NULL;
    assert_int_equal(fm_sim_measured_load(path, &m), FM_OK);
    unlink(path);
    assert_int_equal(fm_sim_measured_rows(m), 5);
    double us;
    assert_int_equal(fm_sim_measured_us(m, "h200", FM_FORMAT_NVFP4, 4096, 6144, 1, &us), FM_OK);
    assert_true(fabs(us - u1) < 1e-6 * u1);
    assert_int_equal(fm_sim_measured_us(m, "h200", FM_FORMAT_NVFP4, 4096, 6144, 4.5, &us), FM_OK);
    assert_true(fabs(us - (u1 + (u8 - u1) * 0.5)) < 1e-6 * u8); /* linear between 1 and 8 */
    assert_int_equal(fm_sim_measured_us(m, "h200", FM_FORMAT_NVFP4, 4096, 6144, 32, &us), FM_OK);
    assert_true(fabs(us - u32) < 1e-6 * u32); /* two rows at 32, both per expert u32 */
    assert_int_equal(fm_sim_measured_us(m, "h200", FM_FORMAT_NVFP4, 4096, 6144, 56, &us), FM_OK);
    double slope = (u32 - u8) / 24;
    assert_true(fabs(us - (u32 + slope * 24)) < 1e-6 * us); /* extended along the last segment */
    assert_int_equal(fm_sim_measured_us(m, "h200", FM_FORMAT_NVFP4, 4096, 6144, 0, &us), FM_OK);
    assert_true(us == 0);
    assert_int_equal(fm_sim_measured_us(m, "h200", FM_FORMAT_NVFP4, 4096, 2048, 1, &us), FM_ERR_NOT_FOUND);
    assert_int_equal(fm_sim_measured_us(m, "b200", FM_FORMAT_NVFP4, 4096, 6144, 1, &us), FM_ERR_NOT_FOUND);
    assert_int_equal(fm_sim_measured_us(m, "h200", FM_FORMAT_NVFP4, 4096, 6144, -1, &us), FM_ERR_INVALID_ARG);
    fm_sim_measured_free(m);
}

static void test_bad_files(void **state)
{
    (void)state;
    static const struct {
        const char *text, *needle;
    } k_bad[] = {
        {"", "empty"},
        {"gpu,format,n,k,us\nh200,nvfp4,1,1,1\n", "header"},
        {"gpu,format,gemm,experts,n,k,rows_per_expert,us\n", "no rows"},
        {"gpu,format,gemm,experts,n,k,rows_per_expert,us\nh200,nvfp4,fc1,32,4096,6144,8\n", ":2:"},
        {"gpu,format,gemm,experts,n,k,rows_per_expert,us\nh200,nvfp4,fc1,32,4096,6144,8,1,2\n", "8 comma"},
        {"gpu,format,gemm,experts,n,k,rows_per_expert,us\nh200,fp3,fc1,32,4096,6144,8,1\n", "format 'fp3'"},
        {"gpu,format,gemm,experts,n,k,rows_per_expert,us\n#\nh200,nvfp4,fc1,0,4096,6144,8,1\n", ":3: experts"},
        {"gpu,format,gemm,experts,n,k,rows_per_expert,us\nh200,nvfp4,fc1,32,4096,6144,8,-1\n", "us '-1'"},
        {"gpu,format,gemm,experts,n,k,rows_per_expert,us\nh200,nvfp4,fc1,32,4096,6144,0,5\n", "rows_per_expert"},
        {"gpu,format,gemm,experts,n,k,rows_per_expert,us\nh200,nvfp4,fc1,32,4096,6144,8,nan\n", "us 'nan'"},
    };
    for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
        char *path = fm_test_write_tmp("sim-meas", k_bad[i].text);
        fm_sim_measured *m = (fm_sim_measured *)0x1;
        fm_status st = fm_sim_measured_load(path, &m);
        unlink(path);
        if (st != FM_ERR_FORMAT || !strstr(fm_last_error(), k_bad[i].needle)) {
            print_error("case %zu: %s '%s' (want FM_ERR_FORMAT with '%s')\n", i, fm_status_name(st), fm_last_error(),
                        k_bad[i].needle);
            fail();
        }
        assert_ptr_equal(m, (fm_sim_measured *)0x1); /* untouched */
    }
    fm_sim_measured *m = NULL;
    assert_int_equal(fm_sim_measured_load("/nonexistent/x.csv", &m), FM_ERR_IO);
    assert_int_equal(fm_sim_measured_load(NULL, &m), FM_ERR_INVALID_ARG);
}

/* The simulator with a linear measured table against the closed form. */
static void test_sim_uses_table(void **state)
{
    (void)state;
    fm_sim_config c;
    fm_sim_config_default(&c);
    c.max_running = 1 + (int)(fm_rng_u64(&g_rng) % 400);
    c.parallel = fm_rng_u64(&g_rng) & 1 ? FM_PARALLEL_TP : FM_PARALLEL_EP;
    fm_sim_result roof;
    assert_int_equal(fm_sim_run(&c, &roof), FM_OK);
    double a[2], b[2];
    char text[2048];
    int len = snprintf(text, sizeof text, "gpu,format,gemm,experts,n,k,rows_per_expert,us\n");
    int nn[2] = {roof.fc1_n, roof.fc2_n}, kk[2] = {roof.fc1_k, roof.fc2_k};
    for (int j = 0; j < 2; j++) {
        a[j] = 1 + 10 * fm_rng_uniform(&g_rng);
        b[j] = 0.01 + 0.1 * fm_rng_uniform(&g_rng);
        for (int r = 1; r <= 4096; r *= 4) /* the last segment's slope carries beyond 4096 */
            len += snprintf(text + len, sizeof text - len, "h200,nvfp4,fc%d,8,%d,%d,%d,%.12g\n", j + 1, nn[j], kk[j],
                            r, 8 * (a[j] + b[j] * r));
    }
    char *path = fm_test_write_tmp("sim-meas", text);
    fm_sim_measured *m = NULL;
    assert_int_equal(fm_sim_measured_load(path, &m), FM_OK);
    unlink(path);
    c.measured = m;
    fm_sim_result r;
    assert_int_equal(fm_sim_run(&c, &r), FM_OK);
    assert_int_equal(r.measured, 1);
    double rows = r.rows_per_expert * r.local_experts;
    double want1 = a[0] * r.active_experts + b[0] * rows, want2 = a[1] * r.active_experts + b[1] * rows;
    assert_true(fabs(r.fc1_us - want1) < 1e-9 * want1);
    assert_true(fabs(r.fc2_us - want2) < 1e-9 * want2);
    /* a table for another GPU: a clear NOT_FOUND, not a silent roofline */
    c.gpu.name = "b200";
    fm_sim_result r2;
    fm_poison_bytes(&r2, sizeof r2);
    assert_int_equal(fm_sim_run(&c, &r2), FM_ERR_NOT_FOUND);
    assert_non_null(strstr(fm_last_error(), "b200"));
    fm_sim_measured_free(m);
}

int main(void)
{
    fm_rng_init(&g_rng, fm_test_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_interpolation),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_sim_uses_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
