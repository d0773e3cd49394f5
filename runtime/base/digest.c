/* digest.c: SHA-256 through OpenSSL's EVP interface (never hand-written). */
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <openssl/evp.h>

#include "internal.h"

void khub__to_hex(const unsigned char *md, unsigned n, char *hex)
{
    static const char digits[] = "0123456789abcdef";
    for (unsigned i = 0; i < n; i++) {
        hex[2 * i] = digits[md[i] >> 4];
        hex[2 * i + 1] = digits[md[i] & 15];
    }
    hex[2 * n] = '\0';
}

static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;
static const EVP_MD *sha256_fetched;

/* Kept for the life of the process (one reference, never freed): an
 * EVP_MD is immutable and safe to share between threads. */
static void sha256_fetch(void) { sha256_fetched = EVP_MD_fetch(NULL, "SHA2-256", NULL); }

const EVP_MD *khub__sha256_md(void)
{
    pthread_once(&sha256_once, sha256_fetch);
    return sha256_fetched ? sha256_fetched : EVP_sha256();
}

khub_status khub__sha256_hex(const void *data, size_t n, char hex[65])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned md_len = 0;
    if (!EVP_Digest(data, n, md, &md_len, khub__sha256_md(), NULL) || md_len != 32)
        return KHUB_STATUS_INTERNAL;
    khub__to_hex(md, md_len, hex);
    return KHUB_STATUS_OK;
}

khub_status khub__sha256_file_hex(const char *path, char hex[65])
{
    FILE *f = khub__fopen_regular(path, NULL, 0);
    if (!f) return KHUB_STATUS_IO;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    khub_status st = KHUB_STATUS_OK;
    if (!ctx || !EVP_DigestInit_ex(ctx, khub__sha256_md(), NULL)) {
        st = KHUB_STATUS_NOMEM;
        goto fail;
    }
    unsigned char buf[1 << 16];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
        if (!EVP_DigestUpdate(ctx, buf, got)) {
            st = KHUB_STATUS_INTERNAL;
            goto fail;
        }
    }
    if (ferror(f)) {
        st = KHUB_STATUS_IO;
        goto fail;
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned md_len = 0;
    if (!EVP_DigestFinal_ex(ctx, md, &md_len)) {
        st = KHUB_STATUS_INTERNAL;
        goto fail;
    }
    khub__to_hex(md, md_len, hex);
fail:
    EVP_MD_CTX_free(ctx);
    fclose(f);
    return st;
}

bool khub__digest_eq(const char *a, const char *b)
{
    if (!a || !b) return false;
    size_t na = strlen(a), nb = strlen(b);
    if (na != nb) return false;
    unsigned char diff = 0;
    for (size_t i = 0; i < na; i++)
        diff |= (unsigned char)(tolower((unsigned char)a[i]) ^ tolower((unsigned char)b[i]));
    return diff == 0;
}

bool khub__is_sha256_hex(const char *s)
{
    if (!s) return false;
    for (int i = 0; i < 64; i++)
        if (!isxdigit((unsigned char)s[i])) return false;
    return s[64] == '\0';
}
