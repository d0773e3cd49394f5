/* test_negotiation.c: the numeric ABI rule, and every descriptor rule the
 * loader applies after init (each broken plugin: status and message). */
#include "plugins/tp_args.h"
#include "plugins/tp_util.h"
#include "elf_gate.h"
#include "runtime_impl.h"

/* ------------------------------------------------------------------------ */
/* The version rule, directly                                               */
/* ------------------------------------------------------------------------ */

static void rule(unsigned maj, unsigned min, unsigned ptr, unsigned hmaj, unsigned lo, unsigned hi,
                 khub_status want, const char *needle)
{
    char msg[160] = "";
    ASSERT_STATUS(khub__abi_check_range(maj, min, ptr, hmaj, lo, hi, 8, msg, sizeof msg), want);
    if (needle)
        ASSERT_STR_EQ(msg, needle);
    else
        ASSERT_STR_EQ(msg, "");
}

TEST_IMPL(abi_rule_exact_match) { rule(1, 0, 8, 1, 0, 0, KHUB_STATUS_OK, NULL); }

TEST_IMPL(abi_rule_major_differs)
{
    rule(2, 1, 8, 1, 0, 0, KHUB_STATUS_ABI_MAJOR, "ABI 2.1, host supports 1.0-1.0");
    rule(0, 9, 8, 1, 0, 4, KHUB_STATUS_ABI_MAJOR, "ABI 0.9, host supports 1.0-1.4");
    /* The major wins over a pointer-size mismatch. */
    rule(2, 0, 4, 1, 0, 0, KHUB_STATUS_ABI_MAJOR, "ABI 2.0, host supports 1.0-1.0");
}

TEST_IMPL(abi_rule_minor_window)
{
    /* Older minors load on newer hosts, newer ones do not. */
    rule(1, 0, 8, 1, 0, 4, KHUB_STATUS_OK, NULL);
    rule(1, 4, 8, 1, 0, 4, KHUB_STATUS_OK, NULL);
    rule(1, 5, 8, 1, 0, 4, KHUB_STATUS_ABI_MINOR, "ABI 1.5, host supports 1.0-1.4");
    /* Below the host's oldest supported minor. */
    rule(1, 1, 8, 1, 2, 4, KHUB_STATUS_ABI_MINOR, "ABI 1.1, host supports 1.2-1.4");
    rule(1, 2, 8, 1, 2, 4, KHUB_STATUS_OK, NULL);
}

TEST_IMPL(abi_rule_ptr_size)
{
    rule(1, 0, 4, 1, 0, 0, KHUB_STATUS_PTR_SIZE, "pointer size 4 bytes, host pointer size 8 bytes");
}

TEST_IMPL(abi_rule_this_host)
{
    char msg[160];
    ASSERT_OK(khub__abi_check(KHUB_ABI_MAJOR, KHUB_ABI_MINOR, sizeof(void *), msg, sizeof msg));
    ASSERT_STATUS(
        khub__abi_check(KHUB_ABI_MAJOR, KHUB_ABI_MINOR + 1, sizeof(void *), msg, sizeof msg),
        KHUB_STATUS_ABI_MINOR);
}

/* The one op-kind table (KHUB_OP_KINDS) names every kind, both ways. */
TEST_IMPL(op_kind_table)
{
    for (uint32_t k = 1; k < KHUB_OP_KIND__COUNT; k++) {
        const char *name = khub__op_kind_name(k);
        ASSERT(strcmp(name, "unknown") != 0);
        ASSERT_EQ(khub__op_kind_from_name(name), k);
        for (uint32_t j = 1; j < k; j++) ASSERT(strcmp(khub__op_kind_name(j), name) != 0);
    }
    ASSERT_STR_EQ(khub__op_kind_name(KHUB_OP_KV_CACHE), "kv_cache");
    ASSERT_STR_EQ(khub__op_kind_name(0), "unknown");
    ASSERT_STR_EQ(khub__op_kind_name(KHUB_OP_KIND__COUNT), "unknown");
    ASSERT_EQ(khub__op_kind_from_name("softmax"), 0);
    ASSERT_STR_EQ(
        KHUB__OP_KIND_WORDS,
        "attention, linear, qlinear, kv_cache, norm, activation, rotary, paged_attention, "
        "embedding");
}

/* ------------------------------------------------------------------------ */
/* Descriptor rules, through broken plugins                                 */
/* ------------------------------------------------------------------------ */

static void expect_load(const char *name, khub_status want, const char *needle)
{
    khub_runtime *rt = tp_runtime(1);
    const char *path = TP(name);
    khub_plugin *p = (khub_plugin *)1;
    ASSERT_STATUS(khub_plugin_load(rt, path, TP_SHA(path), &p), want);
    ASSERT(p == NULL);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), needle);
    ASSERT_EQ(khub_plugin_count(rt), 0);
    khub_runtime_free(rt);
}

TEST_IMPL(desc_struct_size_too_small)
{
    expect_load("bad_small_desc", KHUB_STATUS_STRUCT_SIZE,
                "plugin khub-test/bad 1.0.0: descriptor struct_size 16, ABI 1.0 minimum 80");
}

TEST_IMPL(init_error_carries_plugin_text)
{
    expect_load("bad_init_fails", KHUB_STATUS_INIT_FAILED,
                "plugin khub-test/bad 1.0.0: init failed with KHUB_STATUS_IO: cannot open the "
                "widget table");
}

TEST_IMPL(duplicate_op_names)
{
    expect_load("bad_dup_ops", KHUB_STATUS_DUPLICATE_OP,
                "op name \"first\" appears twice (ops 0 and 1)");
}

TEST_IMPL(null_id)
{
    expect_load("bad_null_id", KHUB_STATUS_PLUGIN_INVALID,
                "descriptor id or version is NULL, empty or too long");
}

TEST_IMPL(id_differs_from_note)
{
    expect_load("bad_id_mismatch", KHUB_STATUS_PLUGIN_INVALID,
                "descriptor names khub-test/other 1.0.0, its ELF note khub-test/bad 1.0.0");
}

TEST_IMPL(ops_null) { expect_load("bad_null_ops", KHUB_STATUS_PLUGIN_INVALID, "2 ops at (nil)"); }

static char log_lines[2048];
static void capture_log(void *ud, khub_log_level level, const char *msg)
{
    (void)ud;
    size_t len = strlen(log_lines);
    snprintf(log_lines + len, sizeof log_lines - len, "%d %s\n", (int)level, msg);
}

TEST_IMPL(unknown_kind_skipped)
{
    /* Op "second" has kind 99: skipped with a trace line, "first" loads. */
    khub_runtime *rt = tp_runtime(1);
    log_lines[0] = '\0';
    khub_log_set(rt, capture_log, NULL);
    ASSERT_OK(khub_runtime_set_option(rt, KHUB_OPT_LOG_LEVEL, KHUB_LOG_INFO));
    khub_plugin *p = tp_load(rt, "bad_kind");
    ASSERT_EQ(khub_plugin_op_count(p), 1);
    ASSERT_STR_EQ(khub_plugin_op(p, 0)->name, "first");
    ASSERT_EQ(khub_plugin_op(p, 0)->kind, KHUB_OP_NORM);
    char want[256];
    snprintf(want, sizeof want,
             "2 plugin khub-test/bad 1.0.0: op second skipped: kind 99 is unknown to this host "
             "(ABI 1.%d knows kinds 1-9: attention, linear, qlinear, kv_cache, norm, activation, "
             "rotary, paged_attention, embedding); its other ops load",
             KHUB_ABI_MINOR);
    ASSERT_CONTAINS(log_lines, want);
    /* The op that loaded serves. */
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query), .kind = KHUB_OP_NORM};
    khub_binding *b = NULL;
    ASSERT_OK(khub_registry_select(rt, &q, &b));
    ASSERT_STR_EQ(khub_binding_name(b), "khub-test/bad 1.0.0 :: first");
    khub_runtime_free(rt);
}

TEST_IMPL(kind_zero)
{
    expect_load("bad_kind_zero", KHUB_STATUS_PLUGIN_INVALID,
                "op second: kind 0 is no kind; set one of attention, linear,");
}

TEST_IMPL(missing_caps)
{
    expect_load("bad_no_caps", KHUB_STATUS_PLUGIN_INVALID, "op second: caps is NULL");
}

TEST_IMPL(missing_run)
{
    expect_load("bad_no_run", KHUB_STATUS_PLUGIN_INVALID,
                "op first: run is NULL (required for kind norm)");
}

TEST_IMPL(op_struct_size_too_small)
{
    expect_load("bad_small_op", KHUB_STATUS_STRUCT_SIZE, "op struct_size 16, ABI 1.0 minimum 48");
}

TEST_IMPL(desc_abi_newer_than_host)
{
    char want[128];
    snprintf(want, sizeof want,
             "plugin khub-test/bad 1.0.0: descriptor ABI 1.9, host supports 1.0-1.%d",
             KHUB_ABI_MINOR);
    expect_load("bad_desc_abi", KHUB_STATUS_ABI_MINOR, want);
}

TEST_IMPL(desc_abi_differs_from_note)
{
    char want[128];
    snprintf(want, sizeof want,
             "plugin khub-test/bad 1.0.0: descriptor says ABI 1.0, its ELF note says 1.%d",
             KHUB_ABI_MINOR);
    ASSERT(KHUB_ABI_MINOR > 0); /* else the plugin's 1.0 would equal its note */
    expect_load("bad_desc_note", KHUB_STATUS_PLUGIN_INVALID, want);
}

TEST_IMPL(caps_struct_size_too_small)
{
    expect_load("bad_small_caps", KHUB_STATUS_STRUCT_SIZE,
                "plugin khub-test/bad 1.0.0: op first: caps struct_size 8, ABI 1.0 minimum 56");
}

TEST_IMPL(op_sizes_differ)
{
    expect_load("bad_mixed_ops", KHUB_STATUS_PLUGIN_INVALID,
                "plugin khub-test/bad 1.0.0: op 1 has struct_size 56, op 0 has 48");
}

TEST_IMPL(op_stride_bounded)
{
    /* The op array is walked with op 0's struct_size as the stride: 1 GiB
     * used to read far outside the plugin and crash the loader. */
    expect_load("bad_huge_stride", KHUB_STATUS_STRUCT_SIZE,
                "plugin khub-test/bad 1.0.0: op struct_size 1073741824, more than the 4096 "
                "allowed");
    expect_load("bad_huge_caps", KHUB_STATUS_STRUCT_SIZE,
                "plugin khub-test/bad 1.0.0: op second: caps struct_size 1073741824, more than "
                "the 4096 allowed");
}

TEST_IMPL(wider_ops_walked_by_struct_size)
{
    /* A plugin built against a newer minor has larger op structs: op 1
     * lies at stride sizeof(its struct), not sizeof(ours). */
    khub_runtime *rt = tp_runtime(1);
    khub_plugin *p = tp_load(rt, "wide_ops");
    ASSERT_EQ(khub_plugin_op_count(p), 2);
    ASSERT_STR_EQ(khub_plugin_op(p, 0)->name, "first");
    ASSERT_STR_EQ(khub_plugin_op(p, 1)->name, "second");
    ASSERT_EQ(khub_plugin_op(p, 1)->kind, KHUB_OP_ACTIVATION);
    ASSERT_EQ(khub_plugin_op(p, 1)->struct_size, sizeof(khub_op_desc));
    khub_runtime_free(rt);
}

/* ------------------------------------------------------------------------ */
/* Target minor: built with today's header for an older minor               */
/* ------------------------------------------------------------------------ */

/* What the struct sizes are at each minor (abi_minor.c), as layout.c pins
 * the full ones. */
TEST_IMPL(abi_sizes_per_minor)
{
    ASSERT_EQ(khub__host_api_size(0), 160);
    ASSERT_EQ(khub__host_api_size(1), 160);
    ASSERT_EQ(khub__host_api_size(2), 176);
    ASSERT_EQ(khub__host_api_size(3), 176);
    ASSERT_EQ(khub__host_api_size(4), 176);
    ASSERT_EQ(khub__host_api_size(5), 208);
    ASSERT_EQ(khub__host_api_size(KHUB_ABI_MINOR), sizeof(khub_host_api));
    ASSERT_EQ(khub__op_caps_size(2), 56);
    ASSERT_EQ(khub__op_caps_size(3), 72);
    ASSERT_EQ(khub__op_caps_size(4), 80); /* kv_layouts */
    ASSERT_EQ(khub__op_caps_size(5), 88); /* stream_bytes */
    for (unsigned m = 0; m <= 4; m++) ASSERT_EQ(khub__plugin_desc_size(m), 80);
    ASSERT_EQ(khub__plugin_desc_size(5), 88); /* stream_end */
    ASSERT_EQ(khub__plugin_desc_size(KHUB_ABI_MINOR), sizeof(khub_plugin_desc));
}

/* Loads name in a runtime of its own and calls its "probe" op. */
static tp_target_args probe(const char *name, uint16_t *major, uint16_t *minor)
{
    khub_runtime *rt = tp_runtime(1);
    khub_plugin *p = tp_load(rt, name);
    khub_plugin_abi(p, major, minor);
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query), .kind = KHUB_OP_NORM};
    khub_binding *b = NULL;
    ASSERT_OK(khub_registry_select(rt, &q, &b));
    tp_target_args a = {0};
    ASSERT_OK(khub_binding_call(b, &a));
    khub_runtime_free(rt);
    return a;
}

TEST_IMPL(target_minor_stamps_note_and_desc)
{
    /* Built with this header (1.KHUB_ABI_MINOR) for 1.1: stamped 1.1, so a
     * 1.1 host accepts it; a 1.0 host still does not. */
    khub_plugin_info info = {KHUB_STRUCT_INIT(khub_plugin_info)};
    ASSERT_OK(khub_plugin_inspect(TP("target_1_1"), &info, NULL, 0));
    ASSERT_EQ(info.plugin_abi_major, 1);
    ASSERT_EQ(info.plugin_abi_minor, 1);
    char msg[160] = "";
    ASSERT_OK(khub__abi_check_range(info.plugin_abi_major, info.plugin_abi_minor, info.ptr_size, 1,
                                    0, 1, 8, msg, sizeof msg));
    ASSERT_STATUS(khub__abi_check_range(info.plugin_abi_major, info.plugin_abi_minor, info.ptr_size,
                                        1, 0, 0, 8, msg, sizeof msg),
                  KHUB_STATUS_ABI_MINOR);
    ASSERT_OK(khub_plugin_inspect(TP("target_1_0"), &info, NULL, 0));
    ASSERT_EQ(info.plugin_abi_minor, 0);
    ASSERT_OK(khub_plugin_inspect(TP("target_now"), &info, NULL, 0));
    ASSERT_EQ(info.plugin_abi_minor, KHUB_ABI_MINOR);
    /* The descriptor says the same (the loader requires it to equal the note). */
    uint16_t major = 0, minor = 9;
    (void)probe("target_1_1", &major, &minor);
    ASSERT_EQ(major, 1);
    ASSERT_EQ(minor, 1);
}

TEST_IMPL(target_minor_sees_only_its_minor)
{
    uint16_t major, minor;
    tp_target_args a = probe("target_1_1", &major, &minor);
    ASSERT_EQ(a.target_minor, 1);
    ASSERT_EQ(a.own_host_size, 160); /* the header hid the 1.2 entries */
    ASSERT_EQ(a.qformat_count, 10);
    ASSERT_EQ(a.host_size, 160); /* and the host sent none of them */
    ASSERT_EQ(a.host_minor, 1);
    ASSERT_EQ(a.desc_size, 80);

    a = probe("target_1_0", &major, &minor);
    ASSERT_EQ(minor, 0);
    ASSERT_EQ(a.target_minor, 0);
    ASSERT_EQ(a.own_host_size, 160);
    ASSERT_EQ(a.qformat_count, 8); /* no Q5_0 / Q5_1 (1.1) */
    ASSERT_EQ(a.host_size, 160);
    ASSERT_EQ(a.host_minor, 0);

    /* 1.4: the streams of 1.2, not the collectives of 1.5. */
    a = probe("target_1_4", &major, &minor);
    ASSERT_EQ(minor, 4);
    ASSERT_EQ(a.own_host_size, 176);
    ASSERT_EQ(a.host_size, 176);
    ASSERT_EQ(a.host_minor, 4);

    /* Kind 9 (embedding) is 1.5's: skipped from a 1.4 plugin (and older),
     * loaded from a 1.5 one. */
    khub_runtime *rt = tp_runtime(1);
    log_lines[0] = '\0';
    khub_log_set(rt, capture_log, NULL);
    ASSERT_OK(khub_runtime_set_option(rt, KHUB_OPT_LOG_LEVEL, KHUB_LOG_INFO));
    khub_plugin *p4 = tp_load(rt, "target_1_4"), *p1 = tp_load(rt, "target_1_1"),
                *pn = tp_load(rt, "target_now");
    ASSERT_EQ(khub_plugin_op_count(p4), 1);
    ASSERT_EQ(khub_plugin_op_count(p1), 1);
    ASSERT_EQ(khub_plugin_op_count(pn), 2);
    ASSERT_EQ(khub_plugin_op(pn, 1)->kind, KHUB_OP_EMBEDDING);
    ASSERT_CONTAINS(log_lines, "2 plugin khub-test/target-1-4 1.0.0: op kind9 skipped: kind 9 "
                               "(embedding) is from a later ABI than the plugin's 1.4 (1.4 "
                               "knows kinds 1-8); its other ops load");
    ASSERT_CONTAINS(log_lines, "(1.1 knows kinds 1-7)");
    ASSERT_EQ(khub__op_kind_max(3), KHUB_OP_ROTARY);
    ASSERT_EQ(khub__op_kind_max(4), KHUB_OP_PAGED_ATTENTION);
    ASSERT_EQ(khub__op_kind_max(5), KHUB_OP_EMBEDDING);
    khub_runtime_free(rt);

    /* Built for this header's minor: the whole table. */
    a = probe("target_now", &major, &minor);
    ASSERT_EQ(a.target_minor, KHUB_ABI_MINOR);
    ASSERT_EQ(a.own_host_size, sizeof(khub_host_api));
    ASSERT_EQ(a.qformat_count, KHUB_QFORMAT__COUNT);
    ASSERT_EQ(a.host_size, sizeof(khub_host_api));
    ASSERT_EQ(a.host_minor, KHUB_ABI_MINOR);
}

/* ABI note versions: a plugin that targets 1.0-1.2 emits version 1 (which
 * older hosts read), one that targets 1.3+ version 2; this host reads both. */
static uint32_t note_version_of(const char *name, char *id, size_t n)
{
    khub_gate_report rep;
    char err[256];
    (void)khub__gate_check_file(TP(name), NULL, &rep, err, sizeof err);
    ASSERT(rep.has_note);
    snprintf(id, n, "%s", rep.note.id);
    return rep.note.note_version;
}

#define LONG_ID \
    "khub-test/a-kernel-whose-hub-id-does-not-fit-the-63-bytes-of-note-version-1-a-kernel-" \
    "whose-hub-id-does-not-fit-the-63-bytes-of-note-version-1-end"

TEST_IMPL(note_v1_and_v2_read)
{
    char id[300];
    ASSERT_EQ(note_version_of("target_1_1", id, sizeof id), 1);
    ASSERT_STR_EQ(id, "khub-test/target-1-1");
    ASSERT_EQ(note_version_of("target_now", id, sizeof id), 2);
    ASSERT_EQ(note_version_of("long_id", id, sizeof id), 2);
    ASSERT_STR_EQ(id, LONG_ID);
    /* Both load: the version 1 note of a 1.1 target, the version 2 note of
     * this header's (probe() loads and calls them). */
    uint16_t major, minor;
    (void)probe("target_1_1", &major, &minor);
    (void)probe("target_now", &major, &minor);
    /* A full Hub ID survives the note: inspect, load, and the descriptor's
     * id must equal the note's whole id. */
    khub_plugin_info info = {KHUB_STRUCT_INIT(khub_plugin_info)};
    ASSERT_OK(khub_plugin_inspect(TP("long_id"), &info, NULL, 0));
    ASSERT(strlen(LONG_ID) > 63);
    ASSERT_STR_EQ(info.full_id, LONG_ID);
    ASSERT_EQ(strlen(info.id), 63); /* the 0.1 field holds its first 63 bytes */
    ASSERT(strncmp(info.id, LONG_ID, 63) == 0);
    khub_runtime *rt = tp_runtime(1);
    khub_plugin *p = tp_load(rt, "long_id");
    ASSERT_STR_EQ(khub_plugin_id(p), LONG_ID);
    khub_runtime_free(rt);
}

/* ------------------------------------------------------------------------ */
/* Per-kind caps flags and activation dtypes (1.3)                          */
/* ------------------------------------------------------------------------ */

/* Selects kind with flags (1.0 word), kind_flags and act dtype; returns the
 * status, with the registry's message in msg. */
static khub_status pick(khub_runtime *rt, uint32_t kind, uint32_t flags, uint64_t kind_flags,
                        int32_t act, char *msg, size_t n)
{
    khub_op_query q = {
        KHUB_STRUCT_INIT(khub_op_query), .kind = kind,       .dtype_id = -1, .flags = flags,
        .kind_flags = kind_flags,        .act_dtype_id = act};
    khub_binding *b = NULL;
    khub_status st = khub_registry_select(rt, &q, &b);
    snprintf(msg, n, "%s", st == KHUB_STATUS_OK ? khub_binding_name(b) : khub_runtime_errmsg(rt));
    return st;
}

TEST_IMPL(per_kind_caps)
{
    khub_runtime *rt = tp_runtime(1);
    khub_plugin *p = tp_load(rt, "caps_now");
    const khub_op_caps *attn = khub_plugin_op(p, 0)->caps, *norm = khub_plugin_op(p, 1)->caps;
    /* The host's copies: kind_flags holds the 1.0 word too; act 0 = f32. */
    ASSERT_EQ(attn->kind_flags, KHUB_ATTN_CAUSAL | KHUB_ATTN_GQA);
    ASSERT_EQ(attn->act_dtypes,
              KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32) | KHUB_DTYPE_BIT(KHUB_DTYPE_ID_BF16));
    ASSERT_EQ(norm->kind_flags, KHUB_NORM_RESIDUAL | (UINT64_C(1) << 8));
    ASSERT_EQ(norm->act_dtypes, KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32));
    char msg[512];
    /* A 1.0-word query matches a flag declared only per kind, and back. */
    ASSERT_OK(pick(rt, KHUB_OP_ATTENTION, KHUB_CAP_GQA, 0, KHUB_DTYPE_ID_F32, msg, sizeof msg));
    ASSERT_OK(pick(rt, KHUB_OP_NORM, 0, KHUB_NORM_RESIDUAL, KHUB_DTYPE_ID_F32, msg, sizeof msg));
    /* Bit 8 is a norm flag here; this attention op lacks bit 8 (softcap,
     * 1.5) and bit 9 (no host names it). */
    ASSERT_OK(pick(rt, KHUB_OP_NORM, 0, UINT64_C(1) << 8, KHUB_DTYPE_ID_F32, msg, sizeof msg));
    ASSERT_STATUS(
        pick(rt, KHUB_OP_ATTENTION, 0, UINT64_C(1) << 8, KHUB_DTYPE_ID_F32, msg, sizeof msg),
        KHUB_STATUS_NO_KERNEL);
    ASSERT_CONTAINS(msg, "khub-test/caps-now :: attn: missing flag softcap");
    ASSERT_STATUS(
        pick(rt, KHUB_OP_ATTENTION, 0, UINT64_C(1) << 9, KHUB_DTYPE_ID_F32, msg, sizeof msg),
        KHUB_STATUS_NO_KERNEL);
    ASSERT_CONTAINS(msg, "khub-test/caps-now :: attn: missing flag bit9");
    ASSERT_STATUS(pick(rt, KHUB_OP_ATTENTION, 0, KHUB_ATTN_MASK, 0, msg, sizeof msg),
                  KHUB_STATUS_NO_KERNEL);
    ASSERT_CONTAINS(msg, "attn: missing flag mask");
    /* Activation dtypes. */
    ASSERT_OK(pick(rt, KHUB_OP_ATTENTION, 0, 0, KHUB_DTYPE_ID_BF16, msg, sizeof msg));
    ASSERT_STATUS(pick(rt, KHUB_OP_NORM, 0, 0, KHUB_DTYPE_ID_BF16, msg, sizeof msg),
                  KHUB_STATUS_NO_KERNEL);
    ASSERT_CONTAINS(msg, "norm: activation dtype bf16 not in caps (takes f32)");
    ASSERT_OK(pick(rt, KHUB_OP_NORM, 0, 0, -1, msg, sizeof msg));
    khub_runtime_free(rt);
}

TEST_IMPL(caps_fields_gated_on_minor)
{
    /* Stamped 1.2 with caps bytes where 1.3 has kind_flags and act_dtypes,
     * all ones: the host reads none of them. */
    khub_runtime *rt = tp_runtime(1);
    khub_plugin *p = tp_load(rt, "caps_old_wide");
    uint16_t major, minor;
    khub_plugin_abi(p, &major, &minor);
    ASSERT_EQ(minor, 2);
    const khub_op_caps *attn = khub_plugin_op(p, 0)->caps;
    ASSERT_EQ(attn->kind_flags, KHUB_ATTN_CAUSAL);
    ASSERT_EQ(attn->act_dtypes, KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32));
    ASSERT_EQ(khub_plugin_op(p, 1)->caps->kind_flags, 0);
    char msg[512];
    ASSERT_OK(pick(rt, KHUB_OP_ATTENTION, KHUB_CAP_CAUSAL, 0, 0, msg, sizeof msg));
    ASSERT_STATUS(pick(rt, KHUB_OP_ATTENTION, 0, KHUB_ATTN_GQA, 0, msg, sizeof msg),
                  KHUB_STATUS_NO_KERNEL);
    ASSERT_CONTAINS(msg, "khub-test/caps-old :: attn: missing flag gqa");
    ASSERT_STATUS(pick(rt, KHUB_OP_ATTENTION, 0, 0, KHUB_DTYPE_ID_BF16, msg, sizeof msg),
                  KHUB_STATUS_NO_KERNEL);
    ASSERT_CONTAINS(msg, "attn: activation dtype bf16 not in caps (takes f32)");
    khub_runtime_free(rt);
}

/* Calls attention op 0 of p with 1.5 args carrying softcap 30; returns what
 * the op saw: [struct_size, abi_minor, softcap or -1]. */
static void softcap_call(khub_runtime *rt, const char *id, float seen[3])
{
    int64_t shape[3] = {1, 1, 4};
    float q[4] = {0}, out[4] = {0};
    khub_tensor tq = {.data = q,
                      .device = {KHUB_DEVICE_CPU, 0},
                      .ndim = 3,
                      .dtype = KHUB_DTYPE_F32,
                      .shape = shape};
    khub_tensor to = tq;
    to.data = out;
    khub_op_query qu = {KHUB_STRUCT_INIT(khub_op_query), .kind = KHUB_OP_ATTENTION, .dtype_id = -1,
                        .plugin_id = id};
    khub_binding *b = NULL;
    ASSERT_OK(khub_registry_select(rt, &qu, &b));
    ASSERT(strncmp(khub_binding_name(b), id, strlen(id)) == 0);
    khub_attention_args a = {KHUB_STRUCT_INIT(khub_attention_args),
                             .q = &tq,
                             .k = &tq,
                             .v = &tq,
                             .out = &to,
                             .scale = 1.0f,
                             .softcap = 30.0f};
    ASSERT_OK(khub_binding_call(b, &a));
    for (int i = 0; i < 3; i++) seen[i] = out[i];
}

/* Soft-capping (1.5): a 1.4 attention op's bit 8 is not believed (1.4 has
 * no such flag), and whatever the caller fills, a 1.4 op is sent 1.4's
 * 80-byte args stamped 1.4, so it never sees softcap; a 1.5 op declares
 * KHUB_ATTN_SOFTCAP and gets the 88-byte args with the cap. */
TEST_IMPL(softcap_gated_on_minor)
{
    ASSERT_EQ(khub__attention_args_size(4), 80);
    ASSERT_EQ(khub__attention_args_size(5), 88);
    ASSERT_EQ(khub__paged_attention_args_size(4), 144);
    ASSERT_EQ(khub__paged_attention_args_size(5), 152);
    ASSERT_EQ(khub__attention_args_size(KHUB_ABI_MINOR), sizeof(khub_attention_args));
    khub_runtime *rt = tp_runtime(1);
    khub_plugin *old = tp_load(rt, "softcap_1_4"), *now = tp_load(rt, "softcap_1_5");
    uint16_t major, minor;
    khub_plugin_abi(old, &major, &minor);
    ASSERT_EQ(minor, 4);
    ASSERT_EQ(khub_plugin_op(old, 0)->caps->kind_flags & KHUB_ATTN_SOFTCAP, 0);
    ASSERT_EQ(khub_plugin_op(now, 0)->caps->kind_flags & KHUB_ATTN_SOFTCAP, KHUB_ATTN_SOFTCAP);
    char msg[512];
    ASSERT_STATUS(pick(rt, KHUB_OP_ATTENTION, 0, KHUB_ATTN_SOFTCAP, 0, msg, sizeof msg),
                  KHUB_STATUS_OK);
    ASSERT_STR_EQ(msg, "khub-test/softcap-1-5 1.0.0 :: attn");
    float seen[3];
    softcap_call(rt, "khub-test/softcap-1-4", seen);
    ASSERT_EQ((int)seen[0], 80);
    ASSERT_EQ((int)seen[1], 4);
    ASSERT(seen[2] == -1.0f);
    softcap_call(rt, "khub-test/softcap-1-5", seen);
    ASSERT_EQ((int)seen[0], 88);
    ASSERT_EQ((int)seen[1], KHUB_ABI_MINOR);
    ASSERT(seen[2] == 30.0f);
    /* Only the 1.4 op loaded: a capped query is refused, naming the flag. */
    khub_runtime *rt4 = tp_runtime(1);
    (void)tp_load(rt4, "softcap_1_4");
    ASSERT_STATUS(pick(rt4, KHUB_OP_ATTENTION, 0, KHUB_ATTN_SOFTCAP, 0, msg, sizeof msg),
                  KHUB_STATUS_NO_KERNEL);
    ASSERT_STR_EQ(msg, "no attention op fits: all 1 candidates rejected (first: "
                       "khub-test/softcap-1-4 :: attn: missing flag softcap)");
    khub_runtime_free(rt4);
    khub_runtime_free(rt);
}

/* The KV cache write's ctx (1.5: the stream a device cache appends on):
 * a kv_cache op of a 1.4 plugin is sent a copy cut to the 40-byte 1.0
 * layout and stamped 1.4, so it never sees ctx; a 1.5 op gets the args as
 * they are (48 bytes, ctx set). */
TEST_IMPL(kv_write_ctx_gated_on_minor)
{
    ASSERT_EQ(khub__kv_write_args_size(4), 40);
    ASSERT_EQ(khub__kv_write_args_size(5), 48);
    ASSERT_EQ(khub__kv_write_args_size(KHUB_ABI_MINOR), sizeof(khub_kv_write_args));
    khub_call_ctx ctx = {KHUB_STRUCT_INIT(khub_call_ctx), .stream = &ctx};
    khub_kv_write_args w = {KHUB_STRUCT_INIT(khub_kv_write_args), .layer = 3, .pos = 17,
                            .ctx = &ctx};
    khub__args_buf buf;
    const khub_kv_write_args *old = khub__args_for_minor(KHUB_OP_KV_CACHE, 4, &w, &buf);
    ASSERT(old != &w);
    ASSERT_EQ(old->struct_size, 40);
    ASSERT_EQ(old->abi_minor, 4);
    ASSERT_EQ(old->layer, 3);
    ASSERT_EQ(old->pos, 17);
    ASSERT(old->ctx == NULL);
    const khub_kv_write_args *now = khub__args_for_minor(KHUB_OP_KV_CACHE, 5, &w, &buf);
    ASSERT(now == &w);
    ASSERT(now->ctx == &ctx);
}

/* A query of library 0.1 (no kind_flags, no act_dtype_id) still works. */
TEST_IMPL(query_of_0_1)
{
    khub_runtime *rt = tp_runtime(1);
    (void)tp_load(rt, "caps_now");
    khub_op_query q = {
        KHUB_STRUCT_INIT(khub_op_query), .kind = KHUB_OP_ATTENTION,      .dtype_id = -1,
        .flags = KHUB_CAP_GQA,           .kind_flags = UINT64_C(1) << 8, .act_dtype_id = 77};
    q.struct_size = offsetof(khub_op_query, kind_flags);
    khub_binding *b = NULL;
    ASSERT_OK(khub_registry_select(rt, &q, &b));
    khub_runtime_free(rt);
}

/* ------------------------------------------------------------------------ */
/* Static plugins negotiate the same way                                    */
/* ------------------------------------------------------------------------ */

static const khub_op_caps caps = {KHUB_STRUCT_INIT(khub_op_caps), .device_type = KHUB_DEVICE_CPU};

static khub_status run_nop(void *state, const void *args)
{
    (void)state, (void)args;
    return KHUB_STATUS_OK;
}

static khub_status init_fails_via_host(const khub_host_api *host, khub_plugin_desc *out,
                                       char *errbuf, size_t errbuf_size)
{
    (void)out, (void)errbuf, (void)errbuf_size;
    return host->fail(host->host_ctx, KHUB_STATUS_UNSUPPORTED, "needs a %s", "flux capacitor");
}

static khub_status init_bad_name(const khub_host_api *host, khub_plugin_desc *out, char *errbuf,
                                 size_t errbuf_size)
{
    static const khub_op_desc ops[] = {{KHUB_STRUCT_INIT(khub_op_desc), .name = "Bad-Name",
                                        .kind = KHUB_OP_NORM, .caps = &caps, .run = run_nop}};
    (void)host, (void)errbuf, (void)errbuf_size;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc), .id = "t/static", .version = "0.1",
                          .n_ops = 1, .ops = ops};
    return khub_plugin_desc_put(out, &d);
}

static int shutdowns;
static void count_shutdown(void *state)
{
    (void)state;
    shutdowns++;
}

static khub_status init_long_id(const khub_host_api *host, khub_plugin_desc *out, char *errbuf,
                                size_t errbuf_size)
{
    (void)host, (void)errbuf, (void)errbuf_size;
    static char id[300]; /* over the 255 bytes of note version 2 */
    memset(id, 'x', sizeof id - 1);
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc), .id = id, .version = "0.1",
                          .shutdown = count_shutdown};
    return khub_plugin_desc_put(out, &d);
}

static khub_status init_ok(const khub_host_api *host, khub_plugin_desc *out, char *errbuf,
                           size_t errbuf_size)
{
    static const khub_op_desc ops[] = {{KHUB_STRUCT_INIT(khub_op_desc), .name = "nop",
                                        .kind = KHUB_OP_NORM, .caps = &caps, .run = run_nop}};
    (void)host, (void)errbuf, (void)errbuf_size;
    /* The host's out arrives zeroed with the host's struct_size. */
    if (out->struct_size != sizeof(khub_plugin_desc) || out->id || out->ops || out->n_ops)
        return KHUB_STATUS_INTERNAL;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc), .id = "t/static", .version = "0.1",
                          .n_ops = 1, .ops = ops};
    return khub_plugin_desc_put(out, &d);
}

TEST_IMPL(static_init_error_via_host_fail)
{
    khub_runtime *rt = tp_runtime(1);
    ASSERT_STATUS(khub_plugin_load_static(rt, init_fails_via_host, NULL), KHUB_STATUS_INIT_FAILED);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt),
                    "init failed with KHUB_STATUS_UNSUPPORTED: needs a flux capacitor");
    khub_runtime_free(rt);
}

TEST_IMPL(static_rules)
{
    khub_runtime *rt = tp_runtime(1);
    ASSERT_STATUS(khub_plugin_load_static(rt, init_bad_name, NULL), KHUB_STATUS_PLUGIN_INVALID);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "op 0: name is NULL, empty, over 63 bytes or not");
    shutdowns = 0;
    ASSERT_STATUS(khub_plugin_load_static(rt, init_long_id, NULL), KHUB_STATUS_PLUGIN_INVALID);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "id or version is NULL, empty or too long");
    ASSERT_EQ(shutdowns, 1); /* a rejected plugin that initialised is shut down */
    khub_plugin *p = NULL;
    ASSERT_OK(khub_plugin_load_static(rt, init_ok, &p));
    ASSERT_STR_EQ(khub_plugin_path(p), "(static)");
    ASSERT_EQ(khub_plugin_count(rt), 1);
    khub_runtime_free(rt);
}

#define TEST_LIST(X) \
    X(abi_rule_exact_match) \
    X(abi_rule_major_differs) \
    X(abi_rule_minor_window) \
    X(abi_rule_ptr_size) \
    X(abi_rule_this_host) \
    X(op_kind_table) \
    X(desc_struct_size_too_small) \
    X(init_error_carries_plugin_text) \
    X(duplicate_op_names) \
    X(null_id) \
    X(id_differs_from_note) \
    X(ops_null) \
    X(unknown_kind_skipped) \
    X(kind_zero) \
    X(missing_caps) \
    X(missing_run) \
    X(op_struct_size_too_small) \
    X(desc_abi_newer_than_host) \
    X(desc_abi_differs_from_note) \
    X(caps_struct_size_too_small) \
    X(op_sizes_differ) \
    X(op_stride_bounded) \
    X(wider_ops_walked_by_struct_size) \
    X(abi_sizes_per_minor) \
    X(target_minor_stamps_note_and_desc) \
    X(target_minor_sees_only_its_minor) \
    X(note_v1_and_v2_read) \
    X(per_kind_caps) \
    X(caps_fields_gated_on_minor) \
    X(query_of_0_1) \
    X(softcap_gated_on_minor) \
    X(kv_write_ctx_gated_on_minor) \
    X(static_init_error_via_host_fail) \
    X(static_rules)
TEST_MAIN(TEST_LIST)
