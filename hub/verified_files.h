/*
 * verified_files.h: the sidecar of verified fingerprints of a cached
 * variant's files (khub-verified/<commit>/<variant>, verified_files.c),
 * which variant.c's check of a variant's files reads and writes. A line
 * records the digest a file matched and the stat fingerprint of its bytes
 * ("<sha256> <dev> <ino> <size> <mtime_ns> <ctime_ns> <name>"); a later
 * check trusts a line that matches exactly instead of hashing the file.
 * The sidecar starts with the header line "khub-verified 1".
 */
#ifndef KHUB_HUB_VERIFIED_FILES_H
#define KHUB_HUB_VERIFIED_FILES_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>

#include "hub_impl.h"

/* The sidecar line of path (sb: its stat, or NULL to stat it) as the file
 * `name` of digest sha256, newline-terminated, into buf; *ctime_out (may be
 * NULL) gets its ctime in ns. False when it is no regular file, name holds
 * a newline or buf is too small. */
KHUB_INTERNAL bool khub__verified_line(const char *path, const struct stat *sb, const char *name,
                                       const char *sha256, char *buf, size_t size,
                                       long long *ctime_out);
/* The sidecar's text (allocated from a; free with khub__mem_free), or NULL
 * when there is none usable (absent, empty, too big, another header). Each
 * line after the header follows a newline. */
KHUB_INTERNAL char *khub__verified_read(const khub_allocator *a, const char *path);
/* Appends line to *lines of *len bytes (grown from a); false on OOM. */
KHUB_INTERNAL bool khub__verified_add(const khub_allocator *a, char **lines, size_t *len,
                                      const char *line);
/* Writes lines as the sidecar at path, best effort: a failure is logged at
 * debug level, and hub's error state is left as it was. */
KHUB_INTERNAL void khub__verified_write(khub_hub *hub, const char *path, const char *lines);
/* Whether a file of that ctime (ns) is old enough to be recorded (git's
 * "racily clean" rule). */
KHUB_INTERNAL bool khub__verified_settled(long long ctime_ns);
/* Hashes real (the file `name` of dir) and checks it against want:
 * DIGEST_MISMATCH, or LOCK_MISMATCH naming pinned_by (may be NULL) when a
 * lock pins want too, IO when it cannot be read. On a match, the sidecar
 * line into line ("" when the file changed while it was hashed or is too
 * young to record). note_fresh: also note the file as hashed by this handle
 * (khub__hub_note_fresh), with the fingerprint taken before the hash and
 * only when the one taken after is the same: a file rewritten while or
 * after it was read is hashed again by the next check. */
KHUB_INTERNAL khub_status khub__verified_hash_check(khub_hub *hub, const char *dir,
                                                    const char *name, const char *real,
                                                    const char *want, const char *pinned_by,
                                                    char *line, size_t size, bool note_fresh);

#endif /* KHUB_HUB_VERIFIED_FILES_H */
