/* device.c - visible GPUs through the CUDA runtime API (plain C, compiled only when
 * FM_HAVE_CUDA).  No driver or no device is a normal answer (FM_ERR_NO_DEVICE with
 * the runtime's reason), never a crash: `fp4moe devices` prints it in one line. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda/cuda_internal.h"
#include "cuda/units.h"
#include "fm_internal.h"
#include "kernels/fm_build.h"

fm_status fm_device_count(int *n)
{
    if (!n) return fm_fail(FM_ERR_INVALID_ARG, "fm_device_count: n is NULL");
    int c = 0;
    cudaError_t e = cudaGetDeviceCount(&c);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || (e == cudaSuccess && c == 0)) {
        (void)cudaGetLastError();
        return fm_fail(FM_ERR_NO_DEVICE, "no CUDA device visible (%s)",
                       e == cudaSuccess ? "device count is 0" : cudaGetErrorString(e));
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fm_fail(FM_ERR_NO_DEVICE, "CUDA runtime unavailable: %s", cudaGetErrorString(e));
    }
    *n = c;
    return FM_OK;
}

static fm_status attr(int *v, enum cudaDeviceAttr a, int dev, const char *what)
{
    cudaError_t e = cudaDeviceGetAttribute(v, a, dev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fm_fail(FM_ERR_CUDA, "cudaDeviceGetAttribute(%s) on device %d: %s", what, dev, cudaGetErrorString(e));
    }
    return FM_OK;
}

fm_status fm_device_query(int index, fm_device_info *out)
{
    if (!out) return fm_fail(FM_ERR_INVALID_ARG, "fm_device_query: out is NULL");
    int n = 0;
    FM_CHECK(fm_device_count(&n));
    if (index < 0 || index >= n)
        return fm_fail(FM_ERR_OUT_OF_RANGE, "device %d does not exist (%d visible)", index, n);
    fm_device_info d;
    memset(&d, 0, sizeof d);
    d.index = index;
    struct cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, index);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fm_fail(FM_ERR_CUDA, "cudaGetDeviceProperties(%d): %s", index, cudaGetErrorString(e));
    }
    snprintf(d.name, sizeof d.name, "%s", p.name);
    d.cc = p.major * 10 + p.minor;
    int v = 0;
    FM_CHECK(attr(&v, cudaDevAttrMultiProcessorCount, index, "MultiProcessorCount"));
    d.sms = v;
    FM_CHECK(attr(&v, cudaDevAttrMaxSharedMemoryPerBlock, index, "MaxSharedMemoryPerBlock"));
    d.smem_block_default = (size_t)v;
    FM_CHECK(attr(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, index, "MaxSharedMemoryPerBlockOptin"));
    d.smem_block_optin = (size_t)v;
    FM_CHECK(attr(&v, cudaDevAttrMaxSharedMemoryPerMultiprocessor, index, "MaxSharedMemoryPerMultiprocessor"));
    d.smem_per_sm = (size_t)v;
    FM_CHECK(attr(&v, cudaDevAttrReservedSharedMemoryPerBlock, index, "ReservedSharedMemoryPerBlock"));
    d.smem_reserved = (size_t)v;
    FM_CHECK(attr(&v, cudaDevAttrL2CacheSize, index, "L2CacheSize"));
    d.l2_bytes = (size_t)v;
    d.global_mem = p.totalGlobalMem;
    /* clock and bus width: not reported by every runtime (CUDA 13 dropped the clock) */
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMemoryClockRate, index) == cudaSuccess) d.mem_clock_khz = v;
    (void)cudaGetLastError();
    if (cudaDeviceGetAttribute(&v, cudaDevAttrGlobalMemoryBusWidth, index) == cudaSuccess) d.bus_width_bits = v;
    (void)cudaGetLastError();
    if (d.mem_clock_khz > 0 && d.bus_width_bits > 0)
        d.mem_gbs = 2.0 * d.mem_clock_khz * 1e3 * (d.bus_width_bits / 8.0) / 1e9;
    *out = d;
    return FM_OK;
}

/* ---- fm_cuda_device: a device opened once (fp4moe/layer.h) ---------------- */

struct fm_cuda_device {
    int            ordinal;
    fm_device_info info;
    fm_gpu_info    gpu;   /* the matched row of the GPU table (valid when has_gpu) */
    int            has_gpu;
    fm_gpu_info    plan_gpu; /* what the planner ranks for: gpu, or the device's own figures */
    /* the catalogue rows this device has code for (bit r = row r), asked once at open */
    unsigned long long mma_rows, wgmma_rows;
    int                jit;         /* the code is PTX the driver compiled at open */
    char               running[32]; /* the build's target that runs here ("sm_90a") */
    int                driver_version, runtime_version;
};

/* The GPU table's row of the same compute capability and SM count, the memory
 * bandwidth nearest the device's (what the planner ranks tiles for). */
static int match_gpu(const fm_device_info *d, fm_gpu_info *out)
{
    const fm_gpu_info *best = NULL;
    for (size_t i = 0; i < fm_gpu_count(); i++) {
        const fm_gpu_info *r = fm_gpu_at(i);
        if (r->cc != d->cc || r->sms != d->sms) continue;
        if (!best || fabs(r->mem_gbs - d->mem_gbs) < fabs(best->mem_gbs - d->mem_gbs)) best = r;
    }
    if (best) *out = *best;
    return best != NULL;
}

/* Whether the device has code for kernel fn (SASS of a target that runs here, or PTX
 * the driver compiles now). A kernel without an image is an answer, not an error. */
static int has_code(const void *fn)
{
    if (!fn) return 0;
    struct cudaFuncAttributes a;
    cudaError_t               e = cudaFuncGetAttributes(&a, fn);
    (void)cudaGetLastError();
    return e == cudaSuccess;
}

/* Which kernels carry code for this device, asked of the runtime once: the planner,
 * fm_layer_set_plan, fm_layer_tune and fm_cuda_gemm then choose only among them.
 * Fails with FM_ERR_NO_KERNEL when the build has nothing this device can run. */
static fm_status probe_kernels(fm_cuda_device *d)
{
    int prev;
    FM_CHECK(fm_cuda_device_enter(d, &prev));
    for (int r = 0; r < fm_build_n_mma && r < 64; r++) {
        const fm_mma_unit *u = fm_mma_units[r];
        if (u && has_code(u->plain) && has_code(*u->list) && (!u->mb || has_code(u->mb))) d->mma_rows |= 1ull << r;
    }
    for (int r = 0; r < fm_build_n_wgmma && r < 64; r++) {
        const fm_wgmma_unit *u = fm_wgmma_units[r];
        if (u && has_code(u->packed) && (!u->natural || has_code(u->natural))) d->wgmma_rows |= 1ull << r;
    }
    /* the hand-written units (routing, permutation, reduce, X packing): one kernel each */
    int generic = has_code(fm_mma_generic_kernel()) && has_code(fm_route_generic_kernel()) &&
                  has_code(fm_moe_generic_kernel()) && has_code(fm_wgmma_generic_kernel());
    fm_cuda_device_leave(d, prev);
    unsigned sass, ptx;
    fm_build_targets_for(d->info.cc, &sass, &ptx);
    char built[160];
    fm_build_targets_str(built, sizeof built);
    if (!generic || !d->mma_rows)
        return fm_fail(FM_ERR_NO_KERNEL,
                       "device %d (%s, compute capability %d.%d) has no fp4moe kernel code in this build, which "
                       "carries %s; rebuild with -DFM_CUDA_ARCHS=native (this GPU) or all",
                       d->ordinal, d->info.name, d->info.cc / 10, d->info.cc % 10, built);
    unsigned use = sass ? sass : ptx;
    for (int i = 0; i < fm_build_n_targets; i++)
        if (use & (1u << i)) {
            snprintf(d->running, sizeof d->running, "%s", fm_build_target_names[i]);
            break;
        }
    d->jit = !sass;
    return FM_OK;
}

fm_status fm_cuda_device_open(int ordinal, fm_cuda_device **out)
{
    fm_clear_error();
    if (!out) return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_device_open: out is NULL");
    *out = NULL;
    fm_device_info info;
    FM_CHECK(fm_device_query(ordinal, &info)); /* reads attributes of `ordinal`: the current device is untouched */
    fm_cuda_device *d = calloc(1, sizeof *d);
    if (!d) return fm_fail(FM_ERR_OOM, "fm_cuda_device_open: out of host memory");
    d->ordinal = ordinal;
    d->info = info;
    d->has_gpu = match_gpu(&info, &d->gpu);
    if (d->has_gpu) d->plan_gpu = d->gpu;
    else /* no row of the table: the device's own figures (the cost model's rates are the H200's) */
        d->plan_gpu = (fm_gpu_info){.name = "cuda-device", .full_name = "CUDA device", .cc = info.cc,
                                    .sms = info.sms, .mem_gbs = info.mem_gbs};
    if (cudaDriverGetVersion(&d->driver_version) != cudaSuccess) d->driver_version = 0;
    if (cudaRuntimeGetVersion(&d->runtime_version) != cudaSuccess) d->runtime_version = 0;
    (void)cudaGetLastError();
    fm_status st = probe_kernels(d);
    if (st != FM_OK) {
        free(d);
        return st;
    }
    *out = d;
    return FM_OK;
}

/* The device current on the calling thread, opened once per ordinal and kept for the
 * process (the GEMM API takes no device object: it runs on the current device). */
#define FM_CURRENT_MAX 64
static _Atomic(fm_cuda_device *) k_current[FM_CURRENT_MAX];

fm_status fm_cuda_device_current(const fm_cuda_device **out)
{
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return fm_fail(FM_ERR_NO_DEVICE, "no usable CUDA device");
    }
    if (dev < 0 || dev >= FM_CURRENT_MAX)
        return fm_fail(FM_ERR_UNSUPPORTED, "CUDA device %d: at most %d devices per process", dev, FM_CURRENT_MAX);
    fm_cuda_device *d = atomic_load(&k_current[dev]);
    if (!d) {
        fm_cuda_device *mine = NULL;
        FM_CHECK(fm_cuda_device_open(dev, &mine));
        if (atomic_compare_exchange_strong(&k_current[dev], &d, mine)) d = mine;
        else fm_cuda_device_close(mine); /* another thread opened it first */
    }
    *out = d;
    return FM_OK;
}

const fm_gpu_info *fm_cuda_device_plan_gpu(const fm_cuda_device *d) { return &d->plan_gpu; }

int fm_cuda_device_has_tile(const fm_cuda_device *d, int wgmma, int idx)
{
    return idx >= 0 && idx < 64 && (((wgmma ? d->wgmma_rows : d->mma_rows) >> idx) & 1);
}

void fm_cuda_device_rows(const fm_cuda_device *d, unsigned long long *mma_rows, unsigned long long *wgmma_rows)
{
    *mma_rows = d->mma_rows;
    *wgmma_rows = d->wgmma_rows;
}

fm_status fm_cuda_device_code(const fm_cuda_device *d, fm_cuda_code_info *out)
{
    fm_clear_error();
    if (!d || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_device_code: NULL argument");
    memset(out, 0, sizeof *out);
    fm_build_targets_str(out->targets, sizeof out->targets);
    snprintf(out->running, sizeof out->running, "%s", d->running);
    out->jit = d->jit;
    out->driver_version = d->driver_version;
    out->runtime_version = d->runtime_version;
    for (int r = 0; r < 64; r++) {
        out->mma_tiles += (int)((d->mma_rows >> r) & 1);
        out->wgmma_tiles += (int)((d->wgmma_rows >> r) & 1);
    }
    return FM_OK;
}

void fm_cuda_device_close(fm_cuda_device *d) { free(d); }

const fm_device_info *fm_cuda_device_limits(const fm_cuda_device *d) { return d ? &d->info : NULL; }

const fm_gpu_info *fm_cuda_device_gpu(const fm_cuda_device *d) { return d && d->has_gpu ? &d->gpu : NULL; }

int fm_cuda_device_ordinal(const fm_cuda_device *d) { return d ? d->ordinal : -1; }

fm_status fm_cuda_device_enter(const fm_cuda_device *d, int *prev)
{
    *prev = -1;
    cudaError_t e = cudaGetDevice(prev);
    if (e == cudaSuccess && *prev == d->ordinal) return FM_OK;
    if (e == cudaSuccess) e = cudaSetDevice(d->ordinal);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *prev = -1;
        return fm_fail(FM_ERR_CUDA, "cannot make device %d current: %s", d->ordinal, cudaGetErrorString(e));
    }
    return FM_OK;
}

void fm_cuda_device_leave(const fm_cuda_device *d, int prev)
{
    if (prev >= 0 && prev != d->ordinal) (void)cudaSetDevice(prev);
}
