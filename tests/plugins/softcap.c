/*
 * softcap.c: an attention op that reports what the host sent it (ABI 1.5
 * soft-capping), built twice:
 *   TARGET_MINOR 4  khub-test/softcap-1-4: its caps set kind_flags bit 8 by
 *                   number (1.4 has no KHUB_ATTN_SOFTCAP), which the host must
 *                   not believe, and it must be sent 1.4's 80-byte args;
 *   TARGET_MINOR 5  khub-test/softcap-1-5: declares KHUB_ATTN_SOFTCAP and is
 *                   sent the 88-byte args with softcap.
 * run writes into out's first floats: struct_size, abi_minor and, when the
 * args it got have it, softcap (else -1).
 */
#include <khub/khub_plugin.h>

static khub_status run(void *state, const void *args)
{
    (void)state;
    const khub_attention_args *a = args;
    float *o = a->out->data;
    o[0] = (float)a->struct_size;
    o[1] = (float)a->abi_minor;
    o[2] = -1.0f;
#if KHUB_PLUGIN_TARGET_MINOR >= 5
    if (KHUB_HAS_FIELD(a, khub_attention_args, softcap)) o[2] = a->softcap;
#endif
    return KHUB_STATUS_OK;
}

static const khub_op_caps caps = {
    KHUB_STRUCT_INIT(khub_op_caps), .device_type = KHUB_DEVICE_CPU,
    .flags = KHUB_CAP_CAUSAL | KHUB_CAP_GQA | KHUB_CAP_STRIDED_KV | KHUB_CAP_SLIDING,
    .kind_flags = UINT64_C(1) << 8 /* KHUB_ATTN_SOFTCAP in 1.5; nothing in 1.4 */};

static const khub_op_desc ops[] = {{KHUB_STRUCT_INIT(khub_op_desc), .name = "attn",
                                    .kind = KHUB_OP_ATTENTION, .caps = &caps, .run = run}};

static khub_status init(const khub_host_api *host, khub_plugin_desc *out, char *errbuf,
                        size_t errbuf_size)
{
    (void)host, (void)errbuf, (void)errbuf_size;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc), .id = TP_ID, .version = "1.0.0",
                          .n_ops = 1, .ops = ops};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE(init, TP_ID, "1.0.0")
