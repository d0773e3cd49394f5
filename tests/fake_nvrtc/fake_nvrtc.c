/* fake_nvrtc.c: a stand-in libnvrtc.so.13 for the load-time compilation
 * tests (test_cuda_jit), found through KHUB_NVRTC_LIBRARY. It "compiles"
 * deterministically and instantly: the output is a fake cubin ("\177ELF"
 * then one line naming the program, the options in order and an FNV-1a
 * hash of the source, NUL-terminated) or a fake PTX of the same line, so
 * what was compiled with which options can be read back from the result
 * and from the cache entry that holds it.
 *
 * Environment, read at each call:
 *   KHUB_FAKE_NVRTC_VERSION  "MAJOR.MINOR" nvrtcVersion answers (13.0)
 *   KHUB_FAKE_NVRTC_LOG      a file that gets one line per compile
 *                            ("compile NAME OPTIONS..."): counts across
 *                            processes
 * A source containing "#error" fails to compile with a log naming it.
 * khub_fake_nvrtc_compiles() (dlsym) counts compiles in this process. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

enum { OK = 0, ERR_INVALID_INPUT = 3, ERR_INVALID_PROGRAM = 4, ERR_COMPILATION = 6 };

typedef struct program {
    char *src, *name;
    char out[2048];
    size_t out_n;
    int cubin; /* the last compile's --gpu-architecture was sm_ */
    char log[256];
} program;

static long compiles;

EXPORT long khub_fake_nvrtc_compiles(void) { return compiles; }

EXPORT int nvrtcVersion(int *major, int *minor)
{
    const char *v = getenv("KHUB_FAKE_NVRTC_VERSION");
    *major = 13, *minor = 0;
    if (v) sscanf(v, "%d.%d", major, minor);
    return OK;
}

EXPORT const char *nvrtcGetErrorString(int r)
{
    switch (r) {
    case OK: return "NVRTC_SUCCESS";
    case ERR_INVALID_INPUT: return "NVRTC_ERROR_INVALID_INPUT";
    case ERR_INVALID_PROGRAM: return "NVRTC_ERROR_INVALID_PROGRAM";
    case ERR_COMPILATION: return "NVRTC_ERROR_COMPILATION";
    default: return "NVRTC_ERROR (fake)";
    }
}

EXPORT int nvrtcCreateProgram(program **out, const char *src, const char *name, int n_headers,
                              const char *const *headers, const char *const *include_names)
{
    (void)headers, (void)include_names;
    if (!out || !src || n_headers) return ERR_INVALID_INPUT;
    program *p = calloc(1, sizeof *p);
    if (!p) return ERR_INVALID_INPUT;
    p->src = strdup(src);
    p->name = strdup(name ? name : "default_program");
    *out = p;
    return OK;
}

EXPORT int nvrtcDestroyProgram(program **p)
{
    if (!p || !*p) return ERR_INVALID_PROGRAM;
    free((*p)->src);
    free((*p)->name);
    free(*p);
    *p = NULL;
    return OK;
}

EXPORT int nvrtcCompileProgram(program *p, int n_opts, const char *const *opts)
{
    if (!p) return ERR_INVALID_PROGRAM;
    compiles++;
    const char *logf = getenv("KHUB_FAKE_NVRTC_LOG");
    FILE *f = logf ? fopen(logf, "a") : NULL;
    if (f) fprintf(f, "compile %s", p->name);
    uint64_t h = 1469598103934665603ull; /* FNV-1a of the source */
    for (const char *s = p->src; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    size_t len = (size_t)snprintf(p->out, sizeof p->out, "\177ELF fake-nvrtc %s src:%016llx",
                                  p->name, (unsigned long long)h);
    p->cubin = 0;
    for (int i = 0; i < n_opts; i++) {
        if (f) fprintf(f, " %s", opts[i]);
        if (!strncmp(opts[i], "--gpu-architecture=sm_", 22)) p->cubin = 1;
        if (len < sizeof p->out)
            len += (size_t)snprintf(p->out + len, sizeof p->out - len, " %s", opts[i]);
    }
    if (f) fprintf(f, "\n"), fclose(f);
    if (len >= sizeof p->out) len = sizeof p->out - 1;
    p->out_n = len + 1; /* with the NUL, as NVRTC counts PTX */
    p->log[0] = '\0';
    if (strstr(p->src, "#error")) {
        snprintf(p->log, sizeof p->log, "%s(1): error: #error directive: fake failure\n", p->name);
        return ERR_COMPILATION;
    }
    return OK;
}

/* PTX is the same line without the ELF magic. */
EXPORT int nvrtcGetPTXSize(program *p, size_t *n)
{
    if (!p || !p->out_n || p->cubin) return ERR_INVALID_PROGRAM;
    *n = p->out_n - 4;
    return OK;
}

EXPORT int nvrtcGetPTX(program *p, char *buf)
{
    if (!p || !p->out_n || p->cubin) return ERR_INVALID_PROGRAM;
    memcpy(buf, p->out + 4, p->out_n - 4);
    return OK;
}

EXPORT int nvrtcGetCUBINSize(program *p, size_t *n)
{
    if (!p || !p->out_n || !p->cubin) return ERR_INVALID_PROGRAM;
    *n = p->out_n;
    return OK;
}

EXPORT int nvrtcGetCUBIN(program *p, char *buf)
{
    if (!p || !p->out_n || !p->cubin) return ERR_INVALID_PROGRAM;
    memcpy(buf, p->out, p->out_n);
    return OK;
}

EXPORT int nvrtcGetProgramLogSize(program *p, size_t *n)
{
    if (!p) return ERR_INVALID_PROGRAM;
    *n = strlen(p->log) + 1;
    return OK;
}

EXPORT int nvrtcGetProgramLog(program *p, char *buf)
{
    if (!p) return ERR_INVALID_PROGRAM;
    memcpy(buf, p->log, strlen(p->log) + 1);
    return OK;
}
