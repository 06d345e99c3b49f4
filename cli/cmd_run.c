/* cmd_run.c - `fp4moe run`: the main job.
 *
 * Builds a MoE layer (GLM-5 EP8 shard by default: 32 experts, top-8, hidden 6144,
 * intermediate 2048, NVFP4), quantizes random Gaussian weights (sigma 1/sqrt(K), as
 * trained layers roughly are), runs it on the best backend present (CUDA when a GPU
 * is visible, else the fast CPU path), and with --check compares it against the CPU
 * reference on the same input. Prints time (median of --iters), the bytes the layer
 * must read (active experts' weights and scales + activations, each once), the
 * achieved bandwidth, and the error. On the cuda backend the layer runs as an
 * engine calls it (run_cuda.c: device x, ids and weights, fm_layer_run on a
 * stream of its own), eager and replayed from a captured CUDA graph, both timed.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "flags.h" /* FM_FLAGS_GO */
#include "fm_file.h" /* fm_file_out: --output checked before the run */
#include "run_cuda.h"
#include "run_flags.h"
#include "run_model.h"
#include "run_report.h"

/* The planner's plan of T's bucket with what ps names replaced, set on the layer. */
static fm_status apply_plan(fm_layer *layer, int T, const fm_run_plan_spec *ps)
{
    fm_layer_plan_info pi;
    fm_status          st = fm_layer_plan(layer, T, &pi);
    if (st != FM_OK) return st;
    for (int g = 0; g < 2; g++) {
        if (!ps->have[g]) continue;
        pi.tile[g] = ps->tile[g], pi.k_splits[g] = ps->ks[g], pi.feature_blocks[g] = 1;
        pi.x_packed[g] = ps->tile[g].family == FM_FAMILY_FP4MOE_WGMMA;
    }
    if (ps->list >= 0) pi.work_list = ps->list;
    if (ps->list_n) pi.active_experts = ps->list_n;
    /* the spec names the chain's kernels: the chain runs the bucket (a bucket on the decode
     * kernel, --decode on, would keep them for the chain and never run them) */
    pi.decode = 0;
    return fm_layer_set_plan(layer, T, &pi);
}

/* External routing as an engine would give it: the router's logits (the CPU's
 * summation order) and fm_moe_route, ids/weights [T][top_k]. */
static fm_status host_routing(const fm_moe_config *c, const fm_moe_weights *w, const uint16_t *x, int T, int32_t *ids,
                              float *wts)
{
    const int E = c->n_experts, H = c->hidden;
    float    *logits = malloc(sizeof(float) * (size_t)T * E);
    if (!logits) return FM_ERR_OOM;
    for (long i = 0; i < (long)T * E; i++) {
        const uint16_t *xt = x + (size_t)(i / E) * H;
        const float    *we = w->router_w + (size_t)(i % E) * H;
        float           part[8] = {0};
        for (int k = 0; k < H; k++) part[k % 8] += fm_bf16_decode(xt[k]) * we[k];
        logits[i] = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    }
    fm_status s = fm_moe_route(c, w->router_bias, logits, T, ids, wts);
    free(logits);
    return s;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Error bound of a backend against the reference (NMSE), from docs/accuracy.md:
 * the CPU paths differ from the reference only in FP32 accumulation order; the
 * CUDA path rounds the SwiGLU output to BF16 before FC2 (as every BF16 tensor-core
 * MoE kernel does), which costs ~2^-9 relative per element. With NVFP4
 * activations an accumulation-order difference can flip one E2M1 rounding step
 * of an activation, so the bound is that of activation quantization itself. */
static double nmse_bound(fm_backend_kind k, const fm_moe_config *cfg)
{
    double b = 0.0;
    (void)fm_layer_accuracy(k, cfg, &b); /* the layer's backend: never AUTO here */
    return b;
}

/* One run: the options, the layer and its buffers, and what the report prints. */
typedef struct {
    fm_run_cli        cl;
    fm_run_model      m;
    int               built;  /* m built: fm_run_model_free */
    fm_moe_weights    sw;     /* the shard's view of m's weights: its experts; the router stays global */
    fm_cuda_device   *dev;    /* cuda: ordinal 0, opened here */
    fm_layer_desc     desc;
    fm_layer         *layer;
    fm_layer_run_args run;    /* external routing: x, ids/weights, out (host pointers) */
    float            *out, *ref, *wts;
    int32_t          *ids;
    double           *ms;     /* --iters times */
    fm_run_report     rep;
} run_state;

/* Refusals before any work (no GPU, an --output that cannot be written), then the
 * layer's weights and input; FM_FLAGS_GO or the exit code. */
static int run_model(run_state *rs)
{
    const fm_run_opts *o = &rs->cl.o;
    /* Say "no GPU" before spending seconds on quantizing weights. */
    fm_status s = fm_backend_available(o->backend);
    if (s != FM_OK) return fm_cli_fail("run", s);
    /* and refuse an --output path that is a link, FIFO, device or read-only file before
     * the run, not after it (fm_file.h's rule; checked again when the output is written) */
    if (o->output_path) {
        fm_file_out probe;
        if ((s = fm_file_out_begin(o->output_path, &probe)) != FM_OK) return fm_cli_fail("run", s);
        fm_file_out_abort(&probe);
    }
    fm_run_model *m = &rs->m;
    s = fm_run_model_build(o, m);
    if (s != FM_OK) { /* settings from flags that do not make a layer are usage errors; a bad checkpoint or
                       * --input file is not (exit 1 whatever is wrong with the file, with or without --weights) */
        int         rc0 = fm_cli_fail("run", s);
        const char *d = fm_last_error();
        /* routing the checkpoint does not say (src/io/load_routing.c's two messages end so); not
         * any message with "give" in it: a tensor's "data_offsets give N" bytes is a bad file */
        if (o->weights_path && d && (strstr(d, "; give it explicitly") || strstr(d, "; give them explicitly")))
            fprintf(stderr, "fp4moe run: the routing flags are --topk, --score, --renormalize, --routed-scale "
                            "and --groups/--topk-group\n");
        return !o->weights_path && !m->bad_input && (s == FM_ERR_INVALID_ARG || s == FM_ERR_BAD_SHAPE) ? FM_EXIT_USAGE
                                                                                                    : rc0;
    }
    rs->built = 1;
    const fm_run_shard *sh = &rs->cl.shard;
    if (sh->count && (long long)sh->first + sh->count > m->cfg.n_experts) {
        fprintf(stderr, "fp4moe run: --shard %d:%d is not a range of the layer's %d experts\n", sh->first, sh->count,
                m->cfg.n_experts);
        return FM_EXIT_USAGE;
    }
    return FM_FLAGS_GO;
}

/* The buffers, external routing, the device and the layer, then --plan / --tune /
 * --save-plans on it (before any timed run); FM_FLAGS_GO or the exit code. */
static int run_layer(run_state *rs)
{
    const fm_run_cli    *cl = &rs->cl;
    const fm_moe_config *cfg = &rs->m.cfg;
    const int            T = rs->m.tokens; /* --tokens, or the rows of --input */
    fm_status            s = FM_OK;
    rs->out = malloc((size_t)T * cfg->hidden * sizeof *rs->out);
    rs->ms = calloc((size_t)cl->o.iters, sizeof *rs->ms);
    rs->sw = rs->m.w;
    const int off = cl->shard.first - rs->m.first_held; /* with --global-experts m holds the shard's experts only */
    rs->sw.w13 += off, rs->sw.w2 += off;
    if (rs->sw.a1_scale) rs->sw.a1_scale += off;
    if (rs->sw.a2_scale) rs->sw.a2_scale += off;
    if (rs->sw.w13_up_global) rs->sw.w13_up_global += off;
    rs->desc = (fm_layer_desc){.backend = cl->o.backend, .max_tokens = T, .first_expert = cl->shard.first,
                               .n_local = cl->shard.count, .decode_work_list = cl->work_list,
                               .row_quantile = (float)cl->row_q, .plans = cl->plans_in, .decode_path = cl->decode,
                               .act_fp8_path = cl->fp8_path};
    rs->run = (fm_layer_run_args){.x = rs->m.x, .T = T, .out = rs->out};
    if (!rs->out || !rs->ms) {
        fprintf(stderr, "fp4moe run: out of host memory\n");
        return FM_EXIT_FAIL;
    }
    if (cl->external) {
        rs->ids = malloc(sizeof(int32_t) * (size_t)T * cfg->top_k);
        rs->wts = malloc(sizeof(float) * (size_t)T * cfg->top_k);
        if (!rs->ids || !rs->wts || (s = host_routing(cfg, &rs->m.w, rs->m.x, T, rs->ids, rs->wts)) != FM_OK)
            return fm_cli_fail("run", rs->ids && rs->wts ? s : FM_ERR_OOM);
        rs->run.topk_ids = rs->ids, rs->run.topk_weights = rs->wts;
    }
    fm_cli_progress("fp4moe run: preparing backend...\n");
    /* cold start, apart from making the random weights: opening the device (which learns the
     * kernels it has code for; a PTX build JIT-compiles here) and creating the layer */
    const int use_cuda = cl->o.backend == FM_BACKEND_CUDA ||
                         (cl->o.backend == FM_BACKEND_AUTO && fm_backend_available(FM_BACKEND_CUDA) == FM_OK);
    double t_start = fm_cli_now_ms();
    if (use_cuda) {
        if ((s = fm_cuda_device_open(0, &rs->dev)) != FM_OK) return fm_cli_fail("run", s);
        (void)fm_cuda_device_code(rs->dev, &rs->rep.code);
        rs->rep.have_code = 1;
        rs->rep.open_ms = fm_cli_now_ms() - t_start;
        rs->desc.backend = FM_BACKEND_CUDA, rs->desc.device = rs->dev;
    }
    t_start = fm_cli_now_ms();
    s = fm_layer_create_desc(&rs->desc, cfg, &rs->sw, &rs->layer);
    rs->rep.create_ms = fm_cli_now_ms() - t_start;
    if (s != FM_OK) return fm_cli_fail("run", s);
    fm_backend_kind bk = rs->rep.bk = fm_layer_backend(rs->layer);
    if ((cl->plan.given || cl->tune || cl->plans_out) && bk != FM_BACKEND_CUDA) {
        fprintf(stderr, "fp4moe run: %s applies to the cuda backend (%s); the %s backend has no tile plan\n",
                cl->plan.given ? "--plan" : cl->tune ? "--tune" : "--save-plans",
                cl->plan.given ? "fm_layer_set_plan" : cl->tune ? "fm_layer_tune" : "fm_layer_save_plans",
                fm_backend_name(bk));
        return FM_EXIT_USAGE;
    }
    if (cl->plan.given && (s = apply_plan(rs->layer, T, &cl->plan)) != FM_OK) /* before any run: nothing ran */
        return fm_cli_fail("run", s);
    if (*fm_layer_plans_note(rs->layer)) fprintf(stderr, "fp4moe run: %s\n", fm_layer_plans_note(rs->layer));
    if (cl->tune) { /* from the planner's plan, or --plan's */
        fm_cli_progress("fp4moe run: tuning the plan of %d tokens...\n", T);
        if ((s = fm_layer_tune(rs->layer, T, NULL, &rs->rep.tinfo)) != FM_OK) return fm_cli_fail("run", s);
    }
    if (cl->plans_out && (s = fm_layer_save_plans(rs->layer, cl->plans_out)) != FM_OK) /* nothing timed lost */
        return fm_cli_fail("run", s);
    return FM_FLAGS_GO;
}

/* One warm-up, then the timed repetitions: cuda through run_cuda.c (device x, ids and
 * weights, a stream of ours, eager + graph replay); the CPU backends with host
 * pointers (external routing through fm_layer_run), timed on the host clock. Then
 * --output, the median, the plan the run used, bytes and FLOPs. */
static int run_timed(run_state *rs)
{
    const fm_run_opts *o = &rs->cl.o;
    fm_run_report     *rep = &rs->rep;
    const int          T = rs->m.tokens, external = rs->cl.external;
    fm_status          s = FM_OK;
    fm_run_stats       st;
    if (rep->bk == FM_BACKEND_CUDA) {
        fm_cli_progress("fp4moe run: cuda, %d eager runs and %d graph replays...\n", o->iters, o->iters);
        fm_run_cuda_in ci = {.x = rs->m.x, .T = T, .hidden = rs->m.cfg.hidden, .top_k = rs->m.cfg.top_k,
                             .ids = rs->ids, .wts = rs->wts, .iters = o->iters};
        s = fm_run_cuda(rs->layer, 0, &ci, rs->out, &rep->ct);
        for (int i = 0; i < o->iters; i++) rs->ms[i] = rep->ct.eager_ms;
    }
    for (int i = -1; rep->bk != FM_BACKEND_CUDA && i < o->iters; i++) {
        if (i >= 0) fm_cli_progress("\rfp4moe run: %s iteration %d/%d", fm_backend_name(rep->bk), i + 1, o->iters);
        double t0 = fm_cli_now_ms();
        s = external ? fm_layer_run(rs->layer, &rs->run) : fm_layer_forward(rs->layer, rs->m.x, T, rs->out, &st);
        if (s != FM_OK) break;
        if (i >= 0) rs->ms[i] = external ? fm_cli_now_ms() - t0 : st.ms;
    }
    fm_cli_progress("\n");
    if (s != FM_OK) return fm_cli_fail("run", s);
    s = fm_run_write_output(o, &rs->m, rs->out); /* the backend's output of the last iteration */
    if (s != FM_OK) return fm_cli_fail("run", s);
    qsort(rs->ms, (size_t)o->iters, sizeof *rs->ms, cmp_double);
    rep->med = rs->ms[o->iters / 2];
    /* cuda: the plan of T's bucket (tiles, splits, layouts the run launched) */
    rep->have_plan = rep->bk == FM_BACKEND_CUDA && fm_layer_plan(rs->layer, T, &rep->pi) == FM_OK;
    if (rep->have_plan)
        for (int g = 0; g < 2; g++) fm_tile_name(&rep->pi.tile[g], rep->tn[g], sizeof rep->tn[g]);
    rep->bytes = fm_run_model_bytes(&rs->m, T);
    rep->flops = fm_run_model_flops(&rs->m, T);
    return FM_FLAGS_GO;
}

/* --check: the CPU reference of cfg (the numerics that ran) on the same input (holding the
 * same shard, given the same routing), NMSE and max |err| against nmse_bound; cuda: the graph
 * replay must equal the eager run. FM_EXIT_OK, FM_EXIT_MISMATCH, or a failure's exit code. */
static int run_check(run_state *rs, const fm_moe_config *cfg)
{
    fm_run_report       *rep = &rs->rep;
    const int            T = rs->m.tokens;
    const size_t         n_out = (size_t)T * cfg->hidden;
    fm_status            s;
    fm_cli_progress("fp4moe run: running the CPU reference for --check...\n");
    rs->ref = malloc(n_out * sizeof *rs->ref);
    if (!rs->ref) {
        fprintf(stderr, "fp4moe run: out of host memory\n");
        return FM_EXIT_FAIL;
    }
    if (rs->cl.shard.count || rs->cl.external) {
        fm_layer         *rl = NULL;
        fm_layer_desc     rd = rs->desc;
        fm_layer_run_args ra = rs->run;
        rd.backend = FM_BACKEND_CPU_REF, rd.device = NULL;
        ra.out = rs->ref;
        s = fm_layer_create_desc(&rd, cfg, &rs->sw, &rl);
        if (s == FM_OK) s = fm_layer_run(rl, &ra);
        fm_layer_destroy(rl);
    } else {
        s = fm_moe_forward_ref(cfg, &rs->m.w, rs->m.x, T, rs->ref);
    }
    if (s != FM_OK) return fm_cli_fail("run", s);
    double num = 0, den = 0;
    for (size_t i = 0; i < n_out; i++) {
        const float *out = rs->out, *ref = rs->ref;
        if (!isfinite(out[i]) && rep->bad < 0) rep->bad = (long)i;
        double d = (double)out[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
        if (fabs(d) > rep->maxabs) rep->maxabs = fabs(d);
    }
    rep->nmse = den > 0 ? num / den : num;
    int rc = rep->bad >= 0 || !(rep->nmse <= rep->bound) ? FM_EXIT_MISMATCH : FM_EXIT_OK;
    if (rep->bk == FM_BACKEND_CUDA && !rep->ct.graph_bitexact) rc = FM_EXIT_MISMATCH; /* replay must equal eager */
    return rc;
}

static void run_free(run_state *rs)
{
    free(rs->ids);
    free(rs->wts);
    fm_layer_destroy(rs->layer);
    fm_cuda_device_close(rs->dev); /* after its layer */
    if (rs->built) fm_run_model_free(&rs->m);
    free(rs->out);
    free(rs->ref);
    free(rs->ms);
}

int fm_cmd_run(int argc, char **argv)
{
    run_state rs;
    memset(&rs, 0, sizeof rs);
    int rc = fm_run_options(argc, argv, &rs.cl);
    if (rc != FM_FLAGS_GO) return rc;
    if ((rc = run_model(&rs)) == FM_FLAGS_GO && (rc = run_layer(&rs)) == FM_FLAGS_GO &&
        (rc = run_timed(&rs)) == FM_FLAGS_GO) {
        fm_run_report *rep = &rs.rep;
        rep->m = &rs.m, rep->cfg = &rs.m.cfg, rep->T = rs.m.tokens, rep->iters = rs.cl.o.iters;
        rep->shard_first = rs.cl.shard.first, rep->shard_count = rs.cl.shard.count;
        rep->external = rs.cl.external, rep->tune = rs.cl.tune, rep->check = rs.cl.o.check;
        /* the numerics that ran: a W4A8 layer's bucket that runs W4A16 (--fp8-path faster) is
         * checked against the layer without act_fp8 */
        fm_moe_config ran = rs.m.cfg;
        if (rep->have_plan && !rep->pi.act_fp8) ran.act_fp8 = FM_ACT_FP8_OFF;
        rep->nmse = -1, rep->bad = -1, rep->bound = nmse_bound(rep->bk, &ran);
        rc = rep->check ? run_check(&rs, &ran) : FM_EXIT_OK;
        rep->passed = rc == FM_EXIT_OK;
        if (rc == FM_EXIT_OK || rc == FM_EXIT_MISMATCH) (rs.cl.o.json ? fm_run_report_json : fm_run_report_text)(rep);
    }
    run_free(&rs);
    return rc;
}
