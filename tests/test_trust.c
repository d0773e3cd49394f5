/*
 * test_trust.c: Ed25519 keys, signatures over metadata.json and every branch
 * of the verification policy: signed and trusted, bad signature, unknown key,
 * revoked key, unsigned from a listed org, unsigned from an unlisted org with
 * and without opt-in, malformed policy files.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runner.h"
#include "trust.h"

static char dir[128];
static char priv[256], pub[256];

static void make_key(const char *name, khub_pubkey *key)
{
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/khub-trust-XXXXXX");
        ASSERT(mkdtemp(dir) != NULL);
    }
    snprintf(priv, sizeof priv, "%s/%s.key", dir, name);
    snprintf(pub, sizeof pub, "%s/%s.pub", dir, name);
    char err[KHUB_ERROR_SIZE];
    ASSERT_OK(khub__key_generate(priv, pub, key, err, sizeof err));
}

static const char metadata[] = "{\"name\": \"flash-attn2\", \"files\": {\"a.so\": \"00\"}}";

static char *sign_with(const char *priv_path, const char *data)
{
    char *sig = NULL, err[KHUB_ERROR_SIZE];
    ASSERT_OK(khub__sign(priv_path, data, strlen(data), &sig, err, sizeof err));
    return sig;
}

TEST_IMPL(keygen_files_and_formats)
{
    khub_pubkey key, loaded;
    make_key("a", &key);
    struct stat sb;
    ASSERT_EQ(stat(priv, &sb), 0);
    ASSERT_EQ(sb.st_mode & 0777, 0600);
    char err[KHUB_ERROR_SIZE];
    ASSERT_OK(khub__pubkey_load(pub, &loaded, err, sizeof err));
    ASSERT(memcmp(key.raw, loaded.raw, 32) == 0);
    ASSERT_STR_EQ(key.id, loaded.id);
    ASSERT_EQ(strlen(key.id), KHUB_KEY_ID_LEN);
    /* never overwrites */
    ASSERT_STATUS(khub__key_generate(priv, pub, NULL, err, sizeof err), KHUB_STATUS_EXISTS);
    ASSERT_CONTAINS(err, "already exists");
    ASSERT_STATUS(khub__pubkey_parse("ssh-ed25519 AAAA", &loaded), KHUB_STATUS_PARSE);
    ASSERT_STATUS(khub__pubkey_parse("khub-ed25519 AAAA", &loaded), KHUB_STATUS_PARSE);
}

TEST_IMPL(sign_and_verify)
{
    khub_pubkey key;
    make_key("s", &key);
    char *sig = sign_with(priv, metadata);
    char kid[KHUB_KEY_ID_LEN + 1];
    unsigned char raw[64];
    ASSERT_OK(khub__sig_parse(sig, strlen(sig), kid, raw));
    ASSERT_STR_EQ(kid, key.id);
    ASSERT_OK(khub__sig_verify(&key, metadata, strlen(metadata), raw));
    /* one flipped byte of the message or of the signature fails */
    char tampered[sizeof metadata];
    memcpy(tampered, metadata, sizeof metadata);
    tampered[10] ^= 1;
    ASSERT_STATUS(khub__sig_verify(&key, tampered, strlen(tampered), raw),
                  KHUB_STATUS_SIGNATURE_INVALID);
    raw[5] ^= 0x80;
    ASSERT_STATUS(khub__sig_verify(&key, metadata, strlen(metadata), raw),
                  KHUB_STATUS_SIGNATURE_INVALID);
    khub__mem_free(sig);
}

static khub_trust_policy *policy_with(const char *org, const khub_pubkey *key)
{
    khub_trust_policy *p = NULL;
    ASSERT_OK(khub__trust_policy_default(&p));
    if (org) ASSERT_OK(khub__trust_policy_add(p, org, key));
    return p;
}

TEST_IMPL(decide_signed_trusted)
{
    khub_pubkey key;
    make_key("t", &key);
    char *sig = sign_with(priv, metadata);
    khub_trust_policy *p = policy_with("kernels-community", &key);
    char err[KHUB_ERROR_SIZE] = "";
    ASSERT_OK(khub__trust_decide(p, "kernels-community", metadata, strlen(metadata), sig,
                                 strlen(sig), 0, err, sizeof err));
    khub__trust_policy_free(p);
    khub__mem_free(sig);
}

TEST_IMPL(decide_bad_signature)
{
    khub_pubkey key;
    make_key("b", &key);
    char *sig = sign_with(priv, "{\"other\": 1}");
    khub_trust_policy *p = policy_with("kernels-community", &key);
    char err[KHUB_ERROR_SIZE] = "";
    ASSERT_STATUS(khub__trust_decide(p, "kernels-community", metadata, strlen(metadata), sig,
                                     strlen(sig), 0, err, sizeof err),
                  KHUB_STATUS_SIGNATURE_INVALID);
    ASSERT_CONTAINS(err, "does not verify over metadata.json");
    ASSERT_CONTAINS(err, key.id);
    const char *junk = "{\"algorithm\": \"rsa\"}";
    ASSERT_STATUS(khub__trust_decide(p, "kernels-community", metadata, strlen(metadata), junk,
                                     strlen(junk), 0, err, sizeof err),
                  KHUB_STATUS_SIGNATURE_INVALID);
    ASSERT_CONTAINS(err, "malformed");
    khub__trust_policy_free(p);
    khub__mem_free(sig);
}

TEST_IMPL(decide_unknown_key)
{
    khub_pubkey trusted, other;
    make_key("u1", &trusted);
    make_key("u2", &other);
    char *sig = sign_with(priv, metadata); /* signed by u2 */
    khub_trust_policy *p = policy_with("kernels-community", &trusted);
    char err[KHUB_ERROR_SIZE] = "";
    ASSERT_STATUS(khub__trust_decide(p, "kernels-community", metadata, strlen(metadata), sig,
                                     strlen(sig), 0, err, sizeof err),
                  KHUB_STATUS_KEY_UNKNOWN);
    ASSERT_CONTAINS(err, other.id);
    ASSERT_CONTAINS(err, "does not trust for this organisation");
    /* even a CLI opt-in does not accept a listed org's kernel signed by a stranger */
    ASSERT_STATUS(khub__trust_decide(p, "kernels-community", metadata, strlen(metadata), sig,
                                     strlen(sig), 1, err, sizeof err),
                  KHUB_STATUS_KEY_UNKNOWN);
    khub__trust_policy_free(p);
    khub__mem_free(sig);
}

/* A key trusted for one organisation does not vouch for another: signed by
 * kernels-community's key, an unlisted organisation's kernel still needs the
 * opt-in that an unsigned one needs. */
TEST_IMPL(decide_key_of_other_org)
{
    khub_pubkey key;
    make_key("o", &key);
    char *sig = sign_with(priv, metadata);
    khub_trust_policy *p = policy_with("kernels-community", &key);
    char err[KHUB_ERROR_SIZE] = "";
    ASSERT_STATUS(khub__trust_decide(p, "someone", metadata, strlen(metadata), sig, strlen(sig), 0,
                                     err, sizeof err),
                  KHUB_STATUS_KEY_UNKNOWN);
    ASSERT_CONTAINS(err, "someone: signed with key ");
    ASSERT_CONTAINS(err, key.id);
    ASSERT_CONTAINS(err, "lists no keys for this organisation");
    ASSERT_CONTAINS(err, "that key is trusted for another organisation");
    ASSERT_CONTAINS(err, "opt in with khub_kernel_opts.allow_unsigned or allow_unsigned in");
    ASSERT_OK(khub__trust_decide(p, "someone", metadata, strlen(metadata), sig, strlen(sig), 1, err,
                                 sizeof err));
    khub__trust_policy_free(p);
    /* the same signature with a policy that lists no key at all */
    p = policy_with(NULL, NULL);
    ASSERT_STATUS(khub__trust_decide(p, "someone", metadata, strlen(metadata), sig, strlen(sig), 0,
                                     err, sizeof err),
                  KHUB_STATUS_KEY_UNKNOWN);
    ASSERT_CONTAINS(err, "the policy does not list that key");
    khub__trust_policy_free(p);
    khub__mem_free(sig);
}

TEST_IMPL(decide_revoked_key)
{
    khub_pubkey key;
    make_key("r", &key);
    char *sig = sign_with(priv, metadata);
    char line[96], json[512];
    khub__pubkey_format(&key, line, sizeof line);
    snprintf(json, sizeof json,
             "{\"version\": 1, \"publishers\": {\"kernels-community\": [\"%s\"]}, "
             "\"revoked\": [\"%s\"]}",
             line, key.id);
    khub_trust_policy *p = NULL;
    char err[KHUB_ERROR_SIZE] = "";
    ASSERT_OK(khub__trust_policy_parse(json, strlen(json), &p, err, sizeof err));
    ASSERT_STATUS(khub__trust_decide(p, "kernels-community", metadata, strlen(metadata), sig,
                                     strlen(sig), 1, err, sizeof err),
                  KHUB_STATUS_KEY_REVOKED);
    ASSERT_CONTAINS(err, "revoked key");
    khub__trust_policy_free(p);
    khub__mem_free(sig);
}

TEST_IMPL(decide_unsigned)
{
    khub_pubkey key;
    make_key("n", &key);
    khub_trust_policy *p = policy_with("kernels-community", &key);
    char err[KHUB_ERROR_SIZE] = "";
    /* listed org: signature required, opt-in or not */
    ASSERT_STATUS(khub__trust_decide(p, "kernels-community", metadata, strlen(metadata), NULL, 0, 1,
                                     err, sizeof err),
                  KHUB_STATUS_UNSIGNED);
    ASSERT_CONTAINS(err, "requires a signature");
    /* unlisted org: refused without opt-in, accepted with it */
    ASSERT_STATUS(
        khub__trust_decide(p, "someone", metadata, strlen(metadata), NULL, 0, 0, err, sizeof err),
        KHUB_STATUS_UNSIGNED);
    ASSERT_CONTAINS(err, "opt in with khub_kernel_opts.allow_unsigned or allow_unsigned in");
    ASSERT_OK(
        khub__trust_decide(p, "someone", metadata, strlen(metadata), NULL, 0, 1, err, sizeof err));
    khub__trust_policy_free(p);
    /* opt-in through the policy file, per org */
    const char *json = "{\"version\": 1, \"allow_unsigned\": [\"my-org\"]}";
    ASSERT_OK(khub__trust_policy_parse(json, strlen(json), &p, err, sizeof err));
    ASSERT_OK(
        khub__trust_decide(p, "my-org", metadata, strlen(metadata), NULL, 0, 0, err, sizeof err));
    ASSERT_STATUS(khub__trust_decide(p, "not-my-org", metadata, strlen(metadata), NULL, 0, 0, err,
                                     sizeof err),
                  KHUB_STATUS_UNSIGNED);
    khub__trust_policy_free(p);
}

TEST_IMPL(policy_malformed)
{
    khub_trust_policy *p = NULL;
    char err[KHUB_ERROR_SIZE] = "";
    static const struct {
        const char *json, *msg;
    } cases[] = {
        {"[1,2]", "not a JSON object"},
        {"{\"version\": 2}", "'version' must be 1"},
        {"{\"version\": 1, \"publishers\": []}", "'publishers' must be an object"},
        {"{\"version\": 1, \"publishers\": {\"x\": \"k\"}}", "must be an array"},
        {"{\"version\": 1, \"publishers\": {\"x\": [\"nope\"]}}", "not a key"},
        {"{\"version\": 1, \"revoked\": [\"short\"]}", "'revoked' must be"},
        {"{\"version\": 1, \"allow_unsigned\": 3}", "'allow_unsigned' must be"},
        {"{\"version\": 1,", "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ASSERT_STATUS(
            khub__trust_policy_parse(cases[i].json, strlen(cases[i].json), &p, err, sizeof err),
            KHUB_STATUS_PARSE);
        ASSERT(p == NULL);
        ASSERT_CONTAINS(err, cases[i].msg);
    }
    ASSERT_STATUS(khub__trust_policy_load("/nonexistent/policy.json", &p, err, sizeof err),
                  KHUB_STATUS_NOT_FOUND);
    ASSERT_CONTAINS(err, "/nonexistent/policy.json");
}

TEST_IMPL(sign_file_writes_sig)
{
    khub_pubkey key;
    make_key("f", &key);
    char path[256], sigpath[300];
    snprintf(path, sizeof path, "%s/metadata.json", dir);
    FILE *f = fopen(path, "w");
    fputs(metadata, f);
    fclose(f);
    char err[KHUB_ERROR_SIZE];
    ASSERT_OK(khub__sign_file(priv, path, err, sizeof err));
    snprintf(sigpath, sizeof sigpath, "%s.sig", path);
    f = fopen(sigpath, "r");
    ASSERT(f != NULL);
    char buf[512];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    khub_trust_policy *p = policy_with("acme", &key);
    ASSERT_OK(
        khub__trust_decide(p, "acme", metadata, strlen(metadata), buf, n, 0, err, sizeof err));
    khub__trust_policy_free(p);
    ASSERT_STATUS(khub__sign_file(pub, path, err, sizeof err), KHUB_STATUS_PARSE);
    ASSERT_CONTAINS(err, "not an Ed25519 private key");
}

/* A typo in the policy must not drop a revocation or a signature
 * requirement, and a key named twice must not read one way here and
 * another in jq or Python (issue 10). */
TEST_IMPL(policy_strict_fields)
{
    khub_pubkey key;
    make_key("ps", &key);
    char line[96], json[1024], err[KHUB_ERROR_SIZE] = "";
    khub__pubkey_format(&key, line, sizeof line);
    khub_trust_policy *p = NULL;
    const struct {
        const char *fmt, *msg;
    } cases[] = {
        {"{\"version\": 1, \"publishers\": {\"acme\": [\"%s\"]}, \"revokd\": [\"%.16s\"]}",
         "unknown field \"revokd\""},
        {"{\"version\": 1, \"publisher\": {\"acme\": [\"%s\"]}, \"revoked\": [\"%.16s\"]}",
         "unknown field \"publisher\""},
        {"{\"version\": 1, \"publishers\": {\"acme\": [\"%s\"]}, \"revoked\": [\"%.16s\"], "
         "\"revoked\": []}",
         "duplicate key \"revoked\""},
        {"{\"version\": 1, \"publishers\": {\"acme\": [\"%s\"], \"acme\": []}, "
         "\"revoked\": [\"%.16s\"]}",
         "duplicate key \"acme\""},
        {"{\"version\": 1, \"publishers\": {\"acme\": [\"%s\"]}, \"revoked\": [\"%.16s\"]} "
         "{\"version\": 1}",
         "text after the JSON document"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(json, sizeof json, cases[i].fmt, line, key.id);
        ASSERT_STATUS(khub__trust_policy_parse(json, strlen(json), &p, err, sizeof err),
                      KHUB_STATUS_PARSE);
        ASSERT(p == NULL);
        ASSERT_CONTAINS(err, cases[i].msg);
    }
}

/* An organisation listed with an empty key list is not unlisted: nothing
 * from it loads, opt-in or not. */
TEST_IMPL(policy_org_without_keys)
{
    khub_pubkey key;
    make_key("nk", &key);
    char *sig = sign_with(priv, metadata);
    char line[96], json[512], err[KHUB_ERROR_SIZE] = "";
    khub__pubkey_format(&key, line, sizeof line);
    snprintf(json, sizeof json,
             "{\"version\": 1, \"publishers\": {\"acme\": [], \"other\": [\"%s\"]}, "
             "\"allow_unsigned\": true}",
             line);
    khub_trust_policy *p = NULL;
    ASSERT_OK(khub__trust_policy_parse(json, strlen(json), &p, err, sizeof err));
    ASSERT_STATUS(
        khub__trust_decide(p, "acme", metadata, strlen(metadata), NULL, 0, 1, err, sizeof err),
        KHUB_STATUS_UNSIGNED);
    ASSERT_CONTAINS(err, "acme: the policy lists this organisation with no keys, so nothing from "
                         "it loads");
    ASSERT_STATUS(khub__trust_decide(p, "acme", metadata, strlen(metadata), sig, strlen(sig), 1,
                                     err, sizeof err),
                  KHUB_STATUS_KEY_UNKNOWN);
    ASSERT_CONTAINS(err, "with no keys, so nothing from it loads");
    /* an org the policy does not name still takes the opt-in */
    ASSERT_OK(
        khub__trust_decide(p, "someone", metadata, strlen(metadata), NULL, 0, 0, err, sizeof err));
    khub__trust_policy_free(p);
    khub__mem_free(sig);
}

/* The .sig is read as strictly as the policy: an unknown field or a key
 * named twice makes it malformed, even when the signature verifies. */
TEST_IMPL(sig_strict_fields)
{
    khub_pubkey key;
    make_key("ss", &key);
    char *sig = sign_with(priv, metadata);
    khub_trust_policy *p = policy_with("kernels-community", &key);
    char err[KHUB_ERROR_SIZE] = "", bent[512];
    ASSERT_OK(khub__trust_decide(p, "kernels-community", metadata, strlen(metadata), sig,
                                 strlen(sig), 0, err, sizeof err));
    char *close = strrchr(sig, '}');
    ASSERT(close != NULL);
    *close = '\0';
    snprintf(bent, sizeof bent, "%s, \"comment\": \"hi\"}", sig);
    ASSERT_STATUS(khub__trust_decide(p, "kernels-community", metadata, strlen(metadata), bent,
                                     strlen(bent), 0, err, sizeof err),
                  KHUB_STATUS_SIGNATURE_INVALID);
    ASSERT_CONTAINS(err, "metadata.json.sig is malformed (unknown field \"comment\")");
    snprintf(bent, sizeof bent, "%s, \"key_id\": \"0000000000000000\"}", sig);
    ASSERT_STATUS(khub__trust_decide(p, "kernels-community", metadata, strlen(metadata), bent,
                                     strlen(bent), 0, err, sizeof err),
                  KHUB_STATUS_SIGNATURE_INVALID);
    ASSERT_CONTAINS(err, "malformed (duplicate key \"key_id\"");
    khub__trust_policy_free(p);
    khub__mem_free(sig);
}

static const char real_meta[] =
    "{\"format\": 1, \"name\": \"kernels-community/rmsnorm\", \"version\": \"1.2.0\", "
    "\"major\": 1, \"variant\": \"khub1-cpu-x86_64-linux\", \"abi\": {\"major\": 1, "
    "\"minor\": 0}, \"backend\": {\"type\": \"cpu\", \"archs\": [\"x86_64\"]}, "
    "\"plugins\": [{\"file\": \"r.so\", \"level\": \"generic\", \"cpu_features\": []}], "
    "\"files\": {\"r.so\": "
    "\"0000000000000000000000000000000000000000000000000000000000000000\"}}";

static void write_real_meta(char *path, size_t n)
{
    snprintf(path, n, "%s/metadata.json", dir);
    FILE *f = fopen(path, "w");
    ASSERT(f != NULL);
    fputs(real_meta, f);
    fclose(f);
}

/* The file at path, NUL-terminated, in a static buffer. */
static char *slurp(const char *path, size_t *n)
{
    static char buf[4096];
    FILE *f = fopen(path, "r");
    ASSERT(f != NULL);
    *n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[*n] = '\0';
    return buf;
}

/* khub sign DIR writes a format-2 statement naming repo, version, variant
 * and metadata.json's digest; it verifies, and an edit of either side does
 * not. */
TEST_IMPL(statement_signs_what_was_built)
{
    khub_pubkey key;
    make_key("st", &key);
    char path[256], sigpath[300], err[KHUB_ERROR_SIZE] = "";
    write_real_meta(path, sizeof path);
    ASSERT_OK(khub__sign_metadata(priv, path, err, sizeof err));
    snprintf(sigpath, sizeof sigpath, "%s.sig", path);
    size_t n;
    char *sig = slurp(sigpath, &n);
    khub_sig sg;
    ASSERT_OK(khub__sig_parse_full(sig, n, &sg, err, sizeof err));
    ASSERT_EQ(sg.format, 2);
    ASSERT_STR_EQ(sg.key_id, key.id);
    ASSERT_STR_EQ(sg.stmt.repo, "kernels-community/rmsnorm");
    ASSERT_STR_EQ(sg.stmt.version, "1.2.0");
    ASSERT_STR_EQ(sg.stmt.variant, "khub1-cpu-x86_64-linux");
    char hex[65];
    ASSERT_OK(khub__sha256_hex(real_meta, strlen(real_meta), hex));
    ASSERT_STR_EQ(sg.stmt.metadata_sha256, hex);
    /* the statement text is what is signed */
    char text[1024];
    size_t tn = khub__sig_statement_text(&sg.stmt, text, sizeof text);
    ASSERT(tn > 0);
    ASSERT_OK(khub__sig_verify(&key, text, tn, sg.sig));
    ASSERT_CONTAINS(text, "khub-signed-statement 1\nrepo kernels-community/rmsnorm\n");

    khub_trust_policy *p = policy_with("kernels-community", &key);
    ASSERT_OK(khub__trust_decide(p, "kernels-community", real_meta, strlen(real_meta), sig, n, 0,
                                 err, sizeof err));
    /* metadata.json edited after signing */
    char edited[sizeof real_meta];
    memcpy(edited, real_meta, sizeof real_meta);
    *strstr(edited, "1.2.0") = '0';
    ASSERT_STATUS(khub__trust_decide(p, "kernels-community", edited, strlen(edited), sig, n, 0, err,
                                     sizeof err),
                  KHUB_STATUS_SIGNATURE_INVALID);
    ASSERT_CONTAINS(err, "does not verify over metadata.json (it signs SHA-256");
    /* the statement edited after signing (claims another kernel) */
    char *at = strstr(sig, "kernels-community/rmsnorm");
    ASSERT(at != NULL);
    memcpy(at + strlen("kernels-community/"), "rmsnorX", 7);
    ASSERT_STATUS(khub__trust_decide(p, "kernels-community", real_meta, strlen(real_meta), sig, n,
                                     0, err, sizeof err),
                  KHUB_STATUS_SIGNATURE_INVALID);
    ASSERT_CONTAINS(err, "does not verify over its signed statement");
    khub__trust_policy_free(p);
    /* a statement with a space cannot be signed (it would have two readings) */
    khub_sig_statement bad = {"a/b", "1 0", "v", ""};
    memcpy(bad.metadata_sha256, hex, 65);
    char *out = NULL;
    ASSERT_STATUS(khub__sign_statement(priv, &bad, &out, err, sizeof err), KHUB_STATUS_INVALID_ARG);
    ASSERT(out == NULL);
}

/* A hub serving the validly signed build of another kernel (or variant) of
 * the same organisation is refused by name (issue 10). */
TEST_IMPL(bind_refuses_another_kernel)
{
    char err[KHUB_ERROR_SIZE] = "";
    khub_trust_subject want = {"kernels-community/flash-attn2", NULL, "khub1-cpu-x86_64-linux"};
    khub_trust_subject got = {"kernels-community/rmsnorm", "1.2.0", "khub1-cpu-x86_64-linux"};
    ASSERT_STATUS(khub__trust_bind(&want, &got, NULL, 0, err, sizeof err),
                  KHUB_STATUS_NAME_MISMATCH);
    ASSERT_CONTAINS(err, "kernels-community/flash-attn2: the hub served the signed build of "
                         "another kernel (metadata.json names kernels-community/rmsnorm 1.2.0)");
    ASSERT_CONTAINS(err, "(khub_kernel_opts.allow_name_mismatch loads it anyway)");
    want.repo = "Kernels-Community/RMSNorm"; /* Hub names ignore case */
    ASSERT_OK(khub__trust_bind(&want, &got, NULL, 0, err, sizeof err));
    want.variant = "khub1-cpu-aarch64-linux";
    ASSERT_STATUS(khub__trust_bind(&want, &got, NULL, 0, err, sizeof err),
                  KHUB_STATUS_NAME_MISMATCH);
    ASSERT_CONTAINS(err, "variant khub1-cpu-aarch64-linux holds the signed build of variant "
                         "khub1-cpu-x86_64-linux");
    want.variant = NULL;
    ASSERT_OK(khub__trust_bind(&want, &got, NULL, 0, err, sizeof err));
    /* a statement that names another kernel than its own metadata.json */
    khub_pubkey key;
    make_key("bd", &key);
    khub_sig_statement stmt = {"kernels-community/flash-attn2", "1.2.0", "khub1-cpu-x86_64-linux",
                               ""};
    memset(stmt.metadata_sha256, 'a', 64);
    char *sig = NULL;
    ASSERT_OK(khub__sign_statement(priv, &stmt, &sig, err, sizeof err));
    want.repo = "kernels-community/rmsnorm";
    ASSERT_STATUS(khub__trust_bind(&want, &got, sig, strlen(sig), err, sizeof err),
                  KHUB_STATUS_SIGNATURE_INVALID);
    ASSERT_CONTAINS(err, "the signed statement names kernels-community/flash-attn2 1.2.0");
    khub__mem_free(sig);
}

/* khub__trust_decide_ex judges the digest it is handed as that of the
 * bytes (it is not recomputed), and hands back the signature it parsed;
 * khub__trust_bind_sig on that parse decides as khub__trust_bind on the
 * text. */
TEST_IMPL(decide_ex_parses_and_hashes_once)
{
    khub_pubkey key;
    make_key("dx", &key);
    char path[256], sigpath[300], err[KHUB_ERROR_SIZE] = "";
    write_real_meta(path, sizeof path);
    ASSERT_OK(khub__sign_metadata(priv, path, err, sizeof err));
    snprintf(sigpath, sizeof sigpath, "%s.sig", path);
    size_t n;
    char *sig = slurp(sigpath, &n);
    char hex[65], other[65];
    ASSERT_OK(khub__sha256_hex(real_meta, strlen(real_meta), hex));
    ASSERT_OK(khub__sha256_hex("{}", 2, other));
    khub_trust_policy *p = policy_with("kernels-community", &key);
    khub_trust_input in = {real_meta, strlen(real_meta), hex, sig, n};
    khub_sig sg;
    memset(&sg, 0x5a, sizeof sg);
    ASSERT_OK(khub__trust_decide_ex(p, "kernels-community", &in, 0, &sg, err, sizeof err));
    ASSERT_EQ(sg.format, 2);
    ASSERT_STR_EQ(sg.key_id, key.id);
    ASSERT_STR_EQ(sg.stmt.metadata_sha256, hex);
    /* the digest handed in is the one compared with the statement's */
    in.metadata_sha256 = other;
    ASSERT_STATUS(khub__trust_decide_ex(p, "kernels-community", &in, 0, &sg, err, sizeof err),
                  KHUB_STATUS_SIGNATURE_INVALID);
    char want_msg[200];
    snprintf(want_msg, sizeof want_msg, "metadata.json has %.16s...", other);
    ASSERT_CONTAINS(err, want_msg);
    /* unsigned or malformed: format 0 */
    in.metadata_sha256 = NULL;
    in.sig_json = "{\"algorithm\": \"ed25519\"}";
    in.sig_len = strlen(in.sig_json);
    ASSERT_STATUS(khub__trust_decide_ex(p, "kernels-community", &in, 0, &sg, err, sizeof err),
                  KHUB_STATUS_SIGNATURE_INVALID);
    ASSERT_CONTAINS(err, "metadata.json.sig is malformed");
    ASSERT_EQ(sg.format, 0);
    in.sig_json = NULL;
    in.sig_len = 0;
    ASSERT_OK(khub__trust_decide_ex(p, "someone", &in, 1, &sg, err, sizeof err));
    ASSERT_EQ(sg.format, 0);
    khub__trust_policy_free(p);
    /* the binding on the parse: a statement naming another kernel */
    khub_sig_statement stmt = {"kernels-community/flash-attn2", "1.2.0", "khub1-cpu-x86_64-linux",
                               ""};
    memset(stmt.metadata_sha256, 'a', 64);
    char *other_sig = NULL;
    ASSERT_OK(khub__sign_statement(priv, &stmt, &other_sig, err, sizeof err));
    ASSERT_OK(khub__sig_parse_full(other_sig, strlen(other_sig), &sg, err, sizeof err));
    khub_trust_subject want = {"kernels-community/rmsnorm", NULL, NULL};
    khub_trust_subject got = {"kernels-community/rmsnorm", "1.2.0", "khub1-cpu-x86_64-linux"};
    ASSERT_STATUS(khub__trust_bind_sig(&want, &got, &sg, err, sizeof err),
                  KHUB_STATUS_SIGNATURE_INVALID);
    ASSERT_CONTAINS(err, "the signed statement names kernels-community/flash-attn2 1.2.0");
    ASSERT_OK(khub__trust_bind_sig(&want, &got, NULL, err, sizeof err));
    khub__mem_free(other_sig);
}

#define TEST_LIST(X) \
    X(keygen_files_and_formats) \
    X(sign_and_verify) \
    X(decide_signed_trusted) \
    X(decide_bad_signature) \
    X(decide_unknown_key) \
    X(decide_key_of_other_org) \
    X(decide_revoked_key) \
    X(decide_unsigned) \
    X(policy_malformed) \
    X(sign_file_writes_sig) \
    X(policy_strict_fields) \
    X(policy_org_without_keys) \
    X(sig_strict_fields) \
    X(statement_signs_what_was_built) \
    X(bind_refuses_another_kernel) \
    X(decide_ex_parses_and_hashes_once)
TEST_MAIN(TEST_LIST)
