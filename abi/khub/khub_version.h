/*
 * khub_version.h: version macros for libkhub and for the plugin ABI.
 *
 * Three numbers live here and they move independently:
 *   - the library version (KHUB_VERSION_*), bumped with every release;
 *   - the application API version (KHUB_API_VERSION_*), the library's
 *     major.minor: the version of the structs an application fills;
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

/* The application API (khub.h, khub_hub.h, khub_kernels.h, khub_model.h,
 * khub_project.h): versioned with the library, not with the plugin ABI.
 * KHUB_APP_INIT (khub.h) stamps an application struct with these numbers,
 * but the library tells the versions of those structs apart by struct_size
 * alone and never compares the stamp (abi/ABI.md, "The application API").
 * Since 0.1. */
#define KHUB_API_VERSION_MAJOR KHUB_VERSION_MAJOR
#define KHUB_API_VERSION_MINOR KHUB_VERSION_MINOR

/* The plugin ABI. A plugin built against ABI a.b loads into a host of ABI
 * A.B when a == A and b <= B (see abi/ABI.md). */
#define KHUB_ABI_MAJOR 1
#define KHUB_ABI_MINOR 5
/* The oldest plugin minor this host still accepts (always 0 within a major). */
#define KHUB_ABI_MINOR_MIN 0

/* The minor a plugin targets, as PyTorch's TORCH_TARGET_VERSION: a plugin
 * that must load into hosts of ABI 1.N defines KHUB_PLUGIN_TARGET_MINOR as N
 * before including any khub header (khub_add_plugin(... TARGET_MINOR N)
 * passes -DKHUB_PLUGIN_TARGET_MINOR=N). Its ELF note and every struct it
 * stamps (KHUB_STRUCT_INIT, khub_plugin_desc_put) then say 1.N, so every
 * host of 1.N or newer accepts it, and the headers declare only what 1.N
 * has (struct fields, op kinds, quant formats, flags), so it cannot use what
 * such a host lacks. Unset, it is this header's KHUB_ABI_MINOR. libkhub and
 * applications never set it. */
#ifndef KHUB_PLUGIN_TARGET_MINOR
#define KHUB_PLUGIN_TARGET_MINOR KHUB_ABI_MINOR
#endif
#if KHUB_PLUGIN_TARGET_MINOR < KHUB_ABI_MINOR_MIN || KHUB_PLUGIN_TARGET_MINOR > KHUB_ABI_MINOR
#error "KHUB_PLUGIN_TARGET_MINOR must lie within KHUB_ABI_MINOR_MIN..KHUB_ABI_MINOR of this header"
#endif

#endif /* KHUB_VERSION_H */
