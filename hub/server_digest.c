/*
 * server_digest.c: the digest cache of `khub serve`.
 *
 * Listings, HEADs, GETs and preuploads all need a file's SHA-256 (and git
 * blob SHA-1). Hashing on every request made a HEAD of a 100 MiB file cost
 * a full read (docs/performance.md "Hub"), so digests are kept per path
 * with the stat fingerprint they were computed under (device, inode, size,
 * mtime and ctime in ns) and reused only while all of it is unchanged. A
 * rewrite in place moves mtime/ctime, a rename-over moves the inode. The
 * fingerprint is taken before and after hashing and the result is kept
 * only when both agree, so a file changing mid-hash is never cached, and
 * only for a file whose ctime is 2 s old: timestamps come from a coarse
 * clock, so a younger file could still change under the same fingerprint
 * (git's "racily clean" entries). The table is direct-mapped: a colliding
 * path evicts the old one (a re-hash, never a wrong answer, because the
 * path is compared too). The fingerprint and the bytes hashed are those of
 * one open file: serve_file hashes the very fd whose bytes it sends.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "server_impl.h"

typedef struct fprint {
    uint64_t dev, ino, size;
    int64_t mtime_ns, ctime_ns;
} fprint;

typedef struct digest_slot {
    char *path; /* NULL = empty */
    int lfs;
    fprint fp;
    file_ids ids;
} digest_slot;

#define DIGEST_SLOTS 4096u

typedef struct digest_cache {
    pthread_mutex_t lock;
    digest_slot slot[DIGEST_SLOTS];
} digest_cache;

struct digest_cache *khub__srv_digest_cache_new(void)
{
    digest_cache *dc = calloc(1, sizeof *dc);
    if (dc) pthread_mutex_init(&dc->lock, NULL);
    return dc;
}

void khub__srv_digest_cache_free(digest_cache *dc)
{
    if (!dc) return;
    for (unsigned i = 0; i < DIGEST_SLOTS; i++) free(dc->slot[i].path);
    pthread_mutex_destroy(&dc->lock);
    free(dc);
}

static int fprint_of(int fd, fprint *fp)
{
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) return 0;
    *fp = (fprint){(uint64_t)sb.st_dev, (uint64_t)sb.st_ino, (uint64_t)sb.st_size,
                   (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec,
                   (int64_t)sb.st_ctim.tv_sec * 1000000000 + sb.st_ctim.tv_nsec};
    return 1;
}

static int fprint_eq(const fprint *a, const fprint *b)
{
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime_ns == b->mtime_ns && a->ctime_ns == b->ctime_ns;
}

static unsigned path_slot(const char *path)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)path; *p; p++) h = (h ^ *p) * 16777619u;
    return h % DIGEST_SLOTS;
}

static int digest_lookup(digest_cache *dc, const char *path, int lfs, const fprint *fp,
                         file_ids *ids)
{
    if (!dc) return 0;
    digest_slot *e = &dc->slot[path_slot(path)];
    pthread_mutex_lock(&dc->lock);
    int hit = e->path && e->lfs == lfs && !strcmp(e->path, path) && fprint_eq(&e->fp, fp);
    if (hit) *ids = e->ids;
    pthread_mutex_unlock(&dc->lock);
    return hit;
}

static void digest_store(digest_cache *dc, const char *path, int lfs, const fprint *fp,
                         const file_ids *ids)
{
    char *copy = dc ? strdup(path) : NULL;
    if (!copy) return;
    digest_slot *e = &dc->slot[path_slot(path)];
    pthread_mutex_lock(&dc->lock);
    free(e->path);
    *e = (digest_slot){copy, lfs, *fp, *ids};
    pthread_mutex_unlock(&dc->lock);
}

/* libkhub_server reaches only libkhub's exported (KHUB_PRIVATE_API) helpers:
 * khub__to_hex is not one of them. */
static void to_hex(const unsigned char *md, unsigned n, char *hex)
{
    static const char digits[] = "0123456789abcdef";
    for (unsigned i = 0; i < n; i++) {
        hex[2 * i] = digits[md[i] >> 4];
        hex[2 * i + 1] = digits[md[i] & 15];
    }
    hex[2 * n] = '\0';
}

/* SHA-256 of fd's content and its git blob SHA-1 (content of size bytes),
 * in one pass read with pread from offset 0. */
static int hash_fd(int fd, uint64_t size, char sha256[65], char sha1[41])
{
    EVP_MD_CTX *c256 = EVP_MD_CTX_new(), *c1 = EVP_MD_CTX_new();
    char head[64];
    int hn = snprintf(head, sizeof head, "blob %llu", (unsigned long long)size);
    int ok = c256 && c1 && EVP_DigestInit_ex(c256, EVP_sha256(), NULL) &&
             EVP_DigestInit_ex(c1, EVP_sha1(), NULL) &&
             EVP_DigestUpdate(c1, head, (size_t)hn + 1); /* with the NUL */
    unsigned char buf[1 << 16];
    uint64_t at = 0;
    while (ok && at < size) {
        size_t want = size - at < sizeof buf ? (size_t)(size - at) : sizeof buf;
        ssize_t got = pread(fd, buf, want, (off_t)at);
        if (got < 0 && errno == EINTR) continue;
        ok = got > 0 && EVP_DigestUpdate(c256, buf, (size_t)got) &&
             EVP_DigestUpdate(c1, buf, (size_t)got);
        at += got > 0 ? (uint64_t)got : 0;
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned mdn = 0;
    ok = ok && EVP_DigestFinal_ex(c256, md, &mdn) && mdn == 32;
    if (ok) to_hex(md, mdn, sha256);
    ok = ok && EVP_DigestFinal_ex(c1, md, &mdn) && mdn == 20;
    if (ok) to_hex(md, mdn, sha1);
    EVP_MD_CTX_free(c256);
    EVP_MD_CTX_free(c1);
    return ok;
}

static atomic_uint_fast64_t n_hashed; /* files hashed by this process (tests) */

uint64_t khub__srv_digest_hashed(void) { return (uint64_t)atomic_load(&n_hashed); }

static int hash_ids(int fd, int lfs, uint64_t size, file_ids *ids)
{
    atomic_fetch_add(&n_hashed, 1);
    char content_sha1[41];
    if (!hash_fd(fd, size, ids->sha256, content_sha1)) return 0;
    if (!lfs) {
        memcpy(ids->sha1, content_sha1, sizeof content_sha1);
        return 1;
    }
    char ptr[256];
    int n = snprintf(ptr, sizeof ptr,
                     "version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %llu\n",
                     ids->sha256, (unsigned long long)size);
    ids->pointer_size = (size_t)n;
    return khub__git_blob_sha1_buf(ptr, (size_t)n, ids->sha1) == KHUB_STATUS_OK;
}

/* The digests of the open file fd (whose name is path, the cache's key):
 * the fingerprint and the bytes hashed are both fd's, so a file swapped
 * under path meanwhile cannot lend its digests to fd's body. */
int khub__srv_file_ids_of_fd(digest_cache *dc, const char *path, int fd, int lfs, file_ids *ids)
{
    fprint before, after;
    if (!fprint_of(fd, &before)) return 0;
    if (digest_lookup(dc, path, lfs, &before, ids)) return 1;
    if (!hash_ids(fd, lfs, before.size, ids)) return 0;
    struct timespec now;
    int settled = clock_gettime(CLOCK_REALTIME, &now) == 0 &&
                  before.ctime_ns + 2000000000LL <= (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
    if (settled && fprint_of(fd, &after) && fprint_eq(&before, &after))
        digest_store(dc, path, lfs, &before, ids);
    return 1;
}

/* ------------------------------------------------------------------------ */
/* One request's memo by file                                               */
/* ------------------------------------------------------------------------ */

/* The digests one request has computed, by file: paths that are hard links
 * of one file (every path of a commit that names the same LFS object is
 * one) are hashed once per request. A file younger than the digest
 * cache's 2 s is not cached there, and anyone may ask for a tree page or
 * paths-info, so 10,000 links to one large fresh object were hashed 10,000
 * times. The key is the file's identity and state (device, inode, size,
 * mtime, ctime) and whether it is answered as LFS (its git id differs):
 * within one request a file with all five unchanged holds the bytes that
 * were hashed, as the store never writes a file in place (a change
 * replaces the name). */
typedef struct ids_memo_entry {
    struct ids_memo_entry *next;
    file_ids ids;
    char key[112]; /* "dev:ino:size:mtime_ns:ctime_ns:lfs" */
} ids_memo_entry;

void khub__srv_ids_memo_free(ids_memo *m)
{
    khub__srv_path_set_free(&m->by_key);
    for (ids_memo_entry *e = m->all, *next; e; e = next) {
        next = e->next;
        free(e);
    }
    m->all = NULL;
}

int khub__srv_file_ids_memo(digest_cache *dc, ids_memo *m, const char *path, int fd,
                            const struct stat *sb, int lfs, file_ids *ids)
{
    char key[112];
    snprintf(key, sizeof key, "%llu:%llu:%lld:%lld.%09ld:%lld.%09ld:%d",
             (unsigned long long)sb->st_dev, (unsigned long long)sb->st_ino, (long long)sb->st_size,
             (long long)sb->st_mtim.tv_sec, sb->st_mtim.tv_nsec, (long long)sb->st_ctim.tv_sec,
             sb->st_ctim.tv_nsec, lfs);
    const ids_memo_entry *hit = khub__srv_path_set_get(&m->by_key, key);
    if (hit) {
        *ids = hit->ids;
        return 1;
    }
    if (!khub__srv_file_ids_of_fd(dc, path, fd, lfs, ids)) return 0;
    ids_memo_entry *e = malloc(sizeof *e);
    if (!e) return 1; /* answered, not remembered */
    e->ids = *ids;
    memcpy(e->key, key, sizeof key);
    if (khub__srv_path_set_add(&m->by_key, e->key, e) != 1) {
        free(e);
        return 1;
    }
    e->next = m->all;
    m->all = e;
    return 1;
}

/* The digests of path (a link is followed), through khub__srv_file_ids_of_fd. */
int khub__srv_file_ids_of(digest_cache *dc, const char *path, int lfs, file_ids *ids)
{
    /* O_NONBLOCK: a FIFO at path hangs no thread (fprint_of refuses it) */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return 0;
    int ok = khub__srv_file_ids_of_fd(dc, path, fd, lfs, ids);
    close(fd);
    return ok;
}
