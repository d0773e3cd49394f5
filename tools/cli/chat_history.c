/*
 * chat_history.c: a `khub chat` conversation in memory and in its JSON file
 * (chat_history.h). Loading checks everything before it keeps anything:
 * size, NUL bytes, JSON syntax (with the byte where cJSON stopped), the
 * shape, each message's role and content (a string of valid UTF-8), a system
 * message only first. Unknown members of a message ("name", "tool_calls")
 * are ignored, as OpenAI's API ignores them.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "chat_history.h"

/* ======================================================================== */
/* In memory                                                                */
/* ======================================================================== */

/* The static spelling of a role, or NULL when it is not one. */
static const char *role_of(const char *s)
{
    static const char *const roles[] = {"system", "user", "assistant"};
    for (size_t i = 0; i < 3; i++)
        if (!strcmp(s, roles[i])) return roles[i];
    return NULL;
}

int chat_history_add(chat_history *h, const char *role, const char *content, size_t len)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 16;
        const char **r = realloc(h->roles, cap * sizeof *r);
        if (r) h->roles = r;
        char **c = r ? realloc(h->contents, cap * sizeof *c) : NULL;
        if (!c) return -1;
        h->contents = c;
        h->cap = cap;
    }
    char *copy = malloc(len + 1);
    if (!copy) return -1;
    memcpy(copy, content, len);
    copy[len] = '\0';
    h->roles[h->n] = role_of(role);
    h->contents[h->n++] = copy;
    return 0;
}

void chat_history_pop(chat_history *h)
{
    if (h->n) free(h->contents[--h->n]);
}

void chat_history_clear(chat_history *h, int keep_system)
{
    size_t keep = keep_system && h->n && !strcmp(h->roles[0], "system") ? 1 : 0;
    while (h->n > keep) chat_history_pop(h);
}

void chat_history_free(chat_history *h)
{
    chat_history_clear(h, 0);
    free(h->roles);
    free(h->contents);
    memset(h, 0, sizeof *h);
}

void chat_history_swap(chat_history *a, chat_history *b)
{
    chat_history t = *a;
    *a = *b;
    *b = t;
}

/* ======================================================================== */
/* The file                                                                 */
/* ======================================================================== */

static int fail(char *err, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t size, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, size, fmt, ap);
    va_end(ap);
    return -1;
}

int chat_history_save(const chat_history *h, const char *path, char *err, size_t err_size)
{
    cJSON *o = cJSON_CreateObject(), *arr = o ? cJSON_AddArrayToObject(o, "messages") : NULL;
    for (size_t i = 0; arr && i < h->n; i++) {
        cJSON *e = cJSON_CreateObject();
        if (!e || !cJSON_AddStringToObject(e, "role", h->roles[i]) ||
            !cJSON_AddStringToObject(e, "content", h->contents[i]) ||
            !cJSON_AddItemToArray(arr, e)) {
            cJSON_Delete(e);
            arr = NULL;
        }
    }
    char *text = arr ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    if (!text) return fail(err, err_size, "out of memory");
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        cJSON_free(text);
        return fail(err, err_size, "the path is too long");
    }
    FILE *f = fopen(tmp, "w");
    int ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    int why = errno;
    if (f && fclose(f) != 0 && ok) {
        ok = 0;
        why = errno;
    }
    cJSON_free(text);
    if (ok && rename(tmp, path) != 0) {
        ok = 0;
        why = errno;
    }
    if (!ok) {
        if (f) remove(tmp);
        return fail(err, err_size, "%s", strerror(why));
    }
    return 0;
}

/* The file's bytes, NUL-terminated, into *out[*n]; 0 or -1 with err. */
static int read_file(const char *path, char **out, size_t *n, char *err, size_t err_size)
{
    FILE *f = fopen(path, "rb");
    if (!f) return fail(err, err_size, "%s", strerror(errno));
    char *buf = malloc(CHAT_FILE_MAX + 1);
    size_t got = buf ? fread(buf, 1, CHAT_FILE_MAX + 1, f) : 0;
    int bad_read = ferror(f);
    fclose(f);
    if (!buf) return fail(err, err_size, "out of memory");
    if (bad_read || got > CHAT_FILE_MAX) {
        free(buf);
        return bad_read ? fail(err, err_size, "cannot read it (a folder?)")
                        : fail(err, err_size, "it is over %d MiB", CHAT_FILE_MAX >> 20);
    }
    buf[got] = '\0';
    size_t nul = strlen(buf);
    if (nul != got) {
        free(buf);
        return fail(err, err_size, "it holds a NUL byte at offset %zu (not a JSON text file)", nul);
    }
    *out = buf;
    *n = got;
    return 0;
}

/* The offset of the first byte of s that is not valid UTF-8, or -1. */
static long bad_utf8(const unsigned char *s)
{
    for (const unsigned char *p = s; *p;) {
        int n = *p < 0x80 ? 0 : (*p >> 5) == 6 ? 1 : (*p >> 4) == 14 ? 2 : (*p >> 3) == 30 ? 3 : -1;
        if (n < 0 || (n == 1 && *p < 0xc2)) return (long)(p - s);
        for (int k = 1; k <= n; k++)
            if ((p[k] & 0xc0) != 0x80) return (long)(p - s);
        p += n + 1;
    }
    return -1;
}

/* Message i of the file into out; 0 or -1 with err. */
static int take_message(const cJSON *e, size_t i, chat_history *out, char *err, size_t err_size)
{
    if (!cJSON_IsObject(e))
        return fail(err, err_size, "message %zu is not an object {\"role\", \"content\"}", i);
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(e, "role");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
    if (!cJSON_IsString(role))
        return fail(err, err_size, "message %zu: \"role\" is missing or not a string", i);
    if (!role_of(role->valuestring))
        return fail(err, err_size, "message %zu: role \"%.40s\" is not system, user or assistant",
                    i, role->valuestring);
    if (!cJSON_IsString(content))
        return fail(err, err_size, "message %zu: \"content\" is missing or not a string", i);
    long at = bad_utf8((const unsigned char *)content->valuestring);
    if (at >= 0)
        return fail(err, err_size, "message %zu: content is not valid UTF-8 (byte %ld)", i, at);
    if (!strcmp(role->valuestring, "system") && i > 0)
        return fail(err, err_size, "message %zu: a system message may only come first", i);
    if (chat_history_add(out, role->valuestring, content->valuestring,
                         strlen(content->valuestring)))
        return fail(err, err_size, "out of memory");
    return 0;
}

int chat_history_load(const char *path, chat_history *out, char *err, size_t err_size)
{
    char *text = NULL;
    size_t n = 0;
    if (read_file(path, &text, &n, err, err_size)) return -1;
    const char *end = NULL;
    cJSON *doc = cJSON_ParseWithLengthOpts(text, n + 1, &end, 1); /* n + 1: the NUL */
    int rc = 0;
    if (!doc) {
        size_t at = end && end >= text ? (size_t)(end - text) : 0;
        rc = fail(err, err_size, "not JSON: a syntax error at byte %zu of %zu", at, n);
    }
    const cJSON *msgs =
        cJSON_IsArray(doc) ? doc : cJSON_GetObjectItemCaseSensitive(doc, "messages");
    if (!rc && !cJSON_IsArray(msgs))
        rc = fail(err, err_size, "want {\"messages\": [...]} or an array of messages");
    size_t i = 0;
    const cJSON *e;
    const cJSON *list = rc ? NULL : msgs;
    cJSON_ArrayForEach(e, list)
    {
        if ((rc = take_message(e, i++, out, err, err_size))) break;
    }
    if (!rc && i == 0) rc = fail(err, err_size, "it holds no messages");
    cJSON_Delete(doc);
    free(text);
    if (rc) chat_history_free(out);
    return rc;
}
