/*
 * khub_status.h: the status codes every fallible khub function returns.
 *
 * Rules (abi/ABI.md): codes are never renumbered or removed; a retired code
 * becomes KHUB_STATUS_OBSOLETE_nn. Groups: 0 OK, 1-99 general, 100-199 hub and
 * network, 200-299 verification, 300-399 loader and ABI, 400-499 model and
 * executor, 1000+ experimental.
 *
 * One X-macro list, KHUB_STATUS_MAP, generates the enum and the tables behind
 * khub_status_name() and khub_status_str() (declared in khub.h).
 *
 * Usage:
 *     khub_status st = khub_runtime_new(NULL, &rt);
 *     if (st != KHUB_STATUS_OK) fprintf(stderr, "%s\n", khub_status_str(st));
 *
 * This header is shared by apps (khub.h) and plugins (khub_plugin.h).
 * Anything not declared in abi/khub/ is not part of khub's API.
 */
#ifndef KHUB_STATUS_H
#define KHUB_STATUS_H

/* X(NAME, value, "one-line description") */
#define KHUB_STATUS_MAP(X) \
    X(OK, 0, "success") \
    X(ERROR, 1, "unspecified error") \
    X(MISUSE, 2, "API misuse (a NULL or invalid argument from the caller)") \
    X(NOMEM, 3, "out of memory") \
    X(INVALID_ARG, 4, "invalid argument") \
    X(IO, 5, "input/output error") \
    X(NOT_FOUND, 6, "not found") \
    X(UNSUPPORTED, 7, "not supported") \
    X(OVERFLOW, 8, "size or count overflow") \
    X(BUSY, 9, "resource busy (calls in flight)") \
    X(PARSE, 10, "malformed input") \
    X(INTERNAL, 11, "internal error (a bug in khub)") \
    X(CHILD_CRASHED, 12, "child process crashed") \
    X(TIMEOUT, 13, "operation timed out") \
    X(EXISTS, 14, "already exists") \
    X(NETWORK, 100, "network error") \
    X(HTTP, 101, "unexpected HTTP status") \
    X(REPO_NOT_FOUND, 102, "repository not found") \
    X(REVISION_NOT_FOUND, 103, "revision not found") \
    X(ENTRY_NOT_FOUND, 104, "file not found in repository") \
    X(GATED_REPO, 105, "gated repository: access must be requested") \
    X(UNAUTHORIZED, 106, "authentication required or token rejected") \
    X(OFFLINE, 107, "not cached, and offline mode forbids the network") \
    X(RATE_LIMITED, 108, "rate limited by the hub") \
    X(BAD_ID, 109, "malformed Hub ID") \
    X(NO_VARIANT, 110, "no build variant fits this machine") \
    X(UNSAFE_PATH, 111, "path escapes its directory") \
    X(DIGEST_MISMATCH, 200, "content digest mismatch") \
    X(SIGNATURE_INVALID, 201, "signature does not verify") \
    X(KEY_UNKNOWN, 202, "signing key is not trusted") \
    X(KEY_REVOKED, 203, "signing key is revoked") \
    X(UNSIGNED, 204, "signature required but absent") \
    X(METADATA_INVALID, 205, "kernel metadata is malformed") \
    X(LOCK_MISMATCH, 206, "content does not match the lock file") \
    X(NAME_MISMATCH, 207, \
      "signed metadata names another kernel or variant than the one asked for") \
    X(QUARANTINED, 210, "kernel build quarantined: it crashed or exited in a call before") \
    X(DOWNGRADE, 211, "a pin resolves to an older kernel version than the one locked") \
    X(NOT_ELF, 300, "not an ELF shared object") \
    X(WRONG_ARCH, 301, "shared object built for another architecture") \
    X(TRUNCATED, 302, "file is truncated") \
    X(NO_ABI_NOTE, 303, "no khub ABI note in the shared object") \
    X(ABI_MAJOR, 304, "plugin ABI major version differs from the host's") \
    X(ABI_MINOR, 305, "plugin ABI minor version is newer than the host's") \
    X(STRUCT_SIZE, 306, "plugin struct is smaller than the ABI minimum") \
    X(DLOPEN, 307, "dlopen failed") \
    X(NO_ENTRY, 308, "plugin entry symbol not found") \
    X(INIT_FAILED, 309, "plugin initialisation failed") \
    X(DUPLICATE_OP, 310, "duplicate op name") \
    X(PLUGIN_INVALID, 311, "plugin descriptor is invalid") \
    X(NO_KERNEL, 312, "no plugin serves this op") \
    X(NO_CUDA, 313, "no CUDA driver") \
    X(CUDA, 314, "CUDA driver call failed") \
    X(PTR_SIZE, 315, "plugin pointer size differs from the host's") \
    X(NO_NCCL, 316, "no usable NCCL library") \
    X(NO_NVRTC, 317, "no usable NVRTC library (load-time CUDA compilation)") \
    X(KERNEL_MISMATCH, 330, "kernel output differs from khub/ref-cpu beyond its tolerance") \
    X(MODEL_INVALID, 400, "model file is malformed") \
    X(MODEL_UNSUPPORTED, 401, "model architecture or field value not supported") \
    X(TOKENIZER, 402, "tokenizer error") \
    X(CONTEXT_FULL, 403, "context length exceeded") \
    X(KV_FULL, 404, "KV cache block pool exhausted")

typedef enum khub_status {
#define KHUB__STATUS_ENUM(name, value, text) KHUB_STATUS_##name = value,
    KHUB_STATUS_MAP(KHUB__STATUS_ENUM)
#undef KHUB__STATUS_ENUM
        KHUB_STATUS__COUNT /* never use: one past the largest code */
} khub_status;

#endif /* KHUB_STATUS_H */
