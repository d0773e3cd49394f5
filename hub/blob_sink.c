/*
 * blob_sink.c: where a download's body goes: appended to the blob's private
 * temp file and hashed while it arrives.
 *
 * A small download is written and hashed on the receiving thread. A large
 * one runs as a three-stage pipeline, so that receiving, hashing and
 * writing, which each cost about as much as the others for a file from a
 * loopback or LAN hub, overlap instead of adding up:
 *
 *   receiver (curl's thread)  copies each piece into a ring of 1 MiB chunks
 *   hasher thread             runs the digests over the chunks, in order
 *   writer thread             appends the chunks to the file, in order
 *
 * A chunk is refilled only after both workers are done with it; the
 * receiver waits when all chunks are in flight. The writer uses O_DIRECT
 * on a fresh file where the file system allows it (the bytes go to the
 * device without a page-cache copy, so the fsync before publishing has
 * almost nothing left to do), else buffered writes with writeback started
 * every 8 MiB (sync_file_range), for the same reason.
 *
 * The file always holds a prefix of the received bytes, in order, so a
 * process killed mid-download leaves an orphan that the next one resumes
 * with a Range request. offset() counts every byte accepted, written or
 * still queued: queued bytes reach the file before any later ones.
 *
 * The running digest stands for the file only while every byte since
 * offset 0 went through it: a resumed orphan has none (the caller hashes
 * the file at the end instead).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "hub_impl.h"

#define CHUNK        (1u << 20)
#define N_CHUNKS     8
#define PIPELINE_MIN (4ull << 20) /* bytes still to come; below, one thread */
#define KICK_EVERY   (8ull << 20) /* buffered writes: start writeback this often */
#define DIRECT_ALIGN 4096

struct khub__blob_sink {
    khub__sink sink; /* what khub__http_fetch calls; ud = this */
    khub_hub *hub;
    int fd;
    uint64_t have, expect; /* bytes accepted; bytes the hub announced */
    const char *path;      /* for messages */
    khub_status st;
    int git;           /* the ETag is a git blob SHA-1: "blob <size>\0" first */
    EVP_MD_CTX *md;    /* NULL: no running digest */
    EVP_MD_CTX *md256; /* git blobs: SHA-256 too, for the variant check; NULL = none */

    /* The pipeline (piped = 1). Counters count chunks; chunk k lives in
     * ring[k % N_CHUNKS]. */
    int piped;
    pthread_mutex_t mu;
    pthread_cond_t cv;                 /* broadcast on every counter change */
    unsigned char *ring[N_CHUNKS];     /* DIRECT_ALIGN-aligned, inside ring_mem[k] */
    unsigned char *ring_mem[N_CHUNKS]; /* the hub's blocks (khub__mem_alloc) */
    size_t len[N_CHUNKS];
    uint64_t produced, hashed, written;
    size_t fill; /* bytes in the chunk being filled */
    int closing;
    int write_errno; /* first failed write's errno (writer thread), 0 = none */
    pthread_t writer, hasher;
    int has_hasher;
    int direct;                /* the fd has O_DIRECT (writer thread only) */
    uint64_t file_off, kicked; /* writer thread only */
};

/* ======================================================================== */
/* Digests                                                                  */
/* ======================================================================== */

static void digest_reset(khub__blob_sink *s)
{
    char hdr[40];
    int n = snprintf(hdr, sizeof hdr, "blob %llu", (unsigned long long)s->expect);
    if (s->md256 && EVP_DigestInit_ex(s->md256, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(s->md256);
        s->md256 = NULL;
    }
    if (!s->md) return;
    if (EVP_DigestInit_ex(s->md, s->git ? EVP_sha1() : EVP_sha256(), NULL) != 1 ||
        (s->git && EVP_DigestUpdate(s->md, hdr, (size_t)n + 1) != 1)) {
        EVP_MD_CTX_free(s->md);
        s->md = NULL;
    }
}

/* A digest that fails to update stops standing for the file: dropped, and
 * the caller hashes the file instead. */
static void digest_update(khub__blob_sink *s, const void *data, size_t n)
{
    if (s->md && EVP_DigestUpdate(s->md, data, n) != 1) {
        EVP_MD_CTX_free(s->md);
        s->md = NULL;
    }
    if (s->md256 && EVP_DigestUpdate(s->md256, data, n) != 1) {
        EVP_MD_CTX_free(s->md256);
        s->md256 = NULL;
    }
}

static bool digest_hex(EVP_MD_CTX *md, char hex[65])
{
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    hex[0] = '\0';
    if (!md || EVP_DigestFinal_ex(md, d, &n) != 1 || n > 32) return false;
    khub__to_hex(d, n, hex);
    return true;
}

/* ======================================================================== */
/* Writing                                                                  */
/* ======================================================================== */

static void set_direct(khub__blob_sink *s, int on)
{
    int fl = fcntl(s->fd, F_GETFL);
    if (fl < 0) return;
    int want = on ? (fl | O_DIRECT) : (fl & ~O_DIRECT);
    if (want != fl && fcntl(s->fd, F_SETFL, want) != 0) return;
    s->direct = on;
}

/* 0 or an errno. O_DIRECT needs aligned sizes: a short tail, or a file
 * system that refuses it at write time, goes through the page cache. */
static int write_all(khub__blob_sink *s, const unsigned char *p, size_t n)
{
    if (s->direct && (n % DIRECT_ALIGN || s->file_off % DIRECT_ALIGN)) set_direct(s, 0);
    while (n > 0) {
        ssize_t w = write(s->fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno == EINVAL && s->direct) {
            set_direct(s, 0);
            continue;
        }
        if (w <= 0) return w < 0 ? errno : EIO;
        p += w;
        n -= (size_t)w;
        s->file_off += (uint64_t)w;
    }
    if (!s->direct && s->file_off - s->kicked >= KICK_EVERY) {
        sync_file_range(s->fd, (off64_t)s->kicked, (off64_t)(s->file_off - s->kicked),
                        SYNC_FILE_RANGE_WRITE);
        s->kicked = s->file_off;
    }
    return 0;
}

/* ======================================================================== */
/* The pipeline                                                             */
/* ======================================================================== */

/* Waits for chunk *done < produced (or the end); returns its index, or -1
 * at the end. */
static int next_chunk(khub__blob_sink *s, const uint64_t *done)
{
    pthread_mutex_lock(&s->mu);
    while (*done == s->produced && !s->closing) pthread_cond_wait(&s->cv, &s->mu);
    int k = *done == s->produced ? -1 : (int)(*done % N_CHUNKS);
    pthread_mutex_unlock(&s->mu);
    return k;
}

static void chunk_done(khub__blob_sink *s, uint64_t *done)
{
    pthread_mutex_lock(&s->mu);
    (*done)++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void *writer_main(void *ud)
{
    khub__blob_sink *s = ud;
    int k;
    while ((k = next_chunk(s, &s->written)) >= 0) {
        if (!s->write_errno) { /* after a failure the rest is skipped, not waited on */
            int e = write_all(s, s->ring[k], s->len[k]);
            if (e) {
                pthread_mutex_lock(&s->mu);
                s->write_errno = e;
                pthread_mutex_unlock(&s->mu);
            }
        }
        chunk_done(s, &s->written);
    }
    return NULL;
}

static void *hasher_main(void *ud)
{
    khub__blob_sink *s = ud;
    int k;
    while ((k = next_chunk(s, &s->hashed)) >= 0) {
        digest_update(s, s->ring[k], s->len[k]);
        chunk_done(s, &s->hashed);
    }
    return NULL;
}

/* Without a hasher, hashed follows produced. */
static uint64_t slowest(const khub__blob_sink *s)
{
    return s->hashed < s->written ? s->hashed : s->written;
}

/* Hands the chunk being filled to the workers and waits for a free one. */
static void submit(khub__blob_sink *s)
{
    pthread_mutex_lock(&s->mu);
    s->len[s->produced % N_CHUNKS] = s->fill;
    s->produced++;
    if (!s->has_hasher) s->hashed = s->produced;
    pthread_cond_broadcast(&s->cv);
    while (s->produced - slowest(s) == N_CHUNKS) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    s->fill = 0;
}

/* Everything accepted reaches the file and the digests. */
static void drain(khub__blob_sink *s)
{
    if (s->fill > 0) submit(s);
    pthread_mutex_lock(&s->mu);
    while (slowest(s) < s->produced) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

static int pipeline_errno(khub__blob_sink *s)
{
    pthread_mutex_lock(&s->mu);
    int e = s->write_errno;
    pthread_mutex_unlock(&s->mu);
    return e;
}

/* Starts the workers; on any failure the sink stays single-threaded. */
static void pipeline_start(khub__blob_sink *s)
{
    for (int i = 0; i < N_CHUNKS; i++) {
        /* O_DIRECT wants DIRECT_ALIGN; the hub's allocator gives 16. */
        s->ring_mem[i] = khub__mem_alloc(khub__hub_alloc(s->hub), CHUNK + DIRECT_ALIGN);
        if (!s->ring_mem[i]) return;
        uintptr_t at =
            ((uintptr_t)s->ring_mem[i] + DIRECT_ALIGN - 1) & ~(uintptr_t)(DIRECT_ALIGN - 1);
        s->ring[i] = (unsigned char *)at;
    }
    if (pthread_mutex_init(&s->mu, NULL) != 0) return;
    if (pthread_cond_init(&s->cv, NULL) != 0) {
        pthread_mutex_destroy(&s->mu);
        return;
    }
    s->file_off = s->kicked = s->have;
    if (s->have == 0) set_direct(s, 1);
    s->has_hasher = s->md != NULL || s->md256 != NULL;
    if (pthread_create(&s->writer, NULL, writer_main, s) != 0) goto undo;
    if (s->has_hasher && pthread_create(&s->hasher, NULL, hasher_main, s) != 0) {
        pthread_mutex_lock(&s->mu);
        s->closing = 1;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->writer, NULL);
        goto undo;
    }
    s->piped = 1;
    return;
undo:
    set_direct(s, 0);
    s->closing = 0;
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
}

static void pipeline_stop(khub__blob_sink *s)
{
    drain(s);
    pthread_mutex_lock(&s->mu);
    s->closing = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->writer, NULL);
    if (s->has_hasher) pthread_join(s->hasher, NULL);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    set_direct(s, 0);
    s->piped = 0;
}

/* ======================================================================== */
/* The sink                                                                 */
/* ======================================================================== */

static khub_status write_failed(khub__blob_sink *s, int e)
{
    return s->st =
               khub__hub_fail(s->hub, KHUB_STATUS_IO, "%s: write failed: %s", s->path, strerror(e));
}

static khub_status on_start(void *ud, long status, int64_t range_start)
{
    khub__blob_sink *s = ud;
    if (status == 200 && s->have > 0) { /* the server ignored Range: start over */
        if (s->piped) {
            s->fill = 0; /* not yet queued: dropped */
            drain(s);
        }
        if (ftruncate(s->fd, 0) != 0) /* O_APPEND: the next write lands at 0 */
            return s->st = khub__hub_fail(s->hub, KHUB_STATUS_IO, "cannot truncate: %s",
                                          strerror(errno));
        s->have = 0;
        if (s->piped) { /* the writer is idle: drained */
            s->file_off = s->kicked = 0;
            set_direct(s, 1);
        }
        /* From offset 0 again: a digest is possible, unless the pipeline
         * runs without a hasher (it had none to start with). */
        if (!s->piped || s->has_hasher) {
            if (!s->md) s->md = EVP_MD_CTX_new();
            if (s->git && !s->md256) s->md256 = EVP_MD_CTX_new();
        }
        digest_reset(s);
    } else if (status == 206 && range_start != (int64_t)s->have) {
        return s->st = khub__hub_fail(s->hub, KHUB_STATUS_HTTP,
                                      "%s: asked for bytes from %llu, got a range from %lld",
                                      s->path, (unsigned long long)s->have, (long long)range_start);
    }
    return KHUB_STATUS_OK;
}

static size_t on_write(void *ud, const void *data, size_t n)
{
    khub__blob_sink *s = ud;
    if (s->have + n > s->expect) {
        s->st = khub__hub_fail(s->hub, KHUB_STATUS_OVERFLOW,
                               "%s: the server sent more than the %llu bytes it announced; "
                               "nothing was stored",
                               s->path, (unsigned long long)s->expect);
        return 0;
    }
    if (s->piped) {
        int e = pipeline_errno(s);
        if (e) {
            write_failed(s, e);
            return 0;
        }
        for (size_t off = 0; off < n;) {
            size_t take = n - off < CHUNK - s->fill ? n - off : CHUNK - s->fill;
            memcpy(s->ring[s->produced % N_CHUNKS] + s->fill, (const char *)data + off, take);
            s->fill += take;
            off += take;
            if (s->fill == CHUNK) submit(s);
        }
    } else {
        int e = write_all(s, data, n);
        if (e) {
            write_failed(s, e);
            return 0;
        }
        digest_update(s, data, n);
    }
    s->have += n;
    if (s->hub->progress) s->hub->progress(s->hub->progress_ud, s->path, s->have, s->expect);
    return n;
}

static uint64_t on_offset(void *ud) { return ((khub__blob_sink *)ud)->have; }

khub_status khub__blob_sink_new(khub_hub *hub, int fd, uint64_t have, uint64_t expect,
                                const char *path, int git, khub__blob_sink **out)
{
    *out = NULL;
    khub__blob_sink *s = khub__mem_calloc(khub__hub_alloc(hub), 1, sizeof *s);
    if (!s) return khub__hub_fail(hub, KHUB_STATUS_NOMEM, "out of memory for %s", path);
    s->sink = (khub__sink){s, on_start, on_write, on_offset};
    s->hub = hub;
    s->fd = fd;
    s->have = have;
    s->expect = expect;
    s->path = path;
    s->git = git;
    s->file_off = s->kicked = have;
    if (have == 0) { /* a fresh file: hash while receiving */
        s->md = EVP_MD_CTX_new();
        if (git) s->md256 = EVP_MD_CTX_new();
        digest_reset(s);
    }
    if (expect > have && expect - have >= PIPELINE_MIN) pipeline_start(s);
    *out = s;
    return KHUB_STATUS_OK;
}

const khub__sink *khub__blob_sink_sink(khub__blob_sink *s) { return &s->sink; }

uint64_t khub__blob_sink_have(const khub__blob_sink *s) { return s->have; }

khub_status khub__blob_sink_finish(khub__blob_sink *s, char streamed[65], char sha256[65])
{
    if (s->piped) pipeline_stop(s);
    if (s->st == KHUB_STATUS_OK && s->write_errno) write_failed(s, s->write_errno);
    digest_hex(s->md, streamed);
    if (s->git)
        digest_hex(s->md256, sha256);
    else
        sha256[0] = '\0';
    return s->st;
}

void khub__blob_sink_free(khub__blob_sink *s)
{
    if (!s) return;
    if (s->piped) pipeline_stop(s);
    for (int i = 0; i < N_CHUNKS; i++) khub__mem_free(s->ring_mem[i]);
    EVP_MD_CTX_free(s->md);
    EVP_MD_CTX_free(s->md256);
    khub__mem_free(s);
}
