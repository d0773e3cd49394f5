/*
 * json_strict.c: the strictness shared by the JSON files khub reads where a
 * misread would change a decision:
 *  - an object may hold only the keys its format names, so a typo
 *    ("revokd") is an error that names the key instead of a setting
 *    silently ignored (khub.json, khub.lock, the trust policy,
 *    metadata.json and its .sig);
 *  - khub__json_parse_strict: no object may name one key twice (cJSON
 *    answers the first, jq and Python the last, so two readers of one file
 *    would disagree) and nothing but white space may follow the document
 *    (every file a trust decision reads: the policy, khub.lock,
 *    metadata.json and its .sig; issue 10).
 */
#include <stdlib.h>
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

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Sorting the names (not comparing every pair) keeps a hostile object of
 * 100k members from costing 10^10 comparisons. cJSON's nesting limit bounds
 * the recursion. */
static bool unique_keys(const cJSON *j, const char **dup, bool *nomem)
{
    if (!cJSON_IsObject(j) && !cJSON_IsArray(j)) return true;
    size_t n = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, j) n++;
    if (cJSON_IsObject(j) && n > 1) {
        /* Objects of trust files are small: the stack, without allocating
         * (this runs inside hub calls that have no allocator to hand). */
        const char *small[64];
        const char **names = n <= 64 ? small : khub__mem_calloc(NULL, n, sizeof *names);
        if (!names) {
            *nomem = true;
            return false;
        }
        size_t k = 0;
        cJSON_ArrayForEach(c, j) names[k++] = c->string ? c->string : "";
        qsort(names, n, sizeof *names, cmp_name);
        for (size_t i = 1; i < n && !*dup; i++)
            if (!strcmp(names[i - 1], names[i])) *dup = names[i];
        if (names != small) khub__mem_free(names);
        if (*dup) return false;
    }
    cJSON_ArrayForEach(c, j) if (!unique_keys(c, dup, nomem)) return false;
    return true;
}

bool khub__json_unique_keys(const cJSON *j, const char **dup)
{
    bool nomem = false;
    *dup = NULL;
    if (unique_keys(j, dup, &nomem)) return true;
    if (nomem) *dup = NULL;
    return false;
}

cJSON *khub__json_parse_strict(const char *text, size_t n, char *why, size_t why_size)
{
    const char *end = NULL;
    cJSON *j = text ? cJSON_ParseWithLengthOpts(text, n, &end, false) : NULL;
    if (!j) {
        khub__errbuf(why, why_size, "not valid JSON");
        return NULL;
    }
    size_t used = (size_t)(end - text);
    while (used < n && strchr(" \t\r\n", text[used]) && text[used]) used++;
    if (used < n) {
        cJSON_Delete(j);
        khub__errbuf(why, why_size, "text after the JSON document (at byte %zu)", used);
        return NULL;
    }
    const char *dup = NULL;
    if (!khub__json_unique_keys(j, &dup)) {
        if (dup) /* dup points into j: format before freeing it */
            khub__errbuf(why, why_size, "duplicate key \"%.60s\" (readers disagree on which wins)",
                         dup);
        else
            khub__errbuf(why, why_size, "out of memory");
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}
