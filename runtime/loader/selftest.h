/*
 * selftest.h: numeric self-tests of a plugin's op against the reference
 * plugin khub/ref-cpu, the oracle every kernel is measured by.
 *
 * The runtime must hold both the plugin under test and khub/ref-cpu. Inputs
 * are random (fixed seed) and shaped by kind:
 *   norm        [n, dim]                     (run with and without residual)
 *   activation  [n, ff]
 *   attention   [n_q, n_heads, n_kv_heads, head_dim(, n_kv)]  causal; the queries
 *               are the last n_q of n_kv positions (n_kv = n_q by default);
 *               compact f32 K/V first, then every case the op's caps claim:
 *               K/V from khub/ref-cpu's kv_cache view and a padded view with
 *               a byte offset (STRIDED_KV), a decode step and a longer chunk,
 *               f16 K/V (KV_F16), a mask (MASK), a window (SLIDING), an odd
 *               head dim; the score is the worst case's, the report names
 *               the first case over the tolerance (docs/kernel-format.md)
 *   linear      [n, in, out]                 dtype f32, f16 or bf16 weights
 *   qlinear     [n, in, out]                 dtype q8_0, q4_0, q4_1, int8_row or
 *                                            nf4 (weights quantized by ref-cpu)
 *   rotary      [n, n_heads, head_dim]       NEOX, theta 10000
 *   kv_cache    [n_layers, n_kv_heads, head_dim, n_tokens]  dtype f32 or f16: the
 *               same K/V written in two chunks per layer and read back by view()
 *   embedding   [n, vocab, hidden]           dtype f32, f16, bf16 or a block format
 *               (q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q6_k, int8_row, nf4: random
 *               codes with small finite scales); ids spread over the vocabulary,
 *               its last row first; scale sqrt(hidden)
 * The score is the normalised mean squared error
 *   NMSE = sum((y - y_ref)^2) / sum(y_ref^2),
 * which must not exceed the tolerance.
 */
#ifndef KHUB_RUNTIME_SELFTEST_H
#define KHUB_RUNTIME_SELFTEST_H

#include "internal.h"

typedef struct khub_selftest_spec {
    const char *op; /* op name in the plugin under test */
    int64_t shape[6];
    size_t ndim;
    const char *dtype; /* "f32", "q4_1", ... (weights) */
    double tolerance;  /* NMSE bound */
} khub_selftest_spec;

/* Runs one self-test of plugin_id's op against khub/ref-cpu in rt. On
 * success *nmse holds the score; KHUB_STATUS_ERROR when the score exceeds the
 * tolerance; INVALID_ARG for a shape that does not fit the kind; NO_KERNEL
 * when either op is missing. report gets one line either way, e.g.
 * "rms_norm [4, 576] f32: NMSE 1.2e-15 <= 1e-10". */
KHUB_INTERNAL khub_status khub__selftest_run(khub_runtime *rt, const char *plugin_id,
                                             const khub_selftest_spec *spec, double *nmse,
                                             char *report, size_t n);

/* Times plugin_id's op and khub/ref-cpu's on the self-test's inputs (the
 * same builders as khub__selftest_run, the same strict, pinned bindings):
 * each op is called once, then for about min_s seconds (0 = 0.2 s) in the
 * rounds of khub__time_calls (timing.h). *us_test and *us_ref get the median
 * microseconds per call (a kv_cache op: per round trip of create, writes,
 * views, destroy). Outputs are not compared (ops that work in place are fed
 * their own outputs); khub__selftest_run is the correctness check.
 * Statuses: NO_KERNEL, INVALID_ARG, UNSUPPORTED (message on rt), or the
 * op's own. */
KHUB_INTERNAL khub_status khub__selftest_time(khub_runtime *rt, const char *plugin_id,
                                              const khub_selftest_spec *spec, double min_s,
                                              double *us_test, double *us_ref);
/* The op kind of plugin_id's op named op in rt; 0 when there is none. */
KHUB_INTERNAL uint32_t khub__selftest_kind(khub_runtime *rt, const char *plugin_id, const char *op);
/* Whether a CUDA driver sees a GPU, asked in a child process so that this
 * one never initialises CUDA before it forks (selftest_cuda.c). */
KHUB_INTERNAL bool khub__selftest_cuda_present(void);
/* The work of one call on spec's shape: FLOPs (*is_flops = 1: linear,
 * qlinear, attention) or f32 bytes moved (norm, activation, rotary,
 * kv_cache); 0 when the shape does not fit the kind. */
KHUB_INTERNAL double khub__selftest_work(uint32_t kind, const khub_selftest_spec *spec,
                                         int *is_flops);

#endif /* KHUB_RUNTIME_SELFTEST_H */
