/*
 * chat.c: recognises a model's chat template as ChatML or Llama-3 and
 * formats a conversation the way that template would.
 *
 * Why no Jinja: the templates khub's models ship are fixed strings, and a
 * Jinja engine is a large attack surface for a few known outputs. Each
 * format below is checked against the real template text (SmolLM2-Instruct,
 * Qwen2-Instruct, Llama-3-Instruct, Gemma 3); anything else is refused by
 * name.
 */
#include "chat.h"

#include <string.h>

#include "unicode.h"

/* ------------------------------------------------------------------------ */
/* Output buffer                                                            */
/* ------------------------------------------------------------------------ */

typedef struct sbuf {
    khub_runtime *rt;
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    size_t need;
    if (!khub__add_ok(b->n, n, &need) || !khub__add_ok(need, 1, &need)) {
        b->oom = true;
        return;
    }
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
        char *q = khub__realloc(b->rt, b->p, b->cap, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* Hands the text over as a strlen + 1 allocation (khub__strfree's contract). */
static khub_status sb_finish(sbuf *b, char **out)
{
    if (!b->oom && b->p) {
        char *exact = khub__realloc(b->rt, b->p, b->cap, b->n + 1);
        if (exact) {
            *out = exact;
            return KHUB_STATUS_OK;
        }
    }
    khub__free(b->rt, b->p, b->cap);
    return khub__fail(b->rt, KHUB_STATUS_NOMEM, "chat: out of memory formatting the prompt");
}

/* The text of google/gemma-3-*-it's chat_template, without its image
 * branches (tests/fixtures/gemma3_reference.json holds the same text and
 * Transformers' renderings of it). */
const char khub__chat_gemma_template[] =
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate "
    "user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n";

/* ------------------------------------------------------------------------ */
/* Recognition                                                              */
/* ------------------------------------------------------------------------ */

/* Finds the literal default system prompt of a ChatML template: the text of
 * a Jinja string literal '<|im_start|>system\n...<|im_end|>' (the newline
 * written either raw or as \n). NULL and OK when there is none. */
static khub_status default_system(khub_runtime *rt, const char *tmpl, char **out)
{
    static const char tag[] = "<|im_start|>system";
    *out = NULL;
    for (const char *p = strstr(tmpl, tag); p; p = strstr(p + 1, tag)) {
        if (p == tmpl || (p[-1] != '\'' && p[-1] != '"')) continue; /* not a literal's start */
        char quote = p[-1];
        const char *s = p + sizeof tag - 1;
        if (*s == '\n')
            s++;
        else if (s[0] == '\\' && s[1] == 'n')
            s += 2;
        else
            continue;
        const char *end = strstr(s, "<|im_end|>");
        if (!end) continue;
        sbuf b = {.rt = rt};
        bool literal = true;
        for (const char *q = s; q < end && literal; q++) {
            if (*q == quote)
                literal = false; /* the literal closes: content is dynamic */
            else if (*q == '\\' && q + 1 < end) {
                q++;
                char c = *q == 'n' ? '\n' : *q == 't' ? '\t' : *q;
                sb_put(&b, &c, 1);
            } else
                sb_put(&b, q, 1);
        }
        if (!literal) {
            khub__free(rt, b.p, b.cap);
            continue;
        }
        if (!b.p) sb_put(&b, "", 0);
        return sb_finish(&b, out);
    }
    return KHUB_STATUS_OK;
}

khub_status khub__chat_detect(khub_runtime *rt, const char *tmpl, khub_chat_style *style,
                              char **default_sys)
{
    KHUB_API_CHECK(rt, style);
    *style = KHUB_CHAT_UNKNOWN;
    if (default_sys) *default_sys = NULL;
    KHUB_RETURN_IF(rt, !tmpl || !*tmpl, KHUB_STATUS_TOKENIZER,
                   "chat: the model has no chat template; pass a ChatML or Llama-3 template");
    bool uses_role = strstr(tmpl, "message['role']") || strstr(tmpl, "message.role") ||
                     strstr(tmpl, "message[\"role\"]");
    /* Refused on purpose: reasoning (Qwen3 <think>) and Llama-3.1+ preambles
     * produce text these formats do not. */
    bool extras = strstr(tmpl, "<think>") || strstr(tmpl, "Cutting Knowledge Date") ||
                  strstr(tmpl, "<|python_tag|>");
    if (uses_role && !extras && strstr(tmpl, "<|im_start|>") && strstr(tmpl, "<|im_end|>")) {
        *style = KHUB_CHAT_CHATML;
        if (default_sys) KHUB_FORWARD_IF_ERROR(rt, default_system(rt, tmpl, default_sys));
        return KHUB_STATUS_OK;
    }
    if (uses_role && !extras && strstr(tmpl, "<start_of_turn>") && strstr(tmpl, "<end_of_turn>")) {
        *style = KHUB_CHAT_GEMMA;
        return KHUB_STATUS_OK;
    }
    if (uses_role && !extras && strstr(tmpl, "<|start_header_id|>") &&
        strstr(tmpl, "<|end_header_id|>") && strstr(tmpl, "<|eot_id|>")) {
        *style = KHUB_CHAT_LLAMA3;
        return KHUB_STATUS_OK;
    }
    return khub__fail(rt, KHUB_STATUS_TOKENIZER,
                      "chat: template not recognised (starts \"%.40s\"); khub formats "
                      "ChatML, Llama-3.0 and Gemma templates only, pass one of those",
                      tmpl);
}

const char *khub__chat_end_of_turn(khub_chat_style style)
{
    switch (style) {
    case KHUB_CHAT_CHATML: return "<|im_end|>";
    case KHUB_CHAT_LLAMA3: return "<|eot_id|>";
    case KHUB_CHAT_GEMMA: return "<end_of_turn>";
    default: return "";
    }
}

/* ------------------------------------------------------------------------ */
/* Formatting                                                               */
/* ------------------------------------------------------------------------ */

static bool role_ok(const char *role)
{
    if (!role || !*role || strlen(role) > 64) return false;
    for (const unsigned char *p = (const unsigned char *)role; *p; p++)
        if (*p < 0x20 || *p == 0x7F || *p == '<' || *p == '>') return false;
    return true;
}

/* Jinja's trim: Python's str.strip() whitespace at both ends. */
static bool py_space(uint32_t cp) { return khub__uni_is_space(cp) || (cp >= 0x1C && cp <= 0x1F); }

static void put_trimmed(sbuf *b, const char *s)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s), lo = 0, hi = n;
    while (lo < n) {
        uint32_t cp;
        size_t l = khub__utf8_decode(u + lo, n - lo, &cp);
        if (!py_space(cp)) break;
        lo += l;
    }
    while (hi > lo) {
        size_t st = hi - 1;
        while (st > lo && (u[st] & 0xC0) == 0x80) st--;
        uint32_t cp;
        khub__utf8_decode(u + st, hi - st, &cp);
        if (!py_space(cp)) break;
        hi = st;
    }
    sb_put(b, s + lo, hi - lo);
}

static void chatml_turn(sbuf *b, const char *role, const char *content)
{
    sb_str(b, "<|im_start|>");
    sb_str(b, role);
    sb_str(b, "\n");
    sb_str(b, content);
    sb_str(b, "<|im_end|>\n");
}

static void llama3_turn(sbuf *b, const char *role, const char *content)
{
    sb_str(b, "<|start_header_id|>");
    sb_str(b, role);
    sb_str(b, "<|end_header_id|>\n\n");
    put_trimmed(b, content);
    sb_str(b, "<|eot_id|>");
}

/* Gemma: a leading system message becomes the first user turn's prefix;
 * Jinja's loop.first is the first message after it. */
static void gemma_format(sbuf *b, const khub_chat_msg *msgs, size_t n, bool gen)
{
    size_t first = 0;
    sb_str(b, "<bos>");
    if (n > 0 && strcmp(msgs[0].role, "system") == 0) first = 1;
    for (size_t i = first; i < n; i++) {
        const char *role = strcmp(msgs[i].role, "assistant") == 0 ? "model" : msgs[i].role;
        sb_str(b, "<start_of_turn>");
        sb_str(b, role);
        sb_str(b, "\n");
        if (i == first && first == 1) {
            sb_str(b, msgs[0].content);
            sb_str(b, "\n\n");
        }
        put_trimmed(b, msgs[i].content);
        sb_str(b, "<end_of_turn>\n");
    }
    if (gen) sb_str(b, "<start_of_turn>model\n");
}

khub_status khub__chat_format(khub_runtime *rt, const char *tmpl, const khub_chat_msg *msgs,
                              size_t n, bool add_generation_prompt, char **out)
{
    KHUB_API_CHECK(rt, out && (msgs || n == 0));
    *out = NULL;
    for (size_t i = 0; i < n; i++) {
        KHUB_RETURN_IF(rt, !role_ok(msgs[i].role), KHUB_STATUS_TOKENIZER,
                       "chat: message %zu has an empty or invalid role; use system, user or "
                       "assistant",
                       i);
        KHUB_RETURN_IF(rt, !msgs[i].content, KHUB_STATUS_TOKENIZER,
                       "chat: message %zu (%s) has no content", i, msgs[i].role);
    }
    khub_chat_style style;
    char *sys = NULL;
    KHUB_FORWARD_IF_ERROR(rt, khub__chat_detect(rt, tmpl, &style, &sys));
    if (style == KHUB_CHAT_GEMMA) { /* the template raises on anything else */
        size_t first = n > 0 && strcmp(msgs[0].role, "system") == 0;
        for (size_t i = first; i < n; i++)
            KHUB_RETURN_IF(rt, (strcmp(msgs[i].role, "user") == 0) != ((i - first) % 2 == 0),
                           KHUB_STATUS_TOKENIZER,
                           "chat: message %zu (%s): Gemma's template needs the roles to "
                           "alternate user/assistant after an optional system message",
                           i, msgs[i].role);
    }
    sbuf b = {.rt = rt};
    if (style == KHUB_CHAT_CHATML) {
        /* The template inserts it on the first loop turn: none for no messages. */
        if (sys && n > 0 && strcmp(msgs[0].role, "system") != 0) chatml_turn(&b, "system", sys);
        for (size_t i = 0; i < n; i++) chatml_turn(&b, msgs[i].role, msgs[i].content);
        if (add_generation_prompt) sb_str(&b, "<|im_start|>assistant\n");
    } else if (style == KHUB_CHAT_GEMMA) {
        gemma_format(&b, msgs, n, add_generation_prompt);
    } else {
        if (n > 0) sb_str(&b, "<|begin_of_text|>"); /* bos_token on the first turn */
        for (size_t i = 0; i < n; i++) llama3_turn(&b, msgs[i].role, msgs[i].content);
        if (add_generation_prompt) sb_str(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    }
    khub__strfree(rt, sys);
    if (!b.p) sb_put(&b, "", 0);
    return sb_finish(&b, out);
}
