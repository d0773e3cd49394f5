/*
 * good.c: a well-behaved test plugin, built in several versions
 * (TP_VERSION / TP_VNUM). Ops:
 *   stamp (norm):      writes TP_VNUM into tp_stamp_args.out[0..7]
 *   fail_op (activation): fails through host->fail
 *   host (rotary):     exercises the host table (tp_host_args)
 * With TP_NO_STAMP the stamp op is left out (a reload that must fail); with
 * TP_STAMP_LAST it is listed last instead of first (a reload must follow
 * the op by name, not by index).
 */
#include <khub/khub_plugin.h>

#include "tp_args.h"

#ifndef TP_VERSION
#define TP_VERSION "1.0.0"
#define TP_VNUM    1
#endif

typedef struct tp_state {
    const khub_host_api *host;
    int32_t vnum;
} tp_state;

#ifndef TP_NO_STAMP
static khub_status stamp(void *state, const void *args)
{
    const tp_state *s = state;
    tp_stamp_args *a = (tp_stamp_args *)(uintptr_t)args;
    for (int i = 0; i < 8; i++) {
        a->out[i] = s->vnum;
        for (volatile int spin = 0; spin < 50; spin++) {
        }
    }
    return KHUB_STATUS_OK;
}
#endif

static khub_status fail_op(void *state, const void *args)
{
    const tp_state *s = state;
    (void)args;
    return s->host->fail(s->host->host_ctx, KHUB_STATUS_INVALID_ARG,
                         "widget %d rejected by fail_op", 7);
}

static void mark(void *ud, int64_t begin, int64_t end, int thread)
{
    unsigned char *marks = ud;
    (void)thread;
    for (int64_t i = begin; i < end; i++) marks[i] = 1;
}

static khub_status host_op(void *state, const void *args)
{
    const tp_state *s = state;
    const khub_host_api *h = s->host;
    tp_host_args *a = (tp_host_args *)(uintptr_t)args;
    h->parallel_for(h->host_ctx, a->n, mark, a->marks);
    a->n_threads = h->n_threads(h->host_ctx);
    a->cpu_features = h->cpu_features(h->host_ctx);
    void *p = h->alloc(h->host_ctx, 100);
    a->aligned = p && ((uintptr_t)p % 64) == 0;
    h->free(h->host_ctx, p);
    const void *data = NULL;
    size_t size = 0;
    a->artifact_st = h->artifact(h->host_ctx, "kernel.ptx", &data, &size);
    a->cuda_st = h->cuda_device_count(h->host_ctx, &a->cuda_count);
    h->log(h->host_ctx, KHUB_LOG_WARN, "host op ran on %d threads", (int)a->n_threads);
    return KHUB_STATUS_OK;
}

static const khub_op_caps cpu_caps = {KHUB_STRUCT_INIT(khub_op_caps),
                                      .device_type = KHUB_DEVICE_CPU,
                                      .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32)};

#define TP_STAMP_OP \
    { \
        KHUB_STRUCT_INIT(khub_op_desc), .name = "stamp", .kind = KHUB_OP_NORM, .caps = &cpu_caps, \
                                        .run = stamp \
    }

static const khub_op_desc ops[] = {
#if !defined(TP_NO_STAMP) && !defined(TP_STAMP_LAST)
    TP_STAMP_OP,
#endif
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "fail_op", .kind = KHUB_OP_ACTIVATION,
     .caps = &cpu_caps, .run = fail_op},
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "host", .kind = KHUB_OP_ROTARY, .caps = &cpu_caps,
     .run = host_op},
#if defined(TP_STAMP_LAST)
    TP_STAMP_OP,
#endif
};

static int32_t score(void *state)
{
    (void)state;
    return 1;
}

static khub_status selftest(void *state, char *errbuf, size_t errbuf_size)
{
    (void)errbuf, (void)errbuf_size;
#ifndef TP_NO_STAMP
    tp_stamp_args a = {{0}};
    return stamp(state, &a);
#else
    (void)state;
    return KHUB_STATUS_OK;
#endif
}

static void shutdown_fn(void *state)
{
    tp_state *s = state;
    s->host->free(s->host->host_ctx, s);
}

static khub_status init(const khub_host_api *host, khub_plugin_desc *out, char *errbuf,
                        size_t errbuf_size)
{
    tp_state *s = host->alloc(host->host_ctx, sizeof *s);
    if (!s) {
        if (errbuf && errbuf_size) errbuf[0] = '\0';
        return KHUB_STATUS_NOMEM;
    }
    s->host = host;
    s->vnum = TP_VNUM;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),
                          .id = "khub-test/good",
                          .version = TP_VERSION,
                          .n_ops = sizeof ops / sizeof ops[0],
                          .ops = ops,
                          .state = s,
                          .score = score,
                          .selftest = selftest,
                          .shutdown = shutdown_fn};
    return khub_plugin_desc_put(out, &d);
}

/* The note's kinds are the registered ops' kinds (the loader checks it):
 * without the stamp op there is no norm op. */
#ifdef TP_NO_STAMP
#define TP_KINDS (KHUB_KIND_BIT(KHUB_OP_ACTIVATION) | KHUB_KIND_BIT(KHUB_OP_ROTARY))
#else
#define TP_KINDS \
    (KHUB_KIND_BIT(KHUB_OP_NORM) | KHUB_KIND_BIT(KHUB_OP_ACTIVATION) | \
     KHUB_KIND_BIT(KHUB_OP_ROTARY))
#endif
KHUB_PLUGIN_DEFINE_KINDS(init, "khub-test/good", TP_VERSION, TP_KINDS)
