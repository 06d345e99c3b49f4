/* run_report.h - what `fp4moe run` reports: one record filled by the run and the
 * check (cmd_run.c), printed as text or as JSON (run_report.c). */
#ifndef FM_RUN_REPORT_H
#define FM_RUN_REPORT_H

#include "fp4moe.h"
#include "run_cuda.h"
#include "run_model.h"

typedef struct {
    const fm_run_model  *m;
    const fm_moe_config *cfg;
    fm_backend_kind      bk;
    int                  T, iters;
    int                  shard_first, shard_count; /* --shard F:C (count 0: all experts) */
    int                  external, tune, check;    /* --routing external, --tune, --check */
    /* startup: device open (cuda, with the code it runs) and layer create */
    double               open_ms, create_ms;
    int                  have_code;
    fm_cuda_code_info    code;
    /* time: median of the eager runs (ms); cuda: graph replay */
    double               med;
    fm_run_cuda_times    ct;
    int                  have_plan; /* cuda: the plan of T's bucket, its tiles' names */
    fm_layer_plan_info   pi;
    char                 tn[2][48];
    fm_layer_tune_info   tinfo;
    double               bytes, flops;
    /* --check: NMSE, max |err|, the bound, the first non-finite output (-1 none), verdict */
    double               nmse, maxabs, bound;
    long                 bad;
    int                  passed;
} fm_run_report;

void fm_run_report_text(const fm_run_report *r);
void fm_run_report_json(const fm_run_report *r);

#endif
