/*
 * comm.c: a plugin that communicates through the host's collectives (ABI
 * 1.5, host->comm_*; issue 18 item 3). Its "silu_and_mul" computes
 * silu(gate) * up and, at every call, checks the job through the host:
 *   - comm_info gives rank r of size s;
 *   - comm_all_reduce_sum of {1, r, r * r} must give {s, s(s-1)/2, sum r^2};
 *   - comm_all_gather of {r, -r} (i32) must give {0, 0, 1, -1, ...}.
 * A wrong answer fails the call with the numbers, so a model that runs on it
 * at tp 2 (tests/test_tp.c, ranks as threads) proves that every rank's op
 * met the others'; in one process the host's job of one passes the same
 * checks. The 1.4 build (comm_1_4) must not see the three functions.
 */
#include <math.h>

#include <khub/khub_plugin.h>

#if KHUB_PLUGIN_TARGET_MINOR >= 5
#define COMM_ID "khub-test/comm"
#else
#define COMM_ID "khub-test/comm-1-4"
#endif

static const khub_host_api *g_host;

#if KHUB_PLUGIN_TARGET_MINOR >= 5
/* The three collectives against what they must give; OK or the failure. */
static khub_status check_job(void)
{
    const khub_host_api *h = g_host;
    if (!KHUB_HAS_FIELD(h, khub_host_api, comm_all_gather))
        return h->fail(h->host_ctx, KHUB_STATUS_UNSUPPORTED, "comm: the host has no collectives");
    int32_t r = -1, s = 0;
    khub_status st = h->comm_info(h->host_ctx, &r, &s);
    if (st != KHUB_STATUS_OK) return st;
    float v[3] = {1.0f, (float)r, (float)(r * r)};
    int64_t n3 = 3, n2 = 2, n2s = 2 * (int64_t)s;
    khub_tensor t = {.data = v,
                     .device = {KHUB_DEVICE_CPU, 0},
                     .ndim = 1,
                     .dtype = KHUB_DTYPE_F32,
                     .shape = &n3};
    if ((st = h->comm_all_reduce_sum(h->host_ctx, &t)) != KHUB_STATUS_OK) return st;
    float sq = 0;
    for (int32_t k = 0; k < s; k++) sq += (float)(k * k);
    if (v[0] != (float)s || v[1] != (float)(s * (s - 1) / 2) || v[2] != sq)
        return h->fail(h->host_ctx, KHUB_STATUS_INTERNAL,
                       "comm: rank %d of %d: all-reduce gave {%g, %g, %g}, want {%d, %d, %g}",
                       (int)r, (int)s, v[0], v[1], v[2], (int)s, (int)(s * (s - 1) / 2), sq);
    int32_t mine[2] = {r, -r}, all[2 * 64];
    if (s > 64) return KHUB_STATUS_OK;
    khub_tensor a = {.data = mine,
                     .device = {KHUB_DEVICE_CPU, 0},
                     .ndim = 1,
                     .dtype = KHUB_DTYPE_I32,
                     .shape = &n2};
    khub_tensor b = {.data = all,
                     .device = {KHUB_DEVICE_CPU, 0},
                     .ndim = 1,
                     .dtype = KHUB_DTYPE_I32,
                     .shape = &n2s};
    if ((st = h->comm_all_gather(h->host_ctx, &a, &b)) != KHUB_STATUS_OK) return st;
    for (int32_t k = 0; k < s; k++)
        if (all[2 * k] != k || all[2 * k + 1] != -k)
            return h->fail(h->host_ctx, KHUB_STATUS_INTERNAL,
                           "comm: rank %d of %d: all-gather gave {%d, %d} for rank %d", (int)r,
                           (int)s, (int)all[2 * k], (int)all[2 * k + 1], (int)k);
    return KHUB_STATUS_OK;
}
#else
_Static_assert(sizeof(khub_host_api) == 176, "a 1.4 target sees no 1.5 host entries");
static khub_status check_job(void) { return KHUB_STATUS_OK; }
#endif

static khub_status act(void *state, const void *args)
{
    (void)state;
    const khub_activation_args *a = args;
    if (a->act_type != KHUB_ACT_SILU)
        return g_host->fail(g_host->host_ctx, KHUB_STATUS_UNSUPPORTED, "comm: SiLU only");
    khub_status st = check_job();
    if (st != KHUB_STATUS_OK) return st;
    int64_t n = a->gate->shape[0] * a->gate->shape[1];
    const float *g = a->gate->data, *u = a->up->data;
    float *y = a->y->data;
    for (int64_t i = 0; i < n; i++) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    return KHUB_STATUS_OK;
}

static const khub_op_caps caps = {KHUB_STRUCT_INIT(khub_op_caps), .device_type = KHUB_DEVICE_CPU,
                                  .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32)};
static const khub_op_desc ops[] = {{KHUB_STRUCT_INIT(khub_op_desc), .name = "silu_and_mul",
                                    .kind = KHUB_OP_ACTIVATION, .caps = &caps, .run = act}};

static khub_status init(const khub_host_api *host, khub_plugin_desc *out, char *errbuf,
                        size_t errbuf_size)
{
    (void)errbuf, (void)errbuf_size;
    g_host = host;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc), .id = COMM_ID, .version = "1.0.0",
                          .n_ops = 1, .ops = ops};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE(init, COMM_ID, "1.0.0")
