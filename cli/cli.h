/* cli.h - the fp4moe command-line tool: one file per subcommand (cmd_<name>.c),
 * each exporting `int fm_cmd_<name>(int argc, char **argv)` (argv[0] is the
 * subcommand name), each reading its flags from a table (flags.h: one parser,
 * one usage printer), and shared helpers in cli_util.c. */
#ifndef FM_CLI_H
#define FM_CLI_H

#include <stdio.h>

#include "fp4moe/tools.h"

/* Exit codes of the tool (documented in docs/cli.md). */
enum {
    FM_EXIT_OK = 0,
    FM_EXIT_FAIL = 1,      /* the operation failed (message on stderr) */
    FM_EXIT_USAGE = 2,     /* bad flags or arguments */
    FM_EXIT_NO_DEVICE = 3, /* no GPU / driver where one was needed */
    FM_EXIT_MISMATCH = 4,  /* --check: result outside the stated bound */
    FM_EXIT_REJECTED = 5,  /* explain/plan: the configuration does not fit */
};

int fm_cmd_run(int argc, char **argv);
int fm_cmd_devices(int argc, char **argv);
int fm_cmd_plan(int argc, char **argv);
int fm_cmd_explain(int argc, char **argv);
int fm_cmd_simulate(int argc, char **argv);
int fm_cmd_inspect(int argc, char **argv);
int fm_cmd_plan_engine(int argc, char **argv); /* fp4moe plan --engine E (cmd_plan_engine.c) */
int fm_cmd_advise(int argc, char **argv);

/* Parse a whole decimal integer in [lo, hi]; on error prints
 * "fp4moe <cmd>: --flag expects an integer in [lo, hi], got 'x'" and returns 0. */
int fm_cli_int(const char *cmd, const char *flag, const char *s, long lo, long hi, long *out);
int fm_cli_double(const char *cmd, const char *flag, const char *s, double lo, double hi, double *out);

/* Print "fp4moe <cmd>: <status name>: <detail>" to stderr and return the exit
 * code for the status (FM_EXIT_NO_DEVICE for FM_ERR_NO_DEVICE and FM_ERR_NO_BACKEND,
 * else FM_EXIT_FAIL). */
int fm_cli_fail(const char *cmd, fm_status s);

/* A status that came from parsing or checking flag values: the statuses a caller can
 * fix (INVALID_ARG, BAD_SHAPE, FORMAT, NOT_FOUND, ARCH_MISMATCH, UNSUPPORTED) print
 * "fp4moe <cmd>: <flag>: <status name>: <detail naming the accepted values>" and
 * return FM_EXIT_USAGE; anything else goes to fm_cli_fail.  `flag` names the flag
 * (or the flags, for a combination). */
int fm_cli_usage_status(const char *cmd, const char *flag, fm_status s);

/* `fp4moe simulate`'s --help (cmd_simulate_flags.c; its flag table: simulate_flags.h). */
void fm_cli_simulate_usage(FILE *f);

/* Print a JSON document (cJSON_Print) and a newline on stdout, then free it. */
struct cJSON;
void fm_cli_print_json(struct cJSON *j);

/* Progress line on stderr, only when stderr is a terminal or FM_PROGRESS=1. */
void fm_cli_progress(const char *fmt, ...);
/* Monotonic wall clock, milliseconds. */
double fm_cli_now_ms(void);

#endif
