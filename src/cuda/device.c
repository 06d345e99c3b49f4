/* device.c - visible GPUs through the CUDA runtime API (plain C, compiled only when
 * FM_HAVE_CUDA).  No driver or no device is a normal answer (FM_ERR_NO_DEVICE with
 * the runtime's reason), never a crash: `fp4moe devices` prints it in one line. */
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

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
