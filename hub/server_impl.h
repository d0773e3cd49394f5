/*
 * server_impl.h: what the files of `khub serve` share (private to hub/server*.c).
 * Calls go down this list of layers, never up or sideways-back (each file
 * calls only files of the layers below it, or its own; tests/t_hub_layout.sh
 * checks it on the built objects):
 *
 *   server_api.c     the public khub_server_* (khub/khub_server.h)
 *   server.c         the daemon: start/stop, request bodies, URL splitting,
 *                    routing to the route files
 *   server_read.c    the read endpoints: repo info, refs, tree, paths-info,
 *                    resolve (HEAD/GET with Range)
 *   server_write.c   write routing, repos/create, branches, tags, preupload
 *   ---------------- (route files called by the two above)
 *   server_hf.c      organisation overview, whoami-v2, repo listings,
 *                    commit history, and 401 for a token it cannot accept
 *   server_commit.c  one commit: NDJSON or JSON operations applied to a copy
 *                    of the parent's tree
 *   server_lfs.c     the LFS batch API, capability PUTs, verify
 *   server_faults.c  fault injection by name (docs/hub-server.md)
 *   ---------------- (below every route file)
 *   server_util.c    JSON and error replies, percent-decoding, the server's
 *                    own URL, the write token check, request body checks
 *   server_store.c   the repos folder on disk: opening a repo, resolving a
 *                    revision, atomic file and refs.json replacement, commit ids
 *   server_digest.c  the digest cache: file SHA-256 and git blob ids by path,
 *                    and one request's memo of them by file
 *   ---------------- (below those)
 *   server_path_set.c  a set of paths, each with a value: lookups by path
 *
 * The int helpers return 1 on success and 0 on failure; the endpoint that
 * calls them chooses the HTTP answer. The public face is server.h.
 */
#ifndef KHUB_HUB_SERVER_IMPL_H
#define KHUB_HUB_SERVER_IMPL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "server.h"

#if MHD_VERSION < 0x00097002
typedef int MHD_RESULT;
#else
typedef enum MHD_Result MHD_RESULT;
#endif

/* Fault bits of khub__server.faults (names in server_faults.c). */
enum {
    F_DROP = 1 << 0,
    F_SHORT = 1 << 1,
    F_EXTRA = 1 << 2,
    F_WRONG_HASH = 1 << 3,
    F_429 = 1 << 4,
    F_503 = 1 << 5,
    F_LOOP = 1 << 6,
    F_CROSS_HOST = 1 << 7,
    F_IGNORE_RANGE = 1 << 8,
    F_RATE = 1 << 9,
    F_RATELIMIT = 1 << 10,
    F_408 = 1 << 11,
    F_GATED = 1 << 12,
    F_MOVED = 1 << 13,
    F_TREE_DOTDOT = 1 << 14,
    F_TREE_ABS = 1 << 15,
    F_WRONG_COMMIT = 1 << 16,
    F_LINK_AWAY = 1 << 17,
    F_TRICKLE = 1 << 18,
    F_LINK_USERINFO = 1 << 19,
};

struct khub__server {
    struct MHD_Daemon *d;
    char *dir;
    uint16_t port;
    uint32_t page_size;
    unsigned faults;
    atomic_int budget_drop, budget_429, budget_503, budget_ratelimit, budget_408;
    uint64_t rate;    /* F_RATE: body bytes per second per GET */
    uint64_t trickle; /* F_TRICKLE: body bytes per second, a few at a time */
    atomic_ullong n_requests;
    atomic_ullong n_connections; /* TCP connections accepted */
    khub_log_fn log;             /* the access log (khub_server_opts.log), NULL = none */
    void *log_ud;
    pthread_mutex_t log_lock;   /* one log call at a time */
    char *token;                /* writes need "Bearer <token>"; NULL = open */
    uint64_t max_body;          /* bytes of a write's body (--max-body) */
    char secret[65];            /* keys the upload capabilities */
    pthread_mutex_t write_lock; /* one write at a time: refs.json read-modify-write */
    struct digest_cache *dc;    /* file digests by path and stat fingerprint */
};

/* Request bodies are hostile. Each request's body limit is set from its
 * headers, before any of it is read (server.c): an authenticated write's
 * JSON or NDJSON body is buffered up to s->max_body (--max-body, default
 * KHUB__SRV_MAX_BODY); any other body (paths-info, a stray GET body) up to
 * MAX_READ_BODY; an LFS object streams to a temp file and may not exceed
 * the size its batch call declared (itself at most MAX_LFS_OBJECT). */
#define MAX_JSON_BODY KHUB__SRV_MAX_BODY
#define MAX_READ_BODY (1u << 20)
/* A write without the token: a body up to this is read and dropped before
 * the 401; a larger (or chunked) one is answered at the headers. */
#define MAX_UNAUTH_BODY (64u << 10)
#define MAX_LFS_OBJECT  (16ull << 30)

/* One request's state between libmicrohttpd's calls (server.c). */
typedef struct conn {
    char *body;
    size_t n, cap;
    int too_big;
    int answered;   /* a refusal was queued at the headers: no body is read */
    int unauth;     /* a write without the token: its small body is dropped */
    uint64_t limit; /* the most body bytes this request may send */
    uint64_t got;   /* body bytes received so far (chunked bodies are cut) */
    /* PUT /lfs-upload/...: streamed to tmp, checked against oid and want */
    int put_fd;
    char put_tmp[KHUB__PATH_MAX], put_dest[KHUB__PATH_MAX], put_oid[65];
    uint64_t put_got, put_want;
    char put_err[160];
    unsigned put_code;
} conn;

/* ------------------------------------------------------------------------ */
/* Errors (server_util.c)                                                   */
/* ------------------------------------------------------------------------ */

/* Records st's one-line message as this thread's khub__server_errmsg
 * (the server's own message: see server_util.c) and returns st. */
KHUB_INTERNAL khub_status khub__srv_fail(khub_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Forgets the thread's last message (at the start of khub__server_start). */
KHUB_INTERNAL void khub__srv_clear_error(void);

/* ------------------------------------------------------------------------ */
/* Replies and request helpers (server_util.c)                              */
/* ------------------------------------------------------------------------ */

/* Queues j (consumed) as a JSON answer with optional X-Error-Code and
 * X-Repo-Commit headers. */
KHUB_INTERNAL MHD_RESULT khub__srv_send_json(struct MHD_Connection *c, unsigned code, cJSON *j,
                                             const char *err_code, const char *commit);
/* Queues j (consumed) as a body of the given Content-Type, no other header. */
KHUB_INTERNAL MHD_RESULT khub__srv_send_typed(struct MHD_Connection *c, unsigned code, cJSON *j,
                                              const char *content_type);
/* Queues {"error": msg} with X-Error-Message, and the optional headers. */
KHUB_INTERNAL MHD_RESULT khub__srv_send_error(struct MHD_Connection *c, unsigned code,
                                              const char *err_code, const char *commit,
                                              const char *msg);
/* Percent-decodes s in place; returns 0 on a bad escape or an embedded NUL. */
KHUB_INTERNAL int khub__srv_pct_decode(char *s);
/* Opens rel (a safe relative path, khub__path_is_safe) below dir without
 * following a symlink at any of its components, and stats it into sb: the
 * fd, or -1 when rel is unsafe, missing or passes through a link. A served
 * file or folder is reached only this way: "symlinks in DIR are ignored"
 * holds for the folders on the way too. khub__srv_stat_in: the same, 0 or
 * -1, closing the fd. */
KHUB_INTERNAL int khub__srv_open_in(const char *dir, const char *rel, struct stat *sb);
KHUB_INTERNAL int khub__srv_stat_in(const char *dir, const char *rel, struct stat *sb);
/* "http://<Host header>" (or 127.0.0.1 when absent or odd) into buf. */
KHUB_INTERNAL void khub__srv_self_url(struct MHD_Connection *c, char *buf, size_t size);
/* Whether the request carries "Authorization: Bearer <the server's token>"
 * (always when the server has none); constant-time. */
KHUB_INTERNAL int khub__srv_write_allowed(const khub__server *s, struct MHD_Connection *c);
/* Checks of request bodies: an oid is 64 lowercase hex. */
KHUB_INTERNAL int khub__srv_is_sha256_lower(const char *s);
/* A JSON number that is a whole byte count in [0, max]. */
KHUB_INTERNAL int khub__srv_json_size(const cJSON *v, uint64_t max, uint64_t *out);

/* ------------------------------------------------------------------------ */
/* Faults (server_faults.c)                                                 */
/* ------------------------------------------------------------------------ */

/* Sets s->faults and the budgets from "name[=N],..."; INVALID_ARG names
 * the unknown fault and lists the known ones. */
KHUB_INTERNAL khub_status khub__srv_parse_faults(khub__server *s, const char *list);
/* Answers with an injected 503 or 429 while their budgets last: 1 and *ret
 * set when it did, 0 when the request goes on. */
KHUB_INTERNAL int khub__srv_fault_reply(khub__server *s, struct MHD_Connection *c, MHD_RESULT *ret);
/* Whether a fault reshapes GET bodies (extra-bytes, wrong-hash, short-body,
 * drop-body). */
KHUB_INTERNAL int khub__srv_body_faults(const khub__server *s);
/* A response streaming the bytes [off, off + len) of fd, reshaped by the
 * body faults (drop-body spends its budget). Owns fd from the call on.
 * NULL on failure, with *why the reason to answer. */
KHUB_INTERNAL struct MHD_Response *khub__srv_fault_body(khub__server *s, int fd, uint64_t off,
                                                        uint64_t len, const char **why);

/* ------------------------------------------------------------------------ */
/* A set of paths (server_path_set.c)                                       */
/* ------------------------------------------------------------------------ */

/* Paths, each with a value (never NULL); zero-initialised is empty. The
 * strings are borrowed: each must stay alive while it is in the set.
 * Lookups compare bytes (case counts). */
typedef struct path_set {
    struct path_slot *slot;
    size_t cap, n; /* slots (0 or a power of two), paths held */
} path_set;

/* 1 when path is added with value, 0 when it was there (its value kept),
 * -1 out of memory (the set unchanged). */
KHUB_INTERNAL int khub__srv_path_set_add(path_set *s, const char *path, void *value);
/* path's value; NULL when path is not in the set. */
KHUB_INTERNAL void *khub__srv_path_set_get(const path_set *s, const char *path);
/* Removes path: its value, or NULL when it was not in the set. */
KHUB_INTERNAL void *khub__srv_path_set_take(path_set *s, const char *path);
/* Frees the slots; the set is empty again (the strings are the caller's). */
KHUB_INTERNAL void khub__srv_path_set_free(path_set *s);
/* The slot hash: keyed by a random key of this process (tests look at how
 * it spreads paths chosen to collide without the key). */
KHUB_INTERNAL size_t khub__srv_path_hash(const char *path);

/* ------------------------------------------------------------------------ */
/* Digest cache (server_digest.c)                                           */
/* ------------------------------------------------------------------------ */

typedef struct file_ids {
    char sha1[41];   /* git blob id of what git stores: content or LFS pointer */
    char sha256[65]; /* of the content */
    size_t pointer_size;
} file_ids;

/* NULL when out of memory; free with khub__srv_digest_cache_free (NULL ok). */
KHUB_INTERNAL struct digest_cache *khub__srv_digest_cache_new(void);
KHUB_INTERNAL void khub__srv_digest_cache_free(struct digest_cache *dc);
/* The digests of path (lfs: sha1 is that of the LFS pointer), from the
 * cache when its fingerprint is unchanged; 0 when it cannot be hashed. */
KHUB_INTERNAL int khub__srv_file_ids_of(struct digest_cache *dc, const char *path, int lfs,
                                        file_ids *ids);
/* The same for the open regular file fd, named path (the cache's key): its
 * fingerprint and bytes, not whatever path names now (fd stays open, its
 * offset unmoved); 0 when it cannot be hashed. */
KHUB_INTERNAL int khub__srv_file_ids_of_fd(struct digest_cache *dc, const char *path, int fd,
                                           int lfs, file_ids *ids);
/* The digests one request computed, by file (server_digest.c: why);
 * zero-initialised is empty, khub__srv_ids_memo_free ends it. */
typedef struct ids_memo {
    path_set by_key;            /* "dev:ino:size:mtime:ctime:lfs" -> its entry */
    struct ids_memo_entry *all; /* owned, a list */
} ids_memo;

/* khub__srv_file_ids_of_fd for fd (its fstat in sb), from m when this
 * request hashed the same file (device, inode, size, mtime, ctime) with the
 * same lfs already; remembered in m after a hash. 0 when it cannot be
 * hashed. */
KHUB_INTERNAL int khub__srv_file_ids_memo(struct digest_cache *dc, ids_memo *m, const char *path,
                                          int fd, const struct stat *sb, int lfs, file_ids *ids);
KHUB_INTERNAL void khub__srv_ids_memo_free(ids_memo *m);
/* How many files this process has hashed (a count for tests). */
KHUB_INTERNAL uint64_t khub__srv_digest_hashed(void);

/* ------------------------------------------------------------------------ */
/* The repos folder on disk (server_store.c)                                */
/* ------------------------------------------------------------------------ */

/* The log entry of the last commit asked about (khub__srv_commit_log). */
typedef struct repo_memo {
    char commit[41];
    cJSON *log;
    path_set lfs_at; /* the log's "lfs" marks by path (its first of each) */
    int indexed;     /* lfs_at is whole (0: out of memory, look up by walking) */
} repo_memo;

typedef struct repo {
    char org[KHUB_HUB_NAME_MAX + 1], name[KHUB_HUB_NAME_MAX + 1];
    char root[KHUB__PATH_MAX]; /* <dir>/<org>/<name> */
    cJSON *refs;
    struct digest_cache *dc; /* the server's, borrowed */
    repo_memo *memo;         /* owned; changes under a const repo */
} repo;

/* A regular file of at most max bytes, NUL-terminated (caller frees);
 * NULL when absent, not regular, too large or unreadable. */
KHUB_INTERNAL char *khub__srv_read_file(const char *path, size_t *n_out, size_t max);
/* Opens <dir>/<org>/<name> and parses its refs.json; 0 for an invalid name
 * or a missing repo. Call khub__srv_repo_close either way. */
KHUB_INTERNAL int khub__srv_repo_open(const khub__server *s, const char *org, const char *name,
                                      repo *r);
KHUB_INTERNAL void khub__srv_repo_close(repo *r);
/* Whether the repo is served as type ("kernel" or "model"): refs.json's
 * optional "type" names the only type it is served as (a legacy kernel
 * published as a model repo: "model"); without one, both. */
KHUB_INTERNAL int khub__srv_repo_is_type(const repo *r, const char *type);
/* Branch, tag, or an existing commit directory; 0 when unknown. */
KHUB_INTERNAL int khub__srv_repo_resolve(const repo *r, const char *rev, char commit[41]);
/* Whether path's base name matches the repo's LFS globs (or the defaults). */
KHUB_INTERNAL int khub__srv_repo_is_lfs(const repo *r, const char *path);
/* Whether path is an LFS file at commit: the globs, or stored through LFS
 * (an lfsFile operation) as the commit's log records. */
KHUB_INTERNAL int khub__srv_is_lfs_at(const repo *r, const char *commit, const char *path);
/* log/<commit>.json (borrowed until the next call or repo_close), NULL
 * when the server did not make that commit. */
KHUB_INTERNAL const cJSON *khub__srv_commit_log(const repo *r, const char *commit);
/* <root>/commits/<commit> into buf ("" when it does not fit). */
KHUB_INTERNAL void khub__srv_commit_dir(const repo *r, const char *commit, char *buf, size_t size);
/* fsync of a file or directory by name. */
KHUB_INTERNAL int khub__srv_fsync_path(const char *path);
/* Writes data to path via a temp file in the same directory, fsync, rename. */
KHUB_INTERNAL int khub__srv_write_atomic(const char *path, const void *data, size_t n);
/* mkdir -p of root/rel_dir (root must exist); 0 when a file is in the way. */
KHUB_INTERNAL int khub__srv_mkdirs_under(const char *root, const char *rel_dir);
/* Replaces refs.json with r->refs. */
KHUB_INTERNAL int khub__srv_refs_save(const repo *r);
/* The "branches" or "tags" object of r->refs, made when absent or not an object. */
KHUB_INTERNAL cJSON *khub__srv_refs_table(const repo *r, const char *kind);
KHUB_INTERNAL void khub__srv_refs_set(const repo *r, const char *kind, const char *name,
                                      const char *commit);
/* The commit of branch (borrowed from r->refs), NULL when there is none. */
KHUB_INTERNAL const char *khub__srv_branch_head(const repo *r, const char *branch);
/* n_bytes (at most 64) random bytes as 2 * n_bytes hex digits and a NUL. */
KHUB_INTERNAL void khub__srv_random_hex(char *out, size_t n_bytes);
/* A fresh 40-hex commit id from the parent (NULL: none) and the summary. */
KHUB_INTERNAL void khub__srv_new_commit_id(const char *parent, const char *summary, char id[41]);

/* ------------------------------------------------------------------------ */
/* Endpoints                                                                */
/* ------------------------------------------------------------------------ */

/* Account and listing endpoints (server_hf.c): 1 and *ret set when seg is
 * one of them (organizations/{org}/overview, whoami-v2, models, kernels). */
KHUB_INTERNAL int khub__srv_route_hub(khub__server *s, struct MHD_Connection *c, char **seg, int n,
                                      MHD_RESULT *ret);
/* 0 and *ret set (401) when the request carries a token the server does
 * not accept; 1 when it goes on (no token, or an accepted one). */
KHUB_INTERNAL int khub__srv_read_auth(khub__server *s, struct MHD_Connection *c, MHD_RESULT *ret);
/* GET .../commits/{rev}: the history from log/ (server_hf.c). */
KHUB_INTERNAL MHD_RESULT khub__srv_api_commits(struct MHD_Connection *c, const repo *r,
                                               const char *commit);
/* GET and HEAD of the decoded segments seg[0..n) of url (server_read.c). */
KHUB_INTERNAL MHD_RESULT khub__srv_route_read(khub__server *s, struct MHD_Connection *c,
                                              const char *url, int head, char **seg, int n);
/* POST /api/{t}/{org}/{name}/paths-info/{rev}: a read (server_read.c). */
KHUB_INTERNAL int khub__srv_is_paths_info(char **seg, int n);
KHUB_INTERNAL MHD_RESULT khub__srv_route_paths_info(khub__server *s, struct MHD_Connection *c,
                                                    char **seg, conn *k);
/* POST, PUT and DELETE; the caller holds s->write_lock (server_write.c). */
KHUB_INTERNAL MHD_RESULT khub__srv_route_write(khub__server *s, struct MHD_Connection *c,
                                               const char *method, char **seg, int n, conn *k);
/* POST .../commit/{branch} (server_commit.c). */
KHUB_INTERNAL MHD_RESULT khub__srv_api_commit(khub__server *s, struct MHD_Connection *c, repo *r,
                                              const char *branch, const char *api_type, conn *k);
/* LFS (server_lfs.c): the batch call, verify, and the three stages of the
 * capability PUT (headers, each body chunk, the end of the body). */
KHUB_INTERNAL MHD_RESULT khub__srv_api_lfs_batch(khub__server *s, struct MHD_Connection *c,
                                                 const repo *r, conn *k);
KHUB_INTERNAL MHD_RESULT khub__srv_api_lfs_verify(struct MHD_Connection *c, const repo *r, conn *k);
KHUB_INTERNAL void khub__srv_put_begin(khub__server *s, conn *k, char **seg, int n);
KHUB_INTERNAL void khub__srv_put_data(conn *k, const char *data, size_t n);
KHUB_INTERNAL MHD_RESULT khub__srv_put_end(struct MHD_Connection *c, conn *k);

#endif /* KHUB_HUB_SERVER_IMPL_H */
