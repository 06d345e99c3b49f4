/* config.c - a checkpoint's config.json: the model type, the routing keys and
 * quantization_config (config_json.h), and the table of routing families.
 *
 * Why strict: this file decides how tokens are routed. A typo that silently
 * fell back to another value (scoring_func "sigmod" read as softmax, an
 * unparsable file read as "no file") made a layer that runs and is wrong, so
 * every key fp4moe uses must parse or the load fails naming it; keys it does
 * not use are ignored, and JSON null counts as absent (HF writes null for
 * unset optional keys).
 */
#define _POSIX_C_SOURCE 200809L
#include "config_json.h"
#include "fm_file.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The families, with the defaults of their transformers configuration classes
 * (DeepseekV3Config, Glm4MoeConfig, GlmMoeDsaConfig, Qwen2MoeConfig,
 * Qwen3MoeConfig, MixtralConfig, GptOssConfig). Mixtral always renormalises
 * and gpt-oss softmaxes the top-k logits: neither reads a key for it. */
static const fm_route_family k_families[] = {
    {"deepseek_v3", "DeepseekV3ForCausalLM", FM_SCORE_SIGMOID, 8, 1, 8, 4, 2.5f, 1, 1, 1, 1},
    {"deepseek_v32", "DeepseekV32ForCausalLM", FM_SCORE_SIGMOID, 8, 1, 8, 4, 2.5f, 1, 1, 1, 1},
    {"glm4_moe", "Glm4MoeForCausalLM", FM_SCORE_SIGMOID, 8, 1, 1, 1, 1.0f, 1, 1, 1, 1},
    {"glm_moe_dsa", "GlmMoeDsaForCausalLM", FM_SCORE_SIGMOID, 8, 1, 1, 1, 2.5f, 1, 1, 1, 1},
    {"qwen2_moe", "Qwen2MoeForCausalLM", FM_SCORE_SOFTMAX, 4, 0, 0, 0, 1.0f, 0, 1, 0, 0},
    {"qwen3_moe", "Qwen3MoeForCausalLM", FM_SCORE_SOFTMAX, 8, 0, 0, 0, 1.0f, 0, 1, 0, 0},
    {"mixtral", "MixtralForCausalLM", FM_SCORE_SOFTMAX, 2, 1, 0, 0, 1.0f, 0, 0, 0, 0},
    {"gpt_oss", "GptOssForCausalLM", FM_SCORE_SOFTMAX_TOPK, 4, 0, 0, 0, 1.0f, 0, 0, 0, 0},
};

const fm_route_family *fm_route_family_find(const char *model_type, const char *arch)
{
    size_t n = sizeof k_families / sizeof *k_families;
    for (size_t i = 0; model_type && *model_type && i < n; i++)
        if (!strcmp(model_type, k_families[i].model_type)) return &k_families[i];
    if (model_type && *model_type) return NULL; /* model_type is the authority when present */
    for (size_t i = 0; arch && *arch && i < n; i++)
        if (!strcmp(arch, k_families[i].arch)) return &k_families[i];
    return NULL;
}

const char *fm_route_family_list(void)
{
    return "deepseek_v3, deepseek_v32, glm4_moe, glm_moe_dsa, qwen2_moe, qwen3_moe, mixtral, gpt_oss";
}

static const cJSON *item(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* An integer key in [lo, hi]: *has = 1 when present; FM_ERR_FORMAT when it is
 * there with another type or value. */
static fm_status get_int(const cJSON *o, const char *k, long lo, long hi, const char *label, int *has, int *out)
{
    const cJSON *v = item(o, k);
    *has = v != NULL;
    if (!v) return FM_OK;
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d >= (double)lo && d <= (double)hi) || d != floor(d))
        return fm_fail(FM_ERR_FORMAT, "%s: \"%s\" must be an integer in [%ld, %ld]", label, k, lo, hi);
    *out = (int)d;
    return FM_OK;
}

static fm_status get_str(const cJSON *o, const char *k, const char *label, char *dst, size_t n)
{
    const cJSON *v = item(o, k);
    if (!v) return FM_OK;
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= n)
        return fm_fail(FM_ERR_FORMAT, "%s: \"%s\" must be a string of fewer than %zu bytes", label, k, n);
    memcpy(dst, v->valuestring, strlen(v->valuestring) + 1);
    return FM_OK;
}

static fm_status parse_routing(const cJSON *c, const char *label, fm_cfgjson *r)
{
    int k;
    FM_CHECK(get_int(c, "num_experts_per_tok", 1, 65536, label, &k, &r->top_k));
    r->top_k_key = k ? "num_experts_per_tok" : NULL;
    if (!k) { /* openai's original gpt-oss config */
        FM_CHECK(get_int(c, "experts_per_token", 1, 65536, label, &k, &r->top_k));
        r->top_k_key = k ? "experts_per_token" : NULL;
    }
    r->has_top_k = k;
    FM_CHECK(get_int(c, "n_group", 0, 65536, label, &r->has_n_group, &r->n_group));
    FM_CHECK(get_int(c, "topk_group", 0, 65536, label, &r->has_topk_group, &r->topk_group));
    const cJSON *v;
    if ((v = item(c, "scoring_func"))) {
        if (!cJSON_IsString(v)) return fm_fail(FM_ERR_FORMAT, "%s: \"scoring_func\" must be a string", label);
        if (!strcmp(v->valuestring, "sigmoid")) r->score = FM_SCORE_SIGMOID;
        else if (!strcmp(v->valuestring, "softmax")) r->score = FM_SCORE_SOFTMAX;
        else
            return fm_fail(FM_ERR_UNSUPPORTED, "%s: scoring_func \"%.64s\" is not one fp4moe knows (sigmoid, softmax)",
                           label, v->valuestring);
        r->has_score = 1;
    }
    /* DeepSeek's topk_method: "noaux_tc" (V3: groups scored by their top-2 biased
     * scores, what fp4moe does), "greedy" (plain top-k); "group_limited_greedy"
     * (V2: groups scored by their best expert) is not fp4moe's group rule. */
    if ((v = item(c, "topk_method"))) {
        if (!cJSON_IsString(v)) return fm_fail(FM_ERR_FORMAT, "%s: \"topk_method\" must be a string", label);
        if (!strcmp(v->valuestring, "greedy")) r->greedy = 1;
        else if (strcmp(v->valuestring, "noaux_tc"))
            return fm_fail(FM_ERR_UNSUPPORTED, "%s: topk_method \"%.64s\" is not one fp4moe routes (noaux_tc, greedy)",
                           label, v->valuestring);
    }
    if ((v = item(c, "swiglu_limit"))) {
        double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
        if (!(d >= FLT_MIN && d <= FLT_MAX))
            return fm_fail(FM_ERR_FORMAT, "%s: \"swiglu_limit\" must be a number in [%g, %g], got %g", label,
                           (double)FLT_MIN, (double)FLT_MAX, d);
        r->has_swiglu_limit = 1;
        r->swiglu_limit = (float)d;
    }
    if ((v = item(c, "norm_topk_prob"))) {
        if (!cJSON_IsBool(v)) return fm_fail(FM_ERR_FORMAT, "%s: \"norm_topk_prob\" must be true or false", label);
        r->has_renorm = 1;
        r->renorm = cJSON_IsTrue(v);
    }
    if ((v = item(c, "routed_scaling_factor"))) {
        double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
        /* as a float (the layer's routed_scale): a normal number, not one that rounds to 0 */
        if (!(d >= FLT_MIN && d < 1e30))
            return fm_fail(FM_ERR_FORMAT, "%s: \"routed_scaling_factor\" must be a number in [%g, 1e30), got %g", label,
                           (double)FLT_MIN, d);
        r->has_scale = 1;
        r->scale = (float)d;
    }
    return FM_OK;
}

static fm_status parse_quant(const cJSON *q, const char *label, fm_cfgjson *r)
{
    if (!cJSON_IsObject(q)) return fm_fail(FM_ERR_FORMAT, "%s: \"quantization_config\" must be an object", label);
    r->has_quant = 1;
    FM_CHECK(get_str(q, "quant_method", label, r->quant_method, sizeof r->quant_method));
    FM_CHECK(get_str(q, "format", label, r->quant_format, sizeof r->quant_format));
    FM_CHECK(get_str(q, "quant_algo", label, r->quant_algo, sizeof r->quant_algo));
    if (strcmp(r->quant_format, "mixed-precision")) return FM_OK;
    /* mixed-precision: the format of each config group; fp4moe reads one format per checkpoint */
    const cJSON *groups = item(q, "config_groups"), *g;
    r->quant_format[0] = '\0';
    cJSON_ArrayForEach(g, groups)
    {
        char f[64] = "";
        if (!cJSON_IsObject(g)) continue;
        FM_CHECK(get_str(g, "format", label, f, sizeof f));
        if (!f[0]) continue;
        if (!r->quant_format[0]) memcpy(r->quant_format, f, sizeof f);
        else if (strcmp(f, r->quant_format))
            return fm_fail(FM_ERR_UNSUPPORTED, "%s: unsupported format: mixed-precision config_groups with formats \"%s\" and \"%s\"",
                           label, r->quant_format, f);
    }
    if (!r->quant_format[0]) snprintf(r->quant_format, sizeof r->quant_format, "mixed-precision");
    return FM_OK;
}

fm_status fm_cfgjson_parse(const char *buf, size_t len, const char *label, fm_cfgjson *out)
{
    if (!buf || !label || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_cfgjson_parse: NULL argument");
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
    if (!root) {
        size_t at = end && end >= buf && end <= buf + len ? (size_t)(end - buf) : 0;
        return fm_fail(FM_ERR_FORMAT, "%s: not valid JSON (parse error near byte %zu of %zu)", label, at, len);
    }
    fm_cfgjson r = {.present = 1};
    fm_status s = FM_OK;
    if (!cJSON_IsObject(root)) s = fm_fail(FM_ERR_FORMAT, "%s: the top level is not a JSON object", label);
    const cJSON *tc = s == FM_OK ? item(root, "text_config") : NULL;
    if (s == FM_OK && tc && !cJSON_IsObject(tc)) s = fm_fail(FM_ERR_FORMAT, "%s: \"text_config\" must be an object", label);
    const cJSON *c = tc ? tc : root;
    if (s == FM_OK) s = get_str(c, "model_type", label, r.model_type, sizeof r.model_type);
    if (s == FM_OK && !r.model_type[0] && c != root)
        s = get_str(root, "model_type", label, r.model_type, sizeof r.model_type);
    const cJSON *a = s == FM_OK ? item(root, "architectures") : NULL;
    if (a && (!cJSON_IsArray(a) || (cJSON_GetArraySize(a) > 0 && !cJSON_IsString(cJSON_GetArrayItem(a, 0)))))
        s = fm_fail(FM_ERR_FORMAT, "%s: \"architectures\" must be a list of strings", label);
    else if (a && cJSON_GetArraySize(a) > 0)
        snprintf(r.arch, sizeof r.arch, "%s", cJSON_GetArrayItem(a, 0)->valuestring);
    if (s == FM_OK) s = parse_routing(c, label, &r);
    const cJSON *q = s == FM_OK ? item(root, "quantization_config") : NULL;
    if (s == FM_OK && q) s = parse_quant(q, label, &r);
    cJSON_Delete(root);
    if (s == FM_OK) *out = r;
    return s;
}

fm_status fm_cfgjson_read(const char *dir, fm_cfgjson *out)
{
    if (!dir || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_cfgjson_read: NULL argument");
    char path[4096];
    if (snprintf(path, sizeof path, "%s/config.json", *dir ? dir : ".") >= (int)sizeof path)
        return fm_fail(FM_ERR_INVALID_ARG, "config.json path in '%.200s...' is too long", dir);
    struct stat sb;
    if (stat(path, &sb) != 0 && errno == ENOENT) { /* absent: nothing to read (the caller decides) */
        *out = (fm_cfgjson){0};
        return FM_OK;
    }
    int      fd = -1;
    uint64_t size = 0;
    FM_CHECK(fm_file_open(path, &fd, &size)); /* a FIFO / device / directory: FM_ERR_IO, never a hang */
    if (size > FM_CFGJSON_MAX) {
        close(fd);
        return fm_fail(FM_ERR_IO, "%s: %llu bytes, more than a config.json's %u", path, (unsigned long long)size,
                       FM_CFGJSON_MAX);
    }
    size_t n = (size_t)size;
    char  *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return fm_fail(FM_ERR_OOM, "%s: out of memory", path);
    }
    fm_status rs = fm_file_pread(fd, path, 0, buf, n);
    close(fd);
    fm_status s = rs == FM_OK ? fm_cfgjson_parse(buf, n, path, out) : rs;
    free(buf);
    return s;
}
