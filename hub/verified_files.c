/*
 * verified_files.c: the sidecar of verified fingerprints of a cached
 * variant's files, khub-verified/<commit>/<variant> (verified_files.h), and
 * the digest check whose success it records: what lets a warm verify of a
 * variant (variant.c's check_files) trust a file unchanged since it was
 * hashed instead of hashing it again. Moved out of variant.c (session 15),
 * unchanged.
 */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "hub_impl.h"
#include "verified_files.h"

/* ------------------------------------------------------------------------ */
/* Verified fingerprints: khub-verified/<commit>/<variant>                  */
/* ------------------------------------------------------------------------ */

/* Re-hashing every file of a cached variant on every resolve made a warm
 * verify cost ~1.7 ms for 2.8 MB (docs/performance.md "Hub"). After a file
 * has been hashed and matched metadata.json, one line records the digest
 * it matched and the stat fingerprint of the bytes (device, inode, size,
 * mtime and ctime in ns, taken before and after the hash and equal). A
 * later verify trusts a line that matches exactly (same name, same digest
 * metadata.json now states, same fingerprint) instead of hashing; anything
 * else is hashed. Writing a file in place moves its mtime and ctime,
 * replacing it moves the inode, and ctime cannot be set from user space.
 *
 * This is a cache of check_files' answer (variant.c), not of what gets
 * loaded: the loader hashes the exact bytes it copies into a sealed memfd
 * and compares them with the digest before dlopen, an artifact is hashed
 * when it is read, `khub sync` re-hashes every locked file against khub.lock
 * (khub__lock_check_dir), and `khub cache verify` re-hashes every blob. A
 * locked load trusts this sidecar like any load (since session 10): the
 * digests it checks against are then the lock's (the judge's table check),
 * and what runs or is read is hashed where it is used. */

#define VERIFIED_MAX (1u << 20)

/* " <v>" in decimal at p (as printf's " %llu", or " %lld" when neg); returns
 * the end. */
static char *put_number(char *p, unsigned long long v, bool neg)
{
    char digits[24];
    int n = 0;
    do digits[n++] = (char)('0' + v % 10);
    while (v /= 10);
    *p++ = ' ';
    if (neg) *p++ = '-';
    while (n) *p++ = digits[--n];
    return p;
}

static char *put_signed(char *p, long long v)
{
    return put_number(p, v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v, v < 0);
}

/* "<sha256> <dev> <ino> <size> <mtime_ns> <ctime_ns>" of path (of sb, its
 * stat, when not NULL) into buf; ctime_out, when not NULL, receives the
 * ctime in ns. Formatted by hand, byte for byte what snprintf's "%s %llu
 * %llu %llu %lld %lld" wrote (sidecars of older builds still match): two
 * files of every warm load (docs/performance.md, "Warm load, session 16"). */
static bool fingerprint_of(const char *path, const struct stat *sb, const char *sha256, char *buf,
                           size_t size, long long *ctime_out)
{
    struct stat own;
    if (!sb && stat(path, &own) != 0) return false;
    if (!sb) sb = &own;
    if (!S_ISREG(sb->st_mode)) return false;
    long long mt = (long long)sb->st_mtim.tv_sec * 1000000000 + sb->st_mtim.tv_nsec;
    long long ct = (long long)sb->st_ctim.tv_sec * 1000000000 + sb->st_ctim.tv_nsec;
    if (ctime_out) *ctime_out = ct;
    char text[256], *p = text;
    size_t n = strlen(sha256);
    if (n > 64) return false;
    memcpy(p, sha256, n);
    p = put_number(p + n, (unsigned long long)sb->st_dev, false);
    p = put_number(p, (unsigned long long)sb->st_ino, false);
    p = put_number(p, (unsigned long long)sb->st_size, false);
    p = put_signed(put_signed(p, mt), ct);
    n = (size_t)(p - text);
    if (n >= size) return false;
    memcpy(buf, text, n);
    buf[n] = '\0';
    return true;
}

/* One sidecar line: the fingerprint, the file's name in the variant. */
bool khub__verified_line(const char *path, const struct stat *sb, const char *name,
                         const char *sha256, char *buf, size_t size, long long *ctime_out)
{
    char fp[160];
    if (strchr(name, '\n') || !fingerprint_of(path, sb, sha256, fp, sizeof fp, ctime_out))
        return false;
    return khub__concat(buf, size, (const char *const[]){fp, " ", name, "\n", NULL});
}

/* Keeps fp (a fingerprint_of text) as hashed by this handle. */
static void note_fingerprint(khub_hub *hub, const char fp[160])
{
    memcpy(hub->fresh[hub->n_fresh++ % 8], fp, 160);
}

void khub__hub_note_fresh(khub_hub *hub, const char *path, const char *sha256)
{
    char fp[160];
    if (fingerprint_of(path, NULL, sha256, fp, sizeof fp, NULL)) note_fingerprint(hub, fp);
}

bool khub__hub_is_fresh(const khub_hub *hub, const char *path, const char *sha256)
{
    char fp[160];
    if (!fingerprint_of(path, NULL, sha256, fp, sizeof fp, NULL)) return false;
    for (unsigned i = 0; i < 8 && i < hub->n_fresh; i++)
        if (!strcmp(hub->fresh[i], fp)) return true;
    return false;
}

/* The sidecar's text, or NULL when there is none usable (absent, empty,
 * over VERIFIED_MAX, or another header). Every line after the header
 * follows a newline, so each can be found as "\n<line>". Read by the
 * fstat-sized whole-file read: no stdio stream and no VERIFIED_MAX-sized
 * buffer per load (docs/performance.md, "Warm load, session 13"). */
char *khub__verified_read(const khub_allocator *a, const char *path)
{
    char *text = NULL;
    size_t n = 0;
    if (khub__read_file_mem(a, path, VERIFIED_MAX - 1, &text, &n, NULL, 0) != KHUB_STATUS_OK)
        return NULL;
    if (strncmp(text, "khub-verified 1\n", 16) != 0) {
        khub__mem_free(text);
        return NULL;
    }
    return text;
}

/* Appends line to *lines (grown as needed); false on OOM. */
bool khub__verified_add(const khub_allocator *a, char **lines, size_t *len, const char *line)
{
    size_t l = strlen(line);
    char *p = khub__mem_realloc(a, *lines, *len + l + 1);
    if (!p) return false;
    memcpy(p + *len, line, l + 1);
    *lines = p;
    *len += l;
    return true;
}

/* Best effort, like the tree cache: a read-only cache still verifies. */
void khub__verified_write(khub_hub *hub, const char *path, const char *lines)
{
    char dir[KHUB__PATH_MAX], msg[KHUB_ERROR_SIZE];
    int saved = hub->err_set;
    memcpy(msg, hub->errmsg, sizeof msg);
    hub->err_set = 0;
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    if (khub__mkdirs(hub, dir) != KHUB_STATUS_OK ||
        khub__atomic_write(hub, path, lines, strlen(lines)) != KHUB_STATUS_OK)
        khub__log(hub->rt, KHUB_LOG_DEBUG, "not recording verified fingerprints: %s", hub->errmsg);
    hub->err_set = saved;
    memcpy(hub->errmsg, msg, sizeof msg);
}

/* Git's "racily clean" rule: timestamps come from a coarse clock (a
 * scheduler tick, a whole second on some filesystems), so a file changed
 * in the same tick as the change that set its ctime keeps the same
 * fingerprint. A file whose ctime is at least SETTLE_NS in the past can
 * only be changed later under a newer ctime; a younger one is not
 * recorded (it is hashed again next time). */
#define SETTLE_NS 2000000000LL

bool khub__verified_settled(long long ctime_ns)
{
    struct timespec now;
    if (clock_gettime(CLOCK_REALTIME, &now) != 0) return false;
    return ctime_ns + SETTLE_NS <= (long long)now.tv_sec * 1000000000 + now.tv_nsec;
}

/* Hashes real and checks it against want; on a match, the fingerprint line
 * into line ("" when the file changed while it was hashed). pinned_by (may
 * be NULL): the file that pins want as well ("khub.lock"), named in the
 * LOCK_MISMATCH a mismatch then is. */
khub_status khub__verified_hash_check(khub_hub *hub, const char *dir, const char *name,
                                      const char *real, const char *want, const char *pinned_by,
                                      char *line, size_t size, bool note_fresh)
{
    char before[KHUB__PATH_MAX + 200], after[KHUB__PATH_MAX + 200], fp[160], got[65];
    long long ct = 0;
    struct stat sb;
    /* one stat before the hash gives both the sidecar line and the fresh
     * note: what is recorded is what the file was when its bytes were read */
    bool fp_ok = stat(real, &sb) == 0 &&
                 khub__verified_line(real, &sb, name, want, before, sizeof before, &ct) &&
                 fingerprint_of(real, &sb, want, fp, sizeof fp, NULL);
    if (khub__sha256_file_hex(real, got) != KHUB_STATUS_OK)
        return khub__hub_fail(hub, KHUB_STATUS_IO, "cannot read %s", real);
    if (!khub__digest_eq(got, want) && pinned_by)
        return khub__hub_fail(hub, KHUB_STATUS_LOCK_MISMATCH,
                              "%s: %s has SHA-256 %s, %s says %s (as metadata.json does); the "
                              "cached copy was changed: delete it and run khub sync",
                              dir, name, got, pinned_by, want);
    if (!khub__digest_eq(got, want))
        return khub__hub_fail(hub, KHUB_STATUS_DIGEST_MISMATCH,
                              "%s: %s has SHA-256 %s, metadata.json says %s", dir, name, got, want);
    /* unchanged while hashed: the same fingerprint after as before */
    bool unchanged = fp_ok &&
                     khub__verified_line(real, NULL, name, want, after, sizeof after, NULL) &&
                     strcmp(after, before) == 0;
    line[0] = '\0';
    if (unchanged && khub__verified_settled(ct) &&
        !khub__concat(line, size, (const char *const[]){before, NULL}))
        line[0] = '\0';
    if (unchanged && note_fresh) note_fingerprint(hub, fp);
    return KHUB_STATUS_OK;
}
