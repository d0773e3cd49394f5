/*
 * test_trust_path.c: one source of truth on the trust path (issue 10
 * item 1) and temporary names in a shared cache (item 7), below the CLI:
 *   - many hub handles on many threads verify their own variants at once,
 *     and none ever sees another's metadata.json (the verifier once read
 *     it into one process-wide buffer);
 *   - the judge sees the bytes that are then parsed, once: files swapped
 *     in while it runs are checked against the judged table and refused;
 *   - a snapshot link is made outside the variant folder, so a verifier
 *     listing that folder meanwhile never sees a temporary name;
 *   - the debris of a kill is reported by cache verify and removed by
 *     cache prune (an in-flight temporary is left alone).
 * t_verify_load drives the swap through the CLI with an LD_PRELOAD shim.
 */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache_admin.h"
#include "hub_fixture.h"
#include "hub_impl.h"
#include "kernel_meta.h"
#include "runner.h"

#define N_THREADS 8
#define N_ROUNDS  300

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    ASSERT(f != NULL);
    ASSERT_EQ(fwrite(text, 1, strlen(text), f), strlen(text));
    fclose(f);
}

static void mkdirs(const char *path)
{
    char p[1024];
    snprintf(p, sizeof p, "%s", path);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            mkdir(p, 0755);
            *s = '/';
        }
    mkdir(p, 0755);
}

/* A cached, unpacked variant of kernels--org--<name> in cache whose table
 * lists n_files files "<prefix><j>.bin"; the metadata.json bytes go to
 * meta_out (may be NULL). */
static void make_variant(const char *cache, const char *name, const char *prefix, int n_files,
                         char *meta_out, size_t meta_size)
{
    char dir[1024], path[1200], files[8192] = "", sha[65];
    snprintf(dir, sizeof dir, "%s/kernels--org--%s/khub-variants/" C1 "/khub1-cpu-%s-linux", cache,
             name, fx_arch());
    mkdirs(dir);
    for (int j = 0; j < n_files; j++) {
        char content[128];
        snprintf(content, sizeof content, "%s file %d of %s\n", prefix, j, name);
        snprintf(path, sizeof path, "%s/%s%d.bin", dir, prefix, j);
        write_file(path, content);
        ASSERT_OK(khub__sha256_hex(content, strlen(content), sha));
        size_t len = strlen(files);
        snprintf(files + len, sizeof files - len, "%s\"%s%d.bin\":\"%s\"", j ? "," : "", prefix, j,
                 sha);
    }
    char meta[9000];
    snprintf(meta, sizeof meta,
             "{\"format\":1,\"name\":\"org/%s\",\"version\":\"1.0.0\",\"major\":1,"
             "\"variant\":\"khub1-cpu-%s-linux\",\"abi\":{\"major\":1,\"minor\":0},"
             "\"backend\":{\"type\":\"cpu\",\"archs\":[\"%s\"]},"
             "\"plugins\":[{\"file\":\"%s0.bin\",\"level\":\"generic\",\"cpu_features\":[]}],"
             "\"files\":{%s},"
             "\"provenance\":{\"source_commit\":\"unknown\",\"dirty\":false}}",
             name, fx_arch(), fx_arch(), prefix, files);
    snprintf(path, sizeof path, "%s/metadata.json", dir);
    write_file(path, meta);
    if (meta_out) snprintf(meta_out, meta_size, "%s", meta);
}

static khub_hub *offline_hub(const char *cache)
{
    khub_hub_opts o = {KHUB_STRUCT_INIT(khub_hub_opts), .endpoint = "http://127.0.0.1:9",
                       .cache_dir = cache, .token = "", .offline = 1};
    khub_hub *hub = NULL;
    ASSERT_OK(khub_hub_new(&o, &hub));
    return hub;
}

/* ------------------------------------------------------------------------ */

typedef struct worker {
    char cache[300], name[32], prefix[32];
    int n_files;
    atomic_int *failures;
    char first[KHUB_ERROR_SIZE];
} worker;

static void *verify_loop(void *arg)
{
    worker *w = arg;
    khub_hub *hub = offline_hub(w->cache);
    char text[64];
    snprintf(text, sizeof text, "org/%s", w->name);
    khub_hub_id id = fx_id(text);
    char variant[64];
    snprintf(variant, sizeof variant, "khub1-cpu-%s-linux", fx_arch());
    for (int r = 0; r < N_ROUNDS; r++) {
        khub_hub_file_list *l = NULL;
        khub_status st = khub_hub_variant_files(hub, &id, C1, variant, &l);
        bool ok = st == KHUB_STATUS_OK && l->count == (size_t)w->n_files &&
                  !strncmp(l->items[0].rel, w->prefix, strlen(w->prefix));
        if (!ok && atomic_fetch_add(w->failures, 1) == 0)
            snprintf(w->first, sizeof w->first, "%s round %d: %s (%s)", w->name, r,
                     khub_status_name(st),
                     st == KHUB_STATUS_OK ? "another variant's files" : khub_hub_errmsg(hub));
        khub_hub_file_list_free(l);
    }
    khub_hub_free(hub);
    return NULL;
}

TEST_IMPL(hub_handles_on_threads)
{
    /* Each thread: its own handle, its own cache, a table of its own size
     * and file names. A shared read buffer mixes them up: a table read by
     * one thread is parsed by another (missing files, another prefix, or a
     * torn JSON). */
    char root[] = "/tmp/khub-tpath-XXXXXX";
    ASSERT(mkdtemp(root) != NULL);
    worker w[N_THREADS];
    pthread_t th[N_THREADS];
    atomic_int failures = 0;
    for (int k = 0; k < N_THREADS; k++) {
        memset(&w[k], 0, sizeof w[k]);
        snprintf(w[k].cache, sizeof w[k].cache, "%s/cache%d", root, k);
        snprintf(w[k].name, sizeof w[k].name, "k%d", k);
        snprintf(w[k].prefix, sizeof w[k].prefix, "t%d_", k);
        w[k].n_files = 1 + 6 * k;
        w[k].failures = &failures;
        make_variant(w[k].cache, w[k].name, w[k].prefix, w[k].n_files, NULL, 0);
    }
    for (int k = 0; k < N_THREADS; k++)
        ASSERT_EQ(pthread_create(&th[k], NULL, verify_loop, &w[k]), 0);
    for (int k = 0; k < N_THREADS; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < N_THREADS; k++)
        if (w[k].first[0]) fprintf(stderr, "first failure: %s\n", w[k].first);
    ASSERT_EQ(atomic_load(&failures), 0);
    khub__rmtree(root);
}

/* ------------------------------------------------------------------------ */

typedef struct swap_judge {
    char dir[1024], meta[9000]; /* the unsigned table and file to swap in */
    int calls;
    char seen[9000];
} swap_judge;

/* A judge that accepts the bytes it is shown, then swaps in another
 * consistent table and file, as a writer to the cache would. */
static khub_status swap_in(void *ud, const char *dir, const struct khub__dir_list *listed,
                           const char *meta, size_t meta_len, const char *sig, size_t sig_len)
{
    swap_judge *j = ud;
    (void)listed;
    (void)sig;
    (void)sig_len;
    j->calls++;
    snprintf(j->seen, sizeof j->seen, "%.*s", (int)meta_len, meta);
    char path[1200];
    snprintf(path, sizeof path, "%s/metadata.json", dir);
    write_file(path, j->meta);
    snprintf(path, sizeof path, "%s/t0.bin", dir);
    unlink(path);
    write_file(path, "evil file 0 of swapped\n");
    return KHUB_STATUS_OK;
}

TEST_IMPL(judge_sees_what_is_parsed)
{
    char root[] = "/tmp/khub-tpath-XXXXXX", cache[300], good[9000], evil[9000], other[300];
    ASSERT(mkdtemp(root) != NULL);
    snprintf(cache, sizeof cache, "%s/cache", root);
    snprintf(other, sizeof other, "%s/other", root);
    make_variant(cache, "swapped", "t", 1, good, sizeof good);
    /* The swapped-in table: consistent with the swapped-in file. */
    char sha[65];
    const char *bad = "evil file 0 of swapped\n";
    ASSERT_OK(khub__sha256_hex(bad, strlen(bad), sha));
    make_variant(other, "swapped", "t", 1, evil, sizeof evil);
    char *at = strstr(evil, "\"t0.bin\":\"");
    ASSERT(at != NULL);
    memcpy(at + 10, sha, 64);
    swap_judge j = {.calls = 0};
    snprintf(j.meta, sizeof j.meta, "%s", evil);
    khub_hub *hub = offline_hub(cache);
    khub_hub_id id = fx_id("org/swapped");
    char variant[64];
    snprintf(variant, sizeof variant, "khub1-cpu-%s-linux", fx_arch());
    khub__variant_judge judge = {.fn = swap_in, .ud = &j};
    khub__variant v;
    ASSERT_STATUS(khub__hub_variant_open(hub, &id, C1, variant, true, &judge, &v),
                  KHUB_STATUS_DIGEST_MISMATCH);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "t0.bin has SHA-256 ");
    ASSERT_CONTAINS(khub_hub_errmsg(hub), ", metadata.json says ");
    ASSERT_EQ(j.calls, 1);
    ASSERT_STR_EQ(j.seen, good);
    ASSERT(v.km == NULL && v.files == NULL && v.meta == NULL);
    /* With the swap done, a judge that only looks sees the new bytes, once,
     * and the table it judged is the one handed back. */
    judge.fn = NULL;
    ASSERT_OK(khub__hub_variant_open(hub, &id, C1, variant, false, &judge, &v));
    ASSERT_EQ(v.meta_len, strlen(evil));
    ASSERT(memcmp(v.meta, evil, v.meta_len) == 0);
    ASSERT_EQ(v.km->n_files, 1);
    ASSERT_STR_EQ(v.km->files[0].sha256, sha);
    ASSERT_STR_EQ(v.files->items[0].sha256, sha);
    khub__variant_clear(&v);
    khub_hub_free(hub);
    khub__rmtree(root);
}

/* ------------------------------------------------------------------------ */

/* Names in dir (not . and ..), for a message; the count is returned. */
static int list_dir(const char *dir, char *out, size_t size)
{
    DIR *d = opendir(dir);
    int n = 0;
    out[0] = '\0';
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        size_t len = strlen(out);
        snprintf(out + len, size - len, "%s ", de->d_name);
        n++;
    }
    if (d) closedir(d);
    return n;
}

TEST_IMPL(snapshot_links_made_outside_the_folder)
{
    /* A file-by-file download leaves, in the variant folder, exactly the
     * files of the repo: the link is made in .khub-tmp/ and renamed in. The
     * temporary name is gone from .khub-tmp/ too. */
    fixture fx;
    fx_init(&fx, NULL, 0);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub_hub_id id = fx_id("org/demo");
    khub_hub_file_list *l = NULL;
    ASSERT_OK(khub_hub_download_variant(hub, &id, C1, fx.variant, &l));
    ASSERT_EQ(l->count, 1);
    khub_hub_file_list_free(l);
    char dir[1024], names[2048];
    snprintf(dir, sizeof dir, "%s/kernels--org--demo/snapshots/" C1 "/build/%s", fx.cache,
             fx.variant);
    ASSERT_EQ(list_dir(dir, names, sizeof names), 2);
    ASSERT(strstr(names, "libk.so ") && strstr(names, "metadata.json "));
    snprintf(dir, sizeof dir, "%s/kernels--org--demo/" KHUB__TMP_DIR, fx.cache);
    ASSERT_EQ(list_dir(dir, names, sizeof names), 0);
    khub_hub_free(hub);
    fx_done(&fx);
}

typedef struct findings {
    char text[4096];
} findings;

static void note(void *ud, const char *kind, const char *path, const char *detail)
{
    findings *f = ud;
    size_t n = strlen(f->text);
    const char *base = strrchr(path, '/');
    snprintf(f->text + n, sizeof f->text - n, "%s %s (%s)\n", kind, base ? base + 1 : path, detail);
}

/* Sets path's own mtime (not its target's) seconds into the past. */
static void age(const char *path, long seconds)
{
    struct timespec t[2];
    clock_gettime(CLOCK_REALTIME, &t[0]);
    t[0].tv_sec -= seconds;
    t[1] = t[0];
    ASSERT_EQ(utimensat(AT_FDCWD, path, t, AT_SYMLINK_NOFOLLOW), 0);
}

TEST_IMPL(interrupted_download_debris)
{
    /* What a kill leaves: an older version's temporary link inside the
     * variant folder (it made the variant unloadable for good while cache
     * verify said all was well), a stale temporary in .khub-tmp/ (its
     * process gone) and a fresh one (in flight: left alone). */
    fixture fx;
    fx_init(&fx, NULL, 0);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub_hub_id id = fx_id("org/demo");
    khub_hub_file_list *l = NULL;
    ASSERT_OK(khub_hub_download_variant(hub, &id, C1, fx.variant, &l));
    khub_hub_file_list_free(l);
    char repo[600], legacy[1200], stale[1200], fresh[1200], tmpdir[700];
    snprintf(repo, sizeof repo, "%s/kernels--org--demo", fx.cache);
    snprintf(legacy, sizeof legacy, "%s/snapshots/" C1 "/build/%s/libk.so.0badc0de.tmp", repo,
             fx.variant);
    ASSERT_EQ(symlink("../../../../blobs/nowhere", legacy), 0);
    snprintf(tmpdir, sizeof tmpdir, "%s/" KHUB__TMP_DIR, repo);
    mkdir(tmpdir, 0755);
    pid_t child = fork();
    if (child == 0) _exit(0);
    ASSERT(child > 0);
    waitpid(child, NULL, 0); /* a pid that is gone */
    snprintf(stale, sizeof stale, "%s/%d.deadbeef", tmpdir, (int)child);
    ASSERT_EQ(symlink("../blobs/x", stale), 0);
    age(stale, 120);
    snprintf(fresh, sizeof fresh, "%s/%d.feedf00d", tmpdir, (int)getpid());
    ASSERT_EQ(symlink("../blobs/y", fresh), 0);

    ASSERT_STATUS(khub_hub_variant_files(hub, &id, C1, fx.variant, &l),
                  KHUB_STATUS_METADATA_INVALID);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "libk.so.0badc0de.tmp is not listed in metadata.json; "
                                          "refusing the variant (a temporary name an interrupted "
                                          "download left: khub cache prune removes it)");
    findings f = {""};
    uint64_t checked = 0, bad = 0;
    ASSERT_STATUS(khub__cache_verify(hub, NULL, note, &f, &checked, &bad), KHUB_STATUS_IO);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "cache verify: 2 stale temporary names left by "
                                          "interrupted downloads");
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "run khub cache prune to remove them");
    ASSERT_CONTAINS(f.text, "stale libk.so.0badc0de.tmp (temporary link left inside a snapshot");
    ASSERT(strstr(f.text, ".deadbeef (temporary left by an interrupted download") != NULL);
    ASSERT(strstr(f.text, "feedf00d") == NULL);
    ASSERT_EQ(bad, 0);

    f.text[0] = '\0';
    uint64_t freed = 0;
    ASSERT_OK(khub__cache_prune(hub, 1, note, &f, &freed)); /* dry run: nothing goes */
    ASSERT_CONTAINS(f.text, "temporary libk.so.0badc0de.tmp");
    struct stat sb;
    ASSERT_EQ(lstat(legacy, &sb), 0);
    char ref[700];
    snprintf(ref, sizeof ref, "%s/refs", repo);
    mkdir(ref, 0755);
    snprintf(ref, sizeof ref, "%s/refs/main", repo);
    write_file(ref, C1); /* so prune keeps the snapshot */
    ASSERT_OK(khub__cache_prune(hub, 0, NULL, NULL, &freed));
    ASSERT(lstat(legacy, &sb) != 0 && lstat(stale, &sb) != 0);
    ASSERT_EQ(lstat(fresh, &sb), 0);
    ASSERT_OK(khub__cache_verify(hub, NULL, NULL, NULL, &checked, &bad));
    ASSERT_OK(khub_hub_variant_files(hub, &id, C1, fx.variant, &l));
    ASSERT_EQ(l->count, 1);
    khub_hub_file_list_free(l);
    khub_hub_free(hub);
    fx_done(&fx);
}

#define TEST_LIST(X) \
    X(hub_handles_on_threads) \
    X(judge_sees_what_is_parsed) \
    X(snapshot_links_made_outside_the_folder) \
    X(interrupted_download_debris)
TEST_MAIN(TEST_LIST)
