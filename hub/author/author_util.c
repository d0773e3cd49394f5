/*
 * author_util.c: libkhub_author's error reporting and embedded-file lookup.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "author_impl.h"

khub_status khub__author_fail(char *errbuf, size_t errbuf_size, khub_status st, const char *fmt,
                              ...)
{
    char msg[KHUB_ERROR_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    khub__errbuf(errbuf, errbuf_size, "%s", msg);
    return khub__fail(NULL, st, "%s", msg); /* libkhub's khub_last_error() */
}

const khub_author_embedded *khub__author_template_file(const char *path)
{
    for (size_t i = 0; i < khub__author_templates_count; i++)
        if (strcmp(khub__author_templates[i].path, path) == 0) return &khub__author_templates[i];
    return NULL;
}
