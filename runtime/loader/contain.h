/*
 * contain.h: what the host knows when a plugin misbehaves at run time
 * (runtime/loader/contain.c). Internal.
 *
 * Every call into plugin op code is bracketed by khub__inflight_enter/leave,
 * which push a record (plugin, op, kind, the executor's role) on a
 * per-thread stack; the thread pool lends the submitting thread's record to
 * its workers for the length of a job. With containment on (KHUB_OPT_CONTAIN,
 * default 1):
 *   - a fatal signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) write()s one
 *     line naming the plugin, op and role in flight on the faulting thread,
 *     writes the plugin's quarantine marker when it has one, and re-raises
 *     (the previous handler, or the default action, then runs);
 *   - exit() or quick_exit() called while a plugin call is in flight on the
 *     calling thread prints one line, writes the marker, and _exit()s with
 *     KHUB_EXIT_PLUGIN_EXITED instead of the plugin's status.
 * Everything the signal handler touches is prepared before the call: it
 * formats with its own digit writer and calls only async-signal-safe
 * functions (write, open, mkdir, close, sigaction, raise).
 */
#ifndef KHUB_RUNTIME_CONTAIN_H
#define KHUB_RUNTIME_CONTAIN_H

#include "internal.h"

typedef struct khub__inflight {
    const khub_plugin *plugin;
    const char *op;   /* the op's name (host copy, valid while pinned) */
    uint32_t kind;    /* khub_op_kind */
    const char *role; /* the executor's role ("q_proj"), or NULL */
    int layer;        /* with role; -1 when none */
    const struct khub__inflight *prev;
} khub__inflight;

/* Pushes r (caller's storage, valid until leave) for a call of op of p; the
 * role set by khub__inflight_role on this thread goes with it. */
KHUB_INTERNAL void khub__inflight_enter(khub__inflight *r, const khub_plugin *p,
                                        const khub_op_desc *op);
KHUB_INTERNAL void khub__inflight_leave(khub__inflight *r);
/* The executor's name for the calls it makes next on this thread (role is a
 * string literal or NULL to clear; layer -1 for none). */
KHUB_INTERNAL void khub__inflight_role(const char *role, int layer);
/* The innermost record of this thread (NULL when no plugin call is in flight). */
KHUB_INTERNAL const khub__inflight *khub__inflight_now(void);
/* A pool worker runs a job for a thread whose record is r (NULL: done). */
KHUB_INTERNAL void khub__inflight_adopt(const khub__inflight *r);

/* The same for a call through a methods table of b's op, which this thread
 * pinned with khub_binding_acquire (runtime/loader/registry.c); counts one
 * call of b (khub_binding_calls). */
KHUB_INTERNAL void khub__binding_enter(khub_binding *b, khub__inflight *r);
KHUB_INTERNAL void khub__binding_leave(khub__inflight *r);

/* Counts runtimes that want containment: the first installs the handlers
 * (and once per process the exit hooks), the last one out restores the
 * handlers it replaced, unless someone has installed others since. */
KHUB_INTERNAL void khub__contain_acquire(void);
KHUB_INTERNAL void khub__contain_release(void);

/* The marker the handlers write for p (NULL path: nothing to set). The path
 * is copied; call before p serves any call. Set once: when p has a marker
 * already it stays (a later fetch reusing p, one file of one cached variant,
 * names the same one), so it is never freed while p is loaded and a crash
 * report or another thread's fetch may read it at any time. NOMEM. */
KHUB_INTERNAL khub_status khub__plugin_set_quarantine(khub_plugin *p, const char *path);

#endif /* KHUB_RUNTIME_CONTAIN_H */
