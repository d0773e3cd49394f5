/*
 * khub_session.h: a conversation that keeps its KV cache between generate
 * calls, so each turn of a chat computes only its new tokens. The engine of
 * `khub chat` (llama-cli -cnv's and Transformers' chat's job).
 *
 * A session holds one sequence of its model's KV cache and remembers the
 * token ids whose K/V that sequence holds. khub_session_generate takes the
 * whole conversation so far as its prompt (khub_model_chat_format's text),
 * tokenizes it, keeps the cached K/V of the longest common token prefix,
 * truncates the rest, prefills only what follows and then generates. When
 * the new prompt extends the last one (the usual chat turn: the last prompt,
 * the answer, a new user message), only the answer's last token and the new
 * message are computed; when it does not (an edited history, a /load), the
 * prefill starts at the first token that differs.
 *
 *     khub_model *m = NULL;
 *     khub_model_load(rt, "SmolLM2-135M-Instruct.Q4_1.gguf", NULL, &m);
 *     khub_session *s = NULL;
 *     khub_session_new(m, &s);
 *     const char *roles[] = {"user"}, *contents[] = {"Hi"};
 *     char prompt[4096];
 *     size_t len = 0;
 *     khub_model_chat_format(m, roles, contents, 1, 1, prompt, sizeof prompt, &len);
 *     khub_generate_opts go = {KHUB_APP_INIT(khub_generate_opts), .max_new_tokens = 64};
 *     khub_generate_result res = {KHUB_APP_INIT(khub_generate_result)};
 *     if (khub_session_generate(s, prompt, &go, &res) == KHUB_STATUS_OK)
 *         printf("%s\n", res.text);   // then format [user, assistant, user] and call again
 *     khub_generate_results_free(m, &res, 1);
 *     khub_session_free(s);
 *     khub_model_free(m);
 *
 * Greedy output of a turn equals that of khub_model_generate on the same
 * whole prompt when the model's kernels compute a row the same way whatever
 * the rows beside it (khub/ref-cpu does; docs/batching.md says which others
 * do): tests/test_session.c checks it.
 *
 * Sharing the model: a session uses sequence max_seqs - 1 of its model's KV
 * cache, and one model has at most one session. khub_model_generate,
 * khub_model_logits or a khub_batch on the same model between two session
 * calls may take that sequence; the session notices (its cached ids are
 * then forgotten) and its next call prefills the whole prompt again. A
 * session is used by one thread at a time, never while a khub_batch on its
 * model is running in another thread.
 *
 * Anything not declared in abi/khub/ is not part of khub's API.
 */
#ifndef KHUB_SESSION_H
#define KHUB_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "khub_model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct khub_session khub_session;

/* Where a session stands. The caller sets struct_size; khub fills the rest. */
typedef struct khub_session_info {
    KHUB_STRUCT_HEADER;
    int64_t n_cached;    /* tokens whose K/V the session holds now */
    int64_t max_context; /* the most one sequence holds (khub_model_info.max_context) */
    int64_t n_reused;    /* of the last generate's prompt: tokens found in the cache */
    int64_t n_prefilled; /* of the last generate's prompt: tokens computed */
    /* End of 0.1. */
} khub_session_info;

/* Makes an empty session on m (used, not owned: free the session first).
 * BUSY when m already has a session (the message says so). *out is NULL on
 * failure. Since 0.1. */
KHUB_API khub_status khub_session_new(khub_model *m, khub_session **out);
/* Gives the session's KV sequence back and frees it. Accepts NULL.
 * Since 0.1. */
KHUB_API void khub_session_free(khub_session *s);

/* Generates a continuation of prompt (the whole conversation so far, as
 * khub_model_chat_format writes it with add_generation_prompt 1; chat 1 in
 * opts applies the template to prompt as one user message instead, as
 * khub_model_generate does), reusing the cached K/V of the longest token
 * prefix it shares with what the session computed last. opts as
 * khub_model_generate takes them (NULL = defaults), its callback streaming
 * with prompt index 0; a callback that returns nonzero stops the answer
 * (stop reason CALLBACK) and what was generated stays cached. result (its
 * struct_size set) is filled as khub_model_generate fills it, with
 * n_prompt_tokens the whole prompt's length; free it with
 * khub_generate_results_free, also after a failure. Afterwards the session
 * holds the prompt and the answer's tokens (all but the last sampled one).
 * Statuses: CONTEXT_FULL (the prompt leaves no room for one new token:
 * the message gives both numbers; the cache is kept), TOKENIZER,
 * INVALID_ARG (an empty prompt, a bad option), STRUCT_SIZE (result below
 * 0.1's 96; 0.1 asked for this header's sizeof), NOMEM, and op
 * failures (the session is then empty). An answer that fills the context
 * stops with KHUB_STOP_CONTEXT, one cancelled by khub_session_cancel with
 * KHUB_STOP_CANCELLED. Since 0.1. */
KHUB_API khub_status khub_session_generate(khub_session *s, const char *prompt,
                                           const khub_generate_opts *opts,
                                           khub_generate_result *result);

/* Asks the khub_session_generate call running on s in another thread to
 * stop, during its prefill as during its decode: it checks before each
 * forward call (a prefill chunk of khub_model_opts.max_batch_tokens prompt
 * tokens, or one decode step), so it stops within one such call. The call
 * then returns OK with stop_reason KHUB_STOP_CANCELLED and what it
 * generated so far; the session keeps the K/V it computed (a prompt cut
 * short is prefilled from there by the next call). The request is consumed
 * when a generate call returns; sent with no call in flight, it stops the
 * next call at its first check. Safe from any thread and from a signal
 * handler (one lock-free atomic store; `khub chat` calls it on Ctrl-C).
 * Accepts NULL (does nothing); cannot fail. Since 0.1. */
KHUB_API void khub_session_cancel(khub_session *s);

/* Forgets the conversation: the next generate prefills its whole prompt.
 * Since 0.1. */
KHUB_API khub_status khub_session_reset(khub_session *s);
/* Fills info (its struct_size set by the caller, at least 0.1's 40; a
 * larger, newer struct's further bytes are left alone). STRUCT_SIZE below
 * it (since 0.2; 0.1 asked for this header's sizeof). Since 0.1. */
KHUB_API khub_status khub_session_info_get(const khub_session *s, khub_session_info *info);

#ifdef __cplusplus
}
#endif

#endif /* KHUB_SESSION_H */
