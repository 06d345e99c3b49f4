/* layer_plan.c - the cuda layer's plans: the bucket policy's choices (src/layer/
 * buckets.c) resolved into fm_gemm_plans per bucket at create (install) and at
 * fm_layer_set_plan, checked as their launches would check them, and the split-K
 * buffer they need; fm_layer_plan reads them back. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/decode.h"
#include "cuda/layer_cuda.h"
#include "fm_internal.h"

/* T's bucket among the installed ones (T up to max_tokens: the last holds it) */
int fm_cuda_layer_bucket(const fm_cuda_layer *s, int T)
{
    const int b = fm_layer_bucket_of(T);
    return b < s->n_buckets ? b : s->n_buckets - 1;
}

/* The split buffer the plans need: counters of the larger GEMM at the largest split
 * bucket + the largest partials (cuda.h's layout lets FC1 and FC2 share it, one after
 * the other). */
static size_t split_need(const fm_cuda_layer *s, const fm_bucket_plan *plans)
{
    size_t cnt_max = 0, part_max = 0;
    for (int b = 0; b < s->n_buckets; b++) {
        /* a bucket's runs have at most its largest T tokens */
        const int              R = fm_layer_bucket_tokens(s->p.max_tokens, b) * s->p.cfg.top_k;
        const fm_cuda_weights *wk[2] = {s->w13, s->w2};
        const int              ks[2] = {plans[b].ks1, plans[b].ks2};
        for (int g = 0; g < 2; g++) {
            if (ks[g] < 2) continue;
            size_t cb = fm_cuda_split_counter_bytes(wk[g], R), pb = fm_cuda_gemm_split_ws_bytes(wk[g], R, ks[g]) - cb;
            if (cb > cnt_max) cnt_max = cb;
            if (pb > part_max) part_max = pb;
        }
    }
    return cnt_max + part_max;
}

/* The decode kernel's CTAs per SM on the layer's device (current), asked once: 0 when the
 * build has no code for it (or it does not fit). The kernel the layer's runs launch: the
 * gpt-oss twin where the layer has gpt-oss's activation or an expert bias (fm_decode_oss on
 * what layer_run.c passes), else the plain one. */
static int decode_occ(fm_cuda_layer *s)
{
    if (s->decode_occ < 0) {
        int occ = 0, regs = 0;
        if (fm_decode_occupancy(fm_decode_oss(s->p.cfg.activation, s->d_b13, s->d_b2), &occ, &regs) != 0) {
            (void)cudaGetLastError();
            occ = 0;
        }
        s->decode_occ = occ;
    }
    return s->decode_occ;
}

/* Why the decode kernel cannot run bucket b into why ("" when it can): what decode.cu has no
 * code for (FP8 / FP4 activations; an activation other than SwiGLU or gpt-oss's), its slot
 * limit, the device. gpt-oss runs (issue 32): its clamped SwiGLU and both expert biases in the
 * twin kernel (decode.cu), and its softmax-topk routing, which the kernel never computes: it
 * takes ids / weights, the caller's or those of the routing kernels every path shares
 * (layer_run.c: router logits -> fm_moe_route_launch, softmax-topk included -> decode). */
static void decode_refusal(fm_cuda_layer *s, int b, int fp8, char *why, size_t n)
{
    const fm_moe_config *c = &s->p.cfg;
    const int            R = fm_layer_bucket_tokens(s->p.max_tokens, b) * c->top_k;
    why[0] = 0;
    if (c->activation != FM_ACT_SWIGLU && c->activation != FM_ACT_SWIGLU_GPTOSS)
        snprintf(why, n, "decode kernel: SwiGLU or gpt-oss's SwiGLU only");
    else if (c->score != FM_SCORE_SOFTMAX && c->score != FM_SCORE_SIGMOID && c->score != FM_SCORE_SOFTMAX_TOPK)
        snprintf(why, n, "decode kernel: softmax, sigmoid or softmax-topk routing only");
    else if (fp8 || c->act_nvfp4) snprintf(why, n, "decode kernel: BF16 activations only");
    else if (R > FM_DECODE_MAX_SLOTS)
        snprintf(why, n, "decode kernel: %d routed slots > %d", R, FM_DECODE_MAX_SLOTS);
    else if (decode_occ(s) < 1) snprintf(why, n, "decode kernel: no code for this device in this build");
}

/* Bucket b's decode choice into pl: want (0/1), K splits ks1 / ks2 (0: automatic). The note
 * is filled either way; FM_ERR_UNSUPPORTED when wanted and refused, FM_ERR_INVALID_ARG for
 * splits out of range (pl->decode left 0 then). */
static fm_status decode_resolve(fm_cuda_layer *s, fm_bucket_plan *pl, int b, int want, int ks1, int ks2)
{
    memset(pl->dnote, 0, sizeof pl->dnote); /* whole: fm_layer_plan copies every byte */
    decode_refusal(s, b, pl->fp8, pl->dnote, sizeof pl->dnote);
    pl->decode = 0, pl->dks1 = pl->dks2 = pl->dgrid = pl->dcounter = 0;
    if (!want) return FM_OK;
    if (pl->dnote[0]) return fm_fail(FM_ERR_UNSUPPORTED, "%s", pl->dnote);
    const int nks[2] = {(s->w13->kp + FM_DECODE_KC - 1) / FM_DECODE_KC, (s->w2->kp + FM_DECODE_KC - 1) / FM_DECODE_KC};
    const int ks[2] = {ks1, ks2};
    for (int g = 0; g < 2; g++)
        if (ks[g] < 0 || ks[g] > FM_DECODE_MAX_K_SPLITS || ks[g] > nks[g])
            return fm_fail(FM_ERR_INVALID_ARG, "decode kernel: %s K splits %d outside [0 (automatic), %d]",
                           g ? "FC2" : "FC1", ks[g], nks[g] < FM_DECODE_MAX_K_SPLITS ? nks[g] : FM_DECODE_MAX_K_SPLITS);
    /* every CTA resident: the occupancy x SMs, never more (the cooperative launch checks it too) */
    pl->dgrid = decode_occ(s) * fm_cuda_device_limits(s->dev)->sms;
    fm_decode_auto_splits(pl->dgrid, pl->act, s->w13->n, s->w13->k, s->w2->n, s->w2->k, &pl->dks1, &pl->dks2);
    if (ks1) pl->dks1 = ks1;
    if (ks2) pl->dks2 = ks2;
    /* the units from the counter where every run of the bucket has decode_counter_min_t tokens
     * (bucket b holds T = 2^(b-1) + 1 .. 2^b; bucket 0 T = 1) */
    pl->dcounter = (b == 0 ? 1 : (1 << (b - 1)) + 1) >= s->decode_counter_min_t;
    pl->decode = 1;
    return FM_OK;
}

/* decode_path AUTO: whether bucket b takes the decode kernel, i.e. whether the bucket expects
 * at most FM_DECODE_AUTO_LOCAL_SLOTS routed slots on this layer's experts (T x top_k x n_local
 * / n_experts, uniform routing) and routes at most FM_DECODE_AUTO_MAX_SLOTS slots in all (the
 * most it was timed at: 8), on a device of compute capability 9.x, in a layer without the
 * shared expert (launched before the kernel: not timed, and no GPU test runs the two
 * together). That is where it
 * measured faster than the chain in every session that timed both (graph replay, H100,
 * bench/RESULTS.md 2026-12-05 .. 12-07): GLM-5 EP8 T = 1 (1 expected slot) 17.4-17.6 us against
 * 21.8-21.9, gpt-oss-120b EP8 T = 1 / 2 (0.5 / 1) 10.6 / 26.7 against 13.8 / 28.4; and where
 * it was slower: from 2 expected slots (GLM-5 EP8 T = 2 +4.4 %, gpt-oss-120b EP8 T = 4 +8.9 %,
 * Qwen3-235B EP4 T = 1 even, every all-local layer but gpt-oss at T = 1 / 2). The kernel
 * is compiled for sm_80 / sm_100f / sm_120f but has run on sm_90 only, so elsewhere AUTO keeps
 * the chain (decode_path ON still takes it). A bucket the kernel cannot run keeps the chain
 * with the note (decode_resolve). */
static int decode_auto(const fm_cuda_layer *s, int b)
{
    const fm_moe_config *c = &s->p.cfg;
    const int            R = fm_layer_bucket_tokens(s->p.max_tokens, b) * c->top_k;
    const double         local = (double)R * s->p.n_local / c->n_experts;
    const int            shared = s->p.first == 0 && c->shared_inter > 0;
    return s->p.decode_path == FM_DECODE_PATH_AUTO && fm_cuda_device_limits(s->dev)->cc / 10 == 9 && !shared &&
           R <= FM_DECODE_AUTO_MAX_SLOTS && local <= FM_DECODE_AUTO_LOCAL_SLOTS;
}

/* Whether a bucket may run the chain act_fp8 names (1 W4A8, 0 W4A16): W4A8 only on a W4A8
 * layer, W4A16 on one only where its desc allows (FM_FP8_PATH_FASTER). */
static fm_status fp8_allowed(const fm_cuda_layer *s, int act_fp8)
{
    if (act_fp8 != 0 && act_fp8 != 1) return fm_fail(FM_ERR_INVALID_ARG, "act_fp8=%d (0 or 1)", act_fp8);
    if (act_fp8 && !s->w4a8)
        return fm_fail(FM_ERR_UNSUPPORTED, "act_fp8=1 (the W4A8 chain) needs a layer created with cfg act_fp8");
    if (!act_fp8 && s->w4a8 && s->p.act_fp8_path != FM_FP8_PATH_FASTER)
        return fm_fail(FM_ERR_UNSUPPORTED,
                       "act_fp8=0 (W4A16) on a W4A8 layer whose desc requires W4A8 in every bucket "
                       "(act_fp8_path = FM_FP8_PATH_EVERY; FM_FP8_PATH_FASTER allows W4A16)");
    return FM_OK;
}

/* The decode buffer the plans need (the largest bucket's layout) */
static size_t decode_need(const fm_cuda_layer *s, const fm_bucket_plan *plans)
{
    size_t need = 0;
    for (int b = 0; b < s->n_buckets; b++) {
        if (!plans[b].decode) continue;
        const int    R = fm_layer_bucket_tokens(s->p.max_tokens, b) * s->p.cfg.top_k;
        const size_t n = fm_decode_buffer_bytes(R, s->p.n_local, s->w13->n, s->w2->n, plans[b].dks1, plans[b].dks2);
        if (n > need) need = n;
    }
    return need;
}

/* The decode buffer grown to need bytes, zeroed (its rest state; the launches keep it so).
 * No run of the layer is in flight (create, fm_layer_set_plan). */
static fm_status decode_grow(fm_cuda_layer *s, size_t need)
{
    if (need <= s->decode_bytes) return FM_OK;
    void       *d = NULL;
    cudaError_t e = cudaMalloc(&d, need);
    if (e == cudaSuccess) e = cudaMemset(d, 0, need);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cudaStreamLegacy); /* before a run on the caller's stream */
    if (e != cudaSuccess) {
        if (d) cudaFree(d);
        return fm_cuda_layer_fail(e, "the decode kernel's buffer");
    }
    cudaFree(s->d_decode);
    s->d_decode = d, s->decode_bytes = need;
    return FM_OK;
}

/* GEMM g (0 FC1, 1 FC2) of bucket plan pl resolved for launch: made once per bucket
 * (create, fm_layer_set_plan), so that a run only launches. */
static fm_status make_gemm_plan(const fm_cuda_layer *s, fm_bucket_plan *pl, int g)
{
    const fm_gemm_request r =
        g ? (fm_gemm_request){.w = s->w2, .epi = FM_CUDA_EPI_FINALIZE_DET, .x_packed = pl->pk2, .tile = &pl->t2,
                              .feature_blocks = pl->nb2 > 0 ? pl->nb2 : 1, .k_splits = pl->ks2,
                              .work_list = pl->slots > 0, .expert_slots = pl->slots, .pdl = 1,
                              .pdl_reduce = s->pdl_chain}
          : (fm_gemm_request){.w = s->w13, .epi = FM_CUDA_EPI_SWIGLU, .x_packed = pl->pk1, .y_packed = pl->pk2,
                              .tile = &pl->t1, .feature_blocks = pl->nb1 > 0 ? pl->nb1 : 1, .k_splits = pl->ks1,
                              .work_list = pl->slots > 0, .expert_slots = pl->slots, .pdl = 1};
    return fm_cuda_gemm_plan_make(s->dev, &r, &pl->g[g]);
}

fm_status fm_cuda_layer_gemm_choose(void *state, int g, const fm_gemm_hint *h, fm_tile *tile, int *feature_blocks,
                                    int *k_splits, double *est_us)
{
    const fm_cuda_layer  *s = state;
    const fm_gemm_request r = {.w = g ? s->w2 : s->w13,
                               .epi = g ? FM_CUDA_EPI_FINALIZE_DET : FM_CUDA_EPI_SWIGLU,
                               .x_packed = h->x_packed,
                               .expected_rows = h->rows,
                               .active_experts = h->active,
                               .k_splits = h->k_splits_auto ? FM_CUDA_K_SPLITS_AUTO : 0};
    fm_clear_error();
    return fm_cuda_gemm_plan_choose(s->dev, &r, tile, feature_blocks, k_splits, est_us);
}

int fm_cuda_layer_packed_x_ok(void *state, int g)
{
    const fm_cuda_layer *s = state; /* K of FC1 is hidden, of FC2 inter */
    return fm_cuda_packed_x_ok(s->dev, g ? s->p.cfg.inter : s->p.cfg.hidden);
}

/* The policy's plans of every bucket (fm_layer_plan_buckets) resolved for launch, and the
 * split buffer they need. */
static fm_status install_on(fm_cuda_layer *s, const fm_layer_plan_info *plans, int n)
{
    for (int b = 0; b < n; b++) {
        const fm_layer_plan_info *in = &plans[b];
        fm_bucket_plan           *pl = &s->plan[b];
        pl->rows = in->expected_rows, pl->act = in->active_experts;
        pl->t1 = in->tile[0], pl->t2 = in->tile[1];
        pl->nb1 = in->feature_blocks[0], pl->nb2 = in->feature_blocks[1];
        pl->ks1 = in->k_splits[0], pl->ks2 = in->k_splits[1];
        pl->pk1 = in->x_packed[0], pl->pk2 = in->x_packed[1];
        pl->slots = in->work_list ? in->active_experts : 0; /* 0: no work list */
        FM_CHECK(fp8_allowed(s, in->act_fp8));
        pl->fp8 = in->act_fp8;
        FM_CHECK(make_gemm_plan(s, pl, 0));
        FM_CHECK(make_gemm_plan(s, pl, 1));
        /* the policy's decode choice (decode_path ON) or AUTO's (decode_auto) where the kernel
         * can run the bucket; elsewhere the chain, and the note says why */
        if (decode_resolve(s, pl, b, in->decode || decode_auto(s, b), in->decode_k_splits[0], in->decode_k_splits[1]) !=
            FM_OK)
            fm_clear_error();
        s->n_buckets = b + 1;
    }
    FM_CHECK(decode_grow(s, decode_need(s, s->plan)));
    s->split_bytes = split_need(s, s->plan);
    cudaError_t e;
    if (s->split_bytes) { /* the layer's own (a layer runs one call at a time): zero once, kept zero by the runs */
        if ((e = cudaMalloc(&s->d_split, s->split_bytes)) != cudaSuccess) return fm_cuda_layer_fail(e, "cudaMalloc");
        if ((e = cudaMemset(s->d_split, 0, s->split_bytes)) != cudaSuccess)
            return fm_cuda_layer_fail(e, "clear split counters");
        /* the memset ran on the legacy stream, which a caller's non-blocking stream does not wait for */
        if ((e = cudaStreamSynchronize(cudaStreamLegacy)) != cudaSuccess) return fm_cuda_layer_fail(e, "clear split counters");
    }
    return FM_OK;
}

fm_status fm_cuda_layer_install(void *state, const fm_layer_plan_info *plans, int n)
{
    fm_cuda_layer *s = state;
    int            prev = -1;
    FM_CHECK(fm_cuda_device_enter(s->dev, &prev));
    fm_status st = install_on(s, plans, n);
    fm_cuda_device_leave(s->dev, prev);
    return st;
}

fm_status fm_cuda_layer_plan(void *state, int T, fm_layer_plan_info *info)
{
    const fm_cuda_layer  *s = state;
    const int          b = fm_cuda_layer_bucket(s, T);
    const fm_bucket_plan *pl = &s->plan[b];
    *info = (fm_layer_plan_info){.bucket_tokens = fm_layer_bucket_tokens(s->p.max_tokens, b),
                                 .expected_rows = pl->rows, .active_experts = pl->act, .work_list = pl->slots > 0,
                                 .tile = {pl->t1, pl->t2}, .k_splits = {pl->ks1, pl->ks2},
                                 .x_packed = {pl->pk1, pl->pk2}, .feature_blocks = {pl->nb1, pl->nb2},
                                 .decode = pl->decode, .decode_k_splits = {pl->dks1, pl->dks2},
                                 .decode_ctas = pl->dgrid, .act_fp8 = pl->fp8, .decode_counter = pl->dcounter};
    memcpy(info->decode_note, pl->dnote, sizeof info->decode_note);
    return FM_OK;
}

/* Replace T's bucket plan with *info (fm_layer_set_plan): each GEMM's tile, K splits,
 * X layout and feature blocks checked as its launch would check them; the split buffer
 * grown if the new splits need more (zeroed: the counters' rest state). *s unchanged on
 * failure. */
static fm_status set_plan_on(void *state, int T, const fm_layer_plan_info *info)
{
    fm_cuda_layer          *s = state;
    const fm_moe_config *c = &s->p.cfg;
    const int            b = fm_cuda_layer_bucket(s, T);
    const char *const    gemm[2] = {"FC1", "FC2"};
    for (int g = 0; g < 2; g++)
        if (info->k_splits[g] < 1 || info->k_splits[g] > FM_CUDA_MAX_K_SPLITS || info->feature_blocks[g] < 1)
            return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_set_plan: %s k_splits=%d (1..%d), feature_blocks=%d (>= 1)",
                           gemm[g], info->k_splits[g], FM_CUDA_MAX_K_SPLITS, info->feature_blocks[g]);
    if (info->decode != 0 && info->decode != 1)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_set_plan: decode=%d (0 or 1)", info->decode);
    if (info->work_list != 0 && info->work_list != 1)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_set_plan: work_list=%d (0 or 1)", info->work_list);
    const fm_status fs = fp8_allowed(s, info->act_fp8);
    if (fs != FM_OK) return fm_fail(fs, "fm_layer_set_plan: %s", fm_last_error());
    if (info->work_list && (info->active_experts < 1 || info->active_experts > s->p.n_local))
        return fm_fail(FM_ERR_INVALID_ARG,
                       "fm_layer_set_plan: the work list's grid is sized for active_experts=%d, outside [1, %d local "
                       "experts]",
                       info->active_experts, s->p.n_local);
    fm_bucket_plan plans[FM_LAYER_BUCKETS];
    memcpy(plans, s->plan, sizeof plans);
    fm_bucket_plan *pl = &plans[b];
    pl->t1 = info->tile[0], pl->t2 = info->tile[1];
    pl->nb1 = info->feature_blocks[0], pl->nb2 = info->feature_blocks[1];
    pl->ks1 = info->k_splits[0], pl->ks2 = info->k_splits[1];
    pl->pk1 = info->x_packed[0], pl->pk2 = info->x_packed[1];
    pl->slots = info->work_list ? info->active_experts : 0;
    pl->act = info->active_experts > 0 ? info->active_experts : pl->act;
    pl->rows = info->expected_rows > 0 ? info->expected_rows : pl->rows;
    pl->fp8 = info->act_fp8;
    for (int g = 0; g < 2; g++) {
        const int width = g ? c->hidden : c->inter; /* K of the GEMM: what packed X needs % 64 */
        if (info->x_packed[g] != 0 && info->x_packed[g] != 1)
            return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_set_plan: %s x_packed=%d (0 or 1)", gemm[g], info->x_packed[g]);
        if (info->x_packed[g] && !fm_cuda_packed_x_ok(s->dev, width))
            return fm_fail(FM_ERR_UNSUPPORTED, "fm_layer_set_plan: %s x_packed needs sm_90a and K %% 64 == 0 (K=%d)",
                           gemm[g], width);
        const int wg = info->tile[g].family == FM_FAMILY_FP4MOE_WGMMA;
        if (info->work_list && (wg || info->feature_blocks[g] != 1))
            return fm_fail(FM_ERR_UNSUPPORTED,
                           "fm_layer_set_plan: the work list runs mma tiles with one feature block per CTA; %s has a "
                           "%s tile with %d",
                           gemm[g], wg ? "wgmma" : "mma", info->feature_blocks[g]);
        /* the launch's own tile checks, made once here: the runs only launch the plan */
        fm_status st = make_gemm_plan(s, pl, g);
        if (st != FM_OK) return fm_fail(st, "fm_layer_set_plan: %s: %s", gemm[g], fm_last_error());
    }
    fm_status ds = decode_resolve(s, pl, b, info->decode, info->decode_k_splits[0], info->decode_k_splits[1]);
    if (ds != FM_OK) return fm_fail(ds, "fm_layer_set_plan: %s", fm_last_error());
    FM_CHECK(decode_grow(s, decode_need(s, plans)));
    size_t need = split_need(s, plans);
    if (need > s->split_bytes) {
        void       *d = NULL;
        cudaError_t e = cudaMalloc(&d, need);
        if (e == cudaSuccess) e = cudaMemset(d, 0, need);
        if (e == cudaSuccess) e = cudaStreamSynchronize(cudaStreamLegacy); /* before a run on the caller's stream */
        if (e != cudaSuccess) {
            if (d) cudaFree(d);
            return fm_cuda_layer_fail(e, "fm_layer_set_plan: the split-K buffer");
        }
        cudaFree(s->d_split); /* the caller has no run in flight (fm_layer_set_plan's contract) */
        s->d_split = d, s->split_bytes = need;
    }
    memcpy(s->plan, plans, sizeof plans);
    return FM_OK;
}

fm_status fm_cuda_layer_set_plan(void *state, int T, const fm_layer_plan_info *info)
{
    fm_cuda_layer *s = state;
    int         prev = -1;
    FM_CHECK(fm_cuda_device_enter(s->dev, &prev));
    fm_status st = set_plan_on(s, T, info);
    fm_cuda_device_leave(s->dev, prev);
    return st;
}
