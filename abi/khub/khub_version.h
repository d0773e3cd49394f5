/*
 * khub_version.h: version macros for libkhub and for the plugin ABI.
 *
 * Two numbers live here and they move independently:
 *   - the library version (KHUB_VERSION_*), bumped with every release;
 *   - the plugin ABI version (KHUB_ABI_*), bumped only when a struct that
 *     crosses the plugin boundary grows (minor) or breaks (major).
 *
 * Usage:
 *     #include <khub/khub_version.h>
 *     #if KHUB_VERSION_AT_LEAST(0, 1, 0)
 *     ...
 *     #endif
 *     assert(khub_version_num() == KHUB_VERSION_NUM);  // header matches library
 *
 * Anything not declared in abi/khub/ is not part of khub's API.
 */
#ifndef KHUB_VERSION_H
#define KHUB_VERSION_H

#define KHUB_VERSION_MAJOR  0
#define KHUB_VERSION_MINOR  1
#define KHUB_VERSION_PATCH  0
#define KHUB_VERSION_STRING "0.1.0"

/* 0xXXYYZZ: major, minor, patch, one byte each. */
#define KHUB_VERSION_NUM \
    ((KHUB_VERSION_MAJOR << 16) | (KHUB_VERSION_MINOR << 8) | KHUB_VERSION_PATCH)

#define KHUB_VERSION_AT_LEAST(x, y, z) (KHUB_VERSION_NUM >= (((x) << 16) | ((y) << 8) | (z)))

/* The plugin ABI. A plugin built against ABI a.b loads into a host of ABI
 * A.B when a == A and b <= B (see abi/ABI.md). */
#define KHUB_ABI_MAJOR 1
#define KHUB_ABI_MINOR 2
/* The oldest plugin minor this host still accepts (always 0 within a major). */
#define KHUB_ABI_MINOR_MIN 0

#endif /* KHUB_VERSION_H */
