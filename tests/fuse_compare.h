/*
 * fuse_compare.h: a model run with its q/k/v and gate/up joined (one call
 * each, runtime/executor/model_fuse.c) and with them apart
 * (KHUB_JOIN_PROJ=0), compared bit for bit: the logits of every row of a
 * prefill, of a prompt then single decode steps, and of a batch of four
 * sequences (a mixed prefill, then decode steps of four tokens). Shared by
 * test_fuse.c (tiny fixtures) and test_fuse_smollm2.c (label slow).
 */
#ifndef KHUB_TESTS_FUSE_COMPARE_H
#define KHUB_TESTS_FUSE_COMPARE_H

#include <stdbool.h>
#include <stdlib.h>

#include "executor.h"
#include "gguf.h"
#include "mmap_file.h"
#include "runner.h"

/* Prefill rows: past KX_GEMM_MIN_N (128), so a quantized model's prefill
 * takes the cpu-x86 GEMM; the batch's decode steps (4 tokens) take its
 * batch tiles, single decode steps its one-token tiles. */
enum { FC_PREFILL = 140, FC_PROMPT = 5, FC_STEPS = 6, FC_SEQS = 4 };

typedef struct fc_run {
    float *out; /* owned: prefill rows, then decode steps, then batch steps */
    size_t n;   /* floats */
    int32_t joined_qkv, joined_gate_up;
    bool huge;     /* a GGUF read into huge pages (khub__mmap_open_huge) */
    char *explain; /* owned copy */
} fc_run;

static inline size_t fc_floats(int64_t V)
{
    return (size_t)V * (FC_PREFILL + FC_STEPS + (size_t)FC_SEQS * (1 + FC_STEPS));
}

/* Token ids of position i of sequence s, fixed and spread over the vocabulary. */
static inline int32_t fc_id(int s, int i, int64_t V)
{
    return (int32_t)(((uint64_t)(s + 1) * 2654435761u + (uint64_t)i * 40503u) % (uint64_t)V);
}

/* Decode steps of FC_SEQS sequences after a mixed prefill of 3, 1, 7 and 2
 * tokens, the logits of each step appended at *o. */
static inline void fc_batch(khub_model *m, int64_t V, float **o)
{
    static const int64_t len[FC_SEQS] = {3, 1, 7, 2};
    int32_t ids[64];
    khub__seg segs[FC_SEQS];
    int64_t n = 0;
    for (int s = 0; s < FC_SEQS; s++) {
        ASSERT_OK(khub__forward_reset(m, s));
        segs[s] = (khub__seg){s, 0, 0, len[s]};
        for (int64_t i = 0; i < len[s]; i++) ids[n++] = fc_id(s, (int)i, V);
    }
    for (int step = 0; step <= FC_STEPS; step++) {
        ASSERT_OK(khub__forward(m, ids, segs, FC_SEQS));
        memcpy(*o, m->logits, (size_t)FC_SEQS * (size_t)V * sizeof(float));
        *o += (size_t)FC_SEQS * (size_t)V;
        for (int s = 0; s < FC_SEQS; s++) {
            segs[s].pos0 += segs[s].n;
            segs[s].n = 1;
            ids[s] = fc_id(s, (int)segs[s].pos0, V);
        }
    }
}

/* Loads path with opts, joined or not, and runs the three workloads. */
static inline fc_run fc_model_run(const char *path, const khub_model_opts *opts, bool joined)
{
    ASSERT_EQ(setenv("KHUB_JOIN_PROJ", joined ? "1" : "0", 1), 0);
    khub_runtime_opts ro = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = 2};
    khub_runtime *rt = NULL;
    khub_model *m = NULL;
    ASSERT_OK(khub_runtime_new(&ro, &rt));
    ASSERT_OK(khub_plugin_load_builtin(rt));
    khub_model_opts mo = *opts;
    mo.max_seqs = FC_SEQS;
    /* Room for the prefill's joined outputs unless opts say otherwise: a
     * step of more rows than half of max_batch runs its projections apart
     * (forward.c). */
    mo.max_batch = opts->max_batch ? opts->max_batch : 2 * FC_PREFILL;
    ASSERT_OK(khub_model_load(rt, path, &mo, &m));
    int64_t V = m->cfg.vocab_size;
    fc_run r = {.n = fc_floats(V)};
    r.out = malloc(r.n * sizeof(float));
    ASSERT(r.out);
    float *o = r.out;
    int32_t ids[FC_PREFILL];
    for (int i = 0; i < FC_PREFILL; i++) ids[i] = fc_id(0, i, V);
    ASSERT_OK(khub_model_logits_all(m, ids, FC_PREFILL, o));
    o += (size_t)FC_PREFILL * (size_t)V;
    ASSERT_OK(khub__forward_reset(m, 0));
    khub__seg seg = {0, 0, 0, FC_PROMPT};
    ASSERT_OK(khub__forward(m, ids, &seg, 1));
    for (int s = 0; s < FC_STEPS; s++) {
        memcpy(o, m->logits, (size_t)V * sizeof(float));
        o += V;
        seg = (khub__seg){0, 0, FC_PROMPT + s, 1};
        ASSERT_OK(khub__forward(m, &ids[FC_PROMPT + s], &seg, 1));
    }
    fc_batch(m, V, &o);
    ASSERT_EQ(o - r.out, (long long)r.n);
    r.joined_qkv = khub__model_n_joined(m, true);
    r.joined_gate_up = khub__model_n_joined(m, false);
    r.huge = m->gguf && khub__gguf_map(m->gguf)->huge;
    r.explain = strdup(khub_model_explain(m));
    ASSERT(r.explain);
    khub_model_free(m);
    khub_runtime_free(rt);
    ASSERT_EQ(unsetenv("KHUB_JOIN_PROJ"), 0);
    return r;
}

static inline void fc_run_free(fc_run *r)
{
    free(r->out);
    free(r->explain);
}

/* Runs path joined and apart, checks that every logit has the same bits
 * and that qkv_layers joined q/k/v (-N: N unless the file is a huge copy)
 * and gu_layers
 * gate/up, and hands back the joined run's explain (caller frees). */
static inline char *fc_compare(const char *path, const khub_model_opts *opts, int qkv_layers,
                               int gu_layers)
{
    fc_run a = fc_model_run(path, opts, true), b = fc_model_run(path, opts, false);
    ASSERT_EQ(a.n, b.n);
    for (size_t i = 0; i < a.n; i++)
        if (memcmp(&a.out[i], &b.out[i], sizeof(float)) != 0)
            TEST_FAIL_("logit %zu differs: joined %.9g, apart %.9g", i, (double)a.out[i],
                       (double)b.out[i]);
    /* qkv_layers -N: N, or none on a huge copy, where non-adjacent q, k, v
     * (a GGUF's k, o, q, v) cannot be joined (model_fuse.c). */
    ASSERT_EQ(a.joined_qkv, qkv_layers >= 0 ? qkv_layers : a.huge ? 0 : -qkv_layers);
    ASSERT_EQ(a.joined_gate_up, gu_layers);
    ASSERT_EQ(b.joined_qkv, 0);
    ASSERT_EQ(b.joined_gate_up, 0);
    ASSERT(strstr(b.explain, "as one call") == NULL);
    char *ex = a.explain;
    a.explain = NULL;
    fc_run_free(&a);
    fc_run_free(&b);
    return ex;
}

#endif /* KHUB_TESTS_FUSE_COMPARE_H */
