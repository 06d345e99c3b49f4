/* io_internal.h - what the safetensors reader, writer, checkpoint and layer
 * loader share inside src/io/ (not installed).
 *
 * Ownership: an fm_safetensors owns its mapping and its tensor table; an
 * fm_checkpoint owns its shards and a name-sorted table of pointers into them;
 * tensors stay valid until the handle that holds them is closed. */
#ifndef FM_IO_INTERNAL_H
#define FM_IO_INTERNAL_H

#include "fm_internal.h"

#include <stdint.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "src/io reads little-endian safetensors data with memcpy: big-endian hosts are not supported"
#endif

/* Largest header the reader accepts (the reference implementation's limit). */
#define FM_ST_MAX_HEADER (100u * 1000u * 1000u)

/* Elements of a shape, or -1 if it overflows int64 / has a negative dim. */
int64_t fm_st_numel(int ndim, const int64_t *shape);

/* Bytes of n elements of dtype d, or UINT64_MAX on overflow or a partial byte. */
uint64_t fm_st_nbytes(fm_dtype d, int64_t numel);

/* "[2, 64, 8]" into buf (always terminated). */
const char *fm_st_shape_str(const fm_st_tensor *t, char *buf, size_t len);

/* Pattern helpers: {L}, {E}, {P} placeholders.
 * fm_pat_format: substitute (layer, expert, proj; proj may be NULL if unused),
 * then append suffix (may be NULL). Returns 0 if it does not fit in `len`.
 * fm_pat_match: does `name` match pattern+suffix? Captures {L}/{E} as decimal
 * numbers (-1 if absent) and {P} as a dot-free token into proj[proj_len]. */
int fm_pat_format(char *buf, size_t len, const char *pat, int layer, int expert, const char *proj, const char *suffix);
int fm_pat_match(const char *pat, const char *suffix, const char *name, int *layer, int *expert, char *proj,
                 size_t proj_len);

/* names->layout AUTO or names NULL: the default names of whichever layout's
 * weight pattern matches more tensors; else validate and copy names.
 * FM_OK, FM_ERR_INVALID_ARG, FM_ERR_NOT_FOUND. */
fm_status fm_ckpt_names_resolve(const fm_checkpoint *ck, const fm_ckpt_names *given, fm_ckpt_names *nm);

/* The folder of the checkpoint (for config.json); NULL for tensors in memory,
 * which have no config.json. */
const char *fm_checkpoint_dir(const fm_checkpoint *ck);
/* The folder, or the label of tensors in memory: what messages name. */
const char *fm_checkpoint_label(const fm_checkpoint *ck);

/* Elements [first, first + n) of a little-endian F32/F16/BF16/F64 tensor as
 * FP32 into dst, read with fm_st_read in chunks. Returns FM_OK, FM_ERR_FORMAT
 * (other dtype), FM_ERR_OUT_OF_RANGE (beyond the tensor), FM_ERR_IO (the read). */
fm_status fm_st_to_f32(const fm_st_tensor *t, int64_t first, int64_t n, float *dst);

/* No tensor of the layout's expert pattern in `layer` may carry an expert
 * index >= n_total (the router's row count): such a stray tensor would be
 * silently ignored by the load and inflate a count taken from the indices.
 * FM_OK or FM_ERR_FORMAT naming the tensor, its index and n_total. */
fm_status fm_ckpt_check_expert_indices(const fm_checkpoint *ck, const fm_ckpt_names *nm, int layer, int n_total);
#endif
