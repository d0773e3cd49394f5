/*
 * publish_impl.h: what the files of `khub publish` share: the state of one
 * publish (publish.c) and the collection of the local build's files
 * (publish_collect.c). Nothing outside hub/ includes it.
 */
#ifndef KHUB_HUB_PUBLISH_IMPL_H
#define KHUB_HUB_PUBLISH_IMPL_H

#include "publish.h"

typedef struct khub__pub_file {
    char rel[1024];            /* repo path: build/<variant>/... */
    char path[KHUB__PATH_MAX]; /* local file */
    uint64_t size;
    char sha256[65], sha1[41];
    int lfs;       /* the server's uploadMode */
    int unchanged; /* the branch has it with the same oid */
    int need_put;  /* the LFS batch gave an upload action */
} khub__pub_file;

typedef struct khub__pub {
    khub_hub *hub;
    khub_hub_id id;
    const char *type;   /* "kernels" or "models" */
    const char *prefix; /* "kernels/" or "" */
    khub__pub_file *files;
    size_t n, cap;
    char head[41]; /* branch head the publish read */
    khub_publish_result *res;
} khub__pub;

/* Fills p->files (sorted by repo path) with build/<variant>/ of every
 * variant folder of dir/build holding a metadata.json, and
 * build/<variant>.tar.gz; sets p->res->n_files. Statuses: NOT_FOUND (no
 * build/ or no variant), UNSAFE_PATH, OVERFLOW, IO, NOMEM; the message is
 * on p->hub. */
KHUB_INTERNAL khub_status khub__publish_collect(khub__pub *p, const char *dir);

#endif /* KHUB_HUB_PUBLISH_IMPL_H */
