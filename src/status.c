/* status.c - status strings and the per-thread detail message. */
#include "fm_internal.h"

#include <stdarg.h>
#include <stdio.h>

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
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t_detail, sizeof t_detail, fmt, ap);
    va_end(ap);
    return s;
}
