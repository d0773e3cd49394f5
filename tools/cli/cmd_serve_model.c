/*
 * cmd_serve_model.c: `khub serve-model`: load a model (kernels by Hub ID
 * as `khub run` takes them) and serve it over the OpenAI HTTP API
 * (khub_model_server.h) until SIGINT or SIGTERM.
 */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "cli.h"
#include "khub/khub_kernels.h"
#include "khub/khub_model.h"
#include "khub/khub_model_server.h"
#include "model_flags.h"
#include "tp_job.h"

static const khub_cli_cmd serve_model_cmd;

typedef struct sm_args {
    cli_model_args m; /* the model and kernel flags khub run takes (model_flags.h) */
    const char *model_id, *host, *api_key;
    int serial, parallel;
    long port, max_queue, max_connections, timeout;
    double max_body_mib;
} sm_args;

/* serve-model's own flags with a numeric value; 1 when f was one. */
static int numeric_flag(sm_args *a, const char *f, const char *v, int *rc)
{
    const khub_cli_cmd *c = &serve_model_cmd;
    double d = 0;
    if (!strcmp(f, "--port")) {
        *rc = cli_num(c, f, v, 0, 65535, &d), a->port = (long)d;
    } else if (!strcmp(f, "--parallel")) {
        *rc = cli_num(c, f, v, 1, 64, &d), a->parallel = (int)d;
    } else if (!strcmp(f, "--max-queue")) {
        *rc = cli_num(c, f, v, 1, 1 << 16, &d), a->max_queue = (long)d;
    } else if (!strcmp(f, "--max-connections")) {
        *rc = cli_num(c, f, v, 1, 1 << 16, &d), a->max_connections = (long)d;
    } else if (!strcmp(f, "--timeout")) {
        *rc = cli_num(c, f, v, 1, 86400, &d), a->timeout = (long)d;
    } else if (!strcmp(f, "--max-body-mib")) {
        *rc = cli_num(c, f, v, 0.001, 1024, &d), a->max_body_mib = d;
    } else {
        return 0;
    }
    return 1;
}

static int parse(int argc, char **argv, sm_args *a)
{
    memset(a, 0, sizeof *a);
    cli_model_args_init(&a->m);
    a->port = 8080;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (cli_model_sampling_flag(f))
            return khub_cli_usage(&serve_model_cmd,
                                  "%s is set per request (in the request's body), not for the "
                                  "server",
                                  f);
        if (cli_model_flag(&serve_model_cmd, &a->m, argc, argv, &i, &rc)) {
            if (rc) return rc;
            continue;
        }
        if (!strcmp(f, "--serial")) {
            a->serial = 1;
            continue;
        }
        if (numeric_flag(a, f, v, &rc))
            ;
        else if (!strcmp(f, "--model-id"))
            a->model_id = v;
        else if (!strcmp(f, "--host"))
            a->host = v;
        else if (!strcmp(f, "--api-key"))
            a->api_key = v;
        else
            return khub_cli_usage(&serve_model_cmd, "unknown option '%s'", f);
        if (rc) return rc;
        if (!v) return khub_cli_usage(&serve_model_cmd, "%s needs a value", f);
        i++;
    }
    int rc = cli_model_args_finish(&serve_model_cmd, &a->m);
    if (rc) return rc;
    if (!a->api_key) a->api_key = getenv("KHUB_API_KEY");
    return 0;
}

/* The model's file or folder name, the default id. */
static const char *base_name(const char *path)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    static char buf[256];
    snprintf(buf, sizeof buf, "%.*s", (int)n, path);
    const char *b = strrchr(buf, '/');
    return b && b[1] ? b + 1 : buf;
}

static int run(int argc, char **argv)
{
    if (khub_cli_wants_help(&serve_model_cmd, argc, argv)) return 0;
    sm_args a;
    int rc = parse(argc, argv, &a);
    if (rc) return rc;
    /* Blocked before any thread starts, so every thread inherits the mask
     * and sigwait below is the one place they are taken. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    /* Under --tp, MPI starts after the mask, so that its threads inherit it
     * too: a SIGTERM that mpirun passes to every rank ends rank 0's sigwait,
     * and the other ranks, which never take it, leave when rank 0's model
     * is freed (the stop broadcast). The engine thread drives the model. */
    cli_tp_job job;
    if ((rc = cli_tp_begin(&job, "serve-model", a.m.tp, 1)) != 0) return rc;
    a.m.comm = cli_tp_comm(&job);
    static khub_model_kernels_report rep;
    /* The hub handle outlives the load: live kernel swaps fetch with it. */
    khub_hub *hub = NULL;
    if (khub_hub_new(NULL, &hub) != KHUB_STATUS_OK)
        return cli_tp_end(&job, khub_cli_fail("serve-model", "%s", khub_last_error()));
    khub_runtime *rt = NULL;
    khub_model *m = cli_model_open_hub("serve-model", &a.m, a.parallel,
                                       isatty(2) && job.comm.rank == 0, hub, &rt, &rep);
    if (!m) {
        khub_hub_free(hub);
        return cli_tp_end(&job, 1);
    }
    if (job.comm.rank != 0) { /* follows rank 0's steps and its kernel swaps */
        khub_model_kernels policy = {KHUB_APP_INIT(khub_model_kernels), .lock_path = a.m.lock,
                                     .policy_path = a.m.policy,
                                     .allow_unsigned = a.m.allow_unsigned};
        rc = cli_tp_follow_kernels(&job, rt, m, hub, &policy);
        khub_hub_free(hub);
        return cli_tp_end(&job, rc);
    }
    khub_model_server_opts so = {KHUB_APP_INIT(khub_model_server_opts),
                                 .model = m,
                                 .model_id = a.model_id ? a.model_id : base_name(a.m.model),
                                 .host = a.host,
                                 .port = (uint16_t)a.port,
                                 .api_key = a.api_key,
                                 .kernels_report = rep.text[0] ? rep.text : NULL,
                                 .max_queue = (uint32_t)a.max_queue,
                                 .max_connections = (uint32_t)a.max_connections,
                                 .idle_timeout_s = (uint32_t)a.timeout,
                                 .max_body = (uint64_t)(a.max_body_mib * 1048576.0),
                                 .serial = (uint32_t)a.serial,
                                 .hub = hub,
                                 .lock_path = a.m.lock,
                                 .policy_path = a.m.policy,
                                 .allow_unsigned = a.m.allow_unsigned};
    khub_model_server *srv = NULL;
    char err[KHUB_ERROR_SIZE];
    if (khub_model_server_start(&so, &srv, err, sizeof err) != KHUB_STATUS_OK) {
        rc = khub_cli_fail("serve-model", "%s", err);
    } else {
        printf("khub serve-model: serving %s as '%s' at http://%s:%u/v1%s\n", a.m.model,
               so.model_id, a.host ? a.host : "127.0.0.1", khub_model_server_port(srv),
               a.api_key && *a.api_key ? " (API key required)" : "");
        fflush(stdout);
        int sig = 0;
        sigwait(&sigs, &sig);
        khub_model_server_stats st = {KHUB_APP_INIT(khub_model_server_stats)};
        khub_model_server_stats_get(srv, &st);
        khub_model_server_stop(srv);
        fprintf(stderr,
                "khub serve-model: stopped: %llu requests, %llu completions, %llu prompt and "
                "%llu generated tokens\n",
                (unsigned long long)st.requests, (unsigned long long)st.completions,
                (unsigned long long)st.prompt_tokens, (unsigned long long)st.completion_tokens);
    }
    cli_tp_abort_if(&job, rc);
    khub_model_free(m);
    khub_hub_free(hub);
    khub_runtime_free(rt);
    return cli_tp_end(&job, rc);
}

static const khub_cli_cmd serve_model_cmd = {
    "serve-model", "serve a model over the OpenAI HTTP API",
    "usage: khub serve-model --model PATH [options]\n"
    "\n"
    "Loads a model and answers the OpenAI API on it until SIGINT or SIGTERM:\n"
    "POST /v1/chat/completions (stream: true as server-sent events), POST\n"
    "/v1/completions, GET /v1/models, GET /v1/kernels, POST /v1/kernels/reload,\n"
    "GET /health, GET /metrics (docs/model-server.md). Requests share one running\n"
    "batch (continuous batching): each joins it when there is room and leaves it\n"
    "when done. A kernel reload swaps a role's kernel (attention, norm, activation,\n"
    "rotary) live, fetched and verified under --policy and --lock; it needs --api-key.\n"
    "\n"
    "Options:\n"
    "  --model PATH          .gguf file or folder with config.json and *.safetensors\n"
    "  --model-id NAME       the model's name in the API (default: the file name)\n"
    "  --host ADDR           IPv4 address to listen on (default 127.0.0.1; anything\n"
    "                        else exposes the model to the network: set --api-key)\n"
    "  --port N              TCP port (default 8080; 0 = a free one, printed)\n"
    "  --api-key KEY         /v1 requests need \"Authorization: Bearer KEY\"\n"
    "                        (default $KHUB_API_KEY; none = open)\n"
    "  --threads N           worker threads (default: all cores)\n" CLI_MODEL_TP_HELP
    "                        (rank 0 serves HTTP and schedules; SIGTERM to rank 0\n"
    "                        stops every rank)\n"
    "  --max-context N       KV capacity per request, prompt and answer (default: the\n"
    "                        model's trained context, at most 4096)\n"
    "  --parallel N          requests in the running batch at once (default 8)\n"
    "  --max-batch-tokens N  tokens per forward step, prefill chunks and decodes\n"
    "                        together (default 256)\n"
    "  --serial              no batching: one request at a time (the reference engine)\n"
    "  --max-queue N         requests waiting to run; more get 503 (default 64)\n"
    "  --max-connections N   open connections (default 256; 64 per client address)\n"
    "  --timeout S           close a connection silent for S seconds (default 30)\n"
    "  --max-body-mib N      request body limit in MiB (default 1; over: 413)\n"
    "  --help                print this help\n"
    "Sampling (--temperature, --max-new-tokens, --stop, ...) is set per request.\n"
    "\n" CLI_MODEL_KERNELS_HELP,
    run};

KHUB_CLI_COMMAND(serve_model_cmd)
