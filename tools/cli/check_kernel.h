/* check_kernel.h: `khub check DIR` for a built kernel source tree. */
#ifndef KHUB_CLI_CHECK_KERNEL_H
#define KHUB_CLI_CHECK_KERNEL_H

#include "khub/khub_check.h"

/* Prints one line per check ("ok ..." / "FAIL ...") and a summary; returns
 * the exit status (0 when nothing was found). */
int khub_cli_check_kernel_dir(const char *dir);

/* Prints one report line as `khub check DIR` does ("FAIL FILE: message"). */
void khub_cli_print_finding(const khub_check_finding *f);

#endif /* KHUB_CLI_CHECK_KERNEL_H */
