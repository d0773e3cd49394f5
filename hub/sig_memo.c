/*
 * sig_memo.c: a per-process memo of Ed25519 verdicts (issue 14 item 5),
 * used by khub__sig_verify (trust.c).
 *
 * Why it keeps the trust guarantee (docs/kernel-format.md, "Verdicts
 * remembered within a process"):
 *   - Ed25519 verification is a pure function of three byte strings: the
 *     public key, the signature and the signed bytes (RFC 8032 5.1.7;
 *     OpenSSL's check is deterministic, with no randomness and no state).
 *     A second call on the same three strings reaches the same verdict.
 *   - An entry is the SHA-256 of key (32 bytes) || signature (64 bytes) ||
 *     the signed bytes, computed on every call from the bytes being judged
 *     now. The two fixed-width fields come first, so the encoding has one
 *     reading. A changed byte of any of the three gives another digest and
 *     a full verification; a hit needs a SHA-256 second preimage.
 *   - Only successes are recorded. A failure is verified again next time
 *     (and refused again), so nothing an attacker sends can fill the memo
 *     with anything but statements that verified.
 *   - Everything around the verification still runs on every load: the
 *     policy's key lookup and the revocation check (a key revoked since
 *     the first load is refused before the memo is asked), metadata.json's
 *     digest against the statement, the lock, the binding, the file
 *     digests, the loader's hash of the sealed plugin.
 *   - The memo lives in process memory only: whoever can write it can
 *     already change the code that reads it. It is never written to disk
 *     and never shared between processes (a forked child inherits a copy,
 *     which is as true in the child as in the parent).
 *
 * Concurrency: one atomic flag guards the table. A thread that finds it
 * taken does not wait: it verifies the signature itself and records
 * nothing, so no thread ever blocks here (not even in a child forked while
 * another thread held the flag: there the memo stays off for good).
 *
 * Size: KHUB_SIG_MEMO_SLOTS entries of 32 bytes, replaced oldest first.
 * A process sees few distinct signed statements (one per kernel variant
 * it loads), so a small table holds all of them.
 */
#include <stdatomic.h>
#include <string.h>

#include <openssl/evp.h>

#include "trust.h"
#include "memo_flag.h"

static struct {
    unsigned char id[KHUB_SIG_MEMO_SLOTS][32];
    size_t n;    /* entries in use, at most KHUB_SIG_MEMO_SLOTS */
    size_t next; /* the slot the next success replaces */
} memo;
static atomic_flag busy = ATOMIC_FLAG_INIT;
static atomic_size_t n_hits, n_busy;

khub_status khub__sig_memo_id(const khub_pubkey *key, const unsigned char sig[64], const void *data,
                              size_t n, unsigned char id[32])
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned len = 0;
    int ok = ctx && EVP_DigestInit_ex(ctx, khub__sha256_md(), NULL) &&
             EVP_DigestUpdate(ctx, key->raw, 32) && EVP_DigestUpdate(ctx, sig, 64) &&
             EVP_DigestUpdate(ctx, data, n) && EVP_DigestFinal_ex(ctx, id, &len) && len == 32;
    EVP_MD_CTX_free(ctx);
    return ok ? KHUB_STATUS_OK : KHUB_STATUS_INTERNAL;
}

bool khub__sig_memo_find(const unsigned char id[32])
{
    if (!khub__memo_take(&busy)) {
        atomic_fetch_add(&n_busy, 1);
        return false;
    }
    bool hit = false;
    for (size_t i = 0; i < memo.n && !hit; i++) hit = memcmp(memo.id[i], id, 32) == 0;
    khub__memo_give_back(&busy);
    if (hit) atomic_fetch_add(&n_hits, 1);
    return hit;
}

void khub__sig_memo_add(const unsigned char id[32])
{
    if (!khub__memo_take(&busy)) {
        atomic_fetch_add(&n_busy, 1);
        return;
    }
    bool have = false;
    for (size_t i = 0; i < memo.n && !have; i++) have = memcmp(memo.id[i], id, 32) == 0;
    if (!have) {
        memcpy(memo.id[memo.next], id, 32);
        memo.next = (memo.next + 1) % KHUB_SIG_MEMO_SLOTS;
        if (memo.n < KHUB_SIG_MEMO_SLOTS) memo.n++;
    }
    khub__memo_give_back(&busy);
}

void khub__sig_memo_stats(khub_sig_memo_stats *out)
{
    out->hits = atomic_load(&n_hits);
    out->busy = atomic_load(&n_busy);
    khub__memo_take_waiting(&busy);
    out->entries = memo.n;
    khub__memo_give_back(&busy);
}

void khub__sig_memo_clear(void)
{
    khub__memo_take_waiting(&busy);
    memset(&memo, 0, sizeof memo);
    khub__memo_give_back(&busy);
    atomic_store(&n_hits, 0);
    atomic_store(&n_busy, 0);
}
