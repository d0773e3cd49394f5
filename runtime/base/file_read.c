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

int khub__open_regular(const char *path, char *errbuf, size_t errbuf_size)
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
    return fd;
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

/* The read itself, into a buffer from alloc(ud, n), released with
 * release(p) on failure: the C library's for khub__read_file, a tagged
 * block for khub__read_file_mem. */
static khub_status read_into(const char *path, size_t max, void *(*alloc)(const void *, size_t),
                             void (*release)(void *), const void *ud, char **out, size_t *n,
                             char *errbuf, size_t errbuf_size)
{
    *out = NULL;
    *n = 0;
    FILE *f = khub__fopen_regular(path, errbuf, errbuf_size);
    if (!f) return errno == ENOENT ? KHUB_STATUS_NOT_FOUND : KHUB_STATUS_IO;
    char *buf = max < SIZE_MAX ? alloc(ud, max + 1) : NULL;
    size_t got = buf ? fread(buf, 1, max + 1, f) : 0;
    int err = ferror(f);
    fclose(f);
    if (!buf) {
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
    buf[got] = '\0';
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
