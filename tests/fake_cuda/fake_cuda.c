/* fake_cuda.c: a stand-in libcuda.so.1 for tests on machines without a GPU,
 * found through LD_LIBRARY_PATH (scripts) or dlopened by path before khub
 * opens "libcuda.so.1" (C tests: the loaded library's soname answers).
 *
 * Two modes, both from the environment, read on the first call:
 *   - KHUB_FAKE_CUDA="VERSION:CC,CC,..." (for example "13000:90,75": driver
 *     13.0, two GPUs of compute capability 9.0 and 7.5) answers only the
 *     calls the hub's variant selection makes. Everything else is absent,
 *     so the runtime still reports no usable driver to plugins ("lacks
 *     cuDevicePrimaryCtxRetain").
 *   - With KHUB_FAKE_CUDA_MEM=BYTES as well, it is a whole driver as far as
 *     khub uses one: primary contexts, memory (BYTES per GPU; device
 *     pointers are host memory, so copies really copy), copies, streams,
 *     modules, launches and CUDA graphs (fake_graph.c: stream capture,
 *     instantiate, update, launch). A launch marks its stream busy until
 *     the stream is synchronised and runs nothing, unless the test gave
 *     the kernel a host body (khub_fake_cuda_kernel): then that runs, on
 *     the kernel's parameters, when the launch runs.
 *     Contexts are per device, as a real driver's: memory, streams and
 *     modules belong to the device current when they were made, and a
 *     function to its module's. cuLaunchKernel fails with
 *     CUDA_ERROR_INVALID_HANDLE, as a real driver does for a function of
 *     another context, when the function or the stream is another
 *     device's than the current context's, or when a parameter it reads
 *     (the first one's 8 bytes, or every 8-byte one of a kernel with a host
 *     body) points into another device's memory (a real GPU would fault on
 *     that address later; here it is caught at the launch).
 * KHUB_FAKE_CUDA_FAIL="cuName" or "cuName@N" makes that call fail (every
 * time, or the Nth time only) with the error a real driver gives for it
 * (CUDA_ERROR_OUT_OF_MEMORY for cuMemAlloc and cuGraphInstantiateWithFlags,
 * CUDA_ERROR_LAUNCH_FAILED for cuLaunchKernel and cuGraphLaunch,
 * CUDA_ERROR_STREAM_CAPTURE_INVALIDATED for cuStreamEndCapture,
 * CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE for cuGraphExecUpdate,
 * CUDA_ERROR_INVALID_VALUE otherwise).
 *
 * Tests read what happened through khub_fake_cuda_stat("name") (dlsym):
 * allocs_live, bytes_live, bytes_peak, htod_bytes, dtoh_bytes, dtod_bytes,
 * launches (kernels that ran, in a graph or not), streams_live,
 * stream_syncs, busy_destroyed (a stream destroyed with launches not yet
 * synchronised), modules_live, contexts, copies_legacy (copies issued on
 * the legacy default stream, run or refused), per device N (0..7)
 * launches_on_N (kernels run there), allocs_on_N and modules_on_N (every
 * cuMemAlloc and cuModuleLoadData that succeeded there), and
 * fake_graph.c's graph_* counters; and each launch in the order it ran through
 * khub_fake_cuda_launch_name(i) (the function's name),
 * khub_fake_cuda_launch_arg0(i) (its first argument's 8 bytes) and
 * khub_fake_cuda_launch_dims(i, dims) (its grid, block and shared bytes).
 *
 * Not for NVRTC: libnvrtc finds this library too and crashes inside
 * nvrtcCompileProgram when KHUB_FAKE_CUDA names a driver, so run `khub
 * build` without it.
 *
 * Every entry point is handed out through cuGetProcAddress_v2, the only way
 * khub looks them up, and is not thread-safe beyond what khub's tests need:
 * memory, copies and streams are under one lock; the current context is
 * one for the process, so threads calling at once must use one device. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cuda.h"

#define FAKE_MAX_GPUS 8

static int version, n_gpus, ccs[FAKE_MAX_GPUS];
static unsigned long long mem_limit; /* bytes per GPU, 0 = probe-only driver */
static char fail_name[64];
static long fail_at; /* 0 = every call */
static long fail_seen;

typedef struct fake_alloc {
    struct fake_alloc *next;
    void *p;
    size_t n;
    int dev;
} fake_alloc;

typedef struct fake_module {
    struct fake_module *next;
    int dev;
} fake_module;

static fake_alloc *allocs;
fake_stream *fake_streams;
static fake_module *modules;
static unsigned long long used[FAKE_MAX_GPUS];
static long st_allocs_live, st_launches, st_streams_live, st_syncs, st_busy_destroyed;
static long st_modules_live, st_contexts, st_copies_legacy;
static long st_launches_on[FAKE_MAX_GPUS], st_allocs_on[FAKE_MAX_GPUS],
    st_modules_on[FAKE_MAX_GPUS];
static unsigned long long st_bytes_live, st_bytes_peak, st_htod, st_dtoh, st_dtod;
static long legacy_pending; /* launches on the NULL stream */
/* The device of the current context: one for the process, not per thread
 * as in a real driver (a __thread here trips LeakSanitizer's scan of
 * dynamic TLS in a dlopened library); khub's tests call the driver from
 * one thread at a time. */
static int current = -1;
/* Memory, copies, streams, launches and graphs take this lock: the ranks
 * of a tensor-parallel test are threads that make streams and sync them at
 * the same time (test_nccl). */
pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;

static void parse(void)
{
    static int done;
    if (done) return;
    done = 1;
    const char *s = getenv("KHUB_FAKE_CUDA");
    if (!s) return;
    char *end = NULL;
    version = (int)strtol(s, &end, 10);
    while (end && *end && n_gpus < FAKE_MAX_GPUS) {
        s = end + 1;
        int cc = (int)strtol(s, &end, 10);
        if (end == s) break;
        ccs[n_gpus++] = cc;
    }
    const char *m = getenv("KHUB_FAKE_CUDA_MEM");
    if (m) mem_limit = strtoull(m, NULL, 10);
    const char *f = getenv("KHUB_FAKE_CUDA_FAIL");
    if (f) {
        snprintf(fail_name, sizeof fail_name, "%s", f);
        char *at = strchr(fail_name, '@');
        if (at) *at = '\0', fail_at = strtol(at + 1, NULL, 10);
    }
}

/* Whether this call of `name` is the one told to fail. */
int fake_fails(const char *name)
{
    if (!fail_name[0] || strcmp(name, fail_name) != 0) return 0;
    fail_seen++;
    return fail_at == 0 || fail_seen == fail_at;
}

EXPORT long khub_fake_cuda_stat(const char *what)
{
    const struct {
        const char *name;
        long value;
    } t[] = {
        {"allocs_live", st_allocs_live},     {"bytes_live", (long)st_bytes_live},
        {"bytes_peak", (long)st_bytes_peak}, {"htod_bytes", (long)st_htod},
        {"dtoh_bytes", (long)st_dtoh},       {"dtod_bytes", (long)st_dtod},
        {"launches", st_launches},           {"streams_live", st_streams_live},
        {"stream_syncs", st_syncs},          {"busy_destroyed", st_busy_destroyed},
        {"modules_live", st_modules_live},   {"contexts", st_contexts},
        {"copies_legacy", st_copies_legacy},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (strcmp(what, t[i].name) == 0) return t[i].value;
    const struct {
        const char *prefix;
        const long *per_dev;
    } d[] = {{"launches_on_", st_launches_on},
             {"allocs_on_", st_allocs_on},
             {"modules_on_", st_modules_on}};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) {
        size_t n = strlen(d[i].prefix);
        if (strncmp(what, d[i].prefix, n) == 0 && what[n] >= '0' && what[n] < '0' + FAKE_MAX_GPUS &&
            what[n + 1] == '\0')
            return d[i].per_dev[what[n] - '0'];
    }
    int found = 0;
    long v = fake_graph_stat(what, &found);
    return found ? v : -1;
}

/* ======================================================================== */
/* Probe: driver version, devices, attributes                               */
/* ======================================================================== */

EXPORT int cuInit(unsigned flags)
{
    (void)flags;
    parse();
    return version > 0 ? CU_OK : CU_NO_DEVICE;
}

EXPORT int cuDriverGetVersion(int *v)
{
    parse();
    *v = version;
    return version > 0 ? CU_OK : CU_NO_DEVICE;
}

EXPORT int cuDeviceGetCount(int *n)
{
    parse();
    *n = n_gpus;
    return CU_OK;
}

EXPORT int cuDeviceGet(int *dev, int ordinal)
{
    parse();
    if (ordinal < 0 || ordinal >= n_gpus) return CU_INVALID_DEVICE;
    *dev = ordinal;
    return CU_OK;
}

/* 75, 76: CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR. */
EXPORT int cuDeviceGetAttribute(int *v, int attr, int dev)
{
    parse();
    if (dev < 0 || dev >= n_gpus) return CU_INVALID_DEVICE;
    if (attr == 75)
        *v = ccs[dev] / 10;
    else if (attr == 76)
        *v = ccs[dev] % 10;
    else
        return CU_INVALID_VALUE;
    return CU_OK;
}

/* ======================================================================== */
/* Contexts (a context is its device + 1)                                   */
/* ======================================================================== */

EXPORT int cuDevicePrimaryCtxRetain(void **ctx, int dev)
{
    if (dev < 0 || dev >= n_gpus) return CU_INVALID_DEVICE;
    if (fake_fails("cuDevicePrimaryCtxRetain")) return CU_OUT_OF_MEMORY;
    *ctx = (void *)(intptr_t)(dev + 1);
    st_contexts++;
    return CU_OK;
}

EXPORT int cuCtxSetCurrent(void *ctx)
{
    intptr_t d = (intptr_t)ctx - 1;
    if (ctx && (d < 0 || d >= n_gpus)) return CU_INVALID_CONTEXT;
    current = ctx ? (int)d : -1;
    return CU_OK;
}

EXPORT int cuCtxGetCurrent(void **ctx)
{
    *ctx = current < 0 ? NULL : (void *)(intptr_t)(current + 1);
    return CU_OK;
}

/* ======================================================================== */
/* Memory and copies                                                        */
/* ======================================================================== */

EXPORT int cuMemGetInfo(size_t *free_bytes, size_t *total)
{
    if (current < 0) return CU_INVALID_CONTEXT;
    if (fake_fails("cuMemGetInfo")) return CU_INVALID_VALUE;
    *total = (size_t)mem_limit;
    *free_bytes = (size_t)(mem_limit - used[current]);
    return CU_OK;
}

static int unlocked_cuMemAlloc(unsigned long long *dptr, size_t n)
{
    if (current < 0) return CU_INVALID_CONTEXT;
    if (n == 0) return CU_INVALID_VALUE;
    int r = fake_capture_alloc();
    if (r) return r;
    if (fake_fails("cuMemAlloc") || n > mem_limit - used[current]) return CU_OUT_OF_MEMORY;
    fake_alloc *a = calloc(1, sizeof *a);
    void *p = malloc(n);
    if (!a || !p) {
        free(a), free(p);
        return CU_OUT_OF_MEMORY;
    }
    memset(p, 0xA5, n); /* device memory starts as garbage, never zeros */
    *a = (fake_alloc){allocs, p, n, current};
    allocs = a;
    used[current] += n;
    st_allocs_on[current]++;
    st_allocs_live++;
    st_bytes_live += n;
    if (st_bytes_live > st_bytes_peak) st_bytes_peak = st_bytes_live;
    *dptr = (unsigned long long)(uintptr_t)p;
    return CU_OK;
}

EXPORT int cuMemAlloc(unsigned long long *dptr, size_t n)
{
    pthread_mutex_lock(&fake_lock);
    int r = unlocked_cuMemAlloc(dptr, n);
    pthread_mutex_unlock(&fake_lock);
    return r;
}

static int unlocked_cuMemFree(unsigned long long dptr)
{
    fake_alloc **at = &allocs;
    while (*at && (uintptr_t)(*at)->p != dptr) at = &(*at)->next;
    if (!*at) return CU_INVALID_VALUE;
    fake_alloc *a = *at;
    *at = a->next;
    used[a->dev] -= a->n;
    st_allocs_live--;
    st_bytes_live -= a->n;
    free(a->p);
    free(a);
    return CU_OK;
}

EXPORT int cuMemFree(unsigned long long dptr)
{
    pthread_mutex_lock(&fake_lock);
    int r = unlocked_cuMemFree(dptr);
    pthread_mutex_unlock(&fake_lock);
    return r;
}

/* The device of the allocation p points into, or -1 (not device memory). */
static int device_of(unsigned long long p)
{
    for (fake_alloc *a = allocs; a; a = a->next) {
        uintptr_t b = (uintptr_t)a->p;
        if (p >= b && p - b < a->n) return a->dev;
    }
    return -1;
}

/* Whether [p, p + n) lies inside one allocation: a copy outside one is a
 * bug in the caller that a real GPU reports as an illegal address. */
static int inside(unsigned long long p, size_t n)
{
    for (fake_alloc *a = allocs; a; a = a->next) {
        uintptr_t b = (uintptr_t)a->p;
        if (p >= b && p - b <= a->n && n <= a->n - (p - b)) return 1;
    }
    return 0;
}

/* Copies: run at once, or recorded when their stream is capturing. */
int fake_run_copy(const fake_node *c)
{
    if (c->kind == NODE_HTOD) {
        if (!inside(c->dst, c->n)) return CU_INVALID_VALUE;
        memcpy((void *)(uintptr_t)c->dst, (const void *)(uintptr_t)c->src, c->n);
        st_htod += c->n;
    } else if (c->kind == NODE_DTOH) {
        if (!inside(c->src, c->n)) return CU_INVALID_VALUE;
        memcpy((void *)(uintptr_t)c->dst, (const void *)(uintptr_t)c->src, c->n);
        st_dtoh += c->n;
    } else {
        if (!inside(c->dst, c->n) || !inside(c->src, c->n)) return CU_INVALID_VALUE;
        memmove((void *)(uintptr_t)c->dst, (const void *)(uintptr_t)c->src, c->n);
        st_dtod += c->n;
    }
    return CU_OK;
}

static int copy(const char *name, int kind, unsigned long long dst, unsigned long long src,
                size_t n, void *stream)
{
    fake_node c = {.kind = kind, .dst = dst, .src = src, .n = n};
    pthread_mutex_lock(&fake_lock);
    if (!stream) st_copies_legacy++;
    int r = fake_fails(name) ? CU_INVALID_VALUE : CU_OK;
    /* Checked when recorded too, as a driver checks a captured copy. */
    if (!r && ((kind != NODE_DTOH && !inside(dst, n)) || (kind != NODE_HTOD && !inside(src, n))))
        r = CU_INVALID_VALUE;
    if (!r) r = fake_capture_gate(stream, &c);
    if (r == FAKE_RECORDED)
        r = CU_OK; /* recorded */
    else if (!r)
        r = fake_run_copy(&c);
    pthread_mutex_unlock(&fake_lock);
    return r;
}

EXPORT int cuMemcpyHtoDAsync(unsigned long long dst, const void *src, size_t n, void *stream)
{
    return copy("cuMemcpyHtoDAsync", NODE_HTOD, dst, (unsigned long long)(uintptr_t)src, n, stream);
}

EXPORT int cuMemcpyDtoDAsync(unsigned long long dst, unsigned long long src, size_t n, void *stream)
{
    return copy("cuMemcpyDtoDAsync", NODE_DTOD, dst, src, n, stream);
}

EXPORT int cuMemcpyDtoHAsync(void *dst, unsigned long long src, size_t n, void *stream)
{
    return copy("cuMemcpyDtoHAsync", NODE_DTOH, (unsigned long long)(uintptr_t)dst, src, n, stream);
}

/* ======================================================================== */
/* Streams                                                                  */
/* ======================================================================== */

fake_stream *fake_find_stream(void *s)
{
    fake_stream *f = fake_streams;
    while (f && f != s) f = f->next;
    return f;
}

static int unlocked_cuStreamCreate(void **stream, unsigned flags)
{
    (void)flags;
    if (current < 0) return CU_INVALID_CONTEXT;
    if (fake_fails("cuStreamCreate")) return CU_OUT_OF_MEMORY;
    fake_stream *s = calloc(1, sizeof *s);
    if (!s) return CU_OUT_OF_MEMORY;
    s->dev = current;
    s->next = fake_streams;
    fake_streams = s;
    st_streams_live++;
    *stream = s;
    return CU_OK;
}

EXPORT int cuStreamCreate(void **stream, unsigned flags)
{
    pthread_mutex_lock(&fake_lock);
    int r = unlocked_cuStreamCreate(stream, flags);
    pthread_mutex_unlock(&fake_lock);
    return r;
}

static int unlocked_cuStreamSynchronize(void *stream)
{
    if (fake_fails("cuStreamSynchronize"))
        return CU_LAUNCH_FAILED; /* a kernel's error surfaces here */
    fake_stream *s = stream ? fake_find_stream(stream) : NULL;
    if (stream && !s) return CU_INVALID_HANDLE;
    int r = fake_capture_sync(stream);
    if (r) return r;
    st_syncs++;
    if (s)
        s->pending = 0;
    else
        legacy_pending = 0;
    return CU_OK;
}

EXPORT int cuStreamSynchronize(void *stream)
{
    pthread_mutex_lock(&fake_lock);
    int r = unlocked_cuStreamSynchronize(stream);
    pthread_mutex_unlock(&fake_lock);
    return r;
}

static int unlocked_cuStreamDestroy(void *stream)
{
    fake_stream **at = &fake_streams;
    while (*at && *at != stream) at = &(*at)->next;
    if (!*at) return CU_INVALID_HANDLE;
    fake_stream *s = *at;
    *at = s->next;
    if (s->pending) st_busy_destroyed++;
    fake_capture_drop(s);
    st_streams_live--;
    free(s);
    return CU_OK;
}

EXPORT int cuStreamDestroy(void *stream)
{
    pthread_mutex_lock(&fake_lock);
    int r = unlocked_cuStreamDestroy(stream);
    pthread_mutex_unlock(&fake_lock);
    return r;
}

/* ======================================================================== */
/* Modules and launches                                                     */
/* ======================================================================== */

EXPORT int cuModuleLoadData(void **mod, const void *image)
{
    if (current < 0) return CU_INVALID_CONTEXT;
    if (!image || fake_fails("cuModuleLoadData")) return CU_INVALID_VALUE;
    fake_module *m = calloc(1, sizeof *m);
    if (!m) return CU_OUT_OF_MEMORY;
    m->dev = current;
    m->next = modules;
    modules = m;
    st_modules_live++;
    st_modules_on[current]++;
    *mod = m;
    return CU_OK;
}

/* Functions are interned by name (never freed), so the launch log can name
 * what ran; a handle is the name's entry in its device's row of fn_handles,
 * so a launch knows the context its function belongs to. */
#define FAKE_MAX_LAUNCHES 16384
static char fn_names[FAKE_MAX_FNS][64];
static int n_fns;
static int launch_fn[FAKE_MAX_LAUNCHES];                  /* fn_names index per launch */
static unsigned long long launch_arg0[FAKE_MAX_LAUNCHES]; /* the first 8 bytes of params[0] */
static unsigned launch_dims[FAKE_MAX_LAUNCHES][7];   /* grid x y z, block x y z, shared bytes */
static char fn_handles[FAKE_MAX_GPUS][FAKE_MAX_FNS]; /* [device][name index]: the handles */

static int intern(const char *name);

EXPORT int cuModuleGetFunction(void **fn, void *mod, const char *name)
{
    if (!mod || !name || fake_fails("cuModuleGetFunction")) return CU_NOT_FOUND;
    pthread_mutex_lock(&fake_lock);
    int i = intern(name);
    pthread_mutex_unlock(&fake_lock);
    if (i < 0) return CU_NOT_FOUND;
    *fn = &fn_handles[((fake_module *)mod)->dev][i];
    return CU_OK;
}

/* The name of the i-th launch since the driver loaded (0-based), or NULL. */
EXPORT const char *khub_fake_cuda_launch_name(long i)
{
    if (i < 0 || i >= st_launches || i >= FAKE_MAX_LAUNCHES) return NULL;
    return fn_names[launch_fn[i]];
}

/* The first 8 bytes the i-th launch's params[0] pointed at (a kernel's
 * first argument, for the test plugins a tensor's device address), or 0. */
EXPORT unsigned long long khub_fake_cuda_launch_arg0(long i)
{
    return i >= 0 && i < st_launches && i < FAKE_MAX_LAUNCHES ? launch_arg0[i] : 0;
}

/* The i-th launch's grid (x, y, z), block (x, y, z) and dynamic shared
 * memory bytes into dims[7]: 1, or 0 when there is no such launch. */
EXPORT int khub_fake_cuda_launch_dims(long i, unsigned *dims)
{
    if (i < 0 || i >= st_launches || i >= FAKE_MAX_LAUNCHES) return 0;
    memcpy(dims, launch_dims[i], sizeof launch_dims[i]);
    return 1;
}

EXPORT int cuModuleUnload(void *mod)
{
    fake_module **at = &modules;
    while (*at && *at != mod) at = &(*at)->next;
    if (!*at) return CU_INVALID_HANDLE;
    fake_module *m = *at;
    *at = m->next;
    st_modules_live--;
    free(m);
    return CU_OK;
}

/* Host bodies of kernels, by function index (khub_fake_cuda_kernel). */
static struct {
    int n_params;
    unsigned char size[FAKE_MAX_PARAMS]; /* bytes of each parameter: 4 or 8 */
    void (*run)(const unsigned long long *params);
} bodies[FAKE_MAX_FNS];

static int intern(const char *name)
{
    int i = 0;
    while (i < n_fns && strcmp(fn_names[i], name)) i++;
    if (i < n_fns) return i;
    if (n_fns == FAKE_MAX_FNS || strlen(name) >= sizeof fn_names[0]) return -1;
    snprintf(fn_names[n_fns++], sizeof fn_names[0], "%s", name);
    return i;
}

/* Gives kernel `name` a host body: each time a launch of it runs (at once,
 * or when the graph holding it is launched), run(params) is called with
 * its first n_params parameters, 8 bytes each, as they were when it was
 * launched or captured (a driver copies parameters then). Tests use it to
 * make test plugins' kernels compute. 0, or -1 when full. */
EXPORT int khub_fake_cuda_kernel_sized(const char *name, const char *sizes,
                                       void (*run)(const unsigned long long *params));

EXPORT int khub_fake_cuda_kernel(const char *name, int n_params,
                                 void (*run)(const unsigned long long *params))
{
    if (n_params < 0 || n_params > FAKE_MAX_PARAMS) return -1;
    char sizes[FAKE_MAX_PARAMS + 1];
    memset(sizes, '8', (size_t)n_params);
    sizes[n_params] = '\0';
    return khub_fake_cuda_kernel_sized(name, sizes, run);
}

/* As khub_fake_cuda_kernel, for kernels whose parameters are not all 8
 * bytes: sizes has one character per parameter, '4' or '8' (its bytes; a
 * 4-byte one arrives zero-extended in its 8-byte slot, a float as its bit
 * pattern in the low 4 bytes). 0, or -1 when full or malformed. */
EXPORT int khub_fake_cuda_kernel_sized(const char *name, const char *sizes,
                                       void (*run)(const unsigned long long *params))
{
    size_t n = strlen(sizes);
    if (n > FAKE_MAX_PARAMS || strspn(sizes, "48") != n) return -1;
    pthread_mutex_lock(&fake_lock);
    int i = intern(name);
    if (i >= 0) {
        bodies[i].n_params = (int)n, bodies[i].run = run;
        for (size_t k = 0; k < n; k++) bodies[i].size[k] = (unsigned char)(sizes[k] - '0');
    }
    pthread_mutex_unlock(&fake_lock);
    return i < 0 ? -1 : 0;
}

void fake_run_kernel(const fake_node *k, fake_stream *s)
{
    if (s)
        s->pending++;
    else
        legacy_pending++;
    st_launches_on[k->dev]++;
    if (st_launches < FAKE_MAX_LAUNCHES) {
        launch_fn[st_launches] = k->fn;
        launch_arg0[st_launches] = k->n_params > 0 ? k->params[0] : 0;
        unsigned dims[7] = {k->grid[0],  k->grid[1],  k->grid[2], k->block[0],
                            k->block[1], k->block[2], k->shared};
        memcpy(launch_dims[st_launches], dims, sizeof dims);
    }
    st_launches++;
    if (bodies[k->fn].run) bodies[k->fn].run(k->params);
}

/* Whether launch k, with its parameters copied, runs in the current
 * context: its function, its stream (NULL: the context's legacy one) and
 * the device memory its parameters point into are the current device's
 * (the file comment). */
static int in_context(const fake_node *k, const fake_stream *s)
{
    if (k->dev != current || (s && s->dev != current)) return 0;
    for (int i = 0; i < k->n_params; i++) {
        int size = bodies[k->fn].run ? bodies[k->fn].size[i] : 8;
        int dev = size == 8 ? device_of(k->params[i]) : -1;
        if (dev >= 0 && dev != current) return 0;
    }
    return 1;
}

EXPORT int cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                          unsigned bz, unsigned shared, void *stream, void **params, void **extra)
{
    (void)extra;
    if (!fn || !gx || !gy || !gz || !bx || !by || !bz || (unsigned long)bx * by * bz > 1024)
        return CU_INVALID_VALUE;
    if (fake_fails("cuLaunchKernel")) return CU_LAUNCH_FAILED;
    ptrdiff_t h = (char *)fn - &fn_handles[0][0];
    if (h < 0 || h >= (ptrdiff_t)sizeof fn_handles) return CU_INVALID_HANDLE;
    fake_node k = {.kind = NODE_KERNEL,
                   .fn = (int)(h % FAKE_MAX_FNS),
                   .dev = (int)(h / FAKE_MAX_FNS),
                   .grid = {gx, gy, gz},
                   .block = {bx, by, bz},
                   .shared = shared};
    pthread_mutex_lock(&fake_lock);
    /* The parameters by value: the registered count, else the first 8
     * bytes of the first (what the launch log shows). */
    k.n_params = bodies[k.fn].run ? bodies[k.fn].n_params : (params && params[0] ? 1 : 0);
    for (int i = 0; i < k.n_params; i++)
        if (params && params[i])
            memcpy(&k.params[i], params[i], bodies[k.fn].run ? bodies[k.fn].size[i] : 8);
    fake_stream *s = stream ? fake_find_stream(stream) : NULL;
    int r =
        (stream && !s) || !in_context(&k, s) ? CU_INVALID_HANDLE : fake_capture_gate(stream, &k);
    if (r == FAKE_RECORDED)
        r = CU_OK; /* recorded into the capture */
    else if (!r)
        fake_run_kernel(&k, s);
    pthread_mutex_unlock(&fake_lock);
    return r;
}

EXPORT int cuGetErrorName(int r, const char **name)
{
    switch (r) {
    case CU_OK: *name = "CUDA_SUCCESS"; return CU_OK;
    case CU_INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; return CU_OK;
    case CU_OUT_OF_MEMORY: *name = "CUDA_ERROR_OUT_OF_MEMORY"; return CU_OK;
    case CU_INVALID_CONTEXT: *name = "CUDA_ERROR_INVALID_CONTEXT"; return CU_OK;
    case CU_INVALID_HANDLE: *name = "CUDA_ERROR_INVALID_HANDLE"; return CU_OK;
    case CU_NOT_FOUND: *name = "CUDA_ERROR_NOT_FOUND"; return CU_OK;
    case CU_LAUNCH_FAILED: *name = "CUDA_ERROR_LAUNCH_FAILED"; return CU_OK;
    case CU_ILLEGAL_STATE: *name = "CUDA_ERROR_ILLEGAL_STATE"; return CU_OK;
    case CU_CAPTURE_UNSUPPORTED: *name = "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"; return CU_OK;
    case CU_CAPTURE_INVALIDATED: *name = "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"; return CU_OK;
    case CU_CAPTURE_IMPLICIT: *name = "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"; return CU_OK;
    case CU_GRAPH_UPDATE_FAILURE: *name = "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE"; return CU_OK;
    default: *name = NULL; return CU_INVALID_VALUE;
    }
}

/* ======================================================================== */
/* cuGetProcAddress_v2                                                      */
/* ======================================================================== */

/* CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
 *                              cuuint64_t flags, CUdriverProcAddressQueryResult *status) */
EXPORT int cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version,
                               unsigned long long flags, int *status)
{
    static const struct {
        const char *name;
        void *fn;
        int full; /* only in the whole-driver mode */
    } table[] = {
        {"cuInit", (void *)cuInit, 0},
        {"cuDriverGetVersion", (void *)cuDriverGetVersion, 0},
        {"cuDeviceGetCount", (void *)cuDeviceGetCount, 0},
        {"cuDeviceGet", (void *)cuDeviceGet, 0},
        {"cuDeviceGetAttribute", (void *)cuDeviceGetAttribute, 0},
        {"cuDevicePrimaryCtxRetain", (void *)cuDevicePrimaryCtxRetain, 1},
        {"cuCtxSetCurrent", (void *)cuCtxSetCurrent, 1},
        {"cuCtxGetCurrent", (void *)cuCtxGetCurrent, 1},
        {"cuMemGetInfo", (void *)cuMemGetInfo, 1},
        {"cuMemAlloc", (void *)cuMemAlloc, 1},
        {"cuMemFree", (void *)cuMemFree, 1},
        {"cuMemcpyHtoDAsync", (void *)cuMemcpyHtoDAsync, 1},
        {"cuMemcpyDtoDAsync", (void *)cuMemcpyDtoDAsync, 1},
        {"cuMemcpyDtoHAsync", (void *)cuMemcpyDtoHAsync, 1},
        {"cuStreamSynchronize", (void *)cuStreamSynchronize, 1},
        {"cuStreamCreate", (void *)cuStreamCreate, 1},
        {"cuStreamDestroy", (void *)cuStreamDestroy, 1},
        {"cuModuleLoadData", (void *)cuModuleLoadData, 1},
        {"cuModuleGetFunction", (void *)cuModuleGetFunction, 1},
        {"cuModuleUnload", (void *)cuModuleUnload, 1},
        {"cuLaunchKernel", (void *)cuLaunchKernel, 1},
        {"cuGetErrorName", (void *)cuGetErrorName, 1},
        {"cuStreamBeginCapture", (void *)cuStreamBeginCapture_v2, 1},
        {"cuStreamEndCapture", (void *)cuStreamEndCapture, 1},
        {"cuStreamIsCapturing", (void *)cuStreamIsCapturing, 1},
        {"cuGraphInstantiateWithFlags", (void *)cuGraphInstantiateWithFlags, 1},
        {"cuGraphExecUpdate", (void *)cuGraphExecUpdate_v2, 1},
        {"cuGraphLaunch", (void *)cuGraphLaunch, 1},
        {"cuGraphDestroy", (void *)cuGraphDestroy, 1},
        {"cuGraphExecDestroy", (void *)cuGraphExecDestroy, 1},
    };
    (void)cuda_version, (void)flags;
    parse();
    *pfn = NULL;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcmp(symbol, table[i].name) == 0 && (!table[i].full || mem_limit > 0)) {
            *pfn = table[i].fn;
            if (status) *status = 0; /* CU_GET_PROC_ADDRESS_SUCCESS */
            return CU_OK;
        }
    }
    if (status) *status = 1; /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
    return CU_NOT_FOUND;
}
