/*
 * contain.c: naming the plugin in flight when the process dies in it, and
 * remembering it (contain.h).
 *
 * An in-process plugin can always crash its host; what the host can do is
 * say which plugin did it, not let an exit() inside a plugin pass for a
 * clean run, and leave a marker so the next load of the same build is
 * refused instead of crashing again (hub/quarantine.c reads the marker).
 *
 * Hazards, and why the code looks the way it does:
 *   - The signal handler may run in the middle of malloc or stdio, so it
 *     uses no stdio, no allocation and no locks: fixed buffers, write(2),
 *     open/mkdir/close for the marker. Everything it reads (the plugin's id,
 *     version, op name and marker path) was copied at load and stays valid
 *     while the call is pinned.
 *   - The per-thread record pointer uses the initial-exec TLS model: a
 *     global-dynamic access from a handler may call __tls_get_addr, which
 *     can allocate on a thread's first access.
 *   - The previous handler (a sanitizer's, an embedder's crash reporter)
 *     runs after the line is written: the handler puts it back and calls it,
 *     or restores the default action and re-raises, so the process still
 *     dies of the signal it got (a shell sees 128+N, a core is dumped).
 *   - atexit() cannot be undone, so the exit hooks are registered once and
 *     do nothing unless a runtime wants containment and this thread is in a
 *     plugin call. _exit() then skips the other atexit handlers on purpose:
 *     the process is in an unknown state, in the middle of plugin code.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "contain.h"
#include "runtime_impl.h"

#define TLS_IE __attribute__((tls_model("initial-exec")))

static _Thread_local const khub__inflight *tls_now TLS_IE;
static _Thread_local const char *tls_role TLS_IE;
static _Thread_local int tls_layer TLS_IE = -1;

static const int fatal_signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
#define N_FATAL (sizeof fatal_signals / sizeof fatal_signals[0])

static pthread_mutex_t install_lock = PTHREAD_MUTEX_INITIALIZER;
static int n_wanting;         /* runtimes with KHUB_OPT_CONTAIN on (under install_lock) */
static atomic_int contain_on; /* n_wanting > 0, for the handlers */
/* Set by the first report: a later signal is a consequence of the first
 * (a sanitizer's handler, chained to, aborts after a SIGSEGV) and must not
 * overwrite its line or marker. */
static atomic_int reported;
static struct sigaction previous[N_FATAL];

/* ======================================================================== */
/* The per-thread record                                                    */
/* ======================================================================== */

void khub__inflight_enter(khub__inflight *r, const khub_plugin *p, const khub_op_desc *op)
{
    r->plugin = p;
    r->op = op->name;
    r->kind = op->kind;
    r->role = tls_role;
    r->layer = tls_layer;
    r->prev = tls_now;
    atomic_signal_fence(memory_order_seq_cst); /* filled before the handler can see it */
    tls_now = r;
}

void khub__inflight_leave(khub__inflight *r)
{
    atomic_signal_fence(memory_order_seq_cst);
    tls_now = r->prev;
}

void khub__inflight_role(const char *role, int layer)
{
    tls_role = role;
    tls_layer = role ? layer : -1;
}

const khub__inflight *khub__inflight_now(void) { return tls_now; }

void khub__inflight_adopt(const khub__inflight *r) { tls_now = r; }

khub_status khub__plugin_set_quarantine(khub_plugin *p, const char *path)
{
    if (!path || atomic_load(&p->quarantine)) return KHUB_STATUS_OK;
    char *copy = khub__strdup(p->rt, path);
    if (!copy) return KHUB_STATUS_NOMEM;
    char *none = NULL;
    if (!atomic_compare_exchange_strong(&p->quarantine, &none, copy)) khub__strfree(p->rt, copy);
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* Async-signal-safe formatting                                             */
/* ======================================================================== */

typedef struct line {
    char buf[1024];
    size_t len;
} line;

static void put(line *l, const char *s)
{
    for (; s && *s && l->len < sizeof l->buf - 1; s++) l->buf[l->len++] = *s;
}

static void put_int(line *l, long v)
{
    char d[24];
    int n = 0;
    unsigned long u = v < 0 ? 0ul - (unsigned long)v : (unsigned long)v;
    do d[n++] = (char)('0' + u % 10);
    while ((u /= 10) && n < (int)sizeof d);
    if (v < 0) put(l, "-");
    while (n > 0 && l->len < sizeof l->buf - 1) l->buf[l->len++] = d[--n];
}

static const char *signal_name(int sig)
{
    switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGILL: return "SIGILL";
    case SIGFPE: return "SIGFPE";
    case SIGABRT: return "SIGABRT";
    default: return "signal";
    }
}

/* "plugin ID VERSION :: OP (KIND, role ROLE layer N)" */
static void put_call(line *l, const khub__inflight *r)
{
    put(l, "plugin ");
    put(l, r->plugin->id);
    put(l, " ");
    put(l, r->plugin->version);
    put(l, " :: ");
    put(l, r->op);
    put(l, " (");
    put(l, khub__op_kind_name(r->kind)); /* a switch over literals: signal-safe */
    if (r->role) {
        put(l, ", role ");
        put(l, r->role);
        if (r->layer >= 0) {
            put(l, " layer ");
            put_int(l, r->layer);
        }
    }
    put(l, ")");
}

static void write_all(int fd, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, s, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

/* Writes what (one line) into p's quarantine marker, making its missing
 * parent folders; true when the marker was written. */
static bool mark(const khub_plugin *p, const line *what)
{
    const char *path = p->quarantine;
    char dir[4096];
    size_t n = path ? strlen(path) : 0;
    if (!n || n >= sizeof dir) return false;
    memcpy(dir, path, n + 1);
    for (size_t i = 1; i < n; i++) {
        if (dir[i] != '/') continue;
        dir[i] = '\0';
        (void)mkdir(dir, 0755); /* EEXIST for all but the last levels */
        dir[i] = '/';
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) return false;
    write_all(fd, what->buf, what->len);
    close(fd);
    return true;
}

/* Reports the call r on stderr and in the marker: "khub: EVENT in CALL; ..." */
static void report(const khub__inflight *r, const char *event, const char *fate)
{
    line m = {.len = 0};
    put(&m, event);
    put(&m, " in ");
    put_call(&m, r);
    put(&m, "\n");
    bool marked = mark(r->plugin, &m);
    line l = {.len = 0};
    put(&l, "khub: ");
    put(&l, event);
    put(&l, " in ");
    put_call(&l, r);
    put(&l, "; ");
    put(&l, fate);
    if (marked) {
        put(&l, "; quarantined (");
        put(&l, r->plugin->quarantine);
        put(&l, "): the next load refuses it unless allowed");
    }
    put(&l, "\n");
    write_all(2, l.buf, l.len);
}

/* ======================================================================== */
/* The handlers                                                             */
/* ======================================================================== */

static void on_fatal(int sig, siginfo_t *info, void *ctx)
{
    int saved = errno;
    size_t i = 0;
    while (i < N_FATAL && fatal_signals[i] != sig) i++;
    const khub__inflight *r = tls_now;
    if (r && atomic_load(&contain_on) && !atomic_exchange(&reported, 1))
        report(r, signal_name(sig), "the process dies with it");
    if (i < N_FATAL) {
        struct sigaction *o = &previous[i];
        sigaction(sig, o, NULL);
        if ((o->sa_flags & SA_SIGINFO) && o->sa_sigaction) {
            o->sa_sigaction(sig, info, ctx);
            errno = saved;
            return;
        }
        if (!(o->sa_flags & SA_SIGINFO) && o->sa_handler != SIG_DFL && o->sa_handler != SIG_IGN) {
            o->sa_handler(sig);
            errno = saved;
            return;
        }
    }
    /* The default action: raised now, delivered when the handler returns
     * (a faulting instruction would also fault again). */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    raise(sig);
    errno = saved;
}

static void on_exit_hook(void)
{
    const khub__inflight *r = tls_now;
    if (!r || !atomic_load(&contain_on)) return;
    if (!atomic_exchange(&reported, 1))
        report(r, "exit() called", "exiting with status 70 (KHUB_EXIT_PLUGIN_EXITED) instead");
    _exit(KHUB_EXIT_PLUGIN_EXITED);
}

static void register_exit_hooks(void)
{
    atexit(on_exit_hook);
    at_quick_exit(on_exit_hook);
}

static bool is_ours(const struct sigaction *a)
{
    return (a->sa_flags & SA_SIGINFO) && a->sa_sigaction == on_fatal;
}

void khub__contain_acquire(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_exit_hooks);
    pthread_mutex_lock(&install_lock);
    if (n_wanting++ == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_fatal;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        for (size_t i = 0; i < N_FATAL; i++) {
            /* One call installs ours and hands back what it replaced (five
             * system calls per runtime fewer than a query, then a set). */
            struct sigaction cur;
            sigaction(fatal_signals[i], &sa, &cur);
            if (!is_ours(&cur)) previous[i] = cur; /* still ours from before: keep the saved one */
        }
        atomic_store(&contain_on, 1);
    }
    pthread_mutex_unlock(&install_lock);
}

void khub__contain_release(void)
{
    pthread_mutex_lock(&install_lock);
    if (n_wanting > 0 && --n_wanting == 0) {
        atomic_store(&contain_on, 0);
        for (size_t i = 0; i < N_FATAL; i++) {
            struct sigaction cur;
            sigaction(fatal_signals[i], NULL, &cur);
            /* Someone installed a handler after ours and chains to us or
             * not: theirs stays, and ours stays silent (contain_on is 0). */
            if (is_ours(&cur)) sigaction(fatal_signals[i], &previous[i], NULL);
        }
    }
    pthread_mutex_unlock(&install_lock);
}
