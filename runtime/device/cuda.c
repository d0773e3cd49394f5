/*
 * cuda.c: the CUDA driver API, opened with dlopen at run time.
 *
 * libcuda is a per-process resource, so the driver state is process-wide:
 * it is opened once (pthread_once), and only cuGetProcAddress_v2 (or, on
 * drivers before 12.0, cuGetProcAddress) is looked up with dlsym; every other
 * entry point comes through it, with the version we were written against,
 * so the driver hands out the ABI these typedefs describe (the _v2 memory
 * functions, legacy default stream). We never include cuda.h and never link
 * libcuda. Primary contexts are retained once per device and kept for the
 * life of the process; the library is never dlclosed (unloading a GPU driver
 * from a live process is unsafe).
 *
 * Errors raised on behalf of a plugin go to the plugin message
 * (khub__plugin_fail); khub__cuda_info reports on the runtime.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda.h"
#include "runtime_impl.h"

/* ======================================================================== */
/* Driver types (the subset we use, by value as in cuda.h)                  */
/* ======================================================================== */

typedef int cu_result;
typedef int cu_device;
typedef struct cu_ctx *cu_context;
typedef struct cu_mod *cu_module;
typedef struct cu_func *cu_function;
typedef struct cu_strm *cu_stream;
typedef unsigned long long cu_deviceptr;

#define CU_SUCCESS                0
#define CU_ATTR_CC_MAJOR          75
#define CU_ATTR_CC_MINOR          76
#define CU_GET_PROC_LEGACY_STREAM 1ull
#define CU_API_VERSION            12000 /* the driver API these typedefs follow */
#define CU_MAX_DEVICES            64

typedef cu_result (*pfn_get_proc_v2)(const char *, void **, int, unsigned long long, int *);
typedef cu_result (*pfn_get_proc_v1)(const char *, void **, int, unsigned long long);

typedef struct cuda_driver {
    void *lib;
    khub_status st; /* OK once usable */
    char err[256];
    int version;
    int n_devices;
    bool probed; /* version and the device queries resolved (khub__cuda_probe) */
    pfn_get_proc_v2 get_proc_v2;
    pfn_get_proc_v1 get_proc_v1;

    cu_result (*init)(unsigned);
    cu_result (*driver_get_version)(int *);
    cu_result (*device_get_count)(int *);
    cu_result (*device_get)(cu_device *, int);
    cu_result (*device_get_attribute)(int *, int, cu_device);
    cu_result (*primary_ctx_retain)(cu_context *, cu_device);
    cu_result (*ctx_set_current)(cu_context);
    cu_result (*ctx_get_current)(cu_context *);
    cu_result (*mem_get_info)(size_t *, size_t *);
    cu_result (*mem_alloc)(cu_deviceptr *, size_t);
    cu_result (*mem_free)(cu_deviceptr);
    cu_result (*memcpy_htod_async)(cu_deviceptr, const void *, size_t, cu_stream);
    cu_result (*memcpy_dtoh_async)(void *, cu_deviceptr, size_t, cu_stream);
    cu_result (*memcpy_dtod_async)(cu_deviceptr, cu_deviceptr, size_t, cu_stream);
    cu_result (*stream_synchronize)(cu_stream);
    cu_result (*stream_create)(cu_stream *, unsigned);
    cu_result (*stream_destroy)(cu_stream);
    cu_result (*module_load_data)(cu_module *, const void *);
    cu_result (*module_get_function)(cu_function *, cu_module, const char *);
    cu_result (*module_unload)(cu_module);
    cu_result (*launch_kernel)(cu_function, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, cu_stream, void **, void **);
    cu_result (*get_error_name)(cu_result, const char **);

    pthread_mutex_t ctx_lock;
    cu_context ctx[CU_MAX_DEVICES]; /* retained primary contexts, under ctx_lock */
} cuda_driver;

static cuda_driver drv = {.ctx_lock = PTHREAD_MUTEX_INITIALIZER};
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

/* ======================================================================== */
/* Opening the driver                                                       */
/* ======================================================================== */

static bool get_proc(const char *name, void **fn, int version)
{
    *fn = NULL;
    cu_result r;
    if (drv.get_proc_v2) {
        int status = 0;
        r = drv.get_proc_v2(name, fn, version, CU_GET_PROC_LEGACY_STREAM, &status);
    } else {
        r = drv.get_proc_v1(name, fn, version, CU_GET_PROC_LEGACY_STREAM);
    }
    return r == CU_SUCCESS && *fn != NULL;
}

static bool resolve_all(void)
{
    int v = drv.version < CU_API_VERSION ? drv.version : CU_API_VERSION;
    const struct {
        const char *name;
        void **slot;
    } want[] = {
        {"cuDeviceGetCount", (void **)&drv.device_get_count},
        {"cuDeviceGet", (void **)&drv.device_get},
        {"cuDeviceGetAttribute", (void **)&drv.device_get_attribute},
        {"cuDevicePrimaryCtxRetain", (void **)&drv.primary_ctx_retain},
        {"cuCtxSetCurrent", (void **)&drv.ctx_set_current},
        {"cuCtxGetCurrent", (void **)&drv.ctx_get_current},
        {"cuMemGetInfo", (void **)&drv.mem_get_info},
        {"cuMemAlloc", (void **)&drv.mem_alloc},
        {"cuMemFree", (void **)&drv.mem_free},
        {"cuMemcpyHtoDAsync", (void **)&drv.memcpy_htod_async},
        {"cuMemcpyDtoHAsync", (void **)&drv.memcpy_dtoh_async},
        {"cuMemcpyDtoDAsync", (void **)&drv.memcpy_dtod_async},
        {"cuStreamSynchronize", (void **)&drv.stream_synchronize},
        {"cuStreamCreate", (void **)&drv.stream_create},
        {"cuStreamDestroy", (void **)&drv.stream_destroy}, /* the _v2 at version 12000 */
        {"cuModuleLoadData", (void **)&drv.module_load_data},
        {"cuModuleGetFunction", (void **)&drv.module_get_function},
        {"cuModuleUnload", (void **)&drv.module_unload},
        {"cuLaunchKernel", (void **)&drv.launch_kernel},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        if (!get_proc(want[i].name, want[i].slot, v)) {
            snprintf(drv.err, sizeof drv.err,
                     "CUDA driver %d lacks %s (cuGetProcAddress); update the driver", drv.version,
                     want[i].name);
            return false;
        }
    }
    (void)get_proc("cuGetErrorName", (void **)&drv.get_error_name, v);
    return true;
}

static void drv_open(void)
{
    drv.st = KHUB_STATUS_NO_CUDA;
    dlerror();
    drv.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!drv.lib) {
        const char *e = dlerror();
        snprintf(drv.err, sizeof drv.err, "no CUDA driver (libcuda.so.1: %s)", e ? e : "not found");
        return;
    }
    drv.get_proc_v2 = (pfn_get_proc_v2)dlsym(drv.lib, "cuGetProcAddress_v2");
    if (!drv.get_proc_v2) drv.get_proc_v1 = (pfn_get_proc_v1)dlsym(drv.lib, "cuGetProcAddress");
    if (!drv.get_proc_v2 && !drv.get_proc_v1) {
        snprintf(drv.err, sizeof drv.err,
                 "no CUDA driver (libcuda.so.1: no cuGetProcAddress; driver older than 11.3)");
        return;
    }
    if (!get_proc("cuInit", (void **)&drv.init, 2000) ||
        !get_proc("cuDriverGetVersion", (void **)&drv.driver_get_version, 2020)) {
        snprintf(drv.err, sizeof drv.err, "no CUDA driver (libcuda.so.1: cuInit not found)");
        return;
    }
    /* The version first: it needs no cuInit, and a driver without a GPU
     * (cuInit fails with CUDA_ERROR_NO_DEVICE) still has one to report. */
    if (drv.driver_get_version(&drv.version) != CU_SUCCESS || drv.version <= 0) {
        drv.version = 0;
        snprintf(drv.err, sizeof drv.err, "no CUDA driver version");
        return;
    }
    cu_result r = drv.init(0);
    if (r != CU_SUCCESS) {
        snprintf(drv.err, sizeof drv.err, "no CUDA driver (libcuda.so.1: cuInit failed: %d)", r);
        return;
    }
    /* Enough for khub__cuda_probe (the hub's variant choice) even when a
     * later entry point is missing and the driver is unusable for plugins. */
    int v = drv.version < CU_API_VERSION ? drv.version : CU_API_VERSION;
    drv.probed = get_proc("cuDeviceGetCount", (void **)&drv.device_get_count, v) &&
                 get_proc("cuDeviceGet", (void **)&drv.device_get, v) &&
                 get_proc("cuDeviceGetAttribute", (void **)&drv.device_get_attribute, v);
    if (!resolve_all()) return;
    if (drv.device_get_count(&drv.n_devices) != CU_SUCCESS) drv.n_devices = 0;
    drv.st = KHUB_STATUS_OK;
}

static khub_status drv_ready(void)
{
    pthread_once(&drv_once, drv_open);
    if (drv.st != KHUB_STATUS_OK) return khub__plugin_fail(drv.st, "%s", drv.err);
    return KHUB_STATUS_OK;
}

static khub_status cu_check(cu_result r, const char *what)
{
    if (r == CU_SUCCESS) return KHUB_STATUS_OK;
    const char *name = NULL;
    if (drv.get_error_name) drv.get_error_name(r, &name);
    return khub__plugin_fail(KHUB_STATUS_CUDA, "%s failed: %s (%d)", what,
                             name ? name : "CUDA error", r);
}

/* For cuda_graph.c: the driver's optional entry points and its checks. */
int khub__cuda_driver_version(void) { return drv_ready() == KHUB_STATUS_OK ? drv.version : 0; }

bool khub__cuda_proc(const char *name, void **fn, int version)
{
    return drv_ready() == KHUB_STATUS_OK && get_proc(name, fn, version);
}

khub_status khub__cuda_check(int result, const char *what) { return cu_check(result, what); }

/* Makes device's primary context current on this thread. */
static khub_status use_device(int device)
{
    if (device < 0 || device >= drv.n_devices || device >= CU_MAX_DEVICES)
        return khub__plugin_fail(KHUB_STATUS_INVALID_ARG, "CUDA device %d: %d device(s) present",
                                 device, drv.n_devices);
    pthread_mutex_lock(&drv.ctx_lock);
    khub_status st = KHUB_STATUS_OK;
    if (!drv.ctx[device]) {
        cu_device dev;
        st = cu_check(drv.device_get(&dev, device), "cuDeviceGet");
        if (st == KHUB_STATUS_OK)
            st =
                cu_check(drv.primary_ctx_retain(&drv.ctx[device], dev), "cuDevicePrimaryCtxRetain");
    }
    cu_context ctx = drv.ctx[device];
    pthread_mutex_unlock(&drv.ctx_lock);
    if (st != KHUB_STATUS_OK) return st;
    return cu_check(drv.ctx_set_current(ctx), "cuCtxSetCurrent");
}

/* Calls without a device argument run in the thread's current context, or
 * device 0's when the thread has none. */
static khub_status use_current(void)
{
    KHUB_FORWARD_IF_ERROR(NULL, drv_ready());
    cu_context cur = NULL;
    if (drv.ctx_get_current(&cur) == CU_SUCCESS && cur) return KHUB_STATUS_OK;
    return use_device(0);
}

khub_status khub__cuda_use_current(void) { return use_current(); }

/* ======================================================================== */
/* Runtime-facing                                                           */
/* ======================================================================== */

khub_status khub__cuda_info(khub_runtime *rt, int *driver_version, int *n_devices)
{
    if (driver_version) *driver_version = 0;
    if (n_devices) *n_devices = 0;
    pthread_once(&drv_once, drv_open);
    if (drv.st != KHUB_STATUS_OK) return khub__fail(rt, drv.st, "%s", drv.err);
    if (rt) rt->cuda = (struct khub__cuda *)&drv;
    if (driver_version) *driver_version = drv.version;
    if (n_devices) *n_devices = drv.n_devices;
    return KHUB_STATUS_OK;
}

khub_status khub__cuda_probe(int *driver_version, int *cc, int max, int *n_gpus)
{
    *driver_version = 0;
    *n_gpus = 0;
    pthread_once(&drv_once, drv_open);
    *driver_version = drv.version;
    if (!drv.probed) return drv.version > 0 ? KHUB_STATUS_OK : KHUB_STATUS_NO_CUDA;
    int n = 0;
    if (drv.device_get_count(&n) != CU_SUCCESS) n = 0;
    for (int i = 0; i < n && *n_gpus < max; i++) {
        cu_device dev;
        int major = 0, minor = 0;
        if (drv.device_get(&dev, i) == CU_SUCCESS &&
            drv.device_get_attribute(&major, CU_ATTR_CC_MAJOR, dev) == CU_SUCCESS &&
            drv.device_get_attribute(&minor, CU_ATTR_CC_MINOR, dev) == CU_SUCCESS && major > 0 &&
            major < 100 && minor >= 0 && minor < 10)
            cc[(*n_gpus)++] = major * 10 + minor;
    }
    return KHUB_STATUS_OK;
}

khub_status khub__cuda_device_cc(khub_runtime *rt, int device, int *cc)
{
    khub__plugin_msg_clear();
    khub_status st = khub__cuda_host_device_cc(NULL, device, cc);
    if (st != KHUB_STATUS_OK) return khub__fail(rt, st, "%s", khub__plugin_msg());
    return st;
}

/* The executor's calls (runtime/executor/placement.c): a failure's message
 * goes to the runtime, prefixed with what was being done. */
static khub_status rt_fail(khub_runtime *rt, khub_status st, const char *what)
{
    if (st == KHUB_STATUS_OK) return st;
    return khub__fail(rt, st, "%s: %s", what, khub__plugin_msg());
}

khub_status khub__cuda_mem_info(khub_runtime *rt, int device, size_t *free_bytes, size_t *total)
{
    *free_bytes = *total = 0;
    khub__plugin_msg_clear();
    khub_status st = drv_ready();
    if (st == KHUB_STATUS_OK) st = use_device(device);
    if (st == KHUB_STATUS_OK) st = cu_check(drv.mem_get_info(free_bytes, total), "cuMemGetInfo");
    return rt_fail(rt, st, "device memory");
}

khub_status khub__cuda_stream_new(khub_runtime *rt, int device, void **stream)
{
    *stream = NULL;
    khub__plugin_msg_clear();
    khub_status st = drv_ready();
    if (st == KHUB_STATUS_OK) st = use_device(device);
    cu_stream s = NULL;
    if (st == KHUB_STATUS_OK) st = cu_check(drv.stream_create(&s, 0), "cuStreamCreate");
    if (st == KHUB_STATUS_OK) *stream = s;
    return rt_fail(rt, st, "a stream");
}

khub_status khub__cuda_stream_free(khub_runtime *rt, int device, void *stream)
{
    if (!stream) return KHUB_STATUS_OK;
    khub__plugin_msg_clear();
    khub_status st = drv_ready();
    if (st == KHUB_STATUS_OK) st = use_device(device);
    if (st != KHUB_STATUS_OK) return rt_fail(rt, st, "a stream");
    /* Drained first: cuStreamDestroy returns at once and would let queued
     * work run on into memory the caller frees next. Then the plugins
     * forget it (their per-stream scratch), before the handle can name a
     * new stream; not when the drain failed, since work may still be
     * queued on what they would free. */
    khub_status sync = cu_check(drv.stream_synchronize((cu_stream)stream), "cuStreamSynchronize");
    if (sync == KHUB_STATUS_OK) {
        khub__plugins_stream_end(rt, stream);
        khub__plugin_msg_clear(); /* a plugin's message is logged, not this call's */
        st = use_device(device);  /* current again, whatever a plugin made current */
    }
    if (st == KHUB_STATUS_OK)
        st = cu_check(drv.stream_destroy((cu_stream)stream), "cuStreamDestroy");
    return rt_fail(rt, sync != KHUB_STATUS_OK ? sync : st, "a stream");
}

khub_status khub__cuda_use_device(int device)
{
    KHUB_FORWARD_IF_ERROR(NULL, drv_ready());
    return use_device(device);
}

khub_status khub__cuda_stream_open(int device, void **stream)
{
    *stream = NULL;
    KHUB_FORWARD_IF_ERROR(NULL, khub__cuda_use_device(device));
    cu_stream s = NULL;
    KHUB_FORWARD_IF_ERROR(NULL, cu_check(drv.stream_create(&s, 0), "cuStreamCreate"));
    *stream = s;
    return KHUB_STATUS_OK;
}

khub_status khub__cuda_stream_close(int device, void *stream)
{
    if (!stream) return KHUB_STATUS_OK;
    KHUB_FORWARD_IF_ERROR(NULL, khub__cuda_use_device(device));
    khub_status sync = cu_check(drv.stream_synchronize((cu_stream)stream), "cuStreamSynchronize");
    khub_status st = cu_check(drv.stream_destroy((cu_stream)stream), "cuStreamDestroy");
    return sync != KHUB_STATUS_OK ? sync : st;
}

void khub__cuda_close(khub_runtime *rt)
{
    if (rt) rt->cuda = NULL;
}

void khub__cuda_unload_modules(khub_plugin *p)
{
    pthread_mutex_lock(&p->mod_lock);
    khub__cuda_mod *m = p->modules;
    khub__cuda_stream *s = p->streams;
    p->modules = NULL;
    p->streams = NULL;
    pthread_mutex_unlock(&p->mod_lock);
    /* Streams first, each drained before it is destroyed: work queued on
     * them may still run the modules' kernels (cuStreamDestroy returns at
     * once and lets pending work finish; cuModuleUnload would not wait). */
    while (s) {
        khub__cuda_stream *next = s->next;
        if (use_device(s->device) == KHUB_STATUS_OK) {
            drv.stream_synchronize((cu_stream)s->stream);
            drv.stream_destroy((cu_stream)s->stream);
        }
        khub__free(p->rt, s, sizeof *s);
        s = next;
    }
    while (m) {
        khub__cuda_mod *next = m->next;
        if (use_device(m->device) == KHUB_STATUS_OK) drv.module_unload((cu_module)m->module);
        khub__free(p->rt, m, sizeof *m);
        m = next;
    }
}

/* ======================================================================== */
/* Host table entries                                                       */
/* ======================================================================== */

khub_status khub__cuda_host_device_count(void *host_ctx, int *count)
{
    (void)host_ctx;
    if (count) *count = 0;
    KHUB_FORWARD_IF_ERROR(NULL, drv_ready());
    if (!count) return khub__plugin_fail(KHUB_STATUS_MISUSE, "cuda_device_count: count is NULL");
    *count = drv.n_devices;
    return KHUB_STATUS_OK;
}

khub_status khub__cuda_host_device_cc(void *host_ctx, int device, int *cc)
{
    (void)host_ctx;
    if (cc) *cc = 0;
    KHUB_FORWARD_IF_ERROR(NULL, drv_ready());
    if (!cc) return khub__plugin_fail(KHUB_STATUS_MISUSE, "cuda_device_cc: cc is NULL");
    if (device < 0 || device >= drv.n_devices)
        return khub__plugin_fail(KHUB_STATUS_INVALID_ARG, "CUDA device %d: %d device(s) present",
                                 device, drv.n_devices);
    cu_device dev;
    int major = 0, minor = 0;
    KHUB_FORWARD_IF_ERROR(NULL, cu_check(drv.device_get(&dev, device), "cuDeviceGet"));
    KHUB_FORWARD_IF_ERROR(NULL, cu_check(drv.device_get_attribute(&major, CU_ATTR_CC_MAJOR, dev),
                                         "cuDeviceGetAttribute"));
    KHUB_FORWARD_IF_ERROR(NULL, cu_check(drv.device_get_attribute(&minor, CU_ATTR_CC_MINOR, dev),
                                         "cuDeviceGetAttribute"));
    *cc = major * 10 + minor;
    return KHUB_STATUS_OK;
}

khub_status khub__cuda_host_mem_alloc(void *host_ctx, int device, size_t bytes, uint64_t *dptr)
{
    (void)host_ctx;
    if (dptr) *dptr = 0;
    KHUB_FORWARD_IF_ERROR(NULL, drv_ready());
    if (!dptr) return khub__plugin_fail(KHUB_STATUS_MISUSE, "cuda_mem_alloc: dptr is NULL");
    KHUB_FORWARD_IF_ERROR(NULL, use_device(device));
    cu_deviceptr p = 0;
    KHUB_FORWARD_IF_ERROR(NULL, cu_check(drv.mem_alloc(&p, bytes), "cuMemAlloc"));
    *dptr = p;
    return KHUB_STATUS_OK;
}

khub_status khub__cuda_host_mem_free(void *host_ctx, uint64_t dptr)
{
    (void)host_ctx;
    KHUB_FORWARD_IF_ERROR(NULL, use_current());
    return dptr ? cu_check(drv.mem_free(dptr), "cuMemFree") : KHUB_STATUS_OK;
}

khub_status khub__cuda_host_memcpy_htod(void *host_ctx, uint64_t dst, const void *src, size_t n,
                                        void *stream)
{
    (void)host_ctx;
    KHUB_FORWARD_IF_ERROR(NULL, use_current());
    return cu_check(drv.memcpy_htod_async(dst, src, n, (cu_stream)stream), "cuMemcpyHtoDAsync");
}

khub_status khub__cuda_host_memcpy_dtoh(void *host_ctx, void *dst, uint64_t src, size_t n,
                                        void *stream)
{
    (void)host_ctx;
    KHUB_FORWARD_IF_ERROR(NULL, use_current());
    return cu_check(drv.memcpy_dtoh_async(dst, src, n, (cu_stream)stream), "cuMemcpyDtoHAsync");
}

khub_status khub__cuda_memcpy_dtod(uint64_t dst, uint64_t src, size_t n, void *stream)
{
    KHUB_FORWARD_IF_ERROR(NULL, use_current());
    return cu_check(drv.memcpy_dtod_async(dst, src, n, (cu_stream)stream), "cuMemcpyDtoDAsync");
}

khub_status khub__cuda_host_stream_sync(void *host_ctx, void *stream)
{
    (void)host_ctx;
    KHUB_FORWARD_IF_ERROR(NULL, use_current());
    return cu_check(drv.stream_synchronize((cu_stream)stream), "cuStreamSynchronize");
}

/* Streams are charged to the plugin, like modules, so retirement can destroy
 * what it left and destroy accepts only the plugin's own. Flags 0: the
 * stream synchronises with the legacy default stream, which is what the
 * host's NULL stream is (CU_GET_PROC_LEGACY_STREAM). */
khub_status khub__cuda_host_stream_create(void *host_ctx, int device, void **stream)
{
    khub__host_ctx *c = host_ctx;
    if (stream) *stream = NULL;
    KHUB_FORWARD_IF_ERROR(NULL, drv_ready());
    if (!c || !c->plugin || !stream)
        return khub__plugin_fail(KHUB_STATUS_MISUSE, "cuda_stream_create: needs a plugin and out");
    khub_plugin *p = c->plugin;
    khub__cuda_stream *s = khub__calloc(p->rt, 1, sizeof *s);
    if (!s) return khub__plugin_fail(KHUB_STATUS_NOMEM, "cuda_stream_create: out of memory");
    khub_status st = use_device(device);
    cu_stream cs = NULL;
    if (st == KHUB_STATUS_OK) st = cu_check(drv.stream_create(&cs, 0), "cuStreamCreate");
    if (st != KHUB_STATUS_OK) {
        khub__free(p->rt, s, sizeof *s);
        return st;
    }
    s->stream = cs;
    s->device = device;
    pthread_mutex_lock(&p->mod_lock);
    s->next = p->streams;
    p->streams = s;
    pthread_mutex_unlock(&p->mod_lock);
    *stream = cs;
    return KHUB_STATUS_OK;
}

khub_status khub__cuda_host_stream_destroy(void *host_ctx, void *stream)
{
    khub__host_ctx *c = host_ctx;
    if (!stream) return KHUB_STATUS_OK;
    KHUB_FORWARD_IF_ERROR(NULL, drv_ready());
    if (!c || !c->plugin)
        return khub__plugin_fail(KHUB_STATUS_MISUSE, "cuda_stream_destroy: needs a plugin");
    khub_plugin *p = c->plugin;
    pthread_mutex_lock(&p->mod_lock);
    khub__cuda_stream **at = &p->streams;
    while (*at && (*at)->stream != stream) at = &(*at)->next;
    khub__cuda_stream *s = *at;
    if (s) *at = s->next;
    pthread_mutex_unlock(&p->mod_lock);
    if (!s)
        return khub__plugin_fail(KHUB_STATUS_INVALID_ARG,
                                 "cuda_stream_destroy: %p is not a stream %s created", stream,
                                 p->id ? p->id : "this plugin");
    khub_status st = use_device(s->device);
    if (st == KHUB_STATUS_OK)
        st = cu_check(drv.stream_destroy((cu_stream)s->stream), "cuStreamDestroy");
    khub__free(p->rt, s, sizeof *s);
    return st;
}

/* The image is handed to the driver as is: a PTX image must be
 * NUL-terminated within size, which we check, since the driver reads PTX up
 * to the terminator. */
khub_status khub__cuda_host_module_load(void *host_ctx, int device, const void *image, size_t size,
                                        khub_cuda_module **out)
{
    khub__host_ctx *c = host_ctx;
    if (out) *out = NULL;
    KHUB_FORWARD_IF_ERROR(NULL, drv_ready());
    if (!c || !c->plugin || !image || !out || size < 4)
        return khub__plugin_fail(KHUB_STATUS_MISUSE,
                                 "cuda_module_load: needs a plugin, an image and out");
    const unsigned char *b = image;
    bool elf = memcmp(b, "\177ELF", 4) == 0;
    bool fatbin = b[0] == 0x50 && b[1] == 0xed && b[2] == 0x55 && b[3] == 0xba;
    if (!elf && !fatbin && !memchr(b, '\0', size))
        return khub__plugin_fail(KHUB_STATUS_INVALID_ARG,
                                 "cuda_module_load: PTX image of %zu bytes is not NUL-terminated",
                                 size);
    khub_plugin *p = c->plugin;
    khub__cuda_mod *m = khub__calloc(p->rt, 1, sizeof *m);
    if (!m) return khub__plugin_fail(KHUB_STATUS_NOMEM, "cuda_module_load: out of memory");
    khub_status st = use_device(device);
    cu_module mod = NULL;
    if (st == KHUB_STATUS_OK) st = cu_check(drv.module_load_data(&mod, image), "cuModuleLoadData");
    if (st != KHUB_STATUS_OK) {
        khub__free(p->rt, m, sizeof *m);
        return st;
    }
    m->module = mod;
    m->device = device;
    pthread_mutex_lock(&p->mod_lock);
    m->next = p->modules;
    p->modules = m;
    pthread_mutex_unlock(&p->mod_lock);
    *out = (khub_cuda_module *)m;
    return KHUB_STATUS_OK;
}

/* mod must be one this plugin loaded: the handle is checked against its
 * list rather than trusted. */
khub_status khub__cuda_host_module_function(void *host_ctx, khub_cuda_module *mod, const char *name,
                                            void **function)
{
    khub__host_ctx *c = host_ctx;
    if (function) *function = NULL;
    KHUB_FORWARD_IF_ERROR(NULL, drv_ready());
    if (!c || !c->plugin || !mod || !name || !function)
        return khub__plugin_fail(KHUB_STATUS_MISUSE, "cuda_module_function: NULL argument");
    khub_plugin *p = c->plugin;
    pthread_mutex_lock(&p->mod_lock);
    khub__cuda_mod *m = p->modules;
    while (m && m != (khub__cuda_mod *)mod) m = m->next;
    pthread_mutex_unlock(&p->mod_lock);
    if (!m)
        return khub__plugin_fail(KHUB_STATUS_INVALID_ARG,
                                 "cuda_module_function %s: not a module of %s", name, p->id);
    KHUB_FORWARD_IF_ERROR(NULL, use_device(m->device));
    cu_function f = NULL;
    khub_status st =
        cu_check(drv.module_get_function(&f, (cu_module)m->module, name), "cuModuleGetFunction");
    if (st == KHUB_STATUS_OK) *function = f;
    return st;
}

khub_status khub__cuda_host_launch(void *host_ctx, void *function, const khub_cuda_launch_cfg *cfg,
                                   void **kernel_params)
{
    (void)host_ctx;
    KHUB_FORWARD_IF_ERROR(NULL, use_current());
    if (!function || !cfg ||
        cfg->struct_size < offsetof(khub_cuda_launch_cfg, stream) + sizeof(void *))
        return khub__plugin_fail(KHUB_STATUS_MISUSE, "cuda_launch: needs a function and a cfg");
    return cu_check(drv.launch_kernel((cu_function)function, cfg->grid[0], cfg->grid[1],
                                      cfg->grid[2], cfg->block[0], cfg->block[1], cfg->block[2],
                                      cfg->shared_bytes, (cu_stream)cfg->stream, kernel_params,
                                      NULL),
                    "cuLaunchKernel");
}
