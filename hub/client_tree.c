/*
 * client_tree.c: tree listings of a repo at a revision: one full listing
 * per commit, fetched page by page and kept in trees/<commit>.json as
 * huggingface_hub keeps it, from which every listing of that commit
 * (offline too) is derived.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "hub_impl.h"

#define MAX_TREE_PAGES 1000

/* ======================================================================== */
/* Tree listings                                                            */
/* ======================================================================== */

void khub__tree_free(khub__tree *t)
{
    if (!t) return;
    for (size_t i = 0; i < t->count; i++) khub__mem_free(t->items[i].path);
    khub__mem_free(t->items);
    memset(t, 0, sizeof *t);
}

static int is_hex_n(const char *s, size_t n)
{
    if (strlen(s) != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

khub_status khub__tree_parse(khub_hub *hub, const char *json, size_t n, khub__tree *t)
{
    cJSON *root = cJSON_ParseWithLength(json, n), *e;
    if (!cJSON_IsArray(root)) {
        cJSON_Delete(root);
        return khub__hub_fail(hub, KHUB_STATUS_PARSE, "tree listing is not a JSON array");
    }
    khub_status st = KHUB_STATUS_OK;
    cJSON_ArrayForEach(e, root)
    {
        cJSON *type = cJSON_GetObjectItemCaseSensitive(e, "type");
        cJSON *path = cJSON_GetObjectItemCaseSensitive(e, "path");
        cJSON *size = cJSON_GetObjectItemCaseSensitive(e, "size");
        cJSON *oid = cJSON_GetObjectItemCaseSensitive(e, "oid");
        cJSON *lfs = cJSON_GetObjectItemCaseSensitive(e, "lfs");
        cJSON *lfs_oid = cJSON_GetObjectItemCaseSensitive(lfs, "oid");
        if (!cJSON_IsString(type) || !cJSON_IsString(path)) {
            st = khub__hub_fail(hub, KHUB_STATUS_PARSE, "tree entry without type or path");
            break;
        }
        if (!khub__path_is_safe(path->valuestring)) {
            st = khub__hub_fail(hub, KHUB_STATUS_UNSAFE_PATH,
                                "tree entry \"%.200s\" is not a safe relative path; refusing "
                                "the listing",
                                path->valuestring);
            break;
        }
        khub__tree_entry ent = {0};
        ent.is_dir = strcmp(type->valuestring, "directory") == 0;
        if (!ent.is_dir && strcmp(type->valuestring, "file") != 0) continue;
        if (!ent.is_dir) {
            if (!cJSON_IsNumber(size) || size->valuedouble < 0 || size->valuedouble > 1e15 ||
                !cJSON_IsString(oid) || !is_hex_n(oid->valuestring, 40) ||
                (lfs && (!cJSON_IsString(lfs_oid) || !is_hex_n(lfs_oid->valuestring, 64)))) {
                st = khub__hub_fail(hub, KHUB_STATUS_PARSE,
                                    "tree entry %.200s: bad size, oid or lfs.oid",
                                    path->valuestring);
                break;
            }
            ent.size = (uint64_t)size->valuedouble;
            memcpy(ent.oid, oid->valuestring, 41);
            if (lfs) memcpy(ent.lfs_sha256, lfs_oid->valuestring, 65);
        }
        if (t->count == t->cap) {
            size_t cap = t->cap ? 2 * t->cap : 64;
            khub__tree_entry *v =
                khub__mem_realloc(khub__hub_alloc(hub), t->items, cap * sizeof *v);
            if (!v) {
                st = khub__hub_fail(hub, KHUB_STATUS_NOMEM, "out of memory in a tree listing");
                break;
            }
            t->items = v;
            t->cap = cap;
        }
        ent.path = khub__mem_strdup(khub__hub_alloc(hub), path->valuestring);
        t->items[t->count++] = ent;
    }
    cJSON_Delete(root);
    return st;
}

/* ------------------------------------------------------------------------ */
/* trees/<commit>.json: huggingface_hub's tree cache                        */
/* ------------------------------------------------------------------------ */

/* A commit's listing never changes. The first listing of a commit fetches
 * the full one (root, recursive: what snapshot_download asks for), keeps it
 * in trees/<commit>.json where huggingface_hub keeps it, and answers this
 * and every later listing of that commit from it, online or offline, with
 * no request. The file is input like any other: an unreadable, unknown
 * version or malformed one is ignored and the listing fetched again, as the
 * Python client does. Only full listings are written, because
 * snapshot_download reads the file as the complete list of the repo's
 * files. A revision that is not a commit is listed as asked, uncached. */

#define MAX_TREE_FILE (64u << 20)

static char *read_small_file(const khub_allocator *a, const char *path, size_t max, size_t *n_out)
{
    int fd = khub__open_regular(path, NULL, 0); /* never hangs on a FIFO in the cache */
    struct stat sb;
    if (fd < 0) return NULL;
    char *buf = NULL;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && (uint64_t)sb.st_size <= max &&
        (buf = khub__mem_alloc(a, (size_t)sb.st_size + 1))) {
        size_t n = (size_t)sb.st_size, got = 0;
        while (got < n) {
            ssize_t r = read(fd, buf + got, n - got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            got += (size_t)r;
        }
        buf[got] = '\0';
        *n_out = got;
        if (got != n) {
            khub__mem_free(buf);
            buf = NULL;
        }
    }
    close(fd);
    return buf;
}

/* Appends e, taking its path. */
static int tree_take(const khub_allocator *a, khub__tree *t, const khub__tree_entry *e)
{
    if (t->count == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 64;
        khub__tree_entry *v = khub__mem_realloc(a, t->items, cap * sizeof *v);
        if (!v) return 0;
        t->items = v;
        t->cap = cap;
    }
    t->items[t->count++] = *e;
    return 1;
}

/* Appends e with a copy of path[0, len). */
static int tree_push(const khub_allocator *a, khub__tree *t, const khub__tree_entry *e,
                     const char *path, size_t len)
{
    khub__tree_entry c = *e;
    if (!(c.path = khub__mem_strndup(a, path, len))) return 0;
    if (tree_take(a, t, &c)) return 1;
    khub__mem_free(c.path);
    return 0;
}

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const khub__tree_entry *)a)->path, ((const khub__tree_entry *)b)->path);
}

/* One cached file entry, checked like a tree entry from the network. */
static int tree_cached_entry(const cJSON *v, khub__tree_entry *e)
{
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(v, "size");
    const cJSON *blob = cJSON_GetObjectItemCaseSensitive(v, "blob_id");
    const cJSON *lfs = cJSON_GetObjectItemCaseSensitive(v, "lfs_sha256");
    memset(e, 0, sizeof *e);
    if (!v->string || !khub__path_is_safe(v->string) || !cJSON_IsNumber(size) ||
        size->valuedouble < 0 || size->valuedouble > 1e15 || !cJSON_IsString(blob) ||
        !is_hex_n(blob->valuestring, 40) ||
        (lfs && !cJSON_IsNull(lfs) && (!cJSON_IsString(lfs) || !is_hex_n(lfs->valuestring, 64))))
        return 0;
    e->path = v->string; /* borrowed; tree_push copies it */
    e->size = (uint64_t)size->valuedouble;
    memcpy(e->oid, blob->valuestring, 41);
    if (cJSON_IsString(lfs)) memcpy(e->lfs_sha256, lfs->valuestring, 65);
    return 1;
}

/* The files of trees/<commit>.json into files; false (silently) when there
 * is no usable cache file. */
bool khub__tree_read_cache(const khub_allocator *a, const char *path, khub__tree *files)
{
    size_t n = 0;
    char *text = read_small_file(a, path, MAX_TREE_FILE, &n);
    if (!text) return false;
    cJSON *root = cJSON_ParseWithLength(text, n), *v;
    khub__mem_free(text);
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(root, "format_version");
    const cJSON *fl = cJSON_GetObjectItemCaseSensitive(root, "files");
    bool ok = cJSON_IsNumber(ver) && ver->valuedouble == 1 && cJSON_IsObject(fl);
    const cJSON *walk = ok ? fl : NULL;
    cJSON_ArrayForEach(v, walk)
    {
        khub__tree_entry e;
        if (!(ok = tree_cached_entry(v, &e) && tree_push(a, files, &e, e.path, strlen(e.path))))
            break;
    }
    cJSON_Delete(root);
    if (!ok) khub__tree_free(files);
    return ok;
}

/* Adds one file of a full listing to the listing of sub: the file when it
 * is in it, and the directories between sub and it (recursive) or the
 * first one (not recursive). Repeated directories are dropped later. */
static int tree_add(const khub_allocator *a, khub__tree *t, const khub__tree_entry *f,
                    const char *sub, int recursive)
{
    size_t sl = strlen(sub);
    const char *rel = f->path;
    if (f->is_dir) return 1;
    if (sl) {
        if (strncmp(f->path, sub, sl) != 0 || f->path[sl] != '/') return 1;
        rel = f->path + sl + 1;
    }
    khub__tree_entry dir = {.is_dir = 1};
    for (const char *s = strchr(rel, '/'); s; s = recursive ? strchr(s + 1, '/') : NULL)
        if (!tree_push(a, t, &dir, f->path, (size_t)(s - f->path))) return 0;
    return recursive || !strchr(rel, '/') ? tree_push(a, t, f, f->path, strlen(f->path)) : 1;
}

/* The listing of sub, derived from the full listing in files, appended to
 * out in path order. ENTRY_NOT_FOUND when sub holds no file. */
static khub_status tree_select(khub_hub *hub, const khub_hub_id *id, const char *commit,
                               const khub__tree *files, const char *sub, int recursive,
                               khub__tree *out)
{
    khub__tree t = {0};
    for (size_t i = 0; i < files->count; i++)
        if (!tree_add(khub__hub_alloc(hub), &t, &files->items[i], sub, recursive)) {
            khub__tree_free(&t);
            return khub__hub_fail(hub, KHUB_STATUS_NOMEM, "out of memory in a tree listing");
        }
    if (sub[0] && t.count == 0)
        return khub__hub_fail(hub, KHUB_STATUS_ENTRY_NOT_FOUND,
                              "listing %s/%s@%.12s/%s: no such directory at that commit", id->org,
                              id->name, commit, sub);
    if (t.count) qsort(t.items, t.count, sizeof *t.items, cmp_entry);
    khub_status st = KHUB_STATUS_OK;
    for (size_t i = 0; i < t.count; i++) {
        int dup = i > 0 && !strcmp(t.items[i - 1].path, t.items[i].path);
        if (dup || st != KHUB_STATUS_OK) continue;
        if (!tree_push(khub__hub_alloc(hub), out, &t.items[i], t.items[i].path,
                       strlen(t.items[i].path)))
            st = khub__hub_fail(hub, KHUB_STATUS_NOMEM, "out of memory in a tree listing");
    }
    khub__tree_free(&t);
    return st;
}

/* Best effort, like huggingface_hub: a read-only cache still lists. */
static void tree_write_cache(khub_hub *hub, const khub_hub_id *id, const char *commit,
                             const khub__tree *t)
{
    char repo_dir[KHUB__PATH_MAX], msg[KHUB_ERROR_SIZE];
    int saved = hub->err_set;
    memcpy(msg, hub->errmsg, sizeof msg);
    hub->err_set = 0;
    if (khub__cache_repo_dir(hub, id, repo_dir, sizeof repo_dir) != KHUB_STATUS_OK ||
        khub__cache_write_tree(hub, repo_dir, commit, t) != KHUB_STATUS_OK)
        khub__log(hub->rt, KHUB_LOG_WARN, "not caching the listing of %s/%s@%.12s: %s", id->org,
                  id->name, commit, hub->errmsg);
    hub->err_set = saved;
    memcpy(hub->errmsg, msg, sizeof msg);
}

/* GET .../tree/<rev>[/<sub>], every page, appended to out. */
static khub_status list_online(khub_hub *hub, const khub_hub_id *id, const char *rev,
                               const char *sub, int recursive, khub__tree *out)
{
    char url[4096], qsub[2048] = "", what[512];
    if (sub[0]) KHUB_FORWARD_IF_ERROR(NULL, khub__url_quote(hub, sub, 0, qsub, sizeof qsub));
    if (!KHUB__PATHF(url, "%s/api/%s/%s/%s/tree/%s%s%s?recursive=%s&expand=false", hub->endpoint,
                     khub__repo_api_type(hub, id), id->org, id->name, rev, sub[0] ? "/" : "", qsub,
                     recursive ? "true" : "false"))
        return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "tree URL too long");
    snprintf(what, sizeof what, "listing %s/%s@%.12s/%s", id->org, id->name, rev, sub);
    for (int page = 0; page < MAX_TREE_PAGES; page++) {
        khub__http_resp r = {0};
        khub__http_req req = {.method = "GET", .url = url, .auth = 1, .what = what};
        khub_status st = khub__http_fetch(hub, &req, &r);
        if (st == KHUB_STATUS_OK && (r.status < 200 || r.status >= 300))
            st = khub__http_error(hub, &r, what);
        if (st == KHUB_STATUS_OK) st = khub__tree_parse(hub, r.body ? r.body : "", r.body_len, out);
        /* Origins compared as for redirects (scheme, host, port), not text
         * prefixes: "http://127.0.0.1:8080@evil.example/" starts with the
         * endpoint "http://127.0.0.1:8080" and is evil.example's (issue 10). */
        if (st == KHUB_STATUS_OK && r.link_next[0] &&
            (!strstr(r.link_next, "://") || !khub__url_same_origin(hub->endpoint, r.link_next)))
            st = khub__hub_fail(hub, KHUB_STATUS_HTTP,
                                "%s: the next-page link %.200s leaves %s; refusing it", what,
                                r.link_next, hub->endpoint);
        int more = r.link_next[0] != '\0';
        if (more) snprintf(url, sizeof url, "%s", r.link_next);
        khub__http_resp_free(&r);
        if (st != KHUB_STATUS_OK) return st;
        if (!more) return KHUB_STATUS_OK;
    }
    return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "%s: more than %d pages", what,
                          MAX_TREE_PAGES);
}

static khub_status list_tree_once(khub_hub *hub, const khub_hub_id *id, const char *commit,
                                  const char *sub, int recursive, khub__tree *out)
{
    if (!khub__is_commit_hex(commit)) return list_online(hub, id, commit, sub, recursive, out);
    char repo_dir[KHUB__PATH_MAX], path[KHUB__PATH_MAX];
    KHUB_FORWARD_IF_ERROR(NULL, khub__cache_repo_dir(hub, id, repo_dir, sizeof repo_dir));
    if (!KHUB__PATHF(path, "%s/trees/%s.json", repo_dir, commit))
        return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "tree cache path too long");
    khub__tree files = {0};
    if (!khub__tree_read_cache(khub__hub_alloc(hub), path, &files)) {
        /* Warned here, where the handle (and its log callback) is known,
         * and where the file is then fetched and rewritten. */
        if (access(path, F_OK) == 0)
            khub__log(hub->rt, KHUB_LOG_WARN, "ignoring the unusable tree cache %s", path);
        if (hub->offline)
            return khub__hub_fail(hub, KHUB_STATUS_OFFLINE,
                                  "listing %s/%s@%.12s: no cached listing (%s) and "
                                  "HF_HUB_OFFLINE forbids the network; list it once online",
                                  id->org, id->name, commit, path);
        khub_status st = list_online(hub, id, commit, "", 1, &files);
        if (st != KHUB_STATUS_OK) {
            khub__tree_free(&files); /* the pages before a refused one */
            return st;
        }
        tree_write_cache(hub, id, commit, &files);
    }
    khub_status st = tree_select(hub, id, commit, &files, sub, recursive, out);
    khub__tree_free(&files);
    return st;
}

khub_status khub__list_tree(khub_hub *hub, const khub_hub_id *id, const char *commit,
                            const char *sub, int recursive, khub__tree *out)
{
    size_t had = out->count;
    khub_status st = list_tree_once(hub, id, commit, sub, recursive, out);
    if (khub__repo_fallback_begin(hub, id, st)) {
        while (out->count > had)
            khub__mem_free(out->items[--out->count].path); /* a partial listing */
        st = khub__repo_fallback_end(hub, id, list_tree_once(hub, id, commit, sub, recursive, out));
    }
    return st;
}
