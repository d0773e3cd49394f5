/* test_host_api.c: the host table as a plugin sees it (from inside an op),
 * the runtime's own table and its thread pool (parallel_for), and the CUDA
 * layer without a driver. */
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "cuda.h"
#include "plugins/tp_args.h"
#include "plugins/tp_util.h"
#include "runtime_impl.h"

static char logged[2048];
static void capture(void *ud, khub_log_level level, const char *msg)
{
    (void)ud, (void)level;
    snprintf(logged + strlen(logged), sizeof logged - strlen(logged), "%s\n", msg);
}

static bool have_cuda(void) { return khub__cuda_info(NULL, NULL, NULL) == KHUB_STATUS_OK; }

TEST_IMPL(host_table_from_an_op)
{
    khub_runtime_opts o = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = 2, .log = capture};
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(&o, &rt));
    tp_load(rt, "good_v1");
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query), .kind = KHUB_OP_ROTARY, .dtype_id = -1};
    khub_binding *b = NULL;
    ASSERT_OK(khub_registry_select(rt, &q, &b));
    unsigned char marks[1000] = {0};
    tp_host_args a = {.n = 1000, .marks = marks};
    logged[0] = '\0';
    ASSERT_OK(khub_binding_call(b, &a));
    for (int i = 0; i < 1000; i++) ASSERT_EQ(marks[i], 1);
    ASSERT_EQ(a.n_threads, 2);
    ASSERT_EQ(a.cpu_features, khub_cpu_features());
    ASSERT_EQ(a.aligned, 1);
    ASSERT_EQ(a.artifact_st, KHUB_STATUS_NOT_FOUND);
    if (have_cuda())
        ASSERT_EQ(a.cuda_st, KHUB_STATUS_OK);
    else
        ASSERT_EQ(a.cuda_st, KHUB_STATUS_NO_CUDA);
    /* host->log goes to the runtime's callback, prefixed with the plugin id. */
    ASSERT_CONTAINS(logged, "khub-test/good: host op ran on 2 threads\n");
    khub_runtime_free(rt);
}

TEST_IMPL(each_plugin_gets_its_own_context)
{
    khub_runtime *rt = tp_runtime(1);
    khub_plugin *v1 = tp_load(rt, "good_v1");
    khub_plugin *v2 = tp_load(rt, "good_v2");
    ASSERT(v1->host.host_ctx == &v1->hctx);
    ASSERT(v2->host.host_ctx == &v2->hctx);
    ASSERT(v1->hctx.plugin == v1 && v1->hctx.rt == rt);
    ASSERT_EQ(v1->host.struct_size, sizeof(khub_host_api));
    ASSERT_EQ(v1->host.abi_major, KHUB_ABI_MAJOR);
    khub_runtime_free(rt);
}

TEST_IMPL(runtime_host_table)
{
    khub_runtime *rt = tp_runtime(1);
    const khub_host_api *h = khub__runtime_host(rt);
    ASSERT(h != NULL);
    ASSERT(h == khub__runtime_host(rt));
    ASSERT_EQ(h->struct_size, sizeof *h);
    ASSERT_EQ(h->n_threads(h->host_ctx), 1);
    void *p = h->alloc(h->host_ctx, 4096);
    ASSERT(p != NULL && (uintptr_t)p % 64 == 0);
    memset(p, 1, 4096);
    h->free(h->host_ctx, p);
    h->free(h->host_ctx, NULL);
    khub__plugin_msg_clear();
    ASSERT_STATUS(h->fail(h->host_ctx, KHUB_STATUS_IO, "disk %d on fire", 3), KHUB_STATUS_IO);
    ASSERT_STR_EQ(khub__plugin_msg(), "disk 3 on fire");
    const void *data = (const void *)1;
    size_t size = 9;
    ASSERT_STATUS(h->artifact(h->host_ctx, "k.ptx", &data, &size), KHUB_STATUS_NOT_FOUND);
    ASSERT(data == NULL && size == 0);
    ASSERT_CONTAINS(khub__plugin_msg(), "artifact k.ptx: host was loaded without an artifact");
    khub_runtime_free(rt);
}

TEST_IMPL(cuda_without_driver)
{
    if (have_cuda()) TEST_SKIP("a CUDA driver is present; this case checks its absence");
    khub_runtime *rt = tp_runtime(1);
    int ver = -1, n = -1;
    ASSERT_STATUS(khub__cuda_info(rt, &ver, &n), KHUB_STATUS_NO_CUDA);
    ASSERT_EQ(ver, 0);
    ASSERT_EQ(n, 0);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "no CUDA driver (libcuda.so.1: ");
    const khub_host_api *h = khub__runtime_host(rt);
    int count = -1;
    uint64_t dptr = 1;
    khub__plugin_msg_clear();
    ASSERT_STATUS(h->cuda_device_count(h->host_ctx, &count), KHUB_STATUS_NO_CUDA);
    ASSERT_EQ(count, 0);
    ASSERT_CONTAINS(khub__plugin_msg(), "no CUDA driver (libcuda.so.1: ");
    ASSERT_STATUS(h->cuda_mem_alloc(h->host_ctx, 0, 64, &dptr), KHUB_STATUS_NO_CUDA);
    ASSERT_EQ(dptr, 0);
    ASSERT_STATUS(h->cuda_stream_sync(h->host_ctx, NULL), KHUB_STATUS_NO_CUDA);
    ASSERT(KHUB_HAS_FIELD(h, khub_host_api, cuda_stream_destroy)); /* added in ABI 1.2 */
    void *stream = (void *)1;
    ASSERT_STATUS(h->cuda_stream_create(h->host_ctx, 0, &stream), KHUB_STATUS_NO_CUDA);
    ASSERT(stream == NULL);
    ASSERT_CONTAINS(khub__plugin_msg(), "no CUDA driver (libcuda.so.1: ");
    ASSERT_OK(h->cuda_stream_destroy(h->host_ctx, NULL)); /* NULL is always fine */
    khub_cuda_module *m = (khub_cuda_module *)1;
    ASSERT_STATUS(h->cuda_module_load(h->host_ctx, 0, ".version 8.0\n", 14, &m),
                  KHUB_STATUS_NO_CUDA);
    ASSERT(m == NULL);
    int cc = -1;
    ASSERT_STATUS(khub__cuda_device_cc(rt, 0, &cc), KHUB_STATUS_NO_CUDA);
    khub_runtime_free(rt);
}

/* With a driver (GPU machines): memory round trip and a PTX kernel. */
static const char add_one_ptx[] =
    ".version 7.0\n.target sm_52\n.address_size 64\n"
    ".visible .entry add_one(.param .u64 p)\n{\n"
    "  .reg .u64 %rd<3>;\n  .reg .f32 %f<3>;\n  .reg .u32 %r<2>;\n"
    "  ld.param.u64 %rd1, [p];\n  cvta.to.global.u64 %rd1, %rd1;\n"
    "  mov.u32 %r1, %tid.x;\n  mul.wide.u32 %rd2, %r1, 4;\n  add.u64 %rd1, %rd1, %rd2;\n"
    "  ld.global.f32 %f1, [%rd1];\n  add.f32 %f2, %f1, 0f3F800000;\n"
    "  st.global.f32 [%rd1], %f2;\n  ret;\n}\n";

TEST_IMPL(cuda_roundtrip_and_launch)
{
    if (!have_cuda()) TEST_SKIP("no CUDA driver on this machine");
    khub_runtime *rt = tp_runtime(1);
    khub_plugin *p = tp_load(rt, "good_v1");
    const khub_host_api *h = &p->host;
    int n = 0, cc = 0;
    ASSERT_OK(h->cuda_device_count(h->host_ctx, &n));
    if (n == 0) TEST_SKIP("driver present but no device");
    ASSERT_OK(h->cuda_device_cc(h->host_ctx, 0, &cc));
    ASSERT(cc >= 50);
    float host[32], back[32];
    for (int i = 0; i < 32; i++) host[i] = (float)i;
    uint64_t d = 0;
    void *stream = NULL, *left = NULL;
    ASSERT_OK(h->cuda_stream_create(h->host_ctx, 0, &stream));
    ASSERT_OK(h->cuda_stream_create(h->host_ctx, 0, &left)); /* the host destroys it at retire */
    ASSERT(stream != NULL && left != NULL && stream != left);
    ASSERT_OK(h->cuda_mem_alloc(h->host_ctx, 0, sizeof host, &d));
    ASSERT_OK(h->cuda_memcpy_htod(h->host_ctx, d, host, sizeof host, stream));
    ASSERT_OK(h->cuda_stream_sync(h->host_ctx, stream));
    khub_cuda_module *m = NULL;
    void *fn = NULL;
    ASSERT_OK(h->cuda_module_load(h->host_ctx, 0, add_one_ptx, sizeof add_one_ptx, &m));
    ASSERT_OK(h->cuda_module_function(h->host_ctx, m, "add_one", &fn));
    khub_cuda_launch_cfg cfg = {KHUB_STRUCT_INIT(khub_cuda_launch_cfg), .grid = {1, 1, 1},
                                .block = {32, 1, 1}};
    void *params[] = {&d};
    ASSERT_OK(h->cuda_launch(h->host_ctx, fn, &cfg, params));
    ASSERT_OK(h->cuda_memcpy_dtoh(h->host_ctx, back, d, sizeof back, NULL));
    ASSERT_OK(h->cuda_stream_sync(h->host_ctx, NULL));
    for (int i = 0; i < 32; i++) ASSERT_EQ(back[i], i + 1);
    ASSERT_OK(h->cuda_mem_free(h->host_ctx, d));
    ASSERT_OK(h->cuda_stream_destroy(h->host_ctx, stream));
    khub__plugin_msg_clear();
    ASSERT_STATUS(h->cuda_stream_destroy(h->host_ctx, stream), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub__plugin_msg(), "is not a stream khub-test/good created");
    ASSERT(p->modules != NULL); /* recorded; unloaded when the plugin retires */
    ASSERT(p->streams != NULL && p->streams->stream == left && p->streams->next == NULL);
    khub_runtime_free(rt);
}

/* parallel_for on the runtime's pool: thread t of n runs the t-th of n
 * contiguous chunks, the caller being thread 0; the other chunks run on the
 * workers or, when a worker is late, on the caller after its own chunk
 * (runtime_pool_caller_takes_late_chunks); every item runs once; a call
 * from inside a job runs inline; the pool has one thread per core unless
 * told otherwise. */
enum { PF_ITEMS = 1000, PF_THREADS = 3 };
typedef struct pf_job {
    const khub_host_api *h;
    atomic_int hits[PF_ITEMS];
    atomic_int chunks, inner;
    pthread_t who[PF_THREADS];
    int64_t begin[PF_THREADS], end[PF_THREADS];
    int nest;
} pf_job;

static void pf_inner(void *ud, int64_t begin, int64_t end, int thread)
{
    pf_job *j = ud;
    ASSERT_EQ(thread, 0); /* inline: one chunk, the whole range */
    atomic_fetch_add(&j->inner, (int)(end - begin));
}

static void pf_body(void *ud, int64_t begin, int64_t end, int thread)
{
    pf_job *j = ud;
    ASSERT(thread >= 0 && thread < PF_THREADS);
    j->who[thread] = pthread_self();
    j->begin[thread] = begin;
    j->end[thread] = end;
    atomic_fetch_add(&j->chunks, 1);
    for (int64_t i = begin; i < end; i++) atomic_fetch_add(&j->hits[i], 1);
    if (j->nest) j->h->parallel_for(j->h->host_ctx, 10, pf_inner, j);
}

/* This process's threads, from /proc/self/task. */
static int thread_count(void)
{
    DIR *d = opendir("/proc/self/task");
    ASSERT(d != NULL);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

TEST_IMPL(runtime_pool_parallel_for)
{
    int before = thread_count();
    khub_runtime *rt = tp_runtime(PF_THREADS);
    static pf_job j;
    j.h = khub__runtime_host(rt);
    ASSERT_EQ(j.h->n_threads(j.h->host_ctx), PF_THREADS);
    /* The workers start with the first job: a runtime that only loads
     * plugins never creates a thread. */
    ASSERT_EQ(thread_count(), before);
    j.h->parallel_for(j.h->host_ctx, 1, pf_body, &j); /* one item: inline, still none */
    ASSERT_EQ(thread_count(), before);
    for (int round = 0; round < 50; round++) { /* the pool is reused, job after job */
        for (int i = 0; i < PF_ITEMS; i++) atomic_store(&j.hits[i], 0);
        atomic_store(&j.chunks, 0);
        j.h->parallel_for(j.h->host_ctx, PF_ITEMS, pf_body, &j);
        ASSERT_EQ(atomic_load(&j.chunks), PF_THREADS);
        for (int i = 0; i < PF_ITEMS; i++) ASSERT_EQ(atomic_load(&j.hits[i]), 1);
    }
    ASSERT_EQ(j.begin[0], 0);
    ASSERT_EQ(j.end[PF_THREADS - 1], PF_ITEMS);
    for (int t = 1; t < PF_THREADS; t++) ASSERT_EQ(j.begin[t], j.end[t - 1]);
    ASSERT(pthread_equal(j.who[0], pthread_self()));
    ASSERT_EQ(thread_count(), before + PF_THREADS - 1);

    j.nest = 1; /* nested from every thread: inline, no deadlock */
    atomic_store(&j.chunks, 0);
    j.h->parallel_for(j.h->host_ctx, PF_THREADS, pf_body, &j);
    ASSERT_EQ(atomic_load(&j.chunks), PF_THREADS);
    ASSERT_EQ(atomic_load(&j.inner), 10 * PF_THREADS);
    j.nest = 0;
    atomic_store(&j.chunks, 0);
    j.h->parallel_for(j.h->host_ctx, 0, pf_body, &j); /* nothing to do: not called */
    ASSERT_EQ(atomic_load(&j.chunks), 0);
    khub_runtime_free(rt);
    ASSERT_EQ(thread_count(), before); /* joined */

    rt = tp_runtime(0);
    const khub_host_api *h = khub__runtime_host(rt);
    ASSERT_EQ(h->n_threads(h->host_ctx), (int)sysconf(_SC_NPROCESSORS_ONLN));
    khub_runtime_free(rt);
}

/* A worker that is late for a job (here asleep on the pool's condition
 * variable after an idle spell, so a futex wake away) does not make the
 * caller wait: the caller, done with chunk 0 in no time, runs chunk 1
 * itself, with chunk 1's range and `thread` 1, and the worker, when it
 * comes, finds nothing left. A worker could in principle win the race each
 * time; over 50 jobs the caller must win at least once (without the
 * claim it never does, however long the wait). */
typedef struct late_job {
    pthread_t who[2];
    int64_t begin[2], end[2];
    atomic_int runs;
} late_job;

static void late_body(void *ud, int64_t begin, int64_t end, int thread)
{
    late_job *j = ud;
    ASSERT(thread == 0 || thread == 1);
    j->who[thread] = pthread_self();
    j->begin[thread] = begin;
    j->end[thread] = end;
    atomic_fetch_add(&j->runs, 1);
}

TEST_IMPL(runtime_pool_caller_takes_late_chunks)
{
    khub_runtime *rt = tp_runtime(2);
    const khub_host_api *h = khub__runtime_host(rt);
    late_job j = {0};
    h->parallel_for(h->host_ctx, 2, late_body, &j); /* starts the worker */
    int by_caller = 0;
    for (int round = 0; round < 50 && !by_caller; round++) {
        usleep(20000); /* past the worker's spin: it sleeps */
        atomic_store(&j.runs, 0);
        h->parallel_for(h->host_ctx, 5, late_body, &j);
        ASSERT_EQ(atomic_load(&j.runs), 2);
        ASSERT(pthread_equal(j.who[0], pthread_self()));
        ASSERT_EQ(j.begin[0], 0);
        ASSERT_EQ(j.end[0], 3);
        ASSERT_EQ(j.begin[1], 3);
        ASSERT_EQ(j.end[1], 5);
        by_caller = pthread_equal(j.who[1], pthread_self());
    }
    ASSERT(by_caller);
    khub_runtime_free(rt);
}

/* ======================================================================== */
/* Collectives (ABI 1.5)                                                    */
/* ======================================================================== */

/* A job of two whose other rank adds 10 to every element and sends {7, 7}
 * bytes of 0x5A; fail_with makes the next call fail like a transport. */
typedef struct fake_job {
    int calls;
    khub_status fail_with;
} fake_job;

static khub_status fake_reduce(void *ud, float *buf, int64_t n, char *err, size_t es)
{
    fake_job *j = ud;
    j->calls++;
    if (j->fail_with) return snprintf(err, es, "peer 1 hung up"), j->fail_with;
    for (int64_t i = 0; i < n; i++) buf[i] += 10.0f;
    return KHUB_STATUS_OK;
}

static khub_status fake_gather(void *ud, const void *send, size_t bytes, void *recv, char *err,
                               size_t es)
{
    (void)err, (void)es;
    ((fake_job *)ud)->calls++;
    memcpy(recv, send, bytes);
    memset((char *)recv + bytes, 0x5A, bytes);
    return KHUB_STATUS_OK;
}

static khub_tensor host_vec(void *data, khub_dtype dt, int64_t *n)
{
    return (khub_tensor){
        .data = data, .device = {KHUB_DEVICE_CPU, 0}, .ndim = 1, .dtype = dt, .shape = n};
}

TEST_IMPL(comm_job_of_one)
{
    khub_runtime *rt = tp_runtime(1);
    const khub_host_api *h = khub__runtime_host(rt);
    ASSERT(KHUB_HAS_FIELD(h, khub_host_api, comm_all_gather));
    int32_t rank = -1, size = -1;
    ASSERT_OK(h->comm_info(h->host_ctx, &rank, &size));
    ASSERT_EQ(rank, 0);
    ASSERT_EQ(size, 1);
    float v[3] = {1, 2, 3};
    int64_t n3 = 3;
    khub_tensor t = host_vec(v, KHUB_DTYPE_F32, &n3);
    ASSERT_OK(h->comm_all_reduce_sum(h->host_ctx, &t)); /* a sum over one rank */
    ASSERT(v[0] == 1 && v[1] == 2 && v[2] == 3);
    int32_t s[3] = {4, 5, 6}, r[3] = {0};
    khub_tensor ts = host_vec(s, KHUB_DTYPE_I32, &n3), tr = host_vec(r, KHUB_DTYPE_I32, &n3);
    ASSERT_OK(h->comm_all_gather(h->host_ctx, &ts, &tr));
    ASSERT(r[0] == 4 && r[1] == 5 && r[2] == 6);
    khub_runtime_free(rt);
}

TEST_IMPL(comm_refuses_bad_tensors)
{
    khub_runtime *rt = tp_runtime(1);
    const khub_host_api *h = khub__runtime_host(rt);
    float v[4] = {0};
    int64_t n4 = 4, n2 = 2, shape[2] = {2, 2}, strides[2] = {1, 2};
    khub__plugin_msg_clear();
    ASSERT_STATUS(h->comm_info(h->host_ctx, NULL, NULL), KHUB_STATUS_INVALID_ARG);
    ASSERT_STR_EQ(khub__plugin_msg(), "host: comm_info: rank or size is NULL");
    khub_tensor t = host_vec(v, KHUB_DTYPE_F16, &n4);
    ASSERT_STATUS(h->comm_all_reduce_sum(h->host_ctx, &t), KHUB_STATUS_INVALID_ARG);
    ASSERT_STR_EQ(khub__plugin_msg(),
                  "host: comm_all_reduce_sum: t has dtype code 2, 16 bits; the sum takes f32");
    t = host_vec(v, KHUB_DTYPE_F32, &n4);
    t.device = (khub_device){KHUB_DEVICE_CUDA_HOST, 0}; /* CUDA tensors: test_nccl */
    ASSERT_STATUS(h->comm_all_reduce_sum(h->host_ctx, &t), KHUB_STATUS_UNSUPPORTED);
    ASSERT_STR_EQ(khub__plugin_msg(), "host: comm_all_reduce_sum: t is on device type 3; the "
                                      "collectives take host (CPU) and CUDA tensors");
    t = (khub_tensor){.data = v,
                      .device = {KHUB_DEVICE_CPU, 0},
                      .ndim = 2,
                      .dtype = KHUB_DTYPE_F32,
                      .shape = shape,
                      .strides = strides};
    ASSERT_STATUS(h->comm_all_reduce_sum(h->host_ctx, &t), KHUB_STATUS_INVALID_ARG);
    ASSERT_STR_EQ(khub__plugin_msg(),
                  "host: comm_all_reduce_sum: t is not compact row-major (dimension 1)");
    t = host_vec(v, KHUB_DTYPE_Q(KHUB_QFORMAT_Q8_0), &n4);
    ASSERT_STATUS(h->comm_all_reduce_sum(h->host_ctx, &t), KHUB_STATUS_INVALID_ARG);
    ASSERT_STR_EQ(khub__plugin_msg(),
                  "host: comm_all_reduce_sum: t is not a tensor of whole-byte elements");
    khub_tensor s = host_vec(v, KHUB_DTYPE_F32, &n4), r = host_vec(v, KHUB_DTYPE_F32, &n2);
    ASSERT_STATUS(h->comm_all_gather(h->host_ctx, &s, &r), KHUB_STATUS_INVALID_ARG);
    ASSERT_STR_EQ(khub__plugin_msg(), "host: comm_all_gather: recv holds 8 bytes and send 16; "
                                      "recv wants send's dtype and 1 times its bytes");
    khub_runtime_free(rt);
}

TEST_IMPL(comm_uses_the_lent_job)
{
    khub_runtime *rt = tp_runtime(1);
    const khub_host_api *h = khub__runtime_host(rt);
    fake_job fj = {0};
    khub_comm c = {KHUB_APP_INIT(khub_comm),
                   .rank = 1,
                   .size = 2,
                   .ud = &fj,
                   .all_reduce_sum_f32 = fake_reduce,
                   .all_gather = fake_gather};
    int owner = 0, other = 0;
    khub__runtime_lend_comm(rt, &c, &owner);
    khub_comm c2 = c;
    c2.rank = 0;
    khub__runtime_lend_comm(rt, &c2, &other); /* the first lender keeps it */
    int32_t rank = -1, size = -1;
    ASSERT_OK(h->comm_info(h->host_ctx, &rank, &size));
    ASSERT_EQ(rank, 1);
    ASSERT_EQ(size, 2);
    float v[2] = {1, 2};
    int64_t n2 = 2, n4 = 4;
    khub_tensor t = host_vec(v, KHUB_DTYPE_F32, &n2);
    ASSERT_OK(h->comm_all_reduce_sum(h->host_ctx, &t));
    ASSERT(v[0] == 11 && v[1] == 12);
    uint16_t s[2] = {1, 2}, r[4] = {0};
    khub_tensor ts = host_vec(s, KHUB_DTYPE_F16, &n2), tr = host_vec(r, KHUB_DTYPE_F16, &n4);
    ASSERT_OK(h->comm_all_gather(h->host_ctx, &ts, &tr));
    ASSERT(r[0] == 1 && r[1] == 2 && r[2] == 0x5A5A && r[3] == 0x5A5A);
    ASSERT_EQ(fj.calls, 2);
    fj.fail_with = KHUB_STATUS_IO;
    khub__plugin_msg_clear();
    ASSERT_STATUS(h->comm_all_reduce_sum(h->host_ctx, &t), KHUB_STATUS_IO);
    ASSERT_STR_EQ(khub__plugin_msg(), "host: comm_all_reduce_sum: tp rank 1 of 2: peer 1 hung up");
    khub__runtime_return_comm(rt, &other); /* not the lender: nothing changes */
    ASSERT_OK(h->comm_info(h->host_ctx, &rank, &size));
    ASSERT_EQ(size, 2);
    khub__runtime_return_comm(rt, &owner);
    ASSERT_OK(h->comm_info(h->host_ctx, &rank, &size));
    ASSERT_EQ(rank, 0);
    ASSERT_EQ(size, 1);
    ASSERT_EQ(fj.calls, 3);
    khub_runtime_free(rt);
}

#define TEST_LIST(X) \
    X(host_table_from_an_op) \
    X(each_plugin_gets_its_own_context) \
    X(runtime_host_table) \
    X(runtime_pool_parallel_for) \
    X(runtime_pool_caller_takes_late_chunks) \
    X(cuda_without_driver) \
    X(cuda_roundtrip_and_launch) \
    X(comm_job_of_one) \
    X(comm_refuses_bad_tensors) \
    X(comm_uses_the_lent_job)
TEST_MAIN(TEST_LIST)
