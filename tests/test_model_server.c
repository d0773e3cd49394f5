/*
 * test_model_server.c: the embedding API of the model server
 * (khub_model_server.h) and khub_model_chat_format, through the public
 * headers: every refusal of khub_model_server_start with its status and
 * message; on SmolLM2-135M-Instruct (skipped when absent) a start on a free
 * port, the stats before any request, a second server on the same port
 * refused with IO, and the chat template applied to a conversation. The
 * HTTP side is tests/t_model_server.sh's.
 */
#include <stdlib.h>
#include <string.h>

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
    ASSERT_CONTAINS(err, "opts.struct_size 16 is below the 0.1 size");
    ASSERT(srv == NULL);
    /* The queries and stop accept NULL. */
    ASSERT_EQ(khub_model_server_port(NULL), 0);
    khub_model_server_stats st = {KHUB_APP_INIT(khub_model_server_stats)};
    ASSERT_STATUS(khub_model_server_stats_get(NULL, &st), KHUB_STATUS_MISUSE);
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
    ASSERT_OK(khub_model_server_stats_get(srv, &st));
    ASSERT_EQ(st.requests, 0);
    ASSERT_EQ(st.queued, 0);
    ASSERT_EQ(st.running, 0);
    ASSERT_EQ(st.kv_tokens, 0);
    st.struct_size = 8;
    ASSERT_STATUS(khub_model_server_stats_get(srv, &st), KHUB_STATUS_STRUCT_SIZE);
    o.port = port;
    o.serial = 1;
    ASSERT_STATUS(khub_model_server_start(&o, &srv2, err, sizeof err), KHUB_STATUS_IO);
    char want[96];
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

#define TEST_LIST(X) X(model_server_start_refusals) X(model_server_start_stop)
TEST_MAIN(TEST_LIST)
