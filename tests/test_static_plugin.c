/* test_static_plugin.c: khub/ref-cpu linked into this program from the same
 * sources as its module (the CMake target ref-cpu_static that
 * khub_add_plugin() makes) and registered with khub_plugin_load_static. It
 * must list the same ops with the same capabilities as the loaded module
 * and compute bit-identical results through the registry. */
#include "plugins/tp_util.h"
#include "runtime_impl.h"

/* The init function the plugin's KHUB_PLUGIN_DEFINE_KINDS line names. */
khub_status khub_ref_cpu_init(const khub_host_api *host, khub_plugin_desc *out, char *errbuf,
                              size_t errbuf_size);

static khub_plugin *find_plugin(khub_runtime *rt, const char *id)
{
    for (size_t i = 0; i < khub_plugin_count(rt); i++) {
        khub_plugin *p = (khub_plugin *)khub_plugin_at(rt, i);
        if (strcmp(khub_plugin_id(p), id) == 0) return p;
    }
    TEST_FAIL_("no plugin %s loaded", id);
    return NULL;
}

TEST_IMPL(static_registers_like_a_module)
{
    khub_runtime *rt = tp_runtime(1);
    khub_plugin *p = NULL;
    ASSERT_OK(khub_plugin_load_static(rt, khub_ref_cpu_init, &p));
    ASSERT(p != NULL);
    ASSERT_EQ(khub_plugin_count(rt), 1);
    ASSERT_STR_EQ(khub_plugin_id(p), "khub/ref-cpu");
    ASSERT_STR_EQ(khub_plugin_path(p), "(static)");
    ASSERT_STR_EQ(khub_plugin_sha256(p), "");
    uint16_t maj = 0, min = 0;
    khub_plugin_abi(p, &maj, &min);
    ASSERT_EQ(maj, KHUB_ABI_MAJOR);
    ASSERT_EQ(min, KHUB_ABI_MINOR);
    /* static_cache since issue 11; quantized, paged, sliding, offloaded 1.4;
     * embedding 1.5 */
    ASSERT_EQ(khub_plugin_op_count(p), 15);
    char err[KHUB_ERROR_SIZE];
    ASSERT_OK(khub_plugin_selftest(p, err, sizeof err));
    khub_runtime_free(rt);
}

TEST_IMPL(static_and_module_declare_the_same_ops)
{
    khub_runtime *rs = tp_runtime(1), *rm = tp_runtime(1);
    khub_plugin *ps = NULL;
    ASSERT_OK(khub_plugin_load_static(rs, khub_ref_cpu_init, &ps));
    ASSERT_OK(khub_plugin_load_builtin(rm));
    khub_plugin *pm = find_plugin(rm, "khub/ref-cpu");
    ASSERT(strcmp(khub_plugin_path(pm), "(static)") != 0);
    ASSERT_STR_EQ(khub_plugin_version(ps), khub_plugin_version(pm));
    ASSERT_EQ(khub_plugin_op_count(ps), khub_plugin_op_count(pm));
    for (uint32_t i = 0; i < khub_plugin_op_count(ps); i++) {
        const khub_op_desc *a = khub_plugin_op(ps, i), *b = khub_plugin_op(pm, i);
        ASSERT_STR_EQ(a->name, b->name);
        ASSERT_EQ(a->kind, b->kind);
        ASSERT_EQ(a->caps->device_type, b->caps->device_type);
        ASSERT_EQ(a->caps->dtypes, b->caps->dtypes);
        ASSERT_EQ(a->caps->flags, b->caps->flags);
        ASSERT_EQ(a->caps->cpu_features, b->caps->cpu_features);
        ASSERT_EQ(a->caps->n_head_dims, b->caps->n_head_dims);
        ASSERT_EQ(a->caps->priority, b->caps->priority);
        ASSERT_EQ(a->run == NULL, b->run == NULL);
        ASSERT(a->run != b->run || a->run == NULL); /* two copies of the code */
    }
    khub_runtime_free(rs);
    khub_runtime_free(rm);
}

/* y = rms_norm(x) * w through the registry's ref-cpu binding of rt. */
static void norm_via(khub_runtime *rt, const float *x, const float *w, float *y, int64_t n,
                     int64_t dim)
{
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query), .kind = KHUB_OP_NORM,
                       .dtype_id = KHUB_DTYPE_ID_F32, .plugin_id = "khub/ref-cpu"};
    khub_binding *b = NULL;
    ASSERT_OK(khub_registry_select(rt, &q, &b));
    ASSERT_CONTAINS(khub_binding_name(b), "khub/ref-cpu ");
    int64_t xs[2] = {n, dim}, ws[1] = {dim}, ys[2] = {n, dim};
    khub_tensor tx = {.data = (void *)x,
                      .device = {KHUB_DEVICE_CPU, 0},
                      .ndim = 2,
                      .dtype = KHUB_DTYPE_F32,
                      .shape = xs};
    khub_tensor tw = {.data = (void *)w,
                      .device = {KHUB_DEVICE_CPU, 0},
                      .ndim = 1,
                      .dtype = KHUB_DTYPE_F32,
                      .shape = ws};
    khub_tensor ty = {
        .data = y, .device = {KHUB_DEVICE_CPU, 0}, .ndim = 2, .dtype = KHUB_DTYPE_F32, .shape = ys};
    khub_norm_args a = {KHUB_STRUCT_INIT(khub_norm_args),
                        .norm_type = KHUB_NORM_RMS,
                        .eps = 1e-6f,
                        .x = &tx,
                        .weight = &tw,
                        .y = &ty};
    ASSERT_OK(khub_binding_call(b, &a));
}

TEST_IMPL(static_and_module_compute_the_same)
{
    enum { N = 3, DIM = 64 };
    float x[N * DIM], w[DIM], ys[N * DIM], ym[N * DIM];
    for (int i = 0; i < N * DIM; i++) x[i] = (float)((i * 37) % 23) / 7.0f - 1.5f;
    for (int i = 0; i < DIM; i++) w[i] = 0.5f + (float)i / DIM;
    memset(ys, 0, sizeof ys);
    memset(ym, 0xff, sizeof ym);
    khub_runtime *rs = tp_runtime(1), *rm = tp_runtime(1);
    ASSERT_OK(khub_plugin_load_static(rs, khub_ref_cpu_init, NULL));
    ASSERT_OK(khub_plugin_load_builtin(rm));
    norm_via(rs, x, w, ys, N, DIM);
    norm_via(rm, x, w, ym, N, DIM);
    ASSERT_EQ(memcmp(ys, ym, sizeof ys), 0);
    ASSERT(ys[0] != 0.0f);
    khub_runtime_free(rs);
    khub_runtime_free(rm);
}

#define TEST_LIST(X) \
    X(static_registers_like_a_module) \
    X(static_and_module_declare_the_same_ops) \
    X(static_and_module_compute_the_same)
TEST_MAIN(TEST_LIST)
