/*
 * trust.h: Ed25519 signatures over a variant's metadata.json, and the
 * verification policy that says whose signatures count.
 *
 * Formats (docs/trust.md has the full description):
 *   - public key file:  one line "khub-ed25519 <base64 of the 32 raw bytes>"
 *   - private key file: PKCS#8 PEM, mode 0600
 *   - key id:           the first 16 hex digits of SHA-256(raw public key)
 *   - signature file:   metadata.json.sig, JSON
 *                       {"algorithm":"ed25519","key_id":"...","signature":"<base64>"}
 *     over the exact bytes of metadata.json (which lists every file's SHA-256).
 *   - policy file:      JSON
 *       {"version": 1,
 *        "publishers": {"kernels-community": ["khub-ed25519 AAAA...", ...]},
 *        "revoked": ["<key id>" or "khub-ed25519 ..."],
 *        "allow_unsigned": ["my-org"] or true}
 *
 * Decision rule (khub__trust_decide): a revoked key is always refused; an
 * organisation listed in publishers needs a valid signature by one of its
 * keys; an unlisted organisation's kernel needs a valid signature by any
 * listed key, or an explicit opt-in (allow_unsigned for that org or for all,
 * or the caller's allow_unsigned flag). Digests are checked separately and
 * always.
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
KHUB_INTERNAL khub_status khub__key_generate(const char *priv_path, const char *pub_path,
                                             khub_pubkey *out, char *errbuf, size_t errbuf_size);
/* Parses a "khub-ed25519 <base64>" line (trailing newline allowed). */
KHUB_INTERNAL khub_status khub__pubkey_parse(const char *line, khub_pubkey *out);
KHUB_INTERNAL khub_status khub__pubkey_load(const char *path, khub_pubkey *out, char *errbuf,
                                            size_t errbuf_size);
/* Formats key as its one-line text form into buf (>= 64 bytes). */
KHUB_INTERNAL void khub__pubkey_format(const khub_pubkey *key, char *buf, size_t n);

/* Signs data with the private key at priv_path; writes the signature JSON
 * (NUL-terminated, caller frees with free()) to *sig_json. */
KHUB_INTERNAL khub_status khub__sign(const char *priv_path, const void *data, size_t n,
                                     char **sig_json, char *errbuf, size_t errbuf_size);
/* Signs the file at path, writing path + ".sig". */
KHUB_INTERNAL khub_status khub__sign_file(const char *priv_path, const char *path, char *errbuf,
                                          size_t errbuf_size);

/* Parses a signature JSON; key_id receives the key id, sig the 64 bytes. */
KHUB_INTERNAL khub_status khub__sig_parse(const char *sig_json, size_t n,
                                          char key_id[KHUB_KEY_ID_LEN + 1], unsigned char sig[64]);
/* SIGNATURE_INVALID unless sig is key's Ed25519 signature of data. */
KHUB_INTERNAL khub_status khub__sig_verify(const khub_pubkey *key, const void *data, size_t n,
                                           const unsigned char sig[64]);

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
/* Adds a trusted key for an organisation (used by tests and `--trust`). */
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

#endif /* KHUB_HUB_TRUST_H */
