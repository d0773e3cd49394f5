/*
 * app.c: an application built OUTSIDE khub's tree against the installed
 * package (tests/t_install.sh builds it with pkg-config and with CMake's
 * find_package). Only <khub/...> headers and libkhub.
 *
 *   app [--plugin FILE SHA256] [--model DIR]
 *
 * Prints the library version and every built-in plugin with its file; with
 * --plugin loads that kernel plugin (digest-checked), selects its norm op by
 * plugin id and checks one RMS norm against a value computed here; with
 * --model loads the model and generates 4 greedy tokens. Exit 0 on success.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <khub/khub.h>
#include <khub/khub_model.h>

static int fail(khub_runtime *rt, const char *what)
{
    fprintf(stderr, "app: %s: %s\n", what, rt ? khub_runtime_errmsg(rt) : khub_last_error());
    return 1;
}

static int check_norm(khub_runtime *rt)
{
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query), .kind = KHUB_OP_NORM,
                       .plugin_id = "acme/install-norm"};
    khub_binding *b = NULL;
    if (khub_registry_select(rt, &q, &b) != KHUB_STATUS_OK) return fail(rt, "select norm");
    printf("norm: %s\n", khub_binding_name(b));
    float x[4] = {1, 2, 3, 4}, w[4] = {1, 1, 1, 2}, y[4] = {0};
    int64_t shape_x[2] = {1, 4}, shape_w[1] = {4};
    khub_tensor tx = {x, {KHUB_DEVICE_CPU, 0}, 2, KHUB_DTYPE_F32, shape_x, NULL, 0};
    khub_tensor tw = {w, {KHUB_DEVICE_CPU, 0}, 1, KHUB_DTYPE_F32, shape_w, NULL, 0};
    khub_tensor ty = {y, {KHUB_DEVICE_CPU, 0}, 2, KHUB_DTYPE_F32, shape_x, NULL, 0};
    khub_norm_args a = {KHUB_STRUCT_INIT(khub_norm_args),
                        .norm_type = KHUB_NORM_RMS,
                        .eps = 0.0f,
                        .x = &tx,
                        .weight = &tw,
                        .y = &ty};
    if (khub_binding_call(b, &a) != KHUB_STATUS_OK) return fail(rt, "norm call");
    float rms = sqrtf((1 + 4 + 9 + 16) / 4.0f);
    for (int i = 0; i < 4; i++) {
        if (fabsf(y[i] - x[i] / rms * w[i]) > 1e-5f) {
            fprintf(stderr, "app: y[%d] = %g, want %g\n", i, y[i], x[i] / rms * w[i]);
            return 1;
        }
    }
    printf("norm: ok\n");
    return 0;
}

static int run_model(khub_runtime *rt, const char *dir)
{
    khub_model *m = NULL;
    khub_model_opts mo = {KHUB_STRUCT_INIT(khub_model_opts), .max_context = 64};
    if (khub_model_load(rt, dir, &mo, &m) != KHUB_STATUS_OK) return fail(rt, "model load");
    const char *prompts[] = {"Hello"};
    khub_generate_opts go = {KHUB_STRUCT_INIT(khub_generate_opts), .max_new_tokens = 4,
                             .ignore_eos = 1};
    khub_generate_result res = {KHUB_STRUCT_INIT(khub_generate_result)};
    khub_status st = khub_model_generate(m, prompts, 1, &go, &res);
    if (st == KHUB_STATUS_OK) printf("generated %lld tokens\n", (long long)res.n_tokens);
    int rc = st == KHUB_STATUS_OK && res.n_tokens == 4 ? 0 : fail(rt, "generate");
    khub_generate_results_free(m, &res, 1);
    khub_model_free(m);
    return rc;
}

int main(int argc, char **argv)
{
    if (khub_version_num() != KHUB_VERSION_NUM) {
        fprintf(stderr, "app: header %s, library %s\n", KHUB_VERSION_STRING, khub_version_str());
        return 1;
    }
    printf("libkhub %s\n", khub_version_str());
    khub_runtime *rt = NULL;
    if (khub_runtime_new(NULL, &rt) != KHUB_STATUS_OK) return fail(NULL, "runtime");
    int rc = khub_plugin_load_builtin(rt) == KHUB_STATUS_OK ? 0 : fail(rt, "built-in plugins");
    for (size_t i = 0; rc == 0 && i < khub_plugin_count(rt); i++) {
        const khub_plugin *p = khub_plugin_at(rt, i);
        printf("plugin %s %s %s\n", khub_plugin_id(p), khub_plugin_version(p), khub_plugin_path(p));
    }
    for (int i = 1; rc == 0 && i < argc; i++) {
        if (!strcmp(argv[i], "--plugin") && i + 2 < argc) {
            if (khub_plugin_load(rt, argv[i + 1], argv[i + 2], NULL) != KHUB_STATUS_OK)
                rc = fail(rt, "plugin load");
            else
                rc = check_norm(rt);
            i += 2;
        } else if (!strcmp(argv[i], "--model") && i + 1 < argc) {
            rc = run_model(rt, argv[++i]);
        } else {
            fprintf(stderr, "app: unknown argument %s\n", argv[i]);
            rc = 2;
        }
    }
    khub_runtime_free(rt);
    return rc;
}
