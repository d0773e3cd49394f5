/*
 * file_read.c: opening the files a user names, and reading a whole small
 * file (manifests, policies, locks, metadata, signatures) with a size
 * bound, so no caller parses a file it silently cut short.
 *
 * A FIFO named as a model, plugin or policy used to block its open() for
 * good, waiting for a writer (issue 10). The open is O_NONBLOCK, which a
 * FIFO answers at once, and the type is checked on the descriptor that
 * was opened (fstat), not on the name (no window to swap the file). Only a
 * regular file's descriptor is handed back, on which O_NONBLOCK changes
 * nothing, so it is left set.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

static const char *type_name(mode_t m)
{
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a plain file";
}

int khub__open_regular_stat(const char *path, struct stat *sbp, char *errbuf, size_t errbuf_size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        int e = errno;
        khub__errbuf(errbuf, errbuf_size, "%s: cannot open: %s", path, strerror(e));
        errno = e;
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        khub__errbuf(errbuf, errbuf_size, "%s: cannot stat: %s", path, strerror(e));
        close(fd);
        errno = e;
        return -1;
    }
    if (!S_ISREG(sb.st_mode)) {
        khub__errbuf(errbuf, errbuf_size, "%s: is %s, not a regular file; give the path of a file",
                     path, type_name(sb.st_mode));
        close(fd);
        errno = S_ISDIR(sb.st_mode) ? EISDIR : EINVAL;
        return -1;
    }
    /* O_NONBLOCK stays set: it has no effect on a regular file (open(2):
     * "this flag has no effect for regular files and block devices"), and
     * clearing it cost two fcntl calls per file, 26 of the ~170 system
     * calls of a warm locked kernel load (docs/performance.md). */
    *sbp = sb;
    return fd;
}

int khub__open_regular(const char *path, char *errbuf, size_t errbuf_size)
{
    struct stat sb;
    return khub__open_regular_stat(path, &sb, errbuf, errbuf_size);
}

FILE *khub__fopen_regular(const char *path, char *errbuf, size_t errbuf_size)
{
    int fd = khub__open_regular(path, errbuf, errbuf_size);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        khub__errbuf(errbuf, errbuf_size, "%s: cannot open: %s", path, strerror(e));
        close(fd);
        errno = e;
    }
    return f;
}

/* Reads fd to its end into *buf (capacity *cap, from alloc), growing it
 * (alloc, copy, release) up to limit bytes; *got counts what was read.
 * size (0 = unknown): the file's size by fstat. A read that brings *got to
 * exactly size, short of the room it was given (*cap > size), met the end
 * of the file as it was then: no second read to see the end (one system
 * call per small file; docs/performance.md "Warm load, session 15"). A
 * file that grew before that read gives more than size and is read on to
 * its end; one that grows after it is read as it was, as a file that grows
 * after the final read of zero bytes always was. /proc files report size 0
 * and are read until a read returns 0. Returns 0 (stopped at the end,
 * where *got < *cap, or with *got == limit), -1 on a read error, -2 when
 * alloc failed. */
static int read_all(int fd, char **buf, size_t *cap, size_t limit, size_t size, size_t *got,
                    void *(*alloc)(const void *, size_t), void (*release)(void *), const void *ud)
{
    for (;;) {
        if (*got == *cap) {
            if (*cap >= limit) return 0;
            size_t grow = *cap > limit / 2 ? limit : *cap * 2;
            char *bigger = alloc(ud, grow);
            if (!bigger) return -2;
            memcpy(bigger, *buf, *got);
            release(*buf);
            *buf = bigger;
            *cap = grow;
        }
        ssize_t r = read(fd, *buf + *got, *cap - *got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) return 0;
        *got += (size_t)r;
        if (size && *got == size && *cap > size) return 0;
    }
}

/* The read itself, into a buffer from alloc(ud, n), released with
 * release(p) on failure: the C library's for khub__read_file, a tagged
 * block for khub__read_file_mem. The buffer is sized by fstat (the file's
 * size + 1, at most max + 1; a file that grows while it is read, or a
 * /proc file that reports size 0, makes it grow), read with read(2): no
 * stdio stream (its fcntl and second fstat) and no max-sized buffer per
 * file (a warm locked load reads five small files; docs/performance.md). */
static khub_status read_into(const char *path, size_t max, void *(*alloc)(const void *, size_t),
                             void (*release)(void *), const void *ud, char **out, size_t *n,
                             char *errbuf, size_t errbuf_size)
{
    *out = NULL;
    *n = 0;
    struct stat sb;
    int fd = khub__open_regular_stat(path, &sb, errbuf, errbuf_size);
    if (fd < 0) return errno == ENOENT ? KHUB_STATUS_NOT_FOUND : KHUB_STATUS_IO;
    size_t limit = max < SIZE_MAX ? max + 1 : 0; /* one byte past max tells "larger" */
    size_t size = sb.st_size > 0 ? (size_t)sb.st_size : 0;
    size_t cap = size < 4096 ? 4096 : size + 1;
    if (cap > limit) cap = limit;
    char *buf = limit ? alloc(ud, cap) : NULL;
    size_t got = 0;
    int err = buf ? read_all(fd, &buf, &cap, limit, size, &got, alloc, release, ud) : 0;
    close(fd);
    if (!buf || err == -2) {
        if (buf) release(buf);
        khub__errbuf(errbuf, errbuf_size, "%s: out of memory for %zu bytes", path, max);
        return KHUB_STATUS_NOMEM;
    }
    if (err || got > max) {
        release(buf);
        if (err) {
            khub__errbuf(errbuf, errbuf_size, "%s: read error", path);
            return KHUB_STATUS_IO;
        }
        khub__errbuf(errbuf, errbuf_size, "%s: larger than %zu bytes", path, max);
        return KHUB_STATUS_OVERFLOW;
    }
    buf[got] = '\0'; /* got < cap: read_all stops at the end with room left */
    *out = buf;
    *n = got;
    return KHUB_STATUS_OK;
}

static void *libc_alloc(const void *ud, size_t n)
{
    (void)ud;
    return malloc(n);
}

static void *block_alloc(const void *ud, size_t n) { return khub__mem_alloc(ud, n); }

khub_status khub__read_file(const char *path, size_t max, char **out, size_t *n, char *errbuf,
                            size_t errbuf_size)
{
    return read_into(path, max, libc_alloc, free, NULL, out, n, errbuf, errbuf_size);
}

khub_status khub__read_file_mem(const khub_allocator *a, const char *path, size_t max, char **out,
                                size_t *n, char *errbuf, size_t errbuf_size)
{
    return read_into(path, max, block_alloc, khub__mem_free, a, out, n, errbuf, errbuf_size);
}
