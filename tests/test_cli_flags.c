/* test_cli_flags.c - the CLI's flag table (cli/flags.c): both sets of parse rules, the
 * messages and exit codes each refusal gives, and the usage printed from the table.
 * The commands' own behaviour is pinned end to end by run_cli.sh, the golden files and
 * the CLI cases of io.cmake / test_plan_cli.c / test_sim_cli.c. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "flags.h"
#include "testutil.h"

typedef struct {
    int         n, sw, choice, help;
    double      x;
    const char *s, *file, *plan, *plans;
    int         custom;
} opts;

static int parse_even(const char *cmd, const char *flag, const char *v, void *field)
{
    int n = atoi(v);
    if (n % 2) {
        fprintf(stderr, "fp4moe %s: %s wants an even number, got '%s'\n", cmd, flag, v);
        return FM_EXIT_FAIL; /* a custom parser's exit code is passed on as it is */
    }
    *(int *)field = n;
    return FM_FLAGS_GO;
}

static const fm_flag_choice k_choices[] = {{"red", 1}, {"green", 2}, {"blue", 3}, {NULL, 0}};

#define O(f) offsetof(opts, f)
static const fm_flag k_flags[] = {
    {"n", "N", FM_FLAG_INT, O(n), 1, 10, .help = "a number\nsaid on two lines"},
    {"switch", NULL, FM_FLAG_SWITCH, O(sw), .help = "a switch"},
    {"colour", "C", FM_FLAG_CHOICE, O(choice), .choices = k_choices, .help = "red | green | blue"},
    {"x", "X", FM_FLAG_DOUBLE, O(x), 0.5, 2, .help = "a real number"},
    {"string", "S", FM_FLAG_STRING, O(s), .help = NULL},
    {"file", "FILE", FM_FLAG_FILE, O(file), .shown = "--file F", .help = "a file"},
    {"plan", "SPEC", FM_FLAG_STRING, O(plan), .help = "a plan"},
    {"plans", "FILE", FM_FLAG_STRING, O(plans), .help = "plans"},
    {"even", "N", FM_FLAG_CUSTOM, O(custom), .parse = parse_even, .help = "an even number"},
    {"a-very-long-name", "N", FM_FLAG_INT, O(n), 0, 1, .help = "overflows the column"},
    {"help", NULL, FM_FLAG_HELP, O(help), .help = "this text"},
};
#undef O

static const fm_flag_cmd k_getopt = {
    .cmd = "t",
    .flags = k_flags,
    .n_flags = sizeof k_flags / sizeof k_flags[0],
    .head = {"usage: t [flags]\n"},
    .tail = {"exit: 0\n"},
    .col = 10,
    .unknown = {"unknown or incomplete flag '", "'"},
};

/* Parse argv (NULL-ended) with c; the stderr it printed in err (first line). */
static int run(const fm_flag_cmd *c, opts *o, fm_flags_result *r, char *err, size_t errn, char **argv)
{
    int argc = 0;
    while (argv[argc]) argc++;
    memset(o, 0, sizeof *o);
    fflush(stderr);
    FILE *t = tmpfile();
    assert_non_null(t);
    int saved = dup(2);
    dup2(fileno(t), 2);
    int rc = fm_flags_parse(c, argc, argv, o, r);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(t);
    err[0] = 0;
    if (!fgets(err, (int)errn, t)) err[0] = 0;
    fclose(t);
    return rc;
}

#define ARGV(...) ((char *[]){"t", __VA_ARGS__, NULL})

static void test_getopt_rules(void **state)
{
    (void)state;
    opts            o;
    fm_flags_result r;
    char            e[256];
    assert_int_equal(run(&k_getopt, &o, &r, e, sizeof e, ARGV("--n", "3", "--x=1.5", "--switch", "pos", "--colour", "green")),
                     FM_FLAGS_GO);
    assert_int_equal(o.n, 3);
    assert_true(o.x == 1.5);
    assert_int_equal(o.sw, 1);
    assert_int_equal(o.choice, 2);
    assert_int_equal(r.n_args, 1);
    assert_string_equal(r.args[0], "pos");
    assert_true(r.seen[0] && r.seen[1] && r.seen[2] && r.seen[3] && !r.seen[4]);
    assert_true(r.seen[0] < r.seen[3] && r.seen[3] < r.seen[1]); /* argv order */
    /* a unique prefix stands for the name; an exact name wins over a longer one */
    assert_int_equal(run(&k_getopt, &o, &r, e, sizeof e, ARGV("--sw", "--pla", "x")), FM_EXIT_USAGE);
    assert_string_equal(e, "fp4moe t: unknown or incomplete flag '--pla'\n");
    assert_int_equal(run(&k_getopt, &o, &r, e, sizeof e, ARGV("--sw", "--plan", "x", "--plans=y")), FM_FLAGS_GO);
    assert_true(o.sw && !strcmp(o.plan, "x") && !strcmp(o.plans, "y"));
    /* "--" ends the flags, "-" is a word */
    assert_int_equal(run(&k_getopt, &o, &r, e, sizeof e, ARGV("-", "--", "--n")), FM_FLAGS_GO);
    assert_int_equal(r.n_args, 2);
    assert_string_equal(r.args[1], "--n");
    /* refusals: unknown, short, a value to a switch, a missing value */
    assert_int_equal(run(&k_getopt, &o, &r, e, sizeof e, ARGV("--bogus")), FM_EXIT_USAGE);
    assert_int_equal(run(&k_getopt, &o, &r, e, sizeof e, ARGV("-x")), FM_EXIT_USAGE);
    assert_string_equal(e, "fp4moe t: unknown or incomplete flag '-x'\n");
    assert_int_equal(run(&k_getopt, &o, &r, e, sizeof e, ARGV("--switch=1")), FM_EXIT_USAGE);
    assert_int_equal(run(&k_getopt, &o, &r, e, sizeof e, ARGV("--n")), FM_EXIT_USAGE);
    assert_string_equal(e, "fp4moe t: unknown or incomplete flag '--n'\n");
    /* the first bad flag stops the parse; --help before it prints the usage */
    assert_int_equal(run(&k_getopt, &o, &r, e, sizeof e, ARGV("--n", "0", "--help")), FM_EXIT_USAGE);
    assert_string_equal(e, "fp4moe t: --n expects an integer in [1, 10], got '0'\n");
}

static void test_values(void **state)
{
    (void)state;
    opts            o;
    fm_flags_result r;
    char            e[256];
    assert_int_equal(run(&k_getopt, &o, &r, e, sizeof e, ARGV("--x", "3")), FM_EXIT_USAGE);
    assert_string_equal(e, "fp4moe t: --x expects a number in [0.5, 2], got '3'\n");
    assert_int_equal(run(&k_getopt, &o, &r, e, sizeof e, ARGV("--colour", "Red")), FM_EXIT_USAGE); /* exact case */
    assert_string_equal(e, "fp4moe t: --colour expects red, green or blue, got 'Red'\n");
    assert_int_equal(run(&k_getopt, &o, &r, e, sizeof e, ARGV("--file", "")), FM_EXIT_USAGE);
    assert_string_equal(e, "fp4moe t: --file expects a file name\n");
    assert_int_equal(run(&k_getopt, &o, &r, e, sizeof e, ARGV("--string", "")), FM_FLAGS_GO); /* STRING takes "" */
    assert_string_equal(o.s, "");
    assert_int_equal(run(&k_getopt, &o, &r, e, sizeof e, ARGV("--even", "4")), FM_FLAGS_GO);
    assert_int_equal(o.custom, 4);
    assert_int_equal(run(&k_getopt, &o, &r, e, sizeof e, ARGV("--even", "3")), FM_EXIT_FAIL);
    assert_string_equal(e, "fp4moe t: --even wants an even number, got '3'\n");
}

static void test_strict_rules(void **state)
{
    (void)state;
    fm_flag_cmd c = k_getopt;
    c.strict = 1, c.short_help = 1;
    c.unknown[0] = "unknown flag ", c.unknown[1] = " (see --help)";
    c.missing[0] = "", c.missing[1] = " needs a value (or unknown flag)";
    c.empty_post = " expects a value, got '' (an empty string)";
    opts            o;
    fm_flags_result r;
    char            e[256];
    assert_int_equal(run(&c, &o, &r, e, sizeof e, ARGV("--n", "3", "--switch")), FM_FLAGS_GO);
    assert_int_equal(run(&c, &o, &r, e, sizeof e, ARGV("pos", "x")), FM_EXIT_USAGE); /* every word a flag */
    assert_string_equal(e, "fp4moe t: unknown flag pos (see --help)\n");
    assert_int_equal(run(&c, &o, &r, e, sizeof e, ARGV("--sw")), FM_EXIT_USAGE); /* exact names */
    assert_string_equal(e, "fp4moe t: --sw needs a value (or unknown flag)\n");
    assert_int_equal(run(&c, &o, &r, e, sizeof e, ARGV("--n=3")), FM_EXIT_USAGE);
    assert_int_equal(run(&c, &o, &r, e, sizeof e, ARGV("--bogus", "")), FM_EXIT_USAGE); /* empty before unknown */
    assert_string_equal(e, "fp4moe t: --bogus expects a value, got '' (an empty string)\n");
    c.missing_known_only = 1, c.missing[1] = " needs a value";
    assert_int_equal(run(&c, &o, &r, e, sizeof e, ARGV("--bogus")), FM_EXIT_USAGE);
    assert_string_equal(e, "fp4moe t: unknown flag --bogus (see --help)\n");
    assert_int_equal(run(&c, &o, &r, e, sizeof e, ARGV("--n")), FM_EXIT_USAGE);
    assert_string_equal(e, "fp4moe t: --n needs a value\n");
}

static void test_usage(void **state)
{
    (void)state;
    FILE *t = tmpfile();
    assert_non_null(t);
    fm_flags_usage(&k_getopt, t);
    char buf[2048] = "";
    rewind(t);
    size_t n = fread(buf, 1, sizeof buf - 1, t);
    buf[n] = 0;
    fclose(t);
    assert_string_equal(buf, "usage: t [flags]\n"
                             "  --n N      a number\n"
                             "             said on two lines\n"
                             "  --switch   a switch\n"
                             "  --colour C red | green | blue\n"
                             "  --x X      a real number\n"
                             "  --file F   a file\n"
                             "  --plan SPEC  a plan\n"
                             "  --plans FILE  plans\n"
                             "  --even N   an even number\n"
                             "  --a-very-long-name N  overflows the column\n"
                             "  --help     this text\n"
                             "exit: 0\n");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_getopt_rules),
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_strict_rules),
        cmocka_unit_test(test_usage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
