/* gemm_launch.c - the public GPU grouped GEMM API (fp4moe/cuda.h): weight
 * prepack + upload, argument validation, and fm_cuda_gemm as an fm_gemm_plan made
 * for the call and launched (gemm_plan.c: the tile choice, the tile checks, the
 * shared memory from the planner's model, refused with FM_ERR_SMEM_EXCEEDED above
 * the limit, nothing launched then). */
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_internal.h"
#include "fp4moe/kernels.h"
#include "cuda/gemm_plan.h"
#include "fm_internal.h"

static fm_status cuda_fail(cudaError_t err, const char *what) { return fm_cuda_status((int)err, what); }

void fm_cuda_weights_destroy(fm_cuda_weights *w)
{
    if (!w) return;
    cudaFree(w->d_data);
    cudaFree(w->d_scale);
    cudaFree(w->d_oscale);
    free(w);
}

fm_status fm_cuda_weights_create(const fm_qtensor *w, int n_experts, fm_cuda_weights **out)
{
    return fm_cuda_weights_create_gate_up(w, n_experts, NULL, out);
}

fm_status fm_cuda_weights_create_gate_up(const fm_qtensor *w, int n_experts, const float *up_global,
                                         fm_cuda_weights **out)
{
    fm_clear_error();
    if (!out) return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_weights_create: out is NULL");
    *out = NULL;
    if (!w || n_experts < 1) return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_weights_create: no weights (n_experts=%d)", n_experts);
    if (up_global) {
        if (w[0].fmt != FM_FORMAT_NVFP4)
            return fm_fail(FM_ERR_FORMAT, "fm_cuda_weights_create_gate_up: up globals for format %d weights, which "
                           "have no global scales (NVFP4 only)", (int)w[0].fmt);
        if (w[0].rows % 32)
            return fm_fail(FM_ERR_BAD_SHAPE, "fm_cuda_weights_create_gate_up: %lld rows: gate and up halves need "
                           "rows %% 32 == 0", (long long)w[0].rows);
        for (int e = 0; e < n_experts; e++)
            if (!(isfinite(up_global[e]) && up_global[e] >= FLT_MIN))
                return fm_fail(FM_ERR_NONFINITE, "fm_cuda_weights_create_gate_up: up_global[%d] = %g: must be a "
                               "finite, normal, positive number", e, (double)up_global[e]);
    }
    for (int e = 0; e < n_experts; e++) {
        if (w[e].fmt != w[0].fmt)
            return fm_fail(FM_ERR_FORMAT, "fm_cuda_weights_create: expert %d has format %d, expert 0 has %d", e,
                           (int)w[e].fmt, (int)w[0].fmt);
        if (w[e].rows != w[0].rows || w[e].cols != w[0].cols)
            return fm_fail(FM_ERR_BAD_SHAPE, "fm_cuda_weights_create: expert %d is [%lld x %lld], expert 0 [%lld x %lld]",
                           e, (long long)w[e].rows, (long long)w[e].cols, (long long)w[0].rows, (long long)w[0].cols);
    }
    if (w[0].rows > (1 << 24) || w[0].cols > (1 << 24))
        return fm_fail(FM_ERR_BAD_SHAPE, "fm_cuda_weights_create: [%lld x %lld] too large", (long long)w[0].rows,
                       (long long)w[0].cols);
    int dev_count = 0;
    if (fm_device_count(&dev_count) != FM_OK)
        return fm_fail(FM_ERR_NO_DEVICE, "fm_cuda_weights_create: %s", fm_last_error());
    size_t db, sb;
    fm_cuda_prepack_sizes(w[0].rows, w[0].cols, &db, &sb);
    uint8_t *hd = malloc(db), *hs = malloc(sb);
    float   *hos = malloc(sizeof(float) * 2 * (size_t)n_experts); /* [E] all / gate rows, [E] up rows */
    fm_cuda_weights *cw = calloc(1, sizeof *cw);
    fm_status st = FM_OK;
    if (!hd || !hs || !hos || !cw) {
        st = fm_fail(FM_ERR_OOM, "fm_cuda_weights_create: out of host memory");
        goto done;
    }
    cw->fmt = w[0].fmt;
    cw->n_experts = n_experts;
    cw->n = (int)w[0].rows;
    cw->k = (int)w[0].cols;
    cw->kp = (cw->k + FM_PACK_KCHUNK - 1) / FM_PACK_KCHUNK * FM_PACK_KCHUNK;
    cw->data_bytes = db;
    cw->scale_bytes = sb;
    cudaError_t err;
    if ((err = cudaMalloc(&cw->d_data, db * n_experts)) != cudaSuccess ||
        (err = cudaMalloc(&cw->d_scale, sb * n_experts)) != cudaSuccess ||
        (err = cudaMalloc((void **)&cw->d_oscale, sizeof(float) * 2 * n_experts)) != cudaSuccess) {
        st = cuda_fail(err, "fm_cuda_weights_create: cudaMalloc");
        goto done;
    }
    for (int e = 0; e < n_experts; e++) {
        if ((st = fm_cuda_prepack(&w[e], hd, hs, &hos[e])) != FM_OK) goto done;
        /* the up rows' multiplier: the prepack's fold (NVFP4: global x 2^7) with the up global */
        hos[n_experts + e] = up_global ? hos[e] / w[e].global_scale * up_global[e] : hos[e];
        if ((err = cudaMemcpy((uint8_t *)cw->d_data + db * e, hd, db, cudaMemcpyHostToDevice)) != cudaSuccess ||
            (err = cudaMemcpy((uint8_t *)cw->d_scale + sb * e, hs, sb, cudaMemcpyHostToDevice)) != cudaSuccess) {
            st = cuda_fail(err, "fm_cuda_weights_create: upload");
            goto done;
        }
    }
    if ((err = cudaMemcpy(cw->d_oscale, hos, sizeof(float) * 2 * n_experts, cudaMemcpyHostToDevice)) != cudaSuccess ||
        (err = cudaStreamSynchronize(cudaStreamLegacy)) != cudaSuccess) /* the DMAs landed: a launch on a
                                                                          * non-blocking stream may follow */
        st = cuda_fail(err, "fm_cuda_weights_create: upload");
done:
    free(hd);
    free(hs);
    free(hos);
    if (st != FM_OK) {
        fm_cuda_weights_destroy(cw);
        return st;
    }
    *out = cw;
    return FM_OK;
}

void fm_cuda_weights_shape(const fm_cuda_weights *w, int *n_experts, int *n, int *k, fm_format *fmt)
{
    if (!w) return;
    if (n_experts) *n_experts = w->n_experts;
    if (n) *n = w->n;
    if (k) *k = w->k;
    if (fmt) *fmt = w->fmt;
}

size_t fm_cuda_weights_bytes(const fm_cuda_weights *w)
{
    return w ? (w->data_bytes + w->scale_bytes) * (size_t)w->n_experts : 0;
}

int64_t fm_cuda_kpack_col(int64_t c)
{
    int64_t n = c & 63, pr = n >> 1;
    return (c & ~(int64_t)63) + (pr & 7) * 8 + (pr >> 3) * 2 + (n & 1);
}

fm_status fm_cuda_x_pack(const uint16_t *x, uint16_t *out, int rows, int k, void *stream)
{
    fm_clear_error();
    if (!x || !out || rows < 0 || k < 0) return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_x_pack: NULL pointer or negative size");
    if (x == out) return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_x_pack: works out of place (x == out)");
    if (k % 64) return fm_fail(FM_ERR_BAD_SHAPE, "fm_cuda_x_pack: k=%d is not a multiple of 64", k);
    if ((uintptr_t)x % 16 || (uintptr_t)out % 16) return fm_fail(FM_ERR_MISALIGNED, "fm_cuda_x_pack: x and out must be 16-byte aligned");
    int err = fm_x_pack_launch(x, out, rows, k, stream);
    if (err) return cuda_fail((cudaError_t)err, "fm_cuda_x_pack: launch");
    return FM_OK;
}

/* The call's device: the one it names, else the current one (device.c). */
static fm_status gemm_device(const fm_cuda_gemm_args *a, const fm_cuda_device **d)
{
    if (a->device) {
        *d = a->device;
        return FM_OK;
    }
    return fm_cuda_device_current(d);
}

size_t fm_cuda_split_counter_bytes(const fm_cuda_weights *w, int max_rows)
{
    if (!w || max_rows < 0) return 0;
    size_t cnt = ((size_t)max_rows / 8 + (size_t)w->n_experts + 1) * ((size_t)w->n / 16) * sizeof(int32_t);
    return (cnt + 255) / 256 * 256;
}

size_t fm_cuda_gemm_split_ws_bytes(const fm_cuda_weights *w, int max_rows, int k_splits)
{
    if (!w || k_splits < 2 || max_rows < 0) return 0;
    return fm_cuda_split_counter_bytes(w, max_rows) + (size_t)k_splits * (size_t)max_rows * (size_t)w->n * sizeof(float);
}

/* The plan request of a call: its problem, choices and hints (gemm_plan.h). */
static fm_gemm_request request_of(const fm_cuda_gemm_args *a)
{
    return (fm_gemm_request){.w = a->w,
                             .epi = a->epi,
                             .x_packed = a->x_packed,
                             .y_packed = a->y_packed,
                             .tile = a->tile,
                             .expected_rows = a->expected_rows,
                             .active_experts = a->active_experts,
                             .smem_limit = a->smem_limit,
                             .feature_blocks = a->feature_blocks,
                             .k_splits = a->k_splits,
                             .work_list = a->expert_list != NULL,
                             .expert_slots = a->expert_slots,
                             .pdl = a->pdl,
                             .pdl_reduce = a->pdl_reduce};
}

fm_status fm_cuda_gemm_choose(const fm_cuda_gemm_args *a, fm_tile *tile, int *feature_blocks, int *k_splits,
                              double *est_us)
{
    fm_clear_error();
    if (!a || !a->w || !tile) return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm_choose: NULL args, w or tile");
    if (a->feature_blocks < 0)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm_choose: feature_blocks=%d < 0", a->feature_blocks);
    const fm_cuda_device *dev;
    FM_CHECK(gemm_device(a, &dev));
    const fm_gemm_request r = request_of(a);
    return fm_cuda_gemm_plan_choose(dev, &r, tile, feature_blocks, k_splits, est_us);
}

fm_status fm_cuda_gemm(const fm_cuda_gemm_args *a)
{
    fm_clear_error();
    if (!a || !a->w || !a->x || !a->offsets)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: NULL args, w, x or offsets");
    /* y may be NULL only where nothing reads or writes it: FINALIZE_DET from zero into y_bf16 */
    if (!a->y && !(a->epi == FM_CUDA_EPI_FINALIZE_DET && a->y_zero_init && a->y_bf16))
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: NULL y");
    if ((a->y_zero_init || a->y_bf16) && a->epi != FM_CUDA_EPI_FINALIZE_DET)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: y_zero_init / y_bf16 apply to FINALIZE_DET only");
    const fm_cuda_weights *w = a->w;
    const fm_pack_format  *pf = fm_pack_format_get(w->fmt); /* the weights' scale decode */
    if (!pf) return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: w is not prepacked FP4 weights (format %d)", (int)w->fmt);
    if (a->max_rows < 0) return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: max_rows=%d < 0", a->max_rows);
    if (a->expert_slots < 0)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: expert_slots=%d < 0 (0: every expert)", a->expert_slots);
    if ((uintptr_t)a->expert_list % 4)
        return fm_fail(FM_ERR_MISALIGNED, "fm_cuda_gemm: expert_list is not 4-byte aligned");
    if (a->feature_blocks < 0)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: feature_blocks=%d < 0", a->feature_blocks);
    if (a->k_splits < FM_CUDA_K_SPLITS_AUTO || a->k_splits > FM_CUDA_MAX_K_SPLITS)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: k_splits=%d outside [-1, %d] (-1: automatic)", a->k_splits,
                       FM_CUDA_MAX_K_SPLITS);
    if (a->k_splits > 1 && (!a->split_ws || a->split_ws_bytes < fm_cuda_gemm_split_ws_bytes(a->w, a->max_rows,
                                                                                              a->k_splits)))
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: k_splits=%d needs split_ws of at least %zu bytes "
                                           "(fm_cuda_gemm_split_ws_bytes), got %zu%s",
                       a->k_splits, fm_cuda_gemm_split_ws_bytes(a->w, a->max_rows, a->k_splits), a->split_ws_bytes,
                       a->split_ws ? "" : " (NULL)");
    if ((uintptr_t)a->split_ws % 16)
        return fm_fail(FM_ERR_MISALIGNED, "fm_cuda_gemm: split_ws is not 16-byte aligned");
    if ((uintptr_t)a->x % 16) return fm_fail(FM_ERR_MISALIGNED, "fm_cuda_gemm: x is not 16-byte aligned");
    if ((int)a->epi < FM_CUDA_EPI_NONE || a->epi > FM_CUDA_EPI_FINALIZE_DET)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: unknown epilogue %d", (int)a->epi);
    if (a->epi == FM_CUDA_EPI_FINALIZE && (!a->row_weight || !a->row_token || a->n_tokens < 0))
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: FINALIZE needs row_weight and row_token");
    if (a->epi == FM_CUDA_EPI_FINALIZE_DET &&
        (!a->row_weight || !a->token_slots || !a->scratch || a->top_k < 1 || a->n_tokens < 0))
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: FINALIZE_DET needs row_weight, token_slots, scratch, top_k");
    if (a->epi == FM_CUDA_EPI_FINALIZE_DET && ((uintptr_t)a->y % 16 || (uintptr_t)a->scratch % 16 ||
                                               (uintptr_t)a->y_bf16 % 16))
        return fm_fail(FM_ERR_MISALIGNED, "fm_cuda_gemm: FINALIZE_DET output and scratch must be 16-byte aligned "
                                          "(they are read/written as float4)");
    /* experts (GEMM) and tokens (FINALIZE_DET reduce) are the grid's y dimension */
    if (w->n_experts > 65535)
        return fm_fail(FM_ERR_UNSUPPORTED, "fm_cuda_gemm: n_experts=%d > 65,535 (grid y limit)", w->n_experts);
    if (a->epi == FM_CUDA_EPI_FINALIZE_DET && a->n_tokens > 65535)
        return fm_fail(FM_ERR_UNSUPPORTED, "fm_cuda_gemm: n_tokens=%d > 65,535 (grid y limit); split the batch",
                       a->n_tokens);
    const fm_cuda_device *dv;
    FM_CHECK(gemm_device(a, &dv));
    const fm_gemm_request r = request_of(a);
    fm_tile               t;
    int                   chosen_nb = 0, ks = a->k_splits > 1 ? a->k_splits : 1;
    if (a->tile) t = *a->tile;
    else FM_CHECK(fm_cuda_gemm_plan_choose(dv, &r, &t, &chosen_nb, a->k_splits == FM_CUDA_K_SPLITS_AUTO ? &ks : NULL,
                                           NULL)); /* the planner's first candidate (fm_plan_fp4moe) */
    if (ks > 1 && (!a->split_ws || a->split_ws_bytes < fm_cuda_gemm_split_ws_bytes(w, a->max_rows, ks)))
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: the planner chose k_splits=%d, which needs split_ws of "
                                           "%zu bytes (fm_cuda_gemm_split_ws_bytes), got %zu",
                       ks, fm_cuda_gemm_split_ws_bytes(w, a->max_rows, ks), a->split_ws_bytes);
    fm_gemm_plan plan;
    FM_CHECK(fm_cuda_gemm_plan_fill(dv, &r, &t, chosen_nb, ks, &plan));
    const fm_gemm_operands o = {.w = w,
                                .x = a->x,
                                .offsets = a->offsets,
                                .max_rows = a->max_rows,
                                .y = a->y,
                                .row_weight = a->row_weight,
                                .row_token = a->row_token,
                                .n_tokens = a->n_tokens,
                                .top_k = a->top_k,
                                .token_slots = a->token_slots,
                                .scratch = a->scratch,
                                .y_zero_init = a->y_zero_init,
                                .y_bf16 = a->y_bf16,
                                .split_ws = a->split_ws,
                                .split_ws_bytes = a->split_ws_bytes,
                                .expert_list = a->expert_list};
    return fm_cuda_gemm_launch(dv, &plan, &o, a->stream);
}
