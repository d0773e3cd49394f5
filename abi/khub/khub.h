/*
 * khub.h: the application API of libkhub.
 *
 * An embedder makes a runtime, loads plugins into it (the built-in reference
 * plugins, or verified files from the hub cache), and asks the registry for
 * the best op of each kind. The executor (khub_model.h) does exactly this.
 *
 *     khub_runtime *rt = NULL;
 *     if (khub_runtime_new(NULL, &rt) != KHUB_STATUS_OK) {
 *         fprintf(stderr, "khub: %s\n", khub_last_error());
 *         return 1;
 *     }
 *     khub_plugin_load_builtin(rt);                 // ref-cpu and friends
 *     khub_op_query q = {KHUB_APP_INIT(khub_op_query), .kind = KHUB_OP_NORM};
 *     khub_binding *norm = NULL;
 *     khub_registry_select(rt, &q, &norm);
 *     khub_binding_call(norm, &norm_args);          // safe during hot reload
 *     khub_runtime_free(rt);                        // unloads everything
 *
 * Threading: a runtime may be used from several threads. khub_binding_call
 * and the read-only queries are thread-safe; loading, reloading and
 * unloading serialise on the runtime's registry lock.
 *
 * Errors: every fallible function returns khub_status. The message of the
 * last failure is khub_runtime_errmsg(rt) (owned by the runtime, valid until
 * the next call on it from the same thread) and, for failures before a
 * runtime exists, khub_last_error() (thread-local).
 *
 * Anything not declared in abi/khub/ is not part of khub's API.
 */
#ifndef KHUB_H
#define KHUB_H

#include <stddef.h>
#include <stdint.h>

#include "khub_plugin.h"
#include "khub_status.h"
#include "khub_tensor.h"
#include "khub_version.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(KHUB_BUILDING) && defined(KHUB_USING_STATIC)
#error "define at most one of KHUB_BUILDING and KHUB_USING_STATIC"
#endif
#if defined(KHUB_BUILDING) || defined(KHUB_USING_STATIC)
#define KHUB_API __attribute__((visibility("default")))
#else
#define KHUB_API
#endif

/* Initialiser of the header of an application struct (one the application
 * fills or hands to the library to fill: khub_runtime_opts, khub_op_query,
 * khub_plugin_info, khub_hub_opts, khub_kernel_opts, khub_kernel_result,
 * khub_model_kernels, khub_model_opts, khub_model_info, khub_generate_opts,
 * khub_generate_result, and khub_project.h's): its size, and the application
 * API's version (KHUB_API_VERSION_*) in the abi_major/abi_minor words.
 *
 * Application structs are versioned by struct_size alone: a field appended
 * in a later release is read only when struct_size covers it, and the
 * stamp is never compared, so one built against an older header keeps
 * working, and so does one stamped with the plugin ABI's numbers by
 * KHUB_STRUCT_INIT (what callers before 0.1's split wrote), whatever
 * plugin minor that was. A struct the library fills is written only up
 * to its struct_size, after its header: struct_size and the stamp stay as
 * the caller wrote them. Plugin structs (khub_plugin.h) keep
 * KHUB_STRUCT_INIT. Since 0.1. */
#define KHUB_APP_INIT(type) \
    .struct_size = sizeof(type), .abi_major = KHUB_API_VERSION_MAJOR, \
    .abi_minor = KHUB_API_VERSION_MINOR

/* Size of an error buffer that always holds a whole message. */
#define KHUB_ERROR_SIZE 512

/* ------------------------------------------------------------------------ */
/* Version and statuses                                                     */
/* ------------------------------------------------------------------------ */

/* KHUB_VERSION_NUM of the library (compare with the header's). Since 0.1. */
KHUB_API unsigned khub_version_num(void);
/* "0.1.0"; static storage. Since 0.1. */
KHUB_API const char *khub_version_str(void);
/* "KHUB_STATUS_DIGEST_MISMATCH"; static storage; "KHUB_STATUS_UNKNOWN" for
 * values outside the list. Since 0.1. */
KHUB_API const char *khub_status_name(khub_status st);
/* One-line English description; static storage. Since 0.1. */
KHUB_API const char *khub_status_str(khub_status st);
/* Message of the last failure on this thread that had no runtime to hold it;
 * "" if none. Thread-local storage, valid until the next failure. Since 0.1. */
KHUB_API const char *khub_last_error(void);

/* ------------------------------------------------------------------------ */
/* Runtime                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct khub_runtime khub_runtime;

/* One allocator per runtime (lua_Alloc style): realloc(ud, p, old, new) with
 * new == 0 frees and returns NULL; a NULL return for new > 0 is OOM. */
typedef struct khub_allocator {
    void *(*realloc)(void *ud, void *p, size_t old_size, size_t new_size);
    void *ud;
} khub_allocator;

typedef void (*khub_log_fn)(void *ud, khub_log_level level, const char *msg);

typedef struct khub_runtime_opts {
    KHUB_STRUCT_HEADER;
    khub_allocator allocator; /* realloc NULL = the C library's */
    int32_t n_threads;        /* thread pool size, 0 = number of online CPUs
                                 (counted once, at the process's first runtime) */
    uint32_t reserved;
    khub_log_fn log; /* NULL = stderr at WARN and above */
    void *log_ud;
    /* End of 0.1. */
} khub_runtime_opts;

/* Creates a runtime. opts may be NULL for defaults. On failure *out is NULL
 * and khub_last_error() says why: KHUB_STATUS_INVALID_ARG when
 * KHUB_CPU_LEVEL names no level (see khub_cpu_features). Since 0.1. */
KHUB_API khub_status khub_runtime_new(const khub_runtime_opts *opts, khub_runtime **out);
/* Unloads every plugin (waiting for calls in flight) and frees the runtime.
 * Accepts NULL. Since 0.1. */
KHUB_API void khub_runtime_free(khub_runtime *rt);
/* Message of the last failure on rt; "" if none. Owned by rt. Since 0.1. */
KHUB_API const char *khub_runtime_errmsg(const khub_runtime *rt);
/* Replaces the log callback (NULL restores stderr). Since 0.1. */
KHUB_API void khub_log_set(khub_runtime *rt, khub_log_fn cb, void *ud);

typedef enum khub_option {
    KHUB_OPT_LOG_LEVEL = 1,        /* khub_log_level threshold, default WARN */
    KHUB_OPT_STRICT = 2,           /* 1 = no fallback to reference plugins, default 0 */
    KHUB_OPT_ALLOW_UNVERIFIED = 3, /* 1 = khub_plugin_load accepts a NULL digest, default 0 */
    /* 1 = khub_plugin_load/reload, and the load of a kernel fetched by Hub
     * ID (khub_kernel_fetch, models' kernel mappings), first load the file
     * and run its init and selftest in a forked child (as `khub check`
     * does), so a plugin that crashes or hangs there fails the load with
     * KHUB_STATUS_CHILD_CRASHED or TIMEOUT instead of taking the host down;
     * default 0. Since 0.1. */
    KHUB_OPT_ISOLATED_INIT = 4,
    /* 1 = contain misbehaving plugins (process-wide while any runtime has it
     * on): a fatal signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) during
     * a plugin call prints one line to stderr naming the plugin, op and role
     * in flight, then the previous handler or the default action runs (the
     * process still dies of the signal); exit() or quick_exit() called
     * during a plugin call ends the process with KHUB_EXIT_PLUGIN_EXITED
     * instead of the plugin's status. A plugin loaded from the Hub cache is
     * then quarantined (see KHUB_OPT_ALLOW_QUARANTINED). Default 1; 0 removes
     * the signal handlers this runtime installed. Since 0.1. */
    KHUB_OPT_CONTAIN = 5,
    /* 1 = load a kernel build from the Hub cache even though it crashed or
     * exited during a call before (its quarantine marker is reported as a
     * warning); default 0: such a load fails with KHUB_STATUS_QUARANTINED.
     * Since 0.1. */
    KHUB_OPT_ALLOW_QUARANTINED = 6,
    /* N > 0 = cross-check kernels at run time: one model-forward call in N
     * of each op kind (norm, activation, rotary, linear, attention, and
     * since 0.2 paged_attention, the paged pool's batch call; CPU ops; 1 =
     * every call) is also run through khub/ref-cpu on copies of its inputs,
     * and an NMSE over the kind's tolerance fails the call with
     * KHUB_STATUS_KERNEL_MISMATCH naming the plugin, op, role and NMSE; a
     * checked paged_attention call that changed a KV pool block it reads
     * (read-only to it) fails the same way, naming the pool, block and
     * sequence (since session 15). Default 0 (off); costs a reference call
     * per checked call (and two digests of the blocks a paged call reads).
     * Since 0.1. */
    KHUB_OPT_VERIFY_KERNELS = 7,
    KHUB_OPT__COUNT
} khub_option;

/* The exit status of a process in which a plugin called exit() or
 * quick_exit() during a call, with KHUB_OPT_CONTAIN on (EX_SOFTWARE). */
#define KHUB_EXIT_PLUGIN_EXITED 70

/* Sets an option; KHUB_STATUS_INVALID_ARG outside its bounds. Since 0.1. */
KHUB_API khub_status khub_runtime_set_option(khub_runtime *rt, khub_option opt, int64_t value);
KHUB_API khub_status khub_runtime_get_option(const khub_runtime *rt, khub_option opt,
                                             int64_t *value);
/* Inclusive bounds of an option. Since 0.1. */
KHUB_API khub_status khub_option_bounds(khub_option opt, int64_t *min, int64_t *max);

typedef struct khub_feature {
    const char *name;  /* "cpu.avx2", "cuda.driver", "threads", ... */
    const char *value; /* "1", "0", "12080", ... */
} khub_feature;

/* The runtime's features as {name, value} pairs, owned by rt. Since 0.1. */
KHUB_API khub_status khub_runtime_features(const khub_runtime *rt, const khub_feature **list,
                                           size_t *count);
/* KHUB_CPU_* bits of this machine (CPUID and XGETBV), less those the
 * KHUB_CPU_LEVEL environment variable masks. Since 0.1.
 *
 * KHUB_CPU_LEVEL caps what khub uses, everywhere it chooses by CPU (runtime
 * cpu_features given to plugins, registry, Hub variant and plugin-level
 * choice, khub check); it only ever removes features, never adds ones the
 * CPU lacks:
 *   x86-64 (alias generic)  no optional feature: the SSE2 baseline
 *   avx2                    at most SSE4.2, AVX, AVX2, FMA, F16C, BMI2
 *   avx512, native, unset   every detected feature
 * An unknown value masks down to x86-64 here, and khub_runtime_new refuses
 * it with KHUB_STATUS_INVALID_ARG. The runtime feature "cpu.level" names the
 * level reached ("x86-64", "avx2", "avx512"). Thread-safe (reads the
 * environment on each call). */
KHUB_API uint32_t khub_cpu_features(void);

/* ------------------------------------------------------------------------ */
/* Plugins                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct khub_plugin khub_plugin;

/* What a plugin file says about itself, read without running any of it. */
typedef struct khub_plugin_info {
    KHUB_STRUCT_HEADER;
    char id[64];
    char version[32];
    uint16_t plugin_abi_major; /* from the ABI note */
    uint16_t plugin_abi_minor;
    uint32_t kinds; /* KHUB_KIND_BIT mask from the note, 0 = not declared */
    uint32_t ptr_size;
    uint32_t elf_machine; /* EM_* */
    char sha256[65];      /* hex digest of the file's bytes */
    /* End of 0.1. */
    /* added with plugin ABI 1.3 (ABI note version 2): the whole plugin id, up
     * to 255 bytes; id holds it when it is under 64 bytes, else its first 63. */
    char full_id[256];
} khub_plugin_info;

/* Reads a plugin file's ELF header and ABI note and checks them against this
 * host, without loading it. info may be NULL; else its struct_size is set
 * by the caller, at least 0.1's 185 bytes (STRUCT_SIZE below, 0 included,
 * before the file is read: "khub_plugin_inspect: info.struct_size S is
 * smaller than 0.1's 185"; before 0.2, 0 meant the whole struct), and it is
 * written up to it. Statuses: NOT_ELF, WRONG_ARCH, TRUNCATED, NO_ABI_NOTE,
 * ABI_MAJOR, ABI_MINOR, PTR_SIZE, IO, STRUCT_SIZE. Since 0.1. */
KHUB_API khub_status khub_plugin_inspect(const char *path, khub_plugin_info *info, char *errbuf,
                                         size_t errbuf_size);

/* Loads a plugin: reads the file once, checks its SHA-256 against sha256_hex
 * (64 hex digits; NULL only with KHUB_OPT_ALLOW_UNVERIFIED), checks the ABI
 * note, then dlopens exactly the verified bytes from a sealed memfd,
 * negotiates, initialises it and registers its ops. *out (optional) is
 * borrowed, valid until the plugin is unloaded. Since 0.1. */
KHUB_API khub_status khub_plugin_load(khub_runtime *rt, const char *path, const char *sha256_hex,
                                      khub_plugin **out);
/* Loads every plugin listed in the build's manifest (plugins.json with a
 * digest per file) from the first of: $KHUB_PLUGIN_DIR; the plugin folder of
 * the install prefix this library runs from (LIBDIR/khub/plugins next to an
 * installed libkhub.so, or next to BINDIR for a program linking libkhub.a;
 * found at run time, so an installed tree may be moved); the build tree's;
 * the install folder configured at build time. Since 0.1. */
KHUB_API khub_status khub_plugin_load_builtin(khub_runtime *rt);
/* Registers a plugin linked into the program instead of loaded from a file:
 * init_fn is the plugin's init function (the one its KHUB_PLUGIN_DEFINE line
 * names, e.g. khub_ref_cpu_init of the CMake target ref-cpu_static that
 * khub_add_plugin() makes beside every MODULE). It is negotiated and
 * validated exactly like a loaded plugin's entry; there is no file, digest
 * or ABI note, so khub_plugin_path() is "(static)" and khub_plugin_sha256()
 * is "". *out (optional) is borrowed, valid until the plugin is unloaded.
 * Statuses: those of negotiation (INIT_FAILED, STRUCT_SIZE, ABI_MAJOR,
 * ABI_MINOR, PLUGIN_INVALID, DUPLICATE_OP, NOMEM). Since 0.1. */
KHUB_API khub_status khub_plugin_load_static(khub_runtime *rt, khub_plugin_init_fn init_fn,
                                             khub_plugin **out);
/* Hot reload: loads the new file beside old, initialises it, swaps every
 * binding served by old to the op of the same name in the new plugin in one
 * step, then retires old once no call is in flight (real dlclose). Fails with
 * nothing changed if the new plugin lacks an op that a binding uses, and
 * with KHUB_STATUS_BUSY if the calling thread holds a khub_binding_acquire
 * pin on old (it would wait for itself) or a prepared kernel swap holds old
 * (khub_kernels.h, "Ownership of the prepared plugin"; since session 15).
 * Since 0.1. */
KHUB_API khub_status khub_plugin_reload(khub_runtime *rt, khub_plugin *old, const char *path,
                                        const char *sha256_hex, khub_plugin **out);
/* Unloads a plugin no binding uses and no prepared kernel swap holds
 * (KHUB_STATUS_BUSY otherwise, the count of either in the message; the
 * swaps' holds since session 15: khub_kernels.h). A model's bindings are
 * the model's and go with khub_model_free (since session 16): "unload ID
 * VER: N binding(s) of loaded models use it; free those models or swap it
 * out of them (khub_model_kernel_swap), or reload it instead". Bindings of
 * khub_registry_select last until khub_runtime_free: "unload ID VER: N
 * binding(s) use it, K from khub_registry_select, which last until
 * khub_runtime_free; reload it instead, or free the runtime". Since 0.1. */
KHUB_API khub_status khub_plugin_unload(khub_runtime *rt, khub_plugin *p);

KHUB_API size_t khub_plugin_count(const khub_runtime *rt);
/* Borrowed; NULL past the end. Since 0.1. */
KHUB_API const khub_plugin *khub_plugin_at(const khub_runtime *rt, size_t i);
/* Accessors; strings owned by the plugin handle. Since 0.1. */
KHUB_API const char *khub_plugin_id(const khub_plugin *p);
KHUB_API const char *khub_plugin_version(const khub_plugin *p);
KHUB_API const char *khub_plugin_path(const khub_plugin *p);
KHUB_API const char *khub_plugin_sha256(const khub_plugin *p);
KHUB_API void khub_plugin_abi(const khub_plugin *p, uint16_t *major, uint16_t *minor);
KHUB_API uint32_t khub_plugin_op_count(const khub_plugin *p);
/* Borrowed copy of op i's descriptor (host memory). NULL past the end. */
KHUB_API const khub_op_desc *khub_plugin_op(const khub_plugin *p, uint32_t i);
/* Runs the plugin's selftest, if it has one, in this process. */
KHUB_API khub_status khub_plugin_selftest(khub_plugin *p, char *errbuf, size_t errbuf_size);

/* ------------------------------------------------------------------------ */
/* Registry and selection                                                   */
/* ------------------------------------------------------------------------ */

/* What the caller needs from an op. */
typedef struct khub_op_query {
    KHUB_STRUCT_HEADER;
    uint32_t kind;        /* khub_op_kind */
    uint32_t device_type; /* khub_device_type, 0 = CPU */
    int32_t dtype_id;     /* khub_dtype_id of weights / KV, -1 = don't care */
    int32_t head_dim;     /* attention, 0 = don't care */
    uint32_t flags;       /* KHUB_CAP_* that must be present */
    uint32_t reserved;
    const char *plugin_id; /* prefer this plugin ("kernels-community/flash-attn2"), or NULL */
    const char *op_name;   /* prefer this op within it, or NULL */
    /* End of 0.1. */
    /* added with plugin ABI 1.3: flags of the query's kind that must be
     * present (KHUB_ATTN_*, KHUB_NORM_*, ...; ORed with flags), and the
     * activation dtype the caller passes (khub_dtype_id; 0 is f32, -1 = don't
     * care). */
    uint64_t kind_flags;
    int32_t act_dtype_id;
    uint32_t reserved2;
    /* added in 0.1 with plugin ABI 1.4: a paged KV layout (KHUB_KV_LAYOUT_*)
     * the op must list in caps.kv_layouts, 0 = don't care. The executor
     * asks for the paged_attention op by its paged cache's layout, which
     * binds the two as a pair. */
    uint32_t kv_layout;
    uint32_t reserved3;
} khub_op_query;

/* A binding: the registry's current answer to a query. It survives hot
 * reloads (it then points at the new plugin's op). One of
 * khub_registry_select is owned by the runtime, valid until
 * khub_runtime_free. The bindings a model makes for itself (its ops, at
 * load, by a placement or a kernel swap) are the model's: khub_model_free
 * drops them, so they no longer keep their plugins loaded (since session
 * 16; before, they stayed until khub_runtime_free). */
typedef struct khub_binding khub_binding;

/* Picks the best op for q: candidates of the kind are accepted or rejected
 * (device, CPU features, dtype, head dim, flags, score), the preferred
 * plugin wins if it is accepted, else the highest priority. If the preferred
 * plugin is rejected, the best other candidate is used with a warning, or
 * with KHUB_OPT_STRICT the call fails with KHUB_STATUS_NO_KERNEL. The
 * decision trace is kept on the binding. Since 0.1. */
KHUB_API khub_status khub_registry_select(khub_runtime *rt, const khub_op_query *q,
                                          khub_binding **out);
/* Calls the bound op with the kind's argument struct. Thread-safe and safe
 * against a concurrent reload: the plugin is pinned for the call. Since 0.1. */
KHUB_API khub_status khub_binding_call(khub_binding *b, const void *args);
/* The bound op's methods table (khub_qlinear_methods, khub_kv_cache_methods)
 * and plugin state, for kinds with methods; pins nothing, so use it only
 * while no reload can happen, or through khub_binding_acquire. */
KHUB_API const void *khub_binding_methods(const khub_binding *b, void **plugin_state);
/* Pins the bound plugin (must be paired with khub_binding_release) and
 * returns its op; for multi-call sequences on methods. Since 0.1. */
KHUB_API const khub_op_desc *khub_binding_acquire(khub_binding *b, void **plugin_state);
KHUB_API void khub_binding_release(khub_binding *b);
/* "kernels-community/flash-attn2 1.0.0 :: flash_attn" of the current op.
 * Owned by the binding and rewritten by a reload: read it from the thread
 * that reloads, or while no reload runs. */
KHUB_API const char *khub_binding_name(const khub_binding *b);
/* Multi-line decision trace, one candidate per line:
 * "accept khub/ref-cpu 0.1.0 :: attention (priority 0)" or
 * "reject acme/fa 1.0 :: fa: needs cpu avx512f". Owned by the binding. */
KHUB_API const char *khub_binding_trace(const khub_binding *b);
/* Calls made through b since it was selected: each khub_binding_call, and
 * each call the executor makes through a pinned methods table (the KV
 * cache's write and view, the embedding's dequantize). A hot reload of the
 * plugin keeps counting on the same binding. A relaxed atomic read: any
 * thread, any time, no lock; 0 for NULL. Since 0.1. */
KHUB_API uint64_t khub_binding_calls(const khub_binding *b);

#ifdef __cplusplus
}
#endif

#endif /* KHUB_H */
