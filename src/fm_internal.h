/* fm_internal.h - helpers shared by every part of the library (not installed). */
#ifndef FM_INTERNAL_H
#define FM_INTERNAL_H

#include "fp4moe.h"
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define FM_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define FM_PRINTF(a, b)
#endif

/* Record a detail message for the current thread and return `s`, so that
 * call sites read:  return fm_fail(FM_ERR_BAD_SHAPE, "k=%d not a multiple of 16", k);
 * An argument may be fm_last_error() itself (to prefix context to a callee's
 * detail): the message is formatted before the old one is replaced. */
fm_status fm_fail(fm_status s, const char *fmt, ...) FM_PRINTF(2, 3);

/* Clear the detail message (call at the start of public entry points). */
void fm_clear_error(void);

#define FM_CHECK(expr)                      \
    do {                                    \
        fm_status fm_st_ = (expr);          \
        if (fm_st_ != FM_OK) return fm_st_; \
    } while (0)

#define FM_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
