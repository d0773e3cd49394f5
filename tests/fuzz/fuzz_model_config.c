/* fuzz_model_config.c: libFuzzer target for config.json and
 * generation_config.json parsing. */
#include <stdint.h>

#include "model_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    khub_model_config cfg;
    if (khub__model_config_from_json(NULL, "config.json", (const char *)data, size, &cfg) ==
        KHUB_STATUS_OK)
        (void)khub__model_config_apply_generation(NULL, "generation_config.json",
                                                  (const char *)data, size, &cfg);
    return 0;
}
