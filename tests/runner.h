/*
 * runner.h: khub's test runner, after libuv's test/ harness.
 *
 * A test file defines its cases with TEST_IMPL and lists them once:
 *
 *     TEST_IMPL(status_names) { ASSERT_STR_EQ(khub_status_name(0), "KHUB_STATUS_OK"); }
 *     #define TEST_LIST(X) X(status_names)
 *     TEST_MAIN(TEST_LIST)
 *
 * Each case runs in a child process (fork), so a crash or an abort fails that
 * case only and is reported with its signal. `./test_x` runs all cases,
 * `./test_x NAME` one, `./test_x --list` lists them. A case may call
 * TEST_SKIP("why") when a precondition (a GPU, NVRTC) is missing.
 * The closing line is "N passed, N failed, N skipped".
 */
#ifndef KHUB_TESTS_RUNNER_H
#define KHUB_TESTS_RUNNER_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEST_EXIT_SKIP 77

#define TEST_IMPL(name) void test_##name(void)

#define TEST_FAIL_(...) \
    do { \
        fprintf(stderr, "  %s:%d: ", __FILE__, __LINE__); \
        fprintf(stderr, __VA_ARGS__); \
        fprintf(stderr, "\n"); \
        fflush(stderr); \
        abort(); \
    } while (0)

#define ASSERT(c) \
    do { \
        if (!(c)) TEST_FAIL_("assertion failed: %s", #c); \
    } while (0)

#define ASSERT_EQ(a, b) \
    do { \
        long long a_ = (long long)(a), b_ = (long long)(b); \
        if (a_ != b_) TEST_FAIL_("%s == %s: %lld != %lld", #a, #b, a_, b_); \
    } while (0)

#define ASSERT_NE(a, b) \
    do { \
        long long a_ = (long long)(a), b_ = (long long)(b); \
        if (a_ == b_) TEST_FAIL_("%s != %s: both %lld", #a, #b, a_); \
    } while (0)

#define ASSERT_LE(a, b) \
    do { \
        double a_ = (double)(a), b_ = (double)(b); \
        if (!(a_ <= b_)) TEST_FAIL_("%s <= %s: %g > %g", #a, #b, a_, b_); \
    } while (0)

#define ASSERT_STR_EQ(a, b) \
    do { \
        const char *a_ = (a), *b_ = (b); \
        if (!a_ || !b_ || strcmp(a_, b_) != 0) \
            TEST_FAIL_("%s == %s: \"%s\" != \"%s\"", #a, #b, a_ ? a_ : "(null)", \
                       b_ ? b_ : "(null)"); \
    } while (0)

/* haystack contains needle */
#define ASSERT_CONTAINS(hay, needle) \
    do { \
        const char *h_ = (hay), *n_ = (needle); \
        if (!h_ || !strstr(h_, n_)) \
            TEST_FAIL_("%s contains \"%s\": got \"%s\"", #hay, n_, h_ ? h_ : "(null)"); \
    } while (0)

/* status equality, printing both names */
#define ASSERT_OK(st) ASSERT_STATUS(st, KHUB_STATUS_OK)
#define ASSERT_STATUS(st, want) \
    do { \
        khub_status s_ = (st), w_ = (want); \
        if (s_ != w_) \
            TEST_FAIL_("%s: got %s, want %s", #st, khub_status_name(s_), khub_status_name(w_)); \
    } while (0)

#define TEST_SKIP(...) \
    do { \
        fprintf(stderr, "  skip: "); \
        fprintf(stderr, __VA_ARGS__); \
        fprintf(stderr, "\n"); \
        exit(TEST_EXIT_SKIP); \
    } while (0)

typedef struct test_case {
    const char *name;
    void (*fn)(void);
} test_case;

int test_run_main(int argc, char **argv, const test_case *cases, size_t n);

#define TEST_DECL_(name)  void test_##name(void);
#define TEST_ENTRY_(name) {#name, test_##name},
#define TEST_MAIN(LIST) \
    LIST(TEST_DECL_) \
    int main(int argc, char **argv) \
    { \
        static const test_case cases[] = {LIST(TEST_ENTRY_)}; \
        return test_run_main(argc, argv, cases, sizeof cases / sizeof cases[0]); \
    }

#endif /* KHUB_TESTS_RUNNER_H */
