/* flags.h - the subcommands' flags as data: one table per command, a row per flag
 * (name, kind, range or choices, destination field, help line). One parser reads
 * argv against it and one printer writes the command's --help from it, so what a
 * flag accepts, what its error message says and what the help says cannot drift.
 *
 * Two sets of rules, as the commands parsed before (each keeps its own): getopt_long's
 * ("--name VALUE" or "--name=VALUE", a unique prefix of a name stands for it, an exact
 * name winning over a longer one; "--" ends the flags; "-" and words not starting with
 * '-' are positional arguments wherever they stand), or strict ones (exact names,
 * "--name VALUE", every word a flag). Flags are read in argv order and the first bad
 * one stops the parse. */
#ifndef FM_CLI_FLAGS_H
#define FM_CLI_FLAGS_H

#include <stddef.h>
#include <stdio.h>

typedef enum {
    FM_FLAG_SWITCH, /* no value: the int at off becomes 1 */
    FM_FLAG_INT,    /* int in [lo, hi] (fm_cli_int's message) */
    FM_FLAG_DOUBLE, /* double in [lo, hi] (fm_cli_double's message) */
    FM_FLAG_STRING, /* const char *, any value (an empty one too) */
    FM_FLAG_FILE,   /* const char *, an empty value refused: "--X expects a file name" */
    FM_FLAG_CHOICE, /* one of choices[] by name: the int at off becomes its value */
    FM_FLAG_CUSTOM, /* parse(cmd, "--name", value, field): FM_FLAGS_GO, or the exit code (message printed) */
    FM_FLAG_HELP,   /* the usage on stdout, exit 0 */
} fm_flag_kind;

typedef struct {
    const char *name;
    int         value;
} fm_flag_choice;

typedef struct {
    const char           *name;    /* without the dashes: "experts" is --experts */
    const char           *arg;     /* the value's placeholder in the usage ("N"); NULL: none shown */
    fm_flag_kind          kind;
    size_t                off;     /* the destination: offsetof in the command's options struct */
    double                lo, hi;  /* INT, DOUBLE: accepted range, both ends included */
    const fm_flag_choice *choices; /* CHOICE: ended by a {NULL} row */
    int                   nocase;  /* CHOICE: names matched ignoring case */
    int (*parse)(const char *cmd, const char *flag, const char *val, void *field); /* CUSTOM */
    const char *help;              /* '\n' separates lines, each further one indented under the first;
                                    * NULL: the flag is left out of the usage */
    const char *shown;             /* the usage's name column when not "--name ARG" (two flags on one line) */
} fm_flag;

/* A command's usage and parse rules. Messages are "fp4moe <cmd>: <pre><flag><post>". */
typedef struct {
    const char    *cmd;        /* "run": messages say "fp4moe run: ..." */
    const fm_flag *flags;
    size_t         n_flags;
    const char    *head[4];    /* printed before the flag lines (several literals: -Wpedantic's 4095-char limit) */
    void (*more)(FILE *f);     /* what the usage says after head that is not fixed text (NULL: nothing) */
    const char    *tail[4];    /* and after the flag lines */
    int            col;        /* width of the "--name ARG" column (a longer name: two spaces after it) */
    int            short_help; /* -h is --help too */
    /* strict: exact names only, the value is always the next word, and every word is
     * a flag (no positional arguments); else getopt_long's rules (flags.h's top) */
    int            strict;
    const char    *unknown[2];    /* pre and post of the message for an unknown flag */
    int            usage_on_unknown; /* and then the usage on stderr */
    const char    *missing[2];    /* strict: for a last word that takes a value or is unknown; NULL: unknown's */
    int            missing_known_only; /* missing's message for known flags only (an unknown one: unknown's) */
    const char    *empty_post;    /* after the flag when its value is "" (NULL: "" goes to the kind's check) */
} fm_flag_cmd;

enum { FM_FLAGS_MAX = 64, FM_FLAGS_MAX_ARGS = 16, FM_FLAGS_GO = -1 };

typedef struct {
    int         seen[FM_FLAGS_MAX]; /* per table row: argv index of its last occurrence, 0 not given */
    int         n_args;             /* positional arguments (all counted, the first FM_FLAGS_MAX_ARGS kept) */
    const char *args[FM_FLAGS_MAX_ARGS];
} fm_flags_result;

/* Parse argv[1..argc) into the struct at opts. Returns FM_FLAGS_GO when the command
 * goes on, FM_EXIT_OK after --help (usage printed on stdout), FM_EXIT_USAGE after a
 * bad flag (message printed on stderr). */
int  fm_flags_parse(const fm_flag_cmd *c, int argc, char **argv, void *opts, fm_flags_result *r);
void fm_flags_usage(const fm_flag_cmd *c, FILE *f);
/* The table row of --name (exact), or -1. */
int fm_flags_index(const fm_flag_cmd *c, const char *name);

#endif
