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

/* True when a caller's struct (struct_size first) holds at least the fields
 * of 0.1: it reaches last_0_1, the type's last field in 0.1 (app_struct.h;
 * since session 17, where it asked for this header's sizeof, which would
 * have refused every 0.1 caller once a field was appended). */
#define KHUB_AUTHOR_SIZE_OK(p, type, last_0_1) KHUB__APP_HAS(p, type, last_0_1)

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
