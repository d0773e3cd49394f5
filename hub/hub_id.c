/*
 * hub_id.c: the Hub ID parser, "org/name[@REV | @version=N][:symbol]".
 *
 * Repo-id rules are huggingface_hub's validate_repo_id: each part matches
 * \b[\w\-.]{1,96}\b with \w taken as ASCII (so it starts and ends with an
 * alphanumeric or '_'), and the id contains neither "--" nor ".." and does
 * not end in ".git". A kernel ID always names an org.
 *
 * Revisions follow git's check-ref-format (no space, control, ~ ^ : ? * [ \,
 * no "..", "@{", "//", no leading or trailing '/' or '.', no ".lock"
 * suffix), minus '@' (it would make "a/b@x@y" ambiguous). "version=N" is
 * reserved: it names branch vN. 40 lowercase hex digits are a commit; 40
 * hex digits with an uppercase letter are rejected rather than silently
 * taken as a branch name.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "khub/khub_hub.h"

typedef struct id_err {
    char *buf;
    size_t size;
} id_err;

static khub_status bad(id_err *e, const char *text, size_t col, const char *why)
{
    char msg[KHUB_ERROR_SIZE];
    snprintf(msg, sizeof msg, "bad Hub ID \"%.200s\": at column %zu: %s", text, col, why);
    khub__errbuf(e->buf, e->size, "%s", msg);
    return khub__fail(NULL, KHUB_STATUS_BAD_ID, "%s", msg);
}

static int is_word(int c) { return isalnum(c) || c == '_'; }

/* Checks one repo-id part text[start, end); returns the 0-based offset of
 * the first bad character relative to text, or -1 when it is fine. */
static long check_part(const char *text, size_t start, size_t end, const char **why)
{
    size_t n = end - start;
    if (n == 0) return *why = "empty name", (long)start;
    if (n > KHUB_HUB_NAME_MAX)
        return *why = "longer than 96 characters", (long)(start + KHUB_HUB_NAME_MAX);
    for (size_t i = start; i < end; i++) {
        int c = (unsigned char)text[i];
        if (!is_word(c) && c != '-' && c != '.') {
            *why = "only letters, digits, '-', '_' and '.' are allowed in a repo id";
            return (long)i;
        }
        if (i + 1 < end && (c == '-' || c == '.') && text[i + 1] == c) {
            *why = c == '-' ? "\"--\" is not allowed in a repo id" : "\"..\" is not allowed";
            return (long)i;
        }
    }
    if (!is_word((unsigned char)text[start]))
        return *why = "must start with a letter, a digit or '_'", (long)start;
    if (!is_word((unsigned char)text[end - 1]))
        return *why = "must end with a letter, a digit or '_'", (long)(end - 1);
    if (n >= 4 && strncmp(text + end - 4, ".git", 4) == 0)
        return *why = "must not end in \".git\"", (long)(end - 4);
    return -1;
}

static int is_hex40_lower(const char *s, size_t n)
{
    if (n != 40) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isdigit((unsigned char)s[i]) && !(s[i] >= 'a' && s[i] <= 'f')) return 0;
    return 1;
}

static int is_hex40_any(const char *s, size_t n)
{
    if (n != 40) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isxdigit((unsigned char)s[i])) return 0;
    return 1;
}

/* git check-ref-format, for one revision text[start, end). */
static long check_rev(const char *text, size_t start, size_t end, const char **why)
{
    size_t n = end - start;
    const char *r = text + start;
    if (n == 0) return *why = "empty revision after '@'", (long)start;
    if (n > KHUB_HUB_REV_MAX) return *why = "revision longer than 255 characters", (long)start;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)r[i];
        if (c < 0x21 || c == 0x7f || strchr("~^?*[\\@", c)) {
            *why = "revisions may not contain spaces, control characters or ~ ^ ? * [ \\ @";
            return (long)(start + i);
        }
        if (i + 1 < n && ((c == '.' && r[i + 1] == '.') || (c == '/' && r[i + 1] == '/'))) {
            *why = c == '.' ? "\"..\" is not allowed in a revision" : "\"//\" in a revision";
            return (long)(start + i);
        }
        if (c == '.' && (i == 0 || r[i - 1] == '/'))
            return *why = "a revision component may not start with '.'", (long)(start + i);
    }
    if (r[0] == '/') return *why = "a revision may not start with '/'", (long)start;
    if (r[n - 1] == '/' || r[n - 1] == '.')
        return *why = "a revision may not end with '/' or '.'", (long)(end - 1);
    if (n >= 5 && strncmp(r + n - 5, ".lock", 5) == 0)
        return *why = "a revision may not end in \".lock\"", (long)(end - 5);
    if (is_hex40_any(r, n) && !is_hex40_lower(r, n))
        return *why = "commit hashes are 40 lowercase hex digits", (long)start;
    return -1;
}

static long check_symbol(const char *text, size_t start, size_t end, const char **why)
{
    size_t n = end - start;
    if (n == 0) return *why = "empty symbol after ':'", (long)start;
    if (n > KHUB_HUB_SYMBOL_MAX) return *why = "symbol longer than 127 characters", (long)start;
    if (!isalpha((unsigned char)text[start]) && text[start] != '_')
        return *why = "a symbol starts with a letter or '_'", (long)start;
    for (size_t i = start; i < end; i++)
        if (!is_word((unsigned char)text[i]))
            return *why = "a symbol is a C identifier ([A-Za-z_][A-Za-z0-9_]*)", (long)i;
    return -1;
}

/* "version=N": N is a decimal without leading zeros, 0 <= N <= 2^31-1. */
static long parse_version(const char *text, size_t start, size_t end, int32_t *out,
                          const char **why)
{
    size_t n = end - start;
    const char *d = text + start;
    if (n == 0) return *why = "version=N needs a number", (long)start;
    if (n > 1 && d[0] == '0') return *why = "version has a leading zero", (long)start;
    long long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)d[i]))
            return *why = "version=N takes a non-negative integer", (long)(start + i);
        v = v * 10 + (d[i] - '0');
        if (v > INT32_MAX) return *why = "version number too large", (long)start;
    }
    *out = (int32_t)v;
    return -1;
}

#define CHECK(expr) \
    do { \
        long at_ = (expr); \
        if (at_ >= 0) return bad(&e, text, (size_t)at_ + 1, why); \
    } while (0)

khub_status khub_hub_id_parse(const char *text, khub_hub_id *out, char *errbuf, size_t errbuf_size)
{
    id_err e = {errbuf, errbuf_size};
    const char *why = "";
    if (!text || !out) return khub__fail(NULL, KHUB_STATUS_MISUSE, "khub_hub_id_parse: NULL");
    memset(out, 0, sizeof *out);
    out->version = -1;
    size_t len = strlen(text);
    if (len == 0) return bad(&e, text, 1, "empty; expected org/name");
    if (len > 1024) return bad(&e, text, 1025, "longer than 1024 characters");

    const char *slash = strchr(text, '/');
    size_t stop = strcspn(text, "@:");
    if (!slash || (size_t)(slash - text) > stop)
        return bad(&e, text, stop + 1, "expected org/name (the org is required)");
    size_t org_end = (size_t)(slash - text);
    size_t name_end = org_end + 1 + strcspn(text + org_end + 1, "/@:");
    if (text[name_end] == '/')
        return bad(&e, text, name_end + 1, "a Hub ID has exactly one '/' (org/name)");
    CHECK(check_part(text, 0, org_end, &why));
    CHECK(check_part(text, org_end + 1, name_end, &why));
    memcpy(out->org, text, org_end);
    memcpy(out->name, text + org_end + 1, name_end - org_end - 1);

    size_t pos = name_end;
    if (text[pos] == '@') {
        size_t rs = pos + 1, re = rs + strcspn(text + rs, "@:");
        if (text[re] == '@')
            return bad(&e, text, re + 1,
                       "only one '@' allowed: revision and version are mutually exclusive");
        if (re - rs >= 8 && strncmp(text + rs, "version=", 8) == 0) {
            CHECK(parse_version(text, rs + 8, re, &out->version, &why));
            out->rev_kind = KHUB_HUB_REV_VERSION;
            snprintf(out->revision, sizeof out->revision, "v%d", (int)out->version);
        } else {
            CHECK(check_rev(text, rs, re, &why));
            memcpy(out->revision, text + rs, re - rs);
            out->rev_kind =
                is_hex40_lower(text + rs, re - rs) ? KHUB_HUB_REV_COMMIT : KHUB_HUB_REV_NAME;
        }
        pos = re;
    }
    if (text[pos] == ':') {
        CHECK(check_symbol(text, pos + 1, len, &why));
        memcpy(out->symbol, text + pos + 1, len - pos - 1);
    }
    return KHUB_STATUS_OK;
}

khub_status khub_hub_id_format(const khub_hub_id *id, char *buf, size_t size)
{
    if (!id || !buf) return khub__fail(NULL, KHUB_STATUS_MISUSE, "khub_hub_id_format: NULL");
    int n;
    if (id->rev_kind == KHUB_HUB_REV_VERSION)
        n = snprintf(buf, size, "%s/%s@version=%d", id->org, id->name, (int)id->version);
    else if (id->rev_kind != KHUB_HUB_REV_DEFAULT)
        n = snprintf(buf, size, "%s/%s@%s", id->org, id->name, id->revision);
    else
        n = snprintf(buf, size, "%s/%s", id->org, id->name);
    if (n >= 0 && (size_t)n < size && id->symbol[0]) {
        int m = snprintf(buf + n, size - (size_t)n, ":%s", id->symbol);
        n = m < 0 ? m : n + m;
    }
    if (n < 0 || (size_t)n >= size)
        return khub__fail(NULL, KHUB_STATUS_OVERFLOW, "Hub ID does not fit in %zu bytes", size);
    return KHUB_STATUS_OK;
}

khub_status khub_hub_id_set_revision(khub_hub_id *id, const char *rev, int32_t version)
{
    if (!id) return khub__fail(NULL, KHUB_STATUS_MISUSE, "khub_hub_id_set_revision: NULL id");
    if ((rev != NULL) == (version >= 0))
        return khub__fail(NULL, KHUB_STATUS_BAD_ID,
                          "give either a revision or a version, not both or neither");
    if (id->rev_kind != KHUB_HUB_REV_DEFAULT)
        return khub__fail(NULL, KHUB_STATUS_BAD_ID,
                          "%s/%s already has @%s: revision and version are mutually exclusive",
                          id->org, id->name, id->revision);
    char text[KHUB_HUB_NAME_MAX * 2 + KHUB_HUB_REV_MAX + 32];
    if (rev)
        snprintf(text, sizeof text, "%s/%s@%s", id->org, id->name, rev);
    else
        snprintf(text, sizeof text, "%s/%s@version=%d", id->org, id->name, (int)version);
    khub_hub_id tmp;
    KHUB_FORWARD_IF_ERROR(NULL, khub_hub_id_parse(text, &tmp, NULL, 0));
    id->rev_kind = tmp.rev_kind;
    id->version = tmp.version;
    memcpy(id->revision, tmp.revision, sizeof id->revision);
    return KHUB_STATUS_OK;
}
