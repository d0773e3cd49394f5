/*
 * test_parse_memo.c: the per-process memo of parses keyed by the exact
 * bytes parsed (hub/parse_memo.c, issue 14 item 5). The same bytes are
 * answered from the memo; a changed byte, a prefix or another kind misses;
 * a trust policy, a khub.lock and a metadata.json edited after a
 * remembered parse are read and parsed again, so the edit decides (a
 * revocation refuses, a lock edited by hand is refused, a changed table
 * digest is a digest mismatch), each with the message a first load gets;
 * failures are never kept; the table is bounded and safe from threads.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hub_impl.h"
#include "kernel_meta.h"
#include "lockfile.h"
#include "parse_memo.h"
#include "runner.h"
#include "trust.h"

#define C1 "1111111111111111111111111111111111111111"
#define HA "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define HB "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
#define HC "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"

static char dir[128];

static const char *tmp_path(const char *name)
{
    static char path[4][256];
    static int k;
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/khub-parsememo-XXXXXX");
        ASSERT(mkdtemp(dir) != NULL);
    }
    char *p = path[k++ % 4];
    snprintf(p, 256, "%s/%s", dir, name);
    return p;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    ASSERT(f != NULL);
    ASSERT_EQ(fwrite(text, 1, strlen(text), f), strlen(text));
    fclose(f);
}

static khub_parse_memo_stats stats(void)
{
    khub_parse_memo_stats s;
    khub__parse_memo_stats(&s);
    return s;
}

/* ------------------------------------------------------------------------ */
/* The memo itself, on a kind whose parse is a number                       */
/* ------------------------------------------------------------------------ */

static int drops;

static void *int_keep(const void *parsed)
{
    int *c = khub__mem_alloc(NULL, sizeof *c);
    if (c) *c = *(const int *)parsed;
    return c;
}

static bool int_give(const void *kept, void *out)
{
    *(int *)out = *(const int *)kept;
    return true;
}

static void int_drop(void *kept)
{
    drops++;
    khub__mem_free(kept);
}

static const khub__memo_kind number = {"number", int_keep, int_give, int_drop};
static const khub__memo_kind other = {"other", int_keep, int_give, int_drop};

TEST_IMPL(memo_answers_only_the_same_bytes)
{
    khub__parse_memo_clear();
    static const char text[] = "the bytes parsed";
    int v = 42, got = -1;
    ASSERT(!khub__parse_memo_find(&number, text, sizeof text - 1, &got));
    khub__parse_memo_add(&number, text, sizeof text - 1, &v);
    ASSERT(khub__parse_memo_find(&number, text, sizeof text - 1, &got));
    ASSERT_EQ(got, 42);
    ASSERT_EQ(stats().hits, 1);
    char changed[sizeof text];
    memcpy(changed, text, sizeof text);
    changed[7] ^= 1; /* one bit of one byte, same length */
    got = -1;
    ASSERT(!khub__parse_memo_find(&number, changed, sizeof text - 1, &got));
    ASSERT(!khub__parse_memo_find(&number, text, sizeof text - 2, &got)); /* a prefix */
    ASSERT(!khub__parse_memo_find(&other, text, sizeof text - 1, &got));  /* another kind */
    ASSERT_EQ(got, -1);
    ASSERT_EQ(stats().hits, 1);
    /* the same bytes added twice are kept once */
    khub__parse_memo_add(&number, text, sizeof text - 1, &v);
    ASSERT_EQ(stats().entries, 1);
    ASSERT_EQ(stats().busy, 0);
}

/* A digest kept with its bytes (khub__parse_memo_sha256): the same bytes
 * are answered from the memo with their SHA-256; one changed bit, a prefix,
 * or the same bytes remembered as another kind's parse are hashed, and
 * give their own digest. */
TEST_IMPL(digest_answers_only_the_same_bytes)
{
    khub__parse_memo_clear();
    static const char text[] = "{\"format\": 1, \"name\": \"org/k\"}";
    char want[65], got[65];
    ASSERT_OK(khub__sha256_hex(text, sizeof text - 1, want));
    for (int round = 0; round < 2; round++) {
        memset(got, 0, sizeof got);
        ASSERT_OK(khub__parse_memo_sha256(text, sizeof text - 1, got));
        ASSERT_STR_EQ(got, want);
        ASSERT_EQ(stats().hits, (size_t)round); /* the second answered by the memo */
    }
    char changed[sizeof text];
    memcpy(changed, text, sizeof text);
    changed[3] ^= 1;
    ASSERT_OK(khub__sha256_hex(changed, sizeof text - 1, want));
    ASSERT_OK(khub__parse_memo_sha256(changed, sizeof text - 1, got));
    ASSERT_STR_EQ(got, want);
    ASSERT_OK(khub__sha256_hex(text, sizeof text - 2, want));
    ASSERT_OK(khub__parse_memo_sha256(text, sizeof text - 2, got));
    ASSERT_STR_EQ(got, want);
    ASSERT_EQ(stats().hits, 1);
    /* a parse of these bytes as another kind is not their digest */
    static const char other_text[] = "other bytes";
    int v = 7;
    khub__parse_memo_add(&number, other_text, sizeof other_text - 1, &v);
    ASSERT_OK(khub__sha256_hex(other_text, sizeof other_text - 1, want));
    ASSERT_OK(khub__parse_memo_sha256(other_text, sizeof other_text - 1, got));
    ASSERT_STR_EQ(got, want);
    ASSERT_EQ(stats().hits, 1);
}

/* KHUB_PARSE_MEMO_SLOTS parses, then the oldest is replaced (and dropped);
 * clear drops the rest. */
TEST_IMPL(memo_is_bounded)
{
    khub__parse_memo_clear();
    drops = 0;
    enum { N = KHUB_PARSE_MEMO_SLOTS + 3 };
    char text[N][32];
    for (int i = 0; i < N; i++) {
        snprintf(text[i], sizeof text[i], "input %d", i);
        khub__parse_memo_add(&number, text[i], strlen(text[i]), &i);
    }
    ASSERT_EQ(stats().entries, KHUB_PARSE_MEMO_SLOTS);
    ASSERT_EQ(drops, 3);
    int got = -1;
    ASSERT(!khub__parse_memo_find(&number, text[0], strlen(text[0]), &got));
    ASSERT(khub__parse_memo_find(&number, text[N - 1], strlen(text[N - 1]), &got));
    ASSERT_EQ(got, N - 1);
    khub__parse_memo_clear();
    ASSERT_EQ(drops, N);
    ASSERT_EQ(stats().entries, 0);
}

/* ------------------------------------------------------------------------ */
/* The trust policy                                                         */
/* ------------------------------------------------------------------------ */

/* A revocation written into the policy after a remembered parse refuses
 * the next load with the message a first load gets; a policy made invalid
 * is refused every time (failures are not kept). */
TEST_IMPL(policy_edited_after_a_remembered_parse)
{
    khub_pubkey key;
    char err[KHUB_ERROR_SIZE] = "", line[96], json[1024], want[KHUB_ERROR_SIZE];
    const char *priv = tmp_path("k.key"), *pub = tmp_path("k.pub");
    ASSERT_OK(khub__key_generate(priv, pub, &key, err, sizeof err));
    static const char meta[] = "{\"name\": \"kernels-community/rmsnorm\"}";
    khub_sig_statement stmt = {"kernels-community/rmsnorm", "1.2.0", "khub1-cpu-x86_64-linux", ""};
    ASSERT_OK(khub__sha256_hex(meta, strlen(meta), stmt.metadata_sha256));
    char *sig = NULL;
    ASSERT_OK(khub__sign_statement(priv, &stmt, &sig, err, sizeof err));
    khub_trust_input in = {meta, strlen(meta), NULL, sig, strlen(sig)};

    khub__pubkey_format(&key, line, sizeof line);
    const char *path = tmp_path("policy.json");
    snprintf(json, sizeof json,
             "{\"version\": 1, \"publishers\": {\"kernels-community\": [\"%s\"]}, "
             "\"revoked\": [\"%s\"]}",
             line, "0000000000000000");
    write_file(path, json);
    khub__parse_memo_clear();
    for (int round = 0; round < 2; round++) {
        khub_trust_policy *p = NULL;
        size_t hits = stats().hits;
        ASSERT_OK(khub__trust_policy_load(path, &p, err, sizeof err));
        ASSERT_EQ(stats().hits - hits, (size_t)round); /* the second load is a hit */
        ASSERT_OK(khub__trust_decide_ex(p, "kernels-community", &in, 0, NULL, err, sizeof err));
        khub__trust_policy_free(p);
    }

    /* the key revoked in place: same file, same length */
    char *zeros = strstr(json, "0000000000000000");
    ASSERT(zeros != NULL);
    memcpy(zeros, key.id, 16);
    write_file(path, json);
    khub_trust_policy *p = NULL;
    size_t hits = stats().hits;
    ASSERT_OK(khub__trust_policy_load(path, &p, err, sizeof err));
    ASSERT_EQ(stats().hits, hits); /* parsed again */
    ASSERT_STATUS(khub__trust_decide_ex(p, "kernels-community", &in, 0, NULL, err, sizeof err),
                  KHUB_STATUS_KEY_REVOKED);
    snprintf(want, sizeof want, "kernels-community: signed with revoked key %s", key.id);
    ASSERT_STR_EQ(err, want);
    khub__trust_policy_free(p);

    /* a typo: refused, and refused again (nothing kept) */
    char *rev = strstr(json, "\"revoked\"");
    ASSERT(rev != NULL);
    memcpy(rev, "\"revokes\"", 9);
    write_file(path, json);
    snprintf(want, sizeof want,
             "%s: policy: unknown field \"revokes\" (the fields are version, publishers, "
             "revoked, allow_unsigned)",
             path);
    hits = stats().hits;
    for (int round = 0; round < 2; round++) {
        p = NULL;
        ASSERT_STATUS(khub__trust_policy_load(path, &p, err, sizeof err), KHUB_STATUS_PARSE);
        ASSERT_STR_EQ(err, want);
        ASSERT(p == NULL);
    }
    ASSERT_EQ(stats().hits, hits);
    ASSERT_EQ(stats().entries, 3); /* the two policies that parsed, and the .sig */
    khub__mem_free(sig);
    khub__rmtree(dir);
}

/* ------------------------------------------------------------------------ */
/* khub.lock                                                                */
/* ------------------------------------------------------------------------ */

/* A lock of org/k pinning metadata.json (HA) and z.so (so_sha). */
static void lock_text(const char *so_sha, char *buf, size_t n)
{
    khub_lock_file files[2] = {{"z.so", ""}, {"metadata.json", HA}};
    snprintf(files[0].sha256, sizeof files[0].sha256, "%s", so_sha);
    char h[KHUB_LOCK_HASH_LEN + 1];
    ASSERT_OK(khub__lock_content_hash(files, 2, h));
    snprintf(buf, n,
             "{\"format\":1,\"kernels\":[{\"repo\":\"org/k\",\"version\":1,\"commit\":\"" C1
             "\",\"variants\":{\"khub1-cpu-x86_64-linux\":{\"hash\":\"%s\",\"files\":"
             "{\"metadata.json\":\"" HA "\",\"z.so\":\"%s\"}}}}]}",
             h, so_sha);
}

static const char *z_digest(const khub_lock *lock)
{
    const khub_lock_entry *e = khub__lock_find(lock, "org/k");
    ASSERT(e != NULL && e->n_variants == 1);
    const khub_lock_variant *v = &e->variants[0];
    for (size_t i = 0; i < v->n_files; i++)
        if (!strcmp(v->files[i].name, "z.so")) return v->files[i].sha256;
    ASSERT(!"z.so not in the lock");
    return NULL;
}

/* A lock re-pinned in place after a remembered parse is read as written; a
 * lock edited by hand (its content hash no longer matches) is refused each
 * time with the parser's message. */
TEST_IMPL(lock_edited_after_a_remembered_parse)
{
    char text[2048], err[KHUB_ERROR_SIZE] = "";
    const char *path = tmp_path("khub.lock");
    lock_text(HB, text, sizeof text);
    write_file(path, text);
    khub__parse_memo_clear();
    for (int round = 0; round < 2; round++) {
        khub_lock *lock = NULL;
        ASSERT_OK(khub__lock_load(path, &lock, err, sizeof err));
        ASSERT_STR_EQ(z_digest(lock), HB);
        khub__lock_free(lock);
    }
    ASSERT_EQ(stats().hits, 1);
    /* re-pinned: another digest for z.so and its content hash */
    lock_text(HC, text, sizeof text);
    write_file(path, text);
    khub_lock *lock = NULL;
    ASSERT_OK(khub__lock_load(path, &lock, err, sizeof err));
    ASSERT_STR_EQ(z_digest(lock), HC);
    khub__lock_free(lock);
    ASSERT_EQ(stats().hits, 1);
    /* by hand: z.so's digest changed back, the hash left as it was */
    char *at = strstr(text, "\"z.so\":\"") + 8;
    memcpy(at, HB, 64);
    write_file(path, text);
    char want[KHUB_ERROR_SIZE];
    char parse_err[KHUB_ERROR_SIZE];
    ASSERT_STATUS(khub__lock_parse(text, strlen(text), &lock, parse_err, sizeof parse_err),
                  KHUB_STATUS_PARSE);
    ASSERT_CONTAINS(parse_err, "edited by hand");
    snprintf(want, sizeof want, "%s: %s", path, parse_err);
    for (int round = 0; round < 2; round++) {
        lock = NULL;
        ASSERT_STATUS(khub__lock_load(path, &lock, err, sizeof err), KHUB_STATUS_PARSE);
        ASSERT_STR_EQ(err, want);
        ASSERT(lock == NULL);
    }
    ASSERT_EQ(stats().hits, 1);
    khub__rmtree(dir);
}

/* ------------------------------------------------------------------------ */
/* metadata.json of a cached variant                                        */
/* ------------------------------------------------------------------------ */

static const char *arch(void)
{
#if defined(__x86_64__)
    return "x86_64";
#else
    return "aarch64";
#endif
}

/* A cached, unpacked variant of kernels--org--m with one file t0.bin; its
 * folder goes to vdir, the digest of t0.bin to sha. */
static void make_variant(const char *cache, char vdir[512], char sha[65])
{
    char cmd[700], path[600], meta[2048];
    snprintf(vdir, 512, "%s/kernels--org--m/khub-variants/" C1 "/khub1-cpu-%s-linux", cache,
             arch());
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", vdir);
    ASSERT_EQ(system(cmd), 0);
    static const char content[] = "file 0 of m\n";
    snprintf(path, sizeof path, "%s/t0.bin", vdir);
    write_file(path, content);
    ASSERT_OK(khub__sha256_hex(content, strlen(content), sha));
    snprintf(meta, sizeof meta,
             "{\"format\":1,\"name\":\"org/m\",\"version\":\"1.0.0\",\"major\":1,"
             "\"variant\":\"khub1-cpu-%s-linux\",\"abi\":{\"major\":1,\"minor\":0},"
             "\"backend\":{\"type\":\"cpu\",\"archs\":[\"%s\"]},"
             "\"plugins\":[{\"file\":\"t0.bin\",\"level\":\"generic\",\"cpu_features\":[]}],"
             "\"files\":{\"t0.bin\":\"%s\"},"
             "\"provenance\":{\"source_commit\":\"unknown\",\"dirty\":false}}",
             arch(), arch(), sha);
    snprintf(path, sizeof path, "%s/metadata.json", vdir);
    write_file(path, meta);
}

/* metadata.json edited after a remembered parse (one digit of t0.bin's
 * digest): the new table is the one the file is checked against, so the
 * check fails with the digest the edit states. */
TEST_IMPL(metadata_edited_after_a_remembered_parse)
{
    char cache[300], vdir[512], sha[65], variant[64];
    snprintf(cache, sizeof cache, "%s", tmp_path("cache"));
    make_variant(cache, vdir, sha);
    snprintf(variant, sizeof variant, "khub1-cpu-%s-linux", arch());
    khub_hub_opts o = {KHUB_STRUCT_INIT(khub_hub_opts), .endpoint = "http://127.0.0.1:9",
                       .cache_dir = cache, .token = "", .offline = 1};
    khub_hub *hub = NULL;
    ASSERT_OK(khub_hub_new(&o, &hub));
    khub_hub_id id;
    ASSERT_OK(khub_hub_id_parse("org/m", &id, NULL, 0));
    khub__parse_memo_clear();
    for (int round = 0; round < 2; round++) {
        khub_hub_file_list *l = NULL;
        ASSERT_OK(khub_hub_variant_files(hub, &id, C1, variant, &l));
        ASSERT_EQ(l->count, 1);
        ASSERT_STR_EQ(l->items[0].sha256, sha);
        khub_hub_file_list_free(l);
    }
    ASSERT_EQ(stats().hits, 1);
    /* one hex digit of the stated digest changed, in place */
    char path[600], edited[65];
    snprintf(path, sizeof path, "%s/metadata.json", vdir);
    char *meta = NULL;
    size_t n = 0;
    ASSERT_OK(khub__read_file(path, 1 << 20, &meta, &n, NULL, 0));
    char *at = strstr(meta, sha);
    ASSERT(at != NULL);
    at[0] = at[0] == '0' ? '1' : '0';
    memcpy(edited, at, 64);
    edited[64] = '\0';
    write_file(path, meta);
    free(meta);
    khub_hub_file_list *l = NULL;
    ASSERT_STATUS(khub_hub_variant_files(hub, &id, C1, variant, &l), KHUB_STATUS_DIGEST_MISMATCH);
    char want[KHUB_ERROR_SIZE];
    snprintf(want, sizeof want, "%s: t0.bin has SHA-256 %s, metadata.json says %s", vdir, sha,
             edited);
    ASSERT_STR_EQ(khub_hub_errmsg(hub), want);
    ASSERT(l == NULL);
    ASSERT_EQ(stats().hits, 1);
    khub_hub_free(hub);
    khub__rmtree(dir);
}

/* ------------------------------------------------------------------------ */
/* Threads                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct worker {
    const char *path[2]; /* two policies: path[k] lets orgs[k] in */
    int first;           /* which one this thread starts with */
    int wrong;
} worker;

static void *load_many(void *arg)
{
    worker *w = arg;
    static const char *const orgs[2] = {"org-a", "org-b"};
    for (int i = 0; i < 300; i++) {
        khub_trust_policy *p = NULL;
        char err[KHUB_ERROR_SIZE];
        int k = (i + w->first) % 2;
        if (khub__trust_policy_load(w->path[k], &p, err, sizeof err) != KHUB_STATUS_OK) {
            w->wrong++;
            continue;
        }
        /* org-a's policy lets org-a's unsigned kernels in, org-b's org-b's */
        khub_trust_input none = {"{}", 2, NULL, NULL, 0};
        if (khub__trust_decide_ex(p, orgs[k], &none, 0, NULL, err, sizeof err) != KHUB_STATUS_OK ||
            khub__trust_decide_ex(p, orgs[1 - k], &none, 0, NULL, err, sizeof err) !=
                KHUB_STATUS_UNSIGNED)
            w->wrong++;
        khub__trust_policy_free(p);
    }
    return NULL;
}

TEST_IMPL(memo_threads)
{
    const char *a = tmp_path("a.json"), *b = tmp_path("b.json");
    write_file(a, "{\"version\": 1, \"allow_unsigned\": [\"org-a\"]}");
    write_file(b, "{\"version\": 1, \"allow_unsigned\": [\"org-b\"]}");
    khub__parse_memo_clear();
    pthread_t th[8];
    worker w[8];
    for (int i = 0; i < 8; i++) {
        w[i] = (worker){{a, b}, i % 2, 0};
        ASSERT_EQ(pthread_create(&th[i], NULL, load_many, &w[i]), 0);
    }
    for (int i = 0; i < 8; i++) ASSERT_EQ(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < 8; i++) ASSERT_EQ(w[i].wrong, 0);
    ASSERT_EQ(stats().entries, 2);
    ASSERT(stats().hits > 0);
    khub__rmtree(dir);
}

#define TEST_LIST(X) \
    X(memo_answers_only_the_same_bytes) \
    X(digest_answers_only_the_same_bytes) \
    X(memo_is_bounded) \
    X(policy_edited_after_a_remembered_parse) \
    X(lock_edited_after_a_remembered_parse) \
    X(metadata_edited_after_a_remembered_parse) \
    X(memo_threads)
TEST_MAIN(TEST_LIST)
