/* cli_util.c - flag parsing and error printing shared by the subcommands. */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <unistd.h>

int fm_cli_int(const char *cmd, const char *flag, const char *s, long lo, long hi, long *out)
{
    char *end = NULL;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "fp4moe %s: %s expects an integer in [%ld, %ld], got '%s'\n", cmd, flag, lo, hi,
                s ? s : "");
        return 0;
    }
    *out = v;
    return 1;
}

int fm_cli_double(const char *cmd, const char *flag, const char *s, double lo, double hi, double *out)
{
    char *end = NULL;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || !*s || *end || errno || !(v >= lo && v <= hi)) {
        fprintf(stderr, "fp4moe %s: %s expects a number in [%g, %g], got '%s'\n", cmd, flag, lo, hi, s ? s : "");
        return 0;
    }
    *out = v;
    return 1;
}

int fm_cli_fail(const char *cmd, fm_status s)
{
    const char *d = fm_last_error();
    fprintf(stderr, "fp4moe %s: %s: %s\n", cmd, fm_status_name(s), (d && *d) ? d : fm_status_str(s));
    return s == FM_ERR_NO_DEVICE ? FM_EXIT_NO_DEVICE : FM_EXIT_FAIL;
}

void fm_cli_progress(const char *fmt, ...)
{
    const char *e = getenv("FM_PROGRESS");
    if (!(isatty(2) || (e && *e == '1'))) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fflush(stderr);
}
