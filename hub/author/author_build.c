/*
 * author_build.c: khub_author_manifest_read and khub_author_build, the
 * public face of kernel_build.c (the compiler driver) and kernel.json's
 * reader (hub/kernel_manifest.c, in libkhub).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "author_impl.h"
#include "kernel_build.h"

/* Reads DIR/kernel.json into a malloc'd manifest (it is ~40 KB). */
static khub_status load(const char *dir, khub_kernel_manifest **out, char *errbuf,
                        size_t errbuf_size)
{
    *out = NULL;
    if (!dir)
        return khub__author_fail(errbuf, errbuf_size, KHUB_STATUS_MISUSE,
                                 "no kernel source DIR given");
    khub_kernel_manifest *m = calloc(1, sizeof *m);
    if (!m) return khub__author_fail(errbuf, errbuf_size, KHUB_STATUS_NOMEM, "out of memory");
    char err[KHUB_ERROR_SIZE];
    khub_status st = khub__km_load(dir, m, err, sizeof err);
    if (st != KHUB_STATUS_OK) {
        free(m);
        return khub__author_fail(errbuf, errbuf_size, st, "%s", err);
    }
    *out = m;
    return KHUB_STATUS_OK;
}

khub_status khub_author_manifest_read(const char *dir, khub_author_manifest *out, char *errbuf,
                                      size_t errbuf_size)
{
    KHUB_FORWARD_IF_ERROR(NULL, KHUB_AUTHOR_STRUCT(out, khub_author_manifest, n_cuda_ccs,
                                                   "khub_author_manifest_read", "out", errbuf,
                                                   errbuf_size));
    khub_kernel_manifest *m = NULL;
    KHUB_FORWARD_IF_ERROR(NULL, load(dir, &m, errbuf, errbuf_size));
    snprintf(out->repo, sizeof out->repo, "%s", m->repo);
    snprintf(out->version, sizeof out->version, "%s", m->version);
    out->major = m->major;
    out->target_minor = m->target_minor;
    out->n_ops = (uint32_t)m->n_ops;
    out->n_levels = (uint32_t)m->n_levels;
    out->n_cuda_ccs = (uint32_t)m->n_ccs;
    free(m);
    return KHUB_STATUS_OK;
}

khub_status khub_author_build(const char *dir, const khub_author_build_opts *opts,
                              khub_author_build_result *res, char *errbuf, size_t errbuf_size)
{
    KHUB_FORWARD_IF_ERROR(NULL,
                          KHUB_AUTHOR_STRUCT(res, khub_author_build_result, skipped,
                                             "khub_author_build", "res", errbuf, errbuf_size));
    if (opts)
        KHUB_FORWARD_IF_ERROR(NULL,
                              KHUB_AUTHOR_STRUCT(opts, khub_author_build_opts, progress_ud,
                                                 "khub_author_build", "opts", errbuf, errbuf_size));
    khub_kernel_manifest *m = NULL;
    KHUB_FORWARD_IF_ERROR(NULL, load(dir, &m, errbuf, errbuf_size));
    khub_build_opts bo = {0};
    if (opts) {
        bo.cc = opts->cc;
        bo.include_dir = opts->include_dir;
        bo.progress = opts->progress;
        bo.progress_ud = opts->progress_ud;
    }
    khub_build_result br;
    char err[KHUB_ERROR_SIZE];
    khub_status st = khub__kernel_build(m, &bo, &br, err, sizeof err);
    free(m);
    if (st != KHUB_STATUS_OK) return khub__author_fail(errbuf, errbuf_size, st, "%s", err);
    res->n_variants = 0;
    for (size_t i = 0; i < br.n_variants && i < KHUB_AUTHOR_MAX_VARIANTS; i++)
        snprintf(res->variants[res->n_variants++], sizeof res->variants[0], "%s", br.variants[i]);
    snprintf(res->skipped, sizeof res->skipped, "%s", br.skipped);
    return KHUB_STATUS_OK;
}
