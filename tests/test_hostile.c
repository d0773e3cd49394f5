/* test_hostile.c: plugins that attack the gate itself (issue 10, item 4;
 * tests/plugins/hostile.c): a forged check verdict, a plugin that detects
 * the check, one that outlives an alarm, a downloaded plugin with a RUNPATH,
 * an id with terminal escape codes, kinds other than its note's. Each test
 * fails on the gate as it was before that item. */
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>

#include "check.h"
#include "gate_memo.h"
#include "plugin_artifacts.h"
#include "plugins/tp_util.h"
#include "runtime_impl.h"
#include "sealed_memo.h"

/* A fresh path for the mark a hostile plugin's constructor leaves, set in
 * $KHUB_HOSTILE_MARK; the file does not exist yet. */
static const char *mark_path(void)
{
    static char path[256];
    snprintf(path, sizeof path, "/tmp/khub-test-%d-hostile-mark", (int)getpid());
    unlink(path);
    ASSERT_EQ(setenv("KHUB_HOSTILE_MARK", path, 1), 0);
    return path;
}

static int exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* ------------------------------------------------------------------------ */
/* The check's child                                                        */
/* ------------------------------------------------------------------------ */

TEST_IMPL(check_refuses_forged_verdict)
{
    /* Its constructor writes "R0 ... selftest passed" to every descriptor,
     * then its init fails: the forged line must not be the verdict. */
    const char *path = TP("hostile_forge");
    char report[KHUB_ERROR_SIZE];
    ASSERT_STATUS(khub__check_in_child(path, TP_SHA(path), report, sizeof report),
                  KHUB_STATUS_PLUGIN_INVALID);
    ASSERT_CONTAINS(report, "hostile_forge.so: plugin code wrote to the check's result channel (a "
                            "result line without a valid tag: \"R0");
    ASSERT_CONTAINS(report, "the verdict is refused");
    ASSERT_CONTAINS(khub_last_error(), "plugin code wrote to the check's result channel");
}

TEST_IMPL(check_survives_closed_key_channel)
{
    /* Its constructor closes the child's end of the key channel, then asks
     * for the key: the parent's answer must not raise SIGPIPE here. */
    const char *path = TP("hostile_sigpipe");
    char report[KHUB_ERROR_SIZE];
    ASSERT_STATUS(khub__check_in_child(path, TP_SHA(path), report, sizeof report),
                  KHUB_STATUS_PLUGIN_INVALID);
    ASSERT_CONTAINS(report, "hostile_sigpipe.so: plugin code wrote to the check's result channel");
}

TEST_IMPL(check_child_has_no_alarm)
{
    /* Its selftest fails when alarm(0) finds an alarm pending. */
    const char *path = TP("hostile_alarm");
    char report[KHUB_ERROR_SIZE];
    ASSERT_OK(khub__check_in_child(path, TP_SHA(path), report, sizeof report));
    ASSERT_STR_EQ(report, "khub-test/hostile 1.0.0: loaded, 1 ops, selftest passed");
}

TEST_IMPL(check_timed_by_parent)
{
    /* Its init ignores SIGALRM and sleeps for ever: only a timer outside
     * the child stops it. */
    ASSERT_EQ(setenv("KHUB_CHECK_TIMEOUT_S", "2", 1), 0);
    const char *path = TP("hostile_hang");
    char report[KHUB_ERROR_SIZE];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ASSERT_STATUS(khub__check_in_child(path, TP_SHA(path), report, sizeof report),
                  KHUB_STATUS_TIMEOUT);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ASSERT_CONTAINS(report, "hostile_hang.so: timed out after 2 s during init");
    ASSERT(t1.tv_sec - t0.tv_sec < 15);
    /* A bad value is ignored (the default, 60 s, applies): no hang here. */
    ASSERT_EQ(setenv("KHUB_CHECK_TIMEOUT_S", "0", 1), 0);
    ASSERT_OK(khub__check_in_child(TP("good_v1"), NULL, report, sizeof report));
    unsetenv("KHUB_CHECK_TIMEOUT_S");
}

TEST_IMPL(check_child_inherits_no_descriptors)
{
    /* A descriptor of the host (here: a file open without O_CLOEXEC) is
     * closed in the child before the plugin runs: the forging plugin, which
     * writes to every descriptor, leaves this file empty. */
    char path[256];
    snprintf(path, sizeof path, "/tmp/khub-test-%d-host-fd", (int)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT(fd >= 0);
    const char *forge = TP("hostile_forge");
    char report[KHUB_ERROR_SIZE];
    khub__check_in_child(forge, TP_SHA(forge), report, sizeof report);
    struct stat sb;
    ASSERT_EQ(fstat(fd, &sb), 0);
    ASSERT_EQ(sb.st_size, 0);
    close(fd);
    unlink(path);
}

/* ------------------------------------------------------------------------ */
/* The ABI gate on a downloaded plugin's load                               */
/* ------------------------------------------------------------------------ */

TEST_IMPL(verified_load_refuses_runpath_before_dlopen)
{
    const char *mark = mark_path();
    const char *path = TP("hostile_runpath");
    khub_runtime *rt = tp_runtime(1);
    khub_plugin *p = (khub_plugin *)1;
    ASSERT_STATUS(khub__plugin_load_verified(rt, path, TP_SHA(path), NULL, 0, &p),
                  KHUB_STATUS_PLUGIN_INVALID);
    ASSERT(p == NULL);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "hostile_runpath.so: refused before loading: the ABI "
                                             "gate found 1 problem(s): has RUNPATH "
                                             "'/opt/khub-hostile-lib'");
    ASSERT(!exists(mark)); /* its constructor never ran */
    ASSERT_EQ(khub_plugin_count(rt), 0);
    /* With KHUB_OPT_ISOLATED_INIT its code would first run in a child: the
     * gate comes before that child too. */
    ASSERT_OK(khub_runtime_set_option(rt, KHUB_OPT_ISOLATED_INIT, 1));
    ASSERT_STATUS(khub__plugin_load_verified(rt, path, TP_SHA(path), NULL, 0, &p),
                  KHUB_STATUS_PLUGIN_INVALID);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "refused before loading: the ABI gate found 1 "
                                             "problem(s): has RUNPATH '/opt/khub-hostile-lib'");
    ASSERT(!exists(mark));
    ASSERT_OK(khub_runtime_set_option(rt, KHUB_OPT_ISOLATED_INIT, 0));
    /* A clean plugin passes the same gate (this host's glibc as ceiling). */
    const char *good = TP("good_v1");
    ASSERT_OK(khub__plugin_load_verified(rt, good, TP_SHA(good), NULL, 0, &p));
    ASSERT_EQ(khub_plugin_count(rt), 1);
    khub_runtime_free(rt);
    unlink(mark);
}

static khub_gate_memo_stats gate_stats(void)
{
    khub_gate_memo_stats s;
    khub__gate_memo_stats(&s);
    return s;
}

TEST_IMPL(gate_verdict_never_outlives_the_bytes)
{
    /* The checks a plugin's sealed bytes passed are remembered by their
     * SHA-256 (gate_memo.h), never by the file: the same path loaded again
     * with other bytes is inspected and gated again, with the message a
     * first load gets, and its code never runs. */
    khub__gate_memo_clear();
    const char *mark = mark_path();
    size_t good_n = 0, bad_n = 0;
    unsigned char *good = tp_read(TP("good_v1"), &good_n);
    unsigned char *bad = tp_read(TP("hostile_runpath"), &bad_n);
    const char *path = TP_WRITE("gate-memo.so", good, good_n);
    char good_sha[65], bad_sha[65];
    ASSERT_OK(khub__sha256_hex(good, good_n, good_sha));
    ASSERT_OK(khub__sha256_hex(bad, bad_n, bad_sha));
    khub_runtime *rt = tp_runtime(1);
    khub_plugin *p = NULL;
    ASSERT_OK(khub__plugin_load_verified(rt, path, good_sha, NULL, 0, &p));
    ASSERT_EQ(gate_stats().entries, 1);
    ASSERT_EQ(gate_stats().hits, 0);
    khub_runtime_free(rt);
    /* The same bytes again: answered by the memo. */
    rt = tp_runtime(1);
    ASSERT_OK(khub__plugin_load_verified(rt, path, good_sha, NULL, 0, &p));
    ASSERT_EQ(gate_stats().hits, 1);
    khub_runtime_free(rt);
    /* The file edited in place, the same name: gated, refused, not kept. */
    ASSERT_STR_EQ(TP_WRITE("gate-memo.so", bad, bad_n), path);
    char want[KHUB_ERROR_SIZE];
    snprintf(want, sizeof want,
             "%s: refused before loading: the ABI gate found 1 problem(s): has RUNPATH "
             "'/opt/khub-hostile-lib' (plugins must not carry search paths)",
             path);
    for (int round = 0; round < 2; round++) {
        rt = tp_runtime(1);
        p = (khub_plugin *)1;
        ASSERT_STATUS(khub__plugin_load_verified(rt, path, bad_sha, NULL, 0, &p),
                      KHUB_STATUS_PLUGIN_INVALID);
        ASSERT(p == NULL);
        ASSERT_STR_EQ(khub_runtime_errmsg(rt), want);
        ASSERT_EQ(khub_plugin_count(rt), 0);
        ASSERT(!exists(mark)); /* its constructor never ran */
        khub_runtime_free(rt);
    }
    ASSERT_EQ(gate_stats().hits, 1);
    ASSERT_EQ(gate_stats().entries, 1); /* the refusal was not remembered */
    /* A pass without the gate (khub_plugin_load: the embedder's own file)
     * never answers for a load that must gate. */
    khub__gate_memo_clear();
    rt = tp_runtime(1);
    ASSERT_STATUS(khub_plugin_load(rt, path, bad_sha, &p), KHUB_STATUS_OK);
    ASSERT_EQ(gate_stats().entries, 1);
    khub_runtime_free(rt);
    unlink(mark);
    rt = tp_runtime(1);
    ASSERT_STATUS(khub__plugin_load_verified(rt, path, bad_sha, NULL, 0, &p),
                  KHUB_STATUS_PLUGIN_INVALID);
    ASSERT_STR_EQ(khub_runtime_errmsg(rt), want);
    ASSERT_EQ(gate_stats().hits, 0);
    khub_runtime_free(rt);
    unlink(path);
    unlink(mark);
    free(good);
    free(bad);
}

static khub_sealed_memo_stats sealed_stats(void)
{
    khub_sealed_memo_stats s;
    khub__sealed_memo_stats(&s);
    return s;
}

TEST_IMPL(sealed_copy_never_outlives_the_file)
{
    /* A downloaded plugin's sealed memfd is kept after its unload for the
     * next load of the same file (sealed_memo.h) only when the file's ctime
     * was settled (2 s old) when it was read, and serves only while the
     * file stat()s as it did then: edited in place between two loads (same
     * inode, same size), the file is read again and refused with the
     * message a first load gets, and the copy is dropped. */
    khub__sealed_memo_clear();
    size_t n = 0;
    unsigned char *bytes = tp_read(TP("good_v1"), &n);
    char sha[65], edited_sha[65], want[KHUB_ERROR_SIZE], first[48];
    ASSERT_OK(khub__sha256_hex(bytes, n, sha));
    const char *path = TP_WRITE("sealed-memo.so", bytes, n);
    khub_plugin *p = NULL;
    khub_runtime *rt = tp_runtime(1);
    ASSERT_OK(khub__plugin_load_verified(rt, path, sha, NULL, 0, &p));
    khub_runtime_free(rt);
    ASSERT_EQ(sealed_stats().entries, 0); /* written just now: not settled, not kept */
    struct timespec settle = {2, 200 * 1000 * 1000};
    nanosleep(&settle, NULL);
    rt = tp_runtime(1);
    ASSERT_OK(khub__plugin_load_verified(rt, path, sha, NULL, 0, &p));
    snprintf(first, sizeof first, "%s", p->memfd_name);
    khub_runtime_free(rt);
    ASSERT_EQ(sealed_stats().entries, 1);
    /* Unchanged: the kept copy serves, its bytes hashed again. */
    rt = tp_runtime(1);
    ASSERT_OK(khub__plugin_load_verified(rt, path, sha, NULL, 0, &p));
    ASSERT_EQ(sealed_stats().hits, 1);
    ASSERT_STR_EQ(p->memfd_name, first);
    ASSERT_STR_EQ(p->sha256, sha);
    ASSERT_EQ(khub_plugin_count(rt), 1);
    khub_runtime_free(rt);
    /* Edited in place: one byte, same inode and size; only the times tell. */
    bytes[n - 1] ^= 0x5a;
    ASSERT_OK(khub__sha256_hex(bytes, n, edited_sha));
    FILE *f = fopen(path, "r+b");
    ASSERT(f != NULL);
    ASSERT_EQ(fwrite(bytes, 1, n, f), n);
    ASSERT_EQ(fclose(f), 0);
    snprintf(want, sizeof want,
             "plugin file %s: SHA-256 is %s, expected %s; the file is not the one that was "
             "verified, fetch it again",
             path, edited_sha, sha);
    for (int round = 0; round < 2; round++) {
        rt = tp_runtime(1);
        p = (khub_plugin *)1;
        ASSERT_STATUS(khub__plugin_load_verified(rt, path, sha, NULL, 0, &p),
                      KHUB_STATUS_DIGEST_MISMATCH);
        ASSERT(p == NULL);
        ASSERT_STR_EQ(khub_runtime_errmsg(rt), want);
        ASSERT_EQ(khub_plugin_count(rt), 0);
        khub_runtime_free(rt);
        ASSERT_EQ(sealed_stats().entries, 0); /* dropped, and the refusal not kept */
    }
    ASSERT_EQ(sealed_stats().hits, 1);
    unlink(path);
    free(bytes);
}

/* ------------------------------------------------------------------------ */
/* Names and kinds                                                          */
/* ------------------------------------------------------------------------ */

TEST_IMPL(escape_codes_in_id_refused)
{
    const char *mark = mark_path();
    const char *path = TP("hostile_esc_id");
    const char *want = "plugin id \"khub-test/\\x1b[2Jhostile\" has byte 0x1b at offset 10; a "
                       "plugin id may hold only letters, digits, '-', '_', '.' and '/' (Hub ID "
                       "characters)";
    char err[KHUB_ERROR_SIZE];
    khub_plugin_info info = {KHUB_STRUCT_INIT(khub_plugin_info)};
    ASSERT_STATUS(khub_plugin_inspect(path, &info, err, sizeof err), KHUB_STATUS_PLUGIN_INVALID);
    ASSERT_CONTAINS(err, want);
    ASSERT(strchr(err, '\033') == NULL);
    khub_runtime *rt = tp_runtime(1);
    ASSERT_STATUS(khub_plugin_load(rt, path, TP_SHA(path), NULL), KHUB_STATUS_PLUGIN_INVALID);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), want);
    ASSERT(strchr(khub_runtime_errmsg(rt), '\033') == NULL);
    ASSERT(!exists(mark)); /* refused from the note, before dlopen */
    khub_runtime_free(rt);
}

static khub_status esc_version_init(const khub_host_api *h, khub_plugin_desc *out, char *e,
                                    size_t n)
{
    (void)h, (void)e, (void)n;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc), .id = "khub-test/static",
                          .version = "1.0\033]0;pwned\a"};
    return khub_plugin_desc_put(out, &d);
}

TEST_IMPL(escape_codes_in_static_version_refused)
{
    khub_runtime *rt = tp_runtime(1);
    ASSERT_STATUS(khub_plugin_load_static(rt, esc_version_init, NULL), KHUB_STATUS_PLUGIN_INVALID);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "descriptor plugin version \"1.0\\x1b]0;pwned\\x07\" "
                                             "has byte 0x1b at offset 3");
    ASSERT(strchr(khub_runtime_errmsg(rt), '\033') == NULL);
    ASSERT_EQ(khub_plugin_count(rt), 0);
    khub_runtime_free(rt);
}

TEST_IMPL(registered_kinds_match_note)
{
    khub_runtime *rt = tp_runtime(1);
    const char *path = TP("hostile_kinds");
    ASSERT_STATUS(khub_plugin_load(rt, path, TP_SHA(path), NULL), KHUB_STATUS_PLUGIN_INVALID);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt),
                    "plugin khub-test/hostile 1.0.0: its ABI note declares "
                    "kinds { norm }, it registers ops of kinds { "
                    "activation }");
    ASSERT_EQ(khub_plugin_count(rt), 0);
    khub_runtime_free(rt);
}

#define TEST_LIST(X) \
    X(check_refuses_forged_verdict) \
    X(check_survives_closed_key_channel) \
    X(check_child_has_no_alarm) \
    X(check_timed_by_parent) \
    X(check_child_inherits_no_descriptors) \
    X(verified_load_refuses_runpath_before_dlopen) \
    X(gate_verdict_never_outlives_the_bytes) \
    X(sealed_copy_never_outlives_the_file) \
    X(escape_codes_in_id_refused) \
    X(escape_codes_in_static_version_refused) \
    X(registered_kinds_match_note)
TEST_MAIN(TEST_LIST)
