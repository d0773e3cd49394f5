/*
 * nccl.h: NCCL, the collectives for CUDA tensors of a tensor-parallel job
 * (runtime/device/nccl.c; issue 18 item 3), opened with dlopen at run time
 * and never linked, like the CUDA driver (cuda.h).
 *
 * The library is $KHUB_NCCL_LIBRARY when set (a path), else "libnccl.so.2"
 * on the dynamic loader's path. A communicator is a khub_comm whose
 * all_reduce_sum_f32 and all_gather take device pointers (CUdeviceptr cast
 * to a pointer) of one CUDA device and run on a stream of its own; its
 * broadcast and barrier are the job's, the host channel that NCCL's unique
 * id travelled over. Each collective returns when its result is in device
 * memory (the stream is synchronised), as khub_comm's contract asks.
 *
 * Errors follow khub_comm's convention: a status and one line in err.
 * NCCL's results become khub statuses with NCCL's own text:
 *   ncclUnhandledCudaError  KHUB_STATUS_CUDA
 *   ncclInvalidArgument     KHUB_STATUS_INVALID_ARG
 *   ncclInvalidUsage        KHUB_STATUS_INTERNAL (khub called it wrongly)
 *   any other failure       KHUB_STATUS_IO (system, internal, remote: the
 *                           transport; the job cannot go on)
 */
#ifndef KHUB_RUNTIME_NCCL_H
#define KHUB_RUNTIME_NCCL_H

#include "internal.h"
#include "khub/khub_comm.h"

typedef struct khub__nccl khub__nccl;

/* Opens the library once per process and resolves ncclGetUniqueId,
 * ncclCommInitRank, ncclAllReduce, ncclAllGather, ncclCommDestroy and
 * ncclGetErrorString (ncclGetVersion when present). OK and *version (e.g.
 * 22809 for 2.28.9; 0 when the library does not say), or NO_NCCL with the
 * library named in err: absent ("no NCCL (libnccl.so.2: <dlerror>); ...")
 * or lacking a symbol. version may be NULL. Thread-safe. */
KHUB_INTERNAL khub_status khub__nccl_open(int *version, char *err, size_t err_size);

/* Collective over job (every rank calls it at the same point):
 * every rank opens NCCL and says whether it could (so all fail alike, with
 * the failing rank's reason), rank 0 makes the unique id and broadcasts it
 * over job, and each rank joins with ncclCommInitRank on `device` and makes
 * a stream there. job is copied; its ud must outlive the communicator,
 * which is allocated with rt's allocator. */
KHUB_INTERNAL khub_status khub__nccl_comm_new(khub_runtime *rt, const khub_comm *job, int device,
                                              khub__nccl **out, char *err, size_t err_size);
/* The communicator as a khub_comm (valid until khub__nccl_comm_free). */
KHUB_INTERNAL const khub_comm *khub__nccl_comm(const khub__nccl *nc);
/* The CUDA device and the stream (a CUstream) the collectives run on. */
KHUB_INTERNAL int khub__nccl_device(const khub__nccl *nc);
KHUB_INTERNAL void *khub__nccl_stream(const khub__nccl *nc);
/* ncclCommDestroy, then the stream. Accepts NULL. */
KHUB_INTERNAL void khub__nccl_comm_free(khub__nccl *nc);

#endif /* KHUB_RUNTIME_NCCL_H */
