/*
 * trust.c: Ed25519 keys and signatures (OpenSSL libcrypto; never hand-written
 * crypto) and the verification policy. See trust.h for the formats and the
 * decision rule.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include "trust.h"

#define KEY_PREFIX       "khub-ed25519 "
#define MAX_POLICY_BYTES (1u << 20)
#define MAX_SIG_BYTES    4096
#define MAX_ORGS         256
#define MAX_KEYS_PER_ORG 16
#define MAX_REVOKED      256

typedef struct trust_org {
    char name[97];
    khub_pubkey keys[MAX_KEYS_PER_ORG];
    size_t n_keys;
    int allow_unsigned;
} trust_org;

struct khub_trust_policy {
    trust_org *orgs; /* [n_orgs], malloc'd */
    size_t n_orgs;
    char revoked[MAX_REVOKED][KHUB_KEY_ID_LEN + 1];
    size_t n_revoked;
    int allow_unsigned_all;
};

/* ======================================================================== */
/* Base64 and key ids                                                       */
/* ======================================================================== */

static void b64_encode(const unsigned char *in, size_t n, char *out)
{
    EVP_EncodeBlock((unsigned char *)out, in, (int)n);
}

/* Decodes exactly `want` bytes from a base64 text of length n; -1 on error. */
static int b64_decode_exact(const char *in, size_t n, unsigned char *out, size_t want)
{
    if (n == 0 || n % 4 != 0 || n > 4 * ((want + 2) / 3)) return -1;
    unsigned char tmp[128];
    if (n / 4 * 3 > sizeof tmp) return -1;
    int len = EVP_DecodeBlock(tmp, (const unsigned char *)in, (int)n);
    if (len < 0) return -1;
    size_t pad = (in[n - 1] == '=') + (in[n - 2] == '=');
    if ((size_t)len - pad != want) return -1;
    memcpy(out, tmp, want);
    return 0;
}

static void key_id_of(const unsigned char raw[32], char id[KHUB_KEY_ID_LEN + 1])
{
    char hex[65];
    khub__sha256_hex(raw, 32, hex);
    memcpy(id, hex, KHUB_KEY_ID_LEN);
    id[KHUB_KEY_ID_LEN] = '\0';
}

/* ======================================================================== */
/* Keys                                                                     */
/* ======================================================================== */

khub_status khub__pubkey_parse(const char *line, khub_pubkey *out)
{
    size_t plen = strlen(KEY_PREFIX);
    if (!line || strncmp(line, KEY_PREFIX, plen) != 0) return KHUB_STATUS_PARSE;
    const char *b = line + plen;
    size_t n = strcspn(b, " \t\r\n");
    if (b64_decode_exact(b, n, out->raw, 32) != 0) return KHUB_STATUS_PARSE;
    const char *rest = b + n;
    while (*rest == ' ' || *rest == '\t' || *rest == '\r' || *rest == '\n') rest++;
    if (*rest) return KHUB_STATUS_PARSE;
    key_id_of(out->raw, out->id);
    return KHUB_STATUS_OK;
}

void khub__pubkey_format(const khub_pubkey *key, char *buf, size_t n)
{
    char b64[64];
    b64_encode(key->raw, 32, b64);
    snprintf(buf, n, KEY_PREFIX "%s", b64);
}

khub_status khub__pubkey_load(const char *path, khub_pubkey *out, char *errbuf, size_t errbuf_size)
{
    char *text = NULL;
    size_t n = 0;
    khub_status st = khub__read_file(path, 256, &text, &n, errbuf, errbuf_size);
    if (st != KHUB_STATUS_OK) return st;
    st = khub__pubkey_parse(text, out);
    free(text);
    if (st != KHUB_STATUS_OK)
        khub__errbuf(errbuf, errbuf_size,
                     "%s: not a khub public key (want one line 'khub-ed25519 <base64>')", path);
    return st;
}

/* Opens path for writing only if it does not exist yet. */
static FILE *create_new(const char *path, mode_t mode, char *errbuf, size_t errbuf_size,
                        khub_status *st)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) {
        *st = errno == EEXIST ? KHUB_STATUS_EXISTS : KHUB_STATUS_IO;
        khub__errbuf(errbuf, errbuf_size, "%s: %s", path,
                     errno == EEXIST ? "already exists (refusing to overwrite a key)"
                                     : strerror(errno));
        return NULL;
    }
    return fdopen(fd, "w");
}

khub_status khub__key_generate(const char *priv_path, const char *pub_path, khub_pubkey *out,
                               char *errbuf, size_t errbuf_size)
{
    khub_status st = KHUB_STATUS_OK;
    EVP_PKEY *pkey = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
    if (!pkey) {
        khub__errbuf(errbuf, errbuf_size, "Ed25519 key generation failed");
        return KHUB_STATUS_INTERNAL;
    }
    khub_pubkey key;
    size_t len = 32;
    FILE *fp = NULL, *fq = NULL;
    if (!EVP_PKEY_get_raw_public_key(pkey, key.raw, &len) || len != 32) {
        st = KHUB_STATUS_INTERNAL;
        goto fail;
    }
    key_id_of(key.raw, key.id);
    fp = create_new(priv_path, 0600, errbuf, errbuf_size, &st);
    if (!fp) goto fail;
    fq = create_new(pub_path, 0644, errbuf, errbuf_size, &st);
    if (!fq) {
        fclose(fp);
        fp = NULL;
        unlink(priv_path);
        goto fail;
    }
    char line[96];
    khub__pubkey_format(&key, line, sizeof line);
    if (!PEM_write_PrivateKey(fp, pkey, NULL, NULL, 0, NULL, NULL) ||
        fprintf(fq, "%s\n", line) < 0) {
        khub__errbuf(errbuf, errbuf_size, "writing %s / %s failed", priv_path, pub_path);
        st = KHUB_STATUS_IO;
    }
    if (out) *out = key;
fail:
    if (fp && fclose(fp) != 0) st = KHUB_STATUS_IO;
    if (fq && fclose(fq) != 0) st = KHUB_STATUS_IO;
    EVP_PKEY_free(pkey);
    return st;
}

/* ======================================================================== */
/* Signatures                                                               */
/* ======================================================================== */

khub_status khub__sign(const char *priv_path, const void *data, size_t n, char **sig_json,
                       char *errbuf, size_t errbuf_size)
{
    char why[KHUB_ERROR_SIZE];
    FILE *f = khub__fopen_regular(priv_path, why, sizeof why);
    if (!f) {
        khub__errbuf(errbuf, errbuf_size, "private key %s", why);
        return KHUB_STATUS_IO;
    }
    EVP_PKEY *pkey = PEM_read_PrivateKey(f, NULL, NULL, NULL);
    fclose(f);
    if (!pkey || EVP_PKEY_get_base_id(pkey) != EVP_PKEY_ED25519) {
        EVP_PKEY_free(pkey);
        khub__errbuf(errbuf, errbuf_size, "%s: not an Ed25519 private key", priv_path);
        return KHUB_STATUS_PARSE;
    }
    khub_status st = KHUB_STATUS_INTERNAL;
    unsigned char sig[64];
    size_t sig_len = sizeof sig;
    khub_pubkey key;
    size_t klen = 32;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (ctx && EVP_DigestSignInit(ctx, NULL, NULL, NULL, pkey) == 1 &&
        EVP_DigestSign(ctx, sig, &sig_len, data, n) == 1 && sig_len == 64 &&
        EVP_PKEY_get_raw_public_key(pkey, key.raw, &klen) && klen == 32) {
        key_id_of(key.raw, key.id);
        char b64[96];
        b64_encode(sig, 64, b64);
        size_t cap = 200;
        *sig_json = malloc(cap);
        if (*sig_json) {
            snprintf(*sig_json, cap,
                     "{\"algorithm\": \"ed25519\", \"key_id\": \"%s\", \"signature\": \"%s\"}\n",
                     key.id, b64);
            st = KHUB_STATUS_OK;
        } else {
            st = KHUB_STATUS_NOMEM;
        }
    } else {
        khub__errbuf(errbuf, errbuf_size, "Ed25519 signing failed");
    }
    EVP_MD_CTX_free(ctx);
    EVP_PKEY_free(pkey);
    return st;
}

khub_status khub__sign_file(const char *priv_path, const char *path, char *errbuf,
                            size_t errbuf_size)
{
    char *data = NULL, *sig = NULL;
    size_t n = 0;
    khub_status st = khub__read_file(path, 64u << 20, &data, &n, errbuf, errbuf_size);
    if (st != KHUB_STATUS_OK) return st;
    st = khub__sign(priv_path, data, n, &sig, errbuf, errbuf_size);
    free(data);
    if (st != KHUB_STATUS_OK) return st;
    char sig_path[4096];
    snprintf(sig_path, sizeof sig_path, "%s.sig", path);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", sig_path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f || fputs(sig, f) < 0 || fclose(f) != 0 || rename(tmp, sig_path) != 0) {
        khub__errbuf(errbuf, errbuf_size, "%s: cannot write signature", sig_path);
        unlink(tmp);
        st = KHUB_STATUS_IO;
    }
    free(sig);
    return st;
}

khub_status khub__sig_parse(const char *sig_json, size_t n, char key_id[KHUB_KEY_ID_LEN + 1],
                            unsigned char sig[64])
{
    if (!sig_json || n == 0 || n > MAX_SIG_BYTES) return KHUB_STATUS_PARSE;
    cJSON *j = cJSON_ParseWithLength(sig_json, n);
    khub_status st = KHUB_STATUS_PARSE;
    const cJSON *alg = cJSON_GetObjectItemCaseSensitive(j, "algorithm");
    const cJSON *kid = cJSON_GetObjectItemCaseSensitive(j, "key_id");
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "signature");
    if (cJSON_IsString(alg) && strcmp(alg->valuestring, "ed25519") == 0 && cJSON_IsString(kid) &&
        strlen(kid->valuestring) == KHUB_KEY_ID_LEN && cJSON_IsString(s) &&
        b64_decode_exact(s->valuestring, strlen(s->valuestring), sig, 64) == 0) {
        memcpy(key_id, kid->valuestring, KHUB_KEY_ID_LEN + 1);
        st = KHUB_STATUS_OK;
    }
    cJSON_Delete(j);
    return st;
}

khub_status khub__sig_verify(const khub_pubkey *key, const void *data, size_t n,
                             const unsigned char sig[64])
{
    EVP_PKEY *pkey = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL, key->raw, 32);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    int ok = pkey && ctx && EVP_DigestVerifyInit(ctx, NULL, NULL, NULL, pkey) == 1 &&
             EVP_DigestVerify(ctx, sig, 64, data, n) == 1;
    EVP_MD_CTX_free(ctx);
    EVP_PKEY_free(pkey);
    return ok ? KHUB_STATUS_OK : KHUB_STATUS_SIGNATURE_INVALID;
}

/* ======================================================================== */
/* Policy                                                                   */
/* ======================================================================== */

khub_status khub__trust_policy_default(khub_trust_policy **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? KHUB_STATUS_OK : KHUB_STATUS_NOMEM;
}

void khub__trust_policy_free(khub_trust_policy *p)
{
    if (!p) return;
    free(p->orgs);
    free(p);
}

static trust_org *find_org(const khub_trust_policy *p, const char *org)
{
    for (size_t i = 0; i < p->n_orgs; i++)
        if (strcmp(p->orgs[i].name, org) == 0) return &p->orgs[i];
    return NULL;
}

static trust_org *get_org(khub_trust_policy *p, const char *org)
{
    trust_org *o = find_org(p, org);
    if (o) return o;
    if (p->n_orgs >= MAX_ORGS || strlen(org) >= sizeof o->name) return NULL;
    trust_org *grown = realloc(p->orgs, (p->n_orgs + 1) * sizeof *grown);
    if (!grown) return NULL;
    p->orgs = grown;
    o = &p->orgs[p->n_orgs++];
    memset(o, 0, sizeof *o);
    snprintf(o->name, sizeof o->name, "%s", org);
    return o;
}

khub_status khub__trust_policy_add(khub_trust_policy *p, const char *org, const khub_pubkey *key)
{
    trust_org *o = get_org(p, org);
    if (!o || o->n_keys >= MAX_KEYS_PER_ORG) return KHUB_STATUS_OVERFLOW;
    o->keys[o->n_keys++] = *key;
    return KHUB_STATUS_OK;
}

static khub_status parse_publishers(khub_trust_policy *p, const cJSON *pubs, char *errbuf,
                                    size_t errbuf_size)
{
    if (!pubs) return KHUB_STATUS_OK;
    if (!cJSON_IsObject(pubs)) {
        khub__errbuf(errbuf, errbuf_size, "policy: 'publishers' must be an object");
        return KHUB_STATUS_PARSE;
    }
    const cJSON *org;
    cJSON_ArrayForEach(org, pubs)
    {
        if (!cJSON_IsArray(org) || !org->string || !org->string[0]) {
            khub__errbuf(errbuf, errbuf_size,
                         "policy: publishers.%s must be an array of public keys",
                         org->string ? org->string : "?");
            return KHUB_STATUS_PARSE;
        }
        const cJSON *k;
        cJSON_ArrayForEach(k, org)
        {
            khub_pubkey key;
            if (!cJSON_IsString(k) || khub__pubkey_parse(k->valuestring, &key) != KHUB_STATUS_OK) {
                khub__errbuf(errbuf, errbuf_size,
                             "policy: publishers.%s: not a key (want 'khub-ed25519 <base64>')",
                             org->string);
                return KHUB_STATUS_PARSE;
            }
            if (khub__trust_policy_add(p, org->string, &key) != KHUB_STATUS_OK) {
                khub__errbuf(errbuf, errbuf_size, "policy: too many organisations or keys");
                return KHUB_STATUS_OVERFLOW;
            }
        }
    }
    return KHUB_STATUS_OK;
}

static khub_status parse_revoked(khub_trust_policy *p, const cJSON *rev, char *errbuf,
                                 size_t errbuf_size)
{
    if (!rev) return KHUB_STATUS_OK;
    const cJSON *r;
    if (!cJSON_IsArray(rev)) goto bad;
    cJSON_ArrayForEach(r, rev)
    {
        if (!cJSON_IsString(r) || p->n_revoked >= MAX_REVOKED) goto bad;
        khub_pubkey key;
        const char *id = r->valuestring;
        if (khub__pubkey_parse(id, &key) == KHUB_STATUS_OK)
            id = key.id;
        else if (strlen(id) != KHUB_KEY_ID_LEN)
            goto bad;
        snprintf(p->revoked[p->n_revoked++], KHUB_KEY_ID_LEN + 1, "%s", id);
    }
    return KHUB_STATUS_OK;
bad:
    khub__errbuf(errbuf, errbuf_size,
                 "policy: 'revoked' must be an array of key ids (16 hex) or public keys");
    return KHUB_STATUS_PARSE;
}

static khub_status parse_allow_unsigned(khub_trust_policy *p, const cJSON *a, char *errbuf,
                                        size_t errbuf_size)
{
    if (!a) return KHUB_STATUS_OK;
    if (cJSON_IsBool(a)) {
        p->allow_unsigned_all = cJSON_IsTrue(a);
        return KHUB_STATUS_OK;
    }
    const cJSON *o;
    if (!cJSON_IsArray(a)) goto bad;
    cJSON_ArrayForEach(o, a)
    {
        if (!cJSON_IsString(o) || !o->valuestring[0]) goto bad;
        trust_org *org = get_org(p, o->valuestring);
        if (!org) return KHUB_STATUS_OVERFLOW;
        org->allow_unsigned = 1;
    }
    return KHUB_STATUS_OK;
bad:
    khub__errbuf(errbuf, errbuf_size,
                 "policy: 'allow_unsigned' must be true, false or an array of organisations");
    return KHUB_STATUS_PARSE;
}

khub_status khub__trust_policy_parse(const char *json, size_t n, khub_trust_policy **out,
                                     char *errbuf, size_t errbuf_size)
{
    *out = NULL;
    cJSON *j = cJSON_ParseWithLength(json, n);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        khub__errbuf(errbuf, errbuf_size, "policy: not a JSON object");
        return KHUB_STATUS_PARSE;
    }
    khub_trust_policy *p = NULL;
    khub_status st = khub__trust_policy_default(&p);
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(j, "version");
    if (st == KHUB_STATUS_OK && (!cJSON_IsNumber(ver) || ver->valuedouble != 1)) {
        khub__errbuf(errbuf, errbuf_size, "policy: 'version' must be 1");
        st = KHUB_STATUS_PARSE;
    }
    if (st == KHUB_STATUS_OK)
        st = parse_publishers(p, cJSON_GetObjectItemCaseSensitive(j, "publishers"), errbuf,
                              errbuf_size);
    if (st == KHUB_STATUS_OK)
        st = parse_revoked(p, cJSON_GetObjectItemCaseSensitive(j, "revoked"), errbuf, errbuf_size);
    if (st == KHUB_STATUS_OK)
        st = parse_allow_unsigned(p, cJSON_GetObjectItemCaseSensitive(j, "allow_unsigned"), errbuf,
                                  errbuf_size);
    cJSON_Delete(j);
    if (st != KHUB_STATUS_OK) {
        khub__trust_policy_free(p);
        return st;
    }
    *out = p;
    return KHUB_STATUS_OK;
}

khub_status khub__trust_policy_load(const char *path, khub_trust_policy **out, char *errbuf,
                                    size_t errbuf_size)
{
    char *text = NULL;
    size_t n = 0;
    khub_status st = khub__read_file(path, MAX_POLICY_BYTES, &text, &n, errbuf, errbuf_size);
    if (st != KHUB_STATUS_OK) return st;
    char inner[KHUB_ERROR_SIZE] = "";
    st = khub__trust_policy_parse(text, n, out, inner, sizeof inner);
    free(text);
    if (st != KHUB_STATUS_OK) khub__errbuf(errbuf, errbuf_size, "%s: %s", path, inner);
    return st;
}

/* ======================================================================== */
/* Decision                                                                 */
/* ======================================================================== */

static int is_revoked(const khub_trust_policy *p, const char *key_id)
{
    for (size_t i = 0; i < p->n_revoked; i++)
        if (strcmp(p->revoked[i], key_id) == 0) return 1;
    return 0;
}

/* The key with this id among the org's keys (or all orgs' keys when org is
 * NULL), or NULL. */
static const khub_pubkey *find_key(const khub_trust_policy *p, const trust_org *org,
                                   const char *key_id)
{
    for (size_t i = 0; i < p->n_orgs; i++) {
        const trust_org *o = &p->orgs[i];
        if (org && o != org) continue;
        for (size_t k = 0; k < o->n_keys; k++)
            if (strcmp(o->keys[k].id, key_id) == 0) return &o->keys[k];
    }
    return NULL;
}

khub_status khub__trust_decide(const khub_trust_policy *p, const char *org, const void *metadata,
                               size_t metadata_len, const char *sig_json, size_t sig_len,
                               int allow_unsigned, char *errbuf, size_t errbuf_size)
{
    const trust_org *o = find_org(p, org);
    int listed = o && o->n_keys > 0;
    int opted_in = allow_unsigned || p->allow_unsigned_all || (o && o->allow_unsigned);
    if (!sig_json) {
        if (listed) {
            khub__errbuf(errbuf, errbuf_size,
                         "%s: unsigned, but the policy requires a signature from this "
                         "organisation's keys",
                         org);
            return KHUB_STATUS_UNSIGNED;
        }
        if (!opted_in) {
            khub__errbuf(errbuf, errbuf_size,
                         "%s: unsigned kernel from an organisation the policy does not list; "
                         "opt in with --allow-unsigned or allow_unsigned in the policy",
                         org);
            return KHUB_STATUS_UNSIGNED;
        }
        return KHUB_STATUS_OK;
    }
    char key_id[KHUB_KEY_ID_LEN + 1];
    unsigned char sig[64];
    if (khub__sig_parse(sig_json, sig_len, key_id, sig) != KHUB_STATUS_OK) {
        khub__errbuf(errbuf, errbuf_size, "%s: metadata.json.sig is malformed", org);
        return KHUB_STATUS_SIGNATURE_INVALID;
    }
    if (is_revoked(p, key_id)) {
        khub__errbuf(errbuf, errbuf_size, "%s: signed with revoked key %s", org, key_id);
        return KHUB_STATUS_KEY_REVOKED;
    }
    if (!listed) {
        /* A key vouches only for the organisations it is trusted for: a
         * signature on an unlisted organisation's kernel, even by a key the
         * policy trusts elsewhere, is judged as no signature. */
        if (opted_in) return KHUB_STATUS_OK; /* unsigned would pass too */
        khub__errbuf(errbuf, errbuf_size,
                     "%s: signed with key %s, but the policy lists no keys for this "
                     "organisation (%s); opt in with --allow-unsigned or allow_unsigned in the "
                     "policy",
                     org, key_id,
                     find_key(p, NULL, key_id) ? "that key is trusted for another organisation"
                                               : "the policy does not list that key");
        return KHUB_STATUS_KEY_UNKNOWN;
    }
    const khub_pubkey *key = find_key(p, o, key_id);
    if (!key) {
        khub__errbuf(errbuf, errbuf_size,
                     "%s: signed with key %s, which the policy does not trust for this "
                     "organisation",
                     org, key_id);
        return KHUB_STATUS_KEY_UNKNOWN;
    }
    if (khub__sig_verify(key, metadata, metadata_len, sig) != KHUB_STATUS_OK) {
        khub__errbuf(errbuf, errbuf_size,
                     "%s: signature by key %s does not verify over metadata.json", org, key_id);
        return KHUB_STATUS_SIGNATURE_INVALID;
    }
    return KHUB_STATUS_OK;
}
