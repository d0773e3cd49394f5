/*
 * trust.c: Ed25519 keys and signatures (OpenSSL libcrypto; never hand-written
 * crypto): key files, key ids, signing metadata.json and the signed
 * statement, parsing and checking a .sig. The policy that says whose
 * signatures count, and the decision on a variant, are trust_policy.c's.
 * See trust.h for the formats and the decision rule.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include "json_strict.h"
#include "kernel_meta.h"
#include "trust.h"

#define KEY_PREFIX    "khub-ed25519 "
#define MAX_SIG_BYTES 4096

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
    khub_status st = khub__read_file_mem(NULL, path, 256, &text, &n, errbuf, errbuf_size);
    if (st != KHUB_STATUS_OK) return st;
    st = khub__pubkey_parse(text, out);
    khub__mem_free(text);
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

/* A statement field: printable ASCII without space, quote or backslash, so
 * the statement text has one reading and the JSON needs no escapes. */
static bool statement_field_ok(const char *v, size_t cap)
{
    size_t n = strlen(v);
    if (n == 0 || n >= cap) return false;
    for (size_t i = 0; i < n; i++)
        if (v[i] <= ' ' || v[i] > '~' || v[i] == '"' || v[i] == '\\') return false;
    return true;
}

size_t khub__sig_statement_text(const khub_sig_statement *st, char *buf, size_t n)
{
    int w = snprintf(buf, n,
                     KHUB_SIG_STATEMENT_MAGIC "\nrepo %s\nversion %s\nvariant %s\n"
                                              "metadata-sha256 %s\n",
                     st->repo, st->version, st->variant, st->metadata_sha256);
    return w < 0 || (size_t)w >= n ? 0 : (size_t)w;
}

/* Ed25519 signature of data with the private key at priv_path, and the
 * id of its public key. */
static khub_status sign_raw(const char *priv_path, const void *data, size_t n,
                            unsigned char sig[64], char key_id[KHUB_KEY_ID_LEN + 1], char *errbuf,
                            size_t errbuf_size)
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
    size_t sig_len = 64;
    unsigned char raw[32];
    size_t klen = 32;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (ctx && EVP_DigestSignInit(ctx, NULL, NULL, NULL, pkey) == 1 &&
        EVP_DigestSign(ctx, sig, &sig_len, data, n) == 1 && sig_len == 64 &&
        EVP_PKEY_get_raw_public_key(pkey, raw, &klen) && klen == 32) {
        key_id_of(raw, key_id);
        st = KHUB_STATUS_OK;
    } else {
        khub__errbuf(errbuf, errbuf_size, "Ed25519 signing failed");
    }
    EVP_MD_CTX_free(ctx);
    EVP_PKEY_free(pkey);
    return st;
}

khub_status khub__sign(const char *priv_path, const void *data, size_t n, char **sig_json,
                       char *errbuf, size_t errbuf_size)
{
    unsigned char sig[64];
    char key_id[KHUB_KEY_ID_LEN + 1], b64[96];
    KHUB_FORWARD_IF_ERROR(NULL, sign_raw(priv_path, data, n, sig, key_id, errbuf, errbuf_size));
    b64_encode(sig, 64, b64);
    size_t cap = 200;
    *sig_json = khub__mem_alloc(NULL, cap);
    if (!*sig_json) return KHUB_STATUS_NOMEM;
    snprintf(*sig_json, cap,
             "{\"algorithm\": \"ed25519\", \"key_id\": \"%s\", \"signature\": \"%s\"}\n", key_id,
             b64);
    return KHUB_STATUS_OK;
}

/* Writes text to path atomically (temp file + rename). */
static khub_status write_sig(const char *sig_path, const char *text, char *errbuf,
                             size_t errbuf_size)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", sig_path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    bool ok = f && fputs(text, f) >= 0;
    if (f && fclose(f) != 0) ok = false;
    if (!ok || rename(tmp, sig_path) != 0) {
        khub__errbuf(errbuf, errbuf_size, "%s: cannot write signature", sig_path);
        unlink(tmp);
        return KHUB_STATUS_IO;
    }
    return KHUB_STATUS_OK;
}

khub_status khub__sign_file(const char *priv_path, const char *path, char *errbuf,
                            size_t errbuf_size)
{
    char *data = NULL, *sig = NULL;
    size_t n = 0;
    khub_status st = khub__read_file_mem(NULL, path, 64u << 20, &data, &n, errbuf, errbuf_size);
    if (st != KHUB_STATUS_OK) return st;
    st = khub__sign(priv_path, data, n, &sig, errbuf, errbuf_size);
    khub__mem_free(data);
    if (st != KHUB_STATUS_OK) return st;
    char sig_path[4096];
    snprintf(sig_path, sizeof sig_path, "%s.sig", path);
    st = write_sig(sig_path, sig, errbuf, errbuf_size);
    khub__mem_free(sig);
    return st;
}

khub_status khub__sign_statement(const char *priv_path, const khub_sig_statement *stmt,
                                 char **sig_json, char *errbuf, size_t errbuf_size)
{
    *sig_json = NULL;
    char text[1024];
    size_t n = khub__sig_statement_text(stmt, text, sizeof text);
    if (!n || !statement_field_ok(stmt->repo, sizeof stmt->repo) ||
        !statement_field_ok(stmt->version, sizeof stmt->version) ||
        !statement_field_ok(stmt->variant, sizeof stmt->variant) ||
        !khub__is_sha256_hex(stmt->metadata_sha256)) {
        khub__errbuf(errbuf, errbuf_size,
                     "cannot sign: name, version and variant must be printable without spaces or "
                     "quotes");
        return KHUB_STATUS_INVALID_ARG;
    }
    unsigned char sig[64];
    char key_id[KHUB_KEY_ID_LEN + 1];
    KHUB_FORWARD_IF_ERROR(NULL, sign_raw(priv_path, text, n, sig, key_id, errbuf, errbuf_size));
    char b64[96];
    b64_encode(sig, 64, b64);
    size_t cap = 1024;
    *sig_json = khub__mem_alloc(NULL, cap);
    if (!*sig_json) return KHUB_STATUS_NOMEM;
    snprintf(*sig_json, cap,
             "{\"format\": 2, \"algorithm\": \"ed25519\", \"key_id\": \"%s\",\n"
             " \"signed\": {\"repo\": \"%s\", \"version\": \"%s\", \"variant\": \"%s\",\n"
             "            \"metadata_sha256\": \"%s\"},\n"
             " \"signature\": \"%s\"}\n",
             key_id, stmt->repo, stmt->version, stmt->variant, stmt->metadata_sha256, b64);
    return KHUB_STATUS_OK;
}

khub_status khub__sign_metadata(const char *priv_path, const char *path, char *errbuf,
                                size_t errbuf_size)
{
    char *data = NULL, *sig = NULL;
    size_t n = 0;
    KHUB_FORWARD_IF_ERROR(
        NULL, khub__read_file_mem(NULL, path, 4u << 20, &data, &n, errbuf, errbuf_size));
    khub_kmeta *m = khub__mem_alloc(NULL, sizeof *m);
    khub_sig_statement stmt = {0};
    char why[KHUB_ERROR_SIZE] = "";
    khub_status st = m ? khub__kmeta_parse(data, n, m, why, sizeof why) : KHUB_STATUS_NOMEM;
    if (st == KHUB_STATUS_OK) {
        snprintf(stmt.repo, sizeof stmt.repo, "%s", m->name);
        snprintf(stmt.version, sizeof stmt.version, "%s", m->version);
        snprintf(stmt.variant, sizeof stmt.variant, "%s", m->variant);
        khub__sha256_hex(data, n, stmt.metadata_sha256);
        st = khub__sign_statement(priv_path, &stmt, &sig, errbuf, errbuf_size);
    } else {
        khub__errbuf(errbuf, errbuf_size, "%s: %s", path, why);
    }
    khub__mem_free(m);
    khub__mem_free(data);
    if (st == KHUB_STATUS_OK) {
        char sig_path[4096];
        snprintf(sig_path, sizeof sig_path, "%s.sig", path);
        st = write_sig(sig_path, sig, errbuf, errbuf_size);
    }
    khub__mem_free(sig);
    return st;
}

static khub_status parse_statement(const cJSON *j, khub_sig_statement *st, char *errbuf,
                                   size_t errbuf_size)
{
    static const char *const keys[] = {"repo", "version", "variant", "metadata_sha256", NULL};
    struct {
        const char *key;
        char *dst;
        size_t cap;
    } f[] = {{"repo", st->repo, sizeof st->repo},
             {"version", st->version, sizeof st->version},
             {"variant", st->variant, sizeof st->variant},
             {"metadata_sha256", st->metadata_sha256, sizeof st->metadata_sha256}};
    const char *extra = NULL;
    if (!cJSON_IsObject(j) || !khub__json_only_keys(j, keys, &extra)) {
        khub__errbuf(errbuf, errbuf_size,
                     "'signed' must be an object of repo, version, variant, "
                     "metadata_sha256%s%.60s",
                     extra ? "; unknown field " : "", extra ? extra : "");
        return KHUB_STATUS_PARSE;
    }
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, f[i].key);
        if (!cJSON_IsString(v) || !statement_field_ok(v->valuestring, f[i].cap)) {
            khub__errbuf(errbuf, errbuf_size, "signed.%s must be a short printable string",
                         f[i].key);
            return KHUB_STATUS_PARSE;
        }
        memcpy(f[i].dst, v->valuestring, strlen(v->valuestring) + 1);
    }
    if (!strchr(st->repo, '/') || !khub__is_sha256_hex(st->metadata_sha256)) {
        khub__errbuf(errbuf, errbuf_size,
                     "signed.repo must be org/name and "
                     "signed.metadata_sha256 64 hex digits");
        return KHUB_STATUS_PARSE;
    }
    return KHUB_STATUS_OK;
}

khub_status khub__sig_parse_full(const char *sig_json, size_t n, khub_sig *out, char *errbuf,
                                 size_t errbuf_size)
{
    static const char *const keys1[] = {"algorithm", "key_id", "signature", NULL};
    static const char *const keys2[] = {"format", "algorithm", "key_id",
                                        "signed", "signature", NULL};
    memset(out, 0, sizeof *out);
    if (!sig_json || n == 0 || n > MAX_SIG_BYTES) {
        khub__errbuf(errbuf, errbuf_size, "empty or over %d bytes", MAX_SIG_BYTES);
        return KHUB_STATUS_PARSE;
    }
    char why[128];
    cJSON *j = khub__json_parse_strict(sig_json, n, why, sizeof why);
    khub_status st = KHUB_STATUS_PARSE;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
    const cJSON *alg = cJSON_GetObjectItemCaseSensitive(j, "algorithm");
    const cJSON *kid = cJSON_GetObjectItemCaseSensitive(j, "key_id");
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "signature");
    const char *extra = NULL;
    out->format = fmt ? 2 : 1; /* format 1 predates the field */
    if (!j) {
        khub__errbuf(errbuf, errbuf_size, "%s", why);
    } else if (!cJSON_IsObject(j)) {
        khub__errbuf(errbuf, errbuf_size, "not a JSON object");
    } else if (fmt && (!cJSON_IsNumber(fmt) || fmt->valuedouble != 2)) {
        khub__errbuf(errbuf, errbuf_size, "'format' must be 2 (or absent, for format 1)");
    } else if (!khub__json_only_keys(j, out->format == 2 ? keys2 : keys1, &extra)) {
        khub__errbuf(errbuf, errbuf_size, "unknown field \"%.60s\"", extra);
    } else if (!cJSON_IsString(alg) || strcmp(alg->valuestring, "ed25519") != 0) {
        khub__errbuf(errbuf, errbuf_size, "'algorithm' must be \"ed25519\"");
    } else if (!cJSON_IsString(kid) || strlen(kid->valuestring) != KHUB_KEY_ID_LEN) {
        khub__errbuf(errbuf, errbuf_size, "'key_id' must be %d hex digits", KHUB_KEY_ID_LEN);
    } else if (!cJSON_IsString(s) ||
               b64_decode_exact(s->valuestring, strlen(s->valuestring), out->sig, 64) != 0) {
        khub__errbuf(errbuf, errbuf_size, "'signature' must be 64 bytes in base64");
    } else {
        memcpy(out->key_id, kid->valuestring, KHUB_KEY_ID_LEN + 1);
        st = out->format == 2 ? parse_statement(cJSON_GetObjectItemCaseSensitive(j, "signed"),
                                                &out->stmt, errbuf, errbuf_size)
                              : KHUB_STATUS_OK;
    }
    cJSON_Delete(j);
    return st;
}

khub_status khub__sig_parse(const char *sig_json, size_t n, char key_id[KHUB_KEY_ID_LEN + 1],
                            unsigned char sig[64])
{
    khub_sig s;
    khub_status st = khub__sig_parse_full(sig_json, n, &s, NULL, 0);
    if (st == KHUB_STATUS_OK) {
        memcpy(key_id, s.key_id, KHUB_KEY_ID_LEN + 1);
        memcpy(sig, s.sig, 64);
    }
    return st;
}

khub_status khub__sig_verify(const khub_pubkey *key, const void *data, size_t n,
                             const unsigned char sig[64])
{
    /* The memo's id hashes the bytes judged now; only a success is kept
     * (sig_memo.c says why this is as strong as verifying). */
    unsigned char id[32];
    bool have_id = khub__sig_memo_id(key, sig, data, n, id) == KHUB_STATUS_OK;
    if (have_id && khub__sig_memo_find(id)) return KHUB_STATUS_OK;
    EVP_PKEY *pkey = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL, key->raw, 32);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    int ok = pkey && ctx && EVP_DigestVerifyInit(ctx, NULL, NULL, NULL, pkey) == 1 &&
             EVP_DigestVerify(ctx, sig, 64, data, n) == 1;
    EVP_MD_CTX_free(ctx);
    EVP_PKEY_free(pkey);
    if (ok && have_id) khub__sig_memo_add(id);
    return ok ? KHUB_STATUS_OK : KHUB_STATUS_SIGNATURE_INVALID;
}
