/*
 * author_impl.h: what libkhub_author's files share (the library behind
 * abi/khub/khub_author.h; hub/author/).
 */
#ifndef KHUB_AUTHOR_IMPL_H
#define KHUB_AUTHOR_IMPL_H

#include <stddef.h>

#include "internal.h"
#include "khub/khub_author.h"

/* Formats a one-line message into errbuf (may be NULL) and
 * khub_last_error(), and returns st. */
KHUB_INTERNAL khub_status khub__author_fail(char *errbuf, size_t errbuf_size, khub_status st,
                                            const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* True when a caller's struct (struct_size first) holds at least the fields
 * of 0.1 (the size of the type then). */
#define KHUB_AUTHOR_SIZE_OK(p, type) ((p)->struct_size >= sizeof(type))

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
