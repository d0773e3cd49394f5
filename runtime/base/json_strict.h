/* json_strict.h: strict JSON for the files khub decides with (json_strict.c). */
#ifndef KHUB_BASE_JSON_STRICT_H
#define KHUB_BASE_JSON_STRICT_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "internal.h"

/* True when every key of object o is in keys (NULL-ended); else false with
 * *extra = the first other key. */
KHUB_INTERNAL bool khub__json_only_keys(const cJSON *o, const char *const *keys,
                                        const char **extra);
/* True when no object in the tree j names a key twice; else false with
 * *dup = a repeated key (NULL when out of memory). */
KHUB_INTERNAL bool khub__json_unique_keys(const cJSON *j, const char **dup);
/* Parses n bytes of JSON (no NUL needed) and refuses what two JSON readers
 * could read differently: a duplicate key anywhere, or text after the
 * document. NULL with a short reason in why ("duplicate key \"x\" ...",
 * "not valid JSON"); free the result with cJSON_Delete. */
KHUB_PRIVATE_API cJSON *khub__json_parse_strict(const char *text, size_t n, char *why,
                                                size_t why_size);

#endif
