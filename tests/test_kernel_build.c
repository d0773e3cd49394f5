/*
 * test_kernel_build.c: kernel.json parsing (every rejection names its
 * field), `khub build` of a small kernel into variants with metadata.json,
 * digest verification of a variant directory (tampered and extra files are
 * refused), CPU level choice, and the per-variant archive.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <archive.h>
#include <archive_entry.h>

#include "kernel_build.h"
#include "kernel_manifest.h"
#include "kernel_meta.h"
#include "runner.h"

static khub_kernel_manifest man;

static khub_status parse(const char *json, char *err)
{
    return khub__km_parse(json, strlen(json), "/tmp", &man, err, KHUB_ERROR_SIZE);
}

#define GOOD_HEAD \
    "{\"repo\": \"acme/norm\", \"major\": 1, \"version\": \"1.0.0\", " \
    "\"ops\": [{\"name\": \"rms_norm\", \"kind\": \"norm\"}], " \
    "\"sources\": {\"cpu\": [\"norm.c\"]}, "

TEST_IMPL(manifest_good)
{
    char err[KHUB_ERROR_SIZE] = "";
    const char *j = GOOD_HEAD
        "\"variants\": {\"cpu\": [{\"level\": \"generic\"}, {\"level\": \"avx2\", "
        "\"flags\": [\"-mavx2\"], \"features\": [\"avx2\", \"fma\"]}]}, "
        "\"selftests\": [{\"op\": \"rms_norm\", \"shape\": [2, 64], \"tolerance\": 1e-6}]}";
    ASSERT_OK(parse(j, err));
    ASSERT_STR_EQ(man.org, "acme");
    ASSERT_STR_EQ(man.name, "norm");
    ASSERT_EQ(man.major, 1);
    ASSERT_EQ(man.n_levels, 2);
    ASSERT_EQ(man.levels[1].features, KHUB_CPU_AVX2 | KHUB_CPU_FMA);
    ASSERT_EQ(man.ops[0].kind, KHUB_OP_NORM);
    ASSERT_EQ(man.n_tests, 1);
    ASSERT_EQ(man.tests[0].shape[1], 64);
    ASSERT_STR_EQ(man.glibc_ceiling, ""); /* the gate's default */
    const char *g = GOOD_HEAD "\"glibc_ceiling\": \"GLIBC_2.34\", "
                              "\"variants\": {\"cpu\": [{\"level\": \"generic\"}]}}";
    ASSERT_OK(parse(g, err));
    ASSERT_STR_EQ(man.glibc_ceiling, "GLIBC_2.34");
}

TEST_IMPL(manifest_rejections)
{
    static const struct {
        const char *json, *msg;
    } cases[] = {
        {"{", "not a JSON object"},
        {"{\"repo\": \"nope\", \"major\": 1, \"version\": \"1.0.0\"}", "'repo' must be 'org/name'"},
        {"{\"repo\": \"a/b\", \"major\": 0, \"version\": \"1.0.0\"}", "'major' must be an integer"},
        {"{\"repo\": \"a/b\", \"major\": 2, \"version\": \"1.0.0\"}",
         "does not start with the major 2"},
        {"{\"repo\": \"a/b\", \"major\": 1, \"version\": \"1.0\", \"ops\": [{\"name\": \"x\", "
         "\"kind\": \"softmax\"}]}",
         "ops[0].kind 'softmax' is not an op kind"},
        {GOOD_HEAD "\"variants\": {}}", "lists no CPU level and no CUDA target"},
        {GOOD_HEAD "\"glibc_ceiling\": \"GLIBC_2\", \"variants\": {}}",
         "'glibc_ceiling' 'GLIBC_2' is not a glibc version like GLIBC_2.28"},
        {GOOD_HEAD "\"glibc_ceiling\": \"GLIBC_2.34x\", \"variants\": {}}",
         "'glibc_ceiling' 'GLIBC_2.34x' is not a glibc version"},
        {"{\"repo\": \"a/b\", \"major\": 1, \"version\": \"1\", \"ops\": [{\"name\": \"x\", "
         "\"kind\": \"norm\"}], \"sources\": {\"cpu\": [\"../../etc/passwd\"]}}",
         "sources.cpu[0] must be a relative path inside the kernel directory"},
        {GOOD_HEAD "\"variants\": {\"cpu\": [{\"level\": \"x\", \"flags\": [\"-Wl,-rpath,/x\"]}]}}",
         "only -m, -D and -O flags are allowed"},
        {GOOD_HEAD "\"variants\": {\"cpu\": [{\"level\": \"x\", \"features\": [\"sse9\"]}]}}",
         "unknown CPU feature 'sse9'"},
        {GOOD_HEAD "\"variants\": {\"cpu\": [{\"level\": \"x\"}, {\"level\": \"x\"}]}}",
         "level 'x' listed twice"},
        {GOOD_HEAD "\"variants\": {\"cuda\": {\"capabilities\": [80]}}}",
         "variants.cuda needs sources.cuda"},
        {GOOD_HEAD "\"variants\": {\"cpu\": [{\"level\": \"g\"}]}, \"selftests\": [{\"op\": "
                   "\"other\", \"shape\": [1]}]}",
         "selftests[0].op 'other' is not in 'ops'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[KHUB_ERROR_SIZE] = "";
        ASSERT_STATUS(parse(cases[i].json, err), KHUB_STATUS_PARSE);
        ASSERT_CONTAINS(err, "kernel.json: ");
        ASSERT_CONTAINS(err, cases[i].msg);
    }
    char err[KHUB_ERROR_SIZE];
    ASSERT_STATUS(khub__km_load("/nonexistent-dir", &man, err, sizeof err), KHUB_STATUS_NOT_FOUND);
    ASSERT_CONTAINS(err, "/nonexistent-dir/kernel.json: cannot open");
}

/* A tiny kernel source tree in a temp dir; returns its path. */
static const char *make_kernel_tree(void)
{
    static char dir[64];
    snprintf(dir, sizeof dir, "/tmp/khub-kbuild-XXXXXX");
    ASSERT(mkdtemp(dir) != NULL);
    char path[128];
    snprintf(path, sizeof path, "%s/kernel.json", dir);
    FILE *f = fopen(path, "w");
    fputs(GOOD_HEAD "\"variants\": {\"cpu\": [{\"level\": \"generic\"}, {\"level\": \"avx2\", "
                    "\"flags\": [\"-mavx2\", \"-mfma\"], \"features\": [\"avx2\", \"fma\"]}]}}",
          f);
    fclose(f);
    snprintf(path, sizeof path, "%s/norm.c", dir);
    f = fopen(path, "w");
    fputs("#include <khub/khub_plugin.h>\n"
          "static khub_status init(const khub_host_api *h, khub_plugin_desc *o, char *e, size_t n)"
          "{ (void)h; (void)e; (void)n; khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),"
          " .id = \"acme/norm\", .version = \"1.0.0\"}; return khub_plugin_desc_put(o, &d); }\n"
          "KHUB_PLUGIN_DEFINE(init, \"acme/norm\", \"1.0.0\")\n",
          f);
    fclose(f);
    return dir;
}

static khub_status load_meta(const char *vdir, khub_kmeta *meta, char *err)
{
    char path[512];
    snprintf(path, sizeof path, "%s/metadata.json", vdir);
    FILE *f = fopen(path, "rb");
    ASSERT(f != NULL);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    return khub__kmeta_parse(buf, n, meta, err, KHUB_ERROR_SIZE);
}

TEST_IMPL(build_verify_and_tamper)
{
    const char *dir = make_kernel_tree();
    char err[KHUB_ERROR_SIZE] = "";
    ASSERT_OK(khub__km_load(dir, &man, err, sizeof err));
    khub_build_result res;
    khub_status st = khub__kernel_build(&man, NULL, &res, err, sizeof err);
    if (st != KHUB_STATUS_OK) fprintf(stderr, "  %s\n", err);
    ASSERT_OK(st);
    ASSERT_EQ(res.n_variants, 1);
    char variant[96], vdir[256];
    khub__cpu_variant_name(variant, sizeof variant);
    ASSERT_STR_EQ(res.variants[0], variant);
    snprintf(vdir, sizeof vdir, "%s/build/%s", dir, variant);

    khub_kmeta meta;
    ASSERT_OK(load_meta(vdir, &meta, err));
    ASSERT_STR_EQ(meta.name, "acme/norm");
    ASSERT_STR_EQ(meta.backend, "cpu");
    ASSERT_EQ(meta.n_files, 2);
    ASSERT_EQ(meta.n_plugins, 2);
    ASSERT_OK(khub__kmeta_verify_dir(&meta, vdir, err, sizeof err));

    /* level choice by CPU features */
    ASSERT_STR_EQ(khub__kmeta_pick_plugin(&meta, 0)->level, "generic");
    ASSERT_STR_EQ(khub__kmeta_pick_plugin(&meta, KHUB_CPU_AVX2)->level, "generic");
    ASSERT_STR_EQ(khub__kmeta_pick_plugin(&meta, KHUB_CPU_AVX2 | KHUB_CPU_FMA)->level, "avx2");
    khub_kmeta only_avx2 = meta; /* without its generic level: nothing fits a plain CPU */
    only_avx2.n_plugins = 0;
    for (size_t i = 0; i < meta.n_plugins; i++)
        if (strcmp(meta.plugins[i].level, "generic") != 0)
            only_avx2.plugins[only_avx2.n_plugins++] = meta.plugins[i];
    ASSERT_EQ(only_avx2.n_plugins, 1);
    ASSERT(khub__kmeta_pick_plugin(&only_avx2, KHUB_CPU_AVX2) == NULL);
    ASSERT_STR_EQ(khub__kmeta_pick_plugin(&only_avx2, KHUB_CPU_AVX2 | KHUB_CPU_FMA)->level, "avx2");

    /* an extra file is refused */
    char extra[300];
    snprintf(extra, sizeof extra, "%s/evil.so", vdir);
    FILE *f = fopen(extra, "w");
    fputs("x", f);
    fclose(f);
    ASSERT_STATUS(khub__kmeta_verify_dir(&meta, vdir, err, sizeof err),
                  KHUB_STATUS_DIGEST_MISMATCH);
    ASSERT_CONTAINS(err, "evil.so: not listed in metadata.json");
    unlink(extra);

    /* one flipped byte is refused, naming the file and both digests */
    char so[300];
    snprintf(so, sizeof so, "%s/norm-generic.so", vdir);
    f = fopen(so, "r+b");
    fseek(f, 100, SEEK_SET);
    int c = fgetc(f);
    fseek(f, 100, SEEK_SET);
    fputc(c ^ 0xff, f);
    fclose(f);
    ASSERT_STATUS(khub__kmeta_verify_dir(&meta, vdir, err, sizeof err),
                  KHUB_STATUS_DIGEST_MISMATCH);
    ASSERT_CONTAINS(err, "norm-generic.so: SHA-256 ");
    ASSERT_CONTAINS(err, meta.files[0].sha256);

    /* the archive holds every file of the variant under <variant>/ */
    char tgz[300];
    snprintf(tgz, sizeof tgz, "%s/build/%s.tar.gz", dir, variant);
    struct archive *a = archive_read_new();
    archive_read_support_filter_gzip(a);
    archive_read_support_format_tar(a);
    ASSERT_EQ(archive_read_open_filename(a, tgz, 16384), ARCHIVE_OK);
    struct archive_entry *e;
    int entries = 0;
    while (archive_read_next_header(a, &e) == ARCHIVE_OK) {
        ASSERT(strncmp(archive_entry_pathname(e), variant, strlen(variant)) == 0);
        entries++;
    }
    archive_read_free(a);
    ASSERT_EQ(entries, 3); /* two .so and metadata.json */
}

/* Each level is compiled with its own flags: the source refuses to compile
 * unless -DKT_LEVEL names the level, and the avx2 level must see __AVX2__. */
TEST_IMPL(build_applies_level_flags)
{
    const char *dir = make_kernel_tree();
    char path[128];
    snprintf(path, sizeof path, "%s/kernel.json", dir);
    FILE *f = fopen(path, "w");
    fputs(GOOD_HEAD "\"variants\": {\"cpu\": [{\"level\": \"generic\", \"flags\": "
                    "[\"-DKT_LEVEL=1\"]}, {\"level\": \"avx2\", \"flags\": [\"-DKT_LEVEL=2\", "
                    "\"-mavx2\"], \"features\": [\"avx2\"]}]}}",
          f);
    fclose(f);
    snprintf(path, sizeof path, "%s/norm.c", dir);
    f = fopen(path, "a");
    fputs(
        "#if !defined(KT_LEVEL)\n#error no level flags\n#elif KT_LEVEL == 2 && !defined(__AVX2__)\n"
        "#error avx2 level without -mavx2\n#elif KT_LEVEL == 1 && defined(__AVX2__)\n"
        "#error generic level with -mavx2\n#endif\n",
        f);
    fclose(f);
    char err[KHUB_ERROR_SIZE] = "";
    ASSERT_OK(khub__km_load(dir, &man, err, sizeof err));
    khub_build_result res;
    khub_status st = khub__kernel_build(&man, NULL, &res, err, sizeof err);
    if (st != KHUB_STATUS_OK) fprintf(stderr, "  %s\n", err);
    ASSERT_OK(st);
    /* without the level's -D the same source fails, naming the level's file */
    snprintf(path, sizeof path, "%s/kernel.json", dir);
    f = fopen(path, "w");
    fputs(GOOD_HEAD "\"variants\": {\"cpu\": [{\"level\": \"generic\"}]}}", f);
    fclose(f);
    ASSERT_OK(khub__km_load(dir, &man, err, sizeof err));
    ASSERT_STATUS(khub__kernel_build(&man, NULL, &res, err, sizeof err), KHUB_STATUS_ERROR);
    ASSERT_CONTAINS(err, "norm-generic.so failed");
    ASSERT_CONTAINS(err, "no level flags");
}

TEST_IMPL(build_compile_error_is_reported)
{
    const char *dir = make_kernel_tree();
    char path[128];
    snprintf(path, sizeof path, "%s/norm.c", dir);
    FILE *f = fopen(path, "w");
    fputs("this is not C;\n", f);
    fclose(f);
    char err[KHUB_ERROR_SIZE] = "";
    ASSERT_OK(khub__km_load(dir, &man, err, sizeof err));
    khub_build_result res;
    ASSERT_STATUS(khub__kernel_build(&man, NULL, &res, err, sizeof err), KHUB_STATUS_ERROR);
    ASSERT_CONTAINS(err, "acme/norm: compiling ");
    ASSERT_CONTAINS(err, "failed");
}

TEST_IMPL(metadata_rejections)
{
    khub_kmeta meta;
    char err[KHUB_ERROR_SIZE];
    static const struct {
        const char *json, *msg;
    } cases[] = {
        {"[]", "not a JSON object"},
        {"{\"format\": 2}", "'format' must be 1"},
        {"{\"format\": 1, \"name\": \"x\"}", "'name' must be 'org/name'"},
        {"{\"format\": 1, \"name\": \"a/b\", \"version\": \"1\", \"variant\": \"v\", \"major\": 1, "
         "\"abi\": {\"major\": 1, \"minor\": 0}, \"backend\": {\"type\": \"cpu\"}, "
         "\"files\": {\"../x.so\": \"00\"}}",
         "not a plain file name"},
        {"{\"format\": 1, \"name\": \"a/b\", \"version\": \"1\", \"variant\": \"v\", \"major\": 1, "
         "\"abi\": {\"major\": 1, \"minor\": 0}, \"backend\": {\"type\": \"cpu\"}, "
         "\"files\": {\"x.so\": \"zz\"}}",
         "digests must be 64 hex digits"},
        {"{\"format\": 1, \"name\": \"a/b\", \"version\": \"1\", \"variant\": \"v\", \"major\": 1, "
         "\"abi\": {\"major\": 1, \"minor\": 0}, \"backend\": {\"type\": \"cpu\"}, \"files\": {}, "
         "\"plugins\": [{\"file\": \"y.so\"}]}",
         "plugins[].file is not listed in 'files'"},
        /* found by fuzz_hub_formats: numbers past int were converted (UB) */
        {"{\"format\": 1, \"name\": \"a/b\", \"version\": \"1\", \"variant\": \"v\", "
         "\"major\": 8.9e19}",
         "'major' must be a positive integer"},
        {"{\"format\": 1, \"name\": \"a/b\", \"version\": \"1\", \"variant\": \"v\", \"major\": "
         "1.5}",
         "'major' must be a positive integer"},
        {"{\"format\": 1, \"name\": \"a/b\", \"version\": \"1\", \"variant\": \"v\", \"major\": 1, "
         "\"abi\": {\"major\": 1e300, \"minor\": 0}}",
         "'abi' must be {\"major\": N, \"minor\": M} (whole numbers, 0..65535)"},
        /* issue 10: what two JSON readers could read differently, and what
         * this reader would skip, is refused */
        {"{\"format\": 1, \"name\": \"a/b\", \"name\": \"c/d\"}",
         "metadata.json: duplicate key \"name\""},
        {"{\"format\": 1, \"abi\": {\"major\": 1, \"minor\": 0, \"minor\": 9}}",
         "metadata.json: duplicate key \"minor\""},
        {"{\"format\": 1} {\"format\": 2}", "metadata.json: text after the JSON document"},
        {"{\"format\": 1, \"name\": \"a/b\", \"verison\": \"1\"}",
         "metadata.json: unknown field \"verison\" in the top level"},
        {"{\"format\": 1, \"name\": \"a/b\", \"version\": \"1\", \"variant\": \"v\", \"major\": 1, "
         "\"abi\": {\"major\": 1, \"minor\": 0}, \"backend\": {\"type\": \"cpu\"}, \"files\": "
         "{\"y.so\": \""
         "0000000000000000000000000000000000000000000000000000000000000000"
         "\"}, "
         "\"plugins\": [{\"file\": \"y.so\", \"cpu_feature\": [\"avx2\"]}]}",
         "metadata.json: unknown field \"cpu_feature\" in plugins[]"},
        {"{\"format\": 1, \"backend\": {\"type\": \"cpu\", \"arch\": []}}",
         "metadata.json: unknown field \"arch\" in backend"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ASSERT_STATUS(
            khub__kmeta_parse(cases[i].json, strlen(cases[i].json), &meta, err, sizeof err),
            KHUB_STATUS_METADATA_INVALID);
        ASSERT_CONTAINS(err, cases[i].msg);
    }
}

#define TEST_LIST(X) \
    X(manifest_good) \
    X(manifest_rejections) \
    X(build_verify_and_tamper) \
    X(build_applies_level_flags) \
    X(build_compile_error_is_reported) \
    X(metadata_rejections)
TEST_MAIN(TEST_LIST)
