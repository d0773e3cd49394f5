/*
 * ms_openai.c: OpenAI's request bodies read into a generation request, and
 * the answers and stream chunks written from one (the fields are listed in
 * docs/model-server.md).
 *
 * Reading follows the OpenAI API's own rules: unknown fields are ignored
 * (clients send fields a server may not know), a known field of the wrong
 * type or out of range is a 400 naming it, and null means "not given".
 * Messages' content is a string or an array of {"type": "text"} parts; any
 * other part (an image) is refused by name rather than dropped.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_server.h"

/* ======================================================================== */
/* Reading                                                                  */
/* ======================================================================== */

static int bad(khub__ms_params *p, const char *param, const char *fmt, const char *detail)
{
    snprintf(p->param, sizeof p->param, "%s", param);
    khub__errbuf(p->why, sizeof p->why, fmt, param, detail ? detail : "");
    return -1;
}

/* The field, or NULL when absent or null. */
static const cJSON *field(const cJSON *j, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* A number field within [lo, hi] into *out (left as is when absent). */
static int num(const cJSON *j, const char *name, double lo, double hi, int whole, double *out,
               khub__ms_params *p)
{
    const cJSON *v = field(j, name);
    if (!v) return 0;
    char range[96];
    snprintf(range, sizeof range, "%s in [%g, %g]", whole ? "an integer" : "a number", lo, hi);
    if (!cJSON_IsNumber(v) || v->valuedouble < lo || v->valuedouble > hi ||
        (whole && v->valuedouble != (double)(int64_t)v->valuedouble))
        return bad(p, name, "'%s' must be %s", range);
    *out = v->valuedouble;
    return 0;
}

static int boolean(const cJSON *j, const char *name, int *out, khub__ms_params *p)
{
    const cJSON *v = field(j, name);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return bad(p, name, "'%s' must be a boolean%s", NULL);
    *out = cJSON_IsTrue(v);
    return 0;
}

static int stops(const cJSON *j, khub__ms_req *r, khub__ms_params *p)
{
    const cJSON *v = field(j, "stop"), *e;
    if (!v) return 0;
    if (cJSON_IsString(v)) {
        if (!*v->valuestring) return bad(p, "stop", "'%s' must not be empty%s", NULL);
        return (r->stop[r->n_stop++] = strdup(v->valuestring)) ? 0 : -1;
    }
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) > KHUB__MS_MAX_STOP)
        return bad(p, "stop", "'%s' must be a string or an array of up to 4 strings%s", NULL);
    cJSON_ArrayForEach(e, v)
    {
        if (!cJSON_IsString(e) || !*e->valuestring)
            return bad(p, "stop", "'%s' must hold non-empty strings%s", NULL);
        if (!(r->stop[r->n_stop++] = strdup(e->valuestring)))
            return bad(p, "stop", "'%s': out of memory%s", NULL);
    }
    return 0;
}

/* The sampling and output fields both endpoints share. */
static int common(const cJSON *j, khub__ms_req *r, khub__ms_params *p)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "model");
    if (v && !cJSON_IsString(v)) return bad(p, "model", "'%s' must be a string%s", NULL);
    double mt = 0, mct = 0, t = 1, tp = 1, seed = 0, n = 1;
    if (num(j, "max_tokens", 1, 1 << 30, 1, &mt, p) ||
        num(j, "max_completion_tokens", 1, 1 << 30, 1, &mct, p) ||
        num(j, "temperature", 0, 2, 0, &t, p) || num(j, "top_p", 0, 1, 0, &tp, p) ||
        num(j, "seed", -9007199254740991.0, 9007199254740991.0, 1, &seed, p) ||
        num(j, "n", 1, 128, 1, &n, p) || boolean(j, "stream", &p->stream, p))
        return -1;
    if (n != 1) return bad(p, "n", "'%s' must be 1: this server returns one choice%s", NULL);
    if (tp == 0) return bad(p, "top_p", "'%s' must be above 0%s", NULL);
    r->max_tokens = (int32_t)(mct ? mct : mt);
    r->temperature = (float)t;
    r->top_p = (float)tp;
    r->seed = (uint64_t)(int64_t)seed;
    const cJSON *so = field(j, "stream_options");
    if (so && !cJSON_IsObject(so))
        return bad(p, "stream_options", "'%s' must be an object%s", NULL);
    if (so && boolean(so, "include_usage", &p->include_usage, p)) return -1;
    return stops(j, r, p);
}

/* A message's content: a string, or text parts joined. NULL after bad(). */
static char *content_text(const cJSON *c, khub__ms_params *p)
{
    if (cJSON_IsString(c)) return strdup(c->valuestring);
    if (!cJSON_IsArray(c)) {
        bad(p, "messages", "'%s': a content must be a string or an array of text parts%s", NULL);
        return NULL;
    }
    size_t n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, c)
    {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(e, "type");
        const cJSON *tx = cJSON_GetObjectItemCaseSensitive(e, "text");
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "text") != 0 || !cJSON_IsString(tx)) {
            bad(p, "messages",
                "'%s': only {\"type\": \"text\", \"text\": ...} parts are "
                "supported%s",
                NULL);
            return NULL;
        }
        n += strlen(tx->valuestring);
    }
    char *s = malloc(n + 1);
    if (!s) return NULL;
    /* One copy per part at its end: strcat rescanned the joined text for
     * every part, O(parts x length) for a body of many tiny parts. */
    size_t at = 0;
    cJSON_ArrayForEach(e, c)
    {
        const char *t = cJSON_GetObjectItemCaseSensitive(e, "text")->valuestring;
        size_t l = strlen(t);
        memcpy(s + at, t, l);
        at += l;
    }
    s[at] = '\0';
    return s;
}

static int messages(const cJSON *j, khub__ms_req *r, khub__ms_params *p)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "messages"), *e;
    if (!cJSON_IsArray(m))
        return bad(p, "messages", "'%s' is required: an array of messages%s", NULL);
    int n = cJSON_GetArraySize(m);
    if (n == 0) return bad(p, "messages", "'%s' must hold at least one message%s", NULL);
    if (n > KHUB__MS_MAX_MESSAGES)
        return bad(p, "messages", "'%s' holds more than 1024 messages%s", NULL);
    r->roles = calloc((size_t)n, sizeof *r->roles);
    r->contents = calloc((size_t)n, sizeof *r->contents);
    if (!r->roles || !r->contents) return bad(p, "messages", "'%s': out of memory%s", NULL);
    cJSON_ArrayForEach(e, m)
    {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(e, "role");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!cJSON_IsObject(e) || !cJSON_IsString(role) || !*role->valuestring)
            return bad(p, "messages", "'%s': every message needs a non-empty string 'role'%s",
                       NULL);
        const char *rn = role->valuestring;
        if (strcmp(rn, "system") && strcmp(rn, "user") && strcmp(rn, "assistant") &&
            strcmp(rn, "developer"))
            return bad(p, "messages",
                       "'%s': role '%.40s' is not one of system, developer, user, assistant", rn);
        if (!c) return bad(p, "messages", "'%s': every message needs a 'content'%s", NULL);
        char *text = content_text(c, p);
        if (!text) return -1;
        /* "developer" is the newer name of the system role */
        r->roles[r->n_msgs] = strdup(strcmp(rn, "developer") ? rn : "system");
        r->contents[r->n_msgs++] = text;
        if (!r->roles[r->n_msgs - 1]) return bad(p, "messages", "'%s': out of memory%s", NULL);
    }
    r->chat = 1;
    return 0;
}

static int prompt(const cJSON *j, khub__ms_req *r, khub__ms_params *p)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "prompt");
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1 && cJSON_IsString(v->child)) v = v->child;
    if (!cJSON_IsString(v))
        return bad(p, "prompt",
                   "'%s' is required: a string (or an array of one string; token arrays and "
                   "several prompts are not supported)%s",
                   NULL);
    if (!*v->valuestring) return bad(p, "prompt", "'%s' must not be empty%s", NULL);
    return (r->prompt = strdup(v->valuestring)) ? 0
                                                : bad(p, "prompt", "'%s': out of memory%s", NULL);
}

int khub__ms_parse(const cJSON *j, khub__ms_req *r, khub__ms_params *p)
{
    if (!cJSON_IsObject(j)) return bad(p, "", "the request body must be a JSON object%s%s", NULL);
    p->param[0] = '\0';
    if (common(j, r, p)) return -1;
    return p->chat ? messages(j, r, p) : prompt(j, r, p);
}

/* ======================================================================== */
/* Writing                                                                  */
/* ======================================================================== */

const char *khub__ms_finish_reason(uint32_t stop_reason)
{
    switch (stop_reason) {
    case KHUB_STOP_EOS:
    case KHUB_STOP_STRING:
    case KHUB_STOP_CALLBACK: return "stop";
    case KHUB_STOP_MAX_TOKENS:
    case KHUB_STOP_CONTEXT: return "length";
    default: return NULL;
    }
}

cJSON *khub__ms_usage(int64_t prompt_tokens, int64_t completion)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)completion);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt_tokens + completion));
    return u;
}

static cJSON *head(const khub__ms *s, const khub__ms_params *p, const char *id, time_t created,
                   int chunk)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object",
                            !p->chat ? "text_completion"
                            : chunk  ? "chat.completion.chunk"
                                     : "chat.completion");
    cJSON_AddNumberToObject(o, "created", (double)created);
    cJSON_AddStringToObject(o, "model", s->model_id);
    cJSON_AddStringToObject(o, "system_fingerprint", "khub-" KHUB_VERSION_STRING);
    return o;
}

/* One choice: the text as "message", "delta" or "text", and its finish. */
static cJSON *choice(const khub__ms_params *p, int chunk, const char *text, size_t len,
                     const char *finish)
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", 0);
    char *t = malloc(len + 1);
    if (t) {
        memcpy(t, text ? text : "", len);
        t[len] = '\0';
    }
    if (p->chat) {
        cJSON *m = cJSON_AddObjectToObject(c, chunk ? "delta" : "message");
        /* a stream opens with the role, then content deltas, then {} */
        if (!chunk || (!text && !finish)) cJSON_AddStringToObject(m, "role", "assistant");
        if (!chunk || text || !finish) cJSON_AddStringToObject(m, "content", t ? t : "");
    } else {
        cJSON_AddStringToObject(c, "text", t ? t : "");
    }
    free(t);
    cJSON_AddNullToObject(c, "logprobs");
    if (finish)
        cJSON_AddStringToObject(c, "finish_reason", finish);
    else
        cJSON_AddNullToObject(c, "finish_reason");
    return c;
}

cJSON *khub__ms_answer(const khub__ms *s, const khub__ms_params *p, const khub__ms_req *r,
                       const char *id, time_t created)
{
    cJSON *o = head(s, p, id, created, 0);
    cJSON *ch = cJSON_AddArrayToObject(o, "choices");
    const char *fin = khub__ms_finish_reason(r->stop_reason);
    cJSON_AddItemToArray(ch, choice(p, 0, r->text, r->len, fin ? fin : "stop"));
    cJSON_AddItemToObject(o, "usage", khub__ms_usage(r->n_prompt, r->n_completion));
    return o;
}

cJSON *khub__ms_chunk(const khub__ms *s, const khub__ms_params *p, const char *id, time_t created,
                      const char *text, size_t len, const char *finish)
{
    cJSON *o = head(s, p, id, created, 1);
    cJSON *ch = cJSON_AddArrayToObject(o, "choices");
    cJSON_AddItemToArray(ch, choice(p, 1, text, len, finish));
    if (p->include_usage) cJSON_AddNullToObject(o, "usage");
    return o;
}
