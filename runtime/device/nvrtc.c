/*
 * nvrtc.c: NVRTC through dlopen (see nvrtc.h). The function types are
 * declared here from NVRTC's documented C API; nvrtc.h from the toolkit is
 * not included so khub builds without the toolkit.
 */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvrtc.h"

typedef int nvrtcResult; /* 0 = NVRTC_SUCCESS */
typedef struct _nvrtcProgram *nvrtcProgram;

struct khub_nvrtc {
    void *lib;
    char path[256];
    int major, minor;
    nvrtcResult (*Version)(int *, int *);
    const char *(*GetErrorString)(nvrtcResult);
    nvrtcResult (*CreateProgram)(nvrtcProgram *, const char *, const char *, int,
                                 const char *const *, const char *const *);
    nvrtcResult (*DestroyProgram)(nvrtcProgram *);
    nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char *const *);
    nvrtcResult (*GetPTXSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetPTX)(nvrtcProgram, char *);
    nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetCUBIN)(nvrtcProgram, char *);
    nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetProgramLog)(nvrtcProgram, char *);
};

/* $KHUB_NVRTC_LIBRARY alone when it is set (a path, as KHUB_NCCL_LIBRARY:
 * a named library that fails to open is an error, not a reason to take
 * another one); else the toolkit's names in order. why gets the first
 * failure: the named library's, or libnvrtc.so.13's. */
static void *open_lib(char *path, size_t n, char *why, size_t why_n)
{
    const char *env = getenv("KHUB_NVRTC_LIBRARY");
    if (!env || !env[0]) env = getenv("KHUB_NVRTC_PATH"); /* the older name */
    const char *defaults[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so",
                              "/usr/local/cuda/lib64/libnvrtc.so"};
    const char *only[] = {env};
    bool named = env && env[0];
    const char *const *candidates = named ? only : defaults;
    size_t count = named ? 1 : sizeof defaults / sizeof defaults[0];
    why[0] = '\0';
    for (size_t i = 0; i < count; i++) {
        dlerror();
        void *lib = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
        if (lib) {
            snprintf(path, n, "%s", candidates[i]);
            return lib;
        }
        if (!why[0]) {
            const char *e = dlerror();
            snprintf(why, why_n, "%s", e ? e : candidates[i]);
        }
    }
    return NULL;
}

khub_status khub__nvrtc_open(khub_nvrtc **out, char *errbuf, size_t errbuf_size)
{
    *out = NULL;
    khub_nvrtc *nv = calloc(1, sizeof *nv);
    if (!nv) return KHUB_STATUS_NOMEM;
    char why[256];
    nv->lib = open_lib(nv->path, sizeof nv->path, why, sizeof why);
    if (!nv->lib) {
        free(nv);
        khub__errbuf(errbuf, errbuf_size,
                     "NVRTC not found (%s); install the CUDA toolkit's NVRTC or set "
                     "KHUB_NVRTC_LIBRARY to its libnvrtc.so",
                     why);
        return KHUB_STATUS_NO_NVRTC;
    }
#define SYM(field, name) \
    do { \
        *(void **)&nv->field = dlsym(nv->lib, name); \
        if (!nv->field) { \
            khub__errbuf(errbuf, errbuf_size, "NVRTC %s lacks %s; use the CUDA toolkit's", \
                         nv->path, name); \
            khub__nvrtc_close(nv); \
            return KHUB_STATUS_NO_NVRTC; \
        } \
    } while (0)
    SYM(Version, "nvrtcVersion");
    SYM(GetErrorString, "nvrtcGetErrorString");
    SYM(CreateProgram, "nvrtcCreateProgram");
    SYM(DestroyProgram, "nvrtcDestroyProgram");
    SYM(CompileProgram, "nvrtcCompileProgram");
    SYM(GetPTXSize, "nvrtcGetPTXSize");
    SYM(GetPTX, "nvrtcGetPTX");
    SYM(GetCUBINSize, "nvrtcGetCUBINSize");
    SYM(GetCUBIN, "nvrtcGetCUBIN");
    SYM(GetProgramLogSize, "nvrtcGetProgramLogSize");
    SYM(GetProgramLog, "nvrtcGetProgramLog");
#undef SYM
    nv->Version(&nv->major, &nv->minor);
    *out = nv;
    return KHUB_STATUS_OK;
}

void khub__nvrtc_close(khub_nvrtc *nv)
{
    /* The library stays loaded (like libcuda): NVRTC pulls in libstdc++,
     * whose static emergency pool becomes an unreachable block once the
     * library is unmapped, and a later open in the same process finds it
     * mapped already. */
    free(nv);
}

void khub__nvrtc_version(const khub_nvrtc *nv, int *major, int *minor)
{
    *major = nv->major;
    *minor = nv->minor;
}

const char *khub__nvrtc_path(const khub_nvrtc *nv) { return nv->path; }

/* Copies the program log (one line: newlines become " | ") into errbuf. */
static void copy_log(khub_nvrtc *nv, nvrtcProgram prog, const char *name, char *errbuf,
                     size_t errbuf_size)
{
    size_t n = 0;
    if (nv->GetProgramLogSize(prog, &n) != 0 || n == 0 || n > (1u << 20)) {
        khub__errbuf(errbuf, errbuf_size, "%s: NVRTC compilation failed (no log)", name);
        return;
    }
    char *log = malloc(n + 1);
    if (!log) return;
    if (nv->GetProgramLog(prog, log) == 0) {
        log[n] = '\0';
        size_t len = strlen(log); /* without the log's closing newlines */
        while (len && (log[len - 1] == '\n' || log[len - 1] == ' ')) log[--len] = '\0';
        khub__errbuf(errbuf, errbuf_size, "%s: NVRTC: %s", name, log);
    }
    free(log);
}

khub_status khub__nvrtc_compile(khub_nvrtc *nv, const char *src, const char *name, int cc,
                                khub_nvrtc_output kind, const char *const *extra_opts,
                                size_t n_extra, char **out, size_t *out_size, char *errbuf,
                                size_t errbuf_size)
{
    *out = NULL;
    *out_size = 0;
    if (cc < 30 || cc > 1300 || n_extra > 32) {
        khub__errbuf(errbuf, errbuf_size, "%s: bad compute capability %d", name, cc);
        return KHUB_STATUS_INVALID_ARG;
    }
    char arch[64];
    snprintf(arch, sizeof arch, "--gpu-architecture=%s_%d",
             kind == KHUB_NVRTC_PTX ? "compute" : "sm", cc);
    const char *opts[40] = {arch, "--std=c++17", "-default-device"};
    int n_opts = 3;
    for (size_t i = 0; i < n_extra; i++) opts[n_opts++] = extra_opts[i];
    nvrtcProgram prog = NULL;
    nvrtcResult r = nv->CreateProgram(&prog, src, name, 0, NULL, NULL);
    if (r != 0) {
        khub__errbuf(errbuf, errbuf_size, "%s: nvrtcCreateProgram: %s", name,
                     nv->GetErrorString(r));
        return KHUB_STATUS_ERROR;
    }
    khub_status st = KHUB_STATUS_OK;
    r = nv->CompileProgram(prog, n_opts, opts);
    if (r != 0) {
        copy_log(nv, prog, name, errbuf, errbuf_size);
        st = KHUB_STATUS_ERROR;
        goto done;
    }
    size_t n = 0;
    r = kind == KHUB_NVRTC_PTX ? nv->GetPTXSize(prog, &n) : nv->GetCUBINSize(prog, &n);
    char *buf = (r == 0 && n > 0) ? malloc(n + 1) : NULL;
    if (!buf) {
        khub__errbuf(errbuf, errbuf_size, "%s: NVRTC produced no %s", name,
                     kind == KHUB_NVRTC_PTX ? "PTX" : "cubin");
        st = KHUB_STATUS_ERROR;
        goto done;
    }
    r = kind == KHUB_NVRTC_PTX ? nv->GetPTX(prog, buf) : nv->GetCUBIN(prog, buf);
    if (r != 0) {
        free(buf);
        khub__errbuf(errbuf, errbuf_size, "%s: %s", name, nv->GetErrorString(r));
        st = KHUB_STATUS_ERROR;
        goto done;
    }
    buf[n] = '\0';
    /* NVRTC's PTX size counts the terminating NUL. */
    *out_size = (kind == KHUB_NVRTC_PTX && n > 0 && buf[n - 1] == '\0') ? n - 1 : n;
    *out = buf;
done:
    nv->DestroyProgram(&prog);
    return st;
}
