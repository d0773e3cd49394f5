/* fuzz_prompts.c: libFuzzer target for `khub run --prompts-file FILE`
 * (tools/cli/prompts_file.c, compiled in): plain lines and JSON lines with
 * per-request settings, from a file anyone may hand the CLI.
 *
 * The input is written to a file under a per-process folder and read with
 * cli_prompts_read; a file it accepts must give every prompt a text, its
 * stop strings non-empty and as many as it counts. Any input may be refused;
 * none may crash, leak or read out of bounds. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "prompts_file.h"

/* The CLI's failure printer (tools/cli/main.c) prints and returns 1; here
 * it formats (so the arguments are read) and stays quiet. */
int khub_cli_fail(const char *cmd, const char *fmt, ...)
{
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    (void)cmd;
    return 1;
}

static char path[96];

static void setup(void)
{
    if (path[0]) return;
    struct stat sb;
    char dir[64];
    snprintf(dir, sizeof dir, "%s/khub-fuzz-prompts-XXXXXX",
             stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) ? "/dev/shm" : "/tmp");
    if (!mkdtemp(dir)) abort();
    snprintf(path, sizeof path, "%s/prompts.jsonl", dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
    khub_generate_opts defaults = {KHUB_STRUCT_INIT(khub_generate_opts)};
    cli_prompts ps;
    if (cli_prompts_read(path, &defaults, &ps) != 0) return 0;
    for (size_t i = 0; i < ps.n; i++) {
        const cli_prompt *p = &ps.p[i];
        if (!p->prompt || p->line < 1) abort();
        if (p->gen.n_stop != (uint32_t)p->n_stops) abort();
        for (int k = 0; k < p->n_stops; k++)
            if (!p->stops[k] || !p->stops[k][0]) abort();
    }
    cli_prompts_free(&ps);
    return 0;
}
