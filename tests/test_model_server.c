/*
 * test_model_server.c: the embedding API of the model server
 * (khub_model_server.h) and khub_model_chat_format, through the public
 * headers: every refusal of khub_model_server_start with its status and
 * message; on SmolLM2-135M-Instruct (skipped when absent) a start on a free
 * port, the stats before any request, a second server on the same port
 * refused with IO, and the chat template applied to a conversation; a
 * client that hangs up on a plain (not streamed) request while its tokens
 * flow cancels it; on the tiny Gemma fixture, khub_model_server_reload (a
 * swap with no HTTP and no key, its refusals, the reload counters in the
 * stats). The rest of the HTTP side is tests/t_model_server.sh's and
 * tests/t_serve_reload.sh's.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "khub/khub_model.h"
#include "khub/khub_model_server.h"
#include "runner.h"

TEST_IMPL(model_server_start_refusals)
{
    char err[KHUB_ERROR_SIZE];
    khub_model_server *srv = (khub_model_server *)1;
    ASSERT_STATUS(khub_model_server_start(NULL, &srv, err, sizeof err), KHUB_STATUS_MISUSE);
    ASSERT_STR_EQ(err, "khub_model_server_start: opts is NULL");
    ASSERT(srv == NULL);
    khub_model_server_opts o = {KHUB_APP_INIT(khub_model_server_opts)};
    ASSERT_STATUS(khub_model_server_start(&o, NULL, err, sizeof err), KHUB_STATUS_MISUSE);
    ASSERT_STR_EQ(err, "khub_model_server_start: out is NULL");
    ASSERT_STATUS(khub_model_server_start(&o, &srv, err, sizeof err), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(err, "opts.model is NULL");
    o.struct_size = 16;
    ASSERT_STATUS(khub_model_server_start(&o, &srv, err, sizeof err), KHUB_STATUS_STRUCT_SIZE);
    /* 0.1's size, not this header's sizeof (named before session 18) */
    char want[128];
    snprintf(want, sizeof want,
             "khub_model_server_start: opts.struct_size 16 is smaller than 0.1's %zu",
             offsetof(khub_model_server_opts, serial) + sizeof o.serial);
    ASSERT_STR_EQ(err, want);
    ASSERT(srv == NULL);
    /* The queries and stop accept NULL. */
    ASSERT_EQ(khub_model_server_port(NULL), 0);
    khub_model_server_stats st = {KHUB_APP_INIT(khub_model_server_stats)};
    ASSERT_STATUS(khub_model_server_stats_get(NULL, &st), KHUB_STATUS_MISUSE);
    ASSERT_STR_EQ(khub_last_error(), "khub_model_server_stats_get: srv is NULL");
    khub_model_server_stop(NULL);
}

static khub_model *smollm2(khub_runtime **rt)
{
    const char *dir = getenv("KHUB_MODEL_DIR");
    char path[1024];
    if (dir)
        snprintf(path, sizeof path, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir);
    else
        snprintf(path, sizeof path, "%s/.cache/khub/models/SmolLM2-135M-Instruct.Q4_1.gguf",
                 getenv("HOME") ? getenv("HOME") : "");
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fclose(f);
    khub_runtime_opts ro = {KHUB_APP_INIT(khub_runtime_opts), .n_threads = 2};
    if (khub_runtime_new(&ro, rt) != KHUB_STATUS_OK) return NULL;
    khub_plugin_load_builtin(*rt);
    khub_model_opts mo = {KHUB_APP_INIT(khub_model_opts), .max_context = 256, .max_seqs = 2};
    khub_model *m = NULL;
    if (khub_model_load(*rt, path, &mo, &m) != KHUB_STATUS_OK) return NULL;
    return m;
}

TEST_IMPL(model_server_start_stop)
{
    khub_runtime *rt = NULL;
    khub_model *m = smollm2(&rt);
    if (!m) {
        khub_runtime_free(rt);
        TEST_SKIP("SmolLM2-135M-Instruct.Q4_1.gguf absent (tools/fetch-model.sh)");
    }
    char err[KHUB_ERROR_SIZE];
    khub_model_server_opts o = {KHUB_APP_INIT(khub_model_server_opts), .model = m,
                                .host = "127.0.0.1.5"};
    khub_model_server *srv = NULL, *srv2 = NULL;
    ASSERT_STATUS(khub_model_server_start(&o, &srv, err, sizeof err), KHUB_STATUS_INVALID_ARG);
    ASSERT_STR_EQ(err, "serve-model: host 127.0.0.1.5 (khub_model_server_opts.host) is not an IPv4 "
                       "address (use 127.0.0.1)");
    o.host = NULL;
    ASSERT_OK(khub_model_server_start(&o, &srv, err, sizeof err));
    ASSERT_STR_EQ(err, "");
    uint16_t port = khub_model_server_port(srv);
    ASSERT(port > 0);
    khub_model_server_stats st = {KHUB_APP_INIT(khub_model_server_stats)};
    char want[96];
    ASSERT_OK(khub_model_server_stats_get(srv, &st));
    ASSERT_EQ(st.requests, 0);
    ASSERT_EQ(st.queued, 0);
    ASSERT_EQ(st.running, 0);
    ASSERT_EQ(st.kv_tokens, 0);
    st.struct_size = 8;
    ASSERT_STATUS(khub_model_server_stats_get(srv, &st), KHUB_STATUS_STRUCT_SIZE);
    snprintf(want, sizeof want,
             "khub_model_server_stats_get: out.struct_size 8 is smaller than 0.1's %zu",
             offsetof(khub_model_server_stats, kv_capacity) + sizeof st.kv_capacity);
    ASSERT_STR_EQ(khub_last_error(), want);
    ASSERT_STATUS(khub_model_server_stats_get(srv, NULL), KHUB_STATUS_MISUSE);
    ASSERT_STR_EQ(khub_last_error(), "khub_model_server_stats_get: out is NULL");
    o.port = port;
    o.serial = 1;
    ASSERT_STATUS(khub_model_server_start(&o, &srv2, err, sizeof err), KHUB_STATUS_IO);
    snprintf(want, sizeof want, "serve-model: cannot listen on 127.0.0.1:%u (port in use?)", port);
    ASSERT_STR_EQ(err, want);
    ASSERT(srv2 == NULL);
    khub_model_server_stop(srv);
    /* After stop the model is the caller's again. */
    const char *roles[] = {"system", "user", "assistant", "user"};
    const char *contents[] = {"Be brief.", "Hi", "Hello!", "2+2?"};
    size_t len = 0;
    ASSERT_STATUS(khub_model_chat_format(m, roles, contents, 4, 1, NULL, 0, &len),
                  KHUB_STATUS_OVERFLOW);
    char buf[512];
    ASSERT_OK(khub_model_chat_format(m, roles, contents, 4, 1, buf, sizeof buf, &len));
    ASSERT_STR_EQ(buf, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                       "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                       "<|im_start|>assistant\n");
    ASSERT_EQ(len, strlen(buf));
    const char *bad[] = {"", "x"};
    ASSERT_STATUS(khub_model_chat_format(m, bad, contents, 1, 1, buf, sizeof buf, &len),
                  KHUB_STATUS_TOKENIZER);
    ASSERT_CONTAINS(khub_runtime_errmsg(khub_model_runtime(m)),
                    "message 0 has an empty or invalid role");
    ASSERT(khub_model_runtime(m) == rt);
    ASSERT(khub_model_runtime(NULL) == NULL);
    khub_model_free(m);
    khub_runtime_free(rt);
}

static void sleep_ms(int ms)
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* Polls the server's stats until ok(stats) holds, for up to ms. */
static int wait_stats(khub_model_server *srv, khub_model_server_stats *st, int ms,
                      int (*ok)(const khub_model_server_stats *))
{
    for (int waited = 0; waited <= ms; waited += 20) {
        if (khub_model_server_stats_get(srv, st) != KHUB_STATUS_OK) return 0;
        if (ok(st)) return 1;
        sleep_ms(20);
    }
    return 0;
}
static int one_running(const khub_model_server_stats *st) { return st->running == 1; }
static int some_tokens(const khub_model_server_stats *st) { return st->kv_tokens >= 24; }
static int one_cancelled(const khub_model_server_stats *st) { return st->cancelled == 1; }
static int idle(const khub_model_server_stats *st) { return !st->running && !st->kv_tokens; }

/* A plain request is woken by every token it waits for; its client's
 * hang-up must still be seen while the tokens flow (it was seen only after
 * 200 ms without a token, so the request ran to its end and counted as
 * completed: t_model_server's five hang-ups became four). */
TEST_IMPL(model_server_plain_hangup_cancels)
{
    khub_runtime *rt = NULL;
    khub_model *m = smollm2(&rt);
    if (!m) {
        khub_runtime_free(rt);
        TEST_SKIP("SmolLM2-135M-Instruct.Q4_1.gguf absent (tools/fetch-model.sh)");
    }
    char err[KHUB_ERROR_SIZE];
    khub_model_server_opts o = {KHUB_APP_INIT(khub_model_server_opts), .model = m};
    khub_model_server *srv = NULL;
    ASSERT_OK(khub_model_server_start(&o, &srv, err, sizeof err));
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(khub_model_server_port(srv))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    /* 220 new tokens fill the 256-position context: seconds of generation */
    const char *body = "{\"prompt\":\"Count to 1000: 1, 2, 3,\",\"max_tokens\":220,"
                       "\"temperature\":0}";
    char req[512];
    int n = snprintf(req, sizeof req,
                     "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    ASSERT_EQ(write(fd, req, (size_t)n), n);
    khub_model_server_stats st = {KHUB_APP_INIT(khub_model_server_stats)};
    ASSERT(wait_stats(srv, &st, 60000, one_running));
    ASSERT(wait_stats(srv, &st, 60000, some_tokens)); /* decoding: tokens flow */
    close(fd);
    ASSERT(wait_stats(srv, &st, 5000, one_cancelled));
    ASSERT_EQ(st.completions, 0);
    ASSERT(wait_stats(srv, &st, 5000, idle)); /* its KV freed */
    khub_model_server_stop(srv);
    khub_model_free(m);
    khub_runtime_free(rt);
}

TEST_IMPL(model_server_reload_api)
{
    khub_runtime_opts ro = {KHUB_APP_INIT(khub_runtime_opts), .n_threads = 1};
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(&ro, &rt));
    ASSERT_OK(khub_plugin_load_builtin(rt));
    khub_model_opts mo = {KHUB_APP_INIT(khub_model_opts), .max_context = 64, .max_seqs = 2};
    khub_model *m = NULL;
    ASSERT_OK(khub_model_load(rt, KHUB_SOURCE_DIR "/tests/fixtures/gemma3_tiny", &mo, &m));
    khub_hub_opts ho = {KHUB_APP_INIT(khub_hub_opts), .offline = 1};
    khub_hub *hub = NULL;
    ASSERT_OK(khub_hub_new(&ho, &hub));
    /* no key: the C API needs none (the embedder is trusted) */
    khub_model_server_opts o = {KHUB_APP_INIT(khub_model_server_opts), .model = m, .hub = hub};
    khub_model_server *srv = NULL;
    char err[KHUB_ERROR_SIZE];
    ASSERT_OK(khub_model_server_start(&o, &srv, err, sizeof err));
    ASSERT_OK(khub_model_server_reload(srv, "attention", "sdpa", err, sizeof err));
    ASSERT_STR_EQ(err, "");
    ASSERT_STATUS(khub_model_server_reload(srv, "attn", "sdpa", err, sizeof err),
                  KHUB_STATUS_INVALID_ARG);
    ASSERT_STR_EQ(err, "unknown kernel role 'attn' (roles: attention, quantization, cache, norm, "
                       "activation, rotary, linear, embedding)");
    ASSERT_STATUS(khub_model_server_reload(srv, "cache", "static", err, sizeof err),
                  KHUB_STATUS_UNSUPPORTED);
    ASSERT_CONTAINS(err, "the cache kernel cannot be swapped in a running model");
    ASSERT_STATUS(khub_model_server_reload(srv, "norm", "acme/none", err, sizeof err),
                  KHUB_STATUS_OFFLINE);
    ASSERT_CONTAINS(err, "norm kernel acme/none: ");
    ASSERT_STATUS(khub_model_server_reload(srv, NULL, "sdpa", err, sizeof err), KHUB_STATUS_MISUSE);
    ASSERT_STR_EQ(err, "khub_model_server_reload: role is NULL");
    ASSERT_STATUS(khub_model_server_reload(NULL, "attention", "sdpa", err, sizeof err),
                  KHUB_STATUS_MISUSE);
    khub_model_server_stats st = {KHUB_APP_INIT(khub_model_server_stats)};
    ASSERT_OK(khub_model_server_stats_get(srv, &st));
    ASSERT_EQ(st.reloads, 1);
    ASSERT_EQ(st.reload_failures, 3);
    khub_model_server_stop(srv);
    /* the model is the caller's again, with the swapped binding: the paged
     * pool's reader (a model of 2 sequences with no cache named) */
    ASSERT_CONTAINS(khub_model_explain(m),
                    "paged_attention[f32]: khub/ref-cpu 0.1.0 :: paged_attention\n");
    khub_model_free(m);
    khub_hub_free(hub);
    khub_runtime_free(rt);
}

#define TEST_LIST(X) \
    X(model_server_start_refusals) \
    X(model_server_start_stop) X(model_server_plain_hangup_cancels) X(model_server_reload_api)
TEST_MAIN(TEST_LIST)
