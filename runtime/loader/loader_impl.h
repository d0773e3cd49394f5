/*
 * loader_impl.h: what the loader's files share (loader.c, negotiate.c,
 * plugin_list.c, builtins.c). Internal to runtime/loader.
 */
#ifndef KHUB_RUNTIME_LOADER_IMPL_H
#define KHUB_RUNTIME_LOADER_IMPL_H

#include "plugin_artifacts.h"
#include "runtime_impl.h"

#define MAX_PLUGIN_BYTES   ((size_t)1 << 30)
#define MAX_MANIFEST_BYTES ((size_t)1 << 20)
#define MAX_OPS            1024
#define MAX_HEAD_DIMS      64
#define MAX_OP_NAME        64
/* The largest op or caps struct_size accepted. ABI 1.x structs are under
 * 100 bytes and a newer minor only appends fields, so a descriptor claiming
 * kilobytes is broken or hostile: the op array is walked with the claimed
 * size as its stride, and a 1 GiB stride read far outside the plugin. */
#define MAX_STRUCT_SIZE 4096

/* The ABI 1.0 sizes: the smallest structs a plugin may hand over. */
#define DESC_MIN_1_0 (offsetof(khub_plugin_desc, shutdown) + sizeof(void (*)(void *)))
#define OP_MIN_1_0   (offsetof(khub_op_desc, methods) + sizeof(void *))
#define CAPS_MIN_1_0 (offsetof(khub_op_caps, reserved2) + sizeof(uint32_t))

/* ---- loader.c ---------------------------------------------------------- */

/* Reads a regular file of at most cap bytes into memory from rt's
 * allocator (*size bytes, +1 for a NUL the caller may use). */
KHUB_INTERNAL khub_status khub__plugin_read_file(khub_runtime *rt, const char *path, size_t cap,
                                                 unsigned char **out, size_t *size, char *msg,
                                                 size_t n);
/* The path and digest a load is given, checked; the message on rt. */
KHUB_INTERNAL khub_status khub__plugin_check_args(khub_runtime *rt, const char *path,
                                                  const char *sha256_hex);
/* With KHUB_OPT_ISOLATED_INIT: the plugin loaded, initialised and
 * self-tested in a forked child first; OK without the option. */
KHUB_INTERNAL khub_status khub__plugin_isolated_init(khub_runtime *rt, const char *path,
                                                     const char *sha256_hex);
/* Everything up to a ready, unregistered plugin. arts (may be NULL) is the
 * verified artifact directory; the plugin owns it from here on, also on
 * failure. */
KHUB_INTERNAL khub_status khub__plugin_prepare(khub_runtime *rt, const char *path,
                                               const char *sha256_hex, khub__artifacts *arts,
                                               khub_plugin **out, char *msg, size_t n);

/* ---- negotiate.c ------------------------------------------------------- */

/* Calls the entry, validates and copies what it returned (note: the ABI
 * note read from the file, NULL for a static plugin). On failure after a
 * successful init the plugin's shutdown runs. */
KHUB_INTERNAL khub_status khub__plugin_negotiate(khub_plugin *p, khub_plugin_init_fn init,
                                                 const khub_plugin_info *note, char *msg, size_t n);

/* ---- plugin_list.c ----------------------------------------------------- */

/* A zeroed plugin of rt (NULL when out of memory). */
KHUB_INTERNAL khub_plugin *khub__plugin_new(khub_runtime *rt);
/* dlclose, keeping the memfd open when the library stays mapped. */
KHUB_INTERNAL void khub__plugin_dlclose(khub_plugin *p);
/* Whether a loaded object is named fdpath ("/proc/self/fd/N"): glibc's
 * dlopen hands that object back for the name, whatever N is now. */
KHUB_INTERNAL bool khub__fd_path_loaded(const char *fdpath);
/* The plugin's memory (NULL ok); no shutdown, no dlclose. */
KHUB_INTERNAL void khub__plugin_free(khub_plugin *p);
/* Quiesce, shutdown, CUDA modules, dlclose, memory; no call in flight. */
KHUB_INTERNAL void khub__plugin_retire(khub_plugin *p);
/* Waits until no call of p is in flight. */
KHUB_INTERNAL void khub__plugin_wait_idle(khub_plugin *p);
/* Adds p to rt's list (retiring it when that fails); *out (may be NULL)
 * gets it. */
KHUB_INTERNAL khub_status khub__plugin_register(khub_runtime *rt, khub_plugin *p,
                                                khub_plugin **out);

#endif /* KHUB_RUNTIME_LOADER_IMPL_H */
