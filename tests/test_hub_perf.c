/* test_hub_perf.c: the hub's fast paths stay correct. The server's digest
 * cache never answers for a file that changed; a download of a file the
 * commit's cached listing names makes one request (the GET, no HEAD) and
 * still checks the bytes; a variant's verified fingerprints let a later
 * verify skip the hash only while every file is unchanged. */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "hub_fixture.h"
#include "verified_files.h"

/* Fast paths trust only files whose ctime is 2 s old (coarse clocks). */
static void wait_settled(void)
{
    struct timespec t = {2, 200 * 1000 * 1000};
    nanosleep(&t, NULL);
}

static int log_count(const fixture *fx, const char *what)
{
    char *log = fx_log(fx);
    int n = 0;
    for (const char *q = log; (q = strstr(q, what)); q++) n++;
    free(log);
    return n;
}

/* Same size, other bytes, same inode: only mtime/ctime tell. */
static void rewrite_in_place(const char *path)
{
    FILE *f = fopen(path, "r+b");
    ASSERT(f != NULL);
    int c = fgetc(f);
    ASSERT(c != EOF);
    ASSERT_EQ(fseek(f, 0, SEEK_SET), 0);
    fputc(c ^ 0x20, f);
    fclose(f);
}

TEST_IMPL(perf_download_after_listing_skips_head)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub_hub_id id = fx_id("org/demo@" C1);
    khub__tree t = {0};
    ASSERT_OK(khub__list_tree(hub, &id, C1, "", 1, &t));
    khub__tree_free(&t);
    uint64_t before = khub_hub_request_count(hub);
    char *p = NULL;
    ASSERT_OK(khub_hub_download_file(hub, &id, C1, "weights.bin", &p));
    ASSERT_EQ(khub_hub_request_count(hub), before + 1);
    ASSERT_EQ(log_count(&fx, "HEAD "), 0);
    ASSERT_EQ(log_count(&fx, "GET /kernels/org/demo/resolve/" C1 "/weights.bin"), 1);
    struct stat sb;
    ASSERT_EQ(stat(p, &sb), 0);
    ASSERT_EQ(sb.st_size, 70000);
    free(p);
    ASSERT_OK(khub_hub_download_file(hub, &id, C1, "README.md", &p)); /* non-LFS: git SHA-1 */
    ASSERT_EQ(khub_hub_request_count(hub), before + 2);
    free(p);
    khub_hub_free(hub);
    fx_done(&fx);
}

TEST_IMPL(perf_listing_digest_still_checked)
{
    fixture fx;
    fx_init(&fx, "wrong-hash", 0);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub_hub_id id = fx_id("org/demo@" C1);
    khub__tree t = {0};
    ASSERT_OK(khub__list_tree(hub, &id, C1, "", 1, &t));
    khub__tree_free(&t);
    char *p = NULL;
    ASSERT_STATUS(khub_hub_download_file(hub, &id, C1, "weights.bin", &p),
                  KHUB_STATUS_DIGEST_MISMATCH);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "but the hub announced");
    ASSERT(p == NULL);
    khub_hub_free(hub);
    fx_done(&fx);
}

/* A file served (and its digest cached) then rewritten in place must be
 * announced with its new digest: a fresh client downloads it fine. */
TEST_IMPL(perf_server_digest_cache_follows_changes)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    wait_settled();
    char cache2[320], path[512];
    snprintf(cache2, sizeof cache2, "%s", fx.cache);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub_hub_id id = fx_id("org/demo@" C1);
    char *p = NULL;
    ASSERT_OK(khub_hub_download_file(hub, &id, C1, "weights.bin", &p)); /* HEAD: cached */
    free(p);
    khub_hub_free(hub);
    snprintf(path, sizeof path, "%s/org/demo/commits/" C1 "/weights.bin", fx.repos);
    rewrite_in_place(path);
    khub__rmtree(fx.cache);
    hub = fx_hub(&fx, 0, NULL);
    ASSERT_OK(khub_hub_download_file(hub, &id, C1, "weights.bin", &p));
    FILE *f = fopen(p, "rb");
    ASSERT(f != NULL);
    ASSERT_EQ(fgetc(f), 'a' ^ 0x20);
    fclose(f);
    free(p);
    khub_hub_free(hub);
    fx_done(&fx);
}

static void verified_path(const fixture *fx, char *buf, size_t n)
{
    snprintf(buf, n, "%s/kernels--org--demo/khub-verified/" C1 "/%s", fx->cache, fx->variant);
}

TEST_IMPL(perf_variant_fingerprints)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub_hub_id id = fx_id("org/demo@" C1);
    khub_hub_file_list *l = NULL;
    ASSERT_OK(khub_hub_download_variant(hub, &id, C1, fx.variant, &l));
    khub_hub_file_list_free(l);
    char side[512];
    verified_path(&fx, side, sizeof side);
    struct stat sb;
    ASSERT(stat(side, &sb) != 0); /* the blob is too young to be recorded */
    wait_settled();
    ASSERT_OK(khub_hub_variant_files(hub, &id, C1, fx.variant, &l));
    ASSERT_EQ(l->count, 1);
    char blob[4096];
    snprintf(blob, sizeof blob, "%s", l->items[0].path);
    khub_hub_file_list_free(l);
    ASSERT_EQ(stat(side, &sb), 0);
    FILE *f = fopen(side, "rb");
    char text[1024] = "";
    ASSERT(f != NULL);
    text[fread(text, 1, sizeof text - 1, f)] = '\0';
    fclose(f);
    ASSERT_CONTAINS(text, "khub-verified 1\n");
    ASSERT_CONTAINS(text, " libk.so\n");
    ASSERT_OK(khub_hub_variant_files(hub, &id, C1, fx.variant, &l)); /* from the fingerprint */
    khub_hub_file_list_free(l);
    rewrite_in_place(blob); /* same size and inode, new ctime */
    ASSERT_STATUS(khub_hub_variant_files(hub, &id, C1, fx.variant, &l),
                  KHUB_STATUS_DIGEST_MISMATCH);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "libk.so has SHA-256");
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "metadata.json says");
    khub_hub_free(hub);
    fx_done(&fx);
}

/* The sidecar line's exact text (hub/verified_files.c formats it by hand):
 * what snprintf's "%s %llu %llu %llu %lld %lld %s\n" wrote before, so the
 * sidecars of older builds still match, every field counted (a fingerprint
 * without its ctime would trust a file written in place with its mtime set
 * back), extreme and negative values included; a short buffer is refused. */
TEST_IMPL(sidecar_line_text)
{
    const char *sha = "b2a6c7a7a16b9a8e0000000000000000000000000000000000000000000000ff";
    struct {
        unsigned long long dev, ino;
        long long size, mtime_s, mtime_ns, ctime_s, ctime_ns;
    } cases[] = {
        {2049, 123456789, 15864, 1733390000, 5, 1733390001, 123456789},
        {0, 0, 0, 0, 0, 0, 0},
        {~0ull, ~0ull, 9223372036854775807ll, -5, 7, -1, 999999999},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct stat sb;
        memset(&sb, 0, sizeof sb);
        sb.st_mode = S_IFREG | 0644;
        sb.st_dev = (dev_t)cases[i].dev;
        sb.st_ino = (ino_t)cases[i].ino;
        sb.st_size = (off_t)cases[i].size;
        sb.st_mtim = (struct timespec){cases[i].mtime_s, cases[i].mtime_ns};
        sb.st_ctim = (struct timespec){cases[i].ctime_s, cases[i].ctime_ns};
        long long mt = cases[i].mtime_s * 1000000000 + cases[i].mtime_ns;
        long long ct = cases[i].ctime_s * 1000000000 + cases[i].ctime_ns, got_ct = 0;
        char want[400], line[400];
        int n = snprintf(want, sizeof want, "%s %llu %llu %llu %lld %lld %s\n", sha,
                         (unsigned long long)sb.st_dev, (unsigned long long)sb.st_ino,
                         (unsigned long long)sb.st_size, mt, ct, "libk.so");
        ASSERT(khub__verified_line("unused", &sb, "libk.so", sha, line, sizeof line, &got_ct));
        ASSERT_STR_EQ(line, want);
        ASSERT_EQ(got_ct, ct);
        ASSERT(!khub__verified_line("unused", &sb, "libk.so", sha, line, (size_t)n, NULL));
        ASSERT(khub__verified_line("unused", &sb, "libk.so", sha, line, (size_t)n + 1, NULL));
    }
}

/* Bytes this process has read so far (/proc/self/io's rchar), -1 when the
 * kernel does not count them. */
static long long rchar_now(void)
{
    FILE *f = fopen("/proc/self/io", "r");
    long long n = -1;
    if (f) {
        if (fscanf(f, "rchar: %lld", &n) != 1) n = -1;
        fclose(f);
    }
    return n;
}

typedef struct racer {
    const char *path;
    long long base;  /* rchar before the hash began */
    atomic_int done; /* the hash check returned */
    int wrote, late; /* rewrote the file; found the check already done */
} racer;

/* Once the hash has read the file's first MiBs, rewrites its first byte in
 * place: the digest the hash computes is still the old bytes', the file's
 * fingerprint (mtime, ctime) is new. */
static void *race_rewrite(void *ud)
{
    racer *r = ud;
    while (!atomic_load(&r->done) && rchar_now() - r->base < (4 << 20)) usleep(20);
    if (atomic_load(&r->done)) {
        r->late = 1;
        return NULL;
    }
    int fd = open(r->path, O_RDWR);
    unsigned char c = 0;
    if (fd >= 0 && pread(fd, &c, 1, 0) == 1) {
        c ^= 0x20;
        r->wrote = pwrite(fd, &c, 1, 0) == 1;
    }
    if (fd >= 0) close(fd);
    return NULL;
}

/* A file the hub hashed itself is trusted by the same handle's next check
 * without a second hash (khub__hub_is_fresh), but only as it was when its
 * bytes were read: a file rewritten in place while it was being hashed is
 * not noted (the note used the fingerprint taken after the hash, which
 * already showed the rewrite, so the next check trusted bytes nobody had
 * hashed). The rewrite lands mid-hash by watching the process's read
 * counter; a try where it landed before or after the hash is repeated. */
TEST_IMPL(fresh_note_is_the_file_as_hashed)
{
    if (rchar_now() < 0) {
        TEST_SKIP("/proc/self/io is not available");
    }
    fixture fx;
    fx_init(&fx, NULL, 0);
    khub_hub *hub = fx_hub(&fx, 1, NULL);
    char path[512], want[65];
    snprintf(path, sizeof path, "%s/big.bin", fx.root);
    enum { SIZE = 96 << 20 };
    unsigned char *bytes = malloc(SIZE);
    ASSERT(bytes != NULL);
    for (size_t i = 0; i < SIZE; i++) bytes[i] = (unsigned char)(i * 2654435761u >> 24);
    int hit = 0;
    for (int attempt = 0; attempt < 10 && !hit; attempt++) {
        fx_write(path, bytes, SIZE);
        ASSERT_OK(khub__sha256_file_hex(path, want));
        struct timespec t = {0, 30 * 1000 * 1000}; /* the rewrite gets a later ctime */
        nanosleep(&t, NULL);
        racer r = {.path = path, .base = rchar_now()};
        atomic_init(&r.done, 0);
        pthread_t th;
        ASSERT_EQ(pthread_create(&th, NULL, race_rewrite, &r), 0);
        char line[4096];
        khub_status st = khub__verified_hash_check(hub, "dir", "big.bin", path, want, NULL, line,
                                                   sizeof line, true);
        atomic_store(&r.done, 1);
        pthread_join(th, NULL);
        if (st != KHUB_STATUS_OK || !r.wrote || r.late) continue; /* not mid-hash: again */
        hit = 1;
        ASSERT_STR_EQ(line, ""); /* changed while hashed: no sidecar line either */
        ASSERT(!khub__hub_is_fresh(hub, path, want));
    }
    if (!hit) TEST_FAIL_("the rewrite never landed while the file was being hashed (10 tries)");
    /* an unchanged file is noted, and a later rewrite ends the note */
    fx_write(path, bytes, SIZE);
    ASSERT_OK(khub__sha256_file_hex(path, want));
    char line[4096];
    ASSERT_OK(khub__verified_hash_check(hub, "dir", "big.bin", path, want, NULL, line, sizeof line,
                                        true));
    ASSERT(khub__hub_is_fresh(hub, path, want));
    struct timespec t = {0, 30 * 1000 * 1000};
    nanosleep(&t, NULL);
    rewrite_in_place(path);
    ASSERT(!khub__hub_is_fresh(hub, path, want));
    free(bytes);
    khub_hub_free(hub);
    fx_done(&fx);
}

#define TEST_LIST(X) \
    X(perf_download_after_listing_skips_head) \
    X(perf_listing_digest_still_checked) \
    X(perf_server_digest_cache_follows_changes) \
    X(perf_variant_fingerprints) \
    X(sidecar_line_text) \
    X(fresh_note_is_the_file_as_hashed)
TEST_MAIN(TEST_LIST)
