/*
 * check_kernel.c: `khub check DIR`, the publish-time gate over a built
 * kernel source tree. For every DIR/build/<variant>/ it checks:
 *   - metadata.json parses, names the manifest's repo, version and major,
 *     and every file's SHA-256 matches (no unlisted files);
 *   - every plugin .so passes the ABI gate (exports, imports, glibc ceiling,
 *     RPATH, NODELETE, GNU_UNIQUE) and its ABI note agrees with metadata.json;
 *   - every PTX artifact's .target and .version, and every cubin's SM (its
 *     ELF header), agree with metadata.json;
 *   - in a child process, only for plugins the gate passed and only the
 *     bytes it read: each plugin this machine can run loads, passes
 *     its own selftest and the manifest's numeric self-tests against
 *     khub/ref-cpu (CUDA numerics need a GPU and are reported as skipped).
 * Every finding is printed; the exit status is 1 if there was any.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "check.h"
#include "check_kernel.h"
#include "elf_gate.h"
#include "kernel_manifest.h"
#include "kernel_meta.h"
#include "selftest.h"

typedef struct tally {
    int findings;
} tally;

static void finding(tally *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void finding(tally *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    t->findings++;
}

/* A small file, or NULL when it cannot be read whole. */
static char *slurp(const char *path, size_t max, size_t *n)
{
    char *buf = NULL;
    return khub__read_file(path, max, &buf, n, NULL, 0) == KHUB_STATUS_OK ? buf : NULL;
}

/* The ABI gate on one read of the plugin; returns 1 when it passed and the
 * bytes it read are the ones metadata.json's digest names (so the child
 * that loads them by that digest runs exactly what was gated). */
static int check_plugin_file(const khub_kernel_manifest *m, const khub_kmeta *meta,
                             const char *vdir, const char *file, tally *t)
{
    char path[2400], err[KHUB_ERROR_SIZE], sha[65] = "";
    snprintf(path, sizeof path, "%s/%s", vdir, file);
    khub_gate_report rep;
    khub_gate_policy pol = {.glibc_ceiling = m->glibc_ceiling[0] ? m->glibc_ceiling : NULL};
    khub_status st = khub__gate_check_file_sha(path, &pol, &rep, sha, err, sizeof err);
    if (st != KHUB_STATUS_OK && st != KHUB_STATUS_PLUGIN_INVALID) {
        finding(t, "%s", err);
        return 0;
    }
    const char *want = khub__kmeta_digest(meta, file);
    if (!want || strcasecmp(want, sha) != 0) {
        finding(t, "%s: the bytes the ABI gate read have SHA-256 %s, metadata.json says %s", path,
                sha, want ? want : "nothing");
        return 0;
    }
    for (size_t i = 0; i < rep.n_findings; i++) finding(t, "%s: %s", path, rep.findings[i]);
    if (!rep.has_note) return 0;
    if (strcmp(rep.note.id, meta->name) != 0 || strcmp(rep.note.version, meta->version) != 0)
        finding(t, "%s: ABI note says %s %s, metadata.json says %s %s", path, rep.note.id,
                rep.note.version, meta->name, meta->version);
    if (rep.note.abi_major != meta->abi_major || rep.note.abi_minor != meta->abi_minor)
        finding(t, "%s: ABI note says ABI %u.%u, metadata.json says %u.%u", path,
                rep.note.abi_major, rep.note.abi_minor, meta->abi_major, meta->abi_minor);
    uint32_t kinds = 0; /* the note's kinds (read without loading) are kernel.json's */
    for (size_t i = 0; i < m->n_ops; i++) kinds |= 1u << m->ops[i].kind;
    if (rep.note.kinds && rep.note.kinds != kinds) {
        char a[160] = "", b[160] = "";
        for (uint32_t k = 1; k < KHUB_OP_KIND__COUNT; k++) {
            if (rep.note.kinds & (1u << k))
                snprintf(a + strlen(a), sizeof a - strlen(a), " %s", khub__op_kind_name(k));
            if (kinds & (1u << k))
                snprintf(b + strlen(b), sizeof b - strlen(b), " %s", khub__op_kind_name(k));
        }
        finding(t, "%s: ABI note says kinds {%s }, kernel.json's ops are {%s }", path, a, b);
    }
    if (!rep.n_findings)
        printf("ok   %s: ABI gate (glibc %s)\n", path, rep.max_glibc[0] ? rep.max_glibc : "none");
    return st == KHUB_STATUS_OK;
}

/* A cubin's ELF header names the SM it runs on; it must be metadata.json's. */
static void check_cubin(const khub_kmeta_artifact *a, const char *path, tally *t)
{
    size_t n = 0;
    unsigned char *bin = (unsigned char *)slurp(path, 256u << 20, &n);
    int sm = 0;
    khub_status st = bin ? khub__cubin_inspect(bin, n, &sm) : KHUB_STATUS_IO;
    free(bin);
    if (st != KHUB_STATUS_OK)
        finding(t, "%s: not a CUDA ELF cubin (%s)", path, khub_status_name(st));
    else if (sm != a->sm)
        finding(t, "%s: cubin is for sm_%d, metadata.json says sm_%d", path, sm, a->sm);
    else
        printf("ok   %s: cubin for sm_%d\n", path, sm);
}

static void check_artifacts(const khub_kmeta *meta, const char *vdir, tally *t)
{
    for (size_t i = 0; i < meta->n_artifacts; i++) {
        const khub_kmeta_artifact *a = &meta->artifacts[i];
        char path[2400];
        snprintf(path, sizeof path, "%s/%s", vdir, a->file);
        if (strcmp(a->kind, "cubin") == 0) {
            check_cubin(a, path, t);
            continue;
        }
        if (strcmp(a->kind, "ptx") != 0) continue;
        size_t n = 0;
        char *ptx = slurp(path, 64u << 20, &n);
        int isa = 0, sm = 0;
        char suffix = 0;
        if (!ptx || khub__ptx_inspect(ptx, n, &isa, &sm, &suffix) != KHUB_STATUS_OK)
            finding(t, "%s: no readable .version/.target directives", path);
        else if (sm != a->sm || (a->ptx_isa && isa != a->ptx_isa))
            finding(t,
                    "%s: PTX says .target sm_%d .version %d.%d, metadata.json says sm_%d ISA %d.%d",
                    path, sm, isa / 10, isa % 10, a->sm, a->ptx_isa / 10, a->ptx_isa % 10);
        else
            printf("ok   %s: .target sm_%d%c .version %d.%d\n", path, sm, suffix ? suffix : ' ',
                   isa / 10, isa % 10);
        free(ptx);
    }
}

static void run_selftests(const khub_kernel_manifest *m, const khub_kmeta *meta, const char *vdir,
                          const int *gated, tally *t)
{
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
    int cuda = strcmp(meta->backend, "cuda") == 0;
    for (size_t i = 0; i < meta->n_plugins; i++) {
        const khub_kmeta_plugin *p = &meta->plugins[i];
        char path[2400], report[4096];
        snprintf(path, sizeof path, "%s/%s", vdir, p->file);
        if (!gated[i]) {
            printf("skip %s: not loaded, the ABI gate did not pass it (no plugin code runs "
                   "before it does)\n",
                   path);
            continue;
        }
        if ((p->cpu_features & cpu) != p->cpu_features) {
            printf("skip %s: this CPU lacks the level's features\n", path);
            continue;
        }
        khub_status st = khub__check_in_child_declared(path, khub__kmeta_digest(meta, p->file),
                                                       cuda ? NULL : specs, cuda ? 0 : m->n_tests,
                                                       ops, m->n_ops, report, sizeof report);
        size_t pl = strlen(path); /* a crash or timeout report names the path already */
        if (st != KHUB_STATUS_OK && strncmp(report, path, pl) == 0 && report[pl] == ':')
            finding(t, "%s", report);
        else if (st != KHUB_STATUS_OK)
            finding(t, "%s: %s", path, report);
        else
            printf("ok   %s: %s%s\n", path, report,
                   cuda ? " (numeric self-tests need a GPU: skipped)" : "");
    }
}

static void check_variant(const khub_kernel_manifest *m, const char *build, const char *variant,
                          tally *t)
{
    char vdir[1300], mpath[1400], err[KHUB_ERROR_SIZE];
    snprintf(vdir, sizeof vdir, "%s/%s", build, variant);
    snprintf(mpath, sizeof mpath, "%s/metadata.json", vdir);
    size_t n = 0;
    char *json = slurp(mpath, 4u << 20, &n);
    if (!json) {
        finding(t, "%s: missing or unreadable", mpath);
        return;
    }
    khub_kmeta *meta = calloc(1, sizeof *meta);
    khub_status st = meta ? khub__kmeta_parse(json, n, meta, err, sizeof err) : KHUB_STATUS_NOMEM;
    free(json);
    if (st != KHUB_STATUS_OK) {
        finding(t, "%s: %s", mpath, err);
        free(meta);
        return;
    }
    printf("---- %s (%s, %zu files)\n", variant, meta->backend, meta->n_files);
    if (strcmp(meta->name, m->repo) != 0 || strcmp(meta->version, m->version) != 0 ||
        meta->major != m->major)
        finding(t, "%s: says %s %s (v%d), kernel.json says %s %s (v%d): rebuild", mpath, meta->name,
                meta->version, meta->major, m->repo, m->version, m->major);
    if (khub__kmeta_verify_dir(meta, vdir, err, sizeof err) != KHUB_STATUS_OK)
        finding(t, "%s", err);
    else
        printf("ok   %s: every file matches its SHA-256\n", vdir);
    char sig[1500];
    snprintf(sig, sizeof sig, "%s.sig", mpath);
    struct stat sb;
    printf("     %s: %s\n", mpath, stat(sig, &sb) == 0 ? "signed (metadata.json.sig)" : "unsigned");
    int gated[KHUB_KMETA_MAX_PLUGINS] = {0};
    for (size_t i = 0; i < meta->n_plugins; i++)
        gated[i] = check_plugin_file(m, meta, vdir, meta->plugins[i].file, t);
    check_artifacts(meta, vdir, t);
    run_selftests(m, meta, vdir, gated, t);
    free(meta);
}

int khub_cli_check_kernel_dir(const char *dir)
{
    khub_kernel_manifest *m = calloc(1, sizeof *m);
    char err[KHUB_ERROR_SIZE];
    if (!m) return 1;
    if (khub__km_load(dir, m, err, sizeof err) != KHUB_STATUS_OK) {
        printf("FAIL %s\n", err);
        free(m);
        return 1;
    }
    char build[1100];
    snprintf(build, sizeof build, "%s/build", dir);
    DIR *d = opendir(build);
    if (!d) {
        printf("FAIL %s: not built (run 'khub build %s')\n", build, dir);
        free(m);
        return 1;
    }
    tally t = {0};
    int variants = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char p[2400];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", build, e->d_name);
        if (e->d_name[0] == '.' || stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) continue;
        check_variant(m, build, e->d_name, &t);
        variants++;
    }
    closedir(d);
    if (!variants) finding(&t, "%s: no variant directories", build);
    printf("%s %s %s: %d variant%s, %d finding%s\n", t.findings ? "FAIL" : "ok  ", m->repo,
           m->version, variants, variants == 1 ? "" : "s", t.findings, t.findings == 1 ? "" : "s");
    free(m);
    return t.findings ? 1 : 0;
}
