/* test_sim_errors.c - bad simulator settings get their specific status and a
 * detail that names the problem, and leave the caller's output untouched;
 * every preset is valid and runs.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

static fm_rng g_rng;

typedef void (*mutate_fn)(fm_sim_config *c);

static void m_topk(fm_sim_config *c) { c->model.top_k = c->model.n_experts + 1 + (int)(fm_rng_u64(&g_rng) % 9); }
static void m_topk0(fm_sim_config *c) { c->model.top_k = 0; }
static void m_gpus0(fm_sim_config *c) { c->gpus = 0; }
static void m_ep_div(fm_sim_config *c) { c->gpus = 3; } /* 256 experts */
static void m_running0(fm_sim_config *c) { c->max_running = 0; }
static void m_tokens0(fm_sim_config *c) { c->tokens_per_step = 0; }
static void m_steps0(fm_sim_config *c) { c->decode_steps = 0; }
static void m_skew(fm_sim_config *c) { c->skew = 2.5; }
static void m_skew_nan(fm_sim_config *c) { c->skew = NAN; }
static void m_bweff(fm_sim_config *c) { c->bw_eff = 0; }
static void m_ceff(fm_sim_config *c) { c->compute_eff = 1.5; }
static void m_accepted(fm_sim_config *c) { c->accepted = c->tokens_per_step + 0.5; }
static void m_hidden(fm_sim_config *c) { c->model.hidden = 6144 + 8; } /* not a multiple of 16 */
static void m_layers(fm_sim_config *c) { c->model.moe_layers = 0; }
static void m_format(fm_sim_config *c) { c->model.wfmt = (fm_format)42; }
static void m_gpu(fm_sim_config *c) { c->gpu.mem_gbs = 0; }
/* issue 15: 1e7 was refused as "must be finite, >= 0"; 1e-307 printed "inf us" */
static void m_launch(fm_sim_config *c) { c->launch_us = 1e7; }
static void m_bweff_tiny(fm_sim_config *c) { c->bw_eff = 1e-307; }
static void m_ceff_tiny(fm_sim_config *c) { c->compute_eff = 1e-307; }
static void m_tile(fm_sim_config *c) { c->tile_m = 1025; }
static void m_fp4_nan(fm_sim_config *c) { c->gpu.fp4_tflops = NAN; }
static void m_tokens_total(fm_sim_config *c)
{
    c->max_running = 65536;
    c->tokens_per_step = 64;
}
static void m_shared(fm_sim_config *c)
{
    c->model.shared_experts = 1;
    c->model.shared_inter = 0;
}

static const struct {
    mutate_fn   fn;
    fm_status   st;
    const char *needle; /* must appear in fm_last_error() */
} k_cases[] = {
    {m_topk, FM_ERR_INVALID_ARG, "top-k"},
    {m_topk0, FM_ERR_INVALID_ARG, "top-k"},
    {m_gpus0, FM_ERR_INVALID_ARG, "gpus=0"},
    {m_ep_div, FM_ERR_INVALID_ARG, "EP degree 3 does not divide"},
    {m_running0, FM_ERR_INVALID_ARG, "max running"},
    {m_tokens0, FM_ERR_INVALID_ARG, "tokens per step"},
    {m_steps0, FM_ERR_INVALID_ARG, "decode steps"},
    {m_skew, FM_ERR_INVALID_ARG, "skew"},
    {m_skew_nan, FM_ERR_INVALID_ARG, "skew"},
    {m_bweff, FM_ERR_INVALID_ARG, "efficiency"},
    {m_ceff, FM_ERR_INVALID_ARG, "efficiency"},
    {m_accepted, FM_ERR_INVALID_ARG, "accepted"},
    {m_hidden, FM_ERR_BAD_SHAPE, "block"},
    {m_layers, FM_ERR_BAD_SHAPE, "layers"},
    {m_format, FM_ERR_FORMAT, "format"},
    {m_gpu, FM_ERR_INVALID_ARG, "bandwidth"},
    {m_tokens_total, FM_ERR_INVALID_ARG, "tokens"},
    {m_shared, FM_ERR_BAD_SHAPE, "shared"},
    {m_launch, FM_ERR_INVALID_ARG, "launch us=1e+07 must be a number in [0, 1000000] (--launch-us)"},
    {m_bweff_tiny, FM_ERR_INVALID_ARG, "bandwidth efficiency=1e-307 must be a number in [0.001, 1] (--bw-eff)"},
    {m_ceff_tiny, FM_ERR_INVALID_ARG, "compute efficiency=1e-307 must be a number in [0.001, 1] (--compute-eff)"},
    {m_tile, FM_ERR_INVALID_ARG, "[0, 1024] (--tile-m)"},
    {m_fp4_nan, FM_ERR_INVALID_ARG, "FP4 rate"},
};

static void test_bad_settings(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        fm_sim_config c;
        fm_sim_config_default(&c);
        assert_int_equal(fm_sim_config_check(&c), FM_OK);
        k_cases[i].fn(&c);
        fm_sim_result r, before;
        fm_poison_bytes(&r, sizeof r);
        memcpy(&before, &r, sizeof r);
        fm_status st = fm_sim_run(&c, &r);
        if (st != k_cases[i].st || !strstr(fm_last_error(), k_cases[i].needle)) {
            print_error("case %zu: got %s '%s', want %s containing '%s'\n", i, fm_status_name(st), fm_last_error(),
                        fm_status_name(k_cases[i].st), k_cases[i].needle);
            fail();
        }
        assert_memory_equal(&r, &before, sizeof r); /* nothing written on failure */
        assert_int_equal(fm_sim_config_check(&c), k_cases[i].st);
        /* sweeps and crossings set max_running themselves */
        if (k_cases[i].fn == m_running0 || k_cases[i].fn == m_tokens_total) continue;
        fm_sim_crossings x;
        assert_int_equal(fm_sim_find_crossings(&c, 16, &x), k_cases[i].st);
        int mr = 4;
        assert_int_equal(fm_sim_sweep(&c, &mr, 1, &r), k_cases[i].st);
    }
}

static void test_null_and_ranges(void **state)
{
    (void)state;
    fm_sim_config c;
    fm_sim_config_default(&c);
    fm_sim_result r;
    assert_int_equal(fm_sim_run(NULL, &r), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_sim_run(&c, NULL), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_sim_config_check(NULL), FM_ERR_INVALID_ARG);
    int mr[2] = {4, 0};
    assert_int_equal(fm_sim_sweep(&c, mr, 2, &r), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_sim_sweep(&c, NULL, 1, &r), FM_ERR_INVALID_ARG);
    fm_sim_crossings x;
    assert_int_equal(fm_sim_find_crossings(&c, 0, &x), FM_ERR_INVALID_ARG);
    int32_t cnt[4];
    assert_int_equal(fm_sim_sample_counts(&c, 0, 1, cnt), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_sim_expert_probs(&c, NULL), FM_ERR_INVALID_ARG);
    fm_sim_model m;
    assert_int_equal(fm_sim_model_find("glm-6", &m), FM_ERR_NOT_FOUND);
    assert_non_null(strstr(fm_last_error(), "glm5"));
    assert_int_equal(fm_sim_model_find(NULL, &m), FM_ERR_INVALID_ARG);
    assert_null(fm_sim_model_at(-1));
    assert_null(fm_sim_model_at(fm_sim_model_count()));
}

/* Every preset, EP and TP over 8 GPUs, is valid and gives finite figures. */
static void test_presets(void **state)
{
    (void)state;
    assert_int_equal(fm_sim_model_count(), 4);
    for (int i = 0; i < fm_sim_model_count(); i++) {
        const fm_sim_model *pm = fm_sim_model_at(i);
        fm_sim_model m;
        assert_int_equal(fm_sim_model_find(pm->name, &m), FM_OK);
        assert_non_null(m.source);
        assert_true(m.top_k <= m.n_experts && m.moe_layers > 0);
        for (int par = 0; par < 2; par++) {
            fm_sim_config c;
            fm_sim_config_default(&c);
            c.model = m;
            c.parallel = par ? FM_PARALLEL_TP : FM_PARALLEL_EP;
            c.max_running = 1 + (int)(fm_rng_u64(&g_rng) % 512);
            fm_sim_result r;
            assert_int_equal(fm_sim_run(&c, &r), FM_OK);
            assert_true(isfinite(r.layer_us) && r.layer_us > 0 && isfinite(r.tokens_per_s) && r.tokens_per_s > 0);
            assert_true(r.waste >= 0 && r.waste < 1);
            /* the H200 (sm_90) has a planner family: the tile is its pick */
            assert_int_equal(r.tile_from_planner, 1);
            assert_true(r.tile_m == 64 || r.tile_m == 128 || r.tile_m == 256);
            /* swap-AB: the planner's fp4moe-mma ranking, a compiled tile whose K a stage
             * divides FC1's K; where every pass width can (K a multiple of 256), the smallest
             * pass that holds the expected rows (gpt-oss's K = 2880 takes only 64-K stages) */
            c.kernel = FM_SIM_KERNEL_FP4MOE;
            assert_int_equal(fm_sim_run(&c, &r), FM_OK);
            assert_int_equal(r.tile_from_planner, 1);
            assert_true(r.tile_m == 8 || r.tile_m == 16 || r.tile_m == 32 || r.tile_m == 64);
            assert_true(r.tile_k > 0 && r.fc1_k % r.tile_k == 0);
            if (r.fc1_k % 256 == 0) {
                assert_true(r.tile_m >= ceil(r.rows_per_active) || r.tile_m == 64);
                assert_true(r.tile_m / 2 < ceil(r.rows_per_active) || r.tile_m == 8);
            }
            const fm_format_traits *tr = fm_format_traits_get(m.wfmt);
            assert_int_equal(r.fc2_k % tr->block, 0); /* TP slices padded to the block */
        }
    }
}

/* The range table: each library-checked setting just outside its row fails
 * fm_sim_config_check with the row's status and a detail naming the setting's
 * flag and the row's range; at both ends it passes (the other settings chosen
 * so the ties between settings hold). */
static void set_field(fm_sim_config *c, fm_sim_setting s, double v)
{
    switch (s) {
    case FM_SIM_SET_EXPERTS: c->model.n_experts = (int)v; c->model.top_k = 1; c->gpus = 1; break;
    case FM_SIM_SET_TOPK: c->model.top_k = (int)v; c->model.n_experts = 4096; break;
    case FM_SIM_SET_HIDDEN: c->model.hidden = (int)v; c->model.wfmt = FM_FORMAT_BF16; break;
    case FM_SIM_SET_INTER: c->model.inter = (int)v; c->model.wfmt = FM_FORMAT_BF16; break;
    case FM_SIM_SET_LAYERS: c->model.moe_layers = (int)v; break;
    case FM_SIM_SET_SHARED_EXPERTS: c->model.shared_experts = (int)v; break;
    case FM_SIM_SET_SHARED_INTER: c->model.shared_inter = (int)v; c->model.shared_experts = 0; break;
    case FM_SIM_SET_GPUS: c->gpus = (int)v; c->parallel = FM_PARALLEL_TP; break;
    case FM_SIM_SET_MAX_RUNNING: c->max_running = (int)v; break;
    case FM_SIM_SET_TOKENS_PER_STEP: c->tokens_per_step = (int)v; c->max_running = 1; break;
    case FM_SIM_SET_ACCEPTED: c->accepted = v; c->tokens_per_step = 64; c->max_running = 1; break;
    case FM_SIM_SET_DECODE_STEPS: c->decode_steps = (int)v; break;
    case FM_SIM_SET_ROUND_US: c->round_us = v; break;
    case FM_SIM_SET_SKEW: c->skew = v; break;
    case FM_SIM_SET_MC: c->mc_steps = (int)v; break;
    case FM_SIM_SET_TILE_M: c->tile_m = (int)v; break;
    case FM_SIM_SET_BW_EFF: c->bw_eff = v; break;
    case FM_SIM_SET_COMPUTE_EFF: c->compute_eff = v; break;
    case FM_SIM_SET_LAUNCH_US: c->launch_us = v; break;
    default: break; /* seed, sweep max: the CLI's */
    }
}

static void test_range_table(void **state)
{
    (void)state;
    assert_null(fm_sim_range_get(FM_SIM_SET_COUNT));
    assert_null(fm_sim_range_get((fm_sim_setting)-1));
    for (int i = 0; i < FM_SIM_SET_COUNT; i++) {
        const fm_sim_range *r = fm_sim_range_get((fm_sim_setting)i);
        assert_non_null(r);
        assert_true(r->flag && !strncmp(r->flag, "--", 2) && r->name && *r->name && r->lo <= r->hi);
        if (i == FM_SIM_SET_SEED || i == FM_SIM_SET_SWEEP_MAX) continue;
        char rng[96];
        snprintf(rng, sizeof rng, "[%.10g, %.10g] (%s)", r->lo, r->hi, r->flag);
        const double ends[2] = {r->lo, r->hi};
        for (int e = 0; e < 2; e++) {
            fm_sim_config c;
            fm_sim_config_default(&c);
            set_field(&c, (fm_sim_setting)i, ends[e]);
            if (fm_sim_config_check(&c) != FM_OK) {
                print_error("%s = %g (an end of its range) rejected: %s\n", r->flag, ends[e], fm_last_error());
                fail();
            }
        }
        const double bad[2] = {r->integer ? r->hi + 1 : r->hi * 1.5 + 1, r->lo > 0 && !r->integer ? r->lo / 2 : r->lo - 1};
        for (int b = 0; b < 2; b++) {
            fm_sim_config c;
            fm_sim_config_default(&c);
            set_field(&c, (fm_sim_setting)i, bad[b]);
            fm_status st = fm_sim_config_check(&c);
            if (st != r->status || !strstr(fm_last_error(), rng)) {
                print_error("%s = %g: %s '%s' (want %s naming '%s')\n", r->flag, bad[b], fm_status_name(st),
                            fm_last_error(), fm_status_name(r->status), rng);
                fail();
            }
        }
    }
}

/* Issue 15: results were reported as Inf/NaN with FM_OK.  A caller's own GPU
 * figures pass the check (> 0) yet overflow the times: FM_ERR_NONFINITE naming
 * the figure, and the output untouched, from every entry point. */
static void test_nonfinite_results(void **state)
{
    (void)state;
    for (int which = 0; which < 2; which++) {
        fm_sim_config c;
        fm_sim_config_default(&c);
        double tiny = 1e-307 * (1 + (double)(fm_rng_u64(&g_rng) % 90)); /* times overflow past 1e308 */
        if (which) c.gpu.bf16_tflops = tiny, c.gpu.fp4_tflops = 0;
        else c.gpu.mem_gbs = tiny;
        assert_int_equal(fm_sim_config_check(&c), FM_OK);
        fm_sim_result r, before;
        fm_poison_bytes(&r, sizeof r);
        memcpy(&before, &r, sizeof r);
        fm_status st = fm_sim_run(&c, &r);
        if (st != FM_ERR_NONFINITE || !strstr(fm_last_error(), "too small")) {
            print_error("tiny %s: %s '%s' (want FM_ERR_NONFINITE)\n", which ? "rate" : "bandwidth",
                        fm_status_name(st), fm_last_error());
            fail();
        }
        assert_memory_equal(&r, &before, sizeof r);
        int mr[2] = {1, 8};
        fm_sim_result two[2];
        assert_int_equal(fm_sim_sweep(&c, mr, 2, two), FM_ERR_NONFINITE);
        fm_sim_crossings x;
        assert_int_equal(fm_sim_find_crossings(&c, 8, &x), FM_ERR_NONFINITE);
    }
}

/* No gnuplot: a clear FM_ERR_NOT_FOUND, and an existing file is not touched. */
static void test_plot_without_gnuplot(void **state)
{
    (void)state;
    fm_sim_config c;
    fm_sim_config_default(&c);
    fm_sim_result r;
    assert_int_equal(fm_sim_run(&c, &r), FM_OK);
    char path[] = "/tmp/fm-sim-plot-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "keep", 4), 4);
    close(fd);
    setenv("FM_GNUPLOT", "/nonexistent/gnuplot", 1);
    assert_int_equal(fm_sim_plot(path, &c, &r, 1, NULL), FM_ERR_NOT_FOUND);
    assert_non_null(strstr(fm_last_error(), "gnuplot"));
    unsetenv("FM_GNUPLOT");
    FILE *f = fopen(path, "r");
    char buf[8] = {0};
    assert_non_null(f);
    assert_int_equal(fread(buf, 1, 8, f), 4);
    fclose(f);
    assert_string_equal(buf, "keep");
    unlink(path);
}

int main(void)
{
    fm_rng_init(&g_rng, fm_test_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_settings),
        cmocka_unit_test(test_null_and_ranges),
        cmocka_unit_test(test_presets),
        cmocka_unit_test(test_plot_without_gnuplot),
        cmocka_unit_test(test_range_table),
        cmocka_unit_test(test_nonfinite_results),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
