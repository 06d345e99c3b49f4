/* report.c - the simulator's results as text, a sweep table, CSV and JSON.
 *
 * CSV and JSON carry the same fields under the same names (the fm_sim_result
 * members), so a script can switch between them; the text forms are for people
 * and may change.  JSON is built with cJSON so strings are escaped correctly.
 */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "fm_internal.h"
#include "sim_internal.h"

static const char *k_hist_names[FM_SIM_HIST] = {"0", "1", "2-3", "4-7", "8-15", "16-31", "32-63", "64-127", "128+"};

static const char *fmt_name(fm_format f)
{
    const fm_format_traits *t = fm_format_traits_get(f);
    return t ? t->name : "?";
}

static fm_status io_result(FILE *f)
{
    return ferror(f) ? fm_fail(FM_ERR_IO, "simulate: writing the report failed") : FM_OK;
}

fm_status fm_sim_write_text(FILE *f, const fm_sim_config *c, const fm_sim_result *r, const fm_sim_crossings *x)
{
    fm_clear_error();
    if (!f || !c || !r) return fm_fail(FM_ERR_INVALID_ARG, "fm_sim_write_text: NULL argument");
    const fm_sim_model *m = &c->model;
    fprintf(f, "model      %s: %d experts, top-%d, hidden %d, intermediate %d, %d MoE layers, %d shared, %s\n",
            m->name, m->n_experts, m->top_k, m->hidden, m->inter, m->moe_layers, m->shared_experts,
            fmt_name(m->wfmt));
    fprintf(f, "cluster    %d x %s, %s; per GPU %d experts, FC1 N=%d K=%d, FC2 N=%d K=%d\n", c->gpus,
            c->gpu.name ? c->gpu.name : "?", c->parallel == FM_PARALLEL_EP ? "EP" : "TP", r->local_experts, r->fc1_n,
            r->fc1_k, r->fc2_n, r->fc2_k);
    fprintf(f, "serving    %d requests x %d tokens/step = %d tokens/step, %d decode steps/round, ", r->max_running,
            c->tokens_per_step, r->tokens, c->decode_steps);
    if (c->skew > 0)
        fprintf(f, "Zipf skew %g (seed %llu)\n", c->skew, (unsigned long long)c->seed);
    else
        fprintf(f, "uniform routing\n");
    fprintf(f, "tile       %d rows x %d x %d (%s, %s kernel)\n\n", r->tile_m, r->tile_n, r->tile_k,
            r->tile_from_planner ? "the planner's pick" : (c->tile_m ? "--tile-m" : "default: no planner family for this GPU"),
            c->kernel == FM_SIM_KERNEL_FP4MOE ? "fp4moe swap-AB" : "CUTLASS");
    fprintf(f, "rows/expert  %.2f per local expert, %.2f per active expert; %.1f of %d experts active (GPU %d)\n",
            r->rows_per_expert, r->rows_per_active, r->active_experts, r->local_experts, r->straggler);
    fprintf(f, "active rows  p50 %d, p90 %d, p99 %d\n", r->rows_p50, r->rows_p90, r->rows_p99);
    fprintf(f, "histogram   ");
    for (int i = 0; i < FM_SIM_HIST; i++) fprintf(f, " %s:%.1f%%", k_hist_names[i], 100 * r->hist[i]);
    fprintf(f, "\ntile waste   %.1f %% of issued tile rows are padding\n", 100 * r->waste);
    fprintf(f, "routed GEMM  weights %.1f MB, activations %.2f MB; %.2f GFLOP useful, %.2f issued\n", r->weight_mb,
            r->act_mb, r->gflop_useful, r->gflop_issued);
    fprintf(f, "roofline     memory %.1f us, compute %.1f us: %s-bound (tensor rate %.0f TFLOP/s)\n", r->mem_us,
            r->compute_us, r->bound == FM_SIM_COMPUTE_BOUND ? "compute" : "bandwidth", r->peak_tflops);
    fprintf(f, "predicted    FC1 %.1f us + FC2 %.1f us (%s) + shared %.1f us = %.1f us per layer%s; imbalance %.2f\n",
            r->fc1_us, r->fc2_us, r->measured ? "measured" : "roofline", r->shared_us, r->layer_us,
            r->mc ? " (Monte-Carlo max over GPUs)" : "", r->imbalance);
    fprintf(f, "efficiency   %.1f TFLOP/s useful = %.2f %% of the tensor rate; %.0f %% of listed bandwidth\n", r->tflops,
            100 * r->efficiency, 100 * r->bw_util);
    fprintf(f, "decode step  %d MoE layers: %.3f ms; ceiling %.0f tokens/s (MoE part only)\n", m->moe_layers,
            r->step_us / 1e3, r->tokens_per_s);
    if (x) {
        static const int rows[4] = {8, 16, 32, 64};
        fprintf(f, "crossings   ");
        for (int i = 0; i < 4; i++) {
            if (x->rows_at[i])
                fprintf(f, " %d rows/active at %d requests;", rows[i], x->rows_at[i]);
            else
                fprintf(f, " %d rows/active not reached;", rows[i]);
        }
        if (x->compute_bound_at)
            fprintf(f, " compute-bound from %d requests\n", x->compute_bound_at);
        else
            fprintf(f, " bandwidth-bound throughout\n");
    }
    return io_result(f);
}

fm_status fm_sim_write_sweep_text(FILE *f, const fm_sim_result *r, int n)
{
    fm_clear_error();
    if (!f || !r || n < 0) return fm_fail(FM_ERR_INVALID_ARG, "fm_sim_write_sweep_text: NULL argument");
    /* column legend: requests, tokens/step, active experts on the slowest GPU,
     * rows per active expert and its p90, tile waste, predicted FC1/FC2/layer us,
     * roofline bound, useful TFLOP/s, % of tensor rate, MoE-only tokens/s ceiling */
    fprintf(f, "%8s %7s %7s %8s %5s %6s %9s %9s %9s %5s %8s %6s %10s\n", "requests", "tokens", "active", "rows/act",
            "p90", "waste%", "fc1_us", "fc2_us", "layer_us", "bound", "TFLOP/s", "eff%", "tokens/s");
    for (int i = 0; i < n; i++)
        fprintf(f, "%8d %7d %7.1f %8.2f %5d %6.1f %9.1f %9.1f %9.1f %5s %8.1f %6.2f %10.0f\n", r[i].max_running,
                r[i].tokens, r[i].active_experts, r[i].rows_per_active, r[i].rows_p90, 100 * r[i].waste, r[i].fc1_us,
                r[i].fc2_us, r[i].layer_us, r[i].bound == FM_SIM_COMPUTE_BOUND ? "comp" : "bw", r[i].tflops,
                100 * r[i].efficiency, r[i].tokens_per_s);
    return io_result(f);
}

/* One table drives both CSV and JSON: name, int or double member. */
typedef struct {
    const char *name;
    size_t      off;
    int         is_int;
} field;
#define FI(m) {#m, offsetof(fm_sim_result, m), 1}
#define FD(m) {#m, offsetof(fm_sim_result, m), 0}
static const field k_fields[] = {
    FI(max_running),    FI(tokens),       FI(local_experts), FI(fc1_n),        FI(fc1_k),     FI(fc2_n),
    FI(fc2_k),          FI(tile_m),       FI(tile_n),        FI(tile_k),       FI(tile_from_planner),
    FI(straggler),      FD(rows_per_expert), FD(rows_per_active), FD(active_experts), FI(rows_p50),
    FI(rows_p90),       FI(rows_p99),     FD(waste),         FD(weight_mb),    FD(act_mb),    FD(gflop_useful),
    FD(gflop_issued),   FD(mem_us),       FD(compute_us),    FD(peak_tflops),  FD(fc1_us),    FD(fc2_us),
    FD(shared_us),      FD(layer_us),     FD(imbalance),     FI(measured),     FI(mc),        FD(tflops),
    FD(efficiency),     FD(bw_util),      FD(step_us),       FD(tokens_per_s),
};

static double field_value(const fm_sim_result *r, const field *fd)
{
    const char *p = (const char *)r + fd->off;
    if (fd->is_int) {
        int v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    double d;
    memcpy(&d, p, sizeof d);
    return d;
}

fm_status fm_sim_write_csv(FILE *f, const fm_sim_result *r, int n)
{
    fm_clear_error();
    if (!f || !r || n < 0) return fm_fail(FM_ERR_INVALID_ARG, "fm_sim_write_csv: NULL argument");
    for (size_t j = 0; j < FM_ARRAY_LEN(k_fields); j++) fprintf(f, "%s,", k_fields[j].name);
    fprintf(f, "bound");
    for (int i = 0; i < FM_SIM_HIST; i++) fprintf(f, ",hist_%s", k_hist_names[i]);
    fprintf(f, "\n");
    for (int i = 0; i < n; i++) {
        for (size_t j = 0; j < FM_ARRAY_LEN(k_fields); j++) {
            double v = field_value(&r[i], &k_fields[j]);
            if (k_fields[j].is_int)
                fprintf(f, "%d,", (int)v);
            else
                fprintf(f, "%.6g,", v);
        }
        fprintf(f, "%s", r[i].bound == FM_SIM_COMPUTE_BOUND ? "compute" : "bandwidth");
        for (int h = 0; h < FM_SIM_HIST; h++) fprintf(f, ",%.6g", r[i].hist[h]);
        fprintf(f, "\n");
    }
    return io_result(f);
}

static cJSON *config_json(const fm_sim_config *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *m = cJSON_AddObjectToObject(o, "model");
    cJSON_AddStringToObject(m, "name", c->model.name);
    cJSON_AddNumberToObject(m, "experts", c->model.n_experts);
    cJSON_AddNumberToObject(m, "top_k", c->model.top_k);
    cJSON_AddNumberToObject(m, "hidden", c->model.hidden);
    cJSON_AddNumberToObject(m, "intermediate", c->model.inter);
    cJSON_AddNumberToObject(m, "moe_layers", c->model.moe_layers);
    cJSON_AddNumberToObject(m, "shared_experts", c->model.shared_experts);
    cJSON_AddNumberToObject(m, "shared_intermediate", c->model.shared_inter);
    cJSON_AddStringToObject(m, "format", fmt_name(c->model.wfmt));
    cJSON *g = cJSON_AddObjectToObject(o, "gpu");
    cJSON_AddStringToObject(g, "name", c->gpu.name ? c->gpu.name : "");
    cJSON_AddNumberToObject(g, "mem_gbs", c->gpu.mem_gbs);
    cJSON_AddNumberToObject(g, "bf16_tflops", c->gpu.bf16_tflops);
    cJSON_AddNumberToObject(g, "fp4_tflops", c->gpu.fp4_tflops);
    cJSON_AddStringToObject(o, "kernel", c->kernel == FM_SIM_KERNEL_FP4MOE ? "fp4moe" : "cutlass");
    cJSON_AddNumberToObject(o, "gpus", c->gpus);
    cJSON_AddStringToObject(o, "parallel", c->parallel == FM_PARALLEL_EP ? "ep" : "tp");
    cJSON_AddNumberToObject(o, "tokens_per_step", c->tokens_per_step);
    cJSON_AddNumberToObject(o, "accepted", c->accepted > 0 ? c->accepted : c->tokens_per_step);
    cJSON_AddNumberToObject(o, "decode_steps", c->decode_steps);
    cJSON_AddNumberToObject(o, "round_us", c->round_us);
    cJSON_AddNumberToObject(o, "skew", c->skew);
    cJSON_AddNumberToObject(o, "seed", (double)c->seed);
    cJSON_AddNumberToObject(o, "mc_steps", c->mc_steps);
    cJSON_AddNumberToObject(o, "bw_eff", c->bw_eff);
    cJSON_AddNumberToObject(o, "compute_eff", c->compute_eff);
    cJSON_AddNumberToObject(o, "launch_us", c->launch_us);
    cJSON_AddBoolToObject(o, "measured_table", c->measured != NULL);
    return o;
}

fm_status fm_sim_write_json(FILE *f, const fm_sim_config *c, const fm_sim_result *r, int n,
                            const fm_sim_crossings *x)
{
    fm_clear_error();
    if (!f || !c || !r || n < 0) return fm_fail(FM_ERR_INVALID_ARG, "fm_sim_write_json: NULL argument");
    cJSON *root = cJSON_CreateObject();
    if (!root) return fm_fail(FM_ERR_OOM, "fm_sim_write_json: no memory");
    cJSON_AddItemToObject(root, "config", config_json(c));
    cJSON *pts = cJSON_AddArrayToObject(root, "points");
    for (int i = 0; i < n; i++) {
        cJSON *p = cJSON_CreateObject();
        for (size_t j = 0; j < FM_ARRAY_LEN(k_fields); j++)
            cJSON_AddNumberToObject(p, k_fields[j].name, field_value(&r[i], &k_fields[j]));
        cJSON_AddStringToObject(p, "bound", r[i].bound == FM_SIM_COMPUTE_BOUND ? "compute" : "bandwidth");
        cJSON *h = cJSON_AddObjectToObject(p, "hist");
        for (int b = 0; b < FM_SIM_HIST; b++) cJSON_AddNumberToObject(h, k_hist_names[b], r[i].hist[b]);
        cJSON_AddItemToArray(pts, p);
    }
    if (x) {
        cJSON *xo = cJSON_AddObjectToObject(root, "crossings");
        cJSON_AddNumberToObject(xo, "rows_8", x->rows_at[0]);
        cJSON_AddNumberToObject(xo, "rows_16", x->rows_at[1]);
        cJSON_AddNumberToObject(xo, "rows_32", x->rows_at[2]);
        cJSON_AddNumberToObject(xo, "rows_64", x->rows_at[3]);
        cJSON_AddNumberToObject(xo, "compute_bound", x->compute_bound_at);
    }
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    if (!s) return fm_fail(FM_ERR_OOM, "fm_sim_write_json: no memory");
    fprintf(f, "%s\n", s);
    cJSON_free(s);
    return io_result(f);
}
