/*
 * cuda_jit.c: load-time CUDA compilation and its on-disk cache (cuda_jit.h;
 * docs/gpu.md, "Load-time compilation"; issue 19 item 2).
 *
 * A plugin names a CUDA source of its own verified variant and the -D
 * defines it wants; the host compiles it with NVRTC for the device's exact
 * architecture and loads the result. The output is a cubin, not PTX: PTX
 * from an NVRTC newer than the driver carries an ISA the driver cannot read
 * (CUDA_ERROR_UNSUPPORTED_PTX_VERSION), and the driver would compile PTX
 * again at every load; a cubin for the device's architecture it runs as is.
 *
 * The cache: one file per key, <dir>/<key>.cubin, holding one header line
 * "khub-cuda-jit 1 <key> <sha256 of the payload> <payload bytes>\n" and the
 * payload. The key is the SHA-256 of a text naming the source's SHA-256,
 * the target architecture, NVRTC's version, the driver's version and every
 * compiler option (the defines sorted, so their order does not matter): a
 * change in any of them is another key, hence a compile. An entry is written
 * to a temporary file in the same directory, synced and renamed into place,
 * so a reader (another process too) sees a whole entry or none. Every read
 * checks the header's key, the payload's size and its digest: an entry that
 * fails is never loaded; it is recompiled with a warning and replaced. A
 * cache directory that cannot be made or written costs a warning and a
 * compile per load, never the load.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cuda.h"
#include "cuda_jit.h"
#include "nvrtc.h"
#include "plugin_artifacts.h"
#include "runtime_impl.h"
#include "timing.h"

#define JIT_MAX_DEFINES   16
#define JIT_MAX_PART      64 /* characters of a define's NAME, and of its VALUE */
#define JIT_MAX_IMAGE     ((size_t)64 << 20)
#define JIT_PATH_MAX      4096
#define ENTRY_MAGIC       "khub-cuda-jit 1"
#define JIT_FIXED_OPTIONS "--std=c++17 -default-device" /* nvrtc.c's, besides the arch */

typedef struct jit_job {
    khub_runtime *rt;
    const char *who;    /* the plugin's id */
    const char *source; /* the file's name in the variant */
    int device, cc, driver, nv_major, nv_minor;
    char opts[JIT_MAX_DEFINES][2 * JIT_MAX_PART + 4]; /* "-DNAME=VALUE", sorted */
    const char *optv[JIT_MAX_DEFINES];
    size_t n_opts;
    char key[65];
    char dir[JIT_PATH_MAX], path[JIT_PATH_MAX + 80];
} jit_job;

/* ======================================================================== */
/* Options and the key                                                      */
/* ======================================================================== */

/* "NAME" or "NAME=VALUE": NAME an identifier, VALUE letters, digits and
 * _ . + -; each at most JIT_MAX_PART characters. Nothing else can reach the
 * compiler's command line. */
static bool define_ok(const char *d)
{
    if (!d || !(isalpha((unsigned char)d[0]) || d[0] == '_')) return false;
    size_t i = 0;
    for (; d[i] && d[i] != '='; i++)
        if (!isalnum((unsigned char)d[i]) && d[i] != '_') return false;
    if (i > JIT_MAX_PART) return false;
    if (!d[i]) return true;
    size_t v = 0;
    for (const char *p = d + i + 1; *p; p++, v++)
        if (!isalnum((unsigned char)*p) && !strchr("_.+-", *p)) return false;
    return v <= JIT_MAX_PART;
}

static khub_status job_options(jit_job *j, const char *const *defines, size_t n)
{
    if (n > JIT_MAX_DEFINES)
        return khub__plugin_fail(KHUB_STATUS_INVALID_ARG,
                                 "%s: cuda_module_compile %s: %zu defines (at most %d)", j->who,
                                 j->source, n, JIT_MAX_DEFINES);
    for (size_t i = 0; i < n; i++) {
        if (!define_ok(defines[i]))
            return khub__plugin_fail(KHUB_STATUS_INVALID_ARG,
                                     "%s: cuda_module_compile %s: define \"%.80s\" is not NAME or "
                                     "NAME=VALUE (an identifier; letters, digits and _ . + -; at "
                                     "most %d characters each)",
                                     j->who, j->source, defines[i] ? defines[i] : "(null)",
                                     JIT_MAX_PART);
        snprintf(j->opts[i], sizeof j->opts[i], "-D%s", defines[i]);
    }
    /* Sorted (insertion, n <= 16): the same defines in another order are the
     * same module and the same key. */
    for (size_t i = 1; i < n; i++)
        for (size_t k = i; k > 0 && strcmp(j->opts[k - 1], j->opts[k]) > 0; k--) {
            char t[sizeof j->opts[0]];
            memcpy(t, j->opts[k], sizeof t);
            memcpy(j->opts[k], j->opts[k - 1], sizeof t);
            memcpy(j->opts[k - 1], t, sizeof t);
        }
    for (size_t i = 0; i < n; i++) j->optv[i] = j->opts[i];
    j->n_opts = n;
    return KHUB_STATUS_OK;
}

static khub_status job_key(jit_job *j, const void *src, size_t src_n)
{
    char src_sum[65];
    KHUB_FORWARD_IF_ERROR(NULL, khub__sha256_hex(src, src_n, src_sum));
    char text[JIT_MAX_DEFINES * sizeof j->opts[0] + 512];
    int len = snprintf(text, sizeof text,
                       "%s\nsource %s\ntarget sm_%d cubin\nnvrtc %d.%d\ndriver %d\noptions %s\n",
                       ENTRY_MAGIC, src_sum, j->cc, j->nv_major, j->nv_minor, j->driver,
                       JIT_FIXED_OPTIONS);
    for (size_t i = 0; i < j->n_opts && len > 0 && (size_t)len < sizeof text; i++)
        len += snprintf(text + len, sizeof text - (size_t)len, "option %s\n", j->opts[i]);
    if (len <= 0 || (size_t)len >= sizeof text)
        return khub__plugin_fail(KHUB_STATUS_INTERNAL, "cuda_module_compile: key text too long");
    return khub__sha256_hex(text, (size_t)len, j->key);
}

/* The defines as one line for messages. */
static void job_defines(const jit_job *j, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < j->n_opts && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%s", i ? " " : "", j->opts[i]);
    if (!j->n_opts) snprintf(buf, n, "no defines");
}

/* ======================================================================== */
/* The cache directory and its entries                                      */
/* ======================================================================== */

bool khub__cuda_jit_cache_dir(char *buf, size_t n)
{
    const char *e = getenv("KHUB_CUDA_CACHE");
    int w;
    if (e && e[0])
        w = snprintf(buf, n, "%s", e);
    else if ((e = getenv("XDG_CACHE_HOME")) && e[0])
        w = snprintf(buf, n, "%s/khub/cuda", e);
    else if ((e = getenv("HOME")) && e[0])
        w = snprintf(buf, n, "%s/.cache/khub/cuda", e);
    else
        return false;
    return w > 0 && (size_t)w < n;
}

/* mkdir -p with mode 0700; 0 or the errno of the step that failed. */
static int make_dirs(char *path)
{
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        int e = mkdir(path, 0700) != 0 && errno != EEXIST ? errno : 0;
        *p = '/';
        if (e) return e;
    }
    if (mkdir(path, 0700) != 0 && errno != EEXIST) return errno;
    struct stat st;
    if (stat(path, &st) != 0) return errno;
    return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
}

/* 1: a good entry for key (*img, *n: the payload, malloc'd); 0: none;
 * -1: an entry that must not be used, why says what is wrong with it. */
static int cache_read(const char *path, const char *key, char **img, size_t *n, char *why,
                      size_t why_n)
{
    *img = NULL;
    *n = 0;
    char *buf = NULL;
    size_t len = 0;
    khub_status st = khub__read_file(path, JIT_MAX_IMAGE + 256, &buf, &len, NULL, 0);
    if (st == KHUB_STATUS_NOT_FOUND) return 0;
    if (st != KHUB_STATUS_OK) {
        snprintf(why, why_n, "unreadable (%s)", khub_status_name(st));
        return -1;
    }
    char head[256], k[65] = "", sum[65] = "", calc[65] = "";
    unsigned long long size = 0;
    const char *nl = memchr(buf, '\n', len < sizeof head ? len : sizeof head);
    size_t hl = nl ? (size_t)(nl - buf) + 1 : 0;
    if (hl) memcpy(head, buf, hl - 1), head[hl - 1] = '\0';
    if (!hl || sscanf(head, ENTRY_MAGIC " %64s %64s %llu", k, sum, &size) != 3)
        snprintf(why, why_n, "not a khub-cuda-jit 1 entry");
    else if (strcmp(k, key) != 0)
        snprintf(why, why_n, "made for another key (%.12s)", k);
    else if (size != len - hl)
        snprintf(why, why_n, "truncated or padded: %zu payload bytes, the header says %llu",
                 len - hl, size);
    else if (khub__sha256_hex(buf + hl, len - hl, calc) != KHUB_STATUS_OK ||
             !khub__digest_eq(calc, sum))
        snprintf(why, why_n, "corrupt: its payload's SHA-256 is %.12s, the header says %.12s", calc,
                 sum);
    else {
        memmove(buf, buf + hl, len - hl);
        buf[len - hl] = '\0';
        *img = buf;
        *n = len - hl;
        return 1;
    }
    free(buf);
    return -1;
}

static bool write_all(int fd, const void *p, size_t n)
{
    const char *b = p;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        b += w, n -= (size_t)w;
    }
    return true;
}

/* Writes the entry atomically (temporary file, fsync, rename); false with
 * why on failure, nothing left behind. */
static bool cache_write(const jit_job *j, const void *img, size_t n, char *why, size_t why_n)
{
    char sum[65], head[256], tmp[JIT_PATH_MAX + 96];
    if (khub__sha256_hex(img, n, sum) != KHUB_STATUS_OK) {
        snprintf(why, why_n, "hashing the cubin failed");
        return false;
    }
    int hl = snprintf(head, sizeof head, "%s %s %s %zu\n", ENTRY_MAGIC, j->key, sum, n);
    snprintf(tmp, sizeof tmp, "%s/.tmp-%.16s-XXXXXX", j->dir, j->key);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        snprintf(why, why_n, "cannot create a file in it: %s", strerror(errno));
        return false;
    }
    bool ok = write_all(fd, head, (size_t)hl) && write_all(fd, img, n) && fsync(fd) == 0;
    int e = errno;
    ok = close(fd) == 0 && ok;
    if (ok && rename(tmp, j->path) != 0) ok = false, e = errno;
    if (!ok) {
        snprintf(why, why_n, "cannot write %s: %s", tmp, strerror(e));
        unlink(tmp);
    }
    return ok;
}

/* ======================================================================== */
/* Compile and load                                                         */
/* ======================================================================== */

/* The cubin for the job: from the cache when a good entry is there, else
 * from NVRTC (then cached). *img is malloc'd. */
static khub_status job_cubin(jit_job *j, khub_nvrtc *nv, const char *src, char **img, size_t *n)
{
    char why[KHUB_ERROR_SIZE], defs[JIT_MAX_DEFINES * sizeof j->opts[0]];
    job_defines(j, defs, sizeof defs);
    bool cache = khub__cuda_jit_cache_dir(j->dir, sizeof j->dir);
    int e = cache ? make_dirs(j->dir) : ENOENT;
    if (cache && !e) {
        snprintf(j->path, sizeof j->path, "%s/%s.cubin", j->dir, j->key);
        int r = cache_read(j->path, j->key, img, n, why, sizeof why);
        if (r == 1) {
            khub__log(j->rt, KHUB_LOG_DEBUG, "%s: %s for sm_%d (%s) from the CUDA cache %s", j->who,
                      j->source, j->cc, defs, j->path);
            return KHUB_STATUS_OK;
        }
        if (r < 0)
            khub__log(j->rt, KHUB_LOG_WARN,
                      "%s: the cached cubin %s is %s: not used; compiling %s for sm_%d again",
                      j->who, j->path, why, j->source, j->cc);
    }
    double t0 = khub__time_now(CLOCK_MONOTONIC);
    khub_status st = khub__nvrtc_compile(nv, src, j->source, j->cc, KHUB_NVRTC_CUBIN, j->optv,
                                         j->n_opts, img, n, why, sizeof why);
    if (st != KHUB_STATUS_OK)
        return khub__plugin_fail(st, "%s: load-time compilation of %s for sm_%d (%s) failed: %s",
                                 j->who, j->source, j->cc, defs, why);
    double ms = (khub__time_now(CLOCK_MONOTONIC) - t0) * 1e3;
    if (cache && !e && cache_write(j, *img, *n, why, sizeof why)) {
        khub__log(j->rt, KHUB_LOG_INFO,
                  "%s: compiled %s for sm_%d (%s) with NVRTC %d.%d in %.0f ms; "
                  "cached as %s",
                  j->who, j->source, j->cc, defs, j->nv_major, j->nv_minor, ms, j->path);
        return KHUB_STATUS_OK;
    }
    if (!cache)
        snprintf(why, sizeof why, "no cache directory: set KHUB_CUDA_CACHE or HOME");
    else if (e)
        snprintf(why, sizeof why, "cannot make %s: %s", j->dir, strerror(e));
    khub__log(j->rt, KHUB_LOG_WARN,
              "%s: the CUDA cache is not writable (%s): %s for sm_%d compiled without caching",
              j->who, why, j->source, j->cc);
    return KHUB_STATUS_OK;
}

static khub_status module_compile(void *host_ctx, int device, const char *source,
                                  const char *const *defines, size_t n_defines,
                                  khub_cuda_module **out)
{
    khub__host_ctx *c = host_ctx;
    if (out) *out = NULL;
    if (!c || !c->plugin || !source || !out || (n_defines && !defines))
        return khub__plugin_fail(KHUB_STATUS_MISUSE,
                                 "cuda_module_compile: needs a plugin, a source name and out");
    khub_plugin *p = c->plugin;
    jit_job j = {.rt = c->rt, .who = p->id ? p->id : "plugin", .source = source, .device = device};
    KHUB_FORWARD_IF_ERROR(NULL, job_options(&j, defines, n_defines));
    const char *mode = getenv("KHUB_CUDA_JIT");
    if (mode && !strcmp(mode, "0"))
        return khub__plugin_fail(KHUB_STATUS_UNSUPPORTED,
                                 "%s: load-time compilation of %s is off (KHUB_CUDA_JIT=0)", j.who,
                                 source);
    KHUB_FORWARD_IF_ERROR(NULL, khub__cuda_host_device_cc(host_ctx, device, &j.cc));
    if (khub__cuda_info(NULL, &j.driver, NULL) != KHUB_STATUS_OK) /* not after device_cc's OK */
        return khub__plugin_fail(KHUB_STATUS_NO_CUDA, "%s: no CUDA driver version", j.who);
    if (!p->artifacts)
        return khub__plugin_fail(KHUB_STATUS_NOT_FOUND,
                                 "%s: cuda_module_compile %s: the plugin was loaded without its "
                                 "variant's files (the source must be one of them)",
                                 j.who, source);
    const void *src = NULL;
    size_t src_n = 0;
    char msg[KHUB_ERROR_SIZE];
    khub_status st =
        khub__artifacts_get(c->rt, p->artifacts, source, &src, &src_n, msg, sizeof msg);
    if (st != KHUB_STATUS_OK)
        return khub__plugin_fail(st, "%s: cuda_module_compile: %s", j.who, msg);
    khub_nvrtc *nv = NULL;
    if ((st = khub__nvrtc_open(&nv, msg, sizeof msg)) != KHUB_STATUS_OK)
        return khub__plugin_fail(st, "%s: load-time compilation of %s for sm_%d needs NVRTC: %s",
                                 j.who, source, j.cc, msg);
    khub__nvrtc_version(nv, &j.nv_major, &j.nv_minor);
    char *img = NULL;
    size_t n = 0;
    st = job_key(&j, src, src_n);
    if (st == KHUB_STATUS_OK) st = job_cubin(&j, nv, src, &img, &n);
    khub__nvrtc_close(nv);
    if (st == KHUB_STATUS_OK) st = khub__cuda_host_module_load(host_ctx, device, img, n, out);
    free(img);
    return st;
}

/* A failure is also logged (WARN) with its reason: the plugin usually goes
 * on with its build-time PTX and returns OK, and the message it got through
 * fail would be lost; the log says why the device runs unspecialised code.
 * Turned off on purpose (KHUB_CUDA_JIT=0) is not a warning. */
khub_status khub__cuda_host_module_compile(void *host_ctx, int device, const char *source,
                                           const char *const *defines, size_t n_defines,
                                           khub_cuda_module **out)
{
    khub_status st = module_compile(host_ctx, device, source, defines, n_defines, out);
    const khub__host_ctx *c = host_ctx;
    const char *mode = getenv("KHUB_CUDA_JIT");
    if (st != KHUB_STATUS_OK && c && !(mode && !strcmp(mode, "0")))
        khub__log(c->rt, KHUB_LOG_WARN, "%s", khub__plugin_msg());
    return st;
}
