/*
 * lockfile.c: khub.lock (see lockfile.h and docs/lockfile.md).
 *
 * The lock is the root of trust for content on a locked load: the cached
 * files are hashed and compared with the lock before metadata.json is
 * parsed, so a cache entry rewritten consistently (a new .so and a new
 * metadata.json listing it) is still refused. Parsing is strict: unknown
 * fields in a lock written by khub are errors, because a lock that says more
 * than this reader understands must not be half-honoured.
 */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "json_strict.h"
#include <openssl/evp.h>

#include "kernel_meta.h"
#include "lockfile.h"
#include "parse_memo.h"

#define MAX_LOCK_BYTES ((size_t)8 << 20)

static khub_status bad(char *errbuf, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static khub_status bad(char *errbuf, size_t n, const char *fmt, ...)
{
    char msg[KHUB_ERROR_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    khub__errbuf(errbuf, n, "%s", msg);
    return KHUB_STATUS_PARSE;
}

static bool plain_name(const char *s)
{
    size_t len = strnlen(s, 128);
    return len > 0 && len < 128 && !strchr(s, '/') && !strchr(s, '\\') && strcmp(s, ".") &&
           strcmp(s, "..");
}

/* ======================================================================== */
/* Objects                                                                  */
/* ======================================================================== */

khub_status khub__lock_new(khub_lock **out)
{
    *out = khub__mem_calloc(NULL, 1, sizeof **out); /* no handle: the C library's */
    return *out ? KHUB_STATUS_OK : KHUB_STATUS_NOMEM;
}

void khub__lock_entry_clear(khub_lock_entry *e)
{
    if (!e) return;
    for (size_t i = 0; i < e->n_variants; i++) khub__mem_free(e->variants[i].files);
    khub__mem_free(e->variants);
    e->variants = NULL;
    e->n_variants = 0;
}

void khub__lock_free(khub_lock *lock)
{
    if (!lock) return;
    for (size_t i = 0; i < lock->count; i++) khub__lock_entry_clear(&lock->items[i]);
    khub__mem_free(lock->items);
    khub__mem_free(lock);
}

khub_lock_entry *khub__lock_find(const khub_lock *lock, const char *repo)
{
    for (size_t i = 0; lock && repo && i < lock->count; i++)
        if (strcmp(lock->items[i].repo, repo) == 0) return &lock->items[i];
    return NULL;
}

const khub_lock_variant *khub__lock_variant(const khub_lock_entry *e, const char *name)
{
    for (size_t i = 0; e && name && i < e->n_variants; i++)
        if (strcmp(e->variants[i].name, name) == 0) return &e->variants[i];
    return NULL;
}

khub_status khub__lock_put(khub_lock *lock, khub_lock_entry *e)
{
    khub_lock_entry *old = khub__lock_find(lock, e->repo);
    if (old) {
        khub__lock_entry_clear(old);
        *old = *e;
    } else {
        if (lock->count >= KHUB_LOCK_MAX_ENTRIES) return KHUB_STATUS_OVERFLOW;
        /* a lock is made without a handle: the C library's allocator */
        khub_lock_entry *items =
            khub__mem_realloc(NULL, lock->items, (lock->count + 1) * sizeof *items);
        if (!items) return KHUB_STATUS_NOMEM;
        lock->items = items;
        lock->items[lock->count++] = *e;
    }
    memset(e, 0, sizeof *e);
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* Content hash                                                             */
/* ======================================================================== */

static int cmp_file(const void *a, const void *b)
{
    return strcmp(((const khub_lock_file *)a)->name, ((const khub_lock_file *)b)->name);
}

khub_status khub__lock_content_hash(const khub_lock_file *files, size_t n,
                                    char out[KHUB_LOCK_HASH_LEN + 1])
{
    out[0] = '\0';
    if (n > KHUB_LOCK_MAX_FILES) return KHUB_STATUS_OVERFLOW;
    khub_lock_file sorted[KHUB_LOCK_MAX_FILES];
    if (n) memcpy(sorted, files, n * sizeof *files);
    qsort(sorted, n, sizeof *sorted, cmp_file);
    for (size_t i = 1; i < n; i++)
        if (strcmp(sorted[i - 1].name, sorted[i].name) == 0) return KHUB_STATUS_INVALID_ARG;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    khub_status st =
        ctx && EVP_DigestInit_ex(ctx, khub__sha256_md(), NULL) ? KHUB_STATUS_OK : KHUB_STATUS_NOMEM;
    for (size_t i = 0; st == KHUB_STATUS_OK && i < n; i++) {
        if (!EVP_DigestUpdate(ctx, sorted[i].name, strlen(sorted[i].name) + 1) || /* + NUL */
            !EVP_DigestUpdate(ctx, sorted[i].sha256, 64) || !EVP_DigestUpdate(ctx, "\n", 1))
            st = KHUB_STATUS_INTERNAL;
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned md_len = 0;
    if (st == KHUB_STATUS_OK && !EVP_DigestFinal_ex(ctx, md, &md_len)) st = KHUB_STATUS_INTERNAL;
    EVP_MD_CTX_free(ctx);
    if (st != KHUB_STATUS_OK) return st;
    memcpy(out, "sha256:", 7);
    for (unsigned i = 0; i < 32; i++) snprintf(out + 7 + 2 * i, 3, "%02x", md[i]);
    return KHUB_STATUS_OK;
}

khub_status khub__lock_variant_from_dir(const khub_allocator *a, const char *name, const char *dir,
                                        khub_lock_variant *v, char *errbuf, size_t errbuf_size)
{
    memset(v, 0, sizeof *v);
    if (!plain_name(name))
        return bad(errbuf, errbuf_size, "variant name \"%.100s\" is not plain", name);
    snprintf(v->name, sizeof v->name, "%s", name);
    v->files = khub__mem_calloc(a, KHUB_LOCK_MAX_FILES, sizeof *v->files);
    if (!v->files) return KHUB_STATUS_NOMEM;
    DIR *d = opendir(dir);
    if (!d) {
        khub__errbuf(errbuf, errbuf_size, "cannot read variant directory %s: %s", dir,
                     strerror(errno));
        return KHUB_STATUS_NOT_FOUND;
    }
    khub_status st = KHUB_STATUS_OK;
    struct dirent *de;
    while (st == KHUB_STATUS_OK && (de = readdir(d))) {
        const char *nm = de->d_name;
        if (!strcmp(nm, ".") || !strcmp(nm, "..") || !strcmp(nm, "metadata.json.sig")) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, nm);
        /* The cache links snapshot files to blobs: follow one level, but the
         * target must be a regular file. */
        struct stat sb;
        if (!plain_name(nm) || stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            khub__errbuf(errbuf, errbuf_size,
                         "%s: %s is not a regular file; a variant holds "
                         "plain files only",
                         dir, nm);
            st = KHUB_STATUS_UNSAFE_PATH;
        } else if (v->n_files >= KHUB_LOCK_MAX_FILES) {
            khub__errbuf(errbuf, errbuf_size, "%s: more than %d files", dir, KHUB_LOCK_MAX_FILES);
            st = KHUB_STATUS_OVERFLOW;
        } else {
            khub_lock_file *f = &v->files[v->n_files];
            snprintf(f->name, sizeof f->name, "%s", nm);
            st = khub__sha256_file_hex(path, f->sha256);
            if (st != KHUB_STATUS_OK)
                khub__errbuf(errbuf, errbuf_size, "cannot read %s", path);
            else
                v->n_files++;
        }
    }
    closedir(d);
    if (st == KHUB_STATUS_OK) st = khub__lock_content_hash(v->files, v->n_files, v->hash);
    if (st != KHUB_STATUS_OK) {
        khub__mem_free(v->files);
        memset(v, 0, sizeof *v);
    }
    return st;
}

/* ======================================================================== */
/* Parsing                                                                  */
/* ======================================================================== */

static khub_status parse_variant(const cJSON *jv, const char *where, khub_lock_variant *v,
                                 char *errbuf, size_t n)
{
    static const char *const keys[] = {"hash", "files", NULL};
    const char *extra = NULL;
    if (!plain_name(jv->string)) return bad(errbuf, n, "%s: variant name is not plain", where);
    snprintf(v->name, sizeof v->name, "%s", jv->string);
    if (!cJSON_IsObject(jv) || !khub__json_only_keys(jv, keys, &extra))
        return bad(errbuf, n, "%s.variants.%s: must be an object of \"hash\" and \"files\"%s%s",
                   where, v->name, extra ? "; unknown field " : "", extra ? extra : "");
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(jv, "hash");
    const cJSON *fs = cJSON_GetObjectItemCaseSensitive(jv, "files"), *f;
    if (!cJSON_IsString(h) || strlen(h->valuestring) != KHUB_LOCK_HASH_LEN ||
        strncmp(h->valuestring, "sha256:", 7) || !khub__is_sha256_hex(h->valuestring + 7))
        return bad(errbuf, n, "%s.variants.%s.hash must be \"sha256:<64 hex>\"", where, v->name);
    if (!cJSON_IsObject(fs) || cJSON_GetArraySize(fs) < 1 ||
        cJSON_GetArraySize(fs) > KHUB_LOCK_MAX_FILES)
        return bad(errbuf, n, "%s.variants.%s.files must be an object of 1-%d files", where,
                   v->name, KHUB_LOCK_MAX_FILES);
    v->files = khub__mem_calloc(NULL, (size_t)cJSON_GetArraySize(fs), sizeof *v->files);
    if (!v->files) return KHUB_STATUS_NOMEM;
    cJSON_ArrayForEach(f, fs)
    {
        if (!plain_name(f->string) || !cJSON_IsString(f) || !khub__is_sha256_hex(f->valuestring))
            return bad(errbuf, n,
                       "%s.variants.%s.files.%.100s: need a plain name and 64 hex "
                       "digits",
                       where, v->name, f->string);
        khub_lock_file *lf = &v->files[v->n_files++];
        snprintf(lf->name, sizeof lf->name, "%s", f->string);
        memcpy(lf->sha256, f->valuestring, 65);
    }
    char want[KHUB_LOCK_HASH_LEN + 1];
    khub_status st = khub__lock_content_hash(v->files, v->n_files, want);
    if (st != KHUB_STATUS_OK)
        return bad(errbuf, n, "%s.variants.%s.files: duplicate names", where, v->name);
    snprintf(v->hash, sizeof v->hash, "%s", h->valuestring);
    if (strcmp(want, v->hash))
        return bad(errbuf, n,
                   "%s.variants.%s.hash is %s but its files hash to %s; the lock was "
                   "edited by hand",
                   where, v->name, v->hash, want);
    return KHUB_STATUS_OK;
}

static khub_status parse_pin(const cJSON *je, const char *where, khub_lock_entry *e, char *errbuf,
                             size_t n)
{
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(je, "version");
    const cJSON *rev = cJSON_GetObjectItemCaseSensitive(je, "revision");
    if (ver && rev) return bad(errbuf, n, "%s: both \"version\" and \"revision\"; keep one", where);
    e->version = -1;
    if (ver) {
        if (!cJSON_IsNumber(ver) || ver->valuedouble < 0 || ver->valuedouble > 1e6 ||
            ver->valuedouble != (double)(int32_t)ver->valuedouble)
            return bad(errbuf, n, "%s.version must be an integer >= 0", where);
        e->version = (int32_t)ver->valuedouble;
    } else if (rev) {
        if (!cJSON_IsString(rev) || !rev->valuestring[0] ||
            strlen(rev->valuestring) > KHUB_HUB_REV_MAX)
            return bad(errbuf, n, "%s.revision must be a non-empty string", where);
        snprintf(e->revision, sizeof e->revision, "%s", rev->valuestring);
    } else {
        return bad(errbuf, n, "%s: needs \"version\" or \"revision\"", where);
    }
    return KHUB_STATUS_OK;
}

static khub_status parse_entry(const cJSON *je, int idx, khub_lock_entry *e, char *errbuf, size_t n)
{
    static const char *const keys[] = {"repo",           "version",  "revision", "commit",
                                       "kernel_version", "variants", NULL};
    char where[64];
    snprintf(where, sizeof where, "kernels[%d]", idx);
    const char *extra = NULL;
    if (!cJSON_IsObject(je)) return bad(errbuf, n, "%s must be an object", where);
    if (!khub__json_only_keys(je, keys, &extra))
        return bad(errbuf, n, "%s: unknown field \"%.60s\"", where, extra);
    const cJSON *repo = cJSON_GetObjectItemCaseSensitive(je, "repo");
    const cJSON *commit = cJSON_GetObjectItemCaseSensitive(je, "commit");
    const cJSON *vars = cJSON_GetObjectItemCaseSensitive(je, "variants"), *jv;
    khub_hub_id id;
    char idtext[300];
    if (!cJSON_IsString(repo) || strlen(repo->valuestring) >= sizeof e->repo ||
        strchr(repo->valuestring, '@') || strchr(repo->valuestring, ':') ||
        khub_hub_id_parse(repo->valuestring, &id, idtext, sizeof idtext) != KHUB_STATUS_OK)
        return bad(errbuf, n, "%s.repo must be \"org/name\"", where);
    snprintf(e->repo, sizeof e->repo, "%s", repo->valuestring);
    KHUB_FORWARD_IF_ERROR(NULL, parse_pin(je, where, e, errbuf, n));
    if (!cJSON_IsString(commit) || strlen(commit->valuestring) != 40 ||
        strspn(commit->valuestring, "0123456789abcdef") != 40)
        return bad(errbuf, n, "%s.commit must be 40 lowercase hex digits", where);
    memcpy(e->commit, commit->valuestring, 41);
    const cJSON *kv = cJSON_GetObjectItemCaseSensitive(je, "kernel_version");
    if (kv && (!cJSON_IsString(kv) || !kv->valuestring[0] ||
               strlen(kv->valuestring) >= sizeof e->kernel_version))
        return bad(errbuf, n, "%s.kernel_version must be a short non-empty string", where);
    if (kv) snprintf(e->kernel_version, sizeof e->kernel_version, "%s", kv->valuestring);
    if (vars && (!cJSON_IsObject(vars) || cJSON_GetArraySize(vars) > KHUB_LOCK_MAX_VARIANTS))
        return bad(errbuf, n, "%s.variants must be an object of at most %d variants", where,
                   KHUB_LOCK_MAX_VARIANTS);
    int nv = vars ? cJSON_GetArraySize(vars) : 0;
    e->variants = nv ? khub__mem_calloc(NULL, (size_t)nv, sizeof *e->variants) : NULL;
    if (nv && !e->variants) return KHUB_STATUS_NOMEM;
    cJSON_ArrayForEach(jv, vars)
    {
        khub_status st = parse_variant(jv, where, &e->variants[e->n_variants], errbuf, n);
        e->n_variants++; /* counted even on failure so clear frees its files */
        if (st != KHUB_STATUS_OK) return st;
    }
    return KHUB_STATUS_OK;
}

khub_status khub__lock_parse(const char *json, size_t n, khub_lock **out, char *errbuf,
                             size_t errbuf_size)
{
    *out = NULL;
    if (n > MAX_LOCK_BYTES)
        return bad(errbuf, errbuf_size, "khub.lock: over %zu bytes", MAX_LOCK_BYTES);
    static const char *const keys[] = {"format", "kernels", NULL};
    char why[128];
    const char *extra = NULL;
    cJSON *root = khub__json_parse_strict(json, n, why, sizeof why);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *ks = cJSON_GetObjectItemCaseSensitive(root, "kernels"), *je;
    khub_status st = KHUB_STATUS_OK;
    if (!root)
        st = bad(errbuf, errbuf_size, "khub.lock: %s", why);
    else if (!cJSON_IsObject(root))
        st = bad(errbuf, errbuf_size, "khub.lock is not a JSON object");
    else if (!khub__json_only_keys(root, keys, &extra))
        st = bad(errbuf, errbuf_size, "khub.lock: unknown field \"%.60s\"", extra);
    else if (!cJSON_IsNumber(fmt) || fmt->valuedouble != 1)
        st = bad(errbuf, errbuf_size,
                 "khub.lock: \"format\" must be 1 (this khub reads format "
                 "1 only)");
    else if (!cJSON_IsArray(ks) || cJSON_GetArraySize(ks) > KHUB_LOCK_MAX_ENTRIES)
        st = bad(errbuf, errbuf_size, "khub.lock: \"kernels\" must be an array of at most %d",
                 KHUB_LOCK_MAX_ENTRIES);
    khub_lock *lock = NULL;
    if (st == KHUB_STATUS_OK) st = khub__lock_new(&lock);
    int idx = 0;
    const cJSON *list = st == KHUB_STATUS_OK ? ks : NULL;
    cJSON_ArrayForEach(je, list)
    {
        khub_lock_entry e = {0};
        st = parse_entry(je, idx, &e, errbuf, errbuf_size);
        if (st == KHUB_STATUS_OK && khub__lock_find(lock, e.repo))
            st = bad(errbuf, errbuf_size, "kernels[%d]: %s is locked twice", idx, e.repo);
        if (st == KHUB_STATUS_OK) st = khub__lock_put(lock, &e);
        khub__lock_entry_clear(&e);
        if (st != KHUB_STATUS_OK) break;
        idx++;
    }
    cJSON_Delete(root);
    if (st != KHUB_STATUS_OK) {
        khub__lock_free(lock);
        return st;
    }
    *out = lock;
    return KHUB_STATUS_OK;
}

/* A deep copy of e into c (C library allocator); false on OOM, with what
 * was copied left for khub__lock_entry_clear (c's arrays are zeroed first). */
static bool entry_clone(const khub_lock_entry *e, khub_lock_entry *c)
{
    *c = *e;
    c->variants = e->n_variants ? khub__mem_calloc(NULL, e->n_variants, sizeof *c->variants) : NULL;
    c->n_variants = c->variants ? e->n_variants : 0;
    if (e->n_variants && !c->variants) return false;
    for (size_t i = 0; i < e->n_variants; i++) {
        const khub_lock_variant *v = &e->variants[i];
        khub_lock_variant *cv = &c->variants[i];
        *cv = *v;
        cv->files = v->n_files ? khub__mem_alloc(NULL, v->n_files * sizeof *cv->files) : NULL;
        if (v->n_files && !cv->files) return false;
        if (v->n_files) memcpy(cv->files, v->files, v->n_files * sizeof *cv->files);
    }
    return true;
}

static khub_lock *lock_clone(const khub_lock *lock)
{
    khub_lock *c = NULL;
    if (khub__lock_new(&c) != KHUB_STATUS_OK) return NULL;
    c->items = lock->count ? khub__mem_calloc(NULL, lock->count, sizeof *c->items) : NULL;
    c->count = c->items ? lock->count : 0;
    bool ok = !lock->count || c->items;
    for (size_t i = 0; ok && i < lock->count; i++) ok = entry_clone(&lock->items[i], &c->items[i]);
    if (ok) return c;
    khub__lock_free(c);
    return NULL;
}

static void *lock_keep(const void *parsed) { return lock_clone(parsed); }

static bool lock_give(const void *kept, void *out)
{
    khub_lock *c = lock_clone(kept);
    *(khub_lock **)out = c;
    return c != NULL;
}

static void lock_drop(void *kept) { khub__lock_free(kept); }

static const khub__memo_kind lock_memo = {"lock", lock_keep, lock_give, lock_drop};

/* Read on every load; parsed only when its bytes are not those of a lock
 * parsed before in this process (parse_memo.h). */
khub_status khub__lock_load(const char *path, khub_lock **out, char *errbuf, size_t errbuf_size)
{
    *out = NULL;
    char *text = NULL, why[KHUB_ERROR_SIZE];
    size_t len = 0;
    KHUB_FORWARD_IF_ERROR(
        NULL, khub__read_file_mem(NULL, path, MAX_LOCK_BYTES, &text, &len, errbuf, errbuf_size));
    if (khub__parse_memo_find(&lock_memo, text, len, out)) {
        khub__mem_free(text);
        return KHUB_STATUS_OK;
    }
    khub_status st = khub__lock_parse(text, len, out, why, sizeof why);
    if (st == KHUB_STATUS_OK) khub__parse_memo_add(&lock_memo, text, len, *out);
    khub__mem_free(text);
    if (st != KHUB_STATUS_OK) khub__errbuf(errbuf, errbuf_size, "%s: %s", path, why);
    return st;
}

/* ======================================================================== */
/* Versions                                                                 */
/* ======================================================================== */

khub_status khub__lock_version_from_dir(const khub_allocator *a, const char *dir, char out[32],
                                        char *errbuf, size_t errbuf_size)
{
    char path[4096], *text = NULL;
    size_t n = 0;
    out[0] = '\0';
    snprintf(path, sizeof path, "%s/metadata.json", dir);
    KHUB_FORWARD_IF_ERROR(
        NULL, khub__read_file_mem(a, path, (size_t)4 << 20, &text, &n, errbuf, errbuf_size));
    khub_kmeta *m = khub__mem_alloc(a, sizeof *m);
    khub_status st = m ? khub__kmeta_parse(text, n, m, errbuf, errbuf_size) : KHUB_STATUS_NOMEM;
    if (st == KHUB_STATUS_OK) snprintf(out, 32, "%s", m->version);
    khub__mem_free(m);
    khub__mem_free(text);
    return st;
}

/* Reads "N(.N)*" then an optional "-pre" and "+build"; false otherwise. */
static bool version_parts(const char *v, long parts[8], size_t *n, const char **pre)
{
    *n = 0;
    *pre = NULL;
    while (*n < 8) {
        if (*v < '0' || *v > '9') return false;
        char *end;
        parts[(*n)++] = strtol(v, &end, 10);
        v = end;
        if (*v != '.') break;
        v++;
    }
    if (*v == '-') *pre = ++v, v += strcspn(v, "+");
    return *v == '\0' || *v == '+';
}

int khub__lock_version_cmp(const char *a, const char *b, bool *comparable)
{
    long pa[8] = {0}, pb[8] = {0};
    size_t na, nb;
    const char *prea, *preb;
    *comparable = version_parts(a, pa, &na, &prea) && version_parts(b, pb, &nb, &preb);
    if (!*comparable) return 0;
    for (size_t i = 0; i < 8; i++)
        if (pa[i] != pb[i]) return pa[i] < pb[i] ? -1 : 1;
    if (!prea != !preb) return prea ? -1 : 1; /* 1.0.0-rc1 < 1.0.0 */
    if (!prea) return 0;
    size_t la = strcspn(prea, "+"), lb = strcspn(preb, "+");
    int c = strncmp(prea, preb, la < lb ? la : lb);
    return c ? c : (la > lb) - (la < lb);
}

/* ======================================================================== */
/* Writing                                                                  */
/* ======================================================================== */

static cJSON *entry_json(const khub_lock_entry *e)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "repo", e->repo);
    if (e->version >= 0)
        cJSON_AddNumberToObject(o, "version", e->version);
    else
        cJSON_AddStringToObject(o, "revision", e->revision);
    cJSON_AddStringToObject(o, "commit", e->commit);
    if (e->kernel_version[0]) cJSON_AddStringToObject(o, "kernel_version", e->kernel_version);
    cJSON *vs = cJSON_AddObjectToObject(o, "variants");
    for (size_t i = 0; i < e->n_variants; i++) {
        const khub_lock_variant *v = &e->variants[i];
        khub_lock_file sorted[KHUB_LOCK_MAX_FILES];
        size_t nf = v->n_files < KHUB_LOCK_MAX_FILES ? v->n_files : KHUB_LOCK_MAX_FILES;
        memcpy(sorted, v->files, nf * sizeof *sorted);
        qsort(sorted, nf, sizeof *sorted, cmp_file);
        cJSON *jv = cJSON_AddObjectToObject(vs, v->name);
        cJSON_AddStringToObject(jv, "hash", v->hash);
        cJSON *fs = cJSON_AddObjectToObject(jv, "files");
        for (size_t j = 0; j < nf; j++)
            cJSON_AddStringToObject(fs, sorted[j].name, sorted[j].sha256);
    }
    return o;
}

khub_status khub__lock_save(const khub_lock *lock, const char *path, char *errbuf,
                            size_t errbuf_size)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddNumberToObject(root, "format", 1);
    cJSON *ks = cJSON_AddArrayToObject(root, "kernels");
    for (size_t i = 0; i < lock->count; i++) cJSON_AddItemToArray(ks, entry_json(&lock->items[i]));
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return KHUB_STATUS_NOMEM;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    khub_status st = KHUB_STATUS_OK;
    if (!f || fputs(text, f) < 0 || fputc('\n', f) < 0 || fflush(f) != 0 || fsync(fileno(f)))
        st = KHUB_STATUS_IO;
    if (f && fclose(f) != 0) st = KHUB_STATUS_IO;
    if (st == KHUB_STATUS_OK && rename(tmp, path) != 0) st = KHUB_STATUS_IO;
    if (st != KHUB_STATUS_OK) {
        khub__errbuf(errbuf, errbuf_size, "cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
    }
    cJSON_free(text);
    return st;
}

/* ======================================================================== */
/* The Python library's kernels.lock                                        */
/* ======================================================================== */

static void note(char *notes, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void note(char *notes, size_t size, const char *fmt, ...)
{
    size_t len = strnlen(notes, size);
    if (len + 1 >= size) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(notes + len, size - len, fmt, ap);
    va_end(ap);
    len = strnlen(notes, size);
    if (len + 1 < size) notes[len] = '\n', notes[len + 1] = '\0';
}

/* Legacy: {"repo_id", "sha", "variants": {name: {"hash", "hash_type"}}}. */
static khub_status import_legacy(const cJSON *je, int idx, khub_lock_entry *e, char *notes,
                                 size_t nn, char *errbuf, size_t n)
{
    const cJSON *repo = cJSON_GetObjectItemCaseSensitive(je, "repo_id");
    const cJSON *sha = cJSON_GetObjectItemCaseSensitive(je, "sha");
    const cJSON *vars = cJSON_GetObjectItemCaseSensitive(je, "variants"), *v;
    if (!cJSON_IsString(repo) || !cJSON_IsString(sha))
        return bad(errbuf, n, "kernels.lock[%d]: needs string \"repo_id\" and \"sha\"", idx);
    snprintf(e->repo, sizeof e->repo, "%.193s", repo->valuestring);
    snprintf(e->commit, sizeof e->commit, "%.40s", sha->valuestring);
    e->version = -1;
    snprintf(e->revision, sizeof e->revision, "%.40s", sha->valuestring);
    note(notes, nn,
         "%s: the legacy format records no version or revision; pinned to commit "
         "%.12s (set a version in khub.json and run khub update to follow a branch)",
         e->repo, e->commit);
    cJSON_ArrayForEach(v, vars)
    {
        const cJSON *ht = cJSON_GetObjectItemCaseSensitive(v, "hash_type");
        note(notes, nn,
             "%s: variant %.100s (%s hash) is a Python/Torch build with no khub "
             "equivalent; not carried over",
             e->repo, v->string ? v->string : "?",
             cJSON_IsString(ht) ? ht->valuestring : "unknown");
    }
    return KHUB_STATUS_OK;
}

/* Newer: {"dependency": {"repo-id", "version" | "revision"}, "lock": {"commit"[, "hash"]}}. */
static khub_status import_new(const cJSON *je, int idx, khub_lock_entry *e, char *notes, size_t nn,
                              char *errbuf, size_t n)
{
    const cJSON *dep = cJSON_GetObjectItemCaseSensitive(je, "dependency");
    const cJSON *lk = cJSON_GetObjectItemCaseSensitive(je, "lock");
    const cJSON *repo = cJSON_GetObjectItemCaseSensitive(dep, "repo-id");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(dep, "version");
    const cJSON *rev = cJSON_GetObjectItemCaseSensitive(dep, "revision");
    const cJSON *commit = cJSON_GetObjectItemCaseSensitive(lk, "commit");
    if (!cJSON_IsString(repo) || !cJSON_IsString(commit))
        return bad(errbuf, n, "kernels.lock[%d]: needs dependency.repo-id and lock.commit", idx);
    if (ver && rev)
        return bad(errbuf, n,
                   "kernels.lock[%d]: dependency has both version and "
                   "revision",
                   idx);
    snprintf(e->repo, sizeof e->repo, "%.193s", repo->valuestring);
    snprintf(e->commit, sizeof e->commit, "%.40s", commit->valuestring);
    e->version = -1;
    if (cJSON_IsNumber(ver) && ver->valuedouble >= 0 && ver->valuedouble <= 1e6)
        e->version = (int32_t)ver->valuedouble;
    else if (cJSON_IsString(rev))
        snprintf(e->revision, sizeof e->revision, "%.255s", rev->valuestring);
    else
        return bad(errbuf, n,
                   "kernels.lock[%d]: dependency needs an integer version or a "
                   "revision",
                   idx);
    if (cJSON_GetObjectItemCaseSensitive(lk, "hash"))
        note(notes, nn,
             "%s: lock.hash (a Nix output hash) has no khub meaning; not carried "
             "over",
             e->repo);
    return KHUB_STATUS_OK;
}

static khub_status check_imported(const khub_lock_entry *e, int idx, char *errbuf, size_t n)
{
    khub_hub_id id;
    if (strchr(e->repo, '@') || strchr(e->repo, ':') ||
        khub_hub_id_parse(e->repo, &id, NULL, 0) != KHUB_STATUS_OK)
        return bad(errbuf, n, "kernels.lock[%d]: repo \"%.100s\" is not org/name", idx, e->repo);
    if (strlen(e->commit) != 40 || strspn(e->commit, "0123456789abcdef") != 40)
        return bad(errbuf, n, "kernels.lock[%d] (%s): commit is not 40 lowercase hex digits", idx,
                   e->repo);
    return KHUB_STATUS_OK;
}

khub_status khub__lock_import_python(const char *json, size_t n, khub_lock *into, char *notes,
                                     size_t notes_size, char *errbuf, size_t errbuf_size)
{
    if (notes && notes_size) notes[0] = '\0';
    if (n > MAX_LOCK_BYTES) return bad(errbuf, errbuf_size, "kernels.lock: too large");
    cJSON *root = cJSON_ParseWithLength(json, n);
    if (!cJSON_IsArray(root)) {
        cJSON_Delete(root);
        return bad(errbuf, errbuf_size,
                   "kernels.lock is not a JSON array (neither the legacy "
                   "[{repo_id, sha, variants}] nor the [{dependency, lock}] format)");
    }
    khub_status st = KHUB_STATUS_OK;
    int idx = 0;
    const cJSON *je;
    cJSON_ArrayForEach(je, root)
    {
        khub_lock_entry e = {0};
        if (!cJSON_IsObject(je))
            st = bad(errbuf, errbuf_size,
                     "kernels.lock[%d] is not an "
                     "object",
                     idx);
        else if (cJSON_GetObjectItemCaseSensitive(je, "dependency"))
            st = import_new(je, idx, &e, notes, notes_size, errbuf, errbuf_size);
        else
            st = import_legacy(je, idx, &e, notes, notes_size, errbuf, errbuf_size);
        if (st == KHUB_STATUS_OK) st = check_imported(&e, idx, errbuf, errbuf_size);
        if (st == KHUB_STATUS_OK) st = khub__lock_put(into, &e);
        khub__lock_entry_clear(&e);
        if (st != KHUB_STATUS_OK) break;
        idx++;
    }
    cJSON_Delete(root);
    return st;
}
