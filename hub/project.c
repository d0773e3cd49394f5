/*
 * project.c: the public face of khub.json and khub.lock (khub_project.h):
 * parsing, loading, saving and reading pins, and the import of the Python
 * kernels.lock. The formats themselves live in kernel_mapping.c and
 * lockfile.c; this file only adapts them to the API's error reporting
 * (errbuf and khub_last_error) and copies pins out as versioned structs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app_struct.h"
#include "kernel_mapping.h"
#include "khub/khub_project.h"
#include "lockfile.h"

/* The Python kernels.lock is small; this bounds a hostile one. */
#define MAX_IMPORT_BYTES ((size_t)8 << 20)

/* Copies a message from an internal errbuf to the caller's and to
 * khub_last_error(); returns st. */
static khub_status report(khub_status st, const char *msg, char *errbuf, size_t errbuf_size)
{
    if (st == KHUB_STATUS_OK) return st;
    khub__errbuf(errbuf, errbuf_size, "%s", msg);
    return khub__fail(NULL, st, "%s", msg);
}

/* ======================================================================== */
/* Roles                                                                    */
/* ======================================================================== */

const char *khub_kernel_role_name(khub_kernel_role role)
{
    return khub__role_name((khub_role)role);
}

khub_kernel_role khub_kernel_role_from_name(const char *name)
{
    return (khub_kernel_role)khub__role_from_name(name);
}

/* ======================================================================== */
/* Mapping                                                                  */
/* ======================================================================== */

khub_status khub_mapping_parse(const char *json, size_t n, khub_mapping **out, char *errbuf,
                               size_t errbuf_size)
{
    KHUB_API_CHECK(NULL, json != NULL && out != NULL);
    char msg[KHUB_ERROR_SIZE] = "";
    return report(khub__mapping_parse(json, n, out, msg, sizeof msg), msg, errbuf, errbuf_size);
}

khub_status khub_mapping_load(const char *path, khub_mapping **out, char *errbuf,
                              size_t errbuf_size)
{
    KHUB_API_CHECK(NULL, path != NULL && out != NULL);
    char msg[KHUB_ERROR_SIZE] = "";
    return report(khub__mapping_load(path, out, msg, sizeof msg), msg, errbuf, errbuf_size);
}

void khub_mapping_free(khub_mapping *m) { free(m); }

size_t khub_mapping_kernel_count(const khub_mapping *m)
{
    const char *ids[KHUB_ROLE__COUNT * KHUB_MAP_MAX_RULES + KHUB_MAP_MAX_DEPS];
    return m ? khub__mapping_kernels(m, ids, sizeof ids / sizeof ids[0]) : 0;
}

const char *khub_mapping_kernel(const khub_mapping *m, size_t i)
{
    const char *ids[KHUB_ROLE__COUNT * KHUB_MAP_MAX_RULES + KHUB_MAP_MAX_DEPS];
    size_t n = m ? khub__mapping_kernels(m, ids, sizeof ids / sizeof ids[0]) : 0;
    return i < n ? ids[i] : NULL;
}

const char *khub_mapping_pick(const khub_mapping *m, khub_kernel_role role, uint32_t device_type,
                              int32_t cc)
{
    const khub_map_rule *r = khub__mapping_pick(m, (khub_role)role, device_type, cc);
    return r ? r->text : NULL;
}

/* ======================================================================== */
/* Lock                                                                     */
/* ======================================================================== */

khub_status khub_lock_new(khub_lock **out)
{
    KHUB_API_CHECK(NULL, out != NULL);
    khub_status st = khub__lock_new(out);
    return st == KHUB_STATUS_OK ? st : khub__fail(NULL, st, "khub_lock_new: out of memory");
}

khub_status khub_lock_parse(const char *json, size_t n, khub_lock **out, char *errbuf,
                            size_t errbuf_size)
{
    KHUB_API_CHECK(NULL, json != NULL && out != NULL);
    char msg[KHUB_ERROR_SIZE] = "";
    return report(khub__lock_parse(json, n, out, msg, sizeof msg), msg, errbuf, errbuf_size);
}

khub_status khub_lock_load(const char *path, khub_lock **out, char *errbuf, size_t errbuf_size)
{
    KHUB_API_CHECK(NULL, path != NULL && out != NULL);
    char msg[KHUB_ERROR_SIZE] = "";
    return report(khub__lock_load(path, out, msg, sizeof msg), msg, errbuf, errbuf_size);
}

khub_status khub_lock_save(const khub_lock *lock, const char *path, char *errbuf,
                           size_t errbuf_size)
{
    KHUB_API_CHECK(NULL, lock != NULL && path != NULL);
    char msg[KHUB_ERROR_SIZE] = "";
    return report(khub__lock_save(lock, path, msg, sizeof msg), msg, errbuf, errbuf_size);
}

void khub_lock_free(khub_lock *lock) { khub__lock_free(lock); }

size_t khub_lock_count(const khub_lock *lock) { return lock ? lock->count : 0; }

/* Fills the caller's pin from an entry (for who), as far as its struct_size
 * reaches. */
static khub_status pin_put(const khub_lock_entry *e, khub_lock_pin *out, const char *who)
{
    char msg[KHUB_ERROR_SIZE];
    if (khub__app_struct_check(out, KHUB__SIZE_TO(khub_lock_pin, reserved), who, "out", msg,
                               sizeof msg))
        return khub__fail(NULL, KHUB_STATUS_STRUCT_SIZE, "%s", msg);
    khub_lock_pin p = {KHUB_APP_INIT(khub_lock_pin), .version = e->version,
                       .n_variants = (uint32_t)e->n_variants};
    snprintf(p.repo, sizeof p.repo, "%s", e->repo);
    snprintf(p.revision, sizeof p.revision, "%s", e->revision);
    snprintf(p.commit, sizeof p.commit, "%s", e->commit);
    snprintf(p.kernel_version, sizeof p.kernel_version, "%s", e->kernel_version);
    khub__app_copy_out(out, &p, sizeof p); /* up to its struct_size, the caller's header kept */
    return KHUB_STATUS_OK;
}

khub_status khub_lock_pin_at(const khub_lock *lock, size_t i, khub_lock_pin *out)
{
    KHUB_API_CHECK(NULL, lock != NULL && out != NULL);
    if (i >= lock->count)
        return khub__fail(NULL, KHUB_STATUS_NOT_FOUND, "khub_lock_pin_at: %zu is past the %zu pins",
                          i, lock->count);
    return pin_put(&lock->items[i], out, "khub_lock_pin_at");
}

khub_status khub_lock_pin_find(const khub_lock *lock, const char *repo, khub_lock_pin *out)
{
    KHUB_API_CHECK(NULL, lock != NULL && repo != NULL && out != NULL);
    const khub_lock_entry *e = khub__lock_find(lock, repo);
    if (!e) return khub__fail(NULL, KHUB_STATUS_NOT_FOUND, "%s is not in the lock", repo);
    return pin_put(e, out, "khub_lock_pin_find");
}

khub_status khub_lock_pin_id(const khub_lock_pin *pin, khub_hub_id *out)
{
    KHUB_API_CHECK(NULL, pin != NULL && out != NULL);
    KHUB_FORWARD_IF_ERROR(NULL, khub_hub_id_parse(pin->repo, out, NULL, 0));
    if (pin->version >= 0) return khub_hub_id_set_revision(out, NULL, pin->version);
    if (pin->revision[0]) return khub_hub_id_set_revision(out, pin->revision, -1);
    return KHUB_STATUS_OK;
}

khub_status khub_lock_import_python(const char *path, khub_lock **out, char *notes,
                                    size_t notes_size, char *errbuf, size_t errbuf_size)
{
    KHUB_API_CHECK(NULL, path != NULL && out != NULL);
    *out = NULL;
    if (notes && notes_size) notes[0] = '\0';
    char *buf = NULL, msg[KHUB_ERROR_SIZE] = "", err[KHUB_ERROR_SIZE] = "", scratch[1];
    size_t n = 0;
    khub_status st = khub__read_file_mem(NULL, path, MAX_IMPORT_BYTES, &buf, &n, msg, sizeof msg);
    if (st == KHUB_STATUS_OVERFLOW) st = KHUB_STATUS_PARSE;
    if (st != KHUB_STATUS_OK) return report(st, msg, errbuf, errbuf_size);
    khub_lock *lock = NULL;
    st = khub__lock_new(&lock);
    if (st == KHUB_STATUS_OK)
        st = khub__lock_import_python(buf, n, lock, notes ? notes : scratch,
                                      notes ? notes_size : sizeof scratch, err, sizeof err);
    else
        snprintf(err, sizeof err, "out of memory");
    khub__mem_free(buf);
    if (st != KHUB_STATUS_OK) {
        khub__lock_free(lock);
        snprintf(msg, sizeof msg, "%s: %s", path, err);
        return report(st, msg, errbuf, errbuf_size);
    }
    *out = lock;
    return KHUB_STATUS_OK;
}
