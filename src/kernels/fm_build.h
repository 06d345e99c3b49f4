/* fm_build.h - what this build carries (the table fm_units_gen writes at configure
 * time, build/kernels/fm_build_table.c), and the questions asked of it. */
#ifndef FM_BUILD_H
#define FM_BUILD_H

#ifdef __cplusplus
extern "C" {
#endif

extern const int         fm_build_has_cuda;       /* the CUDA backend is compiled in */
extern const int         fm_build_n_targets;
extern const char *const fm_build_target_names[]; /* "sm_90a", ..., NULL */
extern const char        fm_build_targets_string[]; /* "sm_80 sm_90a sm_100f sm_120f" */
extern const int         fm_build_n_mma, fm_build_n_wgmma;
/* per catalogue row: bit i = fm_build_target_names[i] carries the row's kernels */
extern const unsigned fm_build_mma_targets[], fm_build_wgmma_targets[];

/* The targets that run on compute capability cc (x10) as bits of fm_build_target_names:
 * *sass = those with machine code for it, *ptx = PTX that the driver would JIT. */
void fm_build_targets_for(int cc, unsigned *sass, unsigned *ptx);
/* The catalogue rows (bit r = row r of fm_mma_tiles / fm_wgmma_tiles) this build
 * carries code for on compute capability cc, by its table (SASS first; PTX only when
 * no SASS target runs there). Without CUDA: the rows an equal CUDA build would carry. */
void fm_build_rows_for(int cc, unsigned long long *mma_rows, unsigned long long *wgmma_rows);
/* "sm_80 sm_90a sm_100f sm_120f" into buf. */
const char *fm_build_targets_str(char *buf, unsigned long n);

#ifdef __cplusplus
}
#endif
#endif
