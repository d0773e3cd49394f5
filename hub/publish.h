/*
 * publish.h: `khub publish DIR`: uploads what `khub build DIR` produced
 * (DIR/build/<variant>/ and DIR/build/<variant>.tar.gz) to branch
 * v<major> of the kernel.json's repo over the Hub's write protocol, as the
 * Hub's kernel-builder upload does:
 *
 *   POST /api/repos/create (409 = exists), GET refs, POST branch v<major>
 *   (from main) when missing, list the branch's build/ tree, POST preupload
 *   (regular or LFS), POST the LFS batch (sha256, basic), PUT each missing
 *   object to its href without credentials, POST verify (with the token
 *   only when verify is on the endpoint's host), then one NDJSON commit to
 *   v<major> with parentCommit: changed files, and deletedFile for files
 *   under build/ that the build no longer has.
 *
 * The token is hub's (HF_TOKEN, HF_TOKEN_PATH, the token file, or the
 * caller's); it goes to the endpoint's origin only. Progress of uploads
 * goes to hub's progress callback. Internal: used by tools/cli and tests.
 */
#ifndef KHUB_HUB_PUBLISH_H
#define KHUB_HUB_PUBLISH_H

#include <stddef.h>
#include <stdint.h>

#include "hub_impl.h"

typedef struct khub_publish_opts {
    const char *dir;     /* the kernel source tree: kernel.json and build/ (borrowed) */
    const char *repo;    /* "org/name" instead of kernel.json's, NULL = kernel.json's */
    const char *message; /* commit summary, NULL = "Upload <repo> <version> (khub publish)" */
} khub_publish_opts;

typedef struct khub_publish_result {
    char repo[200];      /* "org/name" */
    char branch[32];     /* "v1" */
    char version[32];    /* kernel.json's version */
    char commit[41];     /* the new commit, or the branch head when nothing changed */
    char url[1024];      /* the server's commitUrl, "" when nothing changed */
    int changed;         /* 0: the branch already had exactly these files */
    int created_repo;    /* the repo did not exist */
    int created_branch;  /* v<major> did not exist */
    size_t n_files;      /* files in the build */
    size_t n_unchanged;  /* already on the branch with the same content */
    size_t n_uploaded;   /* LFS objects PUT */
    size_t n_lfs_stored; /* LFS objects the server already had */
    size_t n_deleted;    /* stale files removed from build/ */
} khub_publish_result;

/* Publishes o->dir. Statuses: NOT_FOUND (no kernel.json or no built
 * variant), PARSE (kernel.json or a server answer), UNAUTHORIZED (401/403:
 * token missing, rejected or without write access), EXISTS (409 on a
 * commit), HTTP (412: the branch moved during the publish; other codes),
 * NETWORK, UNSAFE_PATH (a symlink or odd name in build/), IO, OVERFLOW.
 * The message is khub_hub_errmsg(hub). */
KHUB_PRIVATE_API khub_status khub__publish(khub_hub *hub, const khub_publish_opts *o,
                                           khub_publish_result *res);
/* A publish refused before it starts (khub_author_publish's arguments):
 * msg replaces hub's message, as khub__publish's own failures set it, and
 * goes into khub_last_error(). Returns st. */
KHUB_PRIVATE_API khub_status khub__publish_refuse(khub_hub *hub, khub_status st, const char *msg);

#endif /* KHUB_HUB_PUBLISH_H */
