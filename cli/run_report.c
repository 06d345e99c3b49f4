/* run_report.c - `fp4moe run`'s report of one run: the text lines, or the JSON
 * document with --json (fields pinned by tests/run_cli.sh and docs/cli.md). */
#include "run_report.h"

#include <cjson/cJSON.h>
#include <stdio.h>

#include "cli.h"

/* cuda: the plan of T's bucket (fm_layer_plan_info) and what --tune did */
static void json_plan(cJSON *j, const fm_run_report *r)
{
    const fm_layer_plan_info *pi = &r->pi;
    cJSON                    *pj = cJSON_AddObjectToObject(j, "plan");
    cJSON_AddNumberToObject(pj, "bucket_tokens", pi->bucket_tokens);
    cJSON_AddNumberToObject(pj, "expected_rows", pi->expected_rows);
    cJSON_AddNumberToObject(pj, "active_experts", pi->active_experts);
    cJSON_AddBoolToObject(pj, "work_list", pi->work_list);
    cJSON_AddBoolToObject(pj, "decode", pi->decode);
    cJSON_AddBoolToObject(pj, "act_fp8", pi->act_fp8);
    if (pi->decode) {
        cJSON_AddNumberToObject(pj, "decode_ctas", pi->decode_ctas);
        cJSON_AddStringToObject(pj, "decode_units", pi->decode_counter ? "counter" : "strides");
        cJSON *dk = cJSON_AddArrayToObject(pj, "decode_k_splits");
        for (int g = 0; g < 2; g++) cJSON_AddItemToArray(dk, cJSON_CreateNumber(pi->decode_k_splits[g]));
    }
    if (pi->decode_note[0]) cJSON_AddStringToObject(pj, "decode_note", pi->decode_note);
    if (r->tune) {
        cJSON *tj = cJSON_AddObjectToObject(j, "tune");
        cJSON_AddNumberToObject(tj, "plans_tried", r->tinfo.plans_tried);
        cJSON_AddNumberToObject(tj, "plans_refused", r->tinfo.plans_refused);
        cJSON_AddNumberToObject(tj, "before_us", r->tinfo.before_us);
        cJSON_AddNumberToObject(tj, "after_us", r->tinfo.after_us);
        cJSON_AddBoolToObject(tj, "changed", r->tinfo.changed);
    }
    const char *gn[2] = {"fc1", "fc2"};
    for (int g = 0; g < 2; g++) {
        cJSON *gj = cJSON_AddObjectToObject(pj, gn[g]);
        cJSON_AddStringToObject(gj, "tile", r->tn[g]);
        cJSON_AddNumberToObject(gj, "k_splits", pi->k_splits[g]);
        cJSON_AddBoolToObject(gj, "x_packed", pi->x_packed[g]);
        cJSON_AddNumberToObject(gj, "feature_blocks", pi->feature_blocks[g]);
    }
}

void fm_run_report_json(const fm_run_report *r)
{
    const fm_moe_config *cfg = r->cfg;
    const int            cuda = r->bk == FM_BACKEND_CUDA;
    cJSON               *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "backend", fm_backend_name(r->bk));
    cJSON_AddNumberToObject(j, "device_open_ms", r->open_ms);
    cJSON_AddNumberToObject(j, "layer_create_ms", r->create_ms);
    if (r->have_code) {
        cJSON_AddStringToObject(j, "code_target", r->code.running);
        cJSON_AddBoolToObject(j, "jit", r->code.jit);
    }
    cJSON_AddStringToObject(j, "format", fm_format_traits_get(cfg->wfmt)->name);
    cJSON_AddNumberToObject(j, "experts", cfg->n_experts);
    cJSON_AddNumberToObject(j, "top_k", cfg->top_k);
    cJSON_AddNumberToObject(j, "hidden", cfg->hidden);
    cJSON_AddNumberToObject(j, "inter", cfg->inter);
    cJSON_AddNumberToObject(j, "tokens", r->T);
    cJSON_AddNumberToObject(j, "active_experts", r->m->active_experts);
    cJSON_AddNumberToObject(j, "shard_first", r->shard_first);
    cJSON_AddNumberToObject(j, "shard_count", r->shard_count ? r->shard_count : cfg->n_experts - r->shard_first);
    cJSON_AddStringToObject(j, "routing", r->external ? "external" : "internal");
    /* device: fm_layer_run on device buffers and a stream (cuda); host: host pointers (CPU backends) */
    cJSON_AddStringToObject(j, "path", cuda ? "device" : "host");
    cJSON_AddNumberToObject(j, "time_ms", r->med);
    cJSON_AddNumberToObject(j, "eager_ms", r->med);
    if (cuda) {
        cJSON_AddNumberToObject(j, "graph_ms", r->ct.graph_ms);
        cJSON_AddNumberToObject(j, "graph_gbps", r->bytes / (r->ct.graph_ms * 1e6));
        cJSON_AddBoolToObject(j, "graph_matches_eager", r->ct.graph_bitexact);
        if (r->have_plan) json_plan(j, r);
    } else {
        cJSON_AddNullToObject(j, "graph_ms");
    }
    cJSON_AddNumberToObject(j, "bytes", r->bytes);
    cJSON_AddNumberToObject(j, "gbps", r->bytes / (r->med * 1e6));
    cJSON_AddNumberToObject(j, "tflops", r->flops / (r->med * 1e9));
    if (r->check) {
        cJSON_AddNumberToObject(j, "nmse", r->nmse);
        cJSON_AddNumberToObject(j, "max_abs_err", r->maxabs);
        cJSON_AddNumberToObject(j, "nmse_bound", r->bound);
        cJSON_AddBoolToObject(j, "check_passed", r->passed);
    }
    fm_cli_print_json(j);
}

/* cuda: startup, the device path, eager and graph times, the plan and the tune */
static void text_cuda(const fm_run_report *r)
{
    const fm_layer_plan_info *pi = &r->pi;
    printf("  startup          device open %.1f ms (code %s%s), layer create %.1f ms\n", r->open_ms, r->code.running,
           r->code.jit ? ", PTX JIT-compiled at open" : ", SASS", r->create_ms);
    printf("  path             device: fm_layer_run on device x%s, a stream of its own\n",
           r->external ? ", ids and weights" : "");
    printf("  time (median)    %.3f ms eager, %.3f ms CUDA graph replay, over %d iterations each\n", r->med,
           r->ct.graph_ms, r->iters);
    printf("  graph replay     %s the eager output bit for bit\n", r->ct.graph_bitexact ? "equals" : "DIFFERS from");
    if (r->have_plan)
        printf("  plan             bucket of %d token%s, tiles for %d row%s x %d experts%s: FC1 %s (K split %d%s), "
               "FC2 %s (K split %d%s)\n",
               pi->bucket_tokens, pi->bucket_tokens == 1 ? "" : "s", pi->expected_rows,
               pi->expected_rows == 1 ? "" : "s", pi->active_experts, pi->work_list ? ", work list" : "", r->tn[0],
               pi->k_splits[0], pi->x_packed[0] ? ", packed X" : "", r->tn[1], pi->k_splits[1],
               pi->x_packed[1] ? ", packed X" : "");
    if (r->have_plan && pi->act_fp8)
        printf("  W4A8             the bucket runs the W4A8 chain (FP8 activations); the tiles above are the W4A16\n"
               "                   chain's, unused here\n");
    if (r->have_plan && pi->decode)
        printf("  decode path      one launch (decode kernel): %d CTAs, K splits %d / %d, units %s, replacing the\n"
               "                   chain above\n",
               pi->decode_ctas, pi->decode_k_splits[0], pi->decode_k_splits[1],
               pi->decode_counter ? "from a counter" : "by strides");
    else if (r->have_plan)
        printf("  decode path      the chain (%s)\n",
               pi->decode_note[0] ? pi->decode_note : "--decode on would run the one-launch decode kernel");
    if (r->tune)
        printf("  tune             %d plans tried (%d refused): %.1f -> %.1f us per graph replay "
               "(synthetic routing), %s\n",
               r->tinfo.plans_tried, r->tinfo.plans_refused, r->tinfo.before_us, r->tinfo.after_us,
               r->tinfo.changed ? "a faster plan kept" : "the plan kept (none >= 3 % faster)");
}

void fm_run_report_text(const fm_run_report *r)
{
    const fm_moe_config *cfg = r->cfg;
    const int            T = r->T, first = r->shard_first, count = r->shard_count;
    printf("fp4moe run: %s backend, %s weights, %d experts (top-%d), hidden %d, inter %d, %d token%s%s\n",
           fm_backend_name(r->bk), fm_format_traits_get(cfg->wfmt)->name, cfg->n_experts, cfg->top_k, cfg->hidden,
           cfg->inter, T, T == 1 ? "" : "s",
           cfg->act_nvfp4 ? ", NVFP4 activations"
           : cfg->act_fp8 == FM_ACT_FP8_TOKEN ? ", FP8 activations (per token)"
           : cfg->act_fp8 ? ", FP8 activations (per 128)" : "");
    printf("  active experts   %d of %d%s\n", r->m->active_experts, count ? count : cfg->n_experts,
           count ? " held" : "");
    if (count || r->external)
        printf("  shard / routing  experts [%d, %d) held, %s routing\n", first, count ? first + count : cfg->n_experts,
               r->external ? "external" : "internal");
    if (r->bk == FM_BACKEND_CUDA) text_cuda(r);
    else
        printf("  time (median)    %.3f ms over %d iterations\n", r->med, r->iters);
    printf("  bytes read       %.1f MB (active experts' weights + scales + activations)\n", r->bytes / 1e6);
    if (r->bk == FM_BACKEND_CUDA)
        printf("  bandwidth        %.1f GB/s eager, %.1f GB/s graph replay\n", r->bytes / (r->med * 1e6),
               r->bytes / (r->ct.graph_ms * 1e6));
    else
        printf("  bandwidth        %.1f GB/s\n", r->bytes / (r->med * 1e6));
    printf("  compute          %.3f TFLOP/s\n", r->flops / (r->med * 1e9));
    if (!r->check) return;
    if (r->bad >= 0) printf("  check            FAILED: non-finite output at index %ld\n", r->bad);
    else
        printf("  check            nmse %.3e, max |err| %.3e vs CPU reference (bound %.0e): %s\n", r->nmse, r->maxabs,
               r->bound, r->passed ? "passed" : "FAILED");
}
