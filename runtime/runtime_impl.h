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
    int log_level;      /* khub_log_level threshold */

    /* Options. */
    int strict;
    int allow_unverified;

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

    /* CUDA driver, opened lazily by runtime/cuda.c (NULL = not tried). */
    struct khub__cuda *cuda;
    pthread_once_t cuda_once;

    /* khub_runtime_features storage. */
    khub_feature features[KHUB__MAX_FEATURES];
    char feature_values[KHUB__MAX_FEATURES][24];
    size_t n_features;
};

#endif /* KHUB_RUNTIME_IMPL_H */
