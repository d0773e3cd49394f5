/* test_hub_id.c: the Hub ID parser accepts exactly the documented forms and
 * reports the column and reason of every rejection. */
#include "internal.h"
#include "khub/khub_hub.h"
#include "runner.h"

static khub_hub_id parse_ok(const char *text)
{
    khub_hub_id id;
    char err[KHUB_ERROR_SIZE] = "";
    khub_status st = khub_hub_id_parse(text, &id, err, sizeof err);
    if (st != KHUB_STATUS_OK) TEST_FAIL_("parse \"%s\": %s", text, err);
    return id;
}

static void parse_bad(const char *text, const char *col, const char *reason)
{
    khub_hub_id id;
    char err[KHUB_ERROR_SIZE] = "";
    ASSERT_STATUS(khub_hub_id_parse(text, &id, err, sizeof err), KHUB_STATUS_BAD_ID);
    ASSERT_CONTAINS(err, col);
    ASSERT_CONTAINS(err, reason);
    ASSERT_CONTAINS(khub_last_error(), reason);
}

TEST_IMPL(plain)
{
    khub_hub_id id = parse_ok("kernels-community/flash-attn2");
    ASSERT_STR_EQ(id.org, "kernels-community");
    ASSERT_STR_EQ(id.name, "flash-attn2");
    ASSERT_EQ(id.rev_kind, KHUB_HUB_REV_DEFAULT);
    ASSERT_EQ(id.version, -1);
    ASSERT_STR_EQ(id.revision, "");
    ASSERT_STR_EQ(id.symbol, "");
}

TEST_IMPL(revision_forms)
{
    khub_hub_id id = parse_ok("org/name@main");
    ASSERT_EQ(id.rev_kind, KHUB_HUB_REV_NAME);
    ASSERT_STR_EQ(id.revision, "main");
    id = parse_ok("org/name@v1.0.0");
    ASSERT_STR_EQ(id.revision, "v1.0.0");
    id = parse_ok("org/name@refs/pr/1");
    ASSERT_STR_EQ(id.revision, "refs/pr/1");
    id = parse_ok("org/name@0123456789abcdef0123456789abcdef01234567");
    ASSERT_EQ(id.rev_kind, KHUB_HUB_REV_COMMIT);
    id = parse_ok("org/name@0123456789abcdef0123456789abcdef0123456"); /* 39: a name */
    ASSERT_EQ(id.rev_kind, KHUB_HUB_REV_NAME);
}

TEST_IMPL(version_and_symbol)
{
    khub_hub_id id = parse_ok("org/name@version=12:flash_attn");
    ASSERT_EQ(id.rev_kind, KHUB_HUB_REV_VERSION);
    ASSERT_EQ(id.version, 12);
    ASSERT_STR_EQ(id.revision, "v12");
    ASSERT_STR_EQ(id.symbol, "flash_attn");
    id = parse_ok("org/name:_sym1");
    ASSERT_STR_EQ(id.symbol, "_sym1");
    ASSERT_EQ(id.rev_kind, KHUB_HUB_REV_DEFAULT);
    id = parse_ok("org/name@version=0");
    ASSERT_EQ(id.version, 0);
    id = parse_ok("org/name@feature/x:f");
    ASSERT_STR_EQ(id.revision, "feature/x");
    ASSERT_STR_EQ(id.symbol, "f");
}

TEST_IMPL(repo_charset)
{
    parse_ok("A_b.c-d/x.Y_z-9");
    parse_ok("_/_");
    char name[200];
    memset(name, 'a', 96);
    name[96] = '\0';
    char text[300];
    snprintf(text, sizeof text, "org/%s", name);
    parse_ok(text);
    snprintf(text, sizeof text, "org/%sa", name);
    parse_bad(text, "column 101", "longer than 96");
    parse_bad("org/na me", "column 7", "only letters");
    parse_bad("org/n+m", "column 6", "only letters");
    parse_bad("org/na--me", "column 7", "\"--\"");
    parse_bad("org/na..me", "column 7", "\"..\"");
    parse_bad("org/-name", "column 5", "must start");
    parse_bad("org/name.", "column 9", "must end");
    parse_bad("org/name.git", "column 9", ".git");
    parse_bad(".org/name", "column 1", "must start");
    parse_bad("org/caf\xc3\xa9", "column 8", "only letters");
}

TEST_IMPL(structure_errors)
{
    parse_bad("", "column 1", "empty");
    parse_bad("name", "column 5", "org is required");
    parse_bad("name@main/x", "column 5", "org is required");
    parse_bad("/name", "column 1", "empty name");
    parse_bad("org/", "column 5", "empty name");
    parse_bad("a/b/c", "column 4", "exactly one '/'");
    parse_bad("org/name@", "column 10", "empty revision");
    parse_bad("org/name:", "column 10", "empty symbol");
    parse_bad("org/name@main@v2", "column 14", "mutually exclusive");
    parse_bad("org/name@version=1@main", "column 19", "mutually exclusive");
}

TEST_IMPL(revision_errors)
{
    parse_bad("org/name@a..b", "column 11", "\"..\"");
    parse_bad("org/name@a b", "column 11", "spaces");
    parse_bad("org/name@a~1", "column 11", "~");
    parse_bad("org/name@/x", "column 10", "start with '/'");
    parse_bad("org/name@x/", "column 11", "end with");
    parse_bad("org/name@a//b", "column 11", "//");
    parse_bad("org/name@.hidden", "column 10", "start with '.'");
    parse_bad("org/name@x.lock", "column 11", ".lock");
    parse_bad("org/name@0123456789ABCDEF0123456789abcdef01234567", "column 10", "lowercase");
    parse_bad("org/name@version=", "column 18", "needs a number");
    parse_bad("org/name@version=01", "column 18", "leading zero");
    parse_bad("org/name@version=-1", "column 18", "non-negative");
    parse_bad("org/name@version=1x", "column 19", "non-negative");
    parse_bad("org/name@version=99999999999", "column 18", "too large");
}

TEST_IMPL(symbol_errors)
{
    parse_bad("org/name:1abc", "column 10", "starts with a letter");
    parse_bad("org/name:a-b", "column 11", "C identifier");
    parse_bad("org/name@main:a:b", "column 16", "C identifier");
}

TEST_IMPL(format_roundtrip)
{
    const char *forms[] = {
        "org/name",           "org/name@main",
        "org/name@version=3", "org/name@version=3:sym",
        "org/name:sym",       "org/name@0123456789abcdef0123456789abcdef01234567"};
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        khub_hub_id id = parse_ok(forms[i]);
        char buf[512];
        ASSERT_OK(khub_hub_id_format(&id, buf, sizeof buf));
        ASSERT_STR_EQ(buf, forms[i]);
    }
    khub_hub_id id = parse_ok("org/name@main");
    char small[8];
    ASSERT_STATUS(khub_hub_id_format(&id, small, sizeof small), KHUB_STATUS_OVERFLOW);
}

TEST_IMPL(set_revision_exclusive)
{
    khub_hub_id id = parse_ok("org/name");
    ASSERT_OK(khub_hub_id_set_revision(&id, NULL, 2));
    ASSERT_STR_EQ(id.revision, "v2");
    ASSERT_STATUS(khub_hub_id_set_revision(&id, "main", -1), KHUB_STATUS_BAD_ID);
    ASSERT_CONTAINS(khub_last_error(), "mutually exclusive");
    id = parse_ok("org/name");
    ASSERT_STATUS(khub_hub_id_set_revision(&id, "main", 1), KHUB_STATUS_BAD_ID);
    ASSERT_CONTAINS(khub_last_error(), "not both");
    ASSERT_STATUS(khub_hub_id_set_revision(&id, "bad..rev", -1), KHUB_STATUS_BAD_ID);
    ASSERT_CONTAINS(khub_last_error(), "\"..\"");
    ASSERT_OK(khub_hub_id_set_revision(&id, "v1.2", -1));
    ASSERT_EQ(id.rev_kind, KHUB_HUB_REV_NAME);
}

#define TEST_LIST(X) \
    X(plain) \
    X(revision_forms) \
    X(version_and_symbol) \
    X(repo_charset) \
    X(structure_errors) \
    X(revision_errors) \
    X(symbol_errors) \
    X(format_roundtrip) \
    X(set_revision_exclusive)
TEST_MAIN(TEST_LIST)
