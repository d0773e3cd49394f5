/*
 * mmap_file.c: a whole file mapped read-only (see mmap_file.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mmap_file.h"

khub_status khub__mmap_open(khub_runtime *rt, const char *path, khub_mmap *out)
{
    KHUB_API_CHECK(rt, out != NULL);
    memset(out, 0, sizeof *out);
    KHUB_API_CHECK(rt, path != NULL);

    char why[KHUB_ERROR_SIZE];
    int fd = khub__open_regular(path, why, sizeof why); /* never hangs on a FIFO */
    KHUB_RETURN_IF(rt, fd < 0, errno == ENOENT ? KHUB_STATUS_NOT_FOUND : KHUB_STATUS_IO, "%s", why);

    khub_status st = KHUB_STATUS_OK;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = khub__fail(rt, KHUB_STATUS_IO, "%s: cannot stat: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = khub__fail(rt, KHUB_STATUS_IO, "%s: not a regular file", path);
        goto fail;
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        st = khub__fail(rt, KHUB_STATUS_OVERFLOW, "%s: too large to map", path);
        goto fail;
    }
    out->size = (size_t)sb.st_size;
    if (out->size > 0) {
        void *p = mmap(NULL, out->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            st = khub__fail(rt, KHUB_STATUS_IO, "%s: cannot mmap %zu bytes: %s", path, out->size,
                            strerror(errno));
            goto fail;
        }
        out->data = p;
    }
    out->path = khub__strdup(rt, path);
    if (!out->path) {
        st = khub__fail(rt, KHUB_STATUS_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    close(fd); /* the mapping keeps the file alive */
    return KHUB_STATUS_OK;

fail:
    if (out->data) munmap((void *)out->data, out->size);
    memset(out, 0, sizeof *out);
    close(fd);
    return st;
}

void khub__mmap_close(khub_runtime *rt, khub_mmap *m)
{
    if (!m) return;
    if (m->data) munmap((void *)m->data, m->size);
    if (m->path) khub__strfree(rt, m->path);
    memset(m, 0, sizeof *m);
}
