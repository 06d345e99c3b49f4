/* fp4moe/status.h - status codes and per-call error detail.
 *
 * One X-macro list (libuv's UV_ERRNO_MAP trick) generates the enum and the
 * message table, so the two cannot drift.  Codes are stable: never renumber,
 * only append.
 */
#ifndef FP4MOE_STATUS_H
#define FP4MOE_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/*        name                value  message */
#define FM_STATUS_MAP(X)                                                                    \
    X(OK,                 0,  "success")                                                    \
    X(ERR_INVALID_ARG,    1,  "invalid argument")                                           \
    X(ERR_BAD_SHAPE,      2,  "bad shape")                                                  \
    X(ERR_FORMAT,         3,  "unsupported or malformed data format")                       \
    X(ERR_MISALIGNED,     4,  "misaligned pointer or size")                                 \
    X(ERR_NO_DEVICE,      5,  "no CUDA device available")                                   \
    X(ERR_CUDA,           6,  "CUDA runtime error")                                         \
    X(ERR_SMEM_EXCEEDED,  7,  "shared memory needed exceeds the per-block limit")           \
    X(ERR_IO,             8,  "I/O error")                                                  \
    X(ERR_OOM,            9,  "out of memory")                                              \
    X(ERR_ARCH_MISMATCH,  10, "configuration not available on this architecture")           \
    X(ERR_UNSUPPORTED,    11, "configuration not supported")                                \
    X(ERR_NONFINITE,      12, "non-finite value (NaN or Inf) in input")                     \
    X(ERR_OUT_OF_RANGE,   13, "index out of range")                                         \
    X(ERR_NOT_FOUND,      14, "not found")                                                  \
    X(ERR_NO_BACKEND,     15, "backend not compiled into this build")                       \
    X(ERR_MISMATCH,       16, "result does not match the reference within its bound")     \
    X(ERR_BUSY,           17, "object in use by another call")                              \
    X(ERR_NO_KERNEL,      18, "this build carries no kernel code for the device")

typedef enum {
#define FM_STATUS_ENUM_(name, value, msg) FM_##name = value,
    FM_STATUS_MAP(FM_STATUS_ENUM_)
#undef FM_STATUS_ENUM_
    FM_STATUS_COUNT_
} fm_status;

/* Short fixed message for a status ("shared memory needed exceeds ...").
 * Never NULL; unknown values give "unknown status". */
const char *fm_status_str(fm_status s);

/* Stable symbolic name of a status ("FM_ERR_SMEM_EXCEEDED"). Never NULL. */
const char *fm_status_name(fm_status s);

/* Detail message of the last failing call on this thread, e.g.
 * "fm_quantize: cols=100 is not a multiple of the NVFP4 block (16)".
 * Empty string after a successful call that cleared it; never NULL.
 * Every fm_ function that returns a status other than FM_OK sets it. */
const char *fm_last_error(void);

#ifdef __cplusplus
}
#endif
#endif
