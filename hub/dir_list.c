/*
 * dir_list.c: a folder's names, listed once (dir_list.h).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "dir_list.h"

/* Appends n bytes to *buf (length *len, capacity *cap); false on OOM. */
static bool append(const khub_allocator *a, void **buf, size_t *len, size_t *cap, const void *p,
                   size_t n)
{
    if (*len + n > *cap) {
        size_t grow = *cap ? *cap * 2 : 256;
        while (grow < *len + n) grow *= 2;
        void *bigger = khub__mem_realloc(a, *buf, grow);
        if (!bigger) return false;
        *buf = bigger;
        *cap = grow;
    }
    memcpy((char *)*buf + *len, p, n);
    *len += n;
    return true;
}

/* getdents64's record (linux_dirent64, getdents(2)); glibc declares no
 * type for it. */
struct dirent64_rec {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

/* Lists with getdents64 into a buffer on the stack: opendir() would add an
 * fstat and a 32 KB allocation to each listing, and a warm locked load
 * lists the variant folder on every call (docs/performance.md, "Warm load,
 * session 15"). */
khub_status khub__dir_list_read(const khub_allocator *a, const char *dir, khub__dir_list *out)
{
    memset(out, 0, sizeof *out);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return KHUB_STATUS_IO;
    void *names = NULL, *items = NULL;
    size_t n_len = 0, n_cap = 0, i_len = 0, i_cap = 0;
    khub_status st = KHUB_STATUS_OK;
    _Alignas(8) char buf[4096];
    for (;;) {
        long got = syscall(SYS_getdents64, fd, buf, sizeof buf);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) st = KHUB_STATUS_IO;
        if (got <= 0) break;
        for (long at = 0; st == KHUB_STATUS_OK && at < got;) {
            const struct dirent64_rec *de = (const void *)(buf + at);
            at += de->d_reclen;
            const char *nm = de->d_name;
            if (!strcmp(nm, ".") || !strcmp(nm, "..")) continue;
            struct khub__dir_entry e = {n_len, de->d_type};
            if (!append(a, &names, &n_len, &n_cap, nm, strlen(nm) + 1) ||
                !append(a, &items, &i_len, &i_cap, &e, sizeof e))
                st = KHUB_STATUS_NOMEM;
            else
                out->count++;
        }
        if (st != KHUB_STATUS_OK) break;
    }
    close(fd);
    out->names = names;
    out->items = items;
    if (st != KHUB_STATUS_OK) khub__dir_list_free(out);
    return st;
}

void khub__dir_list_free(khub__dir_list *l)
{
    if (!l) return;
    khub__mem_free(l->names);
    khub__mem_free(l->items);
    memset(l, 0, sizeof *l);
}

bool khub__dir_list_regular(const khub__dir_list *l, const char *name)
{
    for (size_t i = 0; l && i < l->count; i++)
        if (l->items[i].type == DT_REG && !strcmp(khub__dir_list_name(l, i), name)) return true;
    return false;
}
