/*
 * chat_api.c: a conversation formatted with a loaded model's chat template
 * (khub_model_chat_format, khub/khub_model.h), for callers that hold a whole
 * conversation (the model server's /v1/chat/completions, a chat loop)
 * rather than one user turn (khub_generate_opts.chat, generate.c).
 */
#include <string.h>

#include "chat.h"
#include "executor.h"
#include "tokenizer.h"

const char *khub__model_chat_template(const khub_model *m)
{
    const char *t = khub__tokenizer_chat_template(m->tok);
    int32_t id;
    if (!t && khub__tokenizer_find(m->tok, "<start_of_turn>", 15, &id) == KHUB_STATUS_OK &&
        khub__tokenizer_find(m->tok, "<end_of_turn>", 13, &id) == KHUB_STATUS_OK)
        t = khub__chat_gemma_template;
    return t;
}

/* Bytes of the BOS text that khub_model_generate's own BOS would double:
 * the length of the BOS token's text when the tokenizer adds a BOS (an
 * empty text encodes to it alone) and the formatted text starts with it. */
static size_t doubled_bos(const khub_model *m, const char *text)
{
    int32_t *ids = NULL;
    size_t n = 0, skip = 0;
    int32_t bos = khub__tokenizer_bos(m->tok);
    if (bos < 0 ||
        khub__tokenizer_encode(m->tok, "", 0, KHUB_TOK_ADD_SPECIAL, &ids, &n) != KHUB_STATUS_OK)
        return 0;
    const char *p = NULL;
    size_t len = 0;
    if (n == 1 && ids[0] == bos &&
        khub__tokenizer_token_bytes(m->tok, bos, &p, &len) == KHUB_STATUS_OK && len &&
        strncmp(text, p, len) == 0)
        skip = len;
    khub__tokenizer_free_ids(m->tok, ids, n);
    return skip;
}

khub_status khub_model_chat_format(khub_model *m, const char *const *roles,
                                   const char *const *contents, size_t n, int add_generation_prompt,
                                   char *buf, size_t cap, size_t *len)
{
    KHUB_API_CHECK(m ? m->rt : NULL, m && len && (buf || cap == 0) && ((roles && contents) || !n));
    khub_runtime *rt = m->rt;
    khub__clear(rt);
    KHUB_RETURN_IF(rt, !m->tok, KHUB_STATUS_TOKENIZER, "%s: the model has no tokenizer", m->file);
    khub_chat_msg *msgs = n ? khub__calloc(rt, n, sizeof *msgs) : NULL;
    KHUB_RETURN_IF(rt, n && !msgs, KHUB_STATUS_NOMEM, "chat: no memory for %zu messages", n);
    for (size_t i = 0; i < n; i++) msgs[i] = (khub_chat_msg){roles[i], contents[i]};
    char *text = NULL;
    khub_status st = khub__chat_format(rt, khub__model_chat_template(m), msgs, n,
                                       add_generation_prompt != 0, &text);
    khub__free(rt, msgs, n * sizeof *msgs);
    KHUB_FORWARD_IF_ERROR(rt, st);
    size_t skip = doubled_bos(m, text), l = strlen(text) - skip;
    *len = l;
    if (l < cap) memcpy(buf, text + skip, l + 1);
    khub__strfree(rt, text);
    KHUB_RETURN_IF(rt, l >= cap, KHUB_STATUS_OVERFLOW,
                   "khub_model_chat_format: %zu bytes do not fit in %zu", l + 1, cap);
    return KHUB_STATUS_OK;
}
