/* permute.c - the stable permutation of routed rows into expert order.
 *
 * A routed slot s = t*top_k + j (token t's j-th choice) becomes permuted row p:
 * experts in ascending id, and inside an expert the slots in ascending order
 * (a counting sort, so it is stable and O(T*top_k + E)). Grouped GEMMs then see
 * each expert's rows contiguously: rows [offsets[e], offsets[e+1]).
 */
#include "moe_internal.h"

fm_status fm_moe_permute(const int32_t *ids, int T, int top_k, int n_experts, int32_t *offsets, int32_t *perm)
{
    fm_clear_error();
    if (!ids || !offsets || !perm) return fm_fail(FM_ERR_INVALID_ARG, "fm_moe_permute: NULL ids, offsets or perm");
    if (T < 1 || top_k < 1 || n_experts < 1)
        return fm_fail(FM_ERR_BAD_SHAPE, "fm_moe_permute: T=%d, top_k=%d and n_experts=%d must all be >= 1", T, top_k,
                       n_experts);
    if ((int64_t)T * top_k > INT32_MAX)
        return fm_fail(FM_ERR_BAD_SHAPE, "fm_moe_permute: T*top_k = %lld routed rows exceed int32",
                       (long long)T * top_k);
    size_t n = (size_t)T * top_k;
    /* Validate every id before writing anything (no partial output). */
    for (size_t s = 0; s < n; s++)
        if (ids[s] < 0 || ids[s] >= n_experts)
            return fm_fail(FM_ERR_OUT_OF_RANGE, "fm_moe_permute: ids[%zu][%zu] = %d outside [0, %d)", s / top_k,
                           s % top_k, (int)ids[s], n_experts);

    for (int e = 0; e <= n_experts; e++) offsets[e] = 0;
    for (size_t s = 0; s < n; s++) offsets[ids[s] + 1]++;
    for (int e = 0; e < n_experts; e++) offsets[e + 1] += offsets[e];
    /* offsets[e] doubles as expert e's fill cursor, restored afterwards. */
    for (size_t s = 0; s < n; s++) perm[offsets[ids[s]]++] = (int32_t)s;
    for (int e = n_experts; e > 0; e--) offsets[e] = offsets[e - 1];
    offsets[0] = 0;
    return FM_OK;
}
