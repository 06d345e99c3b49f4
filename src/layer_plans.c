/* layer_plans.c - plan files: the buckets' plans of a cuda layer kept across processes
 * (fm_layer_save_plans, fm_layer_desc.plans), as FlashInfer keeps its autotuner's
 * results: a metadata block that must match exactly, or the plans are not used.
 *
 * {"fp4moe_plans": 1,
 *  "sections": [{"meta": {"gpu": "NVIDIA H200", "cc": 90, "sms": 132, "driver": 13000,
 *                         "runtime": 13000, "library": "0.1.0", "targets": "sm_80 sm_90a ..."},
 *                "layers": [{"shape": "nvfp4 e256 k8 h6144 i2048 shard 0+32 t256 swiglu",
 *                            "buckets": [{"T": 1, "expected_rows": 1, "active_experts": 1,
 *                                         "work_list": 1,
 *                                         "fc1": {"tile": "mma_w4m2n1k128s4", "k_splits": 16,
 *                                                 "x_packed": 0, "feature_blocks": 1},
 *                                         "fc2": {...},
 *                                         "decode": 1, "decode_k_splits": [16, 8]}, ...]}]}]}
 * ("decode" and its splits only in buckets that run the one-launch decode kernel, "act_fp8": 1
 * only in a W4A8 layer's buckets that run the W4A8 chain; a W4A8 layer's shape key ends in
 * " w4a8 <granularity> <every|faster>")
 * One file holds the plans of several GPUs, builds and layer shapes; a section is one
 * device + build. Why every field of the metadata: a plan is a measurement of these
 * kernels on this GPU under this driver; another library version may have other tiles. */
#define _POSIX_C_SOURCE 200809L /* stat */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "backend.h"
#include "fm_file.h"
#include "fm_internal.h"
#include "fp4moe/kernels.h"

#define PLANS_MAX_BYTES (64u << 20)

/* The section metadata of the layer's device and build, as a JSON object. */
static fm_status meta_of(const fm_layer_params *p, cJSON **out)
{
    fm_cuda_code_info code;
    FM_CHECK(fm_cuda_device_code(p->device, &code));
    const fm_device_info *d = fm_cuda_device_limits(p->device);
    cJSON                *m = cJSON_CreateObject();
    if (!m || !cJSON_AddStringToObject(m, "gpu", d->name) || !cJSON_AddNumberToObject(m, "cc", d->cc) ||
        !cJSON_AddNumberToObject(m, "sms", d->sms) || !cJSON_AddNumberToObject(m, "driver", code.driver_version) ||
        !cJSON_AddNumberToObject(m, "runtime", code.runtime_version) ||
        !cJSON_AddStringToObject(m, "library", fm_version()) || !cJSON_AddStringToObject(m, "targets", code.targets)) {
        cJSON_Delete(m);
        return fm_fail(FM_ERR_OOM, "plan file: out of host memory");
    }
    *out = m;
    return FM_OK;
}

/* The key of a layer's shape: what its plans depend on. */
static void shape_of(const fm_layer_params *p, char *buf, size_t n)
{
    const fm_moe_config *c = &p->cfg;
    snprintf(buf, n, "%s e%d k%d h%d i%d shard %d+%d t%d act%d wl%d rq%g", c->wfmt == FM_FORMAT_MXFP4 ? "mxfp4" : "nvfp4",
             c->n_experts, c->top_k, c->hidden, c->inter, p->first, p->n_local, p->max_tokens, (int)c->activation,
             p->decode_work_list, (double)p->row_quantile);
    if (c->act_fp8 != FM_ACT_FP8_OFF) { /* W4A8 layers only: the W4A16 layers' keys as before */
        const size_t k = strlen(buf);
        snprintf(buf + k, n - k, " w4a8 %s %s", fm_act_fp8_name(c->act_fp8),
                 p->act_fp8_path == FM_FP8_PATH_FASTER ? "faster" : "every");
    }
}

/* Every bucket's largest T, ascending (what fm_layer_plan reports as bucket_tokens). */
static int buckets(fm_layer *l, int max_tokens, int *ts, int cap)
{
    int n = 0;
    for (long long T = 1; T <= max_tokens && n < cap; T *= 2) {
        fm_layer_plan_info in;
        if (fm_layer_plan(l, (int)T, &in) != FM_OK) break;
        if (n == 0 || ts[n - 1] != in.bucket_tokens) ts[n++] = in.bucket_tokens;
    }
    fm_clear_error();
    return n;
}

static cJSON *gemm_json(const fm_layer_plan_info *in, int g)
{
    char   name[64];
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    fm_tile_name(&in->tile[g], name, sizeof name);
    cJSON_AddStringToObject(o, "tile", name);
    cJSON_AddNumberToObject(o, "k_splits", in->k_splits[g]);
    cJSON_AddNumberToObject(o, "x_packed", in->x_packed[g]);
    cJSON_AddNumberToObject(o, "feature_blocks", in->feature_blocks[g]);
    return o;
}

/* The whole file, parsed; *root NULL when path does not exist. A file that exists and is
 * not a plan file is FM_ERR_FORMAT. */
static fm_status read_file(const char *path, cJSON **root)
{
    *root = NULL;
    int      fd = -1;
    uint64_t size = 0;
    FM_CHECK(fm_file_open(path, &fd, &size)); /* a FIFO / device / directory: FM_ERR_IO, never a hang */
    if (size > PLANS_MAX_BYTES) {
        close(fd);
        return fm_fail(FM_ERR_FORMAT, "plan file %s: %llu bytes, more than %u MB", path, (unsigned long long)size,
                       PLANS_MAX_BYTES >> 20);
    }
    char *buf = malloc((size_t)size + 1);
    if (!buf) {
        close(fd);
        return fm_fail(FM_ERR_OOM, "plan file %s: out of host memory", path);
    }
    fm_status st = fm_file_pread(fd, path, 0, buf, (size_t)size);
    close(fd);
    cJSON *r = st == FM_OK ? cJSON_ParseWithLength(buf, (size_t)size) : NULL;
    free(buf);
    if (st != FM_OK) return st;
    const cJSON *v = r ? cJSON_GetObjectItemCaseSensitive(r, "fp4moe_plans") : NULL;
    if (!cJSON_IsNumber(v) || v->valuedouble != 1 || !cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(r, "sections"))) {
        cJSON_Delete(r);
        return fm_fail(FM_ERR_FORMAT, "plan file %s: not an fp4moe plan file (version 1)", path);
    }
    *root = r;
    return FM_OK;
}

/* Whether anything is at path (never opened: a FIFO there would block a reader). */
static int file_exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

static int meta_equal(const cJSON *a, const cJSON *b) { return a && b && cJSON_Compare(a, b, 1); }

fm_status fm_layer_plans_save(fm_layer *l, const fm_layer_params *p, const char *path)
{
    if (!path || !*path) return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_save_plans: path is NULL or empty");
    cJSON    *root = NULL, *meta = NULL;
    fm_status st = file_exists(path) ? read_file(path, &root) : FM_OK;
    if (st != FM_OK) return st;
    if (!root) {
        root = cJSON_CreateObject();
        if (!root) return fm_fail(FM_ERR_OOM, "fm_layer_save_plans: out of host memory");
        cJSON_AddNumberToObject(root, "fp4moe_plans", 1);
        cJSON_AddItemToObject(root, "sections", cJSON_CreateArray());
    }
    if ((st = meta_of(p, &meta)) != FM_OK) goto done;
    cJSON *sections = cJSON_GetObjectItemCaseSensitive(root, "sections"), *sec = NULL, *it;
    cJSON_ArrayForEach(it, sections) if (meta_equal(cJSON_GetObjectItemCaseSensitive(it, "meta"), meta)) sec = it;
    if (!sec) {
        sec = cJSON_CreateObject();
        cJSON_AddItemToObject(sec, "meta", meta);
        meta = NULL;
        cJSON_AddItemToObject(sec, "layers", cJSON_CreateArray());
        cJSON_AddItemToArray(sections, sec);
    }
    cJSON *layers = cJSON_GetObjectItemCaseSensitive(sec, "layers");
    if (!cJSON_IsArray(layers)) {
        st = fm_fail(FM_ERR_FORMAT, "plan file %s: a section without a layers array", path);
        goto done;
    }
    char shape[160];
    shape_of(p, shape, sizeof shape);
    int idx = 0, found = -1;
    cJSON_ArrayForEach(it, layers)
    {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(it, "shape");
        if (cJSON_IsString(s) && !strcmp(s->valuestring, shape)) found = idx;
        idx++;
    }
    cJSON *entry = cJSON_CreateObject(), *arr = cJSON_CreateArray();
    cJSON_AddStringToObject(entry, "shape", shape);
    cJSON_AddItemToObject(entry, "buckets", arr);
    int ts[32], nb = buckets(l, p->max_tokens, ts, 32);
    for (int i = 0; i < nb; i++) {
        fm_layer_plan_info in;
        if ((st = fm_layer_plan(l, ts[i], &in)) != FM_OK) {
            cJSON_Delete(entry);
            goto done;
        }
        cJSON *b = cJSON_CreateObject();
        cJSON_AddNumberToObject(b, "T", ts[i]);
        cJSON_AddNumberToObject(b, "expected_rows", in.expected_rows);
        cJSON_AddNumberToObject(b, "active_experts", in.active_experts);
        cJSON_AddNumberToObject(b, "work_list", in.work_list);
        if (in.decode) { /* only when chosen: files written before it existed read the same */
            cJSON_AddNumberToObject(b, "decode", 1);
            cJSON *dk = cJSON_AddArrayToObject(b, "decode_k_splits");
            for (int g = 0; g < 2; g++) cJSON_AddItemToArray(dk, cJSON_CreateNumber(in.decode_k_splits[g]));
        }
        if (in.act_fp8) cJSON_AddNumberToObject(b, "act_fp8", 1); /* only when chosen, as decode */
        cJSON_AddItemToObject(b, "fc1", gemm_json(&in, 0));
        cJSON_AddItemToObject(b, "fc2", gemm_json(&in, 1));
        cJSON_AddItemToArray(arr, b);
    }
    if (found >= 0) cJSON_ReplaceItemInArray(layers, found, entry);
    else cJSON_AddItemToArray(layers, entry);
    char *text = cJSON_Print(root);
    if (!text) {
        st = fm_fail(FM_ERR_OOM, "fm_layer_save_plans: out of host memory");
        goto done;
    }
    fm_file_out o;
    if ((st = fm_file_out_begin(path, &o)) == FM_OK && (st = fm_file_out_write(&o, text, strlen(text))) == FM_OK &&
        (st = fm_file_out_write(&o, "\n", 1)) == FM_OK)
        st = fm_file_out_commit(&o);
    cJSON_free(text);
done:
    cJSON_Delete(meta);
    cJSON_Delete(root);
    return st;
}

/* a JSON number that is an int: range first (converting 1e300 or inf to int is undefined) */
static int int_of(const cJSON *x, int *v)
{
    if (!cJSON_IsNumber(x)) return 0;
    const double d = x->valuedouble;
    if (!(d >= (double)INT_MIN && d <= (double)INT_MAX) || d != (double)(int)d) return 0;
    *v = (int)d;
    return 1;
}
static int num(const cJSON *o, const char *k, int *v) { return int_of(cJSON_GetObjectItemCaseSensitive(o, k), v); }
static int num_at(const cJSON *a, int i, int *v) { return int_of(cJSON_GetArrayItem(a, i), v); }

static int gemm_from(const cJSON *o, fm_layer_plan_info *in, int g)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "tile");
    return cJSON_IsObject(o) && cJSON_IsString(t) && fm_tile_parse(t->valuestring, &in->tile[g]) == FM_OK &&
           num(o, "k_splits", &in->k_splits[g]) && num(o, "x_packed", &in->x_packed[g]) &&
           num(o, "feature_blocks", &in->feature_blocks[g]);
}

fm_status fm_layer_plans_load(fm_layer *l, const fm_layer_params *p, const char *path, char *note, size_t nn)
{
    cJSON    *root = NULL, *meta = NULL;
    if (!file_exists(path)) { /* the first run of a deployment: tune, then fm_layer_save_plans */
        snprintf(note, nn, "plans in %s not used: there is no such file yet (the planner's plans)", path);
        return FM_OK;
    }
    fm_status st = read_file(path, &root);
    if (st != FM_OK) return fm_fail(st == FM_ERR_IO ? FM_ERR_IO : FM_ERR_FORMAT, "fm_layer_create: plans: %s",
                                    fm_last_error());
    if ((st = meta_of(p, &meta)) != FM_OK) goto done;
    const cJSON *sec = NULL, *it, *first_meta = NULL;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(root, "sections"))
    {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(it, "meta");
        if (!first_meta) first_meta = m;
        if (meta_equal(m, meta)) sec = it;
    }
    if (!sec) {
        char *want = cJSON_PrintUnformatted(meta), *have = first_meta ? cJSON_PrintUnformatted(first_meta) : NULL;
        snprintf(note, nn, "plans in %s not used: none for this device and build %s (the file has %s%s)", path,
                 want ? want : "?", have ? have : "no sections", have && cJSON_GetArraySize(
                     cJSON_GetObjectItemCaseSensitive(root, "sections")) > 1 ? ", ..." : "");
        cJSON_free(want);
        cJSON_free(have);
        goto done;
    }
    char shape[160];
    shape_of(p, shape, sizeof shape);
    const cJSON *entry = NULL;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(sec, "layers"))
    {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(it, "shape");
        if (cJSON_IsString(s) && !strcmp(s->valuestring, shape)) entry = it;
    }
    if (!entry) {
        snprintf(note, nn, "plans in %s not used: none for this layer's shape (%s)", path, shape);
        goto done;
    }
    /* all or none: parse every bucket, keep the planner's plans, apply, restore on a refusal */
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(entry, "buckets");
    int          n = cJSON_GetArraySize(arr), ts[32], nb = buckets(l, p->max_tokens, ts, 32);
    if (!cJSON_IsArray(arr) || n < 1 || n > 32) {
        st = fm_fail(FM_ERR_FORMAT, "fm_layer_create: plan file %s: %s: no buckets array of 1..32", path, shape);
        goto done;
    }
    fm_layer_plan_info want[32], keep[32];
    int                bt[32], i = 0;
    cJSON_ArrayForEach(it, arr)
    {
        memset(&want[i], 0, sizeof want[i]);
        int ok = num(it, "T", &bt[i]) && num(it, "expected_rows", &want[i].expected_rows) &&
                 num(it, "active_experts", &want[i].active_experts) && num(it, "work_list", &want[i].work_list) &&
                 gemm_from(cJSON_GetObjectItemCaseSensitive(it, "fc1"), &want[i], 0) &&
                 gemm_from(cJSON_GetObjectItemCaseSensitive(it, "fc2"), &want[i], 1);
        const cJSON *dk = cJSON_GetObjectItemCaseSensitive(it, "decode_k_splits");
        if (ok && cJSON_GetObjectItemCaseSensitive(it, "decode")) /* optional: the chain without it */
            ok = num(it, "decode", &want[i].decode) && cJSON_IsArray(dk) && cJSON_GetArraySize(dk) == 2 &&
                 num_at(dk, 0, &want[i].decode_k_splits[0]) && num_at(dk, 1, &want[i].decode_k_splits[1]);
        if (ok && cJSON_GetObjectItemCaseSensitive(it, "act_fp8")) /* optional: W4A16 without it */
            ok = num(it, "act_fp8", &want[i].act_fp8);
        int known = 0;
        for (int b = 0; ok && b < nb; b++) known |= ts[b] == bt[i];
        if (!ok || !known) {
            st = fm_fail(FM_ERR_FORMAT, "fm_layer_create: plan file %s: %s: bucket %d is malformed or not a bucket "
                                        "of this layer", path, shape, i);
            goto done;
        }
        i++;
    }
    for (i = 0; i < nb; i++)
        if ((st = fm_layer_plan(l, ts[i], &keep[i])) != FM_OK) goto done;
    for (i = 0; i < n; i++)
        if ((st = fm_layer_set_plan(l, bt[i], &want[i])) != FM_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", fm_last_error());
            for (int b = 0; b < nb; b++) (void)fm_layer_set_plan(l, ts[b], &keep[b]);
            st = fm_fail(FM_ERR_FORMAT, "fm_layer_create: plan file %s: %s: bucket T=%d refused (%s); the file's "
                                        "section matches this device and build, so it is corrupt",
                         path, shape, bt[i], why);
            goto done;
        }
    snprintf(note, nn, "loaded %d bucket plans from %s", n, path);
done:
    cJSON_Delete(meta);
    cJSON_Delete(root);
    return st;
}
