/*
 * mmap_file.c: a whole file mapped read-only, or read into huge-page-backed
 * anonymous memory for a model's weights (see mmap_file.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mmap_file.h"

/* The x86-64 PMD size: what a transparent huge page maps. */
#define HUGE_BYTES ((size_t)2 << 20)

/* Whether anonymous memory advised MADV_HUGEPAGE gets huge pages: THP
 * "always" or "madvise" (not "never", and no sysfs file: no THP at all),
 * and KHUB_HUGE_PAGES=0 not set. */
static bool huge_pages_on_request(void)
{
    const char *env = getenv("KHUB_HUGE_PAGES");
    if (env && strcmp(env, "0") == 0) return false;
    int fd = open("/sys/kernel/mm/transparent_hugepage/enabled", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    char buf[128];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return false;
    buf[n] = '\0';
    return strstr(buf, "[always]") != NULL || strstr(buf, "[madvise]") != NULL;
}

/* Reads fd's out->size bytes into anonymous memory that starts at a 2 MiB
 * boundary, so that every whole 2 MiB of it can be one huge page; the tail
 * past the last boundary stays in 4 KiB pages (rounding the length up to
 * 2 MiB would add up to 2 MiB of resident zeros). The pages are taken as
 * pread writes them (with THP's "madvise" defrag the kernel compacts
 * memory for them then), and made read-only after. */
static khub_status read_huge(khub_runtime *rt, const char *path, int fd, khub_mmap *out)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t len = (out->size + page - 1) / page * page, span;
    KHUB_RETURN_IF(rt, !khub__add_ok(len, HUGE_BYTES, &span), KHUB_STATUS_OVERFLOW,
                   "%s: too large to read (%zu bytes)", path, out->size);
    uint8_t *raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KHUB_RETURN_IF(rt, raw == MAP_FAILED, KHUB_STATUS_NOMEM,
                   "%s: no memory for a %zu-byte copy of the weights: %s", path, out->size,
                   strerror(errno));
    uint8_t *p = (uint8_t *)(((uintptr_t)raw + HUGE_BYTES - 1) & ~(uintptr_t)(HUGE_BYTES - 1));
    if (p > raw) munmap(raw, (size_t)(p - raw));
    if (raw + span > p + len) munmap(p + len, (size_t)(raw + span - (p + len)));
    /* Only a hint: where it fails (a kernel without THP), 4 KiB pages. */
    (void)madvise(p, len, MADV_HUGEPAGE);
    size_t off = 0;
    while (off < out->size) {
        size_t want = out->size - off < ((size_t)1 << 30) ? out->size - off : (size_t)1 << 30;
        ssize_t n = pread(fd, p + off, want, (off_t)off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            khub_status st =
                n < 0 ? khub__fail(rt, KHUB_STATUS_IO, "%s: read at byte %zu: %s", path, off,
                                   strerror(errno))
                      : khub__fail(rt, KHUB_STATUS_IO,
                                   "%s: the file ended at byte %zu while read (was %zu bytes); "
                                   "is another process writing it?",
                                   path, off, out->size);
            munmap(p, len);
            return st;
        }
        off += (size_t)n;
    }
    if (mprotect(p, len, PROT_READ) != 0) { /* cannot fail on our own mapping; kept honest */
        khub_status st = khub__fail(rt, KHUB_STATUS_IO, "%s: cannot make the copy read-only: %s",
                                    path, strerror(errno));
        munmap(p, len);
        return st;
    }
    out->data = p;
    out->huge = true;
    return KHUB_STATUS_OK;
}

static khub_status open_common(khub_runtime *rt, const char *path, bool huge, khub_mmap *out)
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
    if (huge && out->size >= HUGE_BYTES && huge_pages_on_request()) {
        st = read_huge(rt, path, fd, out);
        if (st != KHUB_STATUS_OK) goto fail;
    } else if (out->size > 0) {
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
    close(fd); /* the mapping keeps the file alive; the copy needs it no more */
    return KHUB_STATUS_OK;

fail:
    if (out->data) munmap((void *)out->data, out->size);
    memset(out, 0, sizeof *out);
    close(fd);
    return st;
}

khub_status khub__mmap_open(khub_runtime *rt, const char *path, khub_mmap *out)
{
    return open_common(rt, path, false, out);
}

khub_status khub__mmap_open_huge(khub_runtime *rt, const char *path, khub_mmap *out)
{
    return open_common(rt, path, true, out);
}

bool khub__mmap_droppable(const khub_mmap *m, const void *p, size_t n)
{
    uintptr_t base = (uintptr_t)m->data, at = (uintptr_t)p;
    /* A huge copy is anonymous memory: dropped pages would read back as
     * zeros, and a cut huge page splits into 4 KiB ones. */
    return m->data && !m->huge && n > 0 && at >= base && at - base <= m->size &&
           n <= m->size - (at - base);
}

bool khub__mmap_drop(const khub_mmap *m, const void *p, size_t n)
{
    if (!khub__mmap_droppable(m, p, n)) return false;
    uintptr_t at = (uintptr_t)p, page = (uintptr_t)sysconf(_SC_PAGESIZE);
    /* The whole pages inside the range: a first or last page it shares
     * with a neighbour stays, as the neighbour's. */
    uintptr_t from = (at + page - 1) & ~(page - 1), to = (at + n) & ~(page - 1);
    if (to <= from) return false;
    /* MADV_RANDOM first: a flag of their own puts the pages in a mapping
     * (VMA) of their own, and the kernel's fault-around, which maps the
     * cached pages up to 64 KB around a faulting one, stays inside the
     * faulting VMA. Without it, reading a neighbour still in use (a norm
     * vector, o_proj) mapped the dropped pages back: 7 MB of SmolLM2's
     * 42 MB came back at its first token (session 18). */
    return madvise((void *)from, to - from, MADV_RANDOM) == 0 &&
           madvise((void *)from, to - from, MADV_DONTNEED) == 0;
}

void khub__mmap_close(khub_runtime *rt, khub_mmap *m)
{
    if (!m) return;
    /* munmap covers the pages of [data, data + size): the whole mapping or
     * copy (the copy's length is size rounded up to a page). */
    if (m->data) munmap((void *)m->data, m->size);
    if (m->path) khub__strfree(rt, m->path);
    memset(m, 0, sizeof *m);
}
