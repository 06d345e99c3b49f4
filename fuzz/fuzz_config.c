/* fuzz_config.c - libFuzzer target over the config.json parser
 * (fm_cfgjson_parse, src/io/config.c): any byte string either fails with a
 * status or yields settings inside their documented ranges, NUL-terminated
 * strings, and a family lookup that does not crash. Built by fuzz/run.sh with
 * ASan/UBSan straight from the sources.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/config_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fm_cfgjson c;
    memset(&c, 0x5a, sizeof c);
    if (fm_cfgjson_parse((const char *)data, size, "fuzz", &c) != FM_OK) return 0;
    if (!c.present) abort();
    if (memchr(c.model_type, 0, sizeof c.model_type) == NULL || memchr(c.arch, 0, sizeof c.arch) == NULL ||
        memchr(c.quant_method, 0, sizeof c.quant_method) == NULL || memchr(c.quant_format, 0, sizeof c.quant_format) == NULL)
        abort();
    if (c.has_top_k && (c.top_k < 1 || c.top_k > 65536 || !c.top_k_key)) abort();
    if (c.has_score && c.score != FM_SCORE_SIGMOID && c.score != FM_SCORE_SOFTMAX) abort();
    if (c.has_scale && !(c.scale > 0.0f)) abort();
    if (c.has_n_group && (c.n_group < 0 || c.n_group > 65536)) abort();
    if (c.has_renorm && c.renorm != 0 && c.renorm != 1) abort();
    const fm_route_family *f = fm_route_family_find(c.model_type, c.arch);
    if (f && !f->model_type) abort();
    return 0;
}
