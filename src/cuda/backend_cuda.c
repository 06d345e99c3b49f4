/* backend_cuda.c - the "cuda" backend: the routed MoE layer on the GPU, as a
 * serving engine calls it (fp4moe/layer.h: fm_layer_run).
 *
 * run(x[T][H] on the device, the caller's stream): launches only, no host
 * round trip, no allocation, no planning (CUDA-graph capturable):
 *   1. internal routing: router logits (route.cu, bit-identical to the CPU's),
 *      then scores, bias, group limit, top-k, weights as fm_moe_route (a NaN/Inf
 *      logit is recorded on the device); external routing: the caller's
 *      topk_ids / topk_weights are read directly by step 2;
 *   2. the stable permutation of the shard's local slots (fm_moe_permute's
 *      order): offsets, perm, row weights, token slots (-1 for slots left out:
 *      id -1, another shard's expert, a bad id, which is counted);
 *   3. gather the routed rows into expert order (NaN/Inf in x recorded);
 *   4. FC1 + SwiGLU: fm_cuda_gemm(FM_CUDA_EPI_SWIGLU) -> h[rows][inter] BF16 (separate gate
 *      and up globals applied by the epilogue, block scales as stored: create_w13)
 *      (X gathered and h written in the prepack K order where the planner
 *      prefers the packed-X wgmma kernel);
 *   5. the BF16 shared expert (the shard holding expert 0 only);
 *   6. FC2 + FINALIZE_DET: out[t] = (shared) + sum over t's local slots of
 *      weight * (h . W2^T) in slot order (deterministic), FP32 or BF16.
 * Tiles: the layer's bucket policy (src/layer/buckets.c) chooses them at create for
 * every batch-size bucket (T a power of two up to max_tokens); layer_plan.c resolves
 * each GEMM into an fm_gemm_plan then, and run looks its bucket up and launches. The
 * GEMMs get max_rows = T * top_k: the row counts live only on the device (offsets).
 * Devices: every CUDA call runs with the layer's device current and restores
 * the caller's device. fm_layer_forward (host pointers) runs on a private
 * stream of the layer: upload, run, one sync, the error word, download.
 * gpt-oss: softmax-topk routing in step 1 (route.cu); its clamped SwiGLU and the FC1 bias
 * in FC1's epilogue (step 4), the FC2 bias in FC2's (step 6: (h . W2^T + b2) x weight per
 * row, before the slot-order sum), both in kernel_common.cuh's epilogues, which every
 * kernel family, the work list, K splits and the multi-block kernel end in.
 * run_dispatched (fm_layer_run_dispatched, layer_run.c): steps 3, 4 and 6 on rows an
 * expert-parallel dispatch left in place (BF16), their counts / offsets read and checked on
 * the device, each row's result stored back to its own row of out.
 * W4A8 (act_fp8, sm_89+, hidden and inter multiples of 64): every bucket runs the chain of
 * enqueue_w4a8 (layer_run.c: FP8 gather, the W4A8 GEMM of gemm_fp8.cu for FC1
 * and FC2, the activation in FP32 between them, the same deterministic reduce); create packs
 * the experts for that GEMM too (create_w4a8: the W4A16 prepack is kept, so the weights are
 * held twice on the device). run_dispatched runs a W4A8 layer's rows (BF16 or FP8) in a build
 * with FM_CUDA_W4A8_DISPATCH (layer_run.c; the default); a build without it refuses them.
 * Not done yet: act_nvfp4: create returns FM_ERR_UNSUPPORTED.
 */
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cuda/cuda_internal.h"
#include "cuda/decode.h"
#include "cuda/gemm_fp8.h"
#include "cuda/gemm_plan.h"
#include "cuda/layer_cuda.h"
#include "cuda/moe_kernels.h"

fm_status fm_cuda_layer_fail(int err, const char *what)
{
    const cudaError_t e = (cudaError_t)err;
    (void)cudaGetLastError();
    if (e == cudaErrorMemoryAllocation) return fm_fail(FM_ERR_OOM, "cuda backend: %s: %s", what, cudaGetErrorString(e));
    return fm_fail(FM_ERR_CUDA, "cuda backend: %s: %s", what, cudaGetErrorString(e));
}

static fm_status cuda_available(void)
{
    int n = 0;
    if (fm_device_count(&n) != FM_OK)
        return fm_fail(FM_ERR_NO_DEVICE, "cuda backend: no usable CUDA device (%s)", fm_last_error());
    return FM_OK;
}

static size_t take(size_t *at, size_t bytes)
{
    size_t o = *at;
    *at += (bytes + FM_WS_ALIGN - 1) / FM_WS_ALIGN * FM_WS_ALIGN;
    return o;
}

static fm_ws_layout layout_of(const fm_layer_params *p)
{
    const fm_moe_config *c = &p->cfg;
    const size_t T = (size_t)p->max_tokens, R = T * c->top_k, E = (size_t)c->n_experts, H = (size_t)c->hidden,
                 I = (size_t)c->inter, S = p->first == 0 ? (size_t)c->shared_inter : 0;
    fm_ws_layout l;
    size_t    at = 0;
    l.xp = take(&at, sizeof(uint16_t) * R * H);
    l.h = take(&at, sizeof(uint16_t) * R * I);
    l.logits = take(&at, sizeof(float) * T * E);
    l.out32 = take(&at, sizeof(float) * T * H);
    l.scratch = take(&at, sizeof(float) * R * H);
    l.rw = take(&at, sizeof(float) * R);
    l.off = take(&at, sizeof(int32_t) * ((size_t)p->n_local + 1));
    l.perm = take(&at, sizeof(int32_t) * R);
    l.slots = take(&at, sizeof(int32_t) * R);
    l.ids = take(&at, sizeof(int32_t) * R);
    l.wts = take(&at, sizeof(float) * R);
    l.rscratch = take(&at, fm_moe_route_scratch_bytes(c, p->max_tokens));
    /* + 4: at least n_local + 1 int32 (max_tokens x top_k >= 1), what run_dispatched's layout kernel needs */
    l.pscratch = take(&at, fm_moe_permute_scratch_bytes(p->max_tokens, c->top_k, p->n_local) + 4);
    l.hs = take(&at, sizeof(float) * (T * S + 1));
    l.badlogit = take(&at, sizeof(unsigned long long));
    l.active = take(&at, sizeof(int32_t) * ((size_t)p->n_local + 1));
    l.xq = l.xsc = l.y1 = l.hq = l.hsc = 0;
    if (c->act_fp8) { /* the W4A8 chain's buffers (per 128 columns: one scale per 128, else one per row) */
        const size_t bh = (size_t)fm_act_fp8_nscales(c->act_fp8, (int)H), bi = (size_t)fm_act_fp8_nscales(c->act_fp8, (int)I);
        l.xq = take(&at, R * H);
        l.xsc = take(&at, sizeof(float) * R * bh);
        l.y1 = take(&at, sizeof(float) * R * 2 * I);
        l.hq = take(&at, R * I);
        l.hsc = take(&at, sizeof(float) * R * bi);
    }
    l.total = at;
    return l;
}

static void cuda_destroy(void *ptr)
{
    fm_cuda_layer *s = ptr;
    if (!s) return;
    int prev = -1;
    if (fm_cuda_device_enter(s->dev, &prev) != FM_OK) prev = -1;
    fm_cuda_weights_destroy(s->w13);
    fm_cuda_weights_destroy(s->w2);
    void *dev[] = {s->d_router, s->d_bias, s->d_b13, s->d_b2, s->d_sw13, s->d_sw2, s->d_err, s->d_ticket, s->ws_own,
                   s->d_xstage, s->d_ostage, s->d_split, s->d_decode, s->q8.q13, s->q8.sc13, s->q8.q2, s->q8.sc2,
                   s->q8.sp13, s->q8.sp2, s->q8.gs13, s->q8.us13, s->q8.osc2};
    for (size_t i = 0; i < FM_ARRAY_LEN(dev); i++) cudaFree(dev[i]);
    if (s->ev0) cudaEventDestroy(s->ev0);
    if (s->ev1) cudaEventDestroy(s->ev1);
    if (s->own_stream) cudaStreamDestroy(s->own_stream);
    fm_cuda_device_leave(s->dev, prev);
    free(s);
}

/* FC1's weights for the kernels: an expert whose gate and up globals differ
 * (fm_moe_weights.w13_up_global) keeps its block scales as stored, each half's global
 * applied by the SWIGLU epilogue (fm_cuda_weights_create_gate_up). */
static fm_status create_w13(fm_cuda_layer *s, const fm_moe_weights *w, int L)
{
    int split = 0;
    for (int e = 0; e < L; e++) split += fm_moe_w13_split(w, e);
    return fm_cuda_weights_create_gate_up(w->w13, L, split ? w->w13_up_global : NULL, &s->w13);
}

/* $FM_W4A8_KERNEL: which W4A8 GEMM kernel a W4A8 layer runs (an A/B knob for bench_layer, read
 * at create; unset or empty = automatic). A name the list does not hold refuses the create
 * (FM_ERR_INVALID_ARG); so does a kernel that cannot run the layer (FM_ERR_UNSUPPORTED): the first
 * and the wgmma kernels (wg*, ws*) on NVFP4 weights, the wgmma kernels on a device other than sm_90 or in a
 * build without their sm_90a code (fm_fp8mma_kernel_here: the launcher's own test). */
static fm_status w4a8_kernel_env(const fm_cuda_layer *s, int *kernel)
{
    const char *v = getenv("FM_W4A8_KERNEL");
    *kernel = v && *v ? fm_fp8mma_kernel_of(v) : FM_FP8MMA_AUTO;
    if (*kernel < 0)
        return fm_fail(FM_ERR_INVALID_ARG, "cuda backend: FM_W4A8_KERNEL='%s' is not a W4A8 GEMM kernel (auto first "
                                           "pipe16 pipe32 staged16 staged32 staged64 wg32 wg64 wg128 ws64 ws128)", v);
    const int mx_only = *kernel == FM_FP8MMA_FIRST || *kernel >= FM_FP8MMA_WG32;
    if (mx_only && s->p.cfg.wfmt != FM_FORMAT_MXFP4)
        return fm_fail(FM_ERR_UNSUPPORTED, "cuda backend: FM_W4A8_KERNEL='%s' takes MXFP4 weights only", v);
    const int cc = fm_cuda_device_limits(s->dev)->cc;
    if (*kernel >= FM_FP8MMA_WG32 && cc != 90)
        return fm_fail(FM_ERR_UNSUPPORTED, "cuda backend: FM_W4A8_KERNEL='%s' runs on sm_90 (wgmma) only; this device is "
                                           "sm_%d", v, cc);
    const int here = fm_fp8mma_kernel_here(*kernel); /* e.g. a build without sm_90a code */
    if (here)
        return fm_fail(FM_ERR_UNSUPPORTED, "cuda backend: FM_W4A8_KERNEL='%s' cannot run on this sm_%d device with this "
                                           "build's code (%s)", v, cc, cudaGetErrorName((cudaError_t)here));
    return FM_OK;
}

/* $FM_DECODE_UNITS: how the decode kernel's CTAs find their units (an A/B knob for bench_layer,
 * read at create): unset, empty or "auto": from its counter at FM_DECODE_COUNTER_MIN_T tokens
 * and more, by strides of the grid below; "static": by strides always; "counter": from the
 * counter always. Anything else refuses the create (FM_ERR_INVALID_ARG). The sums do not
 * depend on it (decode.cu). */
static fm_status decode_units_env(int *min_t)
{
    const char *v = getenv("FM_DECODE_UNITS");
    if (!v || !*v || !strcmp(v, "auto")) *min_t = FM_DECODE_COUNTER_MIN_T;
    else if (!strcmp(v, "static")) *min_t = INT_MAX;
    else if (!strcmp(v, "counter")) *min_t = 0;
    else
        return fm_fail(FM_ERR_INVALID_ARG, "cuda backend: FM_DECODE_UNITS='%s' is not auto, static or counter", v);
    return FM_OK;
}

/* A W4A8 layer's weights (act_fp8): each local expert's FP4 codes packed for the W4A8 GEMM
 * (fm_fp8mma_pack, on the host), its block scales as the checkpoint stores them and packed by
 * 128-K group for the staged kernels (fm_fp8mma_pack_scales), uploaded; the global scales per
 * expert (FC1's gate and up: fm_moe_weights.w13_up_global where the halves differ; 1 for MXFP4). */
static fm_status create_w4a8(fm_cuda_layer *s, const fm_moe_weights *w)
{
    const fm_moe_config *c = &s->p.cfg;
    const int            L = s->p.n_local, H = c->hidden, I = c->inter;
    const size_t p13 = fm_fp8mma_pack_bytes(2 * (int64_t)I, H), p2 = fm_fp8mma_pack_bytes(H, I);
    const size_t q13 = fm_fp8mma_scales_bytes(c->wfmt, 2 * (int64_t)I, H), q2 = fm_fp8mma_scales_bytes(c->wfmt, H, I);
    size_t       d13, s13, d2, s2;
    FM_CHECK(fm_qtensor_bytes(c->wfmt, 2 * (int64_t)I, H, &d13, &s13));
    FM_CHECK(fm_qtensor_bytes(c->wfmt, H, I, &d2, &s2));
    const size_t hb = p13 > p2 ? p13 : p2;
    uint8_t     *hp = malloc(hb);
    float       *g = malloc(sizeof(float) * 3 * (size_t)L);
    cudaError_t  e = cudaSuccess;
    fm_status    st = FM_OK;
    if (!hp || !g) {
        st = fm_fail(FM_ERR_OOM, "cuda backend: W4A8 weights: out of host memory");
        goto done;
    }
#define Q8ALLOC(ptr, bytes)                                                                                            \
    if ((e = cudaMalloc((void **)&(ptr), (bytes))) != cudaSuccess) {                                                   \
        st = fm_cuda_layer_fail(e, "cudaMalloc (W4A8 weights)");                                                       \
        goto done;                                                                                                     \
    }
    Q8ALLOC(s->q8.q13, p13 * L);
    Q8ALLOC(s->q8.sc13, s13 * L);
    Q8ALLOC(s->q8.q2, p2 * L);
    Q8ALLOC(s->q8.sc2, s2 * L);
    Q8ALLOC(s->q8.sp13, q13 * L);
    Q8ALLOC(s->q8.sp2, q2 * L);
    Q8ALLOC(s->q8.gs13, sizeof(float) * L);
    Q8ALLOC(s->q8.us13, sizeof(float) * L);
    Q8ALLOC(s->q8.osc2, sizeof(float) * L);
#undef Q8ALLOC
    for (int x = 0; x < L; x++) {
        if ((st = fm_fp8mma_pack(&w->w13[x], hp)) != FM_OK) goto done;
        if ((e = cudaMemcpy(s->q8.q13 + p13 * x, hp, p13, cudaMemcpyHostToDevice)) != cudaSuccess ||
            (e = cudaMemcpy(s->q8.sc13 + s13 * x, w->w13[x].scales, s13, cudaMemcpyHostToDevice)) != cudaSuccess)
            break;
        if ((st = fm_fp8mma_pack(&w->w2[x], hp)) != FM_OK) goto done;
        if ((e = cudaMemcpy(s->q8.q2 + p2 * x, hp, p2, cudaMemcpyHostToDevice)) != cudaSuccess ||
            (e = cudaMemcpy(s->q8.sc2 + s2 * x, w->w2[x].scales, s2, cudaMemcpyHostToDevice)) != cudaSuccess)
            break;
        if ((st = fm_fp8mma_pack_scales(&w->w13[x], hp)) != FM_OK) goto done; /* hb >= the packed scales */
        if ((e = cudaMemcpy(s->q8.sp13 + q13 * x, hp, q13, cudaMemcpyHostToDevice)) != cudaSuccess) break;
        if ((st = fm_fp8mma_pack_scales(&w->w2[x], hp)) != FM_OK) goto done;
        if ((e = cudaMemcpy(s->q8.sp2 + q2 * x, hp, q2, cudaMemcpyHostToDevice)) != cudaSuccess) break;
        g[x] = w->w13[x].global_scale;
        g[L + x] = fm_moe_w13_split(w, x) ? w->w13_up_global[x] : w->w13[x].global_scale;
        g[2 * L + x] = w->w2[x].global_scale;
    }
    if (e == cudaSuccess && (e = cudaMemcpy(s->q8.gs13, g, sizeof(float) * L, cudaMemcpyHostToDevice)) == cudaSuccess &&
        (e = cudaMemcpy(s->q8.us13, g + L, sizeof(float) * L, cudaMemcpyHostToDevice)) == cudaSuccess)
        e = cudaMemcpy(s->q8.osc2, g + 2 * L, sizeof(float) * L, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) st = fm_cuda_layer_fail(e, "upload (W4A8 weights)");
done:
    free(hp);
    free(g);
    return st;
}

static fm_status create_on_device(fm_cuda_layer *s, const fm_moe_weights *w)
{
    const fm_layer_params *p = &s->p;
    const fm_moe_config   *cfg = &p->cfg;
    const int E = cfg->n_experts, H = cfg->hidden, L = p->n_local, S = p->first == 0 ? cfg->shared_inter : 0;
    cudaError_t e = cudaSuccess;
    if (s->w4a8) FM_CHECK(w4a8_kernel_env(s, &s->q8.kernel)); /* before any upload */
    FM_CHECK(decode_units_env(&s->decode_counter_min_t));
    FM_CHECK(create_w13(s, w, L));
    FM_CHECK(fm_cuda_weights_create(w->w2, L, &s->w2));
    if (s->w4a8) FM_CHECK(create_w4a8(s, w));
#define DALLOC(ptr, bytes) \
    if ((e = cudaMalloc((void **)&(ptr), (bytes))) != cudaSuccess) return fm_cuda_layer_fail(e, "cudaMalloc")
#define UPLOAD(dst, src, bytes) \
    if ((e = cudaMemcpy((dst), (src), (bytes), cudaMemcpyHostToDevice)) != cudaSuccess) return fm_cuda_layer_fail(e, "upload")
    DALLOC(s->d_router, sizeof(float) * (size_t)E * H);
    UPLOAD(s->d_router, w->router_w, sizeof(float) * (size_t)E * H);
    if (w->router_bias) {
        DALLOC(s->d_bias, sizeof(float) * (size_t)E);
        UPLOAD(s->d_bias, w->router_bias, sizeof(float) * (size_t)E);
        for (int i = 0; i < E && s->bad_bias < 0; i++)
            if (!isfinite(w->router_bias[i])) {
                s->bad_bias = i;
                s->bad_bias_value = w->router_bias[i];
            }
    }
    /* the shard's expert biases (w holds its n_local experts; fm_moe_weights_check has
     * refused non-finite ones, naming the element, before any backend saw them) */
    if (w->w13_bias) {
        DALLOC(s->d_b13, sizeof(float) * (size_t)L * 2 * cfg->inter);
        UPLOAD(s->d_b13, w->w13_bias, sizeof(float) * (size_t)L * 2 * cfg->inter);
    }
    if (w->w2_bias) {
        DALLOC(s->d_b2, sizeof(float) * (size_t)L * H);
        UPLOAD(s->d_b2, w->w2_bias, sizeof(float) * (size_t)L * H);
    }
    if (S > 0) {
        DALLOC(s->d_sw13, sizeof(uint16_t) * 2 * (size_t)S * H);
        DALLOC(s->d_sw2, sizeof(uint16_t) * (size_t)S * H);
        UPLOAD(s->d_sw13, w->shared_w13, sizeof(uint16_t) * 2 * (size_t)S * H);
        UPLOAD(s->d_sw2, w->shared_w2, sizeof(uint16_t) * (size_t)S * H);
    }
    DALLOC(s->d_err, sizeof(fm_moe_dev_errors));
    DALLOC(s->d_ticket, sizeof(unsigned));
    s->ws = layout_of(p);
    if (!p->caller_workspace) DALLOC(s->ws_own, s->ws.total);
    DALLOC(s->d_xstage, sizeof(uint16_t) * (size_t)p->max_tokens * H);
    DALLOC(s->d_ostage, sizeof(float) * (size_t)p->max_tokens * H);
#undef DALLOC
#undef UPLOAD
    if ((e = cudaStreamCreateWithFlags(&s->own_stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaEventCreate(&s->ev0)) != cudaSuccess || (e = cudaEventCreate(&s->ev1)) != cudaSuccess)
        return fm_cuda_layer_fail(e, "stream/event create");
    int le = fm_moe_dev_errors_reset_launch(s->d_err, s->own_stream);
    if (!le) le = (int)cudaMemsetAsync(s->d_ticket, 0, sizeof(unsigned), s->own_stream); /* its rest state */
    if (le || (e = cudaStreamSynchronize(s->own_stream)) != cudaSuccess)
        return fm_cuda_layer_fail(le ? (cudaError_t)le : e, "clear the error word");
    /* the uploads (cudaMemcpy from pageable memory may return before its DMA lands) ran on
     * the legacy stream, which a caller's non-blocking stream does not wait for */
    if ((e = cudaStreamSynchronize(cudaStreamLegacy)) != cudaSuccess) return fm_cuda_layer_fail(e, "upload");
    return FM_OK;
}

/* What the kernels cannot run, from the parameters alone (fm_layer_supports asks it too). */
static fm_status cuda_supports(const fm_layer_params *p, unsigned features)
{
    const fm_moe_config *cfg = &p->cfg;
    if (cfg->act_nvfp4) return fm_fail(FM_ERR_UNSUPPORTED, "cuda backend: act_nvfp4 (W4A4) is not implemented yet");
    if (cfg->act_fp8) { /* the W4A8 chain: FP8 mma.sync (sm_89+), K of both GEMMs a multiple of 64 */
        const int cc = p->device ? fm_cuda_device_limits(p->device)->cc : 0;
        if (cc && cc < 89)
            return fm_fail(FM_ERR_UNSUPPORTED, "cuda backend: act_fp8 (W4A8) needs FP8 tensor cores (sm_89 or newer; "
                                               "this device is sm_%d)", cc);
        if (cfg->hidden % 64 || cfg->inter % 64)
            return fm_fail(FM_ERR_UNSUPPORTED, "cuda backend: act_fp8 (W4A8) needs hidden and inter multiples of 64 "
                                               "(hidden=%d, inter=%d)", cfg->hidden, cfg->inter);
    }
    /* every optional weight runs (gpt-oss's expert biases: the GEMM epilogues), and so do both
     * activations fm_moe_config_check admits and every score function (route.cu) */
    (void)features;
    if (cfg->shared_inter % 16)
        return fm_fail(FM_ERR_UNSUPPORTED, "cuda backend: shared_inter=%d must be a multiple of 16", cfg->shared_inter);
    if (cfg->wfmt == FM_FORMAT_BF16)
        return fm_fail(FM_ERR_UNSUPPORTED, "cuda backend: BF16 routed experts are not supported (FP4 only)");
    /* The gather and the deterministic finalize put routed rows / tokens on the
     * grid's y dimension (at most 65,535); bigger batches are split by the caller. */
    if ((int64_t)p->max_tokens * cfg->top_k > 65535)
        return fm_fail(FM_ERR_UNSUPPORTED,
                       "cuda backend: max_tokens=%d x top_k=%d = %lld routed rows > 65,535 per run (grid y limit); "
                       "run the batch in chunks",
                       p->max_tokens, cfg->top_k, (long long)p->max_tokens * cfg->top_k);
    if (cfg->n_experts > 65535)
        return fm_fail(FM_ERR_UNSUPPORTED, "cuda backend: n_experts=%d > 65,535 (grid y limit)", cfg->n_experts);
    if (cfg->hidden % 16 || cfg->inter % 16)
        return fm_fail(FM_ERR_UNSUPPORTED, "cuda backend: hidden=%d and inter=%d must be multiples of 16", cfg->hidden,
                       cfg->inter);
    return FM_OK;
}

static fm_status cuda_create(const fm_layer_params *p, const fm_moe_weights *w, void **state)
{
    FM_CHECK(cuda_supports(p, fm_weights_features(w)));
    fm_cuda_layer *s = calloc(1, sizeof *s);
    if (!s) return fm_fail(FM_ERR_OOM, "cuda backend: out of host memory");
    s->p = *p;
    s->dev = p->device;
    s->bad_bias = -1;
    s->decode_occ = -1;
    s->w4a8 = p->cfg.act_fp8 != FM_ACT_FP8_OFF;
    /* fm_layer_desc.pdl_chain: on where the device has PDL (layer.h says what it gains) */
    s->pdl_chain = p->pdl_chain != FM_PDL_CHAIN_OFF && fm_cuda_device_limits(s->dev)->cc >= 90;
    int       prev = -1;
    fm_status st = fm_cuda_device_enter(s->dev, &prev);
    if (st != FM_OK) {
        free(s);
        return st;
    }
    st = create_on_device(s, w);
    fm_cuda_device_leave(s->dev, prev);
    if (st != FM_OK) {
        cuda_destroy(s);
        return st;
    }
    *state = s;
    return FM_OK;
}

static size_t cuda_workspace_bytes(void *ptr) { return ((fm_cuda_layer *)ptr)->ws.total; }

const fm_backend_ops fm_cuda_ops = {.name = "cuda",
                                    .available = cuda_available,
                                    .create = cuda_create,
                                    .supports = cuda_supports,
                                    .run = fm_cuda_layer_run,
                                    .run_dispatched = fm_cuda_layer_run_dispatched,
                                    .forward_host = fm_cuda_layer_forward_host,
                                    .errors = fm_cuda_layer_errors,
                                    .gemm_choose = fm_cuda_layer_gemm_choose,
                                    .packed_x_ok = fm_cuda_layer_packed_x_ok,
                                    .install = fm_cuda_layer_install,
                                    .plan = fm_cuda_layer_plan,
                                    .set_plan = fm_cuda_layer_set_plan,
                                    .tune_begin = fm_cuda_tune_begin,
                                    .tune_time = fm_cuda_tune_time,
                                    .tune_end = fm_cuda_tune_end,
                                    .tune_tiles = fm_cuda_tune_tiles,
                                    .workspace_bytes = cuda_workspace_bytes,
                                    .destroy = cuda_destroy};
