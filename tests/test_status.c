/* test_status.c: every status code has a distinct, non-empty name and text. */
#include "internal.h"
#include "runner.h"

static const khub_status all[] = {
#define X(name, value, text) KHUB_STATUS_##name,
    KHUB_STATUS_MAP(X)
#undef X
};
#define N_ALL (sizeof all / sizeof all[0])

TEST_IMPL(names_distinct_and_prefixed)
{
    for (size_t i = 0; i < N_ALL; i++) {
        const char *ni = khub_status_name(all[i]);
        ASSERT(strncmp(ni, "KHUB_STATUS_", 12) == 0);
        ASSERT(strlen(ni) > 12);
        for (size_t j = i + 1; j < N_ALL; j++) ASSERT(strcmp(ni, khub_status_name(all[j])) != 0);
    }
}

TEST_IMPL(texts_distinct_and_nonempty)
{
    for (size_t i = 0; i < N_ALL; i++) {
        const char *ti = khub_status_str(all[i]);
        ASSERT(ti[0] != '\0');
        ASSERT(strchr(ti, '\n') == NULL);
        for (size_t j = i + 1; j < N_ALL; j++) ASSERT(strcmp(ti, khub_status_str(all[j])) != 0);
    }
}

TEST_IMPL(values_grouped_and_frozen)
{
    /* Renumbering a published code is an ABI break; these pin a few. */
    ASSERT_EQ(KHUB_STATUS_OK, 0);
    ASSERT_EQ(KHUB_STATUS_NOMEM, 3);
    ASSERT_EQ(KHUB_STATUS_NETWORK, 100);
    ASSERT_EQ(KHUB_STATUS_DIGEST_MISMATCH, 200);
    ASSERT_EQ(KHUB_STATUS_NOT_ELF, 300);
    ASSERT_EQ(KHUB_STATUS_ABI_MAJOR, 304);
    ASSERT_EQ(KHUB_STATUS_MODEL_INVALID, 400);
    for (size_t i = 0; i < N_ALL; i++) ASSERT(all[i] < KHUB_STATUS__COUNT);
}

TEST_IMPL(unknown_status)
{
    ASSERT_STR_EQ(khub_status_name((khub_status)9999), "KHUB_STATUS_UNKNOWN");
    ASSERT_STR_EQ(khub_status_str((khub_status)-1), "unknown status");
}

TEST_IMPL(version_matches_header)
{
    ASSERT_EQ(khub_version_num(), KHUB_VERSION_NUM);
    ASSERT_STR_EQ(khub_version_str(), KHUB_VERSION_STRING);
    ASSERT(KHUB_VERSION_AT_LEAST(0, 1, 0));
    ASSERT(!KHUB_VERSION_AT_LEAST(99, 0, 0));
}

#define TEST_LIST(X) \
    X(names_distinct_and_prefixed) \
    X(texts_distinct_and_nonempty) \
    X(values_grouped_and_frozen) \
    X(unknown_status) \
    X(version_matches_header)
TEST_MAIN(TEST_LIST)
