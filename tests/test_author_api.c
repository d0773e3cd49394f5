/*
 * test_author_api.c: the kernel author's API (abi/khub/khub_author.h) as an
 * application sees it: this program includes only public headers and links
 * the shared libkhub_author and libkhub (tests/CMakeLists.txt), so it also
 * proves that libkhub_author reaches the libkhub internals it needs. Each
 * error asserts its status and its message, in errbuf and khub_last_error().
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "khub/khub_author.h"
#include "runner.h"

/* A fresh scratch directory; cd'd into. */
static void in_scratch(void)
{
    char dir[] = "/tmp/khub-author-api-XXXXXX";
    ASSERT(mkdtemp(dir));
    ASSERT_EQ(chdir(dir), 0);
}

static void count_file(void *ud, const char *path)
{
    (void)path;
    (*(int *)ud)++;
}

TEST_IMPL(templates_listed_in_order)
{
    static const char *const kinds[] = {"attention", "norm",   "linear",  "activation",
                                        "qlinear",   "rotary", "kv_cache"};
    ASSERT_EQ(khub_author_template_count(), 7);
    for (size_t i = 0; i < 7; i++) {
        khub_author_template t = {KHUB_APP_INIT(khub_author_template)};
        ASSERT_OK(khub_author_template_at(i, &t));
        ASSERT_STR_EQ(t.kind, kinds[i]);
        ASSERT(t.op && t.op[0]);
        ASSERT_EQ(t.cuda, i < 6);
    }
    khub_author_template t = {KHUB_APP_INIT(khub_author_template)};
    ASSERT_STATUS(khub_author_template_at(7, &t), KHUB_STATUS_INVALID_ARG);
    ASSERT_STR_EQ(khub_last_error(), "khub_author_template_at: no template 7 (there are 7)");
}

TEST_IMPL(init_writes_a_tree_and_reads_back)
{
    in_scratch();
    int n_files = 0;
    khub_author_init_opts o = {KHUB_APP_INIT(khub_author_init_opts),
                               .repo = "acme/rms-2",
                               .kind = "norm",
                               .backends = KHUB_AUTHOR_BACKEND_CPU | KHUB_AUTHOR_BACKEND_CUDA,
                               .on_file = count_file,
                               .on_file_ud = &n_files};
    char err[KHUB_ERROR_SIZE] = "";
    ASSERT_OK(khub_author_init(&o, err, sizeof err));
    ASSERT_EQ(n_files, 5); /* kernel.json .gitignore rms-2.c rms-2_cuda.c rms-2.cu */
    struct stat sb;
    ASSERT_EQ(stat("rms-2/rms-2_cuda.c", &sb), 0);
    FILE *f = fopen("rms-2/rms-2.c", "r");
    ASSERT(f);
    char text[16384];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    ASSERT(strstr(text, "rms_2_init(") && strstr(text, "\"acme/rms-2\""));
    ASSERT(!strstr(text, "TEMPLATE_CNAME") && !strstr(text, "@ID@") && !strstr(text, "@NAME@"));

    khub_author_manifest m = {KHUB_APP_INIT(khub_author_manifest)};
    ASSERT_OK(khub_author_manifest_read("rms-2", &m, err, sizeof err));
    ASSERT_STR_EQ(m.repo, "acme/rms-2");
    ASSERT_EQ(m.major, 1);
    ASSERT_EQ(m.target_minor, KHUB_ABI_MINOR);
    ASSERT_EQ(m.n_ops, 1);
    ASSERT_EQ(m.n_levels, 2);
    ASSERT_EQ(m.n_cuda_ccs, 3);

    /* again into the same directory: nothing overwritten */
    ASSERT_STATUS(khub_author_init(&o, err, sizeof err), KHUB_STATUS_EXISTS);
    ASSERT_STR_EQ(err, "rms-2: cannot create directory (exists?)");
    ASSERT_STR_EQ(khub_last_error(), err);
}

TEST_IMPL(init_refusals_name_what_is_offered)
{
    in_scratch();
    char err[KHUB_ERROR_SIZE] = "";
    khub_author_init_opts o = {KHUB_APP_INIT(khub_author_init_opts), .repo = "acme/x",
                               .kind = "softmax"};
    ASSERT_STATUS(khub_author_init(&o, err, sizeof err), KHUB_STATUS_NOT_FOUND);
    ASSERT_STR_EQ(err, "no template for kind 'softmax' (attention, norm, linear, activation, "
                       "qlinear, rotary, kv_cache)");
    o.kind = "kv_cache";
    o.backends = KHUB_AUTHOR_BACKEND_CUDA;
    ASSERT_STATUS(khub_author_init(&o, err, sizeof err), KHUB_STATUS_UNSUPPORTED);
    ASSERT_STR_EQ(err, "kind 'kv_cache' has a template for cpu only (cuda is offered for "
                       "attention, norm, linear, activation, qlinear, rotary)");
    o.repo = "acme";
    ASSERT_STATUS(khub_author_init(&o, err, sizeof err), KHUB_STATUS_INVALID_ARG);
    ASSERT_STR_EQ(err, "'acme' is not ORG/NAME");
    struct stat sb;
    ASSERT(stat("x", &sb) != 0); /* a refused init writes nothing */
}

TEST_IMPL(manifest_and_sign_errors)
{
    in_scratch();
    char err[KHUB_ERROR_SIZE] = "";
    khub_author_manifest m = {KHUB_APP_INIT(khub_author_manifest)};
    ASSERT_STATUS(khub_author_manifest_read("nowhere", &m, err, sizeof err), KHUB_STATUS_NOT_FOUND);
    ASSERT(strstr(err, "nowhere/kernel.json") && strstr(err, "is nowhere a kernel source dir?"));
    khub_author_init_opts o = {KHUB_APP_INIT(khub_author_init_opts), .repo = "acme/n",
                               .kind = "norm"};
    ASSERT_OK(khub_author_init(&o, err, sizeof err));
    ASSERT_STATUS(khub_author_sign_build("k.key", "n", NULL, NULL, err, sizeof err),
                  KHUB_STATUS_NOT_FOUND);
    ASSERT_STR_EQ(err, "n/build: no build directory (run 'khub build n' first)");
    khub_author_key key = {KHUB_APP_INIT(khub_author_key)};
    ASSERT_OK(khub_author_key_generate("k.key", "k.pub", &key, err, sizeof err));
    ASSERT_EQ(strncmp(key.public_key, "khub-ed25519 ", 13), 0);
    ASSERT_EQ(strlen(key.key_id), 16);
    ASSERT_STATUS(khub_author_key_generate("k.key", "k2.pub", &key, err, sizeof err),
                  KHUB_STATUS_EXISTS);
    ASSERT_OK(khub_author_sign_file("k.key", "n/kernel.json", err, sizeof err));
    struct stat sb;
    ASSERT_EQ(stat("n/kernel.json.sig", &sb), 0);
}

#define TEST_LIST(X) \
    X(templates_listed_in_order) \
    X(init_writes_a_tree_and_reads_back) \
    X(init_refusals_name_what_is_offered) \
    X(manifest_and_sign_errors)
TEST_MAIN(TEST_LIST)
