/*
 * parse_memo.c: a per-process memo of parses keyed by the exact bytes
 * parsed (parse_memo.h says what it is for and why it keeps the trust
 * design; issue 14 item 5).
 *
 * A slot holds its kind, a copy of the bytes and the kind's own copy of
 * the parse. A find compares the length and then every byte with the copy;
 * a digest or a file's identity would be a weaker key, and the inputs are
 * small (a policy, a lock, a metadata.json: hundreds of bytes to a few KB),
 * so the full comparison costs less than hashing them would.
 *
 * Concurrency: one atomic flag guards the table, never waited on (as
 * hub/sig_memo.c): a thread that finds it taken parses for itself. The
 * copies an add needs are made before the flag is taken and a replaced
 * slot's are freed after it is given back, so nothing allocates or frees
 * under the flag but a kind's give (one copy out).
 */
#include <stdatomic.h>
#include <string.h>

#include "parse_memo.h"
#include "memo_flag.h"

typedef struct slot {
    const khub__memo_kind *kind; /* NULL: empty */
    unsigned char *bytes;        /* [n], the memo's copy (khub__mem_alloc, C library) */
    size_t n;
    void *kept; /* kind->keep's copy of the parse */
} slot;

static struct {
    slot s[KHUB_PARSE_MEMO_SLOTS];
    size_t next; /* the slot the next add replaces */
} memo;
static atomic_flag busy = ATOMIC_FLAG_INIT;
static atomic_size_t n_hits, n_busy;

static const slot *find_slot(const khub__memo_kind *k, const void *bytes, size_t n)
{
    for (size_t i = 0; i < KHUB_PARSE_MEMO_SLOTS; i++) {
        const slot *s = &memo.s[i];
        if (s->kind == k && s->n == n && memcmp(s->bytes, bytes, n) == 0) return s;
    }
    return NULL;
}

bool khub__parse_memo_find(const khub__memo_kind *k, const void *bytes, size_t n, void *out)
{
    if (!khub__memo_take(&busy)) {
        atomic_fetch_add(&n_busy, 1);
        return false;
    }
    const slot *s = find_slot(k, bytes, n);
    bool hit = s && k->give(s->kept, out);
    khub__memo_give_back(&busy);
    if (hit) atomic_fetch_add(&n_hits, 1);
    return hit;
}

void khub__parse_memo_add(const khub__memo_kind *k, const void *bytes, size_t n, const void *parsed)
{
    if (n > KHUB_PARSE_MEMO_MAX_BYTES) return;
    slot fresh = {k, khub__mem_alloc(NULL, n ? n : 1), n, k->keep(parsed)};
    if (!fresh.bytes || !fresh.kept) goto drop;
    memcpy(fresh.bytes, bytes, n);
    if (!khub__memo_take(&busy)) {
        atomic_fetch_add(&n_busy, 1);
        goto drop;
    }
    if (!find_slot(k, bytes, n)) {
        slot old = memo.s[memo.next];
        memo.s[memo.next] = fresh;
        memo.next = (memo.next + 1) % KHUB_PARSE_MEMO_SLOTS;
        fresh = old; /* freed below, outside the flag */
    }
    khub__memo_give_back(&busy);
drop:
    if (fresh.kept) fresh.kind->drop(fresh.kept);
    khub__mem_free(fresh.bytes);
}

void khub__parse_memo_stats(khub_parse_memo_stats *out)
{
    out->hits = atomic_load(&n_hits);
    out->busy = atomic_load(&n_busy);
    out->entries = 0;
    khub__memo_take_waiting(&busy);
    for (size_t i = 0; i < KHUB_PARSE_MEMO_SLOTS; i++) out->entries += memo.s[i].kind != NULL;
    khub__memo_give_back(&busy);
}

void khub__parse_memo_clear(void)
{
    khub__memo_take_waiting(&busy);
    slot old[KHUB_PARSE_MEMO_SLOTS];
    memcpy(old, memo.s, sizeof old);
    memset(&memo, 0, sizeof memo);
    khub__memo_give_back(&busy);
    for (size_t i = 0; i < KHUB_PARSE_MEMO_SLOTS; i++) {
        if (old[i].kept) old[i].kind->drop(old[i].kept);
        khub__mem_free(old[i].bytes);
    }
    atomic_store(&n_hits, 0);
    atomic_store(&n_busy, 0);
}

/* ======================================================================== */
/* Digests as a kind of parse                                               */
/* ======================================================================== */

static void *digest_keep(const void *hex)
{
    char *c = khub__mem_alloc(NULL, 65);
    if (c) memcpy(c, hex, 65);
    return c;
}

static bool digest_give(const void *kept, void *out)
{
    memcpy(out, kept, 65);
    return true;
}

static const khub__memo_kind digest_memo = {"sha256", digest_keep, digest_give, khub__mem_free};

khub_status khub__parse_memo_sha256(const void *bytes, size_t n, char hex[65])
{
    if (khub__parse_memo_find(&digest_memo, bytes, n, hex)) return KHUB_STATUS_OK;
    KHUB_FORWARD_IF_ERROR(NULL, khub__sha256_hex(bytes, n, hex));
    khub__parse_memo_add(&digest_memo, bytes, n, hex);
    return KHUB_STATUS_OK;
}
