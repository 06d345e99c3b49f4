/* test_plan_cli.c - the exit-code contract of docs/cli.md for `plan`, `explain`
 * and the no-GPU paths, end to end through the binary ($FM_CLI, set by
 * tests/plan.cmake; skipped with 77 without it).  Each case is a review finding:
 *   - every bad flag value or combination is exit 2, on stderr a message naming the
 *     flag and the accepted values, and nothing on stdout (no half table);
 *   - numbers that overflow int ("--cluster 99999999999x1") or carry junk
 *     ("--cutlass 4.2x") are refused, not wrapped or truncated;
 *   - `explain --arch X --gpu Y` with different architectures is refused;
 *   - where `devices` finds no GPU or no CUDA backend (exit 3), `simulate --gpu
 *     local` and `run --backend cuda` exit 3 too (they used to exit 1 for
 *     FM_ERR_NO_BACKEND).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

static const char *g_cli;
static char g_err_path[64];

typedef struct {
    int  rc;
    char out[1 << 16], err[1 << 14];
} result;

/* Reads f to its end (so a long output never meets a closed pipe), keeping the first cap - 1 bytes. */
static size_t slurp(FILE *f, char *buf, size_t cap)
{
    size_t n = 0, got;
    char   sink[4096];
    while (n + 1 < cap && (got = fread(buf + n, 1, cap - 1 - n, f)) > 0) n += got;
    buf[n] = 0;
    while (fread(sink, 1, sizeof sink, f) > 0) {
    }
    return n;
}

/* Run `fp4moe <args>`: exit code, stdout and stderr separately. */
static void run(const char *args, result *r)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>'%s'", g_cli, args, g_err_path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    slurp(p, r->out, sizeof r->out);
    int rc = pclose(p);
    r->rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    FILE *e = fopen(g_err_path, "r");
    assert_non_null(e);
    slurp(e, r->err, sizeof r->err);
    fclose(e);
}

/* A usage error: exit 2, nothing on stdout, stderr names every one of `words`. */
static void expect_usage(const char *args, const char *const *words)
{
    static result r;
    run(args, &r);
    int ok = r.rc == 2 && !r.out[0];
    for (int i = 0; ok && words[i]; i++) ok = strstr(r.err, words[i]) != NULL;
    if (!ok) {
        print_error("fp4moe %s: exit %d (want 2)\nstdout: %.400s\nstderr: %.400s\n", args, r.rc, r.out, r.err);
        fail();
    }
}

#define USAGE(args, ...) expect_usage(args, (const char *const[]){__VA_ARGS__, NULL})

/* One run: its exit code, up to three strings stdout must hold and one it must not. */
typedef struct {
    const char *args;
    int         rc;
    const char *has[3];
    const char *lacks;
} cli_case;

static void expect_case(const cli_case *c)
{
    static result r;
    run(c->args, &r);
    int ok = r.rc == c->rc;
    for (int w = 0; ok && w < 3 && c->has[w]; w++) ok = strstr(r.out, c->has[w]) != NULL;
    if (ok && c->lacks) ok = strstr(r.out, c->lacks) == NULL;
    if (!ok) {
        print_error("fp4moe %s: exit %d (want %d)\nstdout: %.600s\nstderr: %.400s\n", c->args, r.rc, c->rc, r.out,
                    r.err);
        fail();
    }
}

static void plan_bad_flags(void **s)
{
    (void)s;
    USAGE("plan --gpu h200 --format bf16 --k 100", "--k", "K=100", "64");
    USAGE("plan --gpu rtx-pro-6000 --format nvfp4 --k 1000", "--k", "K=1000", "128");
    USAGE("plan --gpu h200 --format void", "--format", "nvfp4", "bf16");
    USAGE("plan --gpu h200 --format fp32", "--format", "nvfp4", "'fp32'");
    USAGE("plan --gpu h200 --format foo", "--format", "nvfp4");
    USAGE("plan --gpu h200 --epilogue bar", "--epilogue", "finalize");
    USAGE("plan --gpu nonesuch", "--gpu", "h200");
    char a[128], k[32]; /* any odd K: every catalogue tile K is even */
    fm_rng rng;
    fm_rng_init(&rng, fm_test_seed());
    snprintf(k, sizeof k, "K=%ld", 2 * (long)(fm_rng_u64(&rng) % 500000) + 1);
    snprintf(a, sizeof a, "plan --gpu rtx-5090 --format mxfp4 --k %s", k + 2);
    USAGE(a, "--k", k);
    USAGE("plan --gpu b200 --format fp8", "--format", "fp8");
}

static void explain_bad_flags(void **s)
{
    (void)s;
    const char *t = "explain --arch sm120 --tile 128x128x128";
    char a[256];
#define EX(extra, ...) (snprintf(a, sizeof a, "%s %s", t, extra), USAGE(a, __VA_ARGS__))
    EX("--cutlass 4.2x", "--cutlass", "4.2 .. 4.9");
    EX("--cutlass '4.7 junk'", "--cutlass", "4.2 .. 4.9");
    EX("--cluster 99999999999x1", "--cluster", "[1, 16]");
    EX("--cluster 1x4294967297", "--cluster", "[1, 16]");
    EX("--cluster 2x1x", "--cluster");
    EX("--epilogue-tile 128x", "--epilogue-tile", "MxN", "auto");
    EX("--epilogue-tile 999x64", "--epilogue-tile", "[1, 256]");
    EX("--epilogue-tile 64x48", "EpilogueTile must evenly divide CTA tile"); /* sm120_builder.inl static_assert */
    EX("--format foo", "--format", "nvfp4", "mxfp4");
    EX("--a foo", "--a", "nvfp4");
    EX("--epilogue bar", "--epilogue", "tma", "nosmem", "finalize");
    EX("--schedule fast", "--schedule", "pingpong");
    EX("--family nope", "--family", "fp4moe-mma");
    EX("--gpu h200", "--arch", "--gpu");          /* sm_120 vs sm_90: which one? */
    EX("--gpu b200", "--arch", "--gpu");
#undef EX
    USAGE("explain --arch sm_42 --tile 128x128x128", "--arch", "sm_120");
    USAGE("explain --arch sm120 --tile 100x128x128x", "--tile", "MxNxK");
    USAGE("explain --arch sm120 --tile 99999999999x128x128", "--tile", "MxNxK");
    USAGE("explain --arch sm_90 --tile 128x128x128", "sm_90", "bf16"); /* nvfp4 on sm_90: no such kernel */
    USAGE("explain --arch sm120 --tile 128x128x128 --k 100", "K=100");
}

/* Flags one kind of kernel family reads are an error for the other kind, not
 * silently ignored (issue 15: `explain --warps` on a CUTLASS tile exited 0 with
 * the CUTLASS bytes; `--epilogue` on fp4moe-mma and `plan --launcher
 * --swap-ab` changed nothing either). */
static void family_specific_flags(void **s)
{
    (void)s;
    fm_rng rng;
    fm_rng_init(&rng, fm_test_seed());
    char a[256];
    static const char *const k_cutlass[] = {"sm120 --tile 128x128x128", "sm100 --tile 128x128x128",
                                            "sm90 --format bf16 --tile 128x128x64"};
    for (int i = 0; i < 3; i++) {
        snprintf(a, sizeof a, "explain --arch %s --warps %d", k_cutlass[i], 1 + (int)(fm_rng_u64(&rng) % 12));
        USAGE(a, "--warps applies to the fp4moe kernel families only");
    }
    static const char *const k_cutlass_only[] = {"--epilogue finalize", "--epilogue nosmem", "--swap-ab",
                                                 "--cutlass 4.5",      "--schedule coop",    "--c fp32",
                                                 "--d fp16",           "--epilogue-tile 128x64"};
    for (size_t i = 0; i < sizeof k_cutlass_only / sizeof *k_cutlass_only; i++) {
        const char *fl = k_cutlass_only[i];
        snprintf(a, sizeof a, "explain --arch sm90 --family fp4moe-mma --tile 8x64x128 %s", fl);
        char flag[32];
        snprintf(flag, sizeof flag, "%.*s", (int)strcspn(fl, " "), fl);
        USAGE(a, flag, "CUTLASS families only", "fp4moe-mma");
    }
    USAGE("plan --launcher --gpu h200 --swap-ab", "--swap-ab", "--launcher");
    USAGE("plan --launcher --gpu h200 --epilogue finalize", "--epilogue", "--launcher");
    USAGE("plan --launcher --gpu h200 --cutlass 4.7", "--cutlass", "--launcher");
    USAGE("plan --gpu rtx-pro-6000 --cutlass 9.9", "--cutlass", "9.9");
    /* and the flags where they apply still work (SM120 has no no-smem epilogue: truth-*.csv) */
    static const cli_case k_ok[] = {
        {"explain --arch sm90 --family fp4moe-mma --tile 8x64x128 --warps 4", 0, {"4 warps", NULL, NULL}, NULL},
        {"explain --arch sm90 --family fp4moe-mma --tile 8x64x128 --schedule auto", 0, {"fp4moe-mma", NULL, NULL},
         NULL},
        {"explain --arch sm120 --tile 128x128x128 --epilogue finalize --cutlass 4.5", 0, {"cutlass-sm120", NULL, NULL},
         NULL},
        {"plan --gpu rtx-pro-6000 --epilogue finalize --cutlass 4.7", 0, {"cutlass-sm120", NULL, NULL}, NULL},
    };
    for (size_t i = 0; i < sizeof k_ok / sizeof *k_ok; i++) expect_case(&k_ok[i]);
}

/* The same flags, well formed, still work (so the cases above fail for the flag). */
static void explain_good_flags(void **s)
{
    (void)s;
    static const char *const ok[] = {
        "explain --arch sm120 --tile 128x128x128 --cutlass 4.7",
        "explain --arch sm120 --tile 128x128x128 --cutlass 4.2.0 --cluster 1x1",
        "explain --arch sm_90 --gpu h200 --tile 128x128x64 --format bf16",
        "explain --arch sm_100 --gpu b200 --tile 256x128x256 --cluster 2x1 --json",
        "explain --arch sm_100 --tile 128x128x128 --epilogue-tile 128x64 --cutlass 4.2",
        "explain --arch sm_100 --tile 128x128x128 --epilogue-tile auto",
        "plan --gpu h200 --format bf16 --k 128",
    };
    static result r;
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        run(ok[i], &r);
        if ((r.rc != 0 && r.rc != 5) || !r.out[0]) {
            print_error("fp4moe %s: exit %d\nstderr: %.400s\n", ok[i], r.rc, r.err);
            fail();
        }
    }
}

/* `explain --w4a8`: the W4A8 GEMM's staged and wgmma kernels, each one's bytes against the arch's limit
 * (the numbers are FM_FP8S_* of fm_tile_layout.h, which the launcher expands too: 16 tokens,
 * 4 stages of 16 x 144 + 8 x 2 x 512 + 8 x 64 = 11,008 B, 44,032 B MXFP4; NVFP4's scales
 * 128 B a band); every staged kernel fits SM120's 101,376 B; sm_80 has no FP8 MMA (exit 5);
 * the flags it does not take and the formats it does not run are usage errors. */
static void explain_w4a8(void **s)
{
    (void)s;
    static const cli_case cases[] = {
        {"explain --w4a8 --arch sm_120 --format mxfp4", 0, {"staged16", "44032", "101376"}, "REJECTED"},
        {"explain --w4a8 --gpu rtx-pro-6000", 0, {"staged64", "55296", "verdict: FITS"}, NULL}, /* nvfp4 default */
        {"explain --w4a8 --arch sm_90 --format mxfp4 --json", 0, {"\"total_bytes\":\t53760", "\"fits\":\ttrue", NULL},
         NULL},
        /* the wgmma kernels: wg64 = 4 stages of 64 x 128 + 8 x 2 x 512 + 8 x 64 = 16,896 -> 17,408 B (1 KB) */
        {"explain --w4a8 --arch sm_90 --format mxfp4", 0, {"wg64", "69632", "verdict: FITS"}, "n/a"},
        {"explain --w4a8 --arch sm_120 --format mxfp4", 0, {"wg128", "n/a (sm_90a only)", "verdict: FITS"}, NULL},
        {"explain --w4a8 --arch sm_90", 0, {"wg32", "n/a (MXFP4 only)", "verdict: FITS"}, NULL},
        {"explain --w4a8 --arch sm_80", 5, {"no FP8 MMA", "verdict: REJECTED", NULL}, NULL},
        /* whether the staged / pipelined kernels' FP8 mma.sync is native (ctest sass_fp8_mma reads it) */
        {"explain --w4a8 --arch sm_90 --format mxfp4", 0, {"FP8 mma.sync on sm_90: lowered", "FP16 rate", NULL}, "native (QMMA)"},
        {"explain --w4a8 --arch sm_120 --format nvfp4", 0, {"FP8 mma.sync on sm_120: native (QMMA)", NULL, NULL}, "lowered"},
        {"explain --w4a8 --arch sm_90 --format mxfp4 --json", 0, {"\"fp8_mma_sync\":\t\"lowered\"", NULL, NULL}, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect_case(&cases[i]);
    USAGE("explain --w4a8 --arch sm_120 --tile 8x64x128", "--w4a8", "--tile");
    USAGE("explain --w4a8 --arch sm_120 --warps 4", "--w4a8", "--warps");
    USAGE("explain --w4a8 --arch sm_120 --format bf16", "nvfp4 or mxfp4", "bf16");
    USAGE("explain --w4a8", "--arch");
    USAGE("explain --w4a8 --arch sm_90 --gpu rtx-pro-6000", "different architectures");
}

/* fp4moe-wgmma: listed by `plan` on the H200 (next to fp4moe-mma), never on SM120;
 * `explain` checks it on sm_90 and refuses it elsewhere as a usage error. */
static void wgmma_family(void **s)
{
    (void)s;
    const cli_case cases[] = {
        {"plan --gpu h200", 0, {"\n  fp4moe-wgmma  ", "\n  fp4moe-mma ", NULL}, NULL},
        {"plan --gpu h200 --rows-per-expert 256 --json", 0, {"\"family\":\t\"fp4moe-wgmma\"", "wgmma_w8m", NULL}, NULL},
        {"plan --gpu rtx-pro-6000", 0, {"\n  fp4moe-mma ", NULL}, "\n  fp4moe-wgmma"},
        {"plan --gpu rtx-pro-6000 --json", 0, {"fp4moe-mma", NULL}, "fp4moe-wgmma"},
        {"explain --family fp4moe-wgmma --arch sm90 --tile 128x256x64", 0, {"fm_smem_wgmma", "8 warps", "FITS"}, NULL},
        {"explain --family fp4moe-wgmma --gpu h200 --tile 8x64x128 --warps 4 --json", 0,
         {"\"warps\":\t4", "\"total_bytes\":\t28736", NULL}, NULL},
        /* three consumer warpgroups: 8 stages x (12 x 2 x (512 + 64) + 32 x 128, on 1 KB) + 8 x 16 */
        {"explain --family fp4moe-wgmma --arch sm90 --tile 32x384x64 --warps 12", 0, {"147584", "12 warps", NULL},
         NULL},
        /* the persistent kernel: its output tile (256 tokens x (2 x 128 + 16) B) counted */
        {"explain --family fp4moe-wgmma --arch sm90 --tile 256x128x64 --persistent", 0,
         {"(persistent)", "221248", "output tile 69632"}, NULL},
        {"explain --family fp4moe-wgmma --arch sm90 --tile 256x128x64 --persistent --json", 0,
         {"\"persistent\":\ttrue", "\"epi_d_bytes\":\t69632", "\"total_bytes\":\t221248"}, NULL},
        {"explain --family fp4moe-wgmma --arch sm90 --tile 256x128x64 --json", 0,
         {"\"persistent\":\tfalse", "\"epi_d_bytes\":\t0", "\"total_bytes\":\t151616"}, NULL},
        {"plan --launcher --gpu h200 --packed-x --rows-per-expert 256 --n 6144 --k 256 --experts 256", 0,
         {"wgmma_w8m1n32k64s4p", "221248", NULL}, NULL},
        {"plan --gpu h200 --rows-per-expert 256 --n 6144 --k 256 --experts 256", 0, {"256x128x64/w8/p", "221248", NULL},
         NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect_case(&cases[i]);
    USAGE("explain --family fp4moe-wgmma --arch sm120 --tile 128x256x64", "needs wgmma (sm_90a)", "sm_120");
    USAGE("explain --family fp4moe-wgmma --arch sm_100 --tile 128x256x64", "needs wgmma (sm_90a)", "sm_100");
    USAGE("explain --family fp4moe-wgmma --arch sm90 --tile 8x64x128", "warps", "8x64x128/w4/s4"); /* default 8 warps */
    USAGE("explain --family fp4moe-wgmma --arch sm90 --tile 128x256x64 --stages 5", "not compiled in");
    USAGE("explain --family fp4moe-wgmma --arch sm90 --tile 256x128x64 --stages 6 --persistent", "not compiled in");
    USAGE("explain --family fp4moe-wgmma --arch sm90 --tile 32x384x64 --warps 6", "4, 8 or 12");
    USAGE("explain --family fp4moe-mma --arch sm90 --tile 8x64x256 --warps 12", "1..8");
    USAGE("explain --family fp4moe-wgmma --arch sm90 --tile 32x384x64 --warps 13", "--warps", "[1, 12]");
    USAGE("explain --family fp4moe-mma --arch sm90 --tile 8x64x256 --persistent", "no persistent kernel");
    USAGE("explain --arch sm120 --tile 128x128x128 --persistent", "persistent is fp4moe-wgmma's");
}

/* --launcher: fm_cuda_gemm's ranking (fm_plan_fp4moe): the decode pick on the H200, packed X only
 * wgmma, no wgmma on sm_120, SwiGLU pairs, the limit, and the usage errors. */
static void launcher_ranking(void **s)
{
    (void)s;
    const cli_case cases[] = {
        {"plan --launcher --gpu h200 --rows-per-expert 1", 0, {"\n     1 mma    mma_w4m2n1k256s3 ", "fm_cuda_gemm", NULL},
         NULL},
        {"plan --launcher --gpu h200 --packed-x --rows-per-expert 64 --json", 0, {"\"rank\":\t1", "wgmma_w8m", NULL},
         "\"mma_"},
        {"plan --launcher --gpu rtx-pro-6000 --swiglu --format mxfp4", 0, {"mma_w4m2", NULL}, "wgmma_"},
        {"plan --launcher --gpu h200 --smem-limit 30000 --n 512 --k 512", 0, {"mma_w8m1n1k64s4", NULL}, "w4m2n1k256s3"},
        {"plan --launcher --gpu h200 --smem-limit 1000", 5, {NULL}, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect_case(&cases[i]);
    USAGE("plan --launcher --gpu rtx-pro-6000 --packed-x", "--packed-x", "sm_120");
    USAGE("plan --launcher --gpu h200 --format fp8", "--launcher", "nvfp4");
    USAGE("plan --launcher --gpu h200 --n 100", "--n", "N=100");
    USAGE("plan --gpu h200 --swiglu", "--launcher");
    USAGE("plan --launcher --gpu h200 --feature-blocks -1", "--feature-blocks");
}

static void no_gpu_is_exit_3(void **s)
{
    (void)s;
    static result r;
    run("devices", &r);
    if (r.rc != 3) {
        printf("# a GPU is visible (devices exit %d): the no-GPU exit codes are not exercised here\n", r.rc);
        return;
    }
    run("simulate --gpu local", &r);
    if (r.rc != 3) {
        print_error("simulate --gpu local: exit %d (want 3)\nstderr: %.400s\n", r.rc, r.err);
        fail();
    }
    run("run --backend cuda --tokens 1", &r);
    if (r.rc != 3) {
        print_error("run --backend cuda: exit %d (want 3)\nstderr: %.400s\n", r.rc, r.err);
        fail();
    }
}

int main(void)
{
    g_cli = getenv("FM_CLI");
    if (!g_cli || access(g_cli, X_OK)) {
        printf("skipped: FM_CLI does not name the fp4moe binary\n");
        return 77;
    }
    snprintf(g_err_path, sizeof g_err_path, "/tmp/fp4moe-plan-cli-XXXXXX");
    int fd = mkstemp(g_err_path);
    if (fd < 0) return 1;
    close(fd);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(plan_bad_flags),
        cmocka_unit_test(explain_bad_flags),
        cmocka_unit_test(explain_good_flags),
        cmocka_unit_test(explain_w4a8),
        cmocka_unit_test(family_specific_flags),
        cmocka_unit_test(wgmma_family),
        cmocka_unit_test(launcher_ranking),
        cmocka_unit_test(no_gpu_is_exit_3),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    unlink(g_err_path);
    return rc;
}
