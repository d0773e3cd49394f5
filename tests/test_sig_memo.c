/*
 * test_sig_memo.c: the per-process memo of Ed25519 verdicts (hub/sig_memo.c,
 * issue 14 item 5). A second verification of the same key, signature and
 * bytes is answered by the memo; a changed byte of any of the three is
 * verified and refused; failures are never recorded; the trust decision
 * around the verification (revocation, the key's organisation, the
 * statement's digest) still runs on every call; the table is bounded and
 * safe to use from several threads at once.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runner.h"
#include "trust.h"

static char dir[128];
static char priv[256];

static void make_key(const char *name, khub_pubkey *key)
{
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/khub-sigmemo-XXXXXX");
        ASSERT(mkdtemp(dir) != NULL);
    }
    char pub[256], err[KHUB_ERROR_SIZE];
    snprintf(priv, sizeof priv, "%s/%s.key", dir, name);
    snprintf(pub, sizeof pub, "%s/%s.pub", dir, name);
    ASSERT_OK(khub__key_generate(priv, pub, key, err, sizeof err));
}

/* The raw signature of data by the key at priv (a format-1 .sig, parsed). */
static void sign_raw(const char *data, size_t n, unsigned char sig[64])
{
    char *json = NULL, err[KHUB_ERROR_SIZE], kid[KHUB_KEY_ID_LEN + 1];
    ASSERT_OK(khub__sign(priv, data, n, &json, err, sizeof err));
    ASSERT_OK(khub__sig_parse(json, strlen(json), kid, sig));
    khub__mem_free(json);
}

static khub_sig_memo_stats stats(void)
{
    khub_sig_memo_stats s;
    khub__sig_memo_stats(&s);
    return s;
}

static const char msg[] = "khub-signed-statement 1\nrepo kernels-community/rmsnorm\n";

/* The second verification of the same three byte strings is a hit; a
 * changed message, signature or key misses, is verified and refused, and
 * is not recorded: asked again, it is refused again. */
TEST_IMPL(memo_answers_only_the_same_bytes)
{
    khub_pubkey key, other;
    make_key("b", &other);
    make_key("a", &key);
    unsigned char sig[64];
    sign_raw(msg, strlen(msg), sig);
    khub__sig_memo_clear();
    ASSERT_OK(khub__sig_verify(&key, msg, strlen(msg), sig));
    ASSERT_EQ(stats().hits, 0);
    ASSERT_EQ(stats().entries, 1);
    ASSERT_OK(khub__sig_verify(&key, msg, strlen(msg), sig));
    ASSERT_EQ(stats().hits, 1);
    for (int round = 0; round < 2; round++) {
        char tampered[sizeof msg];
        memcpy(tampered, msg, sizeof msg);
        tampered[30] ^= 1; /* one bit of the repo's name */
        ASSERT_STATUS(khub__sig_verify(&key, tampered, strlen(tampered), sig),
                      KHUB_STATUS_SIGNATURE_INVALID);
        ASSERT_STATUS(khub__sig_verify(&key, msg, strlen(msg) - 1, sig),
                      KHUB_STATUS_SIGNATURE_INVALID); /* a prefix of the signed bytes */
        unsigned char forged[64];
        memcpy(forged, sig, 64);
        forged[63] ^= 0x01;
        ASSERT_STATUS(khub__sig_verify(&key, msg, strlen(msg), forged),
                      KHUB_STATUS_SIGNATURE_INVALID);
        ASSERT_STATUS(khub__sig_verify(&other, msg, strlen(msg), sig),
                      KHUB_STATUS_SIGNATURE_INVALID);
        ASSERT_EQ(stats().hits, 1);    /* none of them was answered by the memo */
        ASSERT_EQ(stats().entries, 1); /* and no failure was recorded */
    }
    ASSERT_OK(khub__sig_verify(&key, msg, strlen(msg), sig));
    ASSERT_EQ(stats().hits, 2);
    ASSERT_EQ(stats().busy, 0);
}

/* A load judged after a successful one: the same statement is accepted
 * from the memo; a statement edited after signing, a forged signature and
 * metadata.json changed under the statement are refused with the status
 * and message a first load gets; so are a key revoked or no longer trusted
 * since (decided before the memo is asked). */
TEST_IMPL(second_load_of_a_tampered_statement_is_refused)
{
    khub_pubkey key;
    make_key("st", &key);
    static const char meta[] = "{\"name\": \"kernels-community/rmsnorm\"}";
    khub_sig_statement stmt = {"kernels-community/rmsnorm", "1.2.0", "khub1-cpu-x86_64-linux", ""};
    ASSERT_OK(khub__sha256_hex(meta, strlen(meta), stmt.metadata_sha256));
    char *sig = NULL, err[KHUB_ERROR_SIZE] = "";
    ASSERT_OK(khub__sign_statement(priv, &stmt, &sig, err, sizeof err));
    khub_trust_policy *p = NULL;
    ASSERT_OK(khub__trust_policy_default(&p));
    ASSERT_OK(khub__trust_policy_add(p, "kernels-community", &key));
    khub__sig_memo_clear();
    khub_trust_input in = {meta, strlen(meta), NULL, sig, strlen(sig)};
    ASSERT_OK(khub__trust_decide_ex(p, "kernels-community", &in, 0, NULL, err, sizeof err));
    ASSERT_OK(khub__trust_decide_ex(p, "kernels-community", &in, 0, NULL, err, sizeof err));
    ASSERT_EQ(stats().hits, 1);

    char want[KHUB_ERROR_SIZE];
    snprintf(want, sizeof want,
             "kernels-community: signature by key %s does not verify over its signed statement",
             key.id);
    /* the statement edited after signing: another version */
    char *edited = strdup(sig);
    memcpy(strstr(edited, "\"1.2.0\"") + 1, "1.2.1", 5);
    khub_trust_input e = {meta, strlen(meta), NULL, edited, strlen(edited)};
    ASSERT_STATUS(khub__trust_decide_ex(p, "kernels-community", &e, 0, NULL, err, sizeof err),
                  KHUB_STATUS_SIGNATURE_INVALID);
    ASSERT_STR_EQ(err, want);
    /* a forged signature over the original statement (its first base64
     * character changed) */
    free(edited);
    edited = strdup(sig);
    char *b64 = strstr(edited, "\"signature\": \"") + strlen("\"signature\": \"");
    *b64 = *b64 == 'A' ? 'B' : 'A';
    e.sig_json = edited;
    ASSERT_STATUS(khub__trust_decide_ex(p, "kernels-community", &e, 0, NULL, err, sizeof err),
                  KHUB_STATUS_SIGNATURE_INVALID);
    ASSERT_STR_EQ(err, want);
    free(edited);
    ASSERT_EQ(stats().hits, 1);
    /* metadata.json changed under the (memoised) statement */
    static const char meta2[] = "{\"name\": \"kernels-community/rmsnorX\"}";
    khub_trust_input m = {meta2, strlen(meta2), NULL, sig, strlen(sig)};
    ASSERT_STATUS(khub__trust_decide_ex(p, "kernels-community", &m, 0, NULL, err, sizeof err),
                  KHUB_STATUS_SIGNATURE_INVALID);
    ASSERT_CONTAINS(err, "does not verify over metadata.json (it signs SHA-256 ");
    ASSERT_EQ(stats().hits, 2); /* the statement itself verified, from the memo */
    khub__trust_policy_free(p);

    /* the key revoked since the first load */
    char line[96], json[512];
    khub__pubkey_format(&key, line, sizeof line);
    snprintf(json, sizeof json,
             "{\"version\": 1, \"publishers\": {\"kernels-community\": [\"%s\"]}, "
             "\"revoked\": [\"%s\"]}",
             line, key.id);
    ASSERT_OK(khub__trust_policy_parse(json, strlen(json), &p, err, sizeof err));
    ASSERT_STATUS(khub__trust_decide_ex(p, "kernels-community", &in, 0, NULL, err, sizeof err),
                  KHUB_STATUS_KEY_REVOKED);
    snprintf(want, sizeof want, "kernels-community: signed with revoked key %s", key.id);
    ASSERT_STR_EQ(err, want);
    khub__trust_policy_free(p);
    /* the key no longer trusted for the organisation */
    khub_pubkey stranger;
    make_key("x", &stranger);
    ASSERT_OK(khub__trust_policy_default(&p));
    ASSERT_OK(khub__trust_policy_add(p, "kernels-community", &stranger));
    ASSERT_STATUS(khub__trust_decide_ex(p, "kernels-community", &in, 0, NULL, err, sizeof err),
                  KHUB_STATUS_KEY_UNKNOWN);
    snprintf(want, sizeof want,
             "kernels-community: signed with key %s, which the policy does not trust for this "
             "organisation",
             key.id);
    ASSERT_STR_EQ(err, want);
    ASSERT_EQ(stats().hits, 2);
    khub__trust_policy_free(p);
    khub__mem_free(sig);
}

/* The table holds KHUB_SIG_MEMO_SLOTS successes and then replaces the
 * oldest: the first statement is verified again (a miss), and still
 * accepted. */
TEST_IMPL(memo_is_bounded)
{
    khub_pubkey key;
    make_key("n", &key);
    enum { N = KHUB_SIG_MEMO_SLOTS + 3 };
    static unsigned char sigs[N][64];
    char text[N][32];
    for (int i = 0; i < N; i++) {
        snprintf(text[i], sizeof text[i], "statement %d", i);
        sign_raw(text[i], strlen(text[i]), sigs[i]);
    }
    khub__sig_memo_clear();
    for (int i = 0; i < N; i++)
        ASSERT_OK(khub__sig_verify(&key, text[i], strlen(text[i]), sigs[i]));
    ASSERT_EQ(stats().entries, KHUB_SIG_MEMO_SLOTS);
    ASSERT_EQ(stats().hits, 0);
    ASSERT_OK(khub__sig_verify(&key, text[0], strlen(text[0]), sigs[0])); /* evicted */
    ASSERT_EQ(stats().hits, 0);
    ASSERT_OK(khub__sig_verify(&key, text[N - 1], strlen(text[N - 1]), sigs[N - 1]));
    ASSERT_EQ(stats().hits, 1);
    ASSERT_EQ(stats().entries, KHUB_SIG_MEMO_SLOTS);
}

/* Threads verifying at once: every genuine signature is accepted and every
 * forged one refused, whether the memo answered, was busy or missed. */
typedef struct worker {
    const khub_pubkey *key;
    const char *msg;
    const unsigned char *sig;
    int wrong; /* verdicts that were not the expected one */
} worker;

static void *verify_many(void *arg)
{
    worker *w = arg;
    unsigned char forged[64];
    memcpy(forged, w->sig, 64);
    forged[0] ^= 0x40;
    for (int i = 0; i < 200; i++) {
        const unsigned char *s = i % 3 == 2 ? forged : w->sig;
        khub_status want = s == forged ? KHUB_STATUS_SIGNATURE_INVALID : KHUB_STATUS_OK;
        if (khub__sig_verify(w->key, w->msg, strlen(w->msg), s) != want) w->wrong++;
    }
    return NULL;
}

TEST_IMPL(memo_threads)
{
    khub_pubkey key;
    make_key("t", &key);
    static const char *const msgs[] = {"one", "two", "three", "four"};
    unsigned char sigs[4][64];
    for (int i = 0; i < 4; i++) sign_raw(msgs[i], strlen(msgs[i]), sigs[i]);
    khub__sig_memo_clear();
    pthread_t th[8];
    worker w[8];
    for (int i = 0; i < 8; i++) {
        w[i] = (worker){&key, msgs[i % 4], sigs[i % 4], 0};
        ASSERT_EQ(pthread_create(&th[i], NULL, verify_many, &w[i]), 0);
    }
    for (int i = 0; i < 8; i++) ASSERT_EQ(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < 8; i++) ASSERT_EQ(w[i].wrong, 0);
    khub_sig_memo_stats s = stats();
    ASSERT_EQ(s.entries, 4);
    ASSERT(s.hits > 0);
}

#define TEST_LIST(X) \
    X(memo_answers_only_the_same_bytes) \
    X(second_load_of_a_tampered_statement_is_refused) \
    X(memo_is_bounded) \
    X(memo_threads)
TEST_MAIN(TEST_LIST)
