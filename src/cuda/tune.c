/* tune.c - fm_layer_tune for cuda layers: other plans of T's bucket timed on the
 * device, the fastest kept (include/fp4moe/layer.h).
 *
 * Inputs: NX synthetic routings of T tokens (top_k distinct global ids per token,
 * uniform over the layer's experts, as the EP / all-local benchmarks route; fixed
 * seed) passed as external routing, x BF16 normal. Rotating NX routings spreads the
 * replays over different experts, so most replays read their weights from DRAM
 * (one routing's experts fit the 50-60 MB L2 of a data-center part at 1-2 tokens;
 * eight do not).
 * Time of a plan: each routing's run captured into a graph; TUNE_REPS replays
 * rotating over them after TUNE_WARM; the mean over routings of each routing's
 * median (bench_layer's rot_time).
 * Search: coordinate descent from the current plan: FC1 over the compiled tiles
 * that fit the bucket's rows x K splits {1, 2, 4, 8, 16} x work list off / on (FC2
 * as it is), then FC2 over the tiles x K splits {1, 2, 4, 8} (FC1 the best so far).
 * Plans fm_layer_set_plan refuses are counted, not timed. The best is re-timed
 * against the current plan interleaved three times and kept only if it is at least
 * TUNE_GAIN faster (the run-to-run spread of a replay is a few percent); otherwise
 * the current plan is set back. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cuda/cuda_internal.h"
#include "fm_internal.h"
#include "fm_rng.h"
#include "kernels/fm_kernels_smem.h"

#define TUNE_NX 8
#define TUNE_REPS 32 /* 4 replays a routing */
#define TUNE_WARM 8
#define TUNE_GAIN 0.03

typedef struct {
    fm_layer    *l;
    int          T;
    cudaStream_t st;
    cudaEvent_t  ev[2];
    uint16_t    *x;
    void        *out, *ws;
    int32_t     *ids;     /* [TUNE_NX][T][top_k] */
    float       *w;       /* [TUNE_NX][T][top_k] */
    int          slots;   /* T * top_k */
} tune_ctx;

static fm_status tune_cu(cudaError_t e, const char *what)
{
    (void)cudaGetLastError();
    return fm_fail(e == cudaErrorMemoryAllocation ? FM_ERR_OOM : FM_ERR_CUDA, "fm_layer_tune: %s: %s", what,
                   cudaGetErrorString(e));
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The current plan's time (us) into *us. */
static fm_status time_current(tune_ctx *c, double *us)
{
    cudaGraphExec_t ex[TUNE_NX] = {0};
    fm_status       st = FM_OK;
    for (int r = 0; r < TUNE_NX && st == FM_OK; r++) {
        fm_layer_run_args a = {.x = c->x, .T = c->T, .topk_ids = c->ids + (size_t)r * c->slots,
                               .topk_weights = c->w + (size_t)r * c->slots, .out = c->out, .workspace = c->ws,
                               .stream = c->st};
        cudaGraph_t g = NULL;
        cudaError_t e = cudaStreamBeginCapture(c->st, cudaStreamCaptureModeThreadLocal);
        if (e != cudaSuccess) {
            st = tune_cu(e, "begin capture");
            break;
        }
        fm_status rs = fm_layer_run(c->l, &a);
        e = cudaStreamEndCapture(c->st, &g);
        if (rs != FM_OK) st = rs;
        else if (e != cudaSuccess) st = tune_cu(e, "end capture");
        else if ((e = cudaGraphInstantiate(&ex[r], g, 0)) != cudaSuccess) st = tune_cu(e, "graph instantiate");
        if (g) cudaGraphDestroy(g);
    }
    double t[TUNE_NX][TUNE_REPS / TUNE_NX];
    for (int it = -TUNE_WARM; st == FM_OK && it < TUNE_REPS; it++) {
        const int   r = (it + TUNE_WARM) % TUNE_NX;
        cudaError_t e = cudaEventRecord(c->ev[0], c->st);
        if (e == cudaSuccess) e = cudaGraphLaunch(ex[r], c->st);
        if (e == cudaSuccess) e = cudaEventRecord(c->ev[1], c->st);
        if (e == cudaSuccess) e = cudaEventSynchronize(c->ev[1]);
        float ms = 0;
        if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, c->ev[0], c->ev[1]);
        if (e != cudaSuccess) st = tune_cu(e, "replay");
        else if (it >= 0) t[r][it / TUNE_NX] = ms * 1e3;
    }
    for (int r = 0; r < TUNE_NX; r++)
        if (ex[r]) cudaGraphExecDestroy(ex[r]);
    if (st != FM_OK) return st;
    double sum = 0;
    const int n = TUNE_REPS / TUNE_NX;
    for (int r = 0; r < TUNE_NX; r++) {
        qsort(t[r], (size_t)n, sizeof(double), cmp_d);
        sum += n % 2 ? t[r][n / 2] : 0.5 * (t[r][n / 2 - 1] + t[r][n / 2]);
    }
    *us = sum / TUNE_NX;
    return FM_OK;
}

/* Plan p: set and timed (*us), or *us = -1 when fm_layer_set_plan refuses it. */
static fm_status time_plan(tune_ctx *c, const fm_layer_plan_info *p, double *us)
{
    *us = -1;
    fm_status s = fm_layer_set_plan(c->l, c->T, p);
    if (s == FM_ERR_UNSUPPORTED || s == FM_ERR_INVALID_ARG || s == FM_ERR_SMEM_EXCEEDED) return FM_OK;
    if (s != FM_OK) return s;
    return time_current(c, us);
}

/* Whether a tile of 8 x nt tokens a pass is a candidate for `need` rows per expert: at
 * most two passes (each pass streams the weights again) and at most a quarter of a pass
 * used (padding rows cost the tile's work). */
static int tile_fits(const fm_tile *t, int need)
{
    const int tok = 8 * t->nt;
    return 2 * tok >= need && tok <= (need > 2 ? 4 * need : 8);
}

/* The candidate tiles of both families that have code on the device for `rows` rows per
 * expert (capped at the largest pass of those tiles). */
static size_t candidates(fm_tile *out, size_t cap, int rows, const fm_cuda_device *d)
{
    size_t         n = 0, ns = 0, nw = 0;
    const fm_tile *sw = fm_swapab_tiles(&ns), *wg = fm_wgmma_tiles(&nw);
    int            max_tok = 8;
    for (size_t i = 0; i < ns; i++)
        if (fm_cuda_device_has_tile(d, 0, (int)i)) max_tok = 8 * sw[i].nt > max_tok ? 8 * sw[i].nt : max_tok;
    for (size_t i = 0; i < nw; i++)
        if (fm_cuda_device_has_tile(d, 1, (int)i)) max_tok = 8 * wg[i].nt > max_tok ? 8 * wg[i].nt : max_tok;
    const int need = rows < max_tok ? rows : max_tok;
    for (size_t i = 0; i < ns && n < cap; i++)
        if (fm_cuda_device_has_tile(d, 0, (int)i) && tile_fits(&sw[i], need)) out[n++] = sw[i];
    for (size_t i = 0; i < nw && n < cap; i++)
        if (fm_cuda_device_has_tile(d, 1, (int)i) && tile_fits(&wg[i], need)) out[n++] = wg[i];
    return n;
}

static fm_status search(tune_ctx *c, const fm_layer_params *p, fm_layer_tune_info *ti)
{
    fm_layer_plan_info cur, best, q;
    FM_CHECK(fm_layer_plan(c->l, c->T, &cur));
    double cur_us, best_us;
    FM_CHECK(time_current(c, &cur_us));
    best = cur, best_us = cur_us;
    fm_tile      tl[128];
    const size_t nt = candidates(tl, 128, cur.expected_rows, p->device);
    static const int ks1[] = {1, 2, 4, 8, 16}, ks2[] = {1, 2, 4, 8};
    for (int phase = 0; phase < 2; phase++) {
        const fm_layer_plan_info base = best;
        const int               *ks = phase ? ks2 : ks1, nks = phase ? 4 : 5;
        for (size_t i = 0; i < nt; i++)
            for (int wl = 0; wl < 2; wl++)
                for (int k = 0; k < nks; k++) {
                    if (phase && wl) continue; /* FC2 keeps the work list FC1's pass chose */
                    const int wg = tl[i].family == FM_FAMILY_FP4MOE_WGMMA;
                    if (wg && (ks[k] > 1 || (!phase && wl))) continue; /* what set_plan refuses anyway */
                    q = base;
                    q.tile[phase] = tl[i], q.k_splits[phase] = ks[k], q.feature_blocks[phase] = 1;
                    q.x_packed[phase] = wg;
                    if (!phase) q.work_list = wl;
                    if (q.work_list) q.feature_blocks[1 - phase] = 1;
                    double us;
                    FM_CHECK(time_plan(c, &q, &us));
                    ti->plans_tried++;
                    if (us < 0) ti->plans_refused++;
                    else if (us < best_us) best_us = us, best = q;
                }
    }
    /* the best against the current plan, interleaved: keep it only if clearly faster */
    double a = 0, b = 0, us;
    for (int r = 0; r < 3; r++) {
        FM_CHECK(fm_layer_set_plan(c->l, c->T, &cur));
        FM_CHECK(time_current(c, &us));
        a += us / 3;
        FM_CHECK(fm_layer_set_plan(c->l, c->T, &best));
        FM_CHECK(time_current(c, &us));
        b += us / 3;
    }
    ti->before_us = a;
    ti->changed = b <= (1.0 - TUNE_GAIN) * a;
    ti->after_us = ti->changed ? b : a;
    return fm_layer_set_plan(c->l, c->T, ti->changed ? &best : &cur);
}

fm_status fm_cuda_tune(fm_layer *l, const fm_layer_params *p, int T, void *stream, fm_layer_tune_info *info)
{
    const fm_moe_config *cfg = &p->cfg;
    const int            K = cfg->top_k, H = cfg->hidden, E = cfg->n_experts;
    fm_layer_tune_info   ti = {0};
    fm_layer_plan_info   keep;
    FM_CHECK(fm_layer_plan(l, T, &keep)); /* set back if anything below fails */
    int prev = -1;
    FM_CHECK(fm_cuda_device_enter(p->device, &prev));
    tune_ctx    c = {.l = l, .T = T, .slots = T * K};
    fm_status   st = FM_OK;
    /* after the caller's work on `stream`, on a stream of its own: graphs cannot be
     * captured from the legacy default stream */
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)stream);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c.st, cudaStreamNonBlocking);
    if (e != cudaSuccess) st = tune_cu(e, "the caller's stream / a stream of its own");
    size_t      wsb = 0;
    uint16_t   *hx = malloc(sizeof(uint16_t) * (size_t)T * H);
    int32_t    *hid = malloc(sizeof(int32_t) * (size_t)TUNE_NX * c.slots);
    float      *hw = malloc(sizeof(float) * (size_t)TUNE_NX * c.slots);
    if (!hx || !hid || !hw) st = fm_fail(FM_ERR_OOM, "fm_layer_tune: out of host memory");
    if (st == FM_OK) { /* the inputs: fixed seed, distinct ids per token */
        fm_rng r;
        fm_rng_init(&r, 0x7475u + (uint64_t)T);
        for (size_t i = 0; i < (size_t)T * H; i++) hx[i] = fm_bf16_encode(fm_rng_normal(&r));
        for (int s = 0; s < TUNE_NX * T; s++)
            for (int j = 0; j < K; j++) {
                int id, dup;
                do {
                    id = (int)(fm_rng_uniform(&r) * E);
                    dup = 0;
                    for (int u = 0; u < j; u++) dup |= hid[(size_t)s * K + u] == id;
                } while (dup);
                hid[(size_t)s * K + j] = id;
                hw[(size_t)s * K + j] = 1.0f / (float)K;
            }
        st = fm_layer_workspace_size(l, &wsb);
    }
    if (st == FM_OK &&
        ((e = cudaMalloc((void **)&c.x, sizeof(uint16_t) * (size_t)T * H)) != cudaSuccess ||
         (e = cudaMalloc(&c.out, sizeof(float) * (size_t)T * H)) != cudaSuccess ||
         (e = cudaMalloc((void **)&c.ids, sizeof(int32_t) * (size_t)TUNE_NX * c.slots)) != cudaSuccess ||
         (e = cudaMalloc((void **)&c.w, sizeof(float) * (size_t)TUNE_NX * c.slots)) != cudaSuccess ||
         (wsb && (e = cudaMalloc(&c.ws, wsb)) != cudaSuccess) || (e = cudaEventCreate(&c.ev[0])) != cudaSuccess ||
         (e = cudaEventCreate(&c.ev[1])) != cudaSuccess ||
         (e = cudaMemcpy(c.x, hx, sizeof(uint16_t) * (size_t)T * H, cudaMemcpyHostToDevice)) != cudaSuccess ||
         (e = cudaMemcpy(c.ids, hid, sizeof(int32_t) * (size_t)TUNE_NX * c.slots, cudaMemcpyHostToDevice)) !=
             cudaSuccess ||
         (e = cudaMemcpy(c.w, hw, sizeof(float) * (size_t)TUNE_NX * c.slots, cudaMemcpyHostToDevice)) != cudaSuccess ||
         (e = cudaStreamSynchronize(cudaStreamLegacy)) != cudaSuccess)) /* the DMAs landed before c.st reads */
        st = tune_cu(e, "buffers");
    if (st == FM_OK) st = search(&c, p, &ti);
    if (st == FM_OK) st = fm_layer_errors(l, c.st, NULL); /* the synthetic runs recorded nothing */
    if (st != FM_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", fm_last_error());
        if (c.st) {
            (void)cudaStreamSynchronize(c.st);
            (void)fm_layer_errors(l, c.st, NULL); /* clear what the failed runs left */
        }
        (void)fm_layer_set_plan(l, T, &keep);
        fm_fail(st, "%s", why);
    }
    cudaFree(c.x), cudaFree(c.out), cudaFree(c.ids), cudaFree(c.w), cudaFree(c.ws);
    if (c.ev[0]) cudaEventDestroy(c.ev[0]);
    if (c.ev[1]) cudaEventDestroy(c.ev[1]);
    if (c.st) cudaStreamDestroy(c.st);
    free(hx), free(hid), free(hw);
    fm_cuda_device_leave(p->device, prev);
    if (st == FM_OK && info) *info = ti;
    return st;
}
