/* cost.c - time of the grouped GEMMs on one GPU from what its experts receive.
 *
 * Roofline per GEMM (FC1 = gate+up, FC2 = down), per GPU per MoE layer:
 *   bytes  = active experts x (N*K weights at the format's bits + one scale byte
 *            per block) + routed rows x (K + N) x 2 (BF16 activations in and out)
 *   issued = 2 N K x tiles x tile_m   (every tile computes tile_m rows, padding
 *            included: that is the waste small batches pay)
 *   t      = max(bytes / (bandwidth x bw_eff), issued / (rate x compute_eff))
 *            + launch_us
 * The rate is the native FP4 rate where the GPU has one (Blackwell), else the
 * BF16 rate: without FP4 MMA (Hopper, Ada) the weights are dequantized into
 * BF16 tiles and multiplied there.  With a measured table the time is instead
 * the sum over experts of the measured per-expert time at their rows.
 * Shared experts are dense BF16 GEMMs over all T tokens, sliced over the GPUs.
 */
#include <math.h>

#include "fm_internal.h"
#include "sim_internal.h"

static double weight_bytes(fm_format f, int n, int k)
{
    const fm_format_traits *tr = fm_format_traits_get(f);
    double elems = (double)n * k;
    double b = elems * (tr ? tr->elem_bits : 16) / 8.0;
    if (tr && tr->block > 0) b += elems / tr->block; /* one E4M3 / UE8M0 byte per block */
    return b;
}

void fm_sim_gemm_roofline(const fm_sim_ctx *x, int n, int k, int tile_m, const fm_sim_moments *mo, fm_sim_cost *out)
{
    const fm_sim_config *c = &x->cfg;
    double bw = c->gpu.mem_gbs * 1e9 * c->bw_eff;          /* B/s */
    double rate = x->peak_tflops * 1e12 * c->compute_eff; /* FLOP/s */
    double wb = mo->active * weight_bytes(c->model.wfmt, n, k);
    double ab = mo->rows * ((double)k + n) * 2.0;
    double issued = 2.0 * n * k * mo->tiles * tile_m;
    *out = (fm_sim_cost){{0, 0}, 0, 0, 0, 0, 0, 0};
    out->wbytes = wb;
    out->abytes = ab;
    out->flops_useful = 2.0 * n * k * mo->rows;
    out->flops_issued = issued;
    out->mem_us = (wb + ab) / bw * 1e6;
    out->compute_us = issued / rate * 1e6;
    out->gemm_us[0] = fmax(out->mem_us, out->compute_us) + c->launch_us;
}

void fm_sim_cost_eval(const fm_sim_ctx *x, int tile_m, const fm_sim_moments *mo, fm_sim_cost *out)
{
    *out = (fm_sim_cost){{0, 0}, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < 2; j++) {
        fm_sim_cost g;
        fm_sim_gemm_roofline(x, x->shape.n[j], x->shape.k[j], tile_m, mo, &g);
        out->wbytes += g.wbytes;
        out->abytes += g.abytes;
        out->flops_useful += g.flops_useful;
        out->flops_issued += g.flops_issued;
        out->mem_us += g.mem_us;
        out->compute_us += g.compute_us;
        out->gemm_us[j] = x->measured ? mo->meas_us[j] : g.gemm_us[0];
    }
}

double fm_sim_shared_us(const fm_sim_ctx *x, int tokens)
{
    const fm_sim_config *c = &x->cfg;
    double bw = c->gpu.mem_gbs * 1e9 * c->bw_eff, rate = c->gpu.bf16_tflops * 1e12 * c->compute_eff;
    double t = 0;
    for (int j = 0; j < 2; j++) {
        double n = x->shape.shared_n[j], k = x->shape.shared_k[j];
        if (n <= 0 || k <= 0) continue;
        double bytes = n * k * 2.0 + (double)tokens * (n + k) * 2.0;
        double flops = 2.0 * n * k * tokens;
        t += fmax(bytes / bw, flops / rate) * 1e6 + c->launch_us;
    }
    return t;
}
