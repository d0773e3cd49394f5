/*
 * test_check_api.c: the public check and bench API (khub_check.h), through
 * public headers only: the gate's report on purpose-built plugins
 * (tests/plugins: hostile_runpath carries a RUNPATH, good_v1 passes), the
 * gate over kernel source trees that are not built or whose variants are
 * broken, the errors a caller can make, op timing against khub/ref-cpu, and
 * the names reports use.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "khub/khub_check.h"
#include "runner.h"

/* The first line of rep with this code, or NULL. */
static const khub_check_finding *find_code(const khub_check_report *rep, uint32_t code)
{
    for (size_t i = 0; i < rep->n_findings; i++)
        if (khub_check_report_finding(rep, i)->code == code)
            return khub_check_report_finding(rep, i);
    return NULL;
}

/* A fresh folder holding kernels-src/rmsnorm's kernel.json. */
static void kernel_tree(char *dir, size_t n)
{
    snprintf(dir, n, "/tmp/khub-check-api-XXXXXX");
    ASSERT(mkdtemp(dir) != NULL);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cp %s/kernels-src/rmsnorm/kernel.json %s/", KHUB_SOURCE_DIR, dir);
    ASSERT_EQ(system(cmd), 0);
}

/* Removes a folder kernel_tree made. */
static void rm_tree(const char *dir)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ASSERT_EQ(system(cmd), 0);
}

/* ------------------------------------------------------------------------ */
/* khub_check_file                                                          */
/* ------------------------------------------------------------------------ */

TEST_IMPL(file_runpath_finding)
{
    const char *path = KHUB_TEST_PLUGIN_DIR "/hostile_runpath.so";
    khub_check_report *rep = NULL;
    char err[KHUB_ERROR_SIZE] = "";
    ASSERT_OK(khub_check_file(path, NULL, &rep, err, sizeof err));
    ASSERT(rep != NULL);
    ASSERT(rep->struct_size >= sizeof *rep);
    ASSERT_STATUS(rep->inspect_status, KHUB_STATUS_OK);
    ASSERT_STATUS(rep->gate_status, KHUB_STATUS_PLUGIN_INVALID);
    ASSERT_EQ(rep->n_failed, 1);
    const khub_check_finding *f = find_code(rep, KHUB_CHECK_GATE_SEARCH_PATH);
    ASSERT(f != NULL);
    ASSERT_EQ(f->severity, KHUB_CHECK_FAIL);
    ASSERT_STR_EQ(f->file, path);
    ASSERT_STR_EQ(f->op, "");
    ASSERT_STR_EQ(f->message,
                  "has RUNPATH '/opt/khub-hostile-lib' (plugins must not carry search paths)");
    ASSERT_STR_EQ(khub_check_code_name(f->code), "gate_search_path");
    /* nothing of it ran */
    ASSERT_EQ(rep->loaded, 0);
    ASSERT_STR_EQ(rep->load_report, "not loaded: no plugin code runs until the ABI gate passes");
    ASSERT(find_code(rep, KHUB_CHECK_SELFTEST) == NULL);
    ASSERT_STR_EQ(rep->glibc_ceiling, "GLIBC_2.28");
    ASSERT(khub_check_report_finding(rep, rep->n_findings) == NULL);
    khub_check_report_free(rep);
}

TEST_IMPL(file_good_passes_and_loads)
{
    const char *path = KHUB_TEST_PLUGIN_DIR "/good_v1.so";
    khub_check_opts o = {KHUB_STRUCT_INIT(khub_check_opts), .glibc_ceiling = "GLIBC_2.99"};
    khub_check_report *rep = NULL;
    char err[KHUB_ERROR_SIZE] = "";
    ASSERT_OK(khub_check_file(path, &o, &rep, err, sizeof err));
    ASSERT_EQ(rep->n_failed, 0);
    ASSERT_EQ(rep->loaded, 1);
    ASSERT_STATUS(rep->load_status, KHUB_STATUS_OK);
    ASSERT_CONTAINS(rep->load_report, "selftest passed");
    ASSERT(rep->info != NULL);
    ASSERT_STR_EQ(rep->info->version, "1.0.0");
    const khub_check_finding *g = find_code(rep, KHUB_CHECK_GATE);
    ASSERT(g != NULL);
    ASSERT_EQ(g->severity, KHUB_CHECK_PASS);
    ASSERT_CONTAINS(g->message, "ceiling GLIBC_2.99");
    ASSERT_EQ(find_code(rep, KHUB_CHECK_SELFTEST)->severity, KHUB_CHECK_PASS);
    khub_check_report_free(rep);
}

TEST_IMPL(file_wrong_digest_not_loaded)
{
    khub_check_opts o = {KHUB_STRUCT_INIT(khub_check_opts),
                         .sha256 =
                             "0000000000000000000000000000000000000000000000000000000000000000"};
    khub_check_report *rep = NULL;
    ASSERT_OK(khub_check_file(KHUB_TEST_PLUGIN_DIR "/good_v1.so", &o, &rep, NULL, 0));
    ASSERT_EQ(rep->n_failed, 1);
    ASSERT_EQ(rep->loaded, 0);
    ASSERT_STATUS(rep->load_status, KHUB_STATUS_DIGEST_MISMATCH);
    ASSERT_CONTAINS(rep->load_report, "not loaded: its SHA-256 is ");
    ASSERT_CONTAINS(rep->load_report, ", expected 0000");
    ASSERT_EQ(find_code(rep, KHUB_CHECK_SELFTEST)->severity, KHUB_CHECK_FAIL);
    khub_check_report_free(rep);
}

TEST_IMPL(file_not_elf_is_an_inspect_finding)
{
    const char *path = KHUB_SOURCE_DIR "/abi/khub/khub_check.h";
    khub_check_report *rep = NULL;
    ASSERT_OK(khub_check_file(path, NULL, &rep, NULL, 0));
    ASSERT_STATUS(rep->inspect_status, KHUB_STATUS_NOT_ELF);
    ASSERT(rep->info == NULL);
    ASSERT_EQ(rep->n_failed, 1);
    const khub_check_finding *f = find_code(rep, KHUB_CHECK_INSPECT);
    ASSERT(f != NULL);
    ASSERT_EQ(f->severity, KHUB_CHECK_FAIL);
    ASSERT(f->message[0] != '\0');
    khub_check_report_free(rep);
}

TEST_IMPL(file_errors)
{
    char err[KHUB_ERROR_SIZE] = "";
    khub_check_report *rep = (khub_check_report *)1;
    khub_check_opts o = {KHUB_STRUCT_INIT(khub_check_opts), .glibc_ceiling = "2.28"};
    ASSERT_STATUS(khub_check_file(KHUB_TEST_PLUGIN_DIR "/good_v1.so", &o, &rep, err, sizeof err),
                  KHUB_STATUS_INVALID_ARG);
    ASSERT(rep == NULL);
    ASSERT_STR_EQ(err, "glibc ceiling '2.28' is not like GLIBC_2.28");
    ASSERT_STATUS(khub_check_file(NULL, NULL, &rep, err, sizeof err), KHUB_STATUS_MISUSE);
    khub_check_report_free(NULL);
}

/* ------------------------------------------------------------------------ */
/* khub_check_dir                                                           */
/* ------------------------------------------------------------------------ */

TEST_IMPL(dir_not_built)
{
    char dir[64], err[KHUB_ERROR_SIZE] = "", want[256];
    kernel_tree(dir, sizeof dir);
    khub_check_report *rep = NULL;
    ASSERT_STATUS(khub_check_dir(dir, NULL, &rep, err, sizeof err), KHUB_STATUS_NOT_FOUND);
    ASSERT(rep == NULL);
    snprintf(want, sizeof want, "%s/build: not built (run 'khub build %s')", dir, dir);
    ASSERT_STR_EQ(err, want);
    /* a file check's option is refused, not ignored */
    khub_check_opts o = {KHUB_STRUCT_INIT(khub_check_opts), .glibc_ceiling = "GLIBC_2.28"};
    ASSERT_STATUS(khub_check_dir(dir, &o, &rep, err, sizeof err), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(err, "kernel.json");
    rm_tree(dir);
}

TEST_IMPL(dir_without_kernel_json)
{
    char err[KHUB_ERROR_SIZE] = "";
    khub_check_report *rep = NULL;
    khub_status st = khub_check_dir("/nonexistent-khub-dir", NULL, &rep, err, sizeof err);
    ASSERT(st != KHUB_STATUS_OK);
    ASSERT(rep == NULL);
    ASSERT_CONTAINS(err, "/nonexistent-khub-dir");
}

TEST_IMPL(dir_findings)
{
    char dir[64], p[256], err[KHUB_ERROR_SIZE] = "";
    kernel_tree(dir, sizeof dir);
    snprintf(p, sizeof p, "%s/build", dir);
    ASSERT_EQ(mkdir(p, 0755), 0);
    khub_check_report *rep = NULL;
    ASSERT_OK(khub_check_dir(dir, NULL, &rep, err, sizeof err));
    ASSERT_STR_EQ(rep->repo, "kernels-community/rmsnorm");
    ASSERT_EQ(rep->n_variants, 0);
    ASSERT_EQ(rep->n_failed, 1);
    const khub_check_finding *f = find_code(rep, KHUB_CHECK_NO_VARIANTS);
    ASSERT_STR_EQ(f->file, p);
    ASSERT_STR_EQ(f->message, "no variant directories");
    khub_check_report_free(rep);

    /* a variant whose metadata.json is not JSON */
    snprintf(p, sizeof p, "%s/build/khub1-cpu-x86_64-linux", dir);
    ASSERT_EQ(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/build/khub1-cpu-x86_64-linux/metadata.json", dir);
    FILE *fp = fopen(p, "w");
    ASSERT(fp != NULL);
    fputs("{not json", fp);
    fclose(fp);
    ASSERT_OK(khub_check_dir(dir, NULL, &rep, err, sizeof err));
    ASSERT_EQ(rep->n_variants, 1);
    ASSERT_EQ(rep->n_failed, 1);
    f = find_code(rep, KHUB_CHECK_METADATA);
    ASSERT(f != NULL);
    ASSERT_EQ(f->severity, KHUB_CHECK_FAIL);
    ASSERT_STR_EQ(f->variant, "khub1-cpu-x86_64-linux");
    ASSERT_STR_EQ(f->file, p);
    ASSERT_CONTAINS(f->message, "metadata.json");
    khub_check_report_free(rep);
    rm_tree(dir);
}

/* A real build whose self-tests cannot pass (tolerance 1e-300): the gate
 * passes, the child runs, and the failure names its op. */
TEST_IMPL(dir_selftest_failure_names_op)
{
    const char *khub = getenv("KHUB_BIN");
    if (!khub) TEST_SKIP("KHUB_BIN unset: no khub CLI to build the kernel with");
    char dir[64], cmd[2048], err[KHUB_ERROR_SIZE] = "";
    kernel_tree(dir, sizeof dir);
    snprintf(cmd, sizeof cmd,
             "cp %s/kernels-src/rmsnorm/* %s/ && sed -i 's/\"tolerance\": [0-9e.-]*/"
             "\"tolerance\": 1e-300/' %s/kernel.json && %s build %s > %s/build.log 2>&1",
             KHUB_SOURCE_DIR, dir, dir, khub, dir, dir);
    if (system(cmd) != 0) TEST_SKIP("khub build failed (no C compiler?): %s", cmd);
    khub_check_report *rep = NULL;
    ASSERT_OK(khub_check_dir(dir, NULL, &rep, err, sizeof err));
    ASSERT(rep->n_variants >= 1);
    ASSERT(rep->n_failed >= 1);
    ASSERT_EQ(find_code(rep, KHUB_CHECK_DIGESTS)->severity, KHUB_CHECK_PASS);
    ASSERT_EQ(find_code(rep, KHUB_CHECK_GATE)->severity, KHUB_CHECK_PASS);
    ASSERT_STR_EQ(find_code(rep, KHUB_CHECK_SIGNATURE)->message, "unsigned");
    const khub_check_finding *f = NULL;
    for (size_t i = 0; i < rep->n_findings && !f; i++) {
        const khub_check_finding *g = khub_check_report_finding(rep, i);
        if (g->code == KHUB_CHECK_SELFTEST && g->severity == KHUB_CHECK_FAIL) f = g;
    }
    ASSERT(f != NULL);
    ASSERT_STR_EQ(f->op, "rms_norm");
    ASSERT_STR_EQ(f->variant, "khub1-cpu-x86_64-linux");
    ASSERT_CONTAINS(f->file, "/build/khub1-cpu-x86_64-linux/rmsnorm-");
    ASSERT_CONTAINS(f->message, "rms_norm [4, 576] f32: NMSE ");
    ASSERT_CONTAINS(f->message, " > 1e-300");
    khub_check_report_free(rep);
    rm_tree(dir);
}

/* ------------------------------------------------------------------------ */
/* Timing                                                                   */
/* ------------------------------------------------------------------------ */

TEST_IMPL(op_bench_against_ref)
{
    khub_runtime_opts ro = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = 1};
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(&ro, &rt));
    ASSERT_OK(khub_plugin_load_builtin(rt));
    khub_op_test t = {KHUB_STRUCT_INIT(khub_op_test), .op = "rms_norm", .shape = {4, 576},
                      .ndim = 2, .dtype = "f32"};
    khub_op_bench_result r = {KHUB_STRUCT_INIT(khub_op_bench_result)};
    ASSERT_OK(khub_op_bench(rt, "khub/ref-cpu", &t, 0.01, &r));
    ASSERT(r.us > 0 && r.ref_us > 0);
    ASSERT_EQ(r.kind, KHUB_OP_NORM);
    ASSERT_EQ(r.is_flops, 0);
    ASSERT(r.work == 4.0 * 4 * 4 * 576);
    snprintf(t.op, sizeof t.op, "no_such_op");
    ASSERT_STATUS(khub_op_bench(rt, "khub/ref-cpu", &t, 0.01, &r), KHUB_STATUS_NO_KERNEL);
    ASSERT_STR_EQ(khub_runtime_errmsg(rt), "khub/ref-cpu: no op named no_such_op is loaded");
    ASSERT(khub_runtime_host(rt) != NULL);
    khub_runtime_free(rt);
}

static khub_status count_calls(void *ud, int i)
{
    (void)i;
    return ++*(int *)ud > 3 ? KHUB_STATUS_IO : KHUB_STATUS_OK;
}

static khub_status nap(void *ud, int i)
{
    (void)ud, (void)i;
    return KHUB_STATUS_OK;
}

TEST_IMPL(time_calls)
{
    double med = -1;
    ASSERT_OK(khub_time_calls(nap, NULL, 0.01, CLOCK_MONOTONIC, &med));
    ASSERT(med >= 0);
    int calls = 0;
    ASSERT_STATUS(khub_time_calls(count_calls, &calls, 0.01, CLOCK_MONOTONIC, &med),
                  KHUB_STATUS_IO);
    ASSERT(med == 0);
}

TEST_IMPL(kernel_dir_tests)
{
    khub_op_test t[4] = {{KHUB_STRUCT_INIT(khub_op_test)}};
    size_t n = 0;
    char err[KHUB_ERROR_SIZE] = "";
    ASSERT_OK(khub_kernel_dir_tests(KHUB_SOURCE_DIR "/kernels-src/activation", t, 4, &n, err,
                                    sizeof err));
    ASSERT_EQ(n, 2);
    ASSERT_STR_EQ(t[1].op, "silu_and_mul");
    ASSERT_EQ(t[1].ndim, 2);
    ASSERT_EQ(t[1].shape[0], 37);
    ASSERT_STR_EQ(t[1].dtype, "f32");
    ASSERT_STATUS(
        khub_kernel_dir_tests(KHUB_SOURCE_DIR "/kernels-src/activation", t, 1, &n, err, sizeof err),
        KHUB_STATUS_OVERFLOW);
    ASSERT_CONTAINS(err, "declares 2 self-tests, room for 1");
    khub_op_test small = {.struct_size = 8};
    ASSERT_STATUS(khub_kernel_dir_tests(KHUB_SOURCE_DIR "/kernels-src/activation", &small, 1, &n,
                                        err, sizeof err),
                  KHUB_STATUS_STRUCT_SIZE);
    ASSERT_STR_EQ(err, "khub_kernel_dir_tests: tests[0].struct_size 8 is smaller than 0.1's 152");
    /* a tree that is not built has nothing to load */
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(NULL, &rt));
    char dir[64];
    kernel_tree(dir, sizeof dir);
    khub_kernel_dir_plugin dp = {KHUB_STRUCT_INIT(khub_kernel_dir_plugin)};
    ASSERT_STATUS(khub_kernel_dir_load(rt, dir, &dp), KHUB_STATUS_NOT_FOUND);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "no metadata.json; build the kernel first");
    ASSERT(dp.plugin == NULL);
    khub_runtime_free(rt);
    rm_tree(dir);
}

/* ------------------------------------------------------------------------ */
/* Names                                                                    */
/* ------------------------------------------------------------------------ */

TEST_IMPL(names)
{
    ASSERT_STR_EQ(khub_op_kind_name(KHUB_OP_NORM), "norm");
    ASSERT_STR_EQ(khub_op_kind_name(99), "unknown");
    ASSERT_EQ(khub_op_kind_from_name("attention"), KHUB_OP_ATTENTION);
    ASSERT_EQ(khub_op_kind_from_name("softmax"), 0);
    ASSERT_EQ(khub_op_kind_from_name(NULL), 0);
    ASSERT_STR_EQ(khub_dtype_id_name(0), "f32");
    ASSERT(khub_dtype_id_name(-1) == NULL);
    char buf[64];
    khub_cap_flag_names(KHUB_OP_ATTENTION, KHUB_CAP_CAUSAL | KHUB_CAP_GQA | (UINT64_C(1) << 40),
                        ",", buf, sizeof buf);
    ASSERT_STR_EQ(buf, "causal,gqa,bit40");
    uint32_t bit = 0;
    ASSERT_STR_EQ(khub_cpu_feature_at(0, &bit), "sse4.2");
    ASSERT_EQ(bit, KHUB_CPU_SSE42);
    size_t n = 0;
    while (khub_cpu_feature_at(n, NULL)) n++;
    ASSERT(n >= 10);
    khub_cpu_feature_names(KHUB_CPU_AVX2 | KHUB_CPU_FMA, " ", buf, sizeof buf);
    ASSERT_STR_EQ(buf, "avx2 fma");
    ASSERT_STR_EQ(khub_cpu_level_name(KHUB_CPU_AVX2 | KHUB_CPU_FMA | KHUB_CPU_F16C), "avx2");
    ASSERT_STR_EQ(khub_cpu_level_name(0), "x86-64");
    ASSERT_EQ(khub_cpu_features() & ~khub_cpu_features_host(), 0);
    /* every check code has its own name */
    for (uint32_t a = 1; a < KHUB_CHECK__COUNT; a++) {
        ASSERT(strcmp(khub_check_code_name(a), "unknown") != 0);
        for (uint32_t b = 1; b < a; b++)
            ASSERT(strcmp(khub_check_code_name(a), khub_check_code_name(b)) != 0);
    }
    ASSERT_STR_EQ(khub_check_code_name(0), "unknown");
}

TEST_IMPL(cpu_level_check)
{
    char err[KHUB_ERROR_SIZE] = "";
    unsetenv("KHUB_CPU_LEVEL");
    ASSERT_OK(khub_cpu_level_check(err, sizeof err));
    setenv("KHUB_CPU_LEVEL", "avx3", 1);
    ASSERT_STATUS(khub_cpu_level_check(err, sizeof err), KHUB_STATUS_INVALID_ARG);
    ASSERT_STR_EQ(err, "KHUB_CPU_LEVEL=avx3 is not a CPU level; use x86-64 (alias generic), "
                       "avx2, avx512 or native, or unset it");
    setenv("KHUB_CPU_LEVEL", "avx2", 1);
    ASSERT_OK(khub_cpu_level_check(NULL, 0));
}

#define TEST_LIST(X) \
    X(file_runpath_finding) \
    X(file_good_passes_and_loads) \
    X(file_wrong_digest_not_loaded) \
    X(file_not_elf_is_an_inspect_finding) \
    X(file_errors) \
    X(dir_not_built) \
    X(dir_without_kernel_json) \
    X(dir_findings) \
    X(dir_selftest_failure_names_op) \
    X(op_bench_against_ref) \
    X(time_calls) \
    X(kernel_dir_tests) \
    X(names) \
    X(cpu_level_check)
TEST_MAIN(TEST_LIST)
