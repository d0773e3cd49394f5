/*
 * test_generate.c: khub_model_generate (runtime/executor/generate.c) on the real
 * SmolLM2-135M-Instruct GGUF (tools/fetch-model.sh), and on its Hugging Face
 * copy (fetch-model.sh --hf) with a generation_config.json of our own; every
 * case skips with a message when its file is absent.
 */
#include <sys/stat.h>
#include <unistd.h>

#include "khub/khub_model.h"
#include "runner.h"

static const char *gguf_path(void)
{
    static char buf[512];
    const char *d = getenv("KHUB_MODEL_DIR");
    if (d)
        snprintf(buf, sizeof buf, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", d);
    else
        snprintf(buf, sizeof buf, "%s/.cache/khub/models/SmolLM2-135M-Instruct.Q4_1.gguf",
                 getenv("HOME") ? getenv("HOME") : "");
    struct stat sb;
    if (stat(buf, &sb) != 0) TEST_SKIP("%s not found (run tools/fetch-model.sh)", buf);
    return buf;
}

typedef struct fixture {
    khub_runtime *rt;
    khub_model *m;
} fixture;

static fixture open_model(const khub_model_opts *o)
{
    const char *path = gguf_path();
    fixture f = {0};
    khub_runtime_opts ro = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = 2};
    ASSERT_OK(khub_runtime_new(&ro, &f.rt));
    ASSERT_OK(khub_plugin_load_builtin(f.rt));
    ASSERT_OK(khub_model_load(f.rt, path, o, &f.m));
    return f;
}

static void close_model(fixture *f)
{
    khub_model_free(f->m);
    khub_runtime_free(f->rt);
}

static khub_generate_result result(void)
{
    return (khub_generate_result){KHUB_STRUCT_INIT(khub_generate_result)};
}

static khub_generate_opts gen(int max_new)
{
    return (khub_generate_opts){KHUB_STRUCT_INIT(khub_generate_opts), .max_new_tokens = max_new};
}

typedef struct sink {
    char text[8192];
    size_t len;
    int calls;
} sink;

static int collect(void *ud, int32_t prompt, const char *text, size_t len)
{
    sink *s = ud;
    ASSERT_EQ(prompt, 0);
    ASSERT(s->len + len < sizeof s->text);
    memcpy(s->text + s->len, text, len);
    s->len += len;
    s->text[s->len] = '\0';
    s->calls++;
    return 0;
}

TEST_IMPL(generate_greedy_is_argmax_and_streams)
{
    fixture f = open_model(NULL);
    const char *p[] = {"The capital of France is"};
    sink s = {0};
    khub_generate_opts o = gen(12);
    o.callback = collect;
    o.callback_ud = &s;
    khub_generate_result r = result();
    ASSERT_OK(khub_model_generate(f.m, p, 1, &o, &r));
    ASSERT(r.n_tokens >= 1 && r.n_tokens <= 12);
    ASSERT(r.stop_reason == KHUB_STOP_MAX_TOKENS || r.stop_reason == KHUB_STOP_EOS);
    ASSERT_STR_EQ(s.text, r.text); /* the stream is the text, piece by piece */
    ASSERT(s.calls >= 2);
    ASSERT(r.prefill_tok_s > 0 && r.load_ms > 0);
    fprintf(stderr, "  \"%s\" -> \"%s\" (%.1f tok/s prefill, %.1f tok/s decode)\n", p[0], r.text,
            r.prefill_tok_s, r.decode_tok_s);

    /* The first token is the argmax of the prompt's logits. */
    int32_t ids[64];
    size_t n = 0;
    ASSERT_OK(khub_model_tokenize(f.m, p[0], 1, ids, 64, &n));
    ASSERT_EQ(n, (size_t)r.n_prompt_tokens);
    khub_model_info info = {KHUB_STRUCT_INIT(khub_model_info)};
    ASSERT_OK(khub_model_info_get(f.m, &info));
    float *logits = malloc((size_t)info.vocab * sizeof(float));
    ASSERT_OK(khub_model_logits(f.m, ids, n, logits));
    int32_t best = 0;
    for (int32_t i = 1; i < info.vocab; i++)
        if (logits[i] > logits[best]) best = i;
    ASSERT_EQ(r.tokens[0], best);
    /* Detokenizing the tokens gives the text. */
    char buf[4096];
    size_t len = 0;
    ASSERT_OK(khub_model_detokenize(f.m, r.tokens, (size_t)r.n_tokens, buf, sizeof buf, &len));
    ASSERT_STR_EQ(buf, r.text);
    free(logits);
    khub_generate_results_free(f.m, &r, 1);
    ASSERT(r.text == NULL && r.struct_size == sizeof r);
    close_model(&f);
}

/* The stream runs while tokens are produced: a callback that says stop at
 * its third piece ends generation there (KHUB_STOP_CALLBACK), long before
 * max_new_tokens, and the text is what was streamed. */
static int stop_at_third(void *ud, int32_t prompt, const char *text, size_t len)
{
    collect(ud, prompt, text, len);
    return ((sink *)ud)->calls == 3;
}

TEST_IMPL(generate_stream_stops_generation)
{
    fixture f = open_model(NULL);
    const char *p[] = {"Write a long story about a dragon:"};
    sink s = {0};
    khub_generate_opts o = gen(48);
    o.ignore_eos = 1;
    o.callback = stop_at_third;
    o.callback_ud = &s;
    khub_generate_result r = result();
    ASSERT_OK(khub_model_generate(f.m, p, 1, &o, &r));
    ASSERT_EQ(r.stop_reason, KHUB_STOP_CALLBACK);
    ASSERT_EQ(s.calls, 3);
    ASSERT(r.n_tokens >= 3 && r.n_tokens < 48);
    ASSERT_STR_EQ(r.text, s.text);
    khub_generate_results_free(f.m, &r, 1);
    close_model(&f);
}

TEST_IMPL(generate_stop_string)
{
    fixture f = open_model(NULL);
    const char *p[] = {"List the days of the week: Monday, Tuesday,"};
    khub_generate_opts o = gen(24);
    o.ignore_eos = 1;
    khub_generate_result r = result();
    ASSERT_OK(khub_model_generate(f.m, p, 1, &o, &r));
    ASSERT(r.text_len > 8);
    /* Stop at a piece from the middle of the free output. */
    char stop[8];
    size_t at = r.text_len / 2;
    memcpy(stop, r.text + at, 3);
    stop[3] = '\0';
    size_t first = (size_t)(strstr(r.text, stop) - r.text);
    char want[4096];
    memcpy(want, r.text, first);
    want[first] = '\0';
    khub_generate_results_free(f.m, &r, 1);

    const char *stops[] = {"never-appears-here", stop};
    sink s = {0};
    o.stop = stops;
    o.n_stop = 2;
    o.callback = collect;
    o.callback_ud = &s;
    ASSERT_OK(khub_model_generate(f.m, p, 1, &o, &r));
    ASSERT_EQ(r.stop_reason, KHUB_STOP_STRING);
    ASSERT_STR_EQ(r.text, want);
    ASSERT_STR_EQ(s.text, want); /* the stop string never reached the stream */
    khub_generate_results_free(f.m, &r, 1);
    close_model(&f);
}

TEST_IMPL(generate_batch_equals_single)
{
    /* ref-cpu: the batched and one-at-a-time paths round alike. */
    const char *ref = "khub/ref-cpu";
    khub_model_opts mo = {KHUB_STRUCT_INIT(khub_model_opts),
                          .attn_impl = ref,
                          .quant = ref,
                          .linear_impl = ref,
                          .norm_impl = ref,
                          .act_impl = ref,
                          .rotary_impl = ref,
                          .cache_impl = ref,
                          .max_batch = 16};
    fixture f = open_model(&mo);
    const char *p[] = {"Once upon a time",
                       "def fibonacci(n):", "The three primary colours are red, yellow and"};
    khub_generate_opts o = gen(6);
    o.ignore_eos = 1;
    khub_generate_result all[3] = {result(), result(), result()};
    ASSERT_OK(khub_model_generate(f.m, p, 3, &o, all));
    for (int i = 0; i < 3; i++) {
        khub_generate_result one = result();
        ASSERT_OK(khub_model_generate(f.m, &p[i], 1, &o, &one));
        ASSERT_EQ(one.n_tokens, all[i].n_tokens);
        ASSERT(memcmp(one.tokens, all[i].tokens, (size_t)one.n_tokens * 4) == 0);
        ASSERT_STR_EQ(one.text, all[i].text);
        khub_generate_results_free(f.m, &one, 1);
    }
    ASSERT(strcmp(all[0].text, all[1].text) != 0);
    khub_generate_results_free(f.m, all, 3);
    close_model(&f);
}

TEST_IMPL(generate_seeded_sampling)
{
    fixture f = open_model(NULL);
    const char *p[] = {"My favourite food is"};
    khub_generate_opts o = gen(16);
    o.temperature = 1.0f;
    o.top_k = 50;
    o.top_p = 0.95f;
    o.repetition_penalty = 1.1f;
    o.ignore_eos = 1;
    int32_t toks[3][16];
    uint64_t seeds[3] = {7, 7, 8};
    for (int k = 0; k < 3; k++) {
        khub_generate_result r = result();
        o.seed = seeds[k];
        ASSERT_OK(khub_model_generate(f.m, p, 1, &o, &r));
        ASSERT_EQ(r.n_tokens, 16);
        memcpy(toks[k], r.tokens, sizeof toks[k]);
        khub_generate_results_free(f.m, &r, 1);
    }
    ASSERT(memcmp(toks[0], toks[1], sizeof toks[0]) == 0);
    ASSERT(memcmp(toks[0], toks[2], sizeof toks[0]) != 0);
    close_model(&f);
}

TEST_IMPL(generate_chat_template)
{
    fixture f = open_model(NULL);
    const char *p[] = {"What is 2+2?"};
    khub_generate_opts o = gen(8);
    khub_generate_result plain = result(), chat = result();
    ASSERT_OK(khub_model_generate(f.m, p, 1, &o, &plain));
    o.chat = 1;
    ASSERT_OK(khub_model_generate(f.m, p, 1, &o, &chat));
    /* The template adds the system and turn markers around the message. */
    ASSERT(chat.n_prompt_tokens > plain.n_prompt_tokens + 5);
    ASSERT(chat.text_len > 0);
    ASSERT(strstr(chat.text, "<|im_end|>") == NULL); /* special tokens stop, never print */
    khub_generate_results_free(f.m, &plain, 1);
    khub_generate_results_free(f.m, &chat, 1);
    close_model(&f);
}

TEST_IMPL(generate_errors)
{
    khub_model_opts mo = {KHUB_STRUCT_INIT(khub_model_opts), .max_context = 8, .max_seqs = 2};
    fixture f = open_model(&mo);
    const char *p[] = {"one two three four five six seven eight nine ten", "a", "b"};
    khub_generate_opts o = gen(4);
    khub_generate_result r[3] = {result(), result(), result()};
    ASSERT_STATUS(khub_model_generate(f.m, p, 1, &o, r), KHUB_STATUS_CONTEXT_FULL);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt), "prompt 0 has");
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt), "the KV cache holds 8 per sequence");
    khub_generate_results_free(f.m, r, 1);
    ASSERT_STATUS(khub_model_generate(f.m, p, 3, &o, r), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt), "3 prompts, the model was loaded for at most 2");
    const char *stops[] = {""};
    o.stop = stops;
    o.n_stop = 1;
    ASSERT_STATUS(khub_model_generate(f.m, &p[1], 1, &o, r), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt), "stop string 0 is NULL or empty");
    khub_generate_results_free(f.m, r, 1);
    o.n_stop = 0;
    /* A context of 8 ends generation with KHUB_STOP_CONTEXT, not an error. */
    o.max_new_tokens = 32;
    o.ignore_eos = 1;
    ASSERT_OK(khub_model_generate(f.m, &p[1], 1, &o, r));
    ASSERT_EQ(r[0].stop_reason, KHUB_STOP_CONTEXT);
    ASSERT_EQ(r[0].n_prompt_tokens + r[0].n_tokens, 8);
    khub_generate_results_free(f.m, r, 1);
    close_model(&f);
}

/* eos_token_id as a list: generation stops at whichever of the ids comes
 * first. The HF copy is linked into a folder whose generation_config.json
 * lists [2, X], X being the third token the model generates with eos 2 only:
 * it then stops after two tokens, X not included. */
static void link_hf(const char *src, const char *dir, const char *name)
{
    char from[640], to[640];
    snprintf(from, sizeof from, "%s/%s", src, name);
    snprintf(to, sizeof to, "%s/%s", dir, name);
    ASSERT_EQ(symlink(from, to), 0);
}

static void write_gen_config(const char *dir, const char *eos)
{
    char path[640];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    FILE *f = fopen(path, "w");
    ASSERT(f);
    fprintf(f, "{\"bos_token_id\": 1, \"eos_token_id\": %s}\n", eos);
    fclose(f);
}

static void greedy_hf(const char *dir, int max_new, khub_generate_result *r)
{
    khub_runtime_opts ro = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = 2};
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(&ro, &rt));
    ASSERT_OK(khub_plugin_load_builtin(rt));
    khub_model *m = NULL;
    ASSERT_OK(khub_model_load(rt, dir, NULL, &m));
    const char *p[] = {"The capital of France is"};
    khub_generate_opts o = gen(max_new);
    khub_generate_result res = result();
    ASSERT_OK(khub_model_generate(m, p, 1, &o, &res));
    *r = res;
    r->text = NULL; /* the copy keeps only the ids; res is freed here */
    int32_t *toks = malloc((size_t)(res.n_tokens ? res.n_tokens : 1) * 4);
    memcpy(toks, res.tokens, (size_t)res.n_tokens * 4);
    r->tokens = toks;
    khub_generate_results_free(m, &res, 1);
    khub_model_free(m);
    khub_runtime_free(rt);
}

TEST_IMPL(generate_stops_at_any_eos_id)
{
    char src[512];
    const char *d = getenv("KHUB_MODEL_DIR");
    if (d)
        snprintf(src, sizeof src, "%s/SmolLM2-135M-Instruct-hf", d);
    else
        snprintf(src, sizeof src, "%s/.cache/khub/models/SmolLM2-135M-Instruct-hf",
                 getenv("HOME") ? getenv("HOME") : "");
    struct stat sb;
    if (stat(src, &sb) != 0) TEST_SKIP("%s not found (run tools/fetch-model.sh --hf)", src);
    char dir[] = "/tmp/khub-eos-XXXXXX";
    ASSERT(mkdtemp(dir) != NULL);
    static const char *const names[] = {"config.json", "model.safetensors", "tokenizer.json",
                                        "tokenizer_config.json"};
    for (int i = 0; i < 4; i++) link_hf(src, dir, names[i]);

    write_gen_config(dir, "2");
    khub_generate_result free_run;
    greedy_hf(dir, 6, &free_run);
    ASSERT(free_run.n_tokens >= 3);
    int32_t x = free_run.tokens[2];
    ASSERT(x != 2 && x != free_run.tokens[0] && x != free_run.tokens[1]);

    char eos[64];
    snprintf(eos, sizeof eos, "[2, %d]", (int)x);
    write_gen_config(dir, eos);
    khub_generate_result stopped;
    greedy_hf(dir, 6, &stopped);
    ASSERT_EQ(stopped.stop_reason, KHUB_STOP_EOS);
    ASSERT_EQ(stopped.n_tokens, 2);
    ASSERT_EQ(stopped.tokens[0], free_run.tokens[0]);
    ASSERT_EQ(stopped.tokens[1], free_run.tokens[1]);
    fprintf(stderr, "  eos [2, %d]: stopped after %lld tokens (free run: %lld)\n", (int)x,
            (long long)stopped.n_tokens, (long long)free_run.n_tokens);
    free(free_run.tokens);
    free(stopped.tokens);

    char path[640];
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    unlink(path);
    rmdir(dir);
}

#define TEST_LIST(X) \
    X(generate_greedy_is_argmax_and_streams) \
    X(generate_stream_stops_generation) \
    X(generate_stop_string) \
    X(generate_batch_equals_single) \
    X(generate_seeded_sampling) \
    X(generate_chat_template) X(generate_errors) X(generate_stops_at_any_eos_id)
TEST_MAIN(TEST_LIST)
