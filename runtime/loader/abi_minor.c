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
#include "runtime_impl.h"

/* The end of field f of struct T: the size of T up to and including f. */
#define END_OF(T, f) (offsetof(T, f) + sizeof(((T *)0)->f))

size_t khub__host_api_size(unsigned minor)
{
    if (minor >= 2) return sizeof(khub_host_api); /* 1.2: cuda_stream_create/destroy */
    return END_OF(khub_host_api, artifact);       /* 1.0, 1.1 */
}

size_t khub__op_caps_size(unsigned minor)
{
    if (minor >= 4) return sizeof(khub_op_caps);             /* 1.4: kv_layouts */
    if (minor >= 3) return END_OF(khub_op_caps, act_dtypes); /* 1.3: kind_flags, act_dtypes */
    return END_OF(khub_op_caps, reserved2);                  /* 1.0-1.2 */
}

size_t khub__plugin_desc_size(unsigned minor)
{
    (void)minor; /* unchanged since 1.0 */
    return sizeof(khub_plugin_desc);
}
