/* test_kernel_resources.c - every compiled kernel x target of this build, from ptxas's
 * own report (build/kernel_resources.csv, scripts/kernel_resources.sh), against the
 * catalogue, the planner's bytes and the reviewed spill baseline. Runs on the CPU.
 *
 * 1. Each GEMM kernel the compiler saw is a catalogue row: its template arguments (warps,
 *    mt, nt, kc, stages, persist), read from the compiled kernel's name, are a row of
 *    fm_mma_tiles / fm_wgmma_tiles, and the build table says its target carries that
 *    row. A unit that instantiated other arguments than its row (the generator, the row
 *    header or the .def drifting apart) fails here.
 * 2. Each row the table puts on a target has exactly its kernels compiled there (mma:
 *    plain, work list, and multi-block only where the row has it; wgmma: packed X, and
 *    natural X unless persistent), each also as its gpt-oss twin (*_oss_*, the same
 *    kernel with gpt-oss's epilogues: expert biases, clamped SwiGLU).
 * 3. Shared memory: static + the planner's dynamic bytes for the tile (fm_smem_mma /
 *    fm_smem_wgmma) within the target's opt-in limit (sm_120f: 101,376 B); the other
 *    kernels' static bytes within the 48 KB every block gets without opting in.
 * 4. Spills: none, except the (target, kernel) pairs of tests/kernel_spills.csv, each up
 *    to its reviewed bytes. A new spill, or a larger one, fails: look at it, then either
 *    fix the kernel or review and raise the baseline in the same commit.
 * 5. Launch bounds, read from the machine code (build/kernel_bounds.csv,
 *    scripts/kernel_bounds.py): each GEMM kernel's maximum threads per block is what the
 *    launcher and the occupancy model count for its row and variant (fm_kernel_threads:
 *    warps x 32, + the producer warpgroup of the packed-X and persistent wgmma kernels),
 *    and its register cap is the one its row's minimum blocks per SM imply
 *    (FM_MMA_MIN_BLOCKS for mma, 1 for wgmma), which the occupancy model counts on.
 *    A kernel whose __launch_bounds__ drift from the row, or a stale build, fails here.
 * Targets of PTX only (compute_NN) have no ptxas report and are not checked.
 * Exit 77 (skipped) in a build without CUDA. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/fm_build.h"
#include "kernels/fm_targets.h"
#include "kernels/fm_kernels_smem.h"
#include "testutil.h"

#define MAXK 4096
typedef struct {
    char target[16], kernel[256];
    int  regs, stack, spst, spld, smem;
} kres;
static kres g_k[MAXK];
static int  g_nk;

typedef struct {
    char target[16], kernel[256];
    int  spst, spld;
} spill_ok;
static spill_ok g_base[256];
static int      g_nbase;

typedef struct {
    char target[16], kernel[256];
    int  threads, max_regs;
} kbound;
static kbound g_b[MAXK];
static int    g_nb;

static void load(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s (the build writes it after linking libfp4moe)", path);
    char line[512];
    if (!fgets(line, sizeof line, f)) fail_msg("%s is empty", path);
    while (fgets(line, sizeof line, f) && g_nk < MAXK) {
        kres *k = &g_k[g_nk];
        /* target,kernel,regs,stack,spill stores,spill loads,static smem; the kernel has no ',' */
        char *c1 = strchr(line, ','), *c2 = c1 ? strchr(c1 + 1, ',') : NULL;
        if (!c1 || !c2 || c1 - line >= (long)sizeof k->target || c2 - c1 - 1 >= (long)sizeof k->kernel)
            fail_msg("malformed row in %s: %s", path, line);
        memcpy(k->target, line, (size_t)(c1 - line));
        memcpy(k->kernel, c1 + 1, (size_t)(c2 - c1 - 1));
        if (sscanf(c2 + 1, "%d,%d,%d,%d,%d", &k->regs, &k->stack, &k->spst, &k->spld, &k->smem) != 5)
            fail_msg("malformed numbers in %s: %s", path, line);
        g_nk++;
    }
    fclose(f);
}

/* kernel_bounds.csv: target,kernel,max_threads,max_regs,template_args (no ',' in kernel) */
static void load_bounds(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s (the build writes it after linking libfp4moe)", path);
    char line[768];
    if (!fgets(line, sizeof line, f)) fail_msg("%s is empty", path);
    while (fgets(line, sizeof line, f) && g_nb < MAXK) {
        kbound *b  = &g_b[g_nb];
        char   *c1 = strchr(line, ','), *c2 = c1 ? strchr(c1 + 1, ',') : NULL;
        if (!c1 || !c2 || c1 - line >= (long)sizeof b->target || c2 - c1 - 1 >= (long)sizeof b->kernel ||
            sscanf(c2 + 1, "%d,%d", &b->threads, &b->max_regs) != 2)
            fail_msg("malformed row in %s: %s", path, line);
        memcpy(b->target, line, (size_t)(c1 - line));
        memcpy(b->kernel, c1 + 1, (size_t)(c2 - c1 - 1));
        g_nb++;
    }
    fclose(f);
}

static const kbound *bounds_of(const char *target, const char *kernel)
{
    for (int i = 0; i < g_nb; i++)
        if (!strcmp(g_b[i].target, target) && !strcmp(g_b[i].kernel, kernel)) return &g_b[i];
    return NULL;
}

/* Check 5 for one GEMM kernel of catalogue tile t run as variant v; returns failures. */
static int check_bounds(const kres *k, const fm_tile *t, fm_kernel_variant v)
{
    const kbound *b = bounds_of(k->target, k->kernel);
    if (!b) {
        printf("FAIL %s %s: not in kernel_bounds.csv (a stale build?)\n", k->target, k->kernel);
        return 1;
    }
    int threads = fm_kernel_threads(t, v);
    int blocks  = fm_variant_family(v) == FM_FAMILY_FP4MOE_MMA
                      ? FM_MMA_MIN_BLOCKS(t->warps, t->mt, t->nt, t->kc, t->stages)
                      : 1;
    /* ptxas's cap for __launch_bounds__(threads, blocks): the register file over
     * threads x blocks, in steps of 8, at most 255 */
    int regs = threads > 0 ? FM_REGS_PER_SM / (threads * blocks) / 8 * 8 : 0;
    if (regs > 255) regs = 255;
    if (b->threads != threads || b->max_regs != regs) {
        printf("FAIL %s %s: compiled for %d threads, %d registers at most; its row as %s has %d threads "
               "(fm_kernel_threads) and %d CTAs per SM (%d registers)\n",
               k->target, k->kernel, b->threads, b->max_regs, fm_kernel_variant_name(v), threads, blocks, regs);
        return 1;
    }
    return 0;
}

static void load_baseline(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s", path);
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        spill_ok *b = &g_base[g_nbase];
        char     *c1 = strchr(line, ','), *c3 = strrchr(line, ','), *c2 = NULL;
        if (c3 && c3 > line) { /* the second-last comma */
            *c3 = 0;
            c2 = strrchr(line, ',');
            *c3 = ',';
        }
        if (!c1 || !c2 || c1 >= c2 || c1 - line >= (long)sizeof b->target || c2 - c1 - 1 >= (long)sizeof b->kernel ||
            sscanf(c2 + 1, "%d,%d", &b->spst, &b->spld) != 2)
            fail_msg("malformed baseline row in %s: %s", path, line);
        memcpy(b->target, line, (size_t)(c1 - line));
        memcpy(b->kernel, c1 + 1, (size_t)(c2 - c1 - 1));
        if (++g_nbase == 256) break;
    }
    fclose(f);
}

/* "void (anonymous namespace)::mma_kernel<4; 1; 1; 256; 4; false>(fm_gemm_params)":
 * the base name's template arguments (bools as 0/1); the count, or -1 if not `base<`. */
static int targs(const char *kernel, const char *base, int *v, int max)
{
    char key[64];
    snprintf(key, sizeof key, "::%s<", base);
    const char *p = strstr(kernel, key);
    if (!p) return -1;
    p += strlen(key);
    int n = 0;
    while (*p && *p != '>' && n < max) {
        while (*p == ' ' || *p == ';') p++;
        if (!strncmp(p, "true", 4)) v[n++] = 1, p += 4;
        else if (!strncmp(p, "false", 5)) v[n++] = 0, p += 5;
        else {
            char *e;
            long  x = strtol(p, &e, 10);
            if (e == p) return -1;
            v[n++] = (int)x;
            p = e;
        }
    }
    return n;
}

static int target_index(const char *name)
{
    for (int i = 0; i < fm_build_n_targets; i++)
        if (!strcmp(fm_build_target_names[i], name)) return i;
    return -1;
}

static void test_resources(void **state)
{
    (void)state;
    if (!fm_build_has_cuda) skip();
    const char *bin = getenv("FM_BINARY_DIR"), *src = getenv("FM_SOURCE_DIR");
    assert_non_null(bin);
    assert_non_null(src);
    char path[1024];
    snprintf(path, sizeof path, "%s/kernel_resources.csv", bin);
    load(path);
    snprintf(path, sizeof path, "%s/tests/kernel_spills.csv", src);
    load_baseline(path);
    snprintf(path, sizeof path, "%s/kernel_bounds.csv", bin);
    load_bounds(path);
    assert_true(g_nk > 0);
    size_t         nsw = 0, nwg = 0;
    const fm_tile *sw = fm_mma_tiles(&nsw), *wg = fm_wgmma_tiles(&nwg);
    assert_int_equal((int)nsw, fm_build_n_mma);
    assert_int_equal((int)nwg, fm_build_n_wgmma);
    /* seen[target][family][row]: bits 1 plain/packed, 2 multi-block/natural, 4 list */
    static unsigned seen[FM_TARGETS_MAX][2][64];
    memset(seen, 0, sizeof seen);
    int bad = 0, checked = 0;
    for (int i = 0; i < g_nk; i++) {
        const kres *k = &g_k[i];
        int         ti = target_index(k->target);
        if (ti < 0) {
            printf("FAIL %s %s: compiled for a target the build table does not list\n", k->target, k->kernel);
            bad++;
            continue;
        }
        fm_target tg;
        assert_int_equal(fm_target_from(k->target + 3, &tg), 0);
        int    v[8], n, fam = -1, bit = 0;
        fm_tile t;
        fm_kernel_variant var = FM_VARIANT_MMA;
        memset(&t, 0, sizeof t);
        /* each kernel and its gpt-oss twin (*_oss_*: the same tile, launch bounds and shared
         * memory, other epilogues), the twin's bit above the row's own */
        if ((n = targs(k->kernel, "mma_kernel", v, 8)) == 6 || (n = targs(k->kernel, "mma_oss_kernel", v, 8)) == 6)
            fam = 0, bit = v[5] ? 2 : 1, var = v[5] ? FM_VARIANT_MMA_MULTI_BLOCK : FM_VARIANT_MMA;
        else if ((n = targs(k->kernel, "mma_list_kernel", v, 8)) == 5 ||
                 (n = targs(k->kernel, "mma_oss_list_kernel", v, 8)) == 5)
            fam = 0, bit = 4, var = FM_VARIANT_MMA;
        else if ((n = targs(k->kernel, "wgmma_ws_kernel", v, 8)) == 6 ||
                 (n = targs(k->kernel, "wgmma_oss_ws_kernel", v, 8)) == 6)
            fam = 1, bit = 1, t.persist = v[5], var = v[5] ? FM_VARIANT_WGMMA_PERSISTENT : FM_VARIANT_WGMMA_PACKED_X;
        else if ((n = targs(k->kernel, "wgmma_kernel", v, 8)) == 5 || (n = targs(k->kernel, "wgmma_oss_kernel", v, 8)) == 5)
            fam = 1, bit = 2, var = FM_VARIANT_WGMMA_NATURAL_X;
        if (fam >= 0 && strstr(k->kernel, "_oss_")) bit <<= fam ? 2 : 3;
        size_t limit = 48 * 1024, dyn = 0;
        if (fam >= 0) {
            t.family = fam ? FM_FAMILY_FP4MOE_WGMMA : FM_FAMILY_FP4MOE_MMA;
            t.warps = v[0], t.mt = v[1], t.nt = v[2], t.kc = v[3], t.stages = v[4];
            int row = fam ? fm_wgmma_tile_index(&t) : fm_mma_tile_index(&t);
            if (row < 0 || row >= 64) {
                printf("FAIL %s %s: no catalogue row has these arguments\n", k->target, k->kernel);
                bad++;
                continue;
            }
            unsigned mask = fam ? fm_build_wgmma_targets[row] : fm_build_mma_targets[row];
            if (!(mask & (1u << ti))) {
                printf("FAIL %s %s: row %d compiled for a target its table entry does not list\n", k->target,
                       k->kernel, row);
                bad++;
            }
            seen[ti][fam][row] |= (unsigned)bit;
            bad += check_bounds(k, fam ? &wg[row] : &sw[row], var);
            fm_smem_breakdown bd;
            assert_int_equal(fam ? fm_smem_wgmma(&t, &bd) : fm_smem_mma(&t, &bd), FM_OK);
            dyn = bd.total;
            limit = tg.smem_optin;
        }
        if ((size_t)k->smem + dyn > limit) {
            printf("FAIL %s %s: %d B static + %zu B planned dynamic > %zu B\n", k->target, k->kernel, k->smem, dyn,
                   limit);
            bad++;
        }
        if (k->spst || k->spld) {
            int ok = 0;
            for (int b = 0; b < g_nbase; b++)
                if (!strcmp(g_base[b].target, k->target) && !strcmp(g_base[b].kernel, k->kernel))
                    ok = k->spst <= g_base[b].spst && k->spld <= g_base[b].spld;
            if (!ok) {
                printf("FAIL %s %s: spills %d B stored / %d B loaded, not in tests/kernel_spills.csv (or more)\n",
                       k->target, k->kernel, k->spst, k->spld);
                bad++;
            }
        }
        checked++;
    }
    for (int ti = 0; ti < fm_build_n_targets; ti++) {
        if (strncmp(fm_build_target_names[ti], "sm_", 3)) continue; /* PTX: no report */
        for (int fam = 0; fam < 2; fam++) {
            int n = fam ? fm_build_n_wgmma : fm_build_n_mma;
            for (int r = 0; r < n && r < 64; r++) {
                unsigned mask = fam ? fm_build_wgmma_targets[r] : fm_build_mma_targets[r];
                if (!(mask & (1u << ti))) continue;
                unsigned want = fam ? (wg[r].persist ? 1u : 3u) : (fm_mma_tile_has_mb(&sw[r]) ? 7u : 5u);
                want |= want << (fam ? 2 : 3); /* and their gpt-oss twins */
                if (seen[ti][fam][r] != want) { /* every kernel of the row, and no other */
                    printf("FAIL %s: %s row %d has kernels 0x%x of 0x%x compiled\n", fm_build_target_names[ti],
                           fam ? "wgmma" : "mma", r, seen[ti][fam][r], want);
                    bad++;
                }
            }
        }
    }
    printf("%d kernel x target rows checked, %d failures\n", checked, bad);
    assert_int_equal(bad, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_resources)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
