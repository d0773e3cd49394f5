/*
 * tokenizer_bpe.c: the BPE merge loop over one pre-tokenized piece, as
 * tokenizers' Word::merge_all runs it. Each byte of the piece starts as the
 * token of its byte-level symbol; these are merged by rank through a
 * min-heap of candidate pairs ordered by rank, then position, with stale
 * entries skipped on pop, so ties break the same way. With ignore_merges
 * (Llama-3) a piece that is itself in the vocab is one token.
 */
#include "tokenizer_impl.h"

khub_status khub__tok_emit(enc_state *st, int32_t id)
{
    if (!khub__tok_grow(st->rt, (void **)&st->ids, &st->cap, st->n + 1, sizeof *st->ids))
        return khub__fail(st->rt, KHUB_STATUS_NOMEM, "tokenizer: out of memory for %zu ids",
                          st->n + 1);
    st->ids[st->n++] = id;
    return KHUB_STATUS_OK;
}

static bool cand_less(const merge_cand *a, const merge_cand *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(enc_state *st, merge_cand c)
{
    size_t i = st->heap_n++;
    st->heap[i] = c;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&st->heap[i], &st->heap[p])) break;
        merge_cand t = st->heap[p];
        st->heap[p] = st->heap[i];
        st->heap[i] = t;
        i = p;
    }
}

static merge_cand heap_pop(enc_state *st)
{
    merge_cand top = st->heap[0];
    st->heap[0] = st->heap[--st->heap_n];
    for (size_t i = 0;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < st->heap_n && cand_less(&st->heap[l], &st->heap[m])) m = l;
        if (r < st->heap_n && cand_less(&st->heap[r], &st->heap[m])) m = r;
        if (m == i) break;
        merge_cand t = st->heap[m];
        st->heap[m] = st->heap[i];
        st->heap[i] = t;
        i = m;
    }
    return top;
}

static void push_pair(const khub_tokenizer *tok, enc_state *st, int32_t pos)
{
    int32_t next = st->syms[pos].next;
    if (next < 0) return;
    const pair_slot *p = khub__tok_pair_lookup(tok, st->syms[pos].id, st->syms[next].id);
    if (p) heap_push(st, (merge_cand){p->rank, (uint32_t)pos, p->id});
}

/* Whole-piece lookup for ignore_merges: the piece's byte-level form. */
static int32_t whole_piece(const khub_tokenizer *tok, enc_state *st, span p)
{
    size_t need;
    if (!khub__mul_ok(p.n, 2, &need) ||
        !khub__tok_grow(st->rt, (void **)&st->buf, &st->buf_cap, need, 1))
        return -1;
    size_t k = 0;
    for (size_t i = 0; i < p.n; i++)
        k += khub__utf8_encode(khub__tok_byte_to_cp(p.s[i]), (unsigned char *)st->buf + k);
    return khub__tok_vocab_lookup(tok, st->buf, k);
}

khub_status khub__tok_bpe_piece(const khub_tokenizer *tok, enc_state *st, span p)
{
    khub_runtime *rt = st->rt;
    if (tok->ignore_merges) {
        int32_t id = whole_piece(tok, st, p);
        if (id >= 0) return khub__tok_emit(st, id);
    }
    size_t hcap;
    KHUB_RETURN_IF(
        rt,
        !khub__tok_grow(rt, (void **)&st->syms, &st->syms_cap, p.n, sizeof *st->syms) ||
            !khub__mul_ok(p.n, 3, &hcap) ||
            !khub__tok_grow(rt, (void **)&st->heap, &st->heap_cap, hcap, sizeof *st->heap),
        KHUB_STATUS_NOMEM, "tokenizer: out of memory for a %zu-byte piece", p.n);
    int32_t n = 0;
    for (size_t i = 0; i < p.n; i++) {
        int32_t id = tok->byte_id[p.s[i]];
        if (id < 0) {
            /* tokenizers drops a symbol missing from the vocab when there is
             * no unk token, and fuses consecutive unks with fuse_unk. */
            if (tok->unk < 0) continue;
            if (tok->fuse_unk && n > 0 && st->syms[n - 1].id == tok->unk) continue;
            id = tok->unk;
        }
        st->syms[n] = (sym){id, n - 1, -1, 1};
        if (n > 0) st->syms[n - 1].next = n;
        n++;
    }
    st->heap_n = 0;
    for (int32_t i = 0; i + 1 < n; i++) push_pair(tok, st, i);
    while (st->heap_n) {
        merge_cand top = heap_pop(st);
        sym *s = &st->syms[top.pos];
        if (!s->alive || s->next < 0) continue;
        sym *r = &st->syms[s->next];
        const pair_slot *pp = khub__tok_pair_lookup(tok, s->id, r->id);
        if (!pp || pp->id != top.id) continue; /* a stale candidate */
        s->id = top.id;
        r->alive = 0;
        s->next = r->next;
        if (s->next >= 0) st->syms[s->next].prev = (int32_t)top.pos;
        if (s->prev >= 0) push_pair(tok, st, s->prev);
        push_pair(tok, st, (int32_t)top.pos);
    }
    for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = st->syms[i].next)
        KHUB_FORWARD_IF_ERROR(rt, khub__tok_emit(st, st->syms[i].id));
    return KHUB_STATUS_OK;
}
