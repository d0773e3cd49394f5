/*
 * test_lockfile.c: khub.lock (content hash known answer, strict parsing with
 * messages, round trip, the per-file check naming the file), the Python
 * kernels.lock import, and the verified artifact store behind host->artifact.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dir_list.h"
#include "hub_impl.h"
#include "kernel_meta.h"
#include "lockfile.h"
#include "plugin_artifacts.h"
#include "runner.h"

#define C1 "1111111111111111111111111111111111111111"
#define HA "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define HB "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    ASSERT(f != NULL);
    fputs(text, f);
    fclose(f);
}

/* The documented definition, computed independently: SHA-256 over the
 * sorted lines "name\0sha\n". */
TEST_IMPL(content_hash_known_answer)
{
    khub_lock_file files[2] = {{"z.so", HB}, {"metadata.json", HA}};
    char got[KHUB_LOCK_HASH_LEN + 1], want[65];
    ASSERT_OK(khub__lock_content_hash(files, 2, got));
    const char text[] = "metadata.json\0" HA "\nz.so\0" HB "\n";
    ASSERT_OK(khub__sha256_hex(text, sizeof text - 1, want));
    ASSERT(strncmp(got, "sha256:", 7) == 0);
    ASSERT_STR_EQ(got + 7, want);
    khub_lock_file dup[2] = {{"a", HA}, {"a", HB}};
    ASSERT_STATUS(khub__lock_content_hash(dup, 2, got), KHUB_STATUS_INVALID_ARG);
}

static char *lock_text(const char *hash)
{
    static char buf[2048];
    snprintf(buf, sizeof buf,
             "{\"format\":1,\"kernels\":[{\"repo\":\"org/k\",\"version\":1,\"commit\":\"" C1
             "\",\"variants\":{\"khub1-cpu-x86_64-linux\":{\"hash\":\"%s\",\"files\":"
             "{\"metadata.json\":\"" HA "\",\"z.so\":\"" HB "\"}}}}]}",
             hash);
    return buf;
}

TEST_IMPL(parse_round_trip_and_errors)
{
    khub_lock_file files[2] = {{"z.so", HB}, {"metadata.json", HA}};
    char h[KHUB_LOCK_HASH_LEN + 1], err[KHUB_ERROR_SIZE];
    ASSERT_OK(khub__lock_content_hash(files, 2, h));
    khub_lock *lock = NULL;
    const char *t = lock_text(h);
    ASSERT_OK(khub__lock_parse(t, strlen(t), &lock, err, sizeof err));
    khub_lock_entry *e = khub__lock_find(lock, "org/k");
    ASSERT(e != NULL);
    ASSERT_EQ(e->version, 1);
    ASSERT_STR_EQ(e->commit, C1);
    ASSERT_EQ(e->n_variants, (size_t)1);
    char dir[] = "/tmp/khub-locktest-XXXXXX", path[300];
    ASSERT(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/khub.lock", dir);
    ASSERT_OK(khub__lock_save(lock, path, err, sizeof err));
    khub__lock_free(lock);
    ASSERT_OK(khub__lock_load(path, &lock, err, sizeof err));
    ASSERT_STR_EQ(khub__lock_find(lock, "org/k")->variants[0].hash, h);
    khub__lock_free(lock);

    t = lock_text("sha256:" HA);
    ASSERT_STATUS(khub__lock_parse(t, strlen(t), &lock, err, sizeof err), KHUB_STATUS_PARSE);
    ASSERT_CONTAINS(err, "edited by hand");
    const char *both = "{\"format\":1,\"kernels\":[{\"repo\":\"org/k\",\"version\":1,"
                       "\"revision\":\"main\",\"commit\":\"" C1 "\"}]}";
    ASSERT_STATUS(khub__lock_parse(both, strlen(both), &lock, err, sizeof err), KHUB_STATUS_PARSE);
    ASSERT_CONTAINS(err, "kernels[0]: both \"version\" and \"revision\"");
    const char *extra = "{\"format\":1,\"kernels\":[{\"repo\":\"org/k\",\"version\":1,"
                        "\"commit\":\"" C1 "\",\"sha\":\"x\"}]}";
    ASSERT_STATUS(khub__lock_parse(extra, strlen(extra), &lock, err, sizeof err),
                  KHUB_STATUS_PARSE);
    ASSERT_CONTAINS(err, "unknown field \"sha\"");
    const char *fmt2 = "{\"format\":2,\"kernels\":[]}";
    ASSERT_STATUS(khub__lock_parse(fmt2, strlen(fmt2), &lock, err, sizeof err), KHUB_STATUS_PARSE);
    ASSERT_CONTAINS(err, "\"format\" must be 1");
    khub__rmtree(dir);
}

/* Issue 10: the lock is read as strictly at the top as in its entries, a
 * key named twice anywhere is an error (cJSON takes the first, jq and
 * Python the last), and kernel_version round-trips. */
TEST_IMPL(parse_strict_and_kernel_version)
{
    khub_lock *lock = NULL;
    char err[KHUB_ERROR_SIZE];
    static const struct {
        const char *json, *msg;
    } cases[] = {
        {"{\"format\":1,\"kernels\":[],\"kernel\":[]}", "khub.lock: unknown field \"kernel\""},
        {"{\"format\":1,\"kernels\":[{\"repo\":\"org/k\",\"version\":1,\"commit\":\"" C1
         "\",\"commit\":\"2222222222222222222222222222222222222222\"}]}",
         "khub.lock: duplicate key \"commit\""},
        {"{\"format\":1,\"kernels\":[],\"kernels\":[{\"repo\":\"org/k\"}]}",
         "khub.lock: duplicate key \"kernels\""},
        {"{\"format\":1,\"kernels\":[]}{}", "khub.lock: text after the JSON document"},
        {"{\"format\":1,\"kernels\":[{\"repo\":\"org/k\",\"version\":1,\"commit\":\"" C1
         "\",\"kernel_version\":3}]}",
         "kernels[0].kernel_version must be a short non-empty string"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ASSERT_STATUS(
            khub__lock_parse(cases[i].json, strlen(cases[i].json), &lock, err, sizeof err),
            KHUB_STATUS_PARSE);
        ASSERT(lock == NULL);
        ASSERT_CONTAINS(err, cases[i].msg);
    }
    const char *t = "{\"format\":1,\"kernels\":[{\"repo\":\"org/k\",\"version\":1,"
                    "\"commit\":\"" C1 "\",\"kernel_version\":\"1.0.1\"}]}";
    ASSERT_OK(khub__lock_parse(t, strlen(t), &lock, err, sizeof err));
    ASSERT_STR_EQ(khub__lock_find(lock, "org/k")->kernel_version, "1.0.1");
    char dir[] = "/tmp/khub-locktest-XXXXXX", path[300];
    ASSERT(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/khub.lock", dir);
    ASSERT_OK(khub__lock_save(lock, path, err, sizeof err));
    khub__lock_free(lock);
    ASSERT_OK(khub__lock_load(path, &lock, err, sizeof err));
    ASSERT_STR_EQ(khub__lock_find(lock, "org/k")->kernel_version, "1.0.1");
    khub__lock_free(lock);
    khub__rmtree(dir);
}

TEST_IMPL(version_order)
{
    static const struct {
        const char *a, *b;
        int sign;
    } cases[] = {
        {"1.0.0", "1.0.1", -1},      {"1.10.0", "1.9.0", 1},     {"2", "1.9.9", 1},
        {"1.0", "1.0.0", 0},         {"1.0.0-rc1", "1.0.0", -1}, {"1.0.0-rc2", "1.0.0-rc10", 1},
        {"1.0.0+b2", "1.0.0+b1", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool ok = false;
        int c = khub__lock_version_cmp(cases[i].a, cases[i].b, &ok);
        ASSERT(ok);
        ASSERT_EQ((c > 0) - (c < 0), cases[i].sign);
    }
    bool ok = true;
    ASSERT_EQ(khub__lock_version_cmp("main", "1.0.0", &ok), 0);
    ASSERT(!ok);
}

TEST_IMPL(check_dir_names_the_file)
{
    char dir[] = "/tmp/khub-locktest-XXXXXX", path[300], err[KHUB_ERROR_SIZE];
    ASSERT(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/metadata.json", dir);
    write_file(path, "{}");
    snprintf(path, sizeof path, "%s/k.so", dir);
    write_file(path, "library");
    khub_lock_variant v;
    ASSERT_OK(
        khub__lock_variant_from_dir(NULL, "khub1-cpu-x86_64-linux", dir, &v, err, sizeof err));
    ASSERT_EQ(v.n_files, (size_t)2);
    ASSERT_OK(khub__lock_check_dir(&v, dir, NULL, "org/k@111", err, sizeof err));
    write_file(path, "librarY");
    ASSERT_STATUS(khub__lock_check_dir(&v, dir, NULL, "org/k@111", err, sizeof err),
                  KHUB_STATUS_LOCK_MISMATCH);
    ASSERT_CONTAINS(err, "k.so has SHA-256");
    ASSERT_CONTAINS(err, "khub.lock says");
    write_file(path, "library");
    snprintf(path, sizeof path, "%s/extra.ptx", dir);
    write_file(path, "x");
    ASSERT_STATUS(khub__lock_check_dir(&v, dir, NULL, "org/k@111", err, sizeof err),
                  KHUB_STATUS_LOCK_MISMATCH);
    ASSERT_CONTAINS(err, "extra.ptx is in");
    unlink(path);
    /* a missing file is named too */
    snprintf(path, sizeof path, "%s/k.so", dir);
    unlink(path);
    ASSERT_STATUS(khub__lock_check_dir(&v, dir, NULL, "org/k@111", err, sizeof err),
                  KHUB_STATUS_LOCK_MISMATCH);
    ASSERT_CONTAINS(err, "locked file k.so is missing from");
    write_file(path, "library");
    /* metadata.json.sig is outside the hash (docs/lockfile.md): adding or
     * renewing a signature changes neither the files nor the content hash */
    snprintf(path, sizeof path, "%s/metadata.json.sig", dir);
    write_file(path, "signature");
    khub_lock_variant v2;
    ASSERT_OK(
        khub__lock_variant_from_dir(NULL, "khub1-cpu-x86_64-linux", dir, &v2, err, sizeof err));
    ASSERT_EQ(v2.n_files, (size_t)2);
    ASSERT_STR_EQ(v2.hash, v.hash);
    ASSERT_OK(khub__lock_check_dir(&v, dir, NULL, "org/k@111", err, sizeof err));
    /* With the caller's digest of the metadata.json it read, that digest is
     * judged, not a second read of the file: another digest is refused
     * naming it, and the file on disk is not looked at. */
    char other[65], meta_sha[65];
    ASSERT_OK(khub__sha256_hex("{ }", 3, other));
    ASSERT_OK(khub__sha256_hex("{}", 2, meta_sha));
    ASSERT_STATUS(khub__lock_check_dir(&v, dir, other, "org/k@111", err, sizeof err),
                  KHUB_STATUS_LOCK_MISMATCH);
    char expect[300];
    snprintf(expect, sizeof expect, "metadata.json has SHA-256 %s, khub.lock says %s", other,
             meta_sha);
    ASSERT_CONTAINS(err, expect);
    snprintf(path, sizeof path, "%s/metadata.json", dir);
    write_file(path, "{\"changed\": 1}");
    ASSERT_OK(khub__lock_check_dir(&v, dir, meta_sha, "org/k@111", err, sizeof err));
    ASSERT_STATUS(khub__lock_check_dir(&v, dir, NULL, "org/k@111", err, sizeof err),
                  KHUB_STATUS_LOCK_MISMATCH);
    ASSERT_CONTAINS(err, "metadata.json has SHA-256");
    write_file(path, "{}");
    /* the documented hash of these two files, computed here */
    char want[65], line[200];
    const char text_k[] = "library", text_m[] = "{}";
    char hk[65], hm[65];
    ASSERT_OK(khub__sha256_hex(text_k, sizeof text_k - 1, hk));
    ASSERT_OK(khub__sha256_hex(text_m, sizeof text_m - 1, hm));
    int n = snprintf(line, sizeof line, "k.so%c%s\nmetadata.json%c%s\n", 0, hk, 0, hm);
    ASSERT_OK(khub__sha256_hex(line, (size_t)n, want));
    ASSERT(strncmp(v.hash, "sha256:", 7) == 0);
    ASSERT_STR_EQ(v.hash + 7, want);
    khub__mem_free(v.files);
    khub__mem_free(v2.files);
    khub__rmtree(dir);
}

/* A metadata.json table for k.so (and extra, when not NULL) with these
 * digests, parsed. */
static void table_of(const char *k_sha, const char *extra, const char *extra_sha, khub_kmeta *m)
{
    char json[2048], err[KHUB_ERROR_SIZE] = "", more[300] = "";
    if (extra) snprintf(more, sizeof more, ",\"%s\":\"%s\"", extra, extra_sha);
    snprintf(json, sizeof json,
             "{\"format\":1,\"name\":\"org/k\",\"version\":\"1.0.0\",\"major\":1,"
             "\"variant\":\"khub1-cpu-x86_64-linux\",\"abi\":{\"major\":1,\"minor\":0},"
             "\"backend\":{\"type\":\"cpu\",\"archs\":[\"x86_64\"]},"
             "\"plugins\":[{\"file\":\"k.so\",\"level\":\"generic\",\"cpu_features\":[]}],"
             "\"files\":{\"k.so\":\"%s\"%s},"
             "\"provenance\":{\"source_commit\":\"unknown\",\"dirty\":false}}",
             k_sha, more);
    khub_status st = khub__kmeta_parse(json, strlen(json), m, err, sizeof err);
    if (st != KHUB_STATUS_OK) fprintf(stderr, "table_of: %s\n", err);
    ASSERT_OK(st);
}

/* What a load checks before the parse (names, presence, metadata.json by
 * the digest of the bytes read) hashes no other file; the table check then
 * holds the parsed digests to the lock's. */
TEST_IMPL(check_names_and_table)
{
    char dir[] = "/tmp/khub-locktest-XXXXXX", path[300], err[KHUB_ERROR_SIZE];
    ASSERT(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/metadata.json", dir);
    write_file(path, "{}");
    snprintf(path, sizeof path, "%s/k.so", dir);
    write_file(path, "library");
    khub_lock_variant v;
    ASSERT_OK(
        khub__lock_variant_from_dir(NULL, "khub1-cpu-x86_64-linux", dir, &v, err, sizeof err));
    char meta_sha[65], k_sha[65], other[65];
    ASSERT_OK(khub__sha256_hex("{}", 2, meta_sha));
    ASSERT_OK(khub__sha256_hex("library", 7, k_sha));
    ASSERT_OK(khub__sha256_hex("librarY", 7, other));
    ASSERT_OK(khub__lock_check_names(&v, dir, NULL, meta_sha, "org/k@111", err, sizeof err));
    /* k.so changed: not this check's to see (the full check does) */
    write_file(path, "librarY");
    ASSERT_OK(khub__lock_check_names(&v, dir, NULL, meta_sha, "org/k@111", err, sizeof err));
    ASSERT_STATUS(khub__lock_check_dir(&v, dir, meta_sha, "org/k@111", err, sizeof err),
                  KHUB_STATUS_LOCK_MISMATCH);
    ASSERT_CONTAINS(err, "k.so has SHA-256");
    /* missing and extra names, and metadata.json's digest, still refused */
    unlink(path);
    ASSERT_STATUS(khub__lock_check_names(&v, dir, NULL, meta_sha, "org/k@111", err, sizeof err),
                  KHUB_STATUS_LOCK_MISMATCH);
    ASSERT_CONTAINS(err, "locked file k.so is missing from");
    write_file(path, "library");
    char extra[300];
    snprintf(extra, sizeof extra, "%s/extra.ptx", dir);
    write_file(extra, "x");
    ASSERT_STATUS(khub__lock_check_names(&v, dir, NULL, meta_sha, "org/k@111", err, sizeof err),
                  KHUB_STATUS_LOCK_MISMATCH);
    ASSERT_CONTAINS(err, "extra.ptx is in");
    unlink(extra);
    ASSERT_STATUS(khub__lock_check_names(&v, dir, NULL, other, "org/k@111", err, sizeof err),
                  KHUB_STATUS_LOCK_MISMATCH);
    ASSERT_CONTAINS(err, "metadata.json has SHA-256");
    ASSERT_STATUS(khub__lock_check_names(&v, dir, NULL, NULL, "org/k@111", err, sizeof err),
                  KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(err, "no digest of metadata.json to check");

    /* the table: the lock's digests, every locked file listed */
    khub_kmeta *m = calloc(1, sizeof *m);
    ASSERT(m != NULL);
    table_of(k_sha, NULL, NULL, m);
    ASSERT_OK(khub__lock_check_table(&v, m, "org/k@111", err, sizeof err));
    table_of(other, NULL, NULL, m);
    ASSERT_STATUS(khub__lock_check_table(&v, m, "org/k@111", err, sizeof err),
                  KHUB_STATUS_LOCK_MISMATCH);
    char want[300];
    snprintf(want, sizeof want, "metadata.json states SHA-256 %s for k.so, khub.lock says %s",
             other, k_sha);
    ASSERT_CONTAINS(err, want);
    ASSERT_CONTAINS(err, "run khub lock again");
    table_of(k_sha, "x.ptx", other, m);
    ASSERT_STATUS(khub__lock_check_table(&v, m, "org/k@111", err, sizeof err),
                  KHUB_STATUS_LOCK_MISMATCH);
    ASSERT_CONTAINS(err, "for x.ptx, khub.lock does not pin it");
    /* a lock pinning a file the table does not list */
    write_file(extra, "x");
    khub_lock_variant v2;
    ASSERT_OK(
        khub__lock_variant_from_dir(NULL, "khub1-cpu-x86_64-linux", dir, &v2, err, sizeof err));
    table_of(k_sha, NULL, NULL, m);
    ASSERT_STATUS(khub__lock_check_table(&v2, m, "org/k@111", err, sizeof err),
                  KHUB_STATUS_LOCK_MISMATCH);
    ASSERT_CONTAINS(err, "khub.lock pins extra.ptx, which metadata.json does not list");
    free(m);
    khub__mem_free(v.files);
    khub__mem_free(v2.files);
    khub__rmtree(dir);
}

/* khub__lock_check_names on the caller's one listing of the folder (a
 * warm load lists it once for this check and the hub's): the same
 * statuses and messages as on its own listing and lstat per file. */
TEST_IMPL(check_names_from_one_listing)
{
    char dir[] = "/tmp/khub-locktest-XXXXXX", path[300], extra[300], err[KHUB_ERROR_SIZE];
    char want[600];
    ASSERT(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/metadata.json", dir);
    write_file(path, "{}");
    snprintf(path, sizeof path, "%s/k.so", dir);
    write_file(path, "library");
    snprintf(extra, sizeof extra, "%s/extra.ptx", dir);
    khub_lock_variant v;
    ASSERT_OK(
        khub__lock_variant_from_dir(NULL, "khub1-cpu-x86_64-linux", dir, &v, err, sizeof err));
    char meta_sha[65];
    ASSERT_OK(khub__sha256_hex("{}", 2, meta_sha));
    khub__dir_list l;
    ASSERT_OK(khub__dir_list_read(NULL, dir, &l));
    ASSERT_EQ(l.count, 2);
    ASSERT_OK(khub__lock_check_names(&v, dir, &l, meta_sha, "org/k@111", err, sizeof err));
    khub__dir_list_free(&l);
    /* an extra name in the listing */
    write_file(extra, "x");
    ASSERT_OK(khub__dir_list_read(NULL, dir, &l));
    ASSERT_STATUS(khub__lock_check_names(&v, dir, &l, meta_sha, "org/k@111", err, sizeof err),
                  KHUB_STATUS_LOCK_MISMATCH);
    snprintf(want, sizeof want,
             "org/k@111 variant khub1-cpu-x86_64-linux: extra.ptx is in %s but not in khub.lock; "
             "refusing the variant",
             dir);
    ASSERT_STR_EQ(err, want);
    khub__dir_list_free(&l);
    unlink(extra);
    /* a locked file missing from the listing */
    unlink(path);
    ASSERT_OK(khub__dir_list_read(NULL, dir, &l));
    ASSERT_STATUS(khub__lock_check_names(&v, dir, &l, meta_sha, "org/k@111", err, sizeof err),
                  KHUB_STATUS_LOCK_MISMATCH);
    snprintf(want, sizeof want,
             "org/k@111 variant khub1-cpu-x86_64-linux: locked file k.so is missing from %s; "
             "run khub sync",
             dir);
    ASSERT_STR_EQ(err, want);
    khub__dir_list_free(&l);
    /* listed, but as a link to nothing: not vouched for by the listing */
    ASSERT_EQ(symlink("/nonexistent/k.so", path), 0);
    ASSERT_OK(khub__dir_list_read(NULL, dir, &l));
    ASSERT_STATUS(khub__lock_check_names(&v, dir, &l, meta_sha, "org/k@111", err, sizeof err),
                  KHUB_STATUS_LOCK_MISMATCH);
    ASSERT_STR_EQ(err, want);
    khub__dir_list_free(&l);
    /* a folder that cannot be listed: the check's own message */
    ASSERT_OK(khub__dir_list_read(NULL, dir, &l));
    khub__rmtree(dir);
    ASSERT_STATUS(khub__dir_list_read(NULL, dir, &(khub__dir_list){0}), KHUB_STATUS_IO);
    khub__dir_list_free(&l);
    khub__mem_free(v.files);
}

TEST_IMPL(import_python_lock)
{
    const char *legacy = "[{\"repo_id\":\"kernels-community/relu\",\"sha\":\"" C1 "\","
                         "\"variants\":{\"torch212-cxx11-cu130-x86_64-linux\":{\"hash\":"
                         "\"sha256-c5\",\"hash_type\":\"git_lfs_concat\"}}},"
                         "{\"dependency\":{\"repo-id\":\"kernels-test/versions\",\"version\":2},"
                         "\"lock\":{\"commit\":\"" C1 "\"}}]";
    khub_lock *lock = NULL;
    char notes[2048], err[KHUB_ERROR_SIZE];
    ASSERT_OK(khub__lock_new(&lock));
    ASSERT_OK(khub__lock_import_python(legacy, strlen(legacy), lock, notes, sizeof notes, err,
                                       sizeof err));
    ASSERT_EQ(lock->count, (size_t)2);
    ASSERT_STR_EQ(khub__lock_find(lock, "kernels-community/relu")->commit, C1);
    ASSERT_EQ(khub__lock_find(lock, "kernels-test/versions")->version, 2);
    ASSERT_CONTAINS(notes, "torch212-cxx11-cu130-x86_64-linux (git_lfs_concat hash)");
    const char *bad = "[{\"repo_id\":\"x\",\"sha\":\"" C1 "\"}]";
    ASSERT_STATUS(
        khub__lock_import_python(bad, strlen(bad), lock, notes, sizeof notes, err, sizeof err),
        KHUB_STATUS_PARSE);
    ASSERT_CONTAINS(err, "kernels.lock[0]: repo \"x\" is not org/name");
    ASSERT_STATUS(khub__lock_import_python("{}", 2, lock, notes, sizeof notes, err, sizeof err),
                  KHUB_STATUS_PARSE);
    ASSERT_CONTAINS(err, "not a JSON array");
    khub__lock_free(lock);
}

TEST_IMPL(artifacts_serve_verified_bytes)
{
    char dir[] = "/tmp/khub-locktest-XXXXXX", path[300], sha[65], msg[KHUB_ERROR_SIZE];
    ASSERT(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/k.sm_80.ptx", dir);
    write_file(path, ".version 8.0");
    ASSERT_OK(khub__sha256_hex(".version 8.0", 12, sha));
    khub__artifact_file f = {"k.sm_80.ptx", path, sha};
    khub__artifacts *a = NULL;
    ASSERT_OK(khub__artifacts_new(NULL, &f, 1, &a, msg, sizeof msg));
    const void *data = NULL;
    size_t size = 0;
    ASSERT_STATUS(khub__artifacts_get(NULL, a, "k.sm_90.ptx", &data, &size, msg, sizeof msg),
                  KHUB_STATUS_NOT_FOUND);
    ASSERT_CONTAINS(msg, "k.sm_90.ptx is not a file of the plugin's verified variant");
    write_file(path, ".version 9.9"); /* changed after verification */
    ASSERT_STATUS(khub__artifacts_get(NULL, a, "k.sm_80.ptx", &data, &size, msg, sizeof msg),
                  KHUB_STATUS_DIGEST_MISMATCH);
    ASSERT_CONTAINS(msg, "changed after verification");
    write_file(path, ".version 8.0");
    ASSERT_OK(khub__artifacts_get(NULL, a, "k.sm_80.ptx", &data, &size, msg, sizeof msg));
    ASSERT_EQ(size, (size_t)12);
    ASSERT(memcmp(data, ".version 8.0", 13) == 0); /* NUL-terminated */
    khub__artifacts_free(NULL, a);
    khub__artifact_file badf = {"../x", path, sha};
    ASSERT_STATUS(khub__artifacts_new(NULL, &badf, 1, &a, msg, sizeof msg),
                  KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(msg, "not a plain file name");
    khub__rmtree(dir);
}

#define TEST_LIST(X) \
    X(content_hash_known_answer) \
    X(parse_round_trip_and_errors) \
    X(parse_strict_and_kernel_version) \
    X(version_order) \
    X(check_dir_names_the_file) \
    X(check_names_and_table) \
    X(check_names_from_one_listing) \
    X(import_python_lock) \
    X(artifacts_serve_verified_bytes)
TEST_MAIN(TEST_LIST)
