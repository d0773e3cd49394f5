/*
 * cmd_author.c: the kernel author's commands: `khub build DIR`,
 * `khub keygen`, `khub sign DIR|FILE`, `khub init ORG/NAME`, over
 * libkhub_author (abi/khub/khub_author.h; the templates are files in
 * hub/author/templates/).
 */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "khub/khub_author.h"

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
    char err[KHUB_ERROR_SIZE];
    khub_author_manifest m = {KHUB_APP_INIT(khub_author_manifest)};
    if (khub_author_manifest_read(dir, &m, err, sizeof err) != KHUB_STATUS_OK)
        return khub_cli_fail("build", "%s", err);
    if (!quiet) fprintf(stderr, "building %s %s (branch v%d)\n", m.repo, m.version, m.major);
    khub_author_build_opts opts = {KHUB_APP_INIT(khub_author_build_opts), .cc = cc,
                                   .progress = print_progress, .progress_ud = &quiet};
    khub_author_build_result res = {KHUB_APP_INIT(khub_author_build_result)};
    if (khub_author_build(dir, &opts, &res, err, sizeof err) != KHUB_STATUS_OK)
        return khub_cli_fail("build", "%s", err);
    for (uint32_t i = 0; i < res.n_variants; i++) printf("%s/build/%s\n", dir, res.variants[i]);
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
    char priv[1100], pub[1100], err[KHUB_ERROR_SIZE];
    snprintf(priv, sizeof priv, "%s.key", prefix);
    snprintf(pub, sizeof pub, "%s.pub", prefix);
    khub_author_key key = {KHUB_APP_INIT(khub_author_key)};
    if (khub_author_key_generate(priv, pub, &key, err, sizeof err) != KHUB_STATUS_OK)
        return khub_cli_fail("keygen", "%s", err);
    printf("%s\nkey id %s\nprivate key: %s (keep it secret)\npublic key:  %s\n", key.public_key,
           key.key_id, priv, pub);
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

static void print_signed(void *ud, const char *meta)
{
    (void)ud;
    printf("signed %s\n", meta);
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
    char err[KHUB_ERROR_SIZE];
    if (S_ISDIR(sb.st_mode)) {
        if (khub_author_sign_build(key, target, print_signed, NULL, err, sizeof err) !=
            KHUB_STATUS_OK)
            return khub_cli_fail("sign", "%s", err);
        return 0;
    }
    if (khub_author_sign_file(key, target, err, sizeof err) != KHUB_STATUS_OK)
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
    "a signature over its bytes (format 1, docs/kernel-format.md).\n\n"
    "  --key PRIVATE_KEY  the Ed25519 private key (PKCS#8 PEM, as khub keygen writes it)\n",
    run_sign};
KHUB_CLI_COMMAND(cmd_sign)

/* ======================================================================== */
/* khub init                                                                */
/* ======================================================================== */

/* "attention, norm, ..." (with_cuda: only the kinds with a CUDA template). */
static void kinds_list(char *buf, size_t n, int with_cuda)
{
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < khub_author_template_count(); i++) {
        khub_author_template t = {KHUB_APP_INIT(khub_author_template)};
        if (khub_author_template_at(i, &t) != KHUB_STATUS_OK || (with_cuda && !t.cuda)) continue;
        int w = snprintf(buf + len, n - len, "%s%s", len ? ", " : "", t.kind);
        if (w < 0 || (size_t)w >= n - len) return;
        len += (size_t)w;
    }
}

/* The template of kind into t; 0 when there is none. */
static int find_template(const char *kind, khub_author_template *t)
{
    for (size_t i = 0; i < khub_author_template_count(); i++)
        if (khub_author_template_at(i, t) == KHUB_STATUS_OK && strcmp(t->kind, kind) == 0) return 1;
    return 0;
}

static const khub_cli_cmd cmd_init;

/* "cpu", "cuda" or both, comma-separated; anything else (an unknown or empty
 * entry) is refused rather than ignored. */
static int parse_backends(const char *list, uint32_t *backends)
{
    for (const char *p = list;;) {
        size_t len = strcspn(p, ",");
        if (len == 3 && strncmp(p, "cpu", 3) == 0)
            *backends |= KHUB_AUTHOR_BACKEND_CPU;
        else if (len == 4 && strncmp(p, "cuda", 4) == 0)
            *backends |= KHUB_AUTHOR_BACKEND_CUDA;
        else
            return -1;
        if (!p[len]) return 0;
        p += len + 1;
    }
}

typedef struct init_print {
    const char *repo, *kind, *backends, *dir;
    int started;
} init_print;

/* Each file written: the heading before the first one, then its path. */
static void print_file(void *ud, const char *path)
{
    init_print *ip = ud;
    if (!ip->started++)
        printf("scaffolding %s (%s, %s) in %s/\n", ip->repo, ip->kind, ip->backends, ip->dir);
    printf("  %s\n", path);
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
    kinds_list(kinds, sizeof kinds, 0);
    if (!kind) return khub_cli_usage(&cmd_init, "missing --kind (%s)", kinds);
    khub_author_template t = {KHUB_APP_INIT(khub_author_template)};
    if (!find_template(kind, &t))
        return khub_cli_usage(&cmd_init, "no template for kind '%s' (%s)", kind, kinds);
    uint32_t bits = 0;
    if (parse_backends(backends, &bits) != 0)
        return khub_cli_usage(&cmd_init, "--backends '%s': a comma-separated list of cpu and cuda",
                              backends);
    if ((bits & KHUB_AUTHOR_BACKEND_CUDA) && !t.cuda) {
        kinds_list(kinds, sizeof kinds, 1);
        return khub_cli_usage(&cmd_init,
                              "--backends '%s': kind '%s' has a template for cpu only (use "
                              "--backends cpu; cuda is offered for %s)",
                              backends, kind, kinds);
    }
    init_print ip = {repo, kind, backends, dir ? dir : slash + 1, 0};
    khub_author_init_opts o = {KHUB_APP_INIT(khub_author_init_opts),
                               .repo = repo,
                               .kind = kind,
                               .backends = bits,
                               .dir = dir,
                               .on_file = print_file,
                               .on_file_ud = &ip};
    char err[KHUB_ERROR_SIZE];
    if (khub_author_init(&o, err, sizeof err) != KHUB_STATUS_OK)
        return khub_cli_fail("init", "%s", err);
    printf("next: khub build %s && khub check %s\n", ip.dir, ip.dir);
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
