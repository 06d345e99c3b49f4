/* cmd_simulate_flags.c - `fp4moe simulate`'s numeric flags and its --help, both
 * from the simulator's range table (fm_sim_range_get): the parser accepts, the
 * message states and the help prints exactly the rows the library checks
 * (docs/simulate.md "Settings and their ranges"). The flag table (flags.h) is built
 * from the same range table, so the parser reads exactly those rows. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cli.h"
#include "flags.h"
#include "simulate_flags.h"

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

/* --max-running: --max-running-requests' old name (hidden), its messages under the new one */
static int parse_max_running(const char *cmd, const char *flag, const char *v, void *field)
{
    const fm_sim_range *r = fm_sim_range_get(FM_SIM_SET_MAX_RUNNING);
    long                lv;
    (void)flag;
    if (!fm_cli_int(cmd, r->flag, v, (long)r->lo, (long)r->hi, &lv)) return FM_EXIT_USAGE;
    *(int *)field = (int)lv;
    return FM_FLAGS_GO;
}

static void usage_more(FILE *f)
{
    fm_cli_simulate_usage(f);
}

#define O(f) offsetof(fm_sim_flags, f)
/* the rows that are not settings of the range table (the usage says them all: help NULL) */
static const fm_flag k_fixed[] = {
    {"help", NULL, FM_FLAG_HELP, O(help), .help = NULL},
    {"sweep", NULL, FM_FLAG_SWITCH, O(sweep), .help = NULL},
    {"csv", NULL, FM_FLAG_SWITCH, O(csv), .help = NULL},
    {"json", NULL, FM_FLAG_SWITCH, O(json), .help = NULL},
    {"fit", NULL, FM_FLAG_SWITCH, O(fit), .help = NULL},
    {"calibrated-h200", NULL, FM_FLAG_SWITCH, O(calibrated), .help = NULL},
    {"model", "M", FM_FLAG_STRING, O(model), .help = NULL},
    {"gpu", "NAME", FM_FLAG_STRING, O(gpu), .help = NULL},
    {"measured", "FILE", FM_FLAG_FILE, O(measured), .help = NULL},
    {"plot", "FILE", FM_FLAG_STRING, O(plot), .help = NULL},
    {"validate", "FILE", FM_FLAG_FILE, O(validate), .help = NULL},
    {"format", "F", FM_FLAG_STRING, O(format), .help = NULL},
    {"parallel", "P", FM_FLAG_STRING, O(parallel), .help = NULL},
    {"kernel", "K", FM_FLAG_STRING, O(kernel), .help = NULL},
    {"max-running", "N", FM_FLAG_CUSTOM, O(ival[FM_SIM_SET_MAX_RUNNING]), .parse = parse_max_running, .help = NULL},
};
enum { N_FIXED = sizeof k_fixed / sizeof k_fixed[0] };

const fm_flag_cmd *fm_cli_simulate_cmd(void)
{
    /* the fixed rows, then one per setting of the simulator's range table: its flag, range
     * and kind, so the parse accepts exactly what the library checks (built once) */
    static fm_flag     rows[N_FIXED + FM_SIM_SET_COUNT];
    static fm_flag_cmd cmd;
    if (cmd.flags) return &cmd;
    for (int i = 0; i < N_FIXED; i++) rows[i] = k_fixed[i];
    for (int i = 0; i < FM_SIM_SET_COUNT; i++) {
        const fm_sim_range *r = fm_sim_range_get((fm_sim_setting)i);
        rows[N_FIXED + i] = (fm_flag){.name = r->flag + 2, /* "--experts" */
                                      .arg = "N",
                                      .kind = r->integer ? FM_FLAG_INT : FM_FLAG_DOUBLE,
                                      .off = r->integer ? O(ival[i]) : O(dval[i]),
                                      .lo = r->lo,
                                      .hi = r->hi};
    }
    cmd = (fm_flag_cmd){
        .cmd = k_cmd,
        .flags = rows,
        .n_flags = N_FIXED + FM_SIM_SET_COUNT,
        .more = usage_more, /* the usage is fm_cli_simulate_usage's, from the same range table */
        .short_help = 1,
        .strict = 1,
        .unknown = {"unknown flag '", "' (fp4moe simulate --help)"},
        .missing = {"", " needs a value"},
        .missing_known_only = 1,
    };
    return &cmd;
}
#undef O

void fm_cli_simulate_apply(const fm_sim_flags *fl, const fm_flags_result *r, fm_sim_config *c, fm_sim_model *ov,
                           int *sweep_max, unsigned *given)
{
    for (int i = 0; i < FM_SIM_SET_COUNT; i++) {
        const fm_sim_range *rg = fm_sim_range_get((fm_sim_setting)i);
        int                 seen = r->seen[N_FIXED + i];
        if (i == FM_SIM_SET_MAX_RUNNING) seen |= r->seen[fm_flags_index(fm_cli_simulate_cmd(), "max-running")];
        if (!seen) continue;
        set_value((fm_sim_setting)i, rg->integer ? (double)fl->ival[i] : fl->dval[i], c, ov, sweep_max);
        *given |= 1u << i;
    }
}
