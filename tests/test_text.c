/* test_text.c: khub__concat, strings joined into a fixed buffer: the
 * joined text when it fits, false and the first size - 1 bytes when it
 * does not, at every size around the boundary. */
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "runner.h"

TEST_IMPL(concat_joins_what_fits)
{
    char buf[32];
    ASSERT(KHUB__CONCAT(buf, "/cache", "/", "kernels--org--name"));
    ASSERT_STR_EQ(buf, "/cache/kernels--org--name");
    ASSERT(KHUB__CONCAT(buf, ""));
    ASSERT_STR_EQ(buf, "");
    ASSERT(KHUB__CONCAT(buf, "", "a", "", "b"));
    ASSERT_STR_EQ(buf, "ab");
}

/* "abc" + "defg" needs 8 bytes: every smaller buffer gets false and the
 * first size - 1 bytes, as snprintf would cut it. */
TEST_IMPL(concat_reports_what_does_not_fit)
{
    for (size_t size = 1; size <= 9; size++) {
        char buf[16], want[16];
        memset(buf, 'x', sizeof buf);
        snprintf(want, size, "%s%s", "abc", "defg");
        bool fits = khub__concat(buf, size, (const char *const[]){"abc", "defg", NULL});
        ASSERT_EQ(fits, size >= 8);
        ASSERT_STR_EQ(buf, want);
        ASSERT_EQ(buf[size], 'x'); /* nothing written past size bytes */
    }
}

#define TEST_LIST(X) \
    X(concat_joins_what_fits) \
    X(concat_reports_what_does_not_fit)
TEST_MAIN(TEST_LIST)
