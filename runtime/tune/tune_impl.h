/*
 * tune_impl.h: libkhub_tune's internals (khub_tune.h is the API): the
 * workload, one configuration, one measured run, and the report's rows.
 */
#ifndef KHUB_TUNE_IMPL_H
#define KHUB_TUNE_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "khub/khub_comm.h"
#include "khub/khub_model.h"
#include "khub/khub_tune.h"

#define TUNE_MAX_REQUESTS 64
#define TUNE_MAX_TOKENS   4096
#define TUNE_MAX_ROWS     32

typedef struct tune_request {
    char *prompt; /* owned */
    int32_t max_tokens;
} tune_request;

struct khub_tune_workload {
    tune_request req[TUNE_MAX_REQUESTS];
    size_t n;
    int32_t concurrency;
    int builtin;     /* 1 = the built-in workload */
    char path[4096]; /* the file it was read from; "" = built in or assembled */
};

/* One configuration: the baseline's zeros and empty strings mean "what
 * `khub run` does with no flag". The names are `khub run`'s flag values. */
typedef struct tune_config {
    char attn[64];      /* --attn: plugin id or built-in name, "" = default */
    char quant[16];     /* --quant: scheme, "" = keep the file's dtypes */
    char cache[48];     /* --cache: built-in strategy, "" = dynamic */
    int32_t threads;    /* --threads, 0 = all cores */
    int32_t max_batch;  /* --max-batch-tokens, 0 = 256 */
    char kernels[512];  /* --kernels: a khub.json path, "" = none */
    char hub_attn[128]; /* --attn Hub ID fetched from endpoint, "" = none */
    char endpoint[256]; /* hub endpoint for hub_attn */
    int32_t tp;         /* --tp: ranks under mpirun, 0 = one process */
} tune_config;

/* What one child process measured. Times in ms, sizes in bytes. */
typedef struct tune_meas {
    int32_t ok;     /* 1 = measured; 0 = see why */
    int32_t status; /* khub_status of a failed load, 0 otherwise */
    char why[480];  /* the failure, one line */
    double load_ms;
    uint64_t weight_bytes, n_params, kv_bytes_per_token, peak_rss;
    int32_t head_dim, n_kv_heads, n_layers, threads;
    int32_t n_heads, ffn, vocab; /* the probe's, for the tp divisibility check */
    int32_t tp_ranks;            /* ranks measured (tp lever), 0 = one process */
    uint64_t peak_rss_total;     /* tp: the ranks' peaks summed; peak_rss is the largest */
    double ttft_ms, ttft_p90_ms; /* median and 90th percentile over requests */
    double token_ms;             /* per-token decode latency, median over requests */
    double latency_ms;           /* median request time, submit to end */
    double queue_ms;             /* mean time requests waited for admission */
    double throughput;           /* generated tokens / workload wall seconds */
    double wall_ms;              /* the workload's wall time */
    double prefill_short_ms, prefill_long_ms; /* one prefill of short_len, long_len tokens */
    int32_t short_len, long_len;
    double ppl; /* perplexity on the held-out text's evaluated positions */
    int32_t ppl_positions;
    int64_t gen_tokens, prompt_tokens;
    int32_t n_tokens[TUNE_MAX_REQUESTS]; /* per request, greedy ids below */
    int32_t tokens[TUNE_MAX_REQUESTS][256];
} tune_meas;

typedef enum tune_state {
    TUNE_MEASURED = 0,
    TUNE_SKIPPED = 1,    /* incompatible: not run, with the reason */
    TUNE_UNVERIFIED = 2, /* ran but failed, crashed, or ran past the budget */
} tune_state;

/* One row of the report. */
typedef struct tune_row {
    char name[96];  /* "cache=quantized-int4" */
    char lever[24]; /* "attention", "quantization", "cache", "threads", "batching", "kernels",
                       "baseline", "combination" */
    tune_config cfg;
    tune_state state;
    char reason[512]; /* why skipped or unverified */
    tune_meas m;
    double agreement; /* greedy token agreement with baseline run 1, [0, 1] */
    double gain;      /* goal improvement over the baseline's mean, fraction (+ = better) */
    int winner;       /* 1 = beat the baseline on the goal by more than the noise */
    char verdict[256];
} tune_row;

/* Hands out the child's result; implemented in measure.c. */
typedef struct tune_run_ctx {
    const char *model;
    const khub_tune_workload *w;
    const char *fail_candidate;
    const char *empty_mapping; /* a khub.json with no roles, so no stray ./khub.json applies */
    const char *tmp_dir;       /* the run's temporary folder (the tp job's files) */
    const char *tp_program;    /* the rank program mpirun starts (tp rows) */
    double deadline;           /* monotonic seconds */
} tune_run_ctx;

/* Measures cfg in a child process; the row's state, reason and m are set.
 * probe = 1: load only (model facts). */
void khub__tune_measure(const tune_run_ctx *ctx, tune_row *row, int probe);
/* In the process that measures: loads the model as `khub run` would with
 * c's flags (comm: a tp rank's communicator, else NULL; max_seqs: the
 * workload's concurrency), filling the model facts of out; on failure
 * out->why and out->status, and *m is NULL. */
khub_status khub__tune_open(const char *model, const tune_config *c, const char *empty_mapping,
                            int32_t max_seqs, const khub_comm *comm, khub_runtime **rt,
                            khub_model **m, tune_meas *out);
/* The workload (greedy, continuous batching) and the held-out perplexity
 * on a loaded model, into out; -1 with out->why on failure. */
int khub__tune_run_workload(khub_model *m, const khub_tune_workload *w, const tune_config *c,
                            double slow_s, tune_meas *out);
int khub__tune_perplexity(khub_model *m, tune_meas *out);
/* VmHWM of process pid (0 = this one), bytes; 0 when unreadable. */
uint64_t khub__tune_peak_rss(int pid);
/* tp.c: the parallelism lever. Why tp ranks cannot split the probed model
 * (0 when they can), and one tp configuration measured under mpirun (in
 * the measuring child: writes the job's spec, runs mpirun, reads rank 0's
 * result). */
int khub__tune_tp_unfit(const tune_meas *probe, int32_t tp, char *why, size_t n);
void khub__tune_tp_measure(const tune_run_ctx *ctx, const tune_row *row, tune_meas *out);
/* Sets row's state and its reason (printf format). */
void khub__tune_set_state(tune_row *row, tune_state state, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
double khub__tune_now(void);

/* The held-out text (heldout.c): its text, source and licence. */
extern const char khub__tune_heldout_text[];
extern const char khub__tune_heldout_source[];

/* workload.c */
khub_status khub__tune_workload_new(khub_tune_workload **out);

/* The report (report.c). */
struct khub_tune_report {
    char model[512];
    uint32_t goal;
    int builtin_workload;
    char workload_path[4096]; /* khub_tune_workload's path: "" = none */
    size_t n_requests;
    int32_t concurrency;
    double budget_s, elapsed_s;
    uint64_t max_memory;
    double min_quality;
    char cpu[256];          /* CPU features seen */
    char kernels_note[600]; /* kernels-from outcome */
    tune_row rows[TUNE_MAX_ROWS];
    int n_rows;
    int n_baseline;  /* rows[0..n_baseline) are baseline runs */
    double noise[4]; /* relative spread of the baseline: latency, throughput, memory, ttft */
    int recommended; /* row index; 0 = keep the baseline */
    char bottleneck[1024];
    char tradeoffs[2048];
    char khub_json[1024];
    char run_flags[1024];
    char *rendered[3];
};

void khub__tune_diagnose(khub_tune_report *r);
void khub__tune_recommend(khub_tune_report *r);
double khub__tune_goal_value(uint32_t goal, const tune_meas *m);
void khub__tune_config_flags(const tune_config *c, char *buf, size_t n);
void khub__tune_config_json(const tune_config *c, char *buf, size_t n);

#endif /* KHUB_TUNE_IMPL_H */
