/* test_sim_work.c - the simulator bounds its work (issue 15): settings whose
 * estimated CPU time exceeds FM_SIM_MAX_SECONDS are refused with
 * FM_ERR_INVALID_ARG, the estimate and the flags to lower, before any work
 * (each refusal runs in a child under alarm(): the call used to run for hours,
 * so a missing bound fails here by timeout instead of hanging the suite); the
 * estimate orders settings as their work does; and the progress callback sees
 * a phase's share done rise to 1 without changing any result.  No timing is
 * asserted.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

static fm_rng g_rng;

typedef enum { CALL_RUN, CALL_SWEEP, CALL_CROSSINGS, CALL_PROBS, CALL_SAMPLE } call_kind;

/* The call in a child with 60 s to answer: 0 when it returned INVALID_ARG with a
 * message holding "refusing" and `needle`. */
static int refused_in_child(const fm_sim_config *c, call_kind k, const char *needle)
{
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(60);
        fm_sim_result r;
        fm_sim_crossings x;
        int mr[2] = {1, c->max_running};
        static double pi[4096];
        (void)pi;
        static int32_t counts[4096];
        fm_status st = k == CALL_RUN        ? fm_sim_run(c, &r)
                       : k == CALL_SWEEP     ? fm_sim_sweep(c, mr, 2, &r)
                       : k == CALL_CROSSINGS ? fm_sim_find_crossings(c, c->max_running, &x)
                       : k == CALL_PROBS     ? fm_sim_expert_probs(c, pi)
                                             : fm_sim_sample_counts(c, 100000, 7, counts);
        int ok = st == FM_ERR_INVALID_ARG && strstr(fm_last_error(), "refusing") && strstr(fm_last_error(), needle);
        if (!ok) fprintf(stderr, "call %d: %s '%s' (want INVALID_ARG: refusing ... %s)\n", (int)k, fm_status_name(st),
                         fm_last_error(), needle);
        _exit(ok ? 0 : 1);
    }
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    if (WIFSIGNALED(ws)) fprintf(stderr, "call %d: killed by signal %d (no bound: it ran)\n", (int)k, WTERMSIG(ws));
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
}

static void test_refused(void **state)
{
    (void)state;
    fm_sim_config c;
    fm_sim_config_default(&c);
    /* the case: 1e5 steps x 1M tokens x top-8 draws, ~11 h */
    c.mc_steps = 50000 + (int)(fm_rng_u64(&g_rng) % 50001);
    c.max_running = 65536;
    c.tokens_per_step = 16;
    assert_int_equal(refused_in_child(&c, CALL_RUN, "--mc"), 0);
    assert_int_equal(refused_in_child(&c, CALL_SWEEP, "--mc"), 0);
    /* the exact crossing search at every integer up to 65536 x 16 tokens under skew */
    fm_sim_config d;
    fm_sim_config_default(&d);
    d.skew = 1.0;
    d.tokens_per_step = 16;
    d.max_running = 65536;
    d.model.n_experts = 4096;
    d.model.top_k = 64;
    d.gpus = 1;
    assert_int_equal(refused_in_child(&d, CALL_CROSSINGS, "--sweep-max"), 0);
    /* top-k close to the experts under strong skew: every draw walks the experts */
    fm_sim_config e;
    fm_sim_config_default(&e);
    e.model.n_experts = 2048;
    e.model.top_k = 2000 + (int)(fm_rng_u64(&g_rng) % 49);
    e.gpus = 1;
    e.skew = 2.0;
    assert_int_equal(refused_in_child(&e, CALL_PROBS, "--topk"), 0);
    assert_int_equal(refused_in_child(&e, CALL_RUN, "--topk"), 0);
    /* sampled steps: 100000 steps x 1M tokens */
    c.mc_steps = 0;
    assert_int_equal(refused_in_child(&c, CALL_SAMPLE, "steps"), 0);
}

static void test_estimate(void **state)
{
    (void)state;
    fm_sim_config c;
    fm_sim_config_default(&c);
    double s0, s1, s2;
    char what[256];
    int mr = c.max_running;
    assert_int_equal(fm_sim_estimate_seconds(&c, &mr, 1, 512, &s0, what, sizeof what), FM_OK);
    assert_true(isfinite(s0) && s0 > 0 && s0 < FM_SIM_MAX_SECONDS);
    c.mc_steps = 100 + (int)(fm_rng_u64(&g_rng) % 100);
    assert_int_equal(fm_sim_estimate_seconds(&c, &mr, 1, 0, &s1, NULL, 0), FM_OK);
    c.mc_steps *= 2;
    assert_int_equal(fm_sim_estimate_seconds(&c, &mr, 1, 0, &s2, what, sizeof what), FM_OK);
    assert_true(s2 > s1 && s1 > 0); /* more steps, more work */
    assert_non_null(strstr(what, "Monte-Carlo"));
    c.mc_steps = 100000;
    c.max_running = mr = 65536;
    c.tokens_per_step = 16;
    assert_int_equal(fm_sim_estimate_seconds(&c, &mr, 1, 0, &s2, what, sizeof what), FM_OK);
    assert_true(s2 > FM_SIM_MAX_SECONDS);
    assert_non_null(strstr(what, "--mc"));
    /* bad arguments */
    assert_int_equal(fm_sim_estimate_seconds(NULL, &mr, 1, 0, &s2, NULL, 0), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_sim_estimate_seconds(&c, NULL, 1, 0, &s2, NULL, 0), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_sim_estimate_seconds(&c, &mr, 1, 0, NULL, NULL, 0), FM_ERR_INVALID_ARG);
    int zero = 0;
    assert_int_equal(fm_sim_estimate_seconds(&c, &zero, 1, 0, &s2, NULL, 0), FM_ERR_INVALID_ARG);
}

typedef struct {
    int    calls, bad;
    double last;
    char   phase[32];
} prog_log;

static void on_progress(void *ctx, const char *phase, double done)
{
    prog_log *l = ctx;
    if (!(done >= 0 && done <= 1)) l->bad++;
    if (l->calls && !strcmp(phase, l->phase) && done < l->last) l->bad++; /* never backwards within a phase */
    snprintf(l->phase, sizeof l->phase, "%s", phase);
    l->last = done;
    l->calls++;
}

static void test_progress(void **state)
{
    (void)state;
    fm_sim_config c;
    fm_sim_config_default(&c);
    c.mc_steps = 20 + (int)(fm_rng_u64(&g_rng) % 20);
    c.skew = 0.5;
    fm_sim_result plain, seen;
    assert_int_equal(fm_sim_run(&c, &plain), FM_OK);
    prog_log l = {0, 0, 0, ""};
    c.progress = on_progress;
    c.progress_ctx = &l;
    fm_poison_bytes(&seen, sizeof seen);
    assert_int_equal(fm_sim_run(&c, &seen), FM_OK);
    assert_true(l.calls >= c.mc_steps);
    assert_int_equal(l.bad, 0);
    assert_string_equal(l.phase, "Monte-Carlo");
    assert_true(l.last == 1.0);
    assert_memory_equal(&plain, &seen, sizeof plain); /* the callback changes nothing */
    prog_log k = {0, 0, 0, ""};
    c.progress_ctx = &k;
    fm_sim_crossings x;
    assert_int_equal(fm_sim_find_crossings(&c, 200, &x), FM_OK);
    assert_true(k.calls >= 1);
    assert_int_equal(k.bad, 0);
}

int main(void)
{
    fm_rng_init(&g_rng, fm_test_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_estimate),
        cmocka_unit_test(test_progress),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
