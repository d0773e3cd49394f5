/*
 * plugin.c: the ref-cpu entry point, "khub/ref-cpu".
 *
 * Lists the reference ops (attention, linear, qlinear, kv_cache,
 * rms_norm, silu_and_mul, rotary, static_cache and, since ABI 1.4,
 * quantized_cache, quantized_cache_int4, paged_cache, paged_attention,
 * sliding_cache and offloaded_cache, and since ABI 1.5 embedding) and owns the plugin
 * state. The same source builds as a module (khub_add_plugin defines KHUB_PLUGIN_MODULE, so
 * KHUB_PLUGIN_DEFINE_KINDS exports khub_plugin_init_v1 and the ABI note) or
 * links in statically, where an embedder registers khub_ref_cpu_init.
 */
#include <math.h>

#include "ref_cpu.h"

#define KHUB_REF_ID      "khub/ref-cpu"
#define KHUB_REF_VERSION "0.1.0"
#define KHUB_REF_KINDS \
    (KHUB_KIND_BIT(KHUB_OP_ATTENTION) | KHUB_KIND_BIT(KHUB_OP_LINEAR) | \
     KHUB_KIND_BIT(KHUB_OP_QLINEAR) | KHUB_KIND_BIT(KHUB_OP_KV_CACHE) | \
     KHUB_KIND_BIT(KHUB_OP_NORM) | KHUB_KIND_BIT(KHUB_OP_ACTIVATION) | \
     KHUB_KIND_BIT(KHUB_OP_ROTARY) | KHUB_REF_KINDS_1_4)
#define KHUB_REF_KINDS_1_4 \
    (KHUB_KIND_BIT(KHUB_OP_PAGED_ATTENTION) | KHUB_KIND_BIT(KHUB_OP_EMBEDDING)) /* 8: 1.4, 9: 1.5 \
                                                                                 */

static int32_t ref_score(void *state)
{
    (void)state;
    return 1; /* runs on any CPU; optimized plugins should score higher */
}

static khub_status ref_selftest_fail(char *errbuf, size_t n, const char *msg)
{
    if (errbuf && n) {
        size_t len = strlen(msg) < n - 1 ? strlen(msg) : n - 1;
        memcpy(errbuf, msg, len);
        errbuf[len] = '\0';
    }
    return KHUB_STATUS_ERROR;
}

/* Known answers: a Q4_0 block, an f16 round trip and a two-key attention
 * whose softmax weights are 1/4 and 3/4 (scores 0 and ln 3), so out = 3. */
static khub_status ref_selftest(void *state, char *errbuf, size_t errbuf_size)
{
    uint8_t q40[18] = {0x00, 0x40}; /* d = 2.0 */
    for (int l = 0; l < 16; l++) q40[2 + l] = (uint8_t)(l | ((15 - l) << 4));
    float w[32];
    khub_ref__dequantize_row(KHUB_QFORMAT_Q4_0, q40, 32, w);
    if (w[0] != -16.0f || w[15] != 14.0f || w[16] != 14.0f || w[31] != -16.0f)
        return ref_selftest_fail(errbuf, errbuf_size, "ref-cpu selftest: q4_0 dequantize");
    if (khub_pu_f16_to_f32(khub_pu_f32_to_f16(0.1f)) != 0.0999755859375f)
        return ref_selftest_fail(errbuf, errbuf_size, "ref-cpu selftest: f16 rounding");
    float q[1] = {1.0f}, k[2] = {0.0f, 1.0986122886681098f}, v[2] = {0.0f, 4.0f}, out[1];
    int64_t sq[3] = {1, 1, 1}, skv[3] = {2, 1, 1};
    khub_tensor tq = {q, {KHUB_DEVICE_CPU, 0}, 3, KHUB_DTYPE_F32, sq, NULL, 0};
    khub_tensor tk = {k, {KHUB_DEVICE_CPU, 0}, 3, KHUB_DTYPE_F32, skv, NULL, 0};
    khub_tensor tv = {v, {KHUB_DEVICE_CPU, 0}, 3, KHUB_DTYPE_F32, skv, NULL, 0};
    khub_tensor to = {out, {KHUB_DEVICE_CPU, 0}, 3, KHUB_DTYPE_F32, sq, NULL, 0};
    khub_attention_args a = {KHUB_STRUCT_INIT(khub_attention_args),
                             .q = &tq,
                             .k = &tk,
                             .v = &tv,
                             .out = &to,
                             .scale = 1.0f};
    if (khub_ref__attention_op.run(state, &a) != KHUB_STATUS_OK || fabsf(out[0] - 3.0f) > 1e-6f)
        return ref_selftest_fail(errbuf, errbuf_size, "ref-cpu selftest: attention softmax");
    return KHUB_STATUS_OK;
}

static void ref_shutdown(void *state)
{
    khub_ref_state *s = state;
    if (s) s->host->free(s->host->host_ctx, s);
}

/* Copies the descriptors into one array (the host reads ops[] as a
 * contiguous array, and each file owns its own descriptor). */
static khub_op_desc ref_ops_table(int i)
{
    switch (i) {
    case 0: return khub_ref__attention_op;
    case 1: return khub_ref__linear_op;
    case 2: return khub_ref__qlinear_op;
    case 3: return khub_ref__kv_cache_op;
    case 4: return khub_ref__norm_op;
    case 5: return khub_ref__activation_op;
    case 6: return khub_ref__rotary_op;
    case 7: return khub_ref__static_cache_op;
    case 8: return khub_ref__quantized_cache_op;
    case 9: return khub_ref__quantized_cache_int4_op;
    case 10: return khub_ref__paged_cache_op;
    case 11: return khub_ref__paged_attention_op;
    case 12: return khub_ref__sliding_cache_op;
    case 13: return khub_ref__offloaded_cache_op;
    default: return khub_ref__embedding_op;
    }
}

#define KHUB_REF_N_OPS 15

/* The host table must reach the last function ref-cpu calls (n_threads). */
static bool ref_host_ok(const khub_host_api *host)
{
    return host && KHUB_HAS_FIELD(host, khub_host_api, n_threads) && host->fail && host->alloc &&
           host->free && host->parallel_for;
}

khub_status khub_ref_cpu_init(const khub_host_api *host, khub_plugin_desc *out, char *errbuf,
                              size_t errbuf_size);

/* Entry: validates the host table, allocates the state (freed by
 * shutdown) and fills out. The op array lives in the state so it is
 * contiguous and dies with the plugin. */
khub_status khub_ref_cpu_init(const khub_host_api *host, khub_plugin_desc *out, char *errbuf,
                              size_t errbuf_size)
{
    if (!ref_host_ok(host) || !out) {
        if (errbuf && errbuf_size) {
            static const char msg[] = "khub/ref-cpu: host table lacks fail/alloc/free/"
                                      "parallel_for/n_threads (want a khub host of ABI >= 1.0)";
            size_t n = sizeof msg < errbuf_size ? sizeof msg : errbuf_size;
            memcpy(errbuf, msg, n);
            errbuf[n - 1] = '\0';
        }
        return KHUB_STATUS_STRUCT_SIZE;
    }
    typedef struct {
        khub_ref_state st;
        khub_op_desc ops[KHUB_REF_N_OPS];
    } ref_block;
    ref_block *b = host->alloc(host->host_ctx, sizeof *b);
    if (!b) {
        if (errbuf && errbuf_size) {
            static const char msg[] = "khub/ref-cpu: out of memory allocating the plugin state";
            size_t n = sizeof msg < errbuf_size ? sizeof msg : errbuf_size;
            memcpy(errbuf, msg, n);
            errbuf[n - 1] = '\0';
        }
        return KHUB_STATUS_NOMEM;
    }
    b->st.host = host;
    for (int i = 0; i < KHUB_REF_N_OPS; i++) b->ops[i] = ref_ops_table(i);
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),
                          .id = KHUB_REF_ID,
                          .version = KHUB_REF_VERSION,
                          .n_ops = KHUB_REF_N_OPS,
                          .ops = b->ops,
                          .state = &b->st,
                          .score = ref_score,
                          .selftest = ref_selftest,
                          .shutdown = ref_shutdown};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE_KINDS(khub_ref_cpu_init, KHUB_REF_ID, KHUB_REF_VERSION, KHUB_REF_KINDS)
