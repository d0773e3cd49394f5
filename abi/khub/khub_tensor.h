/*
 * khub_tensor.h: tensor descriptors that cross the plugin boundary.
 *
 * khub_tensor has the memory layout of DLPack's DLTensor (dlpack.h, v0.8 and
 * later), so a khub_tensor * can be handed to or taken from any DLPack
 * consumer by a cast; these are khub's own definitions of that published
 * layout, not a copy of dlpack.h. The device and dtype codes below equal
 * DLPack's. khub adds one private dtype code, KHUB_DL_BLOCKQ, for the block
 * quantized weight formats (Q8_0, Q4_1, Q5_0, NF4, ...) DLPack has no name for.
 *
 * Conventions:
 *   - shape[] is in elements, outermost first; for block-quantized tensors it
 *     is the logical (dequantized) shape.
 *   - strides[] is in elements (not bytes), or NULL for compact row-major.
 *     Block-quantized tensors are always compact: each row is
 *     khub_qformat_row_bytes(format, shape[ndim-1]) bytes.
 *   - data + byte_offset is the address of element 0.
 *
 * Anything not declared in abi/khub/ is not part of khub's API.
 */
#ifndef KHUB_TENSOR_H
#define KHUB_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "khub_version.h" /* KHUB_PLUGIN_TARGET_MINOR gates the 1.1 formats */

/* Device types: DLPack's DLDeviceType values. */
typedef enum khub_device_type {
    KHUB_DEVICE_CPU = 1,
    KHUB_DEVICE_CUDA = 2,
    KHUB_DEVICE_CUDA_HOST = 3
} khub_device_type;

/* Layout of DLDevice. */
typedef struct khub_device {
    int32_t device_type; /* khub_device_type */
    int32_t device_id;   /* ordinal; 0 for the CPU */
} khub_device;

/* Dtype codes: DLPack's DLDataTypeCode values, plus khub's block formats. */
typedef enum khub_dl_code {
    KHUB_DL_INT = 0,
    KHUB_DL_UINT = 1,
    KHUB_DL_FLOAT = 2,
    KHUB_DL_OPAQUE = 3,
    KHUB_DL_BFLOAT = 4,
    KHUB_DL_BOOL = 6,
    KHUB_DL_BLOCKQ = 0xC0 /* khub: bits holds a khub_qformat, lanes is 1 */
} khub_dl_code;

/* Layout of DLDataType. */
typedef struct khub_dtype {
    uint8_t code;   /* khub_dl_code */
    uint8_t bits;   /* bits per lane; for KHUB_DL_BLOCKQ the khub_qformat */
    uint16_t lanes; /* 1 for every tensor khub makes */
} khub_dtype;

/* Block-quantized weight formats. Values are ABI: never renumber. The GGUF
 * formats keep ggml's block layouts bit for bit so mmapped GGUF tensors are
 * used in place. */
typedef enum khub_qformat {
    KHUB_QFORMAT_NONE = 0,
    KHUB_QFORMAT_Q8_0 = 1, /* 32 weights: f16 scale + 32 x int8 (34 bytes) */
    KHUB_QFORMAT_Q4_0 =
        2, /* 32 weights: f16 scale + 16 bytes of nibbles, value (q-8)*d (18 bytes) */
    KHUB_QFORMAT_Q4_1 = 3, /* 32 weights: f16 scale, f16 min + 16 bytes, value q*d+m (20 bytes) */
    KHUB_QFORMAT_Q4_K = 4, /* 256 weights: ggml block_q4_K (144 bytes) */
    KHUB_QFORMAT_Q6_K = 5, /* 256 weights: ggml block_q6_K (210 bytes) */
    KHUB_QFORMAT_INT8_ROW = 6, /* per output row: f32 scale then in x int8, value q*scale */
    KHUB_QFORMAT_NF4 = 7,      /* 64 weights: f32 absmax + 32 bytes of NF4 codes (36 bytes) */
#if KHUB_PLUGIN_TARGET_MINOR >= 1
    /* added in ABI 1.1: 32 weights, 5-bit codes q = low nibble | bit l of the
     * little-endian u32 qh as bit 4 (ggml block_q5_0 / block_q5_1) */
    KHUB_QFORMAT_Q5_0 = 8, /* f16 d | u8 qh[4] | u8 qs[16], value (q-16)*d (22 bytes) */
    KHUB_QFORMAT_Q5_1 = 9, /* f16 d, f16 m | u8 qh[4] | u8 qs[16], value q*d+m (24 bytes) */
#endif
    KHUB_QFORMAT__COUNT
} khub_qformat;

/* Layout of DLTensor. */
typedef struct khub_tensor {
    void *data; /* borrowed; base address (device pointer for CUDA) */
    khub_device device;
    int32_t ndim; /* number of dimensions, 1..8 */
    khub_dtype dtype;
    int64_t *shape;       /* borrowed; [ndim] elements */
    int64_t *strides;     /* borrowed; [ndim] elements, or NULL for compact row-major */
    uint64_t byte_offset; /* bytes from data to element 0 */
} khub_tensor;

/* Common dtypes as compound literals. */
#define KHUB_DTYPE_F32    ((khub_dtype){KHUB_DL_FLOAT, 32, 1})
#define KHUB_DTYPE_F16    ((khub_dtype){KHUB_DL_FLOAT, 16, 1})
#define KHUB_DTYPE_BF16   ((khub_dtype){KHUB_DL_BFLOAT, 16, 1})
#define KHUB_DTYPE_I32    ((khub_dtype){KHUB_DL_INT, 32, 1})
#define KHUB_DTYPE_Q(fmt) ((khub_dtype){KHUB_DL_BLOCKQ, (uint8_t)(fmt), 1})

/* Dtype ids: one bit each in capability masks (khub_op_caps.dtypes). Values
 * are ABI: never renumber. */
typedef enum khub_dtype_id {
    KHUB_DTYPE_ID_F32 = 0,
    KHUB_DTYPE_ID_F16 = 1,
    KHUB_DTYPE_ID_BF16 = 2,
    KHUB_DTYPE_ID_I8 = 3,
    KHUB_DTYPE_ID_I32 = 4,
    /* 16 + khub_qformat for the block formats */
    KHUB_DTYPE_ID_QBASE = 16
} khub_dtype_id;

#define KHUB_DTYPE_BIT(id)    (UINT64_C(1) << (id))
#define KHUB_DTYPE_BIT_Q(fmt) (UINT64_C(1) << (KHUB_DTYPE_ID_QBASE + (fmt)))

/* The id of a dtype, or -1 when it has none. */
static inline int khub_dtype_id_of(khub_dtype t)
{
    if (t.lanes != 1) return -1;
    if (t.code == KHUB_DL_FLOAT && t.bits == 32) return KHUB_DTYPE_ID_F32;
    if (t.code == KHUB_DL_FLOAT && t.bits == 16) return KHUB_DTYPE_ID_F16;
    if (t.code == KHUB_DL_BFLOAT && t.bits == 16) return KHUB_DTYPE_ID_BF16;
    if (t.code == KHUB_DL_INT && t.bits == 8) return KHUB_DTYPE_ID_I8;
    if (t.code == KHUB_DL_INT && t.bits == 32) return KHUB_DTYPE_ID_I32;
    if (t.code == KHUB_DL_BLOCKQ && t.bits > 0 && t.bits < KHUB_QFORMAT__COUNT)
        return KHUB_DTYPE_ID_QBASE + t.bits;
    return -1;
}

/* Weights per block of a format (the row length must be a multiple), or 0. */
static inline int64_t khub_qformat_block_elems(khub_qformat f)
{
    switch (f) {
    case KHUB_QFORMAT_Q8_0:
    case KHUB_QFORMAT_Q4_0:
    case KHUB_QFORMAT_Q4_1:
#if KHUB_PLUGIN_TARGET_MINOR >= 1
    case KHUB_QFORMAT_Q5_0:
    case KHUB_QFORMAT_Q5_1:
#endif
        return 32;
    case KHUB_QFORMAT_Q4_K:
    case KHUB_QFORMAT_Q6_K: return 256;
    case KHUB_QFORMAT_INT8_ROW: return 1;
    case KHUB_QFORMAT_NF4: return 64;
    default: return 0;
    }
}

/* Bytes per block of a format, or 0. INT8_ROW: 1 (its 4-byte row scale is
 * added by khub_qformat_row_bytes). */
static inline int64_t khub_qformat_block_bytes(khub_qformat f)
{
    switch (f) {
    case KHUB_QFORMAT_Q8_0: return 34;
    case KHUB_QFORMAT_Q4_0: return 18;
    case KHUB_QFORMAT_Q4_1: return 20;
    case KHUB_QFORMAT_Q4_K: return 144;
    case KHUB_QFORMAT_Q6_K: return 210;
    case KHUB_QFORMAT_INT8_ROW: return 1;
    case KHUB_QFORMAT_NF4: return 36;
#if KHUB_PLUGIN_TARGET_MINOR >= 1
    case KHUB_QFORMAT_Q5_0: return 22;
    case KHUB_QFORMAT_Q5_1: return 24;
#endif
    default: return 0;
    }
}

/* Bytes of one row of n weights, or -1 when n is not a whole number of blocks
 * or the format is unknown. */
static inline int64_t khub_qformat_row_bytes(khub_qformat f, int64_t n)
{
    int64_t be = khub_qformat_block_elems(f);
    if (be <= 0 || n <= 0 || n % be != 0 || n > (INT64_C(1) << 40)) return -1;
    return (n / be) * khub_qformat_block_bytes(f) + (f == KHUB_QFORMAT_INT8_ROW ? 4 : 0);
}

#endif /* KHUB_TENSOR_H */
