/*
 * author_sign.c: key generation and signing for kernel authors (the public
 * face of hub/trust.c's signing half, which libkhub shares with
 * verification).
 */
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "author_impl.h"
#include "kernel_build.h"
#include "trust.h"

khub_status khub_author_key_generate(const char *priv_path, const char *pub_path,
                                     khub_author_key *out, char *errbuf, size_t errbuf_size)
{
    if (!priv_path || !pub_path)
        return khub__author_fail(errbuf, errbuf_size, KHUB_STATUS_MISUSE,
                                 "khub_author_key_generate: a path is NULL");
    if (out)
        KHUB_FORWARD_IF_ERROR(NULL, KHUB_AUTHOR_STRUCT(out, khub_author_key, key_id,
                                                       "khub_author_key_generate", "out", errbuf,
                                                       errbuf_size));
    khub_pubkey key;
    char err[KHUB_ERROR_SIZE];
    khub_status st = khub__key_generate(priv_path, pub_path, &key, err, sizeof err);
    if (st != KHUB_STATUS_OK) return khub__author_fail(errbuf, errbuf_size, st, "%s", err);
    if (out) {
        khub__pubkey_format(&key, out->public_key, sizeof out->public_key);
        snprintf(out->key_id, sizeof out->key_id, "%s", key.id);
    }
    return KHUB_STATUS_OK;
}

khub_status khub_author_sign_file(const char *priv_path, const char *path, char *errbuf,
                                  size_t errbuf_size)
{
    if (!priv_path || !path)
        return khub__author_fail(errbuf, errbuf_size, KHUB_STATUS_MISUSE,
                                 "khub_author_sign_file: a path is NULL");
    char err[KHUB_ERROR_SIZE];
    khub_status st = khub__sign_file(priv_path, path, err, sizeof err);
    if (st != KHUB_STATUS_OK) return khub__author_fail(errbuf, errbuf_size, st, "%s", err);
    return KHUB_STATUS_OK;
}

/* Signs DIR/build/<variant>/metadata.json for every variant and repacks each
 * variant archive so it carries the signature. */
khub_status khub_author_sign_build(const char *priv_path, const char *dir,
                                   khub_author_line_fn on_signed, void *ud, char *errbuf,
                                   size_t errbuf_size)
{
    if (!priv_path || !dir)
        return khub__author_fail(errbuf, errbuf_size, KHUB_STATUS_MISUSE,
                                 "khub_author_sign_build: a path is NULL");
    char build[1100], err[KHUB_ERROR_SIZE];
    snprintf(build, sizeof build, "%s/build", dir);
    DIR *d = opendir(build);
    if (!d)
        return khub__author_fail(errbuf, errbuf_size, KHUB_STATUS_NOT_FOUND,
                                 "%s: no build directory (run 'khub build %s' first)", build, dir);
    int signed_n = 0;
    khub_status st = KHUB_STATUS_OK;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char meta[2400];
        snprintf(meta, sizeof meta, "%s/%s/metadata.json", build, e->d_name);
        struct stat sb;
        if (stat(meta, &sb) != 0) continue;
        st = khub__sign_metadata(priv_path, meta, err, sizeof err);
        if (st == KHUB_STATUS_OK) st = khub__variant_pack(build, e->d_name, err, sizeof err);
        if (st != KHUB_STATUS_OK) {
            st = khub__author_fail(errbuf, errbuf_size, st, "%s", err);
            break;
        }
        if (on_signed) on_signed(ud, meta);
        signed_n++;
    }
    closedir(d);
    if (st == KHUB_STATUS_OK && !signed_n)
        st = khub__author_fail(errbuf, errbuf_size, KHUB_STATUS_NOT_FOUND,
                               "%s: no variant with a metadata.json", build);
    return st;
}
