/*
 * test_kernel_roles.c: the one role table (KHUB_KERNEL_ROLES, khub_kernels.h)
 * drives every place that names a kernel role. For each row: the name
 * round-trips through khub_kernel_role_name/from_name; a khub.json naming a
 * kernel under that name yields it for exactly that role
 * (khub_mapping_parse/pick); the khub_model_kernels field of the row reaches
 * the resolver of that role (khub_model_load_hub's message names it); and
 * `khub run --<flag> NAME` reaches the same role (its message names it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "khub/khub_kernels.h"
#include "khub/khub_model.h"
#include "khub/khub_project.h"
#include "runner.h"

typedef struct role_row {
    khub_kernel_role role;
    const char *name, *flag;
} role_row;

static const role_row rows[] = {
#define ROW(NAME, name, flag, field) {KHUB_KERNEL_ROLE_##NAME, #name, #flag},
    KHUB_KERNEL_ROLES(ROW)
#undef ROW
};
#define N_ROWS (sizeof rows / sizeof rows[0])

TEST_IMPL(names_round_trip)
{
    ASSERT_EQ(N_ROWS, (size_t)KHUB_KERNEL_ROLE__COUNT);
    for (size_t i = 0; i < N_ROWS; i++) {
        ASSERT_EQ((size_t)rows[i].role, i);
        ASSERT_STR_EQ(khub_kernel_role_name(rows[i].role), rows[i].name);
        ASSERT_EQ(khub_kernel_role_from_name(rows[i].name), rows[i].role);
    }
    ASSERT_EQ(khub_kernel_role_from_name("attn"), KHUB_KERNEL_ROLE__COUNT);
    ASSERT_EQ(khub_kernel_role_from_name(NULL), KHUB_KERNEL_ROLE__COUNT);
    ASSERT_STR_EQ(khub_kernel_role_name(KHUB_KERNEL_ROLE__COUNT), "unknown");
}

TEST_IMPL(every_role_parses_in_the_mapping)
{
    for (size_t i = 0; i < N_ROWS; i++) {
        char json[256], want[64], err[KHUB_ERROR_SIZE];
        snprintf(want, sizeof want, "test-org/k-%s", rows[i].name);
        snprintf(json, sizeof json, "{\"format\": 1, \"roles\": {\"%s\": \"%s\"}}", rows[i].name,
                 want);
        khub_mapping *m = NULL;
        ASSERT_OK(khub_mapping_parse(json, strlen(json), &m, err, sizeof err));
        for (size_t r = 0; r < N_ROWS; r++) {
            const char *got = khub_mapping_pick(m, rows[r].role, KHUB_DEVICE_CPU, 0);
            if (r == i)
                ASSERT_STR_EQ(got, want);
            else
                ASSERT(got == NULL);
        }
        khub_mapping_free(m);
    }
}

/* Each role's khub_model_kernels field, set from the table, reaches the
 * resolver of that role: a name that is neither a Hub ID nor a loaded
 * plugin nor a built-in fails naming the role. */
TEST_IMPL(every_field_reaches_its_role)
{
    khub_runtime *rt = NULL;
    khub_hub *hub = NULL;
    ASSERT_OK(khub_runtime_new(NULL, &rt));
    ASSERT_OK(khub_hub_new(NULL, &hub));
    for (size_t i = 0; i < N_ROWS; i++) {
        /* No mapping: none next to the (absent) model, none in the test's
         * working directory. */
        khub_model_kernels mk = {KHUB_APP_INIT(khub_model_kernels)};
        const char **field[] = {
#define FIELD(NAME, name, flag, opts_field) &mk.flag,
            KHUB_KERNEL_ROLES(FIELD)
#undef FIELD
        };
        *field[i] = "not-a-kernel";
        khub_model *m = NULL;
        char want[128];
        snprintf(want, sizeof want, "%s kernel \"not-a-kernel\": not a Hub ID", rows[i].name);
        ASSERT_STATUS(khub_model_load_hub(hub, rt, "/nonexistent/model.gguf", NULL, &mk, &m, NULL),
                      KHUB_STATUS_BAD_ID);
        ASSERT(strncmp(khub_runtime_errmsg(rt), want, strlen(want)) == 0);
    }
    khub_hub_free(hub);
    khub_runtime_free(rt);
}

/* `khub run --<flag> not-a-kernel` fails naming the row's role. */
TEST_IMPL(every_cli_flag_reaches_its_role)
{
    const char *bin = getenv("KHUB_BIN");
    if (!bin || !*bin) TEST_SKIP("KHUB_BIN not set (the CLI is not built)");
    char dir[] = "/tmp/khub-roles-XXXXXX";
    ASSERT(mkdtemp(dir) != NULL);
    for (size_t i = 0; i < N_ROWS; i++) {
        char cmd[1024], out[4096] = "", want[128];
        snprintf(cmd, sizeof cmd,
                 "cd %s && '%s' run --model %s/none.gguf --prompt x --%s not-a-kernel 2>&1", dir,
                 bin, dir, rows[i].flag);
        FILE *p = popen(cmd, "r");
        ASSERT(p != NULL);
        size_t n = fread(out, 1, sizeof out - 1, p);
        out[n] = '\0';
        int status = pclose(p);
        ASSERT(WIFEXITED(status));
        ASSERT_EQ(WEXITSTATUS(status), 1);
        snprintf(want, sizeof want, "khub run: %s kernel \"not-a-kernel\": not a Hub ID",
                 rows[i].name);
        ASSERT_CONTAINS(out, want);
    }
    rmdir(dir);
}

#define TEST_LIST(X) \
    X(names_round_trip) \
    X(every_role_parses_in_the_mapping) \
    X(every_field_reaches_its_role) \
    X(every_cli_flag_reaches_its_role)
TEST_MAIN(TEST_LIST)
