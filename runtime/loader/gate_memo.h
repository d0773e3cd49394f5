/*
 * gate_memo.h: a per-process memo of the load-time ELF checks a plugin's
 * sealed bytes passed (issue 14 item 5), used by load_sealed (loader.c).
 *
 * Every load reads the plugin into a sealed memfd and hashes the sealed
 * bytes. When that SHA-256 is the digest of bytes that passed the checks
 * before in this process, the inspection (ELF header, ABI note, the
 * host's ABI range) and, for a downloaded plugin, the ABI gate
 * (elf_gate.h) are not run again: their answer is copied out.
 *
 * Why this keeps the trust design (DESIGN.md "Trust"; docs/kernel-format.md,
 * "Verdicts remembered within a process"):
 *   - both checks are pure functions of the bytes and of this process's
 *     fixed host (its architecture, its ABI range, the default allow-list
 *     and its glibc as the ceiling: a load always gates with that policy);
 *   - the key is the SHA-256 of the sealed bytes, computed on every load
 *     from the bytes that will be dlopened, after the seal: changed bytes
 *     give another digest (a hit would need a SHA-256 second preimage),
 *     whatever the file's name, size or timestamps;
 *   - the digest is still compared with the expected one on every load,
 *     before the memo is asked;
 *   - only passes are kept; bytes that failed are checked (and refused,
 *     with their own message) again every time; a pass without the gate
 *     (khub_plugin_load) never answers for a load that must gate.
 *
 * Thread-safe: one atomic flag guards the table, never waited on (as
 * hub/sig_memo.c): a thread that finds it taken runs the checks itself.
 */
#ifndef KHUB_LOADER_GATE_MEMO_H
#define KHUB_LOADER_GATE_MEMO_H

#include <stdbool.h>

#include "internal.h"

/* Digests kept, replaced oldest first: a process loads few distinct builds. */
#define KHUB_GATE_MEMO_SLOTS 32

/* True when bytes of SHA-256 sha256 (64 hex digits) passed the inspection,
 * and the ABI gate as well when gated, before in this process: then *info
 * holds what the inspection filled in. False (info untouched) otherwise. */
KHUB_INTERNAL bool khub__gate_memo_find(const char *sha256, bool gated, khub_plugin_info *info);
/* Keeps a pass: the bytes of SHA-256 sha256 were inspected into *info, and
 * gated when gated (best effort: skipped when the table is taken). */
KHUB_INTERNAL void khub__gate_memo_add(const char *sha256, bool gated,
                                       const khub_plugin_info *info);

typedef struct khub_gate_memo_stats {
    size_t hits;    /* finds that answered true */
    size_t entries; /* passes held now, <= KHUB_GATE_MEMO_SLOTS */
} khub_gate_memo_stats;

/* For the tests. */
KHUB_INTERNAL void khub__gate_memo_stats(khub_gate_memo_stats *out);
KHUB_INTERNAL void khub__gate_memo_clear(void);

#endif
