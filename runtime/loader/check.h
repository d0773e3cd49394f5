/*
 * check.h: checking an untrusted plugin in a child process (runtime/loader/check.c).
 *
 * A crash in a plugin's init or selftest cannot be survived in-process, so
 * `khub check FILE` and `khub check DIR` (the publish-time gate) run both in
 * a forked child and read back what happened; so do khub_plugin_load and
 * khub_plugin_reload, before loading in-process, when the embedder sets
 * KHUB_OPT_ISOLATED_INIT (off by default: init runs in the calling process).
 */
#ifndef KHUB_RUNTIME_CHECK_H
#define KHUB_RUNTIME_CHECK_H

#include "internal.h"

struct khub__artifact_file; /* plugin_artifacts.h */

/* Forks; the child makes a runtime, loads path (verified against
 * sha256_or_NULL, or unverified when NULL) and runs the plugin's selftest,
 * then exits. report (n bytes, may be NULL/0) receives one line: on success
 * "khub-test/good 1.0.0: loaded, 2 ops, selftest passed", else the child's
 * error message, or "crashed with SIGSEGV during init" when it died.
 * Returns the child's status, KHUB_STATUS_CHILD_CRASHED when it was killed
 * by a signal, KHUB_STATUS_PLUGIN_INVALID when the result channel carried
 * anything the check does not write itself (plugin code forging a verdict),
 * or KHUB_STATUS_TIMEOUT after 60 s (KHUB_CHECK_TIMEOUT_S), timed by the
 * parent: the child has no alarm pending. Thread-safe; the message
 * also goes to khub_last_error(). Since 0.1. */
KHUB_INTERNAL khub_status khub__check_in_child(const char *path, const char *sha256_or_NULL,
                                               char *report, size_t n);

/* The same, then (after the plugin's own selftest passed) runs each numeric
 * self-test of specs against khub/ref-cpu, loaded from the built-ins in the
 * child; report gets "...: selftest passed; <one line per test>". */
struct khub_selftest_spec;
KHUB_INTERNAL khub_status khub__check_in_child_with_tests(const char *path,
                                                          const char *sha256_or_NULL,
                                                          const struct khub_selftest_spec *specs,
                                                          size_t n_specs, char *report, size_t n);

/* An op a kernel's manifest declares: its name and its kind. The kind fixes
 * the op's signature (the argument struct khub_<kind>_args it is called
 * with); kind_name is for messages ("norm"). */
typedef struct khub_check_op {
    const char *name;
    uint32_t kind;
    const char *kind_name;
} khub_check_op;

/* khub__check_in_child_with_tests, and before the numeric self-tests the
 * child compares the plugin's registered ops with ops (n_ops > 0): every
 * declared op must be registered under its name with its kind, and the
 * plugin may register no op that is not declared. A mismatch fails with
 * KHUB_STATUS_PLUGIN_INVALID naming the op ("kernel.json declares op
 * 'rms_norm' (norm); the plugin registers no op by that name (it registers:
 * rmsnorm (norm))"). files[n_files] (or NULL, 0) are the plugin's verified
 * artifacts (a CUDA variant's PTX), served to it through host->artifact as
 * a fetched kernel's are, so a CUDA op can run its numeric self-tests. */
KHUB_INTERNAL khub_status khub__check_in_child_declared(
    const char *path, const char *sha256_or_NULL, const struct khub_selftest_spec *specs,
    size_t n_specs, const khub_check_op *ops, size_t n_ops, const struct khub__artifact_file *files,
    size_t n_files, char *report, size_t n);

#endif /* KHUB_RUNTIME_CHECK_H */
