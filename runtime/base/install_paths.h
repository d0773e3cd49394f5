/*
 * install_paths.h: where libkhub's installed files are, found from the file
 * its code was loaded from, so an installed tree can be moved (relocatable).
 */
#ifndef KHUB_RUNTIME_INSTALL_PATHS_H
#define KHUB_RUNTIME_INSTALL_PATHS_H

#include <stdbool.h>
#include <stddef.h>

#include "internal.h"

/* Writes into buf[size] the path `rel` inside the install prefix this code
 * runs from ("lib/khub/plugins" -> "/opt/khub/lib/khub/plugins") and returns
 * true when that path exists. The prefix is found from the file holding the
 * code: libkhub.so sits in the prefix's libdir, a program linking the static
 * library in its bindir (as configured: CMAKE_INSTALL_LIBDIR/BINDIR). False
 * when that file cannot be found, the path does not fit, or it is absent
 * (from the build tree, for instance). Thread-safe. */
KHUB_PRIVATE_API bool khub__install_path(const char *rel, char *buf, size_t size);

#endif /* KHUB_RUNTIME_INSTALL_PATHS_H */
