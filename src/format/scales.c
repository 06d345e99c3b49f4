/* scales.c - the NaN block-scale scan every consumer of outside scales runs
 * (see format_internal.h for why it is in one place).
 */
#include "format/format_internal.h"

fm_status fm_scales_check_codes(const char *who, fm_scale_type st, const uint8_t *s, int64_t rows, int64_t cols)
{
    if (rows <= 0 || cols <= 0 || st == FM_SCALE_NONE) return FM_OK;
    const int64_t n = rows * cols;
    int64_t i = 0;
    while (i < n && !fm_scale_code_is_nan(st, s[i])) i++;
    if (i == n) return FM_OK;
    return fm_fail(FM_ERR_NONFINITE, "%s%sblock scale [%lld][%lld] = 0x%02X decodes to NaN", who ? who : "",
                   who ? ": " : "", (long long)(i / cols), (long long)(i % cols), s[i]);
}
