/* test_file_read.c: bounded whole-file reads: content, absence, a file over
 * the bound (refused, never cut short), a directory; a FIFO given as a
 * policy, lock, model, plugin or any read file is refused at once. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "khub/khub_model.h"
#include "lockfile.h"
#include "mmap_file.h"
#include "runner.h"
#include "trust.h"

static const char *write_tmp(const char *text)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/khub-fr-%d", (int)getpid());
    FILE *f = fopen(path, "w");
    ASSERT(f != NULL);
    fputs(text, f);
    fclose(f);
    return path;
}

TEST_IMPL(reads_whole_file)
{
    const char *p = write_tmp("hello");
    char *buf = NULL, err[KHUB_ERROR_SIZE] = "";
    size_t n = 0;
    ASSERT_OK(khub__read_file(p, 5, &buf, &n, err, sizeof err));
    ASSERT_EQ(n, 5);
    ASSERT_STR_EQ(buf, "hello"); /* NUL-terminated */
    free(buf);
    unlink(p);
}

TEST_IMPL(over_the_bound_is_refused)
{
    const char *p = write_tmp("hello!");
    char *buf = NULL, err[KHUB_ERROR_SIZE] = "";
    size_t n = 0;
    ASSERT_STATUS(khub__read_file(p, 5, &buf, &n, err, sizeof err), KHUB_STATUS_OVERFLOW);
    ASSERT(buf == NULL);
    ASSERT_CONTAINS(err, "larger than 5 bytes");
    unlink(p);
}

TEST_IMPL(absent_and_directory)
{
    char *buf = NULL, err[KHUB_ERROR_SIZE] = "";
    size_t n = 0;
    ASSERT_STATUS(khub__read_file("/nonexistent/f.json", 10, &buf, &n, err, sizeof err),
                  KHUB_STATUS_NOT_FOUND);
    ASSERT_CONTAINS(err, "/nonexistent/f.json: cannot open");
    ASSERT_STATUS(khub__read_file("/tmp", 10, &buf, &n, err, sizeof err), KHUB_STATUS_IO);
    ASSERT(buf == NULL);
}

/* The buffer is sized by fstat: a file of exactly the bound, a large one
 * (one read past 4 KiB), and /proc files, which report size 0 and are
 * longer than the first 4 KiB buffer (the buffer grows, up to the bound). */
TEST_IMPL(sized_by_fstat_and_grown)
{
    static char big[100000];
    for (size_t i = 0; i < sizeof big - 1; i++) big[i] = (char)('a' + i % 26);
    const char *p = write_tmp(big);
    char *buf = NULL, err[KHUB_ERROR_SIZE] = "";
    size_t n = 0;
    ASSERT_OK(khub__read_file_mem(NULL, p, sizeof big - 1, &buf, &n, err, sizeof err));
    ASSERT_EQ(n, sizeof big - 1);
    ASSERT(memcmp(buf, big, n) == 0 && buf[n] == '\0');
    khub__mem_free(buf);
    ASSERT_STATUS(khub__read_file_mem(NULL, p, sizeof big - 2, &buf, &n, err, sizeof err),
                  KHUB_STATUS_OVERFLOW);
    ASSERT_CONTAINS(err, "larger than 99998 bytes");
    unlink(p);
    /* /proc/self/maps: st_size 0, more than 4 KiB with libkhub's libraries mapped */
    struct stat sb;
    ASSERT_EQ(stat("/proc/self/maps", &sb), 0);
    ASSERT_EQ(sb.st_size, 0);
    ASSERT_OK(khub__read_file("/proc/self/maps", 1 << 20, &buf, &n, err, sizeof err));
    ASSERT(n > 4096);
    ASSERT_EQ(strlen(buf), n);
    ASSERT_EQ(buf[n - 1], '\n'); /* whole lines: not cut at a buffer's end */
    free(buf);
    ASSERT_STATUS(khub__read_file("/proc/self/maps", 5000, &buf, &n, err, sizeof err),
                  KHUB_STATUS_OVERFLOW);
    ASSERT(buf == NULL);
    ASSERT_CONTAINS(err, "/proc/self/maps: larger than 5000 bytes");
}

/* A FIFO named as a file used to block the open() for good, waiting for a
 * writer that never comes (issue 10). Every opener refuses it at once; an
 * alarm turns a hang into a failure. */
TEST_IMPL(fifo_refused_at_once)
{
    char fifo[64], err[KHUB_ERROR_SIZE] = "";
    snprintf(fifo, sizeof fifo, "/tmp/khub-fifo-%d", (int)getpid());
    ASSERT_EQ(mkfifo(fifo, 0600), 0);
    alarm(10);
    char *buf = NULL;
    size_t n = 0;
    ASSERT_STATUS(khub__read_file(fifo, 10, &buf, &n, err, sizeof err), KHUB_STATUS_IO);
    ASSERT_CONTAINS(err, "is a FIFO, not a regular file");
    ASSERT_EQ(khub__open_regular(fifo, NULL, 0), -1);
    ASSERT(khub__fopen_regular("/tmp", err, sizeof err) == NULL);
    ASSERT_CONTAINS(err, "/tmp: is a directory, not a regular file");

    khub_trust_policy *pol = NULL;
    ASSERT_STATUS(khub__trust_policy_load(fifo, &pol, err, sizeof err), KHUB_STATUS_IO);
    ASSERT_CONTAINS(err, "is a FIFO");
    khub_lock *lock = NULL;
    ASSERT(khub__lock_load(fifo, &lock, err, sizeof err) != KHUB_STATUS_OK);
    ASSERT_CONTAINS(err, "is a FIFO");

    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(NULL, &rt));
    ASSERT_STATUS(
        khub_plugin_load(rt, fifo,
                         "0000000000000000000000000000000000000000000000000000000000000000", NULL),
        KHUB_STATUS_IO);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "is a FIFO");
    khub_model *m = NULL;
    ASSERT(khub_model_load(rt, fifo, NULL, &m) != KHUB_STATUS_OK);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "is a FIFO");
    khub_runtime_free(rt);
    alarm(0);
    unlink(fifo);
}

/* ------------------------------------------------------------------------ */
/* A model's weights in huge-page memory (mmap_file.c)                      */
/* ------------------------------------------------------------------------ */

#define MIB ((size_t)1 << 20)

/* A file of n bytes, byte i = (i * 7 + i / 4096) & 0xff (no page repeats). */
static const char *write_pattern(size_t n)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/khub-huge-%d", (int)getpid());
    FILE *f = fopen(path, "w");
    ASSERT(f != NULL);
    for (size_t i = 0; i < n; i++) fputc((int)((i * 7 + i / 4096) & 0xff), f);
    fclose(f);
    return path;
}

static int pattern_ok(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != (uint8_t)((i * 7 + i / 4096) & 0xff)) return 0;
    return 1;
}

/* What huge_pages_on_request reads: THP given to madvise'd memory here. */
static int thp_on_request(void)
{
    char buf[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f) return 0;
    if (!fgets(buf, sizeof buf, f)) buf[0] = '\0';
    fclose(f);
    return strstr(buf, "[always]") || strstr(buf, "[madvise]");
}

/* 5 MiB and a bit: two whole huge pages' worth past the first boundary and
 * a tail in 4 KiB pages. Every byte arrives; the copy starts on a 2 MiB
 * boundary (else no page of it can be a huge one). */
TEST_IMPL(huge_copy_holds_the_file)
{
    const size_t n = 5 * MIB + 123;
    const char *p = write_pattern(n);
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(NULL, &rt));
    khub_mmap m;
    ASSERT_OK(khub__mmap_open_huge(rt, p, &m));
    ASSERT_EQ(m.size, n);
    ASSERT(pattern_ok(m.data, n));
    if (thp_on_request()) {
        ASSERT(m.huge);
        ASSERT_EQ((uintptr_t)m.data % (2 * MIB), 0);
    } else {
        ASSERT(!m.huge); /* no THP here: the file is mapped */
    }
    khub__mmap_close(rt, &m);
    ASSERT(m.data == NULL && m.path == NULL);
    khub_runtime_free(rt);
    unlink(p);
}

/* KHUB_HUGE_PAGES=0, and a file below 2 MiB, get the plain mapping. */
TEST_IMPL(huge_copy_off_and_small_files_are_mapped)
{
    const char *p = write_pattern(3 * MIB);
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(NULL, &rt));
    khub_mmap m;
    ASSERT_EQ(setenv("KHUB_HUGE_PAGES", "0", 1), 0);
    ASSERT_OK(khub__mmap_open_huge(rt, p, &m));
    ASSERT(!m.huge);
    ASSERT(pattern_ok(m.data, 3 * MIB));
    khub__mmap_close(rt, &m);
    ASSERT_EQ(unsetenv("KHUB_HUGE_PAGES"), 0);
    unlink(p);

    p = write_pattern(2 * MIB - 1);
    ASSERT_OK(khub__mmap_open_huge(rt, p, &m));
    ASSERT(!m.huge);
    ASSERT(pattern_ok(m.data, 2 * MIB - 1));
    khub__mmap_close(rt, &m);
    khub_runtime_free(rt);
    unlink(p);
}

/* The copy is read-only, as the mapping is: a write faults (in a child). */
TEST_IMPL(huge_copy_is_read_only)
{
    if (!thp_on_request()) return; /* the mapping's PROT_READ is the kernel's */
    const char *p = write_pattern(4 * MIB);
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(NULL, &rt));
    khub_mmap m;
    ASSERT_OK(khub__mmap_open_huge(rt, p, &m));
    ASSERT(m.huge);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL);
        ((volatile uint8_t *)m.data)[3 * MIB] = 1;
        _exit(0);
    }
    int ws = 0;
    ASSERT_EQ(waitpid(pid, &ws, 0), pid);
    ASSERT(WIFSIGNALED(ws));
    ASSERT_EQ(WTERMSIG(ws), SIGSEGV);
    khub__mmap_close(rt, &m);
    khub_runtime_free(rt);
    unlink(p);
}

/* Errors are the mapping's: absent, a folder. */
TEST_IMPL(huge_copy_errors)
{
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(NULL, &rt));
    khub_mmap m;
    ASSERT_STATUS(khub__mmap_open_huge(rt, "/nonexistent/w.gguf", &m), KHUB_STATUS_NOT_FOUND);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "/nonexistent/w.gguf: cannot open");
    ASSERT(m.data == NULL && m.size == 0 && !m.huge);
    khub_runtime_free(rt);
    ASSERT_OK(khub_runtime_new(NULL, &rt));
    ASSERT_STATUS(khub__mmap_open_huge(rt, "/tmp", &m), KHUB_STATUS_IO);
    ASSERT_STR_EQ(khub_runtime_errmsg(rt),
                  "/tmp: is a directory, not a regular file; give the path of a file");
    khub_runtime_free(rt);
}

#define TEST_LIST(X) \
    X(reads_whole_file) \
    X(over_the_bound_is_refused) \
    X(absent_and_directory) \
    X(sized_by_fstat_and_grown) \
    X(fifo_refused_at_once) \
    X(huge_copy_holds_the_file) \
    X(huge_copy_off_and_small_files_are_mapped) \
    X(huge_copy_is_read_only) \
    X(huge_copy_errors)
TEST_MAIN(TEST_LIST)
