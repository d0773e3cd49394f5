/* test_registry.c: selection (every accept/reject rule, ranking, fallback,
 * strict mode) and binding calls. Candidates are static plugins registered
 * with khub_plugin_load_static, so every rule is exercised exactly. */
#include "plugins/tp_args.h"
#include "plugins/tp_util.h"
#include "runtime_impl.h"

static khub_status run_nop(void *state, const void *args)
{
    (void)state, (void)args;
    return KHUB_STATUS_OK;
}

static int32_t score_zero(void *state)
{
    (void)state;
    return 0;
}

#define F32 KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32)
#define F16 KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F16)
#define CAPS(...) \
    { \
        KHUB_STRUCT_INIT(khub_op_caps), __VA_ARGS__ \
    }
#define OP(n, k, c) \
    { \
        KHUB_STRUCT_INIT(khub_op_desc), .name = n, .kind = k, .caps = c, .run = run_nop \
    }

/* t/ref: a reference-style plugin, priority 0. */
static const khub_op_caps ref_attn = CAPS(.device_type = KHUB_DEVICE_CPU, .dtypes = F32 | F16,
                                          .flags = KHUB_CAP_CAUSAL | KHUB_CAP_GQA);
static const khub_op_caps ref_norm = CAPS(.device_type = KHUB_DEVICE_CPU);
static const khub_op_desc ref_ops[] = {OP("attn", KHUB_OP_ATTENTION, &ref_attn),
                                       OP("norm", KHUB_OP_NORM, &ref_norm)};

/* t/fast: optimised ops with narrower caps and higher priority. */
static const int32_t fa_dims[] = {64, 128};
static const khub_op_caps fast_512 =
    CAPS(.device_type = KHUB_DEVICE_CPU, .dtypes = F16, .cpu_features = KHUB_CPU_AVX512F,
         .flags = KHUB_CAP_CAUSAL, .priority = 20);
static const khub_op_caps fast_fa =
    CAPS(.device_type = KHUB_DEVICE_CPU, .dtypes = F16, .head_dims = fa_dims, .n_head_dims = 2,
         .flags = KHUB_CAP_CAUSAL, .priority = 10);
static const khub_op_caps fast_gpu =
    CAPS(.device_type = KHUB_DEVICE_CUDA, .dtypes = F16, .priority = 30);
static const khub_op_desc fast_ops[] = {OP("fa_avx512", KHUB_OP_ATTENTION, &fast_512),
                                        OP("fa", KHUB_OP_ATTENTION, &fast_fa),
                                        OP("fa_gpu", KHUB_OP_ATTENTION, &fast_gpu)};

/* t/zero: scores itself 0 on this machine. */
static const khub_op_caps zero_caps =
    CAPS(.device_type = KHUB_DEVICE_CPU, .flags = 0xff, .priority = 100);
static const khub_op_desc zero_ops[] = {OP("z", KHUB_OP_ATTENTION, &zero_caps)};

/* t/late: same rank as t/ref's attn, loaded later. */
static const khub_op_desc late_ops[] = {OP("attn", KHUB_OP_ATTENTION, &ref_attn)};

#define DEFINE_INIT(fn, id_, ops_, score_) \
    static khub_status fn(const khub_host_api *host, khub_plugin_desc *out, char *errbuf, \
                          size_t errbuf_size) \
    { \
        (void)host, (void)errbuf, (void)errbuf_size; \
        khub_plugin_desc d = { \
            KHUB_STRUCT_INIT(khub_plugin_desc),    .id = id_,   .version = "1.0", \
            .n_ops = sizeof ops_ / sizeof ops_[0], .ops = ops_, .score = score_}; \
        return khub_plugin_desc_put(out, &d); \
    }
DEFINE_INIT(init_ref, "t/ref", ref_ops, NULL)
DEFINE_INIT(init_fast, "t/fast", fast_ops, NULL)
DEFINE_INIT(init_zero, "t/zero", zero_ops, score_zero)
DEFINE_INIT(init_late, "t/late", late_ops, NULL)

static char warnings[2048];
static void capture(void *ud, khub_log_level level, const char *msg)
{
    (void)ud;
    if (level == KHUB_LOG_WARN)
        snprintf(warnings + strlen(warnings), sizeof warnings - strlen(warnings), "%s\n", msg);
}

static khub_runtime *setup(void)
{
    khub_runtime_opts o = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = 1, .log = capture};
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(&o, &rt));
    rt->cpu_features = KHUB_CPU_AVX2 | KHUB_CPU_FMA; /* a machine without AVX-512 */
    ASSERT_OK(khub_plugin_load_static(rt, init_ref, NULL));
    ASSERT_OK(khub_plugin_load_static(rt, init_fast, NULL));
    ASSERT_OK(khub_plugin_load_static(rt, init_zero, NULL));
    ASSERT_OK(khub_plugin_load_static(rt, init_late, NULL));
    warnings[0] = '\0';
    return rt;
}

static khub_op_query attn_query(int dtype, int head_dim, uint32_t flags)
{
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query), .kind = KHUB_OP_ATTENTION,
                       .dtype_id = dtype, .head_dim = head_dim, .flags = flags};
    return q;
}

static const char *select_ok(khub_runtime *rt, const khub_op_query *q)
{
    khub_binding *b = NULL;
    khub_status st = khub_registry_select(rt, q, &b);
    if (st != KHUB_STATUS_OK) TEST_FAIL_("select: %s", khub_runtime_errmsg(rt));
    return khub_binding_trace(b);
}

TEST_IMPL(trace_lists_every_candidate)
{
    khub_runtime *rt = setup();
    khub_op_query q = attn_query(KHUB_DTYPE_ID_F16, 64, KHUB_CAP_CAUSAL);
    khub_binding *b = NULL;
    ASSERT_OK(khub_registry_select(rt, &q, &b));
    ASSERT_STR_EQ(khub_binding_trace(b),
                  "accept t/ref 1.0 :: attn (priority 0)\n"
                  "reject t/fast 1.0 :: fa_avx512: needs cpu avx512f\n"
                  "accept t/fast 1.0 :: fa (priority 10)\n"
                  "reject t/fast 1.0 :: fa_gpu: device cuda, wants cpu\n"
                  "reject t/zero 1.0 :: z: score 0: unsupported on this machine\n"
                  "accept t/late 1.0 :: attn (priority 0)\n"
                  "chose t/fast 1.0 :: fa (best ranked, priority 10, 3 of 6 accepted)");
    ASSERT_STR_EQ(khub_binding_name(b), "t/fast 1.0 :: fa");
    ASSERT_STR_EQ(warnings, "");
    khub_runtime_free(rt);
}

TEST_IMPL(reject_dtype)
{
    khub_runtime *rt = setup();
    khub_op_query q = attn_query(KHUB_DTYPE_ID_F32, 64, KHUB_CAP_CAUSAL);
    const char *t = select_ok(rt, &q);
    ASSERT_CONTAINS(t, "reject t/fast 1.0 :: fa: dtype f32 not in caps (serves f16)\n");
    ASSERT_CONTAINS(t, "chose t/ref 1.0 :: attn");
    /* block formats by name, as kernel.json and khub plugins write them */
    q.dtype_id = KHUB_DTYPE_ID_QBASE + KHUB_QFORMAT_Q4_1;
    khub_binding *b = NULL;
    ASSERT_STATUS(khub_registry_select(rt, &q, &b), KHUB_STATUS_NO_KERNEL);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt),
                    "t/ref :: attn: dtype q4_1 not in caps (serves f32 f16)");
    ASSERT_STR_EQ(khub__dtype_id_name(KHUB_DTYPE_ID_QBASE + KHUB_QFORMAT_INT8_ROW), "int8_row");
    ASSERT(khub__dtype_id_name(KHUB_DTYPE_ID_QBASE) == NULL);
    ASSERT(khub__dtype_id_name(9) == NULL);
    khub_runtime_free(rt);
}

TEST_IMPL(reject_head_dim)
{
    khub_runtime *rt = setup();
    khub_op_query q = attn_query(KHUB_DTYPE_ID_F16, 96, KHUB_CAP_CAUSAL);
    const char *t = select_ok(rt, &q);
    ASSERT_CONTAINS(t, "reject t/fast 1.0 :: fa: head dim 96 not served (serves 64 128)\n");
    ASSERT_CONTAINS(t, "accept t/ref 1.0 :: attn");
    khub_runtime_free(rt);
}

TEST_IMPL(reject_missing_flag)
{
    khub_runtime *rt = setup();
    khub_op_query q = attn_query(KHUB_DTYPE_ID_F16, 64, KHUB_CAP_CAUSAL | KHUB_CAP_GQA);
    const char *t = select_ok(rt, &q);
    ASSERT_CONTAINS(t, "reject t/fast 1.0 :: fa: missing flag gqa\n");
    ASSERT_CONTAINS(t, "chose t/ref 1.0 :: attn");
    khub_runtime_free(rt);
}

TEST_IMPL(reject_device_wants_cuda)
{
    khub_runtime *rt = setup();
    khub_op_query q = attn_query(KHUB_DTYPE_ID_F16, 0, 0);
    q.device_type = KHUB_DEVICE_CUDA;
    const char *t = select_ok(rt, &q);
    ASSERT_CONTAINS(t, "reject t/ref 1.0 :: attn: device cpu, wants cuda\n");
    ASSERT_CONTAINS(t, "accept t/fast 1.0 :: fa_gpu (priority 30)\n");
    khub_runtime_free(rt);
}

TEST_IMPL(tie_goes_to_earlier_load)
{
    khub_runtime *rt = setup();
    khub_op_query q = attn_query(KHUB_DTYPE_ID_F32, 96, KHUB_CAP_GQA);
    const char *t = select_ok(rt, &q);
    ASSERT_CONTAINS(t, "accept t/late 1.0 :: attn (priority 0)\n");
    ASSERT_CONTAINS(t, "chose t/ref 1.0 :: attn (best ranked, priority 0, 2 of 6 accepted)");
    khub_runtime_free(rt);
}

TEST_IMPL(preferred_beats_priority)
{
    khub_runtime *rt = setup();
    khub_op_query q = attn_query(KHUB_DTYPE_ID_F16, 64, KHUB_CAP_CAUSAL);
    q.plugin_id = "t/late";
    const char *t = select_ok(rt, &q);
    ASSERT_CONTAINS(t, "chose t/late 1.0 :: attn (preferred, priority 0, 3 of 6 accepted)");
    q.plugin_id = "t/fast";
    q.op_name = "fa";
    t = select_ok(rt, &q);
    ASSERT_CONTAINS(t, "chose t/fast 1.0 :: fa (preferred");
    ASSERT_STR_EQ(warnings, "");
    khub_runtime_free(rt);
}

TEST_IMPL(fallback_warns_with_reason)
{
    khub_runtime *rt = setup();
    khub_op_query q = attn_query(KHUB_DTYPE_ID_F32, 64, KHUB_CAP_GQA);
    q.plugin_id = "t/fast";
    const char *t = select_ok(rt, &q);
    ASSERT_CONTAINS(t, "chose t/ref 1.0 :: attn (fallback: preferred t/fast is rejected: needs "
                       "cpu avx512f)");
    ASSERT_CONTAINS(warnings, "preferred t/fast for attention is rejected: needs cpu avx512f; "
                              "falling back to t/ref 1.0 :: attn");
    /* the same fallback again (a model load selects each role per layer):
     * traced every time, logged once */
    char once[sizeof warnings];
    snprintf(once, sizeof once, "%s", warnings);
    t = select_ok(rt, &q);
    ASSERT_CONTAINS(t, "(fallback: preferred t/fast is rejected: needs cpu avx512f)");
    ASSERT_STR_EQ(warnings, once);
    /* another reason is another warning */
    q.plugin_id = "t/nowhere";
    select_ok(rt, &q);
    ASSERT_CONTAINS(warnings + strlen(once), "preferred t/nowhere for attention is not loaded");
    khub_runtime_free(rt);
}

TEST_IMPL(fallback_when_not_loaded)
{
    khub_runtime *rt = setup();
    khub_op_query q = attn_query(-1, 0, 0);
    q.plugin_id = "kernels-community/flash-attn2";
    const char *t = select_ok(rt, &q);
    ASSERT_CONTAINS(t, "(fallback: preferred kernels-community/flash-attn2 is not loaded)");
    ASSERT_CONTAINS(warnings, "preferred kernels-community/flash-attn2 for attention is not "
                              "loaded; falling back to t/fast 1.0 :: fa");
    khub_runtime_free(rt);
}

TEST_IMPL(strict_refuses_fallback)
{
    khub_runtime *rt = setup();
    ASSERT_OK(khub_runtime_set_option(rt, KHUB_OPT_STRICT, 1));
    khub_op_query q = attn_query(KHUB_DTYPE_ID_F32, 64, KHUB_CAP_GQA);
    q.plugin_id = "t/fast";
    khub_binding *b = (khub_binding *)1;
    ASSERT_STATUS(khub_registry_select(rt, &q, &b), KHUB_STATUS_NO_KERNEL);
    ASSERT(b == NULL);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt),
                    "preferred t/fast for attention is rejected: needs cpu avx512f, and "
                    "KHUB_OPT_STRICT forbids falling back to t/ref 1.0 :: attn");
    q.plugin_id = "t/fast";
    q.op_name = "nonexistent";
    ASSERT_STATUS(khub_registry_select(rt, &q, &b), KHUB_STATUS_NO_KERNEL);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "has no attention op named nonexistent");
    khub_runtime_free(rt);
}

TEST_IMPL(no_candidate)
{
    khub_runtime *rt = setup();
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query), .kind = KHUB_OP_LINEAR, .dtype_id = -1};
    khub_binding *b = NULL;
    ASSERT_STATUS(khub_registry_select(rt, &q, &b), KHUB_STATUS_NO_KERNEL);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "no plugin serves linear ops (4 plugins loaded)");
    q = attn_query(KHUB_DTYPE_ID_F32, 0, KHUB_CAP_MASK);
    ASSERT_STATUS(khub_registry_select(rt, &q, &b), KHUB_STATUS_NO_KERNEL);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "no attention op fits: all 6 candidates rejected "
                                             "(first: t/ref :: attn: missing flag mask)");
    khub_runtime_free(rt);
}

TEST_IMPL(query_validated)
{
    khub_runtime *rt = setup();
    khub_op_query q = attn_query(-1, 0, 0);
    khub_binding *b = NULL;
    q.kind = 0;
    ASSERT_STATUS(khub_registry_select(rt, &q, &b), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "unknown op kind 0");
    q.kind = KHUB_OP_ATTENTION;
    q.struct_size = 8;
    ASSERT_STATUS(khub_registry_select(rt, &q, &b), KHUB_STATUS_STRUCT_SIZE);
    char want[96];
    snprintf(want, sizeof want, "khub_registry_select: q.struct_size 8 is smaller than 0.1's %zu",
             offsetof(khub_op_query, op_name) + sizeof q.op_name);
    ASSERT_STR_EQ(khub_runtime_errmsg(rt), want);
    khub_runtime_free(rt);
}

/* ------------------------------------------------------------------------ */
/* Calls                                                                    */
/* ------------------------------------------------------------------------ */

TEST_IMPL(call_runs_bound_op)
{
    khub_runtime *rt = tp_runtime(1);
    tp_load(rt, "good_v1");
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query), .kind = KHUB_OP_NORM, .dtype_id = -1};
    khub_binding *b = NULL;
    ASSERT_OK(khub_registry_select(rt, &q, &b));
    ASSERT_STR_EQ(khub_binding_name(b), "khub-test/good 1.0.0 :: stamp");
    tp_stamp_args a = {{0}};
    ASSERT_OK(khub_binding_call(b, &a));
    ASSERT_EQ(a.out[7], 1);
    khub_runtime_free(rt);
}

TEST_IMPL(call_error_names_op_and_plugin_text)
{
    khub_runtime *rt = tp_runtime(1);
    tp_load(rt, "good_v1");
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query), .kind = KHUB_OP_ACTIVATION, .dtype_id = -1};
    khub_binding *b = NULL;
    ASSERT_OK(khub_registry_select(rt, &q, &b));
    ASSERT_STATUS(khub_binding_call(b, NULL), KHUB_STATUS_INVALID_ARG);
    ASSERT_STR_EQ(khub_runtime_errmsg(rt),
                  "khub-test/good 1.0.0 :: fail_op: widget 7 rejected by fail_op");
    khub_runtime_free(rt);
}

static const int kv_methods_marker = 7;
static const khub_op_caps kv_caps = CAPS(.device_type = KHUB_DEVICE_CPU);
static const khub_op_desc kv_ops[] = {{KHUB_STRUCT_INIT(khub_op_desc), .name = "cache",
                                       .kind = KHUB_OP_KV_CACHE, .caps = &kv_caps,
                                       .methods = &kv_methods_marker}};
DEFINE_INIT(init_kv, "t/kv", kv_ops, NULL)

TEST_IMPL(methods_ops_and_pins)
{
    khub_runtime *rt = tp_runtime(1);
    khub_plugin *p = NULL;
    ASSERT_OK(khub_plugin_load_static(rt, init_kv, &p));
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query), .kind = KHUB_OP_KV_CACHE, .dtype_id = -1};
    khub_binding *b = NULL;
    ASSERT_OK(khub_registry_select(rt, &q, &b));
    ASSERT_STATUS(khub_binding_call(b, NULL), KHUB_STATUS_UNSUPPORTED);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "t/kv 1.0 :: cache: a kv_cache op has methods");
    void *state = (void *)1;
    ASSERT(khub_binding_methods(b, &state) == &kv_methods_marker);
    ASSERT(state == NULL);
    const khub_op_desc *op = khub_binding_acquire(b, &state);
    ASSERT(op != NULL && op->methods == &kv_methods_marker);
    ASSERT_EQ(atomic_load(&p->inflight), 1);
    ASSERT(khub_binding_acquire(b, NULL) != NULL);
    ASSERT_EQ(atomic_load(&p->inflight), 2);
    khub_binding_release(b);
    khub_binding_release(b);
    ASSERT_EQ(atomic_load(&p->inflight), 0);
    khub_binding_release(b); /* unmatched: ignored */
    ASSERT_EQ(atomic_load(&p->inflight), 0);
    /* A bound plugin cannot be unloaded. */
    ASSERT_STATUS(khub_plugin_unload(rt, p), KHUB_STATUS_BUSY);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "unload t/kv 1.0: 1 binding(s) use it");
    khub_runtime_free(rt);
}

#define TEST_LIST(X) \
    X(trace_lists_every_candidate) \
    X(reject_dtype) \
    X(reject_head_dim) \
    X(reject_missing_flag) \
    X(reject_device_wants_cuda) \
    X(tie_goes_to_earlier_load) \
    X(preferred_beats_priority) \
    X(fallback_warns_with_reason) \
    X(fallback_when_not_loaded) \
    X(strict_refuses_fallback) \
    X(no_candidate) \
    X(query_validated) \
    X(call_runs_bound_op) \
    X(call_error_names_op_and_plugin_text) \
    X(methods_ops_and_pins)
TEST_MAIN(TEST_LIST)
