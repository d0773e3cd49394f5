/*
 * tp_job.h: a command run as one rank of a `--tp N` job under mpirun
 * (tools/cli/tp_job.c; docs/parallelism.md). Rank 0 runs the command; the
 * other ranks load the same model and follow rank 0's steps until rank 0
 * frees its model. `khub run`, `chat`, `serve-model`, `bench-model` and
 * `bench-batch` share it:
 *
 *     cli_tp_job job;
 *     if ((rc = cli_tp_begin(&job, "chat", a.tp, 0))) return rc;
 *     a.comm = cli_tp_comm(&job);
 *     m = cli_model_open(...);              // collective: every rank loads
 *     if (!m) return cli_tp_end(&job, 1);
 *     if (job.comm.rank != 0) return cli_tp_end(&job, cli_tp_follow(&job, rt, m));
 *     rc = ...the command on rank 0...;
 *     cli_tp_abort_if(&job, rc);            // before freeing the model
 *     khub_model_free(m); khub_runtime_free(rt);
 *     return cli_tp_end(&job, rc);
 */
#ifndef KHUB_CLI_TP_JOB_H
#define KHUB_CLI_TP_JOB_H

#include "khub/khub_comm.h"
#include "khub/khub_kernels.h"
#include "khub/khub_model.h"

typedef struct cli_tp_job {
    const char *cmd; /* for messages: "khub <cmd>: ..." */
    int tp;          /* --tp N; 0 or 1 = a single process, no MPI */
    khub_comm comm;  /* rank 0 of size 1 without a job */
} cli_tp_job;

/* Starts MPI when tp > 1 (comm_mpi.h); threaded: the model is driven from
 * a thread other than main (serve-model's engine), which needs
 * MPI_THREAD_SERIALIZED. 0, or the exit code after printing why. */
int cli_tp_begin(cli_tp_job *j, const char *cmd, int tp, int threaded);
/* The communicator for khub_model_opts.comm: NULL without a job. */
const khub_comm *cli_tp_comm(const cli_tp_job *j);
/* A rank other than 0: runs rank 0's steps on m until rank 0 frees its
 * model, then frees m and rt. Returns 0; on a failed step it prints why
 * and calls MPI_Abort (it does not return), which ends every rank. */
int cli_tp_follow(const cli_tp_job *j, khub_runtime *rt, khub_model *m);
/* cli_tp_follow that also follows rank 0's kernel swaps (serve-model's
 * POST /v1/kernels/reload): this rank prepares each with hub under policy
 * (khub_model_tp_serve_kernels). */
int cli_tp_follow_kernels(const cli_tp_job *j, khub_runtime *rt, khub_model *m, khub_hub *hub,
                          const khub_model_kernels *policy);
/* On rank 0 after a failure and before khub_model_free: MPI_Abort, which
 * does not return (freeing would broadcast a stop that ranks stuck in
 * another collective cannot match). Nothing without a job or when rc is 0. */
void cli_tp_abort_if(const cli_tp_job *j, int rc);
/* The end of the command on any rank: MPI_Finalize, or MPI_Abort when rc
 * is not 0. Returns rc (without a job: only returns rc). */
int cli_tp_end(const cli_tp_job *j, int rc);

#endif /* KHUB_CLI_TP_JOB_H */
