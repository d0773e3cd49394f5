/*
 * json_strict.c: the strictness shared by khub's own JSON files (khub.json,
 * khub.lock): an object may hold only the keys its format names, so a typo
 * is an error that names the key instead of a setting silently ignored.
 */
#include <string.h>

#include <cjson/cJSON.h>

#include "json_strict.h"

bool khub__json_only_keys(const cJSON *o, const char *const *keys, const char **extra)
{
    const cJSON *c;
    cJSON_ArrayForEach(c, o)
    {
        bool ok = false;
        for (const char *const *k = keys; *k && !ok; k++) ok = !strcmp(c->string, *k);
        if (!ok) {
            *extra = c->string;
            return false;
        }
    }
    return true;
}
