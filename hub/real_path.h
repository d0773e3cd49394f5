/*
 * real_path.h: canonical paths of cache folders, for the hub's "inside the
 * cache" check (variant.c check_files): a file's real path must lie
 * strictly inside the repo folder's.
 *
 * A variant folder beneath the repo folder gets its real path without a
 * second readlink when the kernel confirms that no component below the
 * repo folder is a link (openat2 RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH):
 * then it is the repo folder's real path followed by those components.
 * Before that, when dir is an absolute path with plain components and the
 * kernel finds no link anywhere on it (openat2 RESOLVE_NO_SYMLINKS from /),
 * both paths are canonical as written and nothing is read from /proc.
 * Anything else (a link on the way, a kernel without openat2) is resolved
 * as before, in full. Nothing is remembered: both are worked out on every
 * call (docs/performance.md, "Warm load, sessions 15 and 16").
 */
#ifndef KHUB_HUB_REAL_PATH_H
#define KHUB_HUB_REAL_PATH_H

#include <stdbool.h>

#include "hub_impl.h"

/* The canonical path of the directory path into out, as realpath() gives
 * it; false when it cannot be resolved. */
KHUB_INTERNAL bool khub__real_dir(const char *path, char out[KHUB__PATH_MAX]);
/* The canonical paths of root into rroot and of dir into rdir, where dir
 * names a folder beneath root ("root/a/b", as the cache builds it; any
 * other dir is resolved on its own). false when either cannot be resolved. */
KHUB_INTERNAL bool khub__real_dirs(const char *root, const char *dir, char rroot[KHUB__PATH_MAX],
                                   char rdir[KHUB__PATH_MAX]);

#endif
