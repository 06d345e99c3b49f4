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
static const char *const k_family[FM_FAMILY_COUNT] = {"auto", "cutlass-sm90", "cutlass-sm120", "cutlass-sm100",
                                                       "fp4moe-swapab"};

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
    if (!strcasecmp(s, "swapab") || !strcasecmp(s, "fp4moe")) {
        *out = FM_FAMILY_FP4MOE_SWAPAB;
        return FM_OK;
    }
    return fm_fail(FM_ERR_NOT_FOUND,
                   "unknown kernel family '%s' (auto cutlass-sm90 cutlass-sm120 cutlass-sm100 fp4moe-swapab)", s);
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
fm_status fm_tile_parse(const char *s, int *m, int *n, int *k)
{
    if (!s || !m || !n || !k) return fm_fail(FM_ERR_INVALID_ARG, "fm_tile_parse: NULL argument");
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

/* "4.2", "4.2.0", "4.7" -> 420, 470 */
fm_status fm_cutlass_version_parse(const char *s, int *out)
{
    if (!s || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_cutlass_version_parse: NULL argument");
    int ma = 0, mi = 0, pa = 0;
    char tail = 0;
    int got = sscanf(s, "%d.%d.%d%c", &ma, &mi, &pa, &tail);
    if (got < 2 || got > 3 || ma != 4 || mi < 0 || mi > 9 || pa < 0 || pa > 9)
        return fm_fail(FM_ERR_NOT_FOUND, "CUTLASS version '%s': the model knows 4.2 .. 4.9 (e.g. 4.2, 4.7)", s);
    *out = ma * 100 + mi * 10 + pa;
    return FM_OK;
}
