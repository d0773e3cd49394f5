/*
 * model_fuse.c: one op call for a layer's q, k and v, and one for its gate
 * and up (issue 14: fewer calls, passes and fork/joins per layer).
 *
 * Each layer multiplies the same normed rows by q, k and v, and again by
 * gate and up. Called apart, that is five calls where two would do: five
 * quantizations of the same activations (the cpu-x86 qlinear rounds x to
 * int16 per 32-block inside each call), five fork/joins of the pool, and
 * five short weight streams where two long ones would do. Joined, the
 * weight of q_rows + 2 kv_rows rows (2 ffn rows) is one khub_linear_args
 * call, and forward.c splits the output rows into q, k, v (gate, up).
 *
 * Same bits. Every linear and qlinear op here computes each output row as
 * its own dot products of that weight row with each token's row: the
 * cpu-x86 tiles keep one accumulator per (row, token) whatever rows share a
 * tile (kx.h; the batch tiles take one row at a time, the f32 GEMM one lane
 * per row with the same order over k), khub/ref-cpu dots one row at a time
 * in double, and the activations are quantized per token row, the same in
 * every call on the same x. So row r of the joined weight gives what row r
 * of its own weight gave; tests/test_fuse.c checks the logits bit for bit
 * (decode, prefill, a batch; the tiny fixtures and, in the slow tests,
 * SmolLM2). The ABI does not promise it of every plugin: one that splits
 * its sums by the number of rows would move last bits, as another thread
 * count can.
 *
 * When. The mats are bound to one op (one binding: the same kernel and
 * variant for the same weight dtype), have the same dtype and row length,
 * and biases on all or none. Not under tensor parallelism (each rank's
 * shards are cut per head group, tp.c) nor on a device (forward_device.c
 * calls the three), and not with KHUB_JOIN_PROJ=0 in the environment (read
 * at load; tests and benchmarks compare both). A join never has to be
 * undone: kernel swaps refuse the linear roles (model_rebind.c), and a
 * plugin reload replaces the one binding the joined mats share.
 *
 * Memory. Where the sources lie one after another in memory (SmolLM2's
 * GGUF stores gate then up; tiny_llama.h's safetensors q, k, v), the joined
 * weight is a view of them: no copy. Elsewhere (SmolLM2's q/k/v: the file
 * order is k, o, q, v) it is a copy made here, layer by layer, when every
 * source can go after it: a block the load had already copied (quantized,
 * aligned, converted) is freed, a source in the file's mapping has its
 * pages given back (khub__mmap_drop), so the bytes are never resident
 * twice and peak RSS does not grow (docs/performance.md, session 18). A
 * GGUF read into huge pages (khub__mmap_open_huge) cannot give pages back
 * without zeroing and splitting them, so mats that are not adjacent there
 * stay apart: a copy would hold their bytes twice, and on 4 KiB pages. q,
 * k and v (gate, up) stay as views of their rows, so weight_bytes and
 * every list of the layer's mats see them as before.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "mmap_file.h"
#include "model_impl.h"
#include "safetensors.h"

/* KHUB_JOIN_PROJ=0 turns the joins off (docs/performance.md). */
static bool join_wanted(void)
{
    const char *e = getenv("KHUB_JOIN_PROJ");
    return !(e && strcmp(e, "0") == 0);
}

static bool same_dtype(khub_dtype a, khub_dtype b)
{
    return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

/* Whether mats[0..n) can run as one call of the op they share. */
static bool joinable(khub__mat *const *mats, int n)
{
    const khub__mat *a = mats[0];
    if (!a->op || a->w.t.strides || a->w.t.ndim != 2) return false;
    for (int i = 1; i < n; i++) {
        const khub__mat *b = mats[i];
        if (b->op != a->op || !same_dtype(b->w.t.dtype, a->w.t.dtype) ||
            b->w.shape[1] != a->w.shape[1] || b->w.t.strides || b->w.t.ndim != 2 ||
            !b->bias.t.data != !a->bias.t.data)
            return false;
    }
    return true;
}

/* The file mapping w's bytes lie in when it can give their pages back
 * after a copy; NULL for a huge copy of the file (gguf.h) or any other
 * memory. */
static const khub_mmap *source_map(const khub_model *m, const khub__weight *w, size_t bytes)
{
    const khub_mmap *map =
        m->gguf ? khub__gguf_map(m->gguf) : khub__safetensors_map_of(m->st, w->t.data, bytes);
    return map && khub__mmap_droppable(map, w->t.data, bytes) ? map : NULL;
}

/* After its bytes were copied: a block the weight owns is freed, a view
 * of the file's mapping gives its pages back. */
static void give_back(khub_model *m, khub__weight *w, size_t bytes)
{
    if (w->owned) {
        khub__aligned_free(m->rt, w->owned);
        w->owned = NULL;
        w->owned_bytes = 0;
    } else {
        const khub_mmap *map = source_map(m, w, bytes);
        if (map) khub__mmap_drop(map, w->t.data, bytes);
    }
}

/* How mats can become one weight: a view when they already lie one after
 * another in the file's memory (SmolLM2's GGUF stores gate then up), else
 * a copy when each source can be freed or given back, else not at all (a
 * huge copy of the file, mmap_file.h: its pages cannot be given back, so a
 * copy would hold the bytes twice and the copy would not be on huge pages). */
typedef enum join_how { JOIN_NONE, JOIN_VIEW, JOIN_COPY } join_how;

static join_how how_to_join(const khub_model *m, khub__mat *const *mats, int n, const size_t *bytes)
{
    bool view = true, copy = true;
    for (int i = 0; i < n; i++) {
        const khub__weight *w = &mats[i]->w;
        view = view && !w->owned &&
               (i == 0 || (const uint8_t *)w->t.data ==
                              (const uint8_t *)mats[i - 1]->w.t.data + bytes[i - 1]);
        copy = copy && (w->owned || source_map(m, w, bytes[i]));
    }
    return view ? JOIN_VIEW : copy ? JOIN_COPY : JOIN_NONE;
}

/* The joined bias: each mat's f32 bias in turn, into b; each mat's bias
 * then views its rows of b. */
static void join_bias(khub_model *m, khub__mat *const *mats, int n, float *b)
{
    int64_t r = 0;
    for (int i = 0; i < n; i++) {
        khub__weight *bw = &mats[i]->bias;
        size_t bytes = (size_t)mats[i]->w.shape[0] * sizeof(float);
        memcpy(b + r, bw->t.data, bytes);
        if (bw->owned) khub__aligned_free(m->rt, bw->owned);
        bw->owned = NULL;
        bw->owned_bytes = 0;
        bw->t.data = b + r;
        r += mats[i]->w.shape[0];
    }
}

/* Makes out one weight of mats[0..n)'s rows (and biases), as how_to_join
 * says: a view of them where they lie, or a copy out owns of which each
 * mat becomes a view. *joined is false when neither can be. */
static khub_status join(khub_model *m, khub__mat *const *mats, int n, const char *name,
                        khub__mat *out, bool *joined)
{
    size_t bytes[3], total = 0;
    int64_t rows = 0;
    for (int i = 0; i < n; i++) {
        const khub__weight *w = &mats[i]->w;
        KHUB_RETURN_IF(m->rt,
                       !khub__dtype_bytes(w->t.dtype, w->shape[0], w->shape[1], &bytes[i]) ||
                           !khub__add_ok(total, bytes[i], &total),
                       KHUB_STATUS_OVERFLOW, "%s: '%s' too large to join", m->file, w->name);
        rows += w->shape[0];
    }
    join_how how = how_to_join(m, mats, n, bytes);
    *joined = how != JOIN_NONE;
    if (how == JOIN_NONE) return KHUB_STATUS_OK;
    bool biased = mats[0]->bias.t.data != NULL;
    uint8_t *wb = how == JOIN_COPY ? khub__aligned_alloc(m->rt, total) : NULL;
    float *bb = biased ? khub__aligned_alloc(m->rt, (size_t)rows * sizeof(float)) : NULL;
    if ((how == JOIN_COPY && !wb) || (biased && !bb)) {
        khub__aligned_free(m->rt, wb);
        khub__aligned_free(m->rt, bb);
        return khub__fail(m->rt, KHUB_STATUS_NOMEM, "%s: no memory to join %s (%zu bytes)", m->file,
                          name, total);
    }
    size_t off = 0;
    for (int i = 0; i < n && wb; i++) {
        khub__weight *w = &mats[i]->w;
        memcpy(wb + off, w->t.data, bytes[i]);
        give_back(m, w, bytes[i]);
        w->t.data = wb + off;
        off += bytes[i];
    }
    if (biased) join_bias(m, mats, n, bb);
    out->w = mats[0]->w;
    out->w.t.shape = out->w.shape;
    out->w.shape[0] = rows;
    out->w.t.data = wb ? wb : mats[0]->w.t.data;
    out->w.owned = wb; /* NULL for a view: the file's bytes, as mats[0]'s */
    out->w.owned_bytes = wb ? total : 0;
    out->w.name = name;
    if (biased) {
        out->bias = mats[0]->bias;
        out->bias.t.shape = out->bias.shape;
        out->bias.shape[0] = rows;
        out->bias.t.data = bb;
        out->bias.owned = bb;
        out->bias.owned_bytes = (size_t)rows * sizeof(float);
        out->bias.name = name;
    }
    out->op = mats[0]->op;
    return KHUB_STATUS_OK;
}

khub_status khub__model_join_layer(khub_model *m, int L, bool on_device)
{
    if (on_device || m->tp.size > 1 || !join_wanted()) return KHUB_STATUS_OK;
    khub__layer *ly = &m->layers[L];
    khub__mat *qkv[] = {&ly->q, &ly->k, &ly->v};
    bool joined = false;
    if (joinable(qkv, 3))
        KHUB_FORWARD_IF_ERROR(m->rt, join(m, qkv, 3, "q/k/v (joined)", &ly->qkv, &joined));
    khub__mat *gu[] = {&ly->gate, &ly->up};
    joined = false;
    if (joinable(gu, 2))
        KHUB_FORWARD_IF_ERROR(m->rt, join(m, gu, 2, "gate/up (joined)", &ly->gate_up, &joined));
    return KHUB_STATUS_OK;
}

int khub__model_n_joined(const khub_model *m, bool qkv)
{
    int n = 0;
    for (int64_t L = 0; L < m->cfg.n_layers; L++)
        n += (qkv ? m->layers[L].qkv.op : m->layers[L].gate_up.op) != NULL;
    return n;
}

void khub__model_join_explain(const khub_model *m, const khub__bound *b, char *buf, size_t n)
{
    buf[0] = '\0';
    bool qkv = b->role == KHUB__ROLE_QKV;
    if (!qkv && b->role != KHUB__ROLE_GATE_UP) return;
    int joined = 0;
    int64_t rows = 0;
    for (int64_t L = 0; L < m->cfg.n_layers; L++) {
        const khub__mat *j = qkv ? &m->layers[L].qkv : &m->layers[L].gate_up;
        if (j->op != b->b) continue;
        joined++;
        rows = j->w.shape[0];
    }
    if (joined == 0) return;
    snprintf(buf, n, "    %s as one call (a joined weight of %lld rows) in %d of %d layers\n",
             qkv ? "q_proj, k_proj, v_proj" : "gate_proj, up_proj", (long long)rows, joined,
             (int)m->cfg.n_layers);
}
