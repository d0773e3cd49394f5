/*
 * client.c: the hub client's operations: revision -> commit and verified
 * single-file downloads into the cache. Tree listings are client_tree.c's.
 *
 * A download names the blob (SHA-256 for LFS files, git blob SHA-1
 * otherwise) and its size from the commit's cached full listing when there
 * is one, else from a HEAD (huggingface_hub's order: HEAD then GET); the GET
 * streams into a private temp file under the blob's lock, hashed while it
 * arrives, and only a file whose size and hash match is renamed into
 * blobs/. A file already in the snapshot costs no request at all.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "hub_impl.h"

/* ======================================================================== */
/* Resolving a revision                                                     */
/* ======================================================================== */

static int falls_back(khub_status st, const khub__http_resp *r)
{
    if (st == KHUB_STATUS_NETWORK) return 1;
    if (st != KHUB_STATUS_OK) return 0;
    return r->status >= 500 || r->status == 429 || !strcmp(r->error_code, "RepoNotFound") ||
           !strcmp(r->error_code, "GatedRepo");
}

/* Highest refs/v<N> in the cache, else "main". */
static void default_rev_offline(const char *repo_dir, char *rev, size_t size)
{
    char path[KHUB__PATH_MAX];
    snprintf(rev, size, "main");
    if (!KHUB__PATHF(path, "%s/refs", repo_dir)) return;
    DIR *d = opendir(path);
    struct dirent *de;
    long best = -1;
    while (d && (de = readdir(d))) {
        char *end;
        if (de->d_name[0] != 'v' || !de->d_name[1]) continue;
        long v = strtol(de->d_name + 1, &end, 10);
        if (*end == '\0' && v > best) best = v;
    }
    if (d) closedir(d);
    if (best >= 0) snprintf(rev, size, "v%ld", best);
}

khub_status khub__refs_resolve(khub_hub *hub, const khub_hub_id *id, const char *json, size_t len,
                               int32_t version, char *rev, size_t rev_size, char commit[41])
{
    cJSON *root = cJSON_ParseWithLength(json, len);
    cJSON *br = cJSON_GetObjectItemCaseSensitive(root, "branches"), *b;
    if (!cJSON_IsArray(br)) {
        cJSON_Delete(root);
        return khub__hub_fail(hub, KHUB_STATUS_PARSE, "refs of %s/%s: no \"branches\" array",
                              id->org, id->name);
    }
    long best = -1;
    const char *best_sha = NULL, *main_sha = NULL;
    char seen[256] = "";
    cJSON_ArrayForEach(b, br)
    {
        cJSON *n = cJSON_GetObjectItemCaseSensitive(b, "name");
        cJSON *t = cJSON_GetObjectItemCaseSensitive(b, "targetCommit");
        if (!cJSON_IsString(n) || !cJSON_IsString(t) || !khub__is_commit_hex(t->valuestring))
            continue;
        if (!strcmp(n->valuestring, "main")) main_sha = t->valuestring;
        char *end;
        if (n->valuestring[0] != 'v' || !n->valuestring[1]) continue;
        long v = strtol(n->valuestring + 1, &end, 10);
        if (*end) continue;
        size_t l = strlen(seen);
        snprintf(seen + l, sizeof seen - l, "%s%s", l ? ", " : "", n->valuestring);
        if ((version >= 0 && v == version) || (version < 0 && v > best)) {
            best = v;
            best_sha = t->valuestring;
        }
    }
    khub_status st = KHUB_STATUS_OK;
    if (best_sha) {
        snprintf(rev, rev_size, "v%ld", best);
        memcpy(commit, best_sha, 41);
    } else if (version < 0 && main_sha) {
        snprintf(rev, rev_size, "main");
        memcpy(commit, main_sha, 41);
    } else if (version >= 0) {
        st = khub__hub_fail(hub, KHUB_STATUS_REVISION_NOT_FOUND,
                            "%s/%s has no version %d (branch v%d); available: %s", id->org,
                            id->name, (int)version, (int)version, seen[0] ? seen : "none");
    } else {
        st = khub__hub_fail(hub, KHUB_STATUS_REVISION_NOT_FOUND,
                            "%s/%s has neither a v<N> branch nor main", id->org, id->name);
    }
    cJSON_Delete(root);
    return st;
}

khub_status khub__revision_sha(khub_hub *hub, const khub_hub_id *id, const char *json, size_t n,
                               char commit[41])
{
    cJSON *root = cJSON_ParseWithLength(json, n);
    cJSON *sha = cJSON_GetObjectItemCaseSensitive(root, "sha");
    khub_status st = KHUB_STATUS_OK;
    if (cJSON_IsString(sha) && khub__is_commit_hex(sha->valuestring))
        memcpy(commit, sha->valuestring, 41);
    else
        st = khub__hub_fail(hub, KHUB_STATUS_PARSE, "repo info of %s/%s@%s has no 40-hex \"sha\"",
                            id->org, id->name, id->revision);
    cJSON_Delete(root);
    return st;
}

static khub_status resolve_online(khub_hub *hub, const khub_hub_id *id, const char *repo_dir,
                                  char *rev, size_t rev_size, char commit[41])
{
    char url[4096], qrev[1024], what[512];
    int by_refs = id->rev_kind != KHUB_HUB_REV_NAME;
    if (by_refs) {
        if (!KHUB__PATHF(url, "%s/api/%s/%s/%s/refs", hub->endpoint, khub__repo_api_type(hub, id),
                         id->org, id->name))
            return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "URL too long");
    } else {
        KHUB_FORWARD_IF_ERROR(NULL, khub__url_quote(hub, id->revision, 0, qrev, sizeof qrev));
        if (!KHUB__PATHF(url, "%s/api/%s/%s/%s/revision/%s", hub->endpoint,
                         khub__repo_api_type(hub, id), id->org, id->name, qrev))
            return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "URL too long");
    }
    snprintf(what, sizeof what, "resolving %s/%s@%s", id->org, id->name,
             id->rev_kind == KHUB_HUB_REV_DEFAULT ? "(default)" : id->revision);
    khub__http_resp r = {0};
    khub__http_req req = {.method = "GET", .url = url, .auth = 1, .what = what};
    int saved = hub->err_set;
    khub_status st = khub__http_fetch(hub, &req, &r);
    if (falls_back(st, &r)) {
        char fb_rev[KHUB_HUB_REV_MAX + 1];
        if (id->rev_kind == KHUB_HUB_REV_DEFAULT)
            default_rev_offline(repo_dir, fb_rev, sizeof fb_rev);
        else
            snprintf(fb_rev, sizeof fb_rev, "%s", id->revision);
        int s2 = hub->err_set;
        hub->err_set = 1;
        khub_status rs = khub__cache_read_ref(hub, repo_dir, fb_rev, commit);
        hub->err_set = s2;
        if (rs == KHUB_STATUS_OK) {
            khub__log(hub->rt, KHUB_LOG_WARN,
                      "%s: hub unreachable or refused (%s); using the "
                      "cached refs/%s",
                      what, st == KHUB_STATUS_OK ? r.error_code : hub->errmsg, fb_rev);
            hub->err_set = saved;
            hub->errmsg[0] = '\0';
            snprintf(rev, rev_size, "%s", fb_rev);
            khub__http_resp_free(&r);
            return KHUB_STATUS_OK;
        }
    }
    if (st == KHUB_STATUS_OK && (r.status < 200 || r.status >= 300))
        st = khub__http_error(hub, &r, what);
    if (st == KHUB_STATUS_OK) {
        if (by_refs) {
            st = khub__refs_resolve(hub, id, r.body ? r.body : "", r.body ? r.body_len : 0,
                                    id->version, rev, rev_size, commit);
        } else {
            snprintf(rev, rev_size, "%s", id->revision);
            st = khub__revision_sha(hub, id, r.body ? r.body : "", r.body ? r.body_len : 0, commit);
        }
    }
    khub__http_resp_free(&r);
    return st;
}

/* Online: resolves id and records the answer in refs/ of its cache folder. */
static khub_status resolve_and_record(khub_hub *hub, const khub_hub_id *id, char commit_out[41])
{
    char repo_dir[KHUB__PATH_MAX], rev[KHUB_HUB_REV_MAX + 1];
    KHUB_FORWARD_IF_ERROR(NULL, khub__cache_repo_dir(hub, id, repo_dir, sizeof repo_dir));
    KHUB_FORWARD_IF_ERROR(NULL, resolve_online(hub, id, repo_dir, rev, sizeof rev, commit_out));
    khub__cache_tag(hub);
    return khub__cache_write_ref(hub, repo_dir, rev, commit_out);
}

khub_status khub_hub_resolve(khub_hub *hub, const khub_hub_id *id, char commit_out[41])
{
    if (!hub || !id || !commit_out)
        return khub__fail(NULL, KHUB_STATUS_MISUSE, "khub_hub_resolve: NULL argument");
    khub__hub_clear(hub);
    if (id->rev_kind == KHUB_HUB_REV_COMMIT) {
        memcpy(commit_out, id->revision, 41);
        return KHUB_STATUS_OK;
    }
    if (hub->offline) {
        char repo_dir[KHUB__PATH_MAX], rev[KHUB_HUB_REV_MAX + 1];
        KHUB_FORWARD_IF_ERROR(NULL, khub__cache_repo_dir(hub, id, repo_dir, sizeof repo_dir));
        if (id->rev_kind == KHUB_HUB_REV_DEFAULT)
            default_rev_offline(repo_dir, rev, sizeof rev);
        else
            snprintf(rev, sizeof rev, "%s", id->revision);
        khub_status st = khub__cache_read_ref(hub, repo_dir, rev, commit_out);
        if (st == KHUB_STATUS_NOT_FOUND)
            return khub__hub_fail(hub, KHUB_STATUS_OFFLINE,
                                  "%s/%s@%s is not cached (no %s/refs/%s) and HF_HUB_OFFLINE "
                                  "forbids the network; download it once online",
                                  id->org, id->name, rev, repo_dir, rev);
        return st;
    }
    khub_status st = resolve_and_record(hub, id, commit_out);
    if (khub__repo_fallback_begin(hub, id, st))
        st = khub__repo_fallback_end(hub, id, resolve_and_record(hub, id, commit_out));
    return st;
}

static int is_hex_n(const char *s, size_t n)
{
    if (strlen(s) != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

/* ======================================================================== */
/* Downloading one file                                                     */
/* ======================================================================== */

/* streamed: the digest of the received bytes, or NULL to hash tmp. */
static khub_status verify_blob(khub_hub *hub, const char *tmp, const char *etag, const char *path,
                               const char *streamed)
{
    char got[65];
    khub_status st = KHUB_STATUS_OK;
    if (streamed)
        snprintf(got, sizeof got, "%s", streamed);
    else
        st = strlen(etag) == 64 ? khub__sha256_file_hex(tmp, got)
                                : khub__git_blob_sha1_file(tmp, got);
    if (st != KHUB_STATUS_OK) return khub__hub_fail(hub, KHUB_STATUS_IO, "cannot hash %s", tmp);
    if (!khub__digest_eq(got, etag))
        return khub__hub_fail(hub, KHUB_STATUS_DIGEST_MISMATCH,
                              "%s: content %s is %s but the hub announced %s; nothing was "
                              "stored",
                              path, strlen(etag) == 64 ? "SHA-256" : "git blob SHA-1", got, etag);
    return KHUB_STATUS_OK;
}

/* An announced size is checked before the GET: over KHUB_MAX_DOWNLOAD_SIZE,
 * or over what the cache's file system has free, nothing is requested (a
 * hostile hub's 2^60 bytes would otherwise be written until the disk is
 * full). */
khub_status khub__download_size_ok(khub_hub *hub, const char *dir, uint64_t size, uint64_t have,
                                   const char *what)
{
    if (size > hub->max_download)
        return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW,
                              "%s: the hub announces %llu bytes, over the %llu-byte limit; "
                              "nothing was requested (raise KHUB_MAX_DOWNLOAD_SIZE if you "
                              "trust this file)",
                              what, (unsigned long long)size,
                              (unsigned long long)hub->max_download);
    struct statvfs vs;
    if (statvfs(dir, &vs) == 0 && vs.f_frsize > 0 && size > have &&
        (uint64_t)vs.f_bavail < (size - have) / (uint64_t)vs.f_frsize)
        return khub__hub_fail(hub, KHUB_STATUS_IO,
                              "%s: the hub announces %llu bytes, %llu more than the %llu free on "
                              "the cache's file system (%s); nothing was requested",
                              what, (unsigned long long)size, (unsigned long long)(size - have),
                              (unsigned long long)vs.f_bavail * vs.f_frsize, dir);
    return KHUB_STATUS_OK;
}

static int is_regular(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* GETs url into blobs/<etag> under the blob lock. */
static khub_status fetch_blob(khub_hub *hub, const khub_hub_id *id, const char *repo_dir,
                              const char *url, const char *etag, uint64_t size, const char *path)
{
    char folder[256], blob[KHUB__PATH_MAX], tmp[KHUB__PATH_MAX];
    KHUB_FORWARD_IF_ERROR(NULL, khub__cache_repo_folder(hub, id, folder, sizeof folder));
    if (!KHUB__PATHF(blob, "%s/blobs/%s", repo_dir, etag))
        return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "blob path too long");
    int lock = -1, fd = -1;
    KHUB_FORWARD_IF_ERROR(NULL, khub__cache_lock(hub, folder, etag, &lock));
    khub_status st = KHUB_STATUS_OK;
    if (is_regular(blob)) goto done; /* another process finished it while we waited */
    uint64_t have = 0;
    st = khub__cache_blob_tmp(hub, repo_dir, etag, tmp, sizeof tmp, &fd, &have);
    if (st != KHUB_STATUS_OK) goto done;
    if (have > size && ftruncate(fd, 0) == 0) have = 0;
    char what[512];
    snprintf(what, sizeof what, "downloading %s/%s/%s", id->org, id->name, path);
    st = khub__download_size_ok(hub, repo_dir, size, have, what);
    if (st != KHUB_STATUS_OK) {
        close(fd);
        if (have == 0) unlink(tmp); /* a resumable prefix stays */
        goto done;
    }
    int git = strlen(etag) == 40;
    khub__blob_sink *bs = NULL;
    st = khub__blob_sink_new(hub, fd, have, size, path, git, &bs);
    if (st != KHUB_STATUS_OK) {
        close(fd);
        unlink(tmp);
        goto done;
    }
    khub__http_resp r = {0};
    khub__http_req req = {.method = "GET",
                          .url = url,
                          .auth = 1,
                          .follow_absolute = 1,
                          .sink = khub__blob_sink_sink(bs),
                          .what = what,
                          .expect_bytes = size};
    if (have < size || size == 0) st = khub__http_fetch(hub, &req, &r);
    char streamed[65], sha256[65];
    khub_status sink_st = khub__blob_sink_finish(bs, streamed, sha256);
    if (sink_st != KHUB_STATUS_OK) st = sink_st; /* the sink's reason, not "aborted" */
    uint64_t got = khub__blob_sink_have(bs);
    khub__blob_sink_free(bs);
    int complete416 = r.status == 416 && got == size;
    if (st == KHUB_STATUS_OK && r.status && (r.status < 200 || r.status >= 300) && !complete416)
        st = khub__http_error(hub, &r, what);
    khub__http_resp_free(&r);
    if (st == KHUB_STATUS_OK && got != size)
        st = khub__hub_fail(hub, KHUB_STATUS_TRUNCATED,
                            "%s: got %llu of %llu bytes; nothing was stored", what,
                            (unsigned long long)got, (unsigned long long)size);
    if (!git) snprintf(sha256, sizeof sha256, "%s", etag);
    if (st == KHUB_STATUS_OK) st = verify_blob(hub, tmp, etag, path, streamed[0] ? streamed : NULL);
    if (st == KHUB_STATUS_OK) {
        st = khub__cache_publish_blob(hub, fd, tmp, blob);
        fd = -1;
    }
    /* The bytes were hashed as they were written: the variant check that
     * follows need not read them again (variant.c). */
    if (st == KHUB_STATUS_OK && sha256[0]) khub__hub_note_fresh(hub, blob, sha256);
    if (fd >= 0) close(fd);
    /* A transport failure keeps the bytes for a resume (under this lock,
     * hash-checked at the end); anything else is thrown away. */
    if (st != KHUB_STATUS_OK && st != KHUB_STATUS_NETWORK) unlink(tmp);
done:
    khub__cache_unlock(lock);
    return st;
}

/* The blob's ETag and size from the commit's cached full listing
 * (trees/<commit>.json): the listing names every file's SHA-256 (LFS) or
 * git blob SHA-1 and size, which is all the HEAD would say, so a file it
 * lists costs one request (the GET) instead of two. The bytes are still
 * checked against that digest before they are stored. */
static bool blob_from_tree(const khub_hub *hub, const char *repo_dir, const char *commit,
                           const char *path, char etag[80], uint64_t *size)
{
    char tree[KHUB__PATH_MAX];
    khub__tree files = {0};
    bool found = false;
    if (!KHUB__PATHF(tree, "%s/trees/%s.json", repo_dir, commit) ||
        !khub__tree_read_cache(khub__hub_alloc(hub), tree, &files))
        return false;
    for (size_t i = 0; i < files.count && !found; i++) {
        const khub__tree_entry *e = &files.items[i];
        if (e->is_dir || strcmp(e->path, path) != 0) continue;
        snprintf(etag, 80, "%s", e->lfs_sha256[0] ? e->lfs_sha256 : e->oid);
        *size = e->size;
        found = true;
    }
    khub__tree_free(&files);
    return found;
}

/* HEAD on the resolve URL: the blob's ETag (SHA-256 for LFS files, git blob
 * SHA-1 otherwise) and size. */
static khub_status head_blob(khub_hub *hub, const khub_hub_id *id, const char *repo_dir,
                             const char *commit, const char *path, const char *url,
                             char etag_out[80], uint64_t *size_out)
{
    char what[512];
    snprintf(what, sizeof what, "HEAD %s/%s@%.12s/%s", id->org, id->name, commit, path);
    khub__http_resp r = {0};
    khub__http_req req = {.method = "HEAD", .url = url, .auth = 1, .what = what};
    khub_status st = khub__http_fetch(hub, &req, &r);
    int redirect = r.status >= 300 && r.status < 400;
    if (st == KHUB_STATUS_OK && (r.status < 200 || r.status >= 400)) {
        st = khub__http_error(hub, &r, what);
        /* As huggingface_hub: only a typed 404 for this very commit. */
        if (st == KHUB_STATUS_ENTRY_NOT_FOUND && !strcmp(r.repo_commit, commit))
            khub__cache_mark_absent(hub, repo_dir, commit, path);
    }
    const char *etag = r.linked_etag[0] ? r.linked_etag : r.etag;
    int64_t size = r.linked_size >= 0 ? r.linked_size : redirect ? -1 : r.content_length;
    if (st == KHUB_STATUS_OK && strcmp(r.repo_commit, commit) != 0)
        st = khub__hub_fail(hub, KHUB_STATUS_HTTP,
                            "%s: X-Repo-Commit is \"%s\", not the commit asked for; is %s "
                            "a Hub?",
                            what, r.repo_commit, hub->endpoint);
    if (st == KHUB_STATUS_OK && !is_hex_n(etag, 40) && !is_hex_n(etag, 64))
        st = khub__hub_fail(hub, KHUB_STATUS_HTTP,
                            "%s: no usable ETag (got \"%.80s\"); need a git SHA-1 or a "
                            "SHA-256",
                            what, etag);
    if (st == KHUB_STATUS_OK && size < 0)
        st = khub__hub_fail(hub, KHUB_STATUS_HTTP, "%s: no X-Linked-Size or Content-Length", what);
    snprintf(etag_out, 80, "%s", etag);
    *size_out = size < 0 ? 0 : (uint64_t)size;
    khub__http_resp_free(&r);
    return st;
}

static khub_status download_file_once(khub_hub *hub, const khub_hub_id *id, const char *commit,
                                      const char *path, char *out, size_t out_size)
{
    if (!khub__is_commit_hex(commit))
        return khub__hub_fail(hub, KHUB_STATUS_INVALID_ARG,
                              "download needs a 40-hex commit, got \"%.60s\"; resolve first",
                              commit);
    if (!khub__path_is_safe(path))
        return khub__hub_fail(hub, KHUB_STATUS_UNSAFE_PATH,
                              "refusing repo path \"%.200s\": absolute or with \"..\"", path);
    char repo_dir[KHUB__PATH_MAX], snap[KHUB__PATH_MAX];
    KHUB_FORWARD_IF_ERROR(NULL, khub__cache_repo_dir(hub, id, repo_dir, sizeof repo_dir));
    if (!KHUB__PATHF(snap, "%s/snapshots/%s/%s", repo_dir, commit, path))
        return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "snapshot path too long");
    if (!is_regular(snap)) {
        if (khub__cache_is_absent(repo_dir, commit, path))
            return khub__hub_fail(hub, KHUB_STATUS_ENTRY_NOT_FOUND,
                                  "%s/%s@%.12s: %s is not in that commit (the cache's "
                                  ".no_exist marker says so; no request made)",
                                  id->org, id->name, commit, path);
        if (hub->offline)
            return khub__hub_fail(hub, KHUB_STATUS_OFFLINE,
                                  "%s/%s@%.12s: %s is not cached and HF_HUB_OFFLINE forbids "
                                  "the network",
                                  id->org, id->name, commit, path);
        char url[4096], qpath[2048];
        KHUB_FORWARD_IF_ERROR(NULL, khub__url_quote(hub, path, 1, qpath, sizeof qpath));
        if (!KHUB__PATHF(url, "%s/%s%s/%s/resolve/%s/%s", hub->endpoint,
                         khub__repo_url_prefix(hub, id), id->org, id->name, commit, qpath))
            return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "resolve URL too long");
        char etag_copy[80];
        uint64_t size = 0;
        if (!blob_from_tree(hub, repo_dir, commit, path, etag_copy, &size))
            KHUB_FORWARD_IF_ERROR(
                NULL, head_blob(hub, id, repo_dir, commit, path, url, etag_copy, &size));
        char blob[KHUB__PATH_MAX];
        if (!KHUB__PATHF(blob, "%s/blobs/%s", repo_dir, etag_copy))
            return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "blob path too long");
        khub__cache_tag(hub);
        if (!is_regular(blob))
            KHUB_FORWARD_IF_ERROR(NULL, fetch_blob(hub, id, repo_dir, url, etag_copy, size, path));
        KHUB_FORWARD_IF_ERROR(NULL, khub__cache_link(hub, repo_dir, commit, path, etag_copy));
    }
    if (snprintf(out, out_size, "%s", snap) >= (int)out_size)
        return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "%s: path longer than the %zu-byte buffer",
                              snap, out_size);
    return KHUB_STATUS_OK;
}

khub_status khub_hub_download_path(khub_hub *hub, const khub_hub_id *id, const char *commit,
                                   const char *path, char *buf, size_t size)
{
    if (!hub || !id || !commit || !path || !buf || !size)
        return khub__fail(NULL, KHUB_STATUS_MISUSE, "khub_hub_download_path: NULL argument");
    khub__hub_clear(hub);
    buf[0] = '\0';
    khub_status st = download_file_once(hub, id, commit, path, buf, size);
    if (khub__repo_fallback_begin(hub, id, st))
        st = khub__repo_fallback_end(hub, id, download_file_once(hub, id, commit, path, buf, size));
    if (st != KHUB_STATUS_OK) buf[0] = '\0';
    return st;
}

/* The 0.1 form: its string is the C library's, whatever hub's allocator,
 * because 0.1 callers free it with free() (khub_hub.h). */
khub_status khub_hub_download_file(khub_hub *hub, const khub_hub_id *id, const char *commit,
                                   const char *path, char **path_out)
{
    if (!path_out)
        return khub__fail(NULL, KHUB_STATUS_MISUSE, "khub_hub_download_file: NULL argument");
    *path_out = NULL;
    char buf[KHUB_HUB_PATH_MAX];
    KHUB_FORWARD_IF_ERROR(NULL, khub_hub_download_path(hub, id, commit, path, buf, sizeof buf));
    *path_out = strdup(buf); /* free() is this function's contract (0.1) */
    return *path_out ? KHUB_STATUS_OK : khub__hub_fail(hub, KHUB_STATUS_NOMEM, "out of memory");
}
