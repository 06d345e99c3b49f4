/* plan_internal.h - helpers shared by the planner's files (not installed).
 *
 * fm_lay reproduces how a C++ compiler lays out a struct: each member is placed at
 * the next multiple of its alignment, the struct's alignment is the largest of
 * its members', and its size is rounded up to that alignment.  Every CUTLASS
 * SharedStorage is modelled as a tree of these, which is how the padding the
 * builders forget (alignas(1024) buffers, 128-byte tensor maps) is counted.
 */
#ifndef FM_PLAN_INTERNAL_H
#define FM_PLAN_INTERNAL_H

#include <stddef.h>

#include "fm_internal.h"

typedef struct {
    size_t off;   /* end of the last member */
    size_t align; /* largest member alignment so far (at least 1) */
} fm_lay;

static inline size_t fm_align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static inline void fm_lay_init(fm_lay *l, size_t align) { l->off = 0, l->align = align ? align : 1; }

/* Append a member of `size` bytes aligned to `align`. */
static inline void fm_lay_put(fm_lay *l, size_t size, size_t align)
{
    l->off = fm_align_up(l->off, align) + size;
    if (align > l->align) l->align = align;
}

/* sizeof the struct. An empty struct still has sizeof 1. */
static inline size_t fm_lay_size(const fm_lay *l) { return fm_align_up(l->off ? l->off : 1, l->align); }

int fm_elem_bits(fm_elem e); /* 0 for void */

/* Internal result of one family model: the breakdown plus what the builder believed. */
typedef struct {
    fm_smem_breakdown bd;
    int               auto_stages;   /* the builder's automatic stage count */
    size_t            stage_bytes;   /* per stage, as the builder counts it */
    size_t            capacity;      /* what the builder divides (capacity minus its own carveouts) */
    size_t            carveout;      /* epilogue SharedStorage passed as StageCountAutoCarveout */
    int               min_stages;    /* the collective's static minimum */
} fm_model_out;

/* Family models; cfg is already validated for shape and arch by smem_model.c. */
fm_status fm_model_cutlass_sm120(const fm_kernel_config *cfg, fm_model_out *out);
fm_status fm_model_cutlass_sm90(const fm_kernel_config *cfg, fm_model_out *out);

/* CUTLASS's SM90-style ptr-array TMA epilogue (used by SM90 and SM120 kernels). */
typedef struct {
    size_t tensors, tensors_align; /* CollectiveEpilogue::TensorStorage */
    size_t tmaps;                  /* TensorMapStorage (0 = empty struct) */
    size_t pipeline;               /* LoadPipeline::SharedStorage (0 = empty struct) */
    size_t shared;                 /* sizeof(CollectiveEpilogue::SharedStorage) */
    size_t c, d, fusion;           /* parts, for the breakdown (d = 0 when D reuses C) */
    int    stages_c, stages_d;
} fm_epi_out;
fm_status fm_epilogue_sm90_style(const fm_kernel_config *cfg, int sm120, fm_epi_out *out);

/* sizeof(SharedStorage) of the SM90 ptr-array warp-specialized kernel (cooperative or
 * ping-pong) that both SM90 and SM120 grouped GEMMs instantiate. */
void fm_kernel_sm90_array(const fm_kernel_config *cfg, size_t ml_tensors, size_t ml_tensors_align, size_t ml_tmaps,
                          size_t ml_pipeline, const fm_epi_out *epi, fm_smem_breakdown *bd);

/* Validate + resolve AUTO fields of `in` into *resolved, then run the family model. */
fm_status fm_plan_model_resolved(const fm_kernel_config *in, fm_kernel_config *resolved, fm_model_out *out);

#endif
