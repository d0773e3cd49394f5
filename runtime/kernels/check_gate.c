/*
 * check_gate.c: the gate behind `khub check` as a library call
 * (khub_check.h): khub_check_file over one plugin file, khub_check_dir over
 * a built kernel source tree. Each check appends a line to a report
 * (severity, code, variant, file, op, message) instead of printing; the CLI
 * prints the report line by line.
 *
 * What is loaded: only bytes the ABI gate read and passed, by their digest,
 * and only in the forked child of khub__check_in_child_declared (check.c).
 */
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "app_struct.h"
#include "check.h"
#include "elf_gate.h"
#include "internal.h"
#include "kernel_manifest.h"
#include "kernel_meta.h"
#include "plugin_artifacts.h"
#include "khub/khub_check.h"
#include "selftest.h"

/* ======================================================================== */
/* The report                                                               */
/* ======================================================================== */

typedef struct report_impl {
    khub_check_report pub; /* first: the caller's pointer is to this */
    khub_check_finding *items;
    size_t cap;
    bool nomem; /* a line was lost: the check returns NOMEM */
    khub_plugin_info info;
    char repo[200], version[32];
    char load_report[4096];
    char max_glibc[32], ceiling[64];
} report_impl;

static report_impl *report_new(void)
{
    report_impl *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->pub.struct_size = sizeof r->pub;
    r->pub.abi_major = KHUB_ABI_MAJOR;
    r->pub.abi_minor = KHUB_ABI_MINOR;
    r->pub.repo = r->repo;
    r->pub.version = r->version;
    r->pub.load_report = r->load_report;
    r->pub.max_glibc = r->max_glibc;
    r->pub.glibc_ceiling = r->ceiling;
    return r;
}

/* Appends a line; its four strings live in one block, which starts at
 * variant (so freeing variant frees them all). */
static void add_line(report_impl *r, khub_check_severity sev, khub_check_code code,
                     const char *variant, const char *file, const char *op, const char *msg)
{
    if (r->pub.n_findings == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 16;
        khub_check_finding *items = realloc(r->items, cap * sizeof *items);
        if (!items) {
            r->nomem = true;
            return;
        }
        r->items = items, r->cap = cap;
    }
    size_t lv = strlen(variant) + 1, lf = strlen(file) + 1, lo = strlen(op) + 1;
    char *block = malloc(lv + lf + lo + strlen(msg) + 1);
    if (!block) {
        r->nomem = true;
        return;
    }
    memcpy(block, variant, lv);
    memcpy(block + lv, file, lf);
    memcpy(block + lv + lf, op, lo);
    strcpy(block + lv + lf + lo, msg);
    r->items[r->pub.n_findings++] = (khub_check_finding){
        .struct_size = sizeof(khub_check_finding),
        .abi_major = KHUB_ABI_MAJOR,
        .abi_minor = KHUB_ABI_MINOR,
        .severity = sev,
        .code = code,
        .variant = block,
        .file = block + lv,
        .op = block + lv + lf,
        .message = block + lv + lf + lo,
    };
    if (sev == KHUB_CHECK_FAIL) r->pub.n_failed++;
}

static void addf(report_impl *r, khub_check_severity sev, khub_check_code code, const char *variant,
                 const char *file, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static void addf(report_impl *r, khub_check_severity sev, khub_check_code code, const char *variant,
                 const char *file, const char *fmt, ...)
{
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    add_line(r, sev, code, variant, file, "", msg);
}

/* A message from another function, which may already begin "file: ": then
 * that prefix becomes the line's file. Otherwise, the line is about file
 * when about_file (the text is about it without naming it), else it has no
 * file: the text names what it is about itself. */
static void add_text(report_impl *r, khub_check_severity sev, khub_check_code code,
                     const char *variant, const char *file, bool about_file, const char *op,
                     const char *text)
{
    size_t n = strlen(file);
    if (n && strncmp(text, file, n) == 0 && text[n] == ':' && text[n + 1] == ' ')
        add_line(r, sev, code, variant, file, op, text + n + 2);
    else
        add_line(r, sev, code, variant, about_file ? file : "", op, text);
}

const khub_check_finding *khub_check_report_finding(const khub_check_report *rep, size_t i)
{
    if (!rep || i >= rep->n_findings) return NULL;
    return &((const report_impl *)rep)->items[i];
}

void khub_check_report_free(khub_check_report *rep)
{
    report_impl *r = (report_impl *)rep;
    if (!r) return;
    for (size_t i = 0; i < r->pub.n_findings; i++) free((char *)r->items[i].variant);
    free(r->items);
    free(r);
}

/* Hands the report to the caller, or frees it when a line was lost. */
static khub_status report_done(report_impl *r, khub_check_report **out, char *errbuf, size_t n)
{
    if (!r->nomem) {
        *out = &r->pub;
        return KHUB_STATUS_OK;
    }
    khub_check_report_free(&r->pub);
    khub__errbuf(errbuf, n, "out of memory for the check's report");
    return KHUB_STATUS_NOMEM;
}

/* A small file, or NULL when it cannot be read whole. */
static char *slurp(const char *path, size_t max, size_t *n)
{
    char *buf = NULL;
    return khub__read_file(path, max, &buf, n, NULL, 0) == KHUB_STATUS_OK ? buf : NULL;
}

static bool ceiling_ok(const char *c)
{
    return strncmp(c, "GLIBC_", 6) == 0 && c[6] >= '0' && c[6] <= '9' && strlen(c) < 64;
}

/* The caller's options read into *o (NULL = all defaults), only up to its
 * struct_size; below 0.1's size it is refused (STRUCT_SIZE, the message
 * in errbuf and khub_last_error()): it read the 0.1 fields unchecked. */
static khub_status opts_read(const khub_check_opts *opts, khub_check_opts *o, const char *who,
                             char *errbuf, size_t errbuf_size)
{
    *o = (khub_check_opts){KHUB_APP_INIT(khub_check_opts)};
    if (!opts) return KHUB_STATUS_OK;
    char msg[KHUB_ERROR_SIZE];
    khub_status st = khub__app_struct_check(opts, KHUB__SIZE_TO(khub_check_opts, sha256), who,
                                            "opts", msg, sizeof msg);
    if (st != KHUB_STATUS_OK) {
        khub__fail(NULL, st, "%s", msg);
        khub__errbuf(errbuf, errbuf_size, "%s", msg);
        return st;
    }
    khub__app_copy_in(o, sizeof *o, opts);
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* khub_check_file                                                          */
/* ======================================================================== */

/* The ABI gate's violations as lines of r. */
static void add_gate_findings(report_impl *r, const khub_gate_report *g, const char *variant,
                              const char *path)
{
    for (size_t i = 0; i < g->n_findings; i++)
        add_line(r, KHUB_CHECK_FAIL, g->codes[i], variant, path, "", g->findings[i]);
}

/* Gates path; when it passes (and has the expected digest), loads and
 * self-tests it in a child. */
static void check_one_file(report_impl *r, const char *path, const char *digest)
{
    khub_gate_report gate;
    memset(&gate, 0, sizeof gate);
    khub_gate_policy pol = {.glibc_ceiling = r->ceiling};
    char gerr[KHUB_ERROR_SIZE] = "", sha[65] = "";
    r->pub.gate_status = khub__gate_check_file_sha(path, &pol, &gate, sha, gerr, sizeof gerr);
    snprintf(r->max_glibc, sizeof r->max_glibc, "%s", gate.max_glibc);
    add_gate_findings(r, &gate, "", path);
    if (r->pub.gate_status != KHUB_STATUS_OK && !gate.n_findings)
        add_text(r, KHUB_CHECK_FAIL, KHUB_CHECK_GATE_UNREADABLE, "", path, false, "", gerr);
    if (r->pub.gate_status != KHUB_STATUS_OK) {
        snprintf(r->load_report, sizeof r->load_report,
                 "not loaded: no plugin code runs until the ABI gate passes");
        return;
    }
    addf(r, KHUB_CHECK_PASS, KHUB_CHECK_GATE, "", path, "ABI gate passed (glibc %s, ceiling %s)",
         r->max_glibc[0] ? r->max_glibc : "none", r->ceiling);
    if (digest && strcasecmp(digest, sha) != 0) {
        snprintf(r->load_report, sizeof r->load_report,
                 "not loaded: its SHA-256 is %s, expected %s", sha, digest);
        r->pub.load_status = KHUB_STATUS_DIGEST_MISMATCH;
        add_line(r, KHUB_CHECK_FAIL, KHUB_CHECK_SELFTEST, "", path, "", r->load_report);
        return;
    }
    r->pub.load_status = khub__check_in_child(path, sha, r->load_report, sizeof r->load_report);
    r->pub.loaded = 1;
    add_text(r, r->pub.load_status == KHUB_STATUS_OK ? KHUB_CHECK_PASS : KHUB_CHECK_FAIL,
             KHUB_CHECK_SELFTEST, "", path, true, "", r->load_report);
}

khub_status khub_check_file(const char *path, const khub_check_opts *opts, khub_check_report **out,
                            char *errbuf, size_t errbuf_size)
{
    if (!path || !out) {
        khub__errbuf(errbuf, errbuf_size, "khub_check_file: misuse: NULL path or out");
        return KHUB_STATUS_MISUSE;
    }
    *out = NULL;
    khub_check_opts o;
    KHUB_FORWARD_IF_ERROR(NULL, opts_read(opts, &o, "khub_check_file", errbuf, errbuf_size));
    const char *ceiling = o.glibc_ceiling ? o.glibc_ceiling : "GLIBC_2.28";
    const char *digest = o.sha256;
    if (!ceiling_ok(ceiling)) {
        khub__errbuf(errbuf, errbuf_size, "glibc ceiling '%.64s' is not like GLIBC_2.28", ceiling);
        return KHUB_STATUS_INVALID_ARG;
    }
    report_impl *r = report_new();
    if (!r) {
        khub__errbuf(errbuf, errbuf_size, "out of memory for the check's report");
        return KHUB_STATUS_NOMEM;
    }
    snprintf(r->ceiling, sizeof r->ceiling, "%s", ceiling);
    char err[KHUB_ERROR_SIZE] = "";
    r->info = (khub_plugin_info){KHUB_STRUCT_INIT(khub_plugin_info)};
    r->pub.inspect_status = khub_plugin_inspect(path, &r->info, err, sizeof err);
    r->pub.gate_status = r->pub.inspect_status;
    if (r->pub.inspect_status == KHUB_STATUS_OK) {
        r->pub.info = &r->info;
        check_one_file(r, path, digest);
    } else {
        add_text(r, KHUB_CHECK_FAIL, KHUB_CHECK_INSPECT, "", path, false, "", err);
    }
    return report_done(r, out, errbuf, errbuf_size);
}

/* ======================================================================== */
/* khub_check_dir: one variant                                              */
/* ======================================================================== */

/* What check_variant works on. */
typedef struct variant_ctx {
    report_impl *r;
    const khub_kernel_manifest *m;
    const khub_kmeta *meta;
    const char *variant;
    char vdir[1300];
} variant_ctx;

/* kernel.json's ops' kinds as a mask. */
static uint32_t manifest_kinds(const khub_kernel_manifest *m)
{
    uint32_t kinds = 0;
    for (size_t i = 0; i < m->n_ops; i++) kinds |= 1u << m->ops[i].kind;
    return kinds;
}

static void kind_list(uint32_t mask, char *buf, size_t n)
{
    buf[0] = '\0';
    for (uint32_t k = 1; k < KHUB_OP_KIND__COUNT; k++)
        if (mask & (1u << k))
            snprintf(buf + strlen(buf), n - strlen(buf), " %s", khub__op_kind_name(k));
}

/* The note the gate read against metadata.json and kernel.json. */
static void check_note(variant_ctx *v, const khub_gate_report *rep, const char *path)
{
    const khub_kmeta *meta = v->meta;
    if (strcmp(rep->note.id, meta->name) != 0 || strcmp(rep->note.version, meta->version) != 0)
        addf(v->r, KHUB_CHECK_FAIL, KHUB_CHECK_NOTE_MISMATCH, v->variant, path,
             "ABI note says %s %s, metadata.json says %s %s", rep->note.id, rep->note.version,
             meta->name, meta->version);
    if (rep->note.abi_major != meta->abi_major || rep->note.abi_minor != meta->abi_minor)
        addf(v->r, KHUB_CHECK_FAIL, KHUB_CHECK_NOTE_MISMATCH, v->variant, path,
             "ABI note says ABI %u.%u, metadata.json says %u.%u", rep->note.abi_major,
             rep->note.abi_minor, meta->abi_major, meta->abi_minor);
    uint32_t kinds = manifest_kinds(v->m); /* the note's kinds (read without loading) */
    if (rep->note.kinds && rep->note.kinds != kinds) {
        char a[160], b[160];
        kind_list(rep->note.kinds, a, sizeof a);
        kind_list(kinds, b, sizeof b);
        addf(v->r, KHUB_CHECK_FAIL, KHUB_CHECK_NOTE_KINDS, v->variant, path,
             "ABI note says kinds {%s }, kernel.json's ops are {%s }", a, b);
    }
}

/* The ABI gate on one read of the plugin; true when it passed and the bytes
 * it read are the ones metadata.json's digest names (so the child that
 * loads them by that digest runs exactly what was gated). */
static bool check_plugin_file(variant_ctx *v, const char *file)
{
    char path[2400], err[KHUB_ERROR_SIZE] = "", sha[65] = "";
    snprintf(path, sizeof path, "%s/%s", v->vdir, file);
    khub_gate_report rep;
    memset(&rep, 0, sizeof rep);
    khub_gate_policy pol = {.glibc_ceiling = v->m->glibc_ceiling[0] ? v->m->glibc_ceiling : NULL};
    khub_status st = khub__gate_check_file_sha(path, &pol, &rep, sha, err, sizeof err);
    if (st != KHUB_STATUS_OK && st != KHUB_STATUS_PLUGIN_INVALID) {
        add_text(v->r, KHUB_CHECK_FAIL, KHUB_CHECK_GATE_UNREADABLE, v->variant, path, false, "",
                 err);
        return false;
    }
    const char *want = khub__kmeta_digest(v->meta, file);
    if (!want || strcasecmp(want, sha) != 0) {
        addf(v->r, KHUB_CHECK_FAIL, KHUB_CHECK_GATE_DIGEST, v->variant, path,
             "the bytes the ABI gate read have SHA-256 %s, metadata.json says %s", sha,
             want ? want : "nothing");
        return false;
    }
    add_gate_findings(v->r, &rep, v->variant, path);
    if (!rep.has_note) return false;
    check_note(v, &rep, path);
    if (!rep.n_findings)
        addf(v->r, KHUB_CHECK_PASS, KHUB_CHECK_GATE, v->variant, path, "ABI gate (glibc %s)",
             rep.max_glibc[0] ? rep.max_glibc : "none");
    return st == KHUB_STATUS_OK;
}

/* A cubin's ELF header names the SM it runs on; it must be metadata.json's. */
static void check_cubin(variant_ctx *v, const khub_kmeta_artifact *a, const char *path)
{
    size_t n = 0;
    unsigned char *bin = (unsigned char *)slurp(path, 256u << 20, &n);
    int sm = 0;
    khub_status st = bin ? khub__cubin_inspect(bin, n, &sm) : KHUB_STATUS_IO;
    free(bin);
    if (st != KHUB_STATUS_OK)
        addf(v->r, KHUB_CHECK_FAIL, KHUB_CHECK_CUBIN, v->variant, path, "not a CUDA ELF cubin (%s)",
             khub_status_name(st));
    else if (sm != a->sm)
        addf(v->r, KHUB_CHECK_FAIL, KHUB_CHECK_CUBIN, v->variant, path,
             "cubin is for sm_%d, metadata.json says sm_%d", sm, a->sm);
    else
        addf(v->r, KHUB_CHECK_PASS, KHUB_CHECK_CUBIN, v->variant, path, "cubin for sm_%d", sm);
}

static void check_ptx(variant_ctx *v, const khub_kmeta_artifact *a, const char *path)
{
    size_t n = 0;
    char *ptx = slurp(path, 64u << 20, &n);
    int isa = 0, sm = 0;
    char suffix = 0;
    if (!ptx || khub__ptx_inspect(ptx, n, &isa, &sm, &suffix) != KHUB_STATUS_OK)
        addf(v->r, KHUB_CHECK_FAIL, KHUB_CHECK_PTX, v->variant, path,
             "no readable .version/.target directives");
    else if (sm != a->sm || (a->ptx_isa && isa != a->ptx_isa))
        addf(v->r, KHUB_CHECK_FAIL, KHUB_CHECK_PTX, v->variant, path,
             "PTX says .target sm_%d .version %d.%d, metadata.json says sm_%d ISA %d.%d", sm,
             isa / 10, isa % 10, a->sm, a->ptx_isa / 10, a->ptx_isa % 10);
    else
        addf(v->r, KHUB_CHECK_PASS, KHUB_CHECK_PTX, v->variant, path,
             ".target sm_%d%c .version %d.%d", sm, suffix ? suffix : ' ', isa / 10, isa % 10);
    free(ptx);
}

static void check_artifacts(variant_ctx *v)
{
    for (size_t i = 0; i < v->meta->n_artifacts; i++) {
        const khub_kmeta_artifact *a = &v->meta->artifacts[i];
        char path[2400];
        snprintf(path, sizeof path, "%s/%s", v->vdir, a->file);
        if (strcmp(a->kind, "cubin") == 0)
            check_cubin(v, a, path);
        else if (strcmp(a->kind, "ptx") == 0)
            check_ptx(v, a, path);
    }
}

/* The op a failed self-test report is about: the op of its last test line
 * ("...; rms_norm [4, 576] f32: NMSE ...") or of a declared-ops mismatch
 * ("kernel.json declares op 'rms_norm' ..."); "" when neither. */
static void failed_op(const khub_kernel_manifest *m, const char *report, char *op, size_t n)
{
    op[0] = '\0';
    const char *decl = strstr(report, "declares op '");
    if (decl) {
        decl += strlen("declares op '");
        size_t len = strcspn(decl, "'");
        snprintf(op, n, "%.*s", (int)(len < n ? len : n - 1), decl);
        return;
    }
    const char *last = report, *s;
    while ((s = strstr(last, "; ")) != NULL) last = s + 2;
    for (size_t i = 0; i < m->n_tests; i++) {
        size_t len = strlen(m->tests[i].op);
        if (strncmp(last, m->tests[i].op, len) == 0 && strncmp(last + len, " [", 2) == 0) {
            snprintf(op, n, "%s", m->tests[i].op);
            return;
        }
    }
}

/* The variant's files other than its plugins, as verified artifacts (the
 * gate checked every digest): what a CUDA glue loads its PTX from. */
typedef struct artifact_list {
    khub__artifact_file files[KHUB_KMETA_MAX_FILES];
    char paths[KHUB_KMETA_MAX_FILES][1400];
    size_t n;
} artifact_list;

static void artifacts_of(const variant_ctx *v, artifact_list *af)
{
    for (size_t i = 0; i < v->meta->n_files && af->n < KHUB_KMETA_MAX_FILES; i++) {
        const khub_kmeta_file *f = &v->meta->files[i];
        bool plugin = false;
        for (size_t k = 0; k < v->meta->n_plugins; k++)
            plugin = plugin || !strcmp(v->meta->plugins[k].file, f->name);
        if (plugin) continue;
        snprintf(af->paths[af->n], sizeof af->paths[0], "%s/%s", v->vdir, f->name);
        af->files[af->n] = (khub__artifact_file){f->name, af->paths[af->n], f->sha256};
        af->n++;
    }
}

/* Loads and self-tests each plugin the gate passed, in a child. */
static void run_selftests(variant_ctx *v, const bool *gated)
{
    const khub_kernel_manifest *m = v->m;
    khub_selftest_spec specs[KHUB_KM_MAX_TESTS];
    for (size_t i = 0; i < m->n_tests; i++) {
        specs[i] = (khub_selftest_spec){
            m->tests[i].op, {0}, m->tests[i].ndim, m->tests[i].dtype, m->tests[i].tolerance};
        memcpy(specs[i].shape, m->tests[i].shape, sizeof specs[i].shape);
    }
    khub_check_op ops[KHUB_KM_MAX_OPS];
    for (size_t i = 0; i < m->n_ops; i++)
        ops[i] =
            (khub_check_op){m->ops[i].name, m->ops[i].kind, khub__op_kind_name(m->ops[i].kind)};
    uint32_t cpu = khub_cpu_features();
    int cuda = strcmp(v->meta->backend, "cuda") == 0;
    /* A CUDA variant's numbers run through the device when one is present
     * (selftest_cuda.c), its PTX served as artifacts; without one only its
     * glue is loaded and checked. */
    bool numeric = !cuda || khub__selftest_cuda_present();
    artifact_list af = {0};
    if (cuda && numeric) artifacts_of(v, &af);
    for (size_t i = 0; i < v->meta->n_plugins; i++) {
        const khub_kmeta_plugin *p = &v->meta->plugins[i];
        char path[2400], report[4096] = "", op[64];
        snprintf(path, sizeof path, "%s/%s", v->vdir, p->file);
        if (!gated[i]) {
            addf(v->r, KHUB_CHECK_SKIP, KHUB_CHECK_SELFTEST, v->variant, path,
                 "not loaded, the ABI gate did not pass it (no plugin code runs before it does)");
            continue;
        }
        if ((p->cpu_features & cpu) != p->cpu_features) {
            addf(v->r, KHUB_CHECK_SKIP, KHUB_CHECK_SELFTEST, v->variant, path,
                 "this CPU lacks the level's features");
            continue;
        }
        khub_status st = khub__check_in_child_declared(
            path, khub__kmeta_digest(v->meta, p->file), numeric ? specs : NULL,
            numeric ? m->n_tests : 0, ops, m->n_ops, af.files, af.n, report, sizeof report);
        if (st != KHUB_STATUS_OK) {
            failed_op(m, report, op, sizeof op);
            add_text(v->r, KHUB_CHECK_FAIL, KHUB_CHECK_SELFTEST, v->variant, path, true, op,
                     report);
        } else {
            addf(v->r, KHUB_CHECK_PASS, KHUB_CHECK_SELFTEST, v->variant, path, "%s%s", report,
                 numeric ? "" : " (numeric self-tests need a GPU: skipped)");
        }
    }
}

/* metadata.json of the variant, parsed; NULL after adding why. */
static khub_kmeta *read_meta(variant_ctx *v, const char *mpath)
{
    char err[KHUB_ERROR_SIZE] = "";
    size_t n = 0;
    char *json = slurp(mpath, 4u << 20, &n);
    if (!json) {
        addf(v->r, KHUB_CHECK_FAIL, KHUB_CHECK_METADATA, v->variant, mpath,
             "missing or unreadable");
        return NULL;
    }
    khub_kmeta *meta = calloc(1, sizeof *meta);
    khub_status st = meta ? khub__kmeta_parse(json, n, meta, err, sizeof err) : KHUB_STATUS_NOMEM;
    free(json);
    if (st == KHUB_STATUS_OK) return meta;
    addf(v->r, KHUB_CHECK_FAIL, KHUB_CHECK_METADATA, v->variant, mpath, "%s",
         meta ? err : "out of memory");
    free(meta);
    return NULL;
}

static void check_variant(report_impl *r, const khub_kernel_manifest *m, const char *build,
                          const char *variant)
{
    variant_ctx v = {.r = r, .m = m, .variant = variant};
    char mpath[1400], err[KHUB_ERROR_SIZE] = "";
    snprintf(v.vdir, sizeof v.vdir, "%s/%s", build, variant);
    snprintf(mpath, sizeof mpath, "%s/metadata.json", v.vdir);
    khub_kmeta *meta = read_meta(&v, mpath);
    if (!meta) return;
    v.meta = meta;
    addf(r, KHUB_CHECK_INFO, KHUB_CHECK_VARIANT, variant, "", "%s (%s, %zu files)", variant,
         meta->backend, meta->n_files);
    if (strcmp(meta->name, m->repo) != 0 || strcmp(meta->version, m->version) != 0 ||
        meta->major != m->major)
        addf(r, KHUB_CHECK_FAIL, KHUB_CHECK_METADATA_MISMATCH, variant, mpath,
             "says %s %s (v%d), kernel.json says %s %s (v%d): rebuild", meta->name, meta->version,
             meta->major, m->repo, m->version, m->major);
    if (khub__kmeta_verify_dir(meta, v.vdir, err, sizeof err) != KHUB_STATUS_OK)
        add_text(r, KHUB_CHECK_FAIL, KHUB_CHECK_DIGESTS, variant, v.vdir, false, "", err);
    else
        addf(r, KHUB_CHECK_PASS, KHUB_CHECK_DIGESTS, variant, v.vdir,
             "every file matches its SHA-256");
    char sig[1500];
    snprintf(sig, sizeof sig, "%s.sig", mpath);
    struct stat sb;
    addf(r, KHUB_CHECK_INFO, KHUB_CHECK_SIGNATURE, variant, mpath, "%s",
         stat(sig, &sb) == 0 ? "signed (metadata.json.sig)" : "unsigned");
    bool gated[KHUB_KMETA_MAX_PLUGINS] = {false};
    for (size_t i = 0; i < meta->n_plugins; i++)
        gated[i] = check_plugin_file(&v, meta->plugins[i].file);
    check_artifacts(&v);
    run_selftests(&v, gated);
    free(meta);
}

/* ======================================================================== */
/* khub_check_dir                                                           */
/* ======================================================================== */

/* Every variant folder of build/, in readdir order. */
static void check_variants(report_impl *r, const khub_kernel_manifest *m, const char *build, DIR *d)
{
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char p[2400];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", build, e->d_name);
        if (e->d_name[0] == '.' || stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) continue;
        check_variant(r, m, build, e->d_name);
        r->pub.n_variants++;
    }
    if (!r->pub.n_variants)
        addf(r, KHUB_CHECK_FAIL, KHUB_CHECK_NO_VARIANTS, "", build, "no variant directories");
}

khub_status khub_check_dir(const char *dir, const khub_check_opts *opts, khub_check_report **out,
                           char *errbuf, size_t errbuf_size)
{
    if (!dir || !out) {
        khub__errbuf(errbuf, errbuf_size, "khub_check_dir: misuse: NULL dir or out");
        return KHUB_STATUS_MISUSE;
    }
    *out = NULL;
    khub_check_opts o;
    KHUB_FORWARD_IF_ERROR(NULL, opts_read(opts, &o, "khub_check_dir", errbuf, errbuf_size));
    if (o.glibc_ceiling) {
        khub__errbuf(errbuf, errbuf_size,
                     "a glibc ceiling is for file checks (a kernel tree sets \"glibc_ceiling\" "
                     "in kernel.json)");
        return KHUB_STATUS_INVALID_ARG;
    }
    khub_kernel_manifest *m = calloc(1, sizeof *m);
    report_impl *r = m ? report_new() : NULL;
    khub_status st = r ? khub__km_load(dir, m, errbuf, errbuf_size) : KHUB_STATUS_NOMEM;
    if (st == KHUB_STATUS_NOMEM) khub__errbuf(errbuf, errbuf_size, "out of memory");
    char build[1100];
    snprintf(build, sizeof build, "%s/build", dir);
    DIR *d = st == KHUB_STATUS_OK ? opendir(build) : NULL;
    if (st == KHUB_STATUS_OK && !d) {
        khub__errbuf(errbuf, errbuf_size, "%s: not built (run 'khub build %s')", build, dir);
        st = KHUB_STATUS_NOT_FOUND;
    }
    if (st != KHUB_STATUS_OK) {
        khub_check_report_free(r ? &r->pub : NULL);
        free(m);
        return st;
    }
    snprintf(r->repo, sizeof r->repo, "%s", m->repo);
    snprintf(r->version, sizeof r->version, "%s", m->version);
    check_variants(r, m, build, d);
    closedir(d);
    free(m);
    return report_done(r, out, errbuf, errbuf_size);
}
