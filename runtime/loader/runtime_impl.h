/*
 * runtime_impl.h: the layout of khub_runtime, shared by the files that make
 * up the runtime (runtime.c, loader.c, registry.c, host_api.c). Nothing
 * outside runtime/ includes it.
 */
#ifndef KHUB_RUNTIME_IMPL_H
#define KHUB_RUNTIME_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "internal.h"
#include "khub/khub_comm.h"
#include "sealed_memo.h"

#define KHUB__MAX_FEATURES 32

typedef struct khub__plugin_list {
    khub_plugin **items; /* owned */
    size_t count, cap;
} khub__plugin_list;

typedef struct khub__binding_list {
    khub_binding **items; /* owned */
    size_t count, cap;
} khub__binding_list;

struct khub_runtime {
    khub_allocator alloc;
    int n_threads;

    /* Logging. */
    khub_log_fn log_cb; /* NULL = stderr */
    void *log_ud;
    int log_level; /* khub_log_level threshold */

    /* Options. */
    int strict;
    int allow_unverified;
    int isolated_init;     /* KHUB_OPT_ISOLATED_INIT */
    int contain;           /* KHUB_OPT_CONTAIN (holds a khub__contain_acquire when 1) */
    int allow_quarantined; /* KHUB_OPT_ALLOW_QUARANTINED */
    int verify_kernels;    /* KHUB_OPT_VERIFY_KERNELS: 1 call in N, 0 = off */

    /* Last error (first error wins until khub__clear). */
    pthread_mutex_t err_lock;
    char errmsg[KHUB_ERROR_SIZE];
    int err_set;

    /* Thread pool and the host table plugins receive. */
    khub_pool *pool;
    uint32_t cpu_features;

    /* Plugins and bindings, under reg_lock: readers are calls, writers are
     * load/reload/unload/select. */
    pthread_rwlock_t reg_lock;
    khub__plugin_list plugins;
    khub__binding_list bindings;
    /* Hashes of the fallback warnings already logged (under reg_lock): a
     * model load selects one role many times and warns once per reason. */
    uint64_t warned[32];
    size_t n_warned;

    /* CUDA driver, opened lazily by runtime/device/cuda.c (NULL = not tried). */
    struct khub__cuda *cuda;
    pthread_once_t cuda_once;

    /* khub_runtime_features storage. */
    khub_feature features[KHUB__MAX_FEATURES];
    char feature_values[KHUB__MAX_FEATURES][24];
    size_t n_features;

    /* The runtime's own host table (khub__runtime_host), built on first use
     * under err_lock, freed by khub__registry_teardown. */
    struct khub__runtime_host *host_table;
    /* The collectives of the tensor-parallel model this runtime runs, lent
     * for plugins (host->comm_*, host_comm.c; under err_lock); tp_owner is
     * that model, NULL = none. */
    khub_comm tp_comm;
    const void *tp_owner;
    /* NCCL over tp_comm's ranks for CUDA tensors (host_comm.c): made at the
     * first CUDA tensor's collective, freed with the lent communicator. */
    struct khub__nccl *nccl;
    /* Load order counter for plugins (under reg_lock). */
    uint64_t plugin_seq;
    /* The last load number given (khub_plugin.load_no; under reg_lock). */
    uint64_t plugin_load_no;
};

/* ------------------------------------------------------------------------ */
/* Plugins and bindings (loader.c, registry.c, host_api.c, cuda.c)          */
/* ------------------------------------------------------------------------ */

/* What host->* functions receive as host_ctx: the runtime and, for a loaded
 * plugin, that plugin (NULL for the runtime's own table). */
typedef struct khub__host_ctx {
    khub_runtime *rt;
    khub_plugin *plugin;
} khub__host_ctx;

/* A CUDA module a plugin loaded through host->cuda_module_load. */
typedef struct khub__cuda_mod {
    void *module; /* CUmodule */
    int device;   /* whose primary context it was loaded in */
    struct khub__cuda_mod *next;
} khub__cuda_mod;

/* A CUDA stream a plugin created through host->cuda_stream_create. */
typedef struct khub__cuda_stream {
    void *stream; /* CUstream */
    int device;   /* whose primary context it was created in */
    struct khub__cuda_stream *next;
} khub__cuda_stream;

struct khub_plugin {
    khub_runtime *rt;
    char *id; /* owned copies: plugin memory dies at dlclose */
    char *version;
    char *path;         /* the file it came from, "(static)" for linked-in ones */
    char sha256[65];    /* of the verified bytes, "" for static ones */
    uint16_t abi_major; /* from the descriptor (equal to the note's) */
    uint16_t abi_minor;
    uint32_t kinds; /* from the note */
    uint64_t seq;   /* load order, starts at 1 */
    int32_t score;  /* desc.score() at load, 1 when absent */

    void *dl;            /* dlopen handle, NULL for static plugins */
    int memfd;           /* sealed memfd the library was opened from, -1 if none */
    char memfd_name[48]; /* name shown in /proc/self/maps ("/memfd:NAME") */
    size_t memfd_size;   /* bytes in memfd */
    /* A verified load that succeeded: at free, memfd may go to
     * sealed_memo.h, with source, the file its bytes were read from. */
    bool keep_sealed;
    khub__sealed_source source;

    khub_plugin_desc desc; /* host-size copy; strings/ops point at host copies */
    khub_op_desc *ops;     /* [n_ops], host copies */
    khub_op_caps *caps;    /* [n_ops], host copies; ops[i].caps = &caps[i] */
    uint32_t n_ops;        /* the ops this host runs (unknown kinds are skipped) */
    uint32_t ops_cap;      /* ops and caps are allocated for this many */
    int32_t *dims;         /* [n_dims], every op's head_dims, host copies */
    size_t n_dims;

    khub__host_ctx hctx; /* host.host_ctx points here */
    khub_host_api host;  /* the table this plugin was given */

    atomic_int inflight; /* calls running in plugin code right now */
    pthread_mutex_t mod_lock;
    khub__cuda_mod *modules;    /* under mod_lock; unloaded at retirement */
    khub__cuda_stream *streams; /* under mod_lock; destroyed at retirement */

    /* The verified variant directory host->artifact serves (plugin_artifacts.c);
     * NULL for a plugin loaded from a bare file. Owned, freed with the plugin. */
    struct khub__artifacts *artifacts;

    /* The quarantine marker runtime/loader/contain.c writes when the process dies
     * or exits inside this plugin (hub/quarantine.c names it after the
     * cached repo, commit and variant); NULL for plugins not from a cache.
     * Owned. Set once (khub__plugin_set_quarantine) and freed only with the
     * plugin, so a crash report or another thread's fetch may read it at any
     * time: a later fetch that reuses the plugin names the same marker. */
    _Atomic(char *) quarantine;

    /* Kernel swaps (kernel_swap.c), under rt->reg_lock. load_no: this load's
     * number in rt, given when it joins the list (a reload's new plugin gets
     * its own), never reused, so a prepared swap tells its plugin from one
     * loaded later at the same address. swap_holds: prepared swaps that
     * point at it and were neither switched nor released, and switches in
     * progress (unload and reload answer BUSY while any). swap_loaded: a
     * swap's prepare loaded it (it was not loaded before), so the swap's
     * failure or release, or a later switch that swaps it out, unloads it
     * when nothing else uses it. by_caller: the caller loaded it
     * (khub_plugin_load, _load_static, _reload; set before it joins the
     * list): a swap never unloads it. */
    uint64_t load_no;
    uint32_t swap_holds;
    bool swap_loaded;
    bool by_caller;
};

struct khub_binding {
    khub_runtime *rt;
    /* Who owns it: NULL for the caller of khub_registry_select (it lives
     * until khub_runtime_free), else the model that selected it for itself
     * (khub__registry_select_for), whose khub_model_free drops it
     * (khub__registry_drop_owned). Set at selection, never changed. */
    const void *owner;
    khub_plugin *plugin; /* under rt->reg_lock */
    uint32_t op_index;
    uint32_t kind;
    char name[192]; /* "id version :: op", rewritten on reload */
    char *trace;    /* owned, NUL-terminated */
    size_t trace_cap;
    /* Calls made through it (khub_binding_calls): one relaxed atomic add per
     * call, no lock, so counting costs the hot path nothing measurable. */
    atomic_ullong calls;
};

/* Host tables: fills t for plugin p (NULL: the runtime's own). */
KHUB_INTERNAL void khub__host_api_fill(khub_runtime *rt, khub_plugin *p, khub__host_ctx *ctx,
                                       khub_host_api *t);
/* The message a plugin's last host->fail left on this thread ("" if none),
 * and clearing it before a call into plugin code. */
KHUB_INTERNAL const char *khub__plugin_msg(void);
KHUB_INTERNAL void khub__plugin_msg_clear(void);
/* What host->fail does: records fmt in that thread-local message, returns st. */
KHUB_INTERNAL khub_status khub__plugin_fail(khub_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Frees the table of khub__runtime_host (khub__registry_teardown calls it). */
KHUB_INTERNAL void khub__runtime_host_free(khub_runtime *rt);
/* host_comm.c: the job's collectives for plugins. lend: owner's comm
 * (copied) becomes the plugins' unless another owner lent one first;
 * return: owner's is withdrawn. The host_api entries of ABI 1.5. */
KHUB_INTERNAL void khub__runtime_lend_comm(khub_runtime *rt, const khub_comm *comm,
                                           const void *owner);
KHUB_INTERNAL void khub__runtime_return_comm(khub_runtime *rt, const void *owner);
KHUB_INTERNAL khub_status khub__host_comm_info(void *host_ctx, int32_t *rank, int32_t *size);
KHUB_INTERNAL khub_status khub__host_comm_all_reduce_sum(void *host_ctx, khub_tensor *t);
KHUB_INTERNAL khub_status khub__host_comm_all_gather(void *host_ctx, const khub_tensor *send,
                                                     khub_tensor *recv);

/* Calls every loaded plugin's stream_end (ABI 1.5) for stream, which the
 * runtime made for ops and is about to destroy after its work drained
 * (khub__cuda_stream_free); a plugin's failure message is logged as a
 * warning. NULL rt or stream: nothing. */
KHUB_INTERNAL void khub__plugins_stream_end(khub_runtime *rt, void *stream);
/* Registry internals shared by loader.c and registry.c (call with
 * rt->reg_lock held for writing). */
/* The bindings that use p; *of_callers (optional) gets how many of them are
 * khub_registry_select's (no owner, kept until khub_runtime_free). */
KHUB_INTERNAL size_t khub__registry_bindings_of(const khub_runtime *rt, const khub_plugin *p,
                                                size_t *of_callers);
/* True when the calling thread holds a khub_binding_acquire pin on p (any
 * lock state): waiting for p to go idle would then wait forever. */
KHUB_INTERNAL bool khub__pinned_here(const khub_plugin *p);
KHUB_INTERNAL void khub__binding_set_name(khub_binding *b);
/* khub_registry_select restricted to one loaded plugin: only plugin's ops
 * (the one named q->op_name, when set) may win, and when none of them can
 * serve q the selection fails with NO_KERNEL saying why, whatever
 * KHUB_OPT_STRICT says (a kernel swap never falls back). Unlike a
 * plugin_id, a pointer tells two loaded builds of one plugin apart. */
KHUB_INTERNAL khub_status khub__registry_select_in(khub_runtime *rt, const khub_op_query *q,
                                                   const khub_plugin *plugin, const void *owner,
                                                   khub_binding **out);
/* khub_registry_select for owner (a model, never NULL): the binding is
 * owner's, and khub__registry_drop_owned(rt, owner) frees it. Same
 * statuses and messages. */
KHUB_INTERNAL khub_status khub__registry_select_for(khub_runtime *rt, const khub_op_query *q,
                                                    const void *owner, khub_binding **out);
KHUB_INTERNAL void khub__bindings_free(khub_runtime *rt);
/* Removes b from rt's bindings and frees it (takes rt->reg_lock): a binding
 * its model replaced and nothing can call any more (a kernel swap, after the
 * switch), so khub_plugin_unload no longer counts it as a user of its
 * plugin. Then that plugin is unloaded if a swap's prepare loaded it and
 * nothing uses it any more (khub__plugin_swapped_out). The caller must hold
 * the only pointer to b. */
KHUB_INTERNAL void khub__registry_drop(khub_runtime *rt, khub_binding *b);
/* Drops every binding owner owns (khub__registry_drop for each: the plugin
 * a swap's prepare loaded is unloaded when nothing uses it any more) and
 * returns how many. Bindings of other owners and of khub_registry_select
 * stay. The caller must hold the only pointers to them (khub_model_free,
 * after its last call). NULL owner: nothing. */
KHUB_INTERNAL size_t khub__registry_drop_owned(khub_runtime *rt, const void *owner);

/* A prepared kernel swap's hold on a plugin (plugin_list.c). p is only
 * compared with the loaded plugins' addresses until it is found, so a
 * pointer to a plugin unloaded since may be passed. */
/* The last load number given in rt: a plugin whose load_no is above a mark
 * taken before a resolve was loaded by it. */
KHUB_INTERNAL uint64_t khub__plugin_load_mark(khub_runtime *rt);
/* The load number of the plugin loaded at address p now, 0 when none is
 * (p is only compared until found). */
KHUB_INTERNAL uint64_t khub__plugin_load_of(khub_runtime *rt, const khub_plugin *p);
/* Takes a hold on p for a prepared swap or a switch in progress, when p is
 * loaded as load_no (0: any load), in one step under the lock: while held,
 * khub_plugin_unload and khub_plugin_reload of p answer BUSY, so it stays
 * readable. mark is the load mark taken before a prepare resolved it
 * (p->load_no above it: the prepare loaded it, and the swaps own it);
 * UINT64_MAX claims nothing. Returns p's load number, 0 when p is not
 * loaded (as load_no). */
KHUB_INTERNAL uint64_t khub__plugin_hold(khub_runtime *rt, const khub_plugin *p, uint64_t load_no,
                                         uint64_t mark);
/* Drops a hold taken by khub__plugin_hold (nothing when p is no longer
 * loaded as load_no), then unloads p if a swap's prepare loaded it, no
 * other swap holds it and no binding uses it. True when it unloaded p. */
KHUB_INTERNAL bool khub__plugin_release(khub_runtime *rt, const khub_plugin *p, uint64_t load_no);
/* Drops a hold taken by khub__plugin_hold and nothing else: p stays loaded
 * (a 0.1 khub_kernel_swap, which holds nothing after its prepare). */
KHUB_INTERNAL void khub__plugin_unhold(khub_runtime *rt, const khub_plugin *p, uint64_t load_no);
/* A plugin a successful switch swapped out (its last binding in a model was
 * just dropped): unloaded when it is still loaded as load_no, a swap's
 * prepare loaded it, no prepared swap holds it and no binding uses it. A
 * plugin the caller loaded (by_caller) or a model load loaded stays. True
 * when it unloaded p. */
KHUB_INTERNAL bool khub__plugin_swapped_out(khub_runtime *rt, const khub_plugin *p,
                                            uint64_t load_no);

/* CUDA streams and modules of a plugin are destroyed and unloaded when it
 * retires (cuda.c). */
KHUB_INTERNAL void khub__cuda_unload_modules(khub_plugin *p);

/* ------------------------------------------------------------------------ */
/* What each ABI minor contains (abi_minor.c)                               */
/* ------------------------------------------------------------------------ */

/* The size of a boundary struct as ABI 1.minor declares it: the host sends
 * a plugin of that minor no more, and reads no field past it. */
KHUB_INTERNAL size_t khub__host_api_size(unsigned minor);
KHUB_INTERNAL size_t khub__plugin_desc_size(unsigned minor);
KHUB_INTERNAL size_t khub__op_caps_size(unsigned minor);
/* The call arguments the host fills for an op of a plugin of that minor
 * (struct_size of the 1.minor layout: a 1.4 attention op is sent no softcap). */
KHUB_INTERNAL size_t khub__attention_args_size(unsigned minor);
KHUB_INTERNAL size_t khub__paged_attention_args_size(unsigned minor);
/* khub_kv_write_args (1.5: ctx). */
KHUB_INTERNAL size_t khub__kv_write_args_size(unsigned minor);
/* The args of a call to an op of `kind` in a plugin of that minor: args
 * itself, or a copy in *buf cut to the minor's struct_size and stamped 1.minor
 * when args is larger (attention kinds; for KHUB_OP_KV_CACHE the write
 * method's khub_kv_write_args), so an older plugin is never sent a field its
 * minor lacks (khub_binding_call does it for every call, the device forward
 * pass for its cache writes). */
typedef union khub__args_buf {
    khub_attention_args attn;
    khub_paged_attention_args paged;
    khub_kv_write_args kv_write;
} khub__args_buf;
KHUB_INTERNAL const void *khub__args_for_minor(uint32_t kind, unsigned minor, const void *args,
                                               khub__args_buf *buf);
/* The highest op kind ABI 1.minor declares (7 for 1.0-1.3, 8 for 1.4, 9
 * for 1.5): an op of a higher kind from such a plugin is skipped. */
KHUB_INTERNAL uint32_t khub__op_kind_max(unsigned minor);
/* The kind_flags bits of `kind` that a plugin of that minor can declare. */
KHUB_INTERNAL uint64_t khub__kind_flags_known(uint32_t kind, unsigned minor);

/* ------------------------------------------------------------------------ */
/* Inspection and ABI rules (elf_inspect.c)                                 */
/* ------------------------------------------------------------------------ */

/* The pure version rule: a plugin of ABI major.minor with pointer size
 * ptr_size fits a host of ABI host_major.[min_minor, host_minor] and pointer
 * size host_ptr. On failure msg gets "ABI 2.1, host supports 1.0-1.0" (or
 * the pointer sizes) and the status is ABI_MAJOR, ABI_MINOR or PTR_SIZE. */
KHUB_INTERNAL khub_status khub__abi_check_range(unsigned major, unsigned minor, unsigned ptr_size,
                                                unsigned host_major, unsigned min_minor,
                                                unsigned host_minor, unsigned host_ptr, char *msg,
                                                size_t n);
/* The same rule against this host (KHUB_ABI_*, sizeof(void *)). */
KHUB_INTERNAL khub_status khub__abi_check(unsigned major, unsigned minor, unsigned ptr_size,
                                          char *msg, size_t n);
/* Checks an in-memory ELF image (size bytes at data, untrusted) and reads
 * its ABI note into info (which must be non-NULL; sha256 is left alone).
 * Never runs plugin code; every offset is bounds-checked. On failure msg
 * gets one line naming label (the file) and both sides. Statuses: NOT_ELF,
 * WRONG_ARCH, TRUNCATED, NO_ABI_NOTE, ABI_MAJOR, ABI_MINOR, PTR_SIZE, and
 * PLUGIN_INVALID for an id or version outside khub__plugin_name_check. */
/* A plugin id holds only Hub ID characters ([A-Za-z0-9._-/]) and a version
 * only [A-Za-z0-9._+-], so neither can carry terminal escape codes into a
 * message. On failure msg names the first bad byte (the name shown escaped)
 * and the status is PLUGIN_INVALID. Both must be NUL-terminated. */
KHUB_INTERNAL khub_status khub__plugin_name_check(const char *id, const char *version, char *msg,
                                                  size_t n);
KHUB_INTERNAL khub_status khub__elf_inspect(const void *data, size_t size, const char *label,
                                            khub_plugin_info *info, char *msg, size_t n);

#endif /* KHUB_RUNTIME_IMPL_H */
