/*
 * prompts_file.h: `khub run --prompts-file FILE`: one request per line,
 * either a plain prompt or a JSON object with its own settings
 * (tools/cli/prompts_file.c), and the batch run over them (run_batch.c).
 */
#ifndef KHUB_CLI_PROMPTS_FILE_H
#define KHUB_CLI_PROMPTS_FILE_H

#include "khub/khub_batch.h"

typedef struct cli_prompt {
    long line;    /* 1-based line in the file */
    char *prompt; /* owned */
    char *system; /* owned, or NULL */
    char **stops; /* owned, [n_stops] */
    int n_stops;
    khub_generate_opts gen; /* the command line's, overridden by the line's */
} cli_prompt;

typedef struct cli_prompts {
    cli_prompt *p; /* owned, [n] in file order */
    size_t n, cap;
} cli_prompts;

/* Reads path: each non-blank line is a prompt, or, when it starts with '{',
 * a JSON object {"prompt": TEXT, "max_tokens": N, "temperature": T,
 * "top_k": K, "top_p": P, "repeat_penalty": R, "seed": S, "stop": STR or
 * [STR...], "chat": BOOL, "system": TEXT, "ignore_eos": BOOL}. defaults
 * gives every setting a line leaves out (its stop strings are borrowed).
 * Returns 0, or 1 after printing "khub run: FILE:LINE: what is wrong". */
int cli_prompts_read(const char *path, const khub_generate_opts *defaults, cli_prompts *out);
void cli_prompts_free(cli_prompts *ps);

typedef struct cli_batch_args {
    int json;     /* print one JSON object with per-request timings and totals */
    int progress; /* a progress bar on stderr */
    int32_t max_batch_tokens, max_seqs; /* 0 = the model's */
    int threads;                        /* the pool's size, for --json */
} cli_batch_args;

/* Runs every prompt through one khub_batch and prints the results in file
 * order. Returns 0, or 1 when a request or the run failed (each failure
 * printed with its line). */
int cli_run_batch(khub_runtime *rt, khub_model *m, const cli_prompts *ps, const cli_batch_args *a);

#endif /* KHUB_CLI_PROMPTS_FILE_H */
