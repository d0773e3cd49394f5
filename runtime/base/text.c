/*
 * text.c: khub__text, a growing text in the runtime's memory (internal.h),
 * shared by the registry's selection traces and the placement section of
 * khub_model_explain; khub__concat, strings joined into a fixed buffer.
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"

void khub__text_add(khub__text *t, const char *fmt, ...)
{
    if (t->oom) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    size_t need = t->len + (size_t)n + 1;
    if (need > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < need) cap *= 2;
        char *s = khub__realloc(t->rt, t->s, t->cap, cap);
        if (!s) {
            t->oom = true;
            return;
        }
        t->s = s, t->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(t->s + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    t->len += (size_t)n;
}

bool khub__concat(char *buf, size_t size, const char *const *parts)
{
    size_t len = 0;
    for (; *parts; parts++) {
        size_t n = strlen(*parts);
        if (n >= size - len) {
            memcpy(buf + len, *parts, size - len - 1);
            buf[size - 1] = '\0';
            return false;
        }
        memcpy(buf + len, *parts, n);
        len += n;
    }
    buf[len] = '\0';
    return true;
}

void khub__text_free(khub__text *t)
{
    khub__free(t->rt, t->s, t->cap);
    t->s = NULL, t->len = t->cap = 0;
}
