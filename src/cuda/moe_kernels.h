/* moe_kernels.h - extern "C" launchers of src/cuda/moe_kernels.cu (router
 * logits, row gather). Each returns a cudaError_t as int (0 = launched). */
#ifndef FM_MOE_KERNELS_H
#define FM_MOE_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

int fm_moe_router_logits_launch(const uint16_t *x, const float *rw, int T, int E, int H, float *logits, void *stream);
/* out[t] += W2 . (silu(W13[0:S] . x[t]) * (W13[S:2S] . x[t])), BF16 weights, FP32 hs[T][S] scratch;
 * H % 8 == 0, S % 8 == 0, 16-byte aligned buffers. */
int fm_moe_shared_expert_launch(const uint16_t *x, const uint16_t *w13, const uint16_t *w2, int T, int H, int S,
                                float *hs, float *out, void *stream);
int fm_moe_gather_launch(const uint16_t *x, const int32_t *perm, int rows, int top_k, int H, uint16_t *xp,
                         void *stream);

#ifdef __cplusplus
}
#endif
#endif
