/*
 * misbehave.c: plugins that load cleanly and then misbehave inside an op
 * call, for the containment tests (test_contain.c). One MIS_* macro picks
 * what the op "norm_bad" (kind norm) does when called:
 *   MIS_SEGV       writes through a wild pointer (a real SIGSEGV)
 *   MIS_ABORT      calls abort()
 *   MIS_EXIT       calls exit(0) mid-call
 *   MIS_POOL_SEGV  faults in a host->parallel_for worker thread, not the caller
 * The op's args are never read.
 */
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>

#include <khub/khub_plugin.h>

static const khub_host_api *the_host;
static int *volatile wild = (int *)(uintptr_t)8; /* read at run time: a real fault */

#if defined(MIS_POOL_SEGV)
static void chunk(void *ud, int64_t begin, int64_t end, int thread)
{
    (void)ud, (void)begin, (void)end;
    if (thread != 0) *wild = 1;
}
#endif

static khub_status run(void *state, const void *args)
{
    (void)state, (void)args;
#if defined(MIS_SEGV)
    *wild = 1;
#elif defined(MIS_ABORT)
    abort();
#elif defined(MIS_EXIT)
    exit(0);
#elif defined(MIS_POOL_SEGV)
    the_host->parallel_for(the_host->host_ctx, 64, chunk, NULL);
#endif
    return KHUB_STATUS_OK;
}

static const khub_op_caps caps = {KHUB_STRUCT_INIT(khub_op_caps), .device_type = KHUB_DEVICE_CPU};
static const khub_op_desc ops[] = {{KHUB_STRUCT_INIT(khub_op_desc), .name = "norm_bad",
                                    .kind = KHUB_OP_NORM, .caps = &caps, .run = run}};

static khub_status init(const khub_host_api *h, khub_plugin_desc *out, char *errbuf,
                        size_t errbuf_size)
{
    (void)errbuf, (void)errbuf_size;
    the_host = h;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc), .id = "khub-test/misbehave",
                          .version = "1.0.0", .n_ops = 1, .ops = ops};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE(init, "khub-test/misbehave", "1.0.0")
