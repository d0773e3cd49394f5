/*
 * memo_flag.h: the flag that guards a per-process memo's table
 * (hub/sig_memo.c, hub/parse_memo.c, runtime/loader/gate_memo.c,
 * runtime/loader/sealed_memo.c).
 *
 * A memo is a shortcut, never a requirement: a thread that finds the table
 * taken does the work itself instead of waiting, so a load never blocks on
 * another thread's look-up. Only tests and statistics wait for the table.
 */
#ifndef KHUB_BASE_MEMO_FLAG_H
#define KHUB_BASE_MEMO_FLAG_H

#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>

/* Takes the table if nobody has it; false means "go without the memo". */
static inline bool khub__memo_take(atomic_flag *busy)
{
    return !atomic_flag_test_and_set_explicit(busy, memory_order_acquire);
}

static inline void khub__memo_give_back(atomic_flag *busy)
{
    atomic_flag_clear_explicit(busy, memory_order_release);
}

/* khub__memo_take for the callers that must have the table (tests, stats). */
static inline void khub__memo_take_waiting(atomic_flag *busy)
{
    while (!khub__memo_take(busy)) sched_yield();
}

#endif
