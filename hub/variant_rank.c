/*
 * variant_rank.c: the khub family grammar and the verdict on each build
 * variant for one host, with a reason per variant (variant_rank.h).
 *
 * Grammar (docs/hub-server.md): khub{ABI major}-{backend}-{cpu}-{os}, with
 * backend "cpu" or "cu{major}{minor}" (the last digit is the minor:
 * cu130 = CUDA 13.0, cu126 = 12.6). Hugging Face's torch* and tvm-ffi*
 * families are listed and rejected: they need libtorch + CPython or
 * libtvm_ffi, which khub does not load.
 *
 * Ranking is a pure function of names, file names and the host (issue 12):
 * it once ran on a fake cache of empty files under /tmp for locked
 * variants, which cost a temporary folder per locked load and could fail
 * for reasons that had nothing to do with the variants.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#include "cuda.h"
#include "variant_rank.h"

/* ======================================================================== */
/* The host                                                                 */
/* ======================================================================== */

/* This host's architecture and its CPU features as text, worked out once
 * per thread (the features again whenever their mask changes): neither can
 * change under a running process, and a warm locked load ranks its variants
 * on every call (docs/performance.md, "Warm load, session 15"). */
static void host_cpu(khub__rank_host *h)
{
    static _Thread_local char machine[sizeof h->cpu], listed[sizeof h->cpu_features];
    static _Thread_local uint32_t listed_mask;
    static _Thread_local bool have_machine, have_list;
    if (!have_machine) {
        struct utsname u;
        have_machine = uname(&u) == 0;
        snprintf(machine, sizeof machine, "%s",
                 !have_machine                ? ""
                 : strcmp(u.machine, "arm64") ? u.machine
                                              : "aarch64");
    }
    uint32_t mask = khub_cpu_features();
    if (!have_list || mask != listed_mask) {
        khub__cpu_feature_list(mask, " ", listed, sizeof listed);
        listed_mask = mask;
        have_list = true;
    }
    memcpy(h->cpu, machine, sizeof h->cpu);
    memcpy(h->cpu_features, listed, sizeof h->cpu_features);
}

/* The driver version and every GPU's compute capability, through the
 * runtime's driver layer (opened at run time, never linked, every entry
 * point through cuGetProcAddress, never dlclosed); no driver, no GPUs. */
void khub__rank_host_detect(khub__rank_host *h)
{
    memset(h, 0, sizeof *h);
    host_cpu(h);
    if (khub__cuda_probe(&h->cuda, h->cc, KHUB__RANK_MAX_GPUS, &h->n_gpus) != KHUB_STATUS_OK)
        h->cuda = h->n_gpus = 0;
}

void khub__rank_host_only_gpu(khub__rank_host *h, int gpu)
{
    if (gpu < 0) return;
    bool there = gpu < h->n_gpus && gpu < KHUB__RANK_MAX_GPUS;
    h->cc[0] = there ? h->cc[gpu] : 0;
    h->n_gpus = there ? 1 : 0;
    h->gpu0 = gpu;
}

bool khub__rank_wants_files(const char *name, const khub__rank_host *h)
{
    int abi = 0, used = 0;
    return h->cuda && sscanf(name, "khub%d-cu%n", &abi, &used) == 1 && used > 0;
}

/* ======================================================================== */
/* One verdict                                                              */
/* ======================================================================== */

/* The capability in a file name khub build gives a CUDA artifact,
 * "<name>.sm_<cc>.ptx" or ".cubin"; 0 when the name is not one (*ptx tells
 * which kind). */
static int artifact_cc(const char *name, int *ptx)
{
    const char *dot = strrchr(name, '.');
    if (!dot) return 0;
    *ptx = !strcmp(dot, ".ptx");
    if (!*ptx && strcmp(dot, ".cubin")) return 0;
    const char *sm = NULL;
    for (const char *p = strstr(name, ".sm_"); p && p < dot; p = strstr(p + 1, ".sm_")) sm = p;
    if (!sm) return 0;
    char *end = NULL;
    long cc = strtol(sm + 4, &end, 10);
    return end == dot && cc >= 10 && cc < 1000 ? (int)cc : 0;
}

/* Whether a GPU of this host can run one of the variant's artifacts: a PTX
 * for its capability or below (the driver compiles PTX forward), or a cubin
 * of its major version at its minor or below. files: the variant's file
 * names; none that name a capability means the variant says nothing, and
 * the driver check alone decides. */
static int cuda_fits(const khub__rank_host *h, const char *const *files, size_t n, char *why,
                     size_t wn, const char *accept)
{
    int ptx_min = 0, any = 0;
    for (size_t i = 0; i < n; i++) {
        int ptx = 0, cc = artifact_cc(files[i], &ptx);
        if (cc && ptx && (!ptx_min || cc < ptx_min)) ptx_min = cc;
        any |= cc != 0;
    }
    if (!h->n_gpus) return snprintf(why, wn, "reject: the CUDA driver reports no GPU"), 0;
    if (!any) return snprintf(why, wn, "%s (no sm_XY files listed)", accept), 1;
    for (int g = 0; g < h->n_gpus && g < KHUB__RANK_MAX_GPUS; g++) {
        int runs = ptx_min && ptx_min <= h->cc[g];
        for (size_t i = 0; i < n && !runs; i++) {
            int ptx = 0, cc = artifact_cc(files[i], &ptx);
            runs = cc && !ptx && cc / 10 == h->cc[g] / 10 && cc <= h->cc[g];
        }
        if (runs) return snprintf(why, wn, "%s, GPU %d sm_%d", accept, h->gpu0 + g, h->cc[g]), 1;
    }
    return snprintf(why, wn, "reject: no PTX or cubin for GPU %d sm_%d%s", h->gpu0, h->cc[0],
                    h->n_gpus > 1 ? " or the other GPUs" : ""),
           0;
}

/* A cu{major}{minor} backend on h; returns 1 when accepted. */
static int judge_cuda(int digits, const khub__rank_host *h, const char *const *files,
                      size_t n_files, int *rank, char *why, size_t n)
{
    int major = digits / 10, minor = digits % 10, need = major * 1000 + minor * 10;
    if (!h->cuda)
        return snprintf(why, n, "reject: needs CUDA %d.%d, no CUDA driver", major, minor), 0;
    if (h->cuda / 1000 != major || h->cuda < need)
        return snprintf(why, n, "reject: needs CUDA %d.%d, driver supports %d.%d", major, minor,
                        h->cuda / 1000, (h->cuda % 1000) / 10),
               0;
    char accept[96];
    snprintf(accept, sizeof accept, "accept: CUDA %d.%d build, driver %d.%d", major, minor,
             h->cuda / 1000, (h->cuda % 1000) / 10);
    if (!cuda_fits(h, files, n_files, why, n, accept)) return 0;
    *rank = 100 - minor; /* GPU first, newest matching minor first */
    return 1;
}

/* Copies the longest run (1..31 characters) of a-z, 0-9 (digits) and '_'
 * (underscore) at *p into out when sep follows it, and steps past sep. */
static bool name_part(const char **p, bool digits, bool underscore, char sep, char out[32])
{
    size_t n = 0;
    for (char c; (c = (*p)[n]) && ((c >= 'a' && c <= 'z') || (digits && c >= '0' && c <= '9') ||
                                   (underscore && c == '_'));)
        n++;
    if (n == 0 || n > 31 || (*p)[n] != sep) return false;
    memcpy(out, *p, n);
    out[n] = '\0';
    *p += n + (sep ? 1 : 0);
    return true;
}

/* Splits "khub{ABI}-{backend}-{cpu}-{os}" (ABI: 1-9 decimal digits; backend
 * a-z0-9, cpu a-z0-9_, os a-z, 1-31 characters each). By hand, not sscanf:
 * this runs for every listed variant of every load (docs/performance.md,
 * "Warm load, session 16"), and it takes no sign or white space. */
static bool split_name(const char *name, int *abi, char backend[32], char cpu[32], char os[32])
{
    if (strncmp(name, "khub", 4) != 0) return false;
    const char *p = name + 4;
    int v = 0, digits = 0;
    for (; *p >= '0' && *p <= '9' && digits < 9; p++, digits++) v = v * 10 + (*p - '0');
    if (digits == 0 || *p++ != '-') return false;
    *abi = v;
    return name_part(&p, true, false, '-', backend) && name_part(&p, true, true, '-', cpu) &&
           name_part(&p, false, false, '\0', os);
}

/* Judges one variant name; returns 1 when accepted, with a rank (lower is
 * better) and a reason either way. */
static int judge(const char *name, const khub__rank_host *h, const char *const *files,
                 size_t n_files, int *rank, char *why, size_t n)
{
    *rank = -1;
    if (!strncmp(name, "torch", 5))
        return snprintf(why, n,
                        "reject: torch family needs libtorch and CPython; khub loads "
                        "khub%d-* variants",
                        KHUB_ABI_MAJOR),
               0;
    if (!strncmp(name, "tvm-ffi", 7))
        return snprintf(why, n,
                        "reject: tvm-ffi family needs libtvm_ffi; khub loads "
                        "khub%d-* variants",
                        KHUB_ABI_MAJOR),
               0;
    char backend[32], cpu[32], os[32];
    int abi = -1, used = 0;
    if (!split_name(name, &abi, backend, cpu, os))
        return snprintf(why, n, "reject: not a khub{ABI}-{backend}-{cpu}-{os} name"), 0;
    if (abi != KHUB_ABI_MAJOR)
        return snprintf(why, n, "reject: ABI major %d, host has %d", abi, KHUB_ABI_MAJOR), 0;
    if (strcmp(os, "linux")) return snprintf(why, n, "reject: built for %s, host is linux", os), 0;
    if (strcmp(cpu, h->cpu))
        return snprintf(why, n, "reject: built for %s, host is %s", cpu, h->cpu), 0;
    if (!strcmp(backend, "cpu")) {
        /* The CPU feature check picks one of the variant's levels at load,
         * from its signed metadata.json (a generic level always fits). */
        *rank = 1000;
        return snprintf(why, n, "accept: CPU build for %s (level chosen at load; host CPU: %s)",
                        cpu, h->cpu_features[0] ? h->cpu_features : "no listed features"),
               1;
    }
    int digits = 0;
    if (sscanf(backend, "cu%d%n", &digits, &used) == 1 && backend[used] == '\0' && digits >= 10)
        return judge_cuda(digits, h, files, n_files, rank, why, n);
    return snprintf(why, n, "reject: unknown backend \"%s\"", backend), 0;
}

/* ======================================================================== */
/* The ranked list                                                          */
/* ======================================================================== */

static int cmp_variant(const void *a, const void *b)
{
    const khub_hub_variant *x = a, *y = b;
    if (x->accepted != y->accepted) return y->accepted - x->accepted;
    if (x->accepted && x->rank != y->rank) return x->rank - y->rank;
    return strcmp(x->name, y->name);
}

static bool listed(const khub_hub_variant_list *l, const char *name)
{
    for (size_t i = 0; i < l->count; i++)
        if (!strcmp(l->items[i].name, name)) return true;
    return false;
}

khub_status khub__rank_variants(const khub_allocator *a, const khub__rank_input *in, size_t n,
                                const khub__rank_host *h, khub_hub_variant_list **out)
{
    *out = NULL;
    khub_hub_variant_list *l = khub__mem_calloc(a, 1, sizeof *l);
    if (l) l->items = khub__mem_calloc(a, n ? n : 1, sizeof *l->items);
    if (!l || !l->items) {
        khub_hub_variant_list_free(l);
        return khub__fail(NULL, KHUB_STATUS_NOMEM, "out of memory ranking %zu variants", n);
    }
    for (size_t i = 0; i < n; i++) {
        const char *name = in[i].name;
        if (!name || strlen(name) >= sizeof l->items[0].name || listed(l, name)) continue;
        khub_hub_variant *e = &l->items[l->count++];
        snprintf(e->name, sizeof e->name, "%s", name);
        e->accepted = judge(name, h, in[i].files, in[i].files ? in[i].n_files : 0, &e->rank,
                            e->reason, sizeof e->reason);
    }
    if (l->count) qsort(l->items, l->count, sizeof *l->items, cmp_variant);
    l->best = l->count && l->items[0].accepted ? l->items[0].name : NULL;
    *out = l;
    return KHUB_STATUS_OK;
}
