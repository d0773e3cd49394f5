/* test_safetensors.c: the safetensors reader: single files, sharded folders,
 * every rejection with its status and message, every truncation, OOM, and a
 * golden file written by the upstream safetensors library. */
#include <sys/stat.h>
#include <unistd.h>

#include "model_fixtures.h"
#include "budget_alloc.h"
#include "runner.h"
#include "safetensors.h"

static khub_runtime *new_rt(void)
{
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(NULL, &rt));
    return rt;
}

/* 24 + 8 + 16 = 48 data bytes. */
static const char *const valid_json =
    "{\"__metadata__\":{\"format\":\"pt\"},"
    "\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
    "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
    "\"ids\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[32,48]}}";

static khub_status open_json(khub_runtime *rt, const char *json, size_t data, fx_buf *b,
                             khub_safetensors **st)
{
    fx_safetensors(b, json, data, 1);
    return khub__safetensors_open_mem(rt, "m.safetensors", b->p, b->n, st);
}

TEST_IMPL(single_valid_reads_back)
{
    khub_runtime *rt = new_rt();
    fx_buf b = {0};
    khub_safetensors *st = NULL;
    ASSERT_OK(open_json(rt, valid_json, 48, &b, &st));
    ASSERT_EQ(khub__safetensors_count(st), 3);
    ASSERT_EQ(khub__safetensors_shard_count(st), 1);
    ASSERT_STR_EQ(khub__safetensors_at(st, 0)->name, "w");
    const khub_st_tensor *t = khub__safetensors_find(st, "w");
    ASSERT(t != NULL);
    ASSERT_EQ(t->st_dtype, KHUB_ST_F32);
    ASSERT_EQ(khub_dtype_id_of(t->dtype), KHUB_DTYPE_ID_F32);
    ASSERT_EQ(t->ndim, 2);
    ASSERT_EQ(t->shape[0], 2);
    ASSERT_EQ(t->shape[1], 3);
    ASSERT_EQ(t->n_elems, 6);
    ASSERT_EQ(t->nbytes, 24);
    size_t hdr = b.n - 48;
    ASSERT((const uint8_t *)t->data == b.p + hdr);
    ASSERT_OK(khub__safetensors_get_weight(st, "b", &t));
    ASSERT_EQ(khub_dtype_id_of(t->dtype), KHUB_DTYPE_ID_BF16);
    ASSERT((const uint8_t *)t->data == b.p + hdr + 24);
    ASSERT_STR_EQ(khub__safetensors_metadata(st, "format"), "pt");
    ASSERT(khub__safetensors_metadata(st, "nope") == NULL);

    ASSERT_STATUS(khub__safetensors_get_weight(st, "ids", &t), KHUB_STATUS_MODEL_UNSUPPORTED);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt),
                    "m.safetensors: tensor 'ids' has dtype I64; weights must be F32, F16 or BF16");
    khub__clear(rt);
    ASSERT_STATUS(khub__safetensors_get_weight(st, "lm_head.weight", &t), KHUB_STATUS_NOT_FOUND);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "m.safetensors: tensor 'lm_head.weight' is missing");
    khub__safetensors_close(st);
    fx_free(&b);
    khub_runtime_free(rt);
}

TEST_IMPL(scalars_empty_and_unpadded)
{
    fx_buf b = {0};
    fx_safetensors(&b,
                   "{\"s\":{\"dtype\":\"F16\",\"shape\":[],\"data_offsets\":[0,2]},"
                   "\"e\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[2,2]},"
                   "\"f4\":{\"dtype\":\"F4\",\"shape\":[6],\"data_offsets\":[2,5]}}",
                   5, 0);
    khub_safetensors *st = NULL;
    ASSERT_OK(khub__safetensors_open_mem(NULL, "s.safetensors", b.p, b.n, &st));
    const khub_st_tensor *s = khub__safetensors_find(st, "s");
    ASSERT_EQ(s->ndim, 0);
    ASSERT_EQ(s->n_elems, 1);
    ASSERT_EQ(khub__safetensors_find(st, "e")->nbytes, 0);
    ASSERT_EQ(khub__safetensors_find(st, "f4")->nbytes, 3);
    khub__safetensors_close(st);
    fx_free(&b);
}

typedef struct reject_case {
    const char *json;
    size_t data;
    khub_status st;
    const char *msg;
} reject_case;

#define E(name, body) "\"" name "\":{" body "}"
static const reject_case rejects[] = {
    {"{" E("a", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]") ",}", 8,
     KHUB_STATUS_MODEL_INVALID, "header is not valid JSON"},
    {"[1,2]", 0, KHUB_STATUS_MODEL_INVALID, "header does not start with a JSON object"},
    {"{}{}", 0, KHUB_STATUS_MODEL_INVALID, "not one JSON object padded with spaces"},
    {"{" E("a", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]") "," E(
         "a", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]") "}",
     16, KHUB_STATUS_MODEL_INVALID, "duplicate key 'a' in the header"},
    {"{" E("a", "\"dtype\":\"F32\",\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,8]") "}", 8,
     KHUB_STATUS_MODEL_INVALID, "tensor 'a': duplicate key 'dtype'"},
    {"{" E("a", "\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]") "}", 8,
     KHUB_STATUS_MODEL_INVALID, "tensor 'a': unknown dtype 'Q4'"},
    {"{" E("a", "\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,8]") "}", 8,
     KHUB_STATUS_MODEL_INVALID, "tensor 'a': dtype is not a string"},
    {"{" E("a", "\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]") "}", 24,
     KHUB_STATUS_MODEL_INVALID,
     "tensor 'a': shape and dtype F32 need 24 bytes but data_offsets [0, 20) hold 20"},
    {"{" E("a", "\"dtype\":\"F32\",\"shape\":[1000],\"data_offsets\":[0,4000]") "}", 64,
     KHUB_STATUS_TRUNCATED, "tensor 'a': data_offsets [0, 4000) past end of file"},
    {"{" E("a", "\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,4]") "}", 8,
     KHUB_STATUS_MODEL_INVALID, "tensor 'a': data_offsets [8, 4) end before begin"},
    {"{" E("a", "\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]") "," E(
         "b", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]") "}",
     16, KHUB_STATUS_MODEL_INVALID, "tensors 'a' [0, 16) and 'b' [8, 16) overlap"},
    {"{" E("a", "\"dtype\":\"F32\",\"shape\":[4503599627370496,4503599627370496],"
                "\"data_offsets\":[0,8]") "}",
     8, KHUB_STATUS_MODEL_INVALID, "tensor 'a': element count overflows at shape[1]"},
    {"{" E("a", "\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,8]") "}", 8,
     KHUB_STATUS_MODEL_INVALID, "tensor 'a': shape[0] is not an integer in 0..2^53"},
    {"{" E("a", "\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]") "}", 8,
     KHUB_STATUS_MODEL_INVALID, "tensor 'a': shape[0] is not an integer"},
    {"{" E("a", "\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]") "}", 8,
     KHUB_STATUS_MODEL_INVALID, "tensor 'a': shape[0] is not an integer"},
    {"{" E("a", "\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]") "}", 4,
     KHUB_STATUS_MODEL_INVALID, "tensor 'a': shape is not an array of at most 8 dims"},
    {"{" E("a", "\"dtype\":\"F32\",\"shape\":[2]") "}", 8, KHUB_STATUS_MODEL_INVALID,
     "tensor 'a': 'data_offsets' is missing"},
    {"{" E("a", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]") "}", 8,
     KHUB_STATUS_MODEL_INVALID, "tensor 'a': data_offsets is not [begin, end]"},
    {"{\"a\":[1]}", 0, KHUB_STATUS_MODEL_INVALID, "tensor 'a': entry is not an object"},
    {"{\"__metadata__\":{\"k\":1}}", 0, KHUB_STATUS_MODEL_INVALID,
     "__metadata__ value of 'k' is not a string"},
    {"{" E("a", "\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,1]") "}", 2,
     KHUB_STATUS_MODEL_INVALID, "3 elements of F4 do not end on a byte boundary"},
};

TEST_IMPL(rejections_have_status_and_message)
{
    khub_runtime *rt = new_rt();
    for (size_t i = 0; i < sizeof rejects / sizeof rejects[0]; i++) {
        fx_buf b = {0};
        khub_safetensors *st = (khub_safetensors *)&b;
        khub_status rc = open_json(rt, rejects[i].json, rejects[i].data, &b, &st);
        if (rc != rejects[i].st || !strstr(khub_runtime_errmsg(rt), rejects[i].msg))
            fprintf(stderr, "  case %zu: %s: %s\n", i, khub_status_name(rc),
                    khub_runtime_errmsg(rt));
        ASSERT_STATUS(rc, rejects[i].st);
        ASSERT_CONTAINS(khub_runtime_errmsg(rt), "m.safetensors: ");
        ASSERT_CONTAINS(khub_runtime_errmsg(rt), rejects[i].msg);
        ASSERT(st == NULL);
        fx_free(&b);
        khub__clear(rt);
    }
    khub_runtime_free(rt);
}

TEST_IMPL(header_length_checks)
{
    khub_runtime *rt = new_rt();
    khub_safetensors *st = NULL;
    fx_buf b = {0};
    fx_u64(&b, 1000);
    fx_put(&b, "{}", 2);
    ASSERT_STATUS(khub__safetensors_open_mem(rt, "h.safetensors", b.p, b.n, &st),
                  KHUB_STATUS_TRUNCATED);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt),
                    "h.safetensors: truncated: header length 1000 runs past end of file "
                    "(10 bytes)");
    khub__clear(rt);
    b.n = 0;
    fx_u64(&b, UINT64_C(100000001));
    ASSERT_STATUS(khub__safetensors_open_mem(rt, "h.safetensors", b.p, b.n, &st),
                  KHUB_STATUS_MODEL_INVALID);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "header length 100000001 exceeds the limit");
    khub__clear(rt);
    ASSERT_STATUS(khub__safetensors_open_mem(rt, "h.safetensors", b.p, 5, &st),
                  KHUB_STATUS_TRUNCATED);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "5 bytes, shorter than the 8-byte header length");
    fx_free(&b);
    khub_runtime_free(rt);
}

TEST_IMPL(every_prefix_is_truncated)
{
    khub_runtime *rt = new_rt();
    fx_buf b = {0};
    fx_safetensors(&b, valid_json, 48, 1);
    for (size_t n = 0; n < b.n; n++) {
        void *copy = malloc(n ? n : 1);
        memcpy(copy, b.p, n);
        khub_safetensors *st = NULL;
        khub_status rc = khub__safetensors_open_mem(rt, "p.safetensors", copy, n, &st);
        if (rc != KHUB_STATUS_TRUNCATED)
            fprintf(stderr, "  prefix %zu: %s: %s\n", n, khub_status_name(rc),
                    khub_runtime_errmsg(rt));
        ASSERT_STATUS(rc, KHUB_STATUS_TRUNCATED);
        ASSERT_CONTAINS(khub_runtime_errmsg(rt), "p.safetensors: ");
        free(copy);
        khub__clear(rt);
    }
    fx_free(&b);
    khub_runtime_free(rt);
}

/* ------------------------------------------------------------------------ */
/* Folders and shards                                                       */
/* ------------------------------------------------------------------------ */

static void make_dir(char *tmpl) { ASSERT(mkdtemp(tmpl) != NULL); }

static void write_st(const char *dir, const char *name, const char *json, size_t data)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    fx_buf b = {0};
    fx_safetensors(&b, json, data, 1);
    ASSERT_EQ(fx_write_file(path, &b), 0);
    fx_free(&b);
}

static void write_txt(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ASSERT_EQ(fx_write_text(path, text), 0);
}

static void rm_dir(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ASSERT_EQ(system(cmd), 0);
}

#define SHARD1 "{" E("x", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]") "}"
#define SHARD2 \
    "{" E("y", "\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]") "," E( \
        "z", "\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[8,10]") "}"
#define INDEX(map) "{\"metadata\":{\"total_size\":18},\"weight_map\":{" map "}}"
#define MAP_OK     "\"x\":\"a.safetensors\",\"y\":\"b.safetensors\",\"z\":\"b.safetensors\""

TEST_IMPL(folder_single_and_sharded)
{
    khub_runtime *rt = new_rt();
    char dir[] = "/tmp/khub-st-XXXXXX";
    make_dir(dir);
    khub_safetensors *st = NULL;
    ASSERT_STATUS(khub__safetensors_open(rt, dir, &st), KHUB_STATUS_NOT_FOUND);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt),
                    "no model.safetensors or model.safetensors.index.json");
    khub__clear(rt);

    write_st(dir, "model.safetensors", SHARD1, 8);
    ASSERT_OK(khub__safetensors_open(rt, dir, &st));
    ASSERT_EQ(khub__safetensors_count(st), 1);
    ASSERT(khub__safetensors_find(st, "x") != NULL);
    khub__safetensors_close(st);

    write_st(dir, "a.safetensors", SHARD1, 8);
    write_st(dir, "b.safetensors", SHARD2, 10);
    write_txt(dir, "model.safetensors.index.json", INDEX(MAP_OK));
    ASSERT_OK(khub__safetensors_open(rt, dir, &st)); /* the index wins */
    ASSERT_EQ(khub__safetensors_shard_count(st), 2);
    ASSERT_EQ(khub__safetensors_count(st), 3);
    const khub_st_tensor *z;
    ASSERT_OK(khub__safetensors_get_weight(st, "z", &z));
    ASSERT_CONTAINS(khub__safetensors_shard_path(st, z->shard), "/b.safetensors");
    ASSERT_EQ(z->nbytes, 2);
    khub__safetensors_close(st);
    rm_dir(dir);
    khub_runtime_free(rt);
}

typedef struct index_case {
    const char *index;
    khub_status st;
    const char *msg;
} index_case;

static const index_case index_rejects[] = {
    {INDEX("\"x\":\"a.safetensors\",\"y\":\"a.safetensors\""), KHUB_STATUS_MODEL_INVALID,
     "index.json: tensor 'y' mapped to 'a.safetensors' is not in that file"},
    {INDEX("\"x\":\"a.safetensors\",\"w\":\"b.safetensors\""), KHUB_STATUS_MODEL_INVALID,
     "index.json: tensor 'w' mapped to 'b.safetensors' is not in that file"},
    {INDEX("\"x\":\"c.safetensors\""), KHUB_STATUS_NOT_FOUND, "/c.safetensors: cannot open"},
    {INDEX("\"x\":\"../a.safetensors\""), KHUB_STATUS_UNSAFE_PATH,
     "shard name '../a.safetensors' is not a plain file name"},
    {INDEX("\"x\":\"a.safetensors\",\"y\":\"dup.safetensors\""), KHUB_STATUS_MODEL_INVALID,
     "tensor 'x' appears in both"},
    {INDEX("\"x\":7"), KHUB_STATUS_MODEL_INVALID, "weight_map['x'] is not a file name string"},
    {"{\"weight_map\":[]}", KHUB_STATUS_MODEL_INVALID, "weight_map is missing or not an object"},
    {"{\"weight_map\":{", KHUB_STATUS_MODEL_INVALID, "index.json: not valid JSON"},
    {INDEX(""), KHUB_STATUS_MODEL_INVALID, "weight_map is empty"},
};

TEST_IMPL(index_rejections)
{
    khub_runtime *rt = new_rt();
    char dir[] = "/tmp/khub-st-XXXXXX";
    make_dir(dir);
    write_st(dir, "a.safetensors", SHARD1, 8);
    write_st(dir, "b.safetensors", SHARD2, 10);
    write_st(dir, "dup.safetensors", SHARD1, 8);
    for (size_t i = 0; i < sizeof index_rejects / sizeof index_rejects[0]; i++) {
        write_txt(dir, "model.safetensors.index.json", index_rejects[i].index);
        khub_safetensors *st = NULL;
        khub_status rc = khub__safetensors_open(rt, dir, &st);
        if (rc != index_rejects[i].st || !strstr(khub_runtime_errmsg(rt), index_rejects[i].msg))
            fprintf(stderr, "  case %zu: %s: %s\n", i, khub_status_name(rc),
                    khub_runtime_errmsg(rt));
        ASSERT_STATUS(rc, index_rejects[i].st);
        ASSERT_CONTAINS(khub_runtime_errmsg(rt), index_rejects[i].msg);
        ASSERT(st == NULL);
        khub__clear(rt);
    }
    rm_dir(dir);
    khub_runtime_free(rt);
}

/* ------------------------------------------------------------------------ */
/* OOM and the golden file                                                  */
/* ------------------------------------------------------------------------ */

TEST_IMPL(oom_at_every_allocation_no_leak)
{
    fx_buf b = {0};
    fx_safetensors(&b, valid_json, 48, 1);
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
        khub_safetensors *st = NULL;
        khub_status rc = khub__safetensors_open_mem(rt, "m.safetensors", b.p, b.n, &st);
        if (rc == KHUB_STATUS_OK) {
            saw_ok = 1;
            khub__safetensors_close(st);
        } else {
            ASSERT_STATUS(rc, KHUB_STATUS_NOMEM);
            ASSERT(st == NULL);
        }
        ASSERT_EQ(bu.live, base);
        bu.allocs_left = -1;
        khub_runtime_free(rt);
    }
    ASSERT(saw_ok);
    fx_free(&b);
}

/* tests/golden/small.safetensors was written by the safetensors library
 * (tests/golden/make_golden.py); its values are fixed there. */
TEST_IMPL(golden_from_upstream_writer)
{
    khub_runtime *rt = new_rt();
    khub_safetensors *st = NULL;
    ASSERT_OK(khub__safetensors_open(rt, KHUB_SOURCE_DIR "/tests/golden/small.safetensors", &st));
    ASSERT_EQ(khub__safetensors_count(st), 4);
    ASSERT_STR_EQ(khub__safetensors_metadata(st, "format"), "pt");
    const khub_st_tensor *t;
    ASSERT_OK(khub__safetensors_get_weight(st, "model.layers.0.w", &t));
    ASSERT_EQ(t->st_dtype, KHUB_ST_F32);
    ASSERT_EQ(t->ndim, 2);
    ASSERT_EQ(t->shape[0], 2);
    ASSERT_EQ(t->shape[1], 3);
    float f[6];
    memcpy(f, t->data, sizeof f);
    for (int i = 0; i < 6; i++) ASSERT(f[i] == 0.5f * (float)i - 1.0f);
    ASSERT_OK(khub__safetensors_get_weight(st, "model.norm.weight", &t));
    ASSERT_EQ(t->st_dtype, KHUB_ST_BF16);
    uint16_t h[4];
    memcpy(h, t->data, sizeof h);
    ASSERT_EQ(h[0], 0x3f80); /* 1.0 in bf16 */
    ASSERT_EQ(h[3], 0xc000); /* -2.0 */
    ASSERT_OK(khub__safetensors_get_weight(st, "h", &t));
    ASSERT_EQ(t->st_dtype, KHUB_ST_F16);
    ASSERT_EQ(t->shape[0], 3);
    ASSERT_EQ(t->shape[1], 1);
    t = khub__safetensors_find(st, "pos");
    ASSERT(t && t->st_dtype == KHUB_ST_I64 && t->n_elems == 2);
    khub__safetensors_close(st);
    khub_runtime_free(rt);
}

#define TEST_LIST(X) \
    X(single_valid_reads_back) \
    X(scalars_empty_and_unpadded) \
    X(rejections_have_status_and_message) \
    X(header_length_checks) \
    X(every_prefix_is_truncated) \
    X(folder_single_and_sharded) \
    X(index_rejections) \
    X(oom_at_every_allocation_no_leak) \
    X(golden_from_upstream_writer)
TEST_MAIN(TEST_LIST)
