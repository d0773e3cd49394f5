/*
 * parse_memo.h: a per-process memo of parses keyed by the exact bytes
 * parsed (issue 14 item 5). A warm locked load reads the trust policy,
 * khub.lock and the variant's metadata.json every time; when the bytes read
 * now are, byte for byte, bytes parsed before in this process, the parse
 * kept then is copied out instead of parsed again.
 *
 * Why this keeps the trust design (DESIGN.md "Trust"; docs/kernel-format.md,
 * "Parses remembered within a process"):
 *   - a parse is a pure function of its bytes (khub__trust_policy_parse,
 *     khub__lock_parse, khub__kmeta_parse read nothing else), so the same
 *     bytes give the same parse;
 *   - the key is the bytes themselves, compared in full (memcmp) with a
 *     copy the memo keeps, not a file name, a fingerprint or a digest: every
 *     file is still read on every load, and a changed byte misses;
 *   - nothing is skipped but the parse: every check that runs on the bytes
 *     (the lock's digest of metadata.json, the trust decision on its exact
 *     bytes, before the parse) and on the parse (the table against the lock,
 *     the files against the table, the loader's hash) runs on every load;
 *   - only successes are kept; a failure is parsed (and refused) again, with
 *     its own message, every time.
 *
 * Thread-safe: one atomic flag guards the table, and a thread that finds it
 * taken goes without the memo (parses) instead of waiting, as hub/sig_memo.c.
 */
#ifndef KHUB_HUB_PARSE_MEMO_H
#define KHUB_HUB_PARSE_MEMO_H

#include <stdbool.h>
#include <stddef.h>

#include "internal.h"

/* How one kind of parse is kept and handed out. The memo owns what keep
 * returns (allocated from the C library's allocator: the memo outlives every
 * handle) and frees it with drop. */
typedef struct khub__memo_kind {
    const char *name;                          /* "policy", "lock", "metadata.json" */
    void *(*keep)(const void *parsed);         /* the memo's copy; NULL on OOM */
    bool (*give)(const void *kept, void *out); /* the caller's copy into out; false on OOM */
    void (*drop)(void *kept);
} khub__memo_kind;

/* Slots, shared by every kind, replaced oldest first; inputs larger than
 * KHUB_PARSE_MEMO_MAX_BYTES are never kept. */
#define KHUB_PARSE_MEMO_SLOTS     32
#define KHUB_PARSE_MEMO_MAX_BYTES ((size_t)1 << 20)

/* True when bytes[0..n) were parsed as kind k before in this process:
 * then k->give has filled out from that parse. False (out untouched) on a
 * miss, when another thread holds the table, or when give fails. */
KHUB_INTERNAL bool khub__parse_memo_find(const khub__memo_kind *k, const void *bytes, size_t n,
                                         void *out);
/* Keeps parsed, the successful parse of bytes[0..n) as kind k (best effort:
 * skipped on OOM, for inputs over the bound, or when the table is taken). */
KHUB_INTERNAL void khub__parse_memo_add(const khub__memo_kind *k, const void *bytes, size_t n,
                                        const void *parsed);

/* The SHA-256 of bytes[0..n) as 64 hex digits into hex, kept with the
 * bytes as one more kind of parse: bytes hashed before in this process,
 * byte for byte the same, are answered without hashing them again (a
 * digest is a pure function of the bytes; metadata.json's, which the lock
 * and the signed statement name, on every warm locked load). INTERNAL when
 * hashing fails. */
KHUB_INTERNAL khub_status khub__parse_memo_sha256(const void *bytes, size_t n, char hex[65]);

typedef struct khub_parse_memo_stats {
    size_t hits;    /* finds that answered true */
    size_t busy;    /* finds and adds that went without the table */
    size_t entries; /* parses kept now, <= KHUB_PARSE_MEMO_SLOTS */
} khub_parse_memo_stats;
/* For tests: the counts since the last clear; clear empties the memo. */
KHUB_INTERNAL void khub__parse_memo_stats(khub_parse_memo_stats *out);
KHUB_INTERNAL void khub__parse_memo_clear(void);

#endif
