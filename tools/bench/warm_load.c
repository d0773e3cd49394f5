/*
 * warm_load.c: the warm load of a cached, locked kernel against its floor,
 * in one process, interleaved (issue 14 item 5; run by tools/bench/warm-load.sh,
 * which builds it against libkhub).
 *
 * usage: warm_load ID LOCK DIR N
 *
 * Each of N rounds times, in an order that alternates (khub first in round
 * 0, which names the plugin file):
 *  - floor: read DIR/FILE (FILE: the plugin file khub chose in round 0,
 *    in the cached variant directory DIR), SHA-256 its bytes (OpenSSL EVP,
 *    as khub) and dlopen it RTLD_NOW | RTLD_LOCAL: the least any loader
 *    that checks a digest before loading can do;
 *  - khub: khub_hub_new + khub_runtime_new + khub_kernel_fetch(ID, lock =
 *    LOCK) on fresh handles (HF_HUB_OFFLINE=1 is set by the script), that
 *    is: the locked commit, the cached files of the variant checked
 *    against the lock, the trust decision on metadata.json, the files
 *    checked against metadata.json, the plugin sealed into a memfd, its
 *    sealed bytes hashed and dlopened, and its init run. "fetch" is the
 *    call alone.
 * dlclose, khub_runtime_free and khub_hub_free are outside the clock.
 * Prints one line per measure: median, min and max in microseconds, and
 * the first round's value (the first load in a fresh process), by the wall
 * clock and by this thread's CPU clock.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "khub/khub.h"
#include "khub/khub_hub.h"
#include "khub/khub_kernels.h"

static double clock_us(clockid_t c)
{
    struct timespec t;
    clock_gettime(c, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static double now_us(void) { return clock_us(CLOCK_MONOTONIC); }

/* The calling thread's CPU time: what the load costs on a machine whose
 * other jobs time-slice it (everything timed here runs on this thread). */
static double cpu_us(void) { return clock_us(CLOCK_THREAD_CPUTIME_ID); }

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The floor: SHA-256 of the file's bytes, then dlopen. Returns the handle. */
static void *floor_load(const char *so)
{
    static unsigned char buf[1 << 16];
    FILE *f = fopen(so, "rb");
    if (!f) return NULL;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) EVP_DigestUpdate(ctx, buf, n);
    unsigned char md[32];
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx, md, &len);
    EVP_MD_CTX_free(ctx);
    fclose(f);
    return dlopen(so, RTLD_NOW | RTLD_LOCAL);
}

static void report(const char *what, double *t, int n)
{
    double first = t[0];
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    printf("%s: median %.1f us, min %.1f, max %.1f, first %.1f (%d rounds)\n", what, t[n / 2], t[0],
           t[n - 1], first, n);
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: warm_load ID LOCK DIR N\n");
        return 2;
    }
    int n = atoi(argv[4]);
    if (n < 1) n = 1;
    double *tf = calloc((size_t)n, sizeof *tf), *tk = calloc((size_t)n, sizeof *tk);
    double *tc = calloc((size_t)n, sizeof *tc), *cf = calloc((size_t)n, sizeof *cf);
    double *ck = calloc((size_t)n, sizeof *ck), *cc = calloc((size_t)n, sizeof *cc);
    if (!tf || !tk || !tc || !cf || !ck || !cc) return 1;
    char so[8192] = "";
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < 2; k++) {
            if ((i + k) % 2 == 1) {
                double c0 = cpu_us(), t0 = now_us();
                void *h = floor_load(so);
                tf[i] = now_us() - t0;
                cf[i] = cpu_us() - c0;
                if (!h) {
                    fprintf(stderr, "warm_load: floor: %s: %s\n", so, dlerror());
                    return 1;
                }
                dlclose(h);
                continue;
            }
            khub_hub *hub = NULL;
            khub_runtime *rt = NULL;
            khub_kernel_opts ko = {KHUB_APP_INIT(khub_kernel_opts), .lock_path = argv[2]};
            khub_kernel_result r = {KHUB_APP_INIT(khub_kernel_result)};
            double c0 = cpu_us(), t0 = now_us();
            khub_status st = khub_hub_new(NULL, &hub);
            if (st == KHUB_STATUS_OK) st = khub_runtime_new(NULL, &rt);
            double c1 = cpu_us(), t1 = now_us();
            if (st == KHUB_STATUS_OK) st = khub_kernel_fetch(hub, rt, argv[1], &ko, &r);
            double t2 = now_us(), c2 = cpu_us();
            if (st != KHUB_STATUS_OK || !r.locked || r.fell_back) {
                fprintf(stderr, "warm_load: khub_kernel_fetch %s: %s (locked %d, fell back %d)\n",
                        argv[1], rt ? khub_runtime_errmsg(rt) : khub_last_error(), (int)r.locked,
                        (int)r.fell_back);
                return 1;
            }
            tk[i] = t2 - t0;
            tc[i] = t2 - t1;
            ck[i] = c2 - c0;
            cc[i] = c2 - c1;
            if (i == 0) {
                snprintf(so, sizeof so, "%s/%s", argv[3], r.file);
                printf("khub loaded %s from %s @%.12s (%s)\n", r.file, r.variant, r.commit,
                       r.trust);
            }
            khub_runtime_free(rt);
            khub_hub_free(hub);
        }
    }
    report("floor (SHA-256 + dlopen)", tf, n);
    report("khub (hub + runtime + fetch)", tk, n);
    report("khub fetch alone", tc, n);
    report("cpu: floor (SHA-256 + dlopen)", cf, n);
    report("cpu: khub (hub + runtime + fetch)", ck, n);
    report("cpu: khub fetch alone", cc, n);
    free(tf);
    free(tk);
    free(tc);
    free(cf);
    free(ck);
    free(cc);
    return 0;
}
