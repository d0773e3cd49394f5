/*
 * test_kernel_mapping.c: khub.json: both rule forms, per-device and
 * capability-range choice (narrowest wins), the kernel list for locking, and
 * every refusal with the field it names.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_mapping.h"
#include "runner.h"

static khub_status parse(const char *json, khub_mapping **m, char *err)
{
    return khub__mapping_parse(json, strlen(json), m, err, KHUB_ERROR_SIZE);
}

TEST_IMPL(rules_and_pick)
{
    const char *j =
        "{\"format\":1,\"roles\":{"
        "\"attention\":\"kernels-community/flash-attn2@version=1:flash_attn\","
        "\"norm\":{\"cpu\":{\"repo\":\"kernels-community/rmsnorm\",\"version\":1},"
        "\"cuda\":[{\"repo\":\"acme/wide\",\"revision\":\"main\",\"capability\":[70,120]},"
        "{\"repo\":\"acme/narrow\",\"version\":3,\"capability\":[80,90]}]}},"
        "\"dependencies\":{\"kernels-community/kv-cache\":{\"version\":1}}}";
    khub_mapping *m = NULL;
    char err[KHUB_ERROR_SIZE];
    ASSERT_OK(parse(j, &m, err));
    const khub_map_rule *r = khub__mapping_pick(m, KHUB_ROLE_ATTENTION, KHUB_DEVICE_CPU, 0);
    ASSERT(r != NULL);
    ASSERT_EQ(r->id.version, 1);
    ASSERT_STR_EQ(r->id.symbol, "flash_attn");
    r = khub__mapping_pick(m, KHUB_ROLE_NORM, KHUB_DEVICE_CUDA, 86);
    ASSERT_STR_EQ(r->id.name, "narrow");
    r = khub__mapping_pick(m, KHUB_ROLE_NORM, KHUB_DEVICE_CUDA, 75);
    ASSERT_STR_EQ(r->id.name, "wide");
    ASSERT(khub__mapping_pick(m, KHUB_ROLE_NORM, KHUB_DEVICE_CUDA, 121) == NULL);
    ASSERT_STR_EQ(khub__mapping_pick(m, KHUB_ROLE_NORM, KHUB_DEVICE_CPU, 0)->id.name, "rmsnorm");
    ASSERT(khub__mapping_pick(m, KHUB_ROLE_ROTARY, KHUB_DEVICE_CPU, 0) == NULL);
    const char *ids[32];
    size_t n = khub__mapping_kernels(m, ids, 32);
    ASSERT_EQ(n, (size_t)5); /* flash-attn2, rmsnorm, wide, narrow, kv-cache */
    ASSERT_CONTAINS(ids[4], "kernels-community/kv-cache");
    free(m);
}

static void refused(const char *json, khub_status st, const char *needle)
{
    khub_mapping *m = NULL;
    char err[KHUB_ERROR_SIZE];
    ASSERT_STATUS(parse(json, &m, err), st);
    ASSERT(m == NULL);
    ASSERT_CONTAINS(err, needle);
}

TEST_IMPL(errors_name_the_field)
{
    refused("{\"format\":1,\"roles\":{\"attn\":\"a/b@v1\"}}", KHUB_STATUS_PARSE,
            "roles.attn: unknown role");
    refused("{\"format\":1,\"roles\":{\"norm\":{\"xpu\":\"a/b@v1\"}}}", KHUB_STATUS_PARSE,
            "roles.norm.xpu: unknown device type \"xpu\"");
    refused("{\"format\":1,\"roles\":{\"norm\":{\"cpu\":{\"repo\":\"a/b\",\"version\":1,"
            "\"revision\":\"main\"}}}}",
            KHUB_STATUS_PARSE, "roles.norm.cpu.repo: both \"version\" and \"revision\"");
    refused("{\"format\":1,\"roles\":{\"norm\":\"a//b\"}}", KHUB_STATUS_BAD_ID,
            "roles.norm: bad Hub ID \"a//b\": at column");
    refused("{\"format\":1,\"roles\":{\"norm\":{\"cuda\":[{\"repo\":\"a/b\",\"version\":1,"
            "\"capability\":[90,80]}]}}}",
            KHUB_STATUS_PARSE, "roles.norm.cuda[0].capability must be [min, max]");
    refused("{\"format\":1,\"roles\":{\"norm\":{\"cpu\":{\"repo\":\"a/b@v1\",\"version\":1}}}}",
            KHUB_STATUS_PARSE, "already has a revision");
    refused("{\"format\":1,\"dependencies\":{\"a/b\":{}}}", KHUB_STATUS_PARSE,
            "dependencies.a/b: needs \"version\" or \"revision\"");
    refused("{\"format\":1,\"kernels\":{}}", KHUB_STATUS_PARSE,
            "unknown top-level field \"kernels\"");
    refused("[]", KHUB_STATUS_PARSE, "not a JSON object");
}

/* The names `khub run --attn/--quant/--cache` take are accepted as rules
 * (issue 17: `khub tune` writes them), kept as built-in names, and never
 * listed as kernels to fetch or lock; a word that is none is refused with
 * the role's list. */
TEST_IMPL(builtin_names)
{
    khub_mapping *m = NULL;
    char err[KHUB_ERROR_SIZE];
    ASSERT_STATUS(parse("{\"format\":1,\"roles\":{\"attention\":\"eager\",\"quantization\":"
                        "\"nf4\",\"cache\":\"quantized-int4,q_group_size=32\",\"norm\":"
                        "\"kernels-community/rmsnorm@version=1\"}}",
                        &m, err),
                  KHUB_STATUS_OK);
    const khub_map_rule *r = khub__mapping_pick(m, KHUB_ROLE_CACHE, KHUB_DEVICE_CPU, 0);
    ASSERT(r != NULL && r->builtin == 1);
    ASSERT_STR_EQ(r->text, "quantized-int4,q_group_size=32");
    r = khub__mapping_pick(m, KHUB_ROLE_QUANT, KHUB_DEVICE_CPU, 0);
    ASSERT(r != NULL && r->builtin == 1);
    ASSERT_STR_EQ(r->text, "nf4");
    const char *ids[32];
    ASSERT_EQ(khub__mapping_kernels(m, ids, 32), (size_t)1); /* rmsnorm only */
    ASSERT_CONTAINS(ids[0], "kernels-community/rmsnorm");
    free(m);
    refused(
        "{\"format\":1,\"roles\":{\"cache\":\"nf4\"}}", KHUB_STATUS_BAD_ID,
        "khub.json: roles.cache: \"nf4\" is neither a Hub ID (org/name[@REV|@version=N][:symbol]) "
        "nor a built-in name "
        "(dynamic, static, quantized, quantized-int8, quantized-int4, paged, sliding, "
        "sliding_window, offloaded)");
    refused("{\"format\":1,\"roles\":{\"norm\":\"fast\"}}", KHUB_STATUS_BAD_ID,
            "roles.norm: \"fast\" is neither a Hub ID (org/name[@REV|@version=N][:symbol]) nor a "
            "built-in name (the role has none)");
    refused("{\"format\":1,\"roles\":{\"attention\":\"eagerly\"}}", KHUB_STATUS_BAD_ID,
            "(eager, sdpa)");
}

#define TEST_LIST(X) X(rules_and_pick) X(errors_name_the_field) X(builtin_names)
TEST_MAIN(TEST_LIST)
