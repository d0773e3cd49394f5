/*
 * ref_cpu.h: what the files of the ref-cpu plugin share.
 *
 * ref-cpu is khub's numeric oracle: every other plugin is tested against it,
 * so its code favours obvious math over speed (dot products accumulate in
 * double, softmax subtracts the row maximum, angles are computed in double).
 * One file per op family; each exports its khub_op_desc to plugin.c.
 *
 * Threading: ops validate everything before host->parallel_for, so worker
 * bodies never fail except for scratch allocation, which they report through
 * a flag the op turns into KHUB_STATUS_NOMEM afterwards.
 */
#ifndef KHUB_REF_CPU_H
#define KHUB_REF_CPU_H

#include <stdatomic.h>

#include <khub/khub_plugin.h>

#include "../include/khub_plugin_util.h"

#define KHUB_REF_INTERNAL __attribute__((visibility("hidden")))

/* The plugin state handed to every op: the host table (borrowed, valid for
 * the plugin's lifetime). */
typedef struct khub_ref_state {
    const khub_host_api *host;
} khub_ref_state;

/* The op descriptors, one per file. */
KHUB_REF_INTERNAL extern const khub_op_desc khub_ref__attention_op;
KHUB_REF_INTERNAL extern const khub_op_desc khub_ref__linear_op;
KHUB_REF_INTERNAL extern const khub_op_desc khub_ref__qlinear_op;
KHUB_REF_INTERNAL extern const khub_op_desc khub_ref__kv_cache_op;
KHUB_REF_INTERNAL extern const khub_op_desc khub_ref__static_cache_op;
KHUB_REF_INTERNAL extern const khub_op_desc khub_ref__quantized_cache_op;
KHUB_REF_INTERNAL extern const khub_op_desc khub_ref__quantized_cache_int4_op;
KHUB_REF_INTERNAL extern const khub_op_desc khub_ref__sliding_cache_op;   /* ABI 1.4 */
KHUB_REF_INTERNAL extern const khub_op_desc khub_ref__offloaded_cache_op; /* ABI 1.4 */
KHUB_REF_INTERNAL extern const khub_op_desc khub_ref__norm_op;
KHUB_REF_INTERNAL extern const khub_op_desc khub_ref__activation_op;
KHUB_REF_INTERNAL extern const khub_op_desc khub_ref__rotary_op;
KHUB_REF_INTERNAL extern const khub_op_desc khub_ref__paged_cache_op;     /* ABI 1.4 */
KHUB_REF_INTERNAL extern const khub_op_desc khub_ref__paged_attention_op; /* ABI 1.4 */
KHUB_REF_INTERNAL extern const khub_op_desc khub_ref__embedding_op;       /* ABI 1.5 */

/* quant.c: dequantizes one row of n weights (n a whole number of blocks,
 * already checked) from packed bytes into f32. Used by qlinear. */
KHUB_REF_INTERNAL void khub_ref__dequantize_row(khub_qformat fmt, const uint8_t *src, int64_t n,
                                                float *dst);

/* linear.c: the run function of "qlinear" (quant.c owns its descriptor). */
KHUB_REF_INTERNAL khub_status khub_ref__qlinear_run(void *state, const void *args);

/* Reads element i of a strided f32/f16/bf16 vector as f32. */
static inline float khub_ref__load(const void *base, khub_dtype dt, int64_t i)
{
    if (dt.bits == 32) return ((const float *)base)[i];
    uint16_t h = ((const uint16_t *)base)[i];
    return dt.code == KHUB_DL_BFLOAT ? khub_pu_bf16_to_f32(h) : khub_pu_f16_to_f32(h);
}

#define KHUB_REF_BIT_F32  KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32)
#define KHUB_REF_BIT_F16  KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F16)
#define KHUB_REF_BIT_BF16 KHUB_DTYPE_BIT(KHUB_DTYPE_ID_BF16)

#endif /* KHUB_REF_CPU_H */
