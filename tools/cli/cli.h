/*
 * cli.h: how a `khub` subcommand plugs into the command-line tool.
 *
 * Each tools/cli/cmd_*.c defines one or more commands and registers them
 * with KHUB_CLI_COMMAND; main.c dispatches on argv[1]. A command gets argv
 * starting at its own name (argv[0] = "resolve"), prints results to stdout
 * and diagnostics to stderr, and returns the process exit code:
 * 0 success, 1 failure, 2 usage error. Every command handles --help.
 */
#ifndef KHUB_CLI_H
#define KHUB_CLI_H

#include <stdio.h>

#include "khub/khub.h"
#include "khub/khub_kernels.h"

typedef struct khub_cli_cmd {
    const char *name;    /* "resolve" */
    const char *summary; /* one line for `khub --help` */
    const char *usage;   /* full --help text, starting with "usage: khub <name> ..." */
    int (*run)(int argc, char **argv);
} khub_cli_cmd;

void khub_cli_register(const khub_cli_cmd *cmd);

/* Registers a command at program start (the CLI is linked from objects, so
 * every constructor runs). */
#define KHUB_CLI_COMMAND(var) \
    __attribute__((constructor)) static void khub_cli_register_##var(void) \
    { \
        khub_cli_register(&var); \
    }

/* msg with the library's option names (khub_kernel_opts.allow_unsigned)
 * written as the CLI's flags (--allow-unsigned), into buf; returns buf
 * (flag_hints.c). */
const char *khub_cli_flag_hints(const char *msg, char *buf, size_t size);
/* The runtime's log callback in the CLI: "khub: <level>: <msg>" to stderr,
 * as libkhub's default, with khub_cli_flag_hints applied. */
void khub_cli_log(void *ud, khub_log_level level, const char *msg);

/* Prints "khub <cmd>: <msg>" to stderr, the library's option names in msg
 * written as flags (khub_cli_flag_hints); returns 1. */
int khub_cli_fail(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints the usage error and a hint to run --help; returns 2. */
int khub_cli_usage(const khub_cli_cmd *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* True when argv contains --help or -h (then prints cmd->usage to stdout). */
int khub_cli_wants_help(const khub_cli_cmd *cmd, int argc, char **argv);

/* Prints s to stdout as a JSON string: quoted, with '"', '\\' and control
 * characters escaped (names and reasons can come from a hostile hub). */
void khub_cli_json_str(const char *s);
/* A runtime with the built-in plugins loaded, or NULL after printing why.
 * n_threads 0 = all cores. */
khub_runtime *khub_cli_runtime(const char *cmd, int n_threads);
/* Whether repo ("org/name") is one of the plugins khub_plugin_load_builtin
 * loads: a khub.json may name one (khub run takes it as the loaded plugin,
 * never fetched), and a lock has nothing to pin for it. */
int khub_cli_is_builtin_plugin(const char *repo);

/* The flag that names a role's kernel ("--attn" for KHUB_KERNEL_ROLE_ATTENTION),
 * from the role table; "" outside it. */
const char *khub_cli_role_flag(khub_kernel_role role);

#endif /* KHUB_CLI_H */
