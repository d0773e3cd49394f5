/*
 * test_session.c: khub_session (khub_session.h; runtime/executor/session.c)
 * on the tiny random Llama of tools/make-tiny-model.py (SmolLM2's tokenizer
 * and chat template). A turn that reuses the cache of the turns before it
 * gives exactly the tokens of the whole conversation run from scratch by
 * khub_model_generate, with only the new tokens prefilled; also after an
 * answer stopped by the stream callback, after another user took the
 * session's KV sequence, after a reset, and with an edited history. A
 * prompt over the context fails with its numbers and keeps the cache.
 * khub_session_cancel from another thread stops a long prefill part way,
 * keeps what was computed, and the next call goes on from there.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "khub/khub_session.h"
#include "runner.h"

typedef struct fixture {
    khub_runtime *rt;
    khub_model *m;
    khub_session *s; /* on m */
    char dir[128];
} fixture;

/* The tiny model, written by the script into a fresh folder; ref = khub/ref-cpu for every role. */
static fixture tiny_open(int ref, int max_seqs, int64_t max_context)
{
    fixture f = {0};
    snprintf(f.dir, sizeof f.dir, "/tmp/khub-test-session-%d", (int)getpid());
    char cmd[512];
    snprintf(cmd, sizeof cmd, "python3 %s/tools/make-tiny-model.py %s > /dev/null", KHUB_SOURCE_DIR,
             f.dir);
    ASSERT_EQ(system(cmd), 0);
    khub_runtime_opts ro = {KHUB_APP_INIT(khub_runtime_opts), .n_threads = 2};
    ASSERT_OK(khub_runtime_new(&ro, &f.rt));
    ASSERT_OK(khub_plugin_load_builtin(f.rt));
    const char *r = ref ? "khub/ref-cpu" : NULL;
    khub_model_opts mo = {KHUB_APP_INIT(khub_model_opts),
                          .attn_impl = r,
                          .cache_impl = r,
                          .norm_impl = r,
                          .act_impl = r,
                          .rotary_impl = r,
                          .linear_impl = r,
                          .max_seqs = max_seqs,
                          .max_batch = 16, /* prompts span several prefill chunks */
                          .max_context = max_context};
    ASSERT_OK(khub_model_load(f.rt, f.dir, &mo, &f.m));
    ASSERT_OK(khub_session_new(f.m, &f.s));
    return f;
}

static void fixture_close(fixture *f)
{
    khub_session_free(f->s);
    khub_model_free(f->m);
    khub_runtime_free(f->rt);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
    ASSERT_EQ(system(cmd), 0);
}

/* ======================================================================== */
/* A conversation                                                           */
/* ======================================================================== */

enum { MAXMSG = 8 };

typedef struct convo {
    const char *roles[MAXMSG];
    char *contents[MAXMSG];
    size_t n;
    char prompt[8192];
} convo;

static void say(convo *c, const char *role, const char *text)
{
    ASSERT(c->n < MAXMSG);
    c->roles[c->n] = role;
    c->contents[c->n++] = strdup(text);
}

static void convo_free(convo *c)
{
    for (size_t i = 0; i < c->n; i++) free(c->contents[i]);
    c->n = 0;
}

/* The conversation through the template, ready for the assistant's turn. */
static const char *prompt_of(khub_model *m, convo *c)
{
    size_t len = 0;
    ASSERT_OK(khub_model_chat_format(m, c->roles, (const char *const *)c->contents, c->n, 1,
                                     c->prompt, sizeof c->prompt, &len));
    return c->prompt;
}

static khub_generate_opts greedy(int max_new)
{
    return (khub_generate_opts){KHUB_APP_INIT(khub_generate_opts), .max_new_tokens = max_new};
}

static khub_generate_result result(void)
{
    return (khub_generate_result){KHUB_APP_INIT(khub_generate_result)};
}

static khub_session_info info_of(khub_session *s)
{
    khub_session_info i = {KHUB_APP_INIT(khub_session_info)};
    ASSERT_OK(khub_session_info_get(s, &i));
    return i;
}

/* khub_model_generate on prompt from scratch gives r's tokens. */
static void check_scratch(khub_model *m, const char *prompt, const khub_generate_opts *o,
                          const khub_generate_result *r)
{
    khub_generate_result ref = result();
    ASSERT_OK(khub_model_generate(m, &prompt, 1, o, &ref));
    ASSERT_EQ(ref.n_prompt_tokens, r->n_prompt_tokens);
    ASSERT_EQ(ref.n_tokens, r->n_tokens);
    for (int64_t t = 0; t < r->n_tokens; t++)
        if (ref.tokens[t] != r->tokens[t])
            TEST_FAIL_("token %lld: with the cache %d, from scratch %d", (long long)t,
                       (int)r->tokens[t], (int)ref.tokens[t]);
    ASSERT_STR_EQ(ref.text, r->text);
    khub_generate_results_free(m, &ref, 1);
}

/* Fed ids after an answer: the prompt and every answer token but the last
 * one sampled (an EOS is not an answer token, and the one before it was
 * fed to find it). */
static int64_t fed(const khub_generate_result *r)
{
    return r->n_prompt_tokens + r->n_tokens - (r->stop_reason == KHUB_STOP_EOS ? 0 : 1);
}

/* One turn on s: generate, check against scratch, add the answer. */
static void turn(fixture *f, khub_session *s, convo *c, const char *user, khub_generate_result *r)
{
    say(c, "user", user);
    khub_generate_opts o = greedy(12);
    *r = result();
    const char *prompt = prompt_of(f->m, c);
    ASSERT_OK(khub_session_generate(s, prompt, &o, r));
    ASSERT_EQ(info_of(s).n_cached, fed(r));
    check_scratch(f->m, prompt, &o, r);
    say(c, "assistant", r->text);
}

/* ======================================================================== */
/* Reuse equals scratch                                                     */
/* ======================================================================== */

static void three_turns(int ref)
{
    fixture f = tiny_open(ref, 2, 512);
    khub_session *s = f.s;
    convo c = {0};
    khub_generate_result r1, r2, r3;
    turn(&f, s, &c, "Hello there, how are you today?", &r1);
    khub_session_info i = info_of(s);
    ASSERT_EQ(i.n_reused, 0);
    ASSERT_EQ(i.n_prefilled, r1.n_prompt_tokens);
    ASSERT_EQ(i.max_context, 512);
    ASSERT(r1.n_tokens > 0);
    /* Turn 2 computes only the tail of answer 1 and the new message. The
     * khub_model_generate of check_scratch ran on sequence 0 in between:
     * the session's sequence (the last) was left alone. */
    turn(&f, s, &c, "Tell me more about that, please.", &r2);
    i = info_of(s);
    /* At least all of prompt 1 but its last token: the template's "\n" after
     * "assistant" may merge with the answer's first characters when the
     * text is tokenized again. */
    ASSERT(i.n_reused >= r1.n_prompt_tokens - 1);
    ASSERT_EQ(i.n_reused + i.n_prefilled, r2.n_prompt_tokens);
    ASSERT(i.n_prefilled <= r2.n_prompt_tokens - r1.n_prompt_tokens + 1);
    turn(&f, s, &c, "Thanks!", &r3);
    ASSERT(info_of(s).n_reused >= r2.n_prompt_tokens - 1);
    khub_generate_results_free(f.m, &r1, 1);
    khub_generate_results_free(f.m, &r2, 1);
    khub_generate_results_free(f.m, &r3, 1);
    convo_free(&c);
    fixture_close(&f);
}

TEST_IMPL(session_ref_turns_equal_scratch) { three_turns(1); }
TEST_IMPL(session_default_kernels_turns_equal_scratch) { three_turns(0); }

typedef struct stopper {
    int calls, stop_at;
} stopper;

static int stop_cb(void *ud, int32_t prompt, const char *text, size_t len)
{
    (void)text;
    (void)len;
    stopper *st = ud;
    ASSERT_EQ(prompt, 0);
    return ++st->calls >= st->stop_at;
}

/* An answer the callback stopped stays cached; the next turn goes on from it. */
TEST_IMPL(session_callback_stop_keeps_answer)
{
    fixture f = tiny_open(1, 2, 512);
    khub_session *s = f.s;
    convo c = {0};
    say(&c, "user", "Write a long story.");
    stopper st = {0, 3};
    khub_generate_opts o = greedy(40);
    o.ignore_eos = 1;
    o.callback = stop_cb;
    o.callback_ud = &st;
    khub_generate_result r = result();
    ASSERT_OK(khub_session_generate(s, prompt_of(f.m, &c), &o, &r));
    ASSERT_EQ(r.stop_reason, KHUB_STOP_CALLBACK);
    ASSERT_EQ(st.calls, 3);
    ASSERT(r.n_tokens < 40);
    ASSERT_EQ(info_of(s).n_cached, fed(&r));
    say(&c, "assistant", r.text);
    khub_generate_result r2;
    turn(&f, s, &c, "Go on.", &r2);
    ASSERT(info_of(s).n_reused >= r.n_prompt_tokens - 1);
    khub_generate_results_free(f.m, &r, 1);
    khub_generate_results_free(f.m, &r2, 1);
    convo_free(&c);
    fixture_close(&f);
}

/* Another user of the session's sequence, a reset, an edited history: the
 * session prefills what it must and still equals scratch. */
TEST_IMPL(session_taken_reset_edited)
{
    fixture f = tiny_open(1, 1, 512); /* one sequence: check_scratch takes it */
    khub_session *s = f.s;
    khub_session *s2 = NULL;
    ASSERT_STATUS(khub_session_new(f.m, &s2), KHUB_STATUS_BUSY);
    ASSERT(s2 == NULL);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt), "already has a session (one per model");
    convo c = {0};
    khub_generate_result r1, r2, r3;
    turn(&f, s, &c, "Hello there, how are you today?", &r1);
    ASSERT_EQ(info_of(s).n_cached, 0); /* check_scratch took it */
    turn(&f, s, &c, "Tell me more.", &r2);
    ASSERT_EQ(info_of(s).n_reused, 0);
    /* An edited first message: only the system prompt's tokens are kept. */
    convo e = {0};
    say(&e, "user", "Good morning!");
    khub_generate_opts o = greedy(12);
    khub_generate_result r = result();
    ASSERT_OK(khub_session_generate(s, prompt_of(f.m, &e), &o, &r));
    khub_session_info i = info_of(s);
    ASSERT_EQ(i.n_reused, 0); /* check_scratch took the sequence again */
    khub_generate_results_free(f.m, &r, 1);
    r = result();
    ASSERT_OK(khub_session_generate(s, prompt_of(f.m, &c), &o, &r)); /* back to c */
    i = info_of(s);
    ASSERT(i.n_reused > 5 && i.n_reused < r1.n_prompt_tokens - 2);
    check_scratch(f.m, c.prompt, &o, &r);
    ASSERT_OK(khub_session_reset(s));
    ASSERT_EQ(info_of(s).n_cached, 0);
    turn(&f, s, &c, "Bye.", &r3);
    khub_session_info small = {KHUB_APP_INIT(khub_session_info)};
    small.struct_size = 8;
    ASSERT_STATUS(khub_session_info_get(s, &small), KHUB_STATUS_STRUCT_SIZE);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt), "info.struct_size 8 is smaller than");
    khub_generate_results_free(f.m, &r, 1);
    khub_generate_results_free(f.m, &r1, 1);
    khub_generate_results_free(f.m, &r2, 1);
    khub_generate_results_free(f.m, &r3, 1);
    convo_free(&c);
    convo_free(&e);
    khub_session_free(s);
    ASSERT_OK(khub_session_new(f.m, &f.s)); /* freed: a new one may start */
    fixture_close(&f);
}

/* A prompt over the context fails with both numbers and keeps the cache;
 * an answer that fills the context stops with KHUB_STOP_CONTEXT. */
TEST_IMPL(session_context_full)
{
    fixture f = tiny_open(1, 2, 128);
    khub_session *s = f.s;
    convo c = {0};
    say(&c, "user", "Hi");
    khub_generate_opts o = greedy(100);
    o.ignore_eos = 1;
    khub_generate_result r = result();
    ASSERT_OK(khub_session_generate(s, prompt_of(f.m, &c), &o, &r));
    ASSERT_EQ(r.stop_reason, KHUB_STOP_CONTEXT);
    ASSERT_EQ(r.n_prompt_tokens + r.n_tokens, 128);
    int64_t cached = info_of(s).n_cached;
    ASSERT_EQ(cached, 127);
    say(&c, "assistant", r.text);
    say(&c, "user", "And?");
    khub_generate_result r2 = result();
    ASSERT_STATUS(khub_session_generate(s, prompt_of(f.m, &c), &o, &r2), KHUB_STATUS_CONTEXT_FULL);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt), "khub_session_generate: the prompt has ");
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt), "tokens; the KV cache holds 128 per sequence");
    ASSERT_EQ(info_of(s).n_cached, cached);
    ASSERT_STATUS(khub_session_generate(s, "", &o, &r2), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt), "khub_session_generate: the prompt is empty");
    khub_generate_results_free(f.m, &r, 1);
    khub_generate_results_free(f.m, &r2, 1);
    convo_free(&c);
    fixture_close(&f);
}

/* ======================================================================== */
/* Cancel                                                                   */
/* ======================================================================== */

typedef struct canceller {
    khub_session *s;
    atomic_int started; /* set by the generating thread just before its call */
    int delay_ms;
} canceller;

static void *cancel_later(void *ud)
{
    canceller *c = ud;
    while (!atomic_load(&c->started)) sched_yield();
    struct timespec d = {c->delay_ms / 1000, (long)(c->delay_ms % 1000) * 1000000L};
    nanosleep(&d, NULL);
    khub_session_cancel(c->s);
    return NULL;
}

static double mono_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* A prompt of about 2700 tokens fed one token per forward call (max_batch
 * 1) through khub/ref-cpu: about 1.8 s of prefill on an idle EPYC core, far
 * longer than the canceller's 150 ms. */
static char *long_prompt(khub_model *m, convo *c)
{
    char *text = calloc(1, 8192);
    ASSERT(text);
    for (int i = 0; i < 200; i++) strcat(text, "seven green apples ");
    say(c, "user", text);
    free(text);
    return strdup(prompt_of(m, c));
}

/* Cancelled mid-prefill from another thread: OK, KHUB_STOP_CANCELLED, no
 * token, part of the prompt cached; the same prompt again reuses that part
 * and its answer equals scratch. A cancel sent before a call stops it at its
 * first check, and is consumed: the call after it runs. */
TEST_IMPL(session_cancel_mid_prefill)
{
    fixture f = {0};
    snprintf(f.dir, sizeof f.dir, "/tmp/khub-test-session-%d", (int)getpid());
    char cmd[512];
    snprintf(cmd, sizeof cmd, "python3 %s/tools/make-tiny-model.py %s > /dev/null", KHUB_SOURCE_DIR,
             f.dir);
    ASSERT_EQ(system(cmd), 0);
    khub_runtime_opts ro = {KHUB_APP_INIT(khub_runtime_opts), .n_threads = 2};
    ASSERT_OK(khub_runtime_new(&ro, &f.rt));
    ASSERT_OK(khub_plugin_load_builtin(f.rt));
    const char *r0 = "khub/ref-cpu"; /* the scalar oracle: a slow, steady prefill */
    khub_model_opts mo = {KHUB_APP_INIT(khub_model_opts),
                          .attn_impl = r0,
                          .cache_impl = r0,
                          .norm_impl = r0,
                          .act_impl = r0,
                          .rotary_impl = r0,
                          .linear_impl = r0,
                          .max_seqs = 2,
                          .max_batch = 1,
                          .max_context = 4096};
    ASSERT_OK(khub_model_load(f.rt, f.dir, &mo, &f.m));
    ASSERT_OK(khub_session_new(f.m, &f.s));
    convo c = {0};
    char *prompt = long_prompt(f.m, &c);
    khub_generate_opts o = greedy(8);
    o.ignore_eos = 1;

    canceller k = {.s = f.s, .delay_ms = 150};
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, cancel_later, &k), 0);
    khub_generate_result r = result();
    atomic_store(&k.started, 1);
    double t0 = mono_ms();
    ASSERT_OK(khub_session_generate(f.s, prompt, &o, &r));
    double took = mono_ms() - t0;
    ASSERT_EQ(pthread_join(th, NULL), 0);
    ASSERT_EQ(r.stop_reason, KHUB_STOP_CANCELLED);
    ASSERT_EQ(r.n_tokens, 0);
    ASSERT_EQ(r.text_len, 0);
    int64_t cached = info_of(f.s).n_cached;
    fprintf(stderr, "cancelled after %.0f ms: %lld of %lld prompt tokens prefilled\n", took,
            (long long)cached, (long long)r.n_prompt_tokens);
    ASSERT(r.n_prompt_tokens > 400);
    ASSERT(cached > 0);
    ASSERT(cached < r.n_prompt_tokens - 1);
    khub_generate_results_free(f.m, &r, 1);

    /* The same prompt: the cached part is reused, the rest prefilled. */
    r = result();
    ASSERT_OK(khub_session_generate(f.s, prompt, &o, &r));
    khub_session_info i = info_of(f.s);
    ASSERT_EQ(i.n_reused, cached);
    ASSERT_EQ(i.n_prefilled, r.n_prompt_tokens - cached);
    ASSERT_EQ(r.stop_reason, KHUB_STOP_MAX_TOKENS);
    check_scratch(f.m, prompt, &o, &r); /* takes sequence 0: the session's is 1 */
    khub_generate_results_free(f.m, &r, 1);

    /* Sent before the call: stopped at the first check, nothing computed. */
    khub_session_cancel(f.s);
    r = result();
    ASSERT_OK(khub_session_generate(f.s, "Hello", &o, &r));
    ASSERT_EQ(r.stop_reason, KHUB_STOP_CANCELLED);
    ASSERT_EQ(r.n_tokens, 0);
    khub_generate_results_free(f.m, &r, 1);
    r = result();
    ASSERT_OK(khub_session_generate(f.s, "Hello", &o, &r)); /* consumed */
    ASSERT_EQ(r.stop_reason, KHUB_STOP_MAX_TOKENS);
    ASSERT_EQ(r.n_tokens, 8);
    khub_generate_results_free(f.m, &r, 1);
    khub_session_cancel(NULL); /* accepted, does nothing */
    free(prompt);
    convo_free(&c);
    fixture_close(&f);
}

#define TEST_LIST(X) \
    X(session_ref_turns_equal_scratch) \
    X(session_default_kernels_turns_equal_scratch) \
    X(session_callback_stop_keeps_answer) \
    X(session_taken_reset_edited) X(session_context_full) X(session_cancel_mid_prefill)
TEST_MAIN(TEST_LIST)
