/*
 * test_kv_cache_model.c: KV cache strategies inside a model (issue 13 item
 * 4), on the tiny random Gemma 3 folder (tests/fixtures/gemma3_tiny: five
 * sliding layers with a 4-token window, then a global one):
 *
 *   - the sliding-window cache gives bit-identical logits to the dynamic
 *     cache over sequences ten times the window, two sequences per call,
 *     prefill in chunks of several sizes then decode, with khub/ref-cpu's
 *     attention and with the default kernels; its memory stays bounded
 *     (every windowed slot at 16 rows) and it reports 1/6 of the dense
 *     bytes per token;
 *   - the offloaded cache with a budget smaller than the cache gives
 *     bit-identical logits with layers in its file tier (a mapping of an
 *     unlinked khub-kv-* file), and reports the dense bytes;
 *   - a KV cache plugin of the ABI 1.3 era (tests/plugins/kv13.c: no
 *     memory or view_from method, 40-byte config) loads into this 1.4 host
 *     and serves the model with the dynamic cache's logits.
 */
#include <math.h>
#include <unistd.h>

#include "executor.h"
#include "plugins/tp_util.h"
#include "runner.h"

#define FOLDER KHUB_SOURCE_DIR "/tests/fixtures/gemma3_tiny"
#define N_TOK  40 /* ten windows */

static khub_model *load(khub_runtime *rt, const char *attn, const char *cache)
{
    khub_model_opts o = {KHUB_STRUCT_INIT(khub_model_opts), .attn_impl = attn, .cache_impl = cache,
                         .max_seqs = 2, .max_context = 64};
    khub_model *m = NULL;
    khub_status st = khub_model_load(rt, FOLDER, &o, &m);
    if (st) fprintf(stderr, "  %s\n", khub_runtime_errmsg(rt));
    ASSERT_OK(st);
    return m;
}

/* Feeds two sequences (ids and ids reversed) together: the first `prefill`
 * tokens in chunks of `chunk`, then one token per call; out receives both
 * sequences' logits after every call, [calls][2][vocab]. Returns the
 * number of calls. */
static int feed(khub_model *m, const int32_t *ids, int prefill, int chunk, float *out)
{
    int64_t V = m->cfg.vocab_size;
    int32_t rev[N_TOK], buf[2 * N_TOK];
    for (int i = 0; i < N_TOK; i++) rev[i] = ids[N_TOK - 1 - i];
    ASSERT_OK(khub__forward_reset(m, 0));
    ASSERT_OK(khub__forward_reset(m, 1));
    int calls = 0;
    for (int pos = 0; pos < N_TOK; calls++) {
        int n = pos < prefill ? (prefill - pos < chunk ? prefill - pos : chunk) : 1;
        memcpy(buf, ids + pos, (size_t)n * sizeof *buf);
        memcpy(buf + n, rev + pos, (size_t)n * sizeof *buf);
        khub__seg segs[2] = {{0, 0, pos, n}, {1, 0, pos, n}};
        ASSERT_OK(khub__forward(m, buf, segs, 2));
        memcpy(out + (size_t)calls * 2 * (size_t)V, m->logits, 2 * (size_t)V * sizeof(float));
        pos += n;
    }
    return calls;
}

static void tokens(int32_t *ids)
{
    for (int i = 0; i < N_TOK; i++) ids[i] = 2 + (i * 37 + 11) % 200;
}

static khub_kv_cache_memory memory_of(khub_model *m)
{
    khub_kv_cache_memory mem = {KHUB_STRUCT_INIT(khub_kv_cache_memory)};
    ASSERT_OK(m->kv->memory(m->kv_state, m->cache, &mem));
    return mem;
}

/* Runs feed on the dynamic cache and on `cache`, for several chunkings,
 * and requires bit-identical logits. Returns the models' memory after the
 * last run through *dyn and *got. */
static void same_as_dynamic(const char *attn, const char *cache, khub_kv_cache_memory *dyn,
                            khub_kv_cache_memory *got, khub_model_info *info_dyn,
                            khub_model_info *info_got)
{
    khub_runtime *rt = tp_runtime(2);
    ASSERT_OK(khub_plugin_load_builtin(rt));
    khub_model *a = load(rt, attn, NULL), *b = load(rt, attn, cache);
    size_t per = 2 * (size_t)a->cfg.vocab_size;
    float *la = malloc(N_TOK * per * sizeof(float)), *lb = malloc(N_TOK * per * sizeof(float));
    ASSERT(la && lb);
    int32_t ids[N_TOK];
    tokens(ids);
    static const int plan[][2] = {{N_TOK, 7}, {12, 12}, {1, 1}, {9, 3}, {N_TOK, 13}};
    for (size_t p = 0; p < sizeof plan / sizeof plan[0]; p++) {
        int ca = feed(a, ids, plan[p][0], plan[p][1], la);
        int cb = feed(b, ids, plan[p][0], plan[p][1], lb);
        ASSERT_EQ(ca, cb);
        double worst = 0;
        for (size_t i = 0; i < (size_t)ca * per; i++) worst = fmax(worst, fabs(la[i] - lb[i]));
        fprintf(stderr, "  %s %s prefill %d in chunks of %d: %d calls, max |diff| %.3g\n",
                attn ? attn : "default kernels", cache, plan[p][0], plan[p][1], ca, worst);
        ASSERT(memcmp(la, lb, (size_t)ca * per * sizeof(float)) == 0);
    }
    *dyn = memory_of(a);
    *got = memory_of(b);
    *info_dyn = (khub_model_info){KHUB_STRUCT_INIT(khub_model_info)};
    *info_got = (khub_model_info){KHUB_STRUCT_INIT(khub_model_info)};
    ASSERT_OK(khub_model_info_get(a, info_dyn));
    ASSERT_OK(khub_model_info_get(b, info_got));
    free(la), free(lb);
    khub_model_free(a), khub_model_free(b);
    khub_runtime_free(rt);
}

TEST_IMPL(sliding_cache_equals_dynamic_on_gemma3_tiny)
{
    const char *attns[2] = {"khub/ref-cpu", NULL};
    for (int i = 0; i < 2; i++) {
        khub_kv_cache_memory dyn, sw;
        khub_model_info idyn, isw;
        same_as_dynamic(attns[i], "khub/ref-cpu:sliding_cache", &dyn, &sw, &idyn, &isw);
        /* one global layer of six keeps every position: a sixth of the dense
         * bytes per token; each windowed slot holds 16 rows (2W = 8 < 16,
         * W - 1 + 13 = 16), whatever the length */
        ASSERT_EQ(isw.kv_bytes_per_token * 6, idyn.kv_bytes_per_token);
        uint64_t row2 = idyn.kv_bytes_per_token / 6; /* K and V of one position, one layer */
        uint64_t global = dyn.bytes_total / 6;       /* every dense layer grew alike */
        ASSERT_EQ(sw.bytes_total, global + 5 * 2 * 16 * row2);
        ASSERT(sw.bytes_total < dyn.bytes_total / 2);
        ASSERT_EQ(sw.tokens_used, dyn.tokens_used);
        fprintf(stderr, "  memory: dynamic %llu bytes, sliding %llu bytes for 2 x %d tokens\n",
                (unsigned long long)dyn.bytes_total, (unsigned long long)sw.bytes_total, N_TOK);
    }
}

/* /proc/self/maps has the offloaded cache's file mapped. */
static int file_tier_mapped(void) { return tp_mapped("/khub-kv-"); }

TEST_IMPL(offloaded_cache_equals_dynamic_on_gemma3_tiny)
{
    char dir[] = "/tmp/khub-offload-XXXXXX", cache[256];
    ASSERT(mkdtemp(dir) != NULL);
    /* gemma3_tiny: one KV head of 256 dims, f32: a slot of 16 rows takes
     * 32 KiB (K and V), so 100K keeps three slots in memory, the rest goes
     * to the file. */
    snprintf(cache, sizeof cache, "khub/ref-cpu:offloaded_cache,budget=100K,dir=%s", dir);
    khub_kv_cache_memory dyn, off;
    khub_model_info idyn, ioff;
    same_as_dynamic(NULL, cache, &dyn, &off, &idyn, &ioff);
    ASSERT_EQ(ioff.kv_bytes_per_token, idyn.kv_bytes_per_token);
    ASSERT_EQ(off.bytes_total, dyn.bytes_total); /* the same slots, in two tiers */
    ASSERT(!file_tier_mapped());                 /* unmapped with the model */
    ASSERT_EQ(rmdir(dir), 0);                    /* and nothing left in dir */
}

/* The file tier really holds layers while the model runs. */
TEST_IMPL(offloaded_cache_uses_its_file_tier)
{
    char dir[] = "/tmp/khub-offload-XXXXXX", cache[256];
    ASSERT(mkdtemp(dir) != NULL);
    snprintf(cache, sizeof cache, "khub/ref-cpu:offloaded_cache,budget=1,dir=%s", dir);
    khub_runtime *rt = tp_runtime(2);
    ASSERT_OK(khub_plugin_load_builtin(rt));
    khub_model *m = load(rt, NULL, cache);
    ASSERT_CONTAINS(khub_model_explain(m), "kv_cache[f32]: khub/ref-cpu 0.1.0 :: offloaded_cache");
    int32_t ids[N_TOK];
    tokens(ids);
    ASSERT(file_tier_mapped());
    ASSERT_OK(khub__forward_reset(m, 0));
    khub__seg seg = {0, 0, 0, 8};
    ASSERT_OK(khub__forward(m, ids, &seg, 1));
    int64_t tk[3], ts[3], vk[3], vs[3];
    khub_tensor k = {.shape = tk, .strides = ts}, v = {.shape = vk, .strides = vs};
    ASSERT_OK(m->kv->view(m->kv_state, m->cache, 3, 0, 8, &k, &v));
    /* the view's data lies inside the mapping of the khub-kv file */
    FILE *f = fopen("/proc/self/maps", "r");
    ASSERT(f != NULL);
    char line[1024];
    int inside = 0;
    while (!inside && fgets(line, sizeof line, f)) {
        unsigned long lo = 0, hi = 0;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && strstr(line, "/khub-kv-"))
            inside = (uintptr_t)k.data >= lo && (uintptr_t)k.data < hi;
    }
    fclose(f);
    ASSERT(inside);
    khub_model_free(m);
    khub_runtime_free(rt);
    ASSERT_EQ(rmdir(dir), 0);
}

/* A 1.3-era cache plugin serves the model; the host asks it for nothing
 * 1.4 added (no memory line in explain, kv_bytes_per_token 0). */
TEST_IMPL(cache_plugin_of_abi_1_3_runs)
{
    khub_runtime *rt = tp_runtime(2);
    ASSERT_OK(khub_plugin_load_builtin(rt));
    khub_plugin *p = tp_load(rt, "kv_1_3");
    uint16_t major = 0, minor = 0;
    khub_plugin_abi(p, &major, &minor);
    ASSERT_EQ(major, 1);
    ASSERT_EQ(minor, 3);
    khub_model *a = load(rt, NULL, NULL), *b = load(rt, NULL, "khub-test/kv-1-3");
    const char *ex = khub_model_explain(b);
    ASSERT_CONTAINS(ex, "kv_cache[f32]: khub-test/kv-1-3 1.3.0 :: kv_cache");
    ASSERT(strstr(ex, "kv_cache memory:") == NULL);
    ASSERT(!b->kv_view_from);
    khub_model_info info = {KHUB_STRUCT_INIT(khub_model_info)};
    ASSERT_OK(khub_model_info_get(b, &info));
    ASSERT_EQ(info.kv_bytes_per_token, 0);
    size_t per = 2 * (size_t)a->cfg.vocab_size;
    float *la = malloc(N_TOK * per * sizeof(float)), *lb = malloc(N_TOK * per * sizeof(float));
    ASSERT(la && lb);
    int32_t ids[N_TOK];
    tokens(ids);
    int ca = feed(a, ids, 10, 4, la), cb = feed(b, ids, 10, 4, lb);
    ASSERT_EQ(ca, cb);
    double worst = 0, top = 0;
    for (size_t i = 0; i < (size_t)ca * per; i++) {
        worst = fmax(worst, fabs(la[i] - lb[i]));
        top = fmax(top, fabs(la[i]));
    }
    fprintf(stderr, "  1.3 cache vs dynamic: max |diff| %.3g of max |logit| %.3g\n", worst, top);
    ASSERT_LE(worst, 1e-6 * top);
    free(la), free(lb);
    khub_model_free(a), khub_model_free(b);
    khub_runtime_free(rt);
}

#define TEST_LIST(X) \
    X(sliding_cache_equals_dynamic_on_gemma3_tiny) \
    X(offloaded_cache_equals_dynamic_on_gemma3_tiny) \
    X(offloaded_cache_uses_its_file_tier) \
    X(cache_plugin_of_abi_1_3_runs)
TEST_MAIN(TEST_LIST)
