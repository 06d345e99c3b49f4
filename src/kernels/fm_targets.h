/* fm_targets.h - the GPU targets a build can carry (header-only; read by the unit
 * generator at configure time and by the library at run time, so both apply one rule).
 *
 * A target is SASS for one architecture or family, or (compute_NN) PTX that the driver
 * JIT-compiles for newer devices. Which devices run a target's code:
 *   sm_80, sm_86, sm_89  SASS of one major version runs on every later minor of it
 *   sm_90a               9.0 only (the "a" features: wgmma, setmaxnreg)
 *   sm_100f / sm_103f    the SM100 family (B200, GB200: 10.0; B300: 10.3) / 10.3 only
 *   sm_110f              11.0 (Jetson Thor)
 *   sm_120f / sm_121f    the SM120 family (RTX PRO 6000, RTX 5090: 12.0; GB10: 12.1) / 12.1
 *   compute_NN           any device of compute capability >= NN, after a JIT at first use
 * smem_optin is the largest opt-in shared memory per block of a device the target runs
 * on: an mma tile is compiled for a target only where it can fit (the planner still
 * checks the real device's limit: sm_80 code also runs on 8.6 / 8.9 parts of 99 KB). */
#ifndef FM_TARGETS_H
#define FM_TARGETS_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FM_TARGETS_MAX 16

typedef struct {
    char   name[16];    /* "sm_90a", "compute_80" */
    char   gencode[64]; /* the nvcc flag */
    int    cc_lo, cc_hi; /* compute capabilities (x10) whose devices run it */
    size_t smem_optin;
    int    wgmma; /* the target has the sm_90a features */
    int    ptx;   /* PTX, JIT-compiled by the driver */
} fm_target;

/* "80", "90a", "120f", "compute_80" -> *t; 0 on success, -1 unknown. */
static inline int fm_target_from(const char *s, fm_target *t)
{
    static const struct {
        const char *key;
        int         lo, hi;
        size_t      optin;
        int         wgmma;
    } k[] = {
        {"80", 80, 89, 166912, 0},    {"86", 86, 89, 101376, 0},    {"89", 89, 89, 101376, 0},
        {"90a", 90, 90, 232448, 1},   {"100f", 100, 103, 232448, 0}, {"103f", 103, 103, 232448, 0},
        {"110f", 110, 110, 232448, 0}, {"120f", 120, 121, 101376, 0}, {"121f", 121, 121, 101376, 0},
    };
    memset(t, 0, sizeof *t);
    int ptx = !strncmp(s, "compute_", 8);
    const char *key = ptx ? s + 8 : s;
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        if (strcmp(key, k[i].key)) continue;
        if (ptx && (k[i].wgmma || strchr(key, 'f'))) return -1; /* arch-specific PTX never runs forward */
        t->cc_lo = k[i].lo;
        t->cc_hi = ptx ? 999 : k[i].hi;
        t->smem_optin = k[i].optin;
        t->wgmma = k[i].wgmma;
        t->ptx = ptx;
        snprintf(t->name, sizeof t->name, "%s_%s", ptx ? "compute" : "sm", key);
        if (ptx) snprintf(t->gencode, sizeof t->gencode, "-gencode=arch=compute_%s,code=compute_%s", key, key);
        else snprintf(t->gencode, sizeof t->gencode, "-gencode=arch=compute_%s,code=sm_%s", key, key);
        return 0;
    }
    return -1;
}

/* A ';' or ' '-separated list -> t[*n]; 0, or -1 with err filled (unknown, repeated,
 * empty or too many). */
static inline int fm_targets_parse(const char *list, fm_target *t, int *n, char *err, size_t errn)
{
    *n = 0;
    const char *p = list;
    while (*p) {
        while (*p == ';' || *p == ' ' || *p == ',') p++;
        if (!*p) break;
        char   tok[32];
        size_t l = strcspn(p, "; ,");
        if (l >= sizeof tok || fm_target_from((memcpy(tok, p, l), tok[l] = 0, tok), &t[*n]) != 0) {
            snprintf(err, errn,
                     "unknown GPU target '%.*s' (known: 80 86 89 90a 100f 103f 110f 120f 121f, compute_NN for PTX of "
                     "80 86 89)",
                     (int)l, p);
            return -1;
        }
        for (int i = 0; i < *n; i++)
            if (!strcmp(t[i].name, t[*n].name)) {
                snprintf(err, errn, "GPU target %s given twice", t[i].name);
                return -1;
            }
        if (++*n == FM_TARGETS_MAX) {
            snprintf(err, errn, "more than %d GPU targets", FM_TARGETS_MAX - 1);
            return -1;
        }
        p += l;
    }
    if (*n == 0) {
        snprintf(err, errn, "no GPU target given");
        return -1;
    }
    return 0;
}

#endif
