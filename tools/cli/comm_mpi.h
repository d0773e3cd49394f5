/*
 * comm_mpi.h: `khub run|chat|serve-model|bench-* --tp N` under mpirun: a khub_comm (khub_comm.h)
 * over MPI_COMM_WORLD, built when CMake found MPI (KHUB_WITH_MPI).
 */
#ifndef KHUB_CLI_COMM_MPI_H
#define KHUB_CLI_COMM_MPI_H

#include "khub/khub_comm.h"

/* Starts MPI and fills c with MPI_COMM_WORLD's collectives for `tp` ranks
 * of `khub <cmd>`; threaded: the collectives are called from a thread other
 * than main (one at a time: MPI_THREAD_SERIALIZED), else from main only.
 * 0 on success; otherwise prints why on stderr (no MPI in this build, not
 * launched by mpirun with -np tp, an MPI without the thread level) and
 * returns the exit code. */
int cli_mpi_start(const char *cmd, int tp, int threaded, khub_comm *c);
/* Ends MPI: MPI_Finalize, or, when failed, MPI_Abort, so that ranks
 * waiting in a collective for this one end too instead of hanging. */
void cli_mpi_end(int failed);

#endif /* KHUB_CLI_COMM_MPI_H */
