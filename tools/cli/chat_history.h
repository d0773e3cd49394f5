/*
 * chat_history.h: the messages of a `khub chat` conversation, and their
 * JSON file (tools/cli/chat_history.c): /save writes
 *
 *     {"messages": [{"role": "system", "content": "..."},
 *                   {"role": "user", "content": "..."}, ...]}
 *
 * and /load reads that, or a bare array of messages (what an OpenAI request's
 * "messages" holds). Roles are system, user and assistant; a system message
 * may only come first. A file that breaks any rule is refused whole, with
 * the reason and where, and the conversation in memory is left as it was.
 */
#ifndef KHUB_CLI_CHAT_HISTORY_H
#define KHUB_CLI_CHAT_HISTORY_H

#include <stddef.h>

#define CHAT_FILE_MAX (16 << 20) /* bytes of a conversation file */

typedef struct chat_history {
    const char **roles; /* [n] "system", "user" or "assistant" (static strings) */
    char **contents;    /* [n] owned */
    size_t n, cap;
} chat_history;

/* Appends a message (content copied); 0, or -1 out of memory. */
int chat_history_add(chat_history *h, const char *role, const char *content, size_t len);
/* Drops the last message. */
void chat_history_pop(chat_history *h);
/* Drops every message but a leading system message when keep_system. */
void chat_history_clear(chat_history *h, int keep_system);
void chat_history_free(chat_history *h);
/* Swaps two histories (a loaded one takes the place of the current one). */
void chat_history_swap(chat_history *a, chat_history *b);

/* Writes h to path as JSON (through path.tmp and a rename, so a failed
 * write leaves an older file whole); 0, or -1 with the reason in err. */
int chat_history_save(const chat_history *h, const char *path, char *err, size_t err_size);
/* Reads path into *out (empty on entry); 0, or -1 with the reason in err
 * (*out is then empty). */
int chat_history_load(const char *path, chat_history *out, char *err, size_t err_size);

#endif /* KHUB_CLI_CHAT_HISTORY_H */
