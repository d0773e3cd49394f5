/*
 * placement.h: where a model's parts live when it is loaded for a CUDA
 * device (khub_model_opts.device, `khub run --device cuda[:N]`; issue 19),
 * m->place, NULL for a model on the CPU.
 * runtime/executor/placement.c; docs/gpu.md says what runs and what waits.
 *
 * The plan, made after the CPU load (so every role has its CPU binding as
 * the fallback): each role asks the registry for a CUDA op of the same
 * kind, dtype and flags. A role that gets one runs on the device and its
 * weights are uploaded there once (block formats as they are: quantized
 * weights stay quantized); a role that gets none stays on the CPU, and the
 * copies that costs per token are named in khub_model_explain, or, with
 * strict, the load fails. Activations and scratch are on the device; the
 * KV cache is there when the kv_cache role has a CUDA op. The memory of
 * each part is checked against the device's free memory before anything
 * is allocated.
 *
 * The forward pass of a placed model is forward_device.c's: activations in
 * the device scratch, one stream, the CPU roles between copies. What waits
 * (docs/gpu.md): a GPU to check its numbers.
 */
#ifndef KHUB_RUNTIME_PLACEMENT_H
#define KHUB_RUNTIME_PLACEMENT_H

#include "executor.h"
#include "khub/khub_kernels.h"

/* What khub_model_load_hub decided for the roles of a model placed on a
 * CUDA device (runtime/kernels/model_kernels.c), per kernel role
 * (KHUB_KERNEL_ROLES): the plugin whose CUDA op the role's device query
 * prefers (a Hub kernel's CUDA variant, "org/name" or "org/name:op"), or
 * why the role stays on the CPU (the named Hub kernel has no CUDA variant
 * for the device: its CPU variant serves the role). Both NULL: the
 * registry's best CUDA op, as for khub_model_load. Borrowed for the load.
 * A block-format projection (a qlinear op) takes the quantization role's
 * entries when they are set, else the linear role's, as its CPU binding
 * takes the plugins. */
typedef struct khub__device_prefs {
    const char *impl[KHUB_KERNEL_ROLE__COUNT];
    const char *cpu_why[KHUB_KERNEL_ROLE__COUNT];
} khub__device_prefs;

/* khub_model_load with dev (may be NULL) for a placed model's roles. */
KHUB_INTERNAL khub_status khub__model_load_placed(khub_runtime *rt, const char *path,
                                                  const khub_model_opts *opts,
                                                  const khub__device_prefs *dev, khub_model **out);

/* The decode step as a CUDA graph (forward_graph.c). */
typedef struct khub__graph {
    bool on;        /* decode steps are captured (every role on the device, ...) */
    char why[320];  /* when off: why (--explain), or what turned them off */
    void *exec;     /* CUgraphExec of the last decode step (owned), NULL = none */
    int32_t n_segs; /* the batch shape exec was made for: sequences of one token */
    /* What happened, for tests and logs: decode steps captured, graphs
     * instantiated, updated in place, launched; 1 once a failure turned
     * graphs off. */
    uint64_t captures, instantiations, updates, launches, fallbacks;
} khub__graph;

typedef struct khub__place {
    int32_t device;                        /* CUDA ordinal */
    int32_t driver;                        /* driver version, e.g. 12080 */
    int32_t cc;                            /* compute capability x10 */
    khub_binding *cuda[KHUB__ROLE__COUNT]; /* the role's CUDA op, NULL = CPU (runtime-owned) */
    bool used[KHUB__ROLE__COUNT];          /* the model calls the role in its forward pass */
    void *stream;                          /* the model's CUstream (owned) */
    uint64_t weights_dptr, kv_dptr, scratch_dptr;   /* device blocks (owned), 0 = none */
    uint64_t weight_bytes, kv_bytes, scratch_bytes; /* planned device bytes per part */
    uint64_t host_weight_bytes;                     /* weights of CPU roles, left in host memory */
    uint64_t op_bytes; /* what the CUDA ops keep for the model's stream (caps.stream_bytes) */
    uint64_t free_bytes, total_bytes; /* the device's memory before this load's blocks */
    int32_t n_cuda, n_cpu;            /* roles on each side */
    char *text;                       /* owned: khub_model_explain's placement section */
    khub_binding *cuda_of[64]; /* per m->bound[i]: its CUDA op when the role is on the device */
    uint64_t dbuf[14];         /* device twins of the host scratch (forward_device.c) */
    const khub_kv_cache_methods *dkv; /* the device cache's methods, or NULL */
    void *dkv_state;
    khub_kv_cache *dcache; /* the KV cache in device memory (owned), NULL = the host's */
    uint16_t dkv_minor;    /* ABI minor of the device cache's plugin */
    khub__graph graph;
    /* A paged device cache: blocks each sequence holds (owned, [max_seqs];
     * counted as reserve takes them: its block table is device memory) and
     * the pool's block size. */
    int32_t *dheld;
    int32_t dblock;
} khub__place;

/* Makes m's placement for opts.device (a CUDA device; the CPU needs none):
 * the driver and the device, the plan, the memory check, the allocations
 * and the weight upload. strict: a role without a CUDA op is an error.
 * dev (may be NULL): the roles' device preferences and CPU pins.
 * Statuses (each message names the device): NO_CUDA (no driver, or no GPU
 * on it), INVALID_ARG (no such ordinal), NO_KERNEL (strict, naming the
 * role), NOMEM (does not fit: each part, the sum and the free bytes),
 * CUDA (a driver call failed), UNSUPPORTED (tensor parallelism). */
KHUB_INTERNAL khub_status khub__place_model(khub_model *m, khub_device device, bool strict,
                                            const khub__device_prefs *dev);
/* Frees the device blocks and the stream (waiting for it first). */
KHUB_INTERNAL void khub__place_free(khub_model *m);

/* ---- device_kv.c --------------------------------------------------------- */

/* After the device cache's create: a paged cache's methods, layout and pool
 * (PLUGIN_INVALID naming what is wrong); the budget follows its pool. */
KHUB_INTERNAL khub_status khub__device_pool_init(khub_model *m);
/* The device cache's truncate (no-op when the cache is the host's); a
 * paged cache's truncate to 0 releases the sequence's blocks. */
KHUB_INTERNAL khub_status khub__forward_device_truncate(khub_model *m, int32_t seq, int64_t n);
/* Whether m's KV cache is a paged pool in device memory. */
KHUB_INTERNAL bool khub__forward_device_paged(const khub_model *m);
/* The paged device cache's reserve (KV_FULL or CONTEXT_FULL, named, when
 * the pool or the sequence is too small; then nothing is taken). */
KHUB_INTERNAL khub_status khub__forward_device_reserve(khub_model *m, int32_t seq, int64_t n);
/* The paged device pool's free blocks, block size and the blocks seq holds
 * (0 for seq < 0); false when m's cache is not a paged device pool. */
KHUB_INTERNAL bool khub__forward_device_pool(const khub_model *m, int32_t seq, int64_t *n_free,
                                             int64_t *bs, int64_t *held);

/* ---- forward_device.c ---------------------------------------------------- */

/* After the device blocks exist: lays the device twins of the scratch out
 * and, when the kv_cache role is on the device, creates the device cache
 * through its CUDA op (statuses and messages of its create). */
KHUB_INTERNAL khub_status khub__forward_device_init(khub_model *m);
/* Destroys the device cache (before the blocks and stream go). */
KHUB_INTERNAL void khub__forward_device_free(khub_model *m);
/* The forward pass of khub__forward for a placed model, after plan(): the
 * token ids (n in n_segs segments) go to the device and the embedding op
 * looks them up there when the embedding role is on the device; else the
 * rows the host looked up into m->x go up (forward.c). */
KHUB_INTERNAL khub_status khub__forward_device(khub_model *m, const int32_t *tokens,
                                               const khub__seg *segs, int n_segs, int64_t n);
/* The device cache's truncate (no-op when the cache is the host's). */
KHUB_INTERNAL khub_status khub__forward_device_truncate(khub_model *m, int32_t seq, int64_t n);
/* Every op call of one step on the model's stream, the inputs uploaded:
 * the layers, the final norm, the last rows gathered and lm_head (what a
 * CUDA graph of the step holds). The logits stay on the device. */
KHUB_INTERNAL khub_status khub__forward_device_body(khub_model *m, const khub__seg *segs,
                                                    int n_segs, int64_t n);

/* ---- forward_graph.c ------------------------------------------------------ */

/* At placement, after the device cache exists: whether decode steps run as
 * CUDA graphs, and if not why (pl->graph.on / why). Off with
 * KHUB_CUDA_GRAPHS=0, with a role on the CPU (its copies synchronise the
 * stream mid-step), with a device cache of a plugin older than ABI 1.5 (it
 * writes on the legacy stream), with a paged device cache, or with a
 * driver without graphs. */
KHUB_INTERNAL void khub__graph_plan(khub_model *m);
/* --explain's words for it: "yes (...)" or "no (why)". */
KHUB_INTERNAL void khub__graph_explain(const khub_model *m, char *buf, size_t n);
/* Runs the step as a graph when it is a decode step (one token per
 * sequence) and graphs are on: captures the body, updates the executable
 * graph made for this batch shape in place (or instantiates one: first
 * step, new shape, or an update the driver refuses), launches it; *ran
 * says whether it did. A failed capture, update or instantiation turns
 * graphs off for the model with one warning and leaves *ran false (the
 * caller runs the step with plain launches); only a failed graph launch is
 * an error (CUDA, named). */
KHUB_INTERNAL khub_status khub__graph_step(khub_model *m, const khub__seg *segs, int n_segs,
                                           int64_t n, bool *ran);
/* Destroys the executable graph. */
KHUB_INTERNAL void khub__graph_free(khub_model *m);

#endif /* KHUB_RUNTIME_PLACEMENT_H */
