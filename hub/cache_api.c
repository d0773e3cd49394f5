/*
 * cache_api.c: the public face of cache administration (khub/khub_cache.h):
 * argument checks over the scan, verify and prune of cache_admin.c and the
 * marker walk of quarantine.c. A misused call (NULL hub or out pointer) is
 * KHUB_STATUS_MISUSE with the message in khub_last_error(), since there may
 * be no hub to hold it.
 */
#include <stdlib.h>

#include "cache_admin.h"
#include "khub/khub_cache.h"
#include "quarantine.h"

khub_status khub_cache_scan(khub_hub *hub, khub_cache_report **out)
{
    if (out) *out = NULL;
    if (!hub || !out)
        return khub__fail(NULL, KHUB_STATUS_MISUSE, "khub_cache_scan: %s is NULL",
                          hub ? "out" : "hub");
    khub_cache_report *r = NULL;
    khub_status st = khub__cache_scan(hub, &r);
    if (st != KHUB_STATUS_OK) {
        khub__cache_report_free(r); /* a partial report is not handed out */
        return st;
    }
    *out = r;
    return KHUB_STATUS_OK;
}

void khub_cache_report_free(khub_cache_report *report) { khub__cache_report_free(report); }

khub_status khub_cache_verify(khub_hub *hub, const char *repo, khub_cache_item_fn fn, void *ud,
                              uint64_t *checked, uint64_t *bad)
{
    if (!hub || !checked || !bad)
        return khub__fail(NULL, KHUB_STATUS_MISUSE, "khub_cache_verify: %s is NULL",
                          !hub       ? "hub"
                          : !checked ? "checked"
                                     : "bad");
    *checked = *bad = 0;
    return khub__cache_verify(hub, repo, fn, ud, checked, bad);
}

khub_status khub_cache_prune(khub_hub *hub, int32_t dry_run, khub_cache_item_fn fn, void *ud,
                             uint64_t *freed)
{
    if (!hub || !freed)
        return khub__fail(NULL, KHUB_STATUS_MISUSE, "khub_cache_prune: %s is NULL",
                          hub ? "freed" : "hub");
    *freed = 0;
    return khub__cache_prune(hub, dry_run != 0, fn, ud, freed);
}

static khub_status quarantine(const char *fname, khub_hub *hub, const char *repo, int clear,
                              khub_cache_quarantine_fn fn, void *ud, size_t *count)
{
    if (!hub || !count)
        return khub__fail(NULL, KHUB_STATUS_MISUSE, "%s: %s is NULL", fname, hub ? "count" : "hub");
    khub__hub_clear(hub);
    return khub__quarantine_walk(hub, repo, clear, fn, ud, count);
}

khub_status khub_cache_quarantine_list(khub_hub *hub, const char *repo, khub_cache_quarantine_fn fn,
                                       void *ud, size_t *count)
{
    return quarantine("khub_cache_quarantine_list", hub, repo, 0, fn, ud, count);
}

khub_status khub_cache_quarantine_clear(khub_hub *hub, const char *repo,
                                        khub_cache_quarantine_fn fn, void *ud, size_t *count)
{
    return quarantine("khub_cache_quarantine_clear", hub, repo, 1, fn, ud, count);
}
