/*
 * internal.h: what every libkhub source file shares and nothing outside
 * libkhub may use: error propagation macros, checked size arithmetic, the
 * runtime's allocator and logger, and the thread pool.
 *
 * Conventions (shared/STYLE.md):
 *   - internal functions are named khub__*, file-local ones are static;
 *   - a failure sets one message with khub__fail (first error wins until the
 *     next public call clears it) and returns its status;
 *   - sizes from untrusted data go through khub__mul_ok / khub__add_ok.
 */
#ifndef KHUB_RUNTIME_INTERNAL_H
#define KHUB_RUNTIME_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "khub/khub.h"

#define KHUB_INTERNAL __attribute__((visibility("hidden")))
/* An internal function (or table) that khub's sibling libraries, built from
 * this tree and installed with it, call (libkhub_server and libkhub_author:
 * errors, log, file reading, digests, safe paths, the compiler driver's
 * gate, signing and publishing): exported from libkhub.so under "Private"
 * in abi/SYMBOLS.md, but not API: no header in abi/, no promise between
 * versions, never for applications. This is the siblings' only way in;
 * nothing is compiled into two libraries. Everything else internal stays
 * KHUB_INTERNAL (hidden). */
#define KHUB_PRIVATE_API __attribute__((visibility("default")))

/* The Hub ID form that every message about a kernel name quotes
 * (hub/hub_id.c's grammar), in every layer and sibling library. */
#define KHUB__HUB_ID_FORM "org/name[@REV|@version=N][:symbol]"

/* The host sees the whole ABI; only plugins may target an older minor. */
#if KHUB_PLUGIN_TARGET_MINOR != KHUB_ABI_MINOR
#error "libkhub is built against the whole plugin ABI: do not define KHUB_PLUGIN_TARGET_MINOR"
#endif

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */
/* ------------------------------------------------------------------------ */

/* Records a one-line message for st on rt (or, when rt is NULL, in the
 * thread-local last error) and returns st. The first message since the last
 * khub__clear wins. */
KHUB_PRIVATE_API khub_status khub__fail(khub_runtime *rt, khub_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
KHUB_INTERNAL khub_status khub__vfail(khub_runtime *rt, khub_status st, const char *fmt,
                                      va_list ap);
/* Clears the message (called on entry of every public function of rt). */
KHUB_INTERNAL void khub__clear(khub_runtime *rt);
/* Copies the current message of rt (or the thread-local one) into buf. */
KHUB_INTERNAL void khub__copy_error(const khub_runtime *rt, char *buf, size_t n);
/* Writes a formatted one-line message into a caller's buffer (NULL/0 ok);
 * newlines become spaces (runtime/errbuf.c). */
KHUB_PRIVATE_API void khub__errbuf(char *buf, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
KHUB_PRIVATE_API void khub__verrbuf(char *buf, size_t n, const char *fmt, va_list ap);

/* Fails with st and a message when cond holds; logs file:line at DEBUG. */
#define KHUB_RETURN_IF(rt, cond, st, ...) \
    do { \
        if (cond) { \
            khub__log((rt), KHUB_LOG_DEBUG, "%s:%d: %s: (%s)", __FILE__, __LINE__, __func__, \
                      #cond); \
            return khub__fail((rt), (st), __VA_ARGS__); \
        } \
    } while (0)

/* Returns st when it is an error (its message is already set). */
#define KHUB_FORWARD_IF_ERROR(rt, expr) \
    do { \
        khub_status st_fwd_ = (expr); \
        if (st_fwd_ != KHUB_STATUS_OK) { \
            khub__log((rt), KHUB_LOG_DEBUG, "%s:%d: %s: forwarding %s", __FILE__, __LINE__, \
                      __func__, khub_status_name(st_fwd_)); \
            return st_fwd_; \
        } \
    } while (0)

/* Embedder misuse: an assert in debug builds, KHUB_STATUS_MISUSE in release. */
#ifdef NDEBUG
#define KHUB_API_CHECK(rt, cond) \
    do { \
        if (!(cond)) \
            return khub__fail((rt), KHUB_STATUS_MISUSE, "%s: misuse: %s", __func__, #cond); \
    } while (0)
#else
#include <assert.h>
#define KHUB_API_CHECK(rt, cond) \
    do { \
        assert(cond); \
        if (!(cond)) \
            return khub__fail((rt), KHUB_STATUS_MISUSE, "%s: misuse: %s", __func__, #cond); \
    } while (0)
#endif

/* Internal invariants (our bugs). */
#define KHUB_ASSERT(cond) \
    do { \
        if (!(cond)) khub__assert_fail(#cond, __FILE__, __LINE__); \
    } while (0)
KHUB_INTERNAL void khub__assert_fail(const char *cond, const char *file, int line)
    __attribute__((noreturn));

/* Defensive branches that should never be taken (sqlite's ALWAYS/NEVER). */
#define ALWAYS(x) (x)
#define NEVER(x)  (x)

/* ------------------------------------------------------------------------ */
/* Checked arithmetic for sizes from untrusted data                         */
/* ------------------------------------------------------------------------ */

static inline bool khub__mul_ok(size_t a, size_t b, size_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool khub__add_ok(size_t a, size_t b, size_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}
static inline bool khub__mul_i64_ok(int64_t a, int64_t b, int64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}

/* ------------------------------------------------------------------------ */
/* Memory (the runtime's allocator; rt may be NULL for the C library's)     */
/* ------------------------------------------------------------------------ */

KHUB_INTERNAL void *khub__malloc(khub_runtime *rt, size_t n);
KHUB_INTERNAL void *khub__calloc(khub_runtime *rt, size_t count, size_t size);
KHUB_INTERNAL void *khub__realloc(khub_runtime *rt, void *p, size_t old_n, size_t new_n);
/* n is the size given at allocation (the allocator contract needs it). */
KHUB_INTERNAL void khub__free(khub_runtime *rt, void *p, size_t n);
KHUB_INTERNAL char *khub__strdup(khub_runtime *rt, const char *s);
KHUB_INTERNAL void khub__strfree(khub_runtime *rt, char *s);
/* A growing text in the runtime's memory (explain tables, selection
 * traces): khub__text t = {.rt = rt}; khub__text_add appends printf-style;
 * on out of memory it sets oom and drops this and every later addition;
 * khub__text_free releases s. */
typedef struct khub__text {
    khub_runtime *rt;
    char *s;
    size_t len, cap;
    bool oom;
} khub__text;
KHUB_INTERNAL void khub__text_add(khub__text *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
KHUB_INTERNAL void khub__text_free(khub__text *t);
/* Joins the NULL-ended strings parts into buf (size >= 1 bytes, its NUL
 * included), as snprintf("%s%s...") would but without parsing a format:
 * the paths of a warm load are built this way (docs/performance.md, "Warm
 * load, session 16"). false when they do not fit; buf then holds the
 * first size - 1 bytes. KHUB__CONCAT(array, "a", b, ...) takes the size of
 * array, which must be an array, not a pointer. */
KHUB_INTERNAL bool khub__concat(char *buf, size_t size, const char *const *parts);
#define KHUB__CONCAT(buf, ...) \
    khub__concat((buf), \
                 sizeof(buf) + \
                     0 * sizeof(char[1 - 2 * __builtin_types_compatible_p( \
                                                 __typeof__(buf), __typeof__(&(buf)[0]))]), \
                 (const char *const[]){__VA_ARGS__, NULL})
/* 64-byte aligned blocks (for tensors and plugin allocations); the size is
 * remembered in a header. */
KHUB_INTERNAL void *khub__aligned_alloc(khub_runtime *rt, size_t n);
KHUB_INTERNAL void khub__aligned_free(khub_runtime *rt, void *p);

/* Blocks that remember their allocator (runtime/base/mem_block.c): the
 * hub's memory. Each block carries its size and a copy of the allocator it
 * came from (a NULL allocator, or a NULL realloc, is the C library's), so
 * khub__mem_free and khub__mem_realloc need nothing but the block. Never
 * mix with free() or khub__free. */
KHUB_INTERNAL void *khub__mem_alloc(const khub_allocator *a, size_t n);
KHUB_INTERNAL void *khub__mem_calloc(const khub_allocator *a, size_t count, size_t size);
/* p == NULL allocates from a; otherwise p's own allocator is used and a is
 * ignored. NULL on failure, p untouched. */
KHUB_INTERNAL void *khub__mem_realloc(const khub_allocator *a, void *p, size_t n);
KHUB_INTERNAL void khub__mem_free(void *p);
/* Zeroes the block (a token, a key) before freeing it. */
KHUB_INTERNAL void khub__mem_wipe_free(void *p);
/* The size asked for at allocation (0 for NULL). */
KHUB_INTERNAL size_t khub__mem_size(const void *p);
KHUB_INTERNAL char *khub__mem_strdup(const khub_allocator *a, const char *s);
/* At most n bytes of s, NUL-terminated. */
KHUB_INTERNAL char *khub__mem_strndup(const khub_allocator *a, const char *s, size_t n);
/* The runtime's allocator (runtime/loader/runtime.c), NULL for NULL. */
KHUB_INTERNAL const khub_allocator *khub__runtime_allocator(const khub_runtime *rt);

/* ------------------------------------------------------------------------ */
/* Logging                                                                  */
/* ------------------------------------------------------------------------ */

KHUB_PRIVATE_API void khub__log(const khub_runtime *rt, khub_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
KHUB_INTERNAL void khub__vlog(const khub_runtime *rt, khub_log_level level, const char *fmt,
                              va_list ap);

#define KHUB_LOG_E(rt, fmt, ...) \
    khub__log((rt), KHUB_LOG_ERROR, "%s: " fmt, __func__, ##__VA_ARGS__)
#define KHUB_LOG_W(rt, fmt, ...) khub__log((rt), KHUB_LOG_WARN, "%s: " fmt, __func__, ##__VA_ARGS__)
#define KHUB_LOG_I(rt, fmt, ...) khub__log((rt), KHUB_LOG_INFO, "%s: " fmt, __func__, ##__VA_ARGS__)
#define KHUB_LOG_D(rt, fmt, ...) \
    khub__log((rt), KHUB_LOG_DEBUG, "%s: " fmt, __func__, ##__VA_ARGS__)

/* ------------------------------------------------------------------------ */
/* Thread pool (runtime/device/threadpool.c)                                */
/* ------------------------------------------------------------------------ */

typedef struct khub_pool khub_pool;

KHUB_INTERNAL khub_status khub__pool_new(khub_runtime *rt, int n_threads, khub_pool **out);
KHUB_INTERNAL void khub__pool_free(khub_pool *pool);
KHUB_INTERNAL int khub__pool_size(const khub_pool *pool);
/* Splits [0, n) into one chunk per thread and runs fn on each; the calling
 * thread takes part. A call from inside a pool task runs inline. */
KHUB_INTERNAL void khub__pool_for(khub_pool *pool, int64_t n, khub_range_fn fn, void *ud);

/* The runtime's pool and host API table (runtime/loader/runtime.c). */
KHUB_INTERNAL khub_pool *khub__runtime_pool(khub_runtime *rt);
KHUB_INTERNAL const khub_host_api *khub__runtime_host(khub_runtime *rt);

/* ------------------------------------------------------------------------ */
/* Opening user-given files, small whole-file reads (base/file_read.c)     */
/* ------------------------------------------------------------------------ */

/* Opens path read-only (O_CLOEXEC) without hanging on a FIFO or a device:
 * the open itself is O_NONBLOCK, anything but a regular file is refused
 * (errno EINVAL, or EISDIR for a directory) and blocking reads are
 * restored. The fd, or -1 with errno set and errbuf (may be NULL) holding
 * "<path>: cannot open: <reason>" or "<path>: is a FIFO, not a regular
 * file". Every path a user names (model, plugin, policy, lock, key, token,
 * khub.json) is opened through this or khub__fopen_regular. */
KHUB_PRIVATE_API int khub__open_regular(const char *path, char *errbuf, size_t errbuf_size);
/* khub__open_regular, with the descriptor's fstat into *sb (a regular
 * file's: no second fstat needed). */
struct stat;
KHUB_INTERNAL int khub__open_regular_stat(const char *path, struct stat *sb, char *errbuf,
                                          size_t errbuf_size);
/* The same as a stdio stream ("rb"); NULL with errno and errbuf set. */
KHUB_PRIVATE_API FILE *khub__fopen_regular(const char *path, char *errbuf, size_t errbuf_size);

/* Reads all of path, at most max bytes, into *out (NUL-terminated, the
 * caller frees it with free()); *n gets the length. NOT_FOUND when absent,
 * IO, OVERFLOW when larger than max, NOMEM; errbuf (may be NULL) gets
 * "<path>: cannot open: <reason>" and the like. */
KHUB_PRIVATE_API khub_status khub__read_file(const char *path, size_t max, char **out, size_t *n,
                                             char *errbuf, size_t errbuf_size);
/* The same into a block of allocator a (khub__mem_alloc; freed with
 * khub__mem_free): the hub's reads. */
KHUB_INTERNAL khub_status khub__read_file_mem(const khub_allocator *a, const char *path, size_t max,
                                              char **out, size_t *n, char *errbuf,
                                              size_t errbuf_size);

/* ------------------------------------------------------------------------ */
/* Sorted name index (runtime/base/name_index.c)                            */
/* ------------------------------------------------------------------------ */

/* The record of items (n records of elem_size bytes, each starting with its
 * `const char *name`) whose name is name, found by binary search of order
 * (record indices sorted by name); NULL when absent. */
KHUB_INTERNAL const void *khub__name_index_find(const void *items, size_t elem_size,
                                                const uint32_t *order, size_t n, const char *name);

/* ------------------------------------------------------------------------ */
/* CPU feature names (runtime/device/cpu.c)                                 */
/* ------------------------------------------------------------------------ */

typedef struct khub__cpu_feature {
    uint32_t bit;     /* KHUB_CPU_* */
    const char *name; /* "avx2" */
} khub__cpu_feature;

KHUB_PRIVATE_API extern const khub__cpu_feature khub__cpu_features_table[];
KHUB_PRIVATE_API extern const size_t khub__cpu_features_count;
/* The KHUB_CPU_* bit of a name ("avx2"; "sse42" also for SSE4.2), 0 if none. */
KHUB_INTERNAL uint32_t khub__cpu_feature_bit(const char *name);
/* The names of mask's bits joined by sep into buf (always NUL-terminated). */
KHUB_INTERNAL void khub__cpu_feature_list(uint32_t mask, const char *sep, char *buf, size_t n);
/* The CPU's own KHUB_CPU_* bits, before KHUB_CPU_LEVEL removes any
 * (khub_cpu_features() is this masked). */
KHUB_INTERNAL uint32_t khub__cpu_features_host(void);
/* 0 when KHUB_CPU_LEVEL is unset, empty or a level; else -1 with a message
 * naming the value and the levels in errbuf. */
KHUB_INTERNAL int khub__cpu_level_check(char *errbuf, size_t n);
/* The highest level a feature set reaches: "avx512" (AVX2, FMA, F16C and
 * AVX-512 F/BW/DQ/VL/CD), "avx2" (AVX2, FMA, F16C) or "x86-64". */
KHUB_INTERNAL const char *khub__cpu_level_of(uint32_t features);

/* Op kind names from khub_plugin.h's KHUB_OP_KINDS table (runtime/base/op_kinds.c):
 * "norm" for KHUB_OP_NORM, "unknown" for a value that is no kind; by name,
 * 0 when the name is no kind. */
KHUB_PRIVATE_API const char *khub__op_kind_name(uint32_t kind);
KHUB_INTERNAL uint32_t khub__op_kind_from_name(const char *name);
/* The names of a kind's capability flags (khub_op_caps.kind_flags; "causal",
 * "bias", "bit9" for a bit without a name) joined by sep into buf. */
KHUB_INTERNAL void khub__cap_flag_names(uint32_t kind, uint64_t mask, const char *sep, char *buf,
                                        size_t n);
/* A paged KV layout's name ("paged_htd"; "none" for 0, "unknown"), and the
 * names of a KHUB_KV_LAYOUT_BIT mask, space-separated ("none" for 0). */
KHUB_INTERNAL const char *khub__kv_layout_name(uint32_t layout);
KHUB_INTERNAL void khub__kv_layouts_list(uint64_t mask, char *buf, size_t n);
/* "attention, linear, ...": every kind's name, for messages. */
#define KHUB__OP_KIND_WORD(NAME, value, name) ", " #name
#define KHUB__OP_KIND_WORDS                   (KHUB_OP_KINDS(KHUB__OP_KIND_WORD) + 2)

/* The name of a capability dtype id (khub_dtype_id_of): "f32", "bf16",
 * "q4_1", "int8_row", ...; NULL for an id that names nothing
 * (runtime/loader/registry.c). */
KHUB_INTERNAL const char *khub__dtype_id_name(int id);

/* ------------------------------------------------------------------------ */
/* Digests (runtime/base/digest.c, OpenSSL libcrypto)                       */
/* ------------------------------------------------------------------------ */

/* Lowercase hex of n bytes into hex (2n + 1 bytes, NUL-terminated). */
KHUB_INTERNAL void khub__to_hex(const unsigned char *bytes, unsigned n, char *hex);
/* OpenSSL's SHA-256 (an EVP_MD), fetched from the default provider once
 * per process. Passing EVP_sha256() instead makes OpenSSL 3 look the
 * implementation up again on every init (EVP_MD_fetch: ~2 % of a warm
 * locked load, docs/performance.md "Warm load, session 13"). Never NULL:
 * falls back to EVP_sha256() if the fetch fails. Thread-safe. */
struct evp_md_st;
KHUB_INTERNAL const struct evp_md_st *khub__sha256_md(void);
/* hex must hold 65 bytes. */
KHUB_PRIVATE_API khub_status khub__sha256_hex(const void *data, size_t n, char hex[65]);
KHUB_PRIVATE_API khub_status khub__sha256_file_hex(const char *path, char hex[65]);
/* Constant-time compare of two lowercase/uppercase hex digests. */
KHUB_PRIVATE_API bool khub__digest_eq(const char *a, const char *b);
/* True for exactly 64 hex digits. */
KHUB_PRIVATE_API bool khub__is_sha256_hex(const char *s);

#endif /* KHUB_RUNTIME_INTERNAL_H */
