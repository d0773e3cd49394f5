/*
 * hub.c: the khub_hub handle: configuration from options and the
 * environment (endpoint, token, cache, offline mode), error messages,
 * counters.
 */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "app_struct.h"
#include "hub_impl.h"

/* ======================================================================== */
/* Errors                                                                   */
/* ======================================================================== */

khub_status khub__hub_fail(khub_hub *hub, khub_status st, const char *fmt, ...)
{
    char msg[KHUB_ERROR_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    for (char *p = msg; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    if (hub && hub->err_set) return st;
    if (hub) {
        memcpy(hub->errmsg, msg, sizeof msg);
        hub->err_set = 1;
    }
    khub__fail(NULL, st, "%s", msg);
    return st;
}

void khub__hub_clear(khub_hub *hub)
{
    hub->err_set = 0;
    hub->errmsg[0] = '\0';
}

const char *khub_hub_errmsg(const khub_hub *hub) { return hub ? hub->errmsg : khub_last_error(); }
const char *khub_hub_cache_dir(const khub_hub *hub) { return hub ? hub->cache_dir : NULL; }
int khub_hub_is_offline(const khub_hub *hub) { return hub ? hub->offline : 0; }
uint64_t khub_hub_request_count(const khub_hub *hub) { return hub ? hub->n_requests : 0; }

void khub_hub_set_progress(khub_hub *hub, khub_hub_progress_fn fn, void *ud)
{
    if (!hub) return;
    hub->progress = fn;
    hub->progress_ud = ud;
}

void khub_hub_set_runtime(khub_hub *hub, const khub_runtime *rt)
{
    if (hub) hub->rt = rt;
}

const khub_allocator *khub__hub_alloc(const khub_hub *hub)
{
    if (!hub) return NULL;
    return hub->rt ? khub__runtime_allocator(hub->rt) : &hub->alloc;
}

/* ======================================================================== */
/* Repo type: kernel first, model as the fallback                           */
/* ======================================================================== */

/* Kernel repos are the Hub's repo type "kernel"; kernels published before
 * it existed are model repos (hub-protocol.md). With repo_type KERNEL a
 * repo is tried as a kernel repo first and as a model repo when the Hub
 * does not know it as a kernel; the answer is kept for the handle. */

static void repo_key(const khub_hub_id *id, char *buf, size_t n)
{
    snprintf(buf, n, "%s/%s", id->org, id->name);
}

/* Whether key is repo_key's "org/name" of id (compared in place: this runs
 * on every cache path of a warm load). */
static bool is_repo_key(const char *key, const khub_hub_id *id)
{
    size_t n = strlen(id->org);
    return !strncmp(key, id->org, n) && key[n] == '/' && !strcmp(key + n + 1, id->name);
}

static int legacy_index(const khub_hub *hub, const khub_hub_id *id)
{
    for (int i = 0; i < 8; i++)
        if (hub->legacy[i][0] && is_repo_key(hub->legacy[i], id)) return i;
    return -1;
}

static bool cache_has_folder(const khub_hub *hub, const char *type, const khub_hub_id *id)
{
    char path[KHUB__PATH_MAX];
    struct stat sb;
    return hub->cache_dir &&
           KHUB__CONCAT(path, hub->cache_dir, "/", type, "--", id->org, "--", id->name) &&
           stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

bool khub__repo_is_model(const khub_hub *hub, const khub_hub_id *id)
{
    if (hub->repo_type == KHUB_HUB_REPO_MODEL) return true;
    if (!id) return false;
    if (legacy_index(hub, id) >= 0) return true;
    return !cache_has_folder(hub, "kernels", id) && cache_has_folder(hub, "models", id);
}

const char *khub__repo_api_type(const khub_hub *hub, const khub_hub_id *id)
{
    return khub__repo_is_model(hub, id) ? "models" : "kernels";
}

const char *khub__repo_url_prefix(const khub_hub *hub, const khub_hub_id *id)
{
    return khub__repo_is_model(hub, id) ? "" : "kernels/";
}

bool khub__repo_fallback_begin(khub_hub *hub, const khub_hub_id *id, khub_status st)
{
    if (st != KHUB_STATUS_REPO_NOT_FOUND || hub->repo_type != KHUB_HUB_REPO_KERNEL ||
        hub->offline || khub__repo_is_model(hub, id))
        return false;
    snprintf(hub->fallback_msg, sizeof hub->fallback_msg, "%s", hub->errmsg);
    repo_key(id, hub->legacy[hub->n_legacy++ % 8], sizeof hub->legacy[0]);
    khub__hub_clear(hub);
    khub__log(hub->rt, KHUB_LOG_INFO, "%s/%s is not a kernel repo on %s; trying it as a model repo",
              id->org, id->name, hub->endpoint);
    return true;
}

khub_status khub__repo_fallback_end(khub_hub *hub, const khub_hub_id *id, khub_status st)
{
    if (st != KHUB_STATUS_REPO_NOT_FOUND) return st;
    int i = legacy_index(hub, id);
    if (i >= 0) hub->legacy[i][0] = '\0';
    khub__hub_clear(hub);
    return khub__hub_fail(hub, st, "%s; not a model repo either (/api/models/%s/%s)",
                          hub->fallback_msg, id->org, id->name);
}

/* ======================================================================== */
/* Configuration                                                            */
/* ======================================================================== */

bool khub__env_truthy(const char *name)
{
    const char *v = getenv(name);
    if (!v) return false;
    return !strcasecmp(v, "1") || !strcasecmp(v, "on") || !strcasecmp(v, "yes") ||
           !strcasecmp(v, "true");
}

/* An integer number of seconds from the environment (huggingface_hub's
 * HF_HUB_DOWNLOAD_TIMEOUT): *out = def when unset; a value that is not a
 * whole number in 1..max is an error that names it. */
static khub_status env_seconds(const char *name, int def, int max, int *out)
{
    const char *v = getenv(name);
    *out = def;
    if (!v || !v[0]) return KHUB_STATUS_OK;
    char *end = NULL;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || end == v || *end || n < 1 || n > max)
        return khub__fail(NULL, KHUB_STATUS_INVALID_ARG,
                          "%s=\"%.40s\" is not a whole number of seconds in 1..%d", name, v, max);
    *out = (int)n;
    return KHUB_STATUS_OK;
}

/* A byte count from the environment, with an optional K, M, G or T
 * (powers of 1024): *out = def when unset; a value that is not a whole
 * number in 1..max bytes is an error that names it. */
static khub_status env_bytes(const char *name, uint64_t def, uint64_t max, uint64_t *out)
{
    const char *v = getenv(name);
    *out = def;
    if (!v || !v[0]) return KHUB_STATUS_OK;
    char *end = NULL;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    int shift = 0;
    if (end != v && *end && !end[1]) {
        const char *units = "KMGT", *u = strchr(units, toupper((unsigned char)*end));
        if (u) shift = 10 * (int)(u - units + 1), end++;
    }
    if (errno || end == v || *end || v[0] == '-' || n < 1 || n > (max >> shift))
        return khub__fail(NULL, KHUB_STATUS_INVALID_ARG,
                          "%s=\"%.40s\" is not a byte count in 1..%llu (K, M, G, T allowed)", name,
                          v, (unsigned long long)max);
    *out = (uint64_t)n << shift;
    return KHUB_STATUS_OK;
}

static const char *env_nonempty(const char *name)
{
    const char *v = getenv(name);
    return v && v[0] ? v : NULL;
}

/* Reads a token file: surrounding whitespace stripped; empty means none. */
static char *read_token_file(const khub_allocator *a, const char *path)
{
    FILE *f = khub__fopen_regular(path, NULL, 0); /* a FIFO is no token */
    if (!f) return NULL;
    char buf[1024];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *s = buf;
    while (*s && isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
    char *t = s[0] ? khub__mem_strdup(a, s) : NULL;
    memset(buf, 0, sizeof buf);
    return t;
}

/* HF_TOKEN, HUGGING_FACE_HUB_TOKEN, then $HF_TOKEN_PATH, $HF_HOME/token,
 * ~/.cache/huggingface/token (XDG_CACHE_HOME honoured); the paths expanded
 * as huggingface_hub expands them (hf_env.c). */
static char *find_token(const khub_allocator *a)
{
    const char *t = env_nonempty("HF_TOKEN");
    if (!t) t = env_nonempty("HUGGING_FACE_HUB_TOKEN");
    if (t) return khub__mem_strdup(a, t);
    char path[KHUB__PATH_MAX], dir[KHUB__PATH_MAX];
    int got;
    if ((got = khub__env_path("HF_TOKEN_PATH", path, sizeof path)) != 0)
        return got > 0 ? read_token_file(a, path) : NULL;
    if ((got = khub__env_path("HF_HOME", dir, sizeof dir)) != 0) {
        if (got < 0 || !KHUB__PATHF(path, "%s/token", dir)) return NULL;
    } else if ((got = khub__env_path("XDG_CACHE_HOME", dir, sizeof dir)) != 0) {
        if (got < 0 || !KHUB__PATHF(path, "%s/huggingface/token", dir)) return NULL;
    } else if (env_nonempty("HOME")) {
        snprintf(path, sizeof path, "%s/.cache/huggingface/token", getenv("HOME"));
    } else {
        return NULL;
    }
    return read_token_file(a, path);
}

static char *endpoint_from(const khub_allocator *a, const char *given)
{
    const char *e = given ? given : env_nonempty("HF_ENDPOINT");
    if (!e) e = "https://huggingface.co";
    char *s = khub__mem_strdup(a, e);
    if (!s) return NULL;
    size_t n = strlen(s);
    while (n > 0 && s[n - 1] == '/') s[--n] = '\0';
    return s;
}

static int clamp_default(int32_t v, int def, int max)
{
    if (v <= 0) return def;
    return v > max ? max : (int)v;
}

khub_status khub_hub_new(const khub_hub_opts *opts, khub_hub **out)
{
    if (!out) return khub__fail(NULL, KHUB_STATUS_MISUSE, "khub_hub_new: out is NULL");
    *out = NULL;
    khub_hub_opts o = {KHUB_STRUCT_INIT(khub_hub_opts), .offline = -1};
    if (opts) {
        /* Only what the caller's struct has: an older one is shorter (the
         * fields after it are zero: their defaults). */
        char msg[KHUB_ERROR_SIZE];
        khub_status st = khub__app_read(&o, sizeof o, opts, KHUB__HUB_OPTS_0_1, "khub_hub_new",
                                        "opts", msg, sizeof msg);
        if (st != KHUB_STATUS_OK) return khub__fail(NULL, st, "%s", msg);
    }
    if (o.repo_type > KHUB_HUB_REPO_MODEL)
        return khub__fail(NULL, KHUB_STATUS_INVALID_ARG, "khub_hub_new: unknown repo_type %u",
                          o.repo_type);
    int env_timeout = 10;
    if (o.timeout_s <= 0)
        KHUB_FORWARD_IF_ERROR(NULL, env_seconds("HF_HUB_DOWNLOAD_TIMEOUT", 10, 3600, &env_timeout));
    uint64_t min_rate, max_download;
    KHUB_FORWARD_IF_ERROR(
        NULL, env_bytes("KHUB_DOWNLOAD_MIN_RATE", KHUB__MIN_RATE_DEFAULT, 1ull << 30, &min_rate));
    KHUB_FORWARD_IF_ERROR(NULL, env_bytes("KHUB_MAX_DOWNLOAD_SIZE", KHUB__MAX_DOWNLOAD_DEFAULT,
                                          1ull << 50, &max_download));
    const khub_allocator *a = &o.allocator;
    khub_hub *hub = khub__mem_calloc(a, 1, sizeof *hub);
    if (!hub) return khub__fail(NULL, KHUB_STATUS_NOMEM, "khub_hub_new: out of memory");
    hub->alloc = o.allocator;
    hub->min_rate = min_rate;
    hub->max_download = max_download;
    hub->repo_type = o.repo_type;
    hub->offline = o.offline < 0 ? khub__env_offline() : o.offline != 0;
    hub->max_tries = clamp_default(o.max_tries, 5, 20);
    hub->backoff_ms = clamp_default(o.backoff_ms, 1000, 60000);
    hub->timeout_s = clamp_default(o.timeout_s, env_timeout, 3600);
    hub->max_retry_after_s = clamp_default(o.max_retry_after_s, 60, 3600);
    hub->endpoint = endpoint_from(a, o.endpoint);
    /* HF_HUB_DISABLE_IMPLICIT_TOKEN: a token only when the caller gives one.
     * An offline handle sends no request for its whole life (hub->offline
     * never changes; http.c refuses first), so it looks for no token: the
     * token file's open is ~2 us of a warm locked load (docs/performance.md,
     * "Warm load, session 14"). */
    if (o.token)
        hub->token = o.token[0] ? khub__mem_strdup(a, o.token) : NULL;
    else if (!hub->offline && !khub__env_truthy("HF_HUB_DISABLE_IMPLICIT_TOKEN"))
        hub->token = find_token(a);
    const char *origin = env_nonempty("HF_HUB_USER_AGENT_ORIGIN");
    snprintf(hub->user_agent, sizeof hub->user_agent, "khub/%s%s%.100s", KHUB_VERSION_STRING,
             origin ? "; origin/" : "", origin ? origin : "");
    khub_status st = KHUB_STATUS_OK;
    if (o.cache_dir)
        hub->cache_dir = khub__mem_strdup(a, o.cache_dir);
    else
        st = khub__cache_default_dir(hub, &hub->cache_dir);
    if (st == KHUB_STATUS_OK && (!hub->endpoint || !hub->cache_dir))
        st = khub__fail(NULL, KHUB_STATUS_NOMEM, "khub_hub_new: out of memory");
    if (st != KHUB_STATUS_OK) {
        khub_hub_free(hub);
        return st;
    }
    *out = hub;
    return KHUB_STATUS_OK;
}

void khub_hub_free(khub_hub *hub)
{
    if (!hub) return;
    khub__http_close(hub);
    khub__mem_free(hub->endpoint);
    khub__mem_free(hub->cache_dir);
    khub__mem_wipe_free(hub->token);
    khub__mem_free(hub);
}
