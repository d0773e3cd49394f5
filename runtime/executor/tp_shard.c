/*
 * tp_shard.c: cuts a loaded weight down to this rank's shard (tp.h).
 *
 * A weight is [out, in]. A colwise shard is a run of whole rows, so a
 * weight still mapped from the file stays a view (only this rank's pages
 * are ever read); a rowwise shard is a run of columns of every row, copied
 * into a block the weight owns, and for a block-quantized format (Q4_1,
 * Q8_0, Q4_K, ...) both ends must fall on a block boundary, which
 * khub__dtype_bytes checks. The full weight's copy, when the load had made
 * one (quantize-at-load), is freed: a rank holds its shards only.
 */
#include <string.h>

#include "executor.h"

/* Replaces w's owned block (if any) by `data` of `bytes` owned or mapped. */
static void adopt(khub_model *m, khub__weight *w, void *data, size_t bytes, bool owned)
{
    if (w->owned) khub__aligned_free(m->rt, w->owned);
    w->owned = owned ? data : NULL;
    w->owned_bytes = owned ? bytes : 0;
    w->t.data = data;
}

/* Rows [r0, r0 + nr) of w (a vector's elements are its rows). */
static khub_status slice_rows(khub_model *m, khub__weight *w, int64_t r0, int64_t nr)
{
    size_t row, bytes;
    bool ok = khub__dtype_bytes(w->t.dtype, 1, w->shape[1], &row) &&
              khub__mul_ok(row, (size_t)nr, &bytes);
    KHUB_RETURN_IF(m->rt, !ok || r0 < 0 || nr < 1 || r0 + nr > w->shape[0], KHUB_STATUS_INTERNAL,
                   "%s: tp: rows %lld+%lld of '%s' (%lld rows)", m->file, (long long)r0,
                   (long long)nr, w->name, (long long)w->shape[0]);
    const char *src = (const char *)w->t.data + row * (size_t)r0;
    if (!w->owned) {
        adopt(m, w, (void *)src, bytes, false);
    } else {
        void *dst = khub__aligned_alloc(m->rt, bytes);
        KHUB_RETURN_IF(m->rt, !dst, KHUB_STATUS_NOMEM, "%s: no memory for a shard of '%s'", m->file,
                       w->name);
        memcpy(dst, src, bytes);
        adopt(m, w, dst, bytes, true);
    }
    w->shape[0] = nr;
    return KHUB_STATUS_OK;
}

/* Columns [c0, c0 + nc) of every row of w, copied. */
static khub_status slice_cols(khub_model *m, khub__weight *w, int64_t c0, int64_t nc)
{
    size_t row, off = 0, seg, bytes;
    bool ok = khub__dtype_bytes(w->t.dtype, 1, w->shape[1], &row) &&
              (c0 == 0 || khub__dtype_bytes(w->t.dtype, 1, c0, &off)) &&
              khub__dtype_bytes(w->t.dtype, 1, nc, &seg) &&
              khub__mul_ok(seg, (size_t)w->shape[0], &bytes);
    KHUB_RETURN_IF(m->rt, !ok, KHUB_STATUS_INVALID_ARG,
                   "%s: tp_size %d cannot split '%s' (%s, %lld columns): columns %lld-%lld do not "
                   "fall on its block boundaries; use another tp size or a format with smaller "
                   "blocks",
                   m->file, (int)m->tp.size, w->name, khub__dtype_short(w->t.dtype),
                   (long long)w->shape[1], (long long)c0, (long long)(c0 + nc - 1));
    char *dst = khub__aligned_alloc(m->rt, bytes);
    KHUB_RETURN_IF(m->rt, !dst, KHUB_STATUS_NOMEM, "%s: no memory for a shard of '%s'", m->file,
                   w->name);
    const char *src = w->t.data;
    for (int64_t r = 0; r < w->shape[0]; r++)
        memcpy(dst + (size_t)r * seg, src + (size_t)r * row + off, seg);
    adopt(m, w, dst, bytes, true);
    w->shape[1] = nc;
    return KHUB_STATUS_OK;
}

/* Colwise: the weight's rows and the bias's elements. */
static khub_status colwise(khub_model *m, khub__mat *mat, int64_t r0, int64_t nr)
{
    KHUB_FORWARD_IF_ERROR(m->rt, slice_rows(m, &mat->w, r0, nr));
    if (!mat->bias.t.data) return KHUB_STATUS_OK;
    return slice_rows(m, &mat->bias, r0, nr);
}

/* Rowwise: the weight's columns; the bias is added once, by rank 0, before
 * the all-reduce sums the partial outputs. */
static khub_status rowwise(khub_model *m, khub__mat *mat, int64_t c0, int64_t nc)
{
    KHUB_FORWARD_IF_ERROR(m->rt, slice_cols(m, &mat->w, c0, nc));
    if (m->tp.rank != 0) khub__weight_free(m->rt, &mat->bias);
    return KHUB_STATUS_OK;
}

khub_status khub__tp_shard(khub_model *m, khub__tp_split split, khub__mat *mat)
{
    const khub__tp *tp = &m->tp;
    int64_t hd = tp->full.head_dim;
    if (tp->size < 2) return KHUB_STATUS_OK;
    switch (split) {
    case KHUB__TP_REPLICATE: return KHUB_STATUS_OK;
    case KHUB__TP_COL_Q: return colwise(m, mat, tp->q0 * hd, tp->nq * hd);
    case KHUB__TP_COL_KV: return colwise(m, mat, tp->kv0 * hd, tp->nkv * hd);
    case KHUB__TP_COL_FFN: return colwise(m, mat, tp->ffn0, tp->nffn);
    case KHUB__TP_COL_VOCAB: return colwise(m, mat, tp->vocab0, tp->nvocab);
    case KHUB__TP_ROW_HEADS: return rowwise(m, mat, tp->q0 * hd, tp->nq * hd);
    case KHUB__TP_ROW_FFN: return rowwise(m, mat, tp->ffn0, tp->nffn);
    case KHUB__TP_COL_HIDDEN: return colwise(m, mat, tp->h0, tp->nh);
    }
    return khub__fail(m->rt, KHUB_STATUS_INTERNAL, "tp: unknown split %d", (int)split);
}
