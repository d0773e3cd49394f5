/*
 * server_hf.c: the Hub endpoints of `khub serve` that are about accounts
 * and listings rather than one repo's files, which huggingface_hub and the
 * kernels library call around a download (docs/hub-server.md):
 *
 *   GET /api/organizations/{org}/overview   kernels' publisher check
 *   GET /api/whoami-v2                      the token's owner
 *   GET /api/models, /api/kernels           list_models(author=, search=)
 *   GET /api/{t}/{org}/{name}/commits/{rev} list_repo_commits
 *
 * and the read side of auth: a request whose Authorization the server
 * cannot accept gets 401, as the Hub answers an invalid token on any
 * request, while a request with no token stays open.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

#include "server_impl.h"

#define MAX_LISTED  10000 /* repos in one listing, commits in one history */
#define ISO_TIME_SZ 32

static void iso_time(time_t t, char out[ISO_TIME_SZ])
{
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, ISO_TIME_SZ, "%Y-%m-%dT%H:%M:%S.000Z", &tm);
}

/* ======================================================================== */
/* Auth on reads                                                            */
/* ======================================================================== */

/* A request with no Authorization reads; one with a token must carry the
 * server's (khub__srv_write_allowed: constant-time; without --token every
 * token is accepted, as the server cannot tell a bad one). */
int khub__srv_read_auth(khub__server *s, struct MHD_Connection *c, MHD_RESULT *ret)
{
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || khub__srv_write_allowed(s, c)) return 1;
    *ret = khub__srv_send_error(c, 401, NULL, NULL,
                                "Invalid credentials in Authorization header: the token is not "
                                "this server's");
    return 0;
}

/* ======================================================================== */
/* Organisations and the token's owner                                      */
/* ======================================================================== */

/* Whether org is a valid organisation name with a folder in DIR. */
static int org_exists(const khub__server *s, const char *org, char *dir, size_t size)
{
    char text[KHUB_HUB_NAME_MAX + 8];
    khub_hub_id id;
    struct stat sb;
    return snprintf(text, sizeof text, "%s/x", org) < (int)sizeof text &&
           khub_hub_id_parse(text, &id, NULL, 0) == KHUB_STATUS_OK && !strcmp(id.org, org) &&
           snprintf(dir, size, "%s/%s", s->dir, org) < (int)size && stat(dir, &sb) == 0 &&
           S_ISDIR(sb.st_mode);
}

/* The organisation overview: name and counts, then the fields of the
 * optional DIR/<org>/.org.json (a name no repo can have), where the server's
 * operator sets "trustedKernelPublisher" (false unless set, as on the Hub). */
static MHD_RESULT api_org_overview(khub__server *s, struct MHD_Connection *c, const char *org)
{
    char dir[KHUB__PATH_MAX], path[KHUB__PATH_MAX];
    if (!org_exists(s, org, dir, sizeof dir))
        return khub__srv_send_error(c, 404, NULL, NULL, "Organization not found");
    int repos = 0;
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        struct stat sb;
        if (de->d_name[0] != '.' && KHUB__PATHF(path, "%s/%s/refs.json", dir, de->d_name) &&
            stat(path, &sb) == 0)
            repos++;
    }
    if (d) closedir(d);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "name", org);
    cJSON_AddStringToObject(j, "fullname", org);
    cJSON_AddStringToObject(j, "type", "org");
    cJSON_AddStringToObject(j, "avatarUrl", "");
    cJSON_AddFalseToObject(j, "isVerified");
    cJSON_AddNumberToObject(j, "numModels", repos);
    cJSON_AddFalseToObject(j, "trustedKernelPublisher");
    char *text =
        KHUB__PATHF(path, "%s/.org.json", dir) ? khub__srv_read_file(path, NULL, 1 << 20) : NULL;
    cJSON *extra = text ? cJSON_Parse(text) : NULL, *e;
    free(text);
    if (text && !cJSON_IsObject(extra)) {
        cJSON_Delete(extra);
        cJSON_Delete(j);
        return khub__srv_send_error(c, 500, NULL, NULL,
                                    "the organisation's .org.json is not a JSON object");
    }
    cJSON_ArrayForEach(e, extra)
    {
        cJSON_DeleteItemFromObjectCaseSensitive(j, e->string);
        cJSON_AddItemToObject(j, e->string, cJSON_Duplicate(e, 1));
    }
    cJSON_Delete(extra);
    return khub__srv_send_json(c, 200, j, NULL, NULL);
}

/* whoami-v2 needs a token (401 without one, as on the Hub); the owner is
 * the server itself, a member of every organisation folder. */
static MHD_RESULT api_whoami(khub__server *s, struct MHD_Connection *c)
{
    if (!MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"))
        return khub__srv_send_error(c, 401, NULL, NULL,
                                    "Invalid credentials in Authorization header: whoami-v2 "
                                    "needs a token");
    cJSON *j = cJSON_CreateObject(), *orgs = cJSON_CreateArray();
    cJSON_AddStringToObject(j, "type", "user");
    cJSON_AddStringToObject(j, "id", "khub-serve");
    cJSON_AddStringToObject(j, "name", "khub");
    cJSON_AddStringToObject(j, "fullname", "khub serve");
    cJSON_AddFalseToObject(j, "isPro");
    DIR *d = opendir(s->dir);
    struct dirent *de;
    char dir[KHUB__PATH_MAX];
    while (d && (de = readdir(d)))
        if (de->d_name[0] != '.' && org_exists(s, de->d_name, dir, sizeof dir)) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "type", "org");
            cJSON_AddStringToObject(o, "name", de->d_name);
            cJSON_AddStringToObject(o, "roleInOrg", "admin");
            cJSON_AddItemToArray(orgs, o);
        }
    if (d) closedir(d);
    cJSON_AddItemToObject(j, "orgs", orgs);
    cJSON *auth = cJSON_AddObjectToObject(j, "auth"), *tok;
    cJSON_AddStringToObject(auth, "type", "access_token");
    tok = cJSON_AddObjectToObject(auth, "accessToken");
    cJSON_AddStringToObject(tok, "displayName", "khub serve");
    cJSON_AddStringToObject(tok, "role", "write"); /* it may write: checked or open */
    return khub__srv_send_json(c, 200, j, NULL, NULL);
}

/* ======================================================================== */
/* Repo listings                                                            */
/* ======================================================================== */

static int cmp_id(const void *a, const void *b)
{
    const cJSON *x = *(cJSON *const *)a, *y = *(cJSON *const *)b;
    return strcmp(cJSON_GetObjectItemCaseSensitive(x, "id")->valuestring,
                  cJSON_GetObjectItemCaseSensitive(y, "id")->valuestring);
}

static cJSON *repo_entry(const repo *r)
{
    char id[2 * KHUB_HUB_NAME_MAX + 2], when[ISO_TIME_SZ], path[KHUB__PATH_MAX];
    struct stat sb;
    snprintf(id, sizeof id, "%s/%s", r->org, r->name);
    iso_time(KHUB__PATHF(path, "%s/refs.json", r->root) && stat(path, &sb) == 0 ? sb.st_mtime : 0,
             when);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "_id", id);
    cJSON_AddStringToObject(j, "id", id);
    cJSON_AddStringToObject(j, "author", r->org);
    const char *main_head = khub__srv_branch_head(r, "main");
    if (main_head) cJSON_AddStringToObject(j, "sha", main_head);
    cJSON_AddStringToObject(j, "lastModified", when);
    cJSON_AddFalseToObject(j, "private");
    cJSON_AddFalseToObject(j, "gated");
    cJSON_AddNumberToObject(j, "downloads", 0);
    cJSON_AddNumberToObject(j, "likes", 0);
    cJSON_AddItemToObject(j, "tags", cJSON_CreateArray());
    return j;
}

/* The repos of one organisation folder served as type, matching search. */
static void list_org(khub__server *s, const char *org, const char *type, const char *search,
                     cJSON **v, size_t *n)
{
    char dir[KHUB__PATH_MAX];
    if (!org_exists(s, org, dir, sizeof dir)) return;
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d)) && *n < MAX_LISTED) {
        repo r;
        if (de->d_name[0] == '.') continue;
        if (khub__srv_repo_open(s, org, de->d_name, &r) && khub__srv_repo_is_type(&r, type)) {
            char id[2 * KHUB_HUB_NAME_MAX + 2];
            snprintf(id, sizeof id, "%s/%s", r.org, r.name);
            if (!search || !search[0] || strcasestr(id, search)) v[(*n)++] = repo_entry(&r);
        }
        khub__srv_repo_close(&r);
    }
    if (d) closedir(d);
}

/* GET /api/models or /api/kernels: ?author=ORG, ?search=TEXT, ?limit=N;
 * sorted by id, one page (no Link). */
static MHD_RESULT api_list(khub__server *s, struct MHD_Connection *c, const char *type)
{
    const char *author = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "author");
    const char *search = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "search");
    const char *lim = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "limit");
    cJSON **v = calloc(MAX_LISTED, sizeof *v);
    if (!v) return khub__srv_send_error(c, 500, NULL, NULL, "out of memory");
    size_t n = 0;
    if (author && author[0]) {
        list_org(s, author, type, search, v, &n);
    } else {
        DIR *d = opendir(s->dir);
        struct dirent *de;
        while (d && (de = readdir(d)))
            if (de->d_name[0] != '.') list_org(s, de->d_name, type, search, v, &n);
        if (d) closedir(d);
    }
    qsort(v, n, sizeof *v, cmp_id);
    size_t keep = n;
    if (lim && lim[0]) {
        char *end;
        unsigned long long l = strtoull(lim, &end, 10);
        if (!*end && l < keep) keep = (size_t)l;
    }
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) {
        if (i < keep)
            cJSON_AddItemToArray(arr, v[i]);
        else
            cJSON_Delete(v[i]);
    }
    free(v);
    return khub__srv_send_json(c, 200, arr, NULL, NULL);
}

/* ======================================================================== */
/* Commit history                                                           */
/* ======================================================================== */

/* The commit and its ancestors from log/ (newest first). A commit the
 * server did not make (a folder written by hand) ends the history, dated
 * by its folder. */
MHD_RESULT khub__srv_api_commits(struct MHD_Connection *c, const repo *r, const char *commit)
{
    cJSON *arr = cJSON_CreateArray();
    char cur[41];
    snprintf(cur, sizeof cur, "%s", commit);
    for (int i = 0; i < MAX_LISTED && cur[0]; i++) {
        const cJSON *log = khub__srv_commit_log(r, cur);
        cJSON *e = cJSON_CreateObject(), *authors = cJSON_CreateArray(), *a = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "id", cur);
        cJSON_AddStringToObject(a, "user", "khub");
        cJSON_AddItemToArray(authors, a);
        cJSON_AddItemToObject(e, "authors", authors);
        const char *keys[] = {"title", "message", "date"};
        for (int k = 0; k < 3; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(log, keys[k]);
            if (cJSON_IsString(v)) {
                cJSON_AddStringToObject(e, keys[k], v->valuestring);
            } else if (k < 2) {
                cJSON_AddStringToObject(e, keys[k], "");
            } else {
                char dir[KHUB__PATH_MAX], when[ISO_TIME_SZ];
                struct stat sb;
                khub__srv_commit_dir(r, cur, dir, sizeof dir);
                iso_time(stat(dir, &sb) == 0 ? sb.st_mtime : 0, when);
                cJSON_AddStringToObject(e, "date", when);
            }
        }
        cJSON_AddItemToArray(arr, e);
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(log, "parent");
        char dir[KHUB__PATH_MAX];
        struct stat sb;
        cur[0] = '\0';
        if (cJSON_IsString(p) && khub__is_commit_hex(p->valuestring)) {
            khub__srv_commit_dir(r, p->valuestring, dir, sizeof dir);
            if (stat(dir, &sb) == 0) snprintf(cur, sizeof cur, "%s", p->valuestring);
        }
    }
    return khub__srv_send_json(c, 200, arr, NULL, commit);
}

/* ======================================================================== */
/* Routing                                                                  */
/* ======================================================================== */

int khub__srv_route_hub(khub__server *s, struct MHD_Connection *c, char **seg, int n,
                        MHD_RESULT *ret)
{
    if (n < 2 || strcmp(seg[0], "api") != 0) return 0;
    if (n == 4 && !strcmp(seg[1], "organizations") && !strcmp(seg[3], "overview"))
        *ret = api_org_overview(s, c, seg[2]);
    else if (n == 2 && !strcmp(seg[1], "whoami-v2"))
        *ret = api_whoami(s, c);
    else if (n == 2 && (!strcmp(seg[1], "models") || !strcmp(seg[1], "kernels")))
        *ret = api_list(s, c, strcmp(seg[1], "models") ? "kernel" : "model");
    else
        return 0;
    return 1;
}
