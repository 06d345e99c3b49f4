/* io_internal.h - what the safetensors reader, writer, checkpoint and layer
 * loader share inside src/io/ (not installed).
 *
 * Ownership: an fm_safetensors owns its mapping and its tensor table; an
 * fm_checkpoint owns its shards and a name-sorted table of pointers into them;
 * tensors stay valid until the handle that holds them is closed. */
#ifndef FM_IO_INTERNAL_H
#define FM_IO_INTERNAL_H

#include "fm_internal.h"

#include <stdint.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "src/io reads little-endian safetensors data with memcpy: big-endian hosts are not supported"
#endif

/* Largest header the reader accepts (the reference implementation's limit). */
#define FM_ST_MAX_HEADER (100u * 1000u * 1000u)

/* Elements of a shape, or -1 if it overflows int64 / has a negative dim. */
int64_t fm_st_numel(int ndim, const int64_t *shape);

/* Bytes of n elements of dtype d, or UINT64_MAX on overflow or a partial byte. */
uint64_t fm_st_nbytes(fm_dtype d, int64_t numel);

/* "[2, 64, 8]" into buf (always terminated). */
const char *fm_st_shape_str(const fm_st_tensor *t, char *buf, size_t len);

/* Pattern helpers: {L}, {E}, {P} placeholders.
 * fm_pat_format: substitute (layer, expert, proj; proj may be NULL if unused),
 * then append suffix (may be NULL). Returns 0 if it does not fit in `len`.
 * fm_pat_match: does `name` match pattern+suffix? Captures {L}/{E} as decimal
 * numbers (-1 if absent) and {P} as a dot-free token into proj[proj_len]. */
int fm_pat_format(char *buf, size_t len, const char *pat, int layer, int expert, const char *proj, const char *suffix);
int fm_pat_match(const char *pat, const char *suffix, const char *name, int *layer, int *expert, char *proj,
                 size_t proj_len);

/* names->layout AUTO or names NULL: the default names of whichever layout's
 * weight pattern matches more tensors; else validate and copy names.
 * FM_OK, FM_ERR_INVALID_ARG, FM_ERR_NOT_FOUND. */
fm_status fm_ckpt_names_resolve(const fm_checkpoint *ck, const fm_ckpt_names *given, fm_ckpt_names *nm);

/* The folder of the checkpoint (for config.json), "" for a buffer. */
const char *fm_checkpoint_dir(const fm_checkpoint *ck);

/* Elements [first, first + n) of a little-endian F32/F16/BF16/F64 tensor as
 * FP32 into dst, read with fm_st_read in chunks. Returns FM_OK, FM_ERR_FORMAT
 * (other dtype), FM_ERR_OUT_OF_RANGE (beyond the tensor), FM_ERR_IO (the read). */
fm_status fm_st_to_f32(const fm_st_tensor *t, int64_t first, int64_t n, float *dst);

/* ---- layer loading, shared by load.c and the per-layout files ------------ */

/* What load.c knows before the layout-specific part runs. */
typedef struct {
    const fm_checkpoint *ck;
    fm_ckpt_names        nm;
    int                  layer;
    int                  first, n; /* experts [first, first + n) of n_total */
    int                  n_total;
    int                  hidden;   /* from the router weight */
    int                  dry;      /* validate only: fill cfg, allocate nothing */
} fm_load_ctx;

/* Validate every expert tensor of the layout, then allocate one block (owned_)
 * and fill l->w13, l->w2, l->a1_scale, l->a2_scale, l->cfg.inter, l->cfg.wfmt,
 * l->rescaled_w13, l->ignored_bias. On failure l may hold partial allocations
 * that fm_ckpt_layer_free releases. */
fm_status fm_load_modelopt(const fm_load_ctx *c, fm_ckpt_layer *l); /* also COMPRESSED_TENSORS */

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
fm_status fm_load_gptoss(const fm_load_ctx *c, fm_ckpt_layer *l);

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

/* No tensor of the layout's expert pattern in `layer` may carry an expert
 * index >= n_total (the router's row count): such a stray tensor would be
 * silently ignored by the load and inflate a count taken from the indices.
 * FM_OK or FM_ERR_FORMAT naming the tensor, its index and n_total. */
fm_status fm_ckpt_check_expert_indices(const fm_checkpoint *ck, const fm_ckpt_names *nm, int layer, int n_total);

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
