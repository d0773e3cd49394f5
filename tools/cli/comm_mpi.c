/*
 * comm_mpi.c: khub_comm over MPI_COMM_WORLD (comm_mpi.h). libkhub links no
 * MPI; the CLI does, when CMake finds it (KHUB_WITH_MPI, Debian's Open MPI
 * from tools/install-deps.sh). Errors return (MPI_ERRORS_RETURN) and become
 * KHUB_STATUS_IO with MPI's own text. A rank that dies is Open MPI's to
 * notice: mpirun then ends the job, so no collective here needs a timeout.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "comm_mpi.h"

#ifdef KHUB_WITH_MPI
#include <limits.h>

#include <mpi.h>

enum { CHUNK = 1 << 30 }; /* MPI counts are int */

static khub_status mpi_st(int rc, const char *what, char *err, size_t n)
{
    if (rc == MPI_SUCCESS) return KHUB_STATUS_OK;
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, s, &len);
    if (err && n) snprintf(err, n, "MPI_%s: %.*s", what, len, s);
    return KHUB_STATUS_IO;
}

static khub_status all_reduce(void *ud, float *buf, int64_t n, char *err, size_t es)
{
    for (int64_t i = 0; i < n; i += CHUNK) {
        int c = (int)(n - i < CHUNK ? n - i : CHUNK);
        int rc = MPI_Allreduce(MPI_IN_PLACE, buf + i, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) return mpi_st(rc, "Allreduce", err, es);
    }
    return KHUB_STATUS_OK;
}

static khub_status all_gather(void *ud, const void *send, size_t bytes, void *recv, char *err,
                              size_t es)
{
    if (bytes > INT_MAX) {
        snprintf(err, es, "all-gather of %zu bytes per rank is over MPI's int count", bytes);
        return KHUB_STATUS_OVERFLOW;
    }
    int rc = MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, MPI_COMM_WORLD);
    return mpi_st(rc, "Allgather", err, es);
}

static khub_status broadcast(void *ud, void *buf, size_t bytes, int32_t root, char *err, size_t es)
{
    for (size_t i = 0; i < bytes; i += CHUNK) {
        int c = (int)(bytes - i < CHUNK ? bytes - i : CHUNK);
        int rc = MPI_Bcast((char *)buf + i, c, MPI_BYTE, root, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) return mpi_st(rc, "Bcast", err, es);
    }
    return KHUB_STATUS_OK;
}

static khub_status barrier(void *ud, char *err, size_t es)
{
    return mpi_st(MPI_Barrier(MPI_COMM_WORLD), "Barrier", err, es);
}

int cli_mpi_start(const char *cmd, int tp, int threaded, khub_comm *c)
{
    int provided = 0, rank = 0, size = 0;
    int want = threaded ? MPI_THREAD_SERIALIZED : MPI_THREAD_FUNNELED;
    if (MPI_Init_thread(NULL, NULL, want, &provided) != MPI_SUCCESS)
        return khub_cli_fail(cmd, "--tp %d: MPI_Init failed; launch with mpirun -np %d", tp, tp);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != tp) {
        if (rank == 0)
            khub_cli_fail(cmd,
                          "--tp %d but MPI started %d rank%s; launch as mpirun -np %d khub "
                          "%s --tp %d ...",
                          tp, size, size == 1 ? "" : "s", tp, cmd, tp);
        MPI_Finalize();
        return 1;
    }
    if (provided < want) {
        if (rank == 0)
            khub_cli_fail(cmd,
                          "--tp %d: this MPI gives thread level %d, and khub %s calls it from "
                          "%s (MPI_THREAD_%s)",
                          tp, provided, cmd, threaded ? "its engine thread" : "the main thread",
                          threaded ? "SERIALIZED" : "FUNNELED");
        MPI_Finalize();
        return 1;
    }
    *c = (khub_comm){KHUB_APP_INIT(khub_comm),
                     .rank = rank,
                     .size = size,
                     .ud = NULL,
                     .all_reduce_sum_f32 = all_reduce,
                     .all_gather = all_gather,
                     .broadcast = broadcast,
                     .barrier = barrier};
    return 0;
}

void cli_mpi_end(int failed)
{
    if (failed) {
        fflush(stdout);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, failed);
    }
    MPI_Finalize();
}

#else /* !KHUB_WITH_MPI */

int cli_mpi_start(const char *cmd, int tp, int threaded, khub_comm *c)
{
    (void)c, (void)threaded;
    return khub_cli_fail(cmd,
                         "--tp %d needs MPI, and this khub was built without it (install "
                         "libopenmpi-dev, tools/install-deps.sh, and configure again)",
                         tp);
}

void cli_mpi_end(int failed) { (void)failed; }

#endif
