/*
 * author_publish.c: khub_author_publish, the public face of hub/publish.c
 * (which stays in libkhub beside the HTTP client it drives).
 */
#include <stdio.h>
#include <string.h>

#include "author_impl.h"
#include "publish.h"

khub_status khub_author_publish(khub_hub *hub, const khub_author_publish_opts *opts,
                                khub_author_publish_result *res)
{
    if (!hub) return khub__fail(NULL, KHUB_STATUS_MISUSE, "khub_author_publish: hub is NULL");
    /* A refused argument's message is the hub's as well (before session 18
     * only khub_last_error() had it, and khub_hub_errmsg(hub), which
     * `khub publish` prints, kept an earlier call's or nothing). */
    char msg[KHUB_ERROR_SIZE];
    khub_status st = KHUB_AUTHOR_STRUCT(opts, khub_author_publish_opts, message,
                                        "khub_author_publish", "opts", msg, sizeof msg);
    if (st == KHUB_STATUS_OK)
        st = KHUB_AUTHOR_STRUCT(res, khub_author_publish_result, n_deleted, "khub_author_publish",
                                "res", msg, sizeof msg);
    if (st == KHUB_STATUS_OK && !opts->dir)
        st = khub__author_fail(msg, sizeof msg, KHUB_STATUS_MISUSE,
                               "khub_author_publish: opts.dir is NULL");
    if (st != KHUB_STATUS_OK) return khub__publish_refuse(hub, st, msg);
    khub_publish_opts po = {.dir = opts->dir, .repo = opts->repo, .message = opts->message};
    khub_publish_result r = {0};
    st = khub__publish(hub, &po, &r);
    snprintf(res->repo, sizeof res->repo, "%s", r.repo);
    snprintf(res->branch, sizeof res->branch, "%s", r.branch);
    snprintf(res->version, sizeof res->version, "%s", r.version);
    snprintf(res->commit, sizeof res->commit, "%s", r.commit);
    snprintf(res->url, sizeof res->url, "%s", r.url);
    res->changed = r.changed;
    res->created_repo = r.created_repo;
    res->created_branch = r.created_branch;
    res->n_files = r.n_files;
    res->n_unchanged = r.n_unchanged;
    res->n_uploaded = r.n_uploaded;
    res->n_lfs_stored = r.n_lfs_stored;
    res->n_deleted = r.n_deleted;
    return st;
}
