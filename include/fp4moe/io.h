/* fp4moe/io.h - safetensors checkpoints: read (pread, every offset
 * bounds-checked), write (so tests and tools make their own), multi-file
 * checkpoints with model.safetensors.index.json, and loading one MoE layer's
 * experts into fm_moe_config + fm_moe_weights (see docs/checkpoints.md).
 *
 * Three levels:
 *   fm_safetensors_*  one .safetensors file (or a buffer): tensors by name.
 *   fm_checkpoint_*   a file, a folder or an index: all tensors of all shards,
 *                     plus layer/expert discovery by name patterns.
 *   fm_ckpt_layer_*   one MoE layer converted to fp4moe's layouts, owning its
 *                     buffers; hand cfg/weights to fm_layer_create or
 *                     fm_moe_forward_ref.
 *
 * Statuses used for bad input (the detail message names the file and tensor):
 *   FM_ERR_IO         cannot open / stat / read / write a file; not a regular
 *                     file (FIFO, device, directory); a file shorter when read
 *                     than when opened (truncated since)
 *   FM_ERR_FORMAT     not safetensors: truncated file, header length beyond the
 *                     file, malformed JSON, missing or ill-typed fields, unknown
 *                     dtype, duplicate names, offsets overlapping or leaving a
 *                     gap, bad index file, unexpected dtype for a role
 *   FM_ERR_OUT_OF_RANGE  data_offsets beyond the data section of the file
 *   FM_ERR_BAD_SHAPE  bytes of data_offsets != dtype size x shape; a tensor
 *                     whose shape disagrees with its role (scales vs weight,
 *                     gate vs up, experts of different sizes)
 *   FM_ERR_NOT_FOUND  a tensor, layer, expert or scale that must be there is not
 *   FM_ERR_UNSUPPORTED  a valid checkpoint fp4moe cannot represent ("unsupported format: ...")
 *   FM_ERR_INVALID_ARG, FM_ERR_OOM as usual.
 * Nothing the caller owns is written on failure (out pointers are set to NULL).
 */
#ifndef FP4MOE_IO_H
#define FP4MOE_IO_H

#include <stddef.h>
#include <stdint.h>

#include "fp4moe/format.h"
#include "fp4moe/moe.h"
#include "fp4moe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- dtypes ---------------------------------------------------------------
 * Safetensors dtype strings. F4 is packed float4_e2m1fn (two per byte). */
typedef enum {
    FM_DTYPE_BOOL = 0,
    FM_DTYPE_U8,
    FM_DTYPE_I8,
    FM_DTYPE_U16,
    FM_DTYPE_I16,
    FM_DTYPE_U32,
    FM_DTYPE_I32,
    FM_DTYPE_U64,
    FM_DTYPE_I64,
    FM_DTYPE_F16,
    FM_DTYPE_BF16,
    FM_DTYPE_F32,
    FM_DTYPE_F64,
    FM_DTYPE_F8_E4M3,
    FM_DTYPE_F8_E5M2,
    FM_DTYPE_F8_E8M0,
    FM_DTYPE_F4,
    FM_DTYPE_COUNT
} fm_dtype;

/* "F8_E4M3" etc.; "?" for an invalid value. */
const char *fm_dtype_name(fm_dtype d);
/* Bits per element (4 for F4, 8 for U8, ...); 0 for an invalid value. */
int fm_dtype_bits(fm_dtype d);
/* Parse a safetensors dtype string (case-sensitive, as the format defines them).
 * Returns FM_OK, FM_ERR_INVALID_ARG (NULL), FM_ERR_FORMAT (unknown). */
fm_status fm_dtype_parse(const char *s, fm_dtype *out);

/* ---- one safetensors file ------------------------------------------------- */

#define FM_ST_MAX_DIMS 8

/* One tensor of a file or buffer. Read its bytes with fm_st_read. */
typedef struct {
    const char    *name;
    fm_dtype       dtype;
    int            ndim;                  /* 0 = scalar */
    int64_t        shape[FM_ST_MAX_DIMS];
    const uint8_t *data;                  /* nbytes bytes inside the buffer of fm_safetensors_parse
                                             (no alignment promised); NULL for a file opened with
                                             fm_safetensors_open, which is never mapped */
    uint64_t       nbytes;
    uint64_t       file_offset;           /* absolute offset of data in the file */
    const char    *file;                  /* path (or label) of the file holding it */
    const struct fm_safetensors *owner_;  /* internal: the open file fm_st_read reads (NULL: use data) */
} fm_st_tensor;

typedef struct fm_safetensors fm_safetensors;

/* Open `path` read-only (a regular file: a FIFO, device or directory is
 * FM_ERR_IO without blocking) and parse its header. The file is not mapped:
 * tensor data is read on demand with fm_st_read (pread), so a file truncated
 * or replaced after this returns gives FM_ERR_IO from the read, never a
 * SIGBUS; the descriptor stays open until fm_safetensors_close. The rules (those of the reference
 * implementation): 8-byte little-endian header length N, N <= 100 MB and
 * 8 + N <= file size; the header is a JSON object starting with '{' (trailing
 * spaces allowed) mapping names to {"dtype", "shape", "data_offsets": [b, e]}
 * plus an optional "__metadata__" of strings; e - b == size(dtype) x prod(shape);
 * the tensors tile the data section exactly (no overlap, no gap, no trailing
 * bytes); names unique.
 * Returns FM_OK, FM_ERR_INVALID_ARG, FM_ERR_IO, FM_ERR_FORMAT, FM_ERR_OUT_OF_RANGE,
 * FM_ERR_BAD_SHAPE, FM_ERR_UNSUPPORTED (more than FM_ST_MAX_DIMS dimensions), FM_ERR_OOM. */
fm_status fm_safetensors_open(const char *path, fm_safetensors **out);

/* Same rules over a caller's buffer (borrowed: it must outlive the handle);
 * `label` names it in messages. This is the parser the fuzzer drives. */
fm_status fm_safetensors_parse(const void *buf, size_t len, const char *label, fm_safetensors **out);

/* Copy bytes [off, off + n) of t's data into dst: pread from the file of
 * fm_safetensors_open, memcpy from data otherwise (a buffer's tensor, or one
 * the caller filled in with owner_ NULL). A file that has become shorter
 * since it was opened, or fails to read, is FM_ERR_IO naming file, tensor and
 * offset. Returns FM_OK, FM_ERR_INVALID_ARG (NULL argument, [off, off + n)
 * beyond nbytes, or no data to read), FM_ERR_IO. */
fm_status fm_st_read(const fm_st_tensor *t, uint64_t off, size_t n, void *dst);

/* Tensors in file order of their data (ascending offsets). */
size_t              fm_safetensors_count(const fm_safetensors *st);
const fm_st_tensor *fm_safetensors_at(const fm_safetensors *st, size_t i); /* NULL if out of range */
/* Returns FM_OK, FM_ERR_INVALID_ARG, FM_ERR_NOT_FOUND. */
fm_status fm_safetensors_find(const fm_safetensors *st, const char *name, const fm_st_tensor **out);
/* "__metadata__" value for key, or NULL. */
const char *fm_safetensors_metadata(const fm_safetensors *st, const char *key);
/* The path (or label) given at open. */
const char *fm_safetensors_path(const fm_safetensors *st);
/* Size of the file / buffer in bytes. */
uint64_t fm_safetensors_size(const fm_safetensors *st);
void     fm_safetensors_close(fm_safetensors *st);

/* ---- writing -------------------------------------------------------------- */

/* What to write: name, dtype, shape and the bytes (size(dtype) x prod(shape)). */
typedef struct {
    const char *name;
    fm_dtype    dtype;
    int         ndim;
    int64_t     shape[FM_ST_MAX_DIMS];
    const void *data;
} fm_st_write_item;

/* Write a safetensors file: header padded with spaces to a multiple of 8 bytes,
 * tensors in the given order. metadata: n_meta key/value pairs
 * (keys[i], values[i]) or n_meta = 0. path must be absent or a regular file
 * this process may write (read-only by its mode bits is refused, for root
 * too); a symbolic link, directory, FIFO or device there is refused, never
 * followed or replaced. The file is written to an exclusive temporary next to
 * path, fsynced and renamed over it, so a failure (ENOSPC, EFBIG...) leaves
 * path as it was and no temporary behind.
 * Returns FM_OK, FM_ERR_INVALID_ARG (NULL, empty or duplicate name, bad ndim,
 * negative dim), FM_ERR_FORMAT (bad dtype), FM_ERR_IO (naming path: refused,
 * or the write failed), FM_ERR_OOM. */
fm_status fm_safetensors_write(const char *path, const fm_st_write_item *items, size_t n, const char *const *meta_keys,
                               const char *const *meta_values, size_t n_meta);

/* Write a model.safetensors.index.json: {"metadata": {"total_size": total_size},
 * "weight_map": {names[i]: files[i]}}. files[i] are names relative to the index's folder.
 * path: as fm_safetensors_write. Returns FM_OK, FM_ERR_INVALID_ARG, FM_ERR_IO, FM_ERR_OOM. */
fm_status fm_safetensors_write_index(const char *path, const char *const *names, const char *const *files, size_t n,
                                     uint64_t total_size);

/* ---- checkpoints (one file, a folder, or an index) ------------------------ */

typedef struct fm_checkpoint fm_checkpoint;

/* Open `path`:
 *   a .json file       an index {"weight_map": {tensor: file}}; shards next to it
 *   a folder           its model.safetensors.index.json if present (else the
 *                      only *.safetensors.index.json), else every *.safetensors in it
 *   any other file     one safetensors file
 * Every shard is mapped and validated now. Shard names in an index must be
 * plain file names (no '/'): a checkpoint cannot point outside its folder.
 * Every tensor the index names must be in the file it names; a name in two
 * shards is an error. config.json next to the shards, if any, is read for
 * routing settings (fm_checkpoint_load_layer). Every file is opened as in
 * fm_safetensors_open: a FIFO, device or directory is FM_ERR_IO, never a hang.
 * Returns FM_OK, FM_ERR_INVALID_ARG, FM_ERR_IO, FM_ERR_FORMAT, FM_ERR_OUT_OF_RANGE,
 * FM_ERR_BAD_SHAPE, FM_ERR_NOT_FOUND (no shards, or an indexed tensor missing),
 * FM_ERR_UNSUPPORTED, FM_ERR_OOM. */
fm_status fm_checkpoint_open(const char *path, fm_checkpoint **out);
void      fm_checkpoint_close(fm_checkpoint *ck);

/* One tensor the caller holds in memory, named and typed as a checkpoint stores
 * it (the tensor tables of docs/checkpoints.md): data holds size(dtype) x
 * prod(shape) bytes, C order (F4: two per byte). */
typedef struct {
    const char *name;
    fm_dtype    dtype;
    int         ndim;                  /* 0 = scalar, at most FM_ST_MAX_DIMS */
    int64_t     shape[FM_ST_MAX_DIMS];
    const void *data;                  /* borrowed: must outlive the checkpoint; never written */
} fm_tensor_view;

/* A checkpoint over tensors in memory: the same object fm_checkpoint_open makes
 * from files, so fm_checkpoint_scan / _find / _load_layer run the same layout
 * loaders over it (what a framework holding a model's tensors uses instead of
 * converting layouts itself). The views' names are copied; their data is
 * borrowed, read only by the loads (which copy into the loaded layer), so it
 * must stay valid and unchanged until fm_checkpoint_close. There is no
 * config.json: the routing must be given in fm_ckpt_load_opts.routing, and
 * gpt-oss's swiglu_limit is its default 7.0 (pass the model's in the layer's
 * config). label names the tensors in messages (NULL: "tensors in memory").
 * Checked before anything is kept: a NULL or empty name, a name of 512 bytes
 * or more, an unknown dtype, ndim outside [0, FM_ST_MAX_DIMS], a negative or
 * overflowing shape, an F4 tensor of an odd element count, NULL data for a
 * non-empty tensor, a name given twice.
 * Returns FM_OK, FM_ERR_INVALID_ARG (NULL views with n > 0, NULL out, a
 * missing name or data), FM_ERR_FORMAT (unknown dtype, a name twice),
 * FM_ERR_UNSUPPORTED (more than FM_ST_MAX_DIMS dimensions), FM_ERR_BAD_SHAPE
 * (negative, overflowing or half-byte shape), FM_ERR_NOT_FOUND (n == 0),
 * FM_ERR_OOM. On failure *out is NULL. */
fm_status fm_checkpoint_open_tensors(const fm_tensor_view *views, size_t n, const char *label, fm_checkpoint **out);

/* All tensors of all shards, sorted by name. */
size_t              fm_checkpoint_tensor_count(const fm_checkpoint *ck);
const fm_st_tensor *fm_checkpoint_tensor_at(const fm_checkpoint *ck, size_t i);
/* Returns FM_OK, FM_ERR_INVALID_ARG, FM_ERR_NOT_FOUND. */
fm_status fm_checkpoint_find(const fm_checkpoint *ck, const char *name, const fm_st_tensor **out);
size_t      fm_checkpoint_file_count(const fm_checkpoint *ck);
const char *fm_checkpoint_file_path(const fm_checkpoint *ck, size_t i); /* NULL if out of range */
uint64_t    fm_checkpoint_data_bytes(const fm_checkpoint *ck);           /* sum of tensor bytes */

/* ---- layouts and name patterns -------------------------------------------
 * Patterns are tensor names with placeholders: {L} layer number, {E} expert
 * number, {P} projection name. Suffixes are fixed by the layout:
 *   MODELOPT (NVFP4, or BF16 when there is no weight_scale):
 *     {expert}.{weight, weight_scale, weight_scale_2, input_scale}, one per
 *     expert E and projection P in {gate_proj, up_proj, down_proj}:
 *     weight U8 [N][K/2] (BF16 [N][K] unquantized), weight_scale F8_E4M3 [N][K/16],
 *     weight_scale_2 F32 [] or [1], input_scale F32 [] or [1] (optional).
 *   COMPRESSED_TENSORS (NVFP4 written by llmcompressor, "nvfp4-pack-quantized"):
 *     ModelOpt's patterns, suffixes {weight_packed U8 [N][K/2], weight_scale
 *     F8_E4M3 [N][K/16], weight_global_scale F32 [] or [1], input_global_scale
 *     F32 [] or [1] (absent in W4A16)}; the global scales are the RECIPROCALS of
 *     ModelOpt's: weight_scale_2 = 1 / weight_global_scale (docs/checkpoints.md).
 *   GPT_OSS (MXFP4, experts fused along dimension 0):
 *     {expert}_blocks U8 [E][N][K/32][16], {expert}_scales U8 or F8_E8M0
 *     [E][N][K/32], {expert}_bias [E][N] (optional); P in {gate_up_proj, down_proj};
 *     gate_up_proj rows interleave gate and up (row 2i = gate i, 2i+1 = up i).
 */
typedef enum {
    FM_LAYOUT_AUTO = 0,
    FM_LAYOUT_MODELOPT = 1,
    FM_LAYOUT_GPT_OSS = 2,
    FM_LAYOUT_COMPRESSED_TENSORS = 3 /* ModelOpt's names with compressed-tensors suffixes */
} fm_ckpt_layout;

/* "auto", "modelopt", "gpt-oss", "compressed-tensors". */
const char *fm_ckpt_layout_name(fm_ckpt_layout l);

typedef struct {
    fm_ckpt_layout layout;
    const char    *expert;      /* ModelOpt "model.layers.{L}.mlp.experts.{E}.{P}",
                                   gpt-oss  "model.layers.{L}.mlp.experts.{P}" */
    const char    *proj_gate;   /* ModelOpt "gate_proj"; gpt-oss "gate_up_proj" (fused) */
    const char    *proj_up;     /* ModelOpt "up_proj"; gpt-oss NULL */
    const char    *proj_down;   /* "down_proj" */
    const char    *router;      /* "model.layers.{L}.mlp.gate.weight" / "...mlp.router.weight" */
    const char    *router_bias; /* ModelOpt "model.layers.{L}.mlp.gate.e_score_correction_bias"
                                   (ranking bias, optional); NULL for gpt-oss, whose router
                                   bias is additive on the logits */
    const char    *shared;      /* "model.layers.{L}.mlp.shared_experts.{P}" (optional; BF16,
                                   or NVFP4 dequantized to BF16; P = the proj names); NULL = none */
} fm_ckpt_names;

/* Default patterns of a layout (AUTO gives MODELOPT's).
 * Returns FM_OK, FM_ERR_INVALID_ARG (NULL or unknown layout). */
fm_status fm_ckpt_names_default(fm_ckpt_layout layout, fm_ckpt_names *out);

/* What fm_checkpoint_scan found. */
typedef struct {
    fm_ckpt_layout layout;      /* detected (or the one given) */
    fm_format      wfmt;        /* NVFP4, MXFP4 or BF16 expert weights */
    int            n_layers;    /* layers with routed experts */
    int           *layers;      /* [n_layers] ascending layer numbers (owned) */
    int           *experts;     /* [n_layers] experts per layer: highest E + 1 (ModelOpt), dim 0 (gpt-oss) */
    int           *found;       /* [n_layers] distinct experts seen; < experts[i] means some are missing */
    uint64_t       expert_bytes;/* bytes of all expert tensors */
} fm_ckpt_scan;

/* Detect the layout (names->layout AUTO: whichever pattern matches tensors)
 * and list the MoE layers. names NULL = defaults of the detected layout.
 * Given names must have a known layout, non-empty patterns that cannot make
 * names of 512 bytes or more ({L}/{E} count 11, {P} 63, plus a 16-byte suffix)
 * and projection names of 1-63 bytes without '.'; else FM_ERR_INVALID_ARG
 * naming the field.
 * Returns FM_OK, FM_ERR_INVALID_ARG, FM_ERR_NOT_FOUND (no expert tensors match),
 * FM_ERR_FORMAT (expert weights of an unknown dtype), FM_ERR_OOM.
 * Free with fm_ckpt_scan_free. */
fm_status fm_checkpoint_scan(const fm_checkpoint *ck, const fm_ckpt_names *names, fm_ckpt_scan *out);
void      fm_ckpt_scan_free(fm_ckpt_scan *s);

/* ---- loading one layer ---------------------------------------------------- */

/* ---- routing settings and where they came from ---------------------------
 * A layer's routing comes from the model, never from a built-in default:
 * config.json's model_type (or architectures[0]; text_config first) selects a
 * family whose defaults are those of its transformers configuration class, and
 * the config.json keys that family's model code reads override them:
 *   deepseek_v3, deepseek_v32  sigmoid, top-8, renormalise, x2.5, 8 groups keep 4
 *   glm4_moe                   sigmoid, top-8, renormalise, x1, no groups
 *   glm_moe_dsa (GLM-5)        sigmoid, top-8, renormalise, x2.5, no groups
 *     (these read num_experts_per_tok, scoring_func, norm_topk_prob,
 *      routed_scaling_factor, n_group, topk_group)
 *   qwen2_moe, qwen3_moe       softmax, top-4 / top-8, norm_topk_prob (default
 *                              false), x1 (read: num_experts_per_tok, norm_topk_prob)
 *   mixtral                    softmax, top-2, always renormalised, x1
 *   gpt_oss                    softmax over the top-4 logits (FM_SCORE_SOFTMAX_TOPK),
 *                              router logit bias loaded, x1 (read: num_experts_per_tok
 *                              or experts_per_token)
 * A model type outside this list: every setting must be in config.json
 * (num_experts_per_tok, scoring_func, norm_topk_prob, routed_scaling_factor;
 * groups are off unless n_group is there) or given by the caller. No config.json,
 * or settings that stay unknown: an error naming them. */
enum { FM_ROUTE_TOP_K, FM_ROUTE_SCORE, FM_ROUTE_RENORMALIZE, FM_ROUTE_SCALE, FM_ROUTE_GROUPS, FM_ROUTE_N };
#define FM_ROUTE_ALL ((1u << FM_ROUTE_N) - 1u)

typedef enum {
    FM_ROUTE_FROM_NONE = 0,      /* not set (validation failed before routing) */
    FM_ROUTE_FROM_CALLER,        /* fm_ckpt_load_opts.routing (a CLI flag) */
    FM_ROUTE_FROM_CONFIG,        /* a config.json key (key names it) */
    FM_ROUTE_FROM_MODEL_DEFAULT, /* the default of the model type (fm_ckpt_layer.model_type) */
    FM_ROUTE_FROM_ABSENT         /* groups only: no key, so no groups (unknown model type) */
} fm_route_from;

typedef struct {
    fm_route_from from;
    const char   *key; /* FM_ROUTE_FROM_CONFIG: the key ("num_experts_per_tok"); else NULL */
} fm_route_origin;

/* "top_k", "score", "renormalize", "routed_scale", "groups"; NULL out of range. */
const char *fm_route_setting_name(int setting);

/* What config.json says about the model, and whether fp4moe reads its
 * quantization: quant_method "" (none given), "modelopt" (quant_algo NVFP4,
 * MIXED_PRECISION or none), "mxfp4" (gpt-oss), or
 * "compressed-tensors" with format "nvfp4-pack-quantized"; anything else is
 * FM_ERR_UNSUPPORTED "unsupported format: ...".
 * Returns FM_OK (has_config 0 when there is no config.json), FM_ERR_INVALID_ARG,
 * FM_ERR_IO, FM_ERR_FORMAT (not JSON, a used key of the wrong type), FM_ERR_UNSUPPORTED
 * (unknown scoring_func, a quantization fp4moe cannot read), FM_ERR_OOM. */
typedef struct {
    int  has_config;
    char model_type[64];
    char architecture[96];
    char quant_method[48];
    char quant_format[64];
} fm_ckpt_model_info;
fm_status fm_checkpoint_model_info(const fm_checkpoint *ck, fm_ckpt_model_info *out);

typedef struct {
    const fm_ckpt_names *names;   /* NULL: detect layout, default patterns */
    const fm_moe_config *routing; /* NULL: all routing from the model (see above).
                                     Given: its act_nvfp4 is used, and the settings
                                     routing_fields selects (0 = all five: top_k, score,
                                     renormalize, routed_scale, n_group + topk_group)
                                     override the model's. top_k is clamped to the
                                     experts loaded; groups are dropped on an EP shard. */
    unsigned routing_fields;      /* bits (1u << FM_ROUTE_x); 0 = FM_ROUTE_ALL */
    int first_expert;             /* load experts [first_expert, first_expert + n_experts) */
    int n_experts;                /* 0 = all from first_expert (an EP shard otherwise) */
    int swizzle_scales;           /* 1: also fill w13_sf_swizzled / w2_sf_swizzled */
    int global_router;            /* 1: the layer is a shard of the global layer (an expert-
                                     parallel rank): the router weight and its bias keep all
                                     the layer's experts' rows, cfg.n_experts is that total,
                                     top_k and groups are the model's; the experts' arrays hold
                                     [first_expert, first_expert + n_experts) only (n_local of
                                     them): hand cfg / w to fm_layer_desc with first_expert and
                                     n_local. gpt-oss's fused expert tensors may then hold the
                                     layer's experts or only the shard's (a rank's own tensors,
                                     taken as experts [first_expert, first_expert + n_experts)).
                                     0: a standalone layer of the loaded experts. */
    int validate_only;            /* 1: check every tensor's presence, dtype and shape, the
                                     expert indices, and every block-scale byte for NaN
                                     codes (the scales are read, 1/9 of NVFP4 expert bytes),
                                     so it rejects what a load rejects; fill cfg and the
                                     flags, but load no weights (all weight pointers NULL):
                                     what `fp4moe inspect` uses */
} fm_ckpt_load_opts;

/* One layer in fp4moe's layout; owns every buffer it points to. */
typedef struct {
    fm_moe_config   cfg;          /* shapes and format from the checkpoint, routing as above */
    fm_moe_weights  w;            /* points into the arrays below; pass to fm_layer_create */
    fm_qtensor     *w13;          /* [n_experts] [2*inter][hidden]: gate rows then up rows */
    fm_qtensor     *w2;           /* [n_experts] [hidden][inter] */
    float          *router_w;     /* [n_experts][hidden] FP32 (rows of the loaded experts) */
    float          *router_bias;  /* [n_experts] or NULL */
    float          *a1_scale;     /* [n_experts] or NULL (no input_scale in the checkpoint) */
    float          *a2_scale;     /* [n_experts] or NULL */
    uint16_t       *shared_w13;   /* BF16 or NULL */
    uint16_t       *shared_w2;    /* BF16 or NULL */
    float          *w13_bias;     /* [n_experts][2*inter] FP32 expert biases (gpt-oss), or NULL */
    float          *w2_bias;      /* [n_experts][hidden], or NULL */
    float          *w13_up_global; /* [n_experts] the up projections' weight_scale_2 (w.w13_up_global;
                                      w13[e].global_scale is the gate's), or NULL when every
                                      expert's gate and up globals agree */
    uint8_t       **w13_sf_swizzled; /* [n_experts] 128x4-swizzled scales (fm_sf_swizzle) or NULL */
    uint8_t       **w2_sf_swizzled;
    int             layer;
    int             first_expert;
    int             n_local;      /* experts held in w13, w2, a1/a2_scale, w13/w2_bias and the
                                     swizzled scales: cfg.n_experts, or the shard's count with
                                     global_router */
    int             has_router_bias;  /* the checkpoint has a ranking bias for this layer */
    int             has_input_scales; /* ... and per-expert input_scale (static W4A4 scales) */
    int             has_expert_bias;  /* ... and expert biases (gpt-oss; in w13_bias / w2_bias
                                         unless validate_only) */
    fm_ckpt_layout  layout;
    char            model_type[64];            /* config.json's ("" if none) */
    fm_route_origin route_from[FM_ROUTE_N];    /* where each routing setting came from */
    int             w13_split_globals; /* experts whose gate and up weight_scale_2 differ: both
                                          are held as stored (w13[e].global_scale and
                                          w13_up_global[e]), no block scale re-encoded (every
                                          backend applies each half's global) */
    /* Things in the checkpoint that fp4moe's layer does not model: */
    int             ignored_bias; /* 1: expert biases were not loaded (none of today's layouts:
                                     gpt-oss's load into w13_bias / w2_bias) */
    int             ignored_router_bias; /* 1: additive router logit bias (gpt-oss) not loaded
                                            (it is loaded as router_bias when the score is
                                            FM_SCORE_SOFTMAX_TOPK, whose bias is a logit bias) */
    void           *owned_;       /* internal: the allocation holding expert data */
} fm_ckpt_layer;

/* Load MoE layer `layer`: validate every tensor (dtype, shape, presence of
 * every expert and scale) before allocating, convert (gate/up concatenated or
 * de-interleaved into w13, UE8M0/E4M3 scales copied row-major, router weight to
 * FP32, shared expert to BF16) and fill cfg/weights. Nothing is read from the
 * checkpoint after this returns: it may be closed first.
 * Returns FM_OK, FM_ERR_INVALID_ARG (NULL, layer < 0, n_experts < 0, bad names:
 * see fm_checkpoint_scan; routing_fields has bits beyond FM_ROUTE_ALL),
 * FM_ERR_NOT_FOUND (layer, expert, weight or scale missing; no config.json and
 * routing not given in full), FM_ERR_FORMAT (wrong dtype; a tensor of the expert
 * pattern whose expert index is >= the router's expert count; config.json
 * unparsable, or a routing key of the wrong type), FM_ERR_BAD_SHAPE,
 * FM_ERR_OUT_OF_RANGE (expert range beyond the layer's, computed in 64 bits),
 * FM_ERR_NONFINITE (global or input scale not finite and positive, or a
 * block-scale byte that is a NaN code), FM_ERR_IO (a shard unreadable or
 * truncated since it was opened), FM_ERR_UNSUPPORTED (unknown model type with
 * settings missing, unknown scoring_func, a quantization_config fp4moe does not
 * read; also expert-like tensors, "*.experts.*", that match no layout:
 * "unsupported format: <a tensor>"), FM_ERR_OOM. On failure *out is NULL. */
fm_status fm_checkpoint_load_layer(const fm_checkpoint *ck, int layer, const fm_ckpt_load_opts *opts,
                                   fm_ckpt_layer **out);
void fm_ckpt_layer_free(fm_ckpt_layer *l);

/* ---- numpy .npy arrays (layer inputs and outputs) -------------------------
 * Versions 1.0, 2.0 and 3.0 of the format: the magic "\x93NUMPY", a version,
 * a header length (2 bytes in 1.0, 4 in 2.0/3.0), a Python dict literal
 * {'descr': ..., 'fortran_order': ..., 'shape': (...), } padded with spaces and
 * a newline, then the data, C order, nothing after it. Element types read:
 *   '<f4'            FP32                         -> FM_DTYPE_F32
 *   '<u2'            raw BF16 bits (numpy has no bfloat16)  -> FM_DTYPE_BF16
 *   '<V2' / '|V2'    what np.save writes for an ml_dtypes.bfloat16 array -> FM_DTYPE_BF16
 * Big-endian types, fortran_order True, other types, a dict with other or
 * missing keys, more than FM_ST_MAX_DIMS dimensions, or data shorter or longer
 * than the shape says are errors naming the file. */
typedef struct {
    fm_dtype dtype;                  /* FM_DTYPE_F32 or FM_DTYPE_BF16 */
    int      ndim;
    int64_t  shape[FM_ST_MAX_DIMS];
    void    *data;                   /* owned: numel x 4 or 2 bytes, C order */
    uint64_t numel;
} fm_npy;

/* Read path. Returns FM_OK, FM_ERR_INVALID_ARG, FM_ERR_IO (cannot open/read, not a
 * regular file), FM_ERR_FORMAT (not .npy, bad header, unknown version, wrong
 * dtype, truncated or trailing data), FM_ERR_UNSUPPORTED (fortran_order True,
 * big-endian), FM_ERR_BAD_SHAPE (negative or overflowing shape, too many dims),
 * FM_ERR_OOM. On failure *out is zeroed. Free with fm_npy_free. */
fm_status fm_npy_read(const char *path, fm_npy *out);
/* The same over a buffer (label names it): the parser the tests and fuzzers drive. */
fm_status fm_npy_parse(const void *buf, size_t len, const char *label, fm_npy *out);
void      fm_npy_free(fm_npy *a);

/* Write a version 1.0 .npy ('<f4' for F32, '<u2' for BF16). path: as
 * fm_safetensors_write (absent or a writable regular file; an exclusive
 * temporary renamed over it once every byte is written; a failure leaves it
 * as it was). Returns FM_OK, FM_ERR_INVALID_ARG (NULL, dtype not F32/BF16,
 * bad ndim or negative dim), FM_ERR_IO (naming path), FM_ERR_OOM. */
fm_status fm_npy_write(const char *path, fm_dtype dtype, int ndim, const int64_t *shape, const void *data);

#ifdef __cplusplus
}
#endif
#endif
