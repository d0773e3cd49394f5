/* test_hub_rank.c: variant ranking as a pure function (variant_rank.h):
 * the verdict and reason for every way a name fits or fails a host given
 * as data (CUDA hosts included, with no driver needed), the order of the
 * accepted ones, and the lock's ranking of locked names, which goes
 * through the same function without any file. */
#include <stdio.h>
#include <string.h>

#include "kernel_fetch.h"
#include "runner.h"
#include "variant_rank.h"

static khub__rank_host cpu_host(void)
{
    khub__rank_host h;
    memset(&h, 0, sizeof h);
    snprintf(h.cpu, sizeof h.cpu, "x86_64");
    snprintf(h.cpu_features, sizeof h.cpu_features, "sse4.2 avx2 fma");
    return h;
}

/* A driver of CUDA major.minor and GPUs of the given capabilities (x10). */
static khub__rank_host cuda_host(int major, int minor, int n_gpus, const int *cc)
{
    khub__rank_host h = cpu_host();
    h.cuda = major * 1000 + minor * 10;
    h.n_gpus = n_gpus;
    for (int i = 0; i < n_gpus; i++) h.cc[i] = cc[i];
    return h;
}

static khub_hub_variant_list *rank(const khub__rank_input *in, size_t n, const khub__rank_host *h)
{
    khub_hub_variant_list *l = NULL;
    ASSERT_OK(khub__rank_variants(NULL, in, n, h, &l));
    ASSERT(l != NULL);
    return l;
}

static const khub_hub_variant *find(const khub_hub_variant_list *l, const char *name)
{
    for (size_t i = 0; i < l->count; i++)
        if (!strcmp(l->items[i].name, name)) return &l->items[i];
    TEST_FAIL_("variant %s is not in the list", name);
    return NULL;
}

/* Every rejection of a name, with its reason, on a CPU-only host; the one
 * fitting CPU build is accepted with the host's features in its reason. */
TEST_IMPL(cpu_host_verdicts)
{
    khub__rank_host h = cpu_host();
    struct {
        const char *name, *reason;
    } want[] = {
        {"khub1-cpu-x86_64-linux",
         "accept: CPU build for x86_64 (level chosen at load; host CPU: sse4.2 avx2 fma)"},
        {"khub1-cpu-aarch64-linux", "reject: built for aarch64, host is x86_64"},
        {"khub1-cpu-x86_64-darwin", "reject: built for darwin, host is linux"},
        {"khub9-cpu-x86_64-linux", "reject: ABI major 9, host has 1"},
        {"torch212-cxx11-cu130-x86_64-linux",
         "reject: torch family needs libtorch and CPython; khub loads khub1-* variants"},
        {"tvm-ffi01-cpu-x86_64-linux",
         "reject: tvm-ffi family needs libtvm_ffi; khub loads khub1-* variants"},
        {"khub1-rocm62-x86_64-linux", "reject: unknown backend \"rocm62\""},
        {"khub1-cpu-x86_64-linux-extra", "reject: not a khub{ABI}-{backend}-{cpu}-{os} name"},
        {"_weird-", "reject: not a khub{ABI}-{backend}-{cpu}-{os} name"},
        /* no sign or white space in the ABI (sscanf's %d took them, and
         * "khub 1-cpu-x86_64-linux" was a CPU build), at most 31 characters
         * a part */
        {"khub 1-cpu-x86_64-linux", "reject: not a khub{ABI}-{backend}-{cpu}-{os} name"},
        {"khub+1-cpu-x86_64-linux", "reject: not a khub{ABI}-{backend}-{cpu}-{os} name"},
        {"khub-1-cpu-x86_64-linux", "reject: not a khub{ABI}-{backend}-{cpu}-{os} name"},
        {"khub-cpu-x86_64-linux", "reject: not a khub{ABI}-{backend}-{cpu}-{os} name"},
        {"khub1-cpu-x86_64_and_a_name_of_more_than_31-linux",
         "reject: not a khub{ABI}-{backend}-{cpu}-{os} name"},
        {"khub1-cu130-x86_64-linux", "reject: needs CUDA 13.0, no CUDA driver"},
    };
    size_t n = sizeof want / sizeof want[0];
    khub__rank_input in[16];
    for (size_t i = 0; i < n; i++) in[i] = (khub__rank_input){want[n - 1 - i].name, NULL, 0};
    khub_hub_variant_list *l = rank(in, n, &h);
    ASSERT_EQ(l->count, n);
    ASSERT_STR_EQ(l->best, "khub1-cpu-x86_64-linux");
    ASSERT_STR_EQ(l->items[0].name, "khub1-cpu-x86_64-linux");
    for (size_t i = 0; i < n; i++) {
        const khub_hub_variant *v = find(l, want[i].name);
        ASSERT_STR_EQ(v->reason, want[i].reason);
        ASSERT_EQ(v->accepted, i == 0);
        ASSERT_EQ(v->rank, i == 0 ? 1000 : -1);
    }
    /* rejected ones follow the accepted one, by name */
    for (size_t i = 2; i < l->count; i++)
        ASSERT(strcmp(l->items[i - 1].name, l->items[i].name) < 0);
    khub_hub_variant_list_free(l);

    h.cpu_features[0] = '\0';
    l = rank(in, n, &h);
    ASSERT_CONTAINS(find(l, "khub1-cpu-x86_64-linux")->reason, "host CPU: no listed features)");
    khub_hub_variant_list_free(l);
}

/* With a driver: the CUDA builds of its major at or below its minor are
 * accepted, newest minor first, before the CPU build. */
TEST_IMPL(cuda_ranks_before_cpu)
{
    int cc[] = {90};
    khub__rank_host h = cuda_host(12, 8, 1, cc);
    khub__rank_input in[] = {
        {"khub1-cpu-x86_64-linux", NULL, 0},   {"khub1-cu126-x86_64-linux", NULL, 0},
        {"khub1-cu128-x86_64-linux", NULL, 0}, {"khub1-cu129-x86_64-linux", NULL, 0},
        {"khub1-cu130-x86_64-linux", NULL, 0},
    };
    khub_hub_variant_list *l = rank(in, 5, &h);
    ASSERT_EQ(l->count, 5);
    ASSERT_STR_EQ(l->best, "khub1-cu128-x86_64-linux");
    ASSERT_STR_EQ(l->items[1].name, "khub1-cu126-x86_64-linux");
    ASSERT_STR_EQ(l->items[2].name, "khub1-cpu-x86_64-linux");
    ASSERT_EQ(l->items[0].rank, 92);
    ASSERT_STR_EQ(l->items[0].reason,
                  "accept: CUDA 12.8 build, driver 12.8 (no sm_XY files listed)");
    ASSERT_STR_EQ(find(l, "khub1-cu129-x86_64-linux")->reason,
                  "reject: needs CUDA 12.9, driver supports 12.8");
    ASSERT_STR_EQ(find(l, "khub1-cu130-x86_64-linux")->reason,
                  "reject: needs CUDA 13.0, driver supports 12.8");
    khub_hub_variant_list_free(l);

    h.n_gpus = 0; /* a driver that sees no device */
    l = rank(in, 5, &h);
    ASSERT_STR_EQ(l->best, "khub1-cpu-x86_64-linux");
    ASSERT_STR_EQ(find(l, "khub1-cu128-x86_64-linux")->reason,
                  "reject: the CUDA driver reports no GPU");
    khub_hub_variant_list_free(l);
}

/* The sm_XY artifacts decide: PTX runs on its capability and above, a
 * cubin on its major at its minor or above; the first GPU that runs one
 * is named, and a variant no GPU runs is rejected naming GPU 0. */
TEST_IMPL(cuda_artifacts_match_gpus)
{
    int cc89[] = {89}, two[] = {75, 90};
    const char *ptx80[] = {"libk.so", "metadata.json", "attn.sm_80.ptx"};
    const char *cubin86[] = {"libk.so", "attn.sm_86.cubin"};
    const char *cubin90[] = {"libk.so", "attn.sm_90.cubin"};
    const char *ptx90[] = {"attn.sm_90.ptx", "attn.sm_90x.ptx", "notes.sm_75.txt"};
    struct {
        const khub__rank_host h;
        const char *const *files;
        size_t n;
        const char *reason;
    } cases[] = {
        {cuda_host(13, 0, 1, cc89), ptx80, 3, "accept: CUDA 13.0 build, driver 13.0, GPU 0 sm_89"},
        {cuda_host(13, 0, 1, cc89), cubin86, 2,
         "accept: CUDA 13.0 build, driver 13.0, GPU 0 sm_89"},
        {cuda_host(13, 0, 1, cc89), cubin90, 2, "reject: no PTX or cubin for GPU 0 sm_89"},
        {cuda_host(13, 0, 2, two), cubin90, 2, "accept: CUDA 13.0 build, driver 13.0, GPU 1 sm_90"},
        {cuda_host(13, 0, 2, two), cubin86, 2,
         "reject: no PTX or cubin for GPU 0 sm_75 or the other GPUs"},
        {cuda_host(13, 0, 2, two), ptx90, 3, "accept: CUDA 13.0 build, driver 13.0, GPU 1 sm_90"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        khub__rank_input in = {"khub1-cu130-x86_64-linux", cases[i].files, cases[i].n};
        ASSERT(khub__rank_wants_files(in.name, &cases[i].h));
        khub_hub_variant_list *l = rank(&in, 1, &cases[i].h);
        ASSERT_EQ(l->count, 1);
        ASSERT_STR_EQ(l->items[0].reason, cases[i].reason);
        ASSERT_EQ(l->items[0].accepted, strncmp(cases[i].reason, "accept", 6) == 0);
        ASSERT_EQ(l->items[0].rank, l->items[0].accepted ? 100 : -1);
        ASSERT_EQ(l->best != NULL, l->items[0].accepted);
        khub_hub_variant_list_free(l);
    }
    khub__rank_host cpu = cpu_host();
    ASSERT(!khub__rank_wants_files("khub1-cu130-x86_64-linux", &cpu));
    ASSERT(!khub__rank_wants_files("khub1-cpu-x86_64-linux", &cases[0].h));
}

/* A host cut to one GPU (a model placed on cuda:N) judges a CUDA variant
 * against that GPU alone, naming it by its ordinal: on GPUs sm_75 and
 * sm_90 the sm_90 cubin fits cuda:1 and not cuda:0, though the whole host
 * accepts it; an ordinal the driver lacks leaves no GPU. */
TEST_IMPL(cuda_one_gpu_of_several)
{
    int two[] = {75, 90};
    const char *cubin90[] = {"libk.so", "attn.sm_90.cubin"};
    struct {
        int gpu;
        const char *reason;
    } cases[] = {
        {-1, "accept: CUDA 13.0 build, driver 13.0, GPU 1 sm_90"},
        {0, "reject: no PTX or cubin for GPU 0 sm_75"},
        {1, "accept: CUDA 13.0 build, driver 13.0, GPU 1 sm_90"},
        {2, "reject: the CUDA driver reports no GPU"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        khub__rank_host h = cuda_host(13, 0, 2, two);
        khub__rank_host_only_gpu(&h, cases[i].gpu);
        khub__rank_input in[] = {{"khub1-cu130-x86_64-linux", cubin90, 2},
                                 {"khub1-cpu-x86_64-linux", NULL, 0}};
        khub_hub_variant_list *l = rank(in, 2, &h);
        const khub_hub_variant *v = find(l, "khub1-cu130-x86_64-linux");
        ASSERT_STR_EQ(v->reason, cases[i].reason);
        /* the CPU build is what is left when the GPU runs nothing */
        ASSERT_STR_EQ(l->best, v->accepted ? "khub1-cu130-x86_64-linux" : "khub1-cpu-x86_64-linux");
        khub_hub_variant_list_free(l);
    }
}

/* A name given twice is judged once (the first), one of 128 bytes or more
 * is left out, and nothing at all is an empty list with no best. */
TEST_IMPL(duplicates_long_names_and_empty)
{
    khub__rank_host h = cpu_host();
    char longname[200];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    khub__rank_input in[] = {{"khub1-cpu-x86_64-linux", NULL, 0},
                             {longname, NULL, 0},
                             {"khub1-cpu-x86_64-linux", NULL, 0}};
    khub_hub_variant_list *l = rank(in, 3, &h);
    ASSERT_EQ(l->count, 1);
    ASSERT_STR_EQ(l->best, "khub1-cpu-x86_64-linux");
    khub_hub_variant_list_free(l);
    l = rank(NULL, 0, &h);
    ASSERT_EQ(l->count, 0);
    ASSERT(l->best == NULL);
    khub_hub_variant_list_free(l);
}

/* The lock's ranking: the locked names through the same function on this
 * host, names no cache folder could have left out, no file written. */
TEST_IMPL(locked_names_rank_like_the_listing)
{
    khub__rank_host h;
    khub__rank_host_detect(&h);
    char cpu[128], other[128];
    snprintf(cpu, sizeof cpu, "khub1-cpu-%s-linux", h.cpu);
    snprintf(other, sizeof other, "khub1-cpu-%s-linux",
             strcmp(h.cpu, "x86_64") ? "x86_64" : "aarch64");
    const char *names[] = {other, "torch29-cxx11-cpu-x86_64-linux", cpu, "a/b", "dot.name", ".."};
    khub_lock_file files[] = {{"metadata.json", ""}, {"libk.so", ""}};
    khub_lock_variant vs[6];
    memset(vs, 0, sizeof vs);
    for (size_t i = 0; i < 6; i++) {
        snprintf(vs[i].name, sizeof vs[i].name, "%s", names[i]);
        vs[i].files = files;
        vs[i].n_files = 2;
    }
    khub_lock_entry e;
    memset(&e, 0, sizeof e);
    snprintf(e.repo, sizeof e.repo, "org/demo");
    memset(e.commit, 'a', 40);
    e.variants = vs;
    e.n_variants = 6;
    khub_hub_id id;
    ASSERT_OK(khub_hub_id_parse("org/demo", &id, NULL, 0));
    khub_hub_variant_list *locked = NULL;
    ASSERT_OK(khub__kernel_rank_locked(NULL, &e, -1, &locked));
    khub__rank_input in[] = {
        {other, NULL, 0}, {"torch29-cxx11-cpu-x86_64-linux", NULL, 0}, {cpu, NULL, 0}};
    khub_hub_variant_list *listed = rank(in, 3, &h);
    ASSERT_EQ(locked->count, 3);
    ASSERT_EQ(locked->count, listed->count);
    ASSERT_STR_EQ(locked->best, cpu);
    for (size_t i = 0; i < locked->count; i++) {
        ASSERT_STR_EQ(locked->items[i].name, listed->items[i].name);
        ASSERT_STR_EQ(locked->items[i].reason, listed->items[i].reason);
        ASSERT_EQ(locked->items[i].rank, listed->items[i].rank);
    }
    khub_hub_variant_list_free(locked);
    khub_hub_variant_list_free(listed);
}

#define TEST_LIST(X) \
    X(cpu_host_verdicts) \
    X(cuda_ranks_before_cpu) \
    X(cuda_artifacts_match_gpus) \
    X(cuda_one_gpu_of_several) \
    X(duplicates_long_names_and_empty) X(locked_names_rank_like_the_listing)
TEST_MAIN(TEST_LIST)
