/* simulate_flags.h - `fp4moe simulate`'s flags (cmd_simulate_flags.c): the flag table
 * (fixed rows and one per row of the simulator's range table) and what it fills. */
#ifndef FM_SIMULATE_FLAGS_H
#define FM_SIMULATE_FLAGS_H

#include "flags.h"
#include "fp4moe.h"

typedef struct {
    const char *model, *gpu, *measured, *plot, *validate, *format, *parallel, *kernel;
    int         sweep, csv, json, fit, calibrated, help;
    int         ival[FM_SIM_SET_COUNT]; /* the numeric settings: integer ones */
    double      dval[FM_SIM_SET_COUNT]; /* and the others */
} fm_sim_flags;

const fm_flag_cmd *fm_cli_simulate_cmd(void);
/* The numeric settings given (by the parse r of fl): into c / ov (model overrides) /
 * *sweep_max, their bits (1u << setting) in *given. */
void fm_cli_simulate_apply(const fm_sim_flags *fl, const fm_flags_result *r, fm_sim_config *c, fm_sim_model *ov,
                           int *sweep_max, unsigned *given);

#endif
