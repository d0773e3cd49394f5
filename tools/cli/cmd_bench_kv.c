/*
 * cmd_bench_kv.c: `khub bench-kv-quality`: how far a lossy KV cache moves a
 * model's output from the f32 cache's (issue 13 item 6).
 *
 * For the prompts of a Transformers fixture (tests/fixtures/smollm2_greedy.json:
 * token ids as Transformers made them), the model is loaded once with the
 * dynamic f32 cache and once per --cache, and for each prompt:
 *   - token agreement: the positions of the N greedy tokens (past EOS) where
 *     the cache's tokens equal the f32 cache's, out of N, and the first
 *     position where they differ (N = none). All prompts run as one
 *     continuous batch (khub_generate_batch); with greedy decoding past EOS
 *     the schedule is the same for every cache;
 *   - the last-position logits error: khub_model_logits over the prompt and
 *     the f32 cache's first N - 1 tokens (the context of the N-th greedy
 *     step, in one prefill), max |cache - f32| over the vocabulary divided by
 *     max |f32 logit|, and whether the argmax is the same.
 * Prints a table (or one JSON object per cache with --json). The f32 row
 * compares khub's f32 cache with the fixture's Transformers greedy tokens.
 * --kv-type f16 stores the compared caches' K/V (and a quantized cache's
 * residual window) in f16; the baseline stays f32, so `--cache dynamic
 * --kv-type f16` measures what the f16 cache alone moves.
 * Public API only, like every command.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "khub/khub_batch.h"
#include "khub/khub_kernels.h"
#include "model_flags.h"

#define MAX_PROMPTS 64
#define MAX_CACHES  16

static const khub_cli_cmd bench_kv_cmd;

typedef struct kvq_args {
    const char *model, *fixture;
    const char *caches[MAX_CACHES];
    int n_caches, tokens, threads, json;
    khub_dtype kv_dtype; /* --kv-type of the compared caches; the baseline is f32 */
} kvq_args;

typedef struct kvq_prompt {
    char name[64];
    int32_t *ids; /* [n + tokens]: the prompt, then the f32 cache's tokens */
    int n;
    int32_t *want; /* [tokens] Transformers' greedy tokens from the fixture, or NULL */
    int n_want;
    float *logits; /* [vocab] the f32 cache's last-position logits */
} kvq_prompt;

typedef struct kvq_set {
    kvq_prompt p[MAX_PROMPTS];
    int n, vocab, longest;
} kvq_set;

/* ------------------------------------------------------------------------ */
/* Arguments and the fixture                                                */
/* ------------------------------------------------------------------------ */

static int parse(int argc, char **argv, kvq_args *a)
{
    memset(a, 0, sizeof *a);
    a->tokens = 64;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--json")) {
            a->json = 1;
            continue;
        }
        if (!v) return khub_cli_usage(&bench_kv_cmd, "%s needs a value", f);
        i++;
        if (!strcmp(f, "--model"))
            a->model = v;
        else if (!strcmp(f, "--fixture"))
            a->fixture = v;
        else if (!strcmp(f, "--cache") && a->n_caches < MAX_CACHES)
            a->caches[a->n_caches++] = v;
        else if (!strcmp(f, "--cache"))
            return khub_cli_usage(&bench_kv_cmd, "at most 16 --cache");
        else if (!strcmp(f, "--kv-type")) {
            int rc = cli_kv_type(&bench_kv_cmd, v, &a->kv_dtype);
            if (rc) return rc;
        } else if (!strcmp(f, "--tokens") || !strcmp(f, "--threads")) {
            char *end = NULL;
            long n = strtol(v, &end, 10);
            int hi = f[2] == 't' && f[3] == 'o' ? 4096 : 256;
            if (!end || *end || n < 1 || n > hi)
                return khub_cli_usage(&bench_kv_cmd, "%s must be between 1 and %d (got '%s')", f,
                                      hi, v);
            *(f[3] == 'o' ? &a->tokens : &a->threads) = (int)n;
        } else
            return khub_cli_usage(&bench_kv_cmd, "unknown option '%s'", f);
    }
    if (!a->model) return khub_cli_usage(&bench_kv_cmd, "--model PATH is required");
    if (!a->fixture) return khub_cli_usage(&bench_kv_cmd, "--fixture PATH is required");
    if (!a->n_caches) {
        static const char *const def[] = {"quantized,residual_length=0",
                                          "quantized-int4,residual_length=0", "quantized",
                                          "quantized-int4"};
        for (int i = 0; i < 4; i++) a->caches[a->n_caches++] = def[i];
    }
    return 0;
}

static int32_t *ids_of(const cJSON *arr, int extra, int *n)
{
    *n = cJSON_GetArraySize(arr);
    int32_t *ids = calloc((size_t)(*n + extra + 1), sizeof *ids);
    for (int i = 0; ids && i < *n; i++) ids[i] = cJSON_GetArrayItem(arr, i)->valueint;
    return ids;
}

/* Reads the fixture's cases (name, input_ids, greedy_ids). */
static int read_fixture(const char *path, int tokens, kvq_set *s)
{
    FILE *f = fopen(path, "rb");
    if (!f) return khub_cli_fail("bench-kv-quality", "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    size_t got = buf ? fread(buf, 1, (size_t)len, f) : 0;
    fclose(f);
    cJSON *root = buf && got == (size_t)len ? (buf[len] = '\0', cJSON_Parse(buf)) : NULL;
    free(buf);
    const cJSON *cases = cJSON_GetObjectItem(root, "cases"), *c;
    if (!cJSON_IsArray(cases)) {
        cJSON_Delete(root);
        return khub_cli_fail("bench-kv-quality",
                             "%s: no \"cases\" array (want a fixture such "
                             "as tests/fixtures/smollm2_greedy.json)",
                             path);
    }
    cJSON_ArrayForEach(c, cases)
    {
        const cJSON *in = cJSON_GetObjectItem(c, "input_ids");
        const cJSON *name = cJSON_GetObjectItem(c, "name");
        if (!cJSON_IsArray(in) || cJSON_GetArraySize(in) < 1 || s->n == MAX_PROMPTS) continue;
        kvq_prompt *p = &s->p[s->n++];
        snprintf(p->name, sizeof p->name, "%s", cJSON_IsString(name) ? name->valuestring : "?");
        p->ids = ids_of(in, tokens, &p->n);
        const cJSON *g = cJSON_GetObjectItem(c, "greedy_ids");
        if (cJSON_IsArray(g)) p->want = ids_of(g, 0, &p->n_want);
        if (p->n > s->longest) s->longest = p->n;
    }
    cJSON_Delete(root);
    if (!s->n) return khub_cli_fail("bench-kv-quality", "%s: no case has input_ids", path);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* One cache                                                                */
/* ------------------------------------------------------------------------ */

static khub_model *load(khub_runtime *rt, const kvq_args *a, const kvq_set *s, const char *cache,
                        khub_dtype kv_dtype)
{
    khub_model_opts mo = {KHUB_APP_INIT(khub_model_opts), .max_seqs = s->n,
                          .max_context = s->longest + a->tokens + 8, .kv_dtype = kv_dtype};
    khub_model_kernels mk = {KHUB_APP_INIT(khub_model_kernels), .cache = cache};
    khub_hub *hub = NULL;
    khub_model *m = NULL;
    if (khub_hub_new(NULL, &hub) != KHUB_STATUS_OK) {
        khub_cli_fail("bench-kv-quality", "%s", khub_last_error());
        return NULL;
    }
    if (khub_model_load_hub(hub, rt, a->model, &mo, &mk, &m, NULL) != KHUB_STATUS_OK)
        khub_cli_fail("bench-kv-quality", "--cache %s: %s", cache, khub_runtime_errmsg(rt));
    khub_hub_free(hub);
    return m;
}

/* Greedy tokens of every prompt past EOS: out[i] receives a->tokens ids. */
static int generate(khub_runtime *rt, khub_model *m, const kvq_args *a, const kvq_set *s,
                    int32_t **out)
{
    khub_generate_opts go = {KHUB_APP_INIT(khub_generate_opts), .max_new_tokens = a->tokens,
                             .ignore_eos = 1};
    khub_batch_request req[MAX_PROMPTS];
    khub_batch_result res[MAX_PROMPTS];
    for (int i = 0; i < s->n; i++) {
        req[i] = (khub_batch_request){KHUB_APP_INIT(khub_batch_request), .tokens = s->p[i].ids,
                                      .n_tokens = (size_t)s->p[i].n, .opts = &go};
        res[i] = (khub_batch_result){KHUB_APP_INIT(khub_batch_result)};
    }
    khub_batch_config cfg = {KHUB_APP_INIT(khub_batch_config)};
    int rc = 0;
    if (khub_generate_batch(m, req, (size_t)s->n, &cfg, res) != KHUB_STATUS_OK)
        rc = khub_cli_fail("bench-kv-quality", "generating: %s", khub_runtime_errmsg(rt));
    for (int i = 0; i < s->n && !rc; i++) {
        if (res[i].status != KHUB_STATUS_OK || res[i].n_tokens != a->tokens)
            rc = khub_cli_fail("bench-kv-quality", "%s: %lld of %d tokens (%s)", s->p[i].name,
                               (long long)res[i].n_tokens, a->tokens, res[i].error_full);
        else
            memcpy(out[i], res[i].tokens, (size_t)a->tokens * sizeof(int32_t));
    }
    khub_batch_results_free(m, res, (size_t)s->n);
    return rc;
}

typedef struct kvq_row {
    double agree_mean, agree_min, first_mean, err_max, err_mean;
    int identical, argmax_same;
    uint64_t bytes_per_token;
} kvq_row;

/* Positions equal, and the first that differs (n when none). */
static int agreement(const int32_t *a, const int32_t *b, int n, int *first)
{
    int same = 0;
    *first = n;
    for (int i = 0; i < n; i++) {
        if (a[i] == b[i])
            same++;
        else if (*first == n)
            *first = i;
    }
    return same;
}

static int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Fills row for cache `name` (NULL = the f32 baseline, which also records
 * its tokens and logits in s and compares with the fixture's). */
static int measure(khub_runtime *rt, const kvq_args *a, kvq_set *s, const char *name, kvq_row *row)
{
    khub_model *m = load(rt, a, s, name ? name : "dynamic", name ? a->kv_dtype : KHUB_DTYPE_F32);
    if (!m) return 1;
    khub_model_info info = {KHUB_APP_INIT(khub_model_info)};
    khub_model_info_get(m, &info);
    row->bytes_per_token = info.kv_bytes_per_token;
    s->vocab = info.vocab;
    int32_t *toks[MAX_PROMPTS], *buf = calloc((size_t)s->n * (size_t)a->tokens, sizeof(int32_t));
    float *lg = malloc((size_t)info.vocab * sizeof(float));
    int rc = buf && lg ? 0 : khub_cli_fail("bench-kv-quality", "out of memory");
    for (int i = 0; i < s->n && !rc; i++) toks[i] = buf + (size_t)i * (size_t)a->tokens;
    if (!rc) rc = generate(rt, m, a, s, toks);
    *row = (kvq_row){.agree_min = 1, .bytes_per_token = info.kv_bytes_per_token};
    for (int i = 0; i < s->n && !rc; i++) {
        kvq_prompt *p = &s->p[i];
        int first = 0, same;
        if (!name) {
            memcpy(p->ids + p->n, toks[i], (size_t)a->tokens * sizeof(int32_t));
            int k = p->want && p->n_want < a->tokens ? p->n_want : a->tokens;
            same = p->want ? agreement(toks[i], p->want, k, &first) : k;
            same = same * a->tokens / (k ? k : 1);
        } else {
            same = agreement(toks[i], p->ids + p->n, a->tokens, &first);
        }
        row->agree_mean += (double)same / a->tokens / s->n;
        row->agree_min = fmin(row->agree_min, (double)same / a->tokens);
        row->first_mean += (double)first / s->n;
        row->identical += same == a->tokens;
        size_t n_ctx = (size_t)p->n + (size_t)a->tokens - 1;
        if (khub_model_logits(m, p->ids, n_ctx, lg) != KHUB_STATUS_OK) {
            rc = khub_cli_fail("bench-kv-quality", "logits: %s", khub_runtime_errmsg(rt));
            break;
        }
        if (!name) {
            p->logits = malloc((size_t)info.vocab * sizeof(float));
            if (!p->logits)
                rc = khub_cli_fail("bench-kv-quality", "out of memory");
            else
                memcpy(p->logits, lg, (size_t)info.vocab * sizeof(float));
            row->argmax_same++;
            continue;
        }
        double d = 0, top = 0;
        for (int v = 0; v < info.vocab; v++) {
            d = fmax(d, fabs((double)lg[v] - p->logits[v]));
            top = fmax(top, fabs((double)p->logits[v]));
        }
        row->err_max = fmax(row->err_max, d / top);
        row->err_mean += d / top / s->n;
        row->argmax_same += argmax(lg, info.vocab) == argmax(p->logits, info.vocab);
    }
    free(buf), free(lg);
    khub_model_free(m);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Output                                                                   */
/* ------------------------------------------------------------------------ */

static void print_row(const kvq_args *a, const kvq_set *s, const char *name, const kvq_row *r)
{
    int f16 = name && khub_dtype_id_of(a->kv_dtype) == KHUB_DTYPE_ID_F16;
    if (a->json) {
        printf("{\"cache\":");
        khub_cli_json_str(name ? name : "dynamic");
        printf(",\"kv_type\":\"%s\",\"baseline\":\"%s\",\"kv_bytes_per_token\":%llu,\"prompts\":%d,"
               "\"tokens\":%d,"
               "\"agreement_mean\":%.4f,\"agreement_min\":%.4f,\"first_divergence_mean\":%.1f,"
               "\"prompts_identical\":%d,\"logits_rel_err_max\":%.3e,"
               "\"logits_rel_err_mean\":%.3e,\"argmax_same\":%d}\n",
               f16 ? "f16" : "f32", name ? "khub f32 cache" : "transformers greedy_ids",
               (unsigned long long)r->bytes_per_token, s->n, a->tokens, r->agree_mean, r->agree_min,
               r->first_mean, r->identical, r->err_max, r->err_mean, r->argmax_same);
        return;
    }
    char label[128];
    snprintf(label, sizeof label, "%s%s", name ? name : "dynamic (f32) vs Transformers",
             f16 ? " (f16 K/V)" : "");
    printf("| %-36s | %6llu | %5.1f%% | %5.1f%% | %2d of %-2d | %5.1f | %9.2e | %9.2e | %2d of "
           "%-2d |\n",
           label, (unsigned long long)r->bytes_per_token, 100 * r->agree_mean, 100 * r->agree_min,
           r->identical, s->n, r->first_mean, r->err_max, r->err_mean, r->argmax_same, s->n);
    fflush(stdout);
}

static int bench_kv(int argc, char **argv)
{
    if (khub_cli_wants_help(&bench_kv_cmd, argc, argv)) return 0;
    kvq_args a;
    int rc = parse(argc, argv, &a);
    if (rc) return rc;
    static kvq_set s;
    if (read_fixture(a.fixture, a.tokens, &s)) return 1;
    khub_runtime *rt = khub_cli_runtime("bench-kv-quality", a.threads);
    if (!rt) return 1;
    if (!a.json)
        printf(
            "| cache | bytes/token | agreement mean | min | identical | first diff (mean) | "
            "logits rel err max | mean | argmax same |\n|---|---|---|---|---|---|---|---|---|\n");
    kvq_row row;
    rc = measure(rt, &a, &s, NULL, &row);
    if (!rc) print_row(&a, &s, NULL, &row);
    for (int c = 0; c < a.n_caches && !rc; c++) {
        rc = measure(rt, &a, &s, a.caches[c], &row);
        if (!rc) print_row(&a, &s, a.caches[c], &row);
    }
    for (int i = 0; i < s.n; i++) free(s.p[i].ids), free(s.p[i].want), free(s.p[i].logits);
    khub_runtime_free(rt);
    return rc;
}

static const khub_cli_cmd bench_kv_cmd = {
    "bench-kv-quality", "token agreement and logits error of lossy KV caches against f32",
    "usage: khub bench-kv-quality --model PATH --fixture JSON [options]\n"
    "\n"
    "For each prompt of a Transformers fixture (tests/fixtures/smollm2_greedy.json),\n"
    "generates N greedy tokens past EOS with the f32 (dynamic) cache and with each\n"
    "--cache, and reports per cache: the share of the N positions whose token equals the\n"
    "f32 cache's (mean and worst prompt), the prompts with all N equal, the first\n"
    "differing position (mean; N when none), and the last-position logits error\n"
    "(khub_model_logits over the prompt and the f32 cache's first N - 1 tokens: max\n"
    "|difference| / max |f32 logit|, worst and mean prompt; prompts with the same\n"
    "argmax). The first row compares the f32 cache with the fixture's Transformers\n"
    "tokens. docs/caches.md has a table made with it.\n"
    "\n"
    "Options:\n"
    "  --model PATH      .gguf file or Hugging Face folder\n"
    "  --fixture JSON    a fixture with cases[].input_ids (and greedy_ids)\n"
    "  --cache NAME      a cache as --cache of khub run, options included; repeatable\n"
    "                    (default: quantized,residual_length=0,\n"
    "                    quantized-int4,residual_length=0, quantized, quantized-int4)\n"
    "  --kv-type TYPE    K/V storage of the --cache rows: f32 (default) or f16; the\n"
    "                    baseline stays f32 (--cache dynamic --kv-type f16: what f16\n"
    "                    K/V alone changes)\n"
    "  --tokens N        greedy tokens per prompt (default 64)\n"
    "  --threads N       worker threads (default: all cores)\n"
    "  --json            one JSON object per cache instead of the table\n"
    "  --help            print this help\n",
    bench_kv};

KHUB_CLI_COMMAND(bench_kv_cmd)
