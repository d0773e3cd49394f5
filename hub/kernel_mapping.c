/*
 * kernel_mapping.c: khub.json (see kernel_mapping.h).
 *
 * The schema follows Hugging Face kernels' mapping (layer name -> device ->
 * repository, capability intervals with inclusive bounds, narrowest interval
 * wins), keyed by the executor's roles instead of Python layer names, and
 * as a file rather than Python dicts. Modes (training, torch.compile) have
 * no meaning for an inference-only C executor and are not part of it.
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "json_strict.h"

#include "kernel_mapping.h"

#define MAX_MAPPING_BYTES ((size_t)1 << 20)

static const char *const role_names[KHUB_ROLE__COUNT] = {
#define ROLE_NAME(NAME, name, flag, field) [KHUB_ROLE_##NAME] = #name,
    KHUB_KERNEL_ROLES(ROLE_NAME)
#undef ROLE_NAME
};

/* ", attention, quantization, ...": the known roles for messages (skip 2). */
#define ROLE_LIST(NAME, name, flag, field) ", " #name
static const char known_roles[] = "" KHUB_KERNEL_ROLES(ROLE_LIST);
#undef ROLE_LIST

khub_role khub__role_from_name(const char *name)
{
    for (int r = 0; r < KHUB_ROLE__COUNT; r++)
        if (name && strcmp(name, role_names[r]) == 0) return (khub_role)r;
    return KHUB_ROLE__COUNT;
}

const char *khub__role_name(khub_role role)
{
    return role < KHUB_ROLE__COUNT ? role_names[role] : "unknown";
}

static khub_status bad(khub_status st, char *errbuf, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static khub_status bad(khub_status st, char *errbuf, size_t n, const char *fmt, ...)
{
    char msg[KHUB_ERROR_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    khub__errbuf(errbuf, n, "khub.json: %s", msg);
    return st;
}

/* ======================================================================== */
/* One rule                                                                 */
/* ======================================================================== */

/* text = ID; ver/rev from the object (may be NULL). */
static khub_status parse_id(const char *where, const char *text, const cJSON *ver, const cJSON *rev,
                            khub_hub_id *id, char *out_text, char *errbuf, size_t n)
{
    char why[KHUB_ERROR_SIZE];
    if (khub_hub_id_parse(text, id, why, sizeof why) != KHUB_STATUS_OK)
        return bad(KHUB_STATUS_BAD_ID, errbuf, n, "%s: %s", where, why);
    if (ver && rev)
        return bad(KHUB_STATUS_PARSE, errbuf, n,
                   "%s: both \"version\" and "
                   "\"revision\" are set; they are mutually exclusive, keep one",
                   where);
    if (ver && (!cJSON_IsNumber(ver) || ver->valuedouble < 0 || ver->valuedouble > 1e6 ||
                ver->valuedouble != (double)(int32_t)ver->valuedouble))
        return bad(KHUB_STATUS_PARSE, errbuf, n, "%s.version must be an integer >= 0", where);
    if (rev && (!cJSON_IsString(rev) || !rev->valuestring[0]))
        return bad(KHUB_STATUS_PARSE, errbuf, n, "%s.revision must be a non-empty string", where);
    if ((ver || rev) && id->rev_kind != KHUB_HUB_REV_DEFAULT)
        return bad(KHUB_STATUS_PARSE, errbuf, n,
                   "%s: the ID \"%s\" already has a revision and "
                   "\"%s\" is set too; keep one",
                   where, text, ver ? "version" : "revision");
    if ((ver || rev) && khub_hub_id_set_revision(id, rev ? rev->valuestring : NULL,
                                                 ver ? (int32_t)ver->valuedouble : -1))
        return bad(KHUB_STATUS_BAD_ID, errbuf, n, "%s.revision \"%.100s\" is malformed", where,
                   rev ? rev->valuestring : "");
    if (khub_hub_id_format(id, out_text, KHUB_MAP_ID_MAX) != KHUB_STATUS_OK)
        return bad(KHUB_STATUS_PARSE, errbuf, n, "%s: ID too long", where);
    return KHUB_STATUS_OK;
}

static khub_status parse_capability(const char *where, const cJSON *cap, khub_map_rule *r,
                                    char *errbuf, size_t n)
{
    r->cc_min = 0;
    r->cc_max = INT32_MAX;
    if (!cap) return KHUB_STATUS_OK;
    if (r->device != KHUB_DEVICE_CUDA)
        return bad(KHUB_STATUS_PARSE, errbuf, n, "%s.capability only applies to cuda", where);
    const cJSON *a = cJSON_GetArrayItem(cap, 0), *b = cJSON_GetArrayItem(cap, 1);
    if (!cJSON_IsArray(cap) || cJSON_GetArraySize(cap) != 2 || !cJSON_IsNumber(a) ||
        !cJSON_IsNumber(b) || a->valuedouble < 0 || b->valuedouble < a->valuedouble ||
        b->valuedouble > 10000)
        return bad(KHUB_STATUS_PARSE, errbuf, n,
                   "%s.capability must be [min, max], compute "
                   "capabilities x10 with min <= max (e.g. [80, 90])",
                   where);
    r->cc_min = (int32_t)a->valuedouble;
    r->cc_max = (int32_t)b->valuedouble;
    return KHUB_STATUS_OK;
}

/* ", NAME" for each row of a KHUB__BUILTIN_* table: the list, after its
 * first two bytes. */
#define LIST_ITEM(name, op) ", " name

const char *khub__builtin_names(khub_role role)
{
    static const char attention[] = KHUB__BUILTIN_ATTENTION(LIST_ITEM);
    static const char quant[] = KHUB__BUILTIN_QUANT(LIST_ITEM);
    static const char cache[] = KHUB__BUILTIN_CACHE(LIST_ITEM);
    switch (role) {
    case KHUB_ROLE_ATTENTION: return attention + 2;
    case KHUB_ROLE_QUANT: return quant + 2;
    case KHUB_ROLE_CACHE: return cache + 2;
    default: return NULL;
    }
}

static bool is_builtin(khub_role role, const char *text)
{
    const char *list = khub__builtin_names(role);
    size_t len = role == KHUB_ROLE_CACHE ? strcspn(text, ",") : strlen(text);
    for (const char *p = list; p && *p; p += strspn(p, ", ")) {
        size_t w = strcspn(p, ",");
        if (w == len && len && !strncmp(p, text, len)) return true;
        p += w;
    }
    return false;
}

/* A rule: "ID", a built-in name, or {"repo", "version" | "revision", "capability"}. */
static khub_status parse_rule(const char *where, khub_role role, const cJSON *j, uint32_t device,
                              khub_map_rule *r, char *errbuf, size_t n)
{
    static const char *const keys[] = {"repo", "version", "revision", "capability", NULL};
    memset(r, 0, sizeof *r);
    r->device = device;
    if (cJSON_IsString(j) && !strchr(j->valuestring, '/')) {
        /* No org: not a Hub ID, so it can only be a built-in name. */
        if (!is_builtin(role, j->valuestring) || strlen(j->valuestring) >= sizeof r->text)
            return bad(KHUB_STATUS_BAD_ID, errbuf, n,
                       "%s: \"%.60s\" is neither a Hub ID (" KHUB__HUB_ID_FORM
                       ") nor a built-in name%s%s%s",
                       where, j->valuestring,
                       khub__builtin_names(role) ? " (" : " (the role has none",
                       khub__builtin_names(role) ? khub__builtin_names(role) : "", ")");
        snprintf(r->text, sizeof r->text, "%s", j->valuestring);
        r->builtin = 1;
        return parse_capability(where, NULL, r, errbuf, n);
    }
    if (cJSON_IsString(j)) {
        KHUB_FORWARD_IF_ERROR(
            NULL, parse_id(where, j->valuestring, NULL, NULL, &r->id, r->text, errbuf, n));
        return parse_capability(where, NULL, r, errbuf, n);
    }
    const char *extra = NULL;
    if (!cJSON_IsObject(j))
        return bad(KHUB_STATUS_PARSE, errbuf, n,
                   "%s must be a Hub ID string or an object "
                   "{\"repo\", \"version\" | \"revision\"}",
                   where);
    if (!khub__json_only_keys(j, keys, &extra))
        return bad(KHUB_STATUS_PARSE, errbuf, n,
                   "%s: unknown field \"%.60s\" (known: repo, "
                   "version, revision, capability)",
                   where, extra);
    const cJSON *repo = cJSON_GetObjectItemCaseSensitive(j, "repo");
    if (!cJSON_IsString(repo))
        return bad(KHUB_STATUS_PARSE, errbuf, n,
                   "%s.repo must be a "
                   "string \"org/name[:symbol]\"",
                   where);
    char w2[200];
    snprintf(w2, sizeof w2, "%s.repo", where);
    khub_status st =
        parse_id(w2, repo->valuestring, cJSON_GetObjectItemCaseSensitive(j, "version"),
                 cJSON_GetObjectItemCaseSensitive(j, "revision"), &r->id, r->text, errbuf, n);
    if (st != KHUB_STATUS_OK) return st;
    return parse_capability(where, cJSON_GetObjectItemCaseSensitive(j, "capability"), r, errbuf, n);
}

/* ======================================================================== */
/* Roles and dependencies                                                   */
/* ======================================================================== */

static khub_status add_rule(khub_mapping *m, khub_role role, const char *where, const cJSON *j,
                            uint32_t device, char *errbuf, size_t n)
{
    if (m->n_rules[role] >= KHUB_MAP_MAX_RULES)
        return bad(KHUB_STATUS_PARSE, errbuf, n, "%s: more than %d rules for one role", where,
                   KHUB_MAP_MAX_RULES);
    KHUB_FORWARD_IF_ERROR(
        NULL, parse_rule(where, role, j, device, &m->rules[role][m->n_rules[role]], errbuf, n));
    m->n_rules[role]++;
    return KHUB_STATUS_OK;
}

static khub_status parse_device(khub_mapping *m, khub_role role, const char *rwhere, const cJSON *d,
                                char *errbuf, size_t n)
{
    uint32_t device;
    char where[200];
    snprintf(where, sizeof where, "%s.%.40s", rwhere, d->string);
    if (!strcmp(d->string, "cpu"))
        device = KHUB_DEVICE_CPU;
    else if (!strcmp(d->string, "cuda"))
        device = KHUB_DEVICE_CUDA;
    else
        return bad(KHUB_STATUS_PARSE, errbuf, n,
                   "%s: unknown device type \"%.40s\" (known: "
                   "cpu, cuda)",
                   where, d->string);
    if (!cJSON_IsArray(d)) return add_rule(m, role, where, d, device, errbuf, n);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, d)
    {
        char w2[220];
        snprintf(w2, sizeof w2, "%s[%d]", where, i++);
        KHUB_FORWARD_IF_ERROR(NULL, add_rule(m, role, w2, e, device, errbuf, n));
    }
    return KHUB_STATUS_OK;
}

static khub_status parse_roles(khub_mapping *m, const cJSON *roles, char *errbuf, size_t n)
{
    if (!roles) return KHUB_STATUS_OK;
    if (!cJSON_IsObject(roles))
        return bad(KHUB_STATUS_PARSE, errbuf, n,
                   "\"roles\" must be an "
                   "object");
    const cJSON *r;
    cJSON_ArrayForEach(r, roles)
    {
        khub_role role = khub__role_from_name(r->string);
        char where[120];
        snprintf(where, sizeof where, "roles.%.60s", r->string);
        if (role == KHUB_ROLE__COUNT)
            return bad(KHUB_STATUS_PARSE, errbuf, n, "%s: unknown role (known: %s)", where,
                       known_roles + 2);
        if (cJSON_IsString(r)) {
            KHUB_FORWARD_IF_ERROR(NULL, add_rule(m, role, where, r, KHUB_DEVICE_CPU, errbuf, n));
            KHUB_FORWARD_IF_ERROR(NULL, add_rule(m, role, where, r, KHUB_DEVICE_CUDA, errbuf, n));
            continue;
        }
        if (!cJSON_IsObject(r))
            return bad(KHUB_STATUS_PARSE, errbuf, n,
                       "%s must be a Hub ID or an object of "
                       "device types",
                       where);
        const cJSON *d;
        cJSON_ArrayForEach(d, r)
            KHUB_FORWARD_IF_ERROR(NULL, parse_device(m, role, where, d, errbuf, n));
    }
    return KHUB_STATUS_OK;
}

static khub_status parse_deps(khub_mapping *m, const cJSON *deps, char *errbuf, size_t n)
{
    if (!deps) return KHUB_STATUS_OK;
    if (!cJSON_IsObject(deps))
        return bad(KHUB_STATUS_PARSE, errbuf, n,
                   "\"dependencies\" must be an object "
                   "{\"org/name\": {\"version\": N} | {\"revision\": R}}");
    const cJSON *d;
    cJSON_ArrayForEach(d, deps)
    {
        static const char *const keys[] = {"version", "revision", NULL};
        char where[200];
        const char *extra = NULL;
        snprintf(where, sizeof where, "dependencies.%.100s", d->string);
        if (m->n_deps >= KHUB_MAP_MAX_DEPS)
            return bad(KHUB_STATUS_PARSE, errbuf, n, "more than %d dependencies",
                       KHUB_MAP_MAX_DEPS);
        if (!cJSON_IsObject(d) || !khub__json_only_keys(d, keys, &extra))
            return bad(KHUB_STATUS_PARSE, errbuf, n,
                       "%s must be {\"version\": N} or "
                       "{\"revision\": R}%s%s",
                       where, extra ? "; unknown field " : "", extra ? extra : "");
        const cJSON *ver = cJSON_GetObjectItemCaseSensitive(d, "version");
        const cJSON *rev = cJSON_GetObjectItemCaseSensitive(d, "revision");
        if (!ver && !rev)
            return bad(KHUB_STATUS_PARSE, errbuf, n,
                       "%s: needs \"version\" or "
                       "\"revision\"",
                       where);
        KHUB_FORWARD_IF_ERROR(NULL, parse_id(where, d->string, ver, rev, &m->deps[m->n_deps],
                                             m->dep_text[m->n_deps], errbuf, n));
        m->n_deps++;
    }
    return KHUB_STATUS_OK;
}

khub_status khub__mapping_parse(const char *json, size_t n, khub_mapping **out, char *errbuf,
                                size_t errbuf_size)
{
    static const char *const keys[] = {"format", "roles", "dependencies", NULL};
    *out = NULL;
    if (n > MAX_MAPPING_BYTES)
        return bad(KHUB_STATUS_PARSE, errbuf, errbuf_size,
                   "over %zu "
                   "bytes",
                   MAX_MAPPING_BYTES);
    cJSON *root = cJSON_ParseWithLength(json, n);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const char *extra = NULL;
    khub_status st = KHUB_STATUS_OK;
    if (!cJSON_IsObject(root))
        st = bad(KHUB_STATUS_PARSE, errbuf, errbuf_size,
                 "not a JSON "
                 "object");
    else if (!cJSON_IsNumber(fmt) || fmt->valuedouble != 1)
        st = bad(KHUB_STATUS_PARSE, errbuf, errbuf_size, "\"format\" must be 1");
    else if (!khub__json_only_keys(root, keys, &extra))
        st = bad(KHUB_STATUS_PARSE, errbuf, errbuf_size,
                 "unknown top-level field \"%.60s\" "
                 "(known: format, roles, dependencies)",
                 extra);
    /* The C library's, not a tagged block (khub__mem_alloc): a mapping is
     * made without a handle, and runtime/kernels/model_kernels.c frees its
     * own with free(). */
    khub_mapping *m = st == KHUB_STATUS_OK ? calloc(1, sizeof *m) : NULL;
    if (st == KHUB_STATUS_OK && !m) st = KHUB_STATUS_NOMEM;
    if (st == KHUB_STATUS_OK)
        st = parse_roles(m, cJSON_GetObjectItemCaseSensitive(root, "roles"), errbuf, errbuf_size);
    if (st == KHUB_STATUS_OK)
        st = parse_deps(m, cJSON_GetObjectItemCaseSensitive(root, "dependencies"), errbuf,
                        errbuf_size);
    cJSON_Delete(root);
    if (st != KHUB_STATUS_OK) {
        free(m);
        return st;
    }
    *out = m;
    return KHUB_STATUS_OK;
}

khub_status khub__mapping_load(const char *path, khub_mapping **out, char *errbuf,
                               size_t errbuf_size)
{
    *out = NULL;
    char *buf = NULL;
    size_t got = 0;
    khub_status rs =
        khub__read_file_mem(NULL, path, MAX_MAPPING_BYTES, &buf, &got, errbuf, errbuf_size);
    if (rs != KHUB_STATUS_OK) return rs == KHUB_STATUS_OVERFLOW ? KHUB_STATUS_PARSE : rs;
    char why[KHUB_ERROR_SIZE];
    khub_status st = khub__mapping_parse(buf, got, out, why, sizeof why);
    khub__mem_free(buf);
    /* "PATH: roles.attn: ...", not "PATH: khub.json: roles.attn: ..." */
    const char *w = strncmp(why, "khub.json: ", 11) == 0 ? why + 11 : why;
    if (st != KHUB_STATUS_OK) khub__errbuf(errbuf, errbuf_size, "%s: %s", path, w);
    return st;
}

/* ======================================================================== */
/* Queries                                                                  */
/* ======================================================================== */

const khub_map_rule *khub__mapping_pick(const khub_mapping *m, khub_role role, uint32_t device,
                                        int32_t cc)
{
    if (!m || role >= KHUB_ROLE__COUNT) return NULL;
    const khub_map_rule *best = NULL;
    for (size_t i = 0; i < m->n_rules[role]; i++) {
        const khub_map_rule *r = &m->rules[role][i];
        if (r->device != device) continue;
        if (device == KHUB_DEVICE_CUDA && (cc < r->cc_min || cc > r->cc_max)) continue;
        if (!best || (int64_t)r->cc_max - r->cc_min < (int64_t)best->cc_max - best->cc_min)
            best = r;
    }
    return best;
}

static bool same_repo(const khub_hub_id *a, const khub_hub_id *b)
{
    return !strcmp(a->org, b->org) && !strcmp(a->name, b->name);
}

static size_t add_unique(const khub_hub_id **seen, const char **ids, size_t count, size_t cap,
                         const khub_hub_id *id, const char *text)
{
    for (size_t i = 0; i < count; i++)
        if (same_repo(seen[i], id)) return count;
    if (count >= cap) return count;
    seen[count] = id;
    ids[count] = text;
    return count + 1;
}

size_t khub__mapping_kernels(const khub_mapping *m, const char **ids, size_t cap)
{
    const khub_hub_id *seen[KHUB_ROLE__COUNT * KHUB_MAP_MAX_RULES + KHUB_MAP_MAX_DEPS];
    size_t total = sizeof seen / sizeof seen[0], count = 0;
    if (cap > total) cap = total;
    for (int r = 0; m && r < KHUB_ROLE__COUNT; r++)
        for (size_t i = 0; i < m->n_rules[r]; i++)
            if (!m->rules[r][i].builtin) /* nothing to fetch or lock */
                count = add_unique(seen, ids, count, cap, &m->rules[r][i].id, m->rules[r][i].text);
    for (size_t i = 0; m && i < m->n_deps; i++)
        count = add_unique(seen, ids, count, cap, &m->deps[i], m->dep_text[i]);
    return count;
}
