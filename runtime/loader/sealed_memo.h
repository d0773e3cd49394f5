/*
 * sealed_memo.h: sealed memfds of downloaded plugins, kept per process
 * after their library was unloaded, for the next load of the same file
 * (issue 14 item 5; docs/kernel-format.md, "Sealed copies kept within a
 * process").
 *
 * A verified load reads the plugin file, copies it into a memfd, seals the
 * memfd and hashes the sealed bytes before dlopen maps them (loader.c).
 * When a runtime lets go of such a plugin, its sealed memfd can be kept
 * instead of closed; a later verified load of the same path, expecting the
 * same digest, takes it when the file is, by its stat, the file the bytes
 * were read from: same device, inode, size, mtime and ctime. It then skips
 * the file's read and the memfd's creation, fill and seal, and goes on as
 * every load does: the sealed bytes are read back and hashed, the digest
 * compared with the expected one, the ELF checks run (or gate_memo.h
 * answers them by that digest), and only then is the memfd dlopened.
 *
 * Why this keeps the trust design (DESIGN.md "Trust"):
 *   - the bytes loaded are the sealed bytes, hashed on this load: a sealed
 *     memfd cannot be written, grown or shrunk by anyone, so they are the
 *     bytes read from the file when it had this fingerprint;
 *   - a changed file misses: any write or metadata change moves its ctime,
 *     which only the kernel sets. Timestamps come from a coarse clock, so a
 *     copy is kept only when the file's ctime was 2 s old when its bytes
 *     were read (git's "racily clean" rule, as the hub's sidecar of
 *     verified fingerprints): a later change then has a newer ctime. A
 *     file replaced by another (rename, copy) has another inode or ctime;
 *   - only copies of loads that succeeded are kept, and a miss on a
 *     changed file drops the copy: nothing about a failure is remembered;
 *   - a kept memfd belongs to the memo alone, never to a loaded library:
 *     a load takes it out and gives it back at unload, so no two runtimes
 *     share one (glibc would hand the second the first's library) and a
 *     library still mapped after dlclose keeps its memfd (plugin_list.c).
 *
 * Thread-safe: one atomic flag guards the table, never waited on (as
 * gate_memo.c): a thread that finds it taken reads the file instead, and
 * an offer it cannot take is closed.
 */
#ifndef KHUB_LOADER_SEALED_MEMO_H
#define KHUB_LOADER_SEALED_MEMO_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>

#include "internal.h"

/* Copies kept, replaced oldest first (the replaced one is closed), and the
 * largest plugin kept: the memo holds at most this many bytes of tmpfs. */
#define KHUB_SEALED_MEMO_SLOTS     8
#define KHUB_SEALED_MEMO_MAX_BYTES ((size_t)16 << 20)

/* What a sealed copy was read from: the file's fstat when it was opened,
 * and whether its ctime was settled (2 s old) then. */
typedef struct khub__sealed_source {
    unsigned long long dev, ino, size;
    long long mtime_ns, ctime_ns;
    bool settled;
} khub__sealed_source;

/* The source of a file read now, from the fstat of its descriptor. */
KHUB_INTERNAL void khub__sealed_source_of(const struct stat *sb, khub__sealed_source *out);
/* Takes the kept sealed memfd of path whose bytes have SHA-256 sha256 and
 * whose file stat()s now as src says it did: its fd (the caller owns it),
 * with *size and name (the memfd's, as in /proc/self/maps) and *src; -1
 * when there is none, and a kept copy of path whose file changed is
 * dropped. */
KHUB_INTERNAL int khub__sealed_memo_take(const char *path, const char *sha256, size_t *size,
                                         char name[48], khub__sealed_source *src);
/* Offers fd, a sealed memfd of size bytes no loaded library maps, holding
 * the bytes of SHA-256 sha256 read from path (src). True when kept (the
 * memo owns fd now); false when not (the caller closes it): an unsettled
 * source, a copy over KHUB_SEALED_MEMO_MAX_BYTES, or the table taken. */
KHUB_INTERNAL bool khub__sealed_memo_put(const char *path, const char *sha256,
                                         const khub__sealed_source *src, int fd, size_t size,
                                         const char *name);

typedef struct khub_sealed_memo_stats {
    size_t hits;    /* takes that handed out a memfd */
    size_t entries; /* copies held now, <= KHUB_SEALED_MEMO_SLOTS */
} khub_sealed_memo_stats;

/* For the tests. */
KHUB_INTERNAL void khub__sealed_memo_stats(khub_sealed_memo_stats *out);
KHUB_INTERNAL void khub__sealed_memo_clear(void); /* closes every kept memfd */

#endif
