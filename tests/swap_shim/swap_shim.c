/* swap_shim.c: an LD_PRELOAD shim that plays the writer to the cache who
 * swaps files between two reads (issue 10 item 1). On the first open of a
 * path ending in "/metadata.json.sig" it renames every entry of the folder
 * $KHUB_SWAP_FROM into the folder of that path (replacing what is there),
 * then lets the open go on. khub reads metadata.json just before its .sig,
 * so the swap lands after the bytes that the signature covers were read and
 * before anything else of the variant is: a loader that trusts a second read
 * of metadata.json loads the swapped-in files under the old signature.
 * t_verify_load uses it. Never instrumented (preloaded into sanitizer builds
 * too, with ASAN_OPTIONS=verify_asan_link_order=0). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#define EXPORT __attribute__((visibility("default")))

static int swapped;

static void maybe_swap(const char *path)
{
    static const char tail[] = "/metadata.json.sig";
    const char *from = getenv("KHUB_SWAP_FROM");
    size_t n = path ? strlen(path) : 0, t = sizeof tail - 1;
    if (swapped || !from || n <= t || strcmp(path + n - t, tail) != 0) return;
    swapped = 1;
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s", (int)(n - t), path);
    DIR *d = opendir(from);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char src[4096], dst[8300];
        snprintf(src, sizeof src, "%s/%s", from, de->d_name);
        snprintf(dst, sizeof dst, "%s/%s", dir, de->d_name);
        rename(src, dst);
    }
    if (d) closedir(d);
}

typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);

static mode_t mode_arg(int flags, va_list ap)
{
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

EXPORT int open(const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t m = mode_arg(flags, ap);
    va_end(ap);
    maybe_swap(path);
    static open_fn real;
    if (!real) real = (open_fn)dlsym(RTLD_NEXT, "open");
    return real(path, flags, m);
}

EXPORT int open64(const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t m = mode_arg(flags, ap);
    va_end(ap);
    maybe_swap(path);
    static open_fn real;
    if (!real) real = (open_fn)dlsym(RTLD_NEXT, "open64");
    return real(path, flags, m);
}

EXPORT int openat(int dirfd, const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t m = mode_arg(flags, ap);
    va_end(ap);
    maybe_swap(path);
    static openat_fn real;
    if (!real) real = (openat_fn)dlsym(RTLD_NEXT, "openat");
    return real(dirfd, path, flags, m);
}

EXPORT FILE *fopen(const char *path, const char *mode)
{
    static FILE *(*real)(const char *, const char *);
    if (!real) real = (FILE * (*)(const char *, const char *)) dlsym(RTLD_NEXT, "fopen");
    maybe_swap(path);
    return real(path, mode);
}

EXPORT FILE *fopen64(const char *path, const char *mode)
{
    static FILE *(*real)(const char *, const char *);
    if (!real) real = (FILE * (*)(const char *, const char *)) dlsym(RTLD_NEXT, "fopen64");
    maybe_swap(path);
    return real(path, mode);
}
