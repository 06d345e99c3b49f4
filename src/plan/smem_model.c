/* smem_model.c - validate a kernel configuration and dispatch to its family's model.
 *
 * Validation happens here, once, so every family model can assume a well-formed
 * tile: each rule below is a static_assert or builder restriction in CUTLASS (named
 * in the message), turned into a status the caller can act on instead of a compile
 * error or a kErrorInternal at launch.
 */
#include <string.h>

#include "plan_internal.h"

void fm_kernel_config_init(fm_kernel_config *cfg)
{
    if (!cfg) return;
    memset(cfg, 0, sizeof *cfg);
    cfg->c = cfg->d = FM_ELEM_BF16;
    cfg->cluster_m = cfg->cluster_n = 1;
    cfg->cutlass = 420;
}

static fm_status validate_sm120(fm_kernel_config *c, const fm_arch_info *arch)
{
    (void)arch;
    if (c->cluster_m * c->cluster_n != 1)
        return fm_fail(FM_ERR_ARCH_MISMATCH, "SM120 GEMMs run 1x1x1 clusters (no multicast on this arch)");
    if (c->schedule == FM_SCHED_AUTO) c->schedule = FM_SCHED_COOP;
    if (c->schedule != FM_SCHED_COOP && c->schedule != FM_SCHED_PINGPONG)
        return fm_fail(FM_ERR_ARCH_MISMATCH, "SM120 schedules are coop or pingpong, not %s",
                       fm_schedule_name(c->schedule));
    {
        int nv = c->a == FM_ELEM_NVFP4 && c->b == FM_ELEM_NVFP4;
        int mx = (c->a == FM_ELEM_MXFP4 || c->a == FM_ELEM_FP8) && (c->b == FM_ELEM_MXFP4 || c->b == FM_ELEM_FP8);
        if (!nv && !mx)
            return fm_fail(FM_ERR_ARCH_MISMATCH,
                           "SM120 block-scaled MMA takes nvfp4 x nvfp4 or MX operands (mxfp4/fp8), not %s x %s",
                           fm_elem_name(c->a), fm_elem_name(c->b));
        if (c->tile_n == 192)
            return fm_fail(FM_ERR_BAD_SHAPE, "SM120 tile N=192 is not a power of two");
        if (c->tile_n < 32 && c->cutlass < 470) /* measured on 4.2 and 4.5; 4.7 builds N = 8 / 16 */
            return fm_fail(FM_ERR_BAD_SHAPE,
                           "rejected at compile time: SM120 tile N=%d needs CUTLASS 4.7 (before it: static_assert "
                           "EPI_TILE_N must divide CTA_N, Invalid tile shape N.)",
                           c->tile_n);
        if (c->epilogue == FM_EPI_NOSMEM) /* measured: tests/conformance/truth-*.csv */
            return fm_fail(FM_ERR_UNSUPPORTED, "rejected at compile time: the SM120 epilogue builder has no "
                                               "no-smem epilogue (static_assert: Could not build a collective "
                                               "epilogue for given parameters.)");
        int vec = nv ? 16 : 32; /* a 64-row cooperative tile builds on SM120 (2 warp groups of 32 rows) */
        if (c->tile_k < 64 || c->tile_k % (4 * vec))
            return fm_fail(FM_ERR_BAD_SHAPE, "tile K=%d must be a multiple of %d (4 scale factors of %d)",
                           c->tile_k, 4 * vec, vec);
    }
    return FM_OK;
}

static fm_status validate_sm90(fm_kernel_config *c, const fm_arch_info *arch)
{
    (void)arch;
    if (c->schedule == FM_SCHED_AUTO) c->schedule = FM_SCHED_COOP;
    if (c->schedule != FM_SCHED_COOP && c->schedule != FM_SCHED_PINGPONG)
        return fm_fail(FM_ERR_ARCH_MISMATCH, "SM90 schedules are coop or pingpong");
    if (c->a != c->b || (c->a != FM_ELEM_BF16 && c->a != FM_ELEM_FP16 && c->a != FM_ELEM_FP8))
        return fm_fail(FM_ERR_ARCH_MISMATCH,
                       "sm_90 has no FP4 tensor cores: the SM90 family takes bf16/fp16/fp8 pairs, not %s x %s",
                       fm_elem_name(c->a), fm_elem_name(c->b));
    if (c->schedule == FM_SCHED_COOP && c->tile_m < 128)
        return fm_fail(FM_ERR_BAD_SHAPE, "the cooperative schedule needs tile M >= 128 (use pingpong)");
    if ((size_t)c->tile_k * fm_elem_bits(c->a) / 8 < 64)
        return fm_fail(FM_ERR_BAD_SHAPE, "tile K=%d is under one 64-byte swizzle row", c->tile_k);
    return FM_OK;
}

static fm_status validate_sm100(fm_kernel_config *c, const fm_arch_info *arch)
{
    (void)arch;
    if (c->schedule == FM_SCHED_AUTO) c->schedule = c->tile_m == 256 ? FM_SCHED_2SM : FM_SCHED_1SM;
    if (c->schedule != FM_SCHED_1SM && c->schedule != FM_SCHED_2SM)
        return fm_fail(FM_ERR_ARCH_MISMATCH, "SM100 schedules are 1sm or 2sm, not %s", fm_schedule_name(c->schedule));
    {
        int mx = (c->a == FM_ELEM_MXFP4 || c->a == FM_ELEM_FP8) && (c->b == FM_ELEM_MXFP4 || c->b == FM_ELEM_FP8);
        if (mx && c->a == FM_ELEM_FP8 && c->b == FM_ELEM_FP8)
            return fm_fail(FM_ERR_UNSUPPORTED, "SM100 fp8 x fp8 (MXF8) is not modelled: nvfp4 and mxfp4 pairs and "
                                               "fp8 x mxfp4 are");
        if (!((c->a == FM_ELEM_NVFP4 && c->b == FM_ELEM_NVFP4) || mx))
            return fm_fail(FM_ERR_ARCH_MISMATCH,
                           "the SM100 block-scaled family takes nvfp4 pairs or MX operands (mxfp4 / fp8), not %s x %s",
                           fm_elem_name(c->a), fm_elem_name(c->b));
    }
    if (c->schedule == FM_SCHED_1SM ? c->tile_m != 128 : (c->tile_m != 256 || c->cluster_m % 2))
        return fm_fail(FM_ERR_BAD_SHAPE,
                       "SM100 block-scaled tiles are 128xN with 1sm, 256xN with 2sm and an even cluster M "
                       "(got %dx%d, %s, cluster %dx%d)",
                       c->tile_m, c->tile_n, fm_schedule_name(c->schedule), c->cluster_m, c->cluster_n);
    if (c->tile_n < 64)
        return fm_fail(FM_ERR_BAD_SHAPE,
                       "rejected at compile time: SM100 block-scaled tile N=%d is not 64, 128, 192 or 256 "
                       "(sm100_common.inl static_assert: Invalid TileShape_N.)",
                       c->tile_n);
    if (c->tile_k != 128 && c->tile_k != 256)
        return fm_fail(FM_ERR_BAD_SHAPE, "SM100 block-scaled tile K=%d: use 128 or 256", c->tile_k);
    if (c->epilogue == FM_EPI_FINALIZE) c->d = FM_ELEM_VOID; /* modelled: measured on 4.2, 4.5, 4.7 */
    else if (c->d != FM_ELEM_BF16 && c->d != FM_ELEM_FP16 && c->d != FM_ELEM_FP32)
        return fm_fail(FM_ERR_UNSUPPORTED, "SM100 epilogue D=%s is not modelled (bf16, fp16, fp32 are)",
                       fm_elem_name(c->d));
    if (c->c != FM_ELEM_VOID && c->c != FM_ELEM_BF16 && c->c != FM_ELEM_FP16 && c->c != FM_ELEM_FP32)
        return fm_fail(FM_ERR_UNSUPPORTED, "SM100 epilogue C=%s is not modelled (void, bf16, fp16, fp32 are)",
                       fm_elem_name(c->c));
    return FM_OK;
}

static int runs_sm90(int cc) { return cc == 90; }
static int runs_sm120(int cc) { return cc == 120 || cc == 121; }
static int runs_sm100(int cc) { return cc == 100 || cc == 103 || cc == 110; }

/* The planner's kernel families, one row each (adding a family = a row and its
 * files). cutlass: picked by FM_FAMILY_AUTO on an architecture it runs on (the first
 * such row), validated by the common CUTLASS rules below and then its own; else the
 * family resolves itself (fp4moe's own kernels: their tile and arch rules,
 * smem_fp4moe.c).
 * Columns: family, cutlass, runs on (and the refusal's text), validate, resolve, model. */
typedef struct {
    fm_kernel_family family;
    int              cutlass;
    int (*runs_on)(int cc);
    const char *runs_on_text;
    fm_status (*validate)(fm_kernel_config *c, const fm_arch_info *arch);
    fm_status (*resolve)(fm_kernel_config *c);
    fm_status (*model)(const fm_kernel_config *c, fm_model_out *out);
} family_row;

static const family_row k_families[] = {
    {FM_FAMILY_CUTLASS_SM90, 1, runs_sm90, "the SM90 wgmma family runs on sm_90 only", validate_sm90, NULL,
     fm_model_cutlass_sm90},
    {FM_FAMILY_CUTLASS_SM120, 1, runs_sm120, "the SM120 block-scaled family runs on sm_120/sm_121", validate_sm120,
     NULL, fm_model_cutlass_sm120},
    {FM_FAMILY_CUTLASS_SM100, 1, runs_sm100, "the SM100 UMMA family runs on sm_100/sm_103/sm_110", validate_sm100,
     NULL, fm_model_cutlass_sm100},
    {FM_FAMILY_FP4MOE_MMA, 0, NULL, NULL, NULL, fm_resolve_fp4moe, fm_model_fp4moe},
    {FM_FAMILY_FP4MOE_WGMMA, 0, NULL, NULL, NULL, fm_resolve_fp4moe, fm_model_fp4moe},
};

static const family_row *family_of(fm_kernel_family f)
{
    for (size_t i = 0; i < FM_ARRAY_LEN(k_families); i++)
        if (k_families[i].family == f) return &k_families[i];
    return NULL;
}

/* The one place that maps an architecture to its CUTLASS family (FM_FAMILY_AUTO: none). */
fm_kernel_family fm_family_for_cc(int cc)
{
    for (size_t i = 0; i < FM_ARRAY_LEN(k_families); i++)
        if (k_families[i].cutlass && k_families[i].runs_on(cc)) return k_families[i].family;
    return FM_FAMILY_AUTO;
}

static int pow2(int v) { return v > 0 && (v & (v - 1)) == 0; }

/* Resolve AUTO fields into a copy, validate everything. */
static fm_status resolve(const fm_kernel_config *in, fm_kernel_config *c)
{
    *c = *in;
    const fm_arch_info *arch = NULL;
    FM_CHECK(fm_arch_get(c->cc, &arch));
    if (!c->cutlass) c->cutlass = 420;
    if (c->cutlass < 420)
        return fm_fail(FM_ERR_UNSUPPORTED, "CUTLASS %d.%d is older than the 4.2 the model starts from",
                       c->cutlass / 100, c->cutlass / 10 % 10);
    if (!c->cluster_m) c->cluster_m = 1;
    if (!c->cluster_n) c->cluster_n = 1;
    if ((unsigned)c->a >= FM_ELEM_COUNT || (unsigned)c->b >= FM_ELEM_COUNT || (unsigned)c->c >= FM_ELEM_COUNT ||
        (unsigned)c->d >= FM_ELEM_COUNT || (unsigned)c->schedule >= FM_SCHED_COUNT ||
        (unsigned)c->epilogue >= FM_EPI_COUNT || (unsigned)c->family >= FM_FAMILY_COUNT)
        return fm_fail(FM_ERR_INVALID_ARG, "enum field out of range in fm_kernel_config");
    if (c->family == FM_FAMILY_AUTO && (c->family = fm_family_for_cc(c->cc)) == FM_FAMILY_AUTO)
        return fm_fail(FM_ERR_ARCH_MISMATCH, "%s has no TMA grouped-GEMM kernel family (needs sm_90 or newer)",
                       arch->name);
    if (c->persistent != 0 && c->persistent != 1)
        return fm_fail(FM_ERR_INVALID_ARG, "persistent=%d in fm_kernel_config: 0 or 1", c->persistent);
    if (c->epi_tile_m < 0 || c->epi_tile_n < 0 || !c->epi_tile_m != !c->epi_tile_n || c->epi_tile_m > 256 ||
        c->epi_tile_n > 256)
        return fm_fail(FM_ERR_BAD_SHAPE, "epilogue tile %dx%d: both 0 (automatic) or both in [1, 256]", c->epi_tile_m,
                       c->epi_tile_n);
    const family_row *own = family_of(c->family);
    if (own && own->resolve && c->epi_tile_m)
        return fm_fail(FM_ERR_UNSUPPORTED, "%s: an explicit epilogue tile is an argument of CUTLASS's epilogue "
                                           "builder; fp4moe's kernels store from registers and have none",
                       fm_family_name(c->family));
    if (own && own->resolve) return own->resolve(c); /* their own tile and arch rules */
    if (c->plain != 0 && c->plain != 1)
        return fm_fail(FM_ERR_INVALID_ARG, "plain=%d in fm_kernel_config: 0 (grouped) or 1", c->plain);
    if (c->plain && c->epilogue == FM_EPI_FINALIZE)
        return fm_fail(FM_ERR_UNSUPPORTED, "FINALIZE is TensorRT-LLM's grouped-GEMM epilogue (per-group router "
                                           "scales): a plain GEMM has none");
    if (c->persistent)
        return fm_fail(FM_ERR_UNSUPPORTED, "%s: persistent is fp4moe-wgmma's kernel variant; CUTLASS's own "
                                           "persistence is its tile scheduler, modelled without this flag",
                       fm_family_name(c->family));
    if (c->tile_m <= 0 || c->tile_n <= 0 || c->tile_k <= 0 || !pow2(c->tile_m) ||
        !(pow2(c->tile_n) || c->tile_n == 192) || !pow2(c->tile_k) || c->tile_m < 64 || c->tile_m > 256 ||
        c->tile_n < 8 || c->tile_n > 256 || c->tile_k < 32 || c->tile_k > 512)
        return fm_fail(FM_ERR_BAD_SHAPE,
                       "tile %dx%dx%d: M must be 64/128/256, N a power of two in [8, 256] (or 192), K a power of two "
                       "in [32, 512]",
                       c->tile_m, c->tile_n, c->tile_k);
    if (c->stages < 0 || c->stages == 1 || c->stages > 32)
        return fm_fail(FM_ERR_BAD_SHAPE, "stages=%d: use 0 (auto) or 2..32 (the collectives need at least 2)",
                       c->stages);
    /* each at most 16 before the product: 65536 x 65536 overflows int */
    if (c->cluster_m < 1 || c->cluster_n < 1 || c->cluster_m > 16 || c->cluster_n > 16 || !pow2(c->cluster_m) ||
        !pow2(c->cluster_n) || c->cluster_m * c->cluster_n > 16)
        return fm_fail(FM_ERR_BAD_SHAPE, "cluster %dx%d: powers of two, at most 16 CTAs", c->cluster_m, c->cluster_n);

    const family_row *F = family_of(c->family);
    if (!F || !F->validate) return fm_fail(FM_ERR_INVALID_ARG, "unknown kernel family");
    if (!F->runs_on(c->cc)) return fm_fail(FM_ERR_ARCH_MISMATCH, "%s, not %s", F->runs_on_text, arch->name);
    FM_CHECK(F->validate(c, arch));
    if (c->epi_tile_m && c->epilogue == FM_EPI_NOSMEM) /* nothing staged; the builders' no-smem paths not measured */
        return fm_fail(FM_ERR_UNSUPPORTED, "an explicit epilogue tile with the no-smem epilogue is not modelled (it "
                                           "stages nothing; tma and finalize take one)");
    if (c->epilogue == FM_EPI_FINALIZE && c->d != FM_ELEM_VOID) c->d = FM_ELEM_VOID; /* FINALIZE has no D by definition */
    if (c->epilogue == FM_EPI_TMA && c->d == FM_ELEM_VOID)
        return fm_fail(FM_ERR_UNSUPPORTED, "a TMA epilogue without D needs a storing fusion (use --epilogue finalize)");
    return FM_OK;
}

fm_status fm_plan_model_resolved(const fm_kernel_config *in, fm_kernel_config *resolved, fm_model_out *out)
{
    FM_CHECK(resolve(in, resolved));
    memset(out, 0, sizeof *out);
    const family_row *F = family_of(resolved->family);
    if (!F) return fm_fail(FM_ERR_INVALID_ARG, "unknown kernel family");
    return F->model(resolved, out);
}

fm_status fm_plan_resolve(const fm_kernel_config *in, fm_kernel_config *out)
{
    fm_clear_error();
    if (!in || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_plan_resolve: NULL argument");
    fm_kernel_config r;
    FM_CHECK(resolve(in, &r));
    *out = r;
    return FM_OK;
}

fm_status fm_smem_model(const fm_kernel_config *cfg, fm_smem_breakdown *out)
{
    fm_clear_error();
    if (!cfg || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_smem_model: NULL argument");
    fm_kernel_config r;
    fm_model_out m;
    FM_CHECK(fm_plan_model_resolved(cfg, &r, &m));
    *out = m.bd;
    return FM_OK;
}
