/*
 * test_kv_strategies.c: the cache strategies of ref-cpu (issue 13 item 4)
 * through the same fake host as test_ref_ops (leaks and every message
 * checked): the quantized caches' write/view/truncate semantics, their
 * round-trip error bounds against the group scales, the residual window
 * kept exact, memory per token, and refused options; the sliding-window
 * cache's dropping, views, refusals and memory (test_kv_offload.c has the
 * offloaded cache; test_kv_cache_model.c both inside a model).
 */
#include <khub/khub.h>

#include "gguf.h"
#include "kv_host.h"
#include "ref_oracle.h"

/* The largest error a group of G values of x may get: half a step of the
 * group's scale (int8: absmax / 127; int4: (max - min) / 15), plus f16
 * rounding of the stored scale and minimum. */
static double group_bound(const float *x, int64_t G, int bits)
{
    float lo = x[0], hi = x[0], amax = 0;
    for (int64_t i = 0; i < G; i++) {
        lo = fminf(lo, x[i]), hi = fmaxf(hi, x[i]);
        amax = fmaxf(amax, fabsf(x[i]));
    }
    double step = bits == 8 ? amax / 127.0 : (hi - lo) / 15.0;
    double mnerr = bits == 8 ? 0 : fabs(lo) / 1024.0;
    return 0.5 * step * 1.01 + mnerr + (bits == 8 ? 128 : 16) * step / 1024.0;
}

/* int8 and int4, f32 and f16 views: 50 tokens written as 7 + 43 with a
 * residual window of 8 and groups of 4 along head_dim 8: positions 0..41
 * are quantized within their groups' bounds (and not all exact), 42..49
 * are bit-exact; truncate and rewrite keep the semantics of the dense
 * cache; memory reports the record size per token. */
TEST_IMPL(quantized_round_trip_and_residual)
{
    setup();
    const int64_t H = 2, D = 8, N = 50, R = 8, G = 4;
    for (int bits = 4; bits <= 8; bits += 4) {
        for (int f16 = 0; f16 < 2; f16++) {
            const char *name = bits == 8 ? "quantized_cache" : "quantized_cache_int4";
            const khub_kv_cache_methods *m = op(name)->methods;
            khub_kv_cache *c = cache_new(name, 2, (int32_t)H, (int32_t)D, 2, 64,
                                         f16 ? KHUB_DTYPE_F16 : KHUB_DTYPE_F32,
                                         "q_group_size=4,residual_length=8,axis_key=token");
            float *k = fbuf((size_t)(N * H * D)), *v = fbuf((size_t)(N * H * D));
            oracle_rng r = {7};
            oracle_fill(&r, k, (size_t)(N * H * D), -3, 3);
            oracle_fill(&r, v, (size_t)(N * H * D), -1, 2);
            ASSERT_OK(put(name, c, 1, 0, 0, k, v, 7, H, D));
            ASSERT_OK(put(name, c, 1, 0, 7, k + 7 * H * D, v + 7 * H * D, N - 7, H, D));
            int64_t ks[3], kst[3], vs[3], vst[3];
            khub_tensor kt = {.shape = ks, .strides = kst}, vt = {.shape = vs, .strides = vst};
            ASSERT_OK(m->view(g_desc.state, c, 1, 0, N, &kt, &vt));
            ASSERT_EQ(ks[0], N);
            ASSERT_EQ(ks[1], H);
            ASSERT_EQ(ks[2], D);
            ASSERT_EQ(kt.dtype.bits, f16 ? 16 : 32);
            int inexact = 0;
            double worst = 0;
            for (int64_t i = 0; i < N * H * D; i++) {
                int64_t t = i / (H * D), h = (i / D) % H, d = i % D;
                const float *kg = k + (i / G) * G, *vg = v + (i / G) * G;
                float gk = view_at(&kt, t, h, d), gv = view_at(&vt, t, h, d);
                if (t >= N - R) { /* the residual window: exact (f16: rounded once) */
                    float wk = f16 ? khub_pu_f16_to_f32(khub_pu_f32_to_f16(k[i])) : k[i];
                    float wv = f16 ? khub_pu_f16_to_f32(khub_pu_f32_to_f16(v[i])) : v[i];
                    ASSERT(gk == wk && gv == wv);
                    continue;
                }
                double f16e = f16 ? 3.0 / 1024 : 0; /* the view's own f16 rounding */
                double ek = fabs(gk - k[i]), ev = fabs(gv - v[i]);
                ASSERT(ek <= group_bound(kg, G, bits) + f16e);
                ASSERT(ev <= group_bound(vg, G, bits) + f16e);
                inexact += ek > 0 || ev > 0;
                worst = fmax(worst, ek);
            }
            ASSERT(inexact > 0); /* the old positions really are quantized */
            printf("  int%d %s: worst K error %.4f\n", bits, f16 ? "f16" : "f32", worst);
            khub_kv_cache_memory mem = {KHUB_STRUCT_INIT(khub_kv_cache_memory)};
            ASSERT_OK(m->memory(g_desc.state, c, &mem));
            /* per token and layer: codes H*D*bits/8, then per group of 4 an
             * f16 scale (int8) or scale and minimum (int4); K and V */
            uint64_t rec = (uint64_t)(H * D * bits / 8 + (H * D / G) * (bits == 8 ? 2 : 4));
            ASSERT_EQ(mem.bytes_per_token, rec * 2 * 2);
            ASSERT_EQ(mem.tokens_used, N);
            ASSERT_EQ(mem.tokens_capacity, 64);
            /* truncate into the quantized part, then rewrite: gaps refused */
            ASSERT_OK(m->truncate(g_desc.state, c, 0, 20));
            ASSERT_FAILS(put(name, c, 1, 0, 21, k, v, 1, H, D), KHUB_STATUS_INVALID_ARG,
                         "pos (got 21, want 0..20");
            ASSERT_FAILS(m->view(g_desc.state, c, 1, 0, 21, &kt, &vt), KHUB_STATUS_INVALID_ARG,
                         "n (got 21, want 0..20, the length of layer 1 seq 0)");
            ASSERT_OK(put(name, c, 1, 0, 20, k, v, 1, H, D)); /* position 20 = token 0 */
            ASSERT_OK(m->view(g_desc.state, c, 1, 0, 21, &kt, &vt));
            float w0 = f16 ? khub_pu_f16_to_f32(khub_pu_f32_to_f16(k[3])) : k[3];
            ASSERT(view_at(&kt, 20, 0, 3) == w0); /* newest: in the residual, exact */
            m->destroy(g_desc.state, c);
            free(k), free(v);
        }
    }
    ASSERT_NO_LEAKS();
}

/* residual_length 0 quantizes every token at once; a rewrite below the
 * quantized boundary requantizes in place; the default group is 64. */
TEST_IMPL(quantized_no_residual_and_rewrite)
{
    setup();
    const int64_t H = 1, D = 64, N = 5;
    const char *name = "quantized_cache_int4";
    const khub_kv_cache_methods *m = op(name)->methods;
    khub_kv_cache *c =
        cache_new(name, 1, 1, 64, 1, 16, KHUB_DTYPE_F32, "residual_length=0,axis_key=token");
    float k[5 * 64], v[5 * 64];
    for (int i = 0; i < N * D; i++) k[i] = (float)(i % 16), v[i] = (float)(i % 16) - 8;
    ASSERT_OK(put(name, c, 0, 0, 0, k, v, N, H, D));
    int64_t ks[3], kst[3], vs[3], vst[3];
    khub_tensor kt = {.shape = ks, .strides = kst}, vt = {.shape = vs, .strides = vst};
    ASSERT_OK(m->view(g_desc.state, c, 0, 0, N, &kt, &vt));
    /* 0..15 in a group: min 0, step 1, exactly representable */
    for (int i = 0; i < N * D; i++) ASSERT(view_at(&kt, i / D, 0, i % D) == k[i]);
    float k2[64], v2[64];
    for (int i = 0; i < D; i++) k2[i] = 100.0f, v2[i] = -100.0f;
    ASSERT_OK(put(name, c, 0, 0, 2, k2, v2, 1, H, D)); /* rewrite position 2 */
    ASSERT_OK(m->view(g_desc.state, c, 0, 0, N, &kt, &vt));
    ASSERT(view_at(&kt, 2, 0, 5) == 100.0f && view_at(&vt, 2, 0, 5) == -100.0f);
    ASSERT(view_at(&kt, 3, 0, 5) == k[3 * 64 + 5]);
    khub_kv_cache_memory mem = {KHUB_STRUCT_INIT(khub_kv_cache_memory)};
    ASSERT_OK(m->memory(g_desc.state, c, &mem));
    ASSERT_EQ(mem.bytes_per_token, (64 / 2 + 4) * 2); /* one group of 64: 36 bytes, K and V */
    m->destroy(g_desc.state, c);
    ASSERT_NO_LEAKS();
}

/* The worst error of the quantized keys of positions [0, n) on every
 * channel but the outlier (channel 3 of head 0). */
static double key_error_off_outlier(const khub_tensor *kt, const float *k, int64_t n, int64_t H,
                                    int64_t D)
{
    double worst = 0;
    for (int64_t i = 0; i < n * H * D; i++)
        if (i % (H * D) != 3)
            worst = fmax(worst, fabs(view_at(kt, i / (H * D), (i / D) % H, i % D) - k[i]));
    return worst;
}

/* axis_key=channel (KIVI, the default): keys quantized per channel in blocks of
 * q_group_size tokens, values per token. 50 tokens (7 + 43), blocks of 4,
 * no residual: 48 positions quantized, each key within half a step of its
 * channel-block's range, values within their token groups' bounds, the
 * last 2 exact. One outlier channel (x100) spoils a per-token group of
 * keys but not the other channels of a per-channel block. A truncate
 * inside a block moves its kept positions, as they were, into the
 * residual; a rewrite below qlen requantizes its block. */
TEST_IMPL(quantized_channel_keys)
{
    setup();
    const int64_t H = 2, D = 8, N = 50, T = 4, HD = H * D;
    for (int bits = 4; bits <= 8; bits += 4) {
        const char *name = bits == 8 ? "quantized_cache" : "quantized_cache_int4";
        const khub_kv_cache_methods *m = op(name)->methods;
        float *k = fbuf((size_t)(N * HD)), *v = fbuf((size_t)(N * HD)), col[4];
        oracle_rng r = {11};
        oracle_fill(&r, k, (size_t)(N * HD), -1, 1);
        oracle_fill(&r, v, (size_t)(N * HD), -1, 2);
        for (int64_t t = 0; t < N; t++) k[t * HD + 3] = 100.0f + (float)t; /* the outlier */
        double off[2] = {0, 0};
        for (int chan = 0; chan < 2; chan++) {
            khub_kv_cache *c = cache_new(name, 1, (int32_t)H, (int32_t)D, 1, 64, KHUB_DTYPE_F32,
                                         chan ? "q_group_size=4,residual_length=0"
                                              : "q_group_size=4,residual_length=0,axis_key=token");
            ASSERT_OK(put(name, c, 0, 0, 0, k, v, 7, H, D));
            ASSERT_OK(put(name, c, 0, 0, 7, k + 7 * HD, v + 7 * HD, N - 7, H, D));
            int64_t ks[3], kst[3], vs[3], vst[3];
            khub_tensor kt = {.shape = ks, .strides = kst}, vt = {.shape = vs, .strides = vst};
            ASSERT_OK(m->view(g_desc.state, c, 0, 0, N, &kt, &vt));
            off[chan] = key_error_off_outlier(&kt, k, 48, H, D);
            if (!chan) {
                m->destroy(g_desc.state, c);
                continue;
            }
            for (int64_t i = 0; i < N * HD; i++) {
                int64_t t = i / HD, ch = i % HD;
                float gk = view_at(&kt, t, ch / D, ch % D), gv = view_at(&vt, t, ch / D, ch % D);
                if (t >= 48) { /* the partial block: exact */
                    ASSERT(gk == k[i] && gv == v[i]);
                    continue;
                }
                for (int64_t j = 0; j < T; j++) col[j] = k[(t - t % T + j) * HD + ch];
                ASSERT(fabs(gk - k[i]) <= group_bound(col, T, bits));
                ASSERT(fabs(gv - v[i]) <= group_bound(v + (i / T) * T, T, bits));
            }
            khub_kv_cache_memory mem = {KHUB_STRUCT_INIT(khub_kv_cache_memory)};
            ASSERT_OK(m->memory(g_desc.state, c, &mem));
            /* a key block: 4 tokens of codes + 16 channels x (s[, m]); values per token */
            uint64_t codes = (uint64_t)(HD * bits / 8), par = bits == 8 ? 2 : 4;
            uint64_t krec = (T * codes + HD * par + T - 1) / T, vrec = codes + HD / T * par;
            ASSERT_EQ(mem.bytes_per_token, krec + vrec);
            ASSERT_EQ(mem.tokens_used, N);
            /* truncate inside block 5 (20..23): 20 and 21 stay as they read */
            float k20 = view_at(&kt, 20, 1, 2), k21 = view_at(&kt, 21, 0, 0);
            float v21 = view_at(&vt, 21, 1, 7);
            ASSERT_OK(m->truncate(g_desc.state, c, 0, 22));
            ASSERT_OK(m->view(g_desc.state, c, 0, 0, 22, &kt, &vt));
            ASSERT(view_at(&kt, 20, 1, 2) == k20 && view_at(&kt, 21, 0, 0) == k21);
            ASSERT(view_at(&vt, 21, 1, 7) == v21);
            /* grow again from 22: 22..25 re-form block 5 with 20 and 21 */
            ASSERT_OK(put(name, c, 0, 0, 22, k + 22 * HD, v + 22 * HD, 8, H, D));
            ASSERT_OK(m->view(g_desc.state, c, 0, 0, 30, &kt, &vt));
            ASSERT(view_at(&kt, 29, 1, 1) == k[29 * HD + 9]); /* 28, 29: exact */
            for (int64_t j = 0; j < T; j++) col[j] = k[(24 + j) * HD + 5];
            ASSERT(fabs(view_at(&kt, 25, 0, 5) - k[25 * HD + 5]) <= group_bound(col, T, bits));
            /* rewrite position 5 below qlen: its block is requantized around it */
            float nk[16], nv[16];
            for (int i = 0; i < 16; i++) nk[i] = 7.0f, nv[i] = -7.0f;
            ASSERT_OK(put(name, c, 0, 0, 5, nk, nv, 1, H, D));
            ASSERT_OK(m->view(g_desc.state, c, 0, 0, 30, &kt, &vt));
            ASSERT(fabs(view_at(&kt, 5, 1, 4) - 7.0f) < 0.6);
            ASSERT(fabs(view_at(&vt, 5, 0, 0) + 7.0f) < 0.01);
            ASSERT(fabs(view_at(&kt, 6, 1, 4) - k[6 * HD + 12]) < 0.6);
            m->destroy(g_desc.state, c);
        }
        printf("  int%d keys off the outlier channel: per token %.4f, per channel %.4f\n", bits,
               off[0], off[1]);
        ASSERT(off[1] * 4 < off[0]);
        free(k), free(v);
    }
    ASSERT_NO_LEAKS();
}

/* Bad options are refused with the cache, the key and what it accepts. */
TEST_IMPL(quantized_bad_options)
{
    setup();
    const khub_kv_cache_methods *m = op("quantized_cache")->methods;
    khub_kv_cache_config cfg = {KHUB_STRUCT_INIT(khub_kv_cache_config),
                                .n_layers = 1,
                                .n_kv_heads = 2,
                                .head_dim = 8,
                                .n_seqs = 1,
                                .max_tokens = 8,
                                .dtype = KHUB_DTYPE_F32};
    khub_kv_cache *c = NULL;
    static const struct {
        const char *opts, *msg;
    } bad[] = {
        {"q_group_size=0", "quantized_cache.create: q_group_size (got 0, want a divisor of "
                           "head_dim 8)"},
        {"q_group_size=3", "q_group_size (got 3, want a divisor of head_dim 8)"},
        {"q_group_size=1", "q_group_size (got 1, want an even number)"},
        {"q_group_size=-4", "option q_group_size (got \"-4\", want a non-negative integer)"},
        {"group=4", "quantized_cache.create: unknown option \"group\" (keys: q_group_size, "
                    "residual_length, axis_key)"},
        {"axis_key=row", "quantized_cache.create: axis_key (got \"row\", want token or channel)"},
        {"residual_length", "option \"residual_length\" is not key=value"},
        {"residual_length=99999999999999999999", "option residual_length (got 9999"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cfg.options = bad[i].opts;
        ASSERT_FAILS(m->create(g_desc.state, &cfg, &c), KHUB_STATUS_INVALID_ARG, bad[i].msg);
        ASSERT(c == NULL);
    }
    /* a 1.3 host's config (40 bytes) has no options: defaults apply */
    cfg.options = "q_group_size=0";
    cfg.struct_size = 40;
    ASSERT_OK(m->create(g_desc.state, &cfg, &c));
    m->destroy(g_desc.state, c);
    ASSERT_NO_LEAKS();
}

/* ------------------------------------------------------------------------ */
/* The sliding-window cache                                                 */
/* ------------------------------------------------------------------------ */

#define SW "sliding_cache"

static khub_status sw_new(const int64_t *win, int32_t layers, khub_dtype dt, const char *options,
                          khub_kv_cache **c)
{
    khub_kv_cache_config cfg = {KHUB_STRUCT_INIT(khub_kv_cache_config),
                                .n_layers = layers,
                                .n_kv_heads = 2,
                                .head_dim = 3,
                                .n_seqs = 2,
                                .max_tokens = 64,
                                .dtype = dt,
                                .options = options,
                                .layer_window = win};
    *c = NULL;
    g_err[0] = '\0';
    return kvm(SW)->create(g_desc.state, &cfg, c);
}

/* Value of token p, head h, dim d (K; V is its negation): distinct, and
 * exact in f16 (< 2048). */
static float sw_val(int64_t p, int64_t h, int64_t d) { return (float)(p * 8 + h * 4 + d); }

static khub_status sw_put(khub_kv_cache *c, int32_t layer, int32_t seq, int64_t pos, int64_t n)
{
    float k[32 * 6], v[32 * 6];
    for (int64_t i = 0; i < n * 6; i++) {
        k[i] = sw_val(pos + i / 6, (i / 3) % 2, i % 3);
        v[i] = -k[i];
    }
    return put(SW, c, layer, seq, pos, k, v, n, 2, 3);
}

/* view_from of [first, n): every position holds its own values. */
static int64_t sw_check_view(khub_kv_cache *c, int32_t layer, int32_t seq, int64_t n)
{
    int64_t ks[3], kst[3], vs[3], vst[3], first = -1;
    khub_tensor kt = {.shape = ks, .strides = kst}, vt = {.shape = vs, .strides = vst};
    ASSERT_OK(kvm(SW)->view_from(g_desc.state, c, layer, seq, n, &first, &kt, &vt));
    ASSERT(first >= 0 && first <= n);
    ASSERT_EQ(ks[0], n - first);
    for (int64_t i = 0; i < n - first; i++)
        for (int64_t h = 0; h < 2; h++)
            for (int64_t d = 0; d < 3; d++) {
                ASSERT(view_at(&kt, i, h, d) == sw_val(first + i, h, d));
                ASSERT(view_at(&vt, i, h, d) == -sw_val(first + i, h, d));
            }
    return first;
}

/* Layer 0 has a window of 4, layer 1 none: one token at a time, then
 * chunks. Layer 0 keeps what the window reaches back from the last write's
 * first position (at least), bounded storage; layer 1 keeps everything. */
TEST_IMPL(sliding_keeps_the_window)
{
    setup();
    const khub_kv_cache_methods *m = op(SW)->methods;
    int64_t win[2] = {4, 0};
    khub_kv_cache *c = NULL;
    ASSERT_OK(sw_new(win, 2, KHUB_DTYPE_F32, NULL, &c));
    int64_t pos = 0;
    static const int64_t chunks[] = {1, 1, 1, 1, 1, 1, 7, 1, 13, 1, 1, 20, 1, 1};
    for (size_t i = 0; i < sizeof chunks / sizeof chunks[0]; i++) {
        for (int32_t l = 0; l < 2; l++) ASSERT_OK(sw_put(c, l, 1, pos, chunks[i]));
        int64_t f0 = sw_check_view(c, 0, 1, pos + chunks[i]);
        ASSERT(f0 <= (pos - 3 > 0 ? pos - 3 : 0)); /* the first query reaches back W - 1 */
        ASSERT_EQ(sw_check_view(c, 1, 1, pos + chunks[i]), 0);
        pos += chunks[i];
    }
    ASSERT(sw_check_view(c, 0, 1, pos) > 0); /* it did drop */
    khub_kv_cache_memory mem = {KHUB_STRUCT_INIT(khub_kv_cache_memory)};
    ASSERT_OK(m->memory(g_desc.state, c, &mem));
    ASSERT_EQ(mem.bytes_per_token, 2 * 6 * 4); /* layer 1 only: K and V of 2 x 3 f32 */
    ASSERT_EQ(mem.tokens_used, pos);
    ASSERT_EQ(mem.tokens_capacity, 64);
    /* layer 1 grew to 64 rows (50 tokens); layer 0 to W - 1 + 20 -> 32 */
    ASSERT_EQ(mem.bytes_total, (64 + 32) * 6 * 4 * 2);
    /* seq 0 untouched */
    ASSERT_EQ(sw_check_view(c, 0, 0, 0), 0);
    m->destroy(g_desc.state, c);
    ASSERT_NO_LEAKS();
}

/* What the cache cannot do once it dropped positions is refused with the
 * numbers, changing nothing. */
TEST_IMPL(sliding_refusals)
{
    setup();
    const khub_kv_cache_methods *m = op(SW)->methods;
    int64_t win[2] = {4, 0};
    khub_kv_cache *c = NULL;
    ASSERT_OK(sw_new(win, 2, KHUB_DTYPE_F32, NULL, &c));
    for (int64_t p = 0; p < 20; p++)
        for (int32_t l = 0; l < 2; l++) ASSERT_OK(sw_put(c, l, 0, p, 1));
    int64_t base = sw_check_view(c, 0, 0, 20);
    ASSERT(base > 0 && base <= 16);
    int64_t ks[3], kst[3], vs[3], vst[3], first;
    khub_tensor kt = {.shape = ks, .strides = kst}, vt = {.shape = vs, .strides = vst};
    char msg[256];
    snprintf(msg, sizeof msg,
             "sliding_cache.view: layer 0 seq 0 dropped positions below %lld (window 4); read "
             "it with view_from (a host of ABI 1.4)",
             (long long)base);
    ASSERT_FAILS(m->view(g_desc.state, c, 0, 0, 20, &kt, &vt), KHUB_STATUS_UNSUPPORTED, msg);
    ASSERT_OK(m->view(g_desc.state, c, 1, 0, 20, &kt, &vt)); /* layer 1 dropped nothing */
    snprintf(msg, sizeof msg, "sliding_cache.view_from: n (got %lld, want %lld..20",
             (long long)base - 1, (long long)base);
    ASSERT_FAILS(m->view_from(g_desc.state, c, 0, 0, base - 1, &first, &kt, &vt),
                 KHUB_STATUS_INVALID_ARG, msg);
    /* a write needs the W - 1 positions before it */
    snprintf(msg, sizeof msg, "sliding_cache.write: pos (got %lld, want %lld..20",
             (long long)base + 2, (long long)base + 3);
    ASSERT_FAILS(sw_put(c, 0, 0, base + 2, 1), KHUB_STATUS_INVALID_ARG, msg);
    ASSERT_OK(sw_put(c, 0, 0, 19, 1)); /* rewriting the newest is fine */
    /* truncate: refused (for every layer) when a layer lacks what a write at
     * n needs; 0 always works */
    snprintf(msg, sizeof msg,
             "sliding_cache.truncate: seq 0 to 5 tokens: layer 0 keeps positions from %lld only "
             "(window 4), a write at 5 needs them from 2 (truncate to 0 and recompute)",
             (long long)base);
    ASSERT_FAILS(m->truncate(g_desc.state, c, 0, 5), KHUB_STATUS_UNSUPPORTED, msg);
    ASSERT_EQ(sw_check_view(c, 1, 0, 20), 0); /* layer 1 still has all 20 */
    ASSERT_OK(m->truncate(g_desc.state, c, 0, 19));
    ASSERT_FAILS(m->view_from(g_desc.state, c, 0, 0, 20, &first, &kt, &vt), KHUB_STATUS_INVALID_ARG,
                 "n (got 20, want");
    ASSERT_EQ(sw_check_view(c, 0, 0, 19), base);
    ASSERT_OK(m->truncate(g_desc.state, c, 0, 0));
    ASSERT_OK(sw_put(c, 0, 0, 0, 3));
    ASSERT_EQ(sw_check_view(c, 0, 0, 3), 0);
    m->destroy(g_desc.state, c);
    /* config */
    ASSERT_FAILS(sw_new(win, 2, KHUB_DTYPE_F32, "window=8", &c), KHUB_STATUS_INVALID_ARG,
                 "sliding_cache.create: unknown option \"window\" (keys: none)");
    ASSERT(c == NULL);
    int64_t bad[2] = {4, -1};
    ASSERT_FAILS(sw_new(bad, 2, KHUB_DTYPE_F32, NULL, &c), KHUB_STATUS_INVALID_ARG,
                 "sliding_cache.create: layer_window[1] (got -1, want >= 0; 0 = no window)");
    ASSERT(c == NULL);
    ASSERT_NO_LEAKS();
}

/* No layer_window (a model without windows, or a 1.3 host's 40-byte
 * config): every layer keeps everything, like the dynamic cache; f16
 * storage rounds once; out of memory at any allocation is NOMEM and leaks
 * nothing. */
TEST_IMPL(sliding_without_windows_f16_and_oom)
{
    setup();
    khub_kv_cache *c = NULL;
    ASSERT_OK(sw_new(NULL, 2, KHUB_DTYPE_F16, NULL, &c));
    for (int64_t p = 0; p < 30; p += 3) ASSERT_OK(sw_put(c, 0, 0, p, 3));
    ASSERT_EQ(sw_check_view(c, 0, 0, 30), 0); /* the values are exact in f16 */
    khub_kv_cache_memory mem = {KHUB_STRUCT_INIT(khub_kv_cache_memory)};
    ASSERT_OK(kvm(SW)->memory(g_desc.state, c, &mem));
    ASSERT_EQ(mem.bytes_per_token, 2 * 2 * 6 * 2); /* both layers, f16 */
    kvm(SW)->destroy(g_desc.state, c);
    int64_t win[2] = {4, 4};
    int failed = 0;
    for (int k = 1; k < 20; k++) {
        g_fail_allocs = k;
        khub_status st = sw_new(win, 2, KHUB_DTYPE_F32, NULL, &c);
        for (int64_t p = 0; st == KHUB_STATUS_OK && p < 40; p += 5) st = sw_put(c, 1, 1, p, 5);
        g_fail_allocs = 0;
        if (st != KHUB_STATUS_OK) {
            ASSERT_EQ(st, KHUB_STATUS_NOMEM);
            ASSERT_CONTAINS(g_err, "sliding_cache.");
            failed++;
        }
        kvm(SW)->destroy(g_desc.state, c);
        ASSERT_NO_LEAKS();
    }
    ASSERT(failed >= 3);
}

#define TEST_LIST(X) \
    X(sliding_keeps_the_window) \
    X(sliding_refusals) \
    X(sliding_without_windows_f16_and_oom) \
    X(quantized_round_trip_and_residual) \
    X(quantized_no_residual_and_rewrite) \
    X(quantized_channel_keys) \
    X(quantized_bad_options)
TEST_MAIN(TEST_LIST)
