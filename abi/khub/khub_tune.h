/*
 * khub_tune.h: the optimization advisor (libkhub_tune, on top of libkhub's
 * public API). It does what the Transformers optimization guide asks of a
 * person choosing an inference optimization, on the user's own workload:
 * measure a baseline and name where memory or time goes, then apply one
 * change at a time (attention backend, quantization at load, KV cache
 * strategy, thread count, batching limits, kernels from a hub, tensor
 * parallelism under mpirun), each
 * checked for compatibility first and measured on the same workload (peak
 * RSS, time to first token, per-token latency, throughput, greedy token
 * agreement with the baseline, perplexity on a held-out text), then measure
 * the combination of the winners, and recommend only what was measured.
 *
 *     khub_tune_workload *w = NULL;
 *     char err[KHUB_ERROR_SIZE];
 *     if (khub_tune_workload_read("workload.jsonl", &w, err, sizeof err) != KHUB_STATUS_OK)
 *         return fprintf(stderr, "%s\n", err), 1;   // "workload.jsonl:3: ..."
 *     khub_tune_opts o = {KHUB_APP_INIT(khub_tune_opts), .model = "SmolLM2.gguf",
 *                         .workload = w, .goal = KHUB_TUNE_GOAL_MEMORY};
 *     khub_tune_report *r = NULL;
 *     if (khub_tune_run(&o, &r, err, sizeof err) == KHUB_STATUS_OK)
 *         fputs(khub_tune_report_render(r, KHUB_TUNE_FORMAT_TEXT), stdout);
 *     khub_tune_report_free(r);
 *     khub_tune_workload_free(w);
 *
 * How it measures (docs/tune.md): every configuration runs in a child
 * process of its own (fork), so that its peak RSS is its own, a crash or an
 * out-of-memory kill costs only that candidate (reported as unverified with
 * the reason), and the time budget is enforced by killing a child that runs
 * past it. The baseline runs more than once and the spread between its runs
 * is the noise: a candidate wins only by a margin larger than that.
 *
 * Threading: khub_tune_run blocks; call it from a thread that is the
 * process's only one (it forks; a child of a multithreaded process may
 * inherit locks held by other threads). Errors: the status says what kind,
 * errbuf what failed, on what, and what to do.
 *
 * Anything not declared in abi/khub/ is not part of khub's API.
 */
#ifndef KHUB_TUNE_H
#define KHUB_TUNE_H

#include <stddef.h>
#include <stdint.h>

#include "khub.h"
#include "khub_comm.h"
#include "khub_model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Workload                                                                 */
/* ------------------------------------------------------------------------ */

/* A representative workload: prompts with their generation limits, and how
 * many of them run at once. */
typedef struct khub_tune_workload khub_tune_workload;

/* Reads a JSONL workload file: one JSON object per line, blank lines and
 * lines starting with '#' skipped. {"prompt": "...", "max_tokens": N} is a
 * request (max_tokens 1..4096, default 64); {"concurrency": N} (1..256, at
 * most once) says how many requests run at once (default 1). Unknown keys,
 * a line that is not an object, and a file without requests are errors.
 * errbuf (KHUB_ERROR_SIZE bytes) receives "FILE:LINE: what is wrong".
 * *out is freed with khub_tune_workload_free. Statuses: IO, PARSE, NOMEM.
 * Since 0.1. */
KHUB_API khub_status khub_tune_workload_read(const char *path, khub_tune_workload **out,
                                             char *errbuf, size_t errbuf_size);
/* The built-in mixed workload (short and long prompts, short and long
 * generations, concurrency 4) used when the user gives none. Since 0.1. */
KHUB_API khub_status khub_tune_workload_builtin(khub_tune_workload **out);
/* Requests in w, and its concurrency. Since 0.1. */
KHUB_API size_t khub_tune_workload_count(const khub_tune_workload *w);
KHUB_API int32_t khub_tune_workload_concurrency(const khub_tune_workload *w);
/* Accepts NULL. Since 0.1. */
KHUB_API void khub_tune_workload_free(khub_tune_workload *w);

/* ------------------------------------------------------------------------ */
/* Running                                                                  */
/* ------------------------------------------------------------------------ */

typedef enum khub_tune_goal {
    KHUB_TUNE_GOAL_LATENCY = 0,    /* median request time (end to end) */
    KHUB_TUNE_GOAL_THROUGHPUT = 1, /* generated tokens per second, whole workload */
    KHUB_TUNE_GOAL_MEMORY = 2      /* peak RSS of the process */
} khub_tune_goal;

/* Called in the parent before each measured run (done of total runs
 * planned) with what it is about to measure, and once more with done ==
 * total. label is borrowed for the call. */
typedef void (*khub_tune_progress_fn)(void *ud, int32_t done, int32_t total, const char *label);

typedef struct khub_tune_opts {
    KHUB_STRUCT_HEADER;
    const char *model;                  /* borrowed; .gguf file or Hugging Face folder */
    const khub_tune_workload *workload; /* borrowed; NULL = the built-in workload */
    uint32_t goal;                      /* khub_tune_goal */
    int32_t baseline_runs;              /* baseline repetitions for the noise, 0 = 2 (min 2) */
    uint64_t max_memory;                /* bytes of peak RSS allowed, 0 = no limit */
    double min_quality;                 /* least greedy token agreement in [0, 1], 0 = 0.9 */
    double time_budget_s;               /* whole run, seconds, 0 = 600 */
    /* Kernel candidates: a khub.json mapping file (its roles tried as one
     * candidate) or a hub endpoint URL ("http://host:port"; the known Hub
     * kernels are tried from it). NULL = none. Borrowed. */
    const char *kernels_from;
    khub_tune_progress_fn progress; /* NULL = none */
    void *progress_ud;
    /* For tests of the honesty rules: the candidate with this name (as the
     * report names it, "cache=quantized-int4") aborts in its child process;
     * with ":hang" after the name it never ends (the budget's kill); with
     * ":slow" its workload's wall time is 1 s longer (throughput, not the
     * requests' own times), and "baseline:slow" slows every baseline run
     * (a recommendation that does not depend on the machine's speed). NULL =
     * none. Borrowed. */
    const char *fail_candidate;
    /* The levers to try, comma-separated, from attention, quantization,
     * cache, threads, batching, kernels, parallelism; the others are left
     * out of the report. NULL or "" = all. Borrowed. Added in 0.1 (issue
     * 17: a team that only wants to compare kernels, and tests that need
     * one candidate). */
    const char *levers;
    /* End of 0.1. */
    /* The parallelism lever (added in 0.2, issue 17): tensor parallelism
     * over tp_size ranks (0 = 2), measured under `mpirun` (found on PATH)
     * on the same workload as a candidate of its own. tp_rank_program is
     * the program mpirun starts for each rank, as `PROG tune-rank --tp N
     * SPEC`, which must run khub_tune_rank_load and khub_tune_rank_measure
     * below (the khub CLI passes itself: `khub tune-rank`); NULL lists the
     * lever as unavailable with tp_unavailable as the reason (e.g. "this
     * khub was built without MPI"; NULL = a generic one). Borrowed. */
    int32_t tp_size;
    const char *tp_rank_program;
    const char *tp_unavailable;
    /* End of 0.2. */
} khub_tune_opts;

typedef struct khub_tune_report khub_tune_report;

/* Runs the advisor: a probe load (model facts, the memory check), the
 * baseline (baseline_runs times), each compatible candidate alone, then the
 * winners together. *out receives the report, freed with
 * khub_tune_report_free. opts is read up to its struct_size, at least 0.1's
 * 96 bytes (STRUCT_SIZE below: "khub_tune_run: opts.struct_size S is
 * smaller than 0.1's 96"; before 0.2 a smaller struct read as zeros).
 * Statuses: INVALID_ARG (a bad option, an unknown lever, or max_memory
 * below what the weights need in any configuration: the message gives both
 * sizes), the load's status when the model does not load (NOT_FOUND, IO,
 * MODEL_INVALID, MODEL_UNSUPPORTED, ...: the probe's message; IO when the
 * probe process died without one), TIMEOUT (the budget ended before the baseline
 * was measured), NOMEM, IO. A candidate's failure is not an error: it is in
 * the report as unverified with its reason. Since 0.1. */
KHUB_API khub_status khub_tune_run(const khub_tune_opts *opts, khub_tune_report **out, char *errbuf,
                                   size_t errbuf_size);

typedef enum khub_tune_format {
    KHUB_TUNE_FORMAT_TEXT = 0,     /* terminal table and prose */
    KHUB_TUNE_FORMAT_MARKDOWN = 1, /* the same as Markdown */
    KHUB_TUNE_FORMAT_JSON = 2      /* one JSON object (docs/tune.md lists its fields) */
} khub_tune_format;

/* The report in a format, NUL-terminated; owned by r, valid until
 * khub_tune_report_free. NULL for a NULL report or an unknown format, or
 * when out of memory. Since 0.1. */
KHUB_API const char *khub_tune_report_render(khub_tune_report *r, khub_tune_format format);
/* The recommended configuration as a khub.json (`khub run --kernels`
 * accepts it) and as the equivalent `khub run` flags; owned by r. The
 * khub.json names the kernel roles only; the flags carry the rest (threads,
 * batching). Since 0.1. */
KHUB_API const char *khub_tune_report_khub_json(const khub_tune_report *r);
KHUB_API const char *khub_tune_report_run_flags(const khub_tune_report *r);
/* Accepts NULL. Since 0.1. */
KHUB_API void khub_tune_report_free(khub_tune_report *r);

/* ------------------------------------------------------------------------ */
/* One rank of the parallelism lever's job                                  */
/* ------------------------------------------------------------------------ */

/* In the rank program that khub_tune_run starts under mpirun (`PROG
 * tune-rank --tp N SPEC`; opts.tp_rank_program), on every rank, with the
 * job's communicator (khub_comm.h; comm->size must be the spec's N):
 * reads SPEC (a JSON file khub_tune_run wrote: model, configuration,
 * workload, result path) and loads the model on this rank's shards with
 * the configuration's kernels, as a one-process measurement would; the
 * caller owns *rt and *m (ranks > 0 then run khub_model_tp_serve, rank 0
 * khub_tune_rank_measure; free m before rt). A collective: every rank
 * calls it. On failure rank 0 also writes the reason into the result, so
 * the report can give it. Statuses: PARSE (not a spec), INVALID_ARG (NULL
 * arguments, or a job size other than the spec's), the load's. errbuf
 * (KHUB_ERROR_SIZE bytes) receives the reason. Since 0.2 (issue 17). */
KHUB_API khub_status khub_tune_rank_load(const char *spec_path, const khub_comm *comm,
                                         khub_runtime **rt, khub_model **m, char *errbuf,
                                         size_t errbuf_size);
/* On rank 0 after khub_tune_rank_load: runs the spec's workload and the
 * held-out perplexity on m (the other ranks follow in khub_model_tp_serve),
 * reads every rank's peak RSS (the ranks run on this machine: their pids
 * were written at the load), and writes the result file khub_tune_run
 * reads, also on failure with the reason. Statuses: PARSE, INVALID_ARG,
 * IO (a step failed: errbuf says which). Since 0.2 (issue 17). */
KHUB_API khub_status khub_tune_rank_measure(const char *spec_path, khub_model *m, char *errbuf,
                                            size_t errbuf_size);

#ifdef __cplusplus
}
#endif

#endif /* KHUB_TUNE_H */
