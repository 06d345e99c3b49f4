/* fp4moe/smem.h - the shared-memory breakdown every kernel family's model fills.
 *
 * One function per kernel family computes this from the configuration (it is
 * never stored); the planner and the launcher call the same function, so a
 * prediction and a launch cannot disagree. All sizes are bytes.
 */
#ifndef FP4MOE_SMEM_H
#define FP4MOE_SMEM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int    stages;     /* mainloop pipeline stages */
    /* mainloop, all stages together */
    size_t a;          /* A operand tiles */
    size_t b;          /* B operand tiles */
    size_t sf;         /* scale-factor tiles (SFA + SFB) */
    size_t barriers;   /* pipeline barriers (mbarriers) */
    size_t mainloop;   /* a + b + sf + barriers + alignment padding inside the mainloop storage */
    /* epilogue */
    size_t epi_c;      /* C (source) sub-tile buffers */
    size_t epi_d;      /* D (output) sub-tile buffers */
    size_t epi_other;  /* broadcast storage (bias, router scale), epilogue barriers, TMA descriptors */
    size_t epilogue;   /* epi_c + epi_d + epi_other + its padding */
    /* the rest of the kernel's SharedStorage */
    size_t tensormaps; /* tensor-map storage (grouped / ptr-array kernels) */
    size_t scheduler;  /* tile-scheduler pipeline storage and responses */
    size_t padding;    /* alignment padding between members and of the whole struct */
    size_t total;      /* what the launch needs: sizeof(SharedStorage) (+ dynamic extras) */
} fm_smem_breakdown;

#ifdef __cplusplus
}
#endif
#endif
