/*
 * khub_hub.h: the application API of khub's hub client: Hub IDs, revision
 * resolution, downloads into the Hugging Face cache, build variants.
 *
 *     khub_hub *hub = NULL;
 *     khub_hub_id id;
 *     char err[KHUB_ERROR_SIZE];
 *     if (khub_hub_id_parse("kernels-community/flash-attn2@version=1", &id, err, sizeof err))
 *         return fprintf(stderr, "%s\n", err), 1;
 *     if (khub_hub_new(NULL, &hub) != KHUB_STATUS_OK)
 *         return fprintf(stderr, "%s\n", khub_last_error()), 1;
 *     char commit[41];
 *     khub_hub_resolve(hub, &id, commit);                 // branch v1 -> 40 hex
 *     khub_hub_variant_list *vl = NULL;
 *     khub_hub_variants(hub, &id, commit, &vl);           // ranked, with reasons
 *     khub_hub_file_list *files = NULL;
 *     khub_hub_download_variant(hub, &id, commit, vl->best, &files);
 *     for (size_t i = 0; i < files->count; i++)          // verified path + digest
 *         khub_plugin_load(rt, files->items[i].path, files->items[i].sha256, NULL);
 *
 * Configuration follows huggingface_hub: HF_ENDPOINT, HF_TOKEN, HF_TOKEN_PATH,
 * HF_HOME, HF_HUB_CACHE, XDG_CACHE_HOME, HF_HUB_OFFLINE; KHUB_CACHE overrides
 * the cache directory. The cache is huggingface_hub's layout, so the
 * official tools and khub read what the other wrote.
 *
 * Errors: every fallible function returns khub_status; the one-line message
 * is khub_hub_errmsg(hub) (owned by hub, valid until the next call on it)
 * and, for khub_hub_new and khub_hub_id_parse, khub_last_error().
 *
 * Threading: a khub_hub is used by one thread at a time; separate handles
 * (and separate processes) may share one cache: blobs are published by
 * atomic rename under a per-blob lock.
 *
 * Anything not declared in abi/khub/ is not part of khub's API.
 */
#ifndef KHUB_HUB_H
#define KHUB_HUB_H

#include <stddef.h>
#include <stdint.h>

#include "khub.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Hub IDs                                                                  */
/* ------------------------------------------------------------------------ */

/* Limits of the parts of an ID (bytes, without the terminating NUL). */
#define KHUB_HUB_NAME_MAX   96  /* org and name, as huggingface_hub allows */
#define KHUB_HUB_REV_MAX    255 /* branch or tag name */
#define KHUB_HUB_SYMBOL_MAX 127 /* C identifier */

typedef enum khub_hub_rev_kind {
    KHUB_HUB_REV_DEFAULT = 0, /* none given: highest v<N> branch, else main */
    KHUB_HUB_REV_NAME = 1,    /* a branch or tag name */
    KHUB_HUB_REV_COMMIT = 2,  /* 40 lowercase hex digits */
    KHUB_HUB_REV_VERSION = 3  /* version=N: branch v<N> */
} khub_hub_rev_kind;

/* A parsed Hub ID. Plain value; no ownership. */
typedef struct khub_hub_id {
    char org[KHUB_HUB_NAME_MAX + 1];
    char name[KHUB_HUB_NAME_MAX + 1];
    uint32_t rev_kind;                    /* khub_hub_rev_kind */
    int32_t version;                      /* N of version=N, else -1 */
    char revision[KHUB_HUB_REV_MAX + 1];  /* branch, tag or commit; "v<N>" for a version */
    char symbol[KHUB_HUB_SYMBOL_MAX + 1]; /* after ':', "" if none */
} khub_hub_id;

/* Parses "org/name[@REV | @version=N][:symbol]". REV is a branch, a tag or a
 * 40-hex commit; org and name follow huggingface_hub's repo-id rules (1-96 of
 * [A-Za-z0-9._-], first and last alphanumeric or '_', no "--" or "..", no
 * ".git" suffix). On failure returns KHUB_STATUS_BAD_ID and writes
 * "bad Hub ID \"...\": at column C: <reason>" into errbuf and
 * khub_last_error(). Thread-safe. Since 0.1. */
KHUB_API khub_status khub_hub_id_parse(const char *text, khub_hub_id *out, char *errbuf,
                                       size_t errbuf_size);
/* Writes the canonical text of id into buf (KHUB_STATUS_OVERFLOW if short). */
KHUB_API khub_status khub_hub_id_format(const khub_hub_id *id, char *buf, size_t size);
/* Sets version=N (or a revision with version < 0 and rev != NULL) on an ID
 * that has neither; KHUB_STATUS_BAD_ID when it already has one (they are
 * mutually exclusive) or when rev is malformed. Since 0.1. */
KHUB_API khub_status khub_hub_id_set_revision(khub_hub_id *id, const char *rev, int32_t version);

/* ------------------------------------------------------------------------ */
/* The hub handle                                                           */
/* ------------------------------------------------------------------------ */

/* KERNEL: a repo is reached as a kernel repo first; one the Hub answers
 * RepoNotFound for is tried as a model repo (kernels published before the
 * kernel type existed), and a repo the cache holds only as
 * models--org--name is a model repo without asking. MODEL: model repos
 * only. */
typedef enum khub_hub_repo_type {
    KHUB_HUB_REPO_KERNEL = 0, /* /api/kernels/..., cache kernels--org--name; model fallback */
    KHUB_HUB_REPO_MODEL = 1   /* /api/models/..., cache models--org--name */
} khub_hub_repo_type;

typedef struct khub_hub_opts {
    KHUB_STRUCT_HEADER;
    const char *endpoint;      /* NULL = $HF_ENDPOINT, else https://huggingface.co; copied */
    const char *cache_dir;     /* NULL = $KHUB_CACHE, $HF_HUB_CACHE, $HF_HOME/hub, ...; copied */
    const char *token;         /* NULL = $HF_TOKEN, the token file (online); "" = none; copied */
    int32_t offline;           /* -1 = from $HF_HUB_OFFLINE, 0 = online, 1 = no network at all */
    uint32_t repo_type;        /* khub_hub_repo_type */
    int32_t max_tries;         /* per request, 0 = 5 */
    int32_t backoff_ms;        /* first retry wait, doubling up to 8x; 0 = 1000 */
    int32_t timeout_s;         /* connect and stall timeout, 0 = 10 */
    int32_t max_retry_after_s; /* cap on a server's Retry-After, 0 = 60 */
    /* End of 0.1. */
    /* The allocator of the hub's own memory: the handle, its buffers, and
     * the results it returns (lists, reports, locks grown through it).
     * realloc NULL = the C library's. A runtime attached with
     * khub_hub_set_runtime replaces it while attached. Each block remembers
     * the allocator it came from, so results are freed by their own
     * functions whatever is attached then; ud must stay valid until the
     * last of them is freed. libcurl, cJSON, libarchive and OpenSSL keep
     * their own (process-wide) allocators. Added in 0.2. */
    khub_allocator allocator;
} khub_hub_opts;

typedef struct khub_hub khub_hub;

/* Creates a hub client; opts may be NULL. Makes no network connection.
 * Only the first opts->struct_size bytes of opts are read (a 0.1 caller's
 * struct has no allocator field); below 0.1's size is STRUCT_SIZE. On
 * failure *out is NULL and khub_last_error() says why. Since 0.1. */
KHUB_API khub_status khub_hub_new(const khub_hub_opts *opts, khub_hub **out);
/* Frees hub. Accepts NULL. Since 0.1. */
KHUB_API void khub_hub_free(khub_hub *hub);
/* Message of the last failure on hub, "" if none. Owned by hub. */
KHUB_API const char *khub_hub_errmsg(const khub_hub *hub);
/* The cache root in use (owned by hub) and whether hub is offline. */
KHUB_API const char *khub_hub_cache_dir(const khub_hub *hub);
KHUB_API int khub_hub_is_offline(const khub_hub *hub);
/* Number of HTTP requests hub has sent (each try and redirect hop counts). */
KHUB_API uint64_t khub_hub_request_count(const khub_hub *hub);

/* Progress callback for downloads: bytes done and expected (0 = unknown). */
typedef void (*khub_hub_progress_fn)(void *ud, const char *path, uint64_t done, uint64_t total);
KHUB_API void khub_hub_set_progress(khub_hub *hub, khub_hub_progress_fn fn, void *ud);

/* Sends hub's log messages (a refused hub answered from the cached refs, an
 * unusable tree cache, a no-version pin: WARN; retries and the model-repo
 * fallback: INFO) to rt's log callback at rt's KHUB_OPT_LOG_LEVEL, as the
 * runtime's own messages go (khub_log_set), and, since 0.2, makes hub
 * allocate from rt's allocator (khub_runtime_opts.allocator) from now on:
 * memory allocated before keeps the allocator it came from
 * (khub_hub_opts.allocator) and is returned to it. rt is borrowed and must
 * outlive hub or be unset first; NULL, the default, logs to stderr at WARN
 * and above and allocates from khub_hub_opts.allocator. Failures are not
 * logged: they are returned with khub_hub_errmsg. Not thread-safe with
 * other calls on hub. Since 0.1. */
KHUB_API void khub_hub_set_runtime(khub_hub *hub, const khub_runtime *rt);

/* ------------------------------------------------------------------------ */
/* Resolution and downloads                                                 */
/* ------------------------------------------------------------------------ */

/* Resolves id's revision to a 40-hex commit (commit_out holds 41 bytes) and
 * records it in refs/. A commit ID makes no request. Offline, or when the
 * hub is unreachable (transport error, 5xx, RepoNotFound, GatedRepo), the
 * answer comes from refs/; RevisionNotFound never falls back. Statuses:
 * REPO_NOT_FOUND, REVISION_NOT_FOUND, GATED_REPO, UNAUTHORIZED, OFFLINE,
 * NETWORK, HTTP, RATE_LIMITED, PARSE. Since 0.1. */
KHUB_API khub_status khub_hub_resolve(khub_hub *hub, const khub_hub_id *id, char commit_out[41]);

/* Longest path the hub writes into a caller's buffer, NUL included. */
#define KHUB_HUB_PATH_MAX 4096

/* Downloads one file of the repo at commit into the cache (verified against
 * its ETag: SHA-256 for LFS files, git blob SHA-1 for others, before it
 * enters blobs/) and writes its snapshot path into buf (size bytes;
 * KHUB_HUB_PATH_MAX always suffice, a shorter buffer that the path does not
 * fit is OVERFLOW); nothing is allocated for the caller. A file already in
 * the snapshot makes no request. Statuses as khub_hub_resolve plus
 * ENTRY_NOT_FOUND, DIGEST_MISMATCH, UNSAFE_PATH, IO, OVERFLOW. Since 0.2. */
KHUB_API khub_status khub_hub_download_path(khub_hub *hub, const khub_hub_id *id,
                                            const char *commit, const char *path, char *buf,
                                            size_t size);
/* The 0.1 form of khub_hub_download_path: the path in *path_out, which the
 * caller frees with free(). That string alone comes from the C library's
 * allocator whatever hub's allocator is (0.1 callers free it with free());
 * new code uses khub_hub_download_path. Since 0.1. */
KHUB_API khub_status khub_hub_download_file(khub_hub *hub, const khub_hub_id *id,
                                            const char *commit, const char *path, char **path_out);

/* One build variant of a repo, with the verdict on this machine. */
typedef struct khub_hub_variant {
    char name[128];   /* "khub1-cpu-x86_64-linux" */
    int32_t accepted; /* 1 = loadable here */
    int32_t rank;     /* lower is preferred among accepted, -1 if rejected */
    char reason[160]; /* "accept: ..." or "reject: ..." */
} khub_hub_variant;

typedef struct khub_hub_variant_list {
    size_t count;
    khub_hub_variant *items; /* accepted first, by rank, then rejected */
    const char *best;        /* items[0].name if accepted, else NULL */
} khub_hub_variant_list;

/* Lists build/<variant>/ of the repo at commit (offline: from the snapshot
 * and unpacked archives) and judges each against this host. *out is freed
 * with khub_hub_variant_list_free. NO_VARIANT is not returned here: an empty
 * or all-rejected list is a success. Since 0.1. */
KHUB_API khub_status khub_hub_variants(khub_hub *hub, const khub_hub_id *id, const char *commit,
                                       khub_hub_variant_list **out);
KHUB_API void khub_hub_variant_list_free(khub_hub_variant_list *list);

/* One verified file of a downloaded variant. */
typedef struct khub_hub_file {
    char *rel;       /* path inside build/<variant>/ */
    char *path;      /* absolute path of the verified bytes in the cache */
    char sha256[65]; /* hex digest of those bytes, as metadata.json states it */
} khub_hub_file;

typedef struct khub_hub_file_list {
    size_t count;
    khub_hub_file *items;
    char dir[4096]; /* the variant's directory */
} khub_hub_file_list;

/* Downloads build/<variant>/ (one archive request, build/<variant>.tar.gz,
 * when the repo has one; else file by file), then verifies it: see
 * khub_hub_variant_files. Since 0.1. */
KHUB_API khub_status khub_hub_download_variant(khub_hub *hub, const khub_hub_id *id,
                                               const char *commit, const char *variant,
                                               khub_hub_file_list **out);
/* Verifies an already cached variant without the network: every file is
 * listed in metadata.json's digest table and matches it, and every listed
 * file is present. *out lists the files with their verified paths and
 * digests (what the loader may open). Statuses: NOT_FOUND (not cached),
 * METADATA_INVALID, DIGEST_MISMATCH, UNSAFE_PATH, IO. Since 0.1. */
KHUB_API khub_status khub_hub_variant_files(khub_hub *hub, const khub_hub_id *id,
                                            const char *commit, const char *variant,
                                            khub_hub_file_list **out);
KHUB_API void khub_hub_file_list_free(khub_hub_file_list *list);

#ifdef __cplusplus
}
#endif

#endif /* KHUB_HUB_H */
