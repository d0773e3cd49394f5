/*
 * test_tune.c: khub_tune.h's contracts that need no model run: the
 * workload reader's statuses and messages (the file and line), the
 * built-in workload, and khub_tune_run's and the report's refusals of bad
 * arguments. tests/t_tune.sh runs the advisor itself on the tiny model.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "khub/khub_tune.h"
#include "runner.h"

static khub_status read_text(const char *text, khub_tune_workload **w, char *err)
{
    const char *path = "w.jsonl";
    FILE *f = fopen(path, "w");
    ASSERT(f != NULL);
    fputs(text, f);
    fclose(f);
    return khub_tune_workload_read(path, w, err, KHUB_ERROR_SIZE);
}

TEST_IMPL(workload_file)
{
    khub_tune_workload *w = NULL;
    char err[KHUB_ERROR_SIZE];
    ASSERT_OK(read_text("# a comment\n{\"concurrency\": 3}\n\n{\"prompt\": \"a\"}\n"
                        "{\"prompt\": \"b\", \"max_tokens\": 7}\n",
                        &w, err));
    ASSERT_EQ(khub_tune_workload_count(w), (size_t)2);
    ASSERT_EQ(khub_tune_workload_concurrency(w), 3);
    khub_tune_workload_free(w);
    w = NULL;
    ASSERT_STATUS(read_text("{\"prompt\": \"a\"}\n[1]\n", &w, err), KHUB_STATUS_PARSE);
    ASSERT(w == NULL);
    ASSERT_CONTAINS(err, "w.jsonl:2: not a JSON object");
    ASSERT_STATUS(read_text("{\"prompt\": \"a\", \"max_tokens\": 4097}\n", &w, err),
                  KHUB_STATUS_PARSE);
    ASSERT_STR_EQ(err, "w.jsonl:1: \"max_tokens\" must be an integer in [1, 4096]");
    ASSERT_STATUS(read_text("{\"concurrency\": 0}\n{\"prompt\": \"a\"}\n", &w, err),
                  KHUB_STATUS_PARSE);
    ASSERT_STR_EQ(err, "w.jsonl:1: \"concurrency\" must be an integer in [1, 256]");
    ASSERT_STATUS(read_text("{\"prompt\": \"\"}\n", &w, err), KHUB_STATUS_PARSE);
    ASSERT_STR_EQ(err, "w.jsonl:1: \"prompt\" must be a non-empty string");
    ASSERT_STATUS(read_text("", &w, err), KHUB_STATUS_PARSE);
    ASSERT_CONTAINS(err, "w.jsonl: no requests");
    ASSERT_STATUS(khub_tune_workload_read("no/such/file.jsonl", &w, err, sizeof err),
                  KHUB_STATUS_IO);
    ASSERT_CONTAINS(err, "no/such/file.jsonl: cannot open: ");
    remove("w.jsonl");
    khub_tune_workload_free(NULL);
}

TEST_IMPL(builtin_workload)
{
    khub_tune_workload *w = NULL;
    ASSERT_OK(khub_tune_workload_builtin(&w));
    ASSERT_EQ(khub_tune_workload_count(w), (size_t)6);
    ASSERT_EQ(khub_tune_workload_concurrency(w), 4);
    khub_tune_workload_free(w);
}

TEST_IMPL(bad_arguments)
{
    char err[KHUB_ERROR_SIZE];
    khub_tune_report *r = (khub_tune_report *)1;
    khub_tune_opts o = {KHUB_APP_INIT(khub_tune_opts)};
    ASSERT_STATUS(khub_tune_run(&o, &r, err, sizeof err), KHUB_STATUS_INVALID_ARG);
    ASSERT_STR_EQ(err, "khub_tune_run: no model");
    o.model = "m.gguf";
    o.goal = 7;
    ASSERT_STATUS(khub_tune_run(&o, &r, err, sizeof err), KHUB_STATUS_INVALID_ARG);
    ASSERT_STR_EQ(err, "khub_tune_run: an option is out of range");
    o.goal = KHUB_TUNE_GOAL_MEMORY;
    o.min_quality = 1.5;
    ASSERT_STATUS(khub_tune_run(&o, &r, err, sizeof err), KHUB_STATUS_INVALID_ARG);
    ASSERT_STATUS(khub_tune_run(NULL, &r, err, sizeof err), KHUB_STATUS_INVALID_ARG);
    ASSERT_STR_EQ(err, "khub_tune_run: NULL options or out");
    /* A model that does not load stops at the probe, with its message. */
    o.min_quality = 0;
    o.model = "no/such/model.gguf";
    r = NULL;
    khub_status st = khub_tune_run(&o, &r, err, sizeof err);
    ASSERT(st == KHUB_STATUS_NOT_FOUND || st == KHUB_STATUS_IO);
    ASSERT(r == NULL);
    ASSERT_CONTAINS(err, "the model does not load: load: ");
    ASSERT_CONTAINS(err, "no/such/model.gguf");
    ASSERT(khub_tune_report_render(NULL, KHUB_TUNE_FORMAT_TEXT) == NULL);
    ASSERT(khub_tune_report_khub_json(NULL) == NULL);
    ASSERT(khub_tune_report_run_flags(NULL) == NULL);
    khub_tune_report_free(NULL);
}

#define TEST_LIST(X) X(workload_file) X(builtin_workload) X(bad_arguments)
TEST_MAIN(TEST_LIST)
