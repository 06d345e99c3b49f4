/* cmd_inspect.c - `fp4moe inspect PATH`: what is in a safetensors checkpoint
 * (a file, a folder of shards, or an index): files, tensors by dtype, the
 * detected layout and quantization format, the MoE layers with their experts
 * and shapes, and bytes.
 *
 * Every MoE layer is validated as fp4moe would load it (presence, dtype and
 * shape of every expert tensor and scale, no stray expert index, no NaN block
 * scale code) without reading the weights (fm_checkpoint_load_layer with
 * validate_only, which reads only scales), so a checkpoint inspect
 * accepts is one `fp4moe run --weights` can load; a bad one fails here with the
 * status naming the file and tensor, exit 1. The routing settings are shown
 * with where each came from (config.json key, model-type default). A checkpoint
 * with expert tensors in a layout fp4moe cannot read, or a quantization_config
 * it does not read, is "unsupported format: ..." (exit 1); one with no
 * expert-like tensors at all is not an error: inspect lists its tensors.
 */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "flags.h"
#include "io/io_internal.h" /* fm_st_shape_str */

typedef struct {
    int layout, layer, tensors, json, help;
} inspect_opts;

static const fm_flag_choice k_layouts[] = {{"auto", FM_LAYOUT_AUTO},
                                           {"modelopt", FM_LAYOUT_MODELOPT},
                                           {"compressed-tensors", FM_LAYOUT_COMPRESSED_TENSORS},
                                           {"gpt-oss", FM_LAYOUT_GPT_OSS},
                                           {NULL, 0}};

#define O(f) offsetof(inspect_opts, f)
static const fm_flag k_inspect_flags[] = {
    {"layout", "L", FM_FLAG_CHOICE, O(layout), .choices = k_layouts,
     .help = "auto | modelopt | compressed-tensors | gpt-oss   expert tensor layout (default auto)"},
    {"layer", "N", FM_FLAG_INT, O(layer), 0, 1000000, .help = "show (and validate) only MoE layer N"},
    {"tensors", NULL, FM_FLAG_SWITCH, O(tensors), .help = "also list every tensor: name, dtype, shape, bytes, file"},
    {"json", NULL, FM_FLAG_SWITCH, O(json), .help = "machine-readable output on stdout"},
    {"help", NULL, FM_FLAG_HELP, O(help), .help = "this text"},
};
#undef O

static const fm_flag_cmd k_inspect_cmd = {
    .cmd = "inspect",
    .flags = k_inspect_flags,
    .n_flags = sizeof k_inspect_flags / sizeof k_inspect_flags[0],
    .head = {"usage: fp4moe inspect PATH [flags]\n"
             "List the tensors, quantization format, MoE layers and experts of a safetensors checkpoint.\n"
             "PATH is a .safetensors file, a folder of shards, or a model.safetensors.index.json.\n\n"},
    .tail = {"\nexit codes: 0 ok, 1 bad or unreadable checkpoint (status and tensor on stderr), 2 usage\n"},
    .col = 13,
    .short_help = 1,
    .unknown = {"unknown flag '", "'"},
    .usage_on_unknown = 1,
};

static const char *format_desc(fm_format f)
{
    switch (f) {
    case FM_FORMAT_NVFP4: return "NVFP4 (E2M1 values, E4M3 scale per 16, FP32 global scale)";
    case FM_FORMAT_MXFP4: return "MXFP4 (E2M1 values, UE8M0 scale per 32)";
    case FM_FORMAT_BF16: return "BF16 (unquantized experts)";
    default: return "?";
    }
}

/* The checkpoint's layout as its writer names it. */
static const char *layout_desc(fm_ckpt_layout l, fm_format f, int input_scales)
{
    switch (l) {
    case FM_LAYOUT_MODELOPT:
        return f == FM_FORMAT_BF16 ? "modelopt bf16 (unquantized experts)"
               : input_scales      ? "modelopt nvfp4 (W4A4 input scales)"
                                   : "modelopt nvfp4 (weight-only)";
    case FM_LAYOUT_COMPRESSED_TENSORS:
        return input_scales ? "compressed-tensors nvfp4-pack-quantized W4A4" : "compressed-tensors nvfp4-pack-quantized W4A16";
    case FM_LAYOUT_GPT_OSS: return "gpt-oss mxfp4";
    default: return "?";
    }
}

/* "config.json num_experts_per_tok", "qwen3_moe default", "command line". */
static void origin_str(const fm_ckpt_layer *l, int i, char *buf, size_t n)
{
    const fm_route_origin *r = &l->route_from[i];
    switch (r->from) {
    case FM_ROUTE_FROM_CONFIG: snprintf(buf, n, "config.json %s", r->key ? r->key : "?"); break;
    case FM_ROUTE_FROM_MODEL_DEFAULT: snprintf(buf, n, "%s default", l->model_type); break;
    case FM_ROUTE_FROM_CALLER: snprintf(buf, n, "command line"); break;
    case FM_ROUTE_FROM_ABSENT: snprintf(buf, n, "no n_group in config.json"); break;
    default: snprintf(buf, n, "unknown"); break;
    }
}

static void value_str(const fm_moe_config *c, int i, char *buf, size_t n)
{
    switch (i) {
    case FM_ROUTE_TOP_K: snprintf(buf, n, "%d", c->top_k); break;
    case FM_ROUTE_SCORE: snprintf(buf, n, "%s", fm_score_name(c->score)); break;
    case FM_ROUTE_RENORMALIZE: snprintf(buf, n, "%s", c->renormalize ? "yes" : "no"); break;
    case FM_ROUTE_SCALE: snprintf(buf, n, "%g", (double)c->routed_scale); break;
    default:
        if (c->n_group > 1) snprintf(buf, n, "%d, keep %d", c->n_group, c->topk_group);
        else snprintf(buf, n, "none");
        break;
    }
}

/* No layout matched: expert-like tensors mean a format fp4moe cannot read (an
 * error); none at all is a checkpoint without routed experts (not one). */
static int unsupported_experts(const fm_checkpoint *ck)
{
    for (size_t i = 0; i < fm_checkpoint_tensor_count(ck); i++) {
        const fm_st_tensor *t = fm_checkpoint_tensor_at(ck, i);
        if (!strstr(t->name, ".experts.") && !strstr(t->name, ".experts_")) continue;
        char sh[160];
        fprintf(stderr,
                "fp4moe inspect: FM_ERR_UNSUPPORTED: unsupported format: expert tensors such as '%s' (%s %s) match "
                "none of the layouts fp4moe reads (modelopt .weight/.weight_scale/.weight_scale_2, compressed-tensors "
                ".weight_packed/.weight_global_scale, gpt-oss _blocks/_scales)\n",
                t->name, fm_dtype_name(t->dtype), fm_st_shape_str(t, sh, sizeof sh));
        return 1;
    }
    return 0;
}

/* "1.25 GB", "512 B": decimal units, as disk sizes are quoted. */
static const char *human(uint64_t b, char *buf, size_t n)
{
    static const char *const k_units[] = {"B", "kB", "MB", "GB", "TB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1000.0 && u < 4) v /= 1000.0, u++;
    snprintf(buf, n, u ? "%.2f %s" : "%.0f %s", v, k_units[u]);
    return buf;
}

typedef struct {
    fm_ckpt_layer *info; /* validate-only: cfg and flags, no weights */
    int            layer, experts, found;
} layer_row;

int fm_cmd_inspect(int argc, char **argv)
{
    inspect_opts    opt = {.layout = FM_LAYOUT_AUTO, .layer = -1};
    fm_flags_result fr;
    int             rc0 = fm_flags_parse(&k_inspect_cmd, argc, argv, &opt, &fr);
    if (rc0 != FM_FLAGS_GO) return rc0;
    if (fr.n_args != 1) {
        fprintf(stderr, "fp4moe inspect: expected one PATH, got %d\n", fr.n_args);
        fm_flags_usage(&k_inspect_cmd, stderr);
        return FM_EXIT_USAGE;
    }
    const char          *path = fr.args[0];
    if (!*path) { /* a script's empty variable: said as such, not the library's "empty path" (exit 1) */
        fprintf(stderr, "fp4moe inspect: PATH is empty: give a .safetensors file, a folder or an index\n");
        return FM_EXIT_USAGE;
    }
    const int            json = opt.json, tensors = opt.tensors;
    const long           only = opt.layer;
    const fm_ckpt_layout layout = (fm_ckpt_layout)opt.layout;

    fm_checkpoint *ck = NULL;
    fm_status s = fm_checkpoint_open(path, &ck);
    if (s != FM_OK) return fm_cli_fail("inspect", s);

    fm_ckpt_model_info mi;
    s = fm_checkpoint_model_info(ck, &mi); /* an unreadable config.json or an unsupported quantization */
    if (s != FM_OK) {
        fm_checkpoint_close(ck);
        return fm_cli_fail("inspect", s);
    }
    fm_ckpt_names names;
    fm_ckpt_names_default(layout, &names);
    fm_ckpt_scan sc = {0};
    s = fm_checkpoint_scan(ck, layout == FM_LAYOUT_AUTO ? NULL : &names, &sc);
    int have_moe = s == FM_OK;
    if ((s != FM_OK && s != FM_ERR_NOT_FOUND) || (s == FM_ERR_NOT_FOUND && unsupported_experts(ck))) {
        fm_checkpoint_close(ck);
        return s == FM_ERR_NOT_FOUND ? FM_EXIT_FAIL : fm_cli_fail("inspect", s);
    }
    layer_row *rows = calloc((size_t)(have_moe ? sc.n_layers : 0) + 1, sizeof *rows);
    int nrows = 0, rc = FM_EXIT_OK;
    if (have_moe) fm_ckpt_names_default(sc.layout, &names);
    for (int i = 0; have_moe && rows && i < sc.n_layers; i++) {
        if (only >= 0 && sc.layers[i] != only) continue;
        fm_ckpt_load_opts lo = {.names = &names, .validate_only = 1};
        layer_row *r = &rows[nrows++];
        r->layer = sc.layers[i];
        r->experts = sc.experts[i];
        r->found = sc.found[i];
        s = fm_checkpoint_load_layer(ck, r->layer, &lo, &r->info);
        if (s != FM_OK) { /* a stray expert index, a NaN scale code ...: what a load rejects */
            rc = fm_cli_fail("inspect", s);
            break;
        }
        r->experts = r->info->cfg.n_experts; /* the router's count, every expert present (not max index + 1) */
    }
    if (rc == FM_EXIT_OK && only >= 0 && !nrows) {
        fprintf(stderr, "fp4moe inspect: FM_ERR_NOT_FOUND: layer %ld has no routed experts in %s\n", only, path);
        rc = FM_EXIT_FAIL;
    }
    if (!rows) rc = fm_cli_fail("inspect", FM_ERR_OOM);
    if (rc != FM_EXIT_OK) goto done;

    /* dtype histogram */
    size_t cnt[FM_DTYPE_COUNT] = {0};
    uint64_t bytes[FM_DTYPE_COUNT] = {0};
    size_t nt = fm_checkpoint_tensor_count(ck);
    for (size_t i = 0; i < nt; i++) {
        const fm_st_tensor *t = fm_checkpoint_tensor_at(ck, i);
        cnt[t->dtype]++;
        bytes[t->dtype] += t->nbytes;
    }
    char sh[200], hb[32];
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "path", path);
        cJSON *files = cJSON_AddArrayToObject(j, "files");
        for (size_t i = 0; i < fm_checkpoint_file_count(ck); i++)
            cJSON_AddItemToArray(files, cJSON_CreateString(fm_checkpoint_file_path(ck, i)));
        cJSON_AddNumberToObject(j, "tensors", (double)nt);
        cJSON_AddNumberToObject(j, "data_bytes", (double)fm_checkpoint_data_bytes(ck));
        cJSON *dt = cJSON_AddObjectToObject(j, "dtypes");
        for (int d = 0; d < FM_DTYPE_COUNT; d++) {
            if (!cnt[d]) continue;
            cJSON *o = cJSON_AddObjectToObject(dt, fm_dtype_name((fm_dtype)d));
            cJSON_AddNumberToObject(o, "count", (double)cnt[d]);
            cJSON_AddNumberToObject(o, "bytes", (double)bytes[d]);
        }
        if (mi.has_config) {
            cJSON_AddStringToObject(j, "model_type", mi.model_type);
            cJSON_AddStringToObject(j, "architecture", mi.architecture);
        } else {
            cJSON_AddNullToObject(j, "model_type");
        }
        if (have_moe) {
            cJSON_AddStringToObject(j, "layout", fm_ckpt_layout_name(sc.layout));
            if (nrows)
                cJSON_AddStringToObject(j, "layout_desc",
                                        layout_desc(sc.layout, sc.wfmt, rows[0].info->has_input_scales));
            cJSON_AddStringToObject(j, "format", fm_format_traits_get(sc.wfmt)->name);
            cJSON_AddNumberToObject(j, "expert_bytes", (double)sc.expert_bytes);
        } else {
            cJSON_AddNullToObject(j, "layout");
            cJSON_AddNullToObject(j, "format");
        }
        cJSON *ls = cJSON_AddArrayToObject(j, "layers");
        for (int i = 0; i < nrows; i++) {
            const fm_moe_config *cf = &rows[i].info->cfg;
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "layer", rows[i].layer);
            cJSON_AddNumberToObject(o, "experts", rows[i].experts);
            cJSON_AddNumberToObject(o, "hidden", cf->hidden);
            cJSON_AddNumberToObject(o, "inter", cf->inter);
            cJSON_AddNumberToObject(o, "shared_inter", cf->shared_inter);
            cJSON_AddNumberToObject(o, "top_k", cf->top_k);
            cJSON_AddStringToObject(o, "score", fm_score_name(cf->score));
            cJSON_AddBoolToObject(o, "renormalize", cf->renormalize);
            cJSON_AddNumberToObject(o, "routed_scale", cf->routed_scale);
            cJSON_AddNumberToObject(o, "n_group", cf->n_group);
            cJSON_AddNumberToObject(o, "topk_group", cf->topk_group);
            cJSON *from = cJSON_AddObjectToObject(o, "routing_from");
            for (int k = 0; k < FM_ROUTE_N; k++) {
                char ob[96];
                origin_str(rows[i].info, k, ob, sizeof ob);
                cJSON_AddStringToObject(from, fm_route_setting_name(k), ob);
            }
            cJSON_AddBoolToObject(o, "router_bias", rows[i].info->has_router_bias);
            cJSON_AddBoolToObject(o, "input_scales", rows[i].info->has_input_scales);
            cJSON_AddNumberToObject(o, "w13_split_globals", rows[i].info->w13_split_globals);
            cJSON_AddBoolToObject(o, "expert_bias", rows[i].info->has_expert_bias);
            cJSON_AddStringToObject(o, "activation", fm_activation_name(cf->activation));
            cJSON_AddNumberToObject(o, "swiglu_limit", cf->swiglu_limit);
            cJSON_AddBoolToObject(o, "ignored_expert_bias", rows[i].info->ignored_bias);
            cJSON_AddBoolToObject(o, "ignored_router_logit_bias", rows[i].info->ignored_router_bias);
            cJSON_AddItemToArray(ls, o);
        }
        if (tensors) {
            cJSON *tl = cJSON_AddArrayToObject(j, "tensor_list");
            for (size_t i = 0; i < nt; i++) {
                const fm_st_tensor *t = fm_checkpoint_tensor_at(ck, i);
                cJSON *o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "name", t->name);
                cJSON_AddStringToObject(o, "dtype", fm_dtype_name(t->dtype));
                cJSON *shp = cJSON_AddArrayToObject(o, "shape");
                for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(shp, cJSON_CreateNumber((double)t->shape[d]));
                cJSON_AddNumberToObject(o, "bytes", (double)t->nbytes);
                cJSON_AddStringToObject(o, "file", t->file);
                cJSON_AddItemToArray(tl, o);
            }
        }
        fm_cli_print_json(j);
        goto done;
    }
    printf("checkpoint  %s\n", path);
    printf("files       %zu\n", fm_checkpoint_file_count(ck));
    for (size_t i = 0; i < fm_checkpoint_file_count(ck); i++) printf("  %s\n", fm_checkpoint_file_path(ck, i));
    printf("tensors     %zu, %s of data\n", nt, human(fm_checkpoint_data_bytes(ck), hb, sizeof hb));
    printf("dtypes     ");
    for (int d = 0; d < FM_DTYPE_COUNT; d++)
        if (cnt[d]) printf(" %s x%zu (%s)", fm_dtype_name((fm_dtype)d), cnt[d], human(bytes[d], hb, sizeof hb));
    printf("\n");
    if (!have_moe) {
        printf("experts     none found (no tensor named like a routed expert)\n");
    } else {
        if (mi.has_config)
            printf("model       %s%s%s\n", mi.model_type[0] ? mi.model_type : "(no model_type)",
                   mi.architecture[0] ? ", " : "", mi.architecture);
        printf("layout      %s\n", nrows ? layout_desc(sc.layout, sc.wfmt, rows[0].info->has_input_scales)
                                         : fm_ckpt_layout_name(sc.layout));
        printf("format      %s\n", format_desc(sc.wfmt));
        printf("moe layers  %d, expert tensors %s\n", sc.n_layers, human(sc.expert_bytes, hb, sizeof hb));
        printf("  %-6s %-8s %-7s %-6s %-7s %-5s %-12s %s\n", "layer", "experts", "hidden", "inter", "shared", "top_k",
               "score", "notes");
        for (int i = 0; i < nrows; i++) {
            const fm_ckpt_layer *in = rows[i].info;
            char act[64] = "";
            if (in->cfg.activation != FM_ACT_SWIGLU)
                snprintf(act, sizeof act, " %s(limit %g)", fm_activation_name(in->cfg.activation),
                         (double)in->cfg.swiglu_limit);
            printf("  %-6d %-8d %-7d %-6d %-7d %-5d %-12s%s%s%s%s%s%s%s\n", rows[i].layer, rows[i].experts,
                   in->cfg.hidden, in->cfg.inter, in->cfg.shared_inter, in->cfg.top_k, fm_score_name(in->cfg.score),
                   in->has_router_bias ? " router-bias" : "", in->has_input_scales ? " input-scales" : "",
                   in->w13_split_globals ? " gate/up-globals-differ" : "", act, in->has_expert_bias ? " expert-bias" : "",
                   in->ignored_bias ? " expert-bias-ignored" : "",
                   in->ignored_router_bias ? " router-logit-bias-ignored" : "");
        }
        if (nrows) { /* the same for every layer: from the model, so shown once */
            printf("routing     (where each setting comes from)\n");
            for (int k = 0; k < FM_ROUTE_N; k++) {
                char vb[64], ob[96];
                value_str(&rows[0].info->cfg, k, vb, sizeof vb);
                origin_str(rows[0].info, k, ob, sizeof ob);
                printf("  %-13s %-14s %s\n", fm_route_setting_name(k), vb, ob);
            }
        }
    }
    if (tensors) {
        printf("\n%-64s %-8s %-22s %12s  %s\n", "tensor", "dtype", "shape", "bytes", "file");
        for (size_t i = 0; i < nt; i++) {
            const fm_st_tensor *t = fm_checkpoint_tensor_at(ck, i);
            const char *base = strrchr(t->file, '/') ? strrchr(t->file, '/') + 1 : t->file;
            printf("%-64s %-8s %-22s %12llu  %s\n", t->name, fm_dtype_name(t->dtype), fm_st_shape_str(t, sh, sizeof sh),
                   (unsigned long long)t->nbytes, base);
        }
    }
done:
    for (int i = 0; rows && i < nrows; i++) fm_ckpt_layer_free(rows[i].info);
    free(rows);
    fm_ckpt_scan_free(&sc);
    fm_checkpoint_close(ck);
    return rc;
}
