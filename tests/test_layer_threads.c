/* test_layer_threads.c - one layer, two threads (issue 30, item 5; layer.h "Threads").
 *
 * A layer runs one call at a time. A second call that came while the first ran
 * used to share its scratch buffers: wrong outputs with FM_OK, then heap
 * corruption. Now it fails at once with FM_ERR_BUSY, touching nothing.
 *
 *  - busy_entry_points: the layer's flag held by the test hook (as a call on
 *    another thread holds it), every entry point that uses the layer's state
 *    returns FM_ERR_BUSY with a message naming the call, the output poisoned
 *    before stays poisoned; destroy leaves a held layer alone; released, each
 *    call works again. Deterministic.
 *  - two_threads_hammer: two pthreads run the same layer (cpu and cpu-ref),
 *    each on its own input, until at least one BUSY has been seen and each has
 *    had OK runs (bounded: a time limit, then the test fails saying so). Every
 *    status is FM_OK or FM_ERR_BUSY; every FM_OK output equals, bit for bit,
 *    the single-threaded output for that thread's input; a BUSY output stays
 *    poisoned. Runs under ASan (make test-asan) and TSan (make test-tsan).
 */
#include "test_moe_fixture.h"
#include "testutil.h"

#include "backend.h" /* fm_layer_test_hold */

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const fm_backend_kind k_cpu[2] = {FM_BACKEND_CPU_REF, FM_BACKEND_CPU};

static void *aligned(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    assert_non_null(p);
    return p;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void expect_busy(const char *what, fm_status s, const char *call)
{
    if (s != FM_ERR_BUSY || !strstr(fm_last_error(), call) || !strstr(fm_last_error(), "in use by another call"))
        fail_msg("%s: got %s '%s', want FM_ERR_BUSY naming %s", what, fm_status_name(s), fm_last_error(), call);
}

static void busy_entry_points(void **st)
{
    (void)st;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed());
    fm_moe_config cfg = fx_config(8, 2, 64, 32, FM_FORMAT_NVFP4);
    fx_layer L;
    fx_build(&L, &cfg, &r, 0, 0);
    const int T = 3, H = cfg.hidden;
    uint16_t *x = aligned(sizeof(uint16_t) * T * H);
    float    *out = aligned(sizeof(float) * T * H), *want = aligned(sizeof(float) * T * H);
    for (int i = 0; i < T * H; i++) x[i] = fm_bf16_encode(fm_rng_normal(&r));
    for (int b = 0; b < 2; b++) {
        fm_layer *l = NULL;
        assert_int_equal(fm_layer_create(k_cpu[b], &cfg, &L.w, T, &l), FM_OK);
        fm_layer_run_args a = {.x = x, .T = T, .out = want};
        assert_int_equal(fm_layer_run(l, &a), FM_OK);
        assert_int_equal(fm_layer_test_hold(l, 1), FM_OK);
        assert_int_equal(fm_layer_test_hold(l, 1), FM_ERR_BUSY); /* held: a second taker is refused */
        fm_poison_f32(out, (size_t)T * H);
        a.out = out;
        expect_busy("run", fm_layer_run(l, &a), "fm_layer_run");
        expect_busy("forward", fm_layer_forward(l, x, T, out, NULL), "fm_layer_forward");
        fm_layer_error_info ei;
        expect_busy("errors", fm_layer_errors(l, NULL, &ei), "fm_layer_errors");
        size_t ws = 1;
        expect_busy("workspace_size", fm_layer_workspace_size(l, &ws), "fm_layer_workspace_size");
        assert_int_equal(fm_first_nonfinite(out, (size_t)T * H), 0); /* still poisoned */
        for (size_t i = 0; i < (size_t)T * H; i++) assert_true(out[i] != out[i]);
        /* plan / set_plan / tune: a CPU layer has none (FM_ERR_UNSUPPORTED, said before the
         * flag is looked at: nothing of the layer's state is used) */
        fm_layer_plan_info pi;
        assert_int_equal(fm_layer_plan(l, 1, &pi), FM_ERR_UNSUPPORTED);
        assert_int_equal(fm_layer_backend(l), k_cpu[b]); /* no flag: reads nothing that changes */
        /* destroy of a held layer: refused (leaked rather than freed under a running call) */
        fm_layer_destroy(l);
        assert_int_equal(fm_layer_test_hold(l, 0), FM_OK);
        fm_poison_f32(out, (size_t)T * H);
        assert_int_equal(fm_layer_run(l, &a), FM_OK);
        assert_memory_equal(out, want, sizeof(float) * T * H);
        assert_int_equal(fm_layer_errors(l, NULL, &ei), FM_OK);
        assert_int_equal(fm_layer_workspace_size(l, &ws), FM_OK);
        fm_layer_destroy(l); /* not held: freed (ASan's leak check sees the earlier one was not lost) */
    }
    free(x), free(out), free(want);
    fx_free(&L);
}

enum { NTHREADS = 2 };

typedef struct {
    fm_layer      *l;
    int            T, H;
    const uint16_t *x;    /* this thread's input */
    const float   *want;  /* its single-threaded output */
    float         *out;
    atomic_int    *busy_seen, *stop;
    int            ok, busy, bad; /* counts; bad: a status or output that must not be */
    char           why[256];
} worker;

static void *hammer(void *p)
{
    worker *w = p;
    const size_t n = (size_t)w->T * w->H;
    const double t_end = now_s() + 20; /* the bound: the main thread fails the test past it */
    while (!atomic_load(w->stop) && now_s() < t_end) {
        fm_poison_f32(w->out, n);
        fm_layer_run_args a = {.x = w->x, .T = w->T, .out = w->out};
        fm_status s = fm_layer_run(w->l, &a);
        if (s == FM_OK) {
            w->ok++;
            if (memcmp(w->out, w->want, n * sizeof(float)) != 0) {
                w->bad++;
                snprintf(w->why, sizeof w->why, "an FM_OK output differs from the single-threaded one");
            }
        } else if (s == FM_ERR_BUSY) {
            w->busy++;
            atomic_store(w->busy_seen, 1);
            if (fm_first_nonfinite(w->out, n) != 0) {
                w->bad++;
                snprintf(w->why, sizeof w->why, "a BUSY call wrote the output");
            }
        } else {
            w->bad++;
            snprintf(w->why, sizeof w->why, "status %s: %s", fm_status_name(s), fm_last_error());
        }
        if (w->bad) break;
        /* enough: a BUSY seen by either thread and OK runs on each */
        if (atomic_load(w->busy_seen) && w->ok >= 3) break;
    }
    return NULL;
}

static void two_threads_hammer(void **st)
{
    (void)st;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed());
    /* runs of a millisecond or more, so that the threads' calls overlap */
    const int big = !fx_asan();
    fm_moe_config cfg = big ? fx_config(16, 4, 512, 256, FM_FORMAT_NVFP4) : fx_config(8, 2, 128, 64, FM_FORMAT_NVFP4);
    fx_layer L;
    fx_build(&L, &cfg, &r, 1, 0);
    const int T = big ? 16 : 8, H = cfg.hidden;
    const size_t n = (size_t)T * H;
    for (int b = 0; b < 2; b++) {
        fm_layer *l = NULL;
        assert_int_equal(fm_layer_create(k_cpu[b], &cfg, &L.w, T, &l), FM_OK);
        worker w[NTHREADS];
        atomic_int busy_seen = 0, stop = 0;
        for (int t = 0; t < NTHREADS; t++) {
            uint16_t *x = aligned(sizeof(uint16_t) * n);
            float    *want = aligned(sizeof(float) * n);
            for (size_t i = 0; i < n; i++) x[i] = fm_bf16_encode(fm_rng_normal(&r));
            fm_layer_run_args a = {.x = x, .T = T, .out = want};
            assert_int_equal(fm_layer_run(l, &a), FM_OK); /* single-threaded: the expected output */
            w[t] = (worker){.l = l, .T = T, .H = H, .x = x, .want = want, .out = aligned(sizeof(float) * n),
                            .busy_seen = &busy_seen, .stop = &stop};
        }
        pthread_t th[NTHREADS];
        double t0 = now_s();
        for (int t = 0; t < NTHREADS; t++) assert_int_equal(pthread_create(&th[t], NULL, hammer, &w[t]), 0);
        for (int t = 0; t < NTHREADS; t++) assert_int_equal(pthread_join(th[t], NULL), 0);
        int ok = 0, busy = 0;
        for (int t = 0; t < NTHREADS; t++) {
            print_message("%s thread %d: %d FM_OK, %d FM_ERR_BUSY\n", fm_backend_name(k_cpu[b]), t, w[t].ok, w[t].busy);
            if (w[t].bad) fail_msg("%s thread %d: %s", fm_backend_name(k_cpu[b]), t, w[t].why);
            ok += w[t].ok, busy += w[t].busy;
        }
        if (!busy)
            fail_msg("%s: no FM_ERR_BUSY in %.1f s of two threads running one layer (%d runs): the calls never "
                     "overlapped, or the second was not refused",
                     fm_backend_name(k_cpu[b]), now_s() - t0, ok);
        assert_true(ok > 0);
        for (int t = 0; t < NTHREADS; t++) free((void *)w[t].x), free((void *)w[t].want), free(w[t].out);
        fm_layer_destroy(l);
    }
    fx_free(&L);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(busy_entry_points),
        cmocka_unit_test(two_threads_hammer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
