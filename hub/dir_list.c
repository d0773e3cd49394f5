/*
 * dir_list.c: a folder's names, listed once (dir_list.h).
 */
#include <dirent.h>
#include <string.h>

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

khub_status khub__dir_list_read(const khub_allocator *a, const char *dir, khub__dir_list *out)
{
    memset(out, 0, sizeof *out);
    DIR *d = opendir(dir);
    if (!d) return KHUB_STATUS_IO;
    void *names = NULL, *items = NULL;
    size_t n_len = 0, n_cap = 0, i_len = 0, i_cap = 0;
    khub_status st = KHUB_STATUS_OK;
    for (struct dirent *de; st == KHUB_STATUS_OK && (de = readdir(d));) {
        const char *nm = de->d_name;
        if (!strcmp(nm, ".") || !strcmp(nm, "..")) continue;
        struct khub__dir_entry e = {n_len, de->d_type};
        if (!append(a, &names, &n_len, &n_cap, nm, strlen(nm) + 1) ||
            !append(a, &items, &i_len, &i_cap, &e, sizeof e))
            st = KHUB_STATUS_NOMEM;
        else
            out->count++;
    }
    closedir(d);
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
