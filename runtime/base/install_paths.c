/*
 * install_paths.c: the install prefix found at run time, so that
 * `cmake --install build --prefix P` gives a tree that works wherever P is
 * (and wherever it is moved later): the library looks for its plugins and
 * headers next to itself before it falls back to the paths compiled in.
 *
 * The shared library asks dladdr() for the file that holds this function;
 * a program linking libkhub statically holds it in its own executable, whose
 * name dladdr reports as argv[0] (relative, or a bare name found on PATH),
 * so it reads /proc/self/exe instead. The prefix is that file's folder plus
 * the configured way up: KHUB_LIBDIR_TO_PREFIX ("..", "../.." for
 * lib/x86_64-linux-gnu) or KHUB_BINDIR_TO_PREFIX.
 *
 * Rejected: a prefix compiled in alone (the tree could not move, and a test
 * could not install the build it runs into a temporary folder); $ORIGIN
 * strings (only the dynamic linker expands them).
 */
#include "install_paths.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef KHUB_LIBDIR_TO_PREFIX
#define KHUB_LIBDIR_TO_PREFIX ".."
#endif
#ifndef KHUB_BINDIR_TO_PREFIX
#define KHUB_BINDIR_TO_PREFIX ".."
#endif

/* The real path of the file holding this code, into buf[PATH_MAX]. */
static bool code_file(char *buf)
{
#ifdef KHUB_BUILDING
    Dl_info info;
    if (!dladdr((void *)&khub__install_path, &info) || !info.dli_fname || !info.dli_fname[0])
        return false;
    return realpath(info.dli_fname, buf) != NULL;
#else
    return realpath("/proc/self/exe", buf) != NULL;
#endif
}

bool khub__install_path(const char *rel, char *buf, size_t size)
{
    char file[PATH_MAX], joined[PATH_MAX + 64];
    if (!rel || !code_file(file)) return false;
    char *slash = strrchr(file, '/');
    if (!slash) return false;
    *slash = '\0';
#ifdef KHUB_BUILDING
    const char *up = KHUB_LIBDIR_TO_PREFIX;
#else
    const char *up = KHUB_BINDIR_TO_PREFIX;
#endif
    int n = snprintf(joined, sizeof joined, "%s/%s/%s", file, up, rel);
    if (n < 0 || (size_t)n >= sizeof joined) return false;
    char *real = realpath(joined, NULL); /* absent: false */
    if (!real) return false;
    bool fits = strlen(real) < size;
    if (fits) memcpy(buf, real, strlen(real) + 1);
    free(real);
    return fits;
}
