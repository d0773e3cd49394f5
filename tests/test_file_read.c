/* test_file_read.c: bounded whole-file reads: content, absence, a file over
 * the bound (refused, never cut short), a directory. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "internal.h"
#include "runner.h"

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

#define TEST_LIST(X) \
    X(reads_whole_file) \
    X(over_the_bound_is_refused) \
    X(absent_and_directory)
TEST_MAIN(TEST_LIST)
