/*
 * cmd_run.c: `khub run`: load a model and generate text, streamed to stdout
 * as it is produced, or printed as one JSON object with --json.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "khub/khub_kernels.h"
#include "khub/khub_model.h"
#include "model_flags.h"
#include "prompts_file.h"
#include "tp_job.h"

#define MAX_PROMPTS 8
#define MAX_STDIN   (16 << 20) /* bytes of a prompt read from standard input */

static const khub_cli_cmd run_cmd;

typedef struct run_args {
    cli_model_args ma; /* the model, kernels, cache and sampling (model_flags.h) */
    const char *prompts[MAX_PROMPTS];
    int n_prompts;
    int chat, explain, json;
    const char *prompts_file; /* --prompts-file: a batch (run_batch.c) */
    int32_t parallel;         /* 0 = the default */
    char *stdin_prompt;       /* owned: --prompt - */
} run_args;

/* Reads all of standard input as the prompt of `--prompt -` (one trailing
 * newline dropped: `echo TEXT |` gives TEXT). 0, or 1 after printing why. */
static int read_stdin_prompt(char **out)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (size_t got = 1; buf && got;) {
        if (n + 1 == cap) {
            char *p = cap < MAX_STDIN ? realloc(buf, cap * 2) : NULL;
            if (!p) {
                free(buf);
                return khub_cli_fail("run", "--prompt -: standard input is over %d MiB",
                                     MAX_STDIN >> 20);
            }
            buf = p;
            cap *= 2;
        }
        got = fread(buf + n, 1, cap - 1 - n, stdin);
        n += got;
    }
    if (!buf || ferror(stdin)) {
        free(buf);
        return khub_cli_fail("run", "--prompt -: cannot read standard input");
    }
    if (n && buf[n - 1] == '\n') n--;
    buf[n] = '\0';
    if (strlen(buf) != n) {
        free(buf);
        return khub_cli_fail("run", "--prompt -: standard input holds a NUL byte");
    }
    *out = buf;
    return 0;
}

static int parse(int argc, char **argv, run_args *a)
{
    memset(a, 0, sizeof *a);
    cli_model_args_init(&a->ma);
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double d = 0;
        int rc = 0, takes = 1;
        if (cli_model_flag(&run_cmd, &a->ma, argc, argv, &i, &rc)) {
            if (rc) return rc;
            continue;
        }
        if (!strcmp(f, "--prompt")) {
            if (a->n_prompts == MAX_PROMPTS)
                return khub_cli_usage(&run_cmd, "at most %d prompts", MAX_PROMPTS);
            if (v) a->prompts[a->n_prompts++] = v;
        } else if (!strcmp(f, "--prompts-file"))
            a->prompts_file = v;
        else if (!strcmp(f, "--parallel")) {
            rc = cli_num(&run_cmd, f, v, 1, 256, &d);
            a->parallel = (int32_t)d;
        } else {
            takes = 0;
            if (!strcmp(f, "--chat"))
                a->chat = 1;
            else if (!strcmp(f, "--explain"))
                a->explain = 1;
            else if (!strcmp(f, "--json"))
                a->json = 1;
            else
                return khub_cli_usage(&run_cmd, "unknown option '%s'", f);
        }
        if (rc) return rc;
        if (takes && !v) return khub_cli_usage(&run_cmd, "%s needs a value", f);
        i += takes;
    }
    int rc = cli_model_args_finish(&run_cmd, &a->ma);
    if (rc) return rc;
    if (a->n_prompts && a->prompts_file)
        return khub_cli_usage(&run_cmd, "--prompt and --prompts-file exclude each other");
    if (!a->n_prompts && !a->prompts_file)
        return khub_cli_usage(&run_cmd, "--prompt TEXT or --prompts-file FILE is required");
    int n_stdin = 0;
    for (int i = 0; i < a->n_prompts; i++) n_stdin += !strcmp(a->prompts[i], "-");
    if (n_stdin > 1) return khub_cli_usage(&run_cmd, "--prompt - (standard input) at most once");
    a->ma.gen.chat = (uint32_t)a->chat;
    return 0;
}

/* Replaces a `--prompt -` by standard input's text; 0 or 1. */
static int stdin_prompts(run_args *a)
{
    for (int i = 0; i < a->n_prompts; i++) {
        if (strcmp(a->prompts[i], "-") != 0) continue;
        if (read_stdin_prompt(&a->stdin_prompt)) return 1;
        a->prompts[i] = a->stdin_prompt;
    }
    return 0;
}

static int on_text(void *ud, int32_t prompt, const char *text, size_t len)
{
    (void)ud, (void)prompt;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

static const char *stop_name(uint32_t r)
{
    static const char *const names[] = {"none",        "eos",      "max_tokens",
                                        "stop_string", "callback", "context"};
    return r < sizeof names / sizeof names[0] ? names[r] : "?";
}

static long peak_rss_kib(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : -1; /* KiB on Linux */
}

/* The runtime's pool size (its "threads" feature), -1 if not reported. */
static int pool_threads(const khub_runtime *rt)
{
    const khub_feature *f = NULL;
    size_t n = 0;
    if (khub_runtime_features(rt, &f, &n) != KHUB_STATUS_OK) return -1;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(f[i].name, "threads")) return atoi(f[i].value);
    return -1;
}

/* Under --tp: rank 0's collectives and their share of prefill + decode. */
static void print_tp_share(const khub_model *m, const khub_generate_result *r)
{
    khub_model_info info = {KHUB_APP_INIT(khub_model_info)};
    if (khub_model_info_get(m, &info) != KHUB_STATUS_OK) return;
    double ms = (double)info.tp_comm_ns / 1e6, total = r->prefill_ms + r->decode_ms;
    fprintf(stderr,
            "khub run: tp %d: rank 0 ran %llu collectives, %.1f ms in them (%.0f%% of "
            "prefill and decode)\n",
            (int)info.tp_size, (unsigned long long)info.tp_collectives, ms,
            total > 0 ? 100.0 * ms / total : 0.0);
}

/* The stderr summary of res[n]: the token counts of all prompts beside the
 * whole call's rates, which every result carries (before session 18 the
 * counts were the first prompt's). The first new token is sampled from the
 * prefill's logits, so one new token (or none) leaves no decode step to
 * time: decode_ms is 0 and --json's decode_tok_s 0, and the line says so
 * instead of printing a rate of 0.0 tok/s. */
static void print_summary(const khub_generate_result *res, int n)
{
    const khub_generate_result *r = &res[0]; /* the call's times and rates */
    long long prompt = 0, gen = 0;
    for (int i = 0; i < n; i++) {
        prompt += (long long)res[i].n_prompt_tokens;
        gen += (long long)res[i].n_tokens;
    }
    char prompts[32] = "", decode[64];
    if (n > 1) snprintf(prompts, sizeof prompts, "%d prompts, ", n);
    if (r->decode_ms > 0)
        snprintf(decode, sizeof decode, "%lld new token%s at %.1f tok/s", gen, gen == 1 ? "" : "s",
                 r->decode_tok_s);
    else
        snprintf(decode, sizeof decode, "%lld new token%s, no decode step to time", gen,
                 gen == 1 ? "" : "s");
    fprintf(stderr,
            "khub run: %s%lld prompt token%s at %.1f tok/s, %s (load %.0f ms, peak RSS %ld MiB)\n",
            prompts, prompt, prompt == 1 ? "" : "s", r->prefill_tok_s, decode, r->load_ms,
            peak_rss_kib() / 1024);
}

static void print_json(khub_runtime *rt, khub_model *m, const run_args *a,
                       const khub_generate_result *res)
{
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "results");
    for (int i = 0; i < a->n_prompts; i++) {
        const khub_generate_result *r = &res[i];
        cJSON *e = cJSON_CreateObject(), *toks = cJSON_AddArrayToObject(e, "tokens");
        cJSON_AddStringToObject(e, "text", r->text ? r->text : "");
        for (int64_t t = 0; t < r->n_tokens; t++)
            cJSON_AddItemToArray(toks, cJSON_CreateNumber(r->tokens[t]));
        cJSON_AddNumberToObject(e, "n_prompt_tokens", (double)r->n_prompt_tokens);
        cJSON_AddStringToObject(e, "stop_reason", stop_name(r->stop_reason));
        cJSON_AddItemToArray(arr, e);
    }
    cJSON_AddStringToObject(o, "text", res[0].text ? res[0].text : "");
    cJSON *t = cJSON_AddObjectToObject(o, "timings");
    cJSON_AddNumberToObject(t, "load_ms", res[0].load_ms);
    cJSON_AddNumberToObject(t, "prefill_ms", res[0].prefill_ms);
    cJSON_AddNumberToObject(t, "decode_ms", res[0].decode_ms);
    cJSON_AddNumberToObject(t, "prefill_tok_s", res[0].prefill_tok_s);
    cJSON_AddNumberToObject(t, "decode_tok_s", res[0].decode_tok_s);
    cJSON_AddNumberToObject(o, "peak_rss_kib", (double)peak_rss_kib());
    cJSON_AddNumberToObject(o, "threads", pool_threads(rt));
    khub_model_info info = {KHUB_APP_INIT(khub_model_info)};
    if (khub_model_info_get(m, &info) == KHUB_STATUS_OK) {
        cJSON_AddNumberToObject(o, "max_context", (double)info.max_context);
        cJSON_AddNumberToObject(o, "context_length", (double)info.context_length);
        cJSON_AddNumberToObject(o, "kv_bytes_per_token", (double)info.kv_bytes_per_token);
        if (info.tp_size > 1) {
            cJSON_AddNumberToObject(o, "tp_size", info.tp_size);
            cJSON_AddNumberToObject(o, "tp_collectives", (double)info.tp_collectives);
            cJSON_AddNumberToObject(o, "tp_comm_ms", (double)info.tp_comm_ns / 1e6);
        }
    }
    if (a->explain) cJSON_AddStringToObject(o, "explain", khub_model_explain(m));
    char *s = cJSON_PrintUnformatted(o);
    if (s) printf("%s\n", s);
    cJSON_free(s);
    cJSON_Delete(o);
}

/* Ranks other than 0 of `--tp N`: rank 0's steps on this rank's shards
 * until rank 0 is done; with --explain its plan and memory on stderr. */
static int follow(const cli_tp_job *job, khub_runtime *rt, khub_model *m, const run_args *a)
{
    const char *plan = strstr(khub_model_explain(m), "tp plan: rank");
    if (a->explain && plan) fputs(plan, stderr);
    return cli_tp_end(job, cli_tp_follow(job, rt, m));
}

static int run(int argc, char **argv)
{
    if (khub_cli_wants_help(&run_cmd, argc, argv)) return 0;
    run_args a;
    int rc = parse(argc, argv, &a);
    if (rc) return rc;
    /* The prompts are read before the model: a mistake in them costs no load. */
    if (stdin_prompts(&a)) return 1;
    cli_prompts prompts = {0};
    if (a.prompts_file && cli_prompts_read(a.prompts_file, &a.ma.gen, &prompts)) return 1;
    cli_tp_job job;
    if ((rc = cli_tp_begin(&job, "run", a.ma.tp, 0)) != 0) {
        cli_prompts_free(&prompts);
        free(a.stdin_prompt);
        return rc;
    }
    a.ma.comm = cli_tp_comm(&job);
    khub_runtime *rt = NULL;
    static khub_model_kernels_report rep;
    /* Sequences of the model: with more than one, and no cache named, the
     * library makes its KV cache the paged pool (docs/batching.md). */
    int32_t max_seqs = a.parallel ? a.parallel : a.prompts_file ? 16 : a.n_prompts;
    int progress = !a.json && isatty(2) && job.comm.rank == 0;
    khub_model *m = cli_model_open("run", &a.ma, max_seqs, progress, &rt, &rep);
    if (!m) {
        cli_prompts_free(&prompts);
        free(a.stdin_prompt);
        return cli_tp_end(&job, 1);
    }
    if (job.comm.rank != 0) {
        cli_prompts_free(&prompts);
        free(a.stdin_prompt);
        return follow(&job, rt, m, &a);
    }
    if (a.explain && !a.json) {
        if (rep.text[0]) printf("kernels:\n%s", rep.text);
        fputs(khub_model_explain(m), stdout);
    }
    if (a.prompts_file) {
        cli_batch_args ba = {.json = a.json,
                             .progress = !a.json && isatty(2),
                             .max_batch_tokens = a.ma.max_batch_tokens,
                             .max_seqs = a.parallel,
                             .threads = pool_threads(rt)};
        rc = cli_run_batch(rt, m, &prompts, &ba);
        cli_prompts_free(&prompts);
        cli_tp_abort_if(&job, rc);
        khub_model_free(m);
        khub_runtime_free(rt);
        return cli_tp_end(&job, rc);
    }
    int stream = !a.json && a.n_prompts == 1;
    if (stream) a.ma.gen.callback = on_text;
    khub_generate_result res[MAX_PROMPTS];
    for (int i = 0; i < MAX_PROMPTS; i++)
        res[i] = (khub_generate_result){KHUB_APP_INIT(khub_generate_result)};
    khub_status st = khub_model_generate(m, a.prompts, (size_t)a.n_prompts, &a.ma.gen, res);
    if (st == KHUB_STATUS_CONTEXT_FULL) {
        if (stream) fputc('\n', stdout);
        khub_model_info info = {KHUB_APP_INIT(khub_model_info)};
        khub_model_info_get(m, &info);
        rc = khub_cli_fail("run", "%s; --max-context N raises it (the model was trained for %lld)",
                           khub_runtime_errmsg(rt), (long long)info.context_length);
    } else if (st != KHUB_STATUS_OK) {
        if (stream) fputc('\n', stdout);
        rc = khub_cli_fail("run", "%s", khub_runtime_errmsg(rt));
    } else if (a.json) {
        print_json(rt, m, &a, res);
    } else {
        for (int i = 0; !stream && i < a.n_prompts; i++)
            printf("--- prompt %d ---\n%s\n", i + 1, res[i].text);
        if (stream) fputc('\n', stdout);
        fflush(stdout); /* the summary on stderr comes after the text, even through a pipe */
        print_summary(res, a.n_prompts);
        if (a.ma.tp > 1) print_tp_share(m, &res[0]);
    }
    khub_generate_results_free(m, res, (size_t)a.n_prompts);
    cli_tp_abort_if(&job, rc);
    khub_model_free(m);
    khub_runtime_free(rt);
    free(a.stdin_prompt);
    return cli_tp_end(&job, rc);
}

static const khub_cli_cmd run_cmd = {
    "run", "load a model and generate text",
    "usage: khub run --model PATH --prompt TEXT [options]\n"
    "       khub run --model PATH --prompts-file FILE [options]\n"
    "\n"
    "Loads a .gguf file or a Hugging Face model folder and generates a continuation of\n"
    "each prompt, streaming the text to stdout as it is produced (one prompt) or\n"
    "printing each result at the end (several prompts, generated as one batch).\n"
    "\n"
    "Options:\n"
    "  --model PATH          .gguf file or folder with config.json and *.safetensors\n"
    "  --prompt TEXT         a prompt; repeat for up to 8 prompts; - reads one from standard\n"
    "                        input (up to 16 MiB, one trailing newline dropped)\n"
    "  --prompts-file FILE   one request per line, run with continuous batching: a plain\n"
    "                        prompt, or a JSON object {\"prompt\": TEXT, \"max_tokens\": N,\n"
    "                        \"temperature\", \"top_k\", \"top_p\", \"repeat_penalty\", \"seed\",\n"
    "                        \"stop\": STR or [STR...], \"chat\", \"system\", \"ignore_eos\"}\n"
    "                        (the options below are the defaults); results print in file\n"
    "                        order, a failed request on stderr with its line (exit 1)\n"
    "  --parallel N          requests running together (default 16 with "
    "--prompts-file)\n" CLI_MODEL_TP_HELP
    "  --chat                apply the model's chat template (the prompt is a user turn)\n"
    "  --system TEXT         system message for --chat\n"
    "  --max-new-tokens N    tokens to generate per answer (default 128)\n" CLI_MODEL_SAMPLING_HELP
    "\n" CLI_MODEL_KERNELS_HELP
    "  --explain             print which plugin serves each role, with the selection trace\n"
    "  --json                print one JSON object: results (text, tokens, n_prompt_tokens,\n"
    "                        stop_reason per prompt), text (the first prompt's), timings\n"
    "                        (load_ms, prefill/decode ms and tok/s; decode_ms and\n"
    "                        decode_tok_s are 0 when one token leaves no decode step),\n"
    "                        peak_rss_kib,\n"
    "                        threads, max_context, context_length, kv_bytes_per_token\n"
    "                        (with --tp also tp_size, tp_collectives, tp_comm_ms); with\n"
    "                        --prompts-file: results with status, line and timings (queue_ms,\n"
    "                        ttft_ms, total_ms, decode_tok_s) per request, and totals\n"
    "  --help                print this help\n",
    run};

KHUB_CLI_COMMAND(run_cmd)
