/*
 * ms_api.c: the public face of the model server (khub/khub_model_server.h)
 * over the daemon (ms_http.c) and the request engine.
 *
 * Start order: what the endpoints read (the explain table, the model's
 * numbers) is copied before the engine thread exists, because from then on
 * only that thread may touch the model. Stop order: the engine is shut
 * down first, finishing every queued and running request, so that the
 * connection threads waiting on them return and libmicrohttpd can join
 * them; the engine is freed last.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app_struct.h"
#include "model_server.h"

struct khub_model_server {
    khub__ms s;
};

static khub_status start_fail(khub_status st, char *errbuf, size_t size, const char *msg)
{
    if (errbuf && size) snprintf(errbuf, size, "%s", msg);
    return st;
}

static char *dup_or_null(const char *s, int *oom)
{
    if (!s || !*s) return NULL;
    char *d = strdup(s);
    if (!d) *oom = 1;
    return d;
}

khub_status khub_model_server_start(const khub_model_server_opts *opts, khub_model_server **out,
                                    char *errbuf, size_t errbuf_size)
{
    char msg[KHUB_ERROR_SIZE] = "";
    if (out) *out = NULL;
    if (!opts || !out)
        return start_fail(KHUB_STATUS_MISUSE, errbuf, errbuf_size,
                          opts ? "khub_model_server_start: out is NULL"
                               : "khub_model_server_start: opts is NULL");
    /* 0.1's size (the message named this header's sizeof before session 18) */
    if (khub__app_struct_check(opts, KHUB__SIZE_TO(khub_model_server_opts, serial),
                               "khub_model_server_start", "opts", msg, sizeof msg))
        return start_fail(KHUB_STATUS_STRUCT_SIZE, errbuf, errbuf_size, msg);
    if (!opts->model)
        return start_fail(KHUB_STATUS_INVALID_ARG, errbuf, errbuf_size,
                          "khub_model_server_start: opts.model is NULL (load a model first)");
    khub_model_server *srv = calloc(1, sizeof *srv);
    if (!srv) return start_fail(KHUB_STATUS_NOMEM, errbuf, errbuf_size, "out of memory");
    khub__ms *s = &srv->s;
    khub_model_info info = {KHUB_APP_INIT(khub_model_info)};
    khub_model_info_get(opts->model, &info);
    int oom = 0;
    s->model = opts->model;
    s->model_id = dup_or_null(opts->model_id ? opts->model_id : "khub-model", &oom);
    s->api_key = dup_or_null(opts->api_key, &oom);
    s->kernels_report = dup_or_null(opts->kernels_report, &oom);
    s->explain = strdup(khub_model_explain(opts->model));
    s->rt = khub_model_runtime(opts->model);
    pthread_mutex_init(&s->reload_mu, NULL);
    pthread_mutex_init(&s->kmu, NULL);
    if (opts->struct_size >= offsetof(khub_model_server_opts, reserved2) + sizeof(uint32_t)) {
        s->hub = opts->hub;
        s->lock_path = dup_or_null(opts->lock_path, &oom);
        s->policy_path = dup_or_null(opts->policy_path, &oom);
        s->allow_unsigned = opts->allow_unsigned;
    }
    s->max_context = info.max_context;
    s->context_length = info.context_length;
    s->max_body = opts->max_body ? opts->max_body : KHUB__MS_MAX_BODY;
    s->created = time(NULL);
    khub_status st = KHUB_STATUS_NOMEM;
    snprintf(msg, sizeof msg, "serve-model: out of memory");
    if (oom || !s->explain || !s->model_id) goto fail;
    uint32_t max_queue = opts->max_queue ? opts->max_queue : 64;
    if (opts->serial)
        s->eng = khub__ms_engine_serial_new(opts->model, max_queue);
    else
        s->eng = khub__ms_engine_batch_new(opts->model, max_queue, opts->max_batch_tokens, msg,
                                           sizeof msg);
    if (!s->eng && opts->max_batch_tokens) st = KHUB_STATUS_INVALID_ARG; /* over the model's */
    if (!s->eng) goto fail;
    st = khub__ms_start(s, opts->host, opts->port, opts, msg, sizeof msg);
    if (st != KHUB_STATUS_OK) goto fail;
    *out = srv;
    if (errbuf && errbuf_size) errbuf[0] = '\0';
    return KHUB_STATUS_OK;
fail:
    khub_model_server_stop(srv);
    return start_fail(st, errbuf, errbuf_size, msg);
}

uint16_t khub_model_server_port(const khub_model_server *srv) { return srv ? srv->s.port : 0; }

/* Failures set khub_last_error() (this call has no errbuf, and the server
 * no message of its own), in the one STRUCT_SIZE form (app_struct.h). */
khub_status khub_model_server_stats_get(const khub_model_server *srv, khub_model_server_stats *out)
{
    if (!srv || !out)
        return khub__fail(NULL, KHUB_STATUS_MISUSE, "khub_model_server_stats_get: %s is NULL",
                          srv ? "out" : "srv");
    KHUB__APP_CHECK(NULL, out, KHUB__SIZE_TO(khub_model_server_stats, kv_capacity),
                    "khub_model_server_stats_get", "out");
    khub__ms *s = (khub__ms *)&srv->s;
    khub__ms_engine_stats es = {0};
    s->eng->vt->stats(s->eng, &es);
    khub_model_server_stats st = {KHUB_APP_INIT(khub_model_server_stats)};
    st.requests = atomic_load(&s->n_requests);
    st.errors = atomic_load(&s->n_errors);
    st.completions = atomic_load(&s->n_completions);
    st.cancelled = atomic_load(&s->n_cancelled);
    st.prompt_tokens = atomic_load(&s->prompt_tokens);
    st.completion_tokens = atomic_load(&s->completion_tokens);
    st.queued = es.queued;
    st.running = es.running;
    st.kv_tokens = es.kv_tokens;
    st.kv_capacity = es.kv_capacity;
    pthread_mutex_lock(&s->kmu);
    st.reloads = s->n_reloads;
    pthread_mutex_unlock(&s->kmu);
    st.reload_failures = atomic_load(&s->n_reload_failures);
    /* up to out's struct_size, its header kept (abi/ABI.md rule 5) */
    khub__app_copy_out(out, &st, sizeof st);
    return KHUB_STATUS_OK;
}

khub_status khub_model_server_reload(khub_model_server *srv, const char *role, const char *kernel,
                                     char *errbuf, size_t errbuf_size)
{
    char msg[KHUB_ERROR_SIZE] = "";
    if (!srv || !role || !kernel)
        return start_fail(KHUB_STATUS_MISUSE, errbuf, errbuf_size,
                          !srv    ? "khub_model_server_reload: srv is NULL"
                          : !role ? "khub_model_server_reload: role is NULL"
                                  : "khub_model_server_reload: kernel is NULL");
    khub_status st = khub__ms_reload(&srv->s, role, kernel, msg, sizeof msg);
    return start_fail(st, errbuf, errbuf_size, st == KHUB_STATUS_OK ? "" : msg);
}

void khub_model_server_stop(khub_model_server *srv)
{
    if (!srv) return;
    khub__ms *s = &srv->s;
    if (s->eng) s->eng->vt->shutdown(s->eng);
    khub__ms_stop(s);
    if (s->eng) s->eng->vt->free(s->eng);
    khub__ms_reload_free(s);
    if (s->rt) { /* initialised together with rt */
        pthread_mutex_destroy(&s->reload_mu);
        pthread_mutex_destroy(&s->kmu);
    }
    if (s->api_key) memset(s->api_key, 0, strlen(s->api_key));
    free(s->api_key);
    free(s->model_id);
    free(s->kernels_report);
    free(s->explain);
    free(srv);
}
