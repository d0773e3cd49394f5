/*
 * bad.c: broken test plugins, one per negotiation rule. Exactly one BAD_*
 * macro selects what is wrong (tests/plugins/CMakeLists.txt builds each):
 *   BAD_SMALL_DESC  descriptor struct_size below the 1.0 minimum
 *   BAD_INIT_FAILS  init returns an error with a message
 *   BAD_INIT_CRASH  init raises SIGSEGV
 *   BAD_DUP_OPS     two ops with one name
 *   BAD_NULL_ID     descriptor id NULL
 *   BAD_ID_MISMATCH descriptor id differs from the note's
 *   BAD_NULL_OPS    n_ops 2 with ops NULL
 *   BAD_KIND        not broken: op 1 has kind 99, unknown to the host, which
 *                   skips it and loads op 0
 *   BAD_KIND_ZERO   an op of kind 0 (no kind)
 *   BAD_NO_CAPS     an op without caps
 *   BAD_NO_RUN      a norm op without run
 *   BAD_SMALL_OP    op struct_size below the 1.0 minimum
 *   BAD_DESC_ABI    descriptor claims ABI 1.9 (newer than the host)
 *   BAD_DESC_NOTE   descriptor claims ABI 1.0 while the note says 1.KHUB_ABI_MINOR
 *   BAD_SMALL_CAPS  an op whose caps struct_size is below the 1.0 minimum
 *   BAD_MIXED_OPS   op 1's struct_size differs from op 0's
 *   BAD_HUGE_STRIDE op struct_size (the stride of the op array) of 1 GiB
 *   BAD_HUGE_CAPS   an op whose caps struct_size is 1 GiB
 *   WIDE_OPS        not broken: ops from a "newer minor" with larger
 *                   structs, which the host must walk by struct_size
 */
#include <signal.h>
#include <string.h>

#include <khub/khub_plugin.h>

#include "tp_args.h"

static khub_status run(void *state, const void *args)
{
    (void)state;
    tp_stamp_args *a = (tp_stamp_args *)(uintptr_t)args;
    a->out[0] = 42;
    return KHUB_STATUS_OK;
}

static const khub_op_caps caps = {KHUB_STRUCT_INIT(khub_op_caps), .device_type = KHUB_DEVICE_CPU};

#if defined(WIDE_OPS)
typedef struct wide_op {
    khub_op_desc base;
    uint64_t added_in_a_newer_minor[3];
} wide_op;
#define OP(n, k) \
    { \
        {.struct_size = sizeof(wide_op), \
         .abi_major = KHUB_ABI_MAJOR, \
         .abi_minor = KHUB_ABI_MINOR, \
         .name = n, \
         .kind = k, \
         .caps = &caps, \
         .run = run}, \
        { \
            1, 2, 3 \
        } \
    }
static const wide_op ops[] = {OP("first", KHUB_OP_NORM), OP("second", KHUB_OP_ACTIVATION)};
#else
#define OP(n, k) \
    { \
        KHUB_STRUCT_INIT(khub_op_desc), .name = n, .kind = k, .caps = &caps, .run = run \
    }
static khub_op_desc ops[] = {OP("first", KHUB_OP_NORM), OP("second", KHUB_OP_ACTIVATION)};
#endif

static khub_status init(const khub_host_api *host, khub_plugin_desc *out, char *errbuf,
                        size_t errbuf_size)
{
    (void)host;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc), .id = "khub-test/bad",
                          .version = "1.0.0", .n_ops = 2, .ops = (const khub_op_desc *)ops};
#if defined(BAD_INIT_FAILS)
    strncpy(errbuf, "cannot open the widget table", errbuf_size - 1);
    return KHUB_STATUS_IO;
#elif defined(BAD_INIT_CRASH)
    raise(SIGSEGV);
#elif defined(BAD_DUP_OPS)
    ops[1].name = "first";
#elif defined(BAD_NULL_ID)
    d.id = NULL;
#elif defined(BAD_ID_MISMATCH)
    d.id = "khub-test/other";
#elif defined(BAD_NULL_OPS)
    d.ops = NULL;
#elif defined(BAD_KIND)
    ops[1].kind = 99;
#elif defined(BAD_KIND_ZERO)
    ops[1].kind = 0;
#elif defined(BAD_NO_CAPS)
    ops[1].caps = NULL;
#elif defined(BAD_NO_RUN)
    ops[0].run = NULL;
#elif defined(BAD_SMALL_OP)
    ops[0].struct_size = 16;
    ops[1].struct_size = 16;
#elif defined(BAD_SMALL_CAPS)
    static const khub_op_caps small_caps = {.struct_size = 8, .abi_major = KHUB_ABI_MAJOR};
    ops[0].caps = &small_caps;
#elif defined(BAD_MIXED_OPS)
    ops[1].struct_size = sizeof(khub_op_desc) + 8;
#elif defined(BAD_HUGE_STRIDE)
    ops[0].struct_size = 1u << 30;
    ops[1].struct_size = 1u << 30;
#elif defined(BAD_HUGE_CAPS)
    static const khub_op_caps huge_caps = {.struct_size = 1u << 30, .abi_major = KHUB_ABI_MAJOR};
    ops[1].caps = &huge_caps;
#endif
    (void)errbuf, (void)errbuf_size;
    khub_status st = khub_plugin_desc_put(out, &d);
#if defined(BAD_SMALL_DESC)
    out->struct_size = 16;
#elif defined(BAD_DESC_ABI)
    out->abi_minor = 9;
#elif defined(BAD_DESC_NOTE)
    out->abi_minor = 0;
#endif
    return st;
}

KHUB_PLUGIN_DEFINE(init, "khub-test/bad", "1.0.0")
