/*
 * elf_gate.h: the ABI gate for plugin shared objects.
 *
 * khub build and khub check run every plugin .so through this before it may
 * be published (and before `khub check` runs any of its code), and the
 * loader runs every downloaded plugin's sealed bytes through it before
 * dlopen (khub__plugin_load_verified). It lives in runtime/ for that
 * reason. It reads the bytes with libelf only (nothing is loaded) and
 * checks what makes a plugin safe to hot-load and portable across Linux
 * machines:
 *   - exports: khub_plugin_init_v1, and nothing else (the ABI note is a
 *     section, not a symbol);
 *   - imports: DT_NEEDED libraries from an allow-list, every undefined
 *     global symbol versioned (so it comes from one of them, not from the
 *     host process), and glibc symbol versions no newer than a ceiling
 *     (default GLIBC_2.28);
 *   - no DT_RPATH / DT_RUNPATH;
 *   - no STB_GNU_UNIQUE symbols and no DF_1_NODELETE (either makes dlclose a
 *     no-op, so a hot reload could never retire the old code);
 *   - the .note.khub ABI note is present and well-formed.
 * Every violation found is reported, one line each, not just the first.
 */
#ifndef KHUB_HUB_ELF_GATE_H
#define KHUB_HUB_ELF_GATE_H

#include <stddef.h>

#include "internal.h"
#include "khub/khub_check.h"

typedef struct khub_gate_policy {
    /* Libraries a plugin may need; NULL = khub__gate_default_libs. */
    const char *const *allowed_libs;
    size_t n_allowed_libs;
    /* Highest glibc symbol version allowed, e.g. "GLIBC_2.28"; NULL = that. */
    const char *glibc_ceiling;
} khub_gate_policy;

#define KHUB_GATE_MAX_FINDINGS 32

typedef struct khub_gate_report {
    khub_abi_note_v2 note; /* valid when has_note; a version 1 note decoded */
    int has_note;
    int has_entry;      /* exports KHUB_PLUGIN_ENTRY as a function */
    char max_glibc[32]; /* highest GLIBC_x.y referenced, "" if none */
    size_t n_findings;
    char findings[KHUB_GATE_MAX_FINDINGS][256];    /* one line per violation */
    khub_check_code codes[KHUB_GATE_MAX_FINDINGS]; /* its KHUB_CHECK_GATE_* */
} khub_gate_report;

/* Decodes an ABI note descriptor of size bytes (untrusted) of version 1 or 2
 * into the version 2 layout; id and version are "" when not NUL-terminated
 * within their field (runtime/loader/elf_inspect.c). False when it is too short for its version; an
 * unknown version is decoded (header only) for the caller to refuse. */
KHUB_INTERNAL bool khub__note_decode(const void *desc, size_t size, khub_abi_note_v2 *out);

/* The default allow-list: the C library family and the dynamic loader (and,
 * in a KHUB_SANITIZE build, the sanitizer runtimes its own plugins need). */
KHUB_INTERNAL extern const char *const khub__gate_default_libs[];
KHUB_INTERNAL extern const size_t khub__gate_n_default_libs;

/* Runs every check on the file at path. Returns KHUB_STATUS_OK when the
 * file passes, KHUB_STATUS_PLUGIN_INVALID when it has findings (listed in
 * rep), or NOT_ELF / WRONG_ARCH / TRUNCATED / IO when it cannot be read as an
 * ELF64 shared object at all (message in errbuf). policy may be NULL. */
KHUB_PRIVATE_API khub_status khub__gate_check_file(const char *path, const khub_gate_policy *policy,
                                                   khub_gate_report *rep, char *errbuf,
                                                   size_t errbuf_size);

/* The same checks on an image in memory (size bytes at data, untrusted,
 * not modified); label names it in messages. With sha256_out (65 bytes, may
 * be NULL) khub__gate_check_file also returns the SHA-256 of the bytes it
 * checked, so a caller can load exactly those. */
KHUB_INTERNAL khub_status khub__gate_check_mem(const void *data, size_t size, const char *label,
                                               const khub_gate_policy *policy,
                                               khub_gate_report *rep, char *errbuf,
                                               size_t errbuf_size);
KHUB_INTERNAL khub_status khub__gate_check_file_sha(const char *path,
                                                    const khub_gate_policy *policy,
                                                    khub_gate_report *rep, char sha256_out[65],
                                                    char *errbuf, size_t errbuf_size);

/* The policy for loading a downloaded plugin on this machine: the default
 * allow-list, and the running glibc's version as the ceiling (a plugin that
 * needs a newer glibc could not bind here; the publish-time ceiling is a
 * portability rule for the kernel's author). ceiling_buf holds the name. */
KHUB_INTERNAL void khub__gate_load_policy(khub_gate_policy *pol, char ceiling_buf[32]);

/* Compares two "GLIBC_a.b[.c]" version names numerically: <0, 0, >0. */
KHUB_INTERNAL int khub__glibc_version_cmp(const char *a, const char *b);

/* Reads a PTX text's ".version X.Y" and ".target sm_NN[a|f]" directives.
 * isa is X*10+Y, sm is NN; suffix receives 'a', 'f' or '\0'. Returns
 * KHUB_STATUS_PARSE when either directive is missing or malformed. */
KHUB_PRIVATE_API khub_status khub__ptx_inspect(const char *text, size_t len, int *isa, int *sm,
                                               char *suffix);

/* Reads the SM (e.g. 90) a cubin was compiled for from its ELF header (the
 * first 64 bytes of data). Returns NOT_ELF when it is no little-endian
 * ELF64, WRONG_ARCH when it is not a CUDA ELF (EM_CUDA), PARSE when it
 * names no SM. */
KHUB_INTERNAL khub_status khub__cubin_inspect(const unsigned char *data, size_t len, int *sm);

#endif /* KHUB_HUB_ELF_GATE_H */
