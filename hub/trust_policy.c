/*
 * trust_policy.c: the verification policy (whose Ed25519 keys count for
 * which org, revoked keys, the unsigned opt-in), the decision on a
 * variant's metadata.json and .sig under it, and the binding of a signed
 * build to the kernel asked for. Keys and signatures themselves are
 * trust.c's. See trust.h for the formats and the decision rule.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cjson/cJSON.h>

#include "json_strict.h"
#include "parse_memo.h"
#include "trust.h"

#define MAX_POLICY_BYTES (1u << 20)
#define MAX_ORGS         256
#define MAX_KEYS_PER_ORG 16
#define MAX_REVOKED      256

typedef struct trust_org {
    char name[97];
    khub_pubkey keys[MAX_KEYS_PER_ORG];
    size_t n_keys;
    int listed; /* named in publishers, even with no keys: then nothing loads */
    int allow_unsigned;
} trust_org;

struct khub_trust_policy {
    trust_org *orgs; /* [n_orgs], khub__mem_alloc'd */
    size_t n_orgs;
    char revoked[MAX_REVOKED][KHUB_KEY_ID_LEN + 1];
    size_t n_revoked;
    int allow_unsigned_all;
};

/* ======================================================================== */
/* Policy                                                                   */
/* ======================================================================== */

khub_status khub__trust_policy_default(khub_trust_policy **out)
{
    *out = khub__mem_calloc(NULL, 1, sizeof **out); /* no handle: the C library's */
    return *out ? KHUB_STATUS_OK : KHUB_STATUS_NOMEM;
}

void khub__trust_policy_free(khub_trust_policy *p)
{
    if (!p) return;
    khub__mem_free(p->orgs);
    khub__mem_free(p);
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
    trust_org *grown = khub__mem_realloc(NULL, p->orgs, (p->n_orgs + 1) * sizeof *grown);
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
    if (!o || (key && o->n_keys >= MAX_KEYS_PER_ORG)) return KHUB_STATUS_OVERFLOW;
    o->listed = 1;
    if (key) o->keys[o->n_keys++] = *key;
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
        /* Listed with no keys is not unlisted: the policy names the org
         * and trusts none of its keys, so nothing from it loads. */
        if (khub__trust_policy_add(p, org->string, NULL) != KHUB_STATUS_OK) {
            khub__errbuf(errbuf, errbuf_size, "policy: too many organisations or keys");
            return KHUB_STATUS_OVERFLOW;
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
    static const char *const keys[] = {"version", "publishers", "revoked", "allow_unsigned", NULL};
    *out = NULL;
    char why[128];
    const char *extra = NULL;
    cJSON *j = khub__json_parse_strict(json, n, why, sizeof why);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        khub__errbuf(errbuf, errbuf_size, "policy: %s",
                     j || !strcmp(why, "not valid JSON") ? "not a JSON object" : why);
        return KHUB_STATUS_PARSE;
    }
    /* A typo must not drop a revocation or a signature requirement. */
    if (!khub__json_only_keys(j, keys, &extra)) {
        khub__errbuf(errbuf, errbuf_size,
                     "policy: unknown field \"%.60s\" (the fields are version, publishers, "
                     "revoked, allow_unsigned)",
                     extra);
        cJSON_Delete(j);
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

/* A copy of p from the C library's allocator (as every policy is), or
 * NULL on OOM. */
static khub_trust_policy *policy_clone(const khub_trust_policy *p)
{
    khub_trust_policy *c = khub__mem_alloc(NULL, sizeof *c);
    if (!c) return NULL;
    *c = *p;
    c->orgs = p->n_orgs ? khub__mem_alloc(NULL, p->n_orgs * sizeof *c->orgs) : NULL;
    if (p->n_orgs && !c->orgs) {
        khub__mem_free(c);
        return NULL;
    }
    if (p->n_orgs) memcpy(c->orgs, p->orgs, p->n_orgs * sizeof *c->orgs);
    return c;
}

static void *policy_keep(const void *parsed) { return policy_clone(parsed); }

static bool policy_give(const void *kept, void *out)
{
    khub_trust_policy *c = policy_clone(kept);
    *(khub_trust_policy **)out = c;
    return c != NULL;
}

static void policy_drop(void *kept) { khub__trust_policy_free(kept); }

static const khub__memo_kind policy_memo = {"policy", policy_keep, policy_give, policy_drop};

/* The policy is read on every load (a revocation takes effect at the next
 * one) and parsed only when its bytes are not the bytes of a policy parsed
 * before in this process (parse_memo.h). */
khub_status khub__trust_policy_load(const char *path, khub_trust_policy **out, char *errbuf,
                                    size_t errbuf_size)
{
    char *text = NULL;
    size_t n = 0;
    khub_status st =
        khub__read_file_mem(NULL, path, MAX_POLICY_BYTES, &text, &n, errbuf, errbuf_size);
    if (st != KHUB_STATUS_OK) return st;
    if (khub__parse_memo_find(&policy_memo, text, n, out)) {
        khub__mem_free(text);
        return KHUB_STATUS_OK;
    }
    char inner[KHUB_ERROR_SIZE] = "";
    st = khub__trust_policy_parse(text, n, out, inner, sizeof inner);
    if (st == KHUB_STATUS_OK) khub__parse_memo_add(&policy_memo, text, n, *out);
    khub__mem_free(text);
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

/* Format 1 signs metadata.json's bytes; format 2 signs the statement, which
 * names metadata.json's SHA-256. */
static khub_status verify_metadata(const khub_pubkey *key, const khub_sig *sg, const char *org,
                                   const void *metadata, size_t metadata_len,
                                   const char *metadata_sha256, char *errbuf, size_t errbuf_size)
{
    if (sg->format == 1) {
        if (khub__sig_verify(key, metadata, metadata_len, sg->sig) == KHUB_STATUS_OK)
            return KHUB_STATUS_OK;
        khub__errbuf(errbuf, errbuf_size,
                     "%s: signature by key %s does not verify over metadata.json", org, sg->key_id);
        return KHUB_STATUS_SIGNATURE_INVALID;
    }
    char have[65], text[1024];
    if (metadata_sha256)
        snprintf(have, sizeof have, "%s", metadata_sha256);
    else if (khub__sha256_hex(metadata, metadata_len, have) != KHUB_STATUS_OK)
        have[0] = '\0'; /* matches no statement: refused below */
    size_t n = khub__sig_statement_text(&sg->stmt, text, sizeof text);
    if (!n || khub__sig_verify(key, text, n, sg->sig) != KHUB_STATUS_OK) {
        khub__errbuf(errbuf, errbuf_size,
                     "%s: signature by key %s does not verify over its signed statement", org,
                     sg->key_id);
        return KHUB_STATUS_SIGNATURE_INVALID;
    }
    if (!khub__digest_eq(have, sg->stmt.metadata_sha256)) {
        khub__errbuf(errbuf, errbuf_size,
                     "%s: signature by key %s does not verify over metadata.json (it signs "
                     "SHA-256 %.16s..., metadata.json has %.16s...)",
                     org, sg->key_id, sg->stmt.metadata_sha256, have);
        return KHUB_STATUS_SIGNATURE_INVALID;
    }
    return KHUB_STATUS_OK;
}

khub_status khub__trust_decide(const khub_trust_policy *p, const char *org, const void *metadata,
                               size_t metadata_len, const char *sig_json, size_t sig_len,
                               int allow_unsigned, char *errbuf, size_t errbuf_size)
{
    khub_trust_input in = {metadata, metadata_len, NULL, sig_json, sig_len};
    return khub__trust_decide_ex(p, org, &in, allow_unsigned, NULL, errbuf, errbuf_size);
}

/* The parse of metadata.json.sig's bytes, kept per process like the
 * policy's (parse_memo.h): khub_sig is flat, a copy is one memcpy. Only the
 * JSON reading is skipped; the signature is verified (or found in the
 * verdict memo, sig_memo.c) by verify_metadata on every load. */
static void *sig_keep(const void *parsed)
{
    khub_sig *c = khub__mem_alloc(NULL, sizeof *c);
    if (c) memcpy(c, parsed, sizeof *c);
    return c;
}

static bool sig_give(const void *kept, void *out)
{
    memcpy(out, kept, sizeof(khub_sig));
    return true;
}

static const khub__memo_kind sig_memo = {"metadata.json.sig", sig_keep, sig_give, khub__mem_free};

static khub_status sig_parse_memo(const char *json, size_t n, khub_sig *out, char *why,
                                  size_t why_size)
{
    if (khub__parse_memo_find(&sig_memo, json, n, out)) return KHUB_STATUS_OK;
    khub_status st = khub__sig_parse_full(json, n, out, why, why_size);
    if (st == KHUB_STATUS_OK) khub__parse_memo_add(&sig_memo, json, n, out);
    return st;
}

khub_status khub__trust_decide_ex(const khub_trust_policy *p, const char *org,
                                  const khub_trust_input *in, int allow_unsigned, khub_sig *sig_out,
                                  char *errbuf, size_t errbuf_size)
{
    const char *sig_json = in->sig_json;
    khub_sig sg_local, *psg = sig_out ? sig_out : &sg_local;
    if (sig_out) memset(sig_out, 0, sizeof *sig_out);
    const trust_org *o = find_org(p, org);
    int listed = o && o->listed;
    int opted_in = allow_unsigned || p->allow_unsigned_all || (o && o->allow_unsigned);
    if (listed && o->n_keys == 0) {
        khub__errbuf(errbuf, errbuf_size,
                     "%s: the policy lists this organisation with no keys, so nothing from it "
                     "loads (add its keys to publishers.%s, or remove the entry)",
                     org, org);
        return sig_json ? KHUB_STATUS_KEY_UNKNOWN : KHUB_STATUS_UNSIGNED;
    }
    if (!sig_json) {
        if (listed) {
            khub__errbuf(errbuf, errbuf_size,
                         "%s: unsigned, but the policy requires a signature from this "
                         "organisation's keys",
                         org);
            return KHUB_STATUS_UNSIGNED;
        }
        if (!opted_in) {
            khub__errbuf(
                errbuf, errbuf_size,
                "%s: unsigned kernel from an organisation the policy does not list; "
                "opt in with khub_kernel_opts.allow_unsigned or allow_unsigned in the policy",
                org);
            return KHUB_STATUS_UNSIGNED;
        }
        return KHUB_STATUS_OK;
    }
    char why[KHUB_ERROR_SIZE / 2] = "";
    if (sig_parse_memo(sig_json, in->sig_len, psg, why, sizeof why) != KHUB_STATUS_OK) {
        khub__errbuf(errbuf, errbuf_size, "%s: metadata.json.sig is malformed (%s)", org, why);
        if (sig_out) memset(sig_out, 0, sizeof *sig_out);
        return KHUB_STATUS_SIGNATURE_INVALID;
    }
    const khub_sig *sg = psg;
    const char *key_id = sg->key_id;
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
                     "organisation (%s); opt in with khub_kernel_opts.allow_unsigned or "
                     "allow_unsigned in the policy",
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
    return verify_metadata(key, sg, org, in->metadata, in->metadata_len, in->metadata_sha256,
                           errbuf, errbuf_size);
}

/* ======================================================================== */
/* Binding: the signed metadata is the kernel asked for                     */
/* ======================================================================== */

khub_status khub__trust_bind(const khub_trust_subject *want, const khub_trust_subject *got,
                             const char *sig_json, size_t sig_len, char *errbuf, size_t errbuf_size)
{
    khub_sig sg;
    bool parsed =
        sig_json && khub__sig_parse_full(sig_json, sig_len, &sg, NULL, 0) == KHUB_STATUS_OK;
    return khub__trust_bind_sig(want, got, parsed ? &sg : NULL, errbuf, errbuf_size);
}

khub_status khub__trust_bind_sig(const khub_trust_subject *want, const khub_trust_subject *got,
                                 const khub_sig *sig, char *errbuf, size_t errbuf_size)
{
    const khub_sig sg = sig ? *sig : (khub_sig){0};
    if (sig && sg.format == 2 &&
        (strcmp(sg.stmt.repo, got->repo) || strcmp(sg.stmt.version, got->version) ||
         strcmp(sg.stmt.variant, got->variant))) {
        /* The statement signs metadata.json's digest, so the two can only
         * disagree when the signer signed a false statement. */
        khub__errbuf(errbuf, errbuf_size,
                     "%s: the signed statement names %s %s variant %s, but the metadata.json it "
                     "signs names %s %s variant %s",
                     want->repo, sg.stmt.repo, sg.stmt.version, sg.stmt.variant, got->repo,
                     got->version, got->variant);
        return KHUB_STATUS_SIGNATURE_INVALID;
    }
    /* Hub repository names are case-insensitive; variant names are not. */
    if (strcasecmp(want->repo, got->repo) != 0) {
        khub__errbuf(errbuf, errbuf_size,
                     "%s: the hub served the signed build of another kernel (metadata.json names "
                     "%s %s); refusing it (khub_kernel_opts.allow_name_mismatch loads it anyway)",
                     want->repo, got->repo, got->version);
        return KHUB_STATUS_NAME_MISMATCH;
    }
    if (want->variant && strcmp(want->variant, got->variant) != 0) {
        khub__errbuf(errbuf, errbuf_size,
                     "%s: variant %s holds the signed build of variant %s; refusing it "
                     "(khub_kernel_opts.allow_name_mismatch loads it anyway)",
                     want->repo, want->variant, got->variant);
        return KHUB_STATUS_NAME_MISMATCH;
    }
    return KHUB_STATUS_OK;
}
