/* test_gguf.c: the GGUF reader: a valid synthetic file read back exactly,
 * every rejection with its status and message, every truncation, OOM, and
 * the real SmolLM2 model when it is present. */
#include <stdbool.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf.h"
#include "model_fixtures.h"
#include "budget_alloc.h"
#include "runner.h"

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

/* Opens a copy of b's first n bytes in an exact-size allocation, so ASan
 * sees any read past n. The copy is freed after close. */
static khub_status open_prefix(khub_runtime *rt, const fx_buf *b, size_t n, khub_gguf **g,
                               void **copy)
{
    *copy = malloc(n ? n : 1);
    ASSERT(*copy != NULL);
    if (n) memcpy(*copy, b->p, n);
    return khub__gguf_open_mem(rt, "small.gguf", *copy, n, g);
}

static khub_runtime *new_rt(void)
{
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(NULL, &rt));
    return rt;
}

/* ------------------------------------------------------------------------ */
/* Valid files                                                              */
/* ------------------------------------------------------------------------ */

TEST_IMPL(small_valid_reads_back)
{
    khub_runtime *rt = new_rt();
    fx_buf b = {0};
    fx_gguf_small(&b, FX_NONE);
    khub_gguf *g = NULL;
    ASSERT_OK(khub__gguf_open_mem(rt, "small.gguf", b.p, b.n, &g));
    ASSERT_EQ(khub__gguf_version(g), 3);
    ASSERT_EQ(khub__gguf_alignment(g), 32);
    ASSERT_EQ(khub__gguf_data_offset(g) % 32, 0);
    ASSERT_EQ(khub__gguf_kv_count(g), 6);
    ASSERT_STR_EQ(khub__gguf_kv_at(g, 0)->key, "general.architecture");
    ASSERT(khub__gguf_kv_at(g, 6) == NULL);

    const char *s;
    size_t len;
    ASSERT_OK(khub__gguf_get_str(g, "general.architecture", &s, &len));
    ASSERT_EQ(len, 5);
    ASSERT(memcmp(s, "llama", 5) == 0);
    uint32_t u;
    ASSERT_OK(khub__gguf_get_u32(g, "test.count", &u));
    ASSERT_EQ(u, 7);
    int64_t i64;
    ASSERT_OK(khub__gguf_get_i64(g, "test.count", &i64));
    ASSERT_EQ(i64, 7);
    float f;
    ASSERT_OK(khub__gguf_get_f32(g, "test.scale", &f));
    ASSERT(f == 0.5f);
    ASSERT_OK(khub__gguf_get_f32(g, "test.count", &f)); /* integers convert */
    ASSERT(f == 7.0f);
    bool flag = false;
    ASSERT_OK(khub__gguf_get_bool(g, "test.flag", &flag));
    ASSERT(flag);

    const khub_gguf_kv *words;
    ASSERT_OK(khub__gguf_get_arr(g, "test.words", KHUB_GGUF_STRING, &words));
    ASSERT_EQ(words->count, 4);
    static const char *const want[] = {"<s>", "</s>", "hello", ""};
    for (uint64_t i = 0; i < 4; i++) {
        ASSERT_OK(khub__gguf_arr_str(g, words, i, &s, &len));
        ASSERT_EQ(len, strlen(want[i]));
        ASSERT(memcmp(s, want[i], len) == 0);
    }
    const khub_gguf_kv *scores;
    ASSERT_OK(khub__gguf_get_arr(g, "test.scores", KHUB_GGUF_TYPE__COUNT, &scores));
    ASSERT_EQ(scores->elem, KHUB_GGUF_FLOAT32);
    ASSERT_OK(khub__gguf_arr_f32(g, scores, 2, &f));
    ASSERT(f == 2.25f);

    ASSERT_EQ(khub__gguf_tensor_count(g), 3);
    const khub_gguf_tensor *t = khub__gguf_tensor_find(g, "t.q4_1");
    ASSERT(t != NULL);
    ASSERT_EQ(t->n_dims, 2);
    ASSERT_EQ(t->ne[0], 64);
    ASSERT_EQ(t->ne[1], 2);
    ASSERT_EQ(t->ne[2], 1);
    ASSERT_EQ(t->n_elems, 128);
    ASSERT_EQ(t->ggml_type, KHUB_GGML_Q4_1);
    ASSERT_EQ(t->nbytes, FX_T1_BYTES);
    ASSERT_EQ(t->offset, 64);
    ASSERT((const uint8_t *)t->data == b.p + khub__gguf_data_offset(g) + 64);
    ASSERT_EQ(((const uint8_t *)t->data)[1], (uint8_t)(2 + 7)); /* fx_fill pattern */
    khub_dtype dt;
    ASSERT_OK(khub__gguf_tensor_dtype(g, t, &dt));
    ASSERT_EQ(dt.code, KHUB_DL_BLOCKQ);
    ASSERT_EQ(dt.bits, KHUB_QFORMAT_Q4_1);
    ASSERT_EQ(khub_qformat_row_bytes(KHUB_QFORMAT_Q4_1, t->ne[0]) * t->ne[1], (int64_t)t->nbytes);

    const khub_gguf_tensor *t0 = khub__gguf_tensor_at(g, 0);
    ASSERT_STR_EQ(t0->name, "t.f32");
    ASSERT_OK(khub__gguf_tensor_dtype(g, t0, &dt));
    ASSERT_EQ(khub_dtype_id_of(dt), KHUB_DTYPE_ID_F32);
    ASSERT_EQ(t0->nbytes, FX_T0_BYTES);
    const khub_gguf_tensor *t2;
    ASSERT_OK(khub__gguf_tensor_get(g, "t.q8_0", &t2));
    ASSERT_EQ(t2->nbytes, FX_T2_BYTES);
    ASSERT((const uint8_t *)t2->data + t2->nbytes == b.p + b.n);
    ASSERT(khub__gguf_tensor_at(g, 3) == NULL);
    ASSERT(khub__gguf_tensor_find(g, "t.nope") == NULL);
    khub__gguf_close(g);
    fx_free(&b);
    khub_runtime_free(rt);
}

TEST_IMPL(open_from_file_and_alignment_64)
{
    khub_runtime *rt = new_rt();
    fx_buf b = {0};
    fx_gguf_small(&b, FX_ALIGN_64);
    char path[] = "/tmp/khub-gguf-XXXXXX";
    int fd = mkstemp(path);
    ASSERT(fd >= 0);
    close(fd);
    ASSERT_EQ(fx_write_file(path, &b), 0);
    khub_gguf *g = NULL;
    ASSERT_OK(khub__gguf_open(rt, path, &g));
    ASSERT_STR_EQ(khub__gguf_path(g), path);
    ASSERT_EQ(khub__gguf_alignment(g), 64);
    ASSERT_EQ(khub__gguf_data_offset(g) % 64, 0);
    const khub_gguf_tensor *t = khub__gguf_tensor_find(g, "t.q8_0");
    ASSERT(t && t->offset == 192);
    ASSERT_EQ((uintptr_t)t->data % 64, 0); /* the mapping is page aligned */
    khub__gguf_close(g);
    unlink(path);
    fx_free(&b);
    khub_runtime_free(rt);
}

TEST_IMPL(version_2_accepted)
{
    fx_buf b = {0};
    fx_gguf_small(&b, FX_NONE);
    b.p[4] = 2;
    khub_gguf *g = NULL;
    ASSERT_OK(khub__gguf_open_mem(NULL, "v2.gguf", b.p, b.n, &g));
    ASSERT_EQ(khub__gguf_version(g), 2);
    khub__gguf_close(g);
    fx_free(&b);
}

/* ------------------------------------------------------------------------ */
/* Rejections                                                               */
/* ------------------------------------------------------------------------ */

typedef struct reject_case {
    fx_gguf_mut mut;
    khub_status st;
    const char *msg; /* a substring of the message (which always starts with the name) */
} reject_case;

static const reject_case rejects[] = {
    {FX_BAD_MAGIC, KHUB_STATUS_MODEL_INVALID, "not a GGUF file"},
    {FX_VERSION_1, KHUB_STATUS_MODEL_UNSUPPORTED, "GGUF version 1 is not supported"},
    {FX_BIG_ENDIAN, KHUB_STATUS_MODEL_UNSUPPORTED, "big-endian"},
    {FX_DUP_KEY, KHUB_STATUS_MODEL_INVALID, "duplicate metadata key 'test.count'"},
    {FX_DUP_TENSOR, KHUB_STATUS_MODEL_INVALID, "duplicate tensor name 't.f32'"},
    {FX_BAD_VALUE_TYPE, KHUB_STATUS_MODEL_INVALID,
     "metadata key 1 'test.count': unknown value type 99"},
    {FX_NESTED_ARRAY, KHUB_STATUS_MODEL_UNSUPPORTED, "'test.words': nested arrays"},
    {FX_HUGE_KV_COUNT, KHUB_STATUS_TRUNCATED, "metadata_kv_count 1152921504606846976 needs"},
    {FX_HUGE_STRING, KHUB_STATUS_TRUNCATED,
     "'test.words': string value needs 4611686018427387904 bytes"},
    {FX_HUGE_ARRAY, KHUB_STATUS_TRUNCATED, "'test.words': string array length 2305843009213693952"},
    {FX_NDIMS_0, KHUB_STATUS_MODEL_INVALID, "tensor 't.f32': n_dims 0 is not in 1..4"},
    {FX_NDIMS_5, KHUB_STATUS_MODEL_INVALID, "tensor 't.f32': n_dims 5 is not in 1..4"},
    {FX_DIM_0, KHUB_STATUS_MODEL_INVALID, "tensor 't.f32': ne[0] = 0 is not in"},
    {FX_DIM_OVERFLOW, KHUB_STATUS_MODEL_INVALID, "tensor 't.q4_1': element count overflows"},
    {FX_UNKNOWN_TYPE, KHUB_STATUS_MODEL_UNSUPPORTED, "tensor 't.q4_1': unknown ggml type 77"},
    {FX_ROW_NOT_BLOCK, KHUB_STATUS_MODEL_INVALID,
     "tensor 't.q4_1': ne[0] = 48 is not a multiple of the Q4_1 block size 32"},
    {FX_MISALIGNED, KHUB_STATUS_MODEL_INVALID,
     "tensor 't.q4_1': offset 68 is not a multiple of the alignment 32"},
    {FX_OVERLAP, KHUB_STATUS_MODEL_INVALID, "tensor 't.q4_1' [64, +80) overlaps tensor 't.q8_0'"},
    {FX_PAST_END, KHUB_STATUS_TRUNCATED, "tensor 't.q8_0': offset"},
    {FX_BAD_ALIGNMENT, KHUB_STATUS_MODEL_INVALID, "general.alignment 48 is not a power of two"},
    {FX_BAD_BOOL, KHUB_STATUS_MODEL_INVALID, "'test.flag': BOOL value 2"},
    {FX_EMPTY_KEY, KHUB_STATUS_MODEL_INVALID, "metadata key 0: empty key"},
    {FX_NUL_IN_NAME, KHUB_STATUS_MODEL_INVALID, "tensor 0: tensor name contains a NUL byte"},
};

TEST_IMPL(rejections_have_status_and_message)
{
    khub_runtime *rt = new_rt();
    for (size_t i = 0; i < sizeof rejects / sizeof rejects[0]; i++) {
        fx_buf b = {0};
        fx_gguf_small(&b, rejects[i].mut);
        khub_gguf *g = (khub_gguf *)&b; /* must be reset to NULL */
        void *copy;
        khub_status st = open_prefix(rt, &b, b.n, &g, &copy);
        if (st != rejects[i].st || !strstr(khub_runtime_errmsg(rt), rejects[i].msg))
            fprintf(stderr, "  case %zu: %s: %s\n", i, khub_status_name(st),
                    khub_runtime_errmsg(rt));
        ASSERT_STATUS(st, rejects[i].st);
        ASSERT_CONTAINS(khub_runtime_errmsg(rt), "small.gguf: ");
        ASSERT_CONTAINS(khub_runtime_errmsg(rt), rejects[i].msg);
        ASSERT(g == NULL);
        free(copy);
        fx_free(&b);
        khub__clear(rt);
    }
    khub_runtime_free(rt);
}

TEST_IMPL(past_end_message_names_offsets)
{
    khub_runtime *rt = new_rt();
    fx_buf b = {0};
    fx_gguf_small(&b, FX_PAST_END);
    khub_gguf *g = NULL;
    ASSERT_STATUS(khub__gguf_open_mem(rt, "model.gguf", b.p, b.n, &g), KHUB_STATUS_TRUNCATED);
    char want[128];
    /* data section at 288 for this layout: the absolute offset is printed */
    snprintf(want, sizeof want, "offset %zu + %u bytes past end of file (%zu)",
             (size_t)(b.n - (64 + FX_T1_BYTES + 16 + FX_T2_BYTES) + 4096), FX_T2_BYTES, b.n);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), want);
    fx_free(&b);
    khub_runtime_free(rt);
}

TEST_IMPL(every_prefix_is_truncated)
{
    khub_runtime *rt = new_rt();
    fx_buf b = {0};
    fx_gguf_small(&b, FX_NONE);
    for (size_t n = 0; n < b.n; n++) {
        khub_gguf *g = NULL;
        void *copy;
        khub_status st = open_prefix(rt, &b, n, &g, &copy);
        if (st != KHUB_STATUS_TRUNCATED)
            fprintf(stderr, "  prefix %zu of %zu: %s: %s\n", n, b.n, khub_status_name(st),
                    khub_runtime_errmsg(rt));
        ASSERT_STATUS(st, KHUB_STATUS_TRUNCATED);
        ASSERT_CONTAINS(khub_runtime_errmsg(rt), "small.gguf: ");
        ASSERT(g == NULL);
        free(copy);
        khub__clear(rt);
    }
    fx_free(&b);
    khub_runtime_free(rt);
}

TEST_IMPL(unsupported_type_refused_by_name)
{
    khub_runtime *rt = new_rt();
    fx_buf b = {0};
    fx_gguf_small(&b, FX_Q5K_TYPE);
    khub_gguf *g = NULL;
    ASSERT_OK(khub__gguf_open_mem(rt, "q5k.gguf", b.p, b.n, &g));
    const khub_gguf_tensor *t = khub__gguf_tensor_find(g, "t.q4_1");
    ASSERT_EQ(t->nbytes, 2 * 176);
    khub_dtype dt;
    ASSERT_STATUS(khub__gguf_tensor_dtype(g, t, &dt), KHUB_STATUS_MODEL_UNSUPPORTED);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt),
                    "q5k.gguf: unsupported tensor type Q5_K (13) in tensor 't.q4_1'");
    khub__gguf_close(g);
    fx_free(&b);
    khub_runtime_free(rt);
}

TEST_IMPL(getter_errors)
{
    khub_runtime *rt = new_rt();
    fx_buf b = {0};
    fx_gguf_small(&b, FX_NONE);
    khub_gguf *g = NULL;
    ASSERT_OK(khub__gguf_open_mem(rt, "small.gguf", b.p, b.n, &g));
    uint32_t u;
    ASSERT_STATUS(khub__gguf_get_u32(g, "llama.block_count", &u), KHUB_STATUS_NOT_FOUND);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt),
                    "small.gguf: metadata key 'llama.block_count' is missing");
    khub__clear(rt);
    ASSERT_STATUS(khub__gguf_get_u32(g, "general.architecture", &u), KHUB_STATUS_MODEL_INVALID);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt),
                    "'general.architecture' has type STRING, want an integer");
    khub__clear(rt);
    const char *s;
    size_t len;
    ASSERT_STATUS(khub__gguf_get_str(g, "test.count", &s, &len), KHUB_STATUS_MODEL_INVALID);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "'test.count' has type UINT32, want STRING");
    khub__clear(rt);
    bool flag;
    ASSERT_STATUS(khub__gguf_get_bool(g, "test.scale", &flag), KHUB_STATUS_MODEL_INVALID);
    khub__clear(rt);
    const khub_gguf_kv *kv;
    ASSERT_STATUS(khub__gguf_get_arr(g, "test.words", KHUB_GGUF_INT32, &kv),
                  KHUB_STATUS_MODEL_INVALID);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "is an array of STRING, want an array of INT32");
    khub__clear(rt);
    ASSERT_OK(khub__gguf_get_arr(g, "test.words", KHUB_GGUF_STRING, &kv));
    ASSERT_STATUS(khub__gguf_arr_str(g, kv, 4, &s, &len), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "index 4 out of range (array of 4)");
    khub__clear(rt);
    int64_t v;
    ASSERT_STATUS(khub__gguf_arr_i64(g, kv, 0, &v), KHUB_STATUS_MODEL_INVALID);
    const khub_gguf_tensor *t;
    khub__clear(rt);
    ASSERT_STATUS(khub__gguf_tensor_get(g, "output.weight", &t), KHUB_STATUS_NOT_FOUND);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "small.gguf: tensor 'output.weight' is missing");
    khub__gguf_close(g);
    fx_free(&b);
    khub_runtime_free(rt);
}

TEST_IMPL(missing_file_and_folder)
{
    khub_runtime *rt = new_rt();
    khub_gguf *g = NULL;
    ASSERT_STATUS(khub__gguf_open(rt, "/nonexistent/x.gguf", &g), KHUB_STATUS_NOT_FOUND);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "/nonexistent/x.gguf: cannot open");
    khub__clear(rt);
    ASSERT_STATUS(khub__gguf_open(rt, "/tmp", &g), KHUB_STATUS_IO);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "/tmp: is a directory, not a regular file");
    ASSERT(g == NULL);
    khub_runtime_free(rt);
}

TEST_IMPL(type_table_matches_qformats)
{
    static const struct {
        uint32_t ggml;
        khub_qformat q;
    } m[] = {
        {KHUB_GGML_Q8_0, KHUB_QFORMAT_Q8_0}, {KHUB_GGML_Q4_0, KHUB_QFORMAT_Q4_0},
        {KHUB_GGML_Q4_1, KHUB_QFORMAT_Q4_1}, {KHUB_GGML_Q4_K, KHUB_QFORMAT_Q4_K},
        {KHUB_GGML_Q6_K, KHUB_QFORMAT_Q6_K}, {KHUB_GGML_Q5_0, KHUB_QFORMAT_Q5_0},
        {KHUB_GGML_Q5_1, KHUB_QFORMAT_Q5_1},
    };
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
        int64_t be, bb;
        ASSERT(khub__ggml_type_block(m[i].ggml, &be, &bb));
        ASSERT_EQ(be, khub_qformat_block_elems(m[i].q));
        ASSERT_EQ(bb, khub_qformat_block_bytes(m[i].q));
        khub_dtype d;
        ASSERT(khub__ggml_type_dtype(m[i].ggml, &d));
        ASSERT_EQ(khub_dtype_id_of(d), KHUB_DTYPE_ID_QBASE + m[i].q);
    }
    ASSERT_STR_EQ(khub__ggml_type_name(13), "Q5_K");
    ASSERT(khub__ggml_type_name(4) == NULL); /* retired Q4_2 */
    ASSERT(!khub__ggml_type_block(1000, NULL, NULL));
    ASSERT(!khub__ggml_type_dtype(13, NULL));
}

/* A GGUF holding a Q5_0 [2 x 64] and a Q5_1 [1 x 32] tensor (ggml types 6
 * and 7, the 576-wide matrices of a Q4_K_M SmolLM2); cols 48 makes the Q5_0
 * rows not whole blocks. */
static void q5_gguf(fx_buf *b, uint64_t cols)
{
    fx_gguf_header(b, 3, 2, 1);
    fx_kv_str(b, "general.architecture", "llama");
    uint64_t ne5[2] = {cols, 2}, ne51[2] = {32, 1};
    fx_tensor_info(b, "t.q5_0", 2, ne5, 6, 0);
    fx_tensor_info(b, "t.q5_1", 2, ne51, 7, 96);
    fx_align(b, 32);
    fx_fill(b, 2 * 2 * 22, 5);
    fx_zeros(b, 96 - 2 * 2 * 22);
    fx_fill(b, 24, 6);
}

TEST_IMPL(q5_tensors_load_in_place)
{
    khub_runtime *rt = new_rt();
    fx_buf b = {0};
    q5_gguf(&b, 64);
    khub_gguf *g = NULL;
    ASSERT_OK(khub__gguf_open_mem(rt, "q5.gguf", b.p, b.n, &g));
    const khub_gguf_tensor *t = khub__gguf_tensor_find(g, "t.q5_0");
    ASSERT(t != NULL);
    ASSERT_EQ(t->nbytes, 2 * 2 * 22);
    khub_dtype dt;
    ASSERT_OK(khub__gguf_tensor_dtype(g, t, &dt));
    ASSERT_EQ(dt.code, KHUB_DL_BLOCKQ);
    ASSERT_EQ(dt.bits, KHUB_QFORMAT_Q5_0);
    ASSERT(t->data == b.p + khub__gguf_data_offset(g)); /* in place, not copied */
    t = khub__gguf_tensor_find(g, "t.q5_1");
    ASSERT(t != NULL);
    ASSERT_EQ(t->nbytes, 24);
    ASSERT_OK(khub__gguf_tensor_dtype(g, t, &dt));
    ASSERT_EQ(dt.bits, KHUB_QFORMAT_Q5_1);
    ASSERT(t->data == b.p + khub__gguf_data_offset(g) + 96);
    ASSERT_EQ(((const uint8_t *)t->data)[0], b.p[khub__gguf_data_offset(g) + 96]);
    khub__gguf_close(g);
    fx_free(&b);
    q5_gguf(&b, 48);
    g = NULL;
    ASSERT_STATUS(khub__gguf_open_mem(rt, "q5.gguf", b.p, b.n, &g), KHUB_STATUS_MODEL_INVALID);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt),
                    "tensor 't.q5_0': ne[0] = 48 is not a multiple of the Q5_0 block size 32");
    ASSERT(g == NULL);
    fx_free(&b);
    khub_runtime_free(rt);
}

/* ------------------------------------------------------------------------ */
/* Allocation: no leaks, OOM at every allocation                            */
/* ------------------------------------------------------------------------ */

TEST_IMPL(oom_at_every_allocation_no_leak)
{
    fx_buf b = {0};
    fx_gguf_small(&b, FX_NONE);
    int saw_ok = 0;
    for (long k = 0; k < 200 && !saw_ok; k++) {
        budget bu = {-1, 0};
        khub_runtime_opts o = {KHUB_STRUCT_INIT(khub_runtime_opts)};
        o.allocator.realloc = budget_realloc;
        o.allocator.ud = &bu;
        o.n_threads = 1;
        khub_runtime *rt = NULL;
        ASSERT_OK(khub_runtime_new(&o, &rt));
        long long base = bu.live;
        bu.allocs_left = k;
        khub_gguf *g = NULL;
        khub_status st = khub__gguf_open_mem(rt, "small.gguf", b.p, b.n, &g);
        if (st == KHUB_STATUS_OK) {
            saw_ok = 1;
            khub__gguf_close(g);
        } else {
            ASSERT_STATUS(st, KHUB_STATUS_NOMEM);
            ASSERT_CONTAINS(khub_runtime_errmsg(rt), "small.gguf");
            ASSERT(g == NULL);
        }
        ASSERT_EQ(bu.live, base);
        bu.allocs_left = -1;
        khub_runtime_free(rt);
    }
    ASSERT(saw_ok);
    fx_free(&b);
}

/* ------------------------------------------------------------------------ */
/* The real model                                                           */
/* ------------------------------------------------------------------------ */

static const char *model_path(char *buf, size_t n)
{
    const char *dir = getenv("KHUB_MODEL_DIR");
    if (dir && *dir)
        snprintf(buf, n, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir);
    else
        snprintf(buf, n, "%s/.cache/khub/models/SmolLM2-135M-Instruct.Q4_1.gguf",
                 getenv("HOME") ? getenv("HOME") : "");
    struct stat sb;
    return stat(buf, &sb) == 0 ? buf : NULL;
}

TEST_IMPL(real_smollm2_tensors)
{
    char buf[1024];
    const char *path = model_path(buf, sizeof buf);
    if (!path) TEST_SKIP("model absent: run tools/fetch-model.sh (looked for %s)", buf);
    khub_runtime *rt = new_rt();
    khub_gguf *g = NULL;
    ASSERT_OK(khub__gguf_open(rt, path, &g));
    ASSERT_EQ(khub__gguf_version(g), 3);
    size_t n = khub__gguf_tensor_count(g);
    ASSERT_EQ(n, 272); /* 30 layers x 9 + token_embd + output_norm; output tied */
    int count_by_type[64] = {0};
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const khub_gguf_tensor *t = khub__gguf_tensor_at(g, i);
        khub_dtype dt;
        ASSERT_OK(khub__gguf_tensor_dtype(g, t, &dt)); /* every type is one khub reads */
        if (t->ggml_type < 64) count_by_type[t->ggml_type]++;
        total += t->nbytes;
    }
    for (int i = 0; i < 64; i++)
        if (count_by_type[i])
            fprintf(stderr, "  %s: %d tensors\n", khub__ggml_type_name((uint32_t)i),
                    count_by_type[i]);
    fprintf(stderr, "  tensor bytes: %zu\n", total);

    const khub_gguf_tensor *t;
    ASSERT_OK(khub__gguf_tensor_get(g, "token_embd.weight", &t));
    ASSERT_EQ(t->n_dims, 2);
    ASSERT_EQ(t->ne[0], 576);
    ASSERT_EQ(t->ne[1], 49152);
    ASSERT(khub__gguf_tensor_find(g, "output.weight") == NULL);
    ASSERT_OK(khub__gguf_tensor_get(g, "blk.0.attn_q.weight", &t));
    ASSERT_EQ(t->ne[0], 576);
    ASSERT_EQ(t->ne[1], 576);
    ASSERT_EQ(t->ggml_type, KHUB_GGML_Q4_1);
    ASSERT_OK(khub__gguf_tensor_get(g, "blk.29.attn_k.weight", &t));
    ASSERT_EQ(t->ne[1], 192); /* 3 kv heads x 64 */
    ASSERT_OK(khub__gguf_tensor_get(g, "blk.0.ffn_down.weight", &t));
    ASSERT_EQ(t->ne[0], 1536);
    ASSERT_OK(khub__gguf_tensor_get(g, "blk.0.attn_norm.weight", &t));
    ASSERT_EQ(t->ggml_type, KHUB_GGML_F32);
    ASSERT_EQ(t->n_dims, 1);

    const khub_gguf_kv *tok;
    ASSERT_OK(khub__gguf_get_arr(g, "tokenizer.ggml.tokens", KHUB_GGUF_STRING, &tok));
    ASSERT_EQ(tok->count, 49152);
    const char *s;
    size_t len;
    ASSERT_OK(khub__gguf_arr_str(g, tok, 0, &s, &len));
    ASSERT_EQ(len, 13);
    ASSERT(memcmp(s, "<|endoftext|>", 13) == 0);
    for (size_t i = 0; i < khub__gguf_kv_count(g); i++) {
        const khub_gguf_kv *kv = khub__gguf_kv_at(g, i);
        fprintf(stderr, "  kv %s: %s", kv->key, khub__gguf_type_name(kv->type));
        if (kv->type == KHUB_GGUF_ARRAY)
            fprintf(stderr, " of %s [%llu]", khub__gguf_type_name(kv->elem),
                    (unsigned long long)kv->count);
        fprintf(stderr, "\n");
    }
    khub__gguf_close(g);
    khub_runtime_free(rt);
}

#define TEST_LIST(X) \
    X(small_valid_reads_back) \
    X(open_from_file_and_alignment_64) \
    X(version_2_accepted) \
    X(rejections_have_status_and_message) \
    X(past_end_message_names_offsets) \
    X(every_prefix_is_truncated) \
    X(unsupported_type_refused_by_name) \
    X(getter_errors) \
    X(missing_file_and_folder) \
    X(type_table_matches_qformats) \
    X(q5_tensors_load_in_place) \
    X(oom_at_every_allocation_no_leak) \
    X(real_smollm2_tensors)
TEST_MAIN(TEST_LIST)
