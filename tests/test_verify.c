/*
 * test_verify.c: the runtime cross-check of kernels against khub/ref-cpu
 * (KHUB_OPT_VERIFY_KERNELS, runtime/executor/verify.c) on the paged pool, the
 * library's default cache for a model of several sequences: its
 * paged_attention op, one call per layer for the whole batch, is checked
 * like the other kinds. khub-test/paged-attn-wrong (tests/plugins/paged_attn.c)
 * is right on one sequence and doubles its output on a batch; the check
 * names it on a batch, and passes it alone and passes its right twin.
 * khub-test/paged-attn-scribble writes into the pools it should only read,
 * which the outputs cannot show; the digests of the blocks it reads do.
 * (tests/t_contain.sh checks a norm kernel through `khub run` on SmolLM2.)
 */
#include <unistd.h>

#include "khub/khub_batch.h"
#include "plugins/tp_util.h"
#include "runner.h"
#include "tiny_llama.h"

enum { NREQ = 3 };

typedef struct fixture {
    khub_runtime *rt;
    khub_model *m;
    char dir[128];
} fixture;

/* The tiny Llama on the paged pool with attn's paged_attention op, one
 * call in `every` of each kind cross-checked. */
static fixture open_paged(const char *plugin, const char *attn, int every)
{
    fixture f = {0};
    snprintf(f.dir, sizeof f.dir, "/tmp/khub-test-verify-%d", (int)getpid());
    tiny_llama t = {.hidden = 64,
                    .ffn = 128,
                    .layers = 2,
                    .heads = 4,
                    .kv_heads = 2,
                    .head_dim = 16,
                    .vocab = 256};
    tiny_llama_write(f.dir, &t);
    f.rt = tp_runtime(2);
    ASSERT_OK(khub_plugin_load_builtin(f.rt));
    (void)tp_load(f.rt, plugin);
    ASSERT_OK(khub_runtime_set_option(f.rt, KHUB_OPT_VERIFY_KERNELS, every));
    khub_model_opts mo = {KHUB_STRUCT_INIT(khub_model_opts),
                          .attn_impl = attn,
                          .cache_impl = "khub/ref-cpu:paged_cache",
                          .max_seqs = 4,
                          .max_batch = 64,
                          .max_context = 64};
    ASSERT_OK(khub_model_load(f.rt, f.dir, &mo, &f.m));
    char want[160];
    snprintf(want, sizeof want, "%s 1.0.0 :: paged_attention", attn);
    ASSERT_CONTAINS(khub_model_explain(f.m), want);
    return f;
}

static void close_paged(fixture *f)
{
    khub_model_free(f->m);
    khub_runtime_free(f->rt);
    tiny_llama_rm(f->dir);
}

typedef struct reqs {
    int32_t ids[NREQ][8];
    khub_generate_opts opts[NREQ];
    khub_batch_request req[NREQ];
    khub_batch_result res[NREQ];
} reqs;

static void make_reqs(reqs *r)
{
    memset(r, 0, sizeof *r);
    for (int i = 0; i < NREQ; i++) {
        for (int k = 0; k < 5; k++) r->ids[i][k] = 3 + (i * 31 + k * 7) % 250;
        r->opts[i] = (khub_generate_opts){KHUB_STRUCT_INIT(khub_generate_opts), .max_new_tokens = 3,
                                          .ignore_eos = 1};
        r->req[i] = (khub_batch_request){KHUB_STRUCT_INIT(khub_batch_request), .tokens = r->ids[i],
                                         .n_tokens = 5, .opts = &r->opts[i]};
        r->res[i] = (khub_batch_result){KHUB_STRUCT_INIT(khub_batch_result)};
    }
}

/* A batch of three 5-token prompts: 15 query rows of 4 heads of 16 in the
 * first paged_attention call (layer 0), 960 values. */
TEST_IMPL(verify_catches_a_wrong_paged_attention_on_a_batch)
{
    fixture f = open_paged("paged_attn_wrong", "khub-test/paged-attn-wrong", 1);
    reqs r;
    make_reqs(&r);
    /* alone: one sequence per call, where the kernel is right */
    ASSERT_OK(khub_generate_batch(f.m, r.req, 1, NULL, r.res));
    ASSERT_OK(r.res[0].status);
    ASSERT_EQ(r.res[0].n_tokens, 3);
    khub_batch_results_free(f.m, r.res, 1);
    make_reqs(&r);
    khub_status st = khub_generate_batch(f.m, r.req, NREQ, NULL, r.res);
    ASSERT_STATUS(st, KHUB_STATUS_KERNEL_MISMATCH);
    char want[512];
    snprintf(want, sizeof want,
             "%s: KHUB_OPT_VERIFY_KERNELS: khub-test/paged-attn-wrong 1.0.0 :: paged_attention "
             "(paged_attention, layer 0) differs from khub/ref-cpu: NMSE 1 of out over 960 "
             "values, tolerance 1e-04",
             strrchr(f.dir, '/') + 1);
    ASSERT_STR_EQ(khub_runtime_errmsg(f.rt), want);
    khub_batch_results_free(f.m, r.res, NREQ);
    close_paged(&f);
}

/* The right twin passes the same batch under the check. */
TEST_IMPL(verify_passes_a_right_paged_attention)
{
    fixture f = open_paged("paged_attn", "khub-test/paged-attn", 1);
    reqs r;
    make_reqs(&r);
    ASSERT_OK(khub_generate_batch(f.m, r.req, NREQ, NULL, r.res));
    for (int i = 0; i < NREQ; i++) {
        ASSERT_OK(r.res[i].status);
        ASSERT_EQ(r.res[i].n_tokens, 3);
    }
    khub_batch_results_free(f.m, r.res, NREQ);
    close_paged(&f);
}

/* khub-test/paged-attn-scribble computes right but writes into the V pool
 * before it reads it: its output equals the reference's on the pools it
 * left, so only the digests of the blocks the call reads catch it, in the
 * first call (layer 0, the prompts), naming the pool, the block and the
 * sequence; without the check the batch completes on a corrupted cache. */
TEST_IMPL(verify_catches_a_paged_attention_that_writes_the_pools)
{
    fixture f = open_paged("paged_attn_scribble", "khub-test/paged-attn-scribble", 1);
    reqs r;
    make_reqs(&r);
    khub_status st = khub_generate_batch(f.m, r.req, NREQ, NULL, r.res);
    ASSERT_STATUS(st, KHUB_STATUS_KERNEL_MISMATCH);
    char want[512];
    snprintf(want, sizeof want,
             "%s: KHUB_OPT_VERIFY_KERNELS: khub-test/paged-attn-scribble 1.0.0 :: paged_attention "
             "(paged_attention, layer 0) wrote into the read-only KV pools: block 0 of the V pool "
             "(sequence 0's block 0) changed, 1 of the 6 blocks read",
             strrchr(f.dir, '/') + 1);
    ASSERT_STR_EQ(khub_runtime_errmsg(f.rt), want);
    ASSERT_STATUS(r.res[0].status, KHUB_STATUS_KERNEL_MISMATCH);
    ASSERT_STR_EQ(r.res[0].error, want); /* whole: it fits a result's 256 bytes */
    khub_batch_results_free(f.m, r.res, NREQ);
    close_paged(&f);
}

#define TEST_LIST(X) \
    X(verify_catches_a_wrong_paged_attention_on_a_batch) \
    X(verify_passes_a_right_paged_attention) \
    X(verify_catches_a_paged_attention_that_writes_the_pools)
TEST_MAIN(TEST_LIST)
