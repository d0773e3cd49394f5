/*
 * khub_comm.h: a communicator for tensor parallelism: the collectives that
 * the ranks of one model call, as a table of functions the embedder fills.
 *
 * libkhub links no transport. An embedder that runs a model over several
 * processes (MPI ranks, say) wraps its engine's communicator in a
 * khub_comm and passes it with khub_model_opts.tp_size; `khub run --tp N`
 * under mpirun does so with MPI_COMM_WORLD (tools/cli/comm_mpi.c). Every
 * rank loads the same model with the same options, then:
 *
 *     khub_comm comm = {KHUB_APP_INIT(khub_comm)};
 *     ...          // rank, size, ud and the four functions, from your engine
 *     khub_model_opts mo = {KHUB_APP_INIT(khub_model_opts), .tp_size = comm.size,
 *                           .comm = &comm};
 *     khub_model *m = NULL;
 *     if (khub_model_load(rt, "model.gguf", &mo, &m) != KHUB_STATUS_OK)
 *         return 1;  // every rank fails alike: khub_runtime_errmsg(rt) says why
 *     if (comm.rank == 0) { // rank 0 drives: tokenizes, samples, prints
 *         const char *prompts[] = {"The capital of France is"};
 *         khub_generate_opts go = {KHUB_APP_INIT(khub_generate_opts), .max_new_tokens = 32};
 *         khub_generate_result res = {KHUB_APP_INIT(khub_generate_result)};
 *         if (khub_model_generate(m, prompts, 1, &go, &res) == KHUB_STATUS_OK)
 *             printf("%s\n", res.text);
 *         khub_generate_results_free(m, &res, 1);
 *     } else {
 *         khub_model_tp_serve(m); // runs rank 0's steps until it frees its model
 *     }
 *     khub_model_free(m);
 *
 * Contract of every function: collective (all ranks call it in the same
 * order with the same sizes), blocking, KHUB_STATUS_OK or a failure status
 * (KHUB_STATUS_IO for a transport failure) after which the job cannot go
 * on. A failing implementation may write one line into errbuf (errbuf_size
 * bytes, may be NULL). The table and ud are borrowed for the model's life.
 *
 * Anything not declared in abi/khub/ is not part of khub's API.
 */
#ifndef KHUB_COMM_H
#define KHUB_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "khub.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An application struct (abi/ABI.md: versioned by struct_size). Since 0.1. */
typedef struct khub_comm {
    KHUB_STRUCT_HEADER;
    int32_t rank; /* this process, [0, size) */
    int32_t size; /* ranks in the job */
    void *ud;     /* passed to every function; borrowed */
    /* buf[0..n) = the element-wise sum over ranks of every rank's buf. */
    khub_status (*all_reduce_sum_f32)(void *ud, float *buf, int64_t n, char *errbuf,
                                      size_t errbuf_size);
    /* recv[r * bytes .. (r + 1) * bytes) = rank r's send[0..bytes). */
    khub_status (*all_gather)(void *ud, const void *send, size_t bytes, void *recv, char *errbuf,
                              size_t errbuf_size);
    /* buf[0..bytes) = root's buf on every rank. */
    khub_status (*broadcast)(void *ud, void *buf, size_t bytes, int32_t root, char *errbuf,
                             size_t errbuf_size);
    khub_status (*barrier)(void *ud, char *errbuf, size_t errbuf_size);
} khub_comm;

#ifdef __cplusplus
}
#endif

#endif /* KHUB_COMM_H */
