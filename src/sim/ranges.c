/* ranges.c - the accepted range of every numeric simulator setting, as data.
 *
 * Why one table: the library's check, the CLI's parser, the CLI's messages and
 * its --help used to carry their own limits and drifted apart (--launch-us was
 * parsed up to 1e9, checked up to 1e6 and reported as "finite, >= 0").  Every
 * one of them now reads the row here; docs/simulate.md lists the same rows and
 * tests/test_sim_cli.c checks that the help and the doc agree with them.
 *
 * Lower ends that are not 0 say what is plausible, not only what is finite: an
 * efficiency of 1e-307 is "in (0, 1]" yet describes no kernel and overflows the
 * times to Inf, so efficiencies start at 0.001 (0.1 %: ten times below the worst
 * kernel measured in bench/RESULTS.md).
 */
#include "fm_internal.h"
#include "sim_internal.h"

/* clang-format off */
static const fm_sim_range k_ranges[FM_SIM_SET_COUNT] = {
    /* setting                     flag                     name in messages        lo     hi                  int status */
    [FM_SIM_SET_EXPERTS]        = {"--experts",             "experts",              1,     FM_SIM_MAX_EXPERTS, 1, FM_ERR_INVALID_ARG},
    [FM_SIM_SET_TOPK]           = {"--topk",                "top-k",                1,     FM_SIM_MAX_EXPERTS, 1, FM_ERR_INVALID_ARG},
    [FM_SIM_SET_HIDDEN]         = {"--hidden",              "hidden",               1,     1 << 20,            1, FM_ERR_BAD_SHAPE},
    [FM_SIM_SET_INTER]          = {"--intermediate",        "intermediate",         1,     1 << 20,            1, FM_ERR_BAD_SHAPE},
    [FM_SIM_SET_LAYERS]         = {"--layers",              "layers",               1,     100000,             1, FM_ERR_BAD_SHAPE},
    [FM_SIM_SET_SHARED_EXPERTS] = {"--shared-experts",      "shared experts",       0,     64,                 1, FM_ERR_BAD_SHAPE},
    [FM_SIM_SET_SHARED_INTER]   = {"--shared-intermediate", "shared intermediate",  0,     1 << 20,            1, FM_ERR_BAD_SHAPE},
    [FM_SIM_SET_GPUS]           = {"--gpus",                "gpus",                 1,     FM_SIM_MAX_GPUS,    1, FM_ERR_INVALID_ARG},
    [FM_SIM_SET_MAX_RUNNING]    = {"--max-running-requests", "max running requests", 1,    FM_SIM_MAX_RUNNING, 1, FM_ERR_INVALID_ARG},
    [FM_SIM_SET_TOKENS_PER_STEP] = {"--tokens-per-step",    "tokens per step",      1,     64,                 1, FM_ERR_INVALID_ARG},
    [FM_SIM_SET_ACCEPTED]       = {"--accepted",            "accepted tokens",      0,     64,                 0, FM_ERR_INVALID_ARG},
    [FM_SIM_SET_DECODE_STEPS]   = {"--decode-steps",        "decode steps",         1,     1024,               1, FM_ERR_INVALID_ARG},
    [FM_SIM_SET_ROUND_US]       = {"--round-overhead-us",   "round overhead us",    0,     1e9,                0, FM_ERR_INVALID_ARG},
    [FM_SIM_SET_SKEW]           = {"--skew",                "skew",                 0,     FM_SIM_MAX_SKEW,    0, FM_ERR_INVALID_ARG},
    [FM_SIM_SET_SEED]           = {"--seed",                "seed",                 0,     2147483647,         1, FM_ERR_INVALID_ARG},
    [FM_SIM_SET_MC]             = {"--mc",                  "Monte-Carlo steps",    0,     100000,             1, FM_ERR_INVALID_ARG},
    [FM_SIM_SET_TILE_M]         = {"--tile-m",              "tile rows",            0,     1024,               1, FM_ERR_INVALID_ARG},
    [FM_SIM_SET_BW_EFF]         = {"--bw-eff",              "bandwidth efficiency", 0.001, 1,                  0, FM_ERR_INVALID_ARG},
    [FM_SIM_SET_COMPUTE_EFF]    = {"--compute-eff",         "compute efficiency",   0.001, 1,                  0, FM_ERR_INVALID_ARG},
    [FM_SIM_SET_LAUNCH_US]      = {"--launch-us",           "launch us",            0,     1e6,                0, FM_ERR_INVALID_ARG},
    [FM_SIM_SET_SWEEP_MAX]      = {"--sweep-max",           "sweep max",            1,     FM_SIM_MAX_RUNNING, 1, FM_ERR_INVALID_ARG},
};
/* clang-format on */

const fm_sim_range *fm_sim_range_get(fm_sim_setting s)
{
    return ((int)s >= 0 && s < FM_SIM_SET_COUNT) ? &k_ranges[s] : NULL;
}

fm_status fm_sim_range_check(fm_sim_setting s, double v)
{
    const fm_sim_range *r = &k_ranges[s];
    if (v >= r->lo && v <= r->hi && (!r->integer || v == (double)(int64_t)v)) return FM_OK;
    return fm_fail(r->status, "simulate: %s=%g must be %s in [%.10g, %.10g] (%s)", r->name, v,
                   r->integer ? "an integer" : "a number", r->lo, r->hi, r->flag);
}
