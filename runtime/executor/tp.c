/*
 * tp.c: the collectives of a tensor-parallel forward pass, the step loop
 * of ranks > 0 (khub_model_tp_serve), and the load-time agreement that
 * every rank loaded, and loaded the same bytes (tp.h, issue 18).
 *
 * Rank 0 drives: it tokenizes, schedules and samples, and before each
 * forward call or sequence truncation broadcasts the step (a header, then the
 * segments and tokens) so the other ranks make the same call on their
 * shards. The forward pass itself then meets twice per layer (the
 * all-reduce after o_proj and after down_proj; the gather plan meets four
 * times: each projection's input and output all-gathered) and once at the
 * end (the all-gather of the logits). Any collective that fails ends the job on
 * that rank with a message naming the rank and the step; a rank that dies
 * is noticed by the transport (mpirun ends the job), never by a timeout of
 * ours.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "executor.h"
#include "safetensors.h"

enum { STEP_FORWARD = 1, STEP_TRUNCATE = 2, STEP_STOP = 3, STEP_SWAP = 4 };
enum { SWAP_NAME_MAX = 1024 };

typedef struct step_hdr {
    int32_t op;
    int32_t n_segs;   /* STEP_FORWARD */
    int32_t n_tokens; /* STEP_FORWARD */
    int32_t seq;      /* STEP_TRUNCATE: the sequence and the tokens it keeps;
                         STEP_SWAP: the role and the bytes of the name */
    int32_t all_rows; /* STEP_FORWARD: 1 = every row's logits (khub_model_logits_all) */
    int64_t keep;
} step_hdr;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Turns a collective's failure into the model's error. */
static khub_status comm_done(khub_model *m, khub_status st, const char *what, const char *err,
                             uint64_t t0)
{
    m->tp.comm_ns += now_ns() - t0;
    m->tp.n_collectives++;
    if (st == KHUB_STATUS_OK) return st;
    m->tp.broken = true;
    return khub__fail(m->rt, st, "%s: tp rank %d of %d: %s failed: %s", m->file, (int)m->tp.rank,
                      (int)m->tp.size, what, err[0] ? err : khub_status_str(st));
}

static khub_status bcast(khub_model *m, void *buf, size_t bytes, const char *what)
{
    char err[256] = "";
    uint64_t t0 = now_ns();
    khub_status st = m->tp.comm.broadcast(m->tp.comm.ud, buf, bytes, 0, err, sizeof err);
    return comm_done(m, st, what, err, t0);
}

khub_status khub__tp_all_reduce(khub_model *m, float *buf, int64_t n)
{
    if (m->tp.size < 2) return KHUB_STATUS_OK;
    char err[256] = "";
    uint64_t t0 = now_ns();
    khub_status st = m->tp.comm.all_reduce_sum_f32(m->tp.comm.ud, buf, n, err, sizeof err);
    return comm_done(m, st, "all-reduce", err, t0);
}

khub_status khub__tp_gather_logits(khub_model *m, int n)
{
    khub__tp *tp = &m->tp;
    size_t nv = (size_t)tp->nvocab, V = (size_t)m->cfg.vocab_size;
    char err[256] = "";
    uint64_t t0 = now_ns();
    khub_status st = tp->comm.all_gather(tp->comm.ud, tp->logits, (size_t)n * nv * sizeof(float),
                                         tp->gathered, err, sizeof err);
    KHUB_FORWARD_IF_ERROR(m->rt, comm_done(m, st, "logits all-gather", err, t0));
    /* gathered is [rank][row][nv]; the logits are [row][rank * nv]. */
    for (int r = 0; r < tp->size; r++)
        for (int s = 0; s < n; s++)
            memcpy(m->logits + (size_t)s * V + (size_t)r * nv,
                   tp->gathered + ((size_t)r * (size_t)n + (size_t)s) * nv, nv * sizeof(float));
    return KHUB_STATUS_OK;
}

/* Every rank's [n, its share of part] block of an [n, cols] matrix into out
 * (in the model's column order). The blocks travel padded to the widest
 * share, since an all-gather moves the same bytes from every rank. */
static khub_status gather_cols(khub_model *m, khub__tp_part part, const float *x, int64_t n,
                               float *out, int64_t cols, const char *what)
{
    khub__tp *tp = &m->tp;
    size_t w = tp->share_floats / (size_t)m->max_batch, rows = (size_t)n;
    int64_t c0, nc;
    khub__tp_share_of(m, part, tp->rank, &c0, &nc);
    for (size_t i = 0; i < rows; i++)
        memcpy(tp->send + i * w, x + i * (size_t)nc, (size_t)nc * sizeof(float));
    char err[256] = "";
    uint64_t t0 = now_ns();
    khub_status st = tp->comm.all_gather(tp->comm.ud, tp->send, rows * w * sizeof(float), tp->recv,
                                         err, sizeof err);
    KHUB_FORWARD_IF_ERROR(m->rt, comm_done(m, st, what, err, t0));
    for (int32_t r = 0; r < tp->size; r++) {
        khub__tp_share_of(m, part, r, &c0, &nc);
        const float *blk = tp->recv + (size_t)r * rows * w;
        for (size_t i = 0; i < rows; i++)
            memcpy(out + i * (size_t)cols + (size_t)c0, blk + i * w, (size_t)nc * sizeof(float));
    }
    return KHUB_STATUS_OK;
}

khub_status khub__tp_gather_input(khub_model *m, khub__tp_part part, const float *x, int64_t n)
{
    const khub_model_config *f = &m->tp.full;
    bool heads = part == KHUB__TP_PART_HEADS;
    return gather_cols(m, part, x, n, m->tp.whole,
                       heads ? f->n_heads * f->head_dim : f->intermediate_size,
                       heads ? "attention output all-gather" : "FFN activation all-gather");
}

khub_status khub__tp_gather_output(khub_model *m, int64_t n, float *y)
{
    return gather_cols(m, KHUB__TP_PART_HIDDEN, m->tp.part, n, y, m->tp.full.hidden_size,
                       "hidden rows all-gather");
}

/* ======================================================================== */
/* Steps: rank 0 leads, the others serve                                    */
/* ======================================================================== */

static bool leads(const khub_model *m) { return m->tp.size > 1 && m->tp.rank == 0; }

khub_status khub__tp_lead_forward(khub_model *m, const int32_t *tokens, const khub__seg *segs,
                                  int n_segs, bool all_rows)
{
    if (!leads(m)) return KHUB_STATUS_OK;
    int64_t n = 0;
    for (int s = 0; s < n_segs; s++) n += segs[s].n;
    step_hdr h = {STEP_FORWARD, n_segs, (int32_t)n, -1, all_rows, 0};
    KHUB_FORWARD_IF_ERROR(m->rt, bcast(m, &h, sizeof h, "step broadcast"));
    KHUB_FORWARD_IF_ERROR(m->rt,
                          bcast(m, (void *)segs, (size_t)n_segs * sizeof *segs, "step broadcast"));
    return bcast(m, (void *)tokens, (size_t)n * sizeof *tokens, "step broadcast");
}

khub_status khub__tp_lead_truncate(khub_model *m, int32_t seq, int64_t keep)
{
    if (!leads(m)) return KHUB_STATUS_OK;
    step_hdr h = {STEP_TRUNCATE, 0, 0, seq, 0, keep};
    return bcast(m, &h, sizeof h, "step broadcast");
}

khub_status khub__tp_lead_swap(khub_model *m, int32_t role, const char *name)
{
    if (!leads(m)) return KHUB_STATUS_OK;
    char buf[SWAP_NAME_MAX] = "";
    size_t n = strlen(name) + 1;
    KHUB_RETURN_IF(m->rt, n > sizeof buf, KHUB_STATUS_INVALID_ARG,
                   "kernel swap: the name is %zu bytes; at most %d under tp", n - 1,
                   SWAP_NAME_MAX - 1);
    memcpy(buf, name, n);
    step_hdr h = {STEP_SWAP, 0, 0, role, 0, (int64_t)n};
    KHUB_FORWARD_IF_ERROR(m->rt, bcast(m, &h, sizeof h, "step broadcast"));
    return bcast(m, buf, n, "step broadcast");
}

typedef struct swap_rec {
    int32_t status;
    int32_t pad;
    char sha[72];
    char msg[432];
} swap_rec;

khub_status khub__tp_agree_swap(khub_model *m, khub_status st, const char *sha256)
{
    khub__tp *tp = &m->tp;
    swap_rec mine = {.status = (int32_t)st};
    snprintf(mine.sha, sizeof mine.sha, "%s", sha256 ? sha256 : "");
    if (st != KHUB_STATUS_OK) snprintf(mine.msg, sizeof mine.msg, "%s", khub_runtime_errmsg(m->rt));
    swap_rec *all = khub__calloc(m->rt, (size_t)tp->size, sizeof *all);
    KHUB_RETURN_IF(m->rt, !all, KHUB_STATUS_NOMEM, "%s: out of memory", m->file);
    char err[256] = "";
    uint64_t t0 = now_ns();
    khub_status cs = tp->comm.all_gather(tp->comm.ud, &mine, sizeof mine, all, err, sizeof err);
    cs = comm_done(m, cs, "kernel swap agreement", err, t0);
    if (cs == KHUB_STATUS_OK && st != KHUB_STATUS_OK) cs = st; /* our own message is set */
    for (int r = 0; r < tp->size && cs == KHUB_STATUS_OK; r++) {
        if (all[r].status != KHUB_STATUS_OK)
            cs = khub__fail(m->rt, (khub_status)all[r].status, "tp rank %d: %.420s", r, all[r].msg);
        else if (strcmp(all[r].sha, all[0].sha) != 0)
            cs = khub__fail(m->rt, KHUB_STATUS_DIGEST_MISMATCH,
                            "kernel swap: tp rank %d prepared different kernel bytes than rank 0 "
                            "(sha256 %.12s... vs %.12s...); every rank must run the same build",
                            r, all[r].sha[0] ? all[r].sha : "(built-in)",
                            all[0].sha[0] ? all[0].sha : "(built-in)");
    }
    khub__free(m->rt, all, (size_t)tp->size * sizeof *all);
    return cs;
}

/* A rank > 0 told to swap: its way to follow, or a refusal every rank
 * hears. A swap that fails leaves every rank on its old kernel and the
 * job running; only a failed collective ends it. */
static khub_status serve_swap(khub_model *m, const step_hdr *h)
{
    char name[SWAP_NAME_MAX];
    KHUB_RETURN_IF(m->rt, h->keep < 1 || h->keep > SWAP_NAME_MAX, KHUB_STATUS_INTERNAL,
                   "%s: tp rank %d: rank 0 sent a kernel name of %lld bytes", m->file,
                   (int)m->tp.rank, (long long)h->keep);
    KHUB_FORWARD_IF_ERROR(m->rt, bcast(m, name, (size_t)h->keep, "step broadcast"));
    name[h->keep - 1] = '\0';
    khub_status st;
    if (m->tp.on_swap) {
        st = m->tp.on_swap(m->tp.on_swap_ud, m, h->seq, name);
    } else {
        khub__fail(m->rt, KHUB_STATUS_UNSUPPORTED,
                   "kernel swap: this rank follows with khub_model_tp_serve, which cannot swap "
                   "kernels (khub_model_tp_serve_kernels can)");
        st = khub__tp_agree_swap(m, KHUB_STATUS_UNSUPPORTED, NULL);
    }
    if (st != KHUB_STATUS_OK && !m->tp.broken) {
        KHUB_LOG_W(m->rt, "%s: tp rank %d kept its kernels: %s", m->file, (int)m->tp.rank,
                   khub_runtime_errmsg(m->rt));
        return KHUB_STATUS_OK;
    }
    return st;
}

void khub__tp_lead_stop(khub_model *m)
{
    if (!leads(m) || !m->tp.serving) return;
    step_hdr h = {STEP_STOP, 0, 0, -1, 0, 0};
    if (bcast(m, &h, sizeof h, "stop broadcast") != KHUB_STATUS_OK)
        KHUB_LOG_W(m->rt, "%s", khub_runtime_errmsg(m->rt));
    m->tp.serving = false;
}

/* One step from rank 0: STOP ends the loop (*stop), others run. */
static khub_status serve_step(khub_model *m, bool *stop)
{
    khub__tp *tp = &m->tp;
    step_hdr h;
    KHUB_FORWARD_IF_ERROR(m->rt, bcast(m, &h, sizeof h, "waiting for rank 0's next step"));
    if (h.op == STEP_STOP) {
        *stop = true;
        return KHUB_STATUS_OK;
    }
    if (h.op == STEP_TRUNCATE) return khub__forward_truncate(m, h.seq, h.keep);
    if (h.op == STEP_SWAP) return serve_swap(m, &h);
    KHUB_RETURN_IF(m->rt,
                   h.op != STEP_FORWARD || h.n_segs < 1 || h.n_segs > m->max_seqs ||
                       h.n_tokens < 1 || h.n_tokens > m->max_batch,
                   KHUB_STATUS_INTERNAL,
                   "%s: tp rank %d: rank 0 sent step %d with %d segments of %d tokens (this rank "
                   "takes %d and %d): do all ranks load with the same options?",
                   m->file, (int)tp->rank, (int)h.op, (int)h.n_segs, (int)h.n_tokens,
                   (int)m->max_seqs, (int)m->max_batch);
    KHUB_FORWARD_IF_ERROR(
        m->rt, bcast(m, tp->segs, (size_t)h.n_segs * sizeof *tp->segs, "step broadcast"));
    KHUB_FORWARD_IF_ERROR(
        m->rt, bcast(m, tp->tokens, (size_t)h.n_tokens * sizeof *tp->tokens, "step broadcast"));
    return khub__forward_rows(m, tp->tokens, tp->segs, h.n_segs, h.all_rows != 0, NULL);
}

khub_status khub_model_tp_serve(khub_model *m)
{
    KHUB_API_CHECK(m ? m->rt : NULL, m);
    khub__clear(m->rt);
    KHUB_RETURN_IF(m->rt, m->tp.size < 2 || m->tp.rank == 0, KHUB_STATUS_INVALID_ARG,
                   "khub_model_tp_serve: only ranks other than 0 of a model loaded with tp_size "
                   "> 1 serve (this is rank %d of %d)",
                   (int)m->tp.rank, (int)m->tp.size);
    bool stop = false;
    while (!stop) {
        khub_status st = serve_step(m, &stop);
        /* A failed step has no way back: rank 0 is in a collective that this
         * rank will not join. End the job rather than hang it. */
        if (st != KHUB_STATUS_OK) return st;
    }
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* Load agreement                                                           */
/* ======================================================================== */

typedef struct agree_rec {
    int32_t status;
    int32_t pad;
    char sha[72]; /* hex SHA-256 of the model's bytes */
    char msg[176];
} agree_rec;

/* SHA-256 of the model: the file, or a folder's digests of its shards. */
static khub_status model_digest(khub_model *m, char hex[65])
{
    if (m->gguf) return khub__sha256_file_hex(m->path, hex);
    char cat[65 * 64 + 1] = "";
    size_t len = 0;
    for (size_t i = 0; i < 64; i++) {
        const char *p = m->st ? khub__safetensors_shard_path(m->st, i) : NULL;
        if (!p) break;
        KHUB_FORWARD_IF_ERROR(m->rt, khub__sha256_file_hex(p, cat + len));
        len += 64;
    }
    return khub__sha256_hex(cat, len, hex);
}

khub_status khub__tp_agree(khub_model *m, khub_status st)
{
    khub__tp *tp = &m->tp;
    if (tp->size < 2) return st;
    agree_rec mine = {.status = (int32_t)st};
    if (st == KHUB_STATUS_OK && model_digest(m, mine.sha) != KHUB_STATUS_OK)
        mine.status = khub__fail(m->rt, KHUB_STATUS_IO,
                                 "%s: cannot read it to check that every "
                                 "rank has the same bytes",
                                 m->path);
    if (mine.status != KHUB_STATUS_OK)
        snprintf(mine.msg, sizeof mine.msg, "%s", khub_runtime_errmsg(m->rt));
    agree_rec *all = khub__calloc(m->rt, (size_t)tp->size, sizeof *all);
    KHUB_RETURN_IF(m->rt, !all, KHUB_STATUS_NOMEM, "%s: out of memory", m->file);
    char err[256] = "";
    uint64_t t0 = now_ns();
    khub_status cs = tp->comm.all_gather(tp->comm.ud, &mine, sizeof mine, all, err, sizeof err);
    cs = comm_done(m, cs, "load agreement", err, t0);
    for (int r = 0; r < tp->size && cs == KHUB_STATUS_OK; r++) {
        if (r == tp->rank && mine.status != KHUB_STATUS_OK) {
            cs = (khub_status)mine.status; /* our own message is already set */
        } else if (all[r].status != KHUB_STATUS_OK) {
            cs = khub__fail(m->rt, (khub_status)all[r].status, "tp rank %d failed to load: %.170s",
                            r, all[r].msg);
        } else if (mine.status == KHUB_STATUS_OK && strcmp(all[r].sha, all[0].sha) != 0) {
            cs = khub__fail(m->rt, KHUB_STATUS_MODEL_INVALID,
                            "%s: tp rank %d loaded different model bytes than rank 0 (sha256 "
                            "%.12s... vs %.12s...); every rank must load the same file",
                            m->file, r, all[r].sha, all[0].sha);
        }
    }
    khub__free(m->rt, all, (size_t)tp->size * sizeof *all);
    if (cs == KHUB_STATUS_OK && tp->rank == 0) tp->serving = true;
    return cs;
}
