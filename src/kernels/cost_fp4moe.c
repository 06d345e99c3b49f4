/* cost_fp4moe.c - the planner's cost model of fp4moe's own grouped-GEMM tiles,
 * and the ranking fm_cuda_gemm takes its tile from (fm_plan_fp4moe).
 *
 * A roofline alone cannot rank these tiles: at a few rows per expert every tile
 * streams the same weight bytes, and what separates them is how many bytes each
 * SM keeps in flight (CTAs per SM, stages), how much of the SM's issue the E2M1
 * decode takes, pipeline fill on short K, and how the output leaves. The model,
 * for a tile of W warps x MT 16-feature bands, 8*NT tokens a pass, KC of K per
 * stage, at m rows per expert of E experts and [N x K] weights:
 *
 *   O      CTAs per SM, as the CUDA occupancy calculator counts them: the fewest
 *          of what the SM's shared memory (the launcher's own fm_smem_mma /
 *          fm_smem_wgmma + the 1 KB the driver reserves per block), registers
 *          (each kernel's count from ptxas, fp4moe_regs_sm90.inc by
 *          bench/regs_table.py; per warp in 256-register units), threads (the
 *          packed-X wgmma kernel counts its producer warpgroup) and block slots
 *          allow (fm_fp4moe_occupancy; test_cuda_gemm checks it against
 *          cudaOccupancyMaxActiveBlocksPerMultiprocessor);
 *   ps     per stage of one CTA, its SM shared by O CTAs:
 *          max(bytes x O x SMs / bw, warp instructions x O / issue rate,
 *              tensor FLOPs x O / tensor rate per SM)
 *          (instructions: per 64-K chunk, the decode `dec` x 4 and the MMAs;
 *          per stage the copies `stg`; the natural-X wgmma kernel's transpose),
 *          and for the natural-X wgmma kernel at least `xlat` per 16-byte X load
 *          of a thread (X goes through registers one stage ahead: latency-bound);
 *   t_cta  fixed latency + passes x fill + stages x ps + the output tile's bytes
 *          (an mma CTA loops over its expert's passes and, multi-block, over nb
 *          feature blocks, with `mbp` more per pass when there are several; a
 *          wgmma CTA is one pass of one block, plus a latency per token row and
 *          one per m64 tile past the first);
 *   time   max(1, CTAs / (SMs x O)) x t_cta + launch, times the tile's
 *          efficiency factor;
 *   persistent wgmma kernel: one CTA per SM runs tiles back to back, the next
 *          tile's stages loading under the last one's epilogue: the fixed
 *          latency once, then max(1, tiles / SMs) x (l0pp + pov x (token rows +
 *          output) + pps x stages x ps), and its own efficiency factor.
 *
 * bench/fit_tile_model.py implements the same model in Python, fits its
 * parameters to every tile's timing of a full H200 run (bench/h200_fp4moe_tiles.csv)
 * and writes them to fp4moe_cost_h200.inc, with the fit's error and the regret
 * of the model's pick; tests/test_plan_rank.c checks this C model's pick against
 * the same timings. On another GPU the H200's parameters are scaled by its
 * bandwidth and BF16 rate per SM (the gpu table): an untested prediction.
 */
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "fm_internal.h"
#include "kernels/fm_build.h"
#include "kernels/fm_kernels_smem.h"
#include "fp4moe/layer.h"

typedef struct {
    double bw;     /* B/s the chip streams (the H200's, fitted) */
    double dec;    /* warp instructions to decode a 16x16 weight fragment */
    double mma;    /* per mma.sync (and its operand loads) */
    double stg;    /* per stage per warp: copies, barriers, loop */
    double u;      /* share of the SM's issue slots reachable */
    double rmma;   /* mma.sync FLOP/s per SM */
    double l0;     /* s: fixed latency of an mma CTA */
    double l0mb;   /* s: the same, multi-block kernel */
    double mbp;    /* multi-block: extra share per pass when there are several */
    double fill;   /* s: pipeline fill per pass (mma) */
    double epi;    /* output bytes weight (vs streamed bytes) */
    double launch; /* us per launch */
    double wgi;    /* warp instructions per wgmma issue */
    double natx;   /* natural-X wgmma: instructions per 16-byte X segment transposed */
    double rwg;    /* wgmma FLOP/s per SM */
    double l0w;    /* s: fixed latency of a natural-X wgmma CTA */
    double l0p;    /* s: the same, packed-X (warp-specialized) kernel */
    double ltok;   /* s: per token row and band (wgmma epilogue) */
    double xlat;   /* s: natural-X wgmma, per 16-byte X load of a thread in a stage (loaded one stage ahead) */
    double l0pp;   /* s: persistent wgmma kernel, fixed latency per tile */
    double pov;    /* persistent wgmma kernel: share of the epilogue (token rows, output) not hidden */
    double pps;    /* persistent wgmma kernel: its stages' time vs the per-tile kernel's (measured slower at
                      long K; static tile assignment is the suspect) */
    double lmt;    /* s: wgmma, per tile and m64 tile past the first (two m64 tiles a warpgroup: measured
                      slower per tile at short K, e.g. TP8-FC2) */
} fm_cost_params;

typedef struct {
    fm_kernel_family family;
    int              warps, mt, nt, kc, stages;
    fm_kernel_variant variant;
    double           eff;
} fm_cost_eff;

#include "fp4moe_cost_h200.inc"

typedef struct {
    fm_kernel_family family;
    int              warps, mt, nt, kc, stages;
    fm_kernel_variant variant;
    int              regs; /* per thread (ptxas) */
} fm_kernel_regs;

#include "fp4moe_regs_sm90.inc"

#define FM_H200_GBS 4800.0     /* the gpu table's H200 row the parameters were fitted on */
#define FM_H200_BF16_SM (989.0 / 132.0)
#define FM_ISSUE_PER_SM (4 * 1.9e9) /* warp instructions per second: 4 schedulers at ~1.9 GHz */

static int ceil_div(int64_t a, int64_t b) { return (int)((a + b - 1) / b); }

/* the mma kernel's launch-bounds blocks per SM (gemm_mma.cuh expands the same macro) */
static int mma_min_blocks(const fm_tile *t)
{
    return FM_MMA_MIN_BLOCKS(t->warps, t->mt, t->nt, t->kc, t->stages);
}

/* Is row r of a generated table (fp4moe_cost_h200.inc, fp4moe_regs_sm90.inc: a variant
 * and a tile's five fields) kernel v of tile t? The variant says the family and persist;
 * the fields compare as fm_tile_equal does. */
#define FM_ROW_IS(r, v, t)                                                                                        \
    ((r)->variant == (v) &&                                                                                    \
     fm_tile_equal(&(fm_tile){(r)->warps, (r)->mt, (r)->nt, (r)->kc, (r)->stages, (t)->persist, FM_FAMILY_AUTO}, (t)))

static double efficiency(const fm_tile *t, fm_kernel_variant v)
{
    for (size_t i = 0; i < FM_ARRAY_LEN(k_eff_h200); i++)
        if (FM_ROW_IS(&k_eff_h200[i], v, t)) return k_eff_h200[i].eff;
    return 1.0;
}

int fm_plan_fp4moe_auto_blocks(int warps, int mt, int swiglu, int64_t n, int64_t k, int64_t experts, int sms)
{
    if (k > 512 || warps < 1 || mt < 1 || sms < 1) return 1;
    int64_t per_cta = swiglu ? (int64_t)warps * mt / 2 : (int64_t)warps * mt;
    int64_t bands = swiglu ? n / 32 : n / 16;
    if (per_cta < 1) return 1;
    double ctas = (double)((bands + per_cta - 1) / per_cta) * (double)experts / (16.0 * sms);
    return ctas >= 8 ? 8 : (ctas >= 2 ? (int)ctas : 1);
}

int fm_fp4moe_kernel_regs(const fm_tile *t, fm_kernel_variant v)
{
    for (size_t i = 0; i < FM_ARRAY_LEN(k_regs_sm90); i++)
        if (FM_ROW_IS(&k_regs_sm90[i], v, t)) return k_regs_sm90[i].regs;
    return 0;
}

int fm_fp4moe_occupancy(const fm_arch_info *arch, const fm_tile *t, fm_kernel_variant v, size_t smem)
{
    int mma = fm_variant_family(v) == FM_FAMILY_FP4MOE_MMA;
    int warps = fm_kernel_threads(t, v) / 32; /* the packed-X kernels count their producer warpgroup */
    int o = (int)(arch->smem_per_sm / (smem + arch->smem_reserved));
    int thr = arch->max_threads_sm / (warps * 32);
    if (o > thr) o = thr;
    if (o > arch->max_blocks_sm) o = arch->max_blocks_sm;
    int regs = fm_fp4moe_kernel_regs(t, v);
    if (regs > 0) { /* registers per warp in 256-register units */
        int per_warp = (regs * 32 + 255) / 256 * 256;
        int by_regs = arch->regs_sm / per_warp / warps;
        if (o > by_regs) o = by_regs;
    } else if (mma) { /* not in the table: the launch bounds' promise */
        int lb = t->nt <= 2 ? mma_min_blocks(t) : arch->regs_sm / (240 * t->warps * 32);
        if (o > lb) o = lb;
    } else if (o > 1) o = 1; /* wgmma: __launch_bounds__(threads, 1), registers up to the file */
    return o < 1 ? 0 : o;
}

/* CTAs per SM and the model's time of one candidate. */
static double cost_us(const fm_gpu_info *g, const fm_arch_info *arch, fm_kernel_family fam, const fm_tile *t,
                      size_t smem, int nb, int ks, int packed, double sf, int64_t m, int64_t n, int64_t k,
                      int64_t experts, int *occ)
{
    const fm_cost_params *P = &k_cost_h200;
    double bw = P->bw * (g->mem_gbs > 0 ? g->mem_gbs / FM_H200_GBS : 1.0);
    double rate = g->bf16_tflops > 0 && g->sms > 0 ? g->bf16_tflops / g->sms / FM_H200_BF16_SM : 1.0;
    double sms = g->sms;
    int    mma = fam == FM_FAMILY_FP4MOE_MMA;
    int    W = t->warps, MT = t->mt, NT = t->nt, KC = t->kc, TOK = 8 * NT, F = 16 * W * MT;
    /* split K (ks > 1, mma plain kernel): ks times the CTAs, each over its share of the K
     * stages, plus the fix-up of the last CTA of each (pass, block) (partials to L2, a
     * counter, the sum read back): modelled as one more fixed CTA latency (unmeasured) */
    int    passes = ceil_div(m, TOK), B = ceil_div(n, F), nks = ceil_div(ceil_div(k, KC), ks), chunks = KC / 64;
    /* X bytes a stage: the pass's valid rows (rows past an expert's count are not read) */
    double wst = (double)F * KC * (0.5 + sf), xst = (double)m / passes * KC * 2;
    int    o = fm_fp4moe_occupancy(arch, t, fm_variant_of(fam, t, nb, packed), smem);
    if (o < 1) o = 1;
    double ctas, iss, tc;
    if (mma) {
        ctas = (double)experts * ceil_div(B, nb) * ks;
        iss = W * (MT * chunks * (4 * P->dec + 4.0 * NT * P->mma) + chunks * 2.0 * NT + P->stg);
        tc = (double)W * MT * chunks * 4 * NT * 4096 * 2 / (P->rmma * rate);
    } else {
        ctas = (double)experts * B * passes;
        iss = W * (MT * chunks * (4 * P->dec + 4 * P->wgi) + P->stg);
        if (!packed) iss += (double)TOK * KC * 2 / 16 / 32 * P->natx * 4;
        tc = (double)F * TOK * KC * 2 / (P->rwg * rate);
    }
    double tb = (wst + xst) * o * sms / bw, ti = iss * o / (FM_ISSUE_PER_SM * P->u), tt = tc * o;
    double ps = tb > ti ? tb : ti;
    if (tt > ps) ps = tt;
    if (!mma && !packed && P->xlat * xst / (W * 32 * 16) > ps) ps = P->xlat * xst / (W * 32 * 16);
    double out = P->epi * TOK * F * 2.0 * o * sms / bw, t_cta;
    if (mma)
        t_cta = (nb > 1 ? P->l0mb : P->l0) + (ks > 1 ? passes * P->l0 : 0) + passes * P->fill +
                (double)nb * passes * (1 + (nb > 1 && passes > 1 ? P->mbp : 0)) * (nks * ps + out); /* nb: any int */
    else t_cta = (packed ? P->l0p : P->l0w) + P->ltok * TOK * MT + P->lmt * (MT - 1) + nks * ps + out;
    double waves = ctas / (sms * o);
    *occ = o;
    if (t->persist) { /* one CTA per SM over all tiles: the fixed latency once */
        double t_tile = P->l0pp + P->pov * (P->ltok * TOK * MT + out) + P->lmt * (MT - 1) + P->pps * nks * ps;
        return ((P->l0p + (waves > 1 ? waves : 1) * t_tile) * 1e6 + P->launch) * efficiency(t, FM_VARIANT_WGMMA_PERSISTENT);
    }
    return ((waves > 1 ? waves : 1) * t_cta * 1e6 + P->launch) * efficiency(t, fm_variant_of(fam, t, nb, packed));
}

/* CTAs of the plain mma kernel (one feature block each) over `experts` experts */
static int64_t plain_ctas(const fm_tile *t, int swiglu, int64_t n, int64_t experts)
{
    int64_t per_cta = swiglu ? (int64_t)t->warps * t->mt / 2 : (int64_t)t->warps * t->mt; /* bands */
    int64_t bands = swiglu ? n / 32 : n / 16;
    return per_cta < 1 ? experts : experts * ((bands + per_cta - 1) / per_cta);
}

static int by_est(const void *pa, const void *pb)
{
    const fm_fp4moe_choice *a = pa, *b = pb;
    if (a->est_us != b->est_us) return a->est_us > b->est_us ? 1 : -1;
    return (a->smem_bytes > b->smem_bytes) - (a->smem_bytes < b->smem_bytes);
}

#define FM_CHOICE_MAX 256

fm_status fm_plan_fp4moe(const fm_gpu_info *gpu, const fm_fp4moe_query *q, int64_t rows, int64_t n, int64_t k,
                         int64_t experts, fm_fp4moe_choice *out, size_t cap, size_t *count, size_t *total)
{
    fm_clear_error();
    if (!gpu || !q || !count || (!out && cap)) return fm_fail(FM_ERR_INVALID_ARG, "fm_plan_fp4moe: NULL argument");
    if (q->weights != FM_ELEM_NVFP4 && q->weights != FM_ELEM_MXFP4)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_plan_fp4moe: weights must be nvfp4 or mxfp4, not %s",
                       fm_elem_name(q->weights));
    if (q->feature_blocks < 0)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_plan_fp4moe: feature_blocks=%d < 0", q->feature_blocks);
    if (rows < 1 || n < 1 || k < 1 || experts < 1 || rows > INT32_MAX || n > INT32_MAX || k > INT32_MAX ||
        experts > INT32_MAX)
        return fm_fail(FM_ERR_BAD_SHAPE, "fm_plan_fp4moe: rows per expert, N, K and experts must be 1..2^31-1 "
                                         "(rows=%lld N=%lld K=%lld experts=%lld)",
                       (long long)rows, (long long)n, (long long)k, (long long)experts);
    int kq = q->weights == FM_ELEM_NVFP4 ? 16 : 32;
    if (n % 16 || k % kq)
        return fm_fail(FM_ERR_BAD_SHAPE, "fm_plan_fp4moe: N=%lld must be a multiple of 16 and K=%lld of %d (%s blocks)",
                       (long long)n, (long long)k, kq, fm_elem_name(q->weights));
    if (q->swiglu && n % 32)
        return fm_fail(FM_ERR_BAD_SHAPE, "fm_plan_fp4moe: SwiGLU needs N %% 32 == 0 (gate/up halves of 16-row bands), "
                                         "N=%lld",
                       (long long)n);
    const fm_arch_info *arch = NULL;
    FM_CHECK(fm_arch_get(gpu->cc, &arch));
    FM_CHECK(fm_fp4moe_arch_check(FM_FAMILY_FP4MOE_MMA, arch));
    int wg = fm_fp4moe_arch_check(FM_FAMILY_FP4MOE_WGMMA, arch) == FM_OK;
    fm_clear_error();
    if (q->x_packed && !wg)
        return fm_fail(FM_ERR_ARCH_MISMATCH, "fm_plan_fp4moe: packed X is read by the wgmma kernel only (sm_90a), "
                                             "not on %s",
                       arch->name);
    if (q->x_packed && k % 64)
        return fm_fail(FM_ERR_UNSUPPORTED, "fm_plan_fp4moe: packed X needs K %% 64 == 0 (K=%lld)", (long long)k);
    unsigned long long rows_ok[2] = {q->mma_rows, q->wgmma_rows};
    if (!rows_ok[0] && !rows_ok[1]) fm_build_rows_for(gpu->cc, &rows_ok[0], &rows_ok[1]);
    size_t limit = arch->smem_block_optin;
    if (q->smem_limit && q->smem_limit < limit) limit = q->smem_limit;
    double sf = q->weights == FM_ELEM_NVFP4 ? 1.0 / 16 : 1.0 / 32;

    fm_fp4moe_choice all[FM_CHOICE_MAX];
    size_t got = 0, over = 0, odd = 0, no_mb = 0, absent = 0;
    for (int f = 0; f < 2; f++) {
        fm_kernel_family fam = f ? FM_FAMILY_FP4MOE_WGMMA : FM_FAMILY_FP4MOE_MMA;
        if (f ? !wg : q->x_packed) continue;
        size_t nt = 0;
        const fm_tile *tiles = f ? fm_wgmma_tiles(&nt) : fm_mma_tiles(&nt);
        for (size_t i = 0; i < nt; i++) {
            const fm_tile *t = &tiles[i];
            if (i >= 64 || !((rows_ok[f] >> i) & 1)) { /* no code for this device in the build */
                absent++;
                continue;
            }
            fm_smem_breakdown bd;
            fm_status st = f ? fm_smem_wgmma(t, &bd) : fm_smem_mma(t, &bd);
            if (st != FM_OK) return st; /* a compiled tile outside its model: a bug, said as it is */
            if (t->persist && !q->x_packed) continue; /* reads packed X only: not a candidate */
            if (q->swiglu && t->mt % 2) {
                odd++;
                continue;
            }
            if (bd.total > limit) {
                over++;
                continue;
            }
            int has_mb = !f && fm_mma_tile_has_mb(t);
            int nbs[2], nn = 0;
            if (q->feature_blocks == 1 || (f && q->feature_blocks == 0)) nbs[nn++] = 1;
            else if (q->feature_blocks > 1) {
                if (!has_mb) {
                    no_mb++;
                    continue;
                }
                nbs[nn++] = q->feature_blocks;
            } else {
                nbs[nn++] = 1;
                int a = has_mb ? fm_plan_fp4moe_auto_blocks(t->warps, t->mt, q->swiglu, n, k, experts, gpu->sms) : 1;
                if (a > 1) nbs[nn++] = a;
            }
            for (int j = 0; j < nn && got < FM_CHOICE_MAX; j++) {
                /* split K: the plain mma kernel, where its grid is under one wave */
                int max_ks = 1;
                if (!f && nbs[j] == 1 && q->max_k_splits > 1) {
                    int o = fm_fp4moe_occupancy(arch, t, FM_VARIANT_MMA, bd.total);
                    if (plain_ctas(t, q->swiglu, n, experts) < (int64_t)gpu->sms * (o > 0 ? o : 1))
                        max_ks = q->max_k_splits;
                }
                for (int ks = 1; ks <= max_ks && got < FM_CHOICE_MAX; ks *= 2) {
                    if (ks > 1 && ks > ceil_div(k, t->kc)) break; /* every split at least one K stage */
                    fm_fp4moe_choice *c = &all[got++];
                    memset(c, 0, sizeof *c);
                    c->tile = *t; /* the catalogue's row: its family set */
                    c->feature_blocks = nbs[j];
                    c->k_splits = ks;
                    c->smem_bytes = bd.total;
                    c->est_us = cost_us(gpu, arch, fam, t, bd.total, nbs[j], ks, q->x_packed, sf, rows, n, k,
                                        experts, &c->ctas_per_sm);
                    c->variant = fm_variant_of(fam, t, nbs[j], q->x_packed);
                    c->efficiency = efficiency(t, c->variant);
                }
            }
        }
    }
    if (!got)
        /* the limit when it dropped every tile this build has code for (tiles without code
         * are the build's, not the caller's: on their own, FM_ERR_NO_KERNEL) */
        return fm_fail(over && !odd && !no_mb ? FM_ERR_SMEM_EXCEEDED
                       : absent && !over && !odd && !no_mb ? FM_ERR_NO_KERNEL
                                                           : FM_ERR_UNSUPPORTED,
                       "fm_plan_fp4moe: no compiled fp4moe tile qualifies on %s (sm_%d)%s: %zu over the %zu B "
                       "shared-memory limit, %zu without gate/up pairs for SwiGLU, %zu without a multi-block kernel, "
                       "%zu without code for it in this build (%s)",
                       gpu->name, gpu->cc, q->x_packed ? " for packed X" : "", over, limit, odd, no_mb, absent,
                       fm_cuda_build_targets());
    qsort(all, got, sizeof all[0], by_est);
    size_t w = got < cap ? got : cap;
    if (w) memcpy(out, all, w * sizeof all[0]);
    *count = w;
    if (total) *total = got;
    return FM_OK;
}
