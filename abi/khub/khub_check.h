/*
 * khub_check.h: checking and measuring kernels: the publish-time gate
 * (`khub check`), op self-test timing (`khub bench`), and the names of op
 * kinds, dtypes, capability flags and CPU features that reports print.
 *
 * The gate over a built kernel source tree returns what it found instead
 * of printing it:
 *
 *     khub_check_report *rep = NULL;
 *     char err[KHUB_ERROR_SIZE];
 *     if (khub_check_dir("kernels-src/rmsnorm", NULL, &rep, err, sizeof err) != KHUB_STATUS_OK) {
 *         fprintf(stderr, "%s\n", err);               // no kernel.json, not built, ...
 *         return 1;
 *     }
 *     for (size_t i = 0; i < rep->n_findings; i++) {
 *         const khub_check_finding *f = khub_check_report_finding(rep, i);
 *         if (f->severity == KHUB_CHECK_FAIL)
 *             printf("%s %s%s%s\n", khub_check_code_name(f->code), f->file,
 *                    f->file[0] ? ": " : "", f->message);
 *     }
 *     int passed = rep->n_failed == 0;
 *     khub_check_report_free(rep);
 *
 * What runs: only bytes the ABI gate passed are ever loaded, and only in a
 * forked child process timed by the caller's (60 s, or KHUB_CHECK_TIMEOUT_S);
 * a crash there is a finding, not fatal. A passing check is evidence that a
 * kernel works, not proof that it is harmless (docs/kernel-format.md,
 * Threat model).
 *
 * Threading: every function here is thread-safe except on the same report
 * or runtime from two threads at once. The check functions fork: call them
 * from a process that can.
 *
 * Anything not declared in abi/khub/ is not part of khub's API.
 */
#ifndef KHUB_CHECK_H
#define KHUB_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "khub.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Names                                                                    */
/* ------------------------------------------------------------------------ */

/* The name of an op kind from khub_plugin.h's KHUB_OP_KINDS table ("norm"
 * for KHUB_OP_NORM); "unknown" for a value that is no kind. Static storage.
 * Since 0.1. */
KHUB_API const char *khub_op_kind_name(uint32_t kind);
/* The kind named name ("attention"), or 0 when it names none. Since 0.1. */
KHUB_API uint32_t khub_op_kind_from_name(const char *name);
/* The name of a capability dtype id (khub_dtype_id: "f32", "bf16", "q4_1",
 * "int8_row", ...), or NULL for an id that names nothing. Static storage.
 * Since 0.1. */
KHUB_API const char *khub_dtype_id_name(int32_t id);
/* The names of a kind's capability flags set in flags (the host's view of
 * khub_op_caps: flags | kind_flags; "causal", "bias", "bit9" for a bit
 * without a name), in bit order, joined by sep into buf (n bytes, always
 * NUL-terminated, truncated when short). Since 0.1. */
KHUB_API void khub_cap_flag_names(uint32_t kind, uint64_t flags, const char *sep, char *buf,
                                  size_t n);

/* ------------------------------------------------------------------------ */
/* CPU features and levels                                                  */
/* ------------------------------------------------------------------------ */

/* The i-th CPU feature khub knows (0, 1, ... in its fixed order: "sse42",
 * "avx", "avx2", ...): its name (static storage), and its KHUB_CPU_* bit in
 * *bit (may be NULL); NULL past the end. Since 0.1. */
KHUB_API const char *khub_cpu_feature_at(size_t i, uint32_t *bit);
/* The names of mask's KHUB_CPU_* bits, in that order, joined by sep into
 * buf (n bytes, always NUL-terminated). Since 0.1. */
KHUB_API void khub_cpu_feature_names(uint32_t mask, const char *sep, char *buf, size_t n);
/* This CPU's own KHUB_CPU_* bits, before KHUB_CPU_LEVEL masks any
 * (khub_cpu_features() is this masked). Since 0.1. */
KHUB_API uint32_t khub_cpu_features_host(void);
/* The highest level a feature set reaches: "avx512" (AVX2, FMA, F16C and
 * AVX-512 F/BW/DQ/VL/CD), "avx2" (AVX2, FMA, F16C) or "x86-64". Static
 * storage. Since 0.1. */
KHUB_API const char *khub_cpu_level_name(uint32_t features);
/* OK when KHUB_CPU_LEVEL is unset, empty or names a level; else
 * KHUB_STATUS_INVALID_ARG with a message naming the value and the levels in
 * errbuf (may be NULL). Since 0.1. */
KHUB_API khub_status khub_cpu_level_check(char *errbuf, size_t errbuf_size);

/* ------------------------------------------------------------------------ */
/* The gate: khub check FILE | DIR                                          */
/* ------------------------------------------------------------------------ */

/* How a line of a report counts. */
typedef enum khub_check_severity {
    KHUB_CHECK_FAIL = 1, /* a finding: the check fails */
    KHUB_CHECK_PASS = 2, /* a check that passed */
    KHUB_CHECK_SKIP = 3, /* a check not run, and why */
    KHUB_CHECK_INFO = 4  /* context: a variant begins, metadata.json signed or not */
} khub_check_severity;

/* What a report line is about. X(NAME, value, name): values are never
 * renumbered; names are for programs ("gate_export"). */
#define KHUB_CHECK_CODES(X) \
    X(VARIANT, 1, variant)                     /* INFO: a build variant begins */ \
    X(NO_VARIANTS, 2, no_variants)             /* build/ holds no variant folder */ \
    X(METADATA, 3, metadata)                   /* metadata.json missing, unreadable or invalid */ \
    X(METADATA_MISMATCH, 4, metadata_mismatch) /* names another repo/version than kernel.json */ \
    X(DIGESTS, 5, digests)                     /* the variant's files against metadata.json */ \
    X(SIGNATURE, 6, signature)                 /* INFO: metadata.json signed or unsigned */ \
    X(GATE_UNREADABLE, 7, gate_unreadable)     /* not an ELF64 shared object for this host */ \
    X(GATE_DIGEST, 8, gate_digest)             /* the bytes gated are not the digest's */ \
    X(GATE_LIBRARY, 9, gate_library)           /* DT_NEEDED off the allow-list */ \
    X(GATE_SEARCH_PATH, 10, gate_search_path)  /* RPATH or RUNPATH */ \
    X(GATE_NODELETE, 11, gate_nodelete)        /* DF_1_NODELETE */ \
    X(GATE_UNVERSIONED, 12, gate_unversioned)  /* an import without a symbol version */ \
    X(GATE_GNU_UNIQUE, 13, gate_gnu_unique)    /* an STB_GNU_UNIQUE symbol */ \
    X(GATE_EXPORT, 14, gate_export)            /* an export besides the entry */ \
    X(GATE_GLIBC, 15, gate_glibc)              /* glibc newer than the ceiling, or private */ \
    X(GATE_NOTE, 16, gate_note)                /* .note.khub missing or malformed */ \
    X(GATE_ENTRY, 17, gate_entry)              /* no entry symbol */ \
    X(GATE, 18, gate)                          /* PASS: the ABI gate passed */ \
    X(NOTE_MISMATCH, 19, note_mismatch)        /* ABI note id, version or ABI vs metadata.json */ \
    X(NOTE_KINDS, 20, note_kinds)              /* ABI note kinds vs kernel.json's ops */ \
    X(PTX, 21, ptx)                            /* a PTX file's .target/.version */ \
    X(CUBIN, 22, cubin)                        /* a cubin's SM */ \
    X(SELFTEST, 23, selftest)                  /* load and self-tests in a child */ \
    X(INSPECT, 24, inspect)                    /* khub_plugin_inspect refused the file */

#define KHUB__CHECK_CODE_ENUM(NAME, value, name) KHUB_CHECK_##NAME = value,
typedef enum khub_check_code {
    KHUB_CHECK_CODES(KHUB__CHECK_CODE_ENUM) KHUB_CHECK__COUNT
} khub_check_code;
#undef KHUB__CHECK_CODE_ENUM

/* "gate_export" for KHUB_CHECK_GATE_EXPORT; "unknown" for no code. Static
 * storage. Since 0.1. */
KHUB_API const char *khub_check_code_name(uint32_t code);

/* One line of a report. Strings are owned by the report. */
typedef struct khub_check_finding {
    KHUB_STRUCT_HEADER;  /* set by the library: fields past struct_size are absent */
    uint32_t severity;   /* khub_check_severity */
    uint32_t code;       /* khub_check_code */
    const char *variant; /* the build variant it is in ("khub1-cpu-x86_64-linux"), or "" */
    const char *file;    /* the file or folder it is about, or "" */
    const char *op;      /* the op it is about, when the check knows one, or "" */
    /* One line without a newline and without the file: the whole line is
     * "file: message" when file is not "", else message. */
    const char *message;
    /* End of 0.1. */
} khub_check_finding;

typedef struct khub_check_opts {
    KHUB_STRUCT_HEADER;
    /* khub_check_file: the newest glibc symbol version allowed
     * ("GLIBC_2.28", the default when NULL). khub_check_dir takes kernel.json's
     * "glibc_ceiling" instead and refuses this one (INVALID_ARG). Borrowed. */
    const char *glibc_ceiling;
    /* khub_check_file: the expected SHA-256 (64 hex digits) of the file;
     * bytes with another digest are not loaded (a DIGEST_MISMATCH load
     * status). NULL = the digest of the bytes the gate read. Ignored by
     * khub_check_dir (metadata.json names the digests). Borrowed. */
    const char *sha256;
    /* End of 0.1. */
} khub_check_opts;

/* A check's report, allocated by the library; free with
 * khub_check_report_free. Strings and pointers are owned by it. */
typedef struct khub_check_report {
    KHUB_STRUCT_HEADER; /* set by the library: fields past struct_size are absent */
    size_t n_findings;  /* lines, read with khub_check_report_finding */
    size_t n_failed;    /* lines with KHUB_CHECK_FAIL: the check passed when 0 */
    /* khub_check_dir */
    const char *repo;    /* kernel.json's "org/name" */
    const char *version; /* kernel.json's version */
    uint32_t n_variants; /* build variants checked */
    /* khub_check_file */
    khub_status inspect_status; /* khub_plugin_inspect's */
    khub_status gate_status;    /* the ABI gate's: OK, PLUGIN_INVALID (findings) or why not read */
    khub_status load_status;    /* the child's, or DIGEST_MISMATCH (opts->sha256); OK if not run */
    int32_t loaded;             /* 1 = the child loaded and self-tested the file */
    uint32_t reserved;          /* 0 */
    const khub_plugin_info *info; /* what the file says about itself; NULL when inspect failed */
    const char *load_report;      /* the child's one line, why it did not run, or "" */
    const char *max_glibc;        /* the newest GLIBC_x.y the file references, or "" */
    const char *glibc_ceiling;    /* the ceiling the gate applied */
    /* End of 0.1. */
} khub_check_report;

/* Line i of rep (0 <= i < rep->n_findings), in the order the checks ran;
 * NULL past the end. Owned by rep. Since 0.1. */
KHUB_API const khub_check_finding *khub_check_report_finding(const khub_check_report *rep,
                                                             size_t i);
/* Frees a report. Accepts NULL. Since 0.1. */
KHUB_API void khub_check_report_free(khub_check_report *rep);

/* Checks one plugin file: reads its ELF header and ABI note without running
 * any of it (khub_plugin_inspect: an INSPECT finding when it refuses), runs
 * the ABI gate on one read of its bytes (only the entry exported, allowed
 * libraries, glibc <= the ceiling, no RPATH/RUNPATH, NODELETE or
 * GNU_UNIQUE: one GATE_* finding per violation), and only if both pass,
 * loads exactly the bytes gated (their digest) in a child process and runs
 * the plugin's selftest there (load_status, load_report; a failure is a
 * SELFTEST finding). opts may be NULL; it is read up to its struct_size,
 * at least 0.1's 24 bytes. Returns OK when the check ran (*out set; it
 * passed when (*out)->n_failed is 0), MISUSE, STRUCT_SIZE ("khub_check_file:
 * opts.struct_size S is smaller than 0.1's 24"; since 0.2), INVALID_ARG (a
 * ceiling not like GLIBC_2.28) or NOMEM, with the message in errbuf (may be
 * NULL). Since 0.1. */
KHUB_API khub_status khub_check_file(const char *path, const khub_check_opts *opts,
                                     khub_check_report **out, char *errbuf, size_t errbuf_size);

/* The publish-time gate over a built kernel source tree (kernel.json,
 * build/<variant>/ from `khub build`), for every variant: metadata.json
 * parses and names kernel.json's repo, version and major; every file
 * matches its SHA-256 and none is unlisted; every plugin .so passes the ABI
 * gate (kernel.json's "glibc_ceiling", else GLIBC_2.28) and its ABI note
 * agrees with metadata.json and kernel.json's ops; every PTX file's
 * .target/.version and every cubin's SM agree with metadata.json; in a
 * child process, for each plugin the gate passed and this CPU can run: it
 * loads, passes its own selftest, registers exactly kernel.json's ops, and
 * passes kernel.json's numeric self-tests against khub/ref-cpu (CUDA
 * numerics need a GPU: reported as skipped). opts may be NULL; it is read
 * up to its struct_size, at least 0.1's 24 bytes (STRUCT_SIZE below,
 * "khub_check_dir: opts.struct_size S is smaller than 0.1's 24"; since
 * 0.2). Returns OK
 * when the check ran (*out set; it passed when (*out)->n_failed is 0);
 * else *out is NULL and errbuf says why: kernel.json's statuses (NOT_FOUND,
 * PARSE, ...), NOT_FOUND when DIR has no build/ folder ("not built (run
 * 'khub build DIR')"), INVALID_ARG for opts->glibc_ceiling, NOMEM.
 * Since 0.1. */
KHUB_API khub_status khub_check_dir(const char *dir, const khub_check_opts *opts,
                                    khub_check_report **out, char *errbuf, size_t errbuf_size);

/* ------------------------------------------------------------------------ */
/* Op self-tests and their timing: khub bench                               */
/* ------------------------------------------------------------------------ */

/* One numeric self-test: an op on a shape, against khub/ref-cpu. Shapes by
 * kind (docs/kernel-format.md): norm [n, dim], activation [n, ff],
 * attention [n_q, n_heads, n_kv_heads, head_dim(, n_kv)], linear and
 * qlinear [n, in, out], rotary [n, n_heads, head_dim], kv_cache [n_layers,
 * n_kv_heads, head_dim, n_tokens]. */
typedef struct khub_op_test {
    KHUB_STRUCT_HEADER;
    char op[64];      /* the op's name in the plugin */
    int64_t shape[6]; /* ndim entries used */
    uint32_t ndim;
    char dtype[16];   /* weights / KV: "f32", "f16", "q8_0", ... */
    double tolerance; /* NMSE bound */
    /* End of 0.1. */
} khub_op_test;

/* Reads DIR/kernel.json's "selftests" into tests (max entries; the caller
 * sets tests[0].struct_size, which is the stride of its array: elements
 * that many bytes apart, at least 0.1's 152, and may be larger than this
 * header's sizeof) and their number into *n. Each element written gets
 * that struct_size and the fields this library knows; bytes past them
 * stay the caller's. Statuses: kernel.json's (NOT_FOUND, PARSE, ...;
 * message in errbuf), OVERFLOW when it declares more than max, MISUSE for
 * a NULL argument, STRUCT_SIZE for tests[0].struct_size below 0.1's
 * ("khub_kernel_dir_tests: tests[0].struct_size 8 is smaller than 0.1's
 * 152"; MISUSE and this header's size until 0.2). Since 0.1. */
KHUB_API khub_status khub_kernel_dir_tests(const char *dir, khub_op_test *tests, size_t max,
                                           size_t *n, char *errbuf, size_t errbuf_size);

/* The plugin of a built kernel source tree that khub_kernel_dir_load loaded. */
typedef struct khub_kernel_dir_plugin {
    KHUB_STRUCT_HEADER;
    khub_plugin *plugin; /* borrowed, valid until unloaded */
    char file[128];      /* the plugin file chosen for this CPU ("rmsnorm-avx2.so") */
    char variant[96];    /* "khub1-cpu-x86_64-linux" */
    /* End of 0.1. */
} khub_kernel_dir_plugin;

/* Loads the plugin of DIR's CPU build for this machine into rt:
 * DIR/build/khub<ABI major>-cpu-<arch>-linux/metadata.json is parsed, every
 * file of the variant checked against it, the plugin file for this CPU's
 * features chosen, and exactly those bytes loaded (with their digest).
 * Statuses: NOT_FOUND (no metadata.json: build the kernel first),
 * metadata.json's and the digests' (METADATA_INVALID, DIGEST_MISMATCH),
 * NO_VARIANT (no plugin file fits this CPU), khub_plugin_load's,
 * STRUCT_SIZE (out below 0.1's size; since 0.2, a MISUSE check of this
 * header's sizeof before); the message on rt. Since 0.1. */
KHUB_API khub_status khub_kernel_dir_load(khub_runtime *rt, const char *dir,
                                          khub_kernel_dir_plugin *out);

/* What khub_op_bench measured. */
typedef struct khub_op_bench_result {
    KHUB_STRUCT_HEADER;
    double us;        /* median microseconds per call of the plugin's op */
    double ref_us;    /* the same for khub/ref-cpu's op of its kind */
    double work;      /* one call's work: FLOPs (is_flops) or f32 bytes moved */
    int32_t is_flops; /* 1: linear, qlinear, attention; 0: the rest */
    uint32_t kind;    /* the op's khub_op_kind */
    /* End of 0.1. */
} khub_op_bench_result;

/* Times plugin_id's op test->op and khub/ref-cpu's op of its kind on the
 * self-test's inputs (rt must hold both): each is called once, then for
 * about min_s seconds (0 = 0.2 s) in 15 rounds; the medians of the rounds'
 * time per call go to out (struct_size set by the caller). A kv_cache op is
 * timed per round trip (create, writes, views, destroy). Outputs are not
 * compared (khub check does that). The self-test's op bindings are dropped
 * when it returns (since 0.2: they stayed until khub_runtime_free, so the
 * plugin timed could not be unloaded). Statuses: NO_KERNEL, INVALID_ARG (a
 * shape that does not fit the kind), UNSUPPORTED, STRUCT_SIZE (test or out
 * below 0.1's size), or the op's own; the message on rt. Since 0.1. */
KHUB_API khub_status khub_op_bench(khub_runtime *rt, const char *plugin_id,
                                   const khub_op_test *test, double min_s,
                                   khub_op_bench_result *out);

/* One call of timed code; i counts calls from 0 (to cycle inputs). */
typedef khub_status (*khub_timed_fn)(void *ud, int i);

/* The clock khub_op_bench uses, for code an embedder times itself: calls fn
 * once to warm up, then 15 rounds of at least one call and about min_s / 15
 * seconds each, on clock_id (CLOCK_MONOTONIC, or CLOCK_THREAD_CPUTIME_ID);
 * *median_s gets the median over rounds of the time per call. Returns the
 * first status of fn that is not OK (then *median_s is 0). Since 0.1. */
KHUB_API khub_status khub_time_calls(khub_timed_fn fn, void *ud, double min_s, int clock_id,
                                     double *median_s);

/* The host function table rt gives the plugins it loads (logger, allocator,
 * thread pool, features), for a program that opens and drives a plugin's
 * entry itself, as `khub bench-ops` does to time plugins side by side.
 * Owned by rt, valid until khub_runtime_free. Since 0.1. */
KHUB_API const khub_host_api *khub_runtime_host(khub_runtime *rt);

#ifdef __cplusplus
}
#endif

#endif /* KHUB_CHECK_H */
