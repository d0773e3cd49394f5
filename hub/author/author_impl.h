/*
 * author_impl.h: what libkhub_author's files share (the library behind
 * abi/khub/khub_author.h; hub/author/).
 */
#ifndef KHUB_AUTHOR_IMPL_H
#define KHUB_AUTHOR_IMPL_H

#include <stddef.h>

#include "app_struct.h"
#include "internal.h"
#include "khub/khub_author.h"

/* Formats a one-line message into errbuf (may be NULL) and
 * khub_last_error(), and returns st. */
KHUB_INTERNAL khub_status khub__author_fail(char *errbuf, size_t errbuf_size, khub_status st,
                                            const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Checks a caller's struct p of the author API before it is read or
 * written, as the rest of the app API does (app_struct.h): NULL is MISUSE
 * ("WHO: NAME is NULL"), a struct_size below 0.1's (p reaches no further
 * than last_0_1, the type's last 0.1 field) STRUCT_SIZE ("WHO:
 * NAME.struct_size S is smaller than 0.1's MIN"; MISUSE before session 17),
 * the message in errbuf (may be NULL) and khub_last_error(). */
#define KHUB_AUTHOR_STRUCT(p, type, last_0_1, who, name, errbuf, errbuf_size) \
    khub__author_struct((p), KHUB__SIZE_TO(type, last_0_1), (who), (name), (errbuf), (errbuf_size))

static inline khub_status khub__author_struct(const void *p, size_t min, const char *who,
                                              const char *name, char *errbuf, size_t errbuf_size)
{
    if (!p)
        return khub__author_fail(errbuf, errbuf_size, KHUB_STATUS_MISUSE, "%s: %s is NULL", who,
                                 name);
    char msg[KHUB_ERROR_SIZE];
    khub_status st = khub__app_struct_check(p, min, who, name, msg, sizeof msg);
    return st ? khub__author_fail(errbuf, errbuf_size, st, "%s", msg) : KHUB_STATUS_OK;
}

/* A file of hub/author/templates/, embedded at build time
 * (hub/author/embed-templates.cmake writes author_templates_data.c). */
typedef struct khub_author_embedded {
    const char *path;          /* relative to templates/: "norm/cpu.c", "index.json" */
    const unsigned char *data; /* NUL-terminated */
    size_t size;               /* without the NUL */
} khub_author_embedded;

KHUB_INTERNAL extern const khub_author_embedded khub__author_templates[];
KHUB_INTERNAL extern const size_t khub__author_templates_count;

/* The embedded file at path, or NULL. */
KHUB_INTERNAL const khub_author_embedded *khub__author_template_file(const char *path);

#endif /* KHUB_AUTHOR_IMPL_H */
