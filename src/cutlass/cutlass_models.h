/* cutlass_models.h - what a CUTLASS SharedStorage model needs and provides (not
 * installed): the struct-layout helper every model is built from, the result of one
 * family model, and the CUTLASS families' entry points. The audit's files
 * (smem_cutlass.c, smem_epilogue.c, smem_sm100.c) include only this header; the
 * planner's dispatcher (src/plan/) includes it through plan_family.h. Nothing of the
 * runtime (src/kernels/, src/cuda/, the layer) includes it: the runtime launches
 * fp4moe's own kernels, whose bytes src/kernels/fm_tile_layout.h has.
 *
 * fm_lay reproduces how a C++ compiler lays out a struct: each member is placed at
 * the next multiple of its alignment, the struct's alignment is the largest of
 * its members', and its size is rounded up to that alignment.  Every CUTLASS
 * SharedStorage is modelled as a tree of these, which is how the padding the
 * builders forget (alignas(1024) buffers, 128-byte tensor maps) is counted.
 */
#ifndef FM_CUTLASS_MODELS_H
#define FM_CUTLASS_MODELS_H

#include <stddef.h>

#include "fm_internal.h"
#include "fp4moe/plan.h"
#include "kernels/fm_kernels_smem.h" /* fm_elem_bits */

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

/* Alignment CUTLASS gives a swizzled smem buffer (alignment_for_swizzle of the atom the
 * smem selector picks from the contiguous extent's bytes): SW128 1024, SW64 512,
 * SW32 256, interleaved 128. */
static inline size_t fm_swizzle_align(int contiguous_elems, int bits)
{
    size_t bytes = (size_t)contiguous_elems * (size_t)bits / 8;
    if (bytes % 128 == 0) return 1024;
    if (bytes % 64 == 0) return 512;
    if (bytes % 32 == 0) return 256;
    return 128;
}

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
fm_status fm_model_cutlass_sm100(const fm_kernel_config *cfg, fm_model_out *out);
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

/* The same for the plain (non-ptr-array) kernel: { pipelines; scheduler; tensors { epilogue;
 * mainloop } }, no tensor maps in shared memory. */
void fm_kernel_sm90_plain(const fm_kernel_config *cfg, size_t ml_tensors, size_t ml_tensors_align,
                          size_t ml_pipeline, const fm_epi_out *epi, fm_smem_breakdown *bd);

#endif
