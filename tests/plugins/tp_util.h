/*
 * tp_util.h: helpers shared by the loader tests (header-only): paths of the
 * test plugins, digests, scratch files, and /proc/self/maps checks.
 */
#ifndef KHUB_TESTS_TP_UTIL_H
#define KHUB_TESTS_TP_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "runner.h"

/* KHUB_TEST_PLUGIN_DIR "/" name ".so", in a static buffer per call site. */
static inline const char *tp_path(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s.so", KHUB_TEST_PLUGIN_DIR, name);
    return buf;
}
#define TP(name) tp_path((char[512]){0}, 512, name)

/* SHA-256 hex of a file, in a static buffer per call site. */
static inline const char *tp_sha(char *hex, const char *path)
{
    ASSERT_OK(khub__sha256_file_hex(path, hex));
    return hex;
}
#define TP_SHA(path) tp_sha((char[65]){0}, path)

static inline unsigned char *tp_read(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    ASSERT(f != NULL);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    ASSERT(b != NULL);
    ASSERT_EQ(fread(b, 1, (size_t)n, f), n);
    fclose(f);
    *size = (size_t)n;
    return b;
}

/* Writes bytes to a fresh file under /tmp; returns its path (static per
 * call site through the buffer). */
static inline const char *tp_write(char *path, size_t n, const char *tag, const void *data,
                                   size_t size)
{
    snprintf(path, n, "/tmp/khub-test-%d-%s", (int)getpid(), tag);
    FILE *f = fopen(path, "wb");
    ASSERT(f != NULL);
    ASSERT_EQ(fwrite(data, 1, size, f), size);
    fclose(f);
    return path;
}
#define TP_WRITE(tag, data, size) tp_write((char[256]){0}, 256, tag, data, size)

/* True when /proc/self/maps has a line containing needle. */
static inline int tp_mapped(const char *needle)
{
    FILE *f = fopen("/proc/self/maps", "r");
    ASSERT(f != NULL);
    char line[1024];
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) found = strstr(line, needle) != NULL;
    fclose(f);
    return found;
}

static inline khub_runtime *tp_runtime(int n_threads)
{
    khub_runtime_opts o = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = n_threads};
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(&o, &rt));
    return rt;
}

/* Loads a test plugin with its real digest. */
static inline khub_plugin *tp_load(khub_runtime *rt, const char *name)
{
    const char *path = TP(name);
    khub_plugin *p = NULL;
    khub_status st = khub_plugin_load(rt, path, TP_SHA(path), &p);
    if (st != KHUB_STATUS_OK) TEST_FAIL_("loading %s: %s", name, khub_runtime_errmsg(rt));
    return p;
}

#endif /* KHUB_TESTS_TP_UTIL_H */
