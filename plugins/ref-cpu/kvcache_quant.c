/*
 * kvcache_quant.c: the quantized KV caches, ops "quantized_cache" (int8)
 * and "quantized_cache_int4", behind `--cache quantized` and
 * `--cache quantized-int4` (Transformers' QuantizedCache).
 *
 * Each (layer, sequence) slot keeps positions [0, qlen) quantized and the
 * most recent ones, [qlen, len), exact in f32 (the residual window). After
 * a write leaves more than residual_length tokens in the residual, the
 * oldest are quantized until exactly residual_length remain, so the last
 * residual_length positions are always exact (Transformers quantizes the
 * whole residual once it reaches residual_length; keeping a sliding exact
 * window is at least as accurate and its size is fixed).
 *
 * With axis_key=token, a token is quantized per head in groups of
 * q_group_size values along head_dim, K and V alike (values always are):
 *   int8: symmetric, q = round(x / s) in [-127, 127], s = absmax / 127;
 *   int4: asymmetric, q = round((x - m) / s) in [0, 15], s = (max - m) / 15,
 *         m = the group's minimum; two codes per byte, low nibble first.
 * s (and m) are stored as f16; quantization uses the stored f16 values, so
 * dequantization q * s (+ m) reproduces exactly what was measured.
 * Record of one token: [H * D * bits / 8 code bytes][groups x (s[, m]) f16].
 *
 * Attention reads a view: view dequantizes positions [0, n) of the slot
 * into one cache-owned scratch buffer ([n, H, D] in the config's dtype,
 * strides [H * D, D, 1]), so a view of this cache stays valid only until
 * the next call on the cache (the executor uses one view at a time).
 * Rewriting a position below qlen quantizes it in place; truncating below
 * qlen empties the residual (the kept positions stay quantized).
 * Options: q_group_size (default 64, or head_dim when 64 does not divide
 * it; must divide head_dim), residual_length (default 128, 0 = quantize
 * everything), axis_key (channel, the default, or token).
 *
 * axis_key=channel quantizes keys per channel, as KIVI does (Transformers'
 * QuantizedCacheConfig calls the choice axis_key): keys have a few
 * channels of large magnitude, so a group along head_dim gets a scale set
 * by its outliers, while a group along the tokens of one channel does not.
 * Keys are then quantized in blocks of q_group_size tokens, with one scale
 * (and minimum) per channel and block; values stay per token. qlen is a
 * multiple of the block, so up to q_group_size - 1 tokens beyond
 * residual_length stay exact (residual_length=0 keeps fewer than one block
 * exact). A key block record: [q_group_size][H * D * bits / 8 code bytes]
 * then [H * D] x (s[, m]) f16. Rewriting a key below qlen requantizes its
 * block from the dequantized neighbours; truncating inside a quantized
 * block moves that block's kept positions, dequantized, into the residual.
 */
#include <math.h>

#include "kvcache_strategy.h"

typedef struct qslot {
    uint8_t *kq, *vq; /* [qcap][rec] quantized positions [0, qlen); kq in key
                       * blocks [qcap / group][kblock] with axis_key=channel */
    int64_t qcap, qlen;
    float *kr, *vr; /* [rcap][H * D] exact positions [qlen, len) */
    int64_t rcap;
    int64_t len;
} qslot;

struct khub_kv_cache {
    khub_kv_cache_config cfg;
    int bits;         /* 8 or 4 */
    int64_t group;    /* values per scale */
    int64_t residual; /* exact tokens kept */
    int64_t hd;       /* n_kv_heads * head_dim */
    size_t codes;     /* code bytes per token record */
    size_t rec;       /* bytes per token record: codes then f16 params */
    int kchan;        /* axis_key=channel: keys in blocks of group tokens */
    size_t kblock;    /* bytes per key block record (kchan) */
    size_t esize;     /* view dtype bytes: 4 or 2 */
    qslot *slots;     /* [n_layers * n_seqs], layer-major */
    uint8_t *sk, *sv; /* scratch [scap][hd] in the config's dtype */
    int64_t scap;
    float *tmp; /* [hd] one token in f32 */
    float *blk; /* [group][hd] one key block in f32 (kchan) */
};

static const char *q_op(const khub_kv_cache *kc)
{
    return kc && kc->bits == 4 ? "quantized_cache_int4" : "quantized_cache";
}

static qslot *q_slot(khub_kv_cache *kc, int32_t layer, int32_t seq)
{
    return &kc->slots[(int64_t)layer * kc->cfg.n_seqs + seq];
}

/* ------------------------------------------------------------------------ */
/* Quantizing one token                                                     */
/* ------------------------------------------------------------------------ */

/* Quantizes x[hd] into rec (codes, then per group s[, m] as f16). */
static void q_token(const khub_kv_cache *kc, const float *x, uint8_t *rec)
{
    int64_t G = kc->group, ng = kc->hd / G;
    uint16_t *par = (uint16_t *)(rec + kc->codes);
    if (kc->bits == 8) {
        int8_t *q = (int8_t *)rec;
        for (int64_t g = 0; g < ng; g++) {
            const float *v = x + g * G;
            float amax = 0;
            for (int64_t i = 0; i < G; i++) amax = fmaxf(amax, fabsf(v[i]));
            uint16_t sh = khub_pu_f32_to_f16(amax / 127.0f);
            float s = khub_pu_f16_to_f32(sh);
            par[g] = sh;
            for (int64_t i = 0; i < G; i++) {
                float r = s > 0 ? rintf(v[i] / s) : 0;
                q[g * G + i] = (int8_t)(r > 127 ? 127 : r < -127 ? -127 : r);
            }
        }
        return;
    }
    memset(rec, 0, kc->codes);
    for (int64_t g = 0; g < ng; g++) {
        const float *v = x + g * G;
        float lo = v[0], hi = v[0];
        for (int64_t i = 1; i < G; i++) lo = fminf(lo, v[i]), hi = fmaxf(hi, v[i]);
        uint16_t mh = khub_pu_f32_to_f16(lo), sh = khub_pu_f32_to_f16((hi - lo) / 15.0f);
        float m = khub_pu_f16_to_f32(mh), s = khub_pu_f16_to_f32(sh);
        par[2 * g] = sh;
        par[2 * g + 1] = mh;
        for (int64_t i = 0; i < G; i++) {
            float r = s > 0 ? rintf((v[i] - m) / s) : 0;
            uint8_t c = (uint8_t)(r > 15 ? 15 : r < 0 ? 0 : r);
            int64_t at = g * G + i;
            rec[at / 2] |= (uint8_t)(at % 2 ? c << 4 : c);
        }
    }
}

/* Dequantizes rec into out[hd] as f32. */
static void dq_token(const khub_kv_cache *kc, const uint8_t *rec, float *out)
{
    int64_t G = kc->group, ng = kc->hd / G;
    const uint16_t *par = (const uint16_t *)(rec + kc->codes);
    for (int64_t g = 0; g < ng; g++) {
        if (kc->bits == 8) {
            float s = khub_pu_f16_to_f32(par[g]);
            for (int64_t i = 0; i < G; i++)
                out[g * G + i] = (float)((const int8_t *)rec)[g * G + i] * s;
            continue;
        }
        float s = khub_pu_f16_to_f32(par[2 * g]), m = khub_pu_f16_to_f32(par[2 * g + 1]);
        for (int64_t i = 0; i < G; i++) {
            int64_t at = g * G + i;
            int c = at % 2 ? rec[at / 2] >> 4 : rec[at / 2] & 15;
            out[at] = (float)c * s + m;
        }
    }
}

/* Quantizes a key block x[group][hd] per channel into blk (codes of each
 * token, then per channel s[, m] as f16). */
static void q_kblock(const khub_kv_cache *kc, const float *x, uint8_t *blk)
{
    int64_t T = kc->group, hd = kc->hd;
    uint16_t *par = (uint16_t *)(blk + (size_t)T * kc->codes);
    if (kc->bits == 4) memset(blk, 0, (size_t)T * kc->codes);
    for (int64_t ch = 0; ch < hd; ch++) {
        float lo = x[ch], hi = x[ch], amax = 0;
        for (int64_t t = 0; t < T; t++) {
            float v = x[t * hd + ch];
            lo = fminf(lo, v), hi = fmaxf(hi, v), amax = fmaxf(amax, fabsf(v));
        }
        if (kc->bits == 8) {
            uint16_t sh = khub_pu_f32_to_f16(amax / 127.0f);
            float sc = khub_pu_f16_to_f32(sh);
            par[ch] = sh;
            for (int64_t t = 0; t < T; t++) {
                float r = sc > 0 ? rintf(x[t * hd + ch] / sc) : 0;
                ((int8_t *)blk)[t * (int64_t)kc->codes + ch] = (int8_t)(r > 127    ? 127
                                                                        : r < -127 ? -127
                                                                                   : r);
            }
            continue;
        }
        uint16_t mh = khub_pu_f32_to_f16(lo), sh = khub_pu_f32_to_f16((hi - lo) / 15.0f);
        float m = khub_pu_f16_to_f32(mh), sc = khub_pu_f16_to_f32(sh);
        par[2 * ch] = sh;
        par[2 * ch + 1] = mh;
        for (int64_t t = 0; t < T; t++) {
            float r = sc > 0 ? rintf((x[t * hd + ch] - m) / sc) : 0;
            uint8_t c = (uint8_t)(r > 15 ? 15 : r < 0 ? 0 : r);
            blk[t * (int64_t)kc->codes + ch / 2] |= (uint8_t)(ch % 2 ? c << 4 : c);
        }
    }
}

/* Dequantizes token t of key block blk into out[hd] as f32. */
static void dq_ktoken(const khub_kv_cache *kc, const uint8_t *blk, int64_t t, float *out)
{
    const uint16_t *par = (const uint16_t *)(blk + (size_t)kc->group * kc->codes);
    const uint8_t *row = blk + (size_t)t * kc->codes;
    for (int64_t ch = 0; ch < kc->hd; ch++) {
        if (kc->bits == 8) {
            out[ch] = (float)((const int8_t *)row)[ch] * khub_pu_f16_to_f32(par[ch]);
            continue;
        }
        int c = ch % 2 ? row[ch / 2] >> 4 : row[ch / 2] & 15;
        out[ch] = (float)c * khub_pu_f16_to_f32(par[2 * ch]) + khub_pu_f16_to_f32(par[2 * ch + 1]);
    }
}

/* The quantized key of position p into out[hd]. */
static void dq_key(const khub_kv_cache *kc, const uint8_t *kq, int64_t p, float *out)
{
    if (kc->kchan)
        dq_ktoken(kc, kq + (size_t)(p / kc->group) * kc->kblock, p % kc->group, out);
    else
        dq_token(kc, kq + (size_t)p * kc->rec, out);
}

/* ------------------------------------------------------------------------ */
/* create / destroy                                                         */
/* ------------------------------------------------------------------------ */

static khub_status q_options(const khub_host_api *host, const char *op,
                             const khub_kv_cache_config *cfg, int64_t *group, int64_t *residual,
                             int *kchan)
{
    *group = cfg->head_dim % 64 == 0 ? 64 : cfg->head_dim;
    *residual = 128;
    char axis[16] = "channel";
    khub_ref_kv_opt opts[] = {{"q_group_size", group, NULL, 0},
                              {"residual_length", residual, NULL, 0},
                              {"axis_key", NULL, axis, sizeof axis}};
    KHUB_PU_TRY(khub_ref__kv_opts_parse(host, op, cfg, opts, 3));
    if (strcmp(axis, "token") != 0 && strcmp(axis, "channel") != 0)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "%s: axis_key (got \"%s\", want token or channel)", op, axis);
    *kchan = !strcmp(axis, "channel");
    if (*group < 1 || cfg->head_dim % *group != 0)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "%s: q_group_size (got %lld, want a divisor of head_dim %d)", op,
                          (long long)*group, (int)cfg->head_dim);
    if (*group % 2 != 0)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "%s: q_group_size (got %lld, want an even number)", op,
                          (long long)*group);
    if (*residual > cfg->max_tokens) *residual = cfg->max_tokens;
    return KHUB_STATUS_OK;
}

static khub_status q_create(void *state, const khub_kv_cache_config *cfg, int bits,
                            khub_kv_cache **out)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    void *c = host->host_ctx;
    const char *op = bits == 4 ? "quantized_cache_int4.create" : "quantized_cache.create";
    if (!out) return host->fail(c, KHUB_STATUS_INVALID_ARG, "%s: out is NULL", op);
    *out = NULL;
    size_t esize = 0;
    int64_t group, residual;
    int kchan = 0;
    KHUB_PU_TRY(khub_ref__kv_config_check(host, op, cfg, &esize));
    KHUB_PU_TRY(q_options(host, op, cfg, &group, &residual, &kchan));
    size_t n_slots = (size_t)cfg->n_layers * (size_t)cfg->n_seqs;
    size_t hd = (size_t)cfg->n_kv_heads * (size_t)cfg->head_dim;
    khub_kv_cache *kc = host->alloc(c, sizeof *kc);
    qslot *slots = host->alloc(c, n_slots * sizeof *slots);
    float *tmp = host->alloc(c, hd * sizeof(float));
    float *blk = kchan ? host->alloc(c, (size_t)group * hd * sizeof(float)) : NULL;
    if (!kc || !slots || !tmp || (kchan && !blk)) {
        host->free(c, kc);
        host->free(c, slots);
        host->free(c, tmp);
        host->free(c, blk);
        return host->fail(c, KHUB_STATUS_NOMEM, "%s: out of memory for %zu slots", op, n_slots);
    }
    memset(kc, 0, sizeof *kc);
    memset(slots, 0, n_slots * sizeof *slots);
    khub_pu_kv_config_copy(&kc->cfg, cfg);
    kc->bits = bits;
    kc->group = group;
    kc->residual = residual;
    kc->hd = (int64_t)cfg->n_kv_heads * cfg->head_dim;
    kc->codes = (size_t)kc->hd * (size_t)bits / 8;
    kc->rec = kc->codes + (size_t)(kc->hd / group) * (bits == 4 ? 4 : 2);
    kc->kchan = kchan;
    kc->kblock = (size_t)group * kc->codes + hd * (bits == 4 ? 4 : 2);
    kc->esize = esize;
    kc->slots = slots;
    kc->tmp = tmp;
    kc->blk = blk;
    *out = kc;
    return KHUB_STATUS_OK;
}

static khub_status q8_create(void *state, const khub_kv_cache_config *cfg, khub_kv_cache **out)
{
    return q_create(state, cfg, 8, out);
}

static khub_status q4_create(void *state, const khub_kv_cache_config *cfg, khub_kv_cache **out)
{
    return q_create(state, cfg, 4, out);
}

static void q_destroy(void *state, khub_kv_cache *kc)
{
    if (!kc) return;
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    void *c = host->host_ctx;
    int64_t n_slots = (int64_t)kc->cfg.n_layers * kc->cfg.n_seqs;
    for (int64_t i = 0; i < n_slots; i++) {
        qslot *s = &kc->slots[i];
        host->free(c, s->kq), host->free(c, s->vq), host->free(c, s->kr), host->free(c, s->vr);
    }
    host->free(c, kc->sk);
    host->free(c, kc->sv);
    host->free(c, kc->slots);
    host->free(c, kc->tmp);
    host->free(c, kc->blk);
    host->free(c, kc);
}

/* ------------------------------------------------------------------------ */
/* Storage growth                                                           */
/* ------------------------------------------------------------------------ */

/* Bytes of n tokens stored as units of per tokens, unit bytes each. */
static size_t q_units(int64_t n, int64_t per, size_t unit)
{
    return (size_t)((n + per - 1) / per) * unit;
}

/* Grows two arrays from *cap tokens to hold need (doubling from 16, at
 * most max), keeping the first keep tokens. Array a stores units of aper
 * tokens, arow bytes each (a key block, or one token); b one token per
 * brow bytes. */
static khub_status q_grow2(const khub_host_api *host, const char *op, uint8_t **a, uint8_t **b,
                           int64_t *cap, int64_t need, int64_t max, size_t arow, int64_t aper,
                           size_t brow, int64_t keep)
{
    if (need <= *cap) return KHUB_STATUS_OK;
    int64_t nc = *cap ? *cap : 16;
    while (nc < need) nc *= 2;
    if (nc > max) nc = max;
    /* max_tokens x hd x 4 checked at create */
    size_t abytes = q_units(nc, aper, arow), bbytes = (size_t)nc * brow;
    uint8_t *na = host->alloc(host->host_ctx, abytes), *nb = host->alloc(host->host_ctx, bbytes);
    if (!na || !nb) {
        host->free(host->host_ctx, na);
        host->free(host->host_ctx, nb);
        return host->fail(host->host_ctx, KHUB_STATUS_NOMEM,
                          "%s: out of memory growing storage to %lld tokens (%zu bytes)", op,
                          (long long)nc, abytes + bbytes);
    }
    if (keep > 0) {
        memcpy(na, *a, q_units(keep, aper, arow));
        memcpy(nb, *b, (size_t)keep * brow);
    }
    host->free(host->host_ctx, *a);
    host->free(host->host_ctx, *b);
    *a = na, *b = nb, *cap = nc;
    return KHUB_STATUS_OK;
}

/* Grows two arrays of rows (row bytes each): q_grow2 with one token a row. */
static khub_status q_grow(const khub_host_api *host, const char *op, uint8_t **a, uint8_t **b,
                          int64_t *cap, int64_t need, int64_t max, size_t row, int64_t keep)
{
    return q_grow2(host, op, a, b, cap, need, max, row, 1, row, keep);
}

/* Grows a slot's quantized storage (keys in blocks when kchan). */
static khub_status q_grow_q(const khub_host_api *host, const char *op, const khub_kv_cache *kc,
                            qslot *s, int64_t need)
{
    return q_grow2(host, op, &s->kq, &s->vq, &s->qcap, need, kc->cfg.max_tokens,
                   kc->kchan ? kc->kblock : kc->rec, kc->kchan ? kc->group : 1, kc->rec, s->qlen);
}

/* Quantizes the oldest residual tokens until residual_length remain (with
 * kchan: whole key blocks only, so fewer than a block more may remain). */
static khub_status q_flush(const khub_host_api *host, const char *op, khub_kv_cache *kc, qslot *s)
{
    int64_t n = s->len - s->qlen - kc->residual;
    if (kc->kchan) n -= n % kc->group;
    if (n <= 0) return KHUB_STATUS_OK;
    KHUB_PU_TRY(q_grow_q(host, op, kc, s, s->qlen + n));
    for (int64_t i = 0; i < n; i++) {
        if (kc->kchan && i % kc->group == 0)
            q_kblock(kc, s->kr + i * kc->hd,
                     s->kq + (size_t)((s->qlen + i) / kc->group) * kc->kblock);
        if (!kc->kchan) q_token(kc, s->kr + i * kc->hd, s->kq + (size_t)(s->qlen + i) * kc->rec);
        q_token(kc, s->vr + i * kc->hd, s->vq + (size_t)(s->qlen + i) * kc->rec);
    }
    int64_t left = s->len - s->qlen - n;
    memmove(s->kr, s->kr + n * kc->hd, (size_t)(left * kc->hd) * sizeof(float));
    memmove(s->vr, s->vr + n * kc->hd, (size_t)(left * kc->hd) * sizeof(float));
    s->qlen += n;
    return KHUB_STATUS_OK;
}

/* ------------------------------------------------------------------------ */
/* write / view / truncate / memory                                         */
/* ------------------------------------------------------------------------ */

static khub_status q_write(void *state, khub_kv_cache *kc, const khub_kv_write_args *a)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    char op[64];
    snprintf(op, sizeof op, "%s.write", q_op(kc));
    if (!kc) return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG, "%s: cache is NULL", op);
    KHUB_PU_TRY(khub_pu_args_check(host, op, a, sizeof(khub_kv_write_args)));
    KHUB_PU_TRY(khub_ref__kv_locate(host, op, &kc->cfg, a->layer, a->seq));
    qslot *s = q_slot(kc, a->layer, a->seq);
    KHUB_PU_TRY(khub_ref__kv_write_check(host, op, &kc->cfg, a, 0, s->len));
    int64_t n = a->k->shape[0], end = a->pos + n, H = kc->cfg.n_kv_heads, D = kc->cfg.head_dim;
    if (n == 0) return KHUB_STATUS_OK;
    int64_t rneed = (end > s->len ? end : s->len) - s->qlen;
    KHUB_PU_TRY(q_grow(host, op, (uint8_t **)&s->kr, (uint8_t **)&s->vr, &s->rcap, rneed,
                       kc->cfg.max_tokens, (size_t)kc->hd * sizeof(float), s->len - s->qlen));
    for (int64_t i = 0; i < n; i++) {
        int64_t p = a->pos + i;
        if (p < s->qlen) { /* a rewrite below the residual: quantize in place */
            for (int64_t h = 0; h < H; h++) khub_ref__kv_read_row(a->k, i, h, D, kc->tmp + h * D);
            if (kc->kchan) { /* requantize the key's block around the new row */
                uint8_t *b = s->kq + (size_t)(p / kc->group) * kc->kblock;
                for (int64_t t = 0; t < kc->group; t++) dq_ktoken(kc, b, t, kc->blk + t * kc->hd);
                memcpy(kc->blk + (p % kc->group) * kc->hd, kc->tmp, (size_t)kc->hd * sizeof(float));
                q_kblock(kc, kc->blk, b);
            } else {
                q_token(kc, kc->tmp, s->kq + (size_t)p * kc->rec);
            }
            for (int64_t h = 0; h < H; h++) khub_ref__kv_read_row(a->v, i, h, D, kc->tmp + h * D);
            q_token(kc, kc->tmp, s->vq + (size_t)p * kc->rec);
            continue;
        }
        float *kx = s->kr + (p - s->qlen) * kc->hd, *vx = s->vr + (p - s->qlen) * kc->hd;
        for (int64_t h = 0; h < H; h++) {
            khub_ref__kv_read_row(a->k, i, h, D, kx + h * D);
            khub_ref__kv_read_row(a->v, i, h, D, vx + h * D);
        }
    }
    if (end > s->len) s->len = end;
    return q_flush(host, op, kc, s);
}

/* Stores f32 row x[hd] into scratch row dst in the config's dtype. */
static void q_put(const khub_kv_cache *kc, const float *x, uint8_t *dst)
{
    if (kc->esize == 4) {
        memcpy(dst, x, (size_t)kc->hd * sizeof(float));
        return;
    }
    for (int64_t i = 0; i < kc->hd; i++) ((uint16_t *)dst)[i] = khub_pu_f32_to_f16(x[i]);
}

static khub_status q_view(void *state, khub_kv_cache *kc, int32_t layer, int32_t seq, int64_t n,
                          khub_tensor *k, khub_tensor *v)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    char op[64];
    snprintf(op, sizeof op, "%s.view", q_op(kc));
    if (!kc) return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG, "%s: cache is NULL", op);
    KHUB_PU_TRY(khub_ref__kv_locate(host, op, &kc->cfg, layer, seq));
    qslot *s = q_slot(kc, layer, seq);
    if (n < 0 || n > s->len)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "%s: n (got %lld, want 0..%lld, the length of layer %d seq %d)", op,
                          (long long)n, (long long)s->len, (int)layer, (int)seq);
    size_t row = (size_t)kc->hd * kc->esize;
    KHUB_PU_TRY(q_grow(host, op, &kc->sk, &kc->sv, &kc->scap, n, kc->cfg.max_tokens, row, 0));
    float *tmp = kc->tmp;
    for (int64_t i = 0; i < n; i++) {
        uint8_t *dk = kc->sk + (size_t)i * row, *dv = kc->sv + (size_t)i * row;
        if (i < s->qlen) {
            dq_key(kc, s->kq, i, tmp);
            q_put(kc, tmp, dk);
            dq_token(kc, s->vq + (size_t)i * kc->rec, tmp);
            q_put(kc, tmp, dv);
        } else {
            q_put(kc, s->kr + (i - s->qlen) * kc->hd, dk);
            q_put(kc, s->vr + (i - s->qlen) * kc->hd, dv);
        }
    }
    int64_t H = kc->cfg.n_kv_heads, D = kc->cfg.head_dim;
    KHUB_PU_TRY(
        khub_ref__kv_view_fill(host, op, k, "k", kc->sk, kc->cfg.dtype, n, H, D, kc->hd, D));
    return khub_ref__kv_view_fill(host, op, v, "v", kc->sv, kc->cfg.dtype, n, H, D, kc->hd, D);
}

static khub_status q_truncate(void *state, khub_kv_cache *kc, int32_t seq, int64_t n)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    char op[64];
    snprintf(op, sizeof op, "%s.truncate", q_op(kc));
    if (!kc) return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG, "%s: cache is NULL", op);
    KHUB_PU_TRY(khub_ref__kv_locate(host, op, &kc->cfg, 0, seq));
    if (n < 0)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG, "%s: n (got %lld, want >= 0)",
                          op, (long long)n);
    for (int32_t l = 0; l < kc->cfg.n_layers; l++) {
        qslot *s = q_slot(kc, l, seq);
        if (s->len > n) s->len = n;
        if (s->qlen <= n) continue;
        int64_t keep = kc->kchan ? n - n % kc->group : n;
        if (keep < n) { /* inside a key block: its kept positions go back to the residual */
            KHUB_PU_TRY(q_grow(host, op, (uint8_t **)&s->kr, (uint8_t **)&s->vr, &s->rcap, n - keep,
                               kc->cfg.max_tokens, (size_t)kc->hd * sizeof(float), 0));
            for (int64_t p = keep; p < n; p++) {
                dq_key(kc, s->kq, p, s->kr + (p - keep) * kc->hd);
                dq_token(kc, s->vq + (size_t)p * kc->rec, s->vr + (p - keep) * kc->hd);
            }
        }
        s->qlen = keep;
    }
    return KHUB_STATUS_OK;
}

static khub_status q_memory(void *state, khub_kv_cache *kc, khub_kv_cache_memory *out)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    char op[64];
    snprintf(op, sizeof op, "%s.memory", q_op(kc));
    if (!kc) return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG, "%s: cache is NULL", op);
    KHUB_PU_TRY(khub_pu_args_check(host, op, out, sizeof *out));
    uint64_t rrow = (uint64_t)kc->hd * sizeof(float) * 2;
    uint64_t total = (uint64_t)kc->scap * (uint64_t)kc->hd * kc->esize * 2;
    int64_t used = 0;
    for (int32_t q = 0; q < kc->cfg.n_seqs; q++) {
        int64_t longest = 0;
        for (int32_t l = 0; l < kc->cfg.n_layers; l++) {
            const qslot *s = q_slot(kc, l, q);
            total += q_units(s->qcap, kc->kchan ? kc->group : 1, kc->kchan ? kc->kblock : kc->rec) +
                     (uint64_t)s->qcap * kc->rec + (uint64_t)s->rcap * rrow;
            if (s->len > longest) longest = s->len;
        }
        used += longest;
    }
    out->bytes_total = total;
    /* keys per channel: a block's bytes shared by its tokens, rounded up */
    uint64_t krec = kc->kchan ? (kc->kblock + (size_t)kc->group - 1) / (size_t)kc->group : kc->rec;
    out->bytes_per_token = (krec + kc->rec) * (uint64_t)kc->cfg.n_layers;
    out->tokens_capacity = kc->cfg.max_tokens;
    out->tokens_used = used;
    return KHUB_STATUS_OK;
}

/* ------------------------------------------------------------------------ */
/* Descriptors                                                              */
/* ------------------------------------------------------------------------ */

static const khub_kv_cache_methods q8_methods = {
    KHUB_STRUCT_INIT(khub_kv_cache_methods),
    .create = q8_create,
    .destroy = q_destroy,
    .write = q_write,
    .view = q_view,
    .truncate = q_truncate,
    .memory = q_memory,
};

static const khub_kv_cache_methods q4_methods = {
    KHUB_STRUCT_INIT(khub_kv_cache_methods),
    .create = q4_create,
    .destroy = q_destroy,
    .write = q_write,
    .view = q_view,
    .truncate = q_truncate,
    .memory = q_memory,
};

/* Priority -1: served only when named. */
static const khub_op_caps q_caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CPU,
    .dtypes = KHUB_REF_BIT_F32 | KHUB_REF_BIT_F16,
    .flags = KHUB_CAP_STRIDED_KV | KHUB_CAP_KV_F16,
    .priority = -1,
};

const khub_op_desc khub_ref__quantized_cache_op = {
    KHUB_STRUCT_INIT(khub_op_desc),
    .name = "quantized_cache",
    .kind = KHUB_OP_KV_CACHE,
    .caps = &q_caps,
    .run = NULL,
    .methods = &q8_methods,
};

const khub_op_desc khub_ref__quantized_cache_int4_op = {
    KHUB_STRUCT_INIT(khub_op_desc),
    .name = "quantized_cache_int4",
    .kind = KHUB_OP_KV_CACHE,
    .caps = &q_caps,
    .run = NULL,
    .methods = &q4_methods,
};
