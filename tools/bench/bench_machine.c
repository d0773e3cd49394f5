/*
 * bench_machine.c: this machine's physical ceilings for the model benchmark:
 * DRAM read bandwidth and peak fp32 FMA throughput, at 1..N threads.
 *
 * usage: bench-machine [--threads 1,2] [--reps 7] [--mib 512]
 * Prints one JSON object per line:
 *   {"what":"read_bw","threads":T,"gbps_median":..,"gbps_min":..,"gbps_max":..,"samples":[..]}
 *   {"what":"fma","threads":T,"gflops_median":..,...}
 *   {"what":"madd16","threads":T,"gmacs_median":..,...}
 *
 * Read bandwidth: each thread sums its own slice of one buffer (first-touched
 * by that thread) with 256-bit loads and 4 independent accumulators, so the
 * loop is bound by the memory system, not by add latency. The buffer (default
 * 512 MiB) is far larger than L3, so the bytes come from DRAM. One untimed
 * pass warms the pages; each timed pass reads the whole buffer once.
 *
 * FMA: each thread runs 12 independent chains of 256-bit FMAs (12 covers a
 * 4-cycle latency at 2 FMA/cycle with room), counting 2 flops per lane.
 * AVX2+FMA is checked at run time; without it the tool says so and prints
 * no FMA line. With AVX-512F the same runs on 16 lanes ("fma512"): whether
 * that doubles the rate depends on the core (one or two 512-bit FMA units).
 *
 * madd16: the same 12 chains of 256-bit vpmaddwd (int16 pairs multiplied and
 * added into int32 lanes: 16 multiply-adds each), the instruction of the
 * quantized kernels' int16-activation dot products; printed as GMAC/s
 * ("gmacs"), where an fp32 FMA lane is one MAC (gflops / 2). Some cores run
 * it on one pipe where they have two for FMA (AMD Zen 2), so its peak need
 * not be twice the FMA's.
 *
 * Threads are plain pthreads released together by a barrier; the time of a
 * pass is from the release to the last thread's finish.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_THREADS 64
#define MAX_REPS    101
#define FMA_ACC     12

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ------------------------------------------------------------------------ */
/* Kernels                                                                  */
/* ------------------------------------------------------------------------ */

__attribute__((target("avx2"))) static float sum_avx2(const float *p, size_t n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 32 <= n; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
        a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    float o[8];
    _mm256_storeu_ps(o, s);
    return o[0] + o[1] + o[2] + o[3] + o[4] + o[5] + o[6] + o[7];
}

static float sum_scalar(const float *p, size_t n)
{
    float a[4] = {0};
    for (size_t i = 0; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++) a[k] += p[i + k];
    return a[0] + a[1] + a[2] + a[3];
}

/* 12 chains of x = x * m + a over 8 lanes, `iters` rounds; returns a lane. */
__attribute__((target("avx2,fma"))) static float fma_avx2(long iters)
{
    __m256 acc[FMA_ACC];
    const __m256 m = _mm256_set1_ps(0.999999f), ad = _mm256_set1_ps(1e-7f);
    for (int k = 0; k < FMA_ACC; k++) acc[k] = _mm256_set1_ps((float)k);
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int k = 0; k < FMA_ACC; k++) acc[k] = _mm256_fmadd_ps(acc[k], m, ad);
    }
    __m256 s = acc[0];
    for (int k = 1; k < FMA_ACC; k++) s = _mm256_add_ps(s, acc[k]);
    float o[8];
    _mm256_storeu_ps(o, s);
    return o[0];
}

/* 12 chains of x = madd(x, m) over 16 int16 pairs, `iters` rounds. */
__attribute__((target("avx2"))) static float madd16_avx2(long iters)
{
    __m256i acc[FMA_ACC];
    const __m256i m = _mm256_set1_epi16(3);
    for (int k = 0; k < FMA_ACC; k++) acc[k] = _mm256_set1_epi16((short)k);
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int k = 0; k < FMA_ACC; k++) acc[k] = _mm256_madd_epi16(acc[k], m);
    }
    __m256i s = acc[0];
    for (int k = 1; k < FMA_ACC; k++) s = _mm256_add_epi32(s, acc[k]);
    return (float)_mm256_extract_epi32(s, 0);
}

/* The same with 16 lanes (AVX-512F); some cores run it at twice the rate. */
__attribute__((target("avx512f"))) static float fma_avx512(long iters)
{
    __m512 acc[FMA_ACC];
    const __m512 m = _mm512_set1_ps(0.999999f), ad = _mm512_set1_ps(1e-7f);
    for (int k = 0; k < FMA_ACC; k++) acc[k] = _mm512_set1_ps((float)k);
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int k = 0; k < FMA_ACC; k++) acc[k] = _mm512_fmadd_ps(acc[k], m, ad);
    }
    __m512 s = acc[0];
    for (int k = 1; k < FMA_ACC; k++) s = _mm512_add_ps(s, acc[k]);
    return _mm512_reduce_add_ps(s);
}

/* ------------------------------------------------------------------------ */
/* Threads                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct job {
    pthread_barrier_t *start;
    /* 0 = read pass, 1 = 8-lane FMA pass, 2 = 16-lane FMA pass, 3 = vpmaddwd pass */
    int fma;
    float *buf;      /* read: this thread's slice */
    size_t n;        /* floats in the slice */
    long iters;      /* FMA (or vpmaddwd) rounds */
    int first_touch; /* read: write the slice instead of summing (page-in) */
    double t_end;
    double cpu_s; /* this thread's CPU time for the pass */
    float sink;
} job;

static double thread_cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *thread_main(void *arg)
{
    job *j = arg;
    pthread_barrier_wait(j->start);
    double c0 = thread_cpu_s();
    if (j->first_touch) {
        for (size_t i = 0; i < j->n; i++) j->buf[i] = 1.0f;
    } else if (j->fma) {
        j->sink = j->fma == 3   ? madd16_avx2(j->iters)
                  : j->fma == 2 ? fma_avx512(j->iters)
                                : fma_avx2(j->iters);
    } else {
        j->sink =
            __builtin_cpu_supports("avx2") ? sum_avx2(j->buf, j->n) : sum_scalar(j->buf, j->n);
    }
    j->t_end = now_s();
    j->cpu_s = thread_cpu_s() - c0;
    return NULL;
}

/* Runs one pass on nt threads; returns its wall seconds, or -1 on failure, and
 * the largest per-thread CPU seconds in *cpu_s (time actually on a core: on a
 * loaded machine the wall time includes waiting for one). */
static double pass(int nt, int fma, int first_touch, float *buf, size_t n_total, long iters,
                   double *cpu_s)
{
    pthread_t th[MAX_THREADS];
    job jobs[MAX_THREADS];
    pthread_barrier_t start;
    if (pthread_barrier_init(&start, NULL, (unsigned)nt + 1) != 0) return -1;
    size_t per = (n_total / (size_t)nt) & ~(size_t)31; /* 32-float multiples stay aligned */
    int made = 0;
    for (int i = 0; i < nt; i++) {
        jobs[i] = (job){.start = &start,
                        .fma = fma,
                        .buf = buf ? buf + per * (size_t)i : NULL,
                        .n = per,
                        .iters = iters,
                        .first_touch = first_touch};
        if (pthread_create(&th[i], NULL, thread_main, &jobs[i]) != 0) break;
        made++;
    }
    if (made != nt) {
        fprintf(stderr, "bench-machine: could not start %d threads\n", nt);
        exit(1);
    }
    double t0 = now_s();
    pthread_barrier_wait(&start);
    double t_end = t0, cpu = 0;
    volatile float sink = 0;
    for (int i = 0; i < nt; i++) {
        pthread_join(th[i], NULL);
        if (jobs[i].t_end > t_end) t_end = jobs[i].t_end;
        if (jobs[i].cpu_s > cpu) cpu = jobs[i].cpu_s;
        sink += jobs[i].sink;
    }
    (void)sink;
    pthread_barrier_destroy(&start);
    if (cpu_s) *cpu_s = cpu;
    return t_end - t0;
}

/* ------------------------------------------------------------------------ */
/* Main                                                                     */
/* ------------------------------------------------------------------------ */

/* Prints median [min, max] of the wall-clock and CPU-clock rates. */
static void print_stats(const char *what, const char *unit, int nt, const double *wall,
                        const double *cpu, int n)
{
    double w[MAX_REPS], c[MAX_REPS];
    memcpy(w, wall, sizeof(double) * (size_t)n);
    memcpy(c, cpu, sizeof(double) * (size_t)n);
    qsort(w, (size_t)n, sizeof(double), cmp_double);
    qsort(c, (size_t)n, sizeof(double), cmp_double);
    printf("{\"what\":\"%s\",\"threads\":%d,\"%s_median\":%.2f,\"%s_min\":%.2f,"
           "\"%s_max\":%.2f,\"%s_cpu_median\":%.2f,\"samples\":[",
           what, nt, unit, w[n / 2], unit, w[0], unit, w[n - 1], unit, c[n / 2]);
    for (int i = 0; i < n; i++) printf("%s%.2f", i ? "," : "", wall[i]);
    printf("]}\n");
    fflush(stdout);
}

static int parse_threads(const char *s, int *out, int max)
{
    int n = 0;
    while (*s && n < max) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > MAX_THREADS) return -1;
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

int main(int argc, char **argv)
{
    int threads[16] = {1, 2}, n_threads = 2, reps = 7;
    long mib = 512;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--threads") && v) {
            n_threads = parse_threads(v, threads, 16);
            i++;
        } else if (!strcmp(argv[i], "--reps") && v) {
            reps = atoi(v);
            i++;
        } else if (!strcmp(argv[i], "--mib") && v) {
            mib = atol(v);
            i++;
        } else {
            fprintf(stderr, "usage: bench-machine [--threads 1,2] [--reps 7] [--mib 512]\n");
            return 2;
        }
    }
    if (n_threads < 1 || reps < 1 || reps > MAX_REPS || mib < 64 || mib > 65536) {
        fprintf(stderr, "bench-machine: need 1..64 threads each, 1..%d reps, 64..65536 MiB\n",
                MAX_REPS);
        return 2;
    }
    size_t bytes = (size_t)mib << 20, n = bytes / sizeof(float);
    float *buf = aligned_alloc(64, bytes);
    if (!buf) {
        fprintf(stderr, "bench-machine: no memory for a %ld MiB buffer\n", mib);
        return 1;
    }
    int have_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (!have_fma) fprintf(stderr, "bench-machine: no AVX2+FMA on this CPU; skipping FMA peak\n");
    double wall[MAX_REPS], cpu[MAX_REPS], c;
    for (int t = 0; t < n_threads; t++) {
        int nt = threads[t];
        pass(nt, 0, 1, buf, n, 0, NULL); /* first touch by these threads */
        pass(nt, 0, 0, buf, n, 0, NULL); /* warm-up */
        double moved = (double)(((n / (size_t)nt) & ~(size_t)31) * (size_t)nt * sizeof(float));
        for (int r = 0; r < reps; r++) {
            wall[r] = moved / pass(nt, 0, 0, buf, n, 0, &c) / 1e9;
            cpu[r] = moved / c / 1e9;
        }
        print_stats("read_bw", "gbps", nt, wall, cpu, reps);
        if (!have_fma) continue;
        const long iters = 20000000; /* ~0.1 s per pass at ~100 GFLOP/s per thread */
        double flops = 2.0 * 8 * FMA_ACC * (double)iters * nt;
        pass(nt, 1, 0, NULL, 0, iters / 4, NULL);
        for (int r = 0; r < reps; r++) {
            wall[r] = flops / pass(nt, 1, 0, NULL, 0, iters, &c) / 1e9;
            cpu[r] = flops / c / 1e9; /* every thread ran its share on a core for c s */
        }
        print_stats("fma", "gflops", nt, wall, cpu, reps);
        pass(nt, 3, 0, NULL, 0, iters / 4, NULL);
        for (int r = 0; r < reps; r++) { /* 16 MACs per vpmaddwd: flops / 2 * 2 */
            wall[r] = flops / pass(nt, 3, 0, NULL, 0, iters, &c) / 1e9;
            cpu[r] = flops / c / 1e9;
        }
        print_stats("madd16", "gmacs", nt, wall, cpu, reps);
        if (!__builtin_cpu_supports("avx512f")) continue;
        pass(nt, 2, 0, NULL, 0, iters / 4, NULL);
        for (int r = 0; r < reps; r++) {
            wall[r] = 2 * flops / pass(nt, 2, 0, NULL, 0, iters, &c) / 1e9;
            cpu[r] = 2 * flops / c / 1e9;
        }
        print_stats("fma512", "gflops", nt, wall, cpu, reps);
    }
    free(buf);
    return 0;
}
