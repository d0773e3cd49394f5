/*
 * check_bench.c: timing a kernel's ops against khub/ref-cpu as library
 * calls (khub_check.h): a built kernel source tree's declared self-tests
 * (khub_kernel_dir_tests) and its verified CPU plugin (khub_kernel_dir_load),
 * one op timed on a self-test's inputs (khub_op_bench, over selftest.c),
 * the clock itself (khub_time_calls, timing.c), and the host table for a
 * program that drives a plugin's entry directly (khub_runtime_host).
 */
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#include "app_struct.h"
#include "internal.h"
#include "kernel_manifest.h"
#include "kernel_meta.h"
#include "khub/khub_check.h"
#include "selftest.h"
#include "timing.h"

/* ======================================================================== */
/* A kernel source tree                                                     */
/* ======================================================================== */

#define OP_TEST_0_1 KHUB__SIZE_TO(khub_op_test, tolerance)

khub_status khub_kernel_dir_tests(const char *dir, khub_op_test *tests, size_t max, size_t *n,
                                  char *errbuf, size_t errbuf_size)
{
    if (!dir || !n || (max && !tests)) {
        khub__errbuf(errbuf, errbuf_size, "khub_kernel_dir_tests: misuse: NULL argument");
        return KHUB_STATUS_MISUSE;
    }
    /* The caller sets tests[0].struct_size only: the stride of its array
     * (app_struct.h), 0.1's size at least; it may be larger than this
     * library's (a newer header). */
    char msg[KHUB_ERROR_SIZE];
    khub_status cst = khub__app_array_check(tests, max ? 1 : 0, OP_TEST_0_1,
                                            "khub_kernel_dir_tests", "tests", msg, sizeof msg);
    if (cst != KHUB_STATUS_OK) {
        khub__errbuf(errbuf, errbuf_size, "%s", msg);
        return cst;
    }
    *n = 0;
    khub_kernel_manifest *m = calloc(1, sizeof *m);
    if (!m) {
        khub__errbuf(errbuf, errbuf_size, "out of memory");
        return KHUB_STATUS_NOMEM;
    }
    khub_status st = khub__km_load(dir, m, errbuf, errbuf_size);
    if (st == KHUB_STATUS_OK && m->n_tests > max) {
        khub__errbuf(errbuf, errbuf_size, "%s/kernel.json declares %zu self-tests, room for %zu",
                     dir, m->n_tests, max);
        st = KHUB_STATUS_OVERFLOW;
    }
    /* The caller's khub_op_test may be older or newer than this library's:
     * each element gets tests[0]'s header (the caller's struct_size and
     * stamp) and what both know; the bytes past this library's struct stay
     * the caller's. */
    for (size_t i = 0; st == KHUB_STATUS_OK && i < m->n_tests; i++) {
        khub_op_test t = {KHUB_STRUCT_INIT(khub_op_test), .ndim = (uint32_t)m->tests[i].ndim,
                          .tolerance = m->tests[i].tolerance};
        snprintf(t.op, sizeof t.op, "%s", m->tests[i].op);
        snprintf(t.dtype, sizeof t.dtype, "%s", m->tests[i].dtype);
        memcpy(t.shape, m->tests[i].shape, sizeof t.shape);
        khub_op_test *dst = khub__app_at(tests, i);
        if (i) memcpy(dst, tests, 8); /* tests[0]'s is the caller's already */
        khub__app_copy_out(dst, &t, sizeof t);
    }
    if (st == KHUB_STATUS_OK) *n = m->n_tests;
    free(m);
    return st;
}

/* DIR/build/khub<major>-cpu-<arch>-linux, this machine's CPU variant. */
static void cpu_variant_dir(const char *dir, char *vdir, size_t n)
{
    struct utsname u;
    uname(&u);
    snprintf(vdir, n, "%s/build/khub%d-cpu-%s-linux", dir, KHUB_ABI_MAJOR,
             strcmp(u.machine, "arm64") ? u.machine : "aarch64");
}

/* metadata.json of vdir, parsed and every file verified into *out (the
 * caller frees it); else the status, failed on rt. */
static khub_status verified_meta(khub_runtime *rt, const char *dir, const char *vdir,
                                 khub_kmeta **out)
{
    char mpath[2500], err[KHUB_ERROR_SIZE] = "";
    snprintf(mpath, sizeof mpath, "%s/metadata.json", vdir);
    char *json = NULL;
    size_t len = 0;
    khub_status st = khub__read_file(mpath, 4u << 20, &json, &len, NULL, 0);
    if (st != KHUB_STATUS_OK)
        return khub__fail(rt, st == KHUB_STATUS_NOMEM ? st : KHUB_STATUS_NOT_FOUND,
                          "%s: no metadata.json; build the kernel first (khub build %s)", vdir,
                          dir);
    khub_kmeta *m = calloc(1, sizeof *m);
    st = m ? khub__kmeta_parse(json, len, m, err, sizeof err) : KHUB_STATUS_NOMEM;
    free(json);
    if (st == KHUB_STATUS_OK) st = khub__kmeta_verify_dir(m, vdir, err, sizeof err);
    if (st == KHUB_STATUS_OK) {
        *out = m;
        return st;
    }
    free(m);
    return khub__fail(rt, st, "%s: %s", vdir, err[0] ? err : khub_status_str(st));
}

khub_status khub_kernel_dir_load(khub_runtime *rt, const char *dir, khub_kernel_dir_plugin *out)
{
    KHUB_API_CHECK(rt, rt && dir && out);
    khub__clear(rt);
    KHUB__APP_CHECK(rt, out, KHUB__SIZE_TO(khub_kernel_dir_plugin, variant), "khub_kernel_dir_load",
                    "out");
    out->plugin = NULL;
    out->file[0] = out->variant[0] = '\0';
    char vdir[2400], path[2700];
    cpu_variant_dir(dir, vdir, sizeof vdir);
    khub_kmeta *m = NULL;
    KHUB_FORWARD_IF_ERROR(rt, verified_meta(rt, dir, vdir, &m));
    const khub_kmeta_plugin *p = khub__kmeta_pick_plugin(m, khub_cpu_features());
    khub_status st = KHUB_STATUS_OK;
    if (!p)
        st = khub__fail(rt, KHUB_STATUS_NO_VARIANT, "%s: no plugin file fits this CPU", vdir);
    else if (snprintf(path, sizeof path, "%s/%s", vdir, p->file) >= (int)sizeof path)
        st = khub__fail(rt, KHUB_STATUS_OVERFLOW, "loading %s/%s: path too long", vdir, p->file);
    if (st == KHUB_STATUS_OK)
        st = khub_plugin_load(rt, path, khub__kmeta_digest(m, p->file), &out->plugin);
    if (st != KHUB_STATUS_OK && p && out->plugin == NULL && st != KHUB_STATUS_OVERFLOW) {
        char why[KHUB_ERROR_SIZE];
        khub__copy_error(rt, why, sizeof why);
        khub__clear(rt);
        khub__fail(rt, st, "loading %s: %s", path, why);
    }
    if (st == KHUB_STATUS_OK) {
        snprintf(out->file, sizeof out->file, "%s", p->file);
        snprintf(out->variant, sizeof out->variant, "%s", strrchr(vdir, '/') + 1);
    }
    free(m);
    return st;
}

/* ======================================================================== */
/* Timing                                                                   */
/* ======================================================================== */

khub_status khub_op_bench(khub_runtime *rt, const char *plugin_id, const khub_op_test *test,
                          double min_s, khub_op_bench_result *out)
{
    KHUB_API_CHECK(rt, rt && plugin_id && test && out);
    khub__clear(rt);
    KHUB__APP_CHECK(rt, test, OP_TEST_0_1, "khub_op_bench", "test");
    KHUB__APP_CHECK(rt, out, KHUB__SIZE_TO(khub_op_bench_result, kind), "khub_op_bench", "out");
    KHUB_RETURN_IF(rt, test->ndim > 6, KHUB_STATUS_INVALID_ARG, "%s: %u dimensions, at most 6",
                   test->op, test->ndim);
    khub_selftest_spec s = {test->op, {0}, test->ndim, test->dtype, test->tolerance};
    memcpy(s.shape, test->shape, sizeof s.shape);
    double us = 0, ref = 0;
    KHUB_FORWARD_IF_ERROR(rt, khub__selftest_time(rt, plugin_id, &s, min_s, &us, &ref));
    int flops = 0;
    out->kind = khub__selftest_kind(rt, plugin_id, test->op);
    out->work = khub__selftest_work(out->kind, &s, &flops);
    out->is_flops = flops;
    out->us = us;
    out->ref_us = ref;
    return KHUB_STATUS_OK;
}

khub_status khub_time_calls(khub_timed_fn fn, void *ud, double min_s, int clock_id,
                            double *median_s)
{
    if (!fn || !median_s) return khub__fail(NULL, KHUB_STATUS_MISUSE, "khub_time_calls: misuse");
    return khub__time_calls(fn, ud, min_s, clock_id, median_s);
}

const khub_host_api *khub_runtime_host(khub_runtime *rt) { return khub__runtime_host(rt); }
