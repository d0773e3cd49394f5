/* check_kernel.h: `khub check DIR` for a built kernel source tree. */
#ifndef KHUB_CLI_CHECK_KERNEL_H
#define KHUB_CLI_CHECK_KERNEL_H

/* Prints one line per check ("ok ..." / "FAIL ...") and a summary; returns
 * the exit status (0 when nothing was found). */
int khub_cli_check_kernel_dir(const char *dir);

#endif /* KHUB_CLI_CHECK_KERNEL_H */
