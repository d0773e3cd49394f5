/*
 * model_flags.c: the flags `khub run`, `khub chat` and `khub serve-model`
 * share (--tp included: tp_job.h runs the job), and loading the model they
 * name (model_flags.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_flags.h"

void cli_model_args_init(cli_model_args *a)
{
    memset(a, 0, sizeof *a);
    a->gen = (khub_generate_opts){KHUB_APP_INIT(khub_generate_opts), .max_new_tokens = 128};
}

int cli_num(const khub_cli_cmd *cmd, const char *flag, const char *s, double lo, double hi,
            double *out)
{
    char *end = NULL;
    double v = s ? strtod(s, &end) : 0;
    /* written so that NaN ("nan", which strtod reads) fails: v < lo and
     * v > hi are both false for it */
    if (!s || !*s || *end || !(v >= lo && v <= hi))
        return khub_cli_usage(cmd, "%s needs a number in [%g, %g], got '%s'", flag, lo, hi,
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

/* The shared flags that take no value; 1 when f was one. */
static int switch_flag(cli_model_args *a, const char *f)
{
    int *to = !strcmp(f, "--strict")              ? &a->strict
              : !strcmp(f, "--allow-unsigned")    ? &a->allow_unsigned
              : !strcmp(f, "--allow-quarantined") ? &a->allow_quarantined
              : !strcmp(f, "--verify-kernels")    ? &a->verify_kernels
              : !strcmp(f, "--ignore-eos")        ? &a->ignore_eos
              : !strcmp(f, "--quant-embeddings")  ? &a->quant_embeddings
                                                  : NULL;
    if (to) *to = 1;
    return to != NULL;
}

/* --device: "cpu", "cuda" or "cuda:N"; 0, or the usage error's status. */
static int device_flag(const khub_cli_cmd *cmd, cli_model_args *a, const char *v)
{
    char *end = NULL;
    if (v && !strcmp(v, "cpu")) {
        a->device = (khub_device){KHUB_DEVICE_CPU, 0};
        return 0;
    }
    if (v && !strncmp(v, "cuda", 4) && (!v[4] || v[4] == ':')) {
        long n = v[4] ? strtol(v + 5, &end, 10) : 0;
        if (!v[4] || (end != v + 5 && !*end && n >= 0 && n < 1024)) {
            a->device = (khub_device){KHUB_DEVICE_CUDA, (int32_t)n};
            return 0;
        }
    }
    return khub_cli_usage(cmd, "--device wants cpu, cuda or cuda:N, got '%s'", v ? v : "");
}

int cli_kv_type(const khub_cli_cmd *cmd, const char *v, khub_dtype *out)
{
    if (v && !strcmp(v, "f32"))
        *out = KHUB_DTYPE_F32;
    else if (v && !strcmp(v, "f16"))
        *out = KHUB_DTYPE_F16;
    else
        return khub_cli_usage(cmd, "--kv-type wants f32 or f16, got '%s'", v ? v : "");
    return 0;
}

/* The shared flags with a string value; 1 when f was one. */
static int string_flag(const khub_cli_cmd *cmd, cli_model_args *a, const char *f, const char *v,
                       int *rc)
{
    int role = role_of_flag(f);
    if (role < KHUB_KERNEL_ROLE__COUNT)
        a->role[role] = v;
    else if (!strcmp(f, "--model"))
        a->model = v;
    else if (!strcmp(f, "--device"))
        *rc = v ? device_flag(cmd, a, v) : 0;
    else if (!strcmp(f, "--kv-type"))
        *rc = v ? cli_kv_type(cmd, v, &a->kv_dtype) : 0;
    else if (!strcmp(f, "--kernels"))
        a->kernels = v;
    else if (!strcmp(f, "--lock"))
        a->lock = v;
    else if (!strcmp(f, "--policy"))
        a->policy = v;
    else if (!strcmp(f, "--system"))
        a->system = v;
    else if (!strcmp(f, "--tp-plan")) {
        if (v && !strcmp(v, "reduce"))
            a->tp_plan = KHUB_TP_PLAN_REDUCE;
        else if (v && !strcmp(v, "gather"))
            a->tp_plan = KHUB_TP_PLAN_GATHER;
        else if (v)
            *rc = khub_cli_usage(cmd, "--tp-plan wants reduce or gather, got '%s'", v);
    } else if (!strcmp(f, "--stop")) {
        if (a->n_stops == CLI_MAX_STOPS)
            *rc = khub_cli_usage(cmd, "at most %d stop strings", CLI_MAX_STOPS);
        else if (v)
            a->stops[a->n_stops++] = v;
    } else
        return 0;
    return 1;
}

/* The shared flags with a number; 1 when f was one. */
static int number_flag(const khub_cli_cmd *cmd, cli_model_args *a, const char *f, const char *v,
                       int *rc)
{
    double d = 0;
    if (!strcmp(f, "--max-batch-tokens")) {
        *rc = cli_num(cmd, f, v, 1, 65536, &d);
        a->max_batch_tokens = (int32_t)d;
    } else if (!strcmp(f, "--max-new-tokens")) {
        *rc = cli_num(cmd, f, v, 1, 1 << 20, &d);
        a->gen.max_new_tokens = (int32_t)d;
    } else if (!strcmp(f, "--max-context")) {
        *rc = cli_num(cmd, f, v, 1, 1 << 22, &d);
        a->max_context = (int64_t)d;
    } else if (!strcmp(f, "--num-blocks") || !strcmp(f, "--block-size") ||
               !strcmp(f, "--kv-memory")) {
        *rc = cli_num(cmd, f, v, 1, f[2] == 'b' ? 65536 : 1 << 30, &d);
        *(f[2] == 'n' ? &a->num_blocks : f[2] == 'b' ? &a->block_size : &a->kv_mib) = (int)d;
    } else if (!strcmp(f, "--threads")) {
        *rc = cli_num(cmd, f, v, 0, 1024, &d);
        a->threads = (int)d;
    } else if (!strcmp(f, "--tp")) {
        *rc = cli_num(cmd, f, v, 1, 4096, &d);
        a->tp = (int)d;
    } else if (!strcmp(f, "--temperature")) {
        *rc = cli_num(cmd, f, v, 0, 100, &d);
        a->gen.temperature = (float)d;
    } else if (!strcmp(f, "--top-k")) {
        *rc = cli_num(cmd, f, v, 0, 1 << 24, &d);
        a->gen.top_k = (int32_t)d;
    } else if (!strcmp(f, "--top-p")) {
        *rc = cli_num(cmd, f, v, 0, 1, &d);
        a->gen.top_p = (float)d;
    } else if (!strcmp(f, "--repeat-penalty")) {
        *rc = cli_num(cmd, f, v, 0, 100, &d);
        a->gen.repetition_penalty = (float)d;
    } else if (!strcmp(f, "--seed")) {
        *rc = cli_num(cmd, f, v, 0, 18446744073709551615.0, &d);
        a->gen.seed = (uint64_t)d;
    } else
        return 0;
    return 1;
}

int cli_model_flag(const khub_cli_cmd *cmd, cli_model_args *a, int argc, char **argv, int *i,
                   int *rc)
{
    const char *f = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    *rc = 0;
    if (switch_flag(a, f)) return 1;
    if (!string_flag(cmd, a, f, v, rc) && !number_flag(cmd, a, f, v, rc)) return 0;
    if (!*rc && !v) *rc = khub_cli_usage(cmd, "%s needs a value", f);
    (*i)++;
    return 1;
}

int cli_model_args_finish(const khub_cli_cmd *cmd, cli_model_args *a)
{
    if (!a->model) return khub_cli_usage(cmd, "--model PATH is required");
    if (a->quant_embeddings && !a->role[KHUB_KERNEL_ROLE_QUANT])
        return khub_cli_usage(cmd, "--quant-embeddings needs --quant SCHEME");
    a->gen.stop = a->stops;
    a->gen.n_stop = (uint32_t)a->n_stops;
    a->gen.system = a->system;
    a->gen.ignore_eos = a->ignore_eos;
    return 0;
}

/* ======================================================================== */
/* Loading                                                                  */
/* ======================================================================== */

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

int cli_model_sampling_flag(const char *f)
{
    static const char *const flags[] = {"--max-new-tokens", "--temperature",    "--top-k",
                                        "--top-p",          "--repeat-penalty", "--seed",
                                        "--stop",           "--system",         "--ignore-eos"};
    for (size_t k = 0; k < sizeof flags / sizeof flags[0]; k++)
        if (!strcmp(f, flags[k])) return 1;
    return 0;
}

khub_model *cli_model_open(const char *cmd, const cli_model_args *a, int32_t max_seqs, int progress,
                           khub_runtime **rt, khub_model_kernels_report *rep)
{
    return cli_model_open_hub(cmd, a, max_seqs, progress, NULL, rt, rep);
}

khub_model *cli_model_open_hub(const char *cmd, const cli_model_args *a, int32_t max_seqs,
                               int progress, khub_hub *hub, khub_runtime **rt,
                               khub_model_kernels_report *rep)
{
    *rt = khub_cli_runtime(cmd, a->threads);
    if (!*rt) return NULL;
    if (a->allow_quarantined) khub_runtime_set_option(*rt, KHUB_OPT_ALLOW_QUARANTINED, 1);
    if (a->verify_kernels) khub_runtime_set_option(*rt, KHUB_OPT_VERIFY_KERNELS, 1);
    khub_model_opts mo = {KHUB_APP_INIT(khub_model_opts),
                          .strict = a->strict,
                          .quant_embeddings = a->quant_embeddings,
                          .max_context = a->max_context,
                          .kv_dtype = a->kv_dtype,
                          .max_batch = a->max_batch_tokens,
                          .max_seqs = max_seqs,
                          .kv_num_blocks = a->num_blocks,
                          .kv_block_size = a->block_size,
                          .kv_max_bytes = (uint64_t)a->kv_mib << 20,
                          .tp_size = a->tp,
                          .tp_plan = a->tp_plan,
                          .comm = a->comm,
                          .device = a->device};
    if (progress) {
        mo.progress = on_layer;
        mo.progress_ud = (void *)a->model;
    }
    khub_model_kernels mk = {KHUB_APP_INIT(khub_model_kernels),
#define ROLE_FIELD(NAME, name, flag, field) .flag = a->role[KHUB_KERNEL_ROLE_##NAME],
                             KHUB_KERNEL_ROLES(ROLE_FIELD)
#undef ROLE_FIELD
                                 .mapping_path = a->kernels,
                             .lock_path = a->lock,
                             .policy_path = a->policy,
                             .allow_unsigned = a->allow_unsigned,
                             .strict = a->strict};
    khub_hub *own = NULL;
    khub_model *m = NULL;
    if (!hub && khub_hub_new(NULL, &own) != KHUB_STATUS_OK)
        khub_cli_fail(cmd, "%s", khub_last_error());
    else if (khub_model_load_hub(hub ? hub : own, *rt, a->model, &mo, &mk, &m, rep) !=
             KHUB_STATUS_OK)
        khub_cli_fail(cmd, "%s", khub_runtime_errmsg(*rt));
    khub_hub_free(own);
    if (!m) {
        khub_runtime_free(*rt);
        *rt = NULL;
    }
    return m;
}
