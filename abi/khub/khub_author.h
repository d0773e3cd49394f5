/*
 * khub_author.h: the kernel author's API, in its own library (link
 * -lkhub_author -lkhub): scaffold a kernel source tree from a template
 * (`khub init`), build its variants (`khub build`), make a signing key
 * (`khub keygen`), sign a build (`khub sign`) and publish it to a hub
 * (`khub publish`). An application that only loads kernels links libkhub
 * alone and carries none of this (no compiler driver, no NVRTC, no
 * templates).
 *
 *     khub_author_init_opts io = {KHUB_APP_INIT(khub_author_init_opts),
 *                                 .repo = "acme/rmsnorm", .kind = "norm"};
 *     char err[KHUB_ERROR_SIZE];
 *     if (khub_author_init(&io, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
 *     khub_author_build_result br = {KHUB_APP_INIT(khub_author_build_result)};
 *     if (khub_author_build("rmsnorm", NULL, &br, err, sizeof err)) return 1;
 *     khub_author_key kp = {KHUB_APP_INIT(khub_author_key)};
 *     khub_author_key_generate("me.key", "me.pub", &kp, err, sizeof err);
 *     khub_author_sign_build("me.key", "rmsnorm", NULL, NULL, err, sizeof err);
 *     khub_hub_new(NULL, &hub);                           // endpoint and token
 *     khub_author_publish_opts po = {KHUB_APP_INIT(khub_author_publish_opts), .dir = "rmsnorm"};
 *     khub_author_publish_result pr = {KHUB_APP_INIT(khub_author_publish_result)};
 *     khub_author_publish(hub, &po, &pr);
 *
 * docs/kernel-format.md describes kernel.json, DIR/build/ and the
 * signature files these functions read and write.
 *
 * Errors: every fallible function returns khub_status; the one-line message
 * (what failed, on what, what to do) goes into the caller's errbuf (may be
 * NULL; KHUB_ERROR_SIZE bytes always hold it) and khub_last_error(), except
 * khub_author_publish, whose message is khub_hub_errmsg(hub) and
 * khub_last_error() (its refused arguments' too, since 0.2: they were in
 * khub_last_error() only). A NULL struct is MISUSE; a struct whose
 * struct_size is below its 0.1 layout is STRUCT_SIZE ("WHO: NAME.struct_size
 * S is smaller than 0.1's MIN"; MISUSE before 0.2), as in the rest of the
 * app API. Nothing here prints: progress and the files written come through
 * callbacks.
 *
 * Threading: the functions keep no state between calls; calls on different
 * directories may run on different threads (a build runs compilers as child
 * processes). Anything not declared in abi/khub/ is not part of khub's API.
 */
#ifndef KHUB_AUTHOR_H
#define KHUB_AUTHOR_H

#include <stddef.h>
#include <stdint.h>

#include "khub.h"
#include "khub_hub.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A line of progress ("cc  rmsnorm-avx2.so [avx2]") or the path of a file
 * just written; the string is valid for the call only. */
typedef void (*khub_author_line_fn)(void *ud, const char *line);

/* ------------------------------------------------------------------------ */
/* Templates (`khub init`)                                                  */
/* ------------------------------------------------------------------------ */

/* One template: a plain but correct kernel of one op kind that builds,
 * passes the ABI gate and its self-test against khub/ref-cpu as written. */
typedef struct khub_author_template {
    KHUB_STRUCT_HEADER;
    const char *kind; /* kernel.json's op kind: "attention", "norm", ... (static storage) */
    const char *op;   /* the op's name in kernel.json and the plugin (static storage) */
    int32_t cuda;     /* 1 = also a CUDA template (PTX by NVRTC plus host glue) */
    /* End of 0.1. */
} khub_author_template;

/* The number of templates. Thread-safe. Since 0.1. */
KHUB_API size_t khub_author_template_count(void);
/* Template i (0-based, in the order `khub init --help` lists them) into out
 * (struct_size set by the caller). INVALID_ARG when i is out of range.
 * Thread-safe. Since 0.1. */
KHUB_API khub_status khub_author_template_at(size_t i, khub_author_template *out);

/* Backends of a scaffold (bits of khub_author_init_opts.backends). */
#define KHUB_AUTHOR_BACKEND_CPU  1u
#define KHUB_AUTHOR_BACKEND_CUDA 2u

typedef struct khub_author_init_opts {
    KHUB_STRUCT_HEADER;
    const char *repo;  /* "org/name" (borrowed) */
    const char *kind;  /* a template's kind (borrowed) */
    uint32_t backends; /* KHUB_AUTHOR_BACKEND_* bits, 0 = CPU */
    uint32_t reserved;
    const char *dir; /* the tree to create, must not exist; NULL = ./<name> */
    /* Called with each file's path right after it is written, or NULL. */
    khub_author_line_fn on_file;
    void *on_file_ud;
    /* End of 0.1. */
} khub_author_init_opts;

/* Writes a kernel source tree: kernel.json, .gitignore (build/), NAME.c with
 * CPU backend (generic and AVX2 levels), NAME.cu and NAME_cuda.c with CUDA.
 * Statuses: INVALID_ARG (repo not org/name, no backend), NOT_FOUND (no
 * template for kind; the message lists the kinds), UNSUPPORTED (CUDA asked
 * for a kind with a CPU template only; names the kinds that have one),
 * EXISTS (dir exists), IO (a file cannot be created or written; files
 * already written stay). Since 0.1. */
KHUB_API khub_status khub_author_init(const khub_author_init_opts *opts, char *errbuf,
                                      size_t errbuf_size);

/* ------------------------------------------------------------------------ */
/* Building (`khub build`)                                                  */
/* ------------------------------------------------------------------------ */

/* What kernel.json says, in short. */
typedef struct khub_author_manifest {
    KHUB_STRUCT_HEADER;
    char repo[200];       /* "org/name" */
    char version[32];     /* the plugin's semantic version */
    int32_t major;        /* published to branch v<major> */
    int32_t target_minor; /* plugin ABI minor built for (abi.target_minor) */
    uint32_t n_ops;       /* ops the plugin registers */
    uint32_t n_levels;    /* CPU levels, one .so each */
    uint32_t n_cuda_ccs;  /* CUDA compute capabilities, 0 = no CUDA variant */
    /* End of 0.1. */
} khub_author_manifest;

/* Reads and checks DIR/kernel.json. NOT_FOUND (no kernel.json), PARSE (the
 * message names the field). Since 0.1. */
KHUB_API khub_status khub_author_manifest_read(const char *dir, khub_author_manifest *out,
                                               char *errbuf, size_t errbuf_size);

typedef struct khub_author_build_opts {
    KHUB_STRUCT_HEADER;
    const char *cc;               /* C compiler; NULL = $CC, else "cc" (borrowed) */
    const char *include_dir;      /* the folder holding khub/khub_plugin.h; NULL = found */
    khub_author_line_fn progress; /* one line per step, or NULL */
    void *progress_ud;
    /* End of 0.1. */
} khub_author_build_opts;

#define KHUB_AUTHOR_MAX_VARIANTS 4

typedef struct khub_author_build_result {
    KHUB_STRUCT_HEADER;
    uint32_t n_variants;
    char variants[KHUB_AUTHOR_MAX_VARIANTS][96]; /* built: "khub1-cpu-x86_64-linux", ... */
    char skipped[512]; /* why a declared variant was skipped (no NVRTC), "" if none */
    /* End of 0.1. */
} khub_author_build_result;

/* Builds every variant of DIR/kernel.json into DIR/build/<variant>/ (one
 * .so per CPU level; CUDA host glue plus PTX per capability from NVRTC,
 * opened at run time, skipped with the reason in res->skipped without it),
 * gates every .so, writes each variant's metadata.json (SHA-256 per file,
 * provenance) and packs DIR/build/<variant>.tar.gz. opts may be NULL.
 * Statuses: those of khub_author_manifest_read, NOT_FOUND (khub/khub_plugin.h
 * not found: set include_dir or KHUB_INCLUDE_DIR), ERROR (a compiler failed;
 * the message holds its first lines), the ABI gate's (a .so needs too new a
 * glibc, ...), IO. Since 0.1. */
KHUB_API khub_status khub_author_build(const char *dir, const khub_author_build_opts *opts,
                                       khub_author_build_result *res, char *errbuf,
                                       size_t errbuf_size);

/* ------------------------------------------------------------------------ */
/* Keys and signatures (`khub keygen`, `khub sign`)                         */
/* ------------------------------------------------------------------------ */

typedef struct khub_author_key {
    KHUB_STRUCT_HEADER;
    char public_key[96]; /* "khub-ed25519 <base64>", the line a policy's publishers list */
    char key_id[24];     /* 16 hex digits of SHA-256(public key) */
    /* End of 0.1. */
} khub_author_key;

/* Generates an Ed25519 key pair: the private key (PKCS#8 PEM, mode 0600) at
 * priv_path and the public key line at pub_path; out (may be NULL) gets the
 * public key and its id. Never overwrites a file: EXISTS. Since 0.1. */
KHUB_API khub_status khub_author_key_generate(const char *priv_path, const char *pub_path,
                                              khub_author_key *out, char *errbuf,
                                              size_t errbuf_size);

/* Signs every DIR/build/<variant>/metadata.json with the private key at
 * priv_path (a format-2 statement naming kernel, version, variant and the
 * metadata's digest, written to metadata.json.sig) and repacks the
 * variant's archive; on_signed (may be NULL) gets each metadata.json path
 * once signed. NOT_FOUND (no DIR/build, or no variant with a
 * metadata.json), PARSE (a key or metadata.json that does not parse),
 * METADATA_INVALID, IO. Since 0.1. */
KHUB_API khub_status khub_author_sign_build(const char *priv_path, const char *dir,
                                            khub_author_line_fn on_signed, void *ud, char *errbuf,
                                            size_t errbuf_size);

/* Signs the bytes of the file at path (format 1), writing path + ".sig".
 * Since 0.1. */
KHUB_API khub_status khub_author_sign_file(const char *priv_path, const char *path, char *errbuf,
                                           size_t errbuf_size);

/* ------------------------------------------------------------------------ */
/* Publishing (`khub publish`)                                              */
/* ------------------------------------------------------------------------ */

typedef struct khub_author_publish_opts {
    KHUB_STRUCT_HEADER;
    const char *dir;     /* the kernel source tree: kernel.json and build/ (borrowed) */
    const char *repo;    /* "org/name" instead of kernel.json's, NULL = kernel.json's */
    const char *message; /* commit summary, NULL = "Upload <repo> <version> (khub publish)" */
    /* End of 0.1. */
} khub_author_publish_opts;

typedef struct khub_author_publish_result {
    KHUB_STRUCT_HEADER;
    char repo[200];         /* "org/name" */
    char branch[32];        /* "v1" */
    char version[32];       /* kernel.json's version */
    char commit[41];        /* the new commit, or the branch head when nothing changed */
    char url[1024];         /* the server's commitUrl, "" when nothing changed */
    int32_t changed;        /* 0: the branch already had exactly these files */
    int32_t created_repo;   /* the repo did not exist */
    int32_t created_branch; /* v<major> did not exist */
    uint64_t n_files;       /* files in the build */
    uint64_t n_unchanged;   /* already on the branch with the same content */
    uint64_t n_uploaded;    /* LFS objects uploaded */
    uint64_t n_lfs_stored;  /* LFS objects the server already had */
    uint64_t n_deleted;     /* stale files removed from build/ */
    /* End of 0.1. */
} khub_author_publish_result;

/* Uploads DIR/build/<variant>/ and DIR/build/<variant>.tar.gz to branch
 * v<major> of the kernel's repo on hub's endpoint with hub's token, as one
 * commit: repo and branch created when missing, binaries and archives
 * through Git LFS, files under build/ the build no longer has deleted. The
 * token goes to the endpoint's origin only. Upload progress goes to hub's
 * progress callback (khub_hub_set_progress). Statuses: NOT_FOUND (no
 * kernel.json or no built variant), PARSE, UNAUTHORIZED (token missing,
 * rejected or without write access), EXISTS, HTTP (412: the branch moved
 * during the publish), NETWORK, UNSAFE_PATH (a symlink or odd name in
 * build/), IO, OVERFLOW; MISUSE (hub, opts, res or opts->dir NULL:
 * "khub_author_publish: opts.dir is NULL"), STRUCT_SIZE (opts or res below
 * 0.1's size). The message is khub_hub_errmsg(hub) (hub NULL:
 * khub_last_error() only), e.g. "DIR/kernel.json: cannot open: ..." (before
 * 0.2 "publish: " led some messages). Since 0.1. */
KHUB_API khub_status khub_author_publish(khub_hub *hub, const khub_author_publish_opts *opts,
                                         khub_author_publish_result *res);

#ifdef __cplusplus
}
#endif

#endif /* KHUB_AUTHOR_H */
