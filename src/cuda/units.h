/* units.h - one compiled row of the tile catalogue (src/kernels/fm_tiles.def): the
 * kernels a generated unit (build/kernels/{mma,wgmma}_row_NN.cu) instantiates, as
 * host-side function handles for cudaLaunchKernel / cudaFuncGetAttributes. The
 * build's table (fm_build_table.c) lists them in catalogue order, NULL for a row no
 * target of the build carries. Plain C: device.c asks each handle whether the
 * device has code for it. */
#ifndef FM_CUDA_UNITS_H
#define FM_CUDA_UNITS_H

#ifdef __cplusplus
extern "C" {
#endif

/* A row's gpt-oss twins (the same kernels with gpt-oss's epilogues: expert biases, clamped
 * SwiGLU, fm_gemm_params' bias / act), compiled in a unit of their own
 * (build/kernels/{mma,wgmma}_row_NN_oss.cu): one unit holding both a row's plain kernels and
 * its twins doubled the longest compile, which sets the build's wall time (issue 28). */
/* A work-list kernel's handle is reached through the address of an object its unit exports
 * (fm_mma_list_NN, fm_mma_oss_list_NN): the rows with the longest compiles (the 8-band
 * rows, ~100 s per target) put their work-list kernels in units of their own
 * (build/kernels/mma_row_NN{,_oss}_list.cu), which halves the build's critical path; the
 * address is a constant, so the table needs no initialisation order across units. */
typedef struct {
    const void *plain, *mb;   /* mb NULL where the row has no multi-block kernel */
    const void *const *list;  /* *list: the work-list kernel */
} fm_mma_twins;
typedef struct {
    const void *packed, *natural; /* natural NULL for the persistent row */
} fm_wgmma_twins;
typedef struct {
    int         warps, mt, nt, kc, stages;
    const void *plain; /* one feature block per CTA */
    const void *mb;    /* the multi-block kernel (short K), NULL if the row has none */
    const void *const *list; /* *list: the work-list kernel (split K, expert list) */
    /* probe builds: point the row's timeline buffer at buf (else NULL) */
    int (*probe_timeline)(void *buf, unsigned cap);
    const fm_mma_twins *oss; /* the same three with gpt-oss's epilogues, for calls that have them */
} fm_mma_unit;

typedef struct {
    int         warps, mt, nt, kc, stages, persist;
    const void *packed;  /* warp-specialized, packed X (fm_smem_wgmma's bytes) */
    const void *natural; /* single-role, natural X; NULL for the persistent kernel */
    const fm_wgmma_twins *oss; /* the same with gpt-oss's epilogues */
} fm_wgmma_unit;

extern const fm_mma_unit *const   fm_mma_units[];   /* fm_build_n_mma entries */
extern const fm_wgmma_unit *const fm_wgmma_units[]; /* fm_build_n_wgmma entries */

#ifdef __cplusplus
}
#endif
#endif
