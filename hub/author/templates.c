/*
 * templates.c: `khub init`: the template list and writing a kernel source
 * tree from a template (khub_author_init).
 *
 * The templates are real files under hub/author/templates/ (each kind's
 * cpu.c, kernel.cu, cuda_glue.c, and index.json naming the kinds in order),
 * compiled raw by the build and formatted like the rest of the code, and
 * embedded into the library at build time (embed-templates.cmake). In a
 * template "@ID@" becomes the repo id, "@NAME@" the kernel name and
 * TEMPLATE_CNAME a C identifier made of the name; the placeholders keep
 * the raw files valid C.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "author_impl.h"

#define MAX_TEMPLATES 16

typedef struct tmpl {
    char kind[32];
    char op[64];
    int cuda;
    const char *selftests; /* kernel.json's "selftests": <kind>/selftests.json, verbatim */
} tmpl;

static tmpl g_templates[MAX_TEMPLATES];
static size_t g_n_templates;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* Reads the embedded index.json once. It is this library's own data,
 * checked by t_author on every kind, so a malformed entry is skipped rather
 * than reported at each call. */
static void load_index(void)
{
    const khub_author_embedded *idx = khub__author_template_file("index.json");
    cJSON *j = idx ? cJSON_ParseWithLength((const char *)idx->data, idx->size) : NULL;
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "templates"), *e;
    cJSON_ArrayForEach(e, list)
    {
        const cJSON *kind = cJSON_GetObjectItemCaseSensitive(e, "kind");
        const cJSON *op = cJSON_GetObjectItemCaseSensitive(e, "op");
        if (g_n_templates >= MAX_TEMPLATES || !cJSON_IsString(kind) || !cJSON_IsString(op))
            continue;
        tmpl *t = &g_templates[g_n_templates];
        snprintf(t->kind, sizeof t->kind, "%s", kind->valuestring);
        snprintf(t->op, sizeof t->op, "%s", op->valuestring);
        t->cuda = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "cuda"));
        char path[64];
        snprintf(path, sizeof path, "%s/selftests.json", t->kind);
        const khub_author_embedded *tests = khub__author_template_file(path);
        t->selftests = tests ? (const char *)tests->data : NULL;
        if (t->selftests) g_n_templates++;
    }
    cJSON_Delete(j);
}

static size_t n_templates(void)
{
    pthread_once(&g_once, load_index);
    return g_n_templates;
}

static const tmpl *find(const char *kind)
{
    for (size_t i = 0; i < n_templates(); i++)
        if (strcmp(g_templates[i].kind, kind) == 0) return &g_templates[i];
    return NULL;
}

/* "attention, norm, ..." (with_cuda: only kinds with a CUDA template). */
static void kinds_list(char *buf, size_t n, int with_cuda)
{
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n_templates(); i++) {
        if (with_cuda && !g_templates[i].cuda) continue;
        int w = snprintf(buf + len, n - len, "%s%s", len ? ", " : "", g_templates[i].kind);
        if (w < 0 || (size_t)w >= n - len) return;
        len += (size_t)w;
    }
}

size_t khub_author_template_count(void) { return n_templates(); }

khub_status khub_author_template_at(size_t i, khub_author_template *out)
{
    KHUB_FORWARD_IF_ERROR(NULL, KHUB_AUTHOR_STRUCT(out, khub_author_template, cuda,
                                                   "khub_author_template_at", "out", NULL, 0));
    if (i >= n_templates())
        return khub__fail(NULL, KHUB_STATUS_INVALID_ARG,
                          "khub_author_template_at: no template %zu (there are %zu)", i,
                          n_templates());
    out->kind = g_templates[i].kind;
    out->op = g_templates[i].op;
    out->cuda = g_templates[i].cuda;
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* Writing a tree                                                           */
/* ======================================================================== */

typedef struct subst {
    const char *id, *name, *cname;
} subst;

/* text with every placeholder replaced (malloc'd), or NULL without memory. */
static char *substitute(const char *text, const subst *s)
{
    const char *keys[] = {"@ID@", "@NAME@", "TEMPLATE_CNAME"};
    const char *vals[] = {s->id, s->name, s->cname};
    size_t cap = strlen(text) * 2 + 1024, len = 0;
    char *out = malloc(cap);
    if (!out) return NULL;
    for (const char *p = text; *p;) {
        size_t k, klen = 0;
        for (k = 0; k < 3; k++)
            if (strncmp(p, keys[k], klen = strlen(keys[k])) == 0) break;
        const char *piece = k < 3 ? vals[k] : p;
        size_t plen = k < 3 ? strlen(vals[k]) : 1;
        if (len + plen + 1 > cap) {
            cap = (cap + plen) * 2;
            char *grown = realloc(out, cap);
            if (!grown) return free(out), NULL;
            out = grown;
        }
        memcpy(out + len, piece, plen);
        len += plen;
        p += k < 3 ? klen : 1;
    }
    out[len] = '\0';
    return out;
}

/* Creates dir/file (never overwriting) with text after substitution. */
static khub_status write_new(const khub_author_init_opts *o, const char *dir, const char *file,
                             const char *text, const subst *s, char *errbuf, size_t errbuf_size)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "wx");
    if (!f)
        return khub__author_fail(errbuf, errbuf_size, KHUB_STATUS_IO,
                                 "%s: cannot create (does it exist already?)", path);
    char *body = substitute(text, s);
    int ok = body && fputs(body, f) >= 0;
    free(body);
    ok &= fclose(f) == 0;
    if (!ok)
        return khub__author_fail(errbuf, errbuf_size, KHUB_STATUS_IO, "%s: write failed", path);
    if (o->on_file) o->on_file(o->on_file_ud, path);
    return KHUB_STATUS_OK;
}

static const char *template_text(const tmpl *t, const char *file)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s", t->kind, file);
    const khub_author_embedded *e = khub__author_template_file(path);
    return e ? (const char *)e->data : NULL;
}

/* kernel.json for the template and backends. */
static char *manifest_text(const char *repo, const char *name, const tmpl *t, int cpu, int cuda)
{
    char cpu_src[400] = "", cuda_src[600] = "", cpu_var[300] = "", cuda_var[200] = "";
    if (cpu) {
        snprintf(cpu_src, sizeof cpu_src, "\"cpu\": [\"%s.c\"]", name);
        snprintf(cpu_var, sizeof cpu_var,
                 "\"cpu\": [{\"level\": \"generic\"}, {\"level\": \"avx2\", \"flags\": "
                 "[\"-mavx2\", \"-mfma\", \"-mf16c\"], \"features\": [\"avx2\", \"fma\", "
                 "\"f16c\"]}]");
    }
    if (cuda) {
        snprintf(cuda_src, sizeof cuda_src, "\"cuda_host\": [\"%s_cuda.c\"], \"cuda\": [\"%s.cu\"]",
                 name, name);
        snprintf(cuda_var, sizeof cuda_var,
                 "\"cuda\": {\"capabilities\": [75, 80, 90], \"cubin\": false}");
    }
    size_t tests_len = strcspn(t->selftests, "\n"); /* the file's one line */
    size_t n = tests_len + 4096;
    char *out = malloc(n);
    if (!out) return NULL;
    snprintf(out, n,
             "{\n  \"repo\": \"%s\",\n  \"major\": 1,\n  \"version\": \"1.0.0\",\n"
             "  \"ops\": [{\"name\": \"%s\", \"kind\": \"%s\"}],\n"
             "  \"sources\": {%s%s%s},\n"
             "  \"variants\": {%s%s%s},\n"
             "  \"selftests\": %.*s\n}\n",
             repo, t->op, t->kind, cpu_src, cpu && cuda ? ", " : "", cuda_src, cpu_var,
             cpu && cuda ? ", " : "", cuda_var, (int)tests_len, t->selftests);
    return out;
}

static khub_status check_init_args(const khub_author_init_opts *o, const tmpl **t, char *errbuf,
                                   size_t errbuf_size)
{
    const char *repo = o->repo, *slash = repo ? strchr(repo, '/') : NULL;
    if (!slash || slash == repo || !slash[1] || strchr(slash + 1, '/') || strlen(repo) > 150)
        return khub__author_fail(errbuf, errbuf_size, KHUB_STATUS_INVALID_ARG,
                                 "'%s' is not ORG/NAME", repo ? repo : "(null)");
    if ((o->backends & ~(KHUB_AUTHOR_BACKEND_CPU | KHUB_AUTHOR_BACKEND_CUDA)) != 0)
        return khub__author_fail(errbuf, errbuf_size, KHUB_STATUS_INVALID_ARG,
                                 "backends 0x%x: only KHUB_AUTHOR_BACKEND_CPU and _CUDA exist",
                                 (unsigned)o->backends);
    char kinds[256];
    *t = o->kind ? find(o->kind) : NULL;
    if (!*t) {
        kinds_list(kinds, sizeof kinds, 0);
        return khub__author_fail(errbuf, errbuf_size, KHUB_STATUS_NOT_FOUND,
                                 "no template for kind '%s' (%s)", o->kind ? o->kind : "(null)",
                                 kinds);
    }
    if ((o->backends & KHUB_AUTHOR_BACKEND_CUDA) && !(*t)->cuda) {
        kinds_list(kinds, sizeof kinds, 1);
        return khub__author_fail(errbuf, errbuf_size, KHUB_STATUS_UNSUPPORTED,
                                 "kind '%s' has a template for cpu only (cuda is offered for %s)",
                                 o->kind, kinds);
    }
    return KHUB_STATUS_OK;
}

khub_status khub_author_init(const khub_author_init_opts *o, char *errbuf, size_t errbuf_size)
{
    KHUB_FORWARD_IF_ERROR(NULL,
                          KHUB_AUTHOR_STRUCT(o, khub_author_init_opts, on_file_ud,
                                             "khub_author_init", "opts", errbuf, errbuf_size));
    const tmpl *t = NULL;
    KHUB_FORWARD_IF_ERROR(NULL, check_init_args(o, &t, errbuf, errbuf_size));
    int cpu = !o->backends || (o->backends & KHUB_AUTHOR_BACKEND_CPU);
    int cuda = (o->backends & KHUB_AUTHOR_BACKEND_CUDA) != 0;
    const char *name = strchr(o->repo, '/') + 1;
    char cname[160];
    snprintf(cname, sizeof cname, "%s", name);
    for (char *p = cname; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9')))
            *p = '_';
    const char *dir = o->dir ? o->dir : name;
    if (mkdir(dir, 0755) != 0)
        return khub__author_fail(errbuf, errbuf_size,
                                 errno == EEXIST ? KHUB_STATUS_EXISTS : KHUB_STATUS_IO,
                                 "%s: cannot create directory (exists?)", dir);
    subst s = {o->repo, name, cname};
    char *manifest = manifest_text(o->repo, name, t, cpu, cuda);
    if (!manifest)
        return khub__author_fail(errbuf, errbuf_size, KHUB_STATUS_NOMEM, "out of memory");
    khub_status st = write_new(o, dir, "kernel.json", manifest, &s, errbuf, errbuf_size);
    free(manifest);
    if (st == KHUB_STATUS_OK)
        st = write_new(o, dir, ".gitignore", "/build/\n", &s, errbuf, errbuf_size);
    char file[300];
    const char *cpu_c = template_text(t, "cpu.c"), *cu = template_text(t, "kernel.cu");
    const char *glue = template_text(t, "cuda_glue.c");
    if (st == KHUB_STATUS_OK && (!cpu_c || (cuda && (!cu || !glue))))
        st = khub__author_fail(errbuf, errbuf_size, KHUB_STATUS_ERROR,
                               "template '%s' is incomplete in this build of libkhub_author",
                               t->kind);
    if (st == KHUB_STATUS_OK && cpu) {
        snprintf(file, sizeof file, "%s.c", name);
        st = write_new(o, dir, file, cpu_c, &s, errbuf, errbuf_size);
    }
    if (st == KHUB_STATUS_OK && cuda) {
        snprintf(file, sizeof file, "%s_cuda.c", name);
        st = write_new(o, dir, file, glue, &s, errbuf, errbuf_size);
        snprintf(file, sizeof file, "%s.cu", name);
        if (st == KHUB_STATUS_OK) st = write_new(o, dir, file, cu, &s, errbuf, errbuf_size);
    }
    return st;
}
