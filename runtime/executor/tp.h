/*
 * tp.h: tensor parallelism (issue 18): the plan that splits a model over
 * the ranks of a khub_comm (tp_plan.c), the shards each rank keeps
 * (tp_shard.c), and the collectives of the forward pass, the step that
 * rank 0 broadcasts to the others and the checks that every rank loaded
 * the same model (tp.c). docs/parallelism.md tells the whole story.
 *
 * The split is Megatron-LM's, as Transformers' `_tp_plan` and vLLM write it:
 *   q/k/v, gate/up        colwise: each rank computes its rows of the output
 *   o_proj, down_proj     rowwise: each rank multiplies its columns, then one
 *                         all-reduce (sum) of the [tokens, hidden] partials
 *   lm_head               colwise over the vocabulary, logits all-gathered
 *   embedding, norms      replicated
 * The gather plan (KHUB_TP_PLAN_GATHER) splits o_proj and down_proj the
 * other way: each rank computes its rows of the [tokens, hidden] output
 * from the whole input (all-gathered: the query heads' attention output,
 * the FFN channels), then the rows are all-gathered. No float sum crosses
 * ranks, so a row-deterministic kernel gives the logits one process gives.
 * Attention heads go by whole GQA groups: a rank holds some KV heads and the
 * query heads that read them. With fewer KV heads than ranks each KV head is
 * replicated on ranks/kv_heads ranks, which split its query heads. The
 * groups need not divide evenly (SmolLM2-135M's 3 KV heads over 2 ranks: 2
 * and 1); the FFN width and the vocabulary must divide, and every column
 * split of a block-quantized matrix must fall on a block boundary.
 *
 * After the load, m->cfg describes this rank's part (n_heads, n_kv_heads,
 * intermediate_size are local) and tp.full the whole model, so the forward
 * pass, the KV cache and the scratch need no other change.
 */
#ifndef KHUB_RUNTIME_TP_H
#define KHUB_RUNTIME_TP_H

#include "khub/khub_comm.h"
#include "model_config.h"

typedef struct khub_model khub_model;
typedef struct khub__mat khub__mat;
typedef struct khub__seg khub__seg;

/* How a weight is split (its row in the printed plan). */
typedef enum khub__tp_split {
    KHUB__TP_REPLICATE, /* the whole tensor on every rank */
    KHUB__TP_COL_Q,     /* rows of this rank's query heads */
    KHUB__TP_COL_KV,    /* rows of this rank's KV heads */
    KHUB__TP_COL_FFN,   /* rows of this rank's FFN slice (gate, up) */
    KHUB__TP_COL_VOCAB, /* rows of this rank's vocabulary slice (lm_head) */
    KHUB__TP_ROW_HEADS, /* columns of this rank's query heads (o_proj) */
    KHUB__TP_ROW_FFN,   /* columns of this rank's FFN slice (down_proj) */
    KHUB__TP_COL_HIDDEN /* rows of this rank's hidden slice (gather plan's o/down) */
} khub__tp_split;

/* What the gather plan all-gathers: the inputs of o_proj (the query heads'
 * attention output) and down_proj (the FFN channels), and their outputs
 * (hidden rows). */
typedef enum khub__tp_part {
    KHUB__TP_PART_HEADS,
    KHUB__TP_PART_FFN,
    KHUB__TP_PART_HIDDEN
} khub__tp_part;

/* A kernel swap that rank 0 asked for (khub_model_kernel_swap under tp),
 * run on a rank > 0 from khub_model_tp_serve: make `name` ready for role,
 * agree with the other ranks (khub__tp_agree_swap) and switch, or not. The
 * executor knows no hub; runtime/kernels sets it (khub_model_tp_serve_kernels). */
typedef khub_status (*khub__tp_swap_fn)(void *ud, khub_model *m, int32_t role, const char *name);

typedef struct khub__tp {
    int32_t size, rank; /* 1, 0 without tensor parallelism */
    int32_t plan;       /* enum khub_tp_plan */
    khub_comm comm;     /* the embedder's table, copied up to its struct_size */
    khub_model_config full;
    /* This rank's part, [first, first + n) in heads, channels or tokens. */
    int64_t q0, nq, kv0, nkv, ffn0, nffn, vocab0, nvocab, h0, nh;
    /* The gather plan's buffers: the whole input [max_batch, columns], this
     * rank's output rows [max_batch, nh], and the all-gather's send
     * [max_batch, widest share] and receive [size, max_batch, widest share]. */
    float *whole, *part, *send, *recv;
    size_t whole_floats, share_floats;
    bool serving;     /* rank 0: the others wait in khub_model_tp_serve */
    float *logits;    /* [max_seqs, nvocab] this rank's logits */
    float *gathered;  /* [size, max_seqs, nvocab] every rank's */
    int32_t *tokens;  /* [max_batch] a step's tokens (ranks > 0) */
    khub__seg *segs;  /* [max_seqs] a step's segments (ranks > 0) */
    uint64_t comm_ns; /* time spent in collectives */
    uint64_t n_collectives;
    bool broken;              /* a collective failed: the job cannot go on */
    khub__tp_swap_fn on_swap; /* ranks > 0: how to follow a swap; NULL = refuse it */
    void *on_swap_ud;
} khub__tp;

/* ---- tp_plan.c ---------------------------------------------------------- */

/* Checks tp_size and comm of the options and keeps them in m->tp (size 1
 * without); before anything else of the load, so that every rank takes
 * part in the load agreement (khub__tp_agree) whatever fails later. */
KHUB_INTERNAL khub_status khub__tp_setup(khub_model *m, int32_t tp_size, int32_t plan,
                                         const khub_comm *comm);
/* Computes this rank's ranges from m->cfg (the whole model's, kept in
 * tp.full), refusing with INVALID_ARG a split that cannot be made, naming
 * the tensor. */
KHUB_INTERNAL khub_status khub__tp_plan(khub_model *m);
/* The plan, one line per tensor pattern, into buf (cap bytes, cut short
 * when it does not fit); "" without tp. */
KHUB_INTERNAL void khub__tp_explain(const khub_model *m, char *buf, size_t cap);
/* After the weights: m->cfg becomes this rank's part (tp.full keeps the
 * model's), and the tp scratch is allocated. */
KHUB_INTERNAL khub_status khub__tp_localize(khub_model *m);
KHUB_INTERNAL void khub__tp_free(khub_model *m);

/* Rank r's share [first, first + n) of `part`'s columns (heads in units of
 * head_dim), as khub__tp_plan gave it to that rank. */
KHUB_INTERNAL void khub__tp_share_of(const khub_model *m, khub__tp_part part, int32_t r,
                                     int64_t *first, int64_t *n);

/* ---- tp_shard.c --------------------------------------------------------- */

/* Cuts mat (and its bias) down to this rank's shard for split. Rows of a
 * mapped weight stay mapped (a view); columns are copied into a block the
 * weight owns. INVALID_ARG naming the tensor when a column split does not
 * fall on a block boundary of its format. No-op without tp. */
KHUB_INTERNAL khub_status khub__tp_shard(khub_model *m, khub__tp_split split, khub__mat *mat);

/* ---- tp.c ---------------------------------------------------------------- */

/* Sums buf[0..n) over the ranks (no-op without tp). */
KHUB_INTERNAL khub_status khub__tp_all_reduce(khub_model *m, float *buf, int64_t n);
/* The gather plan: x [n, this rank's columns of part] all-gathered into
 * tp.whole [n, every column], in the model's column order. */
KHUB_INTERNAL khub_status khub__tp_gather_input(khub_model *m, khub__tp_part part, const float *x,
                                                int64_t n);
/* The gather plan: tp.part [n, nh] of every rank all-gathered into
 * y [n, hidden]. */
KHUB_INTERNAL khub_status khub__tp_gather_output(khub_model *m, int64_t n, float *y);
/* The lm_head's local logits (tp.logits) of n rows into m->logits [n, vocab]. */
KHUB_INTERNAL khub_status khub__tp_gather_logits(khub_model *m, int n);
/* Rank 0 tells the others to run the same forward step (all_rows: with
 * every row's logits, khub_model_logits_all), or to truncate a sequence to
 * `keep` tokens; no-op on other ranks and without tp. */
KHUB_INTERNAL khub_status khub__tp_lead_forward(khub_model *m, const int32_t *tokens,
                                                const khub__seg *segs, int n_segs, bool all_rows);
KHUB_INTERNAL khub_status khub__tp_lead_truncate(khub_model *m, int32_t seq, int64_t keep);
/* Rank 0 tells the others to swap role's kernel to `name` (at most 1023
 * bytes); then every rank runs the same agreement (khub__tp_agree_swap). */
KHUB_INTERNAL khub_status khub__tp_lead_swap(khub_model *m, int32_t role, const char *name);
/* One round of a swap's agreement, collective: every rank gives its status
 * (and message on m->rt when failed) and, when OK, the SHA-256 of the plugin
 * it would switch to ("" for a built-in one). OK when every rank is OK with
 * the same bytes; else every rank fails with the first failing rank's
 * status and "tp rank R: <its message>" (its own message when it failed). */
KHUB_INTERNAL khub_status khub__tp_agree_swap(khub_model *m, khub_status st, const char *sha256);
/* Rank 0 releases the others' serve loops (khub_model_free). */
KHUB_INTERNAL void khub__tp_lead_stop(khub_model *m);
/* After the load on every rank, its status: every rank learns every
 * other's status and SHA-256 of the model file, and fails when any rank
 * failed or loaded different bytes, naming the rank. */
KHUB_INTERNAL khub_status khub__tp_agree(khub_model *m, khub_status st);

#endif /* KHUB_RUNTIME_TP_H */
