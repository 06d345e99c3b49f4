/* names.c - names and parsers of the planner's enums, tiles and CUTLASS versions,
 * one table each so the CLI, JSON and messages spell things the same way. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "plan_internal.h"

static const char *const k_sched[FM_SCHED_COUNT] = {"auto", "coop", "pingpong", "1sm", "2sm"};
static const char *const k_epi[FM_EPI_COUNT] = {"tma", "nosmem", "finalize"};
static const char *const k_family[FM_FAMILY_COUNT] = {"auto",          "cutlass-sm90", "cutlass-sm120",
                                                       "cutlass-sm100", "fp4moe-mma", "fp4moe-wgmma"};

const char *fm_schedule_name(fm_schedule s) { return (unsigned)s < FM_SCHED_COUNT ? k_sched[s] : "?"; }
const char *fm_epilogue_name(fm_epilogue e) { return (unsigned)e < FM_EPI_COUNT ? k_epi[e] : "?"; }
const char *fm_family_name(fm_kernel_family f) { return (unsigned)f < FM_FAMILY_COUNT ? k_family[f] : "?"; }

fm_status fm_elem_parse(const char *s, fm_elem *out)
{
    if (!s || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_elem_parse: NULL argument");
    for (int e = 0; e < FM_ELEM_COUNT; e++)
        if (!strcasecmp(s, fm_elem_name((fm_elem)e))) {
            *out = (fm_elem)e;
            return FM_OK;
        }
    if (!strcasecmp(s, "e4m3")) {
        *out = FM_ELEM_FP8;
        return FM_OK;
    }
    return fm_fail(FM_ERR_FORMAT, "unknown element type '%s' (void bf16 fp16 fp32 fp8 nvfp4 mxfp4)", s);
}

fm_status fm_schedule_parse(const char *s, fm_schedule *out)
{
    if (!s || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_schedule_parse: NULL argument");
    for (int i = 0; i < FM_SCHED_COUNT; i++)
        if (!strcasecmp(s, k_sched[i])) {
            *out = (fm_schedule)i;
            return FM_OK;
        }
    if (!strcasecmp(s, "cooperative")) {
        *out = FM_SCHED_COOP;
        return FM_OK;
    }
    return fm_fail(FM_ERR_NOT_FOUND, "unknown schedule '%s' (auto coop pingpong 1sm 2sm)", s);
}

fm_status fm_family_parse(const char *s, fm_kernel_family *out)
{
    if (!s || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_family_parse: NULL argument");
    for (int i = 0; i < FM_FAMILY_COUNT; i++)
        if (!strcasecmp(s, k_family[i])) {
            *out = (fm_kernel_family)i;
            return FM_OK;
        }
    /* "swapab" / "fp4moe-swapab": the mma family's former name (its kernels swap A and B so
     * that the few tokens are the mma's N) */
    if (!strcasecmp(s, "mma") || !strcasecmp(s, "fp4moe") || !strcasecmp(s, "swapab") ||
        !strcasecmp(s, "fp4moe-swapab")) {
        *out = FM_FAMILY_FP4MOE_MMA;
        return FM_OK;
    }
    return fm_fail(FM_ERR_NOT_FOUND,
                   "unknown kernel family '%s' (auto cutlass-sm90 cutlass-sm120 cutlass-sm100 fp4moe-mma "
                   "fp4moe-wgmma)",
                   s);
}

fm_status fm_epilogue_parse(const char *s, fm_epilogue *out)
{
    if (!s || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_epilogue_parse: NULL argument");
    for (int i = 0; i < FM_EPI_COUNT; i++)
        if (!strcasecmp(s, k_epi[i])) {
            *out = (fm_epilogue)i;
            return FM_OK;
        }
    if (!strcasecmp(s, "default") || !strcasecmp(s, "none")) {
        *out = !strcasecmp(s, "none") ? FM_EPI_NOSMEM : FM_EPI_TMA;
        return FM_OK;
    }
    return fm_fail(FM_ERR_NOT_FOUND, "unknown epilogue '%s' (tma|default, nosmem|none, finalize)", s);
}

/* "128x256x128": three whole positive numbers separated by 'x'. */
fm_status fm_tile_shape_parse(const char *s, int *m, int *n, int *k)
{
    if (!s || !m || !n || !k) return fm_fail(FM_ERR_INVALID_ARG, "fm_tile_shape_parse: NULL argument");
    long v[3];
    const char *p = s;
    for (int i = 0; i < 3; i++) {
        if (!isdigit((unsigned char)*p)) goto bad;
        char *end = NULL;
        v[i] = strtol(p, &end, 10);
        if (v[i] <= 0 || v[i] > 4096) goto bad;
        p = end;
        if (i < 2) {
            if (*p != 'x' && *p != 'X') goto bad;
            p++;
        }
    }
    if (*p) goto bad;
    *m = (int)v[0], *n = (int)v[1], *k = (int)v[2];
    return FM_OK;
bad:
    return fm_fail(FM_ERR_BAD_SHAPE, "malformed tile '%s' (expected MxNxK, e.g. 128x256x128)", s);
}

fm_status fm_epi_tile_parse(const char *s, int *m, int *n)
{
    if (!s || !m || !n) return fm_fail(FM_ERR_INVALID_ARG, "fm_epi_tile_parse: NULL argument");
    if (!strcmp(s, "auto")) {
        *m = *n = 0;
        return FM_OK;
    }
    int v[2] = {0, 0};
    const char *p = s;
    for (int i = 0; i < 2; i++) {
        int d = 0;
        for (; *p >= '0' && *p <= '9'; p++, d++)
            if (d >= 3 || (v[i] = v[i] * 10 + (*p - '0')) > 256) goto bad;
        if (!d || v[i] < 1 || *p != (i ? '\0' : 'x')) goto bad;
        p++;
    }
    *m = v[0], *n = v[1];
    return FM_OK;
bad:
    return fm_fail(FM_ERR_BAD_SHAPE, "malformed epilogue tile '%s' (expected MxN with M, N in [1, 256], e.g. 128x64, "
                                     "or auto)", s);
}

/* "4.2", "4.2.0", "4.7" -> 420, 470.  Digits and dots only, the whole string
 * consumed: "4.2x" or "4.7 junk" is an error, not a silent 420/470. */
fm_status fm_cutlass_version_parse(const char *s, int *out)
{
    if (!s || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_cutlass_version_parse: NULL argument");
    int v[3] = {0, 0, 0}, parts = 0;
    const char *p = s;
    while (parts < 3 && *p >= '0' && *p <= '9') {
        int d = 0;
        for (; *p >= '0' && *p <= '9' && d < 3; p++, d++) v[parts] = v[parts] * 10 + (*p - '0');
        parts++;
        if (*p != '.' || !(p[1] >= '0' && p[1] <= '9')) break;
        p++;
    }
    if (*p || parts < 2 || v[0] != 4 || v[1] > 9 || v[2] > 9)
        return fm_fail(FM_ERR_NOT_FOUND, "CUTLASS version '%s': the model knows 4.2 .. 4.9 (e.g. 4.2, 4.7, 4.2.1)", s);
    *out = v[0] * 100 + v[1] * 10 + v[2];
    return FM_OK;
}
