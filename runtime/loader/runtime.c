/*
 * runtime.c: the khub_runtime object: creation and teardown, the per-runtime
 * allocator, error messages, logging, options and features.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app_struct.h"
#include "contain.h"
#include "runtime_impl.h"

/* ======================================================================== */
/* Errors                                                                   */
/* ======================================================================== */

static _Thread_local char tls_last_error[KHUB_ERROR_SIZE];

const char *khub_last_error(void) { return tls_last_error; }

khub_status khub__vfail(khub_runtime *rt, khub_status st, const char *fmt, va_list ap)
{
    char msg[KHUB_ERROR_SIZE];
    khub__verrbuf(msg, sizeof msg, fmt, ap);
    memcpy(tls_last_error, msg, sizeof msg);
    if (rt) {
        pthread_mutex_lock(&rt->err_lock);
        if (!rt->err_set) {
            memcpy(rt->errmsg, msg, sizeof msg);
            rt->err_set = 1;
        }
        pthread_mutex_unlock(&rt->err_lock);
    }
    return st;
}

khub_status khub__fail(khub_runtime *rt, khub_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    khub__vfail(rt, st, fmt, ap);
    va_end(ap);
    return st;
}

void khub__clear(khub_runtime *rt)
{
    if (!rt) return;
    pthread_mutex_lock(&rt->err_lock);
    rt->err_set = 0;
    rt->errmsg[0] = '\0';
    pthread_mutex_unlock(&rt->err_lock);
}

void khub__copy_error(const khub_runtime *rt, char *buf, size_t n)
{
    if (!buf || n == 0) return;
    snprintf(buf, n, "%s", rt ? rt->errmsg : tls_last_error);
}

const char *khub_runtime_errmsg(const khub_runtime *rt) { return rt ? rt->errmsg : tls_last_error; }

void khub__assert_fail(const char *cond, const char *file, int line)
{
    fprintf(stderr, "khub: internal assertion failed: %s (%s:%d)\n", cond, file, line);
    abort();
}

/* ======================================================================== */
/* Memory                                                                   */
/* ======================================================================== */

static void *libc_realloc(void *ud, void *p, size_t old_size, size_t new_size)
{
    (void)ud;
    (void)old_size;
    if (new_size == 0) {
        free(p);
        return NULL;
    }
    return realloc(p, new_size);
}

static const khub_allocator default_alloc = {libc_realloc, NULL};

static const khub_allocator *alloc_of(const khub_runtime *rt)
{
    return rt ? &rt->alloc : &default_alloc;
}

const khub_allocator *khub__runtime_allocator(const khub_runtime *rt)
{
    return rt ? &rt->alloc : NULL;
}

void *khub__realloc(khub_runtime *rt, void *p, size_t old_n, size_t new_n)
{
    const khub_allocator *a = alloc_of(rt);
    return a->realloc(a->ud, p, old_n, new_n);
}

void *khub__malloc(khub_runtime *rt, size_t n) { return khub__realloc(rt, NULL, 0, n ? n : 1); }

void *khub__calloc(khub_runtime *rt, size_t count, size_t size)
{
    size_t n;
    if (!khub__mul_ok(count, size, &n)) return NULL;
    void *p = khub__malloc(rt, n);
    if (p) memset(p, 0, n ? n : 1);
    return p;
}

void khub__free(khub_runtime *rt, void *p, size_t n)
{
    if (p) khub__realloc(rt, p, n ? n : 1, 0);
}

char *khub__strdup(khub_runtime *rt, const char *s)
{
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = khub__malloc(rt, n);
    if (d) memcpy(d, s, n);
    return d;
}

void khub__strfree(khub_runtime *rt, char *s)
{
    if (s) khub__free(rt, s, strlen(s) + 1);
}

/* Aligned blocks: [pad][size_t total][size_t offset] header before the
 * returned pointer, which is 64-byte aligned. */
void *khub__aligned_alloc(khub_runtime *rt, size_t n)
{
    size_t total;
    if (!khub__add_ok(n, 64 + 2 * sizeof(size_t), &total)) return NULL;
    unsigned char *raw = khub__malloc(rt, total);
    if (!raw) return NULL;
    uintptr_t start = (uintptr_t)raw + 2 * sizeof(size_t);
    uintptr_t aligned = (start + 63) & ~(uintptr_t)63;
    size_t *hdr = (size_t *)aligned - 2;
    hdr[0] = total;
    hdr[1] = aligned - (uintptr_t)raw;
    return (void *)aligned;
}

void khub__aligned_free(khub_runtime *rt, void *p)
{
    if (!p) return;
    size_t *hdr = (size_t *)p - 2;
    khub__free(rt, (unsigned char *)p - hdr[1], hdr[0]);
}

/* ======================================================================== */
/* Logging                                                                  */
/* ======================================================================== */

static const char *level_name(khub_log_level l)
{
    switch (l) {
    case KHUB_LOG_ERROR: return "error";
    case KHUB_LOG_WARN: return "warning";
    case KHUB_LOG_INFO: return "info";
    default: return "debug";
    }
}

void khub__vlog(const khub_runtime *rt, khub_log_level level, const char *fmt, va_list ap)
{
    int threshold = rt ? rt->log_level : KHUB_LOG_WARN;
    if ((int)level > threshold) return;
    char msg[1024];
    khub__verrbuf(msg, sizeof msg, fmt, ap);
    if (rt && rt->log_cb)
        rt->log_cb(rt->log_ud, level, msg);
    else
        fprintf(stderr, "khub: %s: %s\n", level_name(level), msg);
}

void khub__log(const khub_runtime *rt, khub_log_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    khub__vlog(rt, level, fmt, ap);
    va_end(ap);
}

void khub_log_set(khub_runtime *rt, khub_log_fn cb, void *ud)
{
    if (!rt) return;
    rt->log_cb = cb;
    rt->log_ud = ud;
}

/* ======================================================================== */
/* Options                                                                  */
/* ======================================================================== */

khub_status khub_option_bounds(khub_option opt, int64_t *min, int64_t *max)
{
    int64_t lo, hi;
    switch (opt) {
    case KHUB_OPT_LOG_LEVEL: lo = KHUB_LOG_ERROR, hi = KHUB_LOG_DEBUG; break;
    case KHUB_OPT_STRICT:
    case KHUB_OPT_ALLOW_UNVERIFIED:
    case KHUB_OPT_ISOLATED_INIT:
    case KHUB_OPT_CONTAIN:
    case KHUB_OPT_ALLOW_QUARANTINED: lo = 0, hi = 1; break;
    case KHUB_OPT_VERIFY_KERNELS: lo = 0, hi = 1 << 30; break;
    default: return khub__fail(NULL, KHUB_STATUS_INVALID_ARG, "unknown option %d", (int)opt);
    }
    if (min) *min = lo;
    if (max) *max = hi;
    return KHUB_STATUS_OK;
}

/* Containment is process-wide: each runtime that wants it holds one count. */
static void set_contain(khub_runtime *rt, int on)
{
    if (on && !rt->contain) khub__contain_acquire();
    if (!on && rt->contain) khub__contain_release();
    rt->contain = on;
}

khub_status khub_runtime_set_option(khub_runtime *rt, khub_option opt, int64_t value)
{
    KHUB_API_CHECK(NULL, rt != NULL);
    khub__clear(rt);
    int64_t lo, hi;
    if (khub_option_bounds(opt, &lo, &hi) != KHUB_STATUS_OK)
        return khub__fail(rt, KHUB_STATUS_INVALID_ARG, "unknown option %d", (int)opt);
    KHUB_RETURN_IF(rt, value < lo || value > hi, KHUB_STATUS_INVALID_ARG,
                   "option %d: value %lld outside [%lld, %lld]", (int)opt, (long long)value,
                   (long long)lo, (long long)hi);
    switch (opt) {
    case KHUB_OPT_LOG_LEVEL: rt->log_level = (int)value; break;
    case KHUB_OPT_STRICT: rt->strict = (int)value; break;
    case KHUB_OPT_ALLOW_UNVERIFIED: rt->allow_unverified = (int)value; break;
    case KHUB_OPT_ISOLATED_INIT: rt->isolated_init = (int)value; break;
    case KHUB_OPT_CONTAIN: set_contain(rt, (int)value); break;
    case KHUB_OPT_ALLOW_QUARANTINED: rt->allow_quarantined = (int)value; break;
    case KHUB_OPT_VERIFY_KERNELS: rt->verify_kernels = (int)value; break;
    default: break;
    }
    return KHUB_STATUS_OK;
}

khub_status khub_runtime_get_option(const khub_runtime *rt, khub_option opt, int64_t *value)
{
    KHUB_API_CHECK(NULL, rt != NULL && value != NULL);
    switch (opt) {
    case KHUB_OPT_LOG_LEVEL: *value = rt->log_level; break;
    case KHUB_OPT_STRICT: *value = rt->strict; break;
    case KHUB_OPT_ALLOW_UNVERIFIED: *value = rt->allow_unverified; break;
    case KHUB_OPT_ISOLATED_INIT: *value = rt->isolated_init; break;
    case KHUB_OPT_CONTAIN: *value = rt->contain; break;
    case KHUB_OPT_ALLOW_QUARANTINED: *value = rt->allow_quarantined; break;
    case KHUB_OPT_VERIFY_KERNELS: *value = rt->verify_kernels; break;
    default: return khub__fail(NULL, KHUB_STATUS_INVALID_ARG, "unknown option %d", (int)opt);
    }
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* Features                                                                 */
/* ======================================================================== */

/* Copies and formats without snprintf: a runtime made per warm load
 * formatted its 15 features with it (~1 us; docs/performance.md, "Warm
 * load, session 14"). */
static void add_feature_str(khub_runtime *rt, const char *name, const char *value)
{
    if (rt->n_features >= KHUB__MAX_FEATURES) return;
    size_t i = rt->n_features++;
    size_t n = strnlen(value, sizeof rt->feature_values[i] - 1);
    memcpy(rt->feature_values[i], value, n);
    rt->feature_values[i][n] = '\0';
    rt->features[i].name = name;
    rt->features[i].value = rt->feature_values[i];
}

static void add_feature(khub_runtime *rt, const char *name, long long value)
{
    char v[24], *p = v + sizeof v;
    unsigned long long u = value < 0 ? 0 - (unsigned long long)value : (unsigned long long)value;
    *--p = '\0';
    do *--p = (char)('0' + u % 10);
    while (u /= 10);
    if (value < 0) *--p = '-';
    add_feature_str(rt, name, p);
}

static void collect_features(khub_runtime *rt)
{
    static const struct {
        const char *name;
        uint32_t bit;
    } cpu[] = {{"cpu.sse42", KHUB_CPU_SSE42},
               {"cpu.avx", KHUB_CPU_AVX},
               {"cpu.avx2", KHUB_CPU_AVX2},
               {"cpu.fma", KHUB_CPU_FMA},
               {"cpu.f16c", KHUB_CPU_F16C},
               {"cpu.avx512f", KHUB_CPU_AVX512F},
               {"cpu.avx512vnni", KHUB_CPU_AVX512VNNI},
               {"cpu.avx512bf16", KHUB_CPU_AVX512BF16},
               {"cpu.avxvnni", KHUB_CPU_AVXVNNI},
               {"cpu.bmi2", KHUB_CPU_BMI2}};
    for (size_t i = 0; i < sizeof cpu / sizeof cpu[0]; i++)
        add_feature(rt, cpu[i].name, (rt->cpu_features & cpu[i].bit) != 0);
    add_feature_str(rt, "cpu.level", khub__cpu_level_of(rt->cpu_features));
    add_feature(rt, "threads", rt->n_threads);
    add_feature(rt, "abi.major", KHUB_ABI_MAJOR);
    add_feature(rt, "abi.minor", KHUB_ABI_MINOR);
    add_feature(rt, "ptr_size", (long long)sizeof(void *));
}

khub_status khub_runtime_features(const khub_runtime *rt, const khub_feature **list, size_t *count)
{
    KHUB_API_CHECK(NULL, rt != NULL && list != NULL && count != NULL);
    *list = rt->features;
    *count = rt->n_features;
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* Lifecycle                                                                */
/* ======================================================================== */

/* The default thread count, asked once per process: sysconf reads
 * /sys/devices/system/cpu/online (open, read, close of a sysfs file),
 * ~16 us of a ~350 us warm kernel load that makes a runtime each time
 * (docs/performance.md, "Warm load, session 12"). A CPU brought online or
 * offline later does not change a later runtime's default (as with the
 * CPUID answer, cached the same way); khub_runtime_opts.n_threads chooses. */
static int online_cpus(void)
{
    static atomic_int cached; /* 0: not asked yet */
    int n = atomic_load_explicit(&cached, memory_order_relaxed);
    if (n) return n;
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    n = c < 1 ? 1 : (c > 256 ? 256 : (int)c);
    atomic_store_explicit(&cached, n, memory_order_relaxed);
    return n;
}

khub_status khub_runtime_new(const khub_runtime_opts *opts, khub_runtime **out)
{
    KHUB_API_CHECK(NULL, out != NULL);
    *out = NULL;
    tls_last_error[0] = '\0';
    char level_err[160];
    if (khub__cpu_level_check(level_err, sizeof level_err) != 0)
        return khub__fail(NULL, KHUB_STATUS_INVALID_ARG, "khub_runtime_new: %s", level_err);
    /* An application struct: struct_size is its version, and the stamp is
     * not compared (callers stamped it with the plugin ABI's numbers before
     * 0.1, KHUB_APP_INIT with the API's; ABI.md "The application API"). */
    if (opts)
        KHUB__APP_CHECK(NULL, opts, KHUB__SIZE_TO(khub_runtime_opts, log_ud), "khub_runtime_new",
                        "opts");
    khub_allocator a = (opts && opts->allocator.realloc) ? opts->allocator : default_alloc;
    khub_runtime *rt = a.realloc(a.ud, NULL, 0, sizeof *rt);
    if (!rt) return khub__fail(NULL, KHUB_STATUS_NOMEM, "khub_runtime_new: out of memory");
    memset(rt, 0, sizeof *rt);
    rt->alloc = a;
    rt->log_level = KHUB_LOG_WARN;
    rt->n_threads = (opts && opts->n_threads > 0) ? opts->n_threads : online_cpus();
    if (opts) {
        rt->log_cb = opts->log;
        rt->log_ud = opts->log_ud;
    }
    pthread_mutex_init(&rt->err_lock, NULL);
    pthread_rwlock_init(&rt->reg_lock, NULL);
    rt->cuda_once = (pthread_once_t)PTHREAD_ONCE_INIT;
    rt->cpu_features = khub_cpu_features();
    khub_status st = khub__pool_new(rt, rt->n_threads, &rt->pool);
    if (st != KHUB_STATUS_OK) {
        khub__fail(NULL, st, "khub_runtime_new: cannot start %d threads", rt->n_threads);
        khub_runtime_free(rt);
        return st;
    }
    collect_features(rt);
    uint32_t masked = khub__cpu_features_host() & ~rt->cpu_features;
    if (masked) {
        char names[160];
        khub__cpu_feature_list(masked, " ", names, sizeof names);
        KHUB_LOG_I(rt, "KHUB_CPU_LEVEL=%s: not using this CPU's %s", getenv("KHUB_CPU_LEVEL"),
                   names);
    }
    set_contain(rt, 1);
    *out = rt;
    return KHUB_STATUS_OK;
}

/* Provided by loader.c: unloads every plugin and frees every binding. */
KHUB_INTERNAL void khub__registry_teardown(khub_runtime *rt);
/* Provided by cuda.c. */
KHUB_INTERNAL void khub__cuda_close(khub_runtime *rt);

void khub_runtime_free(khub_runtime *rt)
{
    if (!rt) return;
    /* A model still holding the communicator (freed after its runtime: a
     * misuse) leaves no NCCL communicator behind. */
    if (rt->tp_owner) khub__runtime_return_comm(rt, rt->tp_owner);
    khub__registry_teardown(rt);
    set_contain(rt, 0);
    khub__pool_free(rt->pool);
    khub__cuda_close(rt);
    pthread_rwlock_destroy(&rt->reg_lock);
    pthread_mutex_destroy(&rt->err_lock);
    khub_allocator a = rt->alloc;
    a.realloc(a.ud, rt, sizeof *rt, 0);
}

khub_pool *khub__runtime_pool(khub_runtime *rt) { return rt->pool; }
