/*
 * kernel_meta.c: parsing and verifying a variant's metadata.json (see
 * kernel_meta.h). Input comes from the network: every field is type- and
 * size-checked, file names may not leave the variant directory.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "json_strict.h"
#include "kernel_manifest.h"
#include "kernel_meta.h"

/* A JSON number that is a whole number in [lo, hi]: converting anything
 * else to an int would be undefined (metadata.json is hostile). */
static bool json_int(const cJSON *j, double lo, double hi, int *out)
{
    if (!cJSON_IsNumber(j) || !(j->valuedouble >= lo && j->valuedouble <= hi) ||
        j->valuedouble != (double)(long long)j->valuedouble)
        return false;
    *out = (int)j->valuedouble;
    return true;
}

static khub_status bad(char *errbuf, size_t n, const char *what)
{
    khub__errbuf(errbuf, n, "metadata.json: %s", what);
    return KHUB_STATUS_METADATA_INVALID;
}

/* An unknown field is an error: metadata.json decides what loads, and a
 * field this reader skips is one the signer may have meant (issue 10). */
static khub_status only_keys(const cJSON *o, const char *const *keys, const char *where,
                             char *errbuf, size_t n)
{
    const char *extra = NULL;
    if (!cJSON_IsObject(o) || khub__json_only_keys(o, keys, &extra)) return KHUB_STATUS_OK;
    khub__errbuf(errbuf, n, "metadata.json: unknown field \"%.60s\" in %s", extra, where);
    return KHUB_STATUS_METADATA_INVALID;
}

static int plain_name(const char *s)
{
    return s[0] && strcmp(s, ".") != 0 && strcmp(s, "..") != 0 && !strchr(s, '/') &&
           !strchr(s, '\\') && strlen(s) < 128;
}

static int copy_str(const cJSON *obj, const char *key, char *dst, size_t n)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= n) return 0;
    memcpy(dst, v->valuestring, strlen(v->valuestring) + 1);
    return 1;
}

static khub_status parse_files(const cJSON *j, khub_kmeta *m, char *errbuf, size_t n)
{
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(j, "files"), *f;
    if (!cJSON_IsObject(files)) return bad(errbuf, n, "'files' must be an object of digests");
    cJSON_ArrayForEach(f, files)
    {
        if (m->n_files >= KHUB_KMETA_MAX_FILES) return bad(errbuf, n, "too many files");
        if (!f->string || !plain_name(f->string))
            return bad(errbuf, n, "'files' has a name that is not a plain file name");
        if (!cJSON_IsString(f) || !khub__is_sha256_hex(f->valuestring))
            return bad(errbuf, n, "'files' digests must be 64 hex digits");
        khub_kmeta_file *e = &m->files[m->n_files++];
        snprintf(e->name, sizeof e->name, "%s", f->string);
        snprintf(e->sha256, sizeof e->sha256, "%s", f->valuestring);
    }
    return KHUB_STATUS_OK;
}

static khub_status parse_plugins(const cJSON *j, khub_kmeta *m, char *errbuf, size_t n)
{
    const cJSON *plugins = cJSON_GetObjectItemCaseSensitive(j, "plugins"), *p;
    if (!cJSON_IsArray(plugins) || cJSON_GetArraySize(plugins) == 0)
        return bad(errbuf, n, "'plugins' must be a non-empty array");
    cJSON_ArrayForEach(p, plugins)
    {
        static const char *const keys[] = {"file", "level", "cpu_features", NULL};
        if (m->n_plugins >= KHUB_KMETA_MAX_PLUGINS) return bad(errbuf, n, "too many plugins");
        KHUB_FORWARD_IF_ERROR(NULL, only_keys(p, keys, "plugins[]", errbuf, n));
        khub_kmeta_plugin *e = &m->plugins[m->n_plugins];
        if (!copy_str(p, "file", e->file, sizeof e->file) || !plain_name(e->file))
            return bad(errbuf, n, "plugins[].file must be a plain file name");
        if (!khub__kmeta_digest(m, e->file))
            return bad(errbuf, n, "plugins[].file is not listed in 'files'");
        copy_str(p, "level", e->level, sizeof e->level);
        const cJSON *feats = cJSON_GetObjectItemCaseSensitive(p, "cpu_features"), *f;
        cJSON_ArrayForEach(f, feats)
        {
            uint32_t bit = cJSON_IsString(f) ? khub__cpu_feature_from_name(f->valuestring) : 0;
            if (!bit) return bad(errbuf, n, "plugins[].cpu_features has an unknown feature");
            e->cpu_features |= bit;
        }
        m->n_plugins++;
    }
    return KHUB_STATUS_OK;
}

static khub_status parse_artifacts(const cJSON *j, khub_kmeta *m, char *errbuf, size_t n)
{
    const cJSON *arts = cJSON_GetObjectItemCaseSensitive(j, "artifacts"), *a;
    if (arts && !cJSON_IsArray(arts)) return bad(errbuf, n, "'artifacts' must be an array");
    cJSON_ArrayForEach(a, arts)
    {
        static const char *const keys[] = {"file", "kind", "sm", "ptx_isa", NULL};
        if (m->n_artifacts >= KHUB_KMETA_MAX_FILES) return bad(errbuf, n, "too many artifacts");
        KHUB_FORWARD_IF_ERROR(NULL, only_keys(a, keys, "artifacts[]", errbuf, n));
        khub_kmeta_artifact *e = &m->artifacts[m->n_artifacts];
        const cJSON *sm = cJSON_GetObjectItemCaseSensitive(a, "sm");
        const cJSON *isa = cJSON_GetObjectItemCaseSensitive(a, "ptx_isa");
        if (!copy_str(a, "file", e->file, sizeof e->file) || !plain_name(e->file) ||
            !khub__kmeta_digest(m, e->file))
            return bad(errbuf, n, "artifacts[].file must be a plain name listed in 'files'");
        if (!copy_str(a, "kind", e->kind, sizeof e->kind) ||
            (strcmp(e->kind, "ptx") != 0 && strcmp(e->kind, "cubin") != 0))
            return bad(errbuf, n, "artifacts[].kind must be \"ptx\" or \"cubin\"");
        if (!json_int(sm, 10, 2000, &e->sm))
            return bad(errbuf, n, "artifacts[].sm must be a compute capability x10");
        e->ptx_isa = 0;
        if (isa && !json_int(isa, 0, 10000, &e->ptx_isa))
            return bad(errbuf, n, "artifacts[].ptx_isa must be a PTX ISA version x10");
        m->n_artifacts++;
    }
    return KHUB_STATUS_OK;
}

/* The fields of each object of the format (docs/kernel-format.md); the
 * arrays' elements are checked as they are parsed. */
static khub_status check_keys(const cJSON *j, char *errbuf, size_t n)
{
    static const char *const top[] = {"format", "name",       "version", "major",   "variant",
                                      "abi",    "backend",    "ops",     "plugins", "artifacts",
                                      "files",  "provenance", NULL};
    static const char *const abi[] = {"major", "minor", NULL};
    static const char *const backend[] = {"type", "archs", NULL};
    static const char *const op[] = {"name", "kind", NULL};
    static const char *const prov[] = {"source_commit", "dirty", "compiler", "nvrtc", "khub", NULL};
    KHUB_FORWARD_IF_ERROR(NULL, only_keys(j, top, "the top level", errbuf, n));
    KHUB_FORWARD_IF_ERROR(
        NULL, only_keys(cJSON_GetObjectItemCaseSensitive(j, "abi"), abi, "abi", errbuf, n));
    KHUB_FORWARD_IF_ERROR(NULL, only_keys(cJSON_GetObjectItemCaseSensitive(j, "backend"), backend,
                                          "backend", errbuf, n));
    KHUB_FORWARD_IF_ERROR(NULL, only_keys(cJSON_GetObjectItemCaseSensitive(j, "provenance"), prov,
                                          "provenance", errbuf, n));
    const cJSON *o, *ops = cJSON_GetObjectItemCaseSensitive(j, "ops");
    if (!cJSON_IsArray(ops)) ops = NULL;
    cJSON_ArrayForEach(o, ops) KHUB_FORWARD_IF_ERROR(NULL, only_keys(o, op, "ops[]", errbuf, n));
    return KHUB_STATUS_OK;
}

khub_status khub__kmeta_parse(const char *json, size_t n, khub_kmeta *out, char *errbuf,
                              size_t errbuf_size)
{
    memset(out, 0, sizeof *out);
    if (n > (4u << 20)) return bad(errbuf, errbuf_size, "larger than 4 MiB");
    char why[128] = "";
    cJSON *j = khub__json_parse_strict(json, n, why, sizeof why);
    /* Not JSON at all reads as "not a JSON object" below. */
    khub_status st =
        j || !strcmp(why, "not valid JSON") ? KHUB_STATUS_OK : bad(errbuf, errbuf_size, why);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
    const cJSON *abi = cJSON_GetObjectItemCaseSensitive(j, "abi");
    const cJSON *major = cJSON_GetObjectItemCaseSensitive(j, "major");
    const cJSON *backend = cJSON_GetObjectItemCaseSensitive(j, "backend");
    const cJSON *prov = cJSON_GetObjectItemCaseSensitive(j, "provenance");
    int abi_major = 0, abi_minor = 0;
    if (st != KHUB_STATUS_OK)
        ; /* a duplicate key or trailing text, named */
    else if (!cJSON_IsObject(j))
        st = bad(errbuf, errbuf_size, "not a JSON object");
    else if ((st = check_keys(j, errbuf, errbuf_size)) != KHUB_STATUS_OK)
        ;
    else if (!cJSON_IsNumber(fmt) || fmt->valuedouble != 1)
        st = bad(errbuf, errbuf_size, "'format' must be 1");
    else if (!copy_str(j, "name", out->name, sizeof out->name) || !strchr(out->name, '/'))
        st = bad(errbuf, errbuf_size, "'name' must be 'org/name'");
    else if (!copy_str(j, "version", out->version, sizeof out->version))
        st = bad(errbuf, errbuf_size, "'version' must be a string");
    else if (!copy_str(j, "variant", out->variant, sizeof out->variant))
        st = bad(errbuf, errbuf_size, "'variant' must be a string");
    else if (!json_int(major, 1, 1e6, &out->major))
        st = bad(errbuf, errbuf_size, "'major' must be a positive integer");
    else if (!cJSON_IsObject(abi) ||
             !json_int(cJSON_GetObjectItemCaseSensitive(abi, "major"), 0, 65535, &abi_major) ||
             !json_int(cJSON_GetObjectItemCaseSensitive(abi, "minor"), 0, 65535, &abi_minor))
        st = bad(errbuf, errbuf_size,
                 "'abi' must be {\"major\": N, \"minor\": M} (whole numbers, 0..65535)");
    else if (!cJSON_IsObject(backend) ||
             !copy_str(backend, "type", out->backend, sizeof out->backend))
        st = bad(errbuf, errbuf_size, "'backend.type' must be a string");
    if (st == KHUB_STATUS_OK) {
        out->abi_major = (uint16_t)abi_major;
        out->abi_minor = (uint16_t)abi_minor;
        st = parse_files(j, out, errbuf, errbuf_size);
    }
    if (st == KHUB_STATUS_OK) st = parse_plugins(j, out, errbuf, errbuf_size);
    if (st == KHUB_STATUS_OK) st = parse_artifacts(j, out, errbuf, errbuf_size);
    if (st == KHUB_STATUS_OK && cJSON_IsObject(prov)) {
        copy_str(prov, "source_commit", out->source_commit, sizeof out->source_commit);
        out->dirty = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(prov, "dirty"));
    }
    cJSON_Delete(j);
    return st;
}

const char *khub__kmeta_digest(const khub_kmeta *m, const char *file)
{
    for (size_t i = 0; i < m->n_files; i++)
        if (strcmp(m->files[i].name, file) == 0) return m->files[i].sha256;
    return NULL;
}

khub_status khub__kmeta_verify_dir(const khub_kmeta *m, const char *dir, char *errbuf,
                                   size_t errbuf_size)
{
    for (size_t i = 0; i < m->n_files; i++) {
        char path[2048], hex[65];
        snprintf(path, sizeof path, "%s/%s", dir, m->files[i].name);
        khub_status st = khub__sha256_file_hex(path, hex);
        if (st != KHUB_STATUS_OK) {
            khub__errbuf(errbuf, errbuf_size, "%s: listed in metadata.json but cannot be read",
                         path);
            return KHUB_STATUS_NOT_FOUND;
        }
        if (!khub__digest_eq(hex, m->files[i].sha256)) {
            khub__errbuf(errbuf, errbuf_size, "%s: SHA-256 %s, metadata.json says %s", path, hex,
                         m->files[i].sha256);
            return KHUB_STATUS_DIGEST_MISMATCH;
        }
    }
    DIR *d = opendir(dir);
    if (!d) {
        khub__errbuf(errbuf, errbuf_size, "%s: cannot list: %s", dir, strerror(errno));
        return KHUB_STATUS_IO;
    }
    khub_status st = KHUB_STATUS_OK;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *nm = e->d_name;
        if (!strcmp(nm, ".") || !strcmp(nm, "..") || !strcmp(nm, "metadata.json") ||
            !strcmp(nm, "metadata.json.sig"))
            continue;
        if (!khub__kmeta_digest(m, nm)) {
            khub__errbuf(errbuf, errbuf_size, "%s/%s: not listed in metadata.json", dir, nm);
            st = KHUB_STATUS_DIGEST_MISMATCH;
            break;
        }
    }
    closedir(d);
    return st;
}

const khub_kmeta_plugin *khub__kmeta_pick_plugin(const khub_kmeta *m, uint32_t cpu_features)
{
    const khub_kmeta_plugin *best = NULL;
    int best_bits = -1;
    for (size_t i = 0; i < m->n_plugins; i++) {
        const khub_kmeta_plugin *p = &m->plugins[i];
        if ((p->cpu_features & cpu_features) != p->cpu_features) continue;
        int bits = __builtin_popcount(p->cpu_features);
        if (bits > best_bits) best = p, best_bits = bits;
    }
    return best;
}
