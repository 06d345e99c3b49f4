/* model.c - the MoE figures of the model presets, and validation of the whole
 * simulator configuration.
 *
 * Presets are data: one row per model, figures from each model's published
 * config.json (sources in the `source` column and docs/simulate.md).  Only what
 * the simulator needs is kept: routed experts, top-k, hidden, expert
 * intermediate, MoE layers (dense layers excluded), shared experts, and the
 * routed-expert weight format of the 4-bit checkpoint people serve.
 */
#include <math.h>
#include <string.h>
#include <strings.h>

#include "fm_internal.h"
#include "sim_internal.h"

/* clang-format off */
static const fm_sim_model k_models[] = {
    /* name           E    k  hidden inter layers sh sh_inter fmt  source */
    {"glm5",         256, 8, 6144,  2048,  75,   1, 2048, FM_FORMAT_NVFP4,
     "GLM-5-NVFP4 (docs background): 78 layers = 3 dense + 75 MoE, 256 experts top-8, 1 shared"},
    {"deepseek-v3",  256, 8, 7168,  2048,  58,   1, 2048, FM_FORMAT_NVFP4,
     "deepseek-ai/DeepSeek-V3 config.json: 61 layers, first_k_dense_replace=3; nvidia/DeepSeek-V3-0324-FP4"},
    {"qwen3-235b",   128, 8, 4096,  1536,  94,   0, 0,    FM_FORMAT_NVFP4,
     "Qwen/Qwen3-235B-A22B config.json: 94 layers all MoE, 128 experts top-8; nvidia/Qwen3-235B-A22B-FP4"},
    {"gpt-oss-120b", 128, 4, 2880,  2880,  36,   0, 0,    FM_FORMAT_MXFP4,
     "openai/gpt-oss-120b config.json: 36 layers all MoE, 128 experts top-4, MXFP4 experts"},
};
/* clang-format on */

int fm_sim_model_count(void) { return (int)FM_ARRAY_LEN(k_models); }

const fm_sim_model *fm_sim_model_at(int i)
{
    return (i >= 0 && i < fm_sim_model_count()) ? &k_models[i] : NULL;
}

fm_status fm_sim_model_find(const char *name, fm_sim_model *out)
{
    fm_clear_error();
    if (!name || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_sim_model_find: NULL argument");
    for (int i = 0; i < fm_sim_model_count(); i++) {
        if (!strcasecmp(name, k_models[i].name)) {
            *out = k_models[i];
            return FM_OK;
        }
    }
    return fm_fail(FM_ERR_NOT_FOUND, "unknown model '%s' (presets: glm5, deepseek-v3, qwen3-235b, gpt-oss-120b)",
                   name);
}

void fm_sim_config_default(fm_sim_config *c)
{
    if (!c) return;
    memset(c, 0, sizeof *c);
    c->model = k_models[0];
    const fm_gpu_info *g = NULL;
    if (fm_gpu_find("h200", &g) == FM_OK && g) c->gpu = *g;
    fm_clear_error();
    c->gpus = 8;
    c->parallel = FM_PARALLEL_EP;
    c->max_running = 64;
    c->tokens_per_step = 1;
    c->accepted = 0;
    c->decode_steps = 1;
    c->round_us = 0;
    c->skew = 0;
    c->seed = 1;
    c->mc_steps = 0;
    c->tile_m = 0;
    c->bw_eff = 0.85;      /* H200: 4.17-4.21 TB/s measured copy vs 4.8 TB/s listed */
    c->compute_eff = 0.75; /* H200: 734-745 TFLOP/s measured BF16 GEMM vs 989 listed */
    c->launch_us = 5.0;    /* launch + prologue/epilogue of one grouped GEMM */
}

#define RANGE(set, v) FM_CHECK(fm_sim_range_check(set, (double)(v)))

fm_status fm_sim_config_check(const fm_sim_config *c)
{
    if (!c) return fm_fail(FM_ERR_INVALID_ARG, "simulate: config is NULL");
    const fm_sim_model *m = &c->model;
    const fm_format_traits *tr = fm_format_traits_get(m->wfmt);
    if (!tr) return fm_fail(FM_ERR_FORMAT, "simulate: unknown weight format %d", (int)m->wfmt);
    /* each setting against its row of the range table (ranges.c), then the
     * limits that tie settings together */
    RANGE(FM_SIM_SET_EXPERTS, m->n_experts);
    RANGE(FM_SIM_SET_TOPK, m->top_k);
    if (m->top_k > m->n_experts)
        return fm_fail(FM_ERR_INVALID_ARG, "simulate: top-k=%d must be in [1, experts=%d]", m->top_k, m->n_experts);
    RANGE(FM_SIM_SET_HIDDEN, m->hidden);
    RANGE(FM_SIM_SET_INTER, m->inter);
    RANGE(FM_SIM_SET_LAYERS, m->moe_layers);
    int blk = tr->block > 0 ? tr->block : 1;
    if (m->hidden % blk || m->inter % blk)
        return fm_fail(FM_ERR_BAD_SHAPE, "simulate: hidden=%d and intermediate=%d must be multiples of the %s block (%d)",
                       m->hidden, m->inter, tr->name, blk);
    RANGE(FM_SIM_SET_SHARED_EXPERTS, m->shared_experts);
    RANGE(FM_SIM_SET_SHARED_INTER, m->shared_inter);
    if (m->shared_experts > 0 && m->shared_inter < 1)
        return fm_fail(FM_ERR_BAD_SHAPE, "simulate: shared experts=%d x intermediate=%d is not valid (--shared-intermediate)",
                       m->shared_experts, m->shared_inter);
    RANGE(FM_SIM_SET_GPUS, c->gpus);
    if (c->parallel != FM_PARALLEL_EP && c->parallel != FM_PARALLEL_TP)
        return fm_fail(FM_ERR_INVALID_ARG, "simulate: parallel must be ep or tp");
    if (c->parallel == FM_PARALLEL_EP && m->n_experts % c->gpus)
        return fm_fail(FM_ERR_INVALID_ARG,
                       "simulate: EP degree %d does not divide the %d experts (each GPU must hold the same number)",
                       c->gpus, m->n_experts);
    RANGE(FM_SIM_SET_MAX_RUNNING, c->max_running);
    RANGE(FM_SIM_SET_TOKENS_PER_STEP, c->tokens_per_step);
    RANGE(FM_SIM_SET_ACCEPTED, c->accepted);
    if (c->accepted > c->tokens_per_step)
        return fm_fail(FM_ERR_INVALID_ARG, "simulate: accepted tokens=%g must be in [0, tokens per step=%d]",
                       c->accepted, c->tokens_per_step);
    RANGE(FM_SIM_SET_DECODE_STEPS, c->decode_steps);
    RANGE(FM_SIM_SET_ROUND_US, c->round_us);
    RANGE(FM_SIM_SET_LAUNCH_US, c->launch_us);
    RANGE(FM_SIM_SET_SKEW, c->skew);
    RANGE(FM_SIM_SET_MC, c->mc_steps);
    if (c->kernel != FM_SIM_KERNEL_CUTLASS && c->kernel != FM_SIM_KERNEL_FP4MOE)
        return fm_fail(FM_ERR_INVALID_ARG, "simulate: unknown kernel %d (cutlass or fp4moe)", (int)c->kernel);
    RANGE(FM_SIM_SET_TILE_M, c->tile_m);
    RANGE(FM_SIM_SET_BW_EFF, c->bw_eff);
    RANGE(FM_SIM_SET_COMPUTE_EFF, c->compute_eff);
    /* the GPU figures come from the GPU table, or from a caller's own copy:
     * finite and positive; a figure so small that times overflow is caught
     * where the times are computed (FM_ERR_NONFINITE) */
    if (!(c->gpu.mem_gbs > 0.0 && c->gpu.mem_gbs < 1e7) || !(c->gpu.bf16_tflops > 0.0 && c->gpu.bf16_tflops < 1e6) ||
        !(c->gpu.fp4_tflops >= 0.0 && c->gpu.fp4_tflops < 1e6))
        return fm_fail(FM_ERR_INVALID_ARG,
                       "simulate: GPU '%s' has no memory bandwidth (%g GB/s) or BF16 rate (%g TFLOP/s), or an FP4 rate "
                       "(%g TFLOP/s) that is not a finite number >= 0; pick one from the GPU table (--gpu)",
                       c->gpu.name ? c->gpu.name : "(none)", c->gpu.mem_gbs, c->gpu.bf16_tflops, c->gpu.fp4_tflops);
    if ((int64_t)c->max_running * c->tokens_per_step > FM_SIM_MAX_TOKENS)
        return fm_fail(FM_ERR_INVALID_ARG,
                       "simulate: %d requests x %d tokens per step exceeds %d tokens per step "
                       "(--max-running-requests x --tokens-per-step)",
                       c->max_running, c->tokens_per_step, FM_SIM_MAX_TOKENS);
    return FM_OK;
}

/* Per-GPU per-expert shapes.  TP slices FC1's N (gate and up each inter/G) and
 * FC2's K by G; a slice that is not a multiple of the format's block is rounded
 * up to it, as servers pad (gpt-oss: 2880 / 8 = 360 -> 384 for MXFP4's 32). */
void fm_sim_shapes(const fm_sim_config *c, fm_sim_shape *s)
{
    const fm_sim_model *m = &c->model;
    const fm_format_traits *tr = fm_format_traits_get(m->wfmt);
    int blk = (tr && tr->block > 0) ? tr->block : 1;
    int slice = m->inter;
    if (c->parallel == FM_PARALLEL_TP) {
        slice = (m->inter + c->gpus - 1) / c->gpus;
        slice = (slice + blk - 1) / blk * blk;
    }
    s->local_experts = c->parallel == FM_PARALLEL_EP ? m->n_experts / c->gpus : m->n_experts;
    s->n[0] = 2 * slice;
    s->k[0] = m->hidden;
    s->n[1] = m->hidden;
    s->k[1] = slice;
    /* shared experts: dense BF16, sliced over the GPUs in both modes */
    int sh = m->shared_experts * m->shared_inter;
    int sh_slice = sh > 0 ? (sh + c->gpus - 1) / c->gpus : 0;
    s->shared_n[0] = 2 * sh_slice;
    s->shared_k[0] = m->hidden;
    s->shared_n[1] = m->hidden;
    s->shared_k[1] = sh_slice;
}
