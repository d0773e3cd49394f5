/*
 * khub_plugin.h: the plugin ABI, the only header a kernel author includes.
 *
 * A plugin is a shared object that exports one function, khub_plugin_init_v1,
 * and carries one ELF note, ".note.khub", that the host reads before dlopen.
 * The host calls the entry once with its function table (khub_host_api); the
 * plugin fills a khub_plugin_desc that lists its ops. Each op has a kind
 * (attention, linear, quantized linear, KV cache, norm, activation, rotary,
 * paged attention since ABI 1.4, embedding since 1.5),
 * declared capabilities (khub_op_caps) and a run function taking that kind's
 * argument struct.
 *
 * Minimal plugin:
 *
 *     #include <khub/khub_plugin.h>
 *
 *     static khub_status my_norm(void *state, const void *args) {
 *         const khub_norm_args *a = args;
 *         ...
 *         return KHUB_STATUS_OK;
 *     }
 *     static const khub_op_caps caps = {KHUB_STRUCT_INIT(khub_op_caps),
 *         .device_type = KHUB_DEVICE_CPU, .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32)};
 *     static const khub_op_desc ops[] = {{KHUB_STRUCT_INIT(khub_op_desc),
 *         .name = "rms_norm", .kind = KHUB_OP_NORM, .caps = &caps, .run = my_norm}};
 *
 *     static khub_status init(const khub_host_api *host, khub_plugin_desc *out,
 *                             char *errbuf, size_t errbuf_size) {
 *         khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),
 *             .id = "acme/rmsnorm", .version = "1.0.0", .n_ops = 1, .ops = ops};
 *         return khub_plugin_desc_put(out, &d);
 *     }
 *     KHUB_PLUGIN_DEFINE(init, "acme/rmsnorm", "1.0.0")
 *
 * Rules of the boundary (abi/ABI.md has the full promise):
 *   - Every struct that crosses it starts with KHUB_STRUCT_HEADER and only
 *     ever grows at the end; fields added after 1.0 say "added in ABI 1.x".
 *   - Each side reads a field of the other's struct only if it lies within
 *     that struct's struct_size.
 *   - Strings and arrays a plugin hands over are borrowed; the host copies
 *     what it keeps, because plugin memory dies at dlclose.
 *   - Memory is freed on the side that allocated it (host->alloc/free are
 *     the host's).
 *   - Plugins never link against libkhub; everything comes through the host
 *     table. They may not call exit(), print to stdout, or keep global
 *     mutable state that outlives khub_plugin_desc.shutdown.
 *
 * Anything not declared in abi/khub/ is not part of khub's API.
 */
#ifndef KHUB_PLUGIN_H
#define KHUB_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include "khub_status.h"
#include "khub_tensor.h"
#include "khub_version.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Struct headers and versioning                                            */
/* ------------------------------------------------------------------------ */

/* The first three fields of every boundary struct. */
#define KHUB_STRUCT_HEADER \
    uint32_t struct_size; \
    uint16_t abi_major; \
    uint16_t abi_minor

/* Initialiser for those fields: the struct's size and ABI version as the
 * plugin's target minor declares them (KHUB_PLUGIN_TARGET_MINOR). For the
 * structs a plugin exchanges with the host; an application's own structs
 * (khub.h and the other application headers) take KHUB_APP_INIT, and
 * ignore these numbers when given them. */
#define KHUB_STRUCT_INIT(type) \
    .struct_size = sizeof(type), .abi_major = KHUB_ABI_MAJOR, .abi_minor = KHUB_PLUGIN_TARGET_MINOR

/* True when struct s (a pointer) is large enough to hold field f. */
#define KHUB_HAS_FIELD(s, type, f) ((s)->struct_size >= offsetof(type, f) + sizeof(((type *)0)->f))

#if defined(_WIN32)
#define KHUB_PLUGIN_EXPORT __declspec(dllexport)
#else
#define KHUB_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/* ------------------------------------------------------------------------ */
/* The ABI note: metadata the host reads without running plugin code        */
/* ------------------------------------------------------------------------ */

/* ELF note owner and type of the ".note.khub" section. */
#define KHUB_NOTE_NAME "khub"
#define KHUB_NOTE_TYPE 0x4b480001u

/* Descriptor of the note. Fixed layout, little-endian, 4-byte aligned. */
typedef struct khub_abi_note {
    uint32_t note_version; /* 1 */
    uint16_t abi_major;    /* ABI the plugin was compiled against */
    uint16_t abi_minor;
    uint32_t ptr_size; /* sizeof(void *) of the plugin */
    uint32_t kinds;    /* bit (1 << khub_op_kind) per kind it serves, 0 if unknown */
    char id[64];       /* NUL-terminated plugin id, e.g. "kernels-community/flash-attn2" */
    char version[32];  /* NUL-terminated plugin version, e.g. "1.2.0" */
} khub_abi_note;

#if KHUB_PLUGIN_TARGET_MINOR >= 3
/* Version 2 of the note's descriptor (added in ABI 1.3): the same fields with
 * room for a full Hub ID as plugin id (up to 255 bytes; version 1 holds 63).
 * KHUB_PLUGIN_DEFINE emits version 2 when the plugin targets 1.3 or newer
 * and version 1 (which older hosts read) when it targets 1.0-1.2; hosts of
 * 1.3 and newer read both. */
typedef struct khub_abi_note_v2 {
    uint32_t note_version; /* 2 */
    uint16_t abi_major;
    uint16_t abi_minor;
    uint32_t ptr_size;
    uint32_t kinds;
    char id[256];     /* NUL-terminated plugin id: a full Hub ID */
    char version[32]; /* NUL-terminated plugin version */
} khub_abi_note_v2;
#endif

/* ------------------------------------------------------------------------ */
/* Host API: the host's function table, handed to the plugin at init        */
/* ------------------------------------------------------------------------ */

typedef enum khub_log_level {
    KHUB_LOG_ERROR = 0,
    KHUB_LOG_WARN = 1,
    KHUB_LOG_INFO = 2,
    KHUB_LOG_DEBUG = 3
} khub_log_level;

/* CPU feature bits, as reported by host->cpu_features and required by
 * khub_op_caps.cpu_features. The host checks OS support (XGETBV) too. */
#define KHUB_CPU_SSE42      (1u << 0)
#define KHUB_CPU_AVX        (1u << 1)
#define KHUB_CPU_AVX2       (1u << 2)
#define KHUB_CPU_FMA        (1u << 3)
#define KHUB_CPU_F16C       (1u << 4)
#define KHUB_CPU_AVX512F    (1u << 5) /* with BW, DQ, VL, CD */
#define KHUB_CPU_AVX512VNNI (1u << 6)
#define KHUB_CPU_AVX512BF16 (1u << 7)
#define KHUB_CPU_AVXVNNI    (1u << 8)
#define KHUB_CPU_BMI2       (1u << 9)

/* Body of a parallel_for: process items [begin, end) on worker `thread`. */
typedef void (*khub_range_fn)(void *ud, int64_t begin, int64_t end, int thread);

/* Opaque CUDA handles; they are CUstream, CUmodule and CUfunction. */
typedef struct khub_cuda_module khub_cuda_module;

/* Launch configuration of host->cuda_launch. */
typedef struct khub_cuda_launch_cfg {
    KHUB_STRUCT_HEADER;
    uint32_t grid[3];
    uint32_t block[3];
    uint32_t shared_bytes; /* dynamic shared memory, bytes */
    uint32_t reserved;
    void *stream; /* CUstream, or NULL for the host's stream */
} khub_cuda_launch_cfg;

typedef struct khub_host_api {
    KHUB_STRUCT_HEADER;
    void *host_ctx; /* pass as first argument to every function below */

    /* Logging: one line, no newline; goes to the runtime's log callback. */
    void (*log)(void *host_ctx, khub_log_level level, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

    /* Records a one-line error message for the current call and returns st,
     * so a plugin writes `return host->fail(host->host_ctx, KHUB_STATUS_X, ...)`. */
    khub_status (*fail)(void *host_ctx, khub_status st, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

    /* Host memory, aligned to 64 bytes; NULL on OOM. free accepts NULL. */
    void *(*alloc)(void *host_ctx, size_t size);
    void (*free)(void *host_ctx, void *p);

    /* Runs fn over [0, n) split into contiguous chunks on the runtime's thread
     * pool and returns when all are done. Calls may nest (then run inline).
     * Chunk t is passed as `thread` t (0 <= t < n_threads), once per call,
     * so scratch indexed by it is private to the chunk; chunk 0 runs on the
     * calling thread, the others on a worker or, when one is late, on the
     * calling thread after chunk 0: do not tie per-OS-thread state (thread
     * locals) to `thread`. */
    void (*parallel_for)(void *host_ctx, int64_t n, khub_range_fn fn, void *ud);
    int (*n_threads)(void *host_ctx);

    /* KHUB_CPU_* bits of this machine. */
    uint32_t (*cpu_features)(void *host_ctx);

    /* CUDA (every call returns KHUB_STATUS_NO_CUDA when no driver is present). */
    khub_status (*cuda_device_count)(void *host_ctx, int *count);
    /* Compute capability as major*10+minor, e.g. 90 for sm_90. */
    khub_status (*cuda_device_cc)(void *host_ctx, int device, int *cc);
    khub_status (*cuda_mem_alloc)(void *host_ctx, int device, size_t bytes, uint64_t *dptr);
    khub_status (*cuda_mem_free)(void *host_ctx, uint64_t dptr);
    khub_status (*cuda_memcpy_htod)(void *host_ctx, uint64_t dst, const void *src, size_t n,
                                    void *stream);
    khub_status (*cuda_memcpy_dtoh)(void *host_ctx, void *dst, uint64_t src, size_t n,
                                    void *stream);
    khub_status (*cuda_stream_sync)(void *host_ctx, void *stream);
    /* Loads a PTX (NUL-terminated), cubin or fatbin image. The host owns the
     * module and unloads it when the plugin is retired. */
    khub_status (*cuda_module_load)(void *host_ctx, int device, const void *image, size_t size,
                                    khub_cuda_module **out);
    khub_status (*cuda_module_function)(void *host_ctx, khub_cuda_module *mod, const char *name,
                                        void **function);
    khub_status (*cuda_launch)(void *host_ctx, void *function, const khub_cuda_launch_cfg *cfg,
                               void **kernel_params);

    /* Artifacts of the plugin's own verified variant (PTX, cubins, tables),
     * by file name relative to the variant directory. *data is valid until
     * the plugin is retired. KHUB_STATUS_NOT_FOUND when absent. */
    khub_status (*artifact)(void *host_ctx, const char *name, const void **data, size_t *size);
    /* End of ABI 1.0. Append only below, each field marked "added in ABI 1.x"
     * and declared only when KHUB_PLUGIN_TARGET_MINOR >= x. */

#if KHUB_PLUGIN_TARGET_MINOR >= 2
    /* added in ABI 1.2: CUDA streams the plugin owns, for work it orders
     * itself (ops still get the caller's stream in their args; NULL is the
     * default stream). create makes a stream in device's primary context;
     * destroy takes only a stream this plugin created, and NULL. The host
     * destroys the ones a plugin leaves when it retires the plugin. Check
     * KHUB_HAS_FIELD(host, khub_host_api, cuda_stream_destroy) first: an ABI
     * 1.0 or 1.1 host has neither. */
    khub_status (*cuda_stream_create)(void *host_ctx, int device, void **stream);
    khub_status (*cuda_stream_destroy)(void *host_ctx, void *stream);
#endif

#if KHUB_PLUGIN_TARGET_MINOR >= 5
    /* added in ABI 1.5: the collectives of the tensor-parallel job that the
     * plugin's runtime runs a model in (docs/parallelism.md), so that a
     * fused kernel can do its own communication (an all-reduce overlapped
     * with its compute). comm_info gives this rank and the job's size: 0
     * and 1 when the runtime runs no tensor-parallel model, and then both
     * collectives leave the data as it is (a job of one). The collectives
     * are collective: every rank calls them in the same order with the same
     * sizes, from the thread that runs the op (never from parallel_for
     * workers), and they block. Tensors are compact row-major (strides NULL
     * or compact), on the host (KHUB_DEVICE_CPU: the job's communicator) or
     * on a CUDA device (KHUB_DEVICE_CUDA: NCCL, which the host opens at run
     * time and joins at the first CUDA collective, on that tensor's device;
     * one device per rank; the plugin's writes to the tensor must be
     * complete, i.e. its stream synchronised, and the result is in device
     * memory when the call returns); others are refused.
     * Statuses: INVALID_ARG (dtype, layout, sizes, a second device),
     * UNSUPPORTED (another device type), NO_NCCL (a CUDA tensor, and no
     * usable libnccl.so.2), CUDA, IO or another failure
     * of the transport (the job cannot go on), each with its message
     * through fail. Check KHUB_HAS_FIELD(host, khub_host_api,
     * comm_all_gather) first: an older host has none of the three. */
    khub_status (*comm_info)(void *host_ctx, int32_t *rank, int32_t *size);
    /* t (f32) = the element-wise sum over ranks of every rank's t, in place. */
    khub_status (*comm_all_reduce_sum)(void *host_ctx, khub_tensor *t);
    /* recv = every rank's send in rank order: rank r's bytes at byte
     * r * bytes(send). recv has send's dtype and size * numel(send)
     * elements (any shape). */
    khub_status (*comm_all_gather)(void *host_ctx, const khub_tensor *send, khub_tensor *recv);

    /* added in ABI 1.5 (issue 19): load-time CUDA compilation. Compiles
     * `source`, the name of a CUDA C++ file of the plugin's own verified
     * variant (as for artifact: a file its metadata.json digests, re-hashed
     * when read; self-contained, no #include of other files), with NVRTC
     * (opened at run time) to a cubin for device's compute capability, and
     * loads it as cuda_module_load does (the host owns the module). The
     * n_defines (at most 16) strings of defines become -D options: "NAME" or
     * "NAME=VALUE", NAME an identifier, VALUE letters, digits and _ . + -
     * (at most 64 characters each): compile-time constants such as a
     * model's head_dim, for a module specialised on them. The result is
     * cached on disk (docs/gpu.md), keyed by the SHA-256 of the source, the
     * architecture, NVRTC's and the driver's versions and the options, so
     * one compile serves every later load. Statuses: NOT_FOUND (no such
     * file in the variant, or no variant), DIGEST_MISMATCH (it changed
     * since it was verified), INVALID_ARG (a define), NO_NVRTC (no usable
     * NVRTC library), UNSUPPORTED (turned off: KHUB_CUDA_JIT=0), ERROR (the
     * compiler's log in the message), NO_CUDA / CUDA (the driver), each
     * with its message through fail. A plugin keeps its build-time PTX as
     * the fallback when this fails. Check KHUB_HAS_FIELD(host, khub_host_api,
     * cuda_module_compile) first: an older host has none. */
    khub_status (*cuda_module_compile)(void *host_ctx, int device, const char *source,
                                       const char *const *defines, size_t n_defines,
                                       khub_cuda_module **out);
#endif
} khub_host_api;

/* ------------------------------------------------------------------------ */
/* Op kinds, capabilities and descriptors                                   */
/* ------------------------------------------------------------------------ */

/* The op kinds, one table: X(NAME, value, name) per kind, where name is the
 * kind's word in kernel.json, traces and messages. It generates the enum
 * below and every name list of the host (nothing else lists the kinds).
 * Values are ABI: never renumber, and keep them contiguous and ascending
 * (KHUB_OP_KIND__COUNT is one past the last). A kind added in ABI 1.x goes
 * into a list KHUB_OP_KINDS_1_x, declared only when KHUB_PLUGIN_TARGET_MINOR
 * >= x, and appended to KHUB_OP_KINDS. A host skips (with a trace line) an
 * op whose kind it does not know and loads the rest of the plugin. */
#define KHUB_OP_KINDS_1_0(X) \
    X(ATTENTION, 1, attention)   /* khub_attention_args */ \
    X(LINEAR, 2, linear)         /* khub_linear_args, dense weights */ \
    X(QLINEAR, 3, qlinear)       /* khub_linear_args, block-quantized weights; \
                                    methods: khub_qlinear_methods */ \
    X(KV_CACHE, 4, kv_cache)     /* methods: khub_kv_cache_methods (run unused) */ \
    X(NORM, 5, norm)             /* khub_norm_args */ \
    X(ACTIVATION, 6, activation) /* khub_activation_args */ \
    X(ROTARY, 7, rotary)         /* khub_rotary_args */

#if KHUB_PLUGIN_TARGET_MINOR >= 4
/* added in ABI 1.4 */
#define KHUB_OP_KINDS_1_4(X) \
    X(PAGED_ATTENTION, 8, paged_attention) /* khub_paged_attention_args \
                                            */
#else
#define KHUB_OP_KINDS_1_4(X)
#endif
#if KHUB_PLUGIN_TARGET_MINOR >= 5
/* added in ABI 1.5 */
#define KHUB_OP_KINDS_1_5(X) X(EMBEDDING, 9, embedding) /* khub_embedding_args */
#else
#define KHUB_OP_KINDS_1_5(X)
#endif
#define KHUB_OP_KINDS(X) KHUB_OP_KINDS_1_0(X) KHUB_OP_KINDS_1_4(X) KHUB_OP_KINDS_1_5(X)

#define KHUB__OP_KIND_ENUM(NAME, value, name) KHUB_OP_##NAME = value,
typedef enum khub_op_kind { KHUB_OP_KINDS(KHUB__OP_KIND_ENUM) KHUB_OP_KIND__COUNT } khub_op_kind;
#undef KHUB__OP_KIND_ENUM

/* Attention layouts and features (khub_op_caps.flags). */
#define KHUB_CAP_CAUSAL     (1u << 0) /* causal masking */
#define KHUB_CAP_GQA        (1u << 1) /* n_kv_heads < n_heads */
#define KHUB_CAP_MASK       (1u << 2) /* an additive mask tensor */
#define KHUB_CAP_STRIDED_KV (1u << 3) /* K/V with arbitrary strides (cache views) */
#define KHUB_CAP_KV_F16     (1u << 4) /* K/V stored in f16 */
#define KHUB_CAP_SLIDING    (1u << 5) /* sliding-window attention */
#define KHUB_CAP_BIAS       (1u << 6) /* linear: bias supported */
#define KHUB_CAP_RESIDUAL   (1u << 7) /* norm: fused residual add */

#if KHUB_PLUGIN_TARGET_MINOR >= 3
/* Capability flags per op kind (khub_op_caps.kind_flags, added in ABI 1.3).
 * The 1.0 word above is one 32-bit namespace shared by every kind and it is
 * nearly full; kind_flags gives each kind 64 bits of its own, so one bit
 * means different things in different kinds. Bits 0-7 of each kind are the
 * 1.0 KHUB_CAP_* bits that apply to it, at the same positions, and the host
 * reads flags | kind_flags, so the 1.0 word stays readable and a 1.0-1.2
 * plugin's flags keep their meaning. A kind's new flags start at its bit 8.
 * Values are ABI: never renumber. */
#define KHUB_ATTN_CAUSAL           ((uint64_t)KHUB_CAP_CAUSAL)
#define KHUB_ATTN_GQA              ((uint64_t)KHUB_CAP_GQA)
#define KHUB_ATTN_MASK             ((uint64_t)KHUB_CAP_MASK)
#define KHUB_ATTN_STRIDED_KV       ((uint64_t)KHUB_CAP_STRIDED_KV) /* strides and byte_offset */
#define KHUB_ATTN_KV_F16           ((uint64_t)KHUB_CAP_KV_F16)
#define KHUB_ATTN_SLIDING          ((uint64_t)KHUB_CAP_SLIDING)
#define KHUB_LINEAR_BIAS           ((uint64_t)KHUB_CAP_BIAS) /* linear and qlinear */
#define KHUB_NORM_RESIDUAL         ((uint64_t)KHUB_CAP_RESIDUAL)
#define KHUB_KV_CACHE_STRIDED_VIEW ((uint64_t)KHUB_CAP_STRIDED_KV) /* views are strided */
#define KHUB_KV_CACHE_F16          ((uint64_t)KHUB_CAP_KV_F16)     /* f16 storage */
#endif

#if KHUB_PLUGIN_TARGET_MINOR >= 5
/* added in ABI 1.5: attention (and paged_attention) applies logit
 * soft-capping, s' = softcap * tanh(s / softcap) on the scaled scores
 * s = scale * q.k before the softmax, when the args' softcap is > 0 (Gemma 2,
 * Grok). The host asks for it only for a model that caps, and never sends a
 * softcap to an op without the flag or to a plugin of an older minor. */
#define KHUB_ATTN_SOFTCAP ((uint64_t)1 << 8)
/* added in ABI 1.5, embedding's flags (its bits 0-7 are unused: no 1.0
 * flag applies to the kind): the op applies khub_embedding_args.scale
 * (a model that scales its embeddings, Gemma: sqrt(hidden)); the op
 * writes y with any row stride (strides[0] >= hidden; a row's values stay
 * contiguous, strides[1] = 1) and byte offset (else y must be compact). */
#define KHUB_EMBEDDING_SCALE       ((uint64_t)1 << 8)
#define KHUB_EMBEDDING_STRIDED_OUT ((uint64_t)1 << 9)
#endif

#if KHUB_PLUGIN_TARGET_MINOR >= 4
/* Paged KV layouts (added in ABI 1.4): how a paged cache arranges its block
 * pool, the contract between a kv_cache op that produces it (paged_view)
 * and a paged_attention op that reads it; both name it in caps.kv_layouts
 * and the registry binds them as a pair. Values are ABI: never renumber.
 *   PAGED_HTD: per layer, K and V pools [n_blocks, n_kv_heads, block_size,
 *     head_dim], compact, f32 or f16 (the pool tensors' dtype); token t of a
 *     sequence lives in block block_table[t / block_size], slot
 *     t % block_size. No scales.
 *   PAGED_HTD_Q8: the same arrangement in int8 with one f32 scale per
 *     (block, KV head) for K and one for V: value = q * scale[block][head]
 *     (k_scales / v_scales [n_blocks, n_kv_heads]). */
#define KHUB_KV_LAYOUT_NONE         0u
#define KHUB_KV_LAYOUT_PAGED_HTD    1u
#define KHUB_KV_LAYOUT_PAGED_HTD_Q8 2u
#define KHUB_KV_LAYOUT_BIT(id)      (UINT64_C(1) << (id))
#endif

typedef struct khub_op_caps {
    KHUB_STRUCT_HEADER;
    uint32_t device_type;     /* khub_device_type */
    uint32_t cpu_features;    /* KHUB_CPU_* bits the op needs */
    uint64_t dtypes;          /* KHUB_DTYPE_BIT(...) of accepted weight / K-V dtypes */
    const int32_t *head_dims; /* borrowed; attention head dims served, NULL = any */
    uint32_t n_head_dims;
    uint32_t flags;   /* KHUB_CAP_* */
    uint16_t cc_min;  /* CUDA compute capability x10 (e.g. 80), 0 = none */
    uint16_t cc_max;  /* inclusive, 0 = no upper bound */
    uint16_t ptx_isa; /* PTX ISA x10 (e.g. 87 for 8.7), 0 when not PTX */
    uint16_t reserved;
    int32_t priority; /* static preference, higher wins; reference plugins use 0 */
    uint32_t reserved2;
    /* End of ABI 1.0. */
#if KHUB_PLUGIN_TARGET_MINOR >= 3
    /* added in ABI 1.3: flags of the op's own kind (KHUB_ATTN_*, KHUB_NORM_*,
     * ...); the host serves flags | kind_flags. */
    uint64_t kind_flags;
    /* added in ABI 1.3: KHUB_DTYPE_BIT(...) of the activation dtypes the op
     * takes and writes (x, y, q, out, gate, up, residual; weights and K/V
     * are `dtypes`). 0 = f32 only, which is what every op of 1.0-1.2 takes;
     * bf16 and f16 are for GPU ops. */
    uint64_t act_dtypes;
#endif
#if KHUB_PLUGIN_TARGET_MINOR >= 4
    /* added in ABI 1.4: KHUB_KV_LAYOUT_BIT(...) of the paged KV layouts the
     * op serves: a kv_cache op lists the one its paged_view produces, a
     * paged_attention op those it reads. The registry binds a paged cache
     * and a paged attention op as a pair that shares one layout. 0 = none
     * (a dense cache; every op before 1.4). */
    uint64_t kv_layouts;
#endif
#if KHUB_PLUGIN_TARGET_MINOR >= 5
    /* added in ABI 1.5: the most device memory, in bytes, the op allocates
     * for itself per stream it runs on and keeps while that stream lives
     * (a split-K attention's partials), freed in the plugin's stream_end
     * (khub_plugin_desc) or shutdown. The host counts it in the memory a
     * model placed on a device needs (the fit check and `--explain`), once
     * per op the model binds. 0 = none, or not declared. */
    uint64_t stream_bytes;
#endif
} khub_op_caps;

/* The run function of an op: args points at the kind's argument struct. */
typedef khub_status (*khub_op_run_fn)(void *plugin_state, const void *args);

typedef struct khub_op_desc {
    KHUB_STRUCT_HEADER;
    const char *name; /* borrowed; unique within the plugin, [a-z0-9_]+ */
    uint32_t kind;    /* khub_op_kind */
    uint32_t reserved;
    const khub_op_caps *caps; /* borrowed; required */
    khub_op_run_fn run;       /* required except for KHUB_OP_KV_CACHE */
    const void *methods;      /* borrowed; kind-specific table or NULL (see khub_op_kind) */
    /* End of ABI 1.0. */
} khub_op_desc;

typedef struct khub_plugin_desc {
    KHUB_STRUCT_HEADER;
    const char *id;      /* borrowed; "org/name", equal to the ABI note's id */
    const char *version; /* borrowed; semantic version, equal to the note's */
    uint32_t n_ops;
    uint32_t reserved;
    const khub_op_desc *ops; /* borrowed; [n_ops] */
    void *state;             /* plugin-owned; first argument of every op call */
    /* Optional: 0 = cannot run on this machine, else higher is better. */
    int32_t (*score)(void *state);
    /* Optional: runs the plugin's own checks; fills errbuf on failure. */
    khub_status (*selftest)(void *state, char *errbuf, size_t errbuf_size);
    /* Optional: stop background work before retirement. */
    khub_status (*quiesce)(void *state);
    /* Optional: frees state; called once, before dlclose. */
    void (*shutdown)(void *state);
    /* End of ABI 1.0. */
#if KHUB_PLUGIN_TARGET_MINOR >= 5
    /* added in ABI 1.5, optional: `stream` (a CUstream the host passed to
     * the plugin's ops, in args or ctx) ends. The host calls it once per
     * stream it made for ops (a placed model's), for every loaded plugin
     * that has it, after the stream's queued work finished (the host
     * synchronised it) and before the stream is destroyed, so the handle
     * cannot belong to a new stream while the plugin still keys state on
     * it. No op call on that stream runs during it or follows it; calls on
     * other streams may run concurrently. The plugin frees what it keeps
     * for that stream (scratch: host->cuda_mem_free, no synchronisation
     * needed) and ignores a stream it never saw. Not called for the NULL
     * stream, for streams the plugin made itself (cuda_stream_create), or
     * when the synchronisation failed (the state stays until shutdown). */
    void (*stream_end)(void *state, void *stream);
#endif
} khub_plugin_desc;

/* Copies src into the host's out, never past out->struct_size (the host's
 * size), and stamps the struct with the plugin's target ABI version. */
static inline khub_status khub_plugin_desc_put(khub_plugin_desc *out, const khub_plugin_desc *src)
{
    uint32_t n = out->struct_size < sizeof(*src) ? out->struct_size : (uint32_t)sizeof(*src);
    const unsigned char *s = (const unsigned char *)src;
    unsigned char *d = (unsigned char *)out;
    for (uint32_t i = sizeof(uint32_t); i < n; i++) d[i] = s[i];
    out->struct_size = n;
    out->abi_major = KHUB_ABI_MAJOR;
    out->abi_minor = KHUB_PLUGIN_TARGET_MINOR;
    return KHUB_STATUS_OK;
}

/* ------------------------------------------------------------------------ */
/* The calling contract: threads, aliasing, strides                         */
/* ------------------------------------------------------------------------ */
/*
 * What the host does when it calls a plugin (runtime/loader/registry.c, the
 * executor in runtime/executor/forward.c), so what a plugin may rely on and what it
 * must cope with:
 *
 * Threads.
 *   - init and score run once, at load, before any op call; quiesce then
 *     shutdown run once, at retirement, after the last call into the plugin
 *     returned. None of them overlaps anything else of the plugin.
 *   - selftest may run (khub_plugin_selftest) while ops run on other threads.
 *   - run (and the qlinear and kv_cache methods) may be called concurrently
 *     from several threads with the SAME plugin state: there is one state per
 *     loaded plugin, shared by every binding and every model of the runtime,
 *     and khub_binding_call takes no lock around the call. Treat the state as
 *     read-only after init, or guard what you change. A kv_cache object
 *     (khub_kv_cache) is used by one model, one thread at a time.
 *   - Inside a call, host->parallel_for runs the body on the runtime's pool;
 *     a nested parallel_for runs inline. A CUDA op is handed the caller's
 *     stream and must order its work on it (or on streams it owns and syncs).
 *   - The plugin is retired (quiesce, shutdown, dlclose) only after every call
 *     that entered it has returned.
 * Strides and offsets (khub_tensor.strides in elements, byte_offset in bytes).
 *   - Attention k and v are cache views: strided (any strides, as the KV
 *     cache's view returns them; the reference cache's are [head_dim,
 *     cap * head_dim, 1]) and possibly at a non-zero byte_offset. An
 *     attention op must honour both (KHUB_CAP_STRIDED_KV says it does).
 *   - Every other tensor the executor passes (x, y, q, out, gate, up,
 *     residual, weight, bias, the rotary x, kv_cache write's k and v) is
 *     compact row-major: strides NULL and byte_offset 0. An op that gets a
 *     strided tensor it cannot handle returns KHUB_STATUS_INVALID_ARG; it
 *     never reads it as compact.
 *   - Block-quantized weights are always compact rows of
 *     khub_qformat_row_bytes(format, n_cols) bytes.
 *   - A CUDA op (caps device_type KHUB_DEVICE_CUDA) gets device memory for
 *     every pointer of its args: tensor data and also khub_rotary_args
 *     positions and khub_embedding_args ids (int32 arrays on the device).
 *   - embedding (1.5): the table is compact rows (a byte offset allowed); y
 *     is compact unless the op declares KHUB_EMBEDDING_STRIDED_OUT (the
 *     executor passes it compact).
 * Aliasing (the executor's in-place calls):
 *   - norm: y may be x (q_norm and k_norm run in place); residual is never x
 *     or y.
 *   - activation: y may be gate (the gated MLP runs in place); up is never y.
 *   - rotary: x is read and written in place.
 *   - linear and qlinear: y never overlaps x, weight or bias.
 *   - attention: out never overlaps q, k, v or mask.
 *   - kv_cache write: k and v never overlap the cache's storage.
 *   - embedding: y never overlaps the table or ids.
 *   Where y may alias an input, an op must give the same result as if it
 *   did not (read a row before writing it).
 */

/* ------------------------------------------------------------------------ */
/* Argument structs, one per kind                                           */
/* ------------------------------------------------------------------------ */

/* y = x @ W^T (+ bias). KHUB_OP_LINEAR: W is f32/f16/bf16; KHUB_OP_QLINEAR:
 * W is block-quantized (dtype KHUB_DL_BLOCKQ). */
typedef struct khub_linear_args {
    KHUB_STRUCT_HEADER;
    void *stream;              /* CUstream for CUDA ops, NULL on the CPU */
    const khub_tensor *x;      /* [n, in] f32 */
    const khub_tensor *weight; /* [out, in] */
    const khub_tensor *bias;   /* [out] f32, or NULL */
    khub_tensor *y;            /* [n, out] f32, written */
    /* End of ABI 1.0. */
} khub_linear_args;

/* Quantize or dequantize rows (KHUB_OP_QLINEAR methods). */
typedef struct khub_quant_args {
    KHUB_STRUCT_HEADER;
    uint32_t format; /* khub_qformat */
    uint32_t reserved;
    int64_t n_rows;
    int64_t n_cols;  /* a multiple of the format's block */
    const void *src; /* quantize: f32 [n_rows, n_cols]; dequantize: packed rows */
    void *dst;       /* quantize: packed rows; dequantize: f32 [n_rows, n_cols] */
    /* End of ABI 1.0. */
} khub_quant_args;

typedef struct khub_qlinear_methods {
    KHUB_STRUCT_HEADER;
    khub_status (*quantize)(void *plugin_state, const khub_quant_args *args);
    khub_status (*dequantize)(void *plugin_state, const khub_quant_args *args);
    /* End of ABI 1.0. */
} khub_qlinear_methods;

/* Scaled dot-product attention for one sequence:
 * out[i,h] = softmax(cap(scale * q[i,h] . k[j,g]^T) + mask[i,j]) v[j,g], with
 * cap(s) = s, or softcap * tanh(s / softcap) when softcap > 0 (ABI 1.5), and
 * g = h / (n_heads / n_kv_heads) (GQA) and, when causal, j <= q_pos0 + i. */
typedef struct khub_attention_args {
    KHUB_STRUCT_HEADER;
    void *stream;
    const khub_tensor *q;    /* [n_q, n_heads, head_dim] f32 */
    const khub_tensor *k;    /* [n_kv, n_kv_heads, head_dim] f32 or f16, strided */
    const khub_tensor *v;    /* [n_kv, n_kv_heads, head_dim] f32 or f16, strided */
    const khub_tensor *mask; /* [n_q, n_kv] f32 additive, or NULL */
    khub_tensor *out;        /* [n_q, n_heads, head_dim] f32, written */
    float scale;             /* usually 1/sqrt(head_dim) */
    uint32_t causal;         /* 1 = causal */
    int64_t q_pos0;          /* position of query 0 within the key sequence */
    int64_t window;          /* sliding window in tokens, 0 = none */
    /* End of ABI 1.0. */
#if KHUB_PLUGIN_TARGET_MINOR >= 5
    /* added in ABI 1.5: logit soft-cap of the scaled scores (KHUB_ATTN_SOFTCAP),
     * 0 = none. Read it only when KHUB_HAS_FIELD(args, khub_attention_args,
     * softcap): a host sends it only to plugins of 1.5 and newer. */
    float softcap;
    uint32_t reserved_1_5;
#endif
} khub_attention_args;

typedef enum khub_norm_type { KHUB_NORM_RMS = 1, KHUB_NORM_LAYER = 2 } khub_norm_type;

/* y = norm(x (+ residual)) * weight. With residual, x + residual is also
 * written back into residual (the fused add of a pre-norm block). */
typedef struct khub_norm_args {
    KHUB_STRUCT_HEADER;
    void *stream;
    uint32_t norm_type; /* khub_norm_type */
    float eps;
    const khub_tensor *x;      /* [n, dim] f32 */
    khub_tensor *residual;     /* [n, dim] f32 in/out, or NULL */
    const khub_tensor *weight; /* [dim] f32 */
    khub_tensor *y;            /* [n, dim] f32, written; may alias x */
    /* End of ABI 1.0. */
} khub_norm_args;

typedef enum khub_act_type {
    KHUB_ACT_SILU = 1,     /* silu(gate) * up */
    KHUB_ACT_GELU_TANH = 2 /* gelu_tanh(gate) * up */
} khub_act_type;

/* y = act(gate) * up, the gated MLP activation. */
typedef struct khub_activation_args {
    KHUB_STRUCT_HEADER;
    void *stream;
    uint32_t act_type; /* khub_act_type */
    uint32_t reserved;
    const khub_tensor *gate; /* [n, ff] f32 */
    const khub_tensor *up;   /* [n, ff] f32 */
    khub_tensor *y;          /* [n, ff] f32, written; may alias gate */
    /* End of ABI 1.0. */
} khub_activation_args;

typedef enum khub_rope_style {
    KHUB_ROPE_NEOX = 1,       /* rotate halves (x[i], x[i + d/2]): HF Llama layout */
    KHUB_ROPE_INTERLEAVED = 2 /* rotate pairs (x[2i], x[2i+1]): GPT-J / original Llama */
} khub_rope_style;

typedef enum khub_rope_scaling {
    KHUB_ROPE_SCALING_NONE = 0,
    KHUB_ROPE_SCALING_LINEAR = 1, /* positions divided by factor */
    KHUB_ROPE_SCALING_LLAMA3 = 2  /* Llama 3.1 frequency-dependent scaling */
} khub_rope_scaling;

/* Rotary embedding applied in place to x at the given positions. */
typedef struct khub_rotary_args {
    KHUB_STRUCT_HEADER;
    void *stream;
    khub_tensor *x;           /* [n, n_heads, head_dim] f32, in place */
    const int32_t *positions; /* [n] token positions (device memory for a CUDA op) */
    uint32_t style;           /* khub_rope_style */
    uint32_t scaling;         /* khub_rope_scaling */
    float theta;              /* base, e.g. 10000 */
    float factor;             /* linear and llama3 */
    float low_freq_factor;    /* llama3 */
    float high_freq_factor;   /* llama3 */
    int32_t original_max_pos; /* llama3: original_max_position_embeddings */
    int32_t rotary_dim;       /* dims rotated, <= head_dim; 0 = head_dim */
    /* End of ABI 1.0. */
} khub_rotary_args;

#if KHUB_PLUGIN_TARGET_MINOR >= 4
/* The per-call context (added in ABI 1.4): where and with what an op runs,
 * passed by pointer in the argument structs of kinds added since 1.4 (the
 * 1.0 structs keep their own `stream` and do not grow; khub_kv_write_args,
 * which had none, carries one since 1.5). It grows at the end
 * like any boundary struct, so a new per-call resource reaches every new
 * kind without touching their argument structs. May be NULL in args: then
 * the op runs on the CPU, on the host's pool, without a workspace.
 *   - device and stream: where the op runs; stream is the CUstream of a
 *     CUDA op (NULL = default stream), NULL on the CPU.
 *   - workspace: scratch the caller lends for this call only (device memory
 *     of `device`), workspace_bytes long, 64-byte aligned, or NULL/0. An op
 *     that needs more allocates its own (host->alloc) or fails with NOMEM.
 *   - n_threads: workers of the thread pool the call's host->parallel_for
 *     runs on (the pool is the host's; this sizes per-worker scratch), 0 =
 *     ask host->n_threads. Ops never start threads of their own. */
typedef struct khub_call_ctx {
    KHUB_STRUCT_HEADER;
    khub_device device;     /* KHUB_DEVICE_CPU or KHUB_DEVICE_CUDA, device id */
    void *stream;           /* CUstream, or NULL */
    void *workspace;        /* borrowed for the call, or NULL */
    size_t workspace_bytes; /* bytes at workspace */
    int32_t n_threads;      /* workers of parallel_for, 0 = host->n_threads */
    uint32_t reserved;
    /* End of ABI 1.4. */
} khub_call_ctx;

/* Batched attention over a paged KV cache (KHUB_OP_PAGED_ATTENTION, added
 * in ABI 1.4): one call serves every sequence of a batch for one layer.
 * Queries of n_seqs sequences are packed: sequence s owns rows
 * [cu_seqlens_q[s], cu_seqlens_q[s + 1]) of q and out; its query i sits at
 * position q_pos0[s] + i and sees keys j in [0, kv_lens[s]) with, when
 * causal, j <= q_pos0[s] + i and, when window > 0, (q_pos0[s] + i) - j <
 * window. Key j of sequence s is read from block
 * block_table[seq_rows[s] * block_table_stride + j / block_size] of the
 * pools, slot j % block_size, in `layout`'s arrangement. GQA: query head h
 * reads KV head h / (n_heads / n_kv_heads). A query that sees no key gets
 * zeros. out never overlaps q, the pools or the tables. */
typedef struct khub_paged_attention_args {
    KHUB_STRUCT_HEADER;
    const khub_call_ctx *ctx;    /* borrowed, or NULL (CPU, host pool) */
    uint32_t layout;             /* KHUB_KV_LAYOUT_* of the pools */
    int32_t n_seqs;              /* sequences in the batch, >= 1 */
    const khub_tensor *q;        /* [total_q, n_heads, head_dim] f32, compact */
    khub_tensor *out;            /* [total_q, n_heads, head_dim] f32, compact, written */
    const khub_tensor *k_pool;   /* this layer's K pool, in layout's shape */
    const khub_tensor *v_pool;   /* this layer's V pool, in layout's shape */
    const khub_tensor *k_scales; /* [n_blocks, n_kv_heads] f32 (Q8 layouts), else NULL */
    const khub_tensor *v_scales; /* [n_blocks, n_kv_heads] f32 (Q8 layouts), else NULL */
    const int32_t *cu_seqlens_q; /* [n_seqs + 1]: 0, ascending, total_q last */
    const int32_t *q_pos0;       /* [n_seqs] position of each sequence's first query */
    const int32_t *kv_lens;      /* [n_seqs] keys of each sequence, >= q_pos0 + n_q */
    const int32_t *block_table;  /* rows of block ids, block_table_stride apart */
    const int32_t *seq_rows;     /* [n_seqs] block_table row of each sequence, or NULL:
                                    row s for sequence s */
    int64_t block_table_stride;  /* entries per block_table row */
    int32_t block_size;          /* tokens per block, >= 1 */
    float scale;                 /* usually 1/sqrt(head_dim) */
    uint32_t causal;             /* 1 = causal */
    uint32_t reserved;
    int64_t window; /* sliding window in tokens, 0 = none */
    /* End of ABI 1.4. */
#if KHUB_PLUGIN_TARGET_MINOR >= 5
    /* added in ABI 1.5: as khub_attention_args.softcap */
    float softcap;
    uint32_t reserved_1_5;
#endif
} khub_paged_attention_args;
#endif

#if KHUB_PLUGIN_TARGET_MINOR >= 5
/* Token embedding lookup (KHUB_OP_EMBEDDING, added in ABI 1.5):
 *   y[i, :] = row(table, ids[i]) * scale, i in [0, n),
 * where row() converts row ids[i] of the table to f32 exactly as
 * khub/ref-cpu's qlinear dequantize does (f16/bf16 widened; block formats
 * value by value in their ggml layout), and the product is one f32
 * multiply (skipped when scale is 0 or 1, which are "no scale").
 * The table is the model's embedding as stored: f32, f16, bf16, or
 * block-quantized rows (KHUB_DL_BLOCKQ: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
 * Q4_K, Q6_K, ...; compact rows of khub_qformat_row_bytes(format, hidden)
 * bytes, shape [vocab, hidden] in values); caps.dtypes lists the formats an
 * op reads. ids and every tensor are in the op's memory (device memory for
 * a CUDA op). An id outside [0, vocab) is refused by a CPU op with
 * INVALID_ARG before anything is written; a CUDA op cannot return a status
 * per id: it must never read outside the table and writes NaN rows for such
 * ids (the host checks ids before it uploads them). y never overlaps the
 * table or ids. */
typedef struct khub_embedding_args {
    KHUB_STRUCT_HEADER;
    const khub_call_ctx *ctx; /* borrowed, or NULL (CPU, host pool) */
    const khub_tensor *table; /* [vocab, hidden], strides NULL (compact rows) */
    const int32_t *ids;       /* [n] token ids, int32, in the op's memory */
    khub_tensor *y;           /* [n, hidden] f32, written; strided only with
                                 KHUB_EMBEDDING_STRIDED_OUT */
    int64_t n;                /* tokens, >= 0 (0: nothing to do) */
    float scale;              /* per-value factor (KHUB_EMBEDDING_SCALE); 0 or 1 = none */
    uint32_t reserved;        /* 0 */
    uint64_t reserved2[2];    /* 0: room for later fields */
    /* End of ABI 1.5. */
} khub_embedding_args;
#endif

/* ------------------------------------------------------------------------ */
/* KV cache (KHUB_OP_KV_CACHE methods)                                      */
/* ------------------------------------------------------------------------ */

typedef struct khub_kv_cache khub_kv_cache; /* plugin-owned */

typedef struct khub_kv_cache_config {
    KHUB_STRUCT_HEADER;
    int32_t n_layers;
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t n_seqs;     /* independent sequences */
    int64_t max_tokens; /* capacity per sequence, tokens */
    khub_dtype dtype;   /* storage dtype (f32 or f16) */
    uint32_t reserved;
    /* End of ABI 1.0. */
#if KHUB_PLUGIN_TARGET_MINOR >= 4
    /* added in ABI 1.4: the strategy's options, "key=value[,key=value...]"
     * (e.g. "q_group_size=32,residual_length=128" for a quantized cache), or
     * NULL. Borrowed for the call; a cache refuses a key it does not know
     * with KHUB_STATUS_INVALID_ARG. */
    const char *options;
    /* added in ABI 1.4: [n_layers] tokens each layer attends to (its sliding
     * window; 0 = every position), or NULL (no layer slides). Borrowed for
     * the call. A sliding-window cache keeps only that many per sequence. */
    const int64_t *layer_window;
    /* added in ABI 1.4, for paged caches (dense caches ignore them): tokens
     * per block (0 = the cache's default), blocks in the pool (0 = from
     * max_bytes, else enough for n_seqs x max_tokens), and a memory budget
     * for the pool in bytes (0 = none; with n_blocks 0 the cache fits as
     * many blocks as the budget holds). */
    int32_t block_size;
    int32_t n_blocks;
    uint64_t max_bytes;
#endif
#if KHUB_PLUGIN_TARGET_MINOR >= 5
    /* added in ABI 1.5: where a cache in device memory lives (ctx->device:
     * its memory and its kernels are that device's) and does device work of
     * its own (a paged cache's block-table copies in create, reserve and
     * release), or NULL: the CPU, or cuda:0 and the legacy default stream
     * as before 1.5. Borrowed for the call; the cache keeps ctx->stream,
     * which the host keeps alive until its last reserve or release (destroy
     * uses no stream). The host passes the stream of the model's ops, the one it
     * may capture decode steps on as CUDA graphs: copies there run in order
     * with the steps, and work on the legacy stream while any stream
     * captures breaks that capture. The host sets it only for a plugin of
     * 1.5 or newer; a plugin of 1.0-1.4 reads the config up to its own
     * size and never sees it (docs/gpu.md). */
    const khub_call_ctx *ctx;
#endif
} khub_kv_cache_config;

#if KHUB_PLUGIN_TARGET_MINOR >= 4
/* What a KV cache holds (khub_kv_cache_methods.memory, added in ABI 1.4). */
typedef struct khub_kv_cache_memory {
    KHUB_STRUCT_HEADER;
    uint64_t bytes_total;     /* bytes the cache holds now, in every tier */
    uint64_t bytes_per_token; /* one token of one sequence: every layer, K and V,
                                 scales and metadata amortized */
    int64_t tokens_capacity;  /* tokens per sequence it can hold, -1 = unbounded */
    int64_t tokens_used;      /* tokens cached now, summed over sequences (the
                                 longest layer's count of each) */
} khub_kv_cache_memory;
/* A paged cache's view of one layer (added in ABI 1.4), filled by
 * khub_kv_cache_methods.paged_view: the layer's pools and the cache's block
 * table, everything the paged_attention op of the same layout reads. The
 * tensors and the table are the cache's: valid until the next reserve,
 * release, truncate or destroy of the cache. A CUDA cache's pools and
 * block table are device memory (what its CUDA paged_attention reads): the
 * host reads only the view's numbers (block_size, n_blocks, n_free). */
typedef struct khub_kv_paged_view {
    KHUB_STRUCT_HEADER;
    uint32_t layout;             /* KHUB_KV_LAYOUT_* */
    int32_t block_size;          /* tokens per block */
    const khub_tensor *k_pool;   /* in layout's shape, e.g. [n_blocks, n_kv_heads, bs, hd] */
    const khub_tensor *v_pool;   /* same shape as k_pool */
    const khub_tensor *k_scales; /* [n_blocks, n_kv_heads] f32 (Q8 layouts), else NULL */
    const khub_tensor *v_scales; /* [n_blocks, n_kv_heads] f32 (Q8 layouts), else NULL */
    const int32_t *block_table;  /* [n_seqs, block_table_stride] block ids; -1 = none yet */
    int64_t block_table_stride;  /* entries per row: blocks one sequence can hold */
    int32_t n_blocks;            /* blocks in the pool */
    int32_t n_free;              /* blocks not held by any sequence */
    /* End of ABI 1.4. */
} khub_kv_paged_view;
#endif

/* Store n tokens of K and V for one layer and sequence at positions
 * [pos, pos + n). */
typedef struct khub_kv_write_args {
    KHUB_STRUCT_HEADER;
    int32_t layer;
    int32_t seq;
    int64_t pos;
    const khub_tensor *k; /* [n, n_kv_heads, head_dim] f32 */
    const khub_tensor *v; /* [n, n_kv_heads, head_dim] f32 */
    /* End of ABI 1.0. */
#if KHUB_PLUGIN_TARGET_MINOR >= 5
    /* added in ABI 1.5: where the write runs (borrowed for the call, or
     * NULL: the CPU, or for a cache in device memory the legacy default
     * stream, as before 1.5). A cache in device memory orders its device
     * work on ctx->stream, the stream of the ops that made k and v and of
     * the attention that reads the cache, and nowhere else: the host may be
     * capturing that stream into a CUDA graph, and work on the legacy
     * stream (or a synchronisation) during a capture breaks it. A plugin of
     * 1.0-1.4 is sent the 1.0 layout (40 bytes) and never sees ctx; the host
     * then captures no graph around its writes (docs/gpu.md). */
    const khub_call_ctx *ctx;
#endif
} khub_kv_write_args;

typedef struct khub_kv_cache_methods {
    KHUB_STRUCT_HEADER;
    khub_status (*create)(void *plugin_state, const khub_kv_cache_config *cfg, khub_kv_cache **out);
    void (*destroy)(void *plugin_state, khub_kv_cache *cache); /* accepts NULL */
    khub_status (*write)(void *plugin_state, khub_kv_cache *cache, const khub_kv_write_args *a);
    /* Describes positions [0, n) of a layer and sequence as tensors
     * [n, n_kv_heads, head_dim] (shape and strides arrays of at least 3
     * entries are provided by the caller in k->shape/k->strides etc.). The
     * views stay valid until the next write or truncate of that sequence. */
    khub_status (*view)(void *plugin_state, khub_kv_cache *cache, int32_t layer, int32_t seq,
                        int64_t n, khub_tensor *k, khub_tensor *v);
    /* Forgets positions >= n of a sequence (n = 0 clears it). */
    khub_status (*truncate)(void *plugin_state, khub_kv_cache *cache, int32_t seq, int64_t n);
    /* End of ABI 1.0. */
#if KHUB_PLUGIN_TARGET_MINOR >= 4
    /* added in ABI 1.4, optional (the host checks KHUB_HAS_FIELD and NULL):
     * what the cache holds now and what one more token costs. */
    khub_status (*memory)(void *plugin_state, khub_kv_cache *cache, khub_kv_cache_memory *out);
    /* added in ABI 1.4, optional: as view, but the cache may describe only
     * positions [*first, n) (it sets *first, 0 <= *first <= n), as
     * tensors [n - *first, n_kv_heads, head_dim]: a sliding-window cache
     * that dropped older positions. The host then passes attention
     * q_pos0 = (position of query 0) - *first. A cache without view_from
     * describes every position [0, n) through view. */
    khub_status (*view_from)(void *plugin_state, khub_kv_cache *cache, int32_t layer, int32_t seq,
                             int64_t n, int64_t *first, khub_tensor *k, khub_tensor *v);
    /* added in ABI 1.4, paged caches only (NULL in a dense cache; the host
     * checks KHUB_HAS_FIELD and the plugin's minor before calling):
     * reserve makes sequence seq able to hold positions [0, n_tokens),
     * taking blocks from the pool as needed (never moving written K/V;
     * a no-op when it already can). KHUB_STATUS_KV_FULL, with a message
     * naming the blocks needed and free, when the pool is short; then
     * nothing is taken. release returns every block of seq to the pool and
     * empties it (truncate to 0 keeps the blocks). paged_view describes a
     * layer's pools and the block table (view->struct_size is the host's). */
    khub_status (*reserve)(void *plugin_state, khub_kv_cache *cache, int32_t seq, int64_t n_tokens);
    khub_status (*release)(void *plugin_state, khub_kv_cache *cache, int32_t seq);
    khub_status (*paged_view)(void *plugin_state, khub_kv_cache *cache, int32_t layer,
                              khub_kv_paged_view *view);
#endif
} khub_kv_cache_methods;

/* ------------------------------------------------------------------------ */
/* The entry point                                                          */
/* ------------------------------------------------------------------------ */

#define KHUB_PLUGIN_ENTRY "khub_plugin_init_v1"

/* The entry: host is valid for the plugin's lifetime; out arrives zeroed with
 * out->struct_size set to the host's size (fill it with
 * khub_plugin_desc_put); errbuf receives a one-line message on failure. */
typedef khub_status (*khub_plugin_init_fn)(const khub_host_api *host, khub_plugin_desc *out,
                                           char *errbuf, size_t errbuf_size);

/* KHUB_PLUGIN_DEFINE(init_fn, id, version): the one line an author writes.
 * When the plugin is built as a module (KHUB_PLUGIN_MODULE defined, as
 * khub_add_plugin() does) it exports khub_plugin_init_v1 and emits the ABI
 * note; linked in statically (the NAME_static target khub_add_plugin()
 * makes), it emits nothing and the embedder passes init_fn, which must then
 * have external linkage, to khub_plugin_load_static(). `kinds` of the note is left 0 (unknown) by
 * this macro; KHUB_PLUGIN_DEFINE_KINDS declares them. */
#define KHUB_PLUGIN_DEFINE(init_fn, id, version) KHUB_PLUGIN_DEFINE_KINDS(init_fn, id, version, 0)

#define KHUB_KIND_BIT(k) (1u << (k))

#if defined(KHUB_PLUGIN_MODULE)
#define KHUB__NOTE_ALIGN4(n) (((n) + 3u) & ~3u)
#if KHUB_PLUGIN_TARGET_MINOR >= 3
#define KHUB__NOTE_DESC    khub_abi_note_v2
#define KHUB__NOTE_VERSION 2u
#else
#define KHUB__NOTE_DESC    khub_abi_note
#define KHUB__NOTE_VERSION 1u
#endif
#define KHUB_PLUGIN_DEFINE_KINDS(init_fn, id_str, version_str, kinds_mask) \
    __attribute__((section(".note.khub"), used, aligned(4))) static const struct { \
        uint32_t namesz, descsz, type; \
        char name[KHUB__NOTE_ALIGN4(sizeof(KHUB_NOTE_NAME))]; \
        KHUB__NOTE_DESC desc; \
    } khub__abi_note = {sizeof(KHUB_NOTE_NAME), \
                        sizeof(KHUB__NOTE_DESC), \
                        KHUB_NOTE_TYPE, \
                        KHUB_NOTE_NAME, \
                        {KHUB__NOTE_VERSION, KHUB_ABI_MAJOR, KHUB_PLUGIN_TARGET_MINOR, \
                         (uint32_t)sizeof(void *), (kinds_mask), id_str, version_str}}; \
    KHUB_PLUGIN_EXPORT khub_status khub_plugin_init_v1( \
        const khub_host_api *host, khub_plugin_desc *out, char *errbuf, size_t errbuf_size) \
    { \
        (void)khub__abi_note; \
        return init_fn(host, out, errbuf, errbuf_size); \
    }
#else
#define KHUB_PLUGIN_DEFINE_KINDS(init_fn, id_str, version_str, kinds_mask)
#endif

#ifdef __cplusplus
}
#endif

#endif /* KHUB_PLUGIN_H */
