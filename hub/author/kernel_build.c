/*
 * kernel_build.c: builds the variants of a kernel source tree (see
 * kernel_build.h).
 *
 * Compilers run as child processes with an explicit argv (no shell, so
 * file names from kernel.json are never interpreted); their stderr is
 * captured and the first lines go into the error message. Outputs are
 * written into a fresh variant directory; a failed build leaves no
 * metadata.json behind, so a half-built variant is never publishable.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <archive.h>
#include <archive_entry.h>
#include <cjson/cJSON.h>

#include "elf_gate.h"
#include "install_paths.h"
#include "kernel_build.h"
#include "nvrtc.h"

#define MAX_ARGS                   96
#define KHUB_KMETA_MAX_FILES_BUILD 64

/* ======================================================================== */
/* Small helpers                                                            */
/* ======================================================================== */

static void progress(const khub_build_opts *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void progress(const khub_build_opts *o, const char *fmt, ...)
{
    if (!o || !o->progress) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    o->progress(o->progress_ud, line);
}

static const char *host_arch(void)
{
#if defined(__x86_64__)
    return "x86_64";
#elif defined(__aarch64__)
    return "aarch64";
#else
    static struct utsname u;
    uname(&u);
    return u.machine;
#endif
}

void khub__cpu_variant_name(char *buf, size_t n)
{
    snprintf(buf, n, "khub%d-cpu-%s-linux", KHUB_ABI_MAJOR, host_arch());
}

static khub_status mkdir_p(const char *path)
{
    char tmp[2048];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return KHUB_STATUS_IO;
        *p = '/';
    }
    return (mkdir(tmp, 0755) == 0 || errno == EEXIST) ? KHUB_STATUS_OK : KHUB_STATUS_IO;
}

/* Empties a variant directory of regular files (it holds only our outputs). */
static khub_status clean_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return mkdir_p(dir);
    struct dirent *e;
    char path[2300];
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    return KHUB_STATUS_OK;
}

static khub_status write_file_atomic(const char *path, const void *data, size_t n)
{
    char tmp[2300];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) return KHUB_STATUS_IO;
    int ok = fwrite(data, 1, n, f) == n;
    ok &= fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok &= fclose(f) == 0;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return KHUB_STATUS_IO;
    }
    return KHUB_STATUS_OK;
}

/* Runs argv, stdout/stderr captured; on failure the first 400 bytes of the
 * output go into errbuf. Returns the exit status (or -1). */
static int run(char *const argv[], char *out, size_t out_n)
{
    char logpath[] = "/tmp/khub-build-XXXXXX";
    int logfd = mkstemp(logpath);
    if (logfd < 0) return -1;
    unlink(logpath);
    pid_t pid = fork();
    if (pid < 0) {
        close(logfd);
        return -1;
    }
    if (pid == 0) {
        dup2(logfd, 1);
        dup2(logfd, 2);
        execvp(argv[0], argv);
        _exit(127);
    }
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
    }
    if (out && out_n) {
        lseek(logfd, 0, SEEK_SET);
        ssize_t r = read(logfd, out, out_n - 1);
        out[r > 0 ? r : 0] = '\0';
        for (char *p = out; *p; p++)
            if (*p == '\n') *p = ' ';
    }
    close(logfd);
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
}

/* First line of `cmd --version`, or "unknown". */
static void tool_version(const char *cmd, char *buf, size_t n)
{
    char out[512];
    char *argv[] = {(char *)cmd, "--version", NULL};
    if (run(argv, out, sizeof out) != 0) {
        snprintf(buf, n, "unknown");
        return;
    }
    /* run() turned newlines into spaces; keep up to the first ")" line end */
    snprintf(buf, n, "%s", out);
    char *cut = strstr(buf, "Copyright");
    if (cut) *cut = '\0';
    size_t len = strlen(buf);
    while (len && buf[len - 1] == ' ') buf[--len] = '\0';
}

/* git commit and dirty flag of the source directory. The tree's own build/
 * is left out of the status: it is this build's output, untracked (or
 * ignored) in every source tree, and would otherwise mark each one dirty.
 * Outside a git work tree the commit is "unknown" and dirty is 1: nothing
 * vouches that the sources are a committed state. */
static void provenance(const char *dir, char *commit, size_t n, int *dirty)
{
    char out[512];
    char *rev[] = {"git", "-C", (char *)dir, "rev-parse", "HEAD", NULL};
    snprintf(commit, n, "unknown");
    *dirty = 1;
    if (run(rev, out, sizeof out) != 0) return;
    if (strlen(out) >= 40) {
        memcpy(commit, out, 40);
        commit[40] = '\0';
    }
    char *st[] = {"git", "-C", (char *)dir,       "status", "--porcelain",
                  "--",  ".",  ":(exclude)build", NULL};
    if (run(st, out, sizeof out) == 0) *dirty = out[0] != '\0';
}

/* The folder holding khub/khub_plugin.h: the option or $KHUB_INCLUDE_DIR,
 * else the include folder of the install prefix this code runs from (an
 * installed khub builds against its own headers), else the source tree's,
 * else the configured install folder. */
static const char *find_include_dir(const khub_build_opts *o)
{
    static const char *candidates[4];
    static char relocated[PATH_MAX];
    candidates[0] = (o && o->include_dir) ? o->include_dir : getenv("KHUB_INCLUDE_DIR");
    candidates[1] = khub__install_path(KHUB_INCLUDE_INSTALL_REL, relocated, sizeof relocated)
                        ? relocated
                        : NULL;
    candidates[2] = KHUB_ABI_SOURCE_DIR;
    candidates[3] = KHUB_ABI_INSTALL_DIR;
    for (int i = 0; i < 4; i++) {
        if (!candidates[i]) continue;
        char probe[1200];
        snprintf(probe, sizeof probe, "%s/khub/khub_plugin.h", candidates[i]);
        if (access(probe, R_OK) == 0) return candidates[i];
    }
    return NULL;
}

/* ======================================================================== */
/* metadata.json                                                            */
/* ======================================================================== */

typedef struct built_file {
    char name[128];
    char sha256[65];
    const char *level; /* for plugins */
    uint32_t features; /* for plugins */
    int is_plugin;
    int sm, ptx_isa;  /* for PTX and cubin artifacts */
    const char *kind; /* "ptx", "cubin"; "source" for a CUDA source shipped for load-time
                         compilation (digested in files, not an artifacts entry) */
} built_file;

static void add_features(cJSON *arr, uint32_t f)
{
    for (size_t i = 0; i < khub__cpu_features_count; i++)
        if (f & khub__cpu_features_table[i].bit)
            cJSON_AddItemToArray(arr, cJSON_CreateString(khub__cpu_features_table[i].name));
}

static khub_status write_metadata(const khub_kernel_manifest *m, const char *vdir,
                                  const char *variant, const char *backend, const built_file *files,
                                  size_t n_files, const char *compiler, const char *nvrtc)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "format", 1);
    cJSON_AddStringToObject(j, "name", m->repo);
    cJSON_AddStringToObject(j, "version", m->version);
    cJSON_AddNumberToObject(j, "major", m->major);
    cJSON_AddStringToObject(j, "variant", variant);
    cJSON *abi = cJSON_AddObjectToObject(j, "abi");
    cJSON_AddNumberToObject(abi, "major", KHUB_ABI_MAJOR);
    cJSON_AddNumberToObject(abi, "minor", m->target_minor); /* what the plugins' notes say */
    cJSON *be = cJSON_AddObjectToObject(j, "backend");
    cJSON_AddStringToObject(be, "type", backend);
    cJSON *archs = cJSON_AddArrayToObject(be, "archs");
    cJSON_AddItemToArray(archs, cJSON_CreateString(host_arch()));
    cJSON *ops = cJSON_AddArrayToObject(j, "ops");
    for (size_t i = 0; i < m->n_ops; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", m->ops[i].name);
        cJSON_AddStringToObject(o, "kind", khub__op_kind_name(m->ops[i].kind));
        cJSON_AddItemToArray(ops, o);
    }
    cJSON *plugins = cJSON_AddArrayToObject(j, "plugins");
    cJSON *artifacts = cJSON_AddArrayToObject(j, "artifacts");
    cJSON *digests = cJSON_AddObjectToObject(j, "files");
    for (size_t i = 0; i < n_files; i++) {
        const built_file *f = &files[i];
        cJSON_AddStringToObject(digests, f->name, f->sha256);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "file", f->name);
        if (f->is_plugin) {
            cJSON_AddStringToObject(o, "level", f->level);
            add_features(cJSON_AddArrayToObject(o, "cpu_features"), f->features);
            cJSON_AddItemToArray(plugins, o);
        } else if (!strcmp(f->kind, "source")) {
            cJSON_Delete(o); /* in "files" only: older khubs read this metadata unchanged */
        } else {
            cJSON_AddStringToObject(o, "kind", f->kind);
            cJSON_AddNumberToObject(o, "sm", f->sm);
            if (f->ptx_isa) cJSON_AddNumberToObject(o, "ptx_isa", f->ptx_isa);
            cJSON_AddItemToArray(artifacts, o);
        }
    }
    cJSON *prov = cJSON_AddObjectToObject(j, "provenance");
    char commit[64];
    int dirty;
    provenance(m->dir, commit, sizeof commit, &dirty);
    cJSON_AddStringToObject(prov, "source_commit", commit);
    cJSON_AddBoolToObject(prov, "dirty", dirty);
    cJSON_AddStringToObject(prov, "compiler", compiler);
    if (nvrtc) cJSON_AddStringToObject(prov, "nvrtc", nvrtc);
    cJSON_AddStringToObject(prov, "khub", KHUB_VERSION_STRING);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) return KHUB_STATUS_NOMEM;
    char path[2300];
    snprintf(path, sizeof path, "%s/metadata.json", vdir);
    size_t len = strlen(text);
    khub_status st = write_file_atomic(path, text, len);
    cJSON_free(text);
    return st;
}

/* ======================================================================== */
/* CPU variant                                                              */
/* ======================================================================== */

static khub_status compile_so(const khub_kernel_manifest *m, const khub_build_opts *o,
                              const char *inc, char (*sources)[128], size_t n_sources,
                              char (*flags)[48], size_t n_flags, const char *out, char *errbuf,
                              size_t errbuf_size)
{
    const char *cc = (o && o->cc) ? o->cc : (getenv("CC") ? getenv("CC") : "cc");
    char *argv[MAX_ARGS];
    char srcpath[KHUB_KM_MAX_SOURCES][1200], incflag[1200], dirflag[1200], minorflag[48];
    int a = 0;
    argv[a++] = (char *)cc;
    static const char *base[] = {"-std=gnu11",
                                 "-O2",
                                 "-fPIC",
                                 "-shared",
                                 "-fvisibility=hidden",
                                 "-DKHUB_PLUGIN_MODULE",
                                 "-Wall",
                                 "-Wl,--no-undefined",
                                 "-Wl,-z,now",
                                 "-Wl,--hash-style=gnu"};
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++) argv[a++] = (char *)base[i];
    snprintf(incflag, sizeof incflag, "-I%s", inc);
    snprintf(dirflag, sizeof dirflag, "-I%s", m->dir);
    argv[a++] = incflag;
    argv[a++] = dirflag;
    /* kernel.json's abi.target_minor (or the header's minor): the plugin's
     * ABI note and structs say 1.N and it sees only what 1.N declares. */
    snprintf(minorflag, sizeof minorflag, "-DKHUB_PLUGIN_TARGET_MINOR=%d", m->target_minor);
    argv[a++] = minorflag;
    for (size_t i = 0; i < n_flags; i++) argv[a++] = flags[i];
    for (size_t i = 0; i < n_sources; i++) {
        snprintf(srcpath[i], sizeof srcpath[i], "%s/%s", m->dir, sources[i]);
        argv[a++] = srcpath[i];
    }
    argv[a++] = "-o";
    argv[a++] = (char *)out;
    argv[a++] = "-lm";
    argv[a] = NULL;
    char log[400];
    int rc = run(argv, log, sizeof log);
    if (rc != 0) {
        khub__errbuf(errbuf, errbuf_size, "%s: compiling %s failed (exit %d): %s", m->repo, out, rc,
                     log);
        return KHUB_STATUS_ERROR;
    }
    return KHUB_STATUS_OK;
}

static khub_status gate_and_digest(const khub_kernel_manifest *m, const char *path, built_file *bf,
                                   char *errbuf, size_t errbuf_size)
{
    khub_gate_report rep;
    khub_gate_policy pol = {.glibc_ceiling = m->glibc_ceiling[0] ? m->glibc_ceiling : NULL};
    khub_status st = khub__gate_check_file(path, &pol, &rep, errbuf, errbuf_size);
    if (st != KHUB_STATUS_OK) return st;
    return khub__sha256_file_hex(path, bf->sha256);
}

static khub_status build_cpu(const khub_kernel_manifest *m, const khub_build_opts *o,
                             const char *inc, const char *build_dir, khub_build_result *res,
                             char *errbuf, size_t errbuf_size)
{
    char variant[96], vdir[1300];
    khub__cpu_variant_name(variant, sizeof variant);
    snprintf(vdir, sizeof vdir, "%s/%s", build_dir, variant);
    if (clean_dir(vdir) != KHUB_STATUS_OK) {
        khub__errbuf(errbuf, errbuf_size, "%s: cannot create", vdir);
        return KHUB_STATUS_IO;
    }
    built_file files[KHUB_KM_MAX_LEVELS];
    for (size_t i = 0; i < m->n_levels; i++) {
        const khub_km_level *lv = &m->levels[i];
        built_file *bf = &files[i];
        memset(bf, 0, sizeof *bf);
        snprintf(bf->name, sizeof bf->name, "%.90s-%.30s.so", m->name, lv->name);
        bf->is_plugin = 1;
        bf->level = lv->name;
        bf->features = lv->features;
        char out[1500];
        snprintf(out, sizeof out, "%s/%s", vdir, bf->name);
        progress(o, "cc  %s [%s]", bf->name, lv->name);
        KHUB_FORWARD_IF_ERROR(NULL, compile_so(m, o, inc, (char(*)[128])m->cpu_sources,
                                               m->n_cpu_sources, (char(*)[48])lv->flags,
                                               lv->n_flags, out, errbuf, errbuf_size));
        KHUB_FORWARD_IF_ERROR(NULL, gate_and_digest(m, out, bf, errbuf, errbuf_size));
    }
    char compiler[256];
    tool_version((o && o->cc) ? o->cc : (getenv("CC") ? getenv("CC") : "cc"), compiler,
                 sizeof compiler);
    khub_status st = write_metadata(m, vdir, variant, "cpu", files, m->n_levels, compiler, NULL);
    if (st != KHUB_STATUS_OK) {
        khub__errbuf(errbuf, errbuf_size, "%s/metadata.json: cannot write", vdir);
        return st;
    }
    KHUB_FORWARD_IF_ERROR(NULL, khub__variant_pack(build_dir, variant, errbuf, errbuf_size));
    progress(o, "ok  %s (%zu plugin level%s)", variant, m->n_levels, m->n_levels == 1 ? "" : "s");
    snprintf(res->variants[res->n_variants++], sizeof res->variants[0], "%s", variant);
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* CUDA variant                                                             */
/* ======================================================================== */

/* "dir/src/x.cu" -> "x" */
static void stem_of(const char *src, char *out, size_t n)
{
    const char *base = strrchr(src, '/');
    base = base ? base + 1 : src;
    snprintf(out, n, "%s", base);
    char *dot = strrchr(out, '.');
    if (dot) *dot = '\0';
}

/* The CUDA source itself goes into the variant as a digested file, so a
 * glue can have the host compile it at load (host->cuda_module_compile:
 * for a GPU newer than every listed capability, or specialised on a
 * model's shapes; docs/gpu.md). Self-contained sources only: the load-time
 * compile has no include path. */
static khub_status ship_source(const char *vdir, const char *rel, const char *src, size_t src_n,
                               built_file *files, size_t *n_files, char *errbuf, size_t errbuf_size)
{
    const char *base = strrchr(rel, '/');
    base = base ? base + 1 : rel;
    for (size_t i = 0; i < *n_files; i++)
        if (!strcmp(files[i].name, base)) {
            khub__errbuf(errbuf, errbuf_size, "sources.cuda: two files named %s", base);
            return KHUB_STATUS_INVALID_ARG;
        }
    if (*n_files >= KHUB_KMETA_MAX_FILES_BUILD || strlen(base) >= sizeof files[0].name) {
        khub__errbuf(errbuf, errbuf_size, "sources.cuda: too many files, or %s too long", base);
        return KHUB_STATUS_OVERFLOW;
    }
    built_file *bf = &files[*n_files];
    memset(bf, 0, sizeof *bf);
    snprintf(bf->name, sizeof bf->name, "%s", base);
    bf->kind = "source";
    char out[1500];
    snprintf(out, sizeof out, "%s/%s", vdir, bf->name);
    khub_status st = write_file_atomic(out, src, src_n);
    if (st == KHUB_STATUS_OK) st = khub__sha256_file_hex(out, bf->sha256);
    if (st != KHUB_STATUS_OK) {
        khub__errbuf(errbuf, errbuf_size, "%s: cannot write", out);
        return st;
    }
    (*n_files)++;
    return KHUB_STATUS_OK;
}

static khub_status nvrtc_artifacts(const khub_kernel_manifest *m, const khub_build_opts *o,
                                   khub_nvrtc *nv, const char *inc, const char *vdir,
                                   built_file *files, size_t *n_files, char *errbuf,
                                   size_t errbuf_size)
{
    char incopt[1300], minoropt[48];
    snprintf(incopt, sizeof incopt, "-I%s", inc);
    snprintf(minoropt, sizeof minoropt, "-DKHUB_PLUGIN_TARGET_MINOR=%d", m->target_minor);
    const char *extra[] = {incopt, minoropt};
    for (size_t s = 0; s < m->n_cuda_sources; s++) {
        char path[1200], stem[128];
        snprintf(path, sizeof path, "%s/%s", m->dir, m->cuda_sources[s]);
        stem_of(m->cuda_sources[s], stem, sizeof stem);
        char *src = NULL;
        size_t src_n = 0;
        if (khub__read_file(path, 4u << 20, &src, &src_n, NULL, 0) != KHUB_STATUS_OK) {
            khub__errbuf(errbuf, errbuf_size, "%s: cannot read", path);
            return KHUB_STATUS_IO;
        }
        khub_status shipped =
            ship_source(vdir, m->cuda_sources[s], src, src_n, files, n_files, errbuf, errbuf_size);
        if (shipped != KHUB_STATUS_OK) {
            free(src);
            return shipped;
        }
        for (size_t c = 0; c < m->n_ccs; c++) {
            for (int kind = KHUB_NVRTC_PTX; kind <= (m->cubin ? KHUB_NVRTC_CUBIN : KHUB_NVRTC_PTX);
                 kind++) {
                if (*n_files >= KHUB_KMETA_MAX_FILES_BUILD) break;
                built_file *bf = &files[(*n_files)];
                memset(bf, 0, sizeof *bf);
                bf->sm = m->ccs[c];
                bf->kind = kind == KHUB_NVRTC_PTX ? "ptx" : "cubin";
                snprintf(bf->name, sizeof bf->name, "%.96s.sm_%d.%s", stem, m->ccs[c], bf->kind);
                progress(o, "nvrtc %s", bf->name);
                char *img = NULL;
                size_t img_n = 0;
                khub_status st = khub__nvrtc_compile(nv, src, m->cuda_sources[s], m->ccs[c], kind,
                                                     extra, 2, &img, &img_n, errbuf, errbuf_size);
                if (st != KHUB_STATUS_OK) {
                    free(src);
                    return st;
                }
                if (kind == KHUB_NVRTC_PTX) {
                    int isa = 0, sm = 0;
                    char suffix;
                    if (khub__ptx_inspect(img, img_n, &isa, &sm, &suffix) == KHUB_STATUS_OK)
                        bf->ptx_isa = isa;
                }
                char out[1500];
                snprintf(out, sizeof out, "%s/%s", vdir, bf->name);
                st = write_file_atomic(out, img, kind == KHUB_NVRTC_PTX ? img_n + 1 : img_n);
                if (st == KHUB_STATUS_OK) st = khub__sha256_file_hex(out, bf->sha256);
                free(img);
                if (st != KHUB_STATUS_OK) {
                    free(src);
                    khub__errbuf(errbuf, errbuf_size, "%s: cannot write", out);
                    return st;
                }
                (*n_files)++;
            }
        }
        free(src);
    }
    return KHUB_STATUS_OK;
}

static khub_status build_cuda(const khub_kernel_manifest *m, const khub_build_opts *o,
                              const char *inc, const char *build_dir, khub_build_result *res,
                              char *errbuf, size_t errbuf_size)
{
    khub_nvrtc *nv = NULL;
    char why[KHUB_ERROR_SIZE];
    if (khub__nvrtc_open(&nv, why, sizeof why) != KHUB_STATUS_OK) {
        snprintf(res->skipped, sizeof res->skipped, "CUDA variant skipped: %.480s", why);
        progress(o, "skip CUDA variant: %s", why);
        return KHUB_STATUS_OK;
    }
    int maj, min;
    khub__nvrtc_version(nv, &maj, &min);
    char variant[96], vdir[1300], nvrtc_ver[32];
    snprintf(variant, sizeof variant, "khub%d-cu%d%d-%s-linux", KHUB_ABI_MAJOR, maj, min,
             host_arch());
    snprintf(nvrtc_ver, sizeof nvrtc_ver, "%d.%d", maj, min);
    snprintf(vdir, sizeof vdir, "%s/%s", build_dir, variant);
    khub_status st = clean_dir(vdir);
    built_file files[KHUB_KMETA_MAX_FILES_BUILD];
    size_t n_files = 0;
    if (st == KHUB_STATUS_OK) {
        built_file *glue = &files[n_files++];
        memset(glue, 0, sizeof *glue);
        snprintf(glue->name, sizeof glue->name, "%.96s-cuda.so", m->name);
        glue->is_plugin = 1;
        glue->level = "cuda";
        char out[1500];
        snprintf(out, sizeof out, "%s/%s", vdir, glue->name);
        progress(o, "cc  %s [cuda host glue]", glue->name);
        st = compile_so(m, o, inc, (char(*)[128])m->cuda_host_sources, m->n_cuda_host_sources, NULL,
                        0, out, errbuf, errbuf_size);
        if (st == KHUB_STATUS_OK) st = gate_and_digest(m, out, glue, errbuf, errbuf_size);
    }
    if (st == KHUB_STATUS_OK)
        st = nvrtc_artifacts(m, o, nv, inc, vdir, files, &n_files, errbuf, errbuf_size);
    khub__nvrtc_close(nv);
    if (st == KHUB_STATUS_OK) {
        char compiler[256];
        tool_version((o && o->cc) ? o->cc : (getenv("CC") ? getenv("CC") : "cc"), compiler,
                     sizeof compiler);
        st = write_metadata(m, vdir, variant, "cuda", files, n_files, compiler, nvrtc_ver);
    }
    if (st == KHUB_STATUS_OK) st = khub__variant_pack(build_dir, variant, errbuf, errbuf_size);
    if (st != KHUB_STATUS_OK) return st;
    progress(o, "ok  %s (%zu files)", variant, n_files);
    snprintf(res->variants[res->n_variants++], sizeof res->variants[0], "%s", variant);
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* Archive                                                                  */
/* ======================================================================== */

khub_status khub__variant_pack(const char *build_dir, const char *variant, char *errbuf,
                               size_t errbuf_size)
{
    char vdir[1300], out[1400], tmp[1500];
    snprintf(vdir, sizeof vdir, "%s/%s", build_dir, variant);
    snprintf(out, sizeof out, "%s/%s.tar.gz", build_dir, variant);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", out, (int)getpid());
    DIR *d = opendir(vdir);
    if (!d) {
        khub__errbuf(errbuf, errbuf_size, "%s: cannot list: %s", vdir, strerror(errno));
        return KHUB_STATUS_IO;
    }
    struct archive *a = archive_write_new();
    archive_write_add_filter_gzip(a);
    archive_write_set_format_pax_restricted(a);
    khub_status st = KHUB_STATUS_OK;
    if (archive_write_open_filename(a, tmp) != ARCHIVE_OK) {
        khub__errbuf(errbuf, errbuf_size, "%s: %s", tmp, archive_error_string(a));
        st = KHUB_STATUS_IO;
    }
    struct dirent *e;
    while (st == KHUB_STATUS_OK && (e = readdir(d)) != NULL) {
        char path[2800], entry_name[300];
        snprintf(path, sizeof path, "%s/%s", vdir, e->d_name);
        struct stat sb;
        if (e->d_name[0] == '.' || lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        char *data = NULL;
        size_t n = 0;
        if (khub__read_file(path, 1u << 30, &data, &n, NULL, 0) != KHUB_STATUS_OK) {
            khub__errbuf(errbuf, errbuf_size, "%s: cannot read", path);
            st = KHUB_STATUS_IO;
            break;
        }
        snprintf(entry_name, sizeof entry_name, "%s/%s", variant, e->d_name);
        struct archive_entry *ent = archive_entry_new();
        archive_entry_set_pathname(ent, entry_name);
        archive_entry_set_size(ent, (la_int64_t)n);
        archive_entry_set_filetype(ent, AE_IFREG);
        archive_entry_set_perm(ent, 0644);
        archive_entry_set_mtime(ent, 0, 0); /* reproducible archives */
        if (archive_write_header(a, ent) != ARCHIVE_OK ||
            archive_write_data(a, data, n) != (la_ssize_t)n) {
            khub__errbuf(errbuf, errbuf_size, "%s: %s", out, archive_error_string(a));
            st = KHUB_STATUS_IO;
        }
        archive_entry_free(ent);
        free(data);
    }
    closedir(d);
    if (archive_write_close(a) != ARCHIVE_OK && st == KHUB_STATUS_OK) {
        khub__errbuf(errbuf, errbuf_size, "%s: %s", out, archive_error_string(a));
        st = KHUB_STATUS_IO;
    }
    archive_write_free(a);
    if (st == KHUB_STATUS_OK && rename(tmp, out) != 0) st = KHUB_STATUS_IO;
    if (st != KHUB_STATUS_OK) unlink(tmp);
    return st;
}

/* ======================================================================== */
/* Entry                                                                    */
/* ======================================================================== */

khub_status khub__kernel_build(const khub_kernel_manifest *m, const khub_build_opts *opts,
                               khub_build_result *res, char *errbuf, size_t errbuf_size)
{
    memset(res, 0, sizeof *res);
    const char *inc = find_include_dir(opts);
    if (!inc) {
        khub__errbuf(errbuf, errbuf_size,
                     "cannot find khub/khub_plugin.h; set KHUB_INCLUDE_DIR to the directory "
                     "holding khub/");
        return KHUB_STATUS_NOT_FOUND;
    }
    char build_dir[1100];
    snprintf(build_dir, sizeof build_dir, "%s/build", m->dir);
    if (mkdir_p(build_dir) != KHUB_STATUS_OK) {
        khub__errbuf(errbuf, errbuf_size, "%s: cannot create: %s", build_dir, strerror(errno));
        return KHUB_STATUS_IO;
    }
    if (m->n_levels)
        KHUB_FORWARD_IF_ERROR(NULL, build_cpu(m, opts, inc, build_dir, res, errbuf, errbuf_size));
    if (m->n_ccs)
        KHUB_FORWARD_IF_ERROR(NULL, build_cuda(m, opts, inc, build_dir, res, errbuf, errbuf_size));
    return KHUB_STATUS_OK;
}
