/*
 * main.c: the `khub` command-line tool: command registry, dispatch, help,
 * and helpers shared by the commands. tools/ is the only code that prints to
 * stdout or calls exit.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "khub/khub_check.h"

#define MAX_COMMANDS 64

static const khub_cli_cmd *commands[MAX_COMMANDS];
static int n_commands;

void khub_cli_register(const khub_cli_cmd *cmd)
{
    if (n_commands < MAX_COMMANDS) commands[n_commands++] = cmd;
}

void khub_cli_json_str(const char *s)
{
    putchar('"');
    for (; s && *s; s++) {
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            printf("\\u%04x", (unsigned)(unsigned char)*s);
        else
            putchar(*s);
    }
    putchar('"');
}

int khub_cli_fail(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    char msg[4096], buf[4096];
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "khub %s: %s\n", cmd, khub_cli_flag_hints(msg, buf, sizeof buf));
    return 1;
}

int khub_cli_usage(const khub_cli_cmd *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "khub %s: ", cmd->name);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nRun 'khub %s --help' for usage.\n", cmd->name);
    va_end(ap);
    return 2;
}

int khub_cli_wants_help(const khub_cli_cmd *cmd, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) break;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(cmd->usage, stdout);
            return 1;
        }
    }
    return 0;
}

khub_runtime *khub_cli_runtime(const char *cmd, int n_threads)
{
    khub_runtime_opts opts = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = n_threads,
                              .log = khub_cli_log};
    khub_runtime *rt = NULL;
    if (khub_runtime_new(&opts, &rt) != KHUB_STATUS_OK) {
        khub_cli_fail(cmd, "%s", khub_last_error());
        return NULL;
    }
    khub_status st = khub_plugin_load_builtin(rt);
    if (st != KHUB_STATUS_OK) {
        khub_cli_fail(cmd, "loading the built-in plugins: %s", khub_runtime_errmsg(rt));
        khub_runtime_free(rt);
        return NULL;
    }
    return rt;
}

static void quiet_log(void *ud, khub_log_level level, const char *msg)
{
    (void)ud, (void)level, (void)msg;
}

int khub_cli_is_builtin_plugin(const char *repo)
{
    khub_runtime_opts opts = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = 1,
                              .log = quiet_log};
    khub_runtime *rt = NULL;
    int found = 0;
    if (khub_runtime_new(&opts, &rt) != KHUB_STATUS_OK) return 0;
    if (khub_plugin_load_builtin(rt) == KHUB_STATUS_OK)
        for (size_t i = 0; i < khub_plugin_count(rt) && !found; i++)
            found = !strcmp(khub_plugin_id(khub_plugin_at(rt, i)), repo);
    khub_runtime_free(rt);
    return found;
}

const char *khub_cli_role_flag(khub_kernel_role role)
{
    static const char *const flags[KHUB_KERNEL_ROLE__COUNT] = {
#define ROLE_FLAG(NAME, name, flag, field) [KHUB_KERNEL_ROLE_##NAME] = "--" #flag,
        KHUB_KERNEL_ROLES(ROLE_FLAG)
#undef ROLE_FLAG
    };
    return (unsigned)role < KHUB_KERNEL_ROLE__COUNT ? flags[role] : "";
}

static int cmp_cmd(const void *a, const void *b)
{
    return strcmp((*(const khub_cli_cmd *const *)a)->name, (*(const khub_cli_cmd *const *)b)->name);
}

static void print_help(FILE *f)
{
    fprintf(f,
            "usage: khub <command> [options]\n\n"
            "khub %s: a kernel hub loader and plugin runtime (plugin ABI %d.%d).\n\n"
            "Commands:\n",
            khub_version_str(), KHUB_ABI_MAJOR, KHUB_ABI_MINOR);
    int width = 0; /* the longest name's, so every summary starts in one column */
    for (int i = 0; i < n_commands; i++)
        if (commands[i]->summary && (int)strlen(commands[i]->name) > width)
            width = (int)strlen(commands[i]->name);
    for (int i = 0; i < n_commands; i++)
        if (commands[i]->summary) /* NULL: a hidden command (tune-rank) */
            fprintf(f, "  %-*s  %s\n", width, commands[i]->name, commands[i]->summary);
    fprintf(f, "\nOptions:\n  --version    print the version and exit\n"
               "  --help       print this help and exit\n\n"
               "Run 'khub <command> --help' for a command's options.\n");
}

int main(int argc, char **argv)
{
    qsort(commands, (size_t)n_commands, sizeof commands[0], cmp_cmd);
    if (argc < 2) {
        print_help(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
        printf("khub %s (plugin ABI %d.%d)\n", khub_version_str(), KHUB_ABI_MAJOR, KHUB_ABI_MINOR);
        return 0;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        print_help(stdout);
        return 0;
    }
    /* Every command chooses by CPU features somewhere (plugins, variants,
     * levels): a mistyped mask is refused up front, not taken as x86-64. */
    char level_err[KHUB_ERROR_SIZE];
    if (khub_cpu_level_check(level_err, sizeof level_err) != KHUB_STATUS_OK) {
        fprintf(stderr, "khub: %s\n", level_err);
        return 2;
    }
    for (int i = 0; i < n_commands; i++)
        if (strcmp(argv[1], commands[i]->name) == 0) return commands[i]->run(argc - 1, argv + 1);
    fprintf(stderr, "khub: unknown command '%s'\nRun 'khub --help' for the list.\n", argv[1]);
    return 2;
}
