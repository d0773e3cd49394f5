/*
 * trust.h: Ed25519 signatures over a variant's metadata.json, and the
 * verification policy that says whose signatures count.
 *
 * Formats (docs/kernel-format.md, "Signatures", has the full description):
 *   - public key file:  one line "khub-ed25519 <base64 of the 32 raw bytes>"
 *   - private key file: PKCS#8 PEM, mode 0600
 *   - key id:           the first 16 hex digits of SHA-256(raw public key)
 *   - signature file:   metadata.json.sig, JSON, one of two formats:
 *       format 2 (what `khub sign DIR` writes): a signed statement
 *         {"format":2,"algorithm":"ed25519","key_id":"...",
 *          "signed":{"repo":"org/name","version":"1.0.0","variant":"khub1-...",
 *                    "metadata_sha256":"<64 hex>"},
 *          "signature":"<base64>"}
 *         where the signature is over the statement text of
 *         khub__sig_statement_text (domain-separated lines, not JSON, so it
 *         has one reading); metadata.json must hash to metadata_sha256.
 *       format 1 (older signatures, still read; `khub sign FILE` writes it)
 *         {"algorithm":"ed25519","key_id":"...","signature":"<base64>"}
 *         over the exact bytes of metadata.json.
 *     Either way the signature covers metadata.json, which lists every file's
 *     SHA-256 and names the kernel, version and variant; khub__trust_bind
 *     then refuses a build of another kernel or variant than the one asked
 *     for. The commit is not signed: it is made by the hub after the upload
 *     (and would hash the signature itself); khub.lock binds it.
 *   - policy file:      JSON
 *       {"version": 1,
 *        "publishers": {"kernels-community": ["khub-ed25519 AAAA...", ...]},
 *        "revoked": ["<key id>" or "khub-ed25519 ..."],
 *        "allow_unsigned": ["my-org"] or true}
 *     read strictly: an unknown field or a duplicate key anywhere is an
 *     error (a typo must not drop a revocation).
 *
 * Decision rule (khub__trust_decide): a revoked key is always refused; an
 * organisation listed in publishers with no keys loads nothing; one listed
 * with keys needs a valid signature by one of them; an unlisted organisation's kernel needs a valid
 * signature by any listed key, or an explicit opt-in (allow_unsigned for that org or for all, or
 * the caller's allow_unsigned flag). Digests are checked separately and always.
 */
#ifndef KHUB_HUB_TRUST_H
#define KHUB_HUB_TRUST_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

#define KHUB_KEY_ID_LEN 16

typedef struct khub_pubkey {
    unsigned char raw[32];
    char id[KHUB_KEY_ID_LEN + 1];
} khub_pubkey;

typedef struct khub_trust_policy khub_trust_policy;

/* Generates a key pair: private key (PEM, 0600) at priv_path and public key
 * line at pub_path. Refuses to overwrite existing files (EXISTS). */
KHUB_PRIVATE_API khub_status khub__key_generate(const char *priv_path, const char *pub_path,
                                                khub_pubkey *out, char *errbuf, size_t errbuf_size);
/* Parses a "khub-ed25519 <base64>" line (trailing newline allowed). */
KHUB_INTERNAL khub_status khub__pubkey_parse(const char *line, khub_pubkey *out);
KHUB_INTERNAL khub_status khub__pubkey_load(const char *path, khub_pubkey *out, char *errbuf,
                                            size_t errbuf_size);
/* Formats key as its one-line text form into buf (>= 64 bytes). */
KHUB_PRIVATE_API void khub__pubkey_format(const khub_pubkey *key, char *buf, size_t n);

/* Signs data with the private key at priv_path; writes the signature JSON
 * (NUL-terminated, caller frees with khub__mem_free()) to *sig_json. */
KHUB_INTERNAL khub_status khub__sign(const char *priv_path, const void *data, size_t n,
                                     char **sig_json, char *errbuf, size_t errbuf_size);
/* Signs the file at path, writing path + ".sig". */
KHUB_PRIVATE_API khub_status khub__sign_file(const char *priv_path, const char *path, char *errbuf,
                                             size_t errbuf_size);

#define KHUB_SIG_STATEMENT_MAGIC "khub-signed-statement 1"

/* What a format-2 signature signs. Fields are printable ASCII without
 * spaces, quotes or backslashes. */
typedef struct khub_sig_statement {
    char repo[200];           /* "org/name", metadata.json's name */
    char version[32];         /* metadata.json's version */
    char variant[96];         /* metadata.json's variant */
    char metadata_sha256[65]; /* SHA-256 of metadata.json's bytes */
} khub_sig_statement;

typedef struct khub_sig {
    int format; /* 1: signs metadata.json's bytes; 2: signs stmt */
    char key_id[KHUB_KEY_ID_LEN + 1];
    unsigned char sig[64];
    khub_sig_statement stmt; /* format 2 only */
} khub_sig;

/* The exact bytes a format-2 signature signs, into buf; returns their length
 * (0 when buf is too small). */
KHUB_INTERNAL size_t khub__sig_statement_text(const khub_sig_statement *st, char *buf, size_t n);
/* Signs stmt with the private key; *sig_json receives the format-2 JSON
 * (caller frees with khub__mem_free()). INVALID_ARG for a field with spaces etc. */
KHUB_INTERNAL khub_status khub__sign_statement(const char *priv_path,
                                               const khub_sig_statement *stmt, char **sig_json,
                                               char *errbuf, size_t errbuf_size);
/* Signs the metadata.json at path with a format-2 statement (its name,
 * version, variant and digest), writing path + ".sig". METADATA_INVALID
 * when it does not parse. */
KHUB_PRIVATE_API khub_status khub__sign_metadata(const char *priv_path, const char *path,
                                                 char *errbuf, size_t errbuf_size);

/* Parses a signature JSON of either format, strictly (unknown fields,
 * duplicate keys, trailing text: PARSE with the reason in errbuf). */
KHUB_INTERNAL khub_status khub__sig_parse_full(const char *sig_json, size_t n, khub_sig *out,
                                               char *errbuf, size_t errbuf_size);
/* The same, keeping only the key id and the 64 signature bytes. */
KHUB_INTERNAL khub_status khub__sig_parse(const char *sig_json, size_t n,
                                          char key_id[KHUB_KEY_ID_LEN + 1], unsigned char sig[64]);
/* SIGNATURE_INVALID unless sig is key's Ed25519 signature of data. A
 * success is remembered for the rest of the process (hub/sig_memo.c): the
 * same key, signature and data verify again without the curve arithmetic;
 * anything else is verified. Thread-safe. */
KHUB_INTERNAL khub_status khub__sig_verify(const khub_pubkey *key, const void *data, size_t n,
                                           const unsigned char sig[64]);

/* The memo of Ed25519 successes (hub/sig_memo.c). An entry is id =
 * SHA-256(key->raw || sig || data), computed from the bytes judged now. */
#define KHUB_SIG_MEMO_SLOTS 64
KHUB_INTERNAL khub_status khub__sig_memo_id(const khub_pubkey *key, const unsigned char sig[64],
                                            const void *data, size_t n, unsigned char id[32]);
/* True when id verified before in this process. Never waits: false when
 * another thread holds the table. */
KHUB_INTERNAL bool khub__sig_memo_find(const unsigned char id[32]);
/* Records a success (the oldest entry makes room; skipped when another
 * thread holds the table). */
KHUB_INTERNAL void khub__sig_memo_add(const unsigned char id[32]);
typedef struct khub_sig_memo_stats {
    size_t hits;    /* finds that answered true */
    size_t busy;    /* finds and adds that went without the table */
    size_t entries; /* successes held now, <= KHUB_SIG_MEMO_SLOTS */
} khub_sig_memo_stats;
/* For tests: the counts since the last clear; clear empties the memo. */
KHUB_INTERNAL void khub__sig_memo_stats(khub_sig_memo_stats *out);
KHUB_INTERNAL void khub__sig_memo_clear(void);

/* Loads a policy file (hostile JSON: bounded, types checked). */
KHUB_INTERNAL khub_status khub__trust_policy_load(const char *path, khub_trust_policy **out,
                                                  char *errbuf, size_t errbuf_size);
/* Builds a policy from JSON text. */
KHUB_INTERNAL khub_status khub__trust_policy_parse(const char *json, size_t n,
                                                   khub_trust_policy **out, char *errbuf,
                                                   size_t errbuf_size);
/* The empty default policy: no publishers, nothing revoked, no opt-in. */
KHUB_INTERNAL khub_status khub__trust_policy_default(khub_trust_policy **out);
KHUB_INTERNAL void khub__trust_policy_free(khub_trust_policy *p);
/* Adds a trusted key for an organisation (used by tests and `--trust`);
 * key NULL lists the organisation without adding a key. */
KHUB_INTERNAL khub_status khub__trust_policy_add(khub_trust_policy *p, const char *org,
                                                 const khub_pubkey *key);

/* Decides whether metadata (the exact bytes of metadata.json) of a kernel
 * from organisation org may be used. sig_json is the metadata.json.sig text
 * or NULL when absent. allow_unsigned is the caller's opt-in (CLI flag or
 * config). Returns OK, UNSIGNED, KEY_UNKNOWN, KEY_REVOKED or
 * SIGNATURE_INVALID, with a one-line reason in errbuf that names the org and
 * the key id. This runs before metadata.json is parsed any further. */
KHUB_INTERNAL khub_status khub__trust_decide(const khub_trust_policy *p, const char *org,
                                             const void *metadata, size_t metadata_len,
                                             const char *sig_json, size_t sig_len,
                                             int allow_unsigned, char *errbuf, size_t errbuf_size);

/* What khub__trust_decide_ex judges: the exact bytes of metadata.json, the
 * SHA-256 of those bytes when the caller has it already (NULL: computed
 * here; a caller passes only a digest it computed from these bytes), and
 * the metadata.json.sig text (NULL when absent). */
typedef struct khub_trust_input {
    const void *metadata;
    size_t metadata_len;
    const char *metadata_sha256; /* 64 hex digits, or NULL */
    const char *sig_json;
    size_t sig_len;
} khub_trust_input;

/* khub__trust_decide on in, without parsing or hashing anything twice:
 * sig_out (may be NULL) receives the parsed signature whenever it parsed
 * (format 0, zeroed, when unsigned or malformed), for khub__trust_bind_sig
 * and the caller's trust line. Same statuses and messages. */
KHUB_INTERNAL khub_status khub__trust_decide_ex(const khub_trust_policy *p, const char *org,
                                                const khub_trust_input *in, int allow_unsigned,
                                                khub_sig *sig_out, char *errbuf,
                                                size_t errbuf_size);

/* A kernel as asked for (want) or as its signed metadata.json says (got). */
typedef struct khub_trust_subject {
    const char *repo;    /* "org/name" */
    const char *version; /* metadata.json's version; unused in want */
    const char *variant; /* the build variant; NULL in want: not checked */
} khub_trust_subject;

/* After trust was decided and metadata.json parsed: is this the kernel that
 * was asked for? SIGNATURE_INVALID when a format-2 statement (sig_json, may
 * be NULL) names another repo, version or variant than metadata.json does
 * (never to be overridden); NAME_MISMATCH when metadata.json names another
 * repo (case-insensitively) or variant than want (a caller may override
 * this one on the user's explicit request). */
KHUB_INTERNAL khub_status khub__trust_bind(const khub_trust_subject *want,
                                           const khub_trust_subject *got, const char *sig_json,
                                           size_t sig_len, char *errbuf, size_t errbuf_size);
/* The same with the signature already parsed (NULL: unsigned), as
 * khub__trust_decide_ex gives it. */
KHUB_INTERNAL khub_status khub__trust_bind_sig(const khub_trust_subject *want,
                                               const khub_trust_subject *got, const khub_sig *sig,
                                               char *errbuf, size_t errbuf_size);

#endif /* KHUB_HUB_TRUST_H */
