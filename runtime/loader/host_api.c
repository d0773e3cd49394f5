/*
 * host_api.c: the khub_host_api table plugins receive at init.
 *
 * Each plugin gets its own copy whose host_ctx names the runtime and the
 * plugin (khub__host_ctx), so a log line can carry the plugin id and CUDA
 * modules can be charged to the plugin that loaded them. The runtime has one
 * more table (khub__runtime_host) for code that runs ops outside a plugin.
 *
 * host->fail does not write rt's message directly: a failing op runs on the
 * caller's thread, and first-error-wins would let a stale message survive.
 * The text goes to a thread-local buffer instead, and khub_binding_call (or
 * the loader, for init and selftest) turns it into the runtime's message
 * when the plugin returns its status.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cuda.h"
#include "cuda_jit.h"
#include "plugin_artifacts.h"
#include "runtime_impl.h"

struct khub__runtime_host {
    khub__host_ctx ctx;
    khub_host_api table;
};

static _Thread_local char tls_plugin_msg[KHUB_ERROR_SIZE];

const char *khub__plugin_msg(void) { return tls_plugin_msg; }
void khub__plugin_msg_clear(void) { tls_plugin_msg[0] = '\0'; }

static const char *ctx_name(const khub__host_ctx *c)
{
    return c->plugin && c->plugin->id ? c->plugin->id : "host";
}

/* ======================================================================== */
/* The functions                                                            */
/* ======================================================================== */

static void host_log(void *host_ctx, khub_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void host_log(void *host_ctx, khub_log_level level, const char *fmt, ...)
{
    const khub__host_ctx *c = host_ctx;
    if (!c || !fmt) return;
    if ((int)level < KHUB_LOG_ERROR || (int)level > KHUB_LOG_DEBUG) level = KHUB_LOG_ERROR;
    char msg[KHUB_ERROR_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    khub__log(c->rt, level, "%s: %s", ctx_name(c), msg);
}

khub_status khub__plugin_fail(khub_status st, const char *fmt, ...)
{
    if (!fmt) return st;
    char msg[KHUB_ERROR_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    khub__errbuf(tls_plugin_msg, sizeof tls_plugin_msg, "%s", msg);
    return st;
}

static khub_status host_fail(void *host_ctx, khub_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static khub_status host_fail(void *host_ctx, khub_status st, const char *fmt, ...)
{
    (void)host_ctx;
    if (!fmt) return st;
    char msg[KHUB_ERROR_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return khub__plugin_fail(st, "%s", msg);
}

static void *host_alloc(void *host_ctx, size_t size)
{
    const khub__host_ctx *c = host_ctx;
    return khub__aligned_alloc(c->rt, size);
}

static void host_free(void *host_ctx, void *p)
{
    const khub__host_ctx *c = host_ctx;
    khub__aligned_free(c->rt, p);
}

static void host_parallel_for(void *host_ctx, int64_t n, khub_range_fn fn, void *ud)
{
    const khub__host_ctx *c = host_ctx;
    if (!fn || n <= 0) return;
    khub__pool_for(khub__runtime_pool(c->rt), n, fn, ud);
}

static int host_n_threads(void *host_ctx)
{
    const khub__host_ctx *c = host_ctx;
    return khub__pool_size(khub__runtime_pool(c->rt));
}

static uint32_t host_cpu_features(void *host_ctx)
{
    const khub__host_ctx *c = host_ctx;
    return c->rt->cpu_features;
}

/* Artifacts need a variant directory, which only the hub's loader path
 * supplies (khub__plugin_load_verified); plugins loaded from a bare file
 * have none. */
static khub_status host_artifact(void *host_ctx, const char *name, const void **data, size_t *size)
{
    const khub__host_ctx *c = host_ctx;
    if (data) *data = NULL;
    if (size) *size = 0;
    if (c && c->plugin && c->plugin->artifacts) {
        char msg[KHUB_ERROR_SIZE];
        khub_status st =
            khub__artifacts_get(c->rt, c->plugin->artifacts, name, data, size, msg, sizeof msg);
        if (st == KHUB_STATUS_OK) return st;
        return host_fail(host_ctx, st, "%s: %s", ctx_name(c), msg);
    }
    return host_fail(host_ctx, KHUB_STATUS_NOT_FOUND,
                     "artifact %s: %s was loaded without an artifact directory",
                     name ? name : "(null)", ctx_name(c));
}

/* ======================================================================== */
/* Tables                                                                   */
/* ======================================================================== */

void khub__host_api_fill(khub_runtime *rt, khub_plugin *p, khub__host_ctx *ctx, khub_host_api *t)
{
    ctx->rt = rt;
    ctx->plugin = p;
    *t = (khub_host_api){
        KHUB_STRUCT_INIT(khub_host_api),
        .host_ctx = ctx,
        .log = host_log,
        .fail = host_fail,
        .alloc = host_alloc,
        .free = host_free,
        .parallel_for = host_parallel_for,
        .n_threads = host_n_threads,
        .cpu_features = host_cpu_features,
        .cuda_device_count = khub__cuda_host_device_count,
        .cuda_device_cc = khub__cuda_host_device_cc,
        .cuda_mem_alloc = khub__cuda_host_mem_alloc,
        .cuda_mem_free = khub__cuda_host_mem_free,
        .cuda_memcpy_htod = khub__cuda_host_memcpy_htod,
        .cuda_memcpy_dtoh = khub__cuda_host_memcpy_dtoh,
        .cuda_stream_sync = khub__cuda_host_stream_sync,
        .cuda_module_load = khub__cuda_host_module_load,
        .cuda_module_function = khub__cuda_host_module_function,
        .cuda_launch = khub__cuda_host_launch,
        .cuda_stream_create = khub__cuda_host_stream_create,
        .cuda_stream_destroy = khub__cuda_host_stream_destroy,
        .artifact = host_artifact,
        .comm_info = khub__host_comm_info,
        .comm_all_reduce_sum = khub__host_comm_all_reduce_sum,
        .comm_all_gather = khub__host_comm_all_gather,
        .cuda_module_compile = khub__cuda_host_module_compile,
    };
}

const khub_host_api *khub__runtime_host(khub_runtime *rt)
{
    if (!rt) return NULL;
    pthread_mutex_lock(&rt->err_lock);
    if (!rt->host_table) {
        struct khub__runtime_host *h = khub__calloc(rt, 1, sizeof *h);
        if (h) khub__host_api_fill(rt, NULL, &h->ctx, &h->table);
        rt->host_table = h;
    }
    pthread_mutex_unlock(&rt->err_lock);
    return rt->host_table ? &rt->host_table->table : NULL;
}

void khub__runtime_host_free(khub_runtime *rt)
{
    if (rt && rt->host_table) khub__free(rt, rt->host_table, sizeof *rt->host_table);
    if (rt) rt->host_table = NULL;
}
