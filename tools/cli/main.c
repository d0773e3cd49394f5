/* main.c: the khub command-line tool (placeholder). */
#include <stdio.h>
#include <string.h>

#include "khub/khub.h"

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--version") == 0) {
        printf("khub %s (ABI %d.%d)\n", khub_version_str(), KHUB_ABI_MAJOR, KHUB_ABI_MINOR);
        return 0;
    }
    fprintf(stderr, "usage: khub --version\n");
    return 2;
}
