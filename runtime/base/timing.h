/*
 * timing.h: the micro-benchmark clock shared by `khub bench` (through
 * khub__selftest_time) and `khub bench-ops`: a median of per-call times
 * over short rounds, which a loaded machine disturbs less than a mean.
 * Internal.
 */
#ifndef KHUB_RUNTIME_TIMING_H
#define KHUB_RUNTIME_TIMING_H

#include "internal.h"

/* One call of the timed code; i counts calls from 0 (to cycle inputs). */
typedef khub_status (*khub__timed_fn)(void *ud, int i);

#define KHUB__TIME_ROUNDS 15

/* Seconds on clock (CLOCK_MONOTONIC, or a thread CPU clock) as a double. */
KHUB_INTERNAL double khub__time_now(int clock_id);

/* Calls fn once to warm up, then KHUB__TIME_ROUNDS rounds of at least one
 * call and about min_s / KHUB__TIME_ROUNDS seconds each; *median_s gets the
 * median over rounds of the round's time per call. Returns the first
 * status of fn that is not OK (then *median_s is 0). */
KHUB_INTERNAL khub_status khub__time_calls(khub__timed_fn fn, void *ud, double min_s, int clock_id,
                                           double *median_s);

#endif /* KHUB_RUNTIME_TIMING_H */
