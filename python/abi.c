/* abi.c - the layout of every public struct the Python binding (ctypes) mirrors.
 *
 * ctypes re-declares C structs field by field; a field added, moved or retyped
 * in a header would make it read garbage silently. The package compares its
 * declarations with this table when it loads the library (fp4moe/_abi.py) and
 * refuses to load on any difference, naming the struct and field. Built only
 * into the shared library (python/python.cmake); it implements nothing the
 * library does.
 */
#include "fp4moe/tools.h"

#include <stddef.h>

typedef struct {
    const char *type;   /* struct name */
    const char *field;  /* field name, or "" for the struct's own size */
    size_t      offset; /* offsetof, or 0 for the size row */
    size_t      size;   /* sizeof field, or sizeof struct */
} fm_py_field;

#define F(T, f) {#T, #f, offsetof(T, f), sizeof(((T *)0)->f)}
#define S(T) {#T, "", 0, sizeof(T)}

static const fm_py_field k_fields[] = {
    S(fm_moe_config),  F(fm_moe_config, n_experts), F(fm_moe_config, top_k), F(fm_moe_config, hidden),
    F(fm_moe_config, inter), F(fm_moe_config, score), F(fm_moe_config, n_group), F(fm_moe_config, topk_group),
    F(fm_moe_config, renormalize), F(fm_moe_config, routed_scale), F(fm_moe_config, shared_inter),
    F(fm_moe_config, wfmt), F(fm_moe_config, act_nvfp4), F(fm_moe_config, activation),
    F(fm_moe_config, swiglu_limit), F(fm_moe_config, act_fp8),

    S(fm_qtensor), F(fm_qtensor, fmt), F(fm_qtensor, rows), F(fm_qtensor, cols), F(fm_qtensor, data),
    F(fm_qtensor, scales), F(fm_qtensor, global_scale),

    S(fm_moe_weights), F(fm_moe_weights, router_w), F(fm_moe_weights, router_bias), F(fm_moe_weights, w13),
    F(fm_moe_weights, w2), F(fm_moe_weights, a1_scale), F(fm_moe_weights, a2_scale),
    F(fm_moe_weights, shared_w13), F(fm_moe_weights, shared_w2), F(fm_moe_weights, w13_bias),
    F(fm_moe_weights, w2_bias), F(fm_moe_weights, w13_up_global),

    S(fm_run_stats), F(fm_run_stats, ms),

    S(fm_layer_desc), F(fm_layer_desc, backend), F(fm_layer_desc, device), F(fm_layer_desc, max_tokens),
    F(fm_layer_desc, out_dtype), F(fm_layer_desc, first_expert), F(fm_layer_desc, n_local),
    F(fm_layer_desc, caller_workspace), F(fm_layer_desc, decode_work_list), F(fm_layer_desc, row_quantile),
    F(fm_layer_desc, plans), F(fm_layer_desc, pdl_chain), F(fm_layer_desc, decode_path), F(fm_layer_desc, act_fp8_path),

    S(fm_layer_run_args), F(fm_layer_run_args, x), F(fm_layer_run_args, T), F(fm_layer_run_args, topk_ids),
    F(fm_layer_run_args, topk_weights), F(fm_layer_run_args, out), F(fm_layer_run_args, workspace),
    F(fm_layer_run_args, stream), F(fm_layer_run_args, routed_ids), F(fm_layer_run_args, routed_weights),

    S(fm_layer_dispatch_args), F(fm_layer_dispatch_args, layout), F(fm_layer_dispatch_args, x),
    F(fm_layer_dispatch_args, x_fp8), F(fm_layer_dispatch_args, x_scales), F(fm_layer_dispatch_args, counts),
    F(fm_layer_dispatch_args, capacity), F(fm_layer_dispatch_args, offsets), F(fm_layer_dispatch_args, weights),
    F(fm_layer_dispatch_args, out), F(fm_layer_dispatch_args, workspace), F(fm_layer_dispatch_args, stream),
    F(fm_layer_dispatch_args, max_rows),

    S(fm_layer_error_info), F(fm_layer_error_info, bad_ids), F(fm_layer_error_info, first_bad_slot),
    F(fm_layer_error_info, nonfinite_x), F(fm_layer_error_info, first_nonfinite),
    F(fm_layer_error_info, nonfinite_logits), F(fm_layer_error_info, nonfinite_weights),
    F(fm_layer_error_info, bad_experts), F(fm_layer_error_info, first_bad_expert),

    S(fm_tile), F(fm_tile, warps), F(fm_tile, mt), F(fm_tile, nt), F(fm_tile, kc), F(fm_tile, stages),
    F(fm_tile, persist), F(fm_tile, family),

    S(fm_layer_plan_info), F(fm_layer_plan_info, bucket_tokens), F(fm_layer_plan_info, expected_rows),
    F(fm_layer_plan_info, active_experts), F(fm_layer_plan_info, work_list), F(fm_layer_plan_info, tile),
    F(fm_layer_plan_info, k_splits), F(fm_layer_plan_info, x_packed), F(fm_layer_plan_info, feature_blocks),
    F(fm_layer_plan_info, decode), F(fm_layer_plan_info, decode_k_splits), F(fm_layer_plan_info, decode_ctas),
    F(fm_layer_plan_info, decode_note), F(fm_layer_plan_info, act_fp8), F(fm_layer_plan_info, decode_counter),

    S(fm_layer_tune_info), F(fm_layer_tune_info, plans_tried), F(fm_layer_tune_info, plans_refused),
    F(fm_layer_tune_info, before_us), F(fm_layer_tune_info, after_us), F(fm_layer_tune_info, changed),

    S(fm_st_tensor), F(fm_st_tensor, name), F(fm_st_tensor, dtype), F(fm_st_tensor, ndim),
    F(fm_st_tensor, shape), F(fm_st_tensor, data), F(fm_st_tensor, nbytes), F(fm_st_tensor, file_offset),
    F(fm_st_tensor, file), F(fm_st_tensor, owner_),

    S(fm_ckpt_names), F(fm_ckpt_names, layout), F(fm_ckpt_names, expert), F(fm_ckpt_names, proj_gate),
    F(fm_ckpt_names, proj_up), F(fm_ckpt_names, proj_down), F(fm_ckpt_names, router),
    F(fm_ckpt_names, router_bias), F(fm_ckpt_names, shared),

    S(fm_ckpt_scan), F(fm_ckpt_scan, layout), F(fm_ckpt_scan, wfmt), F(fm_ckpt_scan, n_layers),
    F(fm_ckpt_scan, layers), F(fm_ckpt_scan, experts), F(fm_ckpt_scan, found), F(fm_ckpt_scan, expert_bytes),

    S(fm_ckpt_load_opts), F(fm_ckpt_load_opts, names), F(fm_ckpt_load_opts, routing), F(fm_ckpt_load_opts, routing_fields),
    F(fm_ckpt_load_opts, first_expert), F(fm_ckpt_load_opts, n_experts), F(fm_ckpt_load_opts, swizzle_scales),
    F(fm_ckpt_load_opts, global_router), F(fm_ckpt_load_opts, validate_only),

    S(fm_tensor_view), F(fm_tensor_view, name), F(fm_tensor_view, dtype), F(fm_tensor_view, ndim),
    F(fm_tensor_view, shape), F(fm_tensor_view, data),

    S(fm_ckpt_layer), F(fm_ckpt_layer, cfg), F(fm_ckpt_layer, w), F(fm_ckpt_layer, w13), F(fm_ckpt_layer, w2),
    F(fm_ckpt_layer, router_w), F(fm_ckpt_layer, router_bias), F(fm_ckpt_layer, a1_scale),
    F(fm_ckpt_layer, a2_scale), F(fm_ckpt_layer, shared_w13), F(fm_ckpt_layer, shared_w2),
    F(fm_ckpt_layer, w13_bias), F(fm_ckpt_layer, w2_bias), F(fm_ckpt_layer, w13_up_global),
    F(fm_ckpt_layer, w13_sf_swizzled), F(fm_ckpt_layer, w2_sf_swizzled), F(fm_ckpt_layer, layer),
    F(fm_ckpt_layer, first_expert), F(fm_ckpt_layer, n_local), F(fm_ckpt_layer, has_router_bias), F(fm_ckpt_layer, has_input_scales),
    F(fm_ckpt_layer, has_expert_bias),
    F(fm_ckpt_layer, layout), F(fm_ckpt_layer, model_type), F(fm_ckpt_layer, route_from),
    F(fm_ckpt_layer, w13_split_globals), F(fm_ckpt_layer, ignored_bias),
    F(fm_ckpt_layer, ignored_router_bias), F(fm_ckpt_layer, owned_),
};

/* Exported for ctypes only (declared here: no header promises them to C users). */
int                fm_py_abi_count(void);
const fm_py_field *fm_py_abi_at(int i);

int fm_py_abi_count(void) { return (int)(sizeof k_fields / sizeof k_fields[0]); }

const fm_py_field *fm_py_abi_at(int i) { return (i >= 0 && i < fm_py_abi_count()) ? &k_fields[i] : 0; }
