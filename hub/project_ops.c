/*
 * project_ops.c: what `khub lock`, `sync`, `outdated` and `update` do to a
 * project's lock with a hub (khub_project.h): pin a kernel (resolve,
 * download, hash; refuse a pin moved back to an older build), sync a pin
 * into the cache, and check a pin for a moved branch or newer versions.
 * The downloads and hashing are kernel_fetch.c's; this file adds the
 * lock-level decisions and the versioned results.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app_struct.h"
#include "hub_impl.h"
#include "kernel_fetch.h"
#include "khub/khub_project.h"
#include "lockfile.h"

/* STRUCT_SIZE on hub when the caller's struct s (argument name of who) is
 * below min, 0.1's size; OK otherwise. */
static khub_status check_size(khub_hub *hub, const void *s, size_t min, const char *who,
                              const char *name)
{
    char msg[KHUB_ERROR_SIZE];
    khub_status st = khub__app_struct_check(s, min, who, name, msg, sizeof msg);
    return st == KHUB_STATUS_OK ? st : khub__hub_fail(hub, st, "%s", msg);
}

static void entry_to_pin(const khub_lock_entry *e, khub_lock_pin *p)
{
    *p = (khub_lock_pin){KHUB_APP_INIT(khub_lock_pin), .version = e->version,
                         .n_variants = (uint32_t)e->n_variants};
    snprintf(p->repo, sizeof p->repo, "%s", e->repo);
    snprintf(p->revision, sizeof p->revision, "%s", e->revision);
    snprintf(p->commit, sizeof p->commit, "%s", e->commit);
    snprintf(p->kernel_version, sizeof p->kernel_version, "%s", e->kernel_version);
}

/* ======================================================================== */
/* khub_lock_kernel                                                         */
/* ======================================================================== */

/* Whether e, about to replace old, resolves the same pin (a version or
 * revision the user did not change in khub.json) to an older kernel
 * version. Locks without kernel_version, and versions that do not compare,
 * are never downgrades. */
static bool is_downgrade(const khub_lock_entry *old, const khub_lock_entry *e)
{
    bool comparable = false;
    if (!old || old->version != e->version || strcmp(old->revision, e->revision) != 0 ||
        !old->kernel_version[0] || !e->kernel_version[0])
        return false;
    return khub__lock_version_cmp(e->kernel_version, old->kernel_version, &comparable) < 0 &&
           comparable;
}

khub_status khub_lock_kernel(khub_hub *hub, khub_lock *lock, const khub_hub_id *id,
                             const khub_lock_opts *opts, khub_lock_result *out)
{
    KHUB_API_CHECK(NULL, hub != NULL && lock != NULL && id != NULL);
    khub__hub_clear(hub);
    khub_lock_opts o = {KHUB_APP_INIT(khub_lock_opts)};
    if (opts) {
        KHUB_FORWARD_IF_ERROR(NULL,
                              check_size(hub, opts, KHUB__SIZE_TO(khub_lock_opts, allow_downgrade),
                                         "khub_lock_kernel", "opts"));
        khub__app_copy_in(&o, sizeof o, opts);
    }
    if (out)
        KHUB_FORWARD_IF_ERROR(NULL, check_size(hub, out, KHUB__SIZE_TO(khub_lock_result, previous),
                                               "khub_lock_kernel", "out"));
    if (o.commit && !khub__is_commit_hex(o.commit))
        return khub__hub_fail(hub, KHUB_STATUS_INVALID_ARG,
                              "%s/%s: commit \"%.60s\" is not 40 lowercase hex digits", id->org,
                              id->name, o.commit);
    khub_lock_entry e;
    KHUB_FORWARD_IF_ERROR(NULL, khub__kernel_lock_entry(hub, id, o.commit, &e));
    const khub_lock_entry *old = khub__lock_find(lock, e.repo);
    bool down = is_downgrade(old, &e);
    if (down && !o.allow_downgrade) {
        khub__hub_fail(hub, KHUB_STATUS_DOWNGRADE,
                       "%s: the pin now resolves to commit %.12s, version %s, older than the "
                       "locked %s (commit %.12s): the branch was moved back to an older build; "
                       "refusing to downgrade (khub_lock_opts.allow_downgrade accepts it)",
                       e.repo, e.commit, e.kernel_version, old->kernel_version, old->commit);
        khub__lock_entry_clear(&e);
        return KHUB_STATUS_DOWNGRADE;
    }
    if (out) {
        khub_lock_result r = {KHUB_APP_INIT(khub_lock_result), .replaced = old != NULL,
                              .downgrade = down};
        entry_to_pin(&e, &r.pin);
        if (old) entry_to_pin(old, &r.previous);
        khub__app_copy_out(out, &r, sizeof r); /* the caller's header kept */
    }
    khub_status st = khub__lock_put(lock, &e);
    if (st != KHUB_STATUS_OK) {
        khub__lock_entry_clear(&e);
        return khub__hub_fail(hub, st, "%s: out of memory adding it to the lock", id->name);
    }
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* khub_lock_sync, khub_lock_outdated                                       */
/* ======================================================================== */

static khub_status entry_at(khub_hub *hub, const khub_lock *lock, size_t i,
                            const khub_lock_entry **e)
{
    if (i < lock->count) {
        *e = &lock->items[i];
        return KHUB_STATUS_OK;
    }
    return khub__hub_fail(hub, KHUB_STATUS_NOT_FOUND, "lock entry %zu is past the %zu pins", i,
                          lock->count);
}

khub_status khub_lock_sync(khub_hub *hub, const khub_lock *lock, size_t i,
                           const khub_sync_opts *opts, khub_sync_result *out)
{
    KHUB_API_CHECK(NULL, hub != NULL && lock != NULL);
    khub__hub_clear(hub);
    if (opts)
        KHUB_FORWARD_IF_ERROR(NULL,
                              check_size(hub, opts, KHUB__SIZE_TO(khub_sync_opts, all_variants),
                                         "khub_lock_sync", "opts"));
    if (out)
        KHUB_FORWARD_IF_ERROR(NULL,
                              check_size(hub, out, KHUB__SIZE_TO(khub_sync_result, newer_commit),
                                         "khub_lock_sync", "out"));
    const khub_lock_entry *e = NULL;
    KHUB_FORWARD_IF_ERROR(NULL, entry_at(hub, lock, i, &e));
    size_t n = 0;
    KHUB_FORWARD_IF_ERROR(NULL, khub__kernel_sync_entry(hub, e, opts && opts->all_variants, &n));
    khub_sync_result r = {KHUB_APP_INIT(khub_sync_result), .n_checked = (uint32_t)n};
    /* Only a warning: a cache it cannot read is no reason to fail the sync. */
    if (khub__kernel_cached_newer(hub, e, r.newer_version, r.newer_commit) != KHUB_STATUS_OK) {
        khub__hub_clear(hub);
        r.newer_version[0] = r.newer_commit[0] = '\0';
    }
    if (out) {
        khub__app_copy_out(out, &r, sizeof r); /* the caller's header kept */
    }
    return KHUB_STATUS_OK;
}

khub_status khub_lock_outdated(khub_hub *hub, const khub_lock *lock, size_t i,
                               khub_outdated_result *out)
{
    KHUB_API_CHECK(NULL, hub != NULL && lock != NULL && out != NULL);
    khub__hub_clear(hub);
    KHUB_FORWARD_IF_ERROR(NULL, check_size(hub, out, KHUB__SIZE_TO(khub_outdated_result, newer),
                                           "khub_lock_outdated", "out"));
    const khub_lock_entry *e = NULL;
    KHUB_FORWARD_IF_ERROR(NULL, entry_at(hub, lock, i, &e));
    khub_lock_pin pin;
    entry_to_pin(e, &pin);
    khub_hub_id id;
    if (khub_lock_pin_id(&pin, &id) != KHUB_STATUS_OK)
        return khub__hub_fail(hub, KHUB_STATUS_BAD_ID, "%s", khub_last_error());
    khub_outdated_result r = {KHUB_APP_INIT(khub_outdated_result), .newest = -1};
    int32_t versions[1024];
    size_t n = 0;
    KHUB_FORWARD_IF_ERROR(NULL, khub_hub_resolve(hub, &id, r.now));
    KHUB_FORWARD_IF_ERROR(NULL, khub__kernel_versions(hub, &id, versions, 1024, &n));
    r.moved = strcmp(r.now, e->commit) != 0;
    if (n) r.newest = versions[n - 1];
    for (size_t k = 0; e->version >= 0 && k < n; k++)
        if (versions[k] > e->version && r.n_newer < sizeof r.newer / sizeof r.newer[0])
            r.newer[r.n_newer++] = versions[k];
    khub__app_copy_out(out, &r, sizeof r); /* the caller's header kept */
    return KHUB_STATUS_OK;
}

khub_status khub_kernel_versions(khub_hub *hub, const khub_hub_id *id, int32_t *versions,
                                 size_t cap, size_t *n)
{
    KHUB_API_CHECK(NULL, hub != NULL && id != NULL && n != NULL && (versions || !cap));
    khub__hub_clear(hub);
    return khub__kernel_versions(hub, id, versions, cap, n);
}
