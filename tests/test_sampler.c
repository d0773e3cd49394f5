/* test_sampler.c: the next-token sampler (runtime/executor/sampler.c). */
#include <math.h>

#include "runner.h"
#include "sampler.h"

static khub__sampler make(float temp, int top_k, float top_p, float pen, uint64_t seed, int64_t nv)
{
    khub__sampler s;
    khub__sampler_params p = {temp, top_k, top_p, pen, seed};
    ASSERT_OK(khub__sampler_init(NULL, &s, &p, nv));
    return s;
}

TEST_IMPL(sampler_greedy_argmax)
{
    khub__sampler s = make(0.0f, 0, 0.0f, 0.0f, 1, 6);
    float l[6] = {0.5f, 2.0f, -1.0f, 2.0f, NAN, 1.0f};
    ASSERT_EQ(khub__sampler_sample(&s, l, NULL, 0), 1); /* tie: lowest id, NaN never wins */
    khub__sampler_free(&s);
}

TEST_IMPL(sampler_repetition_penalty)
{
    /* 2.0 / 2 = 1.0 < 1.5 and -1.0 * 2 = -2.0: the penalty moves greedy to id 2. */
    khub__sampler s = make(0.0f, 0, 0.0f, 2.0f, 1, 4);
    float l[4] = {2.0f, -1.0f, 1.5f, 0.0f};
    int32_t hist[] = {0, 0, 1, 99, -3}; /* repeats and out-of-range ids */
    ASSERT_EQ(khub__sampler_sample(&s, l, hist, 5), 2);
    ASSERT(l[0] == 1.0f); /* applied once although id 0 repeats */
    ASSERT(l[1] == -2.0f);
    /* The marks are cleared: a second call penalises again, once. */
    float l2[4] = {2.0f, -1.0f, 1.5f, 0.0f};
    ASSERT_EQ(khub__sampler_sample(&s, l2, hist, 2), 2);
    ASSERT(l2[0] == 1.0f && l2[1] == -1.0f);
    khub__sampler_free(&s);
}

/* Draws many tokens from logits and returns the frequency of each id. */
static void frequencies(khub__sampler *s, const float *logits, int64_t nv, int n, double *freq)
{
    float buf[8];
    for (int64_t i = 0; i < nv; i++) freq[i] = 0.0;
    for (int i = 0; i < n; i++) {
        memcpy(buf, logits, (size_t)nv * sizeof(float));
        int32_t id = khub__sampler_sample(s, buf, NULL, 0);
        ASSERT(id >= 0 && id < nv);
        freq[id] += 1.0 / n;
    }
}

TEST_IMPL(sampler_distribution)
{
    /* p = (0.5, 0.3, 0.2) at temperature 1; 20000 draws: sd ~ 0.0035. */
    float l[3] = {logf(0.5f), logf(0.3f), logf(0.2f)};
    double f[3];
    khub__sampler s = make(1.0f, 0, 0.0f, 0.0f, 42, 3);
    frequencies(&s, l, 3, 20000, f);
    ASSERT_LE(fabs(f[0] - 0.5), 0.02);
    ASSERT_LE(fabs(f[1] - 0.3), 0.02);
    ASSERT_LE(fabs(f[2] - 0.2), 0.02);
    khub__sampler_free(&s);

    /* Temperature 0.5 squares the probabilities: 25:9:4. */
    s = make(0.5f, 0, 0.0f, 0.0f, 43, 3);
    frequencies(&s, l, 3, 20000, f);
    ASSERT_LE(fabs(f[0] - 25.0 / 38), 0.02);
    ASSERT_LE(fabs(f[2] - 4.0 / 38), 0.02);
    khub__sampler_free(&s);
}

TEST_IMPL(sampler_top_k_top_p)
{
    float l[5] = {logf(0.1f), logf(0.4f), logf(0.05f), logf(0.3f), logf(0.15f)};
    double f[5];
    /* top_k = 2 keeps ids 1 and 3, renormalised to 4:3. */
    khub__sampler s = make(1.0f, 2, 0.0f, 0.0f, 7, 5);
    frequencies(&s, l, 5, 20000, f);
    ASSERT(f[0] == 0.0 && f[2] == 0.0 && f[4] == 0.0);
    ASSERT_LE(fabs(f[1] - 4.0 / 7), 0.02);
    khub__sampler_free(&s);
    /* top_p = 0.75: 0.4 + 0.3 = 0.7 < 0.75, so 0.15 joins; 0.1 and 0.05 are cut. */
    s = make(1.0f, 0, 0.75f, 0.0f, 8, 5);
    frequencies(&s, l, 5, 20000, f);
    ASSERT(f[0] == 0.0 && f[2] == 0.0);
    ASSERT_LE(fabs(f[4] - 0.15 / 0.85), 0.02);
    khub__sampler_free(&s);
    /* top_p smaller than the top probability keeps exactly the top token. */
    s = make(1.0f, 0, 0.01f, 0.0f, 9, 5);
    frequencies(&s, l, 5, 500, f);
    ASSERT(f[0] == 0.0 && f[2] == 0.0 && f[3] == 0.0 && f[4] == 0.0);
    khub__sampler_free(&s);
}

TEST_IMPL(sampler_seeded)
{
    enum { NV = 4000, N = 64 };
    static float l[NV], buf[NV];
    for (int i = 0; i < NV; i++) l[i] = sinf((float)i * 0.37f) * 3.0f;
    int32_t a[N], b[N], c[N];
    uint64_t seeds[3] = {5, 5, 6};
    int32_t *outs[3] = {a, b, c};
    for (int r = 0; r < 3; r++) {
        khub__sampler s = make(0.8f, 40, 0.95f, 1.1f, seeds[r], NV);
        for (int i = 0; i < N; i++) {
            memcpy(buf, l, sizeof l);
            outs[r][i] = khub__sampler_sample(&s, buf, outs[r], (size_t)i);
        }
        khub__sampler_free(&s);
    }
    ASSERT(memcmp(a, b, sizeof a) == 0);
    ASSERT(memcmp(a, c, sizeof a) != 0);
}

TEST_IMPL(sampler_bad_vocab)
{
    khub__sampler s;
    khub__sampler_params p = {0};
    ASSERT_STATUS(khub__sampler_init(NULL, &s, &p, 0), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_last_error(), "vocabulary size 0");
    khub__sampler_free(&s);
}

#define TEST_LIST(X) \
    X(sampler_greedy_argmax) \
    X(sampler_repetition_penalty) \
    X(sampler_distribution) X(sampler_top_k_top_p) X(sampler_seeded) X(sampler_bad_vocab)
TEST_MAIN(TEST_LIST)
