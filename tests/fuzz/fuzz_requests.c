/* fuzz_requests.c: libFuzzer target for what a network peer sends khub
 * outside a file format: the model server's OpenAI request bodies
 * (runtime/model_server/ms_openai.c and ms_request.c, compiled in: the
 * strict JSON reader, then khub__ms_parse into a request), and the response
 * header lines the hub client reads (khub__http_header: status, ETag,
 * X-Repo-Commit, Content-Range, X-Linked-Size, Location, Link, RateLimit...).
 *
 * A chat body that parses is then formatted as the model server's engine
 * does (khub__chat_format, runtime/executor/chat.c) with a ChatML template
 * carrying a default system prompt, a Llama-3 and Gemma 3's; and a model's
 * own chat template text (from tokenizer_config.json or GGUF metadata) is
 * recognised and used with a fixed conversation.
 *
 * The first input byte (mod 5) picks the parser; the rest is its input:
 *   0 /v1/chat/completions body     3 one RateLimit value
 *   1 /v1/completions body          4 a model's chat template
 *   2 header lines (split at '\n')
 * Every input is an exact-size heap copy, so a read past its end is
 * reported. Any input may be refused; none may crash, leak or read out of
 * bounds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "hub_impl.h"
#include "json_strict.h"
#include "model_server.h"

static const char chatml[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}";
static const char llama3[] =
    "{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}";

/* Formats msgs with tmpl (either answer is fine; memory errors are not). */
static void format(const char *tmpl, const khub_chat_msg *msgs, size_t n)
{
    char *out = NULL;
    if (khub__chat_format(NULL, tmpl, msgs, n, true, &out) == KHUB_STATUS_OK)
        khub__strfree(NULL, out);
}

static void chat_formats(const khub__ms_req *r)
{
    khub_chat_msg msgs[KHUB__MS_MAX_MESSAGES];
    for (size_t i = 0; i < r->n_msgs; i++) msgs[i] = (khub_chat_msg){r->roles[i], r->contents[i]};
    format(chatml, msgs, r->n_msgs);
    format(llama3, msgs, r->n_msgs);
    format(khub__chat_gemma_template, msgs, r->n_msgs);
}

static void template_text(const char *s, size_t n)
{
    char *tmpl = strndup(s, n); /* a C string, as the tokenizer keeps it */
    if (!tmpl) return;
    static const khub_chat_msg msgs[] = {
        {"system", " be brief \n"}, {"user", "hi\xc2\xa0"}, {"assistant", "\xe3\x80\x80ok"}};
    khub_chat_style style;
    char *sys = NULL;
    if (khub__chat_detect(NULL, tmpl, &style, &sys) == KHUB_STATUS_OK) khub__strfree(NULL, sys);
    format(tmpl, msgs, 3);
    format(tmpl, msgs + 1, 2);
    free(tmpl);
}

static void body(const char *s, size_t n, int chat)
{
    char why[256];
    cJSON *j = khub__json_parse_strict(s, n, why, sizeof why);
    if (!j) return;
    khub__ms_req *r = khub__ms_req_new();
    khub__ms_params p = {.chat = chat};
    if (r && khub__ms_parse(j, r, &p) == 0) {
        if (r->n_stop > KHUB__MS_MAX_STOP) abort();
        if (chat ? r->n_msgs == 0 : !r->prompt) abort();
        if (chat) chat_formats(r);
    }
    khub__ms_req_unref(r);
    cJSON_Delete(j);
}

static void headers(const char *s, size_t n)
{
    khub__http_resp r;
    memset(&r, 0, sizeof r);
    for (size_t at = 0; at < n;) {
        const char *nl = memchr(s + at, '\n', n - at);
        size_t len = nl ? (size_t)(nl - (s + at)) + 1 : n - at;
        char *line = malloc(len ? len : 1); /* exact size, as curl's is not NUL-ended */
        if (!line) return;
        memcpy(line, s + at, len);
        khub__http_header(&r, line, len);
        free(line);
        at += len;
    }
    /* what the client later uses as C strings */
    if (strlen(r.etag) >= sizeof r.etag || strlen(r.location) >= sizeof r.location ||
        strlen(r.repo_commit) >= sizeof r.repo_commit || strlen(r.link_next) >= sizeof r.link_next)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) return 0;
    size_t n = size - 1;
    if (data[0] % 5 == 4) {
        template_text((const char *)data + 1, n);
        return 0;
    }
    if (data[0] % 5 == 3) { /* a C string whose NUL ends its heap block */
        char *val = strndup((const char *)data + 1, n);
        if (val) (void)khub__http_ratelimit_wait(val);
        free(val);
        return 0;
    }
    char *s = malloc(n ? n : 1); /* exact size: no NUL after it */
    if (!s) return 0;
    memcpy(s, data + 1, n);
    if (data[0] % 5 == 2)
        headers(s, n);
    else
        body(s, n, data[0] % 5 == 0);
    free(s);
    return 0;
}
