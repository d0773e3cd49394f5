/*
 * gate_memo.c: a per-process memo of the load-time ELF checks passed,
 * keyed by the SHA-256 of the sealed bytes (gate_memo.h says why it keeps
 * the trust design; issue 14 item 5). On Zen 2 the inspection and the ABI
 * gate's libelf pass cost ~6 us of a ~165 us warm locked load
 * (docs/performance.md, "Warm load, session 14").
 *
 * Concurrency as hub/sig_memo.c: one atomic flag, never waited on.
 */
#include <stdatomic.h>
#include <string.h>

#include "gate_memo.h"
#include "memo_flag.h"

typedef struct slot {
    char sha256[65]; /* "" = empty */
    bool gated;
    khub_plugin_info info;
} slot;

static struct {
    slot s[KHUB_GATE_MEMO_SLOTS];
    size_t n;    /* slots in use */
    size_t next; /* the slot the next add replaces */
} memo;
static atomic_flag busy = ATOMIC_FLAG_INIT;
static atomic_size_t n_hits;

/* The slot of sha256, or NULL. */
static slot *find(const char *sha256)
{
    for (size_t i = 0; i < memo.n; i++)
        if (!strcmp(memo.s[i].sha256, sha256)) return &memo.s[i];
    return NULL;
}

bool khub__gate_memo_find(const char *sha256, bool gated, khub_plugin_info *info)
{
    if (!khub__memo_take(&busy)) return false;
    const slot *s = find(sha256);
    bool hit = s && (s->gated || !gated);
    if (hit) *info = s->info;
    khub__memo_give_back(&busy);
    if (hit) atomic_fetch_add(&n_hits, 1);
    return hit;
}

void khub__gate_memo_add(const char *sha256, bool gated, const khub_plugin_info *info)
{
    if (strlen(sha256) != 64 || !khub__memo_take(&busy)) return;
    slot *s = find(sha256);
    if (!s) {
        s = &memo.s[memo.next];
        memo.next = (memo.next + 1) % KHUB_GATE_MEMO_SLOTS;
        if (memo.n < KHUB_GATE_MEMO_SLOTS) memo.n++;
        memcpy(s->sha256, sha256, 65);
        s->gated = false;
    }
    s->gated = s->gated || gated;
    s->info = *info;
    khub__memo_give_back(&busy);
}

void khub__gate_memo_stats(khub_gate_memo_stats *out)
{
    out->hits = atomic_load(&n_hits);
    khub__memo_take_waiting(&busy);
    out->entries = memo.n;
    khub__memo_give_back(&busy);
}

void khub__gate_memo_clear(void)
{
    khub__memo_take_waiting(&busy);
    memset(&memo, 0, sizeof memo);
    khub__memo_give_back(&busy);
    atomic_store(&n_hits, 0);
}
