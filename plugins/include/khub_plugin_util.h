/*
 * khub_plugin_util.h: header-only helpers any khub plugin may use.
 *
 * Plugins never link libkhub, so everything here is static inline and needs
 * only khub_plugin.h and the C library:
 *   - half-precision conversions (IEEE binary16 and bfloat16 <-> f32), exact
 *     and round-to-nearest-even, with no CPU feature requirement;
 *   - tensor checks that report through host->fail in the form
 *     "<op>: <what> (got ..., want ...)";
 *   - stride accessors (strides in elements; compact row-major when NULL).
 *
 * Usage inside an op:
 *
 *     KHUB_PU_TRY(khub_pu_tensor_check(host, "rms_norm", "x", a->x, 2,
 *                                      KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32), KHUB_DEVICE_CPU));
 *     KHUB_PU_TRY(khub_pu_dim_check(host, "rms_norm", "weight", a->weight, 0, dim, "dim"));
 *     int64_t s[2];
 *     khub_pu_strides(a->x, s);
 *     const float *x = khub_pu_base(a->x);   // x[i * s[0] + j * s[1]]
 *
 * Include it from a plugin source in this tree as
 * "../include/khub_plugin_util.h", and from an installed khub as
 * <khub/helpers/khub_plugin_util.h> (`pkg-config --cflags khub-plugin`). It
 * is not part of the ABI: helpers may change between khub releases (a plugin
 * compiles them in, so a built plugin is never affected).
 */
#ifndef KHUB_PLUGIN_UTIL_H
#define KHUB_PLUGIN_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <khub/khub_plugin.h>

/* ------------------------------------------------------------------------ */
/* Half-precision conversions                                               */
/* ------------------------------------------------------------------------ */

static inline uint32_t khub_pu_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float khub_pu_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* binary16 -> f32, exact for every input (subnormals, inf, NaN payloads). */
static inline float khub_pu_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24, exact in f32 */
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exp == 31) return khub_pu_bits_f32(sign | 0x7f800000u | (man << 13));
    return khub_pu_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

/* f32 -> binary16, round to nearest even; overflow gives inf, NaN stays NaN
 * (quiet). */
static inline uint16_t khub_pu_f32_to_f16(float f)
{
    uint32_t x = khub_pu_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or NaN */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (ax < 0x38800000u) {
        /* below 2^-14: a binary16 subnormal, in units of 2^-24 */
        if (ax < 0x33000000u) return (uint16_t)sign; /* < 2^-25: rounds to zero */
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24 */
        uint32_t h = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
    /* normal: rebias the exponent (127 -> 15) and round 13 mantissa bits; a
     * carry out of the mantissa correctly bumps the exponent. */
    uint32_t h = (ax - 0x38000000u) >> 13;
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

static inline float khub_pu_bf16_to_f32(uint16_t b) { return khub_pu_bits_f32((uint32_t)b << 16); }

/* f32 -> bfloat16, round to nearest even; NaN stays NaN (quiet). */
static inline uint16_t khub_pu_f32_to_bf16(float f)
{
    uint32_t x = khub_pu_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* Little-endian reads from packed (unaligned) bytes. */
static inline uint16_t khub_pu_load_u16le(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static inline float khub_pu_load_f16le(const uint8_t *p)
{
    return khub_pu_f16_to_f32(khub_pu_load_u16le(p));
}

static inline void khub_pu_store_f16le(uint8_t *p, float f)
{
    uint16_t h = khub_pu_f32_to_f16(f);
    p[0] = (uint8_t)(h & 0xffu);
    p[1] = (uint8_t)(h >> 8);
}

/* f32 stored in host byte order (every khub target is little-endian). */
static inline float khub_pu_load_f32(const uint8_t *p)
{
    float f;
    memcpy(&f, p, sizeof f);
    return f;
}

static inline void khub_pu_store_f32(uint8_t *p, float f) { memcpy(p, &f, sizeof f); }

/* ------------------------------------------------------------------------ */
/* Tensor accessors                                                         */
/* ------------------------------------------------------------------------ */

/* Propagates a non-OK status (its message is already recorded). */
#define KHUB_PU_TRY(expr) \
    do { \
        khub_status st_pu_ = (expr); \
        if (st_pu_ != KHUB_STATUS_OK) return st_pu_; \
    } while (0)

#define KHUB_PU_MAX_DIMS 8

/* Address of element 0. */
static inline void *khub_pu_base(const khub_tensor *t) { return (char *)t->data + t->byte_offset; }

/* Bytes per element of a non-block dtype, 0 for block formats or odd bits. */
static inline size_t khub_pu_elem_size(khub_dtype d)
{
    if (d.code == KHUB_DL_BLOCKQ || d.lanes != 1 || d.bits % 8 != 0) return 0;
    return d.bits / 8u;
}

/* Fills s[ndim] with the element strides of t (compact row-major when
 * t->strides is NULL). t must have passed khub_pu_tensor_check. */
static inline void khub_pu_strides(const khub_tensor *t, int64_t *s)
{
    int64_t acc = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        s[d] = t->strides ? t->strides[d] : acc;
        acc *= t->shape[d];
    }
}

/* True when t is compact row-major (NULL strides, or strides equal to the
 * compact ones; dims of extent 1 may have any stride). */
static inline bool khub_pu_is_compact(const khub_tensor *t)
{
    if (!t->strides) return true;
    int64_t acc = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->strides[d] != acc) return false;
        acc *= t->shape[d];
    }
    return true;
}

/* Name of a dtype for messages ("f32", "f16", "bf16", "q4_k", ...). */
static inline const char *khub_pu_dtype_name(khub_dtype d)
{
    static const char *const q[] = {"q?",   "q8_0",     "q4_0", "q4_1", "q4_k",
                                    "q6_k", "int8_row", "nf4",  "q5_0", "q5_1"};
    switch (khub_dtype_id_of(d)) {
    case KHUB_DTYPE_ID_F32: return "f32";
    case KHUB_DTYPE_ID_F16: return "f16";
    case KHUB_DTYPE_ID_BF16: return "bf16";
    case KHUB_DTYPE_ID_I8: return "i8";
    case KHUB_DTYPE_ID_I32: return "i32";
    default: break;
    }
    if (d.code == KHUB_DL_BLOCKQ && d.bits < sizeof q / sizeof q[0]) return q[d.bits];
    return "unknown";
}

/*
 * Checks that tensor `name` of op `op` is usable: not NULL, data not NULL,
 * on device_type (KHUB_DEVICE_CPU also accepts CUDA_HOST memory), ndim
 * dimensions, non-negative shape, a dtype whose KHUB_DTYPE_BIT is in
 * dtype_bits, and an extent (largest element offset, in bytes) that fits in
 * int64. Block-quantized tensors must be compact. Reports through host->fail
 * and returns KHUB_STATUS_INVALID_ARG (KHUB_STATUS_OVERFLOW for the extent).
 */
static inline khub_status khub_pu_tensor_check(const khub_host_api *host, const char *op,
                                               const char *name, const khub_tensor *t, int32_t ndim,
                                               uint64_t dtype_bits, uint32_t device_type)
{
    void *c = host->host_ctx;
    if (!t)
        return host->fail(c, KHUB_STATUS_INVALID_ARG, "%s: %s is NULL (want a tensor)", op, name);
    if (!t->data)
        return host->fail(c, KHUB_STATUS_INVALID_ARG, "%s: %s.data is NULL (want memory)", op,
                          name);
    int32_t dev = t->device.device_type;
    bool dev_ok = dev == (int32_t)device_type ||
                  (device_type == KHUB_DEVICE_CPU && dev == KHUB_DEVICE_CUDA_HOST);
    if (!dev_ok)
        return host->fail(c, KHUB_STATUS_INVALID_ARG, "%s: %s.device_type (got %d, want %u)", op,
                          name, (int)dev, (unsigned)device_type);
    if (t->ndim != ndim)
        return host->fail(c, KHUB_STATUS_INVALID_ARG, "%s: %s.ndim (got %d, want %d)", op, name,
                          (int)t->ndim, (int)ndim);
    if (!t->shape)
        return host->fail(c, KHUB_STATUS_INVALID_ARG, "%s: %s.shape is NULL (want %d dims)", op,
                          name, (int)ndim);
    int id = khub_dtype_id_of(t->dtype);
    if (id < 0 || id >= 64 || !(dtype_bits & KHUB_DTYPE_BIT(id)))
        return host->fail(c, KHUB_STATUS_INVALID_ARG,
                          "%s: %s.dtype (got %s, code %u bits %u lanes %u, not served by this op)",
                          op, name, khub_pu_dtype_name(t->dtype), t->dtype.code, t->dtype.bits,
                          t->dtype.lanes);
    bool blockq = t->dtype.code == KHUB_DL_BLOCKQ;
    if (blockq && !khub_pu_is_compact(t))
        return host->fail(c, KHUB_STATUS_INVALID_ARG,
                          "%s: %s has strides (want compact rows for a block-quantized tensor)", op,
                          name);
    int64_t esize = blockq ? 1 : (int64_t)khub_pu_elem_size(t->dtype);
    int64_t extent = 0, acc = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        int64_t n = t->shape[d];
        if (n < 0)
            return host->fail(c, KHUB_STATUS_INVALID_ARG, "%s: %s.shape[%d] (got %lld, want >= 0)",
                              op, name, d, (long long)n);
        int64_t s = t->strides ? t->strides[d] : acc;
        if (s == INT64_MIN) s = INT64_MAX; /* |s| below must not overflow; fails the check */
        int64_t part;
        bool ok = n == 0 || (!__builtin_mul_overflow(n - 1, s < 0 ? -s : s, &part) &&
                             !__builtin_add_overflow(extent, part, &extent));
        ok = ok && !__builtin_mul_overflow(acc, n, &acc);
        if (!ok)
            return host->fail(c, KHUB_STATUS_OVERFLOW,
                              "%s: %s spans more than 2^63 elements (check its shape and strides)",
                              op, name);
    }
    if (__builtin_mul_overflow(extent + 1, esize, &extent))
        return host->fail(c, KHUB_STATUS_OVERFLOW,
                          "%s: %s spans more than 2^63 bytes (check its shape and strides)", op,
                          name);
    return KHUB_STATUS_OK;
}

/* Checks t->shape[d] == want; `what` names the quantity ("n_heads"). */
static inline khub_status khub_pu_dim_check(const khub_host_api *host, const char *op,
                                            const char *name, const khub_tensor *t, int d,
                                            int64_t want, const char *what)
{
    if (t->shape[d] == want) return KHUB_STATUS_OK;
    return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                      "%s: %s.shape[%d] (%s) (got %lld, want %lld)", op, name, d, what,
                      (long long)t->shape[d], (long long)want);
}

/* Checks that an argument struct is at least min_size bytes (its ABI 1.0
 * size) and not NULL. */
static inline khub_status khub_pu_args_check(const khub_host_api *host, const char *op,
                                             const void *args, uint32_t min_size)
{
    if (!args) return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG, "%s: args is NULL", op);
    uint32_t size;
    memcpy(&size, args, sizeof size);
    if (size < min_size)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "%s: args.struct_size (got %u, want >= %u)", op, (unsigned)size,
                          (unsigned)min_size);
    return KHUB_STATUS_OK;
}

/* The sizes of the attention argument structs before ABI 1.5 appended
 * softcap: what every host sends at least (1.0's khub_attention_args, 1.4's
 * khub_paged_attention_args). */
#define KHUB_PU_ATTN_ARGS_1_0_SIZE  80u
#define KHUB_PU_PAGED_ARGS_1_4_SIZE 144u

#if KHUB_PLUGIN_TARGET_MINOR >= 5
/* The logit soft-cap of an attention call (ABI 1.5): the args' softcap when
 * the host's struct_size covers it (offset `at`, 80 in khub_attention_args,
 * 144 in khub_paged_attention_args), else 0 (no cap). Refuses a negative or
 * non-finite cap. */
static inline khub_status khub_pu_softcap(const khub_host_api *host, const char *op,
                                          const void *args, size_t at, float *cap)
{
    uint32_t size;
    memcpy(&size, args, sizeof size);
    *cap = 0.0f;
    if (size < at + sizeof(float)) return KHUB_STATUS_OK;
    memcpy(cap, (const char *)args + at, sizeof *cap);
    if (!(*cap >= 0.0f) || *cap > 3.4e38f)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "%s: softcap (got %g, want 0 or a finite positive cap)", op,
                          (double)*cap);
    return KHUB_STATUS_OK;
}
#endif

/* The size of khub_kv_cache_config in ABI 1.0-1.3 (every host sends at
 * least this much). */
#define KHUB_PU_KV_CONFIG_1_0_SIZE 40u

/* Copies the host's cache config into dst, never past the host's
 * struct_size; fields the host lacks are zero. The borrowed pointers of ABI
 * 1.4 (options, layer_window) are cleared: they are valid only during
 * create. */
static inline void khub_pu_kv_config_copy(khub_kv_cache_config *dst,
                                          const khub_kv_cache_config *src)
{
    uint32_t n = src->struct_size < sizeof *dst ? src->struct_size : (uint32_t)sizeof *dst;
    memset(dst, 0, sizeof *dst);
    memcpy(dst, src, n);
    dst->struct_size = sizeof *dst;
#if KHUB_PLUGIN_TARGET_MINOR >= 4
    dst->options = NULL;
    dst->layer_window = NULL;
#endif
}

#endif /* KHUB_PLUGIN_UTIL_H */
