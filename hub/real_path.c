/*
 * real_path.c: canonical paths of cache folders (real_path.h).
 *
 * The kernel's name of a descriptor (readlink of /proc/self/fd/N) costs
 * three system calls where glibc's realpath() reads every component as a
 * possible link (a readlink each, each walking the components before it
 * again; docs/performance.md "Warm load, session 13"). A warm locked load
 * needs two canonical paths, the repo folder's and the variant folder's
 * beneath it; the second is the first plus the components between them
 * whenever none of those is a link, which one openat2 from the repo
 * folder's descriptor confirms: it refuses (ELOOP, EXDEV) any link, "..",
 * or escape on the way instead of following it. That saves the second
 * readlink of /proc (~2.5 us on Zen 2, the costliest call of the two) and
 * the second walk of the long cache path (docs/performance.md, "Warm load,
 * session 15").
 *
 * The usual cache has no link at all from / down to the variant folder,
 * and is named by an absolute path without ".", ".." or empty components.
 * Such a path is already canonical: one openat2 of the variant folder from
 * / with RESOLVE_NO_SYMLINKS confirms that no component is a link, and the
 * repo folder's path, a prefix of it, is then canonical too. No readlink
 * of /proc at all (docs/performance.md, "Warm load, session 16"). A link
 * anywhere, a relative or unplain path, or no openat2: the ways above.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#ifdef SYS_openat2
#include <linux/openat2.h>
#endif

#include "real_path.h"

/* The kernel's name of fd, a directory, into out: an absolute path, not
 * one removed meanwhile ("<path> (deleted)") or outside this root
 * ("(unreachable)/..."). */
static bool fd_name(int fd, char out[KHUB__PATH_MAX])
{
    char link[32];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, out, KHUB__PATH_MAX - 1);
    if (n <= 0 || n >= KHUB__PATH_MAX - 1 || out[0] != '/') return false;
    out[n] = '\0';
    return !strstr(out, " (deleted)");
}

/* realpath() where /proc is not there or its answer is not a plain
 * absolute path. */
bool khub__real_dir(const char *path, char out[KHUB__PATH_MAX])
{
    int fd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        bool ok = fd_name(fd, out);
        close(fd);
        if (ok) return true;
    }
    return realpath(path, out) != NULL;
}

/* Whether rel is relative and every component of it a plain name: no empty
 * component, no "." or "..". */
static bool plain_components(const char *rel)
{
    if (!rel[0]) return false;
    for (const char *p = rel;;) {
        size_t n = strcspn(p, "/");
        if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
            return false;
        if (!p[n]) return true;
        p += n + 1;
    }
}

/* Whether rel (plain_components) leads from the directory rootfd to a
 * directory through no link at all. */
static bool beneath_without_links(int rootfd, const char *rel)
{
#ifdef SYS_openat2
    struct open_how how = {.flags = O_PATH | O_DIRECTORY | O_CLOEXEC,
                           .resolve =
                               RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_BENEATH};
    int fd = (int)syscall(SYS_openat2, rootfd, rel, &how, sizeof how);
    if (fd < 0) return false; /* a link on the way, ENOSYS, ...: resolved in full */
    close(fd);
    return true;
#else
    (void)rootfd, (void)rel;
    return false;
#endif
}

/* Whether path, absolute with plain components (no "." or "..", no empty
 * component), names a directory reached through no link at all: then no
 * component can be resolved to anything but itself, so path is its own
 * canonical path (the readlink of /proc would give the same string). */
static bool canonical_as_written(const char *path)
{
#ifdef SYS_openat2
    if (path[0] != '/' || !plain_components(path + 1) || strlen(path) >= KHUB__PATH_MAX)
        return false;
    struct open_how how = {.flags = O_PATH | O_DIRECTORY | O_CLOEXEC,
                           .resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS};
    int fd = (int)syscall(SYS_openat2, AT_FDCWD, path, &how, sizeof how);
    if (fd < 0) return false; /* a link on the way, ENOSYS, ...: resolved below */
    close(fd);
    return true;
#else
    (void)path;
    return false;
#endif
}

bool khub__real_dirs(const char *root, const char *dir, char rroot[KHUB__PATH_MAX],
                     char rdir[KHUB__PATH_MAX])
{
    size_t n = strlen(root);
    const char *rel = !strncmp(dir, root, n) && dir[n] == '/' ? dir + n + 1 : NULL;
    /* The usual cache: no link from / down to the variant folder. One
     * openat2 of dir says so for root too (a prefix of dir's components). */
    if (rel && canonical_as_written(dir)) {
        memcpy(rroot, root, n + 1);
        memcpy(rdir, dir, strlen(dir) + 1);
        return true;
    }
    int fd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || !fd_name(fd, rroot)) {
        if (fd >= 0) close(fd);
        return khub__real_dir(root, rroot) && khub__real_dir(dir, rdir);
    }
    bool derived = rel && plain_components(rel) && beneath_without_links(fd, rel);
    close(fd);
    if (derived) {
        int w = snprintf(rdir, KHUB__PATH_MAX, "%s/%s", rroot, rel);
        if (w > 0 && w < KHUB__PATH_MAX) return true;
    }
    return khub__real_dir(dir, rdir);
}
