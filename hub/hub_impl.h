/*
 * hub_impl.h: what the files of hub/ share: the khub_hub handle, the cache
 * layout helpers (cache.c), the HTTP exchange (http.c), tree listings
 * (client.c) and the archive unpacker (archive.c). Nothing outside hub/ and
 * tests includes it.
 */
#ifndef KHUB_HUB_IMPL_H
#define KHUB_HUB_IMPL_H

#include <stdint.h>

#include "internal.h"
#include "khub/khub_hub.h"

#define KHUB__PATH_MAX 4096

/* Download limits (docs/hub-server.md, "Client limits"): a transfer slower
 * than KHUB_DOWNLOAD_MIN_RATE bytes/s over HF_HUB_DOWNLOAD_TIMEOUT seconds
 * is cut, and a file announced over KHUB_MAX_DOWNLOAD_SIZE is refused
 * before its GET (the Hub itself stores no file over 50 GB). */
#define KHUB__MIN_RATE_DEFAULT     1024ull
#define KHUB__MAX_DOWNLOAD_DEFAULT (64ull << 30)

/* snprintf into an array; true when it fit (so no silent truncation). */
#define KHUB__PATHF(buf, ...) (snprintf((buf), sizeof(buf), __VA_ARGS__) < (int)sizeof(buf))

struct khub_hub {
    char *endpoint;  /* no trailing '/' */
    char *cache_dir; /* cache root */
    char *token;     /* NULL = send none */
    int offline;
    uint32_t repo_type;
    int max_tries, backoff_ms, timeout_s, max_retry_after_s;
    uint64_t min_rate;     /* bytes/s a transfer must keep up (KHUB_DOWNLOAD_MIN_RATE) */
    uint64_t max_download; /* largest file size accepted (KHUB_MAX_DOWNLOAD_SIZE) */
    char user_agent[256];  /* khub/<version>[; origin/<HF_HUB_USER_AGENT_ORIGIN>] */
    void *curl;            /* the CURL easy handle, kept for its connections (http.c) */
    uint64_t n_requests;
    khub_hub_progress_fn progress;
    void *progress_ud;
    /* Log callback and level, and the allocator while set
     * (khub_hub_set_runtime); borrowed, NULL = stderr and alloc. */
    const khub_runtime *rt;
    khub_allocator alloc; /* khub_hub_opts.allocator (realloc NULL = the C library's) */
    int err_set;
    char errmsg[KHUB_ERROR_SIZE];
    /* Files this handle itself hashed while writing them (a download, an
     * unpacked archive), as "<sha256> <dev> <ino> <size> <mtime_ns>
     * <ctime_ns>", newest at n_fresh % 8: the variant check that follows
     * trusts these instead of hashing the same bytes again (variant.c). */
    char fresh[8][160];
    unsigned n_fresh;
    /* "org/name" of repos this handle found to be model repos (legacy
     * kernels, issue 4 item 2): with repo_type KERNEL a request answered
     * RepoNotFound is tried once more as a model repo, and on success the
     * repo stays a model repo for this handle (newest at n_legacy % 8).
     * fallback_msg keeps the kernel-side message meanwhile. */
    char legacy[8][2 * KHUB_HUB_NAME_MAX + 2];
    unsigned n_legacy;
    char fallback_msg[KHUB_ERROR_SIZE];
};

/* khub_hub_opts up to its last 0.1 field: the smallest struct accepted. */
#define KHUB__HUB_OPTS_0_1 (offsetof(khub_hub_opts, max_retry_after_s) + sizeof(int32_t))

/* The allocator of the hub's memory (hub.c): the attached runtime's
 * (khub_hub_set_runtime), else khub_hub_opts.allocator; NULL for a NULL hub
 * (the C library's). Every block the hub allocates comes from this through
 * khub__mem_* (runtime/base/mem_block.c) and is freed with khub__mem_free,
 * which returns it to the allocator it came from. */
KHUB_INTERNAL const khub_allocator *khub__hub_alloc(const khub_hub *hub);

/* huggingface_hub's truthy values for a variable: 1, ON, YES, TRUE (any
 * case); unset or anything else is false. */
KHUB_INTERNAL bool khub__env_truthy(const char *name);

/* hf_env.c: a path variable as huggingface_hub reads it (expanduser, then
 * expandvars) into out: 0 when unset or empty, 1 when set, -1 when the
 * expansion does not fit in size. */
KHUB_INTERNAL int khub__env_path(const char *name, char *out, size_t size);
/* os.path.expandvars(os.path.expanduser(in)) into out; 0 when too long. */
KHUB_INTERNAL int khub__expand_path(const char *in, char *out, size_t size);
/* HF_HUB_OFFLINE when set and not empty, else TRANSFORMERS_OFFLINE. */
KHUB_INTERNAL bool khub__env_offline(void);

/* Notes that path (a regular file) holds bytes whose SHA-256 this handle
 * just computed itself (hub->fresh); silently nothing when path cannot be
 * stat'ed. khub__hub_is_fresh: whether path, unchanged since, was noted with
 * sha256. Both in variant.c. */
KHUB_INTERNAL void khub__hub_note_fresh(khub_hub *hub, const char *path, const char *sha256);
KHUB_INTERNAL bool khub__hub_is_fresh(const khub_hub *hub, const char *path, const char *sha256);

/* ------------------------------------------------------------------------ */
/* A variant verified from one read of its metadata.json (variant.c)         */
/* ------------------------------------------------------------------------ */

/* The trust decision on a variant (runtime/kernels/kernel_load.c: lock and signature
 * policy), passed with the one call that needs it, never kept on the
 * handle (a handle may serve another caller next). fn sees the exact bytes
 * of metadata.json and of metadata.json.sig (sig NULL when there is none)
 * before anything parses them; dir is where they were read (a staging
 * folder while an archive is unpacked). It returns OK or the refusal, with
 * its message wherever its caller keeps messages. */
struct khub_kmeta;

struct khub__dir_list;

typedef struct khub__variant_judge {
    /* listed (may be NULL): dir's names, listed once when the verification
     * began, for a check of names (dir_list.h) */
    khub_status (*fn)(void *ud, const char *dir, const struct khub__dir_list *listed,
                      const char *meta, size_t meta_len, const char *sig, size_t sig_len);
    void *ud;
    /* Optional (NULL: none): runs once on the parse of the judged bytes,
     * before any file is checked against it (a locked load compares that
     * table with the lock there); a refusal is the judge's. */
    khub_status (*table)(void *ud, const struct khub_kmeta *km);
    /* Optional: the file that pins the table's digests ("khub.lock") once
     * table accepted it; a file that does not match is then LOCK_MISMATCH
     * naming it, not DIGEST_MISMATCH. */
    const char *pinned_by;
} khub__variant_judge;

/* A verified variant: metadata.json read once (meta), judged, parsed once
 * (km, from exactly those bytes), and every file checked against km
 * (files; their sha256 fields are km's digests). What gets loaded is then
 * checked against km, never against a second read. */
typedef struct khub__variant {
    khub_hub_file_list *files; /* owned */
    struct khub_kmeta *km;     /* owned */
    char *meta, *sig;          /* owned; sig NULL when unsigned */
    size_t meta_len, sig_len;
    char *repo_dir; /* owned: the cache's repo folder the variant was verified in (its
                       kernels-- or models-- kind decided once, for the quarantine marker) */
} khub__variant;

/* Verifies a cached variant (download: fetching it first when it is not
 * cached, or cached but not verifying), running judge (may be NULL) once on
 * the bytes that are then parsed. On failure *out is cleared. Statuses as
 * khub_hub_download_variant, or the judge's. */
KHUB_INTERNAL khub_status khub__hub_variant_open(khub_hub *hub, const khub_hub_id *id,
                                                 const char *commit, const char *variant,
                                                 bool download, const khub__variant_judge *judge,
                                                 khub__variant *out);
KHUB_INTERNAL void khub__variant_clear(khub__variant *v);

/* First failure since the last khub__hub_clear wins; also sets
 * khub_last_error(). Returns st. */
KHUB_INTERNAL khub_status khub__hub_fail(khub_hub *hub, khub_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
KHUB_INTERNAL void khub__hub_clear(khub_hub *hub);

/* Whether hub reaches id as a model repo: repo_type MODEL; or, with
 * KERNEL, a repo this handle found to be a model repo, or one the cache
 * holds only as models--org--name (so a cached legacy repo costs no
 * request). id NULL: the handle's own type. */
KHUB_INTERNAL bool khub__repo_is_model(const khub_hub *hub, const khub_hub_id *id);
/* "kernels" or "models" (API path, cache folder prefix), "kernels/" or ""
 * (file URL prefix), by khub__repo_is_model. */
KHUB_INTERNAL const char *khub__repo_api_type(const khub_hub *hub, const khub_hub_id *id);
KHUB_INTERNAL const char *khub__repo_url_prefix(const khub_hub *hub, const khub_hub_id *id);
/* The model-type fallback around one operation on id:
 *     st = op(hub, id, ...);
 *     if (khub__repo_fallback_begin(hub, id, st))
 *         st = khub__repo_fallback_end(hub, id, op(hub, id, ...));
 * begin: when st is REPO_NOT_FOUND for a kernel repo and hub may fall
 * back, marks id a model repo, keeps and clears the message, returns true.
 * end: a second REPO_NOT_FOUND unmarks id and reports both; any other
 * status is returned as it is. */
KHUB_INTERNAL bool khub__repo_fallback_begin(khub_hub *hub, const khub_hub_id *id, khub_status st);
KHUB_INTERNAL khub_status khub__repo_fallback_end(khub_hub *hub, const khub_hub_id *id,
                                                  khub_status st);

/* ------------------------------------------------------------------------ */
/* Cache (cache.c)                                                          */
/* ------------------------------------------------------------------------ */

/* The default cache root from the environment (KHUB_CACHE, HF_HUB_CACHE,
 * HUGGINGFACE_HUB_CACHE, HF_HOME/hub, XDG_CACHE_HOME/huggingface/hub,
 * ~/.cache/huggingface/hub). Caller frees. */
KHUB_INTERNAL khub_status khub__cache_default_dir(khub_hub *hub, char **out);
/* "kernels--org--name" into buf. */
KHUB_INTERNAL khub_status khub__cache_repo_folder(khub_hub *hub, const khub_hub_id *id, char *buf,
                                                  size_t size);
/* <cache>/<repo folder> into buf. */
KHUB_INTERNAL khub_status khub__cache_repo_dir(khub_hub *hub, const khub_hub_id *id, char *buf,
                                               size_t size);
/* True for a repo-relative path that is safe to join: not empty, not
 * absolute, no drive letter, no backslash, no control character, no empty,
 * "." or ".." segment. */
KHUB_PRIVATE_API bool khub__path_is_safe(const char *rel);
KHUB_PRIVATE_API bool khub__is_commit_hex(const char *s);
/* mkdir -p (mode 0755). */
KHUB_INTERNAL khub_status khub__mkdirs(khub_hub *hub, const char *path);
/* Writes data to path through a unique temp file, fsync and rename. */
KHUB_INTERNAL khub_status khub__atomic_write(khub_hub *hub, const char *path, const void *data,
                                             size_t n);
/* refs/<rev> holds exactly 40 hex digits without a newline. */
KHUB_INTERNAL khub_status khub__cache_read_ref(khub_hub *hub, const char *repo_dir, const char *rev,
                                               char commit[41]);
KHUB_INTERNAL khub_status khub__cache_write_ref(khub_hub *hub, const char *repo_dir,
                                                const char *rev, const char *commit);
/* Writes CACHEDIR.TAG at the cache root if it is missing. */
KHUB_INTERNAL void khub__cache_tag(khub_hub *hub);

/* A per-blob lock: .locks/<repo folder>/<etag>.lock, flock'ed exclusively.
 * Blocks until it is ours. */
KHUB_INTERNAL khub_status khub__cache_lock(khub_hub *hub, const char *folder, const char *etag,
                                           int *fd_out);
KHUB_INTERNAL void khub__cache_unlock(int fd);
/* Creates blobs/<etag>.<8 hex>.incomplete (O_EXCL); with the blob lock held,
 * an orphan left by a killed process is adopted (renamed to the new name,
 * its bytes kept for a Range resume; the final hash check guards it) and
 * any other orphans are removed. */
KHUB_INTERNAL khub_status khub__cache_blob_tmp(khub_hub *hub, const char *repo_dir,
                                               const char *etag, char *tmp, size_t size,
                                               int *fd_out, uint64_t *have);
/* fsync(fd), chmod to 0666 & ~umask, rename tmp to blobs/<etag>, fsync the
 * directory. Closes fd. */
KHUB_INTERNAL khub_status khub__cache_publish_blob(khub_hub *hub, int fd, const char *tmp,
                                                   const char *blob);
/* snapshots/<commit>/<rel> -> ../../(...)blobs/<etag>, replaced atomically;
 * with HF_HUB_DISABLE_SYMLINKS a regular file (hard link, else copy). */
/* .no_exist/<commit>/<rel>, huggingface_hub's marker of a file that a
 * commit does not have: written after a 404 EntryNotFound (best effort),
 * and consulted before any request for that file. */
KHUB_INTERNAL void khub__cache_mark_absent(khub_hub *hub, const char *repo_dir, const char *commit,
                                           const char *rel);
KHUB_INTERNAL bool khub__cache_is_absent(const char *repo_dir, const char *commit, const char *rel);
KHUB_INTERNAL khub_status khub__cache_link(khub_hub *hub, const char *repo_dir, const char *commit,
                                           const char *rel, const char *etag);
/* A fresh name "<repo_dir>/.khub-tmp/<pid>.<8hex>" (the folder is made, the
 * name is not): the one place temporary names live (issue 10 item 7). A
 * snapshot link or an unpacked archive is built there and renamed into
 * place, so no folder a verifier reads ever holds a temporary name, and a
 * process killed mid-way leaves its debris where nothing reads it. */
#define KHUB__TMP_DIR     ".khub-tmp"
#define KHUB__TMP_STALE_S 900 /* any temporary this old is debris */
KHUB_INTERNAL khub_status khub__cache_tmp_path(khub_hub *hub, const char *repo_dir, char *out,
                                               size_t size);
/* Whether the temporary at path (lstat), called name, is debris: its
 * "<pid>." owner is gone and it is a minute old, or it is older than
 * KHUB__TMP_STALE_S (names without a pid: older khub versions'). */
KHUB_INTERNAL bool khub__cache_tmp_stale(const char *path, const char *name);

/* ------------------------------------------------------------------------ */
/* Tree listings                                                            */
/* ------------------------------------------------------------------------ */

typedef struct khub__tree_entry {
    char *path; /* repo-relative, validated with khub__path_is_safe */
    int is_dir;
    uint64_t size;
    char oid[41];        /* git blob sha1 ("" for directories) */
    char lfs_sha256[65]; /* "" for regular files */
} khub__tree_entry;

typedef struct khub__tree {
    khub__tree_entry *items;
    size_t count, cap;
} khub__tree;

KHUB_INTERNAL void khub__tree_free(khub__tree *t);
/* Lists the tree of the repo at commit under sub ("" = root), following
 * next-page links that stay on the endpoint. For a 40-hex commit the full
 * listing is fetched once and kept in trees/<commit>.json (huggingface_hub's
 * tree cache), which then answers every listing of that commit, offline too;
 * directory entries derived from it have an empty oid. */
KHUB_INTERNAL khub_status khub__list_tree(khub_hub *hub, const khub_hub_id *id, const char *commit,
                                          const char *sub, int recursive, khub__tree *out);
/* Parses one page of a tree listing (a JSON array) and appends it. */
KHUB_INTERNAL khub_status khub__tree_parse(khub_hub *hub, const char *json, size_t n,
                                           khub__tree *t);
/* The answers a hub gives about revisions (n bytes of JSON each, from the
 * server; the fail message goes on hub). khub__refs_resolve: a .../refs
 * answer, picking branch v<version> (version >= 0) or the highest v<N>,
 * else main (version < 0), into rev and commit (client.c).
 * khub__revision_sha: a .../revision/<rev> answer's 40-hex "sha" (client.c).
 * khub__refs_versions: every v<N> branch of a .../refs answer, the newest
 * into *newest (-1: none) and commit; all (may be NULL) gets the N of each
 * in the order listed, up to cap, count in *n_all (kernel_fetch.c). */
KHUB_INTERNAL khub_status khub__refs_resolve(khub_hub *hub, const khub_hub_id *id, const char *json,
                                             size_t n, int32_t version, char *rev, size_t rev_size,
                                             char commit[41]);
KHUB_INTERNAL khub_status khub__revision_sha(khub_hub *hub, const khub_hub_id *id, const char *json,
                                             size_t n, char commit[41]);
KHUB_INTERNAL khub_status khub__refs_versions(khub_hub *hub, const char *what, const char *json,
                                              size_t n, int32_t *newest, char commit[41],
                                              int32_t *all, size_t cap, size_t *n_all);
/* The files of a trees/<commit>.json at path into files; false (files
 * empty) when it is missing or unusable. Logs nothing: khub__list_tree
 * warns about an unusable one through the hub's log. */
KHUB_INTERNAL bool khub__tree_read_cache(const khub_allocator *a, const char *path,
                                         khub__tree *files);
/* trees/<commit>.json in huggingface_hub's format_version 1. */
KHUB_INTERNAL khub_status khub__cache_write_tree(khub_hub *hub, const char *repo_dir,
                                                 const char *commit, const khub__tree *t);

/* ------------------------------------------------------------------------ */
/* HTTP (http.c)                                                            */
/* ------------------------------------------------------------------------ */

typedef struct khub__http_resp {
    long status;
    char repo_commit[41];
    char etag[80]; /* normalised: no W/, no quotes */
    char linked_etag[80];
    int64_t linked_size;    /* -1 = absent */
    int64_t content_length; /* -1 = absent */
    int64_t range_start;    /* from Content-Range of a 206, -1 = absent */
    long retry_after;       /* seconds, -1 = absent */
    long ratelimit_wait;    /* RateLimit "...;r=0;t=T": T + 1 seconds; -1 = absent or r > 0 */
    char location[2048];
    char error_code[64];
    char error_message[256];
    char link_next[2048];
    char final_url[2048];
    char *body; /* NUL-terminated; owned, free with khub__http_resp_free */
    size_t body_len, body_cap;
} khub__http_resp;

/* Receives the body of a 2xx response. start() is called once per response
 * with its status (200 means "from offset 0": the sink truncates), write()
 * returns 0 to abort the transfer. */
typedef struct khub__sink {
    void *ud;
    khub_status (*start)(void *ud, long status, int64_t range_start);
    size_t (*write)(void *ud, const void *data, size_t n);
    uint64_t (*offset)(void *ud); /* bytes held so far: the next Range start */
} khub__sink;

/* blob_sink.c: a download's body into the blob's temp file fd (opened with
 * O_APPEND, holding `have` bytes already), hashed as it arrives (a running
 * digest only when have == 0); large bodies are received, hashed and
 * written on three threads. path names the file in messages. */
typedef struct khub__blob_sink khub__blob_sink;
KHUB_INTERNAL khub_status khub__blob_sink_new(khub_hub *hub, int fd, uint64_t have, uint64_t expect,
                                              const char *path, int git, khub__blob_sink **out);
KHUB_INTERNAL const khub__sink *khub__blob_sink_sink(khub__blob_sink *s);
/* Bytes accepted so far (all in the file once finished). */
KHUB_INTERNAL uint64_t khub__blob_sink_have(const khub__blob_sink *s);
/* Waits until every accepted byte is in the file; the sink's own failure
 * (overflow, write error: message set) or OK. streamed: the running digest
 * of the ETag's kind ("" = none: hash the file); sha256: git blobs' SHA-256
 * ("" = none or not a git blob). */
KHUB_INTERNAL khub_status khub__blob_sink_finish(khub__blob_sink *s, char streamed[65],
                                                 char sha256[65]);
KHUB_INTERNAL void khub__blob_sink_free(khub__blob_sink *s);

typedef struct khub__http_req {
    const char *method; /* "GET" or "HEAD" */
    const char *url;
    int auth;               /* send the token (only to the URL's own host) */
    int follow_absolute;    /* follow absolute redirects (dropping auth across hosts) */
    const khub__sink *sink; /* NULL = buffer the body (up to 16 MiB) */
    const char *what;       /* "resolving org/name@main" for messages */
    /* Added for publishing: a method of "POST", "PUT" or "DELETE" sends a
     * body, from memory or streamed from a file (both borrowed). */
    const void *body; /* NULL = none */
    size_t body_len;
    const char *upload_path;  /* PUT: the file to send, instead of body */
    const char *content_type; /* NULL = no Content-Type header */
    const char *accept;       /* NULL = no Accept header */
    /* Added for the download deadline: the body bytes the caller expects
     * (a file's announced size), 0 = unknown. */
    uint64_t expect_bytes;
} khub__http_req;

/* Seconds to wait for a RateLimit header value (`"api";r=0;t=55` -> 56);
 * -1 when requests remain (r > 0) or it is not understood. */
KHUB_INTERNAL long khub__http_ratelimit_wait(const char *val);
/* Reads one response header line of n bytes (untrusted, not NUL-terminated;
 * the status line or "Name: value") into the fields of r it names. */
KHUB_INTERNAL void khub__http_header(khub__http_resp *r, const char *data, size_t n);

/* Closes the hub's HTTP connections (khub_hub_free). */
KHUB_INTERNAL void khub__http_close(khub_hub *hub);

/* One request with redirects and retries (408, 429, 5xx and transport
 * errors, backoff doubling from hub->backoff_ms, Retry-After honoured up to
 * hub->max_retry_after_s). Relative redirects and same-host ones keep the
 * Authorization header; any other host gets none. Fails with OFFLINE without
 * touching the network when hub is offline. Returns OK for any final HTTP
 * status; the caller maps non-2xx with khub__http_error. */
KHUB_INTERNAL khub_status khub__http_fetch(khub_hub *hub, const khub__http_req *req,
                                           khub__http_resp *resp);
KHUB_INTERNAL void khub__http_resp_free(khub__http_resp *resp);
/* Maps a non-2xx response to a status and message (X-Error-Code first). */
KHUB_INTERNAL khub_status khub__http_error(khub_hub *hub, const khub__http_resp *resp,
                                           const char *what);
/* Percent-encodes s into buf (RFC 3986 unreserved kept; '/' kept when
 * keep_slash). */
KHUB_INTERNAL khub_status khub__url_quote(khub_hub *hub, const char *s, int keep_slash, char *buf,
                                          size_t size);
/* OK when a file announced at size bytes, of which have are on disk, may
 * be downloaded into dir: size at most KHUB_MAX_DOWNLOAD_SIZE (OVERFLOW),
 * size - have no more than the file system has free (IO); what names the
 * file in the message (client.c). */
KHUB_INTERNAL khub_status khub__download_size_ok(khub_hub *hub, const char *dir, uint64_t size,
                                                 uint64_t have, const char *what);
/* True when URLs a and b have the same scheme, host and port (the token
 * may go to b when it may go to a). False for anything unparsable. */
KHUB_INTERNAL bool khub__url_same_origin(const char *a, const char *b);

/* ------------------------------------------------------------------------ */
/* Hashes of content (client.c)                                             */
/* ------------------------------------------------------------------------ */

/* Git blob id: sha1("blob <len>\0" + content), of a file. */
KHUB_PRIVATE_API khub_status khub__git_blob_sha1_file(const char *path, char hex[41]);
KHUB_PRIVATE_API khub_status khub__git_blob_sha1_buf(const void *data, size_t n, char hex[41]);

/* ------------------------------------------------------------------------ */
/* Archives (archive.c)                                                     */
/* ------------------------------------------------------------------------ */

typedef struct khub__unpack_limits {
    uint64_t max_entry_bytes; /* 0 = 1 GiB */
    uint64_t max_total_bytes; /* 0 = 4 GiB */
    uint64_t max_entries;     /* 0 = 100000 */
    uint64_t max_ratio;       /* unpacked/packed, 0 = 200 */
} khub__unpack_limits;

/* Unpacks a .tar.gz (or any libarchive tar) into dest, which must not exist
 * yet; refuses absolute paths, "..", links of any kind leaving dest or
 * hard links, devices, FIFOs, sockets, and entries over the limits. On
 * failure dest is removed. Statuses: UNSAFE_PATH, OVERFLOW, PARSE, IO. */
KHUB_INTERNAL khub_status khub__archive_unpack(khub_hub *hub, const char *archive, const char *dest,
                                               const khub__unpack_limits *lim);
/* rm -rf path (no symlink is followed). */
KHUB_PRIVATE_API void khub__rmtree(const char *path);

#endif /* KHUB_HUB_IMPL_H */
