/* moe_kernels.h - extern "C" launchers of src/cuda/moe_kernels.cu (router
 * logits, row gather). Each returns a cudaError_t as int (0 = launched). */
#ifndef FM_MOE_KERNELS_H
#define FM_MOE_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

int fm_moe_router_logits_launch(const uint16_t *x, const float *rw, int T, int E, int H, float *logits, void *stream);
int fm_moe_gather_launch(const uint16_t *x, const int32_t *perm, int rows, int top_k, int H, uint16_t *xp,
                         void *stream);

#ifdef __cplusplus
}
#endif
#endif
