/* run_flags.h - `fp4moe run`'s flags: the table (run_flags.c) parsed into one
 * struct, and the checks of what the flags say together. */
#ifndef FM_RUN_FLAGS_H
#define FM_RUN_FLAGS_H

#include "fp4moe.h"
#include "run_model.h"

/* --plan SPEC: what replaces the planner's choice for T's bucket */
typedef struct {
    int     given;             /* --plan seen */
    int     have[2], ks[2];    /* fc1 / fc2 named, their K splits */
    fm_tile tile[2];
    int     list, list_n;      /* -1 unchanged, 0 nolist, 1 list (list_n experts, 0: the planner's count) */
} fm_run_plan_spec;

/* --shard F:C: experts [first, first + count) held (count 0: all) */
typedef struct {
    int first, count;
} fm_run_shard;

/* What the command line says: fm_run_opts' int fields straight from the table, the rest
 * (enums, float, uint64, the cuda-only settings) here and moved into it by fm_run_options. */
typedef struct {
    fm_run_opts      o;
    int              format, score, backend, external, work_list, tune, global;
    int              decode; /* --decode: fm_layer_desc.decode_path */
    int              fp8_path; /* --fp8-path: fm_layer_desc.act_fp8_path */
    double           routed_scale, seed, row_q;
    fm_run_shard     shard;     /* --shard F:C (count 0: all experts) */
    fm_run_plan_spec plan;      /* --plan */
    const char      *plans_in;  /* --plans */
    const char      *plans_out; /* --save-plans */
} fm_run_cli;

/* argv -> cl: defaults, the table (--help: the usage on stdout), the checks of the
 * flags together; FM_FLAGS_GO (flags.h) when the run goes on, else the exit code
 * (FM_EXIT_OK after --help, FM_EXIT_USAGE with the message on stderr). */
int fm_run_options(int argc, char **argv, fm_run_cli *cl);

#endif
