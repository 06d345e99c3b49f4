/* load_internal.h - what fm_checkpoint_load_layer's files share inside src/io/ (not
 * installed): the load context, the layouts' entry points and the tensor helpers.
 *
 * One direction of calls and includes, no circle:
 *   load.c            fm_checkpoint_load_layer: router, shared expert, swizzle, checks;
 *                     calls the layout loaders and the routing settings
 *   load_modelopt.c   the experts of one layout each (fm_load_modelopt, fm_load_gptoss)
 *   load_gptoss.c
 *   load_routing.c    the routing settings (fm_load_routing, fm_load_config)
 *   load_common.c     the tensor helpers all of the above use (find, expect, scalars,
 *                     scales, the experts' one allocation); it calls none of them
 * Each includes this header, which includes config_json.h and io_internal.h (the
 * safetensors / checkpoint layer below), which know nothing of the loader. */
#ifndef FM_IO_LOAD_INTERNAL_H
#define FM_IO_LOAD_INTERNAL_H

#include "config_json.h"
#include "io_internal.h"

/* What load.c knows before the layout-specific part runs. */
typedef struct {
    const fm_checkpoint *ck;
    fm_ckpt_names        nm;
    int                  layer;
    int                  first, n; /* experts [first, first + n) of n_total */
    int                  n_total;
    int                  hidden;   /* from the router weight */
    int                  dry;      /* validate only: fill cfg, allocate nothing */
    int                  global_router; /* router rows and routing over all n_total experts */
} fm_load_ctx;

/* ---- the layouts (load_modelopt.c, load_gptoss.c) and the routing (load_routing.c) ---- */

/* Validate every expert tensor of the layout, then allocate one block (owned_)
 * and fill l->w13, l->w2, l->a1_scale, l->a2_scale, l->cfg.inter, l->cfg.wfmt,
 * l->w13_split_globals / w13_up_global, l->ignored_bias. On failure l may hold partial allocations
 * that fm_ckpt_layer_free releases. */
fm_status fm_load_modelopt(const fm_load_ctx *c, fm_ckpt_layer *l); /* also COMPRESSED_TENSORS */

/* The same for the gpt-oss MXFP4 layout (one tensor per projection fused over the
 * layer's experts). */
fm_status fm_load_gptoss(const fm_load_ctx *c, fm_ckpt_layer *l);

/* The checkpoint's config.json (fm_cfgjson_read on its folder), with the
 * quantization check of fm_checkpoint_model_info: FM_ERR_UNSUPPORTED
 * "unsupported format: ..." for a quantization_config fp4moe does not read. */
fm_status fm_load_config(const fm_checkpoint *ck, fm_cfgjson *out);

/* Fill l->cfg's routing (top_k, score, renormalize, routed_scale, n_group,
 * topk_group, act_nvfp4), l->model_type and l->route_from from the caller's
 * settings, config.json (cj) and the model type's family (fm_ckpt_load_opts). */
fm_status fm_load_routing(const fm_load_ctx *c, const fm_ckpt_load_opts *o, const fm_cfgjson *cj, fm_ckpt_layer *l);

/* ---- the tensor helpers (load_common.c) ---- */

/* Tensor suffixes of an NVFP4 projection in the ModelOpt-named layouts; with
 * `reciprocal` the stored global and input scales are 1 / ModelOpt's
 * (compressed-tensors). NULL for a layout without them. */
typedef struct {
    const char *weight, *scale, *global, *input;
    int         reciprocal;
} fm_nvfp4_suffixes;
const fm_nvfp4_suffixes *fm_nvfp4_suffixes_of(fm_ckpt_layout l);
/* A global / input scale as ModelOpt defines it (multiply): fm_load_scalar,
 * then, with reciprocal, 1/x in FP32 (correctly rounded), itself checked
 * finite and > 0 (FM_ERR_NONFINITE naming the tensor). */
fm_status fm_load_global(const fm_st_tensor *t, int reciprocal, float *out);
/* Bytes of one expert in l->owned_: w13 data, w13 scales, w2 data, w2 scales. */
typedef struct {
    size_t d13, s13, d2, s2;
} fm_load_expert_bytes;

/* After validation, the one allocation of every layout: l->w13 / l->w2 views
 * for c->n experts of format f (w13 [2*inter][hidden], w2 [hidden][inter])
 * over one block l->owned_ (per expert: d13 | s13 | d2 | s2), each view
 * pointing at its slice (scales NULL when the format has none), global_scale 1.
 * *bytes (may be NULL) receives the per-expert sizes. FM_OK or FM_ERR_OOM
 * naming the layer; partial allocations are left to fm_ckpt_layer_free. */
fm_status fm_load_alloc_experts(const fm_load_ctx *c, fm_ckpt_layer *l, fm_format f, int64_t inter,
                                fm_load_expert_bytes *bytes);

/* FM_ERR_NONFINITE naming t (and the expert when expert >= 0: a slice of a
 * fused tensor) and the position if any of the scale bytes codes[rows][cols]
 * is a NaN code (E4M3: 0x7F/0xFF; UE8M0: 0xFF); the scan is fm_scales_check_codes. */
fm_status fm_load_check_scale_codes(const fm_st_tensor *t, int expert, const uint8_t *codes, int64_t rows,
                                     int64_t cols, fm_scale_type st);

/* Read bytes [off, off + rows * cols) of the block-scale tensor t (expert's
 * slice when expert >= 0) into dst, or into a scratch buffer when dst is NULL
 * (validate only), and check them with fm_load_check_scale_codes.
 * FM_OK, FM_ERR_IO (the read), FM_ERR_NONFINITE, FM_ERR_OOM. */
fm_status fm_load_scales(const fm_st_tensor *t, int expert, uint64_t off, int64_t rows, int64_t cols, fm_scale_type st,
                         uint8_t *dst);

/* Find pattern(L, E, P) + suffix; FM_ERR_NOT_FOUND names the layer, expert and tensor. */
fm_status fm_load_find(const fm_load_ctx *c, const char *pat, int expert, const char *proj, const char *suffix,
                       const fm_st_tensor **out);
/* Exactly one element (shape [] or [1]) of F32/BF16/F16, finite and > 0
 * (FM_ERR_NONFINITE otherwise), as weight_scale_2 / input_scale. */
fm_status fm_load_scalar(const fm_st_tensor *t, float *out);
/* Is t of dtype d (or d2 when d2 >= 0) with exactly this shape? FM_ERR_FORMAT
 * (dtype) or FM_ERR_BAD_SHAPE otherwise, naming file, tensor and expectation. */
fm_status fm_load_expect(const fm_st_tensor *t, fm_dtype d, int d2, int ndim, const int64_t *shape);

#endif
