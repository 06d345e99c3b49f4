/* test_layer_buckets.c - the bucket policy (src/layer/buckets.c) on the CPU, over a
 * fake planner: which buckets exist, the rows and active experts each is planned for,
 * the work-list rule (FM_WORK_LIST_AUTO keeps the list and the K splits only where FC1
 * splits at least FM_WORK_LIST_MIN_SPLITS ways), packed X only where the backend can
 * read it and the planner's estimate prefers it, and that the backend installs exactly
 * the plans the policy made. The policy is plain C over the backend table so that it
 * is tested here, without a GPU. */
#include "testutil.h"

#include "backend.h"
#include "layer/layer_internal.h"

#include <string.h>

typedef struct {
    int                packed_ok[2]; /* packed_x_ok per GEMM */
    int                calls, auto_calls[2];
    fm_layer_plan_info got[FM_LAYER_BUCKETS];
    int                n;
} fake;

/* FC1 splits K 8 ways for a bucket with at most 2 active experts, else 2 ways; packed X
 * estimated faster from 4 rows per expert. */
static fm_status fake_choose(void *state, int g, const fm_gemm_hint *h, fm_tile *t, int *nb, int *ks, double *est)
{
    fake *f = state;
    f->calls++;
    if (h->k_splits_auto) f->auto_calls[g]++;
    *t = (fm_tile){.warps = 4, .mt = 2, .nt = 1, .kc = 128, .stages = 4, .family = FM_FAMILY_FP4MOE_MMA};
    if (nb) *nb = 1;
    if (ks) *ks = h->k_splits_auto ? (h->active <= 2 ? 8 : 2) : 1;
    if (est) *est = h->x_packed ? (h->rows >= 4 ? 1.0 : 3.0) : 2.0;
    return FM_OK;
}

static int fake_packed_ok(void *state, int g) { return ((fake *)state)->packed_ok[g]; }

static fm_status fake_install(void *state, const fm_layer_plan_info *plans, int n)
{
    fake *f = state;
    memcpy(f->got, plans, sizeof *plans * (size_t)n);
    f->n = n;
    return FM_OK;
}

static const fm_backend_ops k_fake = {
    .name = "fake", .gemm_choose = fake_choose, .packed_x_ok = fake_packed_ok, .install = fake_install};

/* 64 experts, top-8, a shard of 8 */
static fm_layer_params params(int max_tokens, int work_list)
{
    fm_layer_params p = {.max_tokens = max_tokens, .n_local = 8, .decode_work_list = work_list,
                         .row_quantile = FM_ROW_QUANTILE_MEAN};
    p.cfg.n_experts = 64, p.cfg.top_k = 8, p.cfg.hidden = 256, p.cfg.inter = 128;
    return p;
}

static void buckets_of_t(void **st)
{
    (void)st;
    const int T[] = {1, 2, 3, 4, 5, 8, 9, 4096}, b[] = {0, 1, 2, 2, 3, 3, 4, 12};
    for (size_t i = 0; i < FM_ARRAY_LEN(T); i++) assert_int_equal(fm_layer_bucket_of(T[i]), b[i]);
    assert_int_equal(fm_layer_bucket_tokens(12, 3), 8);
    assert_int_equal(fm_layer_bucket_tokens(12, 4), 12);
    fake            f = {0};
    fm_layer_params p = params(12, FM_WORK_LIST_OFF);
    assert_int_equal(fm_layer_plan_buckets(&k_fake, &f, &p), FM_OK);
    assert_int_equal(f.n, 5); /* T = 1, 2, 4, 8, 12 */
    assert_int_equal(f.got[4].bucket_tokens, 12);
    /* T tokens x 8 slots over 64 experts, the shard's 8: T slots on min(T, 8) experts */
    assert_int_equal(f.got[0].active_experts, 1);
    assert_int_equal(f.got[0].expected_rows, 1);
    assert_int_equal(f.got[3].active_experts, 8);
    assert_int_equal(f.got[4].expected_rows, 2); /* 12 rows over 8 experts */
}

static void work_list_rule(void **st)
{
    (void)st;
    fake            f = {0};
    fm_layer_params p = params(16, FM_WORK_LIST_AUTO);
    assert_int_equal(fm_layer_plan_buckets(&k_fake, &f, &p), FM_OK);
    assert_int_equal(f.n, 5);
    for (int b = 0; b < f.n; b++) {
        const int few = f.got[b].active_experts <= 2; /* where FC1 splits 8 ways */
        assert_int_equal(f.got[b].work_list, few);
        assert_int_equal(f.got[b].k_splits[0], few ? 8 : 1);
        assert_int_equal(f.got[b].k_splits[1], few ? 8 : 1); /* FC2 re-planned without splits too */
    }
    fake off = {0}, on = {0};
    p = params(16, FM_WORK_LIST_OFF);
    assert_int_equal(fm_layer_plan_buckets(&k_fake, &off, &p), FM_OK);
    assert_int_equal(off.auto_calls[0] + off.auto_calls[1], 0);
    for (int b = 0; b < off.n; b++) assert_int_equal(off.got[b].work_list, 0);
    p = params(16, FM_WORK_LIST_ON);
    assert_int_equal(fm_layer_plan_buckets(&k_fake, &on, &p), FM_OK);
    for (int b = 0; b < on.n; b++) {
        assert_int_equal(on.got[b].work_list, 1);
        assert_int_equal(on.got[b].k_splits[0], on.got[b].active_experts <= 2 ? 8 : 2);
    }
}

static void packed_x_rule(void **st)
{
    (void)st;
    fake            f = {.packed_ok = {1, 0}};
    fm_layer_params p = params(64, FM_WORK_LIST_OFF);
    assert_int_equal(fm_layer_plan_buckets(&k_fake, &f, &p), FM_OK);
    for (int b = 0; b < f.n; b++) {
        assert_int_equal(f.got[b].x_packed[0], f.got[b].expected_rows >= 4);
        assert_int_equal(f.got[b].x_packed[1], 0); /* the backend cannot read it: never asked */
    }
    assert_int_equal(f.got[f.n - 1].x_packed[0], 1); /* 64 tokens: 64 rows over 8 experts */
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(buckets_of_t), cmocka_unit_test(work_list_rule),
                                       cmocka_unit_test(packed_x_rule)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
