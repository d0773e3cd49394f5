/*
 * chat.h: turns a conversation into the prompt text a model was trained on,
 * by recognising the model's own chat template (the Jinja string from
 * tokenizer_config.json or GGUF tokenizer.chat_template) as one of a few
 * known formats. khub has no Jinja engine: a template it cannot recognise is
 * refused with KHUB_STATUS_TOKENIZER and a message, never guessed at.
 *
 *     khub_chat_msg msgs[] = {{"user", "What is 2+2?"}};
 *     char *prompt = NULL;
 *     KHUB_FORWARD_IF_ERROR(rt, khub__chat_format(rt, khub__tokenizer_chat_template(tok),
 *                                                 msgs, 1, true, &prompt));
 *     khub__tokenizer_encode(tok, prompt, strlen(prompt), KHUB_TOK_PARSE_SPECIAL, &ids, &n);
 *     khub__strfree(rt, prompt);
 *
 * Recognised formats:
 *   - ChatML ("<|im_start|>role\ncontent<|im_end|>\n", SmolLM2-Instruct,
 *     Qwen2): when the template inserts a default system message if the
 *     first message is not a system one (SmolLM2 and Qwen2 do), the same
 *     text, taken from the template itself, is inserted.
 *   - Gemma ("<start_of_turn>role\ncontent<end_of_turn>\n", <bos> text first,
 *     assistant written "model", content trimmed, a system message's text
 *     and "\n\n" put before the first user turn's content) as in Gemma 3's
 *     template (khub__chat_gemma_template).
 *   - Llama-3 ("<|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>",
 *     content trimmed, bos text "<|begin_of_text|>" first) as in the
 *     Llama-3.0 Instruct template; the 3.1+ templates (date and tool
 *     preamble) are refused.
 * The output contains special-token text: encode it with
 * KHUB_TOK_PARSE_SPECIAL and without KHUB_TOK_ADD_BOS (the Llama-3 format
 * already starts with the bos text).
 *
 * Internal to libkhub (not API; see abi/khub/ for what is).
 */
#ifndef KHUB_RUNTIME_CHAT_H
#define KHUB_RUNTIME_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "internal.h"

typedef struct khub_chat_msg {
    const char *role;    /* "system", "user", "assistant" (any non-empty text without
                            control characters is passed through) */
    const char *content; /* UTF-8, NUL-terminated */
} khub_chat_msg;

typedef enum khub_chat_style {
    KHUB_CHAT_UNKNOWN = 0,
    KHUB_CHAT_CHATML = 1,
    KHUB_CHAT_LLAMA3 = 2,
    KHUB_CHAT_GEMMA = 3
} khub_chat_style;

/* Gemma 3's chat template (the text google/gemma-3-*-it ship, text-only
 * parts), for files that carry none, such as the 270M base GGUF: generation
 * uses it when the vocab has <start_of_turn> and <end_of_turn> tokens. */
KHUB_INTERNAL extern const char khub__chat_gemma_template[];

/* Recognises tmpl. *style receives the format; *default_system (may be NULL)
 * receives the default system prompt the template inserts, allocated on rt
 * (free with khub__strfree), or NULL when it inserts none. A NULL or
 * unrecognised tmpl fails with KHUB_STATUS_TOKENIZER ("chat template not
 * recognised ...: pass a ChatML or Llama-3 template"). */
KHUB_INTERNAL khub_status khub__chat_detect(khub_runtime *rt, const char *tmpl,
                                            khub_chat_style *style, char **default_system);

/* Formats msgs[0..n) as tmpl would with add_generation_prompt (the opening
 * of the assistant's turn appended when true). *out is NUL-terminated,
 * allocated on rt; free with khub__strfree(rt, *out). Fails with TOKENIZER
 * for an unrecognised template or an empty/invalid role, MISUSE for NULL
 * arguments, NOMEM. */
KHUB_INTERNAL khub_status khub__chat_format(khub_runtime *rt, const char *tmpl,
                                            const khub_chat_msg *msgs, size_t n,
                                            bool add_generation_prompt, char **out);

/* The model's chat template (tokenizer.chat_template); for a file without
 * one whose vocab has Gemma's turn tokens (the Gemma 3 base GGUFs), Gemma
 * 3's own template; NULL when neither (chat_api.c). */
struct khub_model;
KHUB_INTERNAL const char *khub__model_chat_template(const struct khub_model *m);

/* The text that ends an assistant turn in a style ("<|im_end|>", "<|eot_id|>");
 * static storage; "" for KHUB_CHAT_UNKNOWN. */
KHUB_INTERNAL const char *khub__chat_end_of_turn(khub_chat_style style);

#endif /* KHUB_RUNTIME_CHAT_H */
