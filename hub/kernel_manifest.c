/*
 * kernel_manifest.c: parses kernel.json (see kernel_manifest.h). The file is
 * an author's input, but it also arrives inside source archives, so it is
 * treated as hostile: bounded sizes, every type checked, every error names
 * its field.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kernel_manifest.h"

#define MAX_MANIFEST_BYTES (1u << 20)

uint32_t khub__cpu_feature_from_name(const char *name) { return khub__cpu_feature_bit(name); }

/* ======================================================================== */
/* Field helpers: each sets errbuf naming the field and returns PARSE       */
/* ======================================================================== */

typedef struct ctx {
    char *errbuf;
    size_t errbuf_size;
} ctx;

static khub_status bad(ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static khub_status bad(ctx *c, const char *fmt, ...)
{
    char msg[KHUB_ERROR_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    khub__errbuf(c->errbuf, c->errbuf_size, "kernel.json: %s", msg);
    return KHUB_STATUS_PARSE;
}

static khub_status get_str(ctx *c, const cJSON *obj, const char *key, char *dst, size_t n,
                           int required)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) return required ? bad(c, "missing '%s'", key) : KHUB_STATUS_OK;
    if (!cJSON_IsString(v) || !v->valuestring[0])
        return bad(c, "'%s' must be a non-empty string", key);
    if (strlen(v->valuestring) >= n) return bad(c, "'%s' is longer than %zu bytes", key, n - 1);
    memcpy(dst, v->valuestring, strlen(v->valuestring) + 1);
    return KHUB_STATUS_OK;
}

/* A relative path that stays inside the kernel directory. */
static int safe_rel_path(const char *p)
{
    if (!p[0] || p[0] == '/' || strstr(p, "\\")) return 0;
    const char *s = p;
    while (*s) {
        const char *e = strchr(s, '/');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (len == 0 || (len == 2 && s[0] == '.' && s[1] == '.') || (len == 1 && s[0] == '.'))
            return 0;
        s += len + (e ? 1 : 0);
    }
    return 1;
}

static khub_status get_sources(ctx *c, const cJSON *src, const char *key, char (*dst)[128],
                               size_t *n)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(src, key);
    *n = 0;
    if (!arr) return KHUB_STATUS_OK;
    if (!cJSON_IsArray(arr)) return bad(c, "sources.%s must be an array of file names", key);
    const cJSON *f;
    cJSON_ArrayForEach(f, arr)
    {
        if (*n >= KHUB_KM_MAX_SOURCES)
            return bad(c, "sources.%s: more than %d files", key, KHUB_KM_MAX_SOURCES);
        if (!cJSON_IsString(f) || strlen(f->valuestring) >= 128 || !safe_rel_path(f->valuestring))
            return bad(c, "sources.%s[%zu] must be a relative path inside the kernel directory",
                       key, *n);
        memcpy(dst[(*n)++], f->valuestring, strlen(f->valuestring) + 1);
    }
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* Sections                                                                 */
/* ======================================================================== */

static khub_status parse_repo(ctx *c, const cJSON *j, khub_kernel_manifest *m)
{
    KHUB_FORWARD_IF_ERROR(NULL, get_str(c, j, "repo", m->repo, sizeof m->repo, 1));
    const char *slash = strchr(m->repo, '/');
    if (!slash || slash == m->repo || !slash[1] || strchr(slash + 1, '/') ||
        (size_t)(slash - m->repo) >= sizeof m->org || strlen(slash + 1) >= sizeof m->name)
        return bad(c, "'repo' must be 'org/name', got '%s'", m->repo);
    memcpy(m->org, m->repo, (size_t)(slash - m->repo));
    m->org[slash - m->repo] = '\0';
    snprintf(m->name, sizeof m->name, "%s", slash + 1);
    const cJSON *major = cJSON_GetObjectItemCaseSensitive(j, "major");
    if (!cJSON_IsNumber(major) || major->valuedouble < 1 || major->valuedouble > 9999 ||
        major->valuedouble != (int)major->valuedouble)
        return bad(c, "'major' must be an integer >= 1 (the branch v<major>)");
    m->major = (int)major->valuedouble;
    KHUB_FORWARD_IF_ERROR(NULL, get_str(c, j, "version", m->version, sizeof m->version, 1));
    if (atoi(m->version) != m->major)
        return bad(c, "'version' %s does not start with the major %d", m->version, m->major);
    return KHUB_STATUS_OK;
}

/* Optional "glibc_ceiling": the newest glibc symbol version the plugins may
 * need, "GLIBC_<major>.<minor>[.<patch>]" (the ABI gate's default is
 * GLIBC_2.28). */
static khub_status parse_glibc_ceiling(ctx *c, const cJSON *j, khub_kernel_manifest *m)
{
    char *g = m->glibc_ceiling;
    KHUB_FORWARD_IF_ERROR(NULL, get_str(c, j, "glibc_ceiling", g, sizeof m->glibc_ceiling, 0));
    if (!g[0]) return KHUB_STATUS_OK;
    const char *p = strncmp(g, "GLIBC_", 6) == 0 ? g + 6 : NULL;
    int parts = 0;
    while (p && *p >= '0' && *p <= '9') {
        while (*p >= '0' && *p <= '9') p++;
        parts++;
        if (*p == '.' && p[1] >= '0' && p[1] <= '9') p++;
    }
    if (!p || *p || parts < 2 || parts > 3)
        return bad(c, "'glibc_ceiling' '%s' is not a glibc version like GLIBC_2.28", g);
    return KHUB_STATUS_OK;
}

/* Optional "abi": {"target_minor": N}, the KHUB_PLUGIN_TARGET_MINOR the
 * plugins are built with (khub_version.h): hosts of ABI major.N and newer
 * then load them. A minor newer than this khub's ABI is refused here, with
 * the range it can build, rather than by the compiler's #error. Any other
 * key in "abi" is refused: a misspelt target_minor must not silently build
 * for the newest ABI, which older hosts refuse. */
static khub_status parse_abi(ctx *c, const cJSON *j, khub_kernel_manifest *m)
{
    m->target_minor = KHUB_ABI_MINOR;
    const cJSON *abi = cJSON_GetObjectItemCaseSensitive(j, "abi"), *e;
    if (!abi) return KHUB_STATUS_OK;
    if (!cJSON_IsObject(abi)) return bad(c, "'abi' must be an object like {\"target_minor\": 2}");
    cJSON_ArrayForEach(e, abi)
    {
        if (strcmp(e->string, "target_minor") != 0)
            return bad(c, "abi.%s is not a field (abi has only target_minor)", e->string);
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(abi, "target_minor");
    if (!t) return KHUB_STATUS_OK;
    double v = cJSON_IsNumber(t) ? t->valuedouble : -1;
    if (!cJSON_IsNumber(t) || v != floor(v))
        return bad(c, "abi.target_minor must be a whole number (the N of plugin ABI %d.N)",
                   KHUB_ABI_MAJOR);
    if (v > KHUB_ABI_MINOR)
        return bad(c,
                   "abi.target_minor %g is newer than this khub's plugin ABI %d.%d (it builds "
                   "for %d.%d-%d.%d): lower target_minor or use a newer khub",
                   v, KHUB_ABI_MAJOR, KHUB_ABI_MINOR, KHUB_ABI_MAJOR, KHUB_ABI_MINOR_MIN,
                   KHUB_ABI_MAJOR, KHUB_ABI_MINOR);
    if (v < KHUB_ABI_MINOR_MIN)
        return bad(c, "abi.target_minor %g is older than this khub's oldest plugin ABI %d.%d", v,
                   KHUB_ABI_MAJOR, KHUB_ABI_MINOR_MIN);
    m->target_minor = (int)t->valuedouble;
    return KHUB_STATUS_OK;
}

static khub_status parse_ops(ctx *c, const cJSON *j, khub_kernel_manifest *m)
{
    const cJSON *ops = cJSON_GetObjectItemCaseSensitive(j, "ops"), *op;
    if (!cJSON_IsArray(ops) || cJSON_GetArraySize(ops) == 0)
        return bad(c, "'ops' must be a non-empty array");
    cJSON_ArrayForEach(op, ops)
    {
        if (m->n_ops >= KHUB_KM_MAX_OPS) return bad(c, "more than %d ops", KHUB_KM_MAX_OPS);
        khub_km_op *o = &m->ops[m->n_ops];
        char kind[32];
        if (get_str(c, op, "name", o->name, sizeof o->name, 1) != KHUB_STATUS_OK ||
            get_str(c, op, "kind", kind, sizeof kind, 1) != KHUB_STATUS_OK)
            return bad(c, "ops[%zu] needs string fields 'name' and 'kind'", m->n_ops);
        o->kind = khub__op_kind_from_name(kind);
        if (!o->kind)
            return bad(c, "ops[%zu].kind '%s' is not an op kind (%s)", m->n_ops, kind,
                       KHUB__OP_KIND_WORDS);
        m->n_ops++;
    }
    return KHUB_STATUS_OK;
}

static khub_status parse_level(ctx *c, const cJSON *lv, khub_km_level *l, size_t idx)
{
    if (get_str(c, lv, "level", l->name, sizeof l->name, 1) != KHUB_STATUS_OK)
        return bad(c, "variants.cpu[%zu] needs a 'level' name", idx);
    const cJSON *flags = cJSON_GetObjectItemCaseSensitive(lv, "flags"), *f;
    if (flags && !cJSON_IsArray(flags))
        return bad(c, "variants.cpu[%zu].flags must be an array", idx);
    cJSON_ArrayForEach(f, flags)
    {
        /* Only -m (target) and -D/-O flags: an author's manifest must not
         * smuggle in -o, -Wl,... or plugin search paths. */
        if (!cJSON_IsString(f) || strlen(f->valuestring) >= 48 || l->n_flags >= KHUB_KM_MAX_FLAGS ||
            !(strncmp(f->valuestring, "-m", 2) == 0 || strncmp(f->valuestring, "-D", 2) == 0 ||
              strncmp(f->valuestring, "-O", 2) == 0))
            return bad(c, "variants.cpu[%zu].flags: only -m, -D and -O flags are allowed", idx);
        memcpy(l->flags[l->n_flags++], f->valuestring, strlen(f->valuestring) + 1);
    }
    const cJSON *feats = cJSON_GetObjectItemCaseSensitive(lv, "features");
    if (feats && !cJSON_IsArray(feats))
        return bad(c, "variants.cpu[%zu].features must be an array", idx);
    cJSON_ArrayForEach(f, feats)
    {
        uint32_t bit = cJSON_IsString(f) ? khub__cpu_feature_from_name(f->valuestring) : 0;
        if (!bit)
            return bad(c, "variants.cpu[%zu].features: unknown CPU feature '%s'", idx,
                       cJSON_IsString(f) ? f->valuestring : "?");
        l->features |= bit;
    }
    return KHUB_STATUS_OK;
}

static khub_status parse_variants(ctx *c, const cJSON *j, khub_kernel_manifest *m)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "variants");
    if (!cJSON_IsObject(v)) return bad(c, "'variants' must be an object with 'cpu' and/or 'cuda'");
    const cJSON *cpu = cJSON_GetObjectItemCaseSensitive(v, "cpu"), *lv;
    if (cpu && !cJSON_IsArray(cpu)) return bad(c, "variants.cpu must be an array of levels");
    cJSON_ArrayForEach(lv, cpu)
    {
        if (m->n_levels >= KHUB_KM_MAX_LEVELS)
            return bad(c, "more than %d CPU levels", KHUB_KM_MAX_LEVELS);
        KHUB_FORWARD_IF_ERROR(NULL, parse_level(c, lv, &m->levels[m->n_levels], m->n_levels));
        for (size_t i = 0; i < m->n_levels; i++)
            if (strcmp(m->levels[i].name, m->levels[m->n_levels].name) == 0)
                return bad(c, "variants.cpu: level '%s' listed twice", m->levels[i].name);
        m->n_levels++;
    }
    const cJSON *cuda = cJSON_GetObjectItemCaseSensitive(v, "cuda");
    if (cuda) {
        const cJSON *ccs = cJSON_GetObjectItemCaseSensitive(cuda, "capabilities"), *cc;
        if (!cJSON_IsArray(ccs) || cJSON_GetArraySize(ccs) == 0)
            return bad(c, "variants.cuda.capabilities must be a non-empty array, e.g. [80, 90]");
        cJSON_ArrayForEach(cc, ccs)
        {
            if (!cJSON_IsNumber(cc) || cc->valuedouble < 50 || cc->valuedouble > 1300 ||
                m->n_ccs >= KHUB_KM_MAX_CCS)
                return bad(c, "variants.cuda.capabilities: %g is not a compute capability x10",
                           cJSON_IsNumber(cc) ? cc->valuedouble : -1.0);
            m->ccs[m->n_ccs++] = (int)cc->valuedouble;
        }
        m->cubin = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cuda, "cubin"));
    }
    if (!m->n_levels && !m->n_ccs)
        return bad(c, "'variants' lists no CPU level and no CUDA target");
    return KHUB_STATUS_OK;
}

static khub_status parse_tests(ctx *c, const cJSON *j, khub_kernel_manifest *m)
{
    const cJSON *tests = cJSON_GetObjectItemCaseSensitive(j, "selftests"), *t;
    if (!tests) return KHUB_STATUS_OK;
    if (!cJSON_IsArray(tests)) return bad(c, "'selftests' must be an array");
    cJSON_ArrayForEach(t, tests)
    {
        if (m->n_tests >= KHUB_KM_MAX_TESTS)
            return bad(c, "more than %d self-tests", KHUB_KM_MAX_TESTS);
        khub_km_selftest *s = &m->tests[m->n_tests];
        if (get_str(c, t, "op", s->op, sizeof s->op, 1) != KHUB_STATUS_OK)
            return bad(c, "selftests[%zu] needs an 'op'", m->n_tests);
        int known = 0;
        for (size_t i = 0; i < m->n_ops; i++) known |= strcmp(m->ops[i].name, s->op) == 0;
        if (!known) return bad(c, "selftests[%zu].op '%s' is not in 'ops'", m->n_tests, s->op);
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape"), *d;
        if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) < 1 || cJSON_GetArraySize(shape) > 6)
            return bad(c, "selftests[%zu].shape must be an array of 1-6 sizes", m->n_tests);
        cJSON_ArrayForEach(d, shape)
        {
            if (!cJSON_IsNumber(d) || d->valuedouble < 1 || d->valuedouble > 65536)
                return bad(c, "selftests[%zu].shape: sizes must be 1..65536", m->n_tests);
            s->shape[s->ndim++] = (int64_t)d->valuedouble;
        }
        snprintf(s->dtype, sizeof s->dtype, "f32");
        KHUB_FORWARD_IF_ERROR(NULL, get_str(c, t, "dtype", s->dtype, sizeof s->dtype, 0));
        const cJSON *tol = cJSON_GetObjectItemCaseSensitive(t, "tolerance");
        s->tolerance = cJSON_IsNumber(tol) ? tol->valuedouble : 1e-5;
        if (!(s->tolerance > 0 && s->tolerance < 1))
            return bad(c, "selftests[%zu].tolerance must be in (0, 1)", m->n_tests);
        m->n_tests++;
    }
    return KHUB_STATUS_OK;
}

khub_status khub__km_parse(const char *json, size_t n, const char *dir, khub_kernel_manifest *out,
                           char *errbuf, size_t errbuf_size)
{
    memset(out, 0, sizeof *out);
    snprintf(out->dir, sizeof out->dir, "%s", dir ? dir : ".");
    ctx c = {errbuf, errbuf_size};
    cJSON *j = cJSON_ParseWithLength(json, n);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return bad(&c, "not a JSON object (malformed JSON?)");
    }
    khub_status st = parse_repo(&c, j, out);
    if (st == KHUB_STATUS_OK) st = parse_ops(&c, j, out);
    if (st == KHUB_STATUS_OK) st = parse_glibc_ceiling(&c, j, out);
    if (st == KHUB_STATUS_OK) st = parse_abi(&c, j, out);
    const cJSON *src = cJSON_GetObjectItemCaseSensitive(j, "sources");
    if (st == KHUB_STATUS_OK && !cJSON_IsObject(src))
        st = bad(&c, "'sources' must be an object with 'cpu', 'cuda_host' and/or 'cuda'");
    if (st == KHUB_STATUS_OK)
        st = get_sources(&c, src, "cpu", out->cpu_sources, &out->n_cpu_sources);
    if (st == KHUB_STATUS_OK)
        st = get_sources(&c, src, "cuda_host", out->cuda_host_sources, &out->n_cuda_host_sources);
    if (st == KHUB_STATUS_OK)
        st = get_sources(&c, src, "cuda", out->cuda_sources, &out->n_cuda_sources);
    if (st == KHUB_STATUS_OK) st = parse_variants(&c, j, out);
    if (st == KHUB_STATUS_OK && out->n_levels && !out->n_cpu_sources)
        st = bad(&c, "variants.cpu is set but sources.cpu is empty");
    if (st == KHUB_STATUS_OK && out->n_ccs && (!out->n_cuda_sources || !out->n_cuda_host_sources))
        st = bad(&c, "variants.cuda needs sources.cuda (kernels) and sources.cuda_host (glue)");
    if (st == KHUB_STATUS_OK) st = parse_tests(&c, j, out);
    cJSON_Delete(j);
    return st;
}

khub_status khub__km_load(const char *dir, khub_kernel_manifest *out, char *errbuf,
                          size_t errbuf_size)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/kernel.json", dir);
    char *buf = NULL;
    size_t n = 0;
    char why[KHUB_ERROR_SIZE];
    khub_status st = khub__read_file_mem(NULL, path, MAX_MANIFEST_BYTES, &buf, &n, why, sizeof why);
    if (st == KHUB_STATUS_NOT_FOUND) {
        khub__errbuf(errbuf, errbuf_size, "%s (is %s a kernel source dir?)", why, dir);
        return st;
    }
    if (st != KHUB_STATUS_OK) {
        khub__errbuf(errbuf, errbuf_size, "%s", why);
        return st == KHUB_STATUS_OVERFLOW ? KHUB_STATUS_PARSE : st;
    }
    st = khub__km_parse(buf, n, dir, out, errbuf, errbuf_size);
    khub__mem_free(buf);
    return st;
}
