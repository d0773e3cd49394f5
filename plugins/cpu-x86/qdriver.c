/*
 * qdriver.c: the driver shared by the quantized-activation qlinear kernels
 * (qlinear.c: int8 blocks, qlinear_q16.c: int16 blocks). Each kernel says
 * how to quantize one row of x and gives its tile functions; the driver
 * quantizes x (in parallel over tokens when there are several), then runs
 * the tiles of k->tr output rows x k->tc tokens, parallel over row tiles.
 */
#include <stdint.h>

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

khub_status KX(qdriver_run)(kx_state *s, const kx_linear *a, const kx_qkernel *k)
{
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
    if (a->n > 1)
        h->parallel_for(h->host_ctx, a->n, quantize_range, &j);
    else
        quantize_range(&j, 0, a->n, 0);
    h->parallel_for(h->host_ctx, (a->out + k->tr - 1) / k->tr, rows_range, &j);
    h->free(h->host_ctx, j.xq);
    return KHUB_STATUS_OK;
}
