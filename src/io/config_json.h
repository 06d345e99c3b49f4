/* config_json.h - what fp4moe reads from a checkpoint's config.json (inside
 * src/io/, not installed): the model type, the routing keys the HF model code
 * reads, and quantization_config. Parsing is strict about the keys it uses
 * (a key present with a value of the wrong type or range is an error, never
 * skipped) and ignores every other key. See docs/checkpoints.md.
 */
#ifndef FM_IO_CONFIG_JSON_H
#define FM_IO_CONFIG_JSON_H

#include "io_internal.h"

/* Largest config.json read (real ones are a few kB; multimodal ones < 100 kB). */
#define FM_CFGJSON_MAX (4u << 20)

typedef struct {
    int   present;         /* a config.json was found and parsed */
    char  model_type[64];  /* text_config.model_type, else model_type; "" if absent */
    char  arch[96];        /* architectures[0]; "" if absent */
    /* routing keys (from text_config when it is an object, else the root);
     * has_x = the key is present (with a valid value) */
    int   has_top_k, top_k;            /* num_experts_per_tok | experts_per_token */
    const char *top_k_key;
    int   has_score;                   /* scoring_func */
    fm_score_func score;
    int   has_renorm, renorm;          /* norm_topk_prob */
    int   has_scale;                   /* routed_scaling_factor */
    float scale;
    int   has_n_group, n_group;        /* n_group */
    int   has_topk_group, topk_group;  /* topk_group */
    int   greedy;                      /* topk_method "greedy": plain top-k, any n_group ignored */
    int   has_swiglu_limit;            /* swiglu_limit (gpt-oss): its experts' clamp, finite > 0 */
    float swiglu_limit;
    /* quantization_config (root) */
    int   has_quant;
    char  quant_method[48];  /* "" if absent */
    char  quant_algo[48];    /* ModelOpt's "quant_algo" ("NVFP4", "FP8", ...); "" if absent */
    char  quant_format[64];  /* compressed-tensors "format" ("" if absent); "mixed-precision"
                                is replaced by the one format all config_groups share */
} fm_cfgjson;

/* Parse buf[len] (label names it in messages). FM_OK; FM_ERR_FORMAT (not JSON,
 * not an object, a used key of the wrong type or range); FM_ERR_UNSUPPORTED (a
 * scoring_func fp4moe does not know, config_groups with different formats);
 * FM_ERR_OOM. *out is filled only on FM_OK. */
fm_status fm_cfgjson_parse(const char *buf, size_t len, const char *label, fm_cfgjson *out);

/* DIR/config.json: none there (ENOENT) -> FM_OK with present = 0; else as
 * fm_cfgjson_parse, plus FM_ERR_IO (unreadable, not a regular file, or larger
 * than FM_CFGJSON_MAX). */
fm_status fm_cfgjson_read(const char *dir, fm_cfgjson *out);

/* The routing of a model family, as its transformers code defines it. */
typedef struct {
    const char   *model_type;   /* config.json model_type */
    const char   *arch;         /* architectures[0] */
    fm_score_func score;
    int           top_k, renorm, n_group, topk_group;
    float         scale;
    /* which config.json keys the family's model code reads (others are ignored) */
    int           reads_score, reads_renorm, reads_scale, reads_groups;
} fm_route_family;

/* The family of model_type (or, when model_type is "", of arch); NULL if unknown. */
const fm_route_family *fm_route_family_find(const char *model_type, const char *arch);
/* "deepseek_v3, glm4_moe, ..." for messages. */
const char *fm_route_family_list(void);

#endif
