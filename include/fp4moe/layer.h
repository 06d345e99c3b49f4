/* fp4moe/layer.h - running a MoE layer on a backend.
 *
 * Backends sit behind a small function table (check, load, run, destroy):
 *   cpu-ref : fm_moe_forward_ref, the oracle
 *   cpu     : the fast CPU path (OpenMP, vectorised), results within the
 *             bound stated in docs/accuracy.md of the reference
 *   cuda    : GPU kernels (present when the library was built with nvcc and a
 *             device is visible)
 * A layer is created once (weights prepacked / uploaded), then run many times.
 *
 * Threads: different layers may be used on different threads at the same time
 * (nothing is shared between layers but read-only tables; a cuda device may
 * carry layers used from several threads). One layer runs one call at a time:
 * fm_layer_forward, fm_layer_run, fm_layer_errors, fm_layer_plan,
 * fm_layer_set_plan, fm_layer_tune and fm_layer_workspace_size each take the
 * layer for the call, and a call that finds it taken by another call (on
 * another thread) fails at once with FM_ERR_BUSY and a message, touching
 * nothing (no output written); it never waits. So give each thread its own
 * layer, or serialise the calls; calls one after the other may come from any
 * thread. fm_layer_backend reads nothing that changes and may be called any
 * time. fm_layer_destroy while another call on the layer is in flight is a
 * caller bug: when that call is inside the library, destroy says so on stderr
 * and leaves the layer allocated (leaked) rather than free memory in use; a
 * call made after destroy returned is a use after free, as for any handle.
 * (A cuda run returns once its work is enqueued: the layer is free again while
 * the device still works; runs on one stream are ordered by the stream.)
 */
#ifndef FP4MOE_LAYER_H
#define FP4MOE_LAYER_H

#include <stdint.h>

#include <stddef.h>

#include "fp4moe/arch.h"
#include "fp4moe/moe.h"
#include "fp4moe/kernels.h"
#include "fp4moe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FM_BACKEND_AUTO = 0, /* cuda if compiled in and a device is visible, else cpu */
    FM_BACKEND_CPU_REF,
    FM_BACKEND_CPU,
    FM_BACKEND_CUDA,
    FM_BACKEND_COUNT
} fm_backend_kind;

/* "auto", "cpu-ref", "cpu", "cuda". */
const char *fm_backend_name(fm_backend_kind k);
fm_status   fm_backend_parse(const char *name, fm_backend_kind *out);

/* Whether backend k can run here: FM_OK, FM_ERR_NO_BACKEND (not compiled in),
 * FM_ERR_NO_DEVICE (cuda compiled in, no usable device). */
fm_status fm_backend_available(fm_backend_kind k);

typedef struct fm_layer fm_layer;

/* Timing of the last forward call, milliseconds (wall clock for CPU backends,
 * CUDA events around the kernels for cuda; transfers are not included). */
typedef struct {
    double ms;
} fm_run_stats;

/* Create a layer: checks cfg and weights, prepacks/uploads the weights for the
 * backend; `w` need not outlive the layer. max_tokens bounds T in forward.
 * Returns FM_OK, FM_ERR_INVALID_ARG, FM_ERR_BAD_SHAPE, FM_ERR_FORMAT,
 * FM_ERR_NO_BACKEND, FM_ERR_NO_DEVICE, FM_ERR_UNSUPPORTED, FM_ERR_SMEM_EXCEEDED,
 * FM_ERR_OOM, FM_ERR_CUDA. FM_ERR_BAD_SHAPE also when max_tokens*top_k or
 * max_tokens*hidden exceeds 2^31-1. FM_ERR_NONFINITE: a NaN scale code, a weight
 * global scale that is not finite and positive or makes a decoded weight overflow
 * FP32 (tensor and expert named), an a1/a2 scale outside its range (moe.h), a
 * NaN or Inf in router_w, router_bias, an expert bias or a BF16 shared-expert weight
 * (shared_w13 / shared_w2; tensor and element named).
 * On failure *out is NULL. */
fm_status fm_layer_create(fm_backend_kind kind, const fm_moe_config *cfg, const fm_moe_weights *w, int max_tokens,
                          fm_layer **out);

/* out[T][hidden] FP32 = layer(x[T][hidden] BF16), host pointers. 1 <= T <= max_tokens.
 * Returns FM_OK, FM_ERR_INVALID_ARG, FM_ERR_BAD_SHAPE, FM_ERR_NONFINITE (NaN/Inf in x),
 * FM_ERR_OOM (cpu-ref allocates its scratch per call), FM_ERR_CUDA, FM_ERR_BUSY
 * (another call is using the layer: see Threads above).
 * `out` is untouched on failure. stats may be NULL. */
fm_status fm_layer_forward(fm_layer *layer, const uint16_t *x, int T, float *out, fm_run_stats *stats);

/* The backend actually used ("cpu", "cuda", ...). */
fm_backend_kind fm_layer_backend(const fm_layer *layer);

void fm_layer_destroy(fm_layer *layer);

/* ==== The layer as a serving engine calls it ===============================
 *
 * open a device once -> create a layer on it (weights uploaded, buffers and
 * tiles chosen for every batch size up to max_tokens) -> fm_layer_run many
 * times on the caller's stream (asynchronous, no allocation, no host planning,
 * no synchronisation: capturable into a CUDA graph and replayable) ->
 * fm_layer_errors now and then (synchronises; reports what the device found).
 * The CPU backends take the same calls: host memory is their "device", the
 * stream is ignored, and run is synchronous.
 */

/* A CUDA device, opened once: its ordinal, limits and row of the GPU table.
 * Every CUDA call the library makes for a layer created on it runs with this
 * device current and restores the caller's current device before returning. */
typedef struct fm_cuda_device fm_cuda_device;

/* Open CUDA device `ordinal` (0-based; the caller's current device is neither
 * read nor changed). It learns here which of the build's kernels have code for the
 * device (fm_cuda_device_code); the planner, fm_layer_set_plan, fm_layer_tune and the
 * GEMMs choose only among those. Returns FM_OK, FM_ERR_INVALID_ARG (NULL out),
 * FM_ERR_OUT_OF_RANGE (no such device), FM_ERR_NO_DEVICE, FM_ERR_CUDA,
 * FM_ERR_NO_KERNEL (the build carries no code this device runs: the message names
 * the device and the build's targets), FM_ERR_NO_BACKEND (built without CUDA),
 * FM_ERR_OOM. *out is NULL on failure. */
fm_status fm_cuda_device_open(int ordinal, fm_cuda_device **out);
void      fm_cuda_device_close(fm_cuda_device *dev); /* after every layer on it is destroyed */
/* Limits read off the device (fp4moe/arch.h fm_device_info); NULL for NULL. */
const fm_device_info *fm_cuda_device_limits(const fm_cuda_device *dev);
/* Its row of the planner's GPU table (matched by compute capability, SMs and
 * memory), or NULL when no row matches (the planner then uses the limits only). */
const fm_gpu_info *fm_cuda_device_gpu(const fm_cuda_device *dev);

/* What this build carries for the device. */
typedef struct {
    char targets[160]; /* every GPU target of the build: "sm_80 sm_90a sm_100f sm_120f" */
    char running[32];  /* the one whose code this device runs: "sm_90a"; a compute_NN target
                          when the driver JIT-compiled PTX (jit = 1) */
    int  jit;
    int  mma_tiles, wgmma_tiles; /* catalogue rows with code here, per kernel family */
    int  driver_version, runtime_version; /* cudaDriverGetVersion / cudaRuntimeGetVersion (13000 = 13.0) */
} fm_cuda_code_info;
/* Returns FM_OK, FM_ERR_INVALID_ARG (NULL), FM_ERR_NO_BACKEND (built without CUDA). */
fm_status fm_cuda_device_code(const fm_cuda_device *dev, fm_cuda_code_info *out);
/* The build's GPU targets ("sm_80 sm_90a sm_100f sm_120f"; without CUDA, those an equal
 * CUDA build would carry), without a device. Never NULL. */
const char *fm_cuda_build_targets(void);

enum { FM_WORK_LIST_OFF = -1, FM_WORK_LIST_AUTO = 0, FM_WORK_LIST_ON = 1, FM_WORK_LIST_MIN_SPLITS = 4 };
/* fm_layer_desc.pdl_chain */
enum { FM_PDL_CHAIN_OFF = -1, FM_PDL_CHAIN_AUTO = 0 };
/* fm_layer_desc.decode_path */
enum { FM_DECODE_PATH_OFF = -1, FM_DECODE_PATH_AUTO = 0, FM_DECODE_PATH_ON = 1 };
/* fm_layer_desc.act_fp8_path */
enum { FM_FP8_PATH_EVERY = 0, FM_FP8_PATH_FASTER = 1 };
/* fm_layer_desc.row_quantile's special values and its AUTO rule */
#define FM_ROW_QUANTILE_AUTO 0.0f
#define FM_ROW_QUANTILE_MEAN (-1.0f)
#define FM_ROW_QUANTILE_AUTO_Q 0.9f
#define FM_ROW_QUANTILE_AUTO_MIN_T 32

typedef enum {
    FM_OUT_F32 = 0,  /* out: FP32 [T][hidden] */
    FM_OUT_BF16 = 1, /* out: BF16 [T][hidden] (round to nearest even) */
} fm_out_dtype;

/* How a layer is created. Zero-initialise, then set what differs:
 * {.backend = FM_BACKEND_CUDA, .device = dev, .max_tokens = 256}. */
typedef struct {
    fm_backend_kind backend;    /* AUTO: cuda when a device is given or visible, else cpu */
    fm_cuda_device *device;     /* cuda: the device (NULL: the library opens ordinal 0 for the layer) */
    int             max_tokens; /* largest T a run may pass (>= 1) */
    fm_out_dtype    out_dtype;
    /* Expert shard: the layer holds experts [first_expert, first_expert + n_local)
     * of the cfg->n_experts global experts; routing (internal or external) is over
     * global ids and only local experts are computed, so `out` is this shard's
     * partial sum: the shards' outputs summed are the whole layer. n_local = 0:
     * all experts. With a shard, fm_moe_weights.w13/w2/a1_scale/a2_scale hold the
     * n_local local experts; router_w/router_bias stay global. The shared expert
     * (if any) is computed by the shard with first_expert == 0 only. */
    int             first_expert, n_local;
    /* 1: the caller passes workspace to every run (fm_layer_workspace_size bytes,
     * 256-byte aligned, in the layer's memory space); 0: the layer owns it. */
    int             caller_workspace;
    /* cuda: whether decode buckets run the mma GEMMs over the list of experts that
     * have rows (a grid sized for the experts expected to have rows) with K split
     * where few experts would leave SMs idle (docs/cuda-gemm.md, "Decode on a few
     * experts"). FM_WORK_LIST_AUTO (0, default): in the buckets where the planner
     * splits FC1's K at least FM_WORK_LIST_MIN_SPLITS ways (a shard's first tokens;
     * measured faster there, slower elsewhere: bench/RESULTS.md, "The work list, A/B");
     * FM_WORK_LIST_ON: every bucket the planner splits or not; FM_WORK_LIST_OFF: never
     * (grids over every local expert). The CPU backends ignore it. */
    int             decode_work_list;
    /* cuda: the rows per expert each bucket's tiles are chosen for.
     * FM_ROW_QUANTILE_AUTO (0, default): the 0.9-quantile of an expert's row count
     * (FM_ROW_QUANTILE_AUTO_Q) in the buckets of at least FM_ROW_QUANTILE_AUTO_MIN_T
     * tokens, the mean below. FM_ROW_QUANTILE_MEAN (-1): the mean everywhere (T * top_k
     * routed slots spread evenly). q in [0.5, 1): the q-quantile everywhere. The quantile
     * is that of Binomial(T, top_k / n_experts), the rows of one expert under uniform
     * random routing, where it exceeds the mean. Why: a tile holds 8 * NT rows per pass
     * and an expert with more re-streams its weights, so a tile sized for the mean runs
     * ~40 % of the experts twice when the mean is a tile's capacity. Measured on the H200
     * (GLM-5, bench/RESULTS.md, "Tiles for the 0.9-quantile of an expert's rows"): 0.9 against the mean, graph
     * replay, EP8 shard T = 256 317 -> 258 us, T = 1,024 435 -> 395, T = 32 157 -> 146;
     * all-local T = 32 294 -> 247; T = 64-128 and 4,096 within 3 %. Below 32 tokens it is
     * not measured (on the EP8 shard it picks the same tiles there). The CPU backends
     * ignore it. */
    float           row_quantile;
    /* cuda: a plan file (fm_layer_save_plans) to take the buckets' plans from, or NULL.
     * Used only where its metadata match this device and build exactly (GPU name,
     * compute capability, SMs, driver and runtime versions, library version, GPU
     * targets) and it has this layer's shape (format, experts, top-k, sizes, shard,
     * max_tokens, activation); otherwise the planner's plans are used and
     * fm_layer_plans_note says why (so too when path does not exist yet: a first run that
     * tunes and saves). A file that is not a plan file, or whose matching
     * plans this layer refuses (fm_layer_set_plan), fails create with FM_ERR_FORMAT:
     * plans are taken all or none. The CPU backends ignore it (a note says so). */
    const char     *plans;
    /* cuda: FM_PDL_CHAIN_AUTO (0, default): where the device has programmatic dependent
     * launch (compute capability 9.0+), the gather and the finalize reduce are launched with
     * it like the GEMMs, so each starts while the kernel before it drains (H200, GLM-5 EP8
     * graph replay: T = 1 22.7 -> 20.9 us, T = 2 41.2 -> 37.2, T = 4-64 unchanged;
     * bench/RESULTS.md). FM_PDL_CHAIN_OFF (-1): those two launched plainly (an A/B, or a
     * driver whose PDL misbehaves); the GEMMs keep theirs. The CPU backends ignore it. */
    int             pdl_chain;
    /* cuda: which buckets run the one-launch decode kernel (docs/decode-kernel.md: routing,
     * FC1, FC2 and the finalize in one persistent launch, no gather) instead of the chain of
     * launches. FM_DECODE_PATH_AUTO (0, default): the buckets where it measured faster than
     * the chain, i.e. those expecting at most one routed slot on the layer's experts
     * (T x top_k x n_local / n_experts <= 1: an EP shard at T = 1 or 2) with at most 8
     * routed slots, in layers without the shared expert, on compute capability 9.x only
     * (where it has run); the chain elsewhere. fm_layer_plan_info.decode
     * says which; fm_layer_set_plan / fm_layer_tune may choose either per bucket.
     * At 1 token the kernel is a cooperative launch of every SM (grid from the occupancy
     * query at install; its CTAs take their units by strides, which needs them all
     * resident); from 2 tokens, and wherever that cooperative launch is refused (fewer SMs
     * available to the process than the device reports: MPS with an SM limit), a plain
     * launch whose CTAs take their units from a counter (no residency needed, the same
     * bits; fm_layer_plan_info.decode_counter).
     * FM_DECODE_PATH_ON (1): every bucket of at most 128 routed slots
     * (T x top_k) where the layer can run it (BF16 activations: plain SwiGLU or gpt-oss's
     * with its expert biases; fm_layer_plan_info.decode_note says why not elsewhere);
     * FM_DECODE_PATH_OFF (-1): none. The CPU backends ignore it. */
    int             decode_path;
    /* cuda, a W4A8 layer (cfg act_fp8 set): whether act_fp8 is required or allowed.
     * FM_FP8_PATH_EVERY (0, default): required: every bucket runs the W4A8 chain, so every
     * output has W4A8's numerics (the cpu-ref layer of the same cfg is its oracle).
     * FM_FP8_PATH_FASTER (1): allowed: each bucket runs W4A8 where the plan expects it to be
     * faster than the W4A16 chain the layer also holds, and W4A16 elsewhere
     * (fm_layer_plan_info.act_fp8 says which; a W4A16 bucket's output is that of the same
     * layer without act_fp8, whose cpu-ref layer is then the oracle). The planner's rule is
     * the measured one: no bucket has yet measured W4A8 faster on any GPU (bench/RESULTS.md,
     * issue 34), so the planner picks W4A16 everywhere; fm_layer_tune times both in each
     * bucket it tunes and keeps the faster, and fm_layer_set_plan may choose either. Without
     * act_fp8 it changes nothing (W4A16 everywhere). The CPU backends ignore it (they run what
     * cfg says). */
    int             act_fp8_path;
} fm_layer_desc;

/* Create a layer from a description. Statuses as fm_layer_create, plus
 * FM_ERR_INVALID_ARG (NULL desc, a shard outside [0, n_experts), a device given
 * to a CPU backend) and FM_ERR_OUT_OF_RANGE (first_expert/n_local overflow). */
fm_status fm_layer_create_desc(const fm_layer_desc *desc, const fm_moe_config *cfg, const fm_moe_weights *w,
                               fm_layer **out);

/* fm_layer_supports's features: the optional weights a layer will be given that
 * fm_moe_config does not name (a bit set when the pointer will be non-NULL). */
#define FM_FEATURE_EXPERT_BIAS 0x1u /* fm_moe_weights.w13_bias / w2_bias (gpt-oss) */
#define FM_FEATURE_ROUTER_BIAS 0x2u /* fm_moe_weights.router_bias */
#define FM_FEATURE_A_SCALE     0x4u /* fm_moe_weights.a1_scale / a2_scale (static input scales) */
#define FM_FEATURE_ALL         0x7u

/* Whether fm_layer_create_desc(desc, cfg, w) would create the layer, asked before any
 * weight exists (an engine choosing its MoE backend): FM_OK, or the status and message
 * create gives for it, from the same checks (the description, fm_moe_config_check, the
 * backend's presence and device, and the backend's own refusals: e.g. cuda refuses
 * act_nvfp4 and act_fp8). features:
 * FM_FEATURE_* of the weights to come. Not judged: the weights' values and shapes (create's
 * fm_moe_weights checks), and memory (FM_ERR_OOM). desc->backend AUTO answers for the
 * backend create would pick; cuda without desc->device opens ordinal 0 as create does and
 * closes it again. The message goes to why (why_len bytes, NUL-terminated, cut if longer;
 * "" on FM_OK; why may be NULL) and, on a refusal, to fm_last_error. Changes nothing else.
 * FM_ERR_INVALID_ARG also for NULL desc / cfg or unknown feature bits. */
fm_status fm_layer_supports(const fm_layer_desc *desc, const fm_moe_config *cfg, unsigned features, char *why,
                            size_t why_len);

/* Bytes of workspace one run needs (at max_tokens); 0 when the layer owns it.
 * An engine that owns its memory creates the layer with desc.caller_workspace = 1,
 * asks this once and passes that many bytes (256-byte aligned) to every run. */
fm_status fm_layer_workspace_size(const fm_layer *layer, size_t *bytes);

typedef struct {
    const uint16_t *x;            /* [T][hidden] BF16, in the layer's memory space, 16-byte aligned */
    int             T;            /* 1 <= T <= max_tokens */
    /* External routing: [T][top_k] global expert ids (int32) and weights (FP32),
     * in the layer's memory space; id -1 = no expert (skipped); ids of other
     * shards are skipped; any other id outside [0, n_experts) is skipped and
     * counted (fm_layer_errors). Weights are used as given (no renormalisation,
     * no routed_scale). Both NULL: internal routing (router GEMM + fm_moe_route). */
    const int32_t *topk_ids;
    const float   *topk_weights;
    void          *out;           /* [T][hidden] of desc.out_dtype, 16-byte aligned; fully written */
    void          *workspace;     /* desc.caller_workspace: fm_layer_workspace_size bytes, else NULL */
    void          *stream;        /* cudaStream_t of the layer's device (NULL: its legacy default stream);
                                     ignored by the CPU backends */
    /* Internal routing only (NULL with external routing): where the run also writes
     * the [T][top_k] global ids (int32) and weights (FP32) its router chose, in the
     * layer's memory space, 4-byte aligned; both or neither. What an engine needs for
     * an expert-parallel dispatch, and what a test passes back as external routing
     * (the same output, bit for bit). CPU backends write them only on success. */
    int32_t       *routed_ids;
    float         *routed_weights;
} fm_layer_run_args;

/* Run the layer. cuda: asynchronous on a->stream, launches only (no allocation,
 * host planning or synchronisation): capturable into a CUDA graph; what only
 * the device can see (ids out of range, NaN/Inf in x or in the router logits)
 * is recorded for fm_layer_errors and the output is still fully written (rows
 * of bad ids skipped). CPU backends: synchronous; they return those statuses
 * directly and leave out untouched. A layer runs one call at a time (its
 * buffers, or one workspace, are shared by the calls in flight on one stream): a
 * call while another call of the layer is running (another thread) is FM_ERR_BUSY,
 * out untouched (Threads, at the top).
 * Returns FM_OK, FM_ERR_INVALID_ARG (NULL layer/x/out, only one of ids/weights or
 * of routed_ids/routed_weights, routed_* with external routing, workspace missing
 * or given wrongly), FM_ERR_BAD_SHAPE (T outside
 * [1, max_tokens]), FM_ERR_MISALIGNED (x, out or workspace), FM_ERR_CUDA (a
 * launch failed; capture errors included), FM_ERR_BUSY; CPU backends also
 * FM_ERR_OUT_OF_RANGE (an id outside [-1, n_experts)), FM_ERR_NONFINITE. */
fm_status fm_layer_run(fm_layer *layer, const fm_layer_run_args *a);

/* Expert parallelism: rows an all-to-all dispatch (NCCL EP, DeepEP, pplx) already sent to
 * this layer's experts, read where the dispatch left them and answered in the layout its
 * combine reads (docs/serving.md, "Expert parallelism"). The layer is the shard of the
 * experts this rank holds (fm_layer_desc first_expert / n_local); routing happened before the
 * dispatch, so the router is not run, and the shared expert, which works on the original
 * tokens, is not part of it (a layer with one refuses: run the shared expert apart). */
typedef enum {
    /* low-latency layout: x [n_local][capacity][hidden], counts[e] rows of local expert e
     * at the start of its block (DeepEP / NCCL EP low-latency, pplx) */
    FM_DISPATCH_EXPERT_MAJOR = 1,
    /* high-throughput layout: x [rows][hidden], local expert e's rows contiguous at
     * [offsets[e], offsets[e + 1]) */
    FM_DISPATCH_EXPERT_ROWS = 2,
} fm_dispatch_layout;

typedef struct {
    fm_dispatch_layout layout;
    const uint16_t    *x;        /* BF16 rows in `layout`, the layer's memory space, 16-byte aligned */
    /* Or FP8 rows, as an FP8 dispatch sends them (DeepEP / NCCL EP low latency): x_fp8 E4M3
     * [rows in `layout`][hidden] (16-byte aligned) and x_scales FP32 [rows in `layout`]
     * [ceil(hidden / 128)], one per 128 channels, finite and > 0; the row is q * scale, used as
     * it is (not quantized again). Exactly one of x / x_fp8. FP8 rows need a W4A8 layer with
     * scales per 128 (act_fp8 = FM_ACT_FP8_BLOCK128): the same numbers its own quantization
     * of BF16 rows makes, so FC1 runs at FP8 either way. */
    const uint8_t     *x_fp8;
    const float       *x_scales;
    const int32_t     *counts;   /* EXPERT_MAJOR: [n_local] rows per local expert, each in [0, capacity] */
    int                capacity; /* EXPERT_MAJOR: row slots per local expert in x and out (>= 1) */
    const int32_t     *offsets;  /* EXPERT_ROWS: [n_local + 1], offsets[0] = 0, non-decreasing */
    /* Each row's routing weight, indexed as its row ([n_local][capacity] or [rows]): the
     * output row is multiplied by it. NULL: the rows are the experts' plain outputs and the
     * combine applies the weights (as DeepEP's and NCCL EP's combine take topk_weights). */
    const float *weights;
    void        *out;       /* the same layout as x, desc.out_dtype, 16-byte aligned: every
                               received row written; the slots past counts[e] (EXPERT_MAJOR) are not */
    void        *workspace; /* as fm_layer_run_args */
    void        *stream;    /* as fm_layer_run_args */
    /* The most rows this call can receive in all, as the caller knows it (0: not given, the
     * layer's max_tokens x top_k; more than that is cut to it): the rows x and out hold in the
     * expert-rows layout, or R ranks x T tokens x top_k. The cuda backend sizes the run for it
     * (the plan of ceil(bound / top_k) tokens' bucket), so an expert-rows run of few rows costs
     * what fm_layer_run of those tokens costs instead of a run of max_tokens; rows past it are
     * FM_ERR_BAD_SHAPE (checked on the device there, as the counts are). Negative:
     * FM_ERR_INVALID_ARG. */
    int          max_rows;
} fm_layer_dispatch_args;

/* Run the layer's experts on dispatched rows: out row = W2_e act(W13_e x row) (+ the
 * expert biases; x rows NVFP4-rounded when act_nvfp4), times the row's weight when weights
 * is given; each row's result is bit-identical to that row's expert output in fm_layer_run
 * of the same rows. The rows received must fit the layer: at most max_tokens * top_k in
 * all (a rank that receives T tokens from each of R ranks needs max_tokens >= R * T).
 * Returns FM_OK, FM_ERR_INVALID_ARG (NULL layer/args/out, neither or both of x and x_fp8,
 * x_fp8 without x_scales or to a layer that is not W4A8 per 128, a bad layout, the layout's
 * counts or offsets missing, capacity < 1, max_rows < 0, workspace as fm_layer_run),
 * FM_ERR_BAD_SHAPE (a count outside [0, capacity], offsets not starting at 0 or decreasing,
 * more rows than max_rows or than the layer holds), FM_ERR_MISALIGNED, FM_ERR_NONFINITE (NaN/Inf in a received row or weight,
 * an FP8 row's NaN code, a scale not finite and > 0, an output that overflowed),
 * FM_ERR_UNSUPPORTED (a layer with a shared expert; x_fp8 to a backend without W4A8; on the
 * cuda backend, a W4A8 layer's rows unless the build enables them), FM_ERR_CUDA,
 * FM_ERR_BUSY. CPU backends: synchronous, every check above made before anything is
 * written; out is untouched on failure.
 * cuda backend: BF16 rows on a W4A16 layer. A W4A8 layer's rows (BF16, quantized as
 * fm_layer_run quantizes x; or FP8, used as they are, a NaN code or a bad scale reported as
 * a NaN row element) run the W4A8 chain only in a build with cmake
 * -DFM_CUDA_W4A8_DISPATCH=ON: built and checked on the host, not yet run on a GPU, so the
 * default build refuses them (FM_ERR_UNSUPPORTED, naming the option). Asynchronous on a->stream, launches only (no
 * allocation, no host synchronisation: capturable into a CUDA graph), like fm_layer_run.
 * The host checks the arguments (pointers, layout, capacity, alignment, workspace, FP8,
 * shared expert; n_local x capacity < 2^31); counts / offsets are device data and are
 * checked on the device: a bad expert (count outside [0, capacity], offsets[0] != 0, an
 * expert's range not within the offsets before and after it, rows past max_rows or
 * max_tokens x top_k)
 * gets no rows (its out rows untouched, the other experts' rows still right) and is
 * reported by fm_layer_errors as FM_ERR_BAD_SHAPE (bad_experts, first_bad_expert); NaN/Inf
 * in a received row or weight as FM_ERR_NONFINITE (first_nonfinite = row x hidden + column
 * of x's layout; nonfinite_weights), the rows still written; an output that overflowed is
 * not checked. Each row's result there is the FC2 epilogue's weight x row, which the
 * token-order run then sums in slot order: with weights given, summing the dispatched rows
 * of each token in slot order (FP32, from 0) gives fm_layer_run's FP32 output bit for bit
 * where both runs use the same bucket's plan (run_dispatched uses the bucket of
 * ceil(bound / top_k) tokens, bound = the smallest of n_local x capacity (expert-major),
 * max_rows when given and max_tokens x top_k); without weights a row is the plain row and
 * the combine's weight x row rounds once more (within an ulp of the product). */
fm_status fm_layer_run_dispatched(fm_layer *layer, const fm_layer_dispatch_args *a);

/* What the device recorded since the last call, then cleared. */
typedef struct {
    long long bad_ids;        /* routed slots whose id was outside [-1, n_experts) */
    long long first_bad_slot; /* smallest such slot t*top_k + j, or -1 */
    int       nonfinite_x;    /* 1: NaN/Inf in x (in a row the layer read) */
    long long first_nonfinite;/* smallest t*hidden + c, or -1 */
    int       nonfinite_logits; /* 1: a router logit overflowed (internal routing) */
    long long nonfinite_weights; /* external topk_weights of local slots (or weights of dispatched
                                    rows) that were NaN/Inf */
    /* fm_layer_run_dispatched on the cuda backend: local experts whose rows were skipped (a
     * count outside [0, capacity], offsets not starting at 0 or decreasing around the expert,
     * rows past max_tokens x top_k), and the smallest of them, or -1 */
    long long bad_experts;
    long long first_bad_expert;
} fm_layer_error_info;

/* Synchronise `stream` (the one runs were enqueued on), read and clear what the
 * device recorded. info may be NULL. Returns FM_OK (nothing recorded),
 * FM_ERR_BAD_SHAPE (a dispatched run's bad counts / offsets: bad_experts),
 * FM_ERR_OUT_OF_RANGE (bad ids), FM_ERR_NONFINITE (NaN/Inf in x, a logit, or an
 * external weight), FM_ERR_CUDA (an
 * asynchronous failure of an earlier run), FM_ERR_INVALID_ARG, FM_ERR_BUSY (another call
 * is using the layer; nothing read or cleared). CPU backends: FM_OK (or FM_ERR_BUSY). */
fm_status fm_layer_errors(fm_layer *layer, void *stream, fm_layer_error_info *info);

/* What a run of T tokens launches: the cuda layer's plan for T's bucket, chosen once at
 * create (the run only looks it up). For an engine's logs and for benchmarks that time
 * the same kernels alone (bench/bench_layer.c). */
typedef struct {
    int     bucket_tokens;     /* the largest T of T's bucket: the next power of two, at most max_tokens */
    int     expected_rows;     /* rows per expert the tiles were chosen for (fm_layer_desc.row_quantile) */
    int     active_experts;    /* local experts the bucket expects to have rows */
    int     work_list;         /* 1: the GEMMs run over the list of experts with rows (decode_work_list) */
    fm_tile tile[2];           /* FC1 (gate/up + SwiGLU), FC2 (down + weighted finalize); fm_tile_name */
    int     k_splits[2];       /* 1: K not split */
    int     x_packed[2];       /* 1: the GEMM's X in the packed layout (docs/cuda-gemm.md) */
    int     feature_blocks[2]; /* output feature blocks a CTA covers */
    /* 1: T's bucket runs the one-launch decode kernel (fm_layer_desc.decode_path) and the
     * fields above describe the chain it replaces (kept, so that decode = 0 restores it);
     * 0: the chain. decode_k_splits: its FC1 / FC2 K splits (set_plan: 0 = automatic, about
     * one wave of units over the active experts; 1..32 and at most the GEMM's K stages of
     * 128); decode_ctas: its grid, every CTA resident (occupancy x SMs; reported, ignored by
     * set_plan); decode_note: "" when the bucket can run it, else why not (FP8 / FP4
     * activations, more than 128 routed slots, no code for the device), NUL-terminated. */
    int     decode;
    int     decode_k_splits[2];
    int     decode_ctas;
    char    decode_note[96];
    /* 1: T's bucket runs the W4A8 chain (FP8 activations, the W4A8 GEMM: the tile fields above
     * are then unused); 0: the W4A16 chain. A W4A8 layer (cfg act_fp8) reports 1 in every
     * bucket under FM_FP8_PATH_EVERY and the planner's or tuner's choice under
     * FM_FP8_PATH_FASTER; any other layer 0. set_plan: 1 only on a W4A8 layer, 0 on one only
     * under FM_FP8_PATH_FASTER (else FM_ERR_UNSUPPORTED). */
    int     act_fp8;
    /* where decode = 1: how the decode kernel's CTAs find their units, 1 from a counter (the
     * free CTAs take the next: from 2 tokens, where it measured faster), 0 by strides of the
     * grid (T = 1); $FM_DECODE_UNITS = static / counter / auto, read at create, overrides it
     * (an A/B knob). The sums do not depend on it. Reported, ignored by set_plan. */
    int     decode_counter;
} fm_layer_plan_info;

/* The plan a run of T tokens uses into *info (written only on FM_OK). Returns FM_OK,
 * FM_ERR_INVALID_ARG (NULL layer or info), FM_ERR_BAD_SHAPE (T outside [1, max_tokens]),
 * FM_ERR_UNSUPPORTED (a CPU backend: no tiles to report), FM_ERR_BUSY. */
fm_status fm_layer_plan(const fm_layer *layer, int T, fm_layer_plan_info *info);

/* Replace the plan of T's bucket (every T of the bucket fm_layer_plan reports): an
 * engine's tuned configuration, or a benchmark's sweep. info as fm_layer_plan writes it:
 * tile[g], k_splits[g] (>= 1), x_packed[g], feature_blocks[g] (>= 1) of FC1 / FC2, and
 * work_list with active_experts (the experts its grid is sized for, in [1, n_local]);
 * expected_rows is kept for fm_layer_plan (informational); bucket_tokens is ignored. Each
 * GEMM's choice is checked as its launch would check it (tile compiled in, wgmma only on
 * sm_90a, shared memory within the device's limit, SwiGLU pairs, packed X only for wgmma
 * tiles on sm_90a with K % 64 == 0, K splits only for an mma tile's plain kernel and at
 * most its K stages, the work list only with mma tiles of one feature block; decode = 1 only
 * where decode_note would be "" and with decode_k_splits in range), so a plan
 * that fails is refused here, never at a run. May allocate (a larger split-K buffer):
 * call it between runs, with no run of the layer in flight, and re-capture any graph of
 * the layer captured before it. Returns FM_OK, FM_ERR_INVALID_ARG (NULL, a value outside
 * its range), FM_ERR_BAD_SHAPE (T outside [1, max_tokens]), FM_ERR_UNSUPPORTED (a choice
 * the device or the GEMM cannot run, or a CPU layer), FM_ERR_SMEM_EXCEEDED, FM_ERR_CUDA,
 * FM_ERR_BUSY; the layer's plans are unchanged on failure. */
fm_status fm_layer_set_plan(fm_layer *layer, int T, const fm_layer_plan_info *info);

/* The NMSE bound of a backend's layer output against the cpu-ref backend (the oracle) on the
 * same weights, inputs and routing, for cfg's activations (src/accuracy.c has the table and
 * why; docs/accuracy.md): what `fp4moe run --check` enforces and the tests assert. Returns
 * FM_OK, FM_ERR_INVALID_ARG (NULL, AUTO or an unknown backend). */
fm_status fm_layer_accuracy(fm_backend_kind backend, const fm_moe_config *cfg, double *nmse_bound);

/* Write every bucket's plan of the layer (cuda) into the plan file at path, in the
 * section of this device and build (the metadata fm_layer_desc.plans matches), replacing
 * the entry of this layer's shape and keeping every other section and shape; PATH is
 * written only if absent or a regular file (an exclusive temporary renamed over it). What
 * fm_layer_tune found survives the process: tune the buckets an engine runs, save, and
 * create with desc.plans next time. Returns FM_OK, FM_ERR_INVALID_ARG, FM_ERR_UNSUPPORTED
 * (a CPU layer), FM_ERR_FORMAT (path holds something that is not a plan file: left
 * alone), FM_ERR_IO, FM_ERR_OOM, FM_ERR_BUSY. */
fm_status fm_layer_save_plans(fm_layer *layer, const char *path);
/* What create did with desc.plans, for the caller to log or warn about: "" (none given),
 * "loaded N bucket plans from F", or why F was not used ("written for NVIDIA B200 ...",
 * "no plans for this layer's shape"). Never NULL; valid while the layer lives. */
const char *fm_layer_plans_note(const fm_layer *layer);

/* What fm_layer_tune did. Times are graph replays of T tokens (synthetic routing,
 * external ids; the mean over 8 routings of each routing's median), interleaved. */
typedef struct {
    int    plans_tried;   /* plans of the search (fm_layer_set_plan refusals included) */
    int    plans_refused; /* of them, refused by fm_layer_set_plan (not timed) */
    double before_us;     /* the plan the bucket had */
    double after_us;      /* the plan it has now (before_us when unchanged) */
    int    changed;       /* 1: a plan at least 3 % faster than the one it had was kept */
} fm_layer_tune_info;

/* Tune T's bucket on the device: the current plan and others (every compiled tile that
 * suits the bucket's rows x K splits x the work list, a coordinate descent over FC1 then
 * FC2) timed as graph replays of T tokens with synthetic routing over the layer's
 * experts, and the fastest kept through fm_layer_set_plan if it is at least 3 % faster
 * than the current one, re-timed against it interleaved (the spread of a replay is a few
 * percent). What vLLM's tuned configs and FlashInfer's autotuner do, for one bucket: call
 * it for the T an engine runs (decode batch sizes) after create, before capturing graphs.
 * Synchronous: it waits for the work on `stream` (NULL: the legacy default stream), then
 * runs on a stream of its own (graphs are not captured from the legacy stream); seconds
 * per bucket; allocates and frees its own inputs and stream; runs the layer, so no other
 * run of it may be in flight, and graphs captured before must be re-captured. Measured on the H200 (GLM-5,
 * bench/RESULTS.md, "Call C"): the planner's plan was within 0-6 % of the
 * best of 108 at 1-16 tokens, so expect small gains there; it exists for the devices the
 * planner's model was not fitted on. info may be NULL. Returns FM_OK,
 * FM_ERR_INVALID_ARG (NULL layer), FM_ERR_BAD_SHAPE (T outside [1, max_tokens]),
 * FM_ERR_UNSUPPORTED (a CPU layer), FM_ERR_OOM, FM_ERR_CUDA, FM_ERR_BUSY (another call is
 * using the layer; the tuner's own calls on it, on this thread, are not refused: they
 * are its work); on failure the bucket keeps the plan it had. */
fm_status fm_layer_tune(fm_layer *layer, int T, void *stream, fm_layer_tune_info *info);

#ifdef __cplusplus
}
#endif
#endif
