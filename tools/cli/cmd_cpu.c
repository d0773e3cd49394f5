/*
 * cmd_cpu.c: `khub cpu`: the CPU features khub detects and uses, and the
 * level they reach, after the KHUB_CPU_LEVEL mask (khub_check.h).
 */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "khub/khub_check.h"

static const khub_cli_cmd cpu_cmd;

static cJSON *feature_array(uint32_t bits)
{
    cJSON *a = cJSON_CreateArray();
    uint32_t bit = 0;
    const char *name;
    for (size_t i = 0; (name = khub_cpu_feature_at(i, &bit)) != NULL; i++)
        if (bits & bit) cJSON_AddItemToArray(a, cJSON_CreateString(name));
    return a;
}

static void print_json(uint32_t host, uint32_t used, const char *env)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "level", khub_cpu_level_name(used));
    cJSON_AddItemToObject(o, "features", feature_array(used));
    cJSON_AddStringToObject(o, "host_level", khub_cpu_level_name(host));
    cJSON_AddItemToObject(o, "host_features", feature_array(host));
    cJSON_AddItemToObject(o, "masked", feature_array(host & ~used));
    if (env && env[0])
        cJSON_AddStringToObject(o, "cpu_level_env", env);
    else
        cJSON_AddNullToObject(o, "cpu_level_env");
    char *s = cJSON_PrintUnformatted(o);
    if (s) printf("%s\n", s);
    cJSON_free(s);
    cJSON_Delete(o);
}

static void print_text(uint32_t host, uint32_t used, const char *env)
{
    char names[256];
    printf("level    %s", khub_cpu_level_name(used));
    if (env && env[0])
        printf(" (KHUB_CPU_LEVEL=%s; this CPU reaches %s)", env, khub_cpu_level_name(host));
    khub_cpu_feature_names(used, " ", names, sizeof names);
    printf("\nfeatures %s\n", names[0] ? names : "-");
    khub_cpu_feature_names(host & ~used, " ", names, sizeof names);
    printf("masked   %s\n", names[0] ? names : "-");
}

static int run_cpu(int argc, char **argv)
{
    if (khub_cli_wants_help(&cpu_cmd, argc, argv)) return 0;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = 1;
        else
            return khub_cli_usage(&cpu_cmd, "unknown argument '%s'", argv[i]);
    }
    const char *env = getenv("KHUB_CPU_LEVEL");
    uint32_t host = khub_cpu_features_host(), used = khub_cpu_features();
    if (json)
        print_json(host, used, env);
    else
        print_text(host, used, env);
    return 0;
}

static const khub_cli_cmd cpu_cmd = {
    "cpu", "show the CPU features khub uses and the level they reach",
    "usage: khub cpu [--json]\n\n"
    "Prints the level khub's CPU features reach (x86-64, avx2 or avx512: the\n"
    "built-in plugins and kernel builds it can choose), the features it uses\n"
    "and those KHUB_CPU_LEVEL masks.\n\n"
    "  --json   one JSON object: level, features, host_level, host_features,\n"
    "           masked, cpu_level_env\n\n"
    "Environment: KHUB_CPU_LEVEL=x86-64|generic|avx2|avx512|native caps the\n"
    "features khub uses at a level, as a CPU without the others would (it never\n"
    "adds a feature the CPU lacks).\n",
    run_cpu};
KHUB_CLI_COMMAND(cpu_cmd)
