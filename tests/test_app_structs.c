/*
 * test_app_structs.c: application structs are versioned by struct_size alone
 * (abi/ABI.md, "The application API"), not by the plugin ABI's numbers. This
 * file is built as an old caller targeting plugin ABI 1.0 would be
 * (KHUB_PLUGIN_TARGET_MINOR 0, so KHUB_STRUCT_INIT stamps 1.0), and every
 * application struct is also handed over with stamps no plugin ABI has
 * (2.7, 0.0, 1.99): each is accepted the same. KHUB_APP_INIT stamps the
 * application API's version, and a struct below 0.1's size is still
 * refused by its size.
 */
#define KHUB_PLUGIN_TARGET_MINOR 0

#include <stdio.h>
#include <string.h>

#include "khub/khub.h"
#include "khub/khub_hub.h"
#include "khub/khub_kernels.h"
#include "khub/khub_model.h"
#include "khub/khub_project.h"
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
        khub_lock_pin pin = {KHUB_STRUCT_INIT(khub_lock_pin)};
        STAMP(pin, i);
        ASSERT_OK(khub_lock_pin_at(lock, 0, &pin));
        ASSERT_STR_EQ(pin.repo, "org/k");
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
    ASSERT_STR_EQ(khub_last_error(), "khub_runtime_opts: struct_size 8 is below 0.1's 48");
}

#define TEST_LIST(X) \
    X(app_init_stamps_the_api_version) \
    X(runtime_hub_and_query_ignore_the_stamp) \
    X(info_and_pins_ignore_the_stamp) \
    X(too_small_is_refused_by_size)
TEST_MAIN(TEST_LIST)
