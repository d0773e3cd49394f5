/*
 * kvcache_strategy.h: what the cache strategies of ref-cpu share (the
 * quantized caches in kvcache_quant.c, the sliding-window one in
 * kvcache_sliding.c, the offloaded one in kvcache_offload.c; kvcache.c is
 * the dense one): their options parser, argument checks and view filling
 * (kvcache_common.c), the write checks every cache makes, and the row
 * copy the sliding and offloaded caches share.
 */
#ifndef KHUB_REF_KVCACHE_STRATEGY_H
#define KHUB_REF_KVCACHE_STRATEGY_H

#include <stdio.h>

#include "ref_cpu.h"

/* One option a cache accepts: an integer (ival) or a string (sval of scap
 * bytes). The caller presets defaults; parsing overwrites what is given. */
typedef struct khub_ref_kv_opt {
    const char *key;
    int64_t *ival;
    char *sval;
    size_t scap;
} khub_ref_kv_opt;

/* Parses cfg->options (ABI 1.4; absent or NULL = defaults) against opts:
 * an unknown key, a value that is not a non-negative integer, or a string
 * too long is KHUB_STATUS_INVALID_ARG. */
KHUB_REF_INTERNAL khub_status khub_ref__kv_opts_parse(const khub_host_api *host, const char *op,
                                                      const khub_kv_cache_config *cfg,
                                                      const khub_ref_kv_opt *opts, int n_opts);

/* Checks layer and seq against the config. */
KHUB_REF_INTERNAL khub_status khub_ref__kv_locate(const khub_host_api *host, const char *op,
                                                  const khub_kv_cache_config *cfg, int32_t layer,
                                                  int32_t seq);

/* Fills caller tensor t (shape and strides arrays of 3) as [n, H, D] of
 * dtype at data with strides [stride0, stride1, 1] elements. */
KHUB_REF_INTERNAL khub_status khub_ref__kv_view_fill(const khub_host_api *host, const char *op,
                                                     khub_tensor *t, const char *name, void *data,
                                                     khub_dtype dtype, int64_t n, int64_t H,
                                                     int64_t D, int64_t stride0, int64_t stride1);

/* The config checks of every cache (kvcache.c's): sizes >= 1, dtype f32 or
 * f16; *esize receives 4 or 2. */
KHUB_REF_INTERNAL khub_status khub_ref__kv_config_check(const khub_host_api *host, const char *op,
                                                        const khub_kv_cache_config *cfg,
                                                        size_t *esize);

/* The write checks of every cache: args size, layer/seq, k and v f32
 * [n, n_kv_heads, head_dim] on the CPU, and pos in [lo, len] with
 * pos + n <= max_tokens. lo is the oldest position still writable (0, or a
 * sliding cache's first kept). */
KHUB_REF_INTERNAL khub_status khub_ref__kv_write_check(const khub_host_api *host, const char *op,
                                                       const khub_kv_cache_config *cfg,
                                                       const khub_kv_write_args *a, int64_t lo,
                                                       int64_t len);

/* Reads token i, head h of a write's k or v ([n, H, D] f32, strided) into
 * row[D]. */
static inline void khub_ref__kv_read_row(const khub_tensor *t, int64_t i, int64_t h, int64_t D,
                                         float *row)
{
    int64_t st[3] = {0, 0, 0};
    khub_pu_strides(t, st);
    const float *x = (const float *)khub_pu_base(t) + i * st[0] + h * st[1];
    for (int64_t d = 0; d < D; d++) row[d] = x[d * st[2]];
}

/* Copies a write's k or v t ([n, H, D] f32, strided) into rows r0 .. r0+n-1
 * of dst, a contiguous [rows, H, D] buffer of cfg->dtype (esize 4: f32,
 * 2: f16). The sliding and offloaded caches store this way; the paged one
 * scatters into blocks. */
static inline void khub_ref__kv_store_rows(const khub_kv_cache_config *cfg, size_t esize,
                                           uint8_t *dst, const khub_tensor *t, int64_t r0)
{
    int64_t st[3] = {0, 0, 0}, n = t->shape[0], H = cfg->n_kv_heads, D = cfg->head_dim;
    khub_pu_strides(t, st);
    const float *src = khub_pu_base(t);
    for (int64_t i = 0; i < n; i++) {
        for (int64_t h = 0; h < H; h++) {
            const float *x = src + i * st[0] + h * st[1];
            int64_t at = ((r0 + i) * H + h) * D;
            for (int64_t d = 0; d < D; d++) {
                if (esize == 2)
                    ((uint16_t *)dst)[at + d] = khub_pu_f32_to_f16(x[d * st[2]]);
                else
                    ((float *)dst)[at + d] = x[d * st[2]];
            }
        }
    }
}

#endif /* KHUB_REF_KVCACHE_STRATEGY_H */
