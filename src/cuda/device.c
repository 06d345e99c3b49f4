/* device.c - visible GPUs through the CUDA runtime API (plain C, compiled only when
 * FM_HAVE_CUDA).  No driver or no device is a normal answer (FM_ERR_NO_DEVICE with
 * the runtime's reason), never a crash: `fp4moe devices` prints it in one line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda/cuda_internal.h"
#include "fm_internal.h"

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
    *out = d;
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
