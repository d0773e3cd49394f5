/*
 * cmd_author.c: the kernel author's commands: `khub build DIR`,
 * `khub keygen`, `khub sign DIR|FILE`, `khub init ORG/NAME` (its templates
 * are in init_templates.c).
 */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "init_templates.h"
#include "kernel_build.h"
#include "trust.h"

/* ======================================================================== */
/* khub build                                                               */
/* ======================================================================== */

static void print_progress(void *ud, const char *line)
{
    if (!*(int *)ud) fprintf(stderr, "  %s\n", line);
}

static const khub_cli_cmd cmd_build;

static int run_build(int argc, char **argv)
{
    if (khub_cli_wants_help(&cmd_build, argc, argv)) return 0;
    const char *dir = NULL, *cc = NULL;
    int quiet = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quiet") == 0 || strcmp(argv[i], "-q") == 0)
            quiet = 1;
        else if (strcmp(argv[i], "--cc") == 0 && i + 1 < argc)
            cc = argv[++i];
        else if (argv[i][0] == '-')
            return khub_cli_usage(&cmd_build, "unknown option '%s'", argv[i]);
        else if (!dir)
            dir = argv[i];
        else
            return khub_cli_usage(&cmd_build, "more than one DIR");
    }
    if (!dir)
        return khub_cli_usage(&cmd_build, "missing DIR (a kernel source tree with kernel.json)");
    khub_kernel_manifest *m = calloc(1, sizeof *m);
    if (!m) return khub_cli_fail("build", "out of memory");
    char err[KHUB_ERROR_SIZE];
    if (khub__km_load(dir, m, err, sizeof err) != KHUB_STATUS_OK) {
        free(m);
        return khub_cli_fail("build", "%s", err);
    }
    if (!quiet) fprintf(stderr, "building %s %s (branch v%d)\n", m->repo, m->version, m->major);
    khub_build_opts opts = {.cc = cc, .progress = print_progress, .progress_ud = &quiet};
    khub_build_result res;
    khub_status st = khub__kernel_build(m, &opts, &res, err, sizeof err);
    free(m);
    if (st != KHUB_STATUS_OK) return khub_cli_fail("build", "%s", err);
    for (size_t i = 0; i < res.n_variants; i++) printf("%s/build/%s\n", dir, res.variants[i]);
    if (res.skipped[0]) fprintf(stderr, "khub build: warning: %s\n", res.skipped);
    return 0;
}

static const khub_cli_cmd cmd_build = {
    "build", "build every variant of a kernel source tree into DIR/build/",
    "usage: khub build DIR [--cc CC] [--quiet]\n\n"
    "Reads DIR/kernel.json and builds each variant into DIR/build/<variant>/:\n"
    "  khub1-cpu-<arch>-linux    one .so per CPU level (e.g. generic, avx2)\n"
    "  khub1-cu<NN>-<arch>-linux CUDA host glue .so plus PTX (and cubins) per\n"
    "                            compute capability, compiled with NVRTC\n"
    "Every .so must pass the ABI gate (see 'khub check'). Each variant gets a\n"
    "metadata.json with a SHA-256 per file and provenance, and an archive\n"
    "DIR/build/<variant>.tar.gz for one-request downloads. Prints the variant\n"
    "directories built.\n\n"
    "  --cc CC    C compiler (default $CC or cc)\n"
    "  --quiet    no progress lines\n",
    run_build};
KHUB_CLI_COMMAND(cmd_build)

/* ======================================================================== */
/* khub keygen                                                              */
/* ======================================================================== */

static const khub_cli_cmd cmd_keygen;

static int run_keygen(int argc, char **argv)
{
    if (khub_cli_wants_help(&cmd_keygen, argc, argv)) return 0;
    const char *prefix = NULL;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-') return khub_cli_usage(&cmd_keygen, "unknown option '%s'", argv[i]);
        if (prefix) return khub_cli_usage(&cmd_keygen, "more than one PREFIX");
        prefix = argv[i];
    }
    if (!prefix)
        return khub_cli_usage(&cmd_keygen, "missing PREFIX (writes PREFIX.key and PREFIX.pub)");
    char priv[1100], pub[1100], err[KHUB_ERROR_SIZE], line[96];
    snprintf(priv, sizeof priv, "%s.key", prefix);
    snprintf(pub, sizeof pub, "%s.pub", prefix);
    khub_pubkey key;
    if (khub__key_generate(priv, pub, &key, err, sizeof err) != KHUB_STATUS_OK)
        return khub_cli_fail("keygen", "%s", err);
    khub__pubkey_format(&key, line, sizeof line);
    printf("%s\nkey id %s\nprivate key: %s (keep it secret)\npublic key:  %s\n", line, key.id, priv,
           pub);
    return 0;
}

static const khub_cli_cmd cmd_keygen = {
    "keygen", "generate an Ed25519 signing key pair",
    "usage: khub keygen PREFIX\n\n"
    "Writes PREFIX.key (PKCS#8 PEM, mode 0600) and PREFIX.pub (one line,\n"
    "'khub-ed25519 <base64>'), and prints the public key and its key id.\n"
    "Existing files are never overwritten. Put the public key line into a\n"
    "verification policy's \"publishers\" to trust kernels signed with it.\n",
    run_keygen};
KHUB_CLI_COMMAND(cmd_keygen)

/* ======================================================================== */
/* khub sign                                                                */
/* ======================================================================== */

/* Signs DIR/build/<variant>/metadata.json for every variant and repacks each
 * variant archive so it carries the signature. */
static int sign_kernel_dir(const char *dir, const char *key)
{
    char build[1100], err[KHUB_ERROR_SIZE];
    snprintf(build, sizeof build, "%s/build", dir);
    DIR *d = opendir(build);
    if (!d)
        return khub_cli_fail("sign", "%s: no build directory (run 'khub build %s' first)", build,
                             dir);
    int signed_n = 0, rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char meta[2400];
        snprintf(meta, sizeof meta, "%s/%s/metadata.json", build, e->d_name);
        struct stat sb;
        if (stat(meta, &sb) != 0) continue;
        if (khub__sign_metadata(key, meta, err, sizeof err) != KHUB_STATUS_OK ||
            khub__variant_pack(build, e->d_name, err, sizeof err) != KHUB_STATUS_OK) {
            rc = khub_cli_fail("sign", "%s", err);
            break;
        }
        printf("signed %s\n", meta);
        signed_n++;
    }
    closedir(d);
    if (!rc && !signed_n) rc = khub_cli_fail("sign", "%s: no variant with a metadata.json", build);
    return rc;
}

static const khub_cli_cmd cmd_sign;

static int run_sign(int argc, char **argv)
{
    if (khub_cli_wants_help(&cmd_sign, argc, argv)) return 0;
    const char *key = NULL, *target = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--key") == 0 && i + 1 < argc)
            key = argv[++i];
        else if (argv[i][0] == '-')
            return khub_cli_usage(&cmd_sign, "unknown option '%s'", argv[i]);
        else if (!target)
            target = argv[i];
        else
            return khub_cli_usage(&cmd_sign, "more than one target");
    }
    if (!key) return khub_cli_usage(&cmd_sign, "missing --key PRIVATE_KEY");
    if (!target) return khub_cli_usage(&cmd_sign, "missing DIR or FILE");
    struct stat sb;
    if (stat(target, &sb) != 0)
        return khub_cli_fail("sign", "%s: no such file or directory", target);
    if (S_ISDIR(sb.st_mode)) return sign_kernel_dir(target, key);
    char err[KHUB_ERROR_SIZE];
    if (khub__sign_file(key, target, err, sizeof err) != KHUB_STATUS_OK)
        return khub_cli_fail("sign", "%s", err);
    printf("signed %s -> %s.sig\n", target, target);
    return 0;
}

static const khub_cli_cmd cmd_sign = {
    "sign", "sign a kernel's metadata.json files with Ed25519",
    "usage: khub sign --key PRIVATE_KEY DIR|FILE\n\n"
    "With a kernel source DIR, signs every DIR/build/<variant>/metadata.json\n"
    "(which lists the SHA-256 of every file of the variant) with a statement\n"
    "naming its kernel, version, variant and digest, writes metadata.json.sig\n"
    "next to it, and repacks the variant archive. With a FILE, writes FILE.sig,\n"
    "a signature over its bytes (format 1, docs/kernel-format.md).\n",
    run_sign};
KHUB_CLI_COMMAND(cmd_sign)

/* ======================================================================== */
/* khub init                                                                */
/* ======================================================================== */

/* Replaces every @KEY@ of text with its value (pairs of key, value). */
static char *substitute(const char *text, const char *const *kv, size_t n_kv)
{
    size_t cap = strlen(text) * 2 + 1024, len = 0;
    char *out = malloc(cap);
    if (!out) return NULL;
    for (const char *p = text; *p;) {
        size_t k;
        for (k = 0; k < n_kv; k += 2) {
            size_t kl = strlen(kv[k]);
            if (strncmp(p, kv[k], kl) == 0) break;
        }
        const char *piece = k < n_kv ? kv[k + 1] : p;
        size_t plen = k < n_kv ? strlen(kv[k + 1]) : 1;
        if (len + plen + 1 > cap) {
            cap = (cap + plen) * 2;
            char *grown = realloc(out, cap);
            if (!grown) return free(out), NULL;
            out = grown;
        }
        memcpy(out + len, piece, plen);
        len += plen;
        p += k < n_kv ? strlen(kv[k]) : 1;
    }
    out[len] = '\0';
    return out;
}

static int write_new(const char *dir, const char *file, const char *a, const char *b, const char *c,
                     const char *const *kv, size_t n_kv)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "wx");
    if (!f) return khub_cli_fail("init", "%s: cannot create (does it exist already?)", path);
    const char *parts[] = {a, b, c};
    int ok = 1;
    for (int i = 0; i < 3; i++) {
        if (!parts[i]) continue;
        char *s = substitute(parts[i], kv, n_kv);
        ok &= s && fputs(s, f) >= 0;
        free(s);
    }
    ok &= fclose(f) == 0;
    if (!ok) return khub_cli_fail("init", "%s: write failed", path);
    printf("  %s\n", path);
    return 0;
}

static const khub_cli_cmd cmd_init;

/* "cpu", "cuda" or both, comma-separated; anything else (an unknown or empty
 * entry) is refused rather than ignored. */
static int parse_backends(const char *list, int *cpu, int *cuda)
{
    for (const char *p = list;;) {
        size_t len = strcspn(p, ",");
        if (len == 3 && strncmp(p, "cpu", 3) == 0)
            *cpu = 1;
        else if (len == 4 && strncmp(p, "cuda", 4) == 0)
            *cuda = 1;
        else
            return -1;
        if (!p[len]) return 0;
        p += len + 1;
    }
}

static int run_init(int argc, char **argv)
{
    if (khub_cli_wants_help(&cmd_init, argc, argv)) return 0;
    const char *repo = NULL, *kind = NULL, *backends = "cpu", *dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--kind") == 0 && i + 1 < argc)
            kind = argv[++i];
        else if (strcmp(argv[i], "--backends") == 0 && i + 1 < argc)
            backends = argv[++i];
        else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc)
            dir = argv[++i];
        else if (argv[i][0] == '-')
            return khub_cli_usage(&cmd_init, "unknown option '%s'", argv[i]);
        else if (!repo)
            repo = argv[i];
        else
            return khub_cli_usage(&cmd_init, "more than one ORG/NAME");
    }
    if (!repo) return khub_cli_usage(&cmd_init, "missing ORG/NAME");
    const char *slash = strchr(repo, '/');
    if (!slash || slash == repo || !slash[1] || strchr(slash + 1, '/') || strlen(repo) > 150)
        return khub_cli_usage(&cmd_init, "'%s' is not ORG/NAME", repo);
    char kinds[256];
    khub_init_kinds(kinds, sizeof kinds, 0);
    if (!kind) return khub_cli_usage(&cmd_init, "missing --kind (%s)", kinds);
    const khub_init_template *t = khub_init_template_find(kind);
    if (!t) return khub_cli_usage(&cmd_init, "no template for kind '%s' (%s)", kind, kinds);
    int cpu = 0, cuda = 0;
    if (parse_backends(backends, &cpu, &cuda) != 0)
        return khub_cli_usage(&cmd_init, "--backends '%s': a comma-separated list of cpu and cuda",
                              backends);
    if (cuda && !t->cuda_src) {
        khub_init_kinds(kinds, sizeof kinds, 1);
        return khub_cli_usage(&cmd_init,
                              "--backends '%s': kind '%s' has a template for cpu only (use "
                              "--backends cpu; cuda is offered for %s)",
                              backends, kind, kinds);
    }
    const char *name = slash + 1;
    char cname[160];
    snprintf(cname, sizeof cname, "%s", name);
    for (char *p = cname; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9')))
            *p = '_';
    char dbuf[1024];
    if (!dir) snprintf(dbuf, sizeof dbuf, "%s", name), dir = dbuf;
    if (mkdir(dir, 0755) != 0)
        return khub_cli_fail("init", "%s: cannot create directory (exists?)", dir);
    const char *kv[] = {"@ID@", repo,         "@NAME@",     name,       "@CNAME@",
                        cname,  "@CCS_DESC@", "90, 80, 75", "@CC_MIN@", "75"};
    size_t n_kv = sizeof kv / sizeof kv[0];
    char manifest[4096], src[300], glue[300], cu[300];
    snprintf(src, sizeof src, "%s.c", name);
    snprintf(glue, sizeof glue, "%s_cuda.c", name);
    snprintf(cu, sizeof cu, "%s.cu", name);
    snprintf(
        manifest, sizeof manifest,
        "{\n  \"repo\": \"%s\",\n  \"major\": 1,\n  \"version\": \"1.0.0\",\n"
        "  \"ops\": [{\"name\": \"%s\", \"kind\": \"%s\"}],\n"
        "  \"sources\": {%s%s%s%s%s%s%s},\n"
        "  \"variants\": {%s%s%s},\n"
        "  \"selftests\": %s\n}\n",
        repo, t->op, kind, cpu ? "\"cpu\": [\"" : "", cpu ? src : "", cpu ? "\"]" : "",
        cpu && cuda ? ", " : "", cuda ? "\"cuda_host\": [\"" : "", cuda ? glue : "",
        cuda ? "\"], \"cuda\": [\"@NAME@.cu\"]" : "",
        cpu ? "\"cpu\": [{\"level\": \"generic\"}, {\"level\": \"avx2\", \"flags\": "
              "[\"-mavx2\", \"-mfma\", \"-mf16c\"], \"features\": [\"avx2\", \"fma\", \"f16c\"]}]"
            : "",
        cpu && cuda ? ", " : "",
        cuda ? "\"cuda\": {\"capabilities\": [75, 80, 90], \"cubin\": false}" : "", t->selftests);
    printf("scaffolding %s (%s, %s) in %s/\n", repo, kind, backends, dir);
    if (write_new(dir, "kernel.json", manifest, NULL, NULL, kv, n_kv) ||
        write_new(dir, ".gitignore", "/build/\n", NULL, NULL, kv, n_kv))
        return 1;
    if (cpu && write_new(dir, src, t->cpu_src, khub_init_cpu_entry(), NULL, kv, n_kv)) return 1;
    if (cuda && (write_new(dir, glue, khub_init_cuda_head(), t->cuda_glue, khub_init_cuda_entry(),
                           kv, n_kv) ||
                 write_new(dir, cu, t->cuda_src, NULL, NULL, kv, n_kv)))
        return 1;
    printf("next: khub build %s && khub check %s\n", dir, dir);
    return 0;
}

static const khub_cli_cmd cmd_init = {
    "init", "scaffold a kernel plugin that builds and passes its self-test",
    "usage: khub init ORG/NAME --kind KIND [--backends cpu,cuda] [--dir DIR]\n\n"
    "Writes a kernel source tree (default ./NAME): kernel.json, a plain but\n"
    "correct CPU implementation (generic and AVX2 levels), with cuda a CUDA\n"
    "kernel compiled to PTX by NVRTC plus its host launch glue, and a\n"
    ".gitignore for build/. As generated it builds ('khub build DIR'), passes\n"
    "the ABI gate and its self-tests against khub/ref-cpu ('khub check DIR').\n\n"
    "  --kind KIND      attention, norm, activation, linear (f32), qlinear\n"
    "                   (Q8_0 weights) and rotary, each with cpu and cuda;\n"
    "                   kv_cache (a static f32 cache), cpu only\n"
    "  --backends LIST  cpu, cuda or cpu,cuda (default cpu)\n"
    "  --dir DIR        output directory (must not exist)\n",
    run_init};
KHUB_CLI_COMMAND(cmd_init)
