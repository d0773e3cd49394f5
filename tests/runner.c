/* runner.c: runs each test case in a forked child and reports the outcome. */
#include "runner.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* A case that runs longer than this is killed, with its whole process
 * group, and reported by name: a hang fails in minutes instead of using up
 * ctest's timeout for the whole program. KHUB_TEST_CASE_TIMEOUT overrides. */
#define CASE_TIMEOUT_S 300

static volatile sig_atomic_t case_timed_out;

static void on_alarm(int sig)
{
    (void)sig;
    case_timed_out = 1;
}

static unsigned case_timeout_s(void)
{
    const char *env = getenv("KHUB_TEST_CASE_TIMEOUT");
    long v = env ? strtol(env, NULL, 10) : 0;
    return v > 0 ? (unsigned)v : CASE_TIMEOUT_S;
}

/* 0 pass, 1 fail, 2 skip */
static int run_one(const test_case *tc)
{
    fflush(stdout);
    fflush(stderr);
    double t0 = now_ms();
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "fork failed for %s\n", tc->name);
        return 1;
    }
    if (pid == 0) {
        setpgid(0, 0);
        signal(SIGALRM, SIG_DFL); /* cases (and the checks they fork) own SIGALRM */
        tc->fn();
        /* exit, not _exit: atexit handlers run, so LeakSanitizer checks every
         * case under ASan (stdio was flushed before the fork). */
        exit(0);
    }
    setpgid(pid, pid);                              /* also here: whichever runs first */
    struct sigaction sa = {.sa_handler = on_alarm}; /* no SA_RESTART: waitpid returns EINTR */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL);
    case_timed_out = 0;
    unsigned limit = case_timeout_s();
    alarm(limit);
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0) {
        if (errno == EINTR && case_timed_out) {
            kill(-pid, SIGKILL);
            while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
            }
            printf("FAIL    %s (timed out after %u s; KHUB_TEST_CASE_TIMEOUT)\n", tc->name, limit);
            return 1;
        }
    }
    alarm(0);
    double ms = now_ms() - t0;
    if (WIFEXITED(ws) && WEXITSTATUS(ws) == 0) {
        printf("ok      %-40s %8.1f ms\n", tc->name, ms);
        return 0;
    }
    if (WIFEXITED(ws) && WEXITSTATUS(ws) == TEST_EXIT_SKIP) {
        printf("skip    %s\n", tc->name);
        return 2;
    }
    if (WIFSIGNALED(ws))
        printf("FAIL    %s (signal %d: %s)\n", tc->name, WTERMSIG(ws), strsignal(WTERMSIG(ws)));
    else
        printf("FAIL    %s (exit %d)\n", tc->name, WEXITSTATUS(ws));
    return 1;
}

int test_run_main(int argc, char **argv, const test_case *cases, size_t n)
{
    if (argc > 1 && strcmp(argv[1], "--list") == 0) {
        for (size_t i = 0; i < n; i++) printf("%s\n", cases[i].name);
        return 0;
    }
    int counts[3] = {0, 0, 0};
    int matched = 0;
    for (size_t i = 0; i < n; i++) {
        if (argc > 1 && strcmp(argv[1], cases[i].name) != 0) continue;
        matched++;
        counts[run_one(&cases[i])]++;
    }
    if (argc > 1 && !matched) {
        fprintf(stderr, "no test named %s\n", argv[1]);
        return 2;
    }
    printf("%d passed, %d failed, %d skipped\n", counts[0], counts[1], counts[2]);
    return counts[1] ? 1 : 0;
}
