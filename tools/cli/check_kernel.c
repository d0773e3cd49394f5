/*
 * check_kernel.c: `khub check DIR`, the publish-time gate over a built
 * kernel source tree (khub_check_dir, khub_check.h, says what it checks),
 * printed one report line at a time:
 *   ---- VARIANT (backend, N files)     a variant begins
 *   ok   FILE: what passed
 *   FAIL FILE: what was found
 *   skip FILE: what did not run, and why
 *        FILE: context (metadata.json signed or unsigned)
 * and a summary; the exit status is 1 if there was any finding.
 */
#include <stdio.h>

#include "check_kernel.h"
#include "cli.h"
#include "khub/khub_check.h"

static const char *const prefix[] = {
    [KHUB_CHECK_FAIL] = "FAIL ",
    [KHUB_CHECK_PASS] = "ok   ",
    [KHUB_CHECK_SKIP] = "skip ",
    [KHUB_CHECK_INFO] = "     ",
};

void khub_cli_print_finding(const khub_check_finding *f)
{
    if (f->code == KHUB_CHECK_VARIANT) {
        printf("---- %s\n", f->message);
        return;
    }
    const char *pre = f->severity <= KHUB_CHECK_INFO ? prefix[f->severity] : "     ";
    printf("%s%s%s%s\n", pre, f->file, f->file[0] ? ": " : "", f->message);
}

int khub_cli_check_kernel_dir(const char *dir)
{
    char err[KHUB_ERROR_SIZE];
    khub_check_report *rep = NULL;
    if (khub_check_dir(dir, NULL, &rep, err, sizeof err) != KHUB_STATUS_OK) {
        printf("FAIL %s\n", err);
        return 1;
    }
    for (size_t i = 0; i < rep->n_findings; i++)
        khub_cli_print_finding(khub_check_report_finding(rep, i));
    size_t nf = rep->n_failed;
    unsigned nv = rep->n_variants;
    printf("%s %s %s: %u variant%s, %zu finding%s\n", nf ? "FAIL" : "ok  ", rep->repo, rep->version,
           nv, nv == 1 ? "" : "s", nf, nf == 1 ? "" : "s");
    khub_check_report_free(rep);
    return nf ? 1 : 0;
}
