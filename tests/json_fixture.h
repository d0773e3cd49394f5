/*
 * json_fixture.h: a test's JSON fixture file, read whole and parsed; the
 * test fails (ASSERT) when the file is missing, unreadable or not JSON.
 * The caller frees the result with cJSON_Delete.
 */
#ifndef KHUB_TESTS_JSON_FIXTURE_H
#define KHUB_TESTS_JSON_FIXTURE_H

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

#include "runner.h"

static inline cJSON *fx_json_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    ASSERT(f != NULL);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    ASSERT(n >= 0);
    char *buf = malloc((size_t)n + 1);
    ASSERT(buf && fread(buf, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    buf[n] = '\0';
    cJSON *j = cJSON_Parse(buf);
    free(buf);
    ASSERT(j != NULL);
    return j;
}

#endif
