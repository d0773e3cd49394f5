/* test_nccl.c: the collectives of CUDA tensors go over NCCL
 * (runtime/device/nccl.c, runtime/loader/host_comm.c; issue 18 item 3),
 * without a GPU: the fake libnccl (tests/fake_nccl, through
 * KHUB_NCCL_LIBRARY) over the fake driver (tests/fake_cuda, dlopened by
 * path so that khub's "libcuda.so.1" finds it), two ranks as threads of
 * this process with tests/tp_thread_comm.h as the job's channel. The fake's
 * collectives really add and gather device memory (its device pointers are
 * host memory), and it records each call's count, type, op and stream.
 * Then the real library where one is installed (its path, symbols and
 * version; a real communicator needs a GPU: tools/gpu-check.sh). */
#include <dlfcn.h>
#include <pthread.h>

#include "cuda.h"
#include "nccl.h"
#include "plugins/tp_util.h"
#include "runtime_impl.h"
#include "tp_thread_comm.h"

#define FAKE_NCCL       KHUB_BINARY_DIR "/fake-nccl/libnccl.so.2"
#define FAKE_NCCL_NO_AG KHUB_BINARY_DIR "/fake-nccl-noallgather/libnccl.so.2"

enum { N = 1000 };

static long (*nccl_last)(int rank, const char *what);
static int (*nccl_groups)(void);
static long (*cuda_stat)(const char *what);

/* The fake driver with `gpus` GPUs of 1 MiB each, and the NCCL library at
 * path (the fake's hooks looked up when it is the fake). Each case runs in
 * a child process of its own, so the process-wide libraries start fresh. */
static void use_fakes(const char *gpus, const char *nccl)
{
    setenv("KHUB_FAKE_CUDA", gpus, 1);
    setenv("KHUB_FAKE_CUDA_MEM", "1048576", 1);
    void *cu = dlopen(KHUB_BINARY_DIR "/fake-cuda/libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    ASSERT(cu != NULL);
    cuda_stat = (long (*)(const char *))dlsym(cu, "khub_fake_cuda_stat");
    setenv("KHUB_NCCL_LIBRARY", nccl, 1);
    void *nc = dlopen(nccl, RTLD_NOW | RTLD_LOCAL);
    if (nc) {
        nccl_last = (long (*)(int, const char *))dlsym(nc, "khub_fake_nccl_last");
        nccl_groups = (int (*)(void))dlsym(nc, "khub_fake_nccl_groups");
    }
}

static khub_tensor cuda_vec(uint64_t dptr, khub_dtype dt, int64_t *n, int device)
{
    return (khub_tensor){.data = (void *)(uintptr_t)dptr,
                         .device = {KHUB_DEVICE_CUDA, device},
                         .ndim = 1,
                         .dtype = dt,
                         .shape = n};
}

/* ---- two ranks as threads --------------------------------------------- */

typedef struct rank_job {
    tc_group *g;
    tc_rank r;
    int rank;
    void (*body)(struct rank_job *j, khub_runtime *rt, const khub_host_api *h);
    khub_status st[8]; /* what the body saw, checked on the main thread */
    char msg[8][512];
    float sum[4];
    int32_t gathered[6];
    long stream_ok, init_calls;
} rank_job;

static void *rank_main(void *arg)
{
    rank_job *j = arg;
    khub_runtime *rt = tp_runtime(1);
    khub_comm c = tc_comm(j->g, &j->r, j->rank);
    khub__runtime_lend_comm(rt, &c, j); /* what a tp_size model does at load */
    j->body(j, rt, khub__runtime_host(rt));
    khub__runtime_return_comm(rt, j); /* ... and when it is freed */
    khub_runtime_free(rt);
    return NULL;
}

static void run_ranks(rank_job jobs[2],
                      void (*body)(rank_job *, khub_runtime *, const khub_host_api *))
{
    static tc_group g;
    tc_init(&g, 2);
    pthread_t t[2];
    for (int r = 0; r < 2; r++) {
        jobs[r] = (rank_job){.g = &g, .rank = r, .body = body};
        ASSERT_EQ(pthread_create(&t[r], NULL, rank_main, &jobs[r]), 0);
    }
    for (int r = 0; r < 2; r++) pthread_join(t[r], NULL);
    tc_destroy(&g);
}

/* Rank r's N floats r * 1000 + i on device 0, all-reduced; then 3 int32
 * per rank all-gathered into 6; then the all-reduce again. */
static void sum_and_gather(rank_job *j, khub_runtime *rt, const khub_host_api *h)
{
    float v[N];
    for (int i = 0; i < N; i++) v[i] = (float)(j->rank * 1000 + i);
    uint64_t d = 0, ds = 0, dr = 0;
    ASSERT_OK(khub__cuda_host_mem_alloc(NULL, 0, sizeof v, &d));
    ASSERT_OK(khub__cuda_host_memcpy_htod(NULL, d, v, sizeof v, NULL));
    int64_t n = N, n3 = 3, n6 = 6;
    khub_tensor t = cuda_vec(d, KHUB_DTYPE_F32, &n, 0);
    j->st[0] = h->comm_all_reduce_sum(h->host_ctx, &t);
    snprintf(j->msg[0], sizeof j->msg[0], "%s", khub__plugin_msg());
    if (j->st[0] != KHUB_STATUS_OK) return;
    /* The call the library saw: in place on this rank's pointer, N floats
     * (ncclFloat32 = 7), ncclSum (0), on the stream khub made for it. */
    ASSERT(rt->nccl != NULL);
    ASSERT_EQ(nccl_last(j->rank, "count"), N);
    ASSERT_EQ(nccl_last(j->rank, "datatype"), 7);
    ASSERT_EQ(nccl_last(j->rank, "op"), 0);
    ASSERT_EQ(nccl_last(j->rank, "send"), (long)d);
    ASSERT_EQ(nccl_last(j->rank, "recv"), (long)d);
    ASSERT_NE(nccl_last(j->rank, "stream"), 0);
    ASSERT_EQ(nccl_last(j->rank, "stream"), (long)(intptr_t)khub__nccl_stream(rt->nccl));
    ASSERT_EQ(nccl_last(j->rank, "nranks"), 2);
    ASSERT_OK(khub__cuda_host_memcpy_dtoh(NULL, v, d, sizeof v, NULL));
    j->sum[0] = v[0], j->sum[1] = v[1], j->sum[2] = v[N - 1];

    int32_t s[3] = {j->rank * 10 + 1, j->rank * 10 + 2, j->rank * 10 + 3}, back[6] = {0};
    ASSERT_OK(khub__cuda_host_mem_alloc(NULL, 0, sizeof s, &ds));
    ASSERT_OK(khub__cuda_host_mem_alloc(NULL, 0, sizeof back, &dr));
    ASSERT_OK(khub__cuda_host_memcpy_htod(NULL, ds, s, sizeof s, NULL));
    khub_tensor ts = cuda_vec(ds, KHUB_DTYPE_I32, &n3, 0),
                tr = cuda_vec(dr, KHUB_DTYPE_I32, &n6, 0);
    j->st[1] = h->comm_all_gather(h->host_ctx, &ts, &tr);
    ASSERT_EQ(nccl_last(j->rank, "count"), 12); /* bytes as ncclUint8 (1) */
    ASSERT_EQ(nccl_last(j->rank, "datatype"), 1);
    ASSERT_EQ(nccl_last(j->rank, "send"), (long)ds);
    ASSERT_EQ(nccl_last(j->rank, "recv"), (long)dr);
    ASSERT_OK(khub__cuda_host_memcpy_dtoh(NULL, back, dr, sizeof back, NULL));
    memcpy(j->gathered, back, sizeof back);

    j->st[2] = h->comm_all_reduce_sum(h->host_ctx, &t); /* the same communicator */
    ASSERT_OK(khub__cuda_host_memcpy_dtoh(NULL, v, d, sizeof v, NULL));
    j->sum[3] = v[1];
    j->init_calls = nccl_last(j->rank, "inits");
    ASSERT_OK(khub__cuda_host_mem_free(NULL, d));
    ASSERT_OK(khub__cuda_host_mem_free(NULL, ds));
    ASSERT_OK(khub__cuda_host_mem_free(NULL, dr));
}

TEST_IMPL(nccl_sums_and_gathers_cuda_tensors)
{
    use_fakes("12080:90", FAKE_NCCL);
    ASSERT(nccl_last != NULL);
    rank_job jobs[2];
    run_ranks(jobs, sum_and_gather);
    for (int r = 0; r < 2; r++) {
        ASSERT_STATUS(jobs[r].st[0], KHUB_STATUS_OK);
        ASSERT_OK(jobs[r].st[1]);
        ASSERT_OK(jobs[r].st[2]);
        ASSERT_EQ(jobs[r].sum[0], 1000);               /* 0 + 1000 */
        ASSERT_EQ(jobs[r].sum[1], 1002);               /* 1 + 1001 */
        ASSERT_EQ(jobs[r].sum[2], 2 * (N - 1) + 1000); /* 999 + 1999 */
        ASSERT_EQ(jobs[r].sum[3], 2004);               /* twice: 1002 + 1002 */
        int32_t want[6] = {1, 2, 3, 11, 12, 13};
        for (int i = 0; i < 6; i++) ASSERT_EQ(jobs[r].gathered[i], want[i]);
        ASSERT_EQ(jobs[r].init_calls, 1); /* one communicator for every call */
        ASSERT_EQ(nccl_last(r, "all_reduces"), 2);
        ASSERT_EQ(nccl_last(r, "all_gathers"), 1);
        ASSERT_EQ(nccl_last(r, "destroys"), 1); /* when the model gave the comm back */
    }
    ASSERT_EQ(nccl_groups(), 1); /* both joined rank 0's id: it was broadcast */
    ASSERT_EQ(cuda_stat("streams_live"), 0);
    ASSERT_EQ(cuda_stat("allocs_live"), 0);
}

/* Every rank's first CUDA all-reduce, status and message, then nothing. */
static void one_reduce(rank_job *j, khub_runtime *rt, const khub_host_api *h)
{
    (void)rt;
    uint64_t d = 0;
    float v[4] = {1, 2, 3, 4};
    ASSERT_OK(khub__cuda_host_mem_alloc(NULL, 0, sizeof v, &d));
    ASSERT_OK(khub__cuda_host_memcpy_htod(NULL, d, v, sizeof v, NULL));
    int64_t n = 4;
    khub_tensor t = cuda_vec(d, KHUB_DTYPE_F32, &n, 0);
    khub__plugin_msg_clear();
    j->st[0] = h->comm_all_reduce_sum(h->host_ctx, &t);
    snprintf(j->msg[0], sizeof j->msg[0], "%s", khub__plugin_msg());
    ASSERT_OK(khub__cuda_host_mem_free(NULL, d));
}

TEST_IMPL(nccl_absent_is_named)
{
    use_fakes("12080:90", "/nonexistent/libnccl.so.2");
    rank_job jobs[2];
    run_ranks(jobs, one_reduce);
    for (int r = 0; r < 2; r++) {
        ASSERT_STATUS(jobs[r].st[0], KHUB_STATUS_NO_NCCL);
        char want[512];
        snprintf(want, sizeof want,
                 "host: comm_all_reduce_sum: tp rank %d of 2: no NCCL (/nonexistent/libnccl.so.2: "
                 "/nonexistent/libnccl.so.2: cannot open shared object file: No such file or "
                 "directory); install NCCL 2 (NVIDIA's repositories, or the nvidia-nccl-cu13 "
                 "wheel) or set KHUB_NCCL_LIBRARY to its libnccl.so.2",
                 r);
        ASSERT_STR_EQ(jobs[r].msg[0], want);
    }
}

TEST_IMPL(nccl_missing_symbol_is_named)
{
    use_fakes("12080:90", FAKE_NCCL_NO_AG);
    char err[512] = "";
    int version = -1;
    ASSERT_STATUS(khub__nccl_open(&version, err, sizeof err), KHUB_STATUS_NO_NCCL);
    ASSERT_STR_EQ(err, "NCCL library " FAKE_NCCL_NO_AG " lacks ncclAllGather; khub needs NCCL 2");
    rank_job jobs[2];
    run_ranks(jobs, one_reduce);
    for (int r = 0; r < 2; r++) {
        ASSERT_STATUS(jobs[r].st[0], KHUB_STATUS_NO_NCCL);
        ASSERT_CONTAINS(jobs[r].msg[0], "lacks ncclAllGather");
    }
}

/* NCCL's results as khub statuses, with NCCL's own words: each failing
 * call fails on both ranks (the fake's injection), so nothing hangs. */
static const struct {
    int result;
    khub_status st;
    const char *text;
} mapped[] = {
    {1, KHUB_STATUS_CUDA, "unhandled cuda error (run with NCCL_DEBUG=INFO for details)"},
    {2, KHUB_STATUS_IO, "unhandled system error (run with NCCL_DEBUG=INFO for details)"},
    {3, KHUB_STATUS_IO, "internal error - please report this issue to the NCCL developers"},
    {4, KHUB_STATUS_INVALID_ARG, "invalid argument (run with NCCL_DEBUG=WARN for details)"},
    {5, KHUB_STATUS_INTERNAL, "invalid usage (run with NCCL_DEBUG=WARN for details)"},
    {6, KHUB_STATUS_IO, "remote process exited or there was a network error"},
};
enum { N_MAPPED = sizeof mapped / sizeof mapped[0] };

static void failing_calls(rank_job *j, khub_runtime *rt, const khub_host_api *h)
{
    (void)rt;
    uint64_t d = 0;
    ASSERT_OK(khub__cuda_host_mem_alloc(NULL, 0, 16, &d));
    int64_t n = 4;
    khub_tensor t = cuda_vec(d, KHUB_DTYPE_F32, &n, 0);
    ASSERT_OK(h->comm_all_reduce_sum(h->host_ctx, &t)); /* makes the communicator */
    for (int k = 0; k < N_MAPPED; k++) {
        if (j->rank == 0) {
            char v[64];
            snprintf(v, sizeof v, "ncclAllReduce=%d", mapped[k].result);
            setenv("KHUB_FAKE_NCCL_FAIL", v, 1);
        }
        tc_barrier(&j->r, NULL, 0); /* the variable is set before anyone reads it */
        khub__plugin_msg_clear();
        j->st[k] = h->comm_all_reduce_sum(h->host_ctx, &t);
        snprintf(j->msg[k], sizeof j->msg[k], "%s", khub__plugin_msg());
        tc_barrier(&j->r, NULL, 0); /* ... and read before it changes */
    }
    ASSERT_OK(khub__cuda_host_mem_free(NULL, d));
}

TEST_IMPL(nccl_results_become_statuses)
{
    use_fakes("12080:90", FAKE_NCCL);
    rank_job jobs[2];
    run_ranks(jobs, failing_calls);
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < N_MAPPED; k++) {
            ASSERT_STATUS(jobs[r].st[k], mapped[k].st);
            char want[512];
            snprintf(want, sizeof want,
                     "host: comm_all_reduce_sum: tp rank %d of 2: ncclAllReduce failed: %s "
                     "(ncclResult_t %d)",
                     r, mapped[k].text, mapped[k].result);
            ASSERT_STR_EQ(jobs[r].msg[k], want);
        }
}

TEST_IMPL(nccl_init_failures_reach_every_rank)
{
    use_fakes("12080:90", FAKE_NCCL);
    /* rank 0 cannot make the id: rank 1 learns it over the job's channel */
    setenv("KHUB_FAKE_NCCL_FAIL", "ncclGetUniqueId=2", 1);
    rank_job jobs[2];
    run_ranks(jobs, one_reduce);
    for (int r = 0; r < 2; r++) {
        ASSERT_STATUS(jobs[r].st[0], KHUB_STATUS_IO);
        char want[512];
        snprintf(want, sizeof want,
                 "host: comm_all_reduce_sum: tp rank %d of 2: tp rank 0: ncclGetUniqueId failed: "
                 "unhandled system error (run with NCCL_DEBUG=INFO for details) (ncclResult_t 2)",
                 r);
        ASSERT_STR_EQ(jobs[r].msg[0], want);
    }
    setenv("KHUB_FAKE_NCCL_FAIL", "ncclCommInitRank=1", 1);
    run_ranks(jobs, one_reduce);
    for (int r = 0; r < 2; r++) {
        ASSERT_STATUS(jobs[r].st[0], KHUB_STATUS_CUDA);
        ASSERT_CONTAINS(jobs[r].msg[0], "ncclCommInitRank failed: unhandled cuda error");
    }
    ASSERT_EQ(cuda_stat("streams_live"), 0);
}

/* One GPU per rank: a tensor on another device than the communicator's. */
static void two_devices(rank_job *j, khub_runtime *rt, const khub_host_api *h)
{
    (void)rt;
    uint64_t d = 0;
    ASSERT_OK(khub__cuda_host_mem_alloc(NULL, 0, 16, &d));
    int64_t n = 4;
    khub_tensor t = cuda_vec(d, KHUB_DTYPE_F32, &n, 0);
    ASSERT_OK(h->comm_all_reduce_sum(h->host_ctx, &t));
    t.device.device_id = 1;
    khub__plugin_msg_clear();
    j->st[0] = h->comm_all_reduce_sum(h->host_ctx, &t);
    snprintf(j->msg[0], sizeof j->msg[0], "%s", khub__plugin_msg());
    float h8[8];
    int64_t n8 = 8;
    khub_tensor host = {.data = h8,
                        .device = {KHUB_DEVICE_CPU, 0},
                        .ndim = 1,
                        .dtype = KHUB_DTYPE_F32,
                        .shape = &n8};
    khub__plugin_msg_clear();
    j->st[1] = h->comm_all_gather(h->host_ctx, &t, &host);
    snprintf(j->msg[1], sizeof j->msg[1], "%s", khub__plugin_msg());
    ASSERT_OK(khub__cuda_host_mem_free(NULL, d));
}

TEST_IMPL(nccl_refuses_a_second_device)
{
    use_fakes("12080:90,90", FAKE_NCCL);
    rank_job jobs[2];
    run_ranks(jobs, two_devices);
    for (int r = 0; r < 2; r++) {
        ASSERT_STATUS(jobs[r].st[0], KHUB_STATUS_INVALID_ARG);
        ASSERT_STR_EQ(jobs[r].msg[0], "host: comm_all_reduce_sum: the tensor is on CUDA device 1, "
                                      "and this rank's NCCL communicator on device 0 (one GPU "
                                      "per rank)");
        ASSERT_STATUS(jobs[r].st[1], KHUB_STATUS_INVALID_ARG);
        ASSERT_STR_EQ(jobs[r].msg[1], "host: comm_all_gather: send is on device type 2 id 1 "
                                      "and recv on type 1 id 0; both must be on the same device");
    }
}

/* Without a job a CUDA tensor's collectives are those of a job of one, and
 * NCCL is never opened. */
TEST_IMPL(nccl_not_used_without_a_job)
{
    use_fakes("12080:90", "/nonexistent/libnccl.so.2");
    khub_runtime *rt = tp_runtime(1);
    const khub_host_api *h = khub__runtime_host(rt);
    float v[4] = {1, 2, 3, 4}, back[4] = {0};
    uint64_t d = 0, dr = 0;
    ASSERT_OK(khub__cuda_host_mem_alloc(NULL, 0, sizeof v, &d));
    ASSERT_OK(khub__cuda_host_mem_alloc(NULL, 0, sizeof v, &dr));
    ASSERT_OK(khub__cuda_host_memcpy_htod(NULL, d, v, sizeof v, NULL));
    int64_t n = 4;
    khub_tensor t = cuda_vec(d, KHUB_DTYPE_F32, &n, 0), tr = cuda_vec(dr, KHUB_DTYPE_F32, &n, 0);
    ASSERT_OK(h->comm_all_reduce_sum(h->host_ctx, &t));
    ASSERT_OK(h->comm_all_gather(h->host_ctx, &t, &tr));
    ASSERT_OK(khub__cuda_host_memcpy_dtoh(NULL, back, dr, sizeof back, NULL));
    for (int i = 0; i < 4; i++) ASSERT_EQ(back[i], v[i]);
    ASSERT(rt->nccl == NULL);
    ASSERT_OK(khub__cuda_host_mem_free(NULL, d));
    ASSERT_OK(khub__cuda_host_mem_free(NULL, dr));
    khub_runtime_free(rt);
}

/* The real library, by its soname on the loader's path: where it is
 * installed (this machine: CUDA 13's libnccl.so.2) khub resolves every
 * symbol and reads its version; where it is not, the message names it. A
 * communicator on it needs a GPU (tools/gpu-check.sh). */
TEST_IMPL(nccl_real_library)
{
    unsetenv("KHUB_NCCL_LIBRARY");
    void *real = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    char err[512] = "";
    int version = -1;
    khub_status st = khub__nccl_open(&version, err, sizeof err);
    if (real) {
        ASSERT_STATUS(st, KHUB_STATUS_OK);
        ASSERT(version >= 20000 && version < 30000);
        printf("libnccl.so.2 is NCCL %d\n", version);
    } else {
        ASSERT_STATUS(st, KHUB_STATUS_NO_NCCL);
        ASSERT_CONTAINS(err, "no NCCL (libnccl.so.2: ");
        ASSERT_CONTAINS(err, "set KHUB_NCCL_LIBRARY");
    }
}

#define TEST_LIST(X) \
    X(nccl_sums_and_gathers_cuda_tensors) \
    X(nccl_absent_is_named) \
    X(nccl_missing_symbol_is_named) \
    X(nccl_results_become_statuses) \
    X(nccl_init_failures_reach_every_rank) \
    X(nccl_refuses_a_second_device) \
    X(nccl_not_used_without_a_job) \
    X(nccl_real_library)
TEST_MAIN(TEST_LIST)
