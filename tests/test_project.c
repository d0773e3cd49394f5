/*
 * test_project.c: the public project API (khub_project.h) on its own: khub.json
 * parsed and queried through khub_mapping_*, khub.lock made, saved, loaded
 * and read through khub_lock_*, the Python kernels.lock import, and the hub
 * operations (lock a kernel, refuse a downgrade with its status and
 * message, sync, outdated) against an in-process `khub serve`. Errors are
 * checked by status and message, in errbuf and in khub_last_error().
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hub_fixture.h"
#include "khub/khub_project.h"
#include "runner.h"

static const char mapping_json[] =
    "{\"format\": 1, \"roles\": {"
    "\"attention\": \"kernels-community/flash-attn2@version=1\","
    "\"norm\": {\"cpu\": {\"repo\": \"kernels-community/rmsnorm\", \"version\": 2},"
    "          \"cuda\": [{\"repo\": \"acme/norm-wide\", \"capability\": [70, 90]},"
    "                     {\"repo\": \"acme/norm-narrow\", \"revision\": \"main\","
    "                      \"capability\": [80, 80]}]}},"
    "\"dependencies\": {\"kernels-community/kv-cache\": {\"version\": 1}}}";

TEST_IMPL(mapping_parse_pick_and_list)
{
    khub_mapping *m = NULL;
    char err[KHUB_ERROR_SIZE];
    ASSERT_OK(khub_mapping_parse(mapping_json, sizeof mapping_json - 1, &m, err, sizeof err));
    ASSERT_STR_EQ(khub_mapping_pick(m, KHUB_KERNEL_ROLE_ATTENTION, KHUB_DEVICE_CPU, 0),
                  "kernels-community/flash-attn2@version=1");
    ASSERT_STR_EQ(khub_mapping_pick(m, KHUB_KERNEL_ROLE_NORM, KHUB_DEVICE_CPU, 0),
                  "kernels-community/rmsnorm@version=2");
    /* the narrowest capability range that holds cc wins */
    ASSERT_STR_EQ(khub_mapping_pick(m, KHUB_KERNEL_ROLE_NORM, KHUB_DEVICE_CUDA, 80),
                  "acme/norm-narrow@main");
    ASSERT_STR_EQ(khub_mapping_pick(m, KHUB_KERNEL_ROLE_NORM, KHUB_DEVICE_CUDA, 75),
                  "acme/norm-wide");
    ASSERT(khub_mapping_pick(m, KHUB_KERNEL_ROLE_NORM, KHUB_DEVICE_CUDA, 100) == NULL);
    ASSERT(khub_mapping_pick(m, KHUB_KERNEL_ROLE_CACHE, KHUB_DEVICE_CPU, 0) == NULL);
    ASSERT_EQ(khub_mapping_kernel_count(m), 5u);
    ASSERT_STR_EQ(khub_mapping_kernel(m, 0), "kernels-community/flash-attn2@version=1");
    ASSERT_STR_EQ(khub_mapping_kernel(m, 4), "kernels-community/kv-cache@version=1");
    ASSERT(khub_mapping_kernel(m, 5) == NULL);
    khub_mapping_free(m);
    khub_mapping_free(NULL);
}

TEST_IMPL(mapping_errors_name_the_field)
{
    static const char bad_role[] = "{\"format\":1,\"roles\":{\"attn\":\"a/b\"}}";
    khub_mapping *m = NULL;
    char err[KHUB_ERROR_SIZE];
    ASSERT_STATUS(khub_mapping_parse(bad_role, sizeof bad_role - 1, &m, err, sizeof err),
                  KHUB_STATUS_PARSE);
    ASSERT(m == NULL);
    ASSERT_STR_EQ(err, "khub.json: roles.attn: unknown role (known: attention, quantization, "
                       "cache, norm, activation, rotary, linear, embedding)");
    ASSERT_STR_EQ(khub_last_error(), err);
    static const char bad_id[] = "{\"format\":1,\"roles\":{\"norm\":\"a//b\"}}";
    ASSERT_STATUS(khub_mapping_parse(bad_id, sizeof bad_id - 1, &m, err, sizeof err),
                  KHUB_STATUS_BAD_ID);
    ASSERT_CONTAINS(err, "khub.json: roles.norm: bad Hub ID \"a//b\"");
    ASSERT_STATUS(khub_mapping_load("/nonexistent/khub.json", &m, NULL, 0), KHUB_STATUS_NOT_FOUND);
    ASSERT_CONTAINS(khub_last_error(), "/nonexistent/khub.json");
}

#define HA "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

TEST_IMPL(lock_parse_save_load_and_pins)
{
    static const char text[] =
        "{\"format\":1,\"kernels\":[{\"repo\":\"org/k\",\"version\":3,\"commit\":\"" C1
        "\",\"kernel_version\":\"3.1.0\",\"variants\":{}},"
        "{\"repo\":\"org/r\",\"revision\":\"stable\",\"commit\":\"" C2 "\",\"variants\":{}}]}";
    khub_lock *lock = NULL, *again = NULL;
    char err[KHUB_ERROR_SIZE], path[] = "/tmp/khub-test-project-XXXXXX";
    ASSERT_OK(khub_lock_parse(text, sizeof text - 1, &lock, err, sizeof err));
    ASSERT_EQ(khub_lock_count(lock), 2u);
    int fd = mkstemp(path);
    ASSERT(fd >= 0);
    close(fd);
    ASSERT_OK(khub_lock_save(lock, path, err, sizeof err));
    ASSERT_OK(khub_lock_load(path, &again, err, sizeof err));
    unlink(path);
    khub_lock_pin p = {KHUB_APP_INIT(khub_lock_pin)};
    ASSERT_OK(khub_lock_pin_at(again, 0, &p));
    ASSERT_STR_EQ(p.repo, "org/k");
    ASSERT_EQ(p.version, 3);
    ASSERT_STR_EQ(p.revision, "");
    ASSERT_STR_EQ(p.commit, C1);
    ASSERT_STR_EQ(p.kernel_version, "3.1.0");
    ASSERT_EQ(p.n_variants, 0u);
    khub_hub_id id;
    char idtext[512];
    ASSERT_OK(khub_lock_pin_id(&p, &id));
    ASSERT_OK(khub_hub_id_format(&id, idtext, sizeof idtext));
    ASSERT_STR_EQ(idtext, "org/k@version=3");
    ASSERT_OK(khub_lock_pin_find(again, "org/r", &p));
    ASSERT_EQ(p.version, -1);
    ASSERT_STR_EQ(p.revision, "stable");
    ASSERT_OK(khub_lock_pin_id(&p, &id));
    ASSERT_OK(khub_hub_id_format(&id, idtext, sizeof idtext));
    ASSERT_STR_EQ(idtext, "org/r@stable");
    ASSERT_STATUS(khub_lock_pin_find(again, "org/none", &p), KHUB_STATUS_NOT_FOUND);
    ASSERT_STR_EQ(khub_last_error(), "org/none is not in the lock");
    ASSERT_STATUS(khub_lock_pin_at(again, 2, &p), KHUB_STATUS_NOT_FOUND);
    p.struct_size = 8; /* older than 0.1: refused, nothing written */
    ASSERT_STATUS(khub_lock_pin_at(again, 0, &p), KHUB_STATUS_STRUCT_SIZE);
    khub_lock_free(lock);
    khub_lock_free(again);
    khub_lock_free(NULL);

    static const char bad[] =
        "{\"format\":1,\"kernels\":[{\"repo\":\"org/k\",\"version\":1,\"commit\":\"xyz\"}]}";
    ASSERT_STATUS(khub_lock_parse(bad, sizeof bad - 1, &lock, err, sizeof err), KHUB_STATUS_PARSE);
    ASSERT_STR_EQ(err, "kernels[0].commit must be 40 lowercase hex digits");
    ASSERT_STR_EQ(khub_last_error(), err);
}

TEST_IMPL(import_python_lock)
{
    char path[] = "/tmp/khub-test-kernels-lock-XXXXXX", notes[1024], err[KHUB_ERROR_SIZE];
    int fd = mkstemp(path);
    ASSERT(fd >= 0);
    static const char text[] =
        "[{\"dependency\":{\"repo-id\":\"kernels-community/activation\",\"version\":1},"
        "\"lock\":{\"commit\":\"" C1 "\"}}]";
    ASSERT_EQ(write(fd, text, sizeof text - 1), (ssize_t)(sizeof text - 1));
    close(fd);
    khub_lock *lock = NULL;
    ASSERT_OK(khub_lock_import_python(path, &lock, notes, sizeof notes, err, sizeof err));
    ASSERT_EQ(khub_lock_count(lock), 1u);
    khub_lock_pin p = {KHUB_APP_INIT(khub_lock_pin)};
    ASSERT_OK(khub_lock_pin_at(lock, 0, &p));
    ASSERT_STR_EQ(p.repo, "kernels-community/activation");
    ASSERT_EQ(p.version, 1);
    ASSERT_STR_EQ(p.commit, C1);
    khub_lock_free(lock);
    FILE *f = fopen(path, "w");
    fputs("{\"not\": \"an array\"}", f);
    fclose(f);
    ASSERT_STATUS(khub_lock_import_python(path, &lock, NULL, 0, err, sizeof err),
                  KHUB_STATUS_PARSE);
    ASSERT(lock == NULL);
    ASSERT(strncmp(err, path, strlen(path)) == 0); /* "PATH: ..." */
    unlink(path);
    ASSERT_STATUS(khub_lock_import_python(path, &lock, NULL, 0, err, sizeof err),
                  KHUB_STATUS_NOT_FOUND);
}

/* org/demo of the fixture: v1 -> C1 (metadata version 1.0.0), v2 -> C2. */
TEST_IMPL(lock_sync_outdated_and_downgrade)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub_lock *lock = NULL;
    ASSERT_OK(khub_lock_new(&lock));
    khub_hub_id id = fx_id("org/demo@version=1");
    khub_lock_result r = {KHUB_APP_INIT(khub_lock_result)};
    ASSERT_OK(khub_lock_kernel(hub, lock, &id, NULL, &r));
    ASSERT_STR_EQ(r.pin.repo, "org/demo");
    ASSERT_EQ(r.pin.version, 1);
    ASSERT_STR_EQ(r.pin.commit, C1);
    ASSERT_STR_EQ(r.pin.kernel_version, "1.0.0");
    ASSERT_EQ(r.pin.n_variants, 1u);
    ASSERT_EQ(r.replaced, 0);
    ASSERT_EQ(khub_lock_count(lock), 1u);

    khub_sync_result s = {KHUB_APP_INIT(khub_sync_result)};
    ASSERT_OK(khub_lock_sync(hub, lock, 0, NULL, &s));
    ASSERT_EQ(s.n_checked, 1u);
    ASSERT_STR_EQ(s.newer_version, "");
    ASSERT_STATUS(khub_lock_sync(hub, lock, 1, NULL, &s), KHUB_STATUS_NOT_FOUND);
    ASSERT_STR_EQ(khub_hub_errmsg(hub), "lock entry 1 is past the 1 pins");

    khub_outdated_result o = {KHUB_APP_INIT(khub_outdated_result)};
    ASSERT_OK(khub_lock_outdated(hub, lock, 0, &o));
    ASSERT_STR_EQ(o.now, C1);
    ASSERT_EQ(o.moved, 0);
    ASSERT_EQ(o.newest, 2);
    ASSERT_EQ(o.n_newer, 1u);
    ASSERT_EQ(o.newer[0], 2);
    int32_t versions[8];
    size_t n = 0;
    ASSERT_OK(khub_kernel_versions(hub, &id, versions, 8, &n));
    ASSERT_EQ(n, 2u);
    ASSERT_EQ(versions[0], 1);
    ASSERT_EQ(versions[1], 2);

    /* A lock that says v1 was at 1.5.0 before: the pin now resolves to the
     * older 1.0.0, its branch moved back. Refused, the lock unchanged. */
    static const char newer[] = "{\"format\":1,\"kernels\":[{\"repo\":\"org/demo\",\"version\":1,"
                                "\"commit\":\"" C2 "\",\"kernel_version\":\"1.5.0\","
                                "\"variants\":{}}]}";
    khub_lock *moved = NULL;
    ASSERT_OK(khub_lock_parse(newer, sizeof newer - 1, &moved, NULL, 0));
    ASSERT_STATUS(khub_lock_kernel(hub, moved, &id, NULL, &r), KHUB_STATUS_DOWNGRADE);
    ASSERT_STR_EQ(khub_hub_errmsg(hub),
                  "org/demo: the pin now resolves to commit 111111111111, version 1.0.0, older "
                  "than the locked 1.5.0 (commit 222222222222): the branch was moved back to an "
                  "older build; refusing to downgrade (khub_lock_opts.allow_downgrade accepts it)");
    khub_lock_pin p = {KHUB_APP_INIT(khub_lock_pin)};
    ASSERT_OK(khub_lock_pin_at(moved, 0, &p));
    ASSERT_STR_EQ(p.commit, C2);
    khub_lock_opts lo = {KHUB_APP_INIT(khub_lock_opts), .allow_downgrade = 1};
    ASSERT_OK(khub_lock_kernel(hub, moved, &id, &lo, &r));
    ASSERT_EQ(r.downgrade, 1);
    ASSERT_EQ(r.replaced, 1);
    ASSERT_STR_EQ(r.previous.kernel_version, "1.5.0");
    ASSERT_STR_EQ(r.previous.commit, C2);
    ASSERT_OK(khub_lock_pin_at(moved, 0, &p));
    ASSERT_STR_EQ(p.commit, C1);
    ASSERT_EQ(khub_lock_count(moved), 1u);

    /* A commit that is not one is refused before any request. */
    lo.commit = "not-a-commit";
    ASSERT_STATUS(khub_lock_kernel(hub, moved, &id, &lo, &r), KHUB_STATUS_INVALID_ARG);
    ASSERT_STR_EQ(khub_hub_errmsg(hub),
                  "org/demo: commit \"not-a-commit\" is not 40 lowercase hex digits");
    khub_lock_free(moved);
    khub_lock_free(lock);
    khub_hub_free(hub);
    fx_done(&fx);
}

#define TEST_LIST(X) \
    X(mapping_parse_pick_and_list) \
    X(mapping_errors_name_the_field) \
    X(lock_parse_save_load_and_pins) \
    X(import_python_lock) \
    X(lock_sync_outdated_and_downgrade)
TEST_MAIN(TEST_LIST)
