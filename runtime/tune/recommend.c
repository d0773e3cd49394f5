/*
 * recommend.c: from measured rows to a verdict. The noise is the spread
 * of the baseline's repeated runs; a candidate wins only when its gain on
 * the goal exceeds that noise plus 1%, its greedy token agreement with the
 * baseline is at least min_quality, and its peak RSS is within max_memory.
 * The recommendation is the best measured winner, the combination included,
 * or the baseline itself: never an unmeasured change.
 *
 * khub__tune_recommend is the decision step, a pure function of the
 * measurements: it reads goal, min_quality, max_memory, n_baseline and the
 * rows' state and m, and writes only noise, the rows' agreement, gain,
 * winner and verdict, recommended, khub_json and run_flags; no clock, no
 * I/O, no other state. So the same measurements always give the same
 * recommendation, and tests/test_tune.c checks that measurements moved
 * inside the stated noise do too (the margin of noise + 1% is what makes
 * that hold: a winner by less is not recommended).
 * The diagnosis names where memory or time goes in the baseline, with the
 * numbers, separating what was measured from what is estimated.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "tune_impl.h"

double khub__tune_goal_value(uint32_t goal, const tune_meas *m)
{
    return goal == KHUB_TUNE_GOAL_THROUGHPUT ? m->throughput
           : goal == KHUB_TUNE_GOAL_MEMORY   ? (double)m->peak_rss
                                             : m->latency_ms;
}

static const char *goal_name(uint32_t goal)
{
    return goal == KHUB_TUNE_GOAL_THROUGHPUT ? "throughput"
           : goal == KHUB_TUNE_GOAL_MEMORY   ? "peak RSS"
                                             : "median latency";
}

/* Greedy token agreement of m with the reference: the tokens before the
 * first difference, over all requests, as a fraction of the reference's. */
static double agreement(const tune_meas *ref, const tune_meas *m)
{
    int64_t same = 0, total = 0;
    for (int i = 0; i < TUNE_MAX_REQUESTS; i++) {
        int32_t n = ref->n_tokens[i], k = 0;
        while (k < n && k < m->n_tokens[i] && ref->tokens[i][k] == m->tokens[i][k]) k++;
        same += k;
        total += n;
    }
    return total ? (double)same / (double)total : 1.0;
}

/* The baseline runs' mean of the goal and the spread of four metrics. */
static double baseline_stats(khub_tune_report *r)
{
    double sum[4] = {0}, lo[4], hi[4];
    int n = 0;
    for (int i = 0; i < r->n_baseline; i++) {
        const tune_meas *m = &r->rows[i].m;
        if (r->rows[i].state != TUNE_MEASURED) continue;
        double v[4] = {m->latency_ms, m->throughput, (double)m->peak_rss, m->ttft_ms};
        for (int k = 0; k < 4; k++) {
            lo[k] = n ? fmin(lo[k], v[k]) : v[k];
            hi[k] = n ? fmax(hi[k], v[k]) : v[k];
            sum[k] += v[k];
        }
        n++;
    }
    for (int k = 0; k < 4; k++)
        r->noise[k] = n > 1 && sum[k] > 0 ? (hi[k] - lo[k]) / (sum[k] / n) : 0;
    int g = r->goal == KHUB_TUNE_GOAL_THROUGHPUT ? 1 : r->goal == KHUB_TUNE_GOAL_MEMORY ? 2 : 0;
    return n ? sum[g] / n : 0;
}

static double goal_noise(const khub_tune_report *r)
{
    int g = r->goal == KHUB_TUNE_GOAL_THROUGHPUT ? 1 : r->goal == KHUB_TUNE_GOAL_MEMORY ? 2 : 0;
    return r->noise[g];
}

/* The peak RSS the machine holds: a tp row's ranks together. */
static uint64_t all_ranks(const tune_meas *m)
{
    return m->tp_ranks > 1 ? m->peak_rss_total : m->peak_rss;
}

static void judge(khub_tune_report *r, tune_row *row, double base)
{
    double v = khub__tune_goal_value(r->goal, &row->m), margin = goal_noise(r) + 0.01;
    row->gain = base > 0 ? (r->goal == KHUB_TUNE_GOAL_THROUGHPUT ? v - base : base - v) / base : 0;
    double change = base > 0 ? v / base - 1 : 0; /* of the metric itself, as shown */
    row->agreement = agreement(&r->rows[0].m, &row->m);
    row->winner = 0;
    if (row->agreement < r->min_quality)
        snprintf(row->verdict, sizeof row->verdict,
                 "rejected: token agreement %.0f%% is below the minimum %.0f%%",
                 row->agreement * 100, r->min_quality * 100);
    else if (r->max_memory && all_ranks(&row->m) > r->max_memory)
        snprintf(row->verdict, sizeof row->verdict,
                 "rejected: peak RSS %.1f MiB%s is over the maximum %.1f MiB",
                 (double)all_ranks(&row->m) / 1048576,
                 row->m.tp_ranks > 1 ? " (all ranks on this machine)" : "",
                 (double)r->max_memory / 1048576);
    else if (row->gain < -margin)
        snprintf(row->verdict, sizeof row->verdict, "worse: %s %+.1f%% (noise + 1%%: %.1f%%)",
                 goal_name(r->goal), change * 100, margin * 100);
    else if (row->gain <= margin)
        snprintf(row->verdict, sizeof row->verdict,
                 "no win: %s %+.1f%%, within the noise + 1%% (%.1f%%)", goal_name(r->goal),
                 change * 100, margin * 100);
    else {
        row->winner = 1;
        snprintf(row->verdict, sizeof row->verdict, "winner: %s %+.1f%% (noise + 1%%: %.1f%%)",
                 goal_name(r->goal), change * 100, margin * 100);
    }
    if (row->m.tp_ranks > 1) { /* the memory column is per rank: say so */
        size_t len = strlen(row->verdict);
        snprintf(row->verdict + len, sizeof row->verdict - len,
                 "; peak RSS per rank (the largest of %d; %.1f MiB in all)", (int)row->m.tp_ranks,
                 (double)row->m.peak_rss_total / 1048576);
    }
}

void khub__tune_recommend(khub_tune_report *r)
{
    double base = baseline_stats(r);
    r->recommended = 0;
    for (int i = 0; i < r->n_rows; i++) {
        tune_row *row = &r->rows[i];
        if (i < r->n_baseline) {
            if (row->state == TUNE_MEASURED) row->agreement = agreement(&r->rows[0].m, &row->m);
            continue;
        }
        if (row->state != TUNE_MEASURED) continue;
        judge(r, row, base);
        if (row->winner && (!r->recommended || row->gain > r->rows[r->recommended].gain))
            r->recommended = i;
    }
    const tune_config *c = &r->rows[r->recommended].cfg;
    khub__tune_config_json(c, r->khub_json, sizeof r->khub_json);
    khub__tune_config_flags(c, r->run_flags, sizeof r->run_flags);
}

/* ------------------------------------------------------------------------ */
/* Diagnosis                                                                */
/* ------------------------------------------------------------------------ */

#define MIB(x) ((double)(x) / 1048576.0)

static void cat(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void memory_line(khub_tune_report *r, const tune_meas *m, double kv_est)
{
    double other = MIB(m->peak_rss) - MIB(m->weight_bytes) - MIB(kv_est);
    const char *what = MIB(m->weight_bytes) >= MIB(kv_est) && MIB(m->weight_bytes) >= other
                           ? "the weights"
                       : MIB(kv_est) >= other ? "the KV cache"
                                              : "activations, scratch and the runtime";
    cat(r->bottleneck, sizeof r->bottleneck,
        "memory: peak RSS %.1f MiB (measured); weights %.1f MiB (measured, as loaded); KV cache "
        "%.1f MiB at the workload's peak (estimated: %llu bytes per token x %d requests "
        "of the mean length); the rest %.1f MiB. Largest: %s.\n",
        MIB(m->peak_rss), MIB(m->weight_bytes), MIB(kv_est),
        (unsigned long long)m->kv_bytes_per_token, (int)r->concurrency, other > 0 ? other : 0,
        what);
    if (r->goal == KHUB_TUNE_GOAL_MEMORY)
        cat(r->bottleneck, sizeof r->bottleneck, "Bottleneck for peak RSS: %s.\n", what);
}

static void time_line(khub_tune_report *r, const tune_meas *m)
{
    double per_short = m->short_len ? m->prefill_short_ms / m->short_len : 0;
    double per_long = m->long_len ? m->prefill_long_ms / m->long_len : 0;
    cat(r->bottleneck, sizeof r->bottleneck,
        "time: prefill %.1f ms for %d tokens, %.1f ms for %d (%.3f -> %.3f ms per token: %s); "
        "decode %.2f ms per token (median); time to first token %.1f ms median, %.1f ms p90; "
        "queueing %.1f ms mean at concurrency %d (all measured).\n",
        m->prefill_short_ms, (int)m->short_len, m->prefill_long_ms, (int)m->long_len, per_short,
        per_long,
        per_long > per_short * 1.2   ? "attention's share grows with the sequence"
        : per_long < per_short * 0.8 ? "fixed costs weigh on short prefills"
                                     : "roughly linear in length",
        m->token_ms, m->ttft_ms, m->ttft_p90_ms, m->queue_ms, (int)r->concurrency);
    const char *b;
    if (r->goal == KHUB_TUNE_GOAL_MEMORY) return; /* memory_line named it */
    if (r->concurrency > 1 && m->queue_ms > 0.3 * m->latency_ms)
        b = "queueing: requests wait for a slot for a large part of their time (more sequences "
            "at once, or a larger batch, would shorten it)";
    else if (m->ttft_ms > 0.5 * m->latency_ms)
        b = "prefill: the first token takes most of a request's time";
    else
        b = "decode: the per-token steps take most of a request's time (memory bandwidth of "
            "the weights each step)";
    cat(r->bottleneck, sizeof r->bottleneck, "Bottleneck for %s: %s.\n", goal_name(r->goal), b);
}

void khub__tune_diagnose(khub_tune_report *r)
{
    const tune_meas *m = &r->rows[0].m;
    r->bottleneck[0] = '\0';
    /* The KV the running requests hold together: concurrency requests of
     * the workload's mean length (an estimate, and labelled so). */
    int32_t running =
        r->concurrency < (int32_t)r->n_requests ? r->concurrency : (int32_t)r->n_requests;
    int64_t kv_tokens =
        (m->prompt_tokens + m->gen_tokens) * running / (int64_t)(r->n_requests ? r->n_requests : 1);
    memory_line(r, m, (double)m->kv_bytes_per_token * (double)kv_tokens);
    time_line(r, m);
    r->tradeoffs[0] = '\0';
    for (int i = r->n_baseline; i < r->n_rows; i++) {
        const tune_row *row = &r->rows[i];
        if (row->state != TUNE_MEASURED || !(row->winner || i == r->recommended)) continue;
        double kv0 = (double)m->kv_bytes_per_token, kv1 = (double)row->m.kv_bytes_per_token;
        cat(r->tradeoffs, sizeof r->tradeoffs,
            "%s, against baseline run 1 (the verdicts use the runs' mean): peak RSS%s %+.1f%% "
            "(%.1f -> %.1f MiB), KV %+.1f%% per token, throughput %+.1f%%, median latency %+.1f%%, "
            "token agreement %.0f%%, perplexity %.2f -> %.2f\n",
            row->name, row->m.tp_ranks > 1 ? " per rank" : "",
            100 * (MIB(row->m.peak_rss) / MIB(m->peak_rss) - 1), MIB(m->peak_rss),
            MIB(row->m.peak_rss), kv0 > 0 ? 100 * (kv1 / kv0 - 1) : 0,
            100 * (row->m.throughput / m->throughput - 1),
            100 * (row->m.latency_ms / m->latency_ms - 1), row->agreement * 100, m->ppl,
            row->m.ppl);
    }
}

static void cat(char *buf, size_t n, const char *fmt, ...)
{
    size_t len = strlen(buf);
    if (len + 1 >= n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, n - len, fmt, ap);
    va_end(ap);
}
