/*
 * check.c: load and selftest an untrusted plugin in a forked child.
 *
 * The child reports its progress over a pipe, one line per phase
 * ("Pinit\n", "Pselftest\n"), so when it dies the parent knows in which
 * phase; phase lines only ever shape a message. Fatal signals are reset to
 * their default action in the child: a sanitizer's SEGV handler would
 * otherwise turn the crash into a plain exit and hide the signal.
 *
 * The plugin runs in the child's address space, so everything the child
 * can do, plugin code can do too: write to the pipe, read the child's
 * memory, exit. The verdict is guarded so that a plugin has to be written
 * against this protocol to forge it, and the rest is left to checks the
 * parent makes itself (docs/kernel-format.md, "Threat model"):
 *   - the child closes every descriptor but stdio and its two pipes before
 *     any plugin code runs, so a plugin inherits nothing else of the host;
 *   - the result line carries an HMAC-SHA256 tag under a 32-byte key the
 *     parent draws after the fork (sent over a socket, never SIGPIPE) (so it is in no memory the
 * child was copied from) and hands over only when the child asks for it, once, after the plugin's
 * last call ("Kverdict\n"); the parent accepts exactly one key request and one result with a valid
 * tag, and any other line (a forged verdict written by a constructor, say) fails the check as
 * tampering: PLUGIN_INVALID;
 *   - the parent times the child (poll with a deadline, then SIGKILL to its
 *     process group): no alarm is pending in the child, so a plugin cannot
 *     tell it is being checked by alarm(0), nor outlive the deadline by
 *     ignoring SIGALRM. KHUB_CHECK_TIMEOUT_S (1-3600, default 60) sets it.
 * Rejected: closing the pipe before dlopen and reopening it later (the
 * child has no way to reopen it that plugin code lacks), and a key in the
 * child from the start (a constructor could read it).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "check.h"
#include "plugin_artifacts.h"
#include "selftest.h"

#define CHECK_TIMEOUT_S 60
#define KEY_BYTES       32
#define RESULT_FD       3 /* the child's end of the report pipe */
#define KEY_FD          4 /* the child's end of the key pipe */

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

/* HMAC-SHA256 of text under key, as 64 hex digits into hex[65]. */
static bool tag_of(const unsigned char *key, const char *text, size_t len, char hex[65])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int md_len = 0;
    if (!HMAC(EVP_sha256(), key, KEY_BYTES, (const unsigned char *)text, len, md, &md_len) ||
        md_len != 32)
        return false;
    for (unsigned i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
    return true;
}

static int hex_val(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Asks the parent for the key (after the plugin's last call) and reads its
 * 64 hex digits from KEY_FD; false when the key does not come (someone
 * else took it). */
static bool child_key(int fd, unsigned char key[KEY_BYTES])
{
    put_line(fd, "Kverdict\n");
    char hex[2 * KEY_BYTES];
    size_t got = 0;
    while (got < sizeof hex) {
        ssize_t r = read(KEY_FD, hex + got, sizeof hex - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        got += (size_t)r;
    }
    for (int i = 0; i < KEY_BYTES; i++) {
        int hi = hex_val(hex[2 * i]), lo = hex_val(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) return false;
        key[i] = (unsigned char)(hi << 4 | lo);
    }
    OPENSSL_cleanse(hex, sizeof hex);
    return true;
}

/* "R<status>\t<message>\t<tag>\n": the message with tabs, newlines and
 * other control bytes made '?', so it is one printable field. */
static void child_result(int fd, khub_status st, const char *msg)
{
    char line[4 * KHUB_ERROR_SIZE + 32];
    int len = snprintf(line, sizeof line - 80, "R%d\t%s", (int)st, msg);
    if (len < 0) len = 0;
    if ((size_t)len >= sizeof line - 80) len = (int)(sizeof line - 81);
    for (char *c = strchr(line, '\t') + 1; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
    unsigned char key[KEY_BYTES];
    char tag[65] = "-";
    if (child_key(fd, key) && !tag_of(key, line, (size_t)len, tag)) snprintf(tag, sizeof tag, "-");
    OPENSSL_cleanse(key, sizeof key);
    snprintf(line + len, sizeof line - (size_t)len, "\t%s\n", tag);
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

/* Before any plugin code runs: the report pipe on RESULT_FD, the key pipe
 * on KEY_FD, every other descriptor of the host closed; fatal signals at
 * their defaults; the child killed with its parent; its own process group,
 * so a timeout kills what it forks too. */
static void child_setup(int rfd, int kfd)
{
    static const int fatal[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
    for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; i++) signal(fatal[i], SIG_DFL);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    setpgid(0, 0);
    if (kfd == RESULT_FD) { /* move it out of the way first */
        int k = fcntl(kfd, F_DUPFD, KEY_FD + 1);
        if (k < 0) _exit(127);
        kfd = k;
    }
    if (dup2(rfd, RESULT_FD) < 0 || dup2(kfd, KEY_FD) < 0) _exit(127);
    /* close_range(2) when the kernel has it, else one by one */
    if (syscall(SYS_close_range, KEY_FD + 1, ~0u, 0) != 0) {
        long max = sysconf(_SC_OPEN_MAX);
        for (long fd = KEY_FD + 1; fd < (max > 0 && max < 65536 ? max : 65536); fd++)
            close((int)fd);
    }
}

static void child_main(const char *path, const char *sha, const khub_selftest_spec *specs,
                       size_t n_specs, const khub_check_op *ops, size_t n_ops,
                       const khub__artifact_file *files, size_t n_files)
{
    const int fd = RESULT_FD;
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
    st = n_files ? khub__plugin_load_verified(rt, path, sha, files, n_files, &p)
                 : khub_plugin_load(rt, path, sha, &p);
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

/* ======================================================================== */
/* The parent                                                               */
/* ======================================================================== */

typedef struct child_run {
    pid_t pid;
    int rfd, kfd;                 /* report pipe (read end), key pipe (write end) */
    unsigned char key[KEY_BYTES]; /* drawn after the fork */
    char out[8192];               /* what the child wrote, NUL-terminated */
    size_t len, scanned;          /* bytes in out; bytes already looked at for K */
    bool overflow;                /* it wrote more than fits: not the child's own */
    int key_requests;
} child_run;

static int timeout_s(void)
{
    const char *e = getenv("KHUB_CHECK_TIMEOUT_S");
    char *end = NULL;
    long v = e ? strtol(e, &end, 10) : 0;
    return e && end != e && !*end && v >= 1 && v <= 3600 ? (int)v : CHECK_TIMEOUT_S;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Answers every complete "Kverdict" line in the new output: the first gets
 * the key, and the key pipe is closed after it. */
static void serve_key_requests(child_run *c)
{
    for (;;) {
        char *nl = memchr(c->out + c->scanned, '\n', c->len - c->scanned);
        if (!nl) return;
        const char *line = c->out + c->scanned;
        c->scanned = (size_t)(nl - c->out) + 1;
        if (strncmp(line, "Kverdict\n", 9) != 0) continue;
        if (c->key_requests++ || c->kfd < 0) continue;
        char hex[2 * KEY_BYTES + 1];
        for (int i = 0; i < KEY_BYTES; i++) snprintf(hex + 2 * i, 3, "%02x", c->key[i]);
        for (size_t put = 0; put < sizeof hex - 1;) {
            ssize_t w = send(c->kfd, hex + put, sizeof hex - 1 - put, MSG_NOSIGNAL);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) break;
            put += (size_t)w;
        }
        OPENSSL_cleanse(hex, sizeof hex);
        close(c->kfd);
        c->kfd = -1;
    }
}

/* Reads the child's output until EOF or the deadline; returns false on
 * the deadline. */
static bool read_child(child_run *c, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - now_ms();
        if (left <= 0) return false;
        struct pollfd pfd = {.fd = c->rfd, .events = POLLIN};
        int r = poll(&pfd, 1, left > 1000 ? 1000 : (int)left);
        if (r < 0 && errno != EINTR) return true;
        if (r <= 0) continue;
        char tmp[512];
        ssize_t got = read(c->rfd, tmp, sizeof tmp);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return true;
        size_t take =
            (size_t)got < sizeof c->out - 1 - c->len ? (size_t)got : sizeof c->out - 1 - c->len;
        if (take < (size_t)got) c->overflow = true;
        memcpy(c->out + c->len, tmp, take);
        c->len += take;
        c->out[c->len] = '\0';
        serve_key_requests(c);
    }
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

/* Up to 60 bytes of a line the plugin may have written, with anything but
 * printable ASCII shown as '?' (it goes into a message). */
static void shown(const char *l, size_t len, char out[61])
{
    size_t i = 0;
    for (; i < len && i < 60; i++) out[i] = l[i] >= 0x20 && l[i] < 0x7f ? l[i] : '?';
    out[i] = '\0';
}

/* Checks the child's output line by line. Returns NULL with *result at the
 * one authenticated result line, or what is wrong (in why) when the channel
 * carried anything the child's own code does not write. */
static const char *tampering(const child_run *c, const char **result, char *why, size_t n)
{
    *result = NULL;
    char line[61];
    if (c->overflow) return "more output than the check writes";
    if (c->key_requests > 1) return "more than one key request";
    for (const char *l = c->out; *l;) {
        size_t len = strcspn(l, "\n");
        if (l[len] != '\n') return "an unterminated line";
        shown(l, len, line);
        if (l[0] == 'R') {
            const char *tab = len > 66 ? l + len - 65 : NULL;
            char tag[65];
            if (*result || !tab || *tab != '\t' || !tag_of(c->key, l, (size_t)(tab - l), tag) ||
                CRYPTO_memcmp(tag, tab + 1, 64) != 0) {
                khub__errbuf(why, n, "a result line without a valid tag: \"%s\"", line);
                return why;
            }
            *result = l;
        } else if (l[0] != 'P' && strncmp(l, "Kverdict\n", 9) != 0) {
            khub__errbuf(why, n, "a line the check never writes: \"%s\"", line);
            return why;
        }
        l += len + 1;
    }
    return NULL;
}

/* The authenticated result line "R<status>\t<message>\t<tag>": its status,
 * and its message into report. */
static khub_status parse_result(const char *r, char *report, size_t n)
{
    char *end = NULL;
    long st = strtol(r + 1, &end, 10);
    const char *msg = (end && *end == '\t') ? end + 1 : "";
    size_t len = strcspn(msg, "\n");
    len = len >= 65 ? len - 65 : 0; /* without "\t<tag>" */
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
    return khub__check_in_child_declared(path, sha256_or_NULL, specs, n_specs, NULL, 0, NULL, 0,
                                         report, n);
}

/* The verdict from a finished child: its signal, its authenticated result
 * line, or why there is none. */
static khub_status verdict(const char *path, const child_run *c, int ws, char *report, size_t n)
{
    char phase[32];
    last_phase(c->out, phase, sizeof phase);
    if (WIFSIGNALED(ws)) {
        const char *abbrev = sigabbrev_np(WTERMSIG(ws));
        khub__errbuf(report, n, "%s: crashed with SIG%s during %s", path, abbrev ? abbrev : "?",
                     phase);
        return khub__fail(NULL, KHUB_STATUS_CHILD_CRASHED, "%s: crashed with SIG%s during %s", path,
                          abbrev ? abbrev : "?", phase);
    }
    const char *result = NULL;
    char buf[160];
    const char *why = tampering(c, &result, buf, sizeof buf);
    if (why) {
        khub__errbuf(report, n,
                     "%s: plugin code wrote to the check's result channel (%s); the verdict is "
                     "refused",
                     path, why);
        return khub__fail(NULL, KHUB_STATUS_PLUGIN_INVALID, "%s", report ? report : path);
    }
    int code = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
    if (!result || code != 0) {
        khub__errbuf(report, n,
                     "%s: child exited with code %d during %s %s (plugin code called exit?)", path,
                     code, phase, result ? "after its result" : "without a result");
        return khub__fail(NULL, KHUB_STATUS_CHILD_CRASHED,
                          "%s: child exited with code %d during %s", path, code, phase);
    }
    return parse_result(result, report, n);
}

/* True once pid has exited (not reaped: WNOWAIT), false at the deadline. */
static bool exited_by(pid_t pid, int64_t deadline)
{
    for (;;) {
        siginfo_t si;
        memset(&si, 0, sizeof si);
        if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == pid)
            return true;
        if (now_ms() >= deadline) return false;
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

static khub_status run_child(const char *path, const char *sha256_or_NULL,
                             const khub_selftest_spec *specs, size_t n_specs,
                             const khub_check_op *ops, size_t n_ops,
                             const khub__artifact_file *files, size_t n_files, child_run *c,
                             char *report, size_t n)
{
    /* The key goes over a socket, sent with MSG_NOSIGNAL: plugin code that
     * closes the child's end and then asks for the key must not kill the
     * parent with SIGPIPE. */
    int rp[2], kp[2];
    if (pipe2(rp, O_CLOEXEC) != 0) goto io;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, kp) != 0) {
        close(rp[0]), close(rp[1]);
        goto io;
    }
    c->pid = fork();
    if (c->pid < 0) {
        close(rp[0]), close(rp[1]), close(kp[0]), close(kp[1]);
        goto io;
    }
    if (c->pid == 0) {
        child_setup(rp[1], kp[0]);
        child_main(path, sha256_or_NULL, specs, n_specs, ops, n_ops, files, n_files);
    }
    setpgid(c->pid, c->pid); /* as the child does: whichever runs first */
    close(rp[1]);
    close(kp[0]);
    c->rfd = rp[0];
    c->kfd = kp[1];
    /* Drawn after the fork: the child's memory is a copy from before it. */
    if (getrandom(c->key, sizeof c->key, 0) != (ssize_t)sizeof c->key) {
        kill(c->pid, SIGKILL);
        khub__errbuf(report, n, "check %s: getrandom: %s", path, strerror(errno));
        return khub__fail(NULL, KHUB_STATUS_IO, "check %s: getrandom failed", path);
    }
    return KHUB_STATUS_OK;
io:
    khub__errbuf(report, n, "check %s: pipe or fork: %s", path, strerror(errno));
    return khub__fail(NULL, KHUB_STATUS_IO, "check %s: pipe or fork: %s", path, strerror(errno));
}

khub_status khub__check_in_child_declared(const char *path, const char *sha256_or_NULL,
                                          const khub_selftest_spec *specs, size_t n_specs,
                                          const khub_check_op *ops, size_t n_ops,
                                          const khub__artifact_file *files, size_t n_files,
                                          char *report, size_t n)
{
    if (!path || !path[0]) {
        khub__errbuf(report, n, "plugin path is empty");
        return khub__fail(NULL, KHUB_STATUS_INVALID_ARG, "plugin path is empty");
    }
    child_run *c = calloc(1, sizeof *c);
    if (!c) {
        khub__errbuf(report, n, "check %s: out of memory", path);
        return khub__fail(NULL, KHUB_STATUS_NOMEM, "check %s: out of memory", path);
    }
    c->rfd = c->kfd = -1;
    int limit = timeout_s();
    khub_status st =
        run_child(path, sha256_or_NULL, specs, n_specs, ops, n_ops, files, n_files, c, report, n);
    if (st != KHUB_STATUS_OK) goto done;
    int64_t deadline = now_ms() + (int64_t)limit * 1000;
    bool exited = read_child(c, deadline) && exited_by(c->pid, deadline);
    /* Its process group dies either way (what it forked too); a child that
     * exited is a zombie until reaped, so its group id is still its own. */
    kill(-c->pid, SIGKILL);
    if (!exited) kill(c->pid, SIGKILL);
    int ws = 0;
    while (waitpid(c->pid, &ws, 0) < 0 && errno == EINTR) {
    }
    if (!exited) {
        char phase[32];
        last_phase(c->out, phase, sizeof phase);
        khub__errbuf(report, n, "%s: timed out after %d s during %s", path, limit, phase);
        st = khub__fail(NULL, KHUB_STATUS_TIMEOUT, "%s: timed out after %d s during %s", path,
                        limit, phase);
        goto done;
    }
    st = verdict(path, c, ws, report, n);
done:
    if (c->rfd >= 0) close(c->rfd);
    if (c->kfd >= 0) close(c->kfd);
    OPENSSL_cleanse(c->key, sizeof c->key);
    free(c);
    return st;
}
