/* status.c - status strings and the per-thread detail message.
 *
 * fm_fail formats into a local buffer and only then copies into the thread's
 * buffer, so a caller may quote the current detail in the new one:
 *     fm_fail(s, "layer %d: %s", layer, fm_last_error());
 * (formatting straight into t_detail would make vsnprintf read the buffer it
 * is writing: undefined behaviour, in practice a garbled, repeated message). */
#include "fm_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const k_msgs[] = {
#define FM_STATUS_MSG_(name, value, msg) [value] = msg,
    FM_STATUS_MAP(FM_STATUS_MSG_)
#undef FM_STATUS_MSG_
};

static const char *const k_names[] = {
#define FM_STATUS_NAME_(name, value, msg) [value] = "FM_" #name,
    FM_STATUS_MAP(FM_STATUS_NAME_)
#undef FM_STATUS_NAME_
};

_Static_assert(FM_ARRAY_LEN(k_msgs) == FM_STATUS_COUNT_, "status table has gaps");

static _Thread_local char t_detail[1024];

const char *fm_status_str(fm_status s)
{
    if ((int)s < 0 || (int)s >= FM_STATUS_COUNT_ || !k_msgs[s]) return "unknown status";
    return k_msgs[s];
}

const char *fm_status_name(fm_status s)
{
    if ((int)s < 0 || (int)s >= FM_STATUS_COUNT_ || !k_names[s]) return "FM_UNKNOWN";
    return k_names[s];
}

const char *fm_last_error(void) { return t_detail; }

void fm_clear_error(void) { t_detail[0] = '\0'; }

fm_status fm_fail(fm_status s, const char *fmt, ...)
{
    char buf[sizeof t_detail];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0; /* encoding error: an empty detail rather than garbage */
    size_t len = (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1;
    memcpy(t_detail, buf, len);
    t_detail[len] = '\0';
    return s;
}
