/*
 * test_app_structs.c: application structs are versioned by struct_size alone
 * (abi/ABI.md, "The application API"), not by the plugin ABI's numbers. This
 * file is built as an old caller targeting plugin ABI 1.0 would be
 * (KHUB_PLUGIN_TARGET_MINOR 0, so KHUB_STRUCT_INIT stamps 1.0), and every
 * application struct is also handed over with stamps no plugin ABI has
 * (2.7, 0.0, 1.99): each is accepted the same. KHUB_APP_INIT stamps the
 * application API's version, and a struct below 0.1's size is still
 * refused by its size.
 *
 * Arrays of application structs (khub_model_generate's results,
 * khub_generate_batch's reqs, khub_kernel_dir_tests' tests, and the
 * single out-structs sized by their caller) are the caller's: elements
 * xs[0].struct_size bytes apart, from 0.1's size to a newer header's
 * larger one, every byte past a caller's struct_size left alone; elements
 * of mixed sizes and sizes below 0.1's are refused by their exact message.
 * These run on the tiny Gemma 3 of tests/fixtures (it has a tokenizer).
 */
#define KHUB_PLUGIN_TARGET_MINOR 0

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "khub/khub.h"
#include "khub/khub_author.h"
#include "khub/khub_batch.h"
#include "khub/khub_check.h"
#include "khub/khub_hub.h"
#include "khub/khub_kernels.h"
#include "khub/khub_model.h"
#include "khub/khub_project.h"
#include "khub/khub_session.h"
#include "khub/khub_tune.h"
#include "runner.h"

/* The stamps tried on every struct: what KHUB_STRUCT_INIT gave this file,
 * a plugin ABI of another major, nothing, a minor beyond any host. */
static const uint16_t stamps[][2] = {{1, 0}, {2, 7}, {0, 0}, {1, 99}};
#define N_STAMPS (sizeof stamps / sizeof stamps[0])

#define STAMP(s, i) ((s).abi_major = stamps[i][0], (s).abi_minor = stamps[i][1])

TEST_IMPL(app_init_stamps_the_api_version)
{
    khub_model_opts mo = {KHUB_APP_INIT(khub_model_opts)};
    ASSERT_EQ(mo.struct_size, sizeof mo);
    ASSERT_EQ(mo.abi_major, KHUB_API_VERSION_MAJOR);
    ASSERT_EQ(mo.abi_minor, KHUB_API_VERSION_MINOR);
    khub_op_query old = {KHUB_STRUCT_INIT(khub_op_query)};
    ASSERT_EQ(old.abi_major, 1);
    ASSERT_EQ(old.abi_minor, 0); /* this file targets plugin ABI 1.0 */
}

TEST_IMPL(runtime_hub_and_query_ignore_the_stamp)
{
    for (size_t i = 0; i < N_STAMPS; i++) {
        khub_runtime_opts ro = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = 1};
        STAMP(ro, i);
        khub_runtime *rt = NULL;
        ASSERT_OK(khub_runtime_new(&ro, &rt));
        ASSERT_OK(khub_plugin_load_builtin(rt));
        khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query), .kind = KHUB_OP_NORM, .dtype_id = -1};
        STAMP(q, i);
        khub_binding *b = NULL;
        ASSERT_OK(khub_registry_select(rt, &q, &b));
        khub_hub_opts ho = {KHUB_STRUCT_INIT(khub_hub_opts), .offline = 1, .token = ""};
        STAMP(ho, i);
        khub_hub *hub = NULL;
        ASSERT_OK(khub_hub_new(&ho, &hub));
        /* The role fields of khub_model_kernels are read whatever the stamp:
         * a name that is no kernel fails naming its role. */
        khub_model_kernels mk = {KHUB_STRUCT_INIT(khub_model_kernels), .norm = "not-a-kernel"};
        khub_model_opts mo = {KHUB_STRUCT_INIT(khub_model_opts)};
        STAMP(mk, i);
        STAMP(mo, i);
        khub_model *m = NULL;
        ASSERT_STATUS(khub_model_load_hub(hub, rt, "/nonexistent/m.gguf", &mo, &mk, &m, NULL),
                      KHUB_STATUS_BAD_ID);
        ASSERT_CONTAINS(khub_runtime_errmsg(rt), "norm kernel \"not-a-kernel\"");
        /* khub_model_load reads the options before the file. */
        mo.max_seqs = 100000;
        ASSERT_STATUS(khub_model_load(rt, "/nonexistent/m.gguf", &mo, &m), KHUB_STATUS_INVALID_ARG);
        khub_hub_free(hub);
        khub_runtime_free(rt);
    }
}

TEST_IMPL(info_and_pins_ignore_the_stamp)
{
    char path[512], err[KHUB_ERROR_SIZE];
    snprintf(path, sizeof path, "%s/ref-cpu.so", KHUB_PLUGIN_DIR_BUILD);
    static const char text[] = "{\"format\":1,\"kernels\":[{\"repo\":\"org/k\",\"version\":1,"
                               "\"commit\":\"1111111111111111111111111111111111111111\","
                               "\"variants\":{}}]}";
    khub_lock *lock = NULL;
    ASSERT_OK(khub_lock_parse(text, sizeof text - 1, &lock, err, sizeof err));
    for (size_t i = 0; i < N_STAMPS; i++) {
        khub_plugin_info info = {KHUB_STRUCT_INIT(khub_plugin_info)};
        STAMP(info, i);
        ASSERT_OK(khub_plugin_inspect(path, &info, err, sizeof err));
        ASSERT_STR_EQ(info.id, "khub/ref-cpu");
        /* the caller's header stays (ABI.md rule 5; both overwrote the stamp) */
        ASSERT_EQ(info.abi_major, stamps[i][0]);
        ASSERT_EQ(info.abi_minor, stamps[i][1]);
        khub_lock_pin pin = {KHUB_STRUCT_INIT(khub_lock_pin)};
        STAMP(pin, i);
        ASSERT_OK(khub_lock_pin_at(lock, 0, &pin));
        ASSERT_STR_EQ(pin.repo, "org/k");
        ASSERT_EQ(pin.abi_major, stamps[i][0]);
        ASSERT_EQ(pin.abi_minor, stamps[i][1]);
    }
    khub_lock_free(lock);
}

/* The size is the version: below 0.1's, refused by name. */
TEST_IMPL(too_small_is_refused_by_size)
{
    khub_runtime_opts ro = {KHUB_APP_INIT(khub_runtime_opts)};
    ro.struct_size = 8;
    khub_runtime *rt = NULL;
    ASSERT_STATUS(khub_runtime_new(&ro, &rt), KHUB_STATUS_STRUCT_SIZE);
    ASSERT_STR_EQ(khub_last_error(),
                  "khub_runtime_new: opts.struct_size 8 is smaller than 0.1's 48");
    /* the size a message names is 0.1's, not this header's (both named
     * sizeof, one named 4 bytes short of 0.1's and accepted those) */
    ASSERT_OK(khub_runtime_new(NULL, &rt));
    khub_hub_opts ho = {KHUB_APP_INIT(khub_hub_opts), .offline = 1, .token = ""};
    khub_hub *hub = NULL;
    ASSERT_OK(khub_hub_new(&ho, &hub));
    khub_kernel_swap sw = {KHUB_APP_INIT(khub_kernel_swap)};
    const size_t swap_0_1 = offsetof(khub_kernel_swap, now_serving) + sizeof sw.now_serving;
    sw.struct_size = (uint32_t)swap_0_1 - 1;
    ASSERT_STATUS(
        khub_kernel_swap_prepare(hub, rt, KHUB_KERNEL_ROLE_NORM, "khub/ref-cpu", NULL, &sw),
        KHUB_STATUS_STRUCT_SIZE);
    char want[128];
    snprintf(want, sizeof want,
             "khub_kernel_swap_prepare: out.struct_size %zu is smaller than 0.1's %zu",
             swap_0_1 - 1, swap_0_1);
    ASSERT_STR_EQ(khub_last_error(), want);
    khub_hub_free(hub);
    khub_runtime_free(rt);
    static const char text[] = "{\"format\":1,\"kernels\":[{\"repo\":\"org/k\",\"version\":1,"
                               "\"commit\":\"1111111111111111111111111111111111111111\","
                               "\"variants\":{}}]}";
    char err[KHUB_ERROR_SIZE];
    khub_lock *lock = NULL;
    ASSERT_OK(khub_lock_parse(text, sizeof text - 1, &lock, err, sizeof err));
    khub_lock_pin pin = {KHUB_STRUCT_INIT(khub_lock_pin)};
    pin.struct_size = 544; /* 0.1's 548 without its reserved */
    ASSERT_STATUS(khub_lock_pin_at(lock, 0, &pin), KHUB_STATUS_STRUCT_SIZE);
    ASSERT_STR_EQ(khub_last_error(),
                  "khub_lock_pin_at: out.struct_size 544 is smaller than 0.1's 548");
    khub_lock_free(lock);
}

/* ======================================================================== */
/* Arrays and out-structs sized by the caller                               */
/* ======================================================================== */

#define TINY_GEMMA       KHUB_SOURCE_DIR "/tests/fixtures/gemma3_tiny"
#define SIZE_TO(type, f) (offsetof(type, f) + sizeof(((type *)0)->f))
enum { CANARY = 0xAB, TAIL = 64, FUTURE = 16 };

/* The 0.1 layouts the library must accept: each struct's last 0.1 field
 * where 0.1 put it (today's headers end there too). */
_Static_assert(SIZE_TO(khub_generate_result, decode_tok_s) == 96, "khub_generate_result 0.1");
_Static_assert(sizeof(khub_generate_result) == 96, "khub_generate_result");
_Static_assert(SIZE_TO(khub_batch_request, ud) == 64, "khub_batch_request 0.1");
_Static_assert(sizeof(khub_batch_request) == 64, "khub_batch_request");
_Static_assert(SIZE_TO(khub_op_test, tolerance) == 152, "khub_op_test 0.1");
_Static_assert(sizeof(khub_op_test) == 152, "khub_op_test");
_Static_assert(SIZE_TO(khub_session_info, n_prefilled) == 40, "khub_session_info 0.1");
_Static_assert(SIZE_TO(khub_kernel_result, trace) == 3016, "khub_kernel_result 0.1");

/* A caller's array of n elements of struct_size bytes each (stride), the
 * first min(known, struct_size) bytes of each from proto (the library's
 * struct, known = sizeof it), every other byte (a newer caller's fields,
 * and TAIL bytes after the array) CANARY. */
static unsigned char *array_new(size_t n, uint32_t struct_size, const void *proto, size_t known)
{
    unsigned char *a = malloc(n * struct_size + TAIL);
    ASSERT(a != NULL);
    memset(a, CANARY, n * struct_size + TAIL);
    for (size_t i = 0; i < n; i++) {
        memcpy(a + i * struct_size, proto, known < struct_size ? known : struct_size);
        memcpy(a + i * struct_size, &struct_size, 4);
    }
    return a;
}

/* Every byte the library does not know is still CANARY. */
static void array_check_canaries(const unsigned char *a, size_t n, uint32_t struct_size,
                                 size_t known)
{
    for (size_t i = 0; i < n; i++)
        for (size_t k = known; k < struct_size; k++) ASSERT_EQ(a[i * struct_size + k], CANARY);
    for (size_t k = 0; k < TAIL; k++) ASSERT_EQ(a[n * struct_size + k], CANARY);
}

/* A caller's single struct of struct_size bytes: the library's struct
 * (proto, known bytes) up to struct_size, then CANARY bytes (what a caller
 * of that size never wrote); a refusal leaves every byte as it was. */
typedef struct struct_buf {
    unsigned char bytes[4096 + TAIL];
    unsigned char before[4096 + TAIL];
} struct_buf;

static struct_buf struct_buf_new(const void *proto, size_t known, uint32_t struct_size)
{
    struct_buf b;
    ASSERT(known <= 4096);
    memset(b.bytes, CANARY, sizeof b.bytes);
    memcpy(b.bytes, proto, known < struct_size ? known : struct_size);
    memcpy(b.bytes, &struct_size, 4);
    memcpy(b.before, b.bytes, sizeof b.bytes);
    return b;
}

static void struct_buf_check_untouched(const struct_buf *b)
{
    for (size_t k = 0; k < sizeof b->bytes; k++) ASSERT_EQ(b->bytes[k], b->before[k]);
}

typedef struct tiny {
    khub_runtime *rt;
    khub_model *m;
} tiny;

static tiny tiny_open(void)
{
    tiny t = {0};
    khub_runtime_opts ro = {KHUB_APP_INIT(khub_runtime_opts), .n_threads = 1};
    ASSERT_OK(khub_runtime_new(&ro, &t.rt));
    ASSERT_OK(khub_plugin_load_builtin(t.rt));
    khub_model_opts mo = {KHUB_APP_INIT(khub_model_opts), .max_seqs = 2, .max_context = 64};
    ASSERT_OK(khub_model_load(t.rt, TINY_GEMMA, &mo, &t.m));
    return t;
}

static void tiny_close(tiny *t)
{
    khub_model_free(t->m);
    khub_runtime_free(t->rt);
}

/* khub_model_generate's results of struct_size bytes each: filled, freed,
 * nothing written past any element's struct_size. */
static void generate_into(tiny *t, uint32_t struct_size)
{
    const char *prompts[] = {"hello", "the sky is"};
    khub_generate_opts go = {KHUB_APP_INIT(khub_generate_opts), .max_new_tokens = 3};
    khub_generate_result proto = {KHUB_APP_INIT(khub_generate_result)};
    unsigned char *a = array_new(2, struct_size, &proto, sizeof proto);
    ASSERT_OK(khub_model_generate(t->m, prompts, 2, &go, (khub_generate_result *)a));
    for (size_t i = 0; i < 2; i++) {
        khub_generate_result r;
        memcpy(&r, a + i * struct_size, sizeof r);
        ASSERT_EQ(r.struct_size, struct_size);
        ASSERT_EQ(r.abi_major, KHUB_API_VERSION_MAJOR);
        ASSERT(r.text != NULL && r.tokens != NULL);
        ASSERT(r.n_tokens >= 1 && r.n_tokens <= 3);
        ASSERT(r.n_prompt_tokens > 0);
        ASSERT(r.decode_ms >= 0);
    }
    array_check_canaries(a, 2, struct_size, sizeof proto);
    khub_generate_results_free(t->m, (khub_generate_result *)a, 2);
    for (size_t i = 0; i < 2; i++) {
        khub_generate_result r;
        memcpy(&r, a + i * struct_size, sizeof r);
        ASSERT_EQ(r.struct_size, struct_size);
        ASSERT_EQ(r.abi_major, KHUB_API_VERSION_MAJOR);
        ASSERT(r.text == NULL && r.tokens == NULL && r.n_tokens == 0);
    }
    array_check_canaries(a, 2, struct_size, sizeof proto);
    free(a);
}

TEST_IMPL(generate_results_sized_by_the_caller)
{
    tiny t = tiny_open();
    generate_into(&t, (uint32_t)SIZE_TO(khub_generate_result, decode_tok_s)); /* 0.1's */
    generate_into(&t, (uint32_t)sizeof(khub_generate_result) + FUTURE);       /* a newer one's */

    /* refused before anything is written: mixed sizes, below 0.1 */
    const char *prompts[] = {"hello", "the sky is"};
    const uint32_t size = (uint32_t)sizeof(khub_generate_result);
    khub_generate_result proto = {KHUB_APP_INIT(khub_generate_result)};
    unsigned char *a = array_new(2, size, &proto, sizeof proto);
    memcpy(a + size, &(uint32_t){size + 8}, 4);
    unsigned char before[2 * sizeof(khub_generate_result) + TAIL];
    memcpy(before, a, sizeof before);
    ASSERT_STATUS(khub_model_generate(t.m, prompts, 2, NULL, (khub_generate_result *)a),
                  KHUB_STATUS_STRUCT_SIZE);
    char want[256];
    snprintf(want, sizeof want,
             "khub_model_generate: results[1].struct_size %u differs from results[0]'s %u (the "
             "array's elements are one struct)",
             size + 8, size);
    ASSERT_STR_EQ(khub_runtime_errmsg(t.rt), want);
    khub_generate_results_free(t.m, (khub_generate_result *)a, 2); /* element 0 only */
    ASSERT(memcmp(a, before, sizeof before) == 0);
    memcpy(a, &(uint32_t){8}, 4);
    memcpy(before, a, sizeof before);
    ASSERT_STATUS(khub_model_generate(t.m, prompts, 2, NULL, (khub_generate_result *)a),
                  KHUB_STATUS_STRUCT_SIZE);
    ASSERT_STR_EQ(khub_runtime_errmsg(t.rt),
                  "khub_model_generate: results[0].struct_size 8 is smaller than 0.1's 96");
    khub_generate_results_free(t.m, (khub_generate_result *)a, 2); /* writes nothing */
    ASSERT(memcmp(a, before, sizeof before) == 0);
    free(a);
    /* n == 0: nothing is read, not even element 0's struct_size (an empty
     * array need not have one; ASan sees the 4-byte read of a 1-byte block) */
    unsigned char *none = malloc(1);
    ASSERT(none != NULL);
    khub_generate_results_free(t.m, (khub_generate_result *)none, 0);
    khub_batch_results_free(t.m, (khub_batch_result *)none, 0);
    free(none);
    tiny_close(&t);
}

/* khub_generate_batch's reqs of req_size bytes each and results of
 * res_size: run, results filled, nothing written past a struct_size. */
static void batch_with(tiny *t, uint32_t req_size, uint32_t res_size)
{
    khub_generate_opts go = {KHUB_APP_INIT(khub_generate_opts), .max_new_tokens = 2};
    khub_batch_request rq = {KHUB_APP_INIT(khub_batch_request), .prompt = "hello", .opts = &go};
    unsigned char *q = array_new(2, req_size, &rq, sizeof rq);
    khub_batch_result rs = {KHUB_APP_INIT(khub_batch_result)};
    unsigned char *r = array_new(2, res_size, &rs, sizeof rs);
    ASSERT_OK(
        khub_generate_batch(t->m, (const khub_batch_request *)q, 2, NULL, (khub_batch_result *)r));
    for (size_t i = 0; i < 2; i++) {
        khub_batch_result x = {0};
        memcpy(&x, r + i * res_size, res_size < sizeof x ? res_size : sizeof x);
        ASSERT_EQ(x.struct_size, res_size);
        ASSERT_OK(x.status);
        ASSERT_EQ(x.id, i + 1);
        ASSERT_EQ(x.n_tokens, 2);
        ASSERT(x.text != NULL);
    }
    array_check_canaries(q, 2, req_size, sizeof rq);
    array_check_canaries(r, 2, res_size, res_size < sizeof rs ? res_size : sizeof rs);
    khub_batch_results_free(t->m, (khub_batch_result *)r, 2);
    array_check_canaries(r, 2, res_size, res_size < sizeof rs ? res_size : sizeof rs);
    free(q);
    free(r);
}

TEST_IMPL(batch_requests_sized_by_the_caller)
{
    tiny t = tiny_open();
    const uint32_t req01 = (uint32_t)SIZE_TO(khub_batch_request, ud);
    const uint32_t res01 = (uint32_t)SIZE_TO(khub_batch_result, error);
    batch_with(&t, req01, res01);
    batch_with(&t, (uint32_t)sizeof(khub_batch_request) + FUTURE,
               (uint32_t)sizeof(khub_batch_result) + FUTURE);

    /* refused: reqs of mixed sizes, below 0.1 */
    khub_batch_request rq = {KHUB_APP_INIT(khub_batch_request), .prompt = "hello"};
    unsigned char *q = array_new(2, req01, &rq, sizeof rq);
    khub_batch_result rs[2] = {{KHUB_APP_INIT(khub_batch_result)},
                               {KHUB_APP_INIT(khub_batch_result)}};
    memcpy(q + req01, &(uint32_t){req01 + 8}, 4);
    ASSERT_STATUS(khub_generate_batch(t.m, (const khub_batch_request *)q, 2, NULL, rs),
                  KHUB_STATUS_STRUCT_SIZE);
    ASSERT_STR_EQ(khub_runtime_errmsg(t.rt),
                  "khub_generate_batch: reqs[1].struct_size 72 differs from reqs[0]'s 64 (the "
                  "array's elements are one struct)");
    memcpy(q, &(uint32_t){8}, 4);
    ASSERT_STATUS(khub_generate_batch(t.m, (const khub_batch_request *)q, 2, NULL, rs),
                  KHUB_STATUS_STRUCT_SIZE);
    ASSERT_STR_EQ(khub_runtime_errmsg(t.rt),
                  "khub_generate_batch: reqs[0].struct_size 8 is smaller than 0.1's 64");
    ASSERT(rs[0].text == NULL && rs[1].text == NULL); /* nothing ran */
    khub_batch_results_free(t.m, rs, 2);
    free(q);
    tiny_close(&t);
}

/* khub_kernel_dir_tests: the caller sets tests[0].struct_size, the stride;
 * each element gets that struct_size and what this library knows. */
TEST_IMPL(kernel_dir_tests_sized_by_the_caller)
{
    const char *dir = KHUB_SOURCE_DIR "/kernels-src/activation";
    char err[KHUB_ERROR_SIZE] = "";
    size_t n = 0;
    const uint32_t sizes[] = {(uint32_t)SIZE_TO(khub_op_test, tolerance),
                              (uint32_t)sizeof(khub_op_test) + FUTURE};
    for (size_t s = 0; s < 2; s++) {
        const uint32_t size = sizes[s];
        khub_op_test proto = {KHUB_APP_INIT(khub_op_test)};
        unsigned char *a = array_new(4, size, &proto, sizeof proto);
        ASSERT_OK(khub_kernel_dir_tests(dir, (khub_op_test *)a, 4, &n, err, sizeof err));
        ASSERT_EQ(n, 2);
        khub_op_test t1;
        memcpy(&t1, a + size, sizeof t1);
        ASSERT_EQ(t1.struct_size, size);
        ASSERT_STR_EQ(t1.op, "silu_and_mul");
        ASSERT_EQ(t1.shape[0], 37);
        array_check_canaries(a, 4, size, sizeof proto);
        free(a);
    }
    khub_op_test small = {KHUB_APP_INIT(khub_op_test)};
    small.struct_size = 8;
    ASSERT_STATUS(khub_kernel_dir_tests(dir, &small, 1, &n, err, sizeof err),
                  KHUB_STATUS_STRUCT_SIZE);
    ASSERT_STR_EQ(err, "khub_kernel_dir_tests: tests[0].struct_size 8 is smaller than 0.1's 152");

    /* the other out-structs of khub_check.h: below 0.1 is STRUCT_SIZE
     * (it was an API_CHECK against this header's sizeof) */
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(NULL, &rt));
    khub_kernel_dir_plugin dp = {KHUB_APP_INIT(khub_kernel_dir_plugin)};
    dp.struct_size = 8;
    ASSERT_STATUS(khub_kernel_dir_load(rt, dir, &dp), KHUB_STATUS_STRUCT_SIZE);
    ASSERT_STR_EQ(khub_runtime_errmsg(rt),
                  "khub_kernel_dir_load: out.struct_size 8 is smaller than 0.1's 240");
    khub_op_test t = {KHUB_APP_INIT(khub_op_test)};
    khub_op_bench_result br = {KHUB_APP_INIT(khub_op_bench_result)};
    br.struct_size = 8;
    ASSERT_STATUS(khub_op_bench(rt, "khub/ref-cpu", &t, 0, &br), KHUB_STATUS_STRUCT_SIZE);
    ASSERT_STR_EQ(khub_runtime_errmsg(rt),
                  "khub_op_bench: out.struct_size 8 is smaller than 0.1's 40");
    khub_runtime_free(rt);
}

/* khub_plugin_inspect refuses an info below 0.1's 185 bytes, 0 included
 * (0 was taken as the whole struct, 1-7 underflowed the copy's length),
 * before it reads the file, and writes nothing; from 0.1's size on it
 * writes up to the caller's struct_size and keeps the caller's header. */
TEST_IMPL(plugin_info_sized_by_the_caller)
{
    char path[512], err[KHUB_ERROR_SIZE];
    snprintf(path, sizeof path, "%s/ref-cpu.so", KHUB_PLUGIN_DIR_BUILD);
    khub_plugin_info proto = {KHUB_APP_INIT(khub_plugin_info)};
    STAMP(proto, 1);
    const uint32_t bad[] = {0, 2, 8, (uint32_t)SIZE_TO(khub_plugin_info, sha256) - 1};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        struct_buf b = struct_buf_new(&proto, sizeof proto, bad[k]);
        ASSERT_STATUS(khub_plugin_inspect(path, (khub_plugin_info *)b.bytes, err, sizeof err),
                      KHUB_STATUS_STRUCT_SIZE);
        char want[128];
        snprintf(want, sizeof want,
                 "khub_plugin_inspect: info.struct_size %u is smaller than 0.1's 185",
                 (unsigned)bad[k]);
        ASSERT_STR_EQ(err, want);
        ASSERT_STR_EQ(khub_last_error(), want);
        struct_buf_check_untouched(&b);
    }
    const uint32_t good[] = {(uint32_t)SIZE_TO(khub_plugin_info, sha256),
                             (uint32_t)sizeof(khub_plugin_info) + FUTURE};
    for (size_t k = 0; k < 2; k++) {
        unsigned char *a = array_new(1, good[k], &proto, sizeof proto);
        ASSERT_OK(khub_plugin_inspect(path, (khub_plugin_info *)a, err, sizeof err));
        khub_plugin_info got;
        memcpy(&got, a, sizeof got < good[k] ? sizeof got : good[k]);
        ASSERT_EQ(got.struct_size, good[k]);
        ASSERT_EQ(got.abi_major, 2);
        ASSERT_EQ(got.abi_minor, 7);
        ASSERT_STR_EQ(got.id, "khub/ref-cpu");
        ASSERT_EQ(strlen(got.sha256), 64);
        array_check_canaries(a, 1, good[k], good[k] < sizeof proto ? good[k] : sizeof proto);
        free(a);
    }
    /* The info's old failure is no reason for the file's: NULL info still works. */
    ASSERT_OK(khub_plugin_inspect(path, NULL, err, sizeof err));
}

/* Single out-structs: 0.1's size is enough (they asked for this header's
 * sizeof), a newer caller's extra bytes are left alone, below 0.1 is
 * refused with the numbers. */
TEST_IMPL(out_structs_sized_by_the_caller)
{
    tiny t = tiny_open();
    khub_session *s = NULL;
    ASSERT_OK(khub_session_new(t.m, &s));
    khub_generate_opts go = {KHUB_APP_INIT(khub_generate_opts), .max_new_tokens = 2};
    khub_generate_result rproto = {KHUB_APP_INIT(khub_generate_result)};
    const uint32_t rsizes[] = {(uint32_t)SIZE_TO(khub_generate_result, decode_tok_s),
                               (uint32_t)sizeof(khub_generate_result) + FUTURE};
    for (size_t k = 0; k < 2; k++) {
        unsigned char *r = array_new(1, rsizes[k], &rproto, sizeof rproto);
        ASSERT_OK(khub_session_generate(s, "hello", &go, (khub_generate_result *)r));
        ASSERT(((khub_generate_result *)r)->text != NULL);
        array_check_canaries(r, 1, rsizes[k], sizeof rproto);
        khub_generate_results_free(t.m, (khub_generate_result *)r, 1);
        array_check_canaries(r, 1, rsizes[k], sizeof rproto);
        free(r);
    }
    unsigned char *r = array_new(1, 8, &rproto, sizeof rproto);
    ASSERT_STATUS(khub_session_generate(s, "hello", &go, (khub_generate_result *)r),
                  KHUB_STATUS_STRUCT_SIZE);
    ASSERT_STR_EQ(khub_runtime_errmsg(t.rt),
                  "khub_session_generate: result.struct_size 8 is smaller than 0.1's 96");
    array_check_canaries(r, 1, 8, 8);
    free(r);

    khub_session_info iproto = {KHUB_APP_INIT(khub_session_info)};
    const uint32_t isizes[] = {(uint32_t)SIZE_TO(khub_session_info, n_prefilled),
                               (uint32_t)sizeof(khub_session_info) + FUTURE};
    for (size_t k = 0; k < 2; k++) {
        unsigned char *i = array_new(1, isizes[k], &iproto, sizeof iproto);
        ASSERT_OK(khub_session_info_get(s, (khub_session_info *)i));
        ASSERT(((khub_session_info *)i)->n_cached > 0);
        array_check_canaries(i, 1, isizes[k], sizeof iproto);
        free(i);
    }
    unsigned char *i = array_new(1, 8, &iproto, sizeof iproto);
    ASSERT_STATUS(khub_session_info_get(s, (khub_session_info *)i), KHUB_STATUS_STRUCT_SIZE);
    ASSERT_STR_EQ(khub_runtime_errmsg(t.rt),
                  "khub_session_info_get: info.struct_size 8 is smaller than 0.1's 40");
    array_check_canaries(i, 1, 8, 8);
    free(i);
    khub_session_free(s);
    tiny_close(&t);

    /* khub_kernel_fetch: checked before anything is fetched, then written
     * only up to the caller's struct_size (it cleared sizeof bytes) */
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(NULL, &rt));
    khub_hub_opts ho = {KHUB_APP_INIT(khub_hub_opts), .offline = 1, .token = ""};
    khub_hub *hub = NULL;
    ASSERT_OK(khub_hub_new(&ho, &hub));
    khub_kernel_result kproto = {KHUB_APP_INIT(khub_kernel_result)};
    STAMP(kproto, 1); /* kept: the copy-out wrote the library's stamp over it */
    unsigned char *k = array_new(1, 8, &kproto, sizeof kproto);
    ASSERT_STATUS(khub_kernel_fetch(hub, rt, "org/none", NULL, (khub_kernel_result *)k),
                  KHUB_STATUS_STRUCT_SIZE);
    ASSERT_STR_EQ(khub_runtime_errmsg(rt),
                  "khub_kernel_fetch: out.struct_size 8 is smaller than 0.1's 3016");
    array_check_canaries(k, 1, 8, 8);
    free(k);
    const uint32_t ksizes[] = {(uint32_t)SIZE_TO(khub_kernel_result, trace),
                               (uint32_t)sizeof(khub_kernel_result) + FUTURE};
    for (size_t j = 0; j < 2; j++) {
        k = array_new(1, ksizes[j], &kproto, sizeof kproto);
        /* offline, nothing cached: OFFLINE, with the repo filled in */
        ASSERT(khub_kernel_fetch(hub, rt, "org/none", NULL, (khub_kernel_result *)k) !=
               KHUB_STATUS_OK);
        ASSERT_EQ(((khub_kernel_result *)k)->struct_size, ksizes[j]);
        ASSERT_EQ(((khub_kernel_result *)k)->abi_major, 2);
        ASSERT_EQ(((khub_kernel_result *)k)->abi_minor, 7);
        ASSERT_STR_EQ(((khub_kernel_result *)k)->repo, "org/none");
        array_check_canaries(k, 1, ksizes[j], sizeof kproto);
        free(k);
    }
    khub_hub_free(hub);
    khub_runtime_free(rt);
}

/* khub_lock_pin is frozen (khub_project.h): khub_lock_result holds it twice
 * by value, so a pin that grew would move replaced, downgrade and previous
 * under every 0.1 caller. */
_Static_assert(sizeof(khub_lock_pin) == 548, "khub_lock_pin is frozen at 0.1's 548 bytes");
_Static_assert(SIZE_TO(khub_lock_pin, reserved) == 548, "khub_lock_pin 0.1");
_Static_assert(offsetof(khub_lock_result, pin) == 8, "khub_lock_result.pin");
_Static_assert(offsetof(khub_lock_result, replaced) == 556, "khub_lock_result.replaced");
_Static_assert(offsetof(khub_lock_result, downgrade) == 560, "khub_lock_result.downgrade");
_Static_assert(offsetof(khub_lock_result, previous) == 564, "khub_lock_result.previous");
_Static_assert(sizeof(khub_lock_result) == 1112, "khub_lock_result");
/* The 0.1 sizes the calls below refuse under. */
_Static_assert(SIZE_TO(khub_check_opts, sha256) == 24, "khub_check_opts 0.1");
_Static_assert(SIZE_TO(khub_plugin_info, sha256) == 185, "khub_plugin_info 0.1");
_Static_assert(SIZE_TO(khub_model_info, reserved) == 176, "khub_model_info 0.1");
_Static_assert(SIZE_TO(khub_model_binding, reserved) == 264, "khub_model_binding 0.1");
_Static_assert(SIZE_TO(khub_tune_opts, levers) == 96, "khub_tune_opts 0.1");

/* khub_check_file and khub_check_dir read their options only up to the
 * caller's struct_size and refuse them below 0.1's (they read the 0.1
 * fields unchecked). */
TEST_IMPL(check_opts_sized_by_the_caller)
{
    char path[512], err[KHUB_ERROR_SIZE];
    snprintf(path, sizeof path, "%s/ref-cpu.so", KHUB_PLUGIN_DIR_BUILD);
    khub_check_opts proto = {KHUB_APP_INIT(khub_check_opts), .glibc_ceiling = "bad"};
    khub_check_report *rep = NULL;
    struct_buf b = struct_buf_new(&proto, sizeof proto, 16);
    ASSERT_STATUS(khub_check_file(path, (khub_check_opts *)b.bytes, &rep, err, sizeof err),
                  KHUB_STATUS_STRUCT_SIZE);
    ASSERT_STR_EQ(err, "khub_check_file: opts.struct_size 16 is smaller than 0.1's 24");
    ASSERT_STR_EQ(khub_last_error(), err);
    ASSERT(rep == NULL);
    ASSERT_STATUS(khub_check_dir("/nonexistent", (khub_check_opts *)b.bytes, &rep, err, sizeof err),
                  KHUB_STATUS_STRUCT_SIZE);
    ASSERT_STR_EQ(err, "khub_check_dir: opts.struct_size 16 is smaller than 0.1's 24");
    struct_buf_check_untouched(&b);
    /* 0.1's size, then a newer caller's bytes: the 0.1 fields are read */
    const uint32_t good[] = {24, (uint32_t)sizeof proto + FUTURE};
    for (size_t k = 0; k < 2; k++) {
        b = struct_buf_new(&proto, sizeof proto, good[k]);
        ASSERT_STATUS(khub_check_file(path, (khub_check_opts *)b.bytes, &rep, err, sizeof err),
                      KHUB_STATUS_INVALID_ARG);
        ASSERT_STR_EQ(err, "glibc ceiling 'bad' is not like GLIBC_2.28");
        ASSERT_STATUS(
            khub_check_dir("/nonexistent", (khub_check_opts *)b.bytes, &rep, err, sizeof err),
            KHUB_STATUS_INVALID_ARG);
        ASSERT_CONTAINS(err, "a glibc ceiling is for file checks");
        struct_buf_check_untouched(&b);
    }
}

/* khub_model_info_get refuses an info below 0.1's 176 bytes (it took any
 * size from 8) with the exact message, and writes only up to the caller's
 * struct_size, which stays the caller's, as does its stamp (it set
 * struct_size to what it wrote and copied its own stamp);
 * khub_model_binding_get's STRUCT_SIZE now has a message. */
TEST_IMPL(model_info_and_bindings_sized_by_the_caller)
{
    tiny t = tiny_open();
    khub_model_info proto = {KHUB_APP_INIT(khub_model_info)};
    STAMP(proto, 1);
    const uint32_t bad[] = {8, 175};
    for (size_t k = 0; k < 2; k++) {
        struct_buf b = struct_buf_new(&proto, sizeof proto, bad[k]);
        ASSERT_STATUS(khub_model_info_get(t.m, (khub_model_info *)b.bytes),
                      KHUB_STATUS_STRUCT_SIZE);
        char want[128];
        snprintf(want, sizeof want,
                 "khub_model_info_get: info.struct_size %u is smaller than 0.1's 176",
                 (unsigned)bad[k]);
        ASSERT_STR_EQ(khub_runtime_errmsg(t.rt), want);
        struct_buf_check_untouched(&b);
    }
    const uint32_t good[] = {176, (uint32_t)sizeof proto + FUTURE};
    for (size_t k = 0; k < 2; k++) {
        unsigned char *a = array_new(1, good[k], &proto, sizeof proto);
        ASSERT_OK(khub_model_info_get(t.m, (khub_model_info *)a));
        khub_model_info got;
        memcpy(&got, a, sizeof got < good[k] ? sizeof got : good[k]);
        ASSERT_EQ(got.struct_size, good[k]);
        ASSERT_EQ(got.abi_major, 2);
        ASSERT_EQ(got.abi_minor, 7);
        ASSERT(got.n_layers > 0 && got.vocab > 0);
        array_check_canaries(a, 1, good[k], good[k] < sizeof proto ? good[k] : sizeof proto);
        free(a);
    }

    khub_model_binding bproto = {KHUB_APP_INIT(khub_model_binding)};
    struct_buf b = struct_buf_new(&bproto, sizeof bproto, 8);
    ASSERT_STATUS(khub_model_binding_get(t.m, 0, (khub_model_binding *)b.bytes),
                  KHUB_STATUS_STRUCT_SIZE);
    ASSERT_STR_EQ(khub_last_error(),
                  "khub_model_binding_get: out.struct_size 8 is smaller than 0.1's 264");
    struct_buf_check_untouched(&b);
    tiny_close(&t);
}

/* khub_tune_run refuses options below 0.1's 96 bytes (it read them as
 * zeros) and reads a 0.1 caller's no further: its tp_* bytes (CANARY
 * here) are not read, so the unknown lever is what fails. */
TEST_IMPL(tune_opts_sized_by_the_caller)
{
    char err[KHUB_ERROR_SIZE];
    khub_tune_opts proto = {KHUB_APP_INIT(khub_tune_opts), .model = "/nonexistent/m.gguf",
                            .levers = "nope"};
    khub_tune_report *rep = NULL;
    struct_buf b = struct_buf_new(&proto, sizeof proto, 8);
    ASSERT_STATUS(khub_tune_run((khub_tune_opts *)b.bytes, &rep, err, sizeof err),
                  KHUB_STATUS_STRUCT_SIZE);
    ASSERT_STR_EQ(err, "khub_tune_run: opts.struct_size 8 is smaller than 0.1's 96");
    b = struct_buf_new(&proto, sizeof proto, 96);
    ASSERT_STATUS(khub_tune_run((khub_tune_opts *)b.bytes, &rep, err, sizeof err),
                  KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(err, "unknown lever \"nope\"");
    struct_buf_check_untouched(&b);
}

/* The author API says STRUCT_SIZE for a struct below 0.1's size, as the
 * rest of the app API does (it said MISUSE), and MISUSE for NULL. */
TEST_IMPL(author_structs_sized_by_the_caller)
{
    char err[KHUB_ERROR_SIZE];
    khub_author_template tp = {KHUB_APP_INIT(khub_author_template)};
    struct_buf b = struct_buf_new(&tp, sizeof tp, 8);
    ASSERT_STATUS(khub_author_template_at(0, (khub_author_template *)b.bytes),
                  KHUB_STATUS_STRUCT_SIZE);
    ASSERT_STR_EQ(khub_last_error(),
                  "khub_author_template_at: out.struct_size 8 is smaller than 0.1's 28");
    struct_buf_check_untouched(&b);
    ASSERT_STATUS(khub_author_template_at(0, NULL), KHUB_STATUS_MISUSE);
    ASSERT_STR_EQ(khub_last_error(), "khub_author_template_at: out is NULL");

    khub_author_init_opts io = {KHUB_APP_INIT(khub_author_init_opts)};
    b = struct_buf_new(&io, sizeof io, 8);
    ASSERT_STATUS(khub_author_init((khub_author_init_opts *)b.bytes, err, sizeof err),
                  KHUB_STATUS_STRUCT_SIZE);
    ASSERT_STR_EQ(err, "khub_author_init: opts.struct_size 8 is smaller than 0.1's 56");
    khub_author_manifest am = {KHUB_APP_INIT(khub_author_manifest)};
    b = struct_buf_new(&am, sizeof am, 8);
    ASSERT_STATUS(
        khub_author_manifest_read("/nonexistent", (khub_author_manifest *)b.bytes, err, sizeof err),
        KHUB_STATUS_STRUCT_SIZE);
    ASSERT_STR_EQ(err, "khub_author_manifest_read: out.struct_size 8 is smaller than 0.1's 260");
    struct_buf_check_untouched(&b);
    khub_author_build_result br = {KHUB_APP_INIT(khub_author_build_result)};
    khub_author_build_opts bo = {KHUB_APP_INIT(khub_author_build_opts)};
    b = struct_buf_new(&br, sizeof br, 8);
    ASSERT_STATUS(khub_author_build("/nonexistent", &bo, (khub_author_build_result *)b.bytes, err,
                                    sizeof err),
                  KHUB_STATUS_STRUCT_SIZE);
    ASSERT_STR_EQ(err, "khub_author_build: res.struct_size 8 is smaller than 0.1's 908");
    struct_buf_check_untouched(&b);
    bo.struct_size = 8;
    ASSERT_STATUS(khub_author_build("/nonexistent", &bo, &br, err, sizeof err),
                  KHUB_STATUS_STRUCT_SIZE);
    ASSERT_STR_EQ(err, "khub_author_build: opts.struct_size 8 is smaller than 0.1's 40");
    khub_author_key key = {KHUB_APP_INIT(khub_author_key)};
    b = struct_buf_new(&key, sizeof key, 8);
    ASSERT_STATUS(khub_author_key_generate("/nonexistent/k", "/nonexistent/k.pub",
                                           (khub_author_key *)b.bytes, err, sizeof err),
                  KHUB_STATUS_STRUCT_SIZE);
    ASSERT_STR_EQ(err, "khub_author_key_generate: out.struct_size 8 is smaller than 0.1's 128");
    struct_buf_check_untouched(&b);

    khub_hub_opts ho = {KHUB_APP_INIT(khub_hub_opts), .offline = 1, .token = ""};
    khub_hub *hub = NULL;
    ASSERT_OK(khub_hub_new(&ho, &hub));
    khub_author_publish_opts po = {KHUB_APP_INIT(khub_author_publish_opts)};
    khub_author_publish_result pr = {KHUB_APP_INIT(khub_author_publish_result)};
    /* a publish that failed first: the refusals below replace its message
     * on the hub (they were in khub_last_error() only before session 18) */
    po.dir = "/nonexistent/kernel";
    ASSERT_STATUS(khub_author_publish(hub, &po, &pr), KHUB_STATUS_NOT_FOUND);
    ASSERT_STR_EQ(khub_hub_errmsg(hub), "/nonexistent/kernel/kernel.json: cannot open: No such "
                                        "file or directory (is /nonexistent/kernel a kernel "
                                        "source dir?)");
    po.struct_size = 8;
    ASSERT_STATUS(khub_author_publish(hub, &po, &pr), KHUB_STATUS_STRUCT_SIZE);
    ASSERT_STR_EQ(khub_last_error(),
                  "khub_author_publish: opts.struct_size 8 is smaller than 0.1's 32");
    ASSERT_STR_EQ(khub_hub_errmsg(hub), khub_last_error());
    po.struct_size = sizeof po;
    pr.struct_size = 8;
    ASSERT_STATUS(khub_author_publish(hub, &po, &pr), KHUB_STATUS_STRUCT_SIZE);
    ASSERT_STR_EQ(khub_last_error(),
                  "khub_author_publish: res.struct_size 8 is smaller than 0.1's 1392");
    ASSERT_STR_EQ(khub_hub_errmsg(hub), khub_last_error());
    pr.struct_size = sizeof pr;
    po.dir = NULL;
    ASSERT_STATUS(khub_author_publish(hub, &po, &pr), KHUB_STATUS_MISUSE);
    ASSERT_STR_EQ(khub_hub_errmsg(hub), "khub_author_publish: opts.dir is NULL");
    ASSERT_STR_EQ(khub_last_error(), khub_hub_errmsg(hub));
    khub_hub_free(hub);
}

/* The option structs read by hand before session 18 (model, generate and
 * batch options, a batch's request and stats, kernel fetch and lock
 * options) refuse a struct below 0.1's size in the one message form; they
 * read anything from 8-12 bytes (the rest as zeros), and khub_kernel_fetch
 * took a struct_size of 0 as the whole struct. */
static void expect_small(khub_status st, const char *errmsg, const char *who, const char *name,
                         size_t size, size_t min)
{
    char want[160];
    snprintf(want, sizeof want, "%s: %s.struct_size %zu is smaller than 0.1's %zu", who, name, size,
             min);
    ASSERT_STATUS(st, KHUB_STATUS_STRUCT_SIZE);
    ASSERT_STR_EQ(errmsg, want);
}

TEST_IMPL(option_structs_refused_below_0_1)
{
    tiny t = tiny_open();
    const size_t mo_0_1 = SIZE_TO(khub_model_opts, progress_ud);
    khub_model_opts mo = {KHUB_APP_INIT(khub_model_opts)};
    mo.struct_size = (uint32_t)mo_0_1 - 8;
    khub_model *m = NULL;
    expect_small(khub_model_load(t.rt, "/nonexistent/m.gguf", &mo, &m), khub_runtime_errmsg(t.rt),
                 "khub_model_load", "opts", mo_0_1 - 8, mo_0_1);
    mo.struct_size = (uint32_t)mo_0_1; /* 0.1's size: read, then the file is missing */
    ASSERT(khub_model_load(t.rt, "/nonexistent/m.gguf", &mo, &m) != KHUB_STATUS_STRUCT_SIZE);
    khub_comm comm = {KHUB_APP_INIT(khub_comm)};
    comm.struct_size = 16; /* INVALID_ARG before session 18 */
    khub_model_opts tp = {KHUB_APP_INIT(khub_model_opts), .tp_size = 2, .comm = &comm};
    expect_small(khub_model_load(t.rt, TINY_GEMMA, &tp, &m), khub_runtime_errmsg(t.rt),
                 "khub_model_load", "opts.comm", 16, SIZE_TO(khub_comm, barrier));
    khub_hub_opts ho = {KHUB_APP_INIT(khub_hub_opts), .offline = 1, .token = ""};
    khub_hub *hub = NULL;
    ASSERT_OK(khub_hub_new(&ho, &hub));
    mo.struct_size = 12;
    expect_small(khub_model_load_hub(hub, t.rt, "/nonexistent/m.gguf", &mo, NULL, &m, NULL),
                 khub_runtime_errmsg(t.rt), "khub_model_load_hub", "base", 12, mo_0_1);

    const char *prompts[] = {"hello"};
    khub_generate_opts go = {KHUB_APP_INIT(khub_generate_opts)};
    go.struct_size = 12; /* max_new_tokens only: read before session 18 */
    khub_generate_result gr = {KHUB_APP_INIT(khub_generate_result)};
    expect_small(khub_model_generate(t.m, prompts, 1, &go, &gr), khub_runtime_errmsg(t.rt),
                 "khub_model_generate", "opts", 12, SIZE_TO(khub_generate_opts, reserved));

    khub_batch_config bc = {KHUB_APP_INIT(khub_batch_config)};
    bc.struct_size = 12;
    khub_batch *b = NULL;
    expect_small(khub_batch_new(t.m, &bc, &b), khub_runtime_errmsg(t.rt), "khub_batch_new", "cfg",
                 12, SIZE_TO(khub_batch_config, reserved));
    ASSERT_OK(khub_batch_new(t.m, NULL, &b));
    khub_batch_request rq = {KHUB_APP_INIT(khub_batch_request), .prompt = "hello"};
    rq.struct_size = 16;
    uint64_t id = 0;
    expect_small(khub_batch_submit(b, &rq, &id), khub_last_error(), "khub_batch_submit", "req", 16,
                 SIZE_TO(khub_batch_request, ud));
    khub_batch_stats bs = {KHUB_APP_INIT(khub_batch_stats)};
    bs.struct_size = 16;
    expect_small(khub_batch_stats_get(b, &bs), khub_last_error(), "khub_batch_stats_get", "stats",
                 16, SIZE_TO(khub_batch_stats, generated_tokens));
    /* the caller's header kept (ABI.md rule 5; the library's stamp was
     * written over it), nothing past its struct_size written */
    for (size_t i = 0; i < N_STAMPS; i++) {
        khub_batch_stats proto = {KHUB_STRUCT_INIT(khub_batch_stats)};
        STAMP(proto, i);
        struct_buf sb = struct_buf_new(&proto, sizeof proto, (uint32_t)sizeof proto + FUTURE);
        ASSERT_OK(khub_batch_stats_get(b, (khub_batch_stats *)(void *)sb.bytes));
        khub_batch_stats got;
        memcpy(&got, sb.bytes, sizeof got);
        ASSERT_EQ(got.struct_size, sizeof proto + FUTURE);
        ASSERT_EQ(got.abi_major, stamps[i][0]);
        ASSERT_EQ(got.abi_minor, stamps[i][1]);
        for (size_t k = sizeof proto; k < sizeof sb.bytes; k++)
            ASSERT_EQ(sb.bytes[k], sb.before[k]);
    }
    khub_batch_free(b);

    khub_kernel_opts ko = {KHUB_APP_INIT(khub_kernel_opts)};
    ko.struct_size = 0; /* was the whole struct */
    khub_kernel_result kr = {KHUB_APP_INIT(khub_kernel_result)};
    expect_small(khub_kernel_fetch(hub, t.rt, "org/k", &ko, &kr), khub_runtime_errmsg(t.rt),
                 "khub_kernel_fetch", "opts", 0, SIZE_TO(khub_kernel_opts, allow_name_mismatch));

    khub_lock *lock = NULL;
    ASSERT_OK(khub_lock_new(&lock));
    khub_hub_id hid;
    ASSERT_OK(khub_hub_id_parse("org/k", &hid, NULL, 0));
    khub_lock_opts lo = {KHUB_APP_INIT(khub_lock_opts)};
    lo.struct_size = 8;
    expect_small(khub_lock_kernel(hub, lock, &hid, &lo, NULL), khub_hub_errmsg(hub),
                 "khub_lock_kernel", "opts", 8, SIZE_TO(khub_lock_opts, allow_downgrade));
    khub_lock_free(lock);
    khub_hub_free(hub);
    tiny_close(&t);
}

#define TEST_LIST(X) \
    X(app_init_stamps_the_api_version) \
    X(runtime_hub_and_query_ignore_the_stamp) \
    X(info_and_pins_ignore_the_stamp) \
    X(too_small_is_refused_by_size) \
    X(generate_results_sized_by_the_caller) \
    X(batch_requests_sized_by_the_caller) \
    X(kernel_dir_tests_sized_by_the_caller) \
    X(plugin_info_sized_by_the_caller) \
    X(out_structs_sized_by_the_caller) \
    X(check_opts_sized_by_the_caller) \
    X(model_info_and_bindings_sized_by_the_caller) \
    X(tune_opts_sized_by_the_caller) \
    X(author_structs_sized_by_the_caller) \
    X(option_structs_refused_below_0_1)
TEST_MAIN(TEST_LIST)
