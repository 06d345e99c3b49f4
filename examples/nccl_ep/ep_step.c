/* examples/nccl_ep/ep_step.c - one rank's expert-parallel MoE step on NCCL EP:
 *
 *     ncclEpUpdateHandle -> ncclEpDispatch -> fm_layer_run_dispatched -> ncclEpCombine
 *
 * all on one stream, captured into one CUDA graph and replayed, for a GLM-5-shaped layer
 * (hidden 6144, inter 2048, 256 experts, top-8, NVFP4 weights; flags shrink it), then checked
 * against fp4moe's whole layer (every expert, one GPU) on the same tokens. docs/ep-nccl.md
 * says how to install, build and run it, and maps NCCL EP's buffers onto
 * fm_layer_dispatch_args field by field.
 *
 * One process per GPU, no MPI: rank 0 writes an ncclUniqueId into --id-file (written to a
 * temporary name, then renamed), the other ranks wait for the file and read it, every rank
 * calls ncclCommInitRank. (Why not ncclCommInitAll with a thread per GPU: NCCL EP's group and
 * handle calls are collectives that allocate symmetric memory, and NVIDIA's own tests run
 * one process per GPU; one process per GPU keeps each rank's stream, graph and CUDA context
 * its own, which is all a graph capture needs.) With --world 1 there is no file: NCCL EP
 * with a world of one rank (issue 35, item 4).
 *
 *   ep_step --rank R --world W --id-file F [--device D] [--tokens T] [--mode ll|ht]
 *           [--hidden H] [--inter I] [--experts E] [--topk K] [--replays N] [--seed S]
 *           [--fp8] [--no-check]
 *
 * Modes (both with NCCL EP's expert-major layout; the rank-major and flat layouts carry
 * per-slot top-k lists instead of experts, which fm_layer_run_dispatched does not take):
 *   ll  low latency: x [n_local][W * T][H] BF16 with expert_counters[n_local] (dispatch
 *       time) -> FM_DISPATCH_EXPERT_MAJOR, capacity = W * T; the combine applies the routing
 *       weights (ncclEpCombineOutputs_t.topk_weights), so fp4moe gets weights = NULL.
 *   ht  high throughput: x [S][H] BF16 (S = max_recv_tokens_per_rank = W * T * min(K,
 *       n_local)), expert_offsets[n_local] and recv_total_counter[1] (handle time) written
 *       into one int32 array of n_local + 1 -> FM_DISPATCH_EXPERT_ROWS offsets; the caller
 *       applies the routing weights before the combine, so fp4moe gets dispatch's per-slot
 *       topk_weights [S] as weights.
 *   --fp8 (ll only): NCCL EP's DS_FP8E3M4 recipe (E4M3 rows, FP32 scale per 128) ->
 *       x_fp8 / x_scales. fp4moe's cuda backend runs W4A8 layers but refuses their dispatched
 *       rows today, so this stops at the first fm_layer_run_dispatched with fp4moe's message;
 *       the mapping is written out for when it does not.
 *
 * Not run yet: compiled and linked on a machine without a GPU (docs/ep-nccl.md).
 */
#define _POSIX_C_SOURCE 200809L

#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nccl.h>
#include <nccl_ep.h>

#include "fp4moe.h"

/* ---- errors: every call checked, the first failure ends the rank ------------------------ */
static int        g_rank = 0;
static ncclComm_t g_comm; /* the rank's communicator (ncclCommInitRank) */

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "[rank %d] %s:%d: %s: %s\n", g_rank, __FILE__, __LINE__, #call,        \
                    cudaGetErrorString(e_));                                                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
/* NCCL and NCCL EP both return ncclResult_t */
#define NK(call)                                                                                   \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess) {                                                                   \
            fprintf(stderr, "[rank %d] %s:%d: %s: %s (%s)\n", g_rank, __FILE__, __LINE__, #call,   \
                    ncclGetErrorString(r_), ncclGetLastError(NULL));                               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
#define FK(call)                                                                                   \
    do {                                                                                           \
        fm_status s_ = (call);                                                                     \
        if (s_ != FM_OK) {                                                                         \
            fprintf(stderr, "[rank %d] %s:%d: %s: %s: %s\n", g_rank, __FILE__, __LINE__, #call,    \
                    fm_status_name(s_), fm_last_error());                                          \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "[rank %d] out of host memory (%zu bytes)\n", g_rank, n);
        exit(1);
    }
    return p;
}

/* ---- small helpers: RNG, BF16 -------------------------------------------------------------- */
static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double uniform01(uint64_t *s) { return (double)(splitmix(s) >> 11) * 0x1.0p-53; }
static float normal01(uint64_t *s)
{
    double u = uniform01(s), v = uniform01(s);
    return (float)(sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v));
}
static uint16_t f2bf(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u); /* round to nearest even (inputs here are finite) */
    return (uint16_t)(u >> 16);
}
static float bf2f(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- options -------------------------------------------------------------------------------- */
typedef struct {
    int         rank, world, device;
    const char *id_file;
    int         T, H, I, E, K;
    int         ll; /* 1: low latency, 0: high throughput */
    int         fp8;
    int         replays;
    uint64_t    seed;
    int         check;
} opts;

static void usage(void)
{
    fprintf(stderr,
            "usage: ep_step --rank R --world W --id-file F [--device D] [--tokens T] [--mode ll|ht]\n"
            "               [--hidden H] [--inter I] [--experts E] [--topk K] [--replays N] [--seed S]\n"
            "               [--fp8] [--no-check]\n"
            "  one process per GPU; rank 0 writes the NCCL unique id to F (use a fresh path per launch),\n"
            "  the others read it. Defaults: GLM-5 (H 6144, I 2048, E 256, K 8), T 8 tokens per rank,\n"
            "  mode ll, device = rank modulo the visible GPUs, 100 replays, seed 1.\n");
    exit(2);
}

static int int_arg(const char *s)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < 0 || v > 1 << 30) usage();
    return (int)v;
}

static opts parse(int argc, char **argv)
{
    opts o = {.rank = 0, .world = 1, .device = -1, .T = 8, .H = 6144, .I = 2048, .E = 256, .K = 8,
              .ll = 1, .replays = 100, .seed = 1, .check = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--fp8")) { o.fp8 = 1; continue; }
        if (!strcmp(a, "--no-check")) { o.check = 0; continue; }
        if (!v) usage();
        i++;
        if (!strcmp(a, "--rank")) o.rank = int_arg(v);
        else if (!strcmp(a, "--world")) o.world = int_arg(v);
        else if (!strcmp(a, "--id-file")) o.id_file = v;
        else if (!strcmp(a, "--device")) o.device = int_arg(v);
        else if (!strcmp(a, "--tokens")) o.T = int_arg(v);
        else if (!strcmp(a, "--hidden")) o.H = int_arg(v);
        else if (!strcmp(a, "--inter")) o.I = int_arg(v);
        else if (!strcmp(a, "--experts")) o.E = int_arg(v);
        else if (!strcmp(a, "--topk")) o.K = int_arg(v);
        else if (!strcmp(a, "--replays")) o.replays = int_arg(v);
        else if (!strcmp(a, "--seed")) o.seed = (uint64_t)int_arg(v);
        else if (!strcmp(a, "--mode")) {
            if (!strcmp(v, "ll")) o.ll = 1;
            else if (!strcmp(v, "ht")) o.ll = 0;
            else usage();
        } else usage();
    }
    if (o.world < 1 || o.rank >= o.world || (o.world > 1 && !o.id_file) || o.T < 1 || o.K < 1 ||
        o.K > o.E || o.E % o.world || o.replays < 1) usage();
    /* 16-byte rows for NCCL EP (HT: max_token_bytes a multiple of 16) and fp4moe; the FP8
     * recipe wants H % 512 (its payload aligned), fp4moe's scales are per 128 */
    if (o.H % 128 || o.I % 128 || (o.fp8 && (o.H % 512 || !o.ll))) {
        fprintf(stderr, "ep_step: --hidden and --inter must be multiples of 128; --fp8 needs --mode ll and "
                        "--hidden a multiple of 512\n");
        exit(2);
    }
    return o;
}

/* ---- bootstrap: the unique id through a file ------------------------------------------------ */
static ncclUniqueId exchange_id(const opts *o)
{
    ncclUniqueId id;
    if (o->rank == 0) {
        NK(ncclGetUniqueId(&id));
        if (o->world == 1) return id;
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp.%ld", o->id_file, (long)getpid());
        FILE *f = fopen(tmp, "wb");
        if (!f || fwrite(&id, sizeof id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, o->id_file) != 0) {
            fprintf(stderr, "[rank 0] cannot write %s: %s\n", o->id_file, strerror(errno));
            exit(1);
        }
        return id;
    }
    for (int waited_ms = 0;; waited_ms += 50) { /* rank 0 renames the whole file into place */
        FILE *f = fopen(o->id_file, "rb");
        if (f) {
            size_t got = fread(&id, sizeof id, 1, f);
            fclose(f);
            if (got == 1) return id;
        }
        if (waited_ms > 300000) {
            fprintf(stderr, "[rank %d] no id in %s after 300 s\n", o->rank, o->id_file);
            exit(1);
        }
        nanosleep(&(struct timespec){.tv_nsec = 50 * 1000 * 1000}, NULL);
    }
}

/* ---- weights: random NVFP4 experts through fp4moe's public API ------------------------------
 * One FP32 matrix per kind (w13 [2I][H], w2 [H][I]) drawn N(0, 1/K) and quantized once with
 * fm_quantize; expert e's packed bytes are those XOR a stream seeded by (seed, e), so that
 * every expert differs (any byte is two valid E2M1 codes) while the block scales and the
 * global scale, which fm_quantize made valid, are shared. Expert e's weights depend only on
 * (seed, e): the shard of rank r and the whole layer of the check hold the same experts. */
typedef struct {
    fm_qtensor base13, base2;
    size_t     db13, sb13, db2, sb2;
} wbase;

static void make_base(fm_qtensor *q, int N, int K, uint64_t seed, size_t *db, size_t *sb)
{
    FK(fm_qtensor_bytes(FM_FORMAT_NVFP4, N, K, db, sb));
    *q = (fm_qtensor){.fmt = FM_FORMAT_NVFP4, .rows = N, .cols = K, .data = xmalloc(*db), .scales = xmalloc(*sb)};
    float   *src = xmalloc(sizeof(float) * (size_t)N * K);
    uint64_t s = seed;
    float    sd = 1.0f / sqrtf((float)K);
    for (size_t i = 0; i < (size_t)N * K; i++) src[i] = sd * normal01(&s);
    FK(fm_quantize(src, NULL, q));
    free(src);
}

static void expert_tensor(const fm_qtensor *base, size_t db, size_t sb, uint64_t seed, fm_qtensor *out)
{
    *out = *base;
    out->data = xmalloc(db);
    out->scales = xmalloc(sb);
    memcpy(out->scales, base->scales, sb);
    const uint8_t *src = base->data;
    uint8_t       *dst = out->data;
    uint64_t       s = seed;
    size_t         i = 0;
    for (; i + 8 <= db; i += 8) {
        uint64_t r = splitmix(&s), v;
        memcpy(&v, src + i, 8);
        v ^= r;
        memcpy(dst + i, &v, 8);
    }
    for (; i < db; i++) dst[i] = src[i] ^ (uint8_t)splitmix(&s);
}

/* Host weights of experts [first, first + n): w13 / w2 arrays and a zero router (the router
 * is not run: routing is external here, and the dispatched run never routes). */
static fm_moe_weights make_weights(const wbase *b, const opts *o, int first, int n)
{
    fm_qtensor *w13 = xmalloc(sizeof *w13 * (size_t)n), *w2 = xmalloc(sizeof *w2 * (size_t)n);
    for (int i = 0; i < n; i++) {
        uint64_t e = (uint64_t)(first + i);
        expert_tensor(&b->base13, b->db13, b->sb13, o->seed * 0x1000003ull + 2 * e + 11, &w13[i]);
        expert_tensor(&b->base2, b->db2, b->sb2, o->seed * 0x1000003ull + 2 * e + 12, &w2[i]);
    }
    float *router = xmalloc(sizeof(float) * (size_t)o->E * o->H);
    memset(router, 0, sizeof(float) * (size_t)o->E * o->H);
    return (fm_moe_weights){.router_w = router, .w13 = w13, .w2 = w2};
}

static void free_weights(fm_moe_weights *w, int n)
{
    for (int i = 0; i < n; i++) {
        free(w->w13[i].data), free(w->w13[i].scales);
        free(w->w2[i].data), free(w->w2[i].scales);
    }
    free((void *)w->w13), free((void *)w->w2), free((void *)w->router_w);
}

static fm_moe_config make_cfg(const opts *o)
{
    fm_moe_config c;
    fm_moe_config_default(&c); /* GLM-5's routing settings; unused with external routing */
    c.n_experts = o->E;        /* global experts; a shard is chosen in fm_layer_desc */
    c.top_k = o->K;
    c.hidden = o->H;
    c.inter = o->I;
    c.shared_inter = 0; /* the dispatched run has no shared expert: an engine runs it apart */
    c.wfmt = FM_FORMAT_NVFP4;
    c.act_fp8 = o->fp8 ? FM_ACT_FP8_BLOCK128 : FM_ACT_FP8_OFF;
    return c;
}

/* ---- the step ------------------------------------------------------------------------------- */
/* An NCCL EP tensor descriptor over a device pointer; its sizes array lives beside it. */
typedef struct {
    ncclEpTensor_t t;
    size_t         sizes[3];
} tensor;

static void tensor_set(tensor *x, void *data, ncclDataType_t dt, unsigned ndim, size_t d0, size_t d1, size_t d2)
{
    x->t = NCCL_EP_TENSOR_INIT;
    x->sizes[0] = d0, x->sizes[1] = d1, x->sizes[2] = d2;
    x->t.ndim = ndim;
    x->t.datatype = dt;
    x->t.data = data;
    x->t.sizes = x->sizes;
}

typedef struct {
    const opts    *o;
    int            n_local, cap, slots; /* cap: LL row slots per expert; slots: HT rows */
    cudaStream_t   st;
    ncclEpGroup_t  group;
    ncclEpHandle_t handle;
    fm_layer      *layer;
    /* the rank's tokens and routing (inputs of the step) */
    uint16_t *x;     /* [T][H] BF16 */
    int32_t  *ids;   /* [T][K] global expert ids */
    float    *w;     /* [T][K] routing weights */
    /* dispatch's outputs = fp4moe's inputs; fp4moe's output = combine's input */
    void     *recv;        /* LL [n_local][cap][H], HT [slots][H]; BF16, or E4M3 with --fp8 */
    float    *recv_scales; /* --fp8: [n_local][cap][H / 128] FP32 */
    float    *recv_w;      /* HT: [slots] routing weight of each received row */
    int32_t  *counts;      /* [n_local] LL: rows of each local expert; HT: (padded) counts */
    int32_t  *offs;        /* HT: [n_local + 1]: expert_offsets then recv_total_counter */
    uint16_t *expert_out;  /* same layout as recv, BF16 */
    uint16_t *out;         /* [T][H] BF16, the combined output in token order */
    tensor    t_x, t_ids, t_w, t_recv, t_recv_scales, t_recv_w, t_counts, t_offs, t_total, t_eo, t_out;
    ncclEpLayoutInfo_t      li;
    ncclEpDispatchInputs_t  din;
    ncclEpDispatchOutputs_t dout;
    ncclEpDispatchConfig_t  dcfg;
    ncclEpCombineInputs_t   cin;
    ncclEpCombineOutputs_t  cout;
    fm_layer_dispatch_args  fa;
} step;

static void *dalloc(size_t bytes)
{
    void *p;
    CK(cudaMalloc(&p, bytes ? bytes : 1));
    CK(cudaMemset(p, 0, bytes ? bytes : 1));
    return p;
}

static void step_setup(step *s, const opts *o, fm_cuda_device *dev)
{
    const int    W = o->world, T = o->T, H = o->H, K = o->K;
    const size_t Hs = (size_t)H;
    s->o = o;
    s->n_local = o->E / W;
    s->cap = W * T;                                          /* LL: num_ranks x max_dispatch_tokens_per_rank */
    s->slots = W * T * (K < s->n_local ? K : s->n_local);    /* HT: a token may reach min(K, n_local) experts here */
    CK(cudaStreamCreateWithFlags(&s->st, cudaStreamNonBlocking));

    /* fp4moe: this rank's expert shard; BF16 output (the combine's input dtype) */
    fm_moe_config  cfg = make_cfg(o);
    wbase         *b = xmalloc(sizeof *b);
    make_base(&b->base13, 2 * o->I, H, o->seed * 7 + 1, &b->db13, &b->sb13);
    make_base(&b->base2, H, o->I, o->seed * 7 + 2, &b->db2, &b->sb2);
    int            first = o->rank * s->n_local;
    fm_moe_weights wt = make_weights(b, o, first, s->n_local);
    fm_layer_desc  d = {.backend = FM_BACKEND_CUDA, .device = dev, .max_tokens = W * T, .out_dtype = FM_OUT_BF16,
                        .first_expert = first, .n_local = s->n_local};
    FK(fm_layer_create_desc(&d, &cfg, &wt, &s->layer)); /* --fp8: a W4A8 layer (its dispatched rows: FM_CUDA_W4A8_DISPATCH, on by default) */
    free_weights(&wt, s->n_local);
    free(b->base13.data), free(b->base13.scales), free(b->base2.data), free(b->base2.scales), free(b);

    /* NCCL EP group and handle (control path: may allocate and be collective; before any capture) */
    ncclEpGroupConfig_t gc = NCCL_EP_GROUP_CONFIG_INIT;
    gc.algorithm = o->ll ? NCCL_EP_ALGO_LOW_LATENCY : NCCL_EP_ALGO_HIGH_THROUGHPUT;
    gc.num_experts = (unsigned)o->E;
    gc.max_dispatch_tokens_per_rank = (unsigned)T;
    /* HT: static sizing (required for graph capture of dispatch); LL: sized by the library */
    gc.max_recv_tokens_per_rank = o->ll ? NCCL_EP_AUTO : (unsigned)s->slots;
    gc.max_token_bytes = (unsigned)(Hs * 2); /* BF16 rows both ways; FP8 rows + scales are smaller */
    gc.rdma_buffer_size = NCCL_EP_AUTO;
    gc.num_qp_per_rank = NCCL_EP_AUTO;
    gc.num_channels = NCCL_EP_AUTO;
    gc.max_num_sms = NCCL_EP_AUTO;
    /* the handle's num_topk (K) is checked against it. nccl_ep.h says HT may pass -1 to the
     * handle, but NCCL EP 2.30.7 with the expert-major layout refuses that ("HT mode requires
     * num_topk > 0", H100, 2026-12-07), so both modes pass K to both */
    gc.num_topk = (unsigned)K;
    NK(ncclEpCreateGroup(&s->group, g_comm, &gc));
    ncclEpHandleConfig_t hc = NCCL_EP_HANDLE_CONFIG_INIT;
    hc.dispatch_output_per_expert_alignment = 1; /* HT: no padding between experts' rows */
    NK(ncclEpInitHandle(&s->handle, s->group, NCCL_EP_LAYOUT_EXPERT_MAJOR, &hc, K, NULL));

    /* buffers, all caller-owned (NCCL EP writes into tensors it is given) */
    s->x = dalloc(sizeof(uint16_t) * T * Hs);
    s->ids = dalloc(sizeof(int32_t) * T * K);
    s->w = dalloc(sizeof(float) * T * K);
    s->out = dalloc(sizeof(uint16_t) * T * Hs);
    s->counts = dalloc(sizeof(int32_t) * s->n_local);
    size_t rows = o->ll ? (size_t)s->n_local * s->cap : (size_t)s->slots;
    s->recv = dalloc((o->fp8 ? 1 : 2) * rows * Hs);
    s->expert_out = dalloc(sizeof(uint16_t) * rows * Hs);
    tensor_set(&s->t_x, s->x, ncclBfloat16, 2, T, Hs, 0);
    tensor_set(&s->t_ids, s->ids, ncclInt32, 2, T, K, 0);
    tensor_set(&s->t_w, s->w, ncclFloat32, 2, T, K, 0);
    tensor_set(&s->t_out, s->out, ncclBfloat16, 2, T, Hs, 0);
    tensor_set(&s->t_counts, s->counts, ncclInt32, 1, s->n_local, 0, 0);

    s->li = NCCL_EP_LAYOUT_INFO_INIT;
    s->din = NCCL_EP_DISPATCH_INPUTS_INIT;
    s->dout = NCCL_EP_DISPATCH_OUTPUTS_INIT;
    s->dcfg = NCCL_EP_DISPATCH_CONFIG_INIT;
    s->cin = NCCL_EP_COMBINE_INPUTS_INIT;
    s->cout = NCCL_EP_COMBINE_OUTPUTS_INIT;
    s->din.tokens = &s->t_x.t;
    s->dout.tokens = &s->t_recv.t;
    s->cin.tokens = &s->t_eo.t;
    s->cout.tokens = &s->t_out.t;
    s->li.expert_counters = &s->t_counts.t;
    s->fa = (fm_layer_dispatch_args){.out = s->expert_out, .stream = s->st};

    if (o->ll) {
        /* LL expert-major: dispatch writes [n_local][W*T][H] and, at dispatch time, the
         * per-expert counts; the combine multiplies by the routing weights on the receive side */
        tensor_set(&s->t_recv, s->recv, o->fp8 ? ncclFloat8e4m3 : ncclBfloat16, 3, s->n_local, s->cap, Hs);
        tensor_set(&s->t_eo, s->expert_out, ncclBfloat16, 3, s->n_local, s->cap, Hs);
        s->cout.topk_weights = &s->t_w.t;
        s->fa.layout = FM_DISPATCH_EXPERT_MAJOR;
        s->fa.counts = s->counts;
        s->fa.capacity = s->cap;
        s->fa.weights = NULL; /* NCCL EP LL's combine applies them */
        if (o->fp8) {
            /* DS_FP8E3M4: E4M3 rows and FP32 scales, one per 128 channels, token-major
             * [n_local][cap][H/128]; the scale is the dequantization multiplier (row = q x
             * scale), fp4moe's x_scales convention */
            s->recv_scales = dalloc(sizeof(float) * rows * (Hs / 128));
            tensor_set(&s->t_recv_scales, s->recv_scales, ncclFloat32, 3, s->n_local, s->cap, Hs / 128);
            s->dout.scales = &s->t_recv_scales.t;
            s->dcfg.quant_recipe = NCCL_EP_DISP_QUANT_DS_FP8E3M4;
            s->fa.x_fp8 = s->recv;
            s->fa.x_scales = s->recv_scales;
        } else {
            s->fa.x = s->recv;
        }
    } else {
        /* HT expert-major: dispatch writes [slots][H], each local expert's rows contiguous from
         * expert_offsets[e] (exclusive prefix sum), recv_total_counter = their end, and one
         * routing weight per row; the caller applies the weights before the combine.
         * offs = [expert_offsets[0..n_local) | recv_total_counter]: fp4moe's offsets[n_local+1]. */
        s->offs = dalloc(sizeof(int32_t) * (s->n_local + 1));
        s->recv_w = dalloc(sizeof(float) * s->slots);
        tensor_set(&s->t_recv, s->recv, ncclBfloat16, 2, s->slots, Hs, 0);
        tensor_set(&s->t_eo, s->expert_out, ncclBfloat16, 2, s->slots, Hs, 0);
        tensor_set(&s->t_recv_w, s->recv_w, ncclFloat32, 1, s->slots, 0, 0);
        tensor_set(&s->t_offs, s->offs, ncclInt32, 1, s->n_local, 0, 0);
        tensor_set(&s->t_total, s->offs + s->n_local, ncclInt32, 1, 1, 0, 0);
        s->li.expert_offsets = &s->t_offs.t;
        s->li.recv_total_counter = &s->t_total.t;
        s->din.topk_weights = &s->t_w.t; /* HT forward: required */
        s->dout.topk_weights = &s->t_recv_w.t;
        s->fa.layout = FM_DISPATCH_EXPERT_ROWS;
        s->fa.x = s->recv;
        s->fa.offsets = s->offs;
        s->fa.weights = s->recv_w; /* HT: fp4moe's FC2 epilogue multiplies each row by its weight */
        s->fa.max_rows = s->slots; /* the rows recv holds: the plan of those rows' bucket */
    }
}

/* The step's four calls, on s->st: what the graph holds. */
static void step_enqueue(step *s, cudaEvent_t *ev /* NULL, or 4 events around the phases */)
{
    if (ev) CK(cudaEventRecord(ev[0], s->st));
    /* data path: the routing of this step (LL: layout info must be NULL here) */
    NK(ncclEpUpdateHandle(s->handle, &s->t_ids.t, s->o->ll ? NULL : &s->li, s->st));
    /* LL: the counts come with the dispatch; HT: they came with the handle update */
    NK(ncclEpDispatch(s->handle, &s->din, &s->dout, s->o->ll ? &s->li : NULL, &s->dcfg, s->st));
    if (ev) CK(cudaEventRecord(ev[1], s->st));
    FK(fm_layer_run_dispatched(s->layer, &s->fa));
    if (ev) CK(cudaEventRecord(ev[2], s->st));
    NK(ncclEpCombine(s->handle, &s->cin, &s->cout, NULL, s->st));
    if (ev) CK(cudaEventRecord(ev[3], s->st));
}

/* This rank's tokens: N(0,1) rows, K distinct random experts per token, weights > 0 summing to 1. */
static void make_tokens(const opts *o, uint16_t *x, int32_t *ids, float *w)
{
    uint64_t s = o->seed * 0x9E3779B1ull + 1000 + (uint64_t)o->rank;
    for (size_t i = 0; i < (size_t)o->T * o->H; i++) x[i] = f2bf(normal01(&s));
    int *perm = xmalloc(sizeof(int) * o->E);
    for (int t = 0; t < o->T; t++) {
        for (int e = 0; e < o->E; e++) perm[e] = e;
        float sum = 0;
        for (int j = 0; j < o->K; j++) { /* partial Fisher-Yates: K distinct experts */
            int r = j + (int)(splitmix(&s) % (uint64_t)(o->E - j));
            int tmp = perm[j];
            perm[j] = perm[r], perm[r] = tmp;
            ids[t * o->K + j] = perm[j];
            w[t * o->K + j] = 0.05f + (float)uniform01(&s);
            sum += w[t * o->K + j];
        }
        for (int j = 0; j < o->K; j++) w[t * o->K + j] /= sum;
    }
    free(perm);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv)
{
    opts o = parse(argc, argv);
    g_rank = o.rank;
#if defined(FM_NCCL_EP_HOME) && defined(FM_NCCL_HOME)
    /* libnccl_ep.so compiles some of its kernels at first use (nvcc) from the headers of both
     * wheels; nccl.ep's Python package points it at them the same way. The environment wins. */
    setenv("NCCL_EP_HOME", FM_NCCL_EP_HOME, 0);
    setenv("NCCL_HOME", FM_NCCL_HOME, 0);
#endif
    int ndev = 0;
    CK(cudaGetDeviceCount(&ndev));
    if (ndev < 1) {
        fprintf(stderr, "[rank %d] no CUDA device\n", o.rank);
        return 1;
    }
    int dev_ordinal = o.device >= 0 ? o.device : o.rank % ndev;
    CK(cudaSetDevice(dev_ordinal));
    int nccl_ver = 0, ep_ver = 0;
    NK(ncclGetVersion(&nccl_ver));
    NK(ncclEpGetVersion(&ep_ver));

    ncclUniqueId id = exchange_id(&o);
    NK(ncclCommInitRank(&g_comm, o.world, id, o.rank));
    if (o.rank == 0 && o.world > 1) unlink(o.id_file); /* every rank has read it: init is collective */

    fm_cuda_device *dev;
    FK(fm_cuda_device_open(dev_ordinal, &dev));
    step s;
    memset(&s, 0, sizeof s);
    step_setup(&s, &o, dev);
    if (o.rank == 0)
        printf("ep_step: world %d, mode %s%s, T %d tokens/rank, H %d, I %d, E %d (%d/rank), top-%d; NCCL %d, "
               "NCCL EP %d\n",
               o.world, o.ll ? "ll" : "ht", o.fp8 ? " fp8" : "", o.T, o.H, o.I, o.E, s.n_local, o.K, nccl_ver,
               ep_ver);

    /* inputs */
    const size_t TH = (size_t)o.T * o.H, TK = (size_t)o.T * o.K;
    uint16_t    *hx = xmalloc(2 * TH), *h_eager = xmalloc(2 * TH), *h_graph = xmalloc(2 * TH);
    int32_t     *hids = xmalloc(4 * TK);
    float       *hw = xmalloc(4 * TK);
    make_tokens(&o, hx, hids, hw);
    CK(cudaMemcpy(s.x, hx, 2 * TH, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(s.ids, hids, 4 * TK, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(s.w, hw, 4 * TK, cudaMemcpyHostToDevice));

    /* 1. eager: the first step also JIT-compiles and loads NCCL EP's kernels, outside any capture */
    step_enqueue(&s, NULL);
    fm_layer_error_info info;
    FK(fm_layer_errors(s.layer, s.st, &info)); /* synchronises; bad counts / offsets would show here */
    CK(cudaMemcpy(h_eager, s.out, 2 * TH, cudaMemcpyDeviceToHost));

    /* 2. eager phases timed (events between the calls): update + dispatch, fp4moe, combine */
    cudaEvent_t ev[4];
    for (int i = 0; i < 4; i++) CK(cudaEventCreate(&ev[i]));
    double *t_disp = xmalloc(sizeof(double) * o.replays), *t_fm = xmalloc(sizeof(double) * o.replays),
           *t_comb = xmalloc(sizeof(double) * o.replays), *t_graph = xmalloc(sizeof(double) * o.replays);
    for (int r = 0; r < o.replays; r++) {
        step_enqueue(&s, ev);
        CK(cudaEventSynchronize(ev[3]));
        float a, b, c;
        CK(cudaEventElapsedTime(&a, ev[0], ev[1]));
        CK(cudaEventElapsedTime(&b, ev[1], ev[2]));
        CK(cudaEventElapsedTime(&c, ev[2], ev[3]));
        t_disp[r] = a * 1e3, t_fm[r] = b * 1e3, t_comb[r] = c * 1e3;
    }

    /* 3. one CUDA graph of the whole step (relaxed mode: the capture refuses none of the
     * libraries' own calls on other streams or threads; all four calls are launches on s.st) */
    cudaGraph_t     graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(s.st, cudaStreamCaptureModeRelaxed));
    step_enqueue(&s, NULL);
    CK(cudaStreamEndCapture(s.st, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaMemsetAsync(s.out, 0, 2 * TH, s.st));
    for (int r = 0; r < 3; r++) CK(cudaGraphLaunch(exec, s.st)); /* warm-up */
    for (int r = 0; r < o.replays; r++) {
        CK(cudaEventRecord(ev[0], s.st));
        CK(cudaGraphLaunch(exec, s.st));
        CK(cudaEventRecord(ev[1], s.st));
        CK(cudaEventSynchronize(ev[1]));
        float a;
        CK(cudaEventElapsedTime(&a, ev[0], ev[1]));
        t_graph[r] = a * 1e3;
    }
    FK(fm_layer_errors(s.layer, s.st, &info));
    CK(cudaMemcpy(h_graph, s.out, 2 * TH, cudaMemcpyDeviceToHost));
    /* informational: fp4moe's part is deterministic; whether NCCL EP's combine sums a token's
     * contributions in a fixed order is its own affair (the check below bounds the result) */
    int    replay_equal = !memcmp(h_eager, h_graph, 2 * TH);
    double m_graph = median(t_graph, o.replays), min_graph = t_graph[0]; /* sorted by median() */
    double m_disp = median(t_disp, o.replays), m_fm = median(t_fm, o.replays), m_comb = median(t_comb, o.replays);
    printf("[rank %d] graph replay %.1f us median (min %.1f) over %d; eager: update+dispatch %.1f, fp4moe %.1f, "
           "combine %.1f us (medians); replay output %s the eager step's\n",
           o.rank, m_graph, min_graph, o.replays, m_disp, m_fm, m_comb,
           replay_equal ? "equals, bit for bit," : "differs from");

    /* 4. the check: every rank's tokens, routing and EP output gathered (rank 0 uses them),
     * the whole layer (every expert) run by fp4moe on rank 0's GPU on the same tokens */
    int fail = 0;
    if (o.check) {
        const int W = o.world;
        uint16_t *g_x = dalloc(2 * TH * W), *g_out = dalloc(2 * TH * W);
        int32_t  *g_ids = dalloc(4 * TK * W);
        float    *g_w = dalloc(4 * TK * W);
        NK(ncclGroupStart());
        NK(ncclAllGather(s.x, g_x, TH, ncclBfloat16, g_comm, s.st));
        NK(ncclAllGather(s.out, g_out, TH, ncclBfloat16, g_comm, s.st));
        NK(ncclAllGather(s.ids, g_ids, TK, ncclInt32, g_comm, s.st));
        NK(ncclAllGather(s.w, g_w, TK, ncclFloat32, g_comm, s.st));
        NK(ncclGroupEnd());
        CK(cudaStreamSynchronize(s.st));
        int *d_fail = dalloc(sizeof(int));
        if (o.rank == 0) {
            fm_moe_config cfg = make_cfg(&o);
            wbase        *b = xmalloc(sizeof *b);
            make_base(&b->base13, 2 * o.I, o.H, o.seed * 7 + 1, &b->db13, &b->sb13);
            make_base(&b->base2, o.H, o.I, o.seed * 7 + 2, &b->db2, &b->sb2);
            fm_moe_weights wt = make_weights(b, &o, 0, o.E);
            fm_layer      *whole;
            fm_layer_desc  d = {.backend = FM_BACKEND_CUDA, .device = dev, .max_tokens = W * o.T};
            FK(fm_layer_create_desc(&d, &cfg, &wt, &whole));
            free_weights(&wt, o.E);
            free(b->base13.data), free(b->base13.scales), free(b->base2.data), free(b->base2.scales), free(b);
            float             *ref = dalloc(sizeof(float) * TH * W);
            fm_layer_run_args  ra = {.x = g_x, .T = W * o.T, .topk_ids = g_ids, .topk_weights = g_w, .out = ref,
                                     .stream = s.st};
            FK(fm_layer_run(whole, &ra));
            FK(fm_layer_errors(whole, s.st, NULL));
            float    *h_ref = xmalloc(sizeof(float) * TH * W);
            uint16_t *h_ep = xmalloc(2 * TH * W);
            CK(cudaMemcpy(h_ref, ref, sizeof(float) * TH * W, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(h_ep, g_out, 2 * TH * W, cudaMemcpyDeviceToHost));
            double num = 0, den = 0;
            int    nonfinite = 0;
            for (size_t i = 0; i < TH * W; i++) {
                double e = bf2f(h_ep[i]), r = h_ref[i];
                if (!isfinite(e)) nonfinite++;
                num += (e - r) * (e - r);
                den += r * r;
            }
            double nmse = den > 0 ? num / den : INFINITY, bound;
            FK(fm_layer_accuracy(FM_BACKEND_CUDA, &cfg, &bound));
            int ok = !nonfinite && nmse <= bound;
            printf("ep_step: check: EP output of %d tokens (BF16, combined) against fp4moe's whole layer on one GPU "
                   "(FP32): NMSE %.3e, bound %.1e (cuda backend, docs/accuracy.md)%s: %s\n",
                   W * o.T, nmse, bound, nonfinite ? ", non-finite outputs" : "", ok ? "PASS" : "FAIL");
            fail |= !ok;
            CK(cudaMemcpy(d_fail, &fail, sizeof(int), cudaMemcpyHostToDevice));
            free(h_ref), free(h_ep);
            CK(cudaFree(ref));
            fm_layer_destroy(whole);
        }
        NK(ncclBroadcast(d_fail, d_fail, 1, ncclInt32, 0, g_comm, s.st)); /* one verdict for all ranks */
        int any;
        CK(cudaMemcpyAsync(&any, d_fail, sizeof(int), cudaMemcpyDeviceToHost, s.st));
        CK(cudaStreamSynchronize(s.st));
        fail |= any;
        void *gb[] = {d_fail, g_x, g_out, g_ids, g_w};
        for (size_t i = 0; i < sizeof gb / sizeof *gb; i++) CK(cudaFree(gb[i]));
    }

    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    for (int i = 0; i < 4; i++) CK(cudaEventDestroy(ev[i]));
    NK(ncclEpHandleDestroy(s.handle));
    NK(ncclEpGroupDestroy(s.group));
    fm_layer_destroy(s.layer);
    void *bufs[] = {s.x, s.ids, s.w, s.recv, s.recv_scales, s.recv_w, s.counts, s.offs, s.expert_out, s.out};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]) CK(cudaFree(bufs[i]));
    CK(cudaStreamDestroy(s.st));
    NK(ncclCommDestroy(g_comm));
    fm_cuda_device_close(dev);
    free(hx), free(h_eager), free(h_graph), free(hids), free(hw);
    free(t_disp), free(t_fm), free(t_comb), free(t_graph);
    return fail ? 1 : 0;
}
