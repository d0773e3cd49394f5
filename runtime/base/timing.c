/*
 * timing.c: medians of per-call times (timing.h).
 */
#include <stdlib.h>
#include <time.h>

#include "timing.h"

double khub__time_now(int clock_id)
{
    struct timespec t;
    clock_gettime((clockid_t)clock_id, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

khub_status khub__time_calls(khub__timed_fn fn, void *ud, double min_s, int clock_id,
                             double *median_s)
{
    double t[KHUB__TIME_ROUNDS];
    int calls_total = 0;
    *median_s = 0;
    khub_status st = fn(ud, calls_total++);
    for (int r = 0; r < KHUB__TIME_ROUNDS && st == KHUB_STATUS_OK; r++) {
        int calls = 0;
        double t0 = khub__time_now(clock_id), el;
        do {
            st = fn(ud, calls_total++);
            calls++;
            el = khub__time_now(clock_id) - t0;
        } while (st == KHUB_STATUS_OK && el < min_s / KHUB__TIME_ROUNDS);
        t[r] = el / calls;
    }
    if (st != KHUB_STATUS_OK) return st;
    qsort(t, KHUB__TIME_ROUNDS, sizeof t[0], cmp_double);
    *median_s = t[KHUB__TIME_ROUNDS / 2];
    return KHUB_STATUS_OK;
}
