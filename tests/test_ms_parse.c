/*
 * test_ms_parse.c: the model server's OpenAI body reader
 * (runtime/model_server/ms_openai.c, khub__ms_parse) on bodies a client
 * chooses: a message's text parts joined in order, whatever their number
 * and sizes, and the refusal of a part that is not text. The HTTP side is
 * tests/t_model_server.sh's; fuzz_requests reads arbitrary bodies.
 */
#include <stdlib.h>
#include <string.h>

#include "json_strict.h"
#include "model_server.h"
#include "runner.h"

/* Parses body as a /v1/chat/completions body; r is the caller's to unref. */
static int parse_chat(const char *body, khub__ms_req **r, khub__ms_params *p)
{
    char why[256];
    cJSON *j = khub__json_parse_strict(body, strlen(body), why, sizeof why);
    ASSERT(j != NULL);
    *r = khub__ms_req_new();
    ASSERT(*r != NULL);
    memset(p, 0, sizeof *p);
    p->chat = 1;
    int rc = khub__ms_parse(j, *r, p);
    cJSON_Delete(j);
    return rc;
}

TEST_IMPL(ms_parse_text_parts_join_in_order)
{
    khub__ms_req *r;
    khub__ms_params p;
    ASSERT_EQ(parse_chat("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                         "\"text\":\"ab\"},{\"type\":\"text\",\"text\":\"\"},{\"text\":\"c\","
                         "\"type\":\"text\"},{\"type\":\"text\",\"text\":\"d\\u00e9\"}]}]}",
                         &r, &p),
              0);
    ASSERT_EQ(r->n_msgs, 1);
    ASSERT_STR_EQ(r->contents[0], "abcd\xc3\xa9");
    khub__ms_req_unref(r);
}

/* The shape that made the old join quadratic (strcat rescanned the joined
 * text for every part): one long part, then 25,000 empty ones and a last
 * one, within the server's 1 MiB body limit. The join must be exact; the
 * cost is not timed here (the commit that made it linear quotes it). */
TEST_IMPL(ms_parse_many_parts_after_a_long_one)
{
    enum { LONG = 300000, EMPTY = 25000 };
    static const char head[] = "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                               "\"text\":\"";
    static const char empty[] = ",{\"type\":\"text\",\"text\":\"\"}";
    static const char tail[] = ",{\"type\":\"text\",\"text\":\"z\"}]}]}";
    size_t n = strlen(head) + LONG + 2 + (size_t)EMPTY * strlen(empty) + strlen(tail);
    ASSERT_LE(n, KHUB__MS_MAX_BODY);
    char *body = malloc(n + 1), *at = body;
    ASSERT(body != NULL);
    at = stpcpy(at, head);
    memset(at, 'x', LONG);
    at = stpcpy(at + LONG, "\"}");
    for (int i = 0; i < EMPTY; i++) at = stpcpy(at, empty);
    stpcpy(at, tail);
    khub__ms_req *r;
    khub__ms_params p;
    ASSERT_EQ(parse_chat(body, &r, &p), 0);
    free(body);
    ASSERT_EQ(strlen(r->contents[0]), LONG + 1);
    ASSERT_EQ(r->contents[0][0], 'x');
    ASSERT_EQ(r->contents[0][LONG - 1], 'x');
    ASSERT_EQ(r->contents[0][LONG], 'z');
    khub__ms_req_unref(r);
}

TEST_IMPL(ms_parse_refuses_a_part_that_is_not_text)
{
    khub__ms_req *r;
    khub__ms_params p;
    ASSERT_EQ(
        parse_chat("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                   "\"text\":\"a\"},{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]}",
                   &r, &p),
        -1);
    ASSERT_STR_EQ(p.param, "messages");
    ASSERT_STR_EQ(p.why,
                  "'messages': only {\"type\": \"text\", \"text\": ...} parts are supported");
    khub__ms_req_unref(r);
}

#define TEST_LIST(X) \
    X(ms_parse_text_parts_join_in_order) \
    X(ms_parse_many_parts_after_a_long_one) \
    X(ms_parse_refuses_a_part_that_is_not_text)
TEST_MAIN(TEST_LIST)
