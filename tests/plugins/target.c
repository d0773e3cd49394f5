/*
 * target.c: a plugin built with today's header for an older ABI minor
 * (KHUB_PLUGIN_TARGET_MINOR, set by khub_add_plugin's TARGET_MINOR; unset,
 * it targets this header's minor). Its op "probe" reports what it saw: the
 * host table's and the descriptor's struct_size and minor at init, and what
 * the header declared for it. The static asserts are the compile-time half:
 * an older target does not see what its hosts lack. Its op "kind9" sets kind 9
 * as a number (embedding, which only 1.5 declares): a host loads it from a
 * 1.5 plugin and skips it from an older one.
 */
#include <khub/khub_plugin.h>

#include "tp_args.h"

#if KHUB_PLUGIN_TARGET_MINOR < 2
_Static_assert(sizeof(khub_host_api) == 160, "a 1.0 or 1.1 target sees no 1.2 host entries");
#elif KHUB_PLUGIN_TARGET_MINOR < 5
_Static_assert(sizeof(khub_host_api) == 176, "a 1.2-1.4 target sees no 1.5 host entries");
#endif
#if KHUB_PLUGIN_TARGET_MINOR < 1
_Static_assert(KHUB_QFORMAT__COUNT == 8, "a 1.0 target sees no 1.1 quant formats");
#endif
#if KHUB_PLUGIN_TARGET_MINOR == 4
_Static_assert(KHUB_OP_KIND__COUNT == 9, "a 1.4 target sees no 1.5 embedding kind");
#elif KHUB_PLUGIN_TARGET_MINOR < 4
_Static_assert(KHUB_OP_KIND__COUNT == 8, "a 1.0-1.3 target sees no 1.4 paged_attention kind");
#endif

static tp_target_args seen;

static khub_status probe(void *state, const void *args)
{
    (void)state;
    *(tp_target_args *)(uintptr_t)args = seen;
    return KHUB_STATUS_OK;
}

static const khub_op_caps caps = {KHUB_STRUCT_INIT(khub_op_caps), .device_type = KHUB_DEVICE_CPU};
static const khub_op_desc ops[] = {
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "probe", .kind = KHUB_OP_NORM, .caps = &caps,
     .run = probe},
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "kind9", .kind = 9, .caps = &caps, .run = probe}};

static khub_status init(const khub_host_api *host, khub_plugin_desc *out, char *errbuf,
                        size_t errbuf_size)
{
    (void)errbuf, (void)errbuf_size;
    seen = (tp_target_args){.host_size = host->struct_size,
                            .host_minor = host->abi_minor,
                            .desc_size = out->struct_size,
                            .own_host_size = (uint32_t)sizeof(khub_host_api),
                            .target_minor = KHUB_PLUGIN_TARGET_MINOR,
                            .qformat_count = KHUB_QFORMAT__COUNT};
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc), .id = TP_ID, .version = "1.0.0",
                          .n_ops = 2, .ops = ops};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE(init, TP_ID, "1.0.0")
