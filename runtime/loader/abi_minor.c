/*
 * abi_minor.c: what each minor of the plugin ABI contains, so that the host
 * sends a plugin only what its minor declares and reads from it only what
 * its minor defines (ONNX Runtime's ort_version_supported rule).
 *
 * A plugin stamped 1.N was compiled with a header that declared only 1.N's
 * fields (KHUB_PLUGIN_TARGET_MINOR), whatever header it came from. The
 * host therefore
 *   - hands it a khub_host_api whose struct_size ends at 1.N's last entry,
 *     so a plugin that copies the table by struct_size never overruns its
 *     own copy, and stamps the table 1.N;
 *   - gives it a khub_plugin_desc to fill whose struct_size is 1.N's;
 *   - reads a field of the plugin's structs only when the field is 1.N's
 *     (as well as within the struct's struct_size): bytes past 1.N's end
 *     are, to that plugin, padding or a field it never set.
 * Each boundary struct that grows gets a function here that gives its size
 * at a minor; tests/test_negotiation.c pins the values.
 */
#include <string.h>

#include "runtime_impl.h"

/* The end of field f of struct T: the size of T up to and including f. */
#define END_OF(T, f) (offsetof(T, f) + sizeof(((T *)0)->f))

size_t khub__host_api_size(unsigned minor)
{
    if (minor >= 5) return sizeof(khub_host_api); /* 1.5: comm_*, cuda_module_compile */
    if (minor >= 2) return END_OF(khub_host_api, cuda_stream_destroy); /* 1.2-1.4 */
    return END_OF(khub_host_api, artifact);                            /* 1.0, 1.1 */
}

size_t khub__op_caps_size(unsigned minor)
{
    if (minor >= 5) return sizeof(khub_op_caps);             /* 1.5: stream_bytes */
    if (minor >= 4) return END_OF(khub_op_caps, kv_layouts); /* 1.4: kv_layouts */
    if (minor >= 3) return END_OF(khub_op_caps, act_dtypes); /* 1.3: kind_flags, act_dtypes */
    return END_OF(khub_op_caps, reserved2);                  /* 1.0-1.2 */
}

/* The argument structs the host fills for a call: stamped with the size of
 * the op's plugin's minor, so a 1.4 attention op is never sent softcap. */
size_t khub__attention_args_size(unsigned minor)
{
    if (minor >= 5) return sizeof(khub_attention_args); /* 1.5: softcap */
    return END_OF(khub_attention_args, window);         /* 1.0-1.4 */
}

size_t khub__paged_attention_args_size(unsigned minor)
{
    if (minor >= 5) return sizeof(khub_paged_attention_args); /* 1.5: softcap */
    return END_OF(khub_paged_attention_args, window);         /* 1.4 */
}

size_t khub__kv_write_args_size(unsigned minor)
{
    if (minor >= 5) return sizeof(khub_kv_write_args); /* 1.5: ctx */
    return END_OF(khub_kv_write_args, v);              /* 1.0-1.4 */
}

const void *khub__args_for_minor(uint32_t kind, unsigned minor, const void *args,
                                 khub__args_buf *buf)
{
    size_t n = kind == KHUB_OP_ATTENTION         ? khub__attention_args_size(minor)
               : kind == KHUB_OP_PAGED_ATTENTION ? khub__paged_attention_args_size(minor)
               : kind == KHUB_OP_KV_CACHE        ? khub__kv_write_args_size(minor)
                                                 : 0;
    const uint32_t *size = args; /* every args struct starts with struct_size */
    if (!n || !args || *size <= n || n > sizeof *buf) return args;
    memset(buf, 0, sizeof *buf);
    memcpy(buf, args, n);
    buf->attn.struct_size = (uint32_t)n;
    buf->attn.abi_minor = (uint16_t)minor;
    return buf;
}

/* Kinds are gated like fields: kind 8 (paged_attention) is 1.4's and kind
 * 9 (embedding) 1.5's, so a plugin of an older minor that sets such a
 * number set a number its header never declared; its op is skipped as an
 * unknown kind would be. */
uint32_t khub__op_kind_max(unsigned minor)
{
    if (minor >= 5) return KHUB_OP_EMBEDDING;       /* 1.5: embedding */
    if (minor >= 4) return KHUB_OP_PAGED_ATTENTION; /* 1.4: paged_attention */
    return KHUB_OP_ROTARY;                          /* 1.0-1.3 */
}

/* The flags of kind_flags a plugin of this minor can mean. Bits 8 and up
 * of every kind were first defined in 1.5 (KHUB_ATTN_SOFTCAP), so a 1.0-1.4
 * plugin has only bits 0-7 (the 1.0 word's); a bit above that is, to it, a
 * bit it never defined, and is not believed. A 1.5 plugin keeps every bit
 * (one this host does not name simply matches no query). */
uint64_t khub__kind_flags_known(uint32_t kind, unsigned minor)
{
    (void)kind; /* per kind when a later minor gives one kind bits before another */
    return minor >= 5 ? ~UINT64_C(0) : UINT64_C(0xff);
}

size_t khub__plugin_desc_size(unsigned minor)
{
    if (minor >= 5) return sizeof(khub_plugin_desc); /* 1.5: stream_end */
    return END_OF(khub_plugin_desc, shutdown);       /* 1.0-1.4 */
}
