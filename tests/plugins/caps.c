/*
 * caps.c: per-kind capability flags and activation dtypes (ABI 1.3).
 *   CAPS_NOW       built for this header: op "attn" declares causal and gqa
 *                  only in kind_flags (the 1.0 word is 0) and activation
 *                  dtypes f32 and bf16; op "norm" declares residual in the
 *                  1.0 word and kind_flags bit 8 (a norm flag no host names).
 *   CAPS_OLD_WIDE  stamped 1.2 (TARGET_MINOR 2), but each caps struct carries
 *                  16 more bytes laid out as 1.3's kind_flags and act_dtypes,
 *                  all set: a 1.2 plugin cannot mean them, so the host must
 *                  not read them although struct_size covers them.
 */
#include <khub/khub_plugin.h>

static khub_status run(void *state, const void *args)
{
    (void)state, (void)args;
    return KHUB_STATUS_OK;
}

#if defined(CAPS_NOW)
#define TP_ID "khub-test/caps-now"
static const khub_op_caps attn_caps = {
    KHUB_STRUCT_INIT(khub_op_caps), .device_type = KHUB_DEVICE_CPU,
    .kind_flags = KHUB_ATTN_CAUSAL | KHUB_ATTN_GQA,
    .act_dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32) | KHUB_DTYPE_BIT(KHUB_DTYPE_ID_BF16)};
static const khub_op_caps norm_caps = {KHUB_STRUCT_INIT(khub_op_caps),
                                       .device_type = KHUB_DEVICE_CPU, .flags = KHUB_CAP_RESIDUAL,
                                       .kind_flags = UINT64_C(1) << 8};
#define ATTN_CAPS (&attn_caps)
#define NORM_CAPS (&norm_caps)
#elif defined(CAPS_OLD_WIDE)
#define TP_ID     "khub-test/caps-old"
_Static_assert(sizeof(khub_op_caps) == 56, "a 1.2 target has no 1.3 caps fields");
typedef struct wide_caps {
    khub_op_caps base;
    uint64_t as_if_kind_flags;
    uint64_t as_if_act_dtypes;
} wide_caps;
static const wide_caps attn_caps = {{.struct_size = sizeof(wide_caps),
                                     .abi_major = KHUB_ABI_MAJOR,
                                     .abi_minor = KHUB_PLUGIN_TARGET_MINOR,
                                     .device_type = KHUB_DEVICE_CPU,
                                     .flags = KHUB_CAP_CAUSAL},
                                    ~UINT64_C(0),
                                    ~UINT64_C(0)};
static const wide_caps norm_caps = {{.struct_size = sizeof(wide_caps),
                                     .abi_major = KHUB_ABI_MAJOR,
                                     .abi_minor = KHUB_PLUGIN_TARGET_MINOR,
                                     .device_type = KHUB_DEVICE_CPU},
                                    ~UINT64_C(0),
                                    ~UINT64_C(0)};
#define ATTN_CAPS (&attn_caps.base)
#define NORM_CAPS (&norm_caps.base)
#endif

static const khub_op_desc ops[] = {{KHUB_STRUCT_INIT(khub_op_desc), .name = "attn",
                                    .kind = KHUB_OP_ATTENTION, .caps = ATTN_CAPS, .run = run},
                                   {KHUB_STRUCT_INIT(khub_op_desc), .name = "norm",
                                    .kind = KHUB_OP_NORM, .caps = NORM_CAPS, .run = run}};

static khub_status init(const khub_host_api *host, khub_plugin_desc *out, char *errbuf,
                        size_t errbuf_size)
{
    (void)host, (void)errbuf, (void)errbuf_size;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc), .id = TP_ID, .version = "1.0.0",
                          .n_ops = 2, .ops = ops};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE(init, TP_ID, "1.0.0")
