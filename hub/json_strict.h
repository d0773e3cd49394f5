/* json_strict.h: strict key checks for khub's own JSON files (json_strict.c). */
#ifndef KHUB_HUB_JSON_STRICT_H
#define KHUB_HUB_JSON_STRICT_H

#include <stdbool.h>

#include <cjson/cJSON.h>

#include "internal.h"

/* True when every key of object o is in keys (NULL-ended); else false with
 * *extra = the first other key. */
KHUB_INTERNAL bool khub__json_only_keys(const cJSON *o, const char *const *keys,
                                        const char **extra);

#endif
