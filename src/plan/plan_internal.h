/* plan_internal.h - helpers shared by the planner's files (not installed).
 * The dispatcher's functions (smem_model.c); the families' side is plan_family.h.
 */
#ifndef FM_PLAN_INTERNAL_H
#define FM_PLAN_INTERNAL_H

#include <stddef.h>

#include "plan_family.h"

/* The CUTLASS family of an architecture, FM_FAMILY_AUTO if it has none (before sm_90).
 * The only place this choice is made: the resolver, the candidates and the CLI ask it. */
fm_kernel_family fm_family_for_cc(int cc);

/* Validate `in` and resolve its AUTO fields (family, schedule, stages of fp4moe tiles)
 * into *out, as fm_smem_model sees them; statuses as fm_smem_model.  *out is written
 * only on FM_OK.  (Used by `fp4moe explain` to print what it checked.) */
fm_status fm_plan_resolve(const fm_kernel_config *in, fm_kernel_config *out);

/* Problem sizes the planner accepts: rows per expert, N and K within CUTLASS's int
 * GEMM extents (<= 2^31 - 1), experts <= 2^31 - 1, none negative; 0 = unknown where
 * the caller allows it.  FM_ERR_BAD_SHAPE names the first offender. */
fm_status fm_plan_problem_check(int64_t rows, int64_t n, int64_t k, int64_t experts);

/* Validate + resolve AUTO fields of `in` into *resolved, then run the family model. */
fm_status fm_plan_model_resolved(const fm_kernel_config *in, fm_kernel_config *resolved, fm_model_out *out);

#endif
