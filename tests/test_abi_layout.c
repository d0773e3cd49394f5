/* test_abi_layout.c: compiles abi/layout.c (the frozen ABI) and checks the
 * header helpers that plugins inline. */
#include "../abi/layout.c"

#include "internal.h"
#include "runner.h"

TEST_IMPL(layout_compiles_and_headers_agree)
{
    /* The _Static_asserts already ran at compile time; check the runtime view. */
    ASSERT_EQ(sizeof(void *), 8);
    khub_op_desc d = {KHUB_STRUCT_INIT(khub_op_desc)};
    ASSERT_EQ(d.struct_size, sizeof(khub_op_desc));
    ASSERT_EQ(d.abi_major, KHUB_ABI_MAJOR);
    ASSERT(KHUB_HAS_FIELD(&d, khub_op_desc, methods));
    d.struct_size = offsetof(khub_op_desc, methods);
    ASSERT(!KHUB_HAS_FIELD(&d, khub_op_desc, methods));
}

TEST_IMPL(qformat_sizes)
{
    ASSERT_EQ(khub_qformat_row_bytes(KHUB_QFORMAT_Q8_0, 576), 18 * 34);
    ASSERT_EQ(khub_qformat_row_bytes(KHUB_QFORMAT_Q4_1, 576), 18 * 20);
    ASSERT_EQ(khub_qformat_row_bytes(KHUB_QFORMAT_Q4_0, 64), 2 * 18);
    ASSERT_EQ(khub_qformat_row_bytes(KHUB_QFORMAT_Q4_K, 512), 2 * 144);
    ASSERT_EQ(khub_qformat_row_bytes(KHUB_QFORMAT_Q6_K, 256), 210);
    ASSERT_EQ(khub_qformat_row_bytes(KHUB_QFORMAT_INT8_ROW, 10), 14);
    ASSERT_EQ(khub_qformat_row_bytes(KHUB_QFORMAT_NF4, 128), 72);
    ASSERT_EQ(khub_qformat_row_bytes(KHUB_QFORMAT_Q5_0, 576), 18 * 22); /* added in ABI 1.1 */
    ASSERT_EQ(khub_qformat_row_bytes(KHUB_QFORMAT_Q5_1, 576), 18 * 24);
    ASSERT_EQ(khub_qformat_row_bytes(KHUB_QFORMAT_Q5_0, 48), -1);
    ASSERT_EQ(khub_qformat_row_bytes(KHUB_QFORMAT_Q4_K, 576), -1); /* not whole blocks */
    ASSERT_EQ(khub_qformat_row_bytes(KHUB_QFORMAT_NONE, 32), -1);
    ASSERT_EQ(khub_qformat_row_bytes(KHUB_QFORMAT_Q8_0, 0), -1);
}

TEST_IMPL(dtype_ids)
{
    ASSERT_EQ(khub_dtype_id_of(KHUB_DTYPE_F32), KHUB_DTYPE_ID_F32);
    ASSERT_EQ(khub_dtype_id_of(KHUB_DTYPE_BF16), KHUB_DTYPE_ID_BF16);
    ASSERT_EQ(khub_dtype_id_of(KHUB_DTYPE_Q(KHUB_QFORMAT_Q4_1)), KHUB_DTYPE_ID_QBASE + 3);
    ASSERT_EQ(khub_dtype_id_of(KHUB_DTYPE_Q(KHUB_QFORMAT_Q5_1)), KHUB_DTYPE_ID_QBASE + 9);
    khub_dtype bad = {KHUB_DL_BLOCKQ, 200, 1};
    ASSERT_EQ(khub_dtype_id_of(bad), -1);
    khub_dtype vec = {KHUB_DL_FLOAT, 32, 4};
    ASSERT_EQ(khub_dtype_id_of(vec), -1);
}

TEST_IMPL(desc_put_respects_host_size)
{
    /* A host that only knows the first fields gets no bytes past them. */
    unsigned char buf[sizeof(khub_plugin_desc) + 16];
    memset(buf, 0xAB, sizeof buf);
    khub_plugin_desc *out = (khub_plugin_desc *)buf;
    out->struct_size = offsetof(khub_plugin_desc, ops);
    khub_plugin_desc src = {KHUB_STRUCT_INIT(khub_plugin_desc), .id = "a/b", .version = "1"};
    ASSERT_OK(khub_plugin_desc_put(out, &src));
    ASSERT_EQ(out->struct_size, offsetof(khub_plugin_desc, ops));
    ASSERT(out->id == src.id);
    for (size_t i = offsetof(khub_plugin_desc, ops); i < sizeof buf; i++) ASSERT_EQ(buf[i], 0xAB);
}

#define TEST_LIST(X) \
    X(layout_compiles_and_headers_agree) \
    X(qformat_sizes) \
    X(dtype_ids) \
    X(desc_put_respects_host_size)
TEST_MAIN(TEST_LIST)
