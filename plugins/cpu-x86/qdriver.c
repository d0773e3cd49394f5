/*
 * qdriver.c: the driver shared by the quantized-activation qlinear kernels
 * (qlinear.c: int8 blocks, qlinear_q16.c: int16 blocks). Each kernel says
 * how to quantize one row of x and gives its tile functions; the driver
 * quantizes x (in parallel over tokens when there are many), then runs
 * the tiles of k->tr output rows x k->tc tokens, parallel over row tiles.
 */
#include <stdint.h>
#include <string.h>

#include "kx.h"

typedef struct job {
    const kx_linear *a;
    const kx_qkernel *k;
    unsigned char *xq; /* [n][nb] quantized blocks of k->blk_bytes */
    int64_t nb;
} job;

static void quantize_range(void *ud, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const job *j = ud;
    size_t row_bytes = (size_t)j->nb * j->k->blk_bytes;
    for (int64_t t = begin; t < end; t++)
        j->k->quantize_row(j->a->x + t * j->a->ldx, j->a->in, j->xq + (size_t)t * row_bytes);
}

/* Items are tiles of k->tr output rows. */
static void rows_range(void *ud, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const job *j = ud;
    const kx_linear *a = j->a;
    const kx_qkernel *k = j->k;
    size_t row_bytes = (size_t)j->nb * k->blk_bytes;
    for (int64_t rt = begin; rt < end; rt++) {
        int64_t r0 = rt * k->tr;
        int tr = (int)(a->out - r0 < k->tr ? a->out - r0 : k->tr);
        const uint8_t *w = a->w + (size_t)r0 * a->w_row_bytes;
        const float *bias = a->bias ? a->bias + r0 : NULL;
        for (int64_t c0 = 0; c0 < a->n; c0 += k->tc) {
            int tc = (int)(a->n - c0 < k->tc ? a->n - c0 : k->tc);
            k->tiles[(tr - 1) * k->tc + (tc - 1)](w, a->w_row_bytes, j->xq + (size_t)c0 * row_bytes,
                                                  j->nb, j->nb, bias, a->y + c0 * a->ldy + r0,
                                                  a->ldy);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Batch tiles: one row x up to KX_TB tokens                                */
/* ------------------------------------------------------------------------ */

typedef struct bjob {
    job j;
    int16_t *xp; /* [n][np][KX_PAIR_CODES]: each token's pairs in k->pairs' layout */
    float *dxv;  /* [n][np][8]: per token and block pair, see kx_qbtile_fn */
    float *sv;   /* [groups][nb][KX_TB]: the block sums of each token group */
    int64_t np;
} bjob;

/* Quantizes tokens [begin, end) and lays out their scales for the tiles. */
static void bquantize_range(void *ud, int64_t begin, int64_t end, int thread)
{
    const bjob *bj = ud;
    quantize_range((void *)&bj->j, begin, end, thread);
    size_t row_bytes = (size_t)bj->j.nb * bj->j.k->blk_bytes;
    for (int64_t t = begin; t < end; t++) {
        const unsigned char *xb = bj->j.xq + (size_t)t * row_bytes;
        bj->j.k->pairs(xb, bj->j.nb, bj->xp + (size_t)t * (size_t)bj->np * KX_PAIR_CODES);
        float *dx = bj->dxv + (size_t)t * (size_t)bj->np * 8;
        float *sv = bj->sv + (size_t)(t / KX_TB) * (size_t)bj->j.nb * KX_TB + t % KX_TB;
        for (int64_t b = 0; b < bj->j.nb; b++) {
            float ds[2]; /* d, s: the first two floats of every block */
            memcpy(ds, xb + (size_t)b * bj->j.k->blk_bytes, sizeof ds);
            sv[b * KX_TB] = ds[1];
            if (b < 2 * bj->np)
                for (int l = 0; l < 8; l++)
                    if (((l >> 1) & 1) == (b & 1)) dx[(b / 2) * 8 + l] = ds[0];
        }
    }
}

/* Output rows per chunk of brows_range: 32 rows of a 576-wide Q8_0 matrix
 * are 19.6 KB, so a chunk stays in L1 while every token group passes over
 * it. */
#define KX_BROWS 32

/* Items are output rows. A thread's range goes in chunks of KX_BROWS rows,
 * and every token group passes over a chunk before the next: the weights
 * are read from memory once per call, not once per group (the tied head of
 * a 49152 x 576 Q8_0 model is 30 MB, read 4 times per 32-sequence step
 * when the groups were the outer loop). The order of the (row, token) dot
 * products does not change any result. */
static void brows_range(void *ud, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const bjob *bj = ud;
    const kx_linear *a = bj->j.a;
    const int64_t nb = bj->j.nb, dxs = bj->np * 8, xps = bj->np * KX_PAIR_CODES;
    size_t row_bytes = (size_t)nb * bj->j.k->blk_bytes;
    for (int64_t r0 = begin; r0 < end; r0 += KX_BROWS) {
        const int64_t r1 = end - r0 < KX_BROWS ? end : r0 + KX_BROWS;
        for (int64_t c0 = 0; c0 < a->n; c0 += KX_TB) {
            int tb = (int)(a->n - c0 < KX_TB ? a->n - c0 : KX_TB);
            const kx_qbtile_fn fn = bj->j.k->btiles[tb - 1];
            const unsigned char *x = bj->j.xq + (size_t)c0 * row_bytes;
            const int16_t *xp = bj->xp + c0 * xps;
            const float *dxv = bj->dxv + c0 * dxs, *sv = bj->sv + (c0 / KX_TB) * nb * KX_TB;
            for (int64_t r = r0; r < r1; r++)
                fn(a->w + (size_t)r * a->w_row_bytes, x, nb, nb, xp, xps, dxv, dxs, sv,
                   a->bias ? a->bias + r : NULL, a->y + c0 * a->ldy + r, a->ldy);
        }
    }
}

static khub_status batch_run(kx_state *s, const kx_linear *a, const kx_qkernel *k)
{
    const khub_host_api *h = s->host;
    bjob bj = {.j = {.a = a, .k = k, .nb = a->in / 32}};
    bj.np = bj.j.nb / 2;
    const size_t groups = (size_t)(a->n + KX_TB - 1) / KX_TB;
    size_t xq_bytes, xp_bytes, dx_bytes, sv_bytes, bytes;
    /* plugin.c bounds in; the products below are checked anyway. */
    if (__builtin_mul_overflow((size_t)a->n, (size_t)bj.j.nb * k->blk_bytes, &xq_bytes) ||
        __builtin_mul_overflow((size_t)a->n, (size_t)bj.np * KX_PAIR_CODES * sizeof(int16_t),
                               &xp_bytes) ||
        __builtin_mul_overflow((size_t)a->n, (size_t)bj.np * 8 * sizeof(float), &dx_bytes) ||
        __builtin_mul_overflow(groups, (size_t)bj.j.nb * KX_TB * sizeof(float), &sv_bytes) ||
        __builtin_add_overflow(xq_bytes, xp_bytes, &bytes) ||
        __builtin_add_overflow(bytes, dx_bytes, &bytes) ||
        __builtin_add_overflow(bytes, sv_bytes, &bytes))
        return KX_FAIL(s, KHUB_STATUS_OVERFLOW,
                       "qlinear: %lld tokens of %lld inputs overflow the scratch size",
                       (long long)a->n, (long long)a->in);
    /* xq_bytes is a multiple of 8 (blocks start with two floats), xp_bytes
     * of 128. */
    unsigned char *raw = h->alloc(h->host_ctx, bytes);
    if (!raw)
        return KX_FAIL(s, KHUB_STATUS_NOMEM,
                       "qlinear: no memory for %zu bytes of quantized activations", bytes);
    bj.j.xq = raw;
    bj.xp = (int16_t *)(raw + xq_bytes);
    bj.dxv = (float *)(raw + xq_bytes + xp_bytes);
    bj.sv = (float *)(raw + xq_bytes + xp_bytes + dx_bytes);
    memset(bj.sv, 0, sv_bytes); /* the tokens past n of the last group */
    if (a->n * a->in <= KX_INLINE_ELEMS)
        bquantize_range(&bj, 0, a->n, 0);
    else
        h->parallel_for(h->host_ctx, a->n, bquantize_range, &bj);
    h->parallel_for(h->host_ctx, a->out, brows_range, &bj);
    h->free(h->host_ctx, raw);
    return KHUB_STATUS_OK;
}

khub_status KX(qdriver_run)(kx_state *s, const kx_linear *a, const kx_qkernel *k)
{
    if (k->btiles && a->n >= KX_BATCH_MIN_N) return batch_run(s, a, k);
    const khub_host_api *h = s->host;
    job j = {.a = a, .k = k, .nb = a->in / 32};
    size_t bytes;
    if (__builtin_mul_overflow((size_t)a->n, (size_t)j.nb * k->blk_bytes, &bytes))
        return KX_FAIL(s, KHUB_STATUS_OVERFLOW,
                       "qlinear: %lld tokens of %lld inputs overflow the scratch size",
                       (long long)a->n, (long long)a->in);
    j.xq = h->alloc(h->host_ctx, bytes);
    if (!j.xq)
        return KX_FAIL(s, KHUB_STATUS_NOMEM,
                       "qlinear: no memory for %zu bytes of quantized activations", bytes);
    if (a->n * a->in > KX_INLINE_ELEMS)
        h->parallel_for(h->host_ctx, a->n, quantize_range, &j);
    else
        quantize_range(&j, 0, a->n, 0);
    h->parallel_for(h->host_ctx, (a->out + k->tr - 1) / k->tr, rows_range, &j);
    h->free(h->host_ctx, j.xq);
    return KHUB_STATUS_OK;
}
