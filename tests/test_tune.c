/*
 * test_tune.c: khub_tune.h's contracts that need no model run: the
 * workload reader's statuses and messages (the file and line), the
 * built-in workload, and khub_tune_run's and the report's refusals of bad
 * arguments; and the decision step (khub__tune_recommend, a pure function
 * of the measurements) on made-up measurements: the same recommendation
 * when every number moves inside the stated noise, and no winner by less
 * than the noise + 1%. tests/t_tune.sh runs the advisor itself on the tiny
 * model.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "khub/khub_tune.h"
#include "runner.h"
#include "../runtime/tune/tune_impl.h"

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
    /* tp_size out of range; the same bytes past a 0.1 caller's struct_size
     * are not read (the run goes on to the probe and stops there). */
    o.tp_size = 1;
    ASSERT_STATUS(khub_tune_run(&o, &r, err, sizeof err), KHUB_STATUS_INVALID_ARG);
    ASSERT_STR_EQ(err, "khub_tune_run: tp_size 1 out of range (want 2..64, 0 = 2)");
    o.struct_size = (uint32_t)offsetof(khub_tune_opts, tp_size);
    st = khub_tune_run(&o, &r, err, sizeof err);
    ASSERT(st == KHUB_STATUS_NOT_FOUND || st == KHUB_STATUS_IO);
    ASSERT_CONTAINS(err, "the model does not load: load: ");
    o.struct_size = sizeof o;
    o.tp_size = 0;
    ASSERT(khub_tune_report_render(NULL, KHUB_TUNE_FORMAT_TEXT) == NULL);
    ASSERT(khub_tune_report_khub_json(NULL) == NULL);
    ASSERT(khub_tune_report_run_flags(NULL) == NULL);
    khub_tune_report_free(NULL);
}

/* ======================================================================== */
/* The decision step                                                        */
/* ======================================================================== */

/* One measured row: throughput tok/s, peak RSS MiB, greedy ids all 7. */
static void put_row(khub_tune_report *r, const char *name, double tok_s, double rss_mib)
{
    tune_row *row = &r->rows[r->n_rows++];
    memset(row, 0, sizeof *row);
    snprintf(row->name, sizeof row->name, "%s", name);
    snprintf(row->lever, sizeof row->lever, "%s", r->n_rows <= r->n_baseline ? "baseline" : "x");
    row->state = TUNE_MEASURED;
    row->m.ok = 1;
    row->m.throughput = tok_s;
    row->m.latency_ms = 1000.0 / tok_s;
    row->m.ttft_ms = 10;
    row->m.peak_rss = (uint64_t)(rss_mib * 1048576);
    row->m.n_tokens[0] = 8;
    for (int k = 0; k < 8; k++) row->m.tokens[0][k] = 7;
    if (!strncmp(name, "cache=", 6))
        snprintf(row->cfg.cache, sizeof row->cfg.cache, "%s", name + 6);
}

/* Three baseline runs of 100, 104 and 98 tok/s (noise 6.0%), then
 * candidates: far=120 (+19%, past noise + 1%), near=107.5 (+6.8%: past the
 * noise alone, not past noise + 1%), flat=101. With d > 0, baseline run 1
 * is 101 + 2.5 j[0] and candidate k's value is times (1 + j[k] d), j in
 * [-1, 1] from the caller. */
static khub_tune_report *made_up(const double *j, double d, int with_far)
{
    khub_tune_report *r = calloc(1, sizeof *r);
    ASSERT(r != NULL);
    r->goal = KHUB_TUNE_GOAL_THROUGHPUT;
    r->min_quality = 0.9;
    r->n_baseline = 3;
    /* The band's ends make the stated noise; run 1 moves inside it, the
     * candidates by up to d. */
    put_row(r, "baseline", d > 0 ? 101 + 2.5 * j[0] : 100, 300);
    put_row(r, "baseline", 104, 300);
    put_row(r, "baseline", 98, 300);
    if (with_far) put_row(r, "cache=quantized", 120 * (1 + j[3] * d), 290);
    put_row(r, "cache=static", 107.5 * (1 + j[4] * d), 300);
    put_row(r, "cache=paged", 101 * (1 + j[5] * d), 300);
    return r;
}

/* The same measurements give the same answer; moved inside the noise, too. */
TEST_IMPL(decision_stable_inside_noise)
{
    const double zero[6] = {0};
    khub_tune_report *r = made_up(zero, 0, 1);
    khub__tune_recommend(r);
    ASSERT(r->noise[1] > 0.059 && r->noise[1] < 0.060);
    ASSERT_STR_EQ(r->rows[r->recommended].name, "cache=quantized");
    ASSERT_EQ(r->rows[3].winner, 1);
    ASSERT_CONTAINS(r->rows[3].verdict, "winner: throughput +19.2% (noise + 1%: 7.0%)");
    ASSERT_EQ(r->rows[4].winner, 0);
    ASSERT_STR_EQ(r->rows[4].verdict, "no win: throughput +6.8%, within the noise + 1% (7.0%)");
    ASSERT_EQ(r->rows[5].winner, 0);
    ASSERT_STR_EQ(r->run_flags, "--cache quantized");
    ASSERT_CONTAINS(r->khub_json, "\"cache\":\t\"quantized\"");
    char json[sizeof r->khub_json], verdicts[3][256];
    memcpy(json, r->khub_json, sizeof json);
    for (int i = 0; i < 3; i++) memcpy(verdicts[i], r->rows[3 + i].verdict, 256);
    khub__tune_recommend(r); /* again on the same numbers: the same words */
    ASSERT_STR_EQ(r->khub_json, json);
    for (int i = 0; i < 3; i++) ASSERT_STR_EQ(r->rows[3 + i].verdict, verdicts[i]);
    free(r);
    /* 500 draws (a fixed seed), each number moved by up to half the noise:
     * the recommendation never changes. */
    srand(17);
    for (int t = 0; t < 500; t++) {
        double j[6] = {0};
        for (int k = 0; k < 6; k++) j[k] = 2.0 * rand() / RAND_MAX - 1;
        r = made_up(j, 0.03, 1);
        khub__tune_recommend(r);
        ASSERT_STR_EQ(r->rows[r->recommended].name, "cache=quantized");
        ASSERT_STR_EQ(r->khub_json, json);
        free(r);
    }
}

/* A winner by more than the noise but less than the noise + 1% is not
 * recommended: the baseline is kept. */
TEST_IMPL(decision_margin_is_noise_plus_one_percent)
{
    const double zero[6] = {0};
    khub_tune_report *r = made_up(zero, 0, 0);
    khub__tune_recommend(r);
    ASSERT(r->rows[3].gain > r->noise[1]);        /* beats the noise alone */
    ASSERT(r->rows[3].gain < r->noise[1] + 0.01); /* not the noise + 1% */
    ASSERT_EQ(r->rows[3].winner, 0);
    ASSERT_EQ(r->recommended, 0);
    ASSERT_STR_EQ(r->run_flags, "(none: the defaults)");
    free(r);
    /* One baseline run: noise 0, and still a 1% margin. */
    r = calloc(1, sizeof *r);
    ASSERT(r != NULL);
    r->goal = KHUB_TUNE_GOAL_THROUGHPUT;
    r->min_quality = 0.9;
    r->n_baseline = 1;
    put_row(r, "baseline", 100, 300);
    put_row(r, "cache=static", 100.9, 300);
    khub__tune_recommend(r);
    ASSERT_EQ(r->noise[1], 0.0);
    ASSERT_EQ(r->recommended, 0);
    r->rows[1].m.throughput = 101.2;
    khub__tune_recommend(r);
    ASSERT_EQ(r->recommended, 1);
    /* A winner whose tokens differ from the baseline's is rejected. */
    r->rows[1].m.tokens[0][0] = 8;
    khub__tune_recommend(r);
    ASSERT_EQ(r->recommended, 0);
    ASSERT_STR_EQ(r->rows[1].verdict, "rejected: token agreement 0% is below the minimum 90%");
    free(r);
}

/* A configuration from a --kernels-from khub.json saves that file's roles
 * (Hub IDs included) with the one-role changes on top. */
TEST_IMPL(saved_json_keeps_the_mapping_roles)
{
    FILE *f = fopen("map.json", "w");
    ASSERT(f != NULL);
    fputs("{\"format\": 1, \"roles\": {\"attention\": \"kernels-community/flash-attn2\", "
          "\"cache\": \"static\"}}\n",
          f);
    fclose(f);
    tune_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.kernels, sizeof c.kernels, "map.json");
    snprintf(c.cache, sizeof c.cache, "quantized");
    char buf[1024];
    khub__tune_config_json(&c, buf, sizeof buf);
    ASSERT_STR_EQ(buf,
                  "{\n\t\"format\":\t1,\n\t\"roles\":\t{\n\t\t\"attention\":\t"
                  "\"kernels-community/flash-attn2\",\n\t\t\"cache\":\t\"quantized\"\n\t}\n}\n");
    remove("map.json"); /* unreadable now: the roles of the flags only */
    khub__tune_config_json(&c, buf, sizeof buf);
    ASSERT_STR_EQ(buf,
                  "{\n\t\"format\":\t1,\n\t\"roles\":\t{\n\t\t\"cache\":\t\"quantized\"\n\t}\n}\n");
}

#define TEST_LIST(X) \
    X(workload_file) \
    X(builtin_workload) \
    X(bad_arguments) \
    X(decision_stable_inside_noise) \
    X(decision_margin_is_noise_plus_one_percent) \
    X(saved_json_keeps_the_mapping_roles)
TEST_MAIN(TEST_LIST)
