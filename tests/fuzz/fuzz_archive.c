/* fuzz_archive.c: libFuzzer target for the per-variant archive unpacker
 * (hub/archive.c), the one hub parser that writes to disk.
 *
 * The input is written to a file and unpacked into a fresh folder under a
 * private root (on /dev/shm when it exists, for speed), with small limits.
 * Any archive may be refused; on success nothing may have escaped: the
 * root holds the destination and nothing else, and the destination holds
 * only regular files and directories. On failure the destination must be
 * gone. Anything else aborts (a bug, found). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hub_impl.h"

static char root[64], input[96], dest[96];
static khub_hub *hub;

static void setup(void)
{
    if (hub) return;
    struct stat sb;
    snprintf(root, sizeof root, "%s/khub-fuzz-archive-XXXXXX",
             stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) ? "/dev/shm" : "/tmp");
    if (!mkdtemp(root)) abort();
    snprintf(input, sizeof input, "%s.in", root);
    snprintf(dest, sizeof dest, "%s/dest", root);
    khub_hub_opts o = {KHUB_STRUCT_INIT(khub_hub_opts), .cache_dir = root, .offline = 1};
    if (khub_hub_new(&o, &hub) != KHUB_STATUS_OK) abort();
}

/* Only regular files and directories below dir (no links, no devices). */
static void check_tree(const char *dir, int depth)
{
    if (depth > 64) abort();
    DIR *d = opendir(dir);
    if (!d) abort();
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char path[4096];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (lstat(path, &sb) != 0) abort();
        if (S_ISDIR(sb.st_mode))
            check_tree(path, depth + 1);
        else if (!S_ISREG(sb.st_mode))
            abort();
    }
    closedir(d);
}

/* The root holds nothing but (on success) the destination. */
static void check_root(int want_dest)
{
    DIR *d = opendir(root);
    if (!d) abort();
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        if (strcmp(de->d_name, "dest") != 0) abort(); /* something escaped */
        n++;
    }
    closedir(d);
    if (n != want_dest) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    FILE *f = fopen(input, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
    khub__unpack_limits lim = {.max_entry_bytes = 1u << 20,
                               .max_total_bytes = 4u << 20,
                               .max_entries = 256,
                               .max_ratio = 200};
    khub__hub_clear(hub);
    khub_status st = khub__archive_unpack(hub, input, dest, &lim);
    check_root(st == KHUB_STATUS_OK);
    if (st == KHUB_STATUS_OK) check_tree(dest, 0);
    khub__rmtree(dest);
    return 0;
}
