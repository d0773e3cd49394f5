/*
 * check.c: load and selftest an untrusted plugin in a forked child.
 *
 * The child reports its progress over a pipe, one line per phase
 * ("Pinit\n", "Pselftest\n") and a result line ("R<status>\t<message>\n"),
 * so when it dies the parent knows in which phase. Fatal signals are reset
 * to their default action in the child: a sanitizer's SEGV handler would
 * otherwise turn the crash into a plain exit and hide the signal. An alarm
 * bounds a plugin that hangs.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "selftest.h"

#define CHECK_TIMEOUT_S 60

static void put_line(int fd, const char *s)
{
    size_t len = strlen(s);
    while (len > 0) {
        ssize_t w = write(fd, s, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        s += w;
        len -= (size_t)w;
    }
}

static void child_result(int fd, khub_status st, const char *msg)
{
    char line[4 * KHUB_ERROR_SIZE + 32];
    snprintf(line, sizeof line, "R%d\t%s\n", (int)st, msg);
    put_line(fd, line);
}

/* Runs the declared numeric self-tests against khub/ref-cpu (loaded from
 * the built-ins) and appends one line per test to msg. */
static khub_status child_numeric_tests(khub_runtime *rt, const char *id,
                                       const khub_selftest_spec *specs, size_t n_specs, char *msg,
                                       size_t n)
{
    khub_status st = khub_plugin_load_builtin(rt);
    if (st != KHUB_STATUS_OK) {
        snprintf(msg, n, "loading khub/ref-cpu for the self-tests: %s", khub_runtime_errmsg(rt));
        return st;
    }
    for (size_t i = 0; i < n_specs; i++) {
        char line[KHUB_ERROR_SIZE];
        st = khub__selftest_run(rt, id, &specs[i], NULL, line, sizeof line);
        size_t len = strlen(msg);
        snprintf(msg + len, n - len, "; %s", line);
        if (st != KHUB_STATUS_OK) return st;
    }
    return KHUB_STATUS_OK;
}

/* The plugin's registered ops against the manifest's: each declared op is
 * registered under its name with its kind, and nothing else is. */
static khub_status child_declared_ops(const khub_plugin *p, const khub_check_op *ops, size_t n_ops,
                                      char *msg, size_t n)
{
    uint32_t count = khub_plugin_op_count(p);
    for (size_t i = 0; i < n_ops; i++) {
        const khub_op_desc *found = NULL;
        for (uint32_t j = 0; j < count && !found; j++)
            if (strcmp(khub_plugin_op(p, j)->name, ops[i].name) == 0) found = khub_plugin_op(p, j);
        if (found && found->kind == ops[i].kind) continue;
        if (found) {
            snprintf(msg, n, "kernel.json declares op '%s' as %s; the plugin registers it as %s",
                     ops[i].name, ops[i].kind_name, khub__op_kind_name(found->kind));
            return KHUB_STATUS_PLUGIN_INVALID;
        }
        size_t len = (size_t)snprintf(msg, n,
                                      "kernel.json declares op '%s' (%s); the plugin registers no "
                                      "op by that name (it registers:",
                                      ops[i].name, ops[i].kind_name);
        for (uint32_t j = 0; j < count && len < n; j++)
            len += (size_t)snprintf(msg + len, n - len, " %s", khub_plugin_op(p, j)->name);
        if (len < n) snprintf(msg + len, n - len, "%s)", count ? "" : " nothing");
        return KHUB_STATUS_PLUGIN_INVALID;
    }
    for (uint32_t j = 0; j < count; j++) {
        size_t i = 0;
        while (i < n_ops && strcmp(ops[i].name, khub_plugin_op(p, j)->name) != 0) i++;
        if (i == n_ops) {
            snprintf(msg, n,
                     "the plugin registers op '%s' that kernel.json does not declare in 'ops'",
                     khub_plugin_op(p, j)->name);
            return KHUB_STATUS_PLUGIN_INVALID;
        }
    }
    return KHUB_STATUS_OK;
}

static void child_main(int fd, const char *path, const char *sha, const khub_selftest_spec *specs,
                       size_t n_specs, const khub_check_op *ops, size_t n_ops)
{
    static const int fatal[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
    for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; i++) signal(fatal[i], SIG_DFL);
    alarm(CHECK_TIMEOUT_S);
    khub_runtime_opts opts = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = 1};
    khub_runtime *rt = NULL;
    khub_status st = khub_runtime_new(&opts, &rt);
    if (st != KHUB_STATUS_OK) {
        child_result(fd, st, khub_last_error());
        _exit(0);
    }
    if (!sha) khub_runtime_set_option(rt, KHUB_OPT_ALLOW_UNVERIFIED, 1);
    put_line(fd, "Pinit\n");
    khub_plugin *p = NULL;
    st = khub_plugin_load(rt, path, sha, &p);
    if (st != KHUB_STATUS_OK) {
        child_result(fd, st, khub_runtime_errmsg(rt));
        _exit(0);
    }
    put_line(fd, "Pselftest\n");
    char err[KHUB_ERROR_SIZE];
    st = khub_plugin_selftest(p, err, sizeof err);
    char msg[4 * KHUB_ERROR_SIZE];
    if (st == KHUB_STATUS_OK)
        snprintf(msg, sizeof msg, "%s %s: loaded, %u ops, selftest passed", khub_plugin_id(p),
                 khub_plugin_version(p), (unsigned)khub_plugin_op_count(p));
    else
        snprintf(msg, sizeof msg, "%s", err);
    if (st == KHUB_STATUS_OK && n_ops) {
        st = child_declared_ops(p, ops, n_ops, msg, sizeof msg);
        if (st == KHUB_STATUS_OK) {
            size_t len = strlen(msg);
            snprintf(msg + len, sizeof msg - len, ", ops as kernel.json declares");
        }
    }
    if (st == KHUB_STATUS_OK && n_specs) {
        put_line(fd, "Pnumeric self-tests\n");
        st = child_numeric_tests(rt, khub_plugin_id(p), specs, n_specs, msg, sizeof msg);
    }
    put_line(fd, "Pshutdown\n");
    khub_runtime_free(rt);
    child_result(fd, st, msg);
    _exit(0);
}

/* Reads the child's lines until EOF into buf (NUL-terminated, capped). */
static void read_all(int fd, char *buf, size_t n)
{
    size_t len = 0;
    for (;;) {
        char tmp[512];
        ssize_t r = read(fd, tmp, sizeof tmp);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        size_t take = (size_t)r < n - 1 - len ? (size_t)r : n - 1 - len;
        memcpy(buf + len, tmp, take);
        len += take;
    }
    buf[len] = '\0';
}

/* The last phase the child announced. */
static void last_phase(const char *out, char *phase, size_t n)
{
    snprintf(phase, n, "start-up");
    for (const char *s = out; (s = strstr(s, "P")) != NULL; s++) {
        if (s != out && s[-1] != '\n') continue;
        size_t len = strcspn(s + 1, "\n");
        snprintf(phase, n, "%.*s", (int)(len < n - 1 ? len : n - 1), s + 1);
    }
}

static khub_status parse_result(const char *out, char *report, size_t n)
{
    const char *r = strstr(out, "\nR");
    r = r ? r + 1 : (out[0] == 'R' ? out : NULL);
    if (!r) return KHUB_STATUS_INTERNAL;
    char *end = NULL;
    long st = strtol(r + 1, &end, 10);
    const char *msg = (end && *end == '\t') ? end + 1 : "";
    size_t len = strcspn(msg, "\n");
    khub__errbuf(report, n, "%.*s", (int)len, msg);
    if (st != KHUB_STATUS_OK) khub__fail(NULL, (khub_status)st, "%.*s", (int)len, msg);
    return (khub_status)st;
}

khub_status khub__check_in_child(const char *path, const char *sha256_or_NULL, char *report,
                                 size_t n)
{
    return khub__check_in_child_with_tests(path, sha256_or_NULL, NULL, 0, report, n);
}

khub_status khub__check_in_child_with_tests(const char *path, const char *sha256_or_NULL,
                                            const khub_selftest_spec *specs, size_t n_specs,
                                            char *report, size_t n)
{
    return khub__check_in_child_declared(path, sha256_or_NULL, specs, n_specs, NULL, 0, report, n);
}

khub_status khub__check_in_child_declared(const char *path, const char *sha256_or_NULL,
                                          const khub_selftest_spec *specs, size_t n_specs,
                                          const khub_check_op *ops, size_t n_ops, char *report,
                                          size_t n)
{
    int fds[2];
    if (!path || !path[0]) {
        khub__errbuf(report, n, "plugin path is empty");
        return khub__fail(NULL, KHUB_STATUS_INVALID_ARG, "plugin path is empty");
    }
    if (pipe2(fds, O_CLOEXEC) != 0) {
        khub__errbuf(report, n, "check %s: pipe: %s", path, strerror(errno));
        return khub__fail(NULL, KHUB_STATUS_IO, "check %s: pipe: %s", path, strerror(errno));
    }
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        khub__errbuf(report, n, "check %s: fork: %s", path, strerror(errno));
        return khub__fail(NULL, KHUB_STATUS_IO, "check %s: fork: %s", path, strerror(errno));
    }
    if (pid == 0) {
        close(fds[0]);
        child_main(fds[1], path, sha256_or_NULL, specs, n_specs, ops, n_ops);
    }
    close(fds[1]);
    char out[8192], phase[32];
    read_all(fds[0], out, sizeof out);
    close(fds[0]);
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
    }
    last_phase(out, phase, sizeof phase);

    if (WIFSIGNALED(ws)) {
        int sig = WTERMSIG(ws);
        if (sig == SIGALRM) {
            khub__errbuf(report, n, "%s: timed out after %d s during %s", path, CHECK_TIMEOUT_S,
                         phase);
            return khub__fail(NULL, KHUB_STATUS_TIMEOUT, "%s", report ? report : path);
        }
        const char *abbrev = sigabbrev_np(sig);
        khub__errbuf(report, n, "%s: crashed with SIG%s during %s", path, abbrev ? abbrev : "?",
                     phase);
        return khub__fail(NULL, KHUB_STATUS_CHILD_CRASHED, "%s: crashed with SIG%s during %s", path,
                          abbrev ? abbrev : "?", phase);
    }
    khub_status st = parse_result(out, report, n);
    if (st == KHUB_STATUS_INTERNAL) {
        int code = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
        khub__errbuf(report, n,
                     "%s: child exited with code %d during %s without a result "
                     "(plugin code called exit?)",
                     path, code, phase);
        return khub__fail(NULL, KHUB_STATUS_CHILD_CRASHED,
                          "%s: child exited with code %d "
                          "during %s without a result",
                          path, code, phase);
    }
    return st;
}
