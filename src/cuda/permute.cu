/* permute.cu - the stable permutation of the routed slots on the device for the cuda
 * backend (routing itself is route.cu's; the gather and the shared expert are in
 * moe_kernels.cu): a histogram (atomics on integers: deterministic), one-CTA scan,
 * then one warp per expert walks the slots in ascending order with ballots: the
 * stable counting sort of fm_moe_permute, no atomics deciding any order; the
 * device's error word the run records into; and the dispatched rows of
 * fm_layer_run_dispatched turned into the same offsets / perm / row weights (their
 * counts / offsets checked here: they live on the device). */
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "cuda/kernel_common.cuh"
#include "cuda/moe_kernels.h"

namespace {

#define FM_FULL 0xffffffffu

/* ---- stable permutation ---------------------------------------------------------- */

/* off[1 + e] += rows of expert e (off zeroed by the launcher). */
__global__ void permute_count_kernel(const int32_t *ids, const float *weights, int R, int E, int first, int n_global,
                                     int32_t *off, int32_t *token_slots, fm_moe_dev_errors *err,
                                     const unsigned long long *bad_logit)
{
    const int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= R) return;
    token_slots[s] = -1; /* placed slots are overwritten by permute_place_kernel */
    const int g = ids[s], e = g - first;
    if (e >= 0 && e < E) {
        atomicAdd(&off[1 + e], 1);
        if (err && !isfinite(weights[s])) atomicAdd(&err->nonfinite_w, 1ull);
    } else if (err && (g < -1 || g >= n_global)) {
        atomicAdd(&err->bad_ids, 1ull);
        atomicMin(&err->first_bad_slot, (unsigned long long)s);
    }
    if (s == 0 && err && bad_logit && *bad_logit != ~0ull) atomicMin(&err->bad_logit, *bad_logit);
}

__global__ void dev_errors_reset_kernel(fm_moe_dev_errors *err)
{
    err->bad_ids = 0;
    err->first_bad_slot = ~0ull;
    err->first_nonfinite_x = ~0ull;
    err->bad_logit = ~0ull;
    err->nonfinite_w = 0;
    err->bad_experts = 0;
    err->first_bad_expert = ~0ull;
    err->nonfinite_h = ~0ull;
}

/* In place: off[1..E] counts -> inclusive prefix sums (so off = offsets[E+1]).
 * One CTA of exactly 1024 threads, 1024 experts per step. */
/* off[1 + i] = src[0] + ... + src[i] for i < E (inclusive prefix sums), by one CTA of
 * exactly 1024 threads, 1024 values per step; src may be off + 1 (in place: each
 * thread reads its value before it writes it). wsum: 32 ints of shared memory. */
__device__ void block_prefix_sums(const int *src, int32_t *off, int E, int *wsum)
{
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    int       carry = 0;
    for (int base = 0; base < E; base += 1024) {
        const int i = base + tid;
        int       v = i < E ? src[i] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            const int n = __shfl_up_sync(FM_FULL, v, o);
            if (lane >= o) v += n;
        }
        if (lane == 31) wsum[w] = v;
        __syncthreads();
        if (w == 0) {
            int s = wsum[lane];
            for (int o = 1; o < 32; o <<= 1) {
                const int n = __shfl_up_sync(FM_FULL, s, o);
                if (lane >= o) s += n;
            }
            wsum[lane] = s;
        }
        __syncthreads();
        if (i < E) off[1 + i] = carry + (w ? wsum[w - 1] : 0) + v;
        carry += wsum[31];
        __syncthreads(); /* wsum is rewritten by the next step */
    }
}

/* active[0] = the number of experts e with off[e+1] > off[e], active[1..] = those e
 * ascending (the GEMMs' work list, fm_cuda_gemm_args.expert_list). One CTA of exactly
 * 1024 threads, after a barrier that makes off visible; wsum: 32 ints of shared memory. */
__device__ void write_active_list(const int32_t *off, int E, int32_t *active, int *wsum)
{
    const int      tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const unsigned lt = (1u << lane) - 1u;
    int            carry = 0;
    for (int base = 0; base < E; base += 1024) {
        const int      i = base + tid;
        const bool     f = i < E && off[i + 1] > off[i];
        const unsigned b = __ballot_sync(FM_FULL, f);
        if (lane == 0) wsum[w] = __popc(b);
        __syncthreads();
        if (w == 0) {
            int v = wsum[lane];
            for (int o = 1; o < 32; o <<= 1) {
                const int n = __shfl_up_sync(FM_FULL, v, o);
                if (lane >= o) v += n;
            }
            wsum[lane] = v; /* inclusive */
        }
        __syncthreads();
        if (f) active[1 + carry + (w ? wsum[w - 1] : 0) + __popc(b & lt)] = i;
        carry += wsum[31];
        __syncthreads(); /* wsum is rewritten by the next step */
    }
    if (tid == 0) active[0] = carry;
}

/* In place: off[1..E] counts -> inclusive prefix sums (so off = offsets[E+1]); then the
 * active list when asked. */
__global__ void __launch_bounds__(1024) permute_scan_kernel(int32_t *off, int E, int32_t *active)
{
    __shared__ int wsum[32];
    block_prefix_sums(off + 1, off, E, wsum);
    if (!active) return;
    __syncthreads();
    write_active_list(off, E, active, wsum);
}

/* One warp: expert e's slots among [s_begin, s_end) in ascending order, 128 slots per
 * step (4 loads in flight), each placed at the next row of e from `row` on: the order
 * of fm_moe_permute. */
__device__ __forceinline__ void place_walk(const int32_t *ids, const float *weights, int s_begin, int s_end, int e,
                                           int first, int row, int top_k, int32_t *perm, int32_t *token_slots,
                                           float *row_weight, int32_t *row_token)
{
    const int      lane = threadIdx.x & 31;
    const unsigned lt = (1u << lane) - 1u; /* lanes below this one */
    for (int s0 = s_begin; s0 < s_end; s0 += 128) {
        int v[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int s = s0 + 32 * q + lane;
            v[q] = s < s_end ? ids[s] - first : -1;
        }
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const bool     mine = v[q] == e;
            const unsigned b = __ballot_sync(FM_FULL, mine);
            if (mine) {
                const int s = s0 + 32 * q + lane, p = row + __popc(b & lt);
                perm[p] = s;
                token_slots[s] = p;
                row_weight[p] = weights[s];
                if (row_token) row_token[p] = s / top_k;
            }
            row += __popc(b);
        }
    }
}

/* count + scan in one CTA (E <= FM_FUSED_E): counts in shared memory, then the
 * prefix sums written as offsets[E+1]; the same token_slots / error bookkeeping as
 * permute_count_kernel. Saves the offsets memset and a launch: at decode the
 * permutation is a few microseconds of launches, not of work. */
#define FM_FUSED_E 4096
#define FM_PLACE_CHUNK 1024 /* slots per placement chunk: the count kernel's step */
__global__ void __launch_bounds__(1024)
    permute_count_scan_kernel(const int32_t *ids, const float *weights, int R, int E, int first, int n_global,
                              int32_t *off, int32_t *token_slots, int32_t *hist, fm_moe_dev_errors *err,
                              const unsigned long long *bad_logit, int top_k, int32_t *perm, float *row_weight,
                              int32_t *row_token, int32_t *active)
{
    __shared__ int cnt[FM_FUSED_E], tmp[FM_FUSED_E];
    __shared__ int wsum[32];
    const int      tid = threadIdx.x;
    fm_kc::pdl_trigger(); /* a gather launched with PDL may be scheduled now (it waits for this grid) */
    for (int e = tid; e < E; e += 1024) cnt[e] = 0;
    for (int s0 = 0, c = 0; s0 < R; s0 += FM_PLACE_CHUNK, c++) { /* chunk c: its counts go to hist[c][e] */
        for (int e = tid; e < E; e += 1024) tmp[e] = 0;
        __syncthreads();
        const int s = s0 + tid;
        if (s < R) {
            token_slots[s] = -1;
            const int g = ids[s], e = g - first;
            if (e >= 0 && e < E) {
                atomicAdd(&tmp[e], 1);
                if (err && !isfinite(weights[s])) atomicAdd(&err->nonfinite_w, 1ull);
            } else if (err && (g < -1 || g >= n_global)) {
                atomicAdd(&err->bad_ids, 1ull);
                atomicMin(&err->first_bad_slot, (unsigned long long)s);
            }
        }
        __syncthreads();
        for (int e = tid; e < E; e += 1024) {
            hist[(size_t)c * E + e] = tmp[e];
            cnt[e] += tmp[e];
        }
    }
    if (tid == 0 && err && bad_logit && *bad_logit != ~0ull) atomicMin(&err->bad_logit, *bad_logit);
    if (tid == 0) off[0] = 0;
    __syncthreads();
    block_prefix_sums(cnt, off, E, wsum);
    __syncthreads(); /* the offsets this CTA just wrote are visible to it */
    if (active) write_active_list(off, E, active, wsum);
    if (!perm) return;
    /* R <= one chunk (perm given): the placement too, warp w taking experts w, w + 32, ... */
    for (int e = tid >> 5; e < E; e += 32)
        place_walk(ids, weights, 0, R, e, first, off[e], top_k, perm, token_slots, row_weight, row_token);
}

/* One warp per (expert e, chunk of slots): e's slots in chunk c = [c*chunk,
 * (c+1)*chunk), placed from off[e] + e's count in the chunks before c (hist[c'][e]);
 * hist NULL: one chunk. */
__global__ void permute_place_kernel(const int32_t *ids, const float *weights, int R, int top_k, int E, int first,
                                     const int32_t *off, const int32_t *hist, int chunk, int32_t *perm,
                                     int32_t *token_slots, float *row_weight, int32_t *row_token)
{
    const long long wid = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int       e = (int)(wid % E), c = (int)(wid / E);
    if ((long long)c * chunk >= R) return;
    int row = off[e];
    if (hist)
        for (int q = 0; q < c; q++) row += hist[(size_t)q * E + e];
    const int s_end = (long long)(c + 1) * chunk < R ? (c + 1) * chunk : R;
    place_walk(ids, weights, c * chunk, s_end, e, first, row, top_k, perm, token_slots, row_weight, row_token);
}


/* ---- dispatched rows (fm_layer_run_dispatched) ------------------------------------ */

/* An inclusive scan of load(0..n) under op (identity id) by one CTA of exactly 1024
 * threads, 1024 values per step, store(i, result); wsum: 32 ints of shared memory. */
template <class Load, class Store, class Op>
__device__ void block_scan(int n, Load load, Store store, Op op, int id, int *wsum)
{
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    int       carry = id;
    for (int base = 0; base < n; base += 1024) {
        const int i = base + tid;
        int       v = i < n ? load(i) : id;
        for (int o = 1; o < 32; o <<= 1) {
            const int u = __shfl_up_sync(FM_FULL, v, o);
            if (lane >= o) v = op(u, v);
        }
        if (lane == 31) wsum[w] = v;
        __syncthreads();
        if (w == 0) {
            int s = wsum[lane];
            for (int o = 1; o < 32; o <<= 1) {
                const int u = __shfl_up_sync(FM_FULL, s, o);
                if (lane >= o) s = op(u, s);
            }
            wsum[lane] = s;
        }
        __syncthreads();
        if (i < n) store(i, op(carry, w ? op(wsum[w - 1], v) : v));
        carry = op(carry, wsum[31]);
        __syncthreads(); /* wsum is rewritten by the next step */
    }
}

__device__ __forceinline__ void dispatch_bad(fm_moe_dev_errors *err, int e, int kind, int value)
{
    atomicAdd(&err->bad_experts, 1ull);
    atomicMin(&err->first_bad_expert, FM_DISPATCH_BAD_KEY(e, kind, value));
}

/* Packed row p (< off[E]): its expert e (the last with off[e] <= p), its layout row. */
__device__ __forceinline__ void dispatch_place_row(int p, int layout, int capacity, const int32_t *offsets,
                                                   const float *weights, int E, const int32_t *off, int32_t *perm,
                                                   float *row_weight, fm_moe_dev_errors *err)
{
    int lo = 0, hi = E; /* off[lo] <= p < off[hi] */
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (off[mid] <= p) lo = mid;
        else hi = mid;
    }
    const int e = lo;
    const int row = (layout == FM_DISPATCH_EXPERT_MAJOR ? e * capacity : offsets[e]) + (p - off[e]);
    perm[p] = row;
    const float w = weights ? weights[row] : 1.0f;
    row_weight[p] = w;
    if (!isfinite(w)) atomicAdd(&err->nonfinite_w, 1ull);
}

__global__ void dispatch_place_kernel(int layout, int capacity, const int32_t *offsets, const float *weights, int E,
                                      int bound_rows, const int32_t *off, int32_t *perm, float *row_weight,
                                      fm_moe_dev_errors *err)
{
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= bound_rows || p >= off[E]) return;
    dispatch_place_row(p, layout, capacity, offsets, weights, E, off, perm, row_weight, err);
}

/* One CTA of 1024 threads: each local expert's rows checked (cnt[e]: its rows, 0 when
 * bad), summed into off, the experts past max_rows dropped and summed again, then the
 * active list. Expert-rows layout: expert e's range [lo, hi) = [offsets[e], offsets[e+1])
 * is read only when 0 <= lo <= hi, lo is the largest of offsets[0..e] and hi the smallest
 * of offsets[e+1..E] (and offsets[0] = 0 for e = 0): the ranges read are then disjoint and
 * inside [0, offsets[E]), whatever the other offsets hold. off[1..E] and cnt hold the
 * prefix maxima / suffix minima on the way. */
__global__ void __launch_bounds__(1024)
    dispatch_scan_kernel(int layout, const int32_t *counts, int capacity, const int32_t *offsets, int E, int max_rows,
                         int32_t *off, int32_t *cnt, int32_t *active, fm_moe_dev_errors *err, const float *weights,
                         int place_rows, int32_t *perm, float *row_weight)
{
    __shared__ int wsum[32];
    const int      tid = threadIdx.x;
    auto           sum = [](int a, int b) { return a + b; };
    if (layout == FM_DISPATCH_EXPERT_MAJOR) {
        for (int e = tid; e < E; e += 1024) {
            const int c = counts[e];
            const bool ok = c >= 0 && c <= capacity;
            if (!ok) dispatch_bad(err, e, FM_DISPATCH_BAD_COUNT, c);
            cnt[e] = ok ? c : 0;
        }
    } else {
        block_scan(E, [&](int i) { return offsets[i]; }, [&](int i, int v) { off[1 + i] = v; },
                   [](int a, int b) { return a > b ? a : b; }, INT_MIN, wsum); /* max of offsets[0..e] */
        block_scan(E, [&](int i) { return offsets[E - i]; }, [&](int i, int v) { cnt[E - 1 - i] = v; },
                   [](int a, int b) { return a < b ? a : b; }, INT_MAX, wsum); /* min of offsets[e+1..E] */
        for (int e = tid; e < E; e += 1024) {
            const int lo = offsets[e], hi = offsets[e + 1];
            int       kind = 0;
            if (e == 0 && lo != 0) kind = FM_DISPATCH_BAD_OFFSET0;
            else if (lo < 0 || hi < lo || off[1 + e] > lo || cnt[e] < hi) kind = FM_DISPATCH_BAD_ORDER;
            if (kind) dispatch_bad(err, e, kind, lo);
            cnt[e] = kind ? 0 : hi - lo; /* this thread's own e: read before written */
        }
    }
    __syncthreads();
    block_scan(E, [&](int i) { return cnt[i]; }, [&](int i, int v) { off[1 + i] = v; }, sum, 0, wsum);
    if (tid == 0) off[0] = 0;
    __syncthreads();
    int dropped = 0;
    for (int e = tid; e < E; e += 1024)
        if (cnt[e] > 0 && off[1 + e] > max_rows) { /* the sums only grow: every expert from the first one over */
            dispatch_bad(err, e, FM_DISPATCH_BAD_TOO_MANY, off[1 + e]);
            cnt[e] = 0;
            dropped = 1;
        }
    if (__syncthreads_or(dropped))
        block_scan(E, [&](int i) { return cnt[i]; }, [&](int i, int v) { off[1 + i] = v; }, sum, 0, wsum);
    __syncthreads(); /* the offsets this CTA just wrote are visible to it */
    if (active) write_active_list(off, E, active, wsum);
    /* a small bound: the rows placed here too (one launch less than dispatch_place_kernel) */
    const int n = min(place_rows, off[E]);
    for (int p = tid; p < n; p += 1024)
        dispatch_place_row(p, layout, capacity, offsets, weights, E, off, perm, row_weight, err);
}

} // namespace

extern "C" int fm_moe_dev_errors_reset_launch(fm_moe_dev_errors *err, void *stream)
{
    dev_errors_reset_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(err);
    return (int)cudaGetLastError();
}

extern "C" size_t fm_moe_permute_scratch_bytes(int T, int top_k, int E)
{
    const long long R = (long long)T * top_k;
    return R > 0 && E > 0 ? sizeof(int32_t) * (size_t)((R + FM_PLACE_CHUNK - 1) / FM_PLACE_CHUNK) * (size_t)E : 0;
}

extern "C" int fm_moe_permute_launch(const int32_t *ids, const float *weights, int T, int top_k, int E, int first,
                                     int n_global, int32_t *offsets, int32_t *perm, int32_t *token_slots,
                                     float *row_weight, int32_t *row_token, void *scratch, fm_moe_dev_errors *err,
                                     const unsigned long long *bad_logit, int32_t *active, void *stream)
{
    cudaStream_t    st = (cudaStream_t)stream;
    const long long R = (long long)T * top_k;
    cudaError_t     err_ = cudaSuccess;
    if (R <= 0 || E <= 0) {
        err_ = cudaMemsetAsync(offsets, 0, sizeof(int32_t) * ((size_t)(E > 0 ? E : 0) + 1), st);
        if (err_ == cudaSuccess && active) err_ = cudaMemsetAsync(active, 0, sizeof(int32_t), st); /* none */
        return (int)err_;
    }
    int32_t *hist = E <= FM_FUSED_E ? (int32_t *)scratch : NULL;
    if (hist) { /* one launch for count + scan, then (expert, chunk) warps place; up to one chunk
                 * of slots (decode) the same CTA places them too: one launch in all */
        const int fused = R <= FM_PLACE_CHUNK;
        permute_count_scan_kernel<<<1, 1024, 0, st>>>(ids, weights, (int)R, E, first, n_global, offsets, token_slots,
                                                      hist, err, bad_logit, top_k, fused ? perm : NULL, row_weight,
                                                      row_token, active);
        if (fused) return (int)cudaGetLastError();
    } else {
        if ((err_ = cudaMemsetAsync(offsets, 0, sizeof(int32_t) * ((size_t)E + 1), st)) != cudaSuccess) return (int)err_;
        permute_count_kernel<<<(unsigned)((R + 255) / 256), 256, 0, st>>>(ids, weights, (int)R, E, first, n_global,
                                                                           offsets, token_slots, err, bad_logit);
        if ((err_ = cudaGetLastError()) != cudaSuccess) return (int)err_;
        permute_scan_kernel<<<1, 1024, 0, st>>>(offsets, E, active);
    }
    if ((err_ = cudaGetLastError()) != cudaSuccess) return (int)err_;
    const int       chunk = hist ? FM_PLACE_CHUNK : (int)R;
    const long long warps = (long long)E * ((R + chunk - 1) / chunk);
    const int       warps_per_block = 8;
    permute_place_kernel<<<(unsigned)((warps + warps_per_block - 1) / warps_per_block), 32 * warps_per_block, 0, st>>>(
        ids, weights, (int)R, top_k, E, first, offsets, hist, chunk, perm, token_slots, row_weight, row_token);
    return (int)cudaGetLastError();
}

extern "C" int fm_moe_dispatch_layout_launch(int layout, const int32_t *counts, int capacity, const int32_t *offsets,
                                             const float *weights, int E, int max_rows, int32_t *offsets_out,
                                             int32_t *perm, float *row_weight, int32_t *active, int32_t *scratch,
                                             fm_moe_dev_errors *err, void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    if (E <= 0 || E > 65535) return (int)cudaErrorInvalidValue;
    /* up to 4,096 rows (4 per thread) the scan's CTA places them: at decode sizes the second
     * launch cost more than the work (bench_layer --dispatched, 2026-12-06) */
    const int small = max_rows <= 4096;
    dispatch_scan_kernel<<<1, 1024, 0, st>>>(layout, counts, capacity, offsets, E, max_rows, offsets_out, scratch,
                                             active, err, weights, small ? max_rows : 0, perm, row_weight);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || max_rows <= 0 || small) return (int)e;
    dispatch_place_kernel<<<(unsigned)((max_rows + 255) / 256), 256, 0, st>>>(
        layout, capacity, offsets, weights, E, max_rows, offsets_out, perm, row_weight, err);
    return (int)cudaGetLastError();
}
