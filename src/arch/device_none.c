/* device_none.c - the device query in a build without CUDA: the same functions as
 * src/cuda/device.c, answering FM_ERR_NO_BACKEND so callers (fp4moe devices) can
 * say so in one line instead of failing to link. */
#ifndef FM_HAVE_CUDA
#include "fm_internal.h"

fm_status fm_device_count(int *n)
{
    if (!n) return fm_fail(FM_ERR_INVALID_ARG, "fm_device_count: n is NULL");
    return fm_fail(FM_ERR_NO_BACKEND, "this fp4moe was built without CUDA (configure with nvcc present)");
}

fm_status fm_device_query(int index, fm_device_info *out)
{
    (void)index;
    if (!out) return fm_fail(FM_ERR_INVALID_ARG, "fm_device_query: out is NULL");
    return fm_fail(FM_ERR_NO_BACKEND, "this fp4moe was built without CUDA (configure with nvcc present)");
}

fm_status fm_cuda_device_open(int ordinal, fm_cuda_device **out)
{
    (void)ordinal;
    if (!out) return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_device_open: out is NULL");
    *out = NULL;
    return fm_fail(FM_ERR_NO_BACKEND, "this fp4moe was built without CUDA (configure with nvcc present)");
}

void fm_cuda_device_close(fm_cuda_device *dev) { (void)dev; }

const fm_device_info *fm_cuda_device_limits(const fm_cuda_device *dev)
{
    (void)dev;
    return NULL;
}

const fm_gpu_info *fm_cuda_device_gpu(const fm_cuda_device *dev)
{
    (void)dev;
    return NULL;
}

fm_status fm_cuda_device_code(const fm_cuda_device *dev, fm_cuda_code_info *out)
{
    (void)dev;
    if (!out) return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_device_code: out is NULL");
    return fm_fail(FM_ERR_NO_BACKEND, "this fp4moe was built without CUDA (configure with nvcc present)");
}
#else
typedef int fm_device_none_unused; /* ISO C forbids an empty translation unit */
#endif
