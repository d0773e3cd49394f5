/*
 * flag_hints.c: the CLI's names for the library's options. libkhub's
 * messages name what an embedder sets (khub_kernel_opts.allow_unsigned,
 * KHUB_OPT_ALLOW_QUARANTINED); a user of the khub command knows the same
 * switch as a flag (--allow-unsigned). Every message the CLI prints from
 * the library (khub_cli_fail, the runtime's log through khub_cli_log, the
 * trust line of `khub fetch`) passes through khub_cli_flag_hints, which
 * writes the flag in place of the option's name. A library message never
 * names a CLI flag (issue 12); the table below is where the two meet.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const struct {
    const char *api;  /* as the library's message names it */
    const char *flag; /* as the CLI user types it */
} hints[] = {
    {"khub_kernel_opts.allow_unsigned", "--allow-unsigned"},
    {"khub_kernel_opts.allow_name_mismatch", "--allow-name-mismatch"},
    {"khub_lock_opts.allow_downgrade", "--allow-downgrade"},
    {"KHUB_OPT_ALLOW_QUARANTINED", "--allow-quarantined"},
    {"KHUB_OPT_VERIFY_KERNELS", "--verify-kernels"},
    {"khub_cache_quarantine_clear on", "khub cache unquarantine"},
    {"khub_hub_opts.token", "--token"},
    {"khub_server_opts.host", "--host"},
    {"khub_model_server_opts.host", "--host"},
};

const char *khub_cli_flag_hints(const char *msg, char *buf, size_t size)
{
    size_t n = 0;
    if (!size) return msg;
    for (const char *p = msg; *p && n + 1 < size;) {
        size_t k = 0;
        while (k < sizeof hints / sizeof hints[0] && strncmp(p, hints[k].api, strlen(hints[k].api)))
            k++;
        if (k == sizeof hints / sizeof hints[0]) {
            buf[n++] = *p++;
            continue;
        }
        n += (size_t)snprintf(buf + n, size - n, "%s", hints[k].flag);
        if (n >= size) n = size - 1;
        p += strlen(hints[k].api);
    }
    buf[n] = '\0';
    return buf;
}

void khub_cli_log(void *ud, khub_log_level level, const char *msg)
{
    (void)ud;
    static const char *const names[] = {"error", "warning", "info", "debug"};
    char buf[2048];
    fprintf(stderr, "khub: %s: %s\n", (unsigned)level < 4 ? names[level] : "debug",
            khub_cli_flag_hints(msg, buf, sizeof buf));
}
