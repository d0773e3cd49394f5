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
#include "prompts_file.h"

#define MAX_PROMPTS 8
#define MAX_STOPS   16

static const khub_cli_cmd run_cmd;

typedef struct run_args {
    const char *model;
    const char *prompts[MAX_PROMPTS];
    int n_prompts;
    const char *stops[MAX_STOPS];
    int n_stops;
    const char *role[KHUB_KERNEL_ROLE__COUNT]; /* --attn NAME ... by KHUB_KERNEL_ROLES */
    const char *system;
    const char *kernels, *lock, *policy;
    int threads, chat, explain, json, strict, ignore_eos, allow_unsigned, quant_embeddings;
    int64_t max_context;                /* 0 = the executor's default */
    int num_blocks, block_size, kv_mib; /* paged cache pool; 0 = defaults */
    int allow_quarantined, verify_kernels;
    khub_generate_opts gen;
    const char *prompts_file;           /* --prompts-file: a batch (run_batch.c) */
    int32_t max_batch_tokens, parallel; /* 0 = defaults */
} run_args;

/* Parses a number into *out within [lo, hi]; 0 on success. */
static int num(const char *flag, const char *s, double lo, double hi, double *out)
{
    char *end = NULL;
    double v = s ? strtod(s, &end) : 0;
    if (!s || !*s || *end || v < lo || v > hi)
        return khub_cli_usage(&run_cmd, "%s needs a number in [%g, %g], got '%s'", flag, lo, hi,
                              s ? s : "");
    *out = v;
    return 0;
}

/* The role whose flag f is (--attn, --quant, ...), or KHUB_KERNEL_ROLE__COUNT. */
static int role_of_flag(const char *f)
{
    int r = 0;
    while (r < KHUB_KERNEL_ROLE__COUNT && strcmp(f, khub_cli_role_flag((khub_kernel_role)r)) != 0)
        r++;
    return r;
}

static int parse(int argc, char **argv, run_args *a)
{
    memset(a, 0, sizeof *a);
    a->gen = (khub_generate_opts){KHUB_APP_INIT(khub_generate_opts), .max_new_tokens = 128};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double d = 0;
        int rc = 0, takes = 1, role = role_of_flag(f);
        if (role < KHUB_KERNEL_ROLE__COUNT)
            a->role[role] = v;
        else if (!strcmp(f, "--model"))
            a->model = v;
        else if (!strcmp(f, "--prompt")) {
            if (a->n_prompts == MAX_PROMPTS)
                return khub_cli_usage(&run_cmd, "at most %d prompts", MAX_PROMPTS);
            if (v) a->prompts[a->n_prompts++] = v;
        } else if (!strcmp(f, "--stop")) {
            if (a->n_stops == MAX_STOPS)
                return khub_cli_usage(&run_cmd, "at most %d stop strings", MAX_STOPS);
            if (v) a->stops[a->n_stops++] = v;
        } else if (!strcmp(f, "--kernels"))
            a->kernels = v;
        else if (!strcmp(f, "--lock"))
            a->lock = v;
        else if (!strcmp(f, "--policy"))
            a->policy = v;
        else if (!strcmp(f, "--system"))
            a->system = v;
        else if (!strcmp(f, "--prompts-file"))
            a->prompts_file = v;
        else if (!strcmp(f, "--max-batch-tokens")) {
            rc = num(f, v, 1, 65536, &d);
            a->max_batch_tokens = (int32_t)d;
        } else if (!strcmp(f, "--parallel")) {
            rc = num(f, v, 1, 256, &d);
            a->parallel = (int32_t)d;
        } else if (!strcmp(f, "--max-new-tokens")) {
            rc = num(f, v, 1, 1 << 20, &d);
            a->gen.max_new_tokens = (int32_t)d;
        } else if (!strcmp(f, "--max-context")) {
            rc = num(f, v, 1, 1 << 22, &d);
            a->max_context = (int64_t)d;
        } else if (!strcmp(f, "--num-blocks") || !strcmp(f, "--block-size") ||
                   !strcmp(f, "--kv-memory")) {
            rc = num(f, v, 1, f[2] == 'b' ? 65536 : 1 << 30, &d);
            *(f[2] == 'n' ? &a->num_blocks : f[2] == 'b' ? &a->block_size : &a->kv_mib) = (int)d;
        } else if (!strcmp(f, "--threads")) {
            rc = num(f, v, 0, 1024, &d);
            a->threads = (int)d;
        } else if (!strcmp(f, "--temperature")) {
            rc = num(f, v, 0, 100, &d);
            a->gen.temperature = (float)d;
        } else if (!strcmp(f, "--top-k")) {
            rc = num(f, v, 0, 1 << 24, &d);
            a->gen.top_k = (int32_t)d;
        } else if (!strcmp(f, "--top-p")) {
            rc = num(f, v, 0, 1, &d);
            a->gen.top_p = (float)d;
        } else if (!strcmp(f, "--repeat-penalty")) {
            rc = num(f, v, 0, 100, &d);
            a->gen.repetition_penalty = (float)d;
        } else if (!strcmp(f, "--seed")) {
            rc = num(f, v, 0, 18446744073709551615.0, &d);
            a->gen.seed = (uint64_t)d;
        } else {
            takes = 0;
            if (!strcmp(f, "--chat"))
                a->chat = 1;
            else if (!strcmp(f, "--explain"))
                a->explain = 1;
            else if (!strcmp(f, "--json"))
                a->json = 1;
            else if (!strcmp(f, "--strict"))
                a->strict = 1;
            else if (!strcmp(f, "--allow-unsigned"))
                a->allow_unsigned = 1;
            else if (!strcmp(f, "--allow-quarantined"))
                a->allow_quarantined = 1;
            else if (!strcmp(f, "--verify-kernels"))
                a->verify_kernels = 1;
            else if (!strcmp(f, "--ignore-eos"))
                a->ignore_eos = 1;
            else if (!strcmp(f, "--quant-embeddings"))
                a->quant_embeddings = 1;
            else
                return khub_cli_usage(&run_cmd, "unknown option '%s'", f);
        }
        if (rc) return rc;
        if (takes && !v) return khub_cli_usage(&run_cmd, "%s needs a value", f);
        i += takes;
    }
    if (!a->model) return khub_cli_usage(&run_cmd, "--model PATH is required");
    if (a->n_prompts && a->prompts_file)
        return khub_cli_usage(&run_cmd, "--prompt and --prompts-file exclude each other");
    if (!a->n_prompts && !a->prompts_file)
        return khub_cli_usage(&run_cmd, "--prompt TEXT or --prompts-file FILE is required");
    if (a->quant_embeddings && !a->role[KHUB_KERNEL_ROLE_QUANT])
        return khub_cli_usage(&run_cmd, "--quant-embeddings needs --quant SCHEME");
    a->gen.stop = a->stops;
    a->gen.n_stop = (uint32_t)a->n_stops;
    a->gen.chat = (uint32_t)a->chat;
    a->gen.system = a->system;
    a->gen.ignore_eos = a->ignore_eos;
    return 0;
}

/* A one-line progress bar on stderr while layers load (terminals only). */
static void on_layer(void *ud, int32_t done, int32_t total)
{
    const char *model = ud, *base = strrchr(model, '/');
    base = base && base[1] ? base + 1 : model;
    int width = 20, fill = total > 0 ? (int)((int64_t)done * width / total) : width;
    fprintf(stderr, "\rloading %.32s [%.*s%*s] %d/%d layers", base, fill, "####################",
            width - fill, "", (int)done, (int)total);
    if (done == total) fputs("\r\033[K", stderr);
    fflush(stderr);
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
    }
    if (a->explain) cJSON_AddStringToObject(o, "explain", khub_model_explain(m));
    char *s = cJSON_PrintUnformatted(o);
    if (s) printf("%s\n", s);
    cJSON_free(s);
    cJSON_Delete(o);
}

static int run(int argc, char **argv)
{
    if (khub_cli_wants_help(&run_cmd, argc, argv)) return 0;
    run_args a;
    int rc = parse(argc, argv, &a);
    if (rc) return rc;
    /* The prompts file is read before the model: a mistake in it costs no load. */
    cli_prompts prompts = {0};
    if (a.prompts_file && cli_prompts_read(a.prompts_file, &a.gen, &prompts)) return 1;
    khub_runtime *rt = khub_cli_runtime("run", a.threads);
    if (!rt) {
        cli_prompts_free(&prompts);
        return 1;
    }
    if (a.allow_quarantined) khub_runtime_set_option(rt, KHUB_OPT_ALLOW_QUARANTINED, 1);
    if (a.verify_kernels) khub_runtime_set_option(rt, KHUB_OPT_VERIFY_KERNELS, 1);
    khub_model_opts mo = {KHUB_APP_INIT(khub_model_opts),
                          .strict = a.strict,
                          .quant_embeddings = a.quant_embeddings,
                          .max_context = a.max_context,
                          .max_batch = a.max_batch_tokens,
                          .max_seqs = a.parallel       ? a.parallel
                                      : a.prompts_file ? 16
                                                       : 0,
                          .kv_num_blocks = a.num_blocks,
                          .kv_block_size = a.block_size,
                          .kv_max_bytes = (uint64_t)a.kv_mib << 20};
    if (!a.json && isatty(2)) {
        mo.progress = on_layer;
        mo.progress_ud = (void *)a.model;
    }
    khub_model_kernels mk = {KHUB_APP_INIT(khub_model_kernels),
#define ROLE_FIELD(NAME, name, flag, field) .flag = a.role[KHUB_KERNEL_ROLE_##NAME],
                             KHUB_KERNEL_ROLES(ROLE_FIELD)
#undef ROLE_FIELD
                                 .mapping_path = a.kernels,
                             .lock_path = a.lock,
                             .policy_path = a.policy,
                             .allow_unsigned = a.allow_unsigned,
                             .strict = a.strict};
    khub_hub *hub = NULL;
    if (khub_hub_new(NULL, &hub) != KHUB_STATUS_OK) {
        rc = khub_cli_fail("run", "%s", khub_last_error());
        cli_prompts_free(&prompts);
        khub_runtime_free(rt);
        return rc;
    }
    khub_model *m = NULL;
    static khub_model_kernels_report rep;
    if (khub_model_load_hub(hub, rt, a.model, &mo, &mk, &m, &rep) != KHUB_STATUS_OK) {
        rc = khub_cli_fail("run", "%s", khub_runtime_errmsg(rt));
        cli_prompts_free(&prompts);
        khub_hub_free(hub);
        khub_runtime_free(rt);
        return rc;
    }
    khub_hub_free(hub);
    if (a.explain && !a.json) {
        if (rep.text[0]) printf("kernels:\n%s", rep.text);
        fputs(khub_model_explain(m), stdout);
    }
    if (a.prompts_file) {
        cli_batch_args ba = {.json = a.json,
                             .progress = !a.json && isatty(2),
                             .max_batch_tokens = a.max_batch_tokens,
                             .max_seqs = a.parallel,
                             .threads = pool_threads(rt)};
        rc = cli_run_batch(rt, m, &prompts, &ba);
        cli_prompts_free(&prompts);
        khub_model_free(m);
        khub_runtime_free(rt);
        return rc;
    }
    int stream = !a.json && a.n_prompts == 1;
    if (stream) a.gen.callback = on_text;
    khub_generate_result res[MAX_PROMPTS];
    for (int i = 0; i < MAX_PROMPTS; i++)
        res[i] = (khub_generate_result){KHUB_APP_INIT(khub_generate_result)};
    khub_status st = khub_model_generate(m, a.prompts, (size_t)a.n_prompts, &a.gen, res);
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
            printf("--- prompt %d ---\n%s\n", i, res[i].text);
        if (stream) fputc('\n', stdout);
        fflush(stdout); /* the summary on stderr comes after the text, even through a pipe */
        fprintf(stderr,
                "khub run: %lld prompt tokens at %.1f tok/s, %lld new tokens at %.1f "
                "tok/s (load %.0f ms, peak RSS %ld MiB)\n",
                (long long)res[0].n_prompt_tokens, res[0].prefill_tok_s, (long long)res[0].n_tokens,
                res[0].decode_tok_s, res[0].load_ms, peak_rss_kib() / 1024);
    }
    khub_generate_results_free(m, res, (size_t)a.n_prompts);
    khub_model_free(m);
    khub_runtime_free(rt);
    return rc;
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
    "  --prompt TEXT         a prompt; repeat for up to 8 prompts\n"
    "  --prompts-file FILE   one request per line, run with continuous batching: a plain\n"
    "                        prompt, or a JSON object {\"prompt\": TEXT, \"max_tokens\": N,\n"
    "                        \"temperature\", \"top_k\", \"top_p\", \"repeat_penalty\", \"seed\",\n"
    "                        \"stop\": STR or [STR...], \"chat\", \"system\", \"ignore_eos\"}\n"
    "                        (the options below are the defaults); results print in file\n"
    "                        order, a failed request on stderr with its line (exit 1)\n"
    "  --parallel N          requests running together (default 16 with --prompts-file)\n"
    "  --max-batch-tokens N  tokens per forward step: prefill chunks and decodes share it\n"
    "                        (default 256)\n"
    "  --max-new-tokens N    tokens to generate per prompt (default 128)\n"
    "  --max-context N       KV capacity per sequence, prompt and new tokens (default: the\n"
    "                        model's trained context, at most 4096); past the trained\n"
    "                        context a warning says the model did not learn it\n"
    "  --threads N           worker threads (default: all cores)\n"
    "  --chat                apply the model's chat template (the prompt is a user turn)\n"
    "  --system TEXT         system message for --chat\n"
    "  --temperature T       0 = greedy (default)\n"
    "  --top-k K             keep the K most likely tokens (0 = all)\n"
    "  --top-p P             nucleus sampling mass (0 or 1 = off)\n"
    "  --repeat-penalty R    CTRL repetition penalty (1 = off)\n"
    "  --seed S              sampling seed (default 0)\n"
    "  --stop STR            stop when STR appears (repeatable; STR is not printed)\n"
    "  --ignore-eos          keep going past end-of-sequence tokens\n"
    "\n"
    "Kernels (each NAME is a Hub ID org/name[@REV|@version=N][:symbol], fetched from\n"
    "HF_ENDPOINT, verified and loaded; or a loaded plugin's id; or a built-in name):\n"
    "  --attn NAME           attention (built-ins: eager, sdpa)\n"
    "  --quant NAME          quantize dense weights at load: int8, nf4, q8_0, q4_0, or a\n"
    "                        kernel (ID, or ID:SCHEME to quantize with it); the embedding\n"
    "                        and the output head stay as they are\n"
    "  --quant-embeddings    with --quant: quantize the output head (lm_head, or the tied\n"
    "                        embedding's copy used as the head) too\n"
    "  --cache NAME          KV cache (built-ins: dynamic, static, paged)\n"
    "  --num-blocks N        paged cache: blocks in the pool (default: what --kv-memory\n"
    "                        holds, else every sequence at --max-context)\n"
    "  --block-size N        paged cache: tokens per block (default 16)\n"
    "  --kv-memory MIB       paged cache: memory budget of the pool in MiB\n"
    "  --norm NAME           RMSNorm      --act NAME   SiLU-and-mul\n"
    "  --rotary NAME         rotary       --linear NAME dense and quantized linear\n"
    "  --kernels FILE        khub.json mapping (default: next to the model, else ./khub.json);\n"
    "                        the flags above override it\n"
    "  --lock FILE           load every role through khub.lock: locked commits, hashes\n"
    "                        re-checked (default: the khub.lock next to the mapping, for the\n"
    "                        roles the mapping names)\n"
    "  --policy FILE         trust policy (default $KHUB_POLICY, ~/.config/khub/policy.json)\n"
    "  --allow-unsigned      accept unsigned kernels of organisations the policy omits\n"
    "  --allow-quarantined   load a kernel build that crashed or called exit() in an earlier\n"
    "                        run (khub cache quarantine lists them; a warning says so)\n"
    "  --verify-kernels      check every norm, activation, rotary, linear and attention call\n"
    "                        against khub/ref-cpu (NMSE per op kind); a kernel that differs\n"
    "                        fails the run naming plugin, op, role and NMSE (slow: a debug aid)\n"
    "  --strict              fail instead of falling back (no variant, plugin cannot serve)\n"
    "  --explain             print which plugin serves each role, with the selection trace\n"
    "  --json                print one JSON object: results (text, tokens, stop reason per\n"
    "                        prompt), timings (load_ms, prefill/decode ms and tok/s),\n"
    "                        peak_rss_kib, threads, max_context, context_length; with\n"
    "                        --prompts-file: results with status, line and timings (queue_ms,\n"
    "                        ttft_ms, total_ms, decode_tok_s) per request, and totals\n"
    "  --help                print this help\n",
    run};

KHUB_CLI_COMMAND(run_cmd)
