/* cli_util.c - flag parsing and error printing shared by the subcommands. */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>

#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <time.h>
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
        fprintf(stderr, "fp4moe %s: %s expects a number in [%.10g, %.10g], got '%s'\n", cmd, flag, lo, hi, s ? s : "");
        return 0;
    }
    *out = v;
    return 1;
}

int fm_cli_fail(const char *cmd, fm_status s)
{
    const char *d = fm_last_error();
    fprintf(stderr, "fp4moe %s: %s: %s\n", cmd, fm_status_name(s), (d && *d) ? d : fm_status_str(s));
    /* no GPU, or a build without the backend asked for: both are "no GPU/driver where
     * one was needed" to the user (docs/cli.md) */
    return s == FM_ERR_NO_DEVICE || s == FM_ERR_NO_BACKEND ? FM_EXIT_NO_DEVICE : FM_EXIT_FAIL;
}

int fm_cli_usage_status(const char *cmd, const char *flag, fm_status s)
{
    switch (s) {
    case FM_ERR_INVALID_ARG:
    case FM_ERR_BAD_SHAPE:
    case FM_ERR_FORMAT:
    case FM_ERR_NOT_FOUND:
    case FM_ERR_ARCH_MISMATCH:
    case FM_ERR_UNSUPPORTED: {
        const char *d = fm_last_error();
        fprintf(stderr, "fp4moe %s: %s: %s: %s\n", cmd, flag, fm_status_name(s), (d && *d) ? d : fm_status_str(s));
        return FM_EXIT_USAGE;
    }
    default: return fm_cli_fail(cmd, s);
    }
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

void fm_cli_print_json(struct cJSON *j)
{
    char *t = cJSON_Print(j);
    if (t) puts(t);
    free(t);
    cJSON_Delete(j);
}

double fm_cli_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}
