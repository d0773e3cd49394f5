/*
 * tp_plan.c: which part of the model each rank holds (tp.h has the split),
 * the refusal of splits that cannot be made, the printed plan, and the
 * switch of m->cfg to this rank's part after the load.
 */
#include <stdio.h>
#include <string.h>

#include "app_struct.h"
#include "executor.h"
#include "runtime_impl.h"

/* [first, first + n) of `total` units for rank r of T, as even as whole
 * units allow (the first total % T ranks get one more). */
static void share(int64_t total, int32_t T, int32_t r, int64_t *first, int64_t *n)
{
    int64_t base = total / T, extra = total % T;
    *first = r * base + (r < extra ? r : extra);
    *n = base + (r < extra ? 1 : 0);
}

/* The tensor names of the plan's messages, in the file's own naming. */
static const char *tname(const khub_model *m, const char *gguf, const char *hf)
{
    return m->gguf ? gguf : hf;
}

/* Rank r's query and KV heads of T ranks under c (the whole model's); false
 * when fewer KV heads than ranks cannot be spread evenly. */
static bool heads_of(const khub_model_config *c, int32_t T, int32_t r, int64_t *q0, int64_t *nq,
                     int64_t *kv0, int64_t *nkv)
{
    int64_t h = c->n_heads, kv = c->n_kv_heads, g = h / kv;
    if (kv >= T) { /* whole GQA groups per rank */
        share(kv, T, r, kv0, nkv);
        *q0 = *kv0 * g;
        *nq = *nkv * g;
        return true;
    }
    /* Fewer KV heads than ranks: each is replicated on T / kv ranks, which
     * split its group of query heads. */
    if (T % kv != 0 || h % T != 0) return false;
    *kv0 = r / (T / (int32_t)kv);
    *nkv = 1;
    *nq = h / T;
    *q0 = r * *nq;
    return true;
}

static khub_status plan_heads(khub_model *m)
{
    khub__tp *tp = &m->tp;
    const khub_model_config *c = &m->cfg;
    int32_t T = tp->size;
    KHUB_RETURN_IF(m->rt, !heads_of(c, T, tp->rank, &tp->q0, &tp->nq, &tp->kv0, &tp->nkv),
                   KHUB_STATUS_INVALID_ARG,
                   "%s: tp_size %d cannot split '%s': %lld KV heads (%lld query heads) over %d "
                   "ranks needs at least %d KV heads, or a rank count that is a multiple of the "
                   "KV heads and divides the query heads",
                   m->file, (int)T,
                   tname(m, "blk.0.attn_k.weight", "model.layers.0.self_attn.k_proj.weight"),
                   (long long)c->n_kv_heads, (long long)c->n_heads, (int)T, (int)T);
    return KHUB_STATUS_OK;
}

void khub__tp_share_of(const khub_model *m, khub__tp_part part, int32_t r, int64_t *first,
                       int64_t *n)
{
    const khub__tp *tp = &m->tp;
    const khub_model_config *f = &tp->full;
    if (part != KHUB__TP_PART_HEADS) {
        share(part == KHUB__TP_PART_FFN ? f->intermediate_size : f->hidden_size, tp->size, r, first,
              n);
        return;
    }
    int64_t q0 = 0, nq = 0, kv0, nkv;
    (void)heads_of(f, tp->size, r, &q0, &nq, &kv0, &nkv); /* checked by the plan */
    *first = q0 * f->head_dim;
    *n = nq * f->head_dim;
}

static khub_status check_plan(khub_model *m)
{
    int32_t plan = m->tp.plan;
    KHUB_RETURN_IF(m->rt, plan != KHUB_TP_PLAN_REDUCE && plan != KHUB_TP_PLAN_GATHER,
                   KHUB_STATUS_INVALID_ARG,
                   "khub_model_load: tp_plan %d is not a plan (want 0 = KHUB_TP_PLAN_REDUCE or "
                   "1 = KHUB_TP_PLAN_GATHER)",
                   (int)plan);
    return KHUB_STATUS_OK;
}

khub_status khub__tp_setup(khub_model *m, int32_t tp_size, int32_t plan, const khub_comm *comm)
{
    khub__tp *tp = &m->tp;
    tp->size = 1;
    tp->plan = plan;
    if (tp_size == 0 || tp_size == 1) return check_plan(m);
    KHUB_RETURN_IF(m->rt, tp_size < 0 || tp_size > 4096, KHUB_STATUS_INVALID_ARG,
                   "khub_model_load: tp_size %d out of range (want 1..4096)", (int)tp_size);
    KHUB_RETURN_IF(m->rt, !comm, KHUB_STATUS_INVALID_ARG,
                   "khub_model_load: tp_size %d needs a communicator (khub_model_opts.comm)",
                   (int)tp_size);
    /* below 0.1's size STRUCT_SIZE, as every application struct (it was
     * INVALID_ARG with the missing functions' message before session 18) */
    KHUB__APP_CHECK(m->rt, comm, KHUB__SIZE_TO(khub_comm, barrier), "khub_model_load", "opts.comm");
    KHUB_RETURN_IF(
        m->rt, !comm->all_reduce_sum_f32 || !comm->all_gather || !comm->broadcast || !comm->barrier,
        KHUB_STATUS_INVALID_ARG,
        "khub_model_load: khub_model_opts.comm lacks a function (want all four set)");
    KHUB_RETURN_IF(m->rt, comm->size != tp_size || comm->rank < 0 || comm->rank >= comm->size,
                   KHUB_STATUS_INVALID_ARG,
                   "khub_model_load: tp_size %d but the communicator has rank %d of %d ranks "
                   "(start as many ranks as tp_size)",
                   (int)tp_size, (int)comm->rank, (int)comm->size);
    tp->comm = *comm;
    tp->size = tp_size;
    tp->rank = comm->rank;
    khub__runtime_lend_comm(m->rt, comm, m); /* plugins' host->comm_* (ABI 1.5) */
    return check_plan(m);                    /* every rank then meets in khub__tp_agree */
}

khub_status khub__tp_plan(khub_model *m)
{
    khub__tp *tp = &m->tp;
    const khub_model_config *c = &m->cfg;
    int32_t tp_size = tp->size;
    tp->full = *c;
    tp->nq = c->n_heads;
    tp->nkv = c->n_kv_heads;
    tp->nffn = c->intermediate_size;
    tp->nvocab = c->vocab_size;
    tp->nh = c->hidden_size;
    if (tp_size < 2) return KHUB_STATUS_OK;
    KHUB_FORWARD_IF_ERROR(m->rt, plan_heads(m));
    KHUB_RETURN_IF(m->rt, c->intermediate_size % tp_size != 0, KHUB_STATUS_INVALID_ARG,
                   "%s: tp_size %d cannot split '%s': intermediate size %lld is not a multiple "
                   "of %d",
                   m->file, (int)tp_size,
                   tname(m, "blk.0.ffn_gate.weight", "model.layers.0.mlp.gate_proj.weight"),
                   (long long)c->intermediate_size, (int)tp_size);
    KHUB_RETURN_IF(m->rt, c->vocab_size % tp_size != 0, KHUB_STATUS_INVALID_ARG,
                   "%s: tp_size %d cannot split '%s': vocabulary %lld is not a multiple of %d",
                   m->file, (int)tp_size,
                   c->tie_word_embeddings
                       ? tname(m, "token_embd.weight", "model.embed_tokens.weight")
                       : tname(m, "output.weight", "lm_head.weight"),
                   (long long)c->vocab_size, (int)tp_size);
    tp->nffn = c->intermediate_size / tp_size;
    tp->ffn0 = tp->rank * tp->nffn;
    tp->nvocab = c->vocab_size / tp_size;
    tp->vocab0 = tp->rank * tp->nvocab;
    if (tp->plan == KHUB_TP_PLAN_GATHER) {
        KHUB_RETURN_IF(
            m->rt, c->hidden_size % tp_size != 0, KHUB_STATUS_INVALID_ARG,
            "%s: tp_size %d with the gather plan cannot split '%s': hidden size %lld "
            "is not a multiple of %d",
            m->file, (int)tp_size,
            tname(m, "blk.0.attn_output.weight", "model.layers.0.self_attn.o_proj.weight"),
            (long long)c->hidden_size, (int)tp_size);
        tp->nh = c->hidden_size / tp_size;
        tp->h0 = tp->rank * tp->nh;
    }
    KHUB_LOG_I(m->rt,
               "%s: tp rank %d of %d: query heads [%lld, %lld), KV heads [%lld, %lld), FFN "
               "[%lld, %lld), vocabulary [%lld, %lld)",
               m->file, (int)tp->rank, (int)tp->size, (long long)tp->q0,
               (long long)(tp->q0 + tp->nq), (long long)tp->kv0, (long long)(tp->kv0 + tp->nkv),
               (long long)tp->ffn0, (long long)(tp->ffn0 + tp->nffn), (long long)tp->vocab0,
               (long long)(tp->vocab0 + tp->nvocab));
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* The printed plan                                                         */
/* ======================================================================== */

static size_t put(char *buf, size_t cap, size_t len, const char *fmt, const char *name,
                  const char *how, const char *part)
{
    if (len >= cap) return len;
    int n = snprintf(buf + len, cap - len, fmt, name, how, part);
    return n < 0 ? len : len + (size_t)n;
}

void khub__tp_explain(const khub_model *m, char *buf, size_t cap)
{
    const khub__tp *tp = &m->tp;
    const khub_model_config *f = &tp->full;
    if (cap) buf[0] = '\0';
    if (tp->size < 2 || !cap) return;
    char q[96], kv[96], ffn[96], voc[96];
    int64_t hd = f->head_dim;
    snprintf(q, sizeof q, "query heads %lld-%lld of %lld: rows %lld-%lld", (long long)tp->q0,
             (long long)(tp->q0 + tp->nq - 1), (long long)f->n_heads, (long long)(tp->q0 * hd),
             (long long)((tp->q0 + tp->nq) * hd - 1));
    snprintf(kv, sizeof kv, "KV heads %lld-%lld of %lld: rows %lld-%lld%s", (long long)tp->kv0,
             (long long)(tp->kv0 + tp->nkv - 1), (long long)f->n_kv_heads,
             (long long)(tp->kv0 * hd), (long long)((tp->kv0 + tp->nkv) * hd - 1),
             f->n_kv_heads < tp->size ? " (replicated)" : "");
    snprintf(ffn, sizeof ffn, "channels %lld-%lld of %lld", (long long)tp->ffn0,
             (long long)(tp->ffn0 + tp->nffn - 1), (long long)f->intermediate_size);
    snprintf(voc, sizeof voc, "tokens %lld-%lld of %lld, logits all-gathered",
             (long long)tp->vocab0, (long long)(tp->vocab0 + tp->nvocab - 1),
             (long long)f->vocab_size);
    bool g = m->gguf != NULL, gather = tp->plan == KHUB_TP_PLAN_GATHER;
    const char *fmt = "    %-34s %-9s %s\n";
    size_t n = (size_t)snprintf(buf, cap, "tp plan: rank %d of %d (%s)\n", (int)tp->rank,
                                (int)tp->size, gather ? "gather" : "reduce");
    n = put(buf, cap, n, fmt, g ? "blk.*.attn_q.weight" : "layers.*.self_attn.q_proj", "colwise",
            q);
    n = put(buf, cap, n, fmt, g ? "blk.*.attn_k.weight" : "layers.*.self_attn.k_proj", "colwise",
            kv);
    n = put(buf, cap, n, fmt, g ? "blk.*.attn_v.weight" : "layers.*.self_attn.v_proj", "colwise",
            kv);
    char o_how[160], d_how[160];
    snprintf(o_how, sizeof o_how,
             "hidden rows %lld-%lld of %lld from the whole attention "
             "output (all-gathered), then all-gather",
             (long long)tp->h0, (long long)(tp->h0 + tp->nh - 1), (long long)f->hidden_size);
    snprintf(d_how, sizeof d_how,
             "hidden rows %lld-%lld of %lld from the whole FFN activation "
             "(all-gathered), then all-gather",
             (long long)tp->h0, (long long)(tp->h0 + tp->nh - 1), (long long)f->hidden_size);
    n = put(buf, cap, n, fmt, g ? "blk.*.attn_output.weight" : "layers.*.self_attn.o_proj",
            gather ? "colwise" : "rowwise",
            gather ? o_how : "columns of the query heads above, then all-reduce");
    n = put(buf, cap, n, fmt, g ? "blk.*.ffn_gate.weight" : "layers.*.mlp.gate_proj", "colwise",
            ffn);
    n = put(buf, cap, n, fmt, g ? "blk.*.ffn_up.weight" : "layers.*.mlp.up_proj", "colwise", ffn);
    n = put(buf, cap, n, fmt, g ? "blk.*.ffn_down.weight" : "layers.*.mlp.down_proj",
            gather ? "colwise" : "rowwise",
            gather ? d_how : "columns of the channels above, then all-reduce");
    n = put(buf, cap, n, fmt, g ? "blk.*.*_norm.weight" : "layers.*.*layernorm", "replicated", "");
    n = put(buf, cap, n, fmt, g ? "token_embd.weight" : "embed_tokens", "replicated", "row lookup");
    n = put(buf, cap, n, fmt,
            m->lm_head.w.name == m->embed.name ? (g ? "output (tied)" : "lm_head (tied)")
                                               : (g ? "output.weight" : "lm_head"),
            "colwise", voc);
}

/* ======================================================================== */
/* This rank's config                                                       */
/* ======================================================================== */

/* The gather plan's buffers (tp.h), sized for the widest input (the query
 * heads' output or the FFN channels) and the widest rank's share. */
static khub_status gather_buffers(khub_model *m)
{
    khub__tp *tp = &m->tp;
    const khub_model_config *f = &tp->full;
    size_t B = (size_t)m->max_batch;
    int64_t widest = tp->nh, first, n;
    for (int32_t r = 0; r < tp->size; r++) {
        khub__tp_share_of(m, KHUB__TP_PART_HEADS, r, &first, &n);
        widest = n > widest ? n : widest;
        khub__tp_share_of(m, KHUB__TP_PART_FFN, r, &first, &n);
        widest = n > widest ? n : widest;
    }
    int64_t cols = f->n_heads * f->head_dim;
    cols = f->intermediate_size > cols ? f->intermediate_size : cols;
    tp->whole_floats = B * (size_t)cols;
    tp->share_floats = B * (size_t)widest;
    tp->whole = khub__aligned_alloc(m->rt, tp->whole_floats * sizeof(float));
    tp->part = khub__aligned_alloc(m->rt, B * (size_t)tp->nh * sizeof(float));
    tp->send = khub__aligned_alloc(m->rt, tp->share_floats * sizeof(float));
    tp->recv = khub__aligned_alloc(m->rt, (size_t)tp->size * tp->share_floats * sizeof(float));
    KHUB_RETURN_IF(m->rt, !tp->whole || !tp->part || !tp->send || !tp->recv, KHUB_STATUS_NOMEM,
                   "%s: no memory for the gather plan's buffers", m->file);
    m->scratch_bytes +=
        (tp->whole_floats + B * (size_t)tp->nh + (size_t)(tp->size + 1) * tp->share_floats) *
        sizeof(float);
    return KHUB_STATUS_OK;
}

khub_status khub__tp_localize(khub_model *m)
{
    khub__tp *tp = &m->tp;
    if (tp->size < 2) return KHUB_STATUS_OK;
    m->cfg.n_heads = tp->nq;
    m->cfg.n_kv_heads = tp->nkv;
    m->cfg.intermediate_size = tp->nffn;
    size_t S = (size_t)m->max_seqs, V = (size_t)tp->nvocab;
    tp->logits = khub__aligned_alloc(m->rt, S * V * sizeof(float));
    tp->gathered = khub__aligned_alloc(m->rt, (size_t)tp->size * S * V * sizeof(float));
    tp->tokens = khub__calloc(m->rt, (size_t)m->max_batch, sizeof *tp->tokens);
    tp->segs = khub__calloc(m->rt, S, sizeof *tp->segs);
    KHUB_RETURN_IF(m->rt, !tp->logits || !tp->gathered || !tp->tokens || !tp->segs,
                   KHUB_STATUS_NOMEM, "%s: no memory for the tensor-parallel buffers", m->file);
    m->scratch_bytes += (size_t)(tp->size + 1) * S * V * sizeof(float);
    return tp->plan == KHUB_TP_PLAN_GATHER ? gather_buffers(m) : KHUB_STATUS_OK;
}

void khub__tp_free(khub_model *m)
{
    khub__tp *tp = &m->tp;
    khub__runtime_return_comm(m->rt, m);
    khub__aligned_free(m->rt, tp->logits);
    khub__aligned_free(m->rt, tp->gathered);
    float **bufs[] = {&tp->whole, &tp->part, &tp->send, &tp->recv};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        khub__aligned_free(m->rt, *bufs[i]);
        *bufs[i] = NULL;
    }
    khub__free(m->rt, tp->tokens, tp->tokens ? (size_t)m->max_batch * sizeof *tp->tokens : 0);
    khub__free(m->rt, tp->segs, tp->segs ? (size_t)m->max_seqs * sizeof *tp->segs : 0);
    tp->logits = tp->gathered = NULL;
    tp->tokens = NULL;
    tp->segs = NULL;
}
