/* cmd_simulate_flags.c - `fp4moe simulate`'s numeric flags and its --help, both
 * from the simulator's range table (fm_sim_range_get): the parser accepts, the
 * message states and the help prints exactly the rows the library checks
 * (docs/simulate.md "Settings and their ranges"). */
#include <stdint.h>
#include <string.h>

#include "cli.h"

static const char k_cmd[] = "simulate";

void fm_cli_simulate_usage(FILE *f)
{
    fprintf(f,
            "usage: fp4moe simulate [flags]\n"
            "model    --model glm5|deepseek-v3|qwen3-235b|gpt-oss-120b (default glm5); overrides:\n"
            "         --experts N --topk N --hidden N --intermediate N --layers N (MoE layers)\n"
            "         --shared-experts N --shared-intermediate N --format nvfp4|mxfp4|bf16\n"
            "cluster  --gpu NAME|local (default h200; `fp4moe plan --help` lists names) --gpus N (8)\n"
            "         --parallel ep|tp (ep)\n"
            "serving  --max-running-requests N (64) --tokens-per-step N (1 + MTP/speculative drafts)\n"
            "         --accepted X (tokens kept per request per step; default all) --decode-steps N (1)\n"
            "         --round-overhead-us X (scheduler overhead per round, 0)\n"
            "routing  --skew S (Zipf exponent of expert popularity, 0 = uniform) --seed N (1)\n"
            "         --mc N (Monte-Carlo steps for the straggler GPU, 0 = exact expectations)\n"
            "kernel   --kernel cutlass|fp4moe (whose tiles pad the rows: the planner's CUTLASS pick, or\n"
            "         fp4moe's swap-AB kernel) --tile-m N (override; 0 = the planner's pick)\n"
            "         --measured FILE.csv (measured times)\n"
            "         --bw-eff X (0.85) --compute-eff X (0.75) --launch-us X (5)\n"
            "         --calibrated-h200 (fp4moe's kernel on the H200 with efficiencies fitted to bench data)\n"
            "validate --validate FILE.csv (roofline vs every measured row of --gpu; --csv for CSV)\n"
            "         --fit (also fit --bw-eff/--compute-eff to that table and show the fitted errors)\n"
            "output   --sweep (table over 1..--sweep-max requests) --sweep-max N (512)\n"
            "         --csv | --json, --plot FILE.png (gnuplot)\n"
            "ranges   (both ends included; the library checks the same table; also requests x tokens per\n"
            "         step <= %d, --topk <= --experts, --accepted <= --tokens-per-step)\n",
            FM_SIM_MAX_STEP_TOKENS);
    for (int i = 0; i < FM_SIM_SET_COUNT; i++) {
        const fm_sim_range *r = fm_sim_range_get((fm_sim_setting)i);
        char rng[64];
        snprintf(rng, sizeof rng, "[%.10g, %.10g]", r->lo, r->hi);
        fprintf(f, "%s%-22s %-18s%s", i % 2 ? "" : "         ", r->flag, rng, i % 2 || i + 1 == FM_SIM_SET_COUNT ? "\n" : "");
    }
    fprintf(f, "work     a run estimated at more than %.0f min of CPU time is refused (exit 2, the message\n"
               "         says what to lower); progress goes to stderr after 2 s (a terminal, or FM_PROGRESS=1)\n"
               "exit: 0 ok, 1 failed, 2 bad flags or settings, 3 no GPU (--gpu local)\n",
            FM_SIM_MAX_SECONDS / 60);
}

/* Where a numeric flag's value goes. */
static void set_value(fm_sim_setting id, double v, fm_sim_config *c, fm_sim_model *ov, int *sweep_max)
{
    int iv = (int)v;
    switch (id) {
    case FM_SIM_SET_EXPERTS: ov->n_experts = iv; break;
    case FM_SIM_SET_TOPK: ov->top_k = iv; break;
    case FM_SIM_SET_HIDDEN: ov->hidden = iv; break;
    case FM_SIM_SET_INTER: ov->inter = iv; break;
    case FM_SIM_SET_LAYERS: ov->moe_layers = iv; break;
    case FM_SIM_SET_SHARED_EXPERTS: ov->shared_experts = iv; break;
    case FM_SIM_SET_SHARED_INTER: ov->shared_inter = iv; break;
    case FM_SIM_SET_GPUS: c->gpus = iv; break;
    case FM_SIM_SET_MAX_RUNNING: c->max_running = iv; break;
    case FM_SIM_SET_TOKENS_PER_STEP: c->tokens_per_step = iv; break;
    case FM_SIM_SET_ACCEPTED: c->accepted = v; break;
    case FM_SIM_SET_DECODE_STEPS: c->decode_steps = iv; break;
    case FM_SIM_SET_ROUND_US: c->round_us = v; break;
    case FM_SIM_SET_SKEW: c->skew = v; break;
    case FM_SIM_SET_SEED: c->seed = (uint64_t)v; break;
    case FM_SIM_SET_MC: c->mc_steps = iv; break;
    case FM_SIM_SET_TILE_M: c->tile_m = iv; break;
    case FM_SIM_SET_BW_EFF: c->bw_eff = v; break;
    case FM_SIM_SET_COMPUTE_EFF: c->compute_eff = v; break;
    case FM_SIM_SET_LAUNCH_US: c->launch_us = v; break;
    case FM_SIM_SET_SWEEP_MAX: *sweep_max = iv; break;
    case FM_SIM_SET_COUNT: break;
    }
}

int fm_cli_simulate_numeric(const char *a, const char *val, fm_sim_config *c, fm_sim_model *ov, int *sweep_max,
                            unsigned *given)
{
    if (!strcmp(a, "--max-running")) a = "--max-running-requests";
    for (int i = 0; i < FM_SIM_SET_COUNT; i++) {
        const fm_sim_range *r = fm_sim_range_get((fm_sim_setting)i);
        if (strcmp(a, r->flag)) continue;
        double v = 0;
        if (r->integer) {
            long lv = 0;
            if (!val || !fm_cli_int(k_cmd, a, val, (long)r->lo, (long)r->hi, &lv)) return -1;
            v = (double)lv;
        } else if (!val || !fm_cli_double(k_cmd, a, val, r->lo, r->hi, &v)) {
            return -1;
        }
        set_value((fm_sim_setting)i, v, c, ov, sweep_max);
        *given |= 1u << i;
        return 1;
    }
    return 0;
}

