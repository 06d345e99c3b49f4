/* layer_internal.h - what the layer's own parts (src/layer.c, src/layer/) share (not
 * installed): the tuner's loop and the bucket policy, plain C over the backend table. */
#ifndef FM_LAYER_INTERNAL_H
#define FM_LAYER_INTERNAL_H

#include "backend.h"

/* Every dense FP32 tensor of w finite (router weights and bias; src/layer/weights_check.c
 * with fm_moe_weights_check). */
fm_status fm_layer_check_dense_finite(const fm_moe_config *cfg, const fm_moe_weights *w);

/* Rows per expert and active experts the planner ranks a bucket of T tokens for:
 * T * top_k routed slots over the global experts, the shard's share of them; with
 * row_quantile (or its AUTO rule), at least that quantile of one expert's row count. */
void fm_layer_bucket_rows(const fm_layer_params *p, int T, int *avg, int *act);
/* Every bucket's plan by the policy (ops->gemm_choose, packed_x_ok), then ops->install. */
fm_status fm_layer_plan_buckets(const fm_backend_ops *ops, void *state, const fm_layer_params *p);

/* fm_layer_tune for a backend with tune ops (T checked, the layer held by the caller):
 * the search of src/layer/tune.c through ops->plan / set_plan / tune_*. */
fm_status fm_layer_tune_bucket(const fm_backend_ops *ops, void *state, const fm_layer_params *p, int T, void *stream,
                               fm_layer_tune_info *info);

/* The time of replays t[reps] rotating over n_sets inputs (replay i, after a warm-up of
 * a multiple of n_sets, on input i % n_sets): the mean over inputs of each input's
 * median. -1 when reps < n_sets or out of memory. */
double fm_rot_time(double *t, int n_sets, int reps);

/* fm_layer_run_dispatched's checks of a (src/layer/dispatch_check.c): FM_OK, or the status
 * and message naming what is wrong, `who` leading it. */
fm_status fm_layer_check_dispatch_args(const fm_layer_params *p, const fm_backend_ops *ops,
                                       const fm_layer_dispatch_args *a, const char *who);

#endif
