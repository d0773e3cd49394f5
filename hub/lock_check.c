/*
 * lock_check.c: a cached variant folder checked against its khub.lock
 * entry (lockfile.h): every file hashed (khub__lock_check_dir, khub sync),
 * or, on a load, the names and metadata.json's digest before the parse
 * (khub__lock_check_names) and the parsed table's digests after it
 * (khub__lock_check_table). The lock format itself is lockfile.c's.
 */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dir_list.h"
#include "kernel_meta.h"
#include "lockfile.h"

static bool is_regular(const char *path)
{
    struct stat sb;
    return lstat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* No name in dir but the locked files and metadata.json.sig: the names of
 * listed (NULL: dir is listed here). */
static khub_status check_extra(const khub_lock_variant *v, const char *dir,
                               const khub__dir_list *listed, const char *label, char *errbuf,
                               size_t errbuf_size)
{
    khub__dir_list own;
    if (!listed && khub__dir_list_read(NULL, dir, &own) != KHUB_STATUS_OK) {
        khub__errbuf(errbuf, errbuf_size, "%s: cannot read %s", label, dir);
        return KHUB_STATUS_IO;
    }
    const khub__dir_list *l = listed ? listed : &own;
    khub_status st = KHUB_STATUS_OK;
    for (size_t k = 0; st == KHUB_STATUS_OK && k < l->count; k++) {
        const char *nm = khub__dir_list_name(l, k);
        if (!strcmp(nm, "metadata.json.sig")) continue;
        bool known = false;
        for (size_t i = 0; i < v->n_files && !known; i++) known = !strcmp(v->files[i].name, nm);
        if (!known) {
            khub__errbuf(errbuf, errbuf_size,
                         "%s variant %s: %s is in %s but not in khub.lock; "
                         "refusing the variant",
                         label, v->name, nm, dir);
            st = KHUB_STATUS_LOCK_MISMATCH;
        }
    }
    if (!listed) khub__dir_list_free(&own);
    return st;
}

/* khub__lock_check_dir, and without hashing the files other than
 * metadata.json when !hash (khub__lock_check_names). listed (may be NULL):
 * dir's names, listed by the caller; a file it shows as regular needs no
 * lstat of its own. */
static khub_status check_dir(const khub_lock_variant *v, const char *dir,
                             const khub__dir_list *listed, const char *meta_sha256, bool hash,
                             const char *label, char *errbuf, size_t errbuf_size)
{
    for (size_t i = 0; i < v->n_files; i++) {
        char path[4096], got[65];
        snprintf(path, sizeof path, "%s/%s", dir, v->files[i].name);
        if (meta_sha256 && !strcmp(v->files[i].name, "metadata.json")) {
            /* The caller's digest of the bytes it read and will parse: a
             * second read from dir would check other bytes than those. */
            snprintf(got, sizeof got, "%s", meta_sha256);
        } else if (!khub__dir_list_regular(listed, v->files[i].name) && !is_regular(path) &&
                   access(path, R_OK) != 0) {
            khub__errbuf(errbuf, errbuf_size,
                         "%s variant %s: locked file %s is missing from %s; "
                         "run khub sync",
                         label, v->name, v->files[i].name, dir);
            return KHUB_STATUS_LOCK_MISMATCH;
        } else if (!hash) {
            continue;
        } else if (khub__sha256_file_hex(path, got) != KHUB_STATUS_OK) {
            khub__errbuf(errbuf, errbuf_size, "%s variant %s: cannot read %s", label, v->name,
                         path);
            return KHUB_STATUS_IO;
        }
        if (!khub__digest_eq(got, v->files[i].sha256)) {
            khub__errbuf(errbuf, errbuf_size,
                         "%s variant %s: %s has SHA-256 %s, khub.lock says "
                         "%s; the cached copy was changed: delete it and run khub sync",
                         label, v->name, v->files[i].name, got, v->files[i].sha256);
            return KHUB_STATUS_LOCK_MISMATCH;
        }
    }
    return check_extra(v, dir, listed, label, errbuf, errbuf_size);
}

khub_status khub__lock_check_dir(const khub_lock_variant *v, const char *dir,
                                 const char *meta_sha256, const char *label, char *errbuf,
                                 size_t errbuf_size)
{
    return check_dir(v, dir, NULL, meta_sha256, true, label, errbuf, errbuf_size);
}

khub_status khub__lock_check_names(const khub_lock_variant *v, const char *dir,
                                   const khub__dir_list *listed, const char *meta_sha256,
                                   const char *label, char *errbuf, size_t errbuf_size)
{
    if (!meta_sha256) {
        khub__errbuf(errbuf, errbuf_size, "%s variant %s: no digest of metadata.json to check",
                     label, v->name);
        return KHUB_STATUS_INVALID_ARG;
    }
    return check_dir(v, dir, listed, meta_sha256, false, label, errbuf, errbuf_size);
}

static const khub_lock_file *locked_file(const khub_lock_variant *v, const char *name)
{
    for (size_t i = 0; i < v->n_files; i++)
        if (!strcmp(v->files[i].name, name)) return &v->files[i];
    return NULL;
}

khub_status khub__lock_check_table(const khub_lock_variant *v, const khub_kmeta *m,
                                   const char *label, char *errbuf, size_t errbuf_size)
{
    for (size_t i = 0; i < m->n_files; i++) {
        const khub_lock_file *lf = locked_file(v, m->files[i].name);
        if (!lf || !khub__digest_eq(lf->sha256, m->files[i].sha256)) {
            khub__errbuf(errbuf, errbuf_size,
                         "%s variant %s: metadata.json states SHA-256 %s for %s, khub.lock %s%s; "
                         "the lock does not match the build it pins: run khub lock again",
                         label, v->name, m->files[i].sha256, m->files[i].name,
                         lf ? "says " : "does not pin it", lf ? lf->sha256 : "");
            return KHUB_STATUS_LOCK_MISMATCH;
        }
    }
    for (size_t i = 0; i < v->n_files; i++) {
        const char *nm = v->files[i].name;
        if (strcmp(nm, "metadata.json") && !khub__kmeta_digest(m, nm)) {
            khub__errbuf(errbuf, errbuf_size,
                         "%s variant %s: khub.lock pins %s, which metadata.json does not list; "
                         "the lock does not match the build it pins: run khub lock again",
                         label, v->name, nm);
            return KHUB_STATUS_LOCK_MISMATCH;
        }
    }
    return KHUB_STATUS_OK;
}
