/* route.c - the router: scores, (group-limited) top-k, routing weights.
 *
 * Per token, on logits[E]:
 *   score[e]  = softmax(logits)[e]  or  sigmoid(logits[e])
 *               or (SOFTMAX_TOPK, gpt-oss) logits[e] + bias[e]: the bias is the
 *               router's logit bias, so it ranks AND weighs
 *   biased[e] = score[e] + bias[e]           (the score-correction bias only ranks;
 *                                             SOFTMAX_TOPK: biased = score)
 *   groups (n_group > 1, DeepSeek-V3 / GLM): a group's score is the sum of the
 *     top-2 biased scores inside it (the top-1 when a group has one expert);
 *     the topk_group best groups are kept, the other experts excluded (-inf,
 *     as SGLang's biased_grouped_topk masks them)
 *   ids       = top_k experts by biased score, descending, ties to the lower id
 *   weights   = UNbiased scores of the chosen experts, / their sum if renormalize
 *               (kept as is if that sum is 0), times routed_scale; SOFTMAX_TOPK:
 *               softmax over the chosen k logits (max-subtracted), times routed_scale
 * Selection is a repeated arg-max scan in ascending id (O(top_k * E)); it is the
 * oracle, so it favours obviously-right over fast, and E is at most a few hundred.
 */
#include "moe_internal.h"

#include <math.h>
#include <stdlib.h>

/* Arg-max of v[0..n) over entries with keep[i], strict '>' so ties go to the
 * lower index; -1 when nothing is left. */
static int argmax_kept(const float *v, const unsigned char *keep, int n)
{
    int best = -1;
    for (int i = 0; i < n; i++)
        if (keep[i] && (best < 0 || v[i] > v[best])) best = i;
    return best;
}

static void scores_of(const fm_moe_config *cfg, const float *logits, const float *bias, float *score)
{
    int E = cfg->n_experts;
    if (cfg->score == FM_SCORE_SOFTMAX_TOPK) {
        for (int e = 0; e < E; e++) score[e] = logits[e] + (bias ? bias[e] : 0.0f);
    } else if (cfg->score == FM_SCORE_SOFTMAX) {
        float mx = logits[0];
        for (int e = 1; e < E; e++) mx = logits[e] > mx ? logits[e] : mx;
        float sum = 0.0f;
        for (int e = 0; e < E; e++) {
            score[e] = expf(logits[e] - mx); /* max-subtracted: no overflow */
            sum += score[e];
        }
        for (int e = 0; e < E; e++) score[e] /= sum; /* sum >= 1 (the max term) */
    } else {
        for (int e = 0; e < E; e++) score[e] = 1.0f / (1.0f + expf(-logits[e]));
    }
}

/* Keep only the experts of the topk_group best groups (keep[] in/out). */
static void limit_groups(const fm_moe_config *cfg, const float *biased, unsigned char *keep, float *gscore,
                         unsigned char *gkeep)
{
    int G = cfg->n_group, gs = cfg->n_experts / G;
    for (int g = 0; g < G; g++) {
        const float *b = biased + (size_t)g * gs;
        int i1 = 0;
        for (int i = 1; i < gs; i++)
            if (b[i] > b[i1]) i1 = i;
        int i2 = -1;
        for (int i = 0; i < gs; i++)
            if (i != i1 && (i2 < 0 || b[i] > b[i2])) i2 = i;
        gscore[g] = b[i1] + (i2 >= 0 ? b[i2] : 0.0f);
        gkeep[g] = 1;
    }
    unsigned char *chosen = gkeep + G; /* second half of the scratch */
    for (int g = 0; g < G; g++) chosen[g] = 0;
    for (int r = 0; r < cfg->topk_group; r++) {
        int g = argmax_kept(gscore, gkeep, G);
        chosen[g] = 1;
        gkeep[g] = 0;
    }
    for (int e = 0; e < cfg->n_experts; e++)
        if (!chosen[e / gs]) keep[e] = 0;
}

fm_status fm_moe_route(const fm_moe_config *cfg, const float *router_bias, const float *logits, int T, int32_t *ids,
                       float *weights)
{
    fm_clear_error();
    if (!cfg || !logits || !ids || !weights)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_moe_route: NULL cfg, logits, ids or weights");
    FM_CHECK(fm_moe_config_check(cfg));
    if (T < 1) return fm_fail(FM_ERR_BAD_SHAPE, "fm_moe_route: T=%d < 1", T);
    int E = cfg->n_experts, K = cfg->top_k;
    for (size_t i = 0; i < (size_t)T * E; i++)
        if (!isfinite(logits[i]))
            return fm_fail(FM_ERR_NONFINITE, "fm_moe_route: logits[%zu][%zu] = %g is not finite", i / E, i % E,
                           (double)logits[i]);
    if (router_bias)
        for (int e = 0; e < E; e++)
            if (!isfinite(router_bias[e]))
                return fm_fail(FM_ERR_NONFINITE, "fm_moe_route: router_bias[%d] = %g is not finite", e,
                               (double)router_bias[e]);
    if (router_bias && cfg->score == FM_SCORE_SOFTMAX_TOPK) /* logit + bias must stay finite */
        for (size_t i = 0; i < (size_t)T * E; i++)
            if (!isfinite(logits[i] + router_bias[i % E]))
                return fm_fail(FM_ERR_NONFINITE, "fm_moe_route: logits[%zu][%zu] + router_bias overflows", i / E, i % E);

    int G = cfg->n_group > 1 ? cfg->n_group : 0;
    float *score = malloc(sizeof(float) * (2 * (size_t)E + G + 1));
    unsigned char *keep = malloc((size_t)E + 2 * (size_t)G + 1);
    if (!score || !keep) {
        free(score);
        free(keep);
        return fm_fail(FM_ERR_OOM, "fm_moe_route: out of memory for %d experts", E);
    }
    float *biased = score + E, *gscore = biased + E;
    unsigned char *gkeep = keep + E;

    for (int t = 0; t < T; t++) {
        const int topk_sm = cfg->score == FM_SCORE_SOFTMAX_TOPK;
        scores_of(cfg, logits + (size_t)t * E, router_bias, score);
        for (int e = 0; e < E; e++) {
            biased[e] = score[e] + (router_bias && !topk_sm ? router_bias[e] : 0.0f);
            keep[e] = 1;
        }
        if (G) limit_groups(cfg, biased, keep, gscore, gkeep);
        int32_t *id = ids + (size_t)t * K;
        float *wt = weights + (size_t)t * K, sum = 0.0f;
        for (int j = 0; j < K; j++) {
            int e = argmax_kept(biased, keep, E); /* config_check guarantees enough kept experts */
            keep[e] = 0;
            id[j] = e;
            wt[j] = score[e];
            sum += score[e];
        }
        if (topk_sm) { /* wt[] holds the chosen logits, wt[0] the largest */
            float mx = wt[0], z = 0.0f;
            for (int j = 0; j < K; j++) z += (wt[j] = expf(wt[j] - mx));
            for (int j = 0; j < K; j++) wt[j] = wt[j] / z * cfg->routed_scale; /* z >= 1 */
            continue;
        }
        for (int j = 0; j < K; j++) {
            if (cfg->renormalize && sum > 0.0f) wt[j] /= sum;
            wt[j] *= cfg->routed_scale;
        }
    }
    free(score);
    free(keep);
    return FM_OK;
}
