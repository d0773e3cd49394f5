/*
 * test_batch.c: continuous batching (khub_batch.h; runtime/executor/batch.c,
 * scheduler.c, kv_budget.c) on a tiny random Llama written here (token-id
 * prompts; SmolLM2 with text prompts is test_batch_smollm2.c). Every greedy output of a batch must
 * equal the same request run alone: with requests joining mid-run, chunked prefill mixed with
 * decode, preemption forced by a small KV limit, and cancellation; bad input gets its status and
 * message, whole in error_full when it is longer than error's 255 bytes; no KV is left held.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "executor.h"
#include "khub/khub_batch.h"
#include "runner.h"
#include "tiny_llama.h"

/* ======================================================================== */
/* A tiny random Llama (tiny_llama.h): 2 layers, vocab 256                   */
/* ======================================================================== */

enum { H = 64, F = 128, L = 2, NH = 4, NKV = 2, HD = 16, V = 256 };

/* The tiny model of this file, written into dir. */
static void tiny_write(const char *dir)
{
    tiny_llama t = {.hidden = H,
                    .ffn = F,
                    .layers = L,
                    .heads = NH,
                    .kv_heads = NKV,
                    .head_dim = HD,
                    .vocab = V};
    tiny_llama_write(dir, &t);
}

static const char *tiny_dir(void)
{
    static char dir[128];
    snprintf(dir, sizeof dir, "/tmp/khub-test-batch-%d", (int)getpid());
    tiny_write(dir);
    return dir;
}

static void tiny_remove(const char *dir) { tiny_llama_rm(dir); }

typedef struct fixture {
    khub_runtime *rt;
    khub_model *m;
    const char *dir;
} fixture;

/* The tiny model with the default kernels, or with khub/ref-cpu for all;
 * its K/V stored as kv_dtype ({0} = f32) in cache (NULL = the default). */
static fixture tiny_open_kv(int ref, int max_seqs, int max_batch, int64_t max_context,
                            khub_dtype kv_dtype, const char *cache)
{
    fixture f = {0};
    khub_runtime_opts ro = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = 2};
    ASSERT_OK(khub_runtime_new(&ro, &f.rt));
    ASSERT_OK(khub_plugin_load_builtin(f.rt));
    const char *r = ref ? "khub/ref-cpu" : NULL;
    khub_model_opts mo = {KHUB_STRUCT_INIT(khub_model_opts),
                          .attn_impl = r,
                          .quant = r,
                          .cache_impl = cache ? cache : r,
                          .norm_impl = r,
                          .act_impl = r,
                          .rotary_impl = r,
                          .kv_dtype = kv_dtype,
                          .linear_impl = r,
                          .max_seqs = max_seqs,
                          .max_batch = max_batch,
                          .max_context = max_context};
    f.dir = tiny_dir();
    ASSERT_OK(khub_model_load(f.rt, f.dir, &mo, &f.m));
    return f;
}

static fixture tiny_open(int ref, int max_seqs, int max_batch, int64_t max_context)
{
    return tiny_open_kv(ref, max_seqs, max_batch, max_context, (khub_dtype){0}, NULL);
}

static void fixture_close(fixture *f)
{
    khub_model_free(f->m);
    khub_runtime_free(f->rt);
    if (f->dir) tiny_remove(f->dir);
}

/* ======================================================================== */
/* Requests and their solo runs                                             */
/* ======================================================================== */

enum { NREQ = 12 };

typedef struct reqset {
    int32_t ids[NREQ][48];
    khub_generate_opts opts[NREQ];
    khub_batch_request req[NREQ];
    int n;
} reqset;

/* n requests of 1..45 prompt tokens and 1..24 new tokens, greedy. */
static void make_reqs(reqset *s, int n)
{
    memset(s, 0, sizeof *s);
    s->n = n;
    for (int i = 0; i < n; i++) {
        int len = 1 + (i * 17) % 45;
        for (int k = 0; k < len; k++) s->ids[i][k] = 3 + (i * 31 + k * 7) % (V - 3);
        s->opts[i] = (khub_generate_opts){KHUB_STRUCT_INIT(khub_generate_opts),
                                          .max_new_tokens = 1 + (i * 5) % 24, .ignore_eos = 1};
        s->req[i] = (khub_batch_request){KHUB_STRUCT_INIT(khub_batch_request), .tokens = s->ids[i],
                                         .n_tokens = (size_t)len, .opts = &s->opts[i]};
    }
}

static khub_batch_result result(void)
{
    return (khub_batch_result){KHUB_STRUCT_INIT(khub_batch_result)};
}

/* Each request alone, then all together under cfg: the same tokens. */
static void check_equals_solo(khub_model *m, reqset *s, const khub_batch_config *cfg,
                              khub_batch_stats *after)
{
    khub_batch_result solo[NREQ], all[NREQ];
    for (int i = 0; i < s->n; i++) {
        solo[i] = result();
        all[i] = result();
        ASSERT_OK(khub_generate_batch(m, &s->req[i], 1, NULL, &solo[i]));
        ASSERT_EQ(solo[i].status, KHUB_STATUS_OK);
        ASSERT_EQ(solo[i].n_tokens, s->opts[i].max_new_tokens);
    }
    khub_batch *b = NULL;
    ASSERT_OK(khub_batch_new(m, cfg, &b));
    for (int i = 0; i < s->n; i++) ASSERT_OK(khub_batch_submit(b, &s->req[i], NULL));
    ASSERT_OK(khub_batch_run(b, 0));
    if (after) {
        *after = (khub_batch_stats){KHUB_STRUCT_INIT(khub_batch_stats)};
        ASSERT_OK(khub_batch_stats_get(b, after));
    }
    khub_batch_free(b);
    ASSERT_OK(khub_generate_batch(m, s->req, (size_t)s->n, cfg, all));
    for (int i = 0; i < s->n; i++) {
        ASSERT_EQ(all[i].status, KHUB_STATUS_OK);
        ASSERT_EQ(all[i].id, i + 1);
        ASSERT_EQ(all[i].n_tokens, solo[i].n_tokens);
        for (int64_t t = 0; t < solo[i].n_tokens; t++)
            if (all[i].tokens[t] != solo[i].tokens[t])
                TEST_FAIL_("request %d token %lld: batched %d, alone %d", i, (long long)t,
                           (int)all[i].tokens[t], (int)solo[i].tokens[t]);
    }
    /* Different prompts give different outputs (the comparison can fail). */
    ASSERT(memcmp(solo[3].tokens, solo[4].tokens, 4) != 0 ||
           memcmp(solo[5].tokens, solo[6].tokens, 4) != 0);
    khub_batch_results_free(m, solo, (size_t)s->n);
    khub_batch_results_free(m, all, (size_t)s->n);
}

/* ======================================================================== */
/* Equal to solo                                                            */
/* ======================================================================== */

static void check_tiny(int ref)
{
    /* 4 sequences, 16-token steps: 12 requests queue, join as others
     * finish, and long prompts are prefilled in chunks beside decodes. */
    fixture f = tiny_open(ref, 4, 16, 128);
    reqset s;
    make_reqs(&s, NREQ);
    khub_batch_config cfg = {KHUB_STRUCT_INIT(khub_batch_config), .max_batch_tokens = 16};
    khub_batch_stats st;
    check_equals_solo(f.m, &s, &cfg, &st);
    ASSERT_EQ(st.completed, NREQ);
    ASSERT_EQ(st.running, 0);
    ASSERT_EQ(st.queued, 0);
    ASSERT_EQ(st.kv_tokens_used, 0);
    ASSERT(st.steps > 0);
    fixture_close(&f);
}

TEST_IMPL(batch_tiny_ref_equals_solo) { check_tiny(1); }
TEST_IMPL(batch_tiny_default_kernels_equal_solo) { check_tiny(0); }

TEST_IMPL(batch_tiny_preemption_equals_solo)
{
    /* 4 slots of 128 tokens, but 80 KV tokens in all: requests of up to 68
     * tokens cannot all fit, so the latest admitted are preempted and
     * recomputed. */
    fixture f = tiny_open(0, 4, 16, 128);
    reqset s;
    make_reqs(&s, NREQ);
    khub_batch_config cfg = {KHUB_STRUCT_INIT(khub_batch_config), .max_batch_tokens = 16,
                             .max_kv_tokens = 80};
    khub_batch_stats st;
    check_equals_solo(f.m, &s, &cfg, &st);
    ASSERT(st.preemptions > 0);
    ASSERT_EQ(st.kv_tokens_used, 0);
    ASSERT_EQ(st.kv_tokens_limit, 80);
    fixture_close(&f);
}

/* The paged cache (issue 13 item 2) under the scheduler: a pool of 20
 * blocks of 4 tokens (80 tokens, less than the 4 x 128 slots) is what runs
 * out, so kv_budget.c answers from the free blocks, the scheduler preempts,
 * every request still equals its solo run, and the pool drains to empty. */
TEST_IMPL(batch_tiny_paged_pool_equals_solo)
{
    fixture f = {0};
    khub_runtime_opts ro = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = 2};
    ASSERT_OK(khub_runtime_new(&ro, &f.rt));
    ASSERT_OK(khub_plugin_load_builtin(f.rt));
    khub_model_opts mo = {KHUB_STRUCT_INIT(khub_model_opts),
                          .cache_impl = "khub/ref-cpu:paged_cache",
                          .max_seqs = 4,
                          .max_batch = 16,
                          .max_context = 128,
                          .kv_block_size = 4,
                          .kv_num_blocks = 20};
    f.dir = tiny_dir();
    ASSERT_OK(khub_model_load(f.rt, f.dir, &mo, &f.m));
    ASSERT_CONTAINS(khub_model_explain(f.m), "by KV layout paged_htd");
    ASSERT_EQ(khub__kv_capacity_tokens(f.m), 80);
    reqset s;
    make_reqs(&s, NREQ);
    khub_batch_config cfg = {KHUB_STRUCT_INIT(khub_batch_config), .max_batch_tokens = 16};
    khub_batch_stats st;
    check_equals_solo(f.m, &s, &cfg, &st);
    ASSERT(st.preemptions > 0);
    ASSERT_EQ(st.kv_tokens_used, 0);
    for (int32_t q = 0; q < 4; q++) ASSERT_OK(khub__kv_release(f.m, q));
    ASSERT_EQ(khub__kv_free_tokens(f.m), 80); /* every block back in the pool */
    fixture_close(&f);
}

/* f16 K/V (khub_model_opts.kv_dtype, `--kv-type f16`): the guarantee holds
 * per KV type. On the dense cache and on the paged pool, a batch on an f16
 * cache gives every request the tokens of its solo run on the same cache,
 * and the cache really stores f16: half the bytes per token of f32. */
TEST_IMPL(batch_tiny_f16_equals_solo)
{
    static const char *const caches[2] = {"khub/ref-cpu:kv_cache", "khub/ref-cpu:paged_cache"};
    for (int c = 0; c < 2; c++) {
        fixture f32 = tiny_open_kv(0, 4, 16, 128, KHUB_DTYPE_F32, caches[c]);
        khub_model_info i32 = {KHUB_STRUCT_INIT(khub_model_info)};
        ASSERT_OK(khub_model_info_get(f32.m, &i32));
        fixture_close(&f32);
        fixture f = tiny_open_kv(0, 4, 16, 128, KHUB_DTYPE_F16, caches[c]);
        ASSERT_CONTAINS(khub_model_explain(f.m), "kv_cache[f16]: khub/ref-cpu");
        khub_model_info info = {KHUB_STRUCT_INIT(khub_model_info)};
        ASSERT_OK(khub_model_info_get(f.m, &info));
        ASSERT_EQ(info.kv_bytes_per_token, (uint64_t)L * NKV * HD * 2 * 2);
        ASSERT_EQ(info.kv_bytes_per_token * 2, i32.kv_bytes_per_token);
        reqset s;
        make_reqs(&s, NREQ);
        khub_batch_config cfg = {KHUB_STRUCT_INIT(khub_batch_config), .max_batch_tokens = 16};
        check_equals_solo(f.m, &s, &cfg, NULL);
        fixture_close(&f);
    }
}

/* No cache named (issue 13 item 4): the library gives a model loaded for
 * several sequences the paged pool, --explain says so, and a batch on it
 * (khub_generate_batch with no config) equals every request run alone on a
 * model of one sequence, which keeps the dense cache. Naming the attention
 * or the cache keeps the dense cache for several sequences too. */
TEST_IMPL(batch_tiny_default_cache_is_paged)
{
    fixture f = tiny_open(0, 4, 16, 128);
    const char *ex = khub_model_explain(f.m);
    ASSERT_CONTAINS(ex, ":: paged_cache\n    the paged pool by default: 4 sequences (max_seqs) "
                        "and no cache or attention named\n");
    ASSERT_CONTAINS(ex, "by KV layout paged_htd");
    khub_model_opts one = {KHUB_STRUCT_INIT(khub_model_opts), .max_seqs = 1, .max_batch = 16,
                           .max_context = 128};
    khub_model *solo = NULL;
    ASSERT_OK(khub_model_load(f.rt, f.dir, &one, &solo));
    ASSERT_CONTAINS(khub_model_explain(solo), "kv_cache[f32]: khub/ref-cpu ");
    ASSERT_CONTAINS(khub_model_explain(solo), ":: kv_cache\n");
    ASSERT(strstr(khub_model_explain(solo), "paged_attention[") == NULL);
    static const char *const named[][2] = {{"khub/ref-cpu", NULL}, {NULL, "khub/ref-cpu"}};
    for (int i = 0; i < 2; i++) {
        khub_model_opts o = {KHUB_STRUCT_INIT(khub_model_opts), .attn_impl = named[i][0],
                             .cache_impl = named[i][1], .max_seqs = 4, .max_context = 128};
        khub_model *d = NULL;
        ASSERT_OK(khub_model_load(f.rt, f.dir, &o, &d));
        ASSERT_CONTAINS(khub_model_explain(d), ":: kv_cache\n");
        ASSERT(strstr(khub_model_explain(d), "paged_attention[") == NULL);
        khub_model_free(d);
    }
    reqset s;
    make_reqs(&s, NREQ);
    khub_batch_result alone[NREQ], all[NREQ];
    for (int i = 0; i < NREQ; i++) all[i] = result();
    ASSERT_OK(khub_generate_batch(f.m, s.req, NREQ, NULL, all));
    for (int i = 0; i < NREQ; i++) {
        alone[i] = result();
        ASSERT_OK(khub_generate_batch(solo, &s.req[i], 1, NULL, &alone[i]));
        ASSERT_EQ(all[i].status, KHUB_STATUS_OK);
        ASSERT_EQ(all[i].n_tokens, alone[i].n_tokens);
        ASSERT(memcmp(all[i].tokens, alone[i].tokens,
                      (size_t)alone[i].n_tokens * sizeof *alone[i].tokens) == 0);
    }
    ASSERT(memcmp(alone[3].tokens, alone[4].tokens, 4) != 0 ||
           memcmp(alone[5].tokens, alone[6].tokens, 4) != 0);
    khub_batch_results_free(solo, alone, NREQ);
    khub_batch_results_free(f.m, all, NREQ);
    khub_model_free(solo);
    fixture_close(&f);
}

/* ======================================================================== */
/* Step policy                                                              */
/* ======================================================================== */

/* Decodes go first (scheduler.c): while a 45-token prompt is prefilled in
 * chunks of max_batch_tokens, a running request gets one token in every
 * step, and the prompt takes only what the step has left (16 - 1 = 15
 * tokens), so it needs 3 steps; a step of the prompt alone would have
 * stalled the decoding request for them. */
TEST_IMPL(batch_tiny_decode_every_step_beside_prefill)
{
    fixture f = tiny_open(0, 2, 16, 128);
    int32_t a_ids[3] = {5, 9, 17}, b_ids[45];
    for (int k = 0; k < 45; k++) b_ids[k] = 3 + (k * 11) % (V - 3);
    khub_generate_opts o = {KHUB_STRUCT_INIT(khub_generate_opts), .max_new_tokens = 20,
                            .ignore_eos = 1};
    khub_batch_request ra = {KHUB_STRUCT_INIT(khub_batch_request), .tokens = a_ids, .n_tokens = 3,
                             .opts = &o};
    khub_batch_request rb = {KHUB_STRUCT_INIT(khub_batch_request), .tokens = b_ids, .n_tokens = 45,
                             .opts = &o};
    khub_batch_config cfg = {KHUB_STRUCT_INIT(khub_batch_config), .max_batch_tokens = 16};
    khub_batch *b = NULL;
    ASSERT_OK(khub_batch_new(f.m, &cfg, &b));
    ASSERT_OK(khub_batch_submit(b, &ra, NULL));
    int64_t pending = 0;
    ASSERT_OK(khub_batch_step(b, &pending)); /* A's prompt and its first token */
    khub_batch_stats st = {KHUB_STRUCT_INIT(khub_batch_stats)};
    ASSERT_OK(khub_batch_stats_get(b, &st));
    ASSERT_EQ(st.generated_tokens, 1);
    ASSERT_OK(khub_batch_submit(b, &rb, NULL));
    int64_t gen = st.generated_tokens, prompt = st.prompt_tokens;
    for (int step = 0; step < 3; step++) {
        ASSERT_OK(khub_batch_step(b, &pending));
        ASSERT_OK(khub_batch_stats_get(b, &st));
        /* step 3 also ends B's prompt: its first token */
        ASSERT_EQ(st.generated_tokens - gen, (step < 2 ? 1 : 2));
        ASSERT_EQ(st.prompt_tokens - prompt, 15);
        ASSERT_EQ(st.running, 2);
        gen = st.generated_tokens, prompt = st.prompt_tokens;
    }
    ASSERT_OK(khub_batch_run(b, 0));
    ASSERT_OK(khub_batch_stats_get(b, &st));
    ASSERT_EQ(st.generated_tokens, 40);
    ASSERT_EQ(st.completed, 2);
    khub_batch_free(b);
    fixture_close(&f);
}

/* ======================================================================== */
/* Cancellation                                                             */
/* ======================================================================== */

typedef struct done_log {
    khub_batch_result r[NREQ + 1]; /* by id, tokens copied */
    int32_t toks[NREQ + 1][64];
    int calls[NREQ + 1];
} done_log;

static void on_done(void *ud, uint64_t id, const khub_batch_result *r)
{
    done_log *d = ud;
    ASSERT(id >= 1 && id <= NREQ);
    d->calls[id]++;
    d->r[id] = *r;
    ASSERT(r->n_tokens <= 64);
    if (r->n_tokens) memcpy(d->toks[id], r->tokens, (size_t)r->n_tokens * 4);
    d->r[id].tokens = d->toks[id];
    d->r[id].text = NULL;
}

TEST_IMPL(batch_tiny_cancel_frees_kv)
{
    fixture f = tiny_open(0, 4, 16, 128);
    reqset s;
    make_reqs(&s, NREQ);
    static done_log d;
    memset(&d, 0, sizeof d);
    khub_batch_config cfg = {KHUB_STRUCT_INIT(khub_batch_config), .max_batch_tokens = 16};
    khub_batch *b = NULL;
    ASSERT_OK(khub_batch_new(f.m, &cfg, &b));
    for (int i = 0; i < NREQ; i++) {
        s.req[i].on_done = on_done;
        s.req[i].ud = &d;
        ASSERT_OK(khub_batch_submit(b, &s.req[i], NULL));
    }
    int64_t left = 0;
    for (int k = 0; k < 6; k++) ASSERT_OK(khub_batch_step(b, &left));
    khub_batch_stats st = {KHUB_STRUCT_INIT(khub_batch_stats)};
    ASSERT_OK(khub_batch_stats_get(b, &st));
    ASSERT(st.running > 0 && st.queued > 0 && st.kv_tokens_used > 0);
    /* One running (request 4 has 23 new tokens to go), one waiting. */
    ASSERT_EQ(d.calls[4], 0);
    ASSERT_OK(khub_batch_cancel(b, 4));
    ASSERT_OK(khub_batch_cancel(b, NREQ));
    ASSERT_STATUS(khub_batch_cancel(b, 999), KHUB_STATUS_NOT_FOUND);
    ASSERT_CONTAINS(khub_last_error(), "no request 999");
    ASSERT_OK(khub_batch_run(b, 0));
    ASSERT_OK(khub_batch_stats_get(b, &st));
    ASSERT_EQ(st.kv_tokens_used, 0);
    ASSERT_EQ(st.running, 0);
    ASSERT_EQ(st.completed, NREQ);
    ASSERT_EQ(khub__kv_free_tokens(f.m), khub__kv_capacity_tokens(f.m));
    /* Cancelling an ended request is NOT_FOUND. */
    ASSERT_STATUS(khub_batch_cancel(b, 1), KHUB_STATUS_NOT_FOUND);
    khub_batch_free(b);
    for (int id = 1; id <= NREQ; id++) {
        ASSERT_EQ(d.calls[id], 1);
        ASSERT_EQ(d.r[id].status, KHUB_STATUS_OK);
        bool cancelled = id == 4 || id == NREQ;
        ASSERT_EQ(d.r[id].stop_reason, cancelled ? KHUB_STOP_CANCELLED : KHUB_STOP_MAX_TOKENS);
        if (cancelled) continue;
        khub_batch_result one = result();
        s.req[id - 1].on_done = NULL;
        ASSERT_OK(khub_generate_batch(f.m, &s.req[id - 1], 1, NULL, &one));
        ASSERT_EQ(one.n_tokens, d.r[id].n_tokens);
        ASSERT(memcmp(one.tokens, d.toks[id], (size_t)one.n_tokens * 4) == 0);
        khub_batch_results_free(f.m, &one, 1);
    }
    ASSERT(d.r[4].n_tokens < s.opts[3].max_new_tokens);
    ASSERT_EQ(d.r[NREQ].n_tokens, 0);
    fixture_close(&f);
}

/* ======================================================================== */
/* Threads: a loop thread serves, the main thread submits                   */
/* ======================================================================== */

typedef struct server {
    khub_batch *b;
    khub_status st;
} server;

static void *serve(void *ud)
{
    server *s = ud;
    s->st = khub_batch_run(s->b, 1);
    return NULL;
}

typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    done_log log;
} waiter;

static void on_done_signal(void *ud, uint64_t id, const khub_batch_result *r)
{
    waiter *w = ud;
    pthread_mutex_lock(&w->mu);
    on_done(&w->log, id, r);
    w->done++;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

TEST_IMPL(batch_tiny_threads)
{
    fixture f = tiny_open(0, 4, 16, 128);
    reqset s;
    make_reqs(&s, NREQ);
    static waiter w;
    memset(&w, 0, sizeof w);
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    server sv = {0};
    ASSERT_OK(khub_batch_new(f.m, NULL, &sv.b));
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, serve, &sv), 0);
    for (int i = 0; i < NREQ; i++) {
        s.req[i].on_done = on_done_signal;
        s.req[i].ud = &w;
        uint64_t id = 0;
        ASSERT_OK(khub_batch_submit(sv.b, &s.req[i], &id));
        ASSERT_EQ(id, i + 1);
        if (i % 3 == 0) usleep(2000); /* some join a running batch */
    }
    pthread_mutex_lock(&w.mu);
    while (w.done < NREQ) pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    khub_batch_stop(sv.b);
    ASSERT_EQ(pthread_join(th, NULL), 0);
    ASSERT_OK(sv.st);
    khub_batch_free(sv.b);
    for (int i = 0; i < NREQ; i++) {
        khub_batch_result one = result();
        s.req[i].on_done = NULL;
        ASSERT_OK(khub_generate_batch(f.m, &s.req[i], 1, NULL, &one));
        ASSERT_EQ(w.log.r[i + 1].n_tokens, one.n_tokens);
        ASSERT(memcmp(one.tokens, w.log.toks[i + 1], (size_t)one.n_tokens * 4) == 0);
        khub_batch_results_free(f.m, &one, 1);
    }
    fixture_close(&f);
}

/* ======================================================================== */
/* Bad input                                                                */
/* ======================================================================== */

TEST_IMPL(batch_tiny_errors)
{
    fixture f = tiny_open(0, 2, 16, 32);
    khub_batch *b = NULL;
    khub_batch_config cfg = {KHUB_STRUCT_INIT(khub_batch_config), .max_batch_tokens = -1};
    ASSERT_STATUS(khub_batch_new(f.m, &cfg, &b), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt), "max_batch_tokens -1 is outside [1, 16]");
    cfg = (khub_batch_config){KHUB_STRUCT_INIT(khub_batch_config), .max_seqs = 3};
    ASSERT_STATUS(khub_batch_new(f.m, &cfg, &b), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt), "max_seqs 3 is outside [1, 2]");
    cfg = (khub_batch_config){KHUB_STRUCT_INIT(khub_batch_config), .max_kv_tokens = 65};
    ASSERT_STATUS(khub_batch_new(f.m, &cfg, &b), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt), "max_kv_tokens 65 is outside [1, 64]");
    cfg = (khub_batch_config){KHUB_STRUCT_INIT(khub_batch_config), .max_queue = 3};
    ASSERT_OK(khub_batch_new(f.m, &cfg, &b));

    int32_t ids[40];
    for (int k = 0; k < 40; k++) ids[k] = 5 + k;
    khub_generate_opts o = {KHUB_STRUCT_INIT(khub_generate_opts), .max_new_tokens = -2};
    khub_batch_request q = {KHUB_STRUCT_INIT(khub_batch_request), .tokens = ids, .n_tokens = 4,
                            .opts = &o};
    ASSERT_STATUS(khub_batch_submit(b, &q, NULL), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_last_error(), "khub_batch_submit: max_new_tokens -2");
    o.max_new_tokens = 4;
    q.prompt = "both";
    ASSERT_STATUS(khub_batch_submit(b, &q, NULL), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_last_error(), "needs a prompt or tokens (not both)");
    q.prompt = NULL;
    ids[2] = V;
    ASSERT_STATUS(khub_batch_submit(b, &q, NULL), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_last_error(), "token 2 is 256, outside the vocabulary [0, 256)");
    ids[2] = 7;
    const char *stops[] = {""};
    o.stop = stops;
    o.n_stop = 1;
    ASSERT_STATUS(khub_batch_submit(b, &q, NULL), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_last_error(), "stop string 0 is NULL or empty");
    o.n_stop = 0;

    /* A request longer than the cache fails alone; the others finish. */
    static done_log d;
    memset(&d, 0, sizeof d);
    q.on_done = on_done;
    q.ud = &d;
    ASSERT_OK(khub_batch_submit(b, &q, NULL));
    khub_batch_request big = q;
    big.n_tokens = 40; /* the slots hold 32 */
    ASSERT_OK(khub_batch_submit(b, &big, NULL));
    ASSERT_OK(khub_batch_submit(b, &q, NULL));
    ASSERT_STATUS(khub_batch_submit(b, &q, NULL), KHUB_STATUS_BUSY);
    ASSERT_CONTAINS(khub_last_error(), "3 requests are waiting (max_queue)");
    khub_batch_request text = {KHUB_STRUCT_INIT(khub_batch_request), .prompt = "hello"};
    (void)text;
    ASSERT_OK(khub_batch_run(b, 0));
    ASSERT_EQ(d.r[1].status, KHUB_STATUS_OK);
    ASSERT_EQ(d.r[1].n_tokens, 4);
    ASSERT_EQ(d.r[2].status, KHUB_STATUS_CONTEXT_FULL);
    ASSERT_CONTAINS(d.r[2].error, "request 2 has 40 tokens; the KV cache holds 32 per sequence");
    ASSERT_EQ(d.r[3].status, KHUB_STATUS_OK);
    /* The tiny model has no tokenizer: a text prompt fails when admitted. */
    text.on_done = on_done;
    text.ud = &d;
    ASSERT_OK(khub_batch_submit(b, &text, NULL));
    ASSERT_OK(khub_batch_run(b, 0));
    ASSERT_EQ(d.r[4].status, KHUB_STATUS_TOKENIZER);
    ASSERT_CONTAINS(d.r[4].error, "has no tokenizer");
    khub_batch_free(b);

    /* With a KV limit of 20 tokens in all, 24 tokens cannot run even alone. */
    cfg = (khub_batch_config){KHUB_STRUCT_INIT(khub_batch_config), .max_kv_tokens = 20};
    ASSERT_OK(khub_batch_new(f.m, &cfg, &b));
    big.n_tokens = 24;
    ASSERT_OK(khub_batch_submit(b, &big, NULL));
    ASSERT_OK(khub_batch_run(b, 0));
    ASSERT_EQ(d.r[1].status, KHUB_STATUS_CONTEXT_FULL);
    ASSERT_CONTAINS(d.r[1].error, "request 1 has 24 tokens; the batch's KV cache holds 20 in all");
    /* 16 tokens fit; generation then stops when the 20 are used. */
    big.n_tokens = 16;
    o.max_new_tokens = 10;
    ASSERT_OK(khub_batch_submit(b, &big, NULL));
    ASSERT_OK(khub_batch_run(b, 0));
    ASSERT_EQ(d.r[2].status, KHUB_STATUS_OK);
    ASSERT_EQ(d.r[2].stop_reason, KHUB_STOP_CONTEXT);
    ASSERT_EQ(d.r[2].n_tokens, 5);
    khub_batch_free(b);

    /* Three that each reach the 20-token limit, two slots: they preempt
     * each other, and each still ends at the limit, as alone (no livelock). */
    o.max_new_tokens = 30;
    big.n_tokens = 8;
    memset(&d, 0, sizeof d);
    ASSERT_OK(khub_batch_new(f.m, &cfg, &b));
    for (int i = 0; i < 3; i++) {
        ids[0] = 50 + i;
        ASSERT_OK(khub_batch_submit(b, &big, NULL));
    }
    ASSERT_OK(khub_batch_run(b, 0));
    khub_batch_stats st = {KHUB_STRUCT_INIT(khub_batch_stats)};
    ASSERT_OK(khub_batch_stats_get(b, &st));
    ASSERT(st.preemptions > 0);
    ASSERT_EQ(st.kv_tokens_used, 0);
    khub_batch_free(b);
    for (int id = 1; id <= 3; id++) {
        ASSERT_EQ(d.calls[id], 1);
        ASSERT_EQ(d.r[id].stop_reason, KHUB_STOP_CONTEXT);
        ASSERT_EQ(d.r[id].n_tokens, 13); /* 8 + 13 = 21: the 21st needs a 21st KV token */
    }
    fixture_close(&f);
}

/* ======================================================================== */
/* A failure's whole message                                                */
/* ======================================================================== */

/* khub_batch_result's layout: 0.1's fields where 0.1 put them, error_full
 * appended at 0.1's end (a 0.1 caller's elements are 360 bytes apart). */
_Static_assert(offsetof(khub_batch_result, error) == 104, "khub_batch_result.error");
_Static_assert(sizeof(((khub_batch_result *)0)->error) == 256, "khub_batch_result.error size");
_Static_assert(offsetof(khub_batch_result, error_full) == 360, "khub_batch_result.error_full");
_Static_assert(sizeof(khub_batch_result) == 368, "khub_batch_result");

static char long_full[KHUB_ERROR_SIZE], long_cut[256];
static khub_status long_status;

static void on_done_long(void *ud, uint64_t id, const khub_batch_result *r)
{
    (void)ud, (void)id;
    long_status = r->status;
    snprintf(long_full, sizeof long_full, "%s", r->error_full); /* borrowed: copied */
    snprintf(long_cut, sizeof long_cut, "%s", r->error);
}

/* A model folder named with 226 bytes makes a failure's message longer than
 * error's 255: error_full has it whole, from on_done (borrowed) and from
 * khub_generate_batch (owned, freed by khub_batch_results_free); a caller
 * built against 0.1's header (elements of 360 bytes, no error_full) gets
 * its results, error cut, nothing written past its array. */
TEST_IMPL(batch_tiny_long_error_is_whole)
{
    char dir[320], base[240];
    memset(base, 'x', 200);
    base[200] = '\0';
    snprintf(dir, sizeof dir, "/tmp/khub-test-batch-long-%d-%s", (int)getpid(), base);
    const char *name = strrchr(dir, '/') + 1;
    tiny_write(dir);
    khub_runtime_opts ro = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = 1};
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(&ro, &rt));
    ASSERT_OK(khub_plugin_load_builtin(rt));
    khub_model_opts mo = {KHUB_STRUCT_INIT(khub_model_opts), .max_seqs = 2, .max_batch = 16,
                          .max_context = 32};
    khub_model *m = NULL;
    ASSERT_OK(khub_model_load(rt, dir, &mo, &m));
    char want[KHUB_ERROR_SIZE];
    snprintf(want, sizeof want, "%s: the model has no tokenizer, so text prompts cannot be encoded",
             name);
    ASSERT(strlen(want) > 255);

    /* on_done: borrowed during the call */
    khub_batch *b = NULL;
    ASSERT_OK(khub_batch_new(m, NULL, &b));
    khub_batch_request text = {KHUB_APP_INIT(khub_batch_request), .prompt = "hello",
                               .on_done = on_done_long};
    ASSERT_OK(khub_batch_submit(b, &text, NULL));
    ASSERT_OK(khub_batch_run(b, 0));
    khub_batch_free(b);
    ASSERT_EQ(long_status, KHUB_STATUS_TOKENIZER);
    ASSERT_STR_EQ(long_full, want);
    ASSERT_EQ(strlen(long_cut), 255);
    ASSERT(strncmp(long_cut, want, 255) == 0);

    /* khub_generate_batch: owned by the result; "" when OK */
    int32_t ids[4] = {5, 6, 7, 8};
    khub_generate_opts o = {KHUB_APP_INIT(khub_generate_opts), .max_new_tokens = 2};
    khub_batch_request reqs[2] = {
        {KHUB_APP_INIT(khub_batch_request), .prompt = "hello"},
        {KHUB_APP_INIT(khub_batch_request), .tokens = ids, .n_tokens = 4, .opts = &o}};
    khub_batch_result res[2] = {{KHUB_APP_INIT(khub_batch_result)},
                                {KHUB_APP_INIT(khub_batch_result)}};
    ASSERT_OK(khub_generate_batch(m, reqs, 2, NULL, res));
    ASSERT_EQ(res[0].status, KHUB_STATUS_TOKENIZER);
    ASSERT_STR_EQ(res[0].error_full, want);
    ASSERT_EQ(strlen(res[0].error), 255);
    ASSERT_OK(res[1].status);
    ASSERT_STR_EQ(res[1].error_full, "");
    ASSERT_EQ(res[1].n_tokens, 2);
    khub_batch_results_free(m, res, 2);
    ASSERT(res[0].error_full == NULL);
    ASSERT_EQ(res[0].struct_size, sizeof res[0]);

    /* a 0.1 caller's array: elements of 360 bytes, then bytes of its own */
    const size_t size01 = offsetof(khub_batch_result, error_full), tail = 64;
    unsigned char *old = malloc(2 * size01 + tail);
    ASSERT(old != NULL);
    memset(old, 0, 2 * size01);
    memset(old + 2 * size01, 0xAB, tail);
    for (int i = 0; i < 2; i++) {
        khub_batch_result hdr = {KHUB_APP_INIT(khub_batch_result)};
        hdr.struct_size = (uint32_t)size01;
        memcpy(old + i * size01, &hdr, 8); /* the header: struct_size, stamp */
    }
    ASSERT_OK(khub_generate_batch(m, reqs, 2, NULL, (khub_batch_result *)old));
    khub_batch_result r0 = {0}, r1 = {0};
    memcpy(&r0, old, size01);
    memcpy(&r1, old + size01, size01);
    ASSERT_EQ(r0.struct_size, size01);
    ASSERT_EQ(r0.status, KHUB_STATUS_TOKENIZER);
    ASSERT_EQ(strlen(r0.error), 255);
    ASSERT(strncmp(r0.error, want, 255) == 0);
    ASSERT_EQ(r1.struct_size, size01);
    ASSERT_OK(r1.status);
    ASSERT_EQ(r1.n_tokens, 2);
    for (size_t k = 0; k < tail; k++) ASSERT_EQ(old[2 * size01 + k], 0xAB);
    khub_batch_results_free(m, (khub_batch_result *)old, 2);
    memcpy(&r1, old + size01, size01);
    ASSERT(r1.text == NULL && r1.tokens == NULL);
    ASSERT_EQ(r1.struct_size, size01);
    for (size_t k = 0; k < tail; k++) ASSERT_EQ(old[2 * size01 + k], 0xAB);
    /* elements of different sizes are refused: the stride is results[0]'s */
    memcpy(old + size01, &(uint32_t){(uint32_t)size01 + 8}, 4);
    ASSERT_STATUS(khub_generate_batch(m, reqs, 2, NULL, (khub_batch_result *)old),
                  KHUB_STATUS_STRUCT_SIZE);
    ASSERT_STR_EQ(khub_runtime_errmsg(rt),
                  "khub_generate_batch: results[1].struct_size 368 differs from results[0]'s 360 "
                  "(the array's elements are one struct)");
    free(old);
    khub_model_free(m);
    khub_runtime_free(rt);
    tiny_llama_rm(dir);
}

#define TEST_LIST(X) \
    X(batch_tiny_ref_equals_solo) \
    X(batch_tiny_default_kernels_equal_solo) \
    X(batch_tiny_preemption_equals_solo) \
    X(batch_tiny_paged_pool_equals_solo) \
    X(batch_tiny_f16_equals_solo) \
    X(batch_tiny_default_cache_is_paged) \
    X(batch_tiny_decode_every_step_beside_prefill) \
    X(batch_tiny_cancel_frees_kv) \
    X(batch_tiny_threads) X(batch_tiny_errors) X(batch_tiny_long_error_is_whole)
TEST_MAIN(TEST_LIST)
