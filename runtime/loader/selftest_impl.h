/*
 * selftest_impl.h: the self-test bench shared by selftest.c and
 * selftest_attn.c. Internal to runtime/loader.
 */
#ifndef KHUB_RUNTIME_SELFTEST_IMPL_H
#define KHUB_RUNTIME_SELFTEST_IMPL_H

#include "runtime_impl.h"
#include "selftest.h"

#define REF_ID "khub/ref-cpu"
#define MAX_T  8

typedef struct tens {
    khub_tensor t;
    int64_t shape[4];
    size_t bytes;
} tens;

typedef struct bench {
    khub_runtime *rt;
    tens t[MAX_T];
    int n;
    uint64_t rng;
    double min_s; /* > 0: time every call for about this long (khub__selftest_time) */
    double us[2]; /* median us per call: [0] the plugin's op, [1] ref-cpu's (summed) */
    /* kinds that run several cases (attention) score themselves: */
    int scored;       /* set: score below is the result, not the NMSE of y vs r */
    double score;     /* the worst case's NMSE (the first one over the tolerance) */
    int n_cases;      /* cases run to the end */
    char layout[192]; /* the case running (or that failed) */
    char worst[192];  /* the case scored */
    int no_test;      /* the kind has no numeric self-test */
} bench;

typedef struct pair {
    khub_binding *test, *ref;
} pair;

typedef struct result {
    khub_tensor *y, *r;
} result;

/* An f32 tensor of the bench (filled with U(-1, 1) when fill is set), freed
 * with the bench; NULL on OOM. */
KHUB_INTERNAL khub_tensor *khub__st_f32(bench *b, int fill, int nd, int64_t d0, int64_t d1,
                                        int64_t d2);
KHUB_INTERNAL void khub__st_bench_free(bench *b);
/* NMSE of y against ref (same shape). */
KHUB_INTERNAL double khub__st_nmse(const khub_tensor *y, const khub_tensor *ref);
/* The op of plugin (op name may be NULL) for kind, pinned to that plugin;
 * the binding is b's, dropped when the self-test ends. */
KHUB_INTERNAL khub_status khub__st_bind(bench *b, uint32_t kind, const char *plugin, const char *op,
                                        int dtype_id, int head_dim, khub_binding **out);
/* The plugin's op and khub/ref-cpu's of the same kind. */
KHUB_INTERNAL khub_status khub__st_bind_pair(bench *b, uint32_t kind, const char *plugin,
                                             const char *op, int dtype_id, int head_dim, pair *p);
/* One call (timed when the bench times; which: 0 plugin, 1 ref-cpu). */
KHUB_INTERNAL khub_status khub__st_call(bench *b, khub_binding *binding, const void *args,
                                        int which);
/* One call of a CUDA op of kind on copies of the host tensors of args in
 * device memory; its outputs come back into the host tensors
 * (selftest_cuda.c). */
KHUB_INTERNAL khub_status khub__st_call_cuda(bench *b, khub_binding *binding, uint32_t kind,
                                             const void *args);
/* The attention self-test (selftest_attn.c). */
KHUB_INTERNAL khub_status khub__st_attention(bench *b, const char *pid, const khub_selftest_spec *s,
                                             result *res);

#endif /* KHUB_RUNTIME_SELFTEST_IMPL_H */
