/*
 * nccl.c: NCCL opened with dlopen at run time (nccl.h; issue 18 item 3).
 *
 * Like the CUDA driver (cuda.c), the library is a per-process resource:
 * opened once (pthread_once), never dlclosed, never linked, and nccl.h is
 * never included: the few types below are NCCL's by value (ncclResult_t,
 * ncclDataType_t and ncclRedOp_t are ints, ncclUniqueId is 128 bytes passed
 * by value, cudaStream_t is the driver's CUstream). Device memory, the
 * context and the stream come from the driver layer (cuda.h).
 *
 * The unique id that NCCL's ranks meet by is made on rank 0 and broadcast
 * over the job's own communicator (MPI under `khub --tp`, or whatever the
 * embedder filled khub_comm from): NCCL needs some channel besides itself
 * to bootstrap, and the job already has one. Rejected: a file or socket of
 * our own for the id (a second transport to configure and secure).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda.h"
#include "nccl.h"
#include "runtime_impl.h"

/* ======================================================================== */
/* NCCL's types (the subset we use, by value as in nccl.h)                  */
/* ======================================================================== */

typedef int nccl_result;
typedef struct nccl_comm *nccl_comm_t;
typedef struct {
    char internal[128]; /* NCCL_UNIQUE_ID_BYTES */
} nccl_id;

enum {
    NCCL_OK = 0,
    NCCL_UNHANDLED_CUDA = 1,
    NCCL_INVALID_ARGUMENT = 4,
    NCCL_INVALID_USAGE = 5,
    NCCL_UINT8 = 1,   /* ncclUint8 */
    NCCL_FLOAT32 = 7, /* ncclFloat32 */
    NCCL_SUM = 0      /* ncclSum */
};

typedef struct nccl_lib {
    void *lib;
    khub_status st; /* OK once usable */
    char err[320];
    int version;
    nccl_result (*get_version)(int *);
    nccl_result (*get_unique_id)(nccl_id *);
    nccl_result (*comm_init_rank)(nccl_comm_t *, int, nccl_id, int);
    nccl_result (*all_reduce)(const void *, void *, size_t, int, int, nccl_comm_t, void *);
    nccl_result (*all_gather)(const void *, void *, size_t, int, nccl_comm_t, void *);
    nccl_result (*comm_destroy)(nccl_comm_t);
    const char *(*get_error_string)(nccl_result);
} nccl_lib;

static nccl_lib lib;
static pthread_once_t lib_once = PTHREAD_ONCE_INIT;

struct khub__nccl {
    khub_comm comm;   /* what host_comm.c calls; ud = this */
    khub_comm job;    /* the host channel: broadcast, barrier */
    khub_runtime *rt; /* whose allocator this came from */
    nccl_comm_t nccl;
    int device;
    void *stream; /* CUstream on device */
};

/* ======================================================================== */
/* Opening the library                                                      */
/* ======================================================================== */

static void lib_open(void)
{
    const char *env = getenv("KHUB_NCCL_LIBRARY");
    const char *path = env && env[0] ? env : "libnccl.so.2";
    lib.st = KHUB_STATUS_NO_NCCL;
    dlerror();
    lib.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib.lib) {
        const char *e = dlerror();
        snprintf(lib.err, sizeof lib.err,
                 "no NCCL (%s: %s); install NCCL 2 (NVIDIA's repositories, or the "
                 "nvidia-nccl-cu13 wheel) or set KHUB_NCCL_LIBRARY to its libnccl.so.2",
                 path, e ? e : "not found");
        return;
    }
    const struct {
        const char *name;
        void **slot;
    } want[] = {
        {"ncclGetUniqueId", (void **)&lib.get_unique_id},
        {"ncclCommInitRank", (void **)&lib.comm_init_rank},
        {"ncclAllReduce", (void **)&lib.all_reduce},
        {"ncclAllGather", (void **)&lib.all_gather},
        {"ncclCommDestroy", (void **)&lib.comm_destroy},
        {"ncclGetErrorString", (void **)&lib.get_error_string},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        *want[i].slot = dlsym(lib.lib, want[i].name);
        if (!*want[i].slot) {
            snprintf(lib.err, sizeof lib.err, "NCCL library %s lacks %s; khub needs NCCL 2", path,
                     want[i].name);
            return;
        }
    }
    lib.get_version = (nccl_result(*)(int *))dlsym(lib.lib, "ncclGetVersion");
    if (!lib.get_version || lib.get_version(&lib.version) != NCCL_OK) lib.version = 0;
    lib.st = KHUB_STATUS_OK;
}

khub_status khub__nccl_open(int *version, char *err, size_t err_size)
{
    pthread_once(&lib_once, lib_open);
    if (version) *version = lib.version;
    if (lib.st != KHUB_STATUS_OK && err && err_size) snprintf(err, err_size, "%s", lib.err);
    return lib.st;
}

/* NCCL's result r of call `what` as a status, with NCCL's words in err. */
static khub_status nccl_check(nccl_result r, const char *what, char *err, size_t n)
{
    if (r == NCCL_OK) return KHUB_STATUS_OK;
    const char *text = lib.get_error_string ? lib.get_error_string(r) : NULL;
    if (err && n) snprintf(err, n, "%s failed: %s (ncclResult_t %d)", what, text ? text : "?", r);
    switch (r) {
    case NCCL_UNHANDLED_CUDA: return KHUB_STATUS_CUDA;
    case NCCL_INVALID_ARGUMENT: return KHUB_STATUS_INVALID_ARG;
    case NCCL_INVALID_USAGE: return KHUB_STATUS_INTERNAL;
    default: return KHUB_STATUS_IO;
    }
}

/* A driver call's failure (its message is khub__plugin_msg()) into err. */
static khub_status cuda_failed(khub_status st, char *err, size_t n)
{
    if (st != KHUB_STATUS_OK && err && n) snprintf(err, n, "%s", khub__plugin_msg());
    return st;
}

/* ======================================================================== */
/* The collectives                                                          */
/* ======================================================================== */

/* Waits for the collective queued on the stream: khub_comm's calls block. */
static khub_status drain(khub__nccl *nc, khub_status st, char *err, size_t n)
{
    if (st != KHUB_STATUS_OK) return st;
    khub__plugin_msg_clear();
    st = khub__cuda_use_device(nc->device);
    if (st == KHUB_STATUS_OK) st = khub__cuda_host_stream_sync(NULL, nc->stream);
    return cuda_failed(st, err, n);
}

static khub_status nc_all_reduce(void *ud, float *buf, int64_t n, char *err, size_t es)
{
    khub__nccl *nc = ud;
    if (n <= 0) return KHUB_STATUS_OK;
    khub_status st = cuda_failed(khub__cuda_use_device(nc->device), err, es);
    if (st != KHUB_STATUS_OK) return st;
    st = nccl_check(
        lib.all_reduce(buf, buf, (size_t)n, NCCL_FLOAT32, NCCL_SUM, nc->nccl, nc->stream),
        "ncclAllReduce", err, es);
    return drain(nc, st, err, es);
}

static khub_status nc_all_gather(void *ud, const void *send, size_t bytes, void *recv, char *err,
                                 size_t es)
{
    khub__nccl *nc = ud;
    if (bytes == 0) return KHUB_STATUS_OK;
    khub_status st = cuda_failed(khub__cuda_use_device(nc->device), err, es);
    if (st != KHUB_STATUS_OK) return st;
    st = nccl_check(lib.all_gather(send, recv, bytes, NCCL_UINT8, nc->nccl, nc->stream),
                    "ncclAllGather", err, es);
    return drain(nc, st, err, es);
}

/* Host buffers over the job's channel, as before. */
static khub_status nc_broadcast(void *ud, void *buf, size_t bytes, int32_t root, char *err,
                                size_t es)
{
    khub__nccl *nc = ud;
    return nc->job.broadcast(nc->job.ud, buf, bytes, root, err, es);
}

static khub_status nc_barrier(void *ud, char *err, size_t es)
{
    khub__nccl *nc = ud;
    return nc->job.barrier(nc->job.ud, err, es);
}

/* ======================================================================== */
/* Making and ending a communicator                                         */
/* ======================================================================== */

typedef struct open_rec {
    int32_t status;
    char msg[316];
} open_rec;

/* Every rank opens the library and learns whether every other could: a rank
 * without NCCL must not leave the others waiting for an id. */
static khub_status agree_open(khub_runtime *rt, const khub_comm *job, char *err, size_t n)
{
    open_rec mine = {0};
    mine.status = (int32_t)khub__nccl_open(NULL, mine.msg, sizeof mine.msg);
    open_rec *all = khub__calloc(rt, (size_t)job->size, sizeof *all);
    if (!all) {
        snprintf(err, n, "out of memory");
        return KHUB_STATUS_NOMEM;
    }
    khub_status st = job->all_gather(job->ud, &mine, sizeof mine, all, err, n);
    if (st == KHUB_STATUS_OK && mine.status != KHUB_STATUS_OK) { /* our own reason first */
        st = (khub_status)mine.status;
        snprintf(err, n, "%s", mine.msg);
    }
    for (int r = 0; r < job->size && st == KHUB_STATUS_OK; r++) {
        if (all[r].status == KHUB_STATUS_OK) continue;
        st = (khub_status)all[r].status;
        snprintf(err, n, "tp rank %d: %.300s", r, all[r].msg);
    }
    khub__free(rt, all, (size_t)job->size * sizeof *all);
    return st;
}

typedef struct id_rec {
    int32_t status;
    char msg[124];
    nccl_id id;
} id_rec;

/* Rank 0 makes the unique id; every rank gets it (or rank 0's failure). */
static khub_status share_id(const khub_comm *job, nccl_id *id, char *err, size_t n)
{
    id_rec rec = {0};
    if (job->rank == 0)
        rec.status = (int32_t)nccl_check(lib.get_unique_id(&rec.id), "ncclGetUniqueId", rec.msg,
                                         sizeof rec.msg);
    khub_status st = job->broadcast(job->ud, &rec, sizeof rec, 0, err, n);
    if (st != KHUB_STATUS_OK) return st;
    if (rec.status != KHUB_STATUS_OK) {
        snprintf(err, n, "tp rank 0: %s", rec.msg);
        return (khub_status)rec.status;
    }
    *id = rec.id;
    return KHUB_STATUS_OK;
}

khub_status khub__nccl_comm_new(khub_runtime *rt, const khub_comm *job, int device,
                                khub__nccl **out, char *err, size_t err_size)
{
    *out = NULL;
    khub_status st = agree_open(rt, job, err, err_size);
    nccl_id id;
    if (st == KHUB_STATUS_OK) st = share_id(job, &id, err, err_size);
    if (st != KHUB_STATUS_OK) return st;
    khub__nccl *nc = khub__calloc(rt, 1, sizeof *nc);
    if (!nc) {
        snprintf(err, err_size, "out of memory");
        return KHUB_STATUS_NOMEM;
    }
    nc->job = *job;
    nc->rt = rt;
    nc->device = device;
    /* ncclCommInitRank takes the device from the thread's current context,
     * and it blocks until every rank has joined. */
    khub__plugin_msg_clear();
    st = cuda_failed(khub__cuda_use_device(device), err, err_size);
    if (st == KHUB_STATUS_OK)
        st = nccl_check(lib.comm_init_rank(&nc->nccl, (int)job->size, id, (int)job->rank),
                        "ncclCommInitRank", err, err_size);
    if (st == KHUB_STATUS_OK)
        st = cuda_failed(khub__cuda_stream_open(device, &nc->stream), err, err_size);
    if (st != KHUB_STATUS_OK) {
        khub__nccl_comm_free(nc);
        return st;
    }
    nc->comm = (khub_comm){KHUB_APP_INIT(khub_comm),
                           .rank = job->rank,
                           .size = job->size,
                           .ud = nc,
                           .all_reduce_sum_f32 = nc_all_reduce,
                           .all_gather = nc_all_gather,
                           .broadcast = nc_broadcast,
                           .barrier = nc_barrier};
    *out = nc;
    return KHUB_STATUS_OK;
}

const khub_comm *khub__nccl_comm(const khub__nccl *nc) { return &nc->comm; }
int khub__nccl_device(const khub__nccl *nc) { return nc->device; }
void *khub__nccl_stream(const khub__nccl *nc) { return nc->stream; }

void khub__nccl_comm_free(khub__nccl *nc)
{
    if (!nc) return;
    if (nc->nccl) (void)lib.comm_destroy(nc->nccl);
    if (nc->stream) (void)khub__cuda_stream_close(nc->device, nc->stream);
    khub__free(nc->rt, nc, sizeof *nc);
}
