/*
 * cuda_variant.h: loading a built kernel's CUDA variant in a test, verified
 * (the glue with the variant's other files as artifacts), for the gpu-label
 * tests that tools/gpu-check.sh runs (gpu_bench.h, test_gpu_embedding.c).
 */
#ifndef KHUB_TESTS_CUDA_VARIANT_H
#define KHUB_TESTS_CUDA_VARIANT_H

#include <dirent.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin_artifacts.h"
#include "runtime_impl.h"
#include "runner.h"

/* ======================================================================== */
/* Loading a built kernel's CUDA variant                                    */
/* ======================================================================== */

static inline void sha256_file(const char *path, char hex[65])
{
    FILE *f = fopen(path, "rb");
    ASSERT(f);
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    EVP_DigestInit_ex(c, EVP_sha256(), NULL);
    unsigned char buf[65536], md[32];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) EVP_DigestUpdate(c, buf, n);
    unsigned len = 0;
    EVP_DigestFinal_ex(c, md, &len);
    EVP_MD_CTX_free(c);
    fclose(f);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
}

/* Loads kernel folder `name`'s CUDA variant (build/khub1-cu*) from
 * $KHUB_GPU_KERNELS: its glue (*.so) with every other file as artifact. */
static inline void load_cuda_variant(khub_runtime *rt, const char *name)
{
    const char *root = getenv("KHUB_GPU_KERNELS");
    if (!root) TEST_SKIP("KHUB_GPU_KERNELS is not set (tools/gpu-check.sh sets it)");
    char build[1024], vdir[1400] = "";
    snprintf(build, sizeof build, "%s/%s/build", root, name);
    DIR *d = opendir(build);
    if (!d) TEST_SKIP("%s: not built (khub build)", build);
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, "khub1-cu", 8) && !strstr(e->d_name, ".tar"))
            snprintf(vdir, sizeof vdir, "%s/%s", build, e->d_name);
    closedir(d);
    if (!vdir[0]) TEST_SKIP("%s: no CUDA variant (NVRTC missing when it was built?)", build);
    static char paths[16][1600], names[16][256], sums[16][65];
    khub__artifact_file files[16];
    int n = 0, glue = -1;
    d = opendir(vdir);
    ASSERT(d);
    while ((e = readdir(d)) && n < 16) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "metadata.json") || strstr(e->d_name, ".sig"))
            continue;
        snprintf(names[n], sizeof names[n], "%s", e->d_name);
        snprintf(paths[n], sizeof paths[n], "%s/%s", vdir, e->d_name);
        sha256_file(paths[n], sums[n]);
        if (strstr(e->d_name, ".so")) glue = n;
        n++;
    }
    closedir(d);
    ASSERT(glue >= 0);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (i != glue) files[k++] = (khub__artifact_file){names[i], paths[i], sums[i]};
    khub_status st =
        khub__plugin_load_verified(rt, paths[glue], sums[glue], files, (size_t)k, NULL);
    if (st != KHUB_STATUS_OK) TEST_FAIL_("loading %s: %s", paths[glue], khub_runtime_errmsg(rt));
}

#endif /* KHUB_TESTS_CUDA_VARIANT_H */
