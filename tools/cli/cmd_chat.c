/*
 * cmd_chat.c: `khub chat`: an interactive multi-turn conversation on a
 * terminal through the model's chat template (llama-cli -cnv's and
 * Transformers' `transformers chat`'s job; issue 16 item 5).
 *
 * Each turn formats the whole conversation (khub_model_chat_format) and hands
 * it to a khub_session, which keeps the KV cache of the turns before and
 * computes only the new tokens. Answers stream to stdout; notes go to stderr.
 *
 * Signals, as llama-cli: Ctrl-C while an answer is being computed stops it
 * (the handler calls khub_session_cancel, async-signal-safe, which the
 * session checks before each forward call): during the prompt's prefill
 * the message is taken back (the K/V computed so far stays cached and is
 * reused if the next prompt starts the same way), during the answer the
 * partial answer stays in the conversation, as it stays in the KV cache;
 * Ctrl-C at any other time (at the prompt, during a /load) leaves at
 * once with status 130 from the handler itself (_exit, as llama-cli does):
 * a flag checked before a blocking read would leave a window in which the
 * signal comes after the check and the read then waits for a line.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat_history.h"
#include "khub/khub_session.h"
#include "model_flags.h"
#include "tp_job.h"

static const khub_cli_cmd chat_cmd;

static volatile sig_atomic_t generating;
static khub_session *volatile sigint_session; /* the chat's, for on_sigint */

static void on_sigint(int sig)
{
    (void)sig;
    if (generating) {
        khub_session_cancel(sigint_session);
        return;
    }
    ssize_t w = write(STDOUT_FILENO, "\n", 1); /* async-signal-safe, as _exit */
    (void)w;
    _exit(130);
}

typedef struct chat {
    cli_model_args a;
    khub_runtime *rt;
    khub_model *m;
    khub_session *s;
    chat_history h; /* a system message first when there is one */
    char *text;     /* the template's output */
    size_t text_cap;
    int64_t trained; /* the model's trained context, tokens */
    /* The last generate call, for /stats. */
    khub_generate_result last;
    khub_session_info last_info;
} chat;

/* ======================================================================== */
/* Turns                                                                    */
/* ======================================================================== */

/* h through the chat template into c->text; 0, or 1 with the message in err. */
static int format(chat *c, const chat_history *h, int add_generation_prompt)
{
    for (;;) {
        size_t len = 0;
        khub_status st =
            khub_model_chat_format(c->m, h->roles, (const char *const *)h->contents, h->n,
                                   add_generation_prompt, c->text, c->text_cap, &len);
        if (st == KHUB_STATUS_OK) return 0;
        if (st != KHUB_STATUS_OVERFLOW) return 1;
        char *p = realloc(c->text, len + 1);
        if (!p) return 1;
        c->text = p;
        c->text_cap = len + 1;
    }
}

static int on_text(void *ud, int32_t prompt, const char *text, size_t len)
{
    (void)ud, (void)prompt;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

static void context_note(chat *c, const khub_generate_result *r)
{
    khub_session_info i = {KHUB_APP_INIT(khub_session_info)};
    if (khub_session_info_get(c->s, &i) != KHUB_STATUS_OK) return;
    long long used = r->n_prompt_tokens + r->n_tokens, max = i.max_context;
    if (r->stop_reason == KHUB_STOP_CONTEXT)
        fprintf(stderr,
                "[context full: %lld of %lld tokens; the answer stops here. /clear starts "
                "again; --max-context raises the limit (the model was trained for %lld)]\n",
                used, max, (long long)c->trained);
    else if (used * 4 >= max * 3)
        fprintf(stderr, "[context: %lld of %lld tokens used (%lld%%)]\n", used, max,
                used * 100 / max);
}

/* Keeps r's numbers (not its text) and the session's for /stats. */
static void remember(chat *c, const khub_generate_result *r)
{
    c->last = *r;
    c->last.text = NULL;
    c->last.tokens = NULL;
    c->last_info = (khub_session_info){KHUB_APP_INIT(khub_session_info)};
    khub_session_info_get(c->s, &c->last_info);
}

static void print_stats(const chat *c)
{
    const khub_generate_result *r = &c->last;
    const khub_session_info *i = &c->last_info;
    if (!i->struct_size) {
        fprintf(stderr, "[no turn yet]\n");
        return;
    }
    fprintf(stderr,
            "[last turn: prompt %lld tokens (%lld reused from the cache, %lld computed in %.1f "
            "ms); answer %lld tokens in %.1f ms (%.1f tok/s); cache %lld of %lld tokens]\n",
            (long long)r->n_prompt_tokens, (long long)i->n_reused, (long long)i->n_prefilled,
            r->prefill_ms, (long long)r->n_tokens, r->decode_ms, r->decode_tok_s,
            (long long)i->n_cached, (long long)i->max_context);
}

/* Generates the answer to c->h (which ends with a user message) with opts,
 * streaming it when stream; on success the answer joins the conversation.
 * On failure the user message is taken back out and the reason printed. */
static void answer(chat *c, khub_generate_opts opts, int stream)
{
    khub_generate_result r = {KHUB_APP_INIT(khub_generate_result)};
    if (format(c, &c->h, 1)) {
        khub_cli_fail("chat", "the chat template: %s", khub_runtime_errmsg(c->rt));
        chat_history_pop(&c->h);
        return;
    }
    opts.callback = stream ? on_text : NULL;
    generating = 1;
    khub_status st = khub_session_generate(c->s, c->text, &opts, &r);
    generating = 0;
    if (st == KHUB_STATUS_OK && r.stop_reason == KHUB_STOP_CANCELLED && r.n_tokens == 0) {
        khub_session_info i = {KHUB_APP_INIT(khub_session_info)};
        khub_session_info_get(c->s, &i);
        fprintf(stderr,
                "[stopped before the answer began (%lld of the prompt's %lld tokens computed): "
                "the message was not added]\n",
                (long long)i.n_cached, (long long)r.n_prompt_tokens);
        remember(c, &r);
        chat_history_pop(&c->h);
    } else if (st != KHUB_STATUS_OK) {
        if (st == KHUB_STATUS_CONTEXT_FULL)
            fprintf(stderr,
                    "[context full: %s. The message was not added; /clear starts again, "
                    "--max-context raises the limit (the model was trained for %lld)]\n",
                    khub_runtime_errmsg(c->rt), (long long)c->trained);
        else
            khub_cli_fail("chat", "%s", khub_runtime_errmsg(c->rt));
        chat_history_pop(&c->h);
    } else {
        if (stream) fputc('\n', stdout);
        fflush(stdout);
        if (r.stop_reason == KHUB_STOP_CANCELLED)
            fprintf(stderr, "[stopped: the partial answer stays in the conversation]\n");
        if (chat_history_add(&c->h, "assistant", r.text, r.text_len))
            khub_cli_fail("chat", "out of memory");
        remember(c, &r);
        context_note(c, &r);
    }
    khub_generate_results_free(c->m, &r, 1);
}

/* Computes the KV of h without answering (a loaded conversation that ends
 * with the assistant): one token is sampled and dropped. 0, or 1 printed. */
static int prefill(chat *c, const chat_history *h, const char *path)
{
    khub_generate_opts opts = {KHUB_APP_INIT(khub_generate_opts), .max_new_tokens = 1};
    khub_generate_result r = {KHUB_APP_INIT(khub_generate_result)};
    int rc = 0;
    if (format(c, h, 0))
        rc = khub_cli_fail("chat", "/load %s: the chat template refuses it: %s", path,
                           khub_runtime_errmsg(c->rt));
    else if (khub_session_generate(c->s, c->text, &opts, &r) != KHUB_STATUS_OK)
        rc = khub_cli_fail("chat", "/load %s: %s", path, khub_runtime_errmsg(c->rt));
    else
        remember(c, &r);
    khub_generate_results_free(c->m, &r, 1);
    return rc;
}

/* ======================================================================== */
/* Commands                                                                 */
/* ======================================================================== */

static const char help_text[] =
    "  /clear        forget the conversation (the system prompt stays) and its cache\n"
    "  /system TEXT  set the system prompt and start again (/system alone shows it)\n"
    "  /save FILE    write the conversation as JSON {\"messages\": [{role, content}...]}\n"
    "  /load FILE    replace the conversation by FILE's (its KV is computed now; a last\n"
    "                message from the user is answered)\n"
    "  /stats        the last turn: tokens reused from the cache and computed, times\n"
    "  /help         this list        /exit  leave (so does Ctrl-D at the prompt)\n"
    "  Ctrl-C stops an answer (what was said stays) or, while the prompt is computed,\n"
    "  the turn (the message is taken back); at any other time it leaves.\n"
    "  A line ending in \\ goes on on the next line; //text sends /text.\n";

static void restart(chat *c, const char *system)
{
    chat_history_clear(&c->h, 0);
    if (system && chat_history_add(&c->h, "system", system, strlen(system)))
        khub_cli_fail("chat", "out of memory");
    if (khub_session_reset(c->s) != KHUB_STATUS_OK)
        khub_cli_fail("chat", "%s", khub_runtime_errmsg(c->rt));
}

static void cmd_load(chat *c, const char *path)
{
    chat_history loaded = {0};
    char err[512];
    if (chat_history_load(path, &loaded, err, sizeof err)) {
        khub_cli_fail("chat", "/load %s: %s; the conversation is unchanged", path, err);
        return;
    }
    int ask = !strcmp(loaded.roles[loaded.n - 1], "user");
    if (!ask && prefill(c, &loaded, path)) {
        fprintf(stderr, "[the conversation is unchanged]\n");
        chat_history_free(&loaded);
        return;
    }
    chat_history_swap(&c->h, &loaded);
    fprintf(stderr, "[loaded %zu messages from %s]\n", c->h.n, path);
    if (ask) {
        /* Answered now; if that fails, the old conversation comes back. */
        size_t n = c->h.n;
        answer(c, c->a.gen, 1);
        if (c->h.n < n) {
            chat_history_swap(&c->h, &loaded);
            fprintf(stderr, "[the conversation is unchanged]\n");
        }
    }
    chat_history_free(&loaded);
}

/* Runs a /command line; returns 1 when the program should leave. */
static int command(chat *c, const char *line)
{
    const char *sp = strchr(line, ' ');
    size_t n = sp ? (size_t)(sp - line) : strlen(line);
    const char *arg = sp ? sp + 1 : "";
    while (*arg == ' ') arg++;
#define IS(name) (n == strlen(name) && !strncmp(line, name, n))
    if (IS("/exit") || IS("/quit")) return 1;
    if (IS("/help")) {
        fputs(help_text, stderr);
    } else if (IS("/stats")) {
        print_stats(c);
    } else if (IS("/clear")) {
        restart(c, c->h.n && !strcmp(c->h.roles[0], "system") ? c->h.contents[0] : NULL);
        fprintf(stderr, "[conversation cleared]\n");
    } else if (IS("/system") && !*arg) {
        int has = c->h.n && !strcmp(c->h.roles[0], "system");
        fprintf(stderr, "[system prompt: %s]\n", has ? c->h.contents[0] : "(none)");
    } else if (IS("/system")) {
        char *copy = strdup(arg);
        restart(c, copy);
        free(copy);
        fprintf(stderr, "[system prompt set; conversation restarted]\n");
    } else if ((IS("/save") || IS("/load")) && !*arg) {
        khub_cli_fail("chat", "%.*s needs a FILE", (int)n, line);
    } else if (IS("/save")) {
        char err[512];
        if (chat_history_save(&c->h, arg, err, sizeof err))
            khub_cli_fail("chat", "/save %s: %s", arg, err);
        else
            fprintf(stderr, "[saved %zu messages to %s]\n", c->h.n, arg);
    } else if (IS("/load")) {
        cmd_load(c, arg);
    } else {
        khub_cli_fail("chat", "unknown command %.*s (/help lists them)", (int)n, line);
    }
#undef IS
    return 0;
}

/* ======================================================================== */
/* The loop                                                                 */
/* ======================================================================== */

/* Reads one message (lines ending in '\' continue) into *buf. Returns 1 for
 * a message, 0 at end of input (Ctrl-C does not come back: on_sigint). */
static int read_message(char **buf, size_t *cap)
{
    size_t len = 0;
    char *line = NULL;
    size_t line_cap = 0;
    fputs("> ", stdout);
    for (;;) {
        fflush(stdout);
        ssize_t got = getline(&line, &line_cap, stdin);
        if (got < 0) {
            free(line);
            return len ? 1 : 0;
        }
        if (got && line[got - 1] == '\n') line[--got] = '\0';
        int more = got && line[got - 1] == '\\';
        if (more) line[--got] = '\0';
        if (len + (size_t)got + 2 > *cap) {
            size_t c = (len + (size_t)got + 2) * 2;
            char *p = realloc(*buf, c);
            if (!p) abort(); /* the CLI is a program: out of memory ends it */
            *buf = p;
            *cap = c;
        }
        memcpy(*buf + len, line, (size_t)got);
        len += (size_t)got;
        if (more) (*buf)[len++] = '\n';
        (*buf)[len] = '\0';
        if (!more) break;
        fputs("... ", stdout);
    }
    free(line);
    return 1;
}

static int loop(chat *c)
{
    char *buf = NULL;
    size_t cap = 0;
    int rc = 0;
    for (;;) {
        if (!read_message(&buf, &cap)) {
            fputc('\n', stdout);
            break;
        }
        const char *msg = buf;
        if (msg[0] == '/' && msg[1] != '/') {
            if (command(c, msg)) break;
            continue;
        }
        if (msg[0] == '/') msg++; /* "//text" sends "/text" */
        if (!*msg) {
            /* An empty line answers a last message from the user (a /load
             * whose answer failed); else it does nothing. */
            if (c->h.n && !strcmp(c->h.roles[c->h.n - 1], "user")) answer(c, c->a.gen, 1);
            continue;
        }
        if (chat_history_add(&c->h, "user", msg, strlen(msg))) {
            rc = khub_cli_fail("chat", "out of memory");
            break;
        }
        answer(c, c->a.gen, 1);
    }
    free(buf);
    return rc;
}

static int parse(int argc, char **argv, cli_model_args *a)
{
    cli_model_args_init(a);
    a->gen.max_new_tokens = 1024;
    for (int i = 1; i < argc; i++) {
        int rc = 0;
        if (cli_model_flag(&chat_cmd, a, argc, argv, &i, &rc)) {
            if (rc) return rc;
            continue;
        }
        return khub_cli_usage(&chat_cmd, "unknown option '%s'", argv[i]);
    }
    return cli_model_args_finish(&chat_cmd, a);
}

static int run(int argc, char **argv)
{
    if (khub_cli_wants_help(&chat_cmd, argc, argv)) return 0;
    chat c = {0};
    int rc = parse(argc, argv, &c.a);
    if (rc) return rc;
    c.a.gen.system = NULL; /* the system message is in the history */
    cli_tp_job job;
    if ((rc = cli_tp_begin(&job, "chat", c.a.tp, 0)) != 0) return rc;
    c.a.comm = cli_tp_comm(&job);
    c.m = cli_model_open("chat", &c.a, 1, isatty(2) && job.comm.rank == 0, &c.rt, NULL);
    if (!c.m) return cli_tp_end(&job, 1);
    if (job.comm.rank != 0) return cli_tp_end(&job, cli_tp_follow(&job, c.rt, c.m));
    khub_model_info info = {KHUB_APP_INIT(khub_model_info)};
    khub_model_info_get(c.m, &info);
    c.trained = info.context_length;
    if (khub_session_new(c.m, &c.s) != KHUB_STATUS_OK ||
        (c.a.system && chat_history_add(&c.h, "system", c.a.system, strlen(c.a.system)))) {
        rc = khub_cli_fail("chat", "%s", khub_runtime_errmsg(c.rt));
    } else {
        struct sigaction sa = {0};
        sigint_session = c.s;
        sa.sa_handler = on_sigint;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL);
        fprintf(stderr,
                "khub chat: %s, context %lld tokens. /help lists the commands; Ctrl-C stops an "
                "answer; Ctrl-D or /exit leaves.\n",
                c.a.model, (long long)info.max_context);
        rc = loop(&c);
    }
    cli_tp_abort_if(&job, rc);
    chat_history_free(&c.h);
    free(c.text);
    khub_session_free(c.s);
    khub_model_free(c.m);
    khub_runtime_free(c.rt);
    return cli_tp_end(&job, rc);
}

static const khub_cli_cmd chat_cmd = {
    "chat", "talk with a model: a multi-turn chat that reuses its KV cache",
    "usage: khub chat --model PATH [options]\n"
    "\n"
    "An interactive conversation through the model's chat template (ChatML, Llama-3,\n"
    "Gemma). Each turn computes only its new tokens: the KV cache of the turns before\n"
    "is kept (khub_session.h). Answers stream to stdout; notes go to stderr. Near the\n"
    "end of the context each answer is followed by the tokens used; when the context\n"
    "is full the answer stops there and says so, and a message that does not fit is\n"
    "refused with the numbers (nothing is cut silently).\n"
    "\n"
    "At the prompt:\n"
    "  /clear        forget the conversation (the system prompt stays) and its cache\n"
    "  /system TEXT  set the system prompt and start again (/system alone shows it)\n"
    "  /save FILE    write the conversation as JSON {\"messages\": [{role, content}...]}\n"
    "  /load FILE    replace the conversation by FILE's, or an array of messages (a bad\n"
    "                file is refused with the reason and the conversation stays); its KV\n"
    "                is computed at once, and a last message from the user is answered\n"
    "  /stats        the last turn: prompt tokens reused from the cache and computed,\n"
    "                prefill and decode times, the cache's use\n"
    "  /help, /exit  (Ctrl-D at the prompt leaves too)\n"
    "  A line ending in \\ goes on on the next line; //text sends /text.\n"
    "  Ctrl-C while an answer streams stops it; the partial answer stays in the\n"
    "  conversation. Ctrl-C while the prompt is computed (before the answer's first\n"
    "  token) stops at once and takes the message back. Ctrl-C at any other time (at\n"
    "  the prompt, during a /load) leaves\n"
    "  at once with status 130 (as llama-cli).\n"
    "\n"
    "Options:\n"
    "  --model PATH          .gguf file or folder with config.json and *.safetensors\n"
    "  --system TEXT         the system prompt to start with\n" CLI_MODEL_TP_HELP
    "  --max-new-tokens N    tokens to generate per answer (default 1024)\n" CLI_MODEL_SAMPLING_HELP
    "\n" CLI_MODEL_KERNELS_HELP "  --help                print this help\n",
    run};

KHUB_CLI_COMMAND(chat_cmd)
