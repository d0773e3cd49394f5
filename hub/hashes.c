/*
 * hashes.c: the content ids the Hub uses, through OpenSSL: the git blob id
 * sha1("blob <len>\0" + content) of regular files, and the id of a Git LFS
 * pointer. SHA-256 of content is runtime/base/digest.c's.
 */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <openssl/evp.h>

#include "hub_impl.h"

khub_status khub__git_blob_sha1_file(const char *path, char hex[41])
{
    FILE *f = khub__fopen_regular(path, NULL, 0);
    if (!f) return KHUB_STATUS_IO;
    struct stat sb;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    khub_status st = KHUB_STATUS_INTERNAL;
    if (fstat(fileno(f), &sb) != 0 || !ctx || !EVP_DigestInit_ex(ctx, EVP_sha1(), NULL)) goto done;
    char head[64];
    int hn = snprintf(head, sizeof head, "blob %lld", (long long)sb.st_size);
    if (!EVP_DigestUpdate(ctx, head, (size_t)hn + 1)) goto done; /* with the NUL */
    unsigned char buf[1 << 16];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0)
        if (!EVP_DigestUpdate(ctx, buf, got)) goto done;
    if (ferror(f)) {
        st = KHUB_STATUS_IO;
        goto done;
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned mdn = 0;
    if (!EVP_DigestFinal_ex(ctx, md, &mdn) || mdn != 20) goto done;
    khub__to_hex(md, mdn, hex);
    st = KHUB_STATUS_OK;
done:
    EVP_MD_CTX_free(ctx);
    fclose(f);
    return st;
}

khub_status khub__git_blob_sha1_buf(const void *data, size_t n, char hex[41])
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    char head[64];
    int hn = snprintf(head, sizeof head, "blob %zu", n);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned mdn = 0;
    int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha1(), NULL) &&
             EVP_DigestUpdate(ctx, head, (size_t)hn + 1) && EVP_DigestUpdate(ctx, data, n) &&
             EVP_DigestFinal_ex(ctx, md, &mdn) && mdn == 20;
    EVP_MD_CTX_free(ctx);
    if (!ok) return KHUB_STATUS_INTERNAL;
    khub__to_hex(md, mdn, hex);
    return KHUB_STATUS_OK;
}
