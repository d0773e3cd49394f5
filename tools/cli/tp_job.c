/*
 * tp_job.c: a command as one rank of a `--tp N` job (tp_job.h). The order
 * of the ends matters: a rank that failed must not free its model (rank 0
 * would broadcast a stop, the others wait in a step), so failures abort
 * the whole job through MPI, which mpirun reports with the rank.
 */
#include "tp_job.h"

#include "cli.h"
#include "comm_mpi.h"

int cli_tp_begin(cli_tp_job *j, const char *cmd, int tp, int threaded)
{
    *j = (cli_tp_job){.cmd = cmd, .tp = tp, .comm = {KHUB_APP_INIT(khub_comm), .size = 1}};
    if (tp < 2) return 0;
    return cli_mpi_start(cmd, tp, threaded, &j->comm);
}

const khub_comm *cli_tp_comm(const cli_tp_job *j) { return j->tp > 1 ? &j->comm : NULL; }

int cli_tp_follow(const cli_tp_job *j, khub_runtime *rt, khub_model *m)
{
    return cli_tp_follow_kernels(j, rt, m, NULL, NULL);
}

int cli_tp_follow_kernels(const cli_tp_job *j, khub_runtime *rt, khub_model *m, khub_hub *hub,
                          const khub_model_kernels *policy)
{
    khub_status st = hub ? khub_model_tp_serve_kernels(m, hub, policy) : khub_model_tp_serve(m);
    if (st != KHUB_STATUS_OK) {
        khub_cli_fail(j->cmd, "tp rank %d: %s", (int)j->comm.rank, khub_runtime_errmsg(rt));
        cli_mpi_end(1); /* MPI_Abort: does not return */
    }
    khub_model_free(m);
    khub_runtime_free(rt);
    return 0;
}

void cli_tp_abort_if(const cli_tp_job *j, int rc)
{
    if (rc && j->tp > 1) cli_mpi_end(rc);
}

int cli_tp_end(const cli_tp_job *j, int rc)
{
    if (j->tp > 1) cli_mpi_end(rc);
    return rc;
}
