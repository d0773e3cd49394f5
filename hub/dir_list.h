/*
 * dir_list.h: the names in a folder, listed once. A warm locked load checks
 * a cached variant folder twice for names: the lock's check (every locked
 * file present, no other file: lock_check.c) before metadata.json is
 * parsed, and the hub's (no file the parse does not list: variant.c)
 * after. One listing, taken when the verification starts, serves both
 * (docs/performance.md, "Warm load, session 14"); each check keeps its own
 * messages. A listing only answers "this name was there, as this type": a
 * name it lacks, or one that was not a regular file, is looked up again by
 * the check that asks, as it was before. Taken once, it can miss a file
 * added after it (as the second listing could miss one added after that),
 * and the lock's check can take a locked file removed after it for present:
 * the hub's check of each listed file (an lstat of its own, then its
 * digest or fingerprint) and the loader's hash of what it reads still
 * refuse that file.
 */
#ifndef KHUB_HUB_DIR_LIST_H
#define KHUB_HUB_DIR_LIST_H

#include <stdbool.h>
#include <stddef.h>

#include "internal.h"

typedef struct khub__dir_list {
    char *names; /* NUL-terminated names, one after another */
    struct khub__dir_entry {
        size_t name;        /* offset of its name in names */
        unsigned char type; /* dirent d_type (DT_UNKNOWN when the filesystem does not tell) */
    } * items;              /* [count] */
    size_t count;
} khub__dir_list;

/* Lists dir ("." and ".." left out) into *out (from a, NULL = the C
 * library's). IO when it cannot be opened or read, NOMEM; *out is then
 * empty. Free with khub__dir_list_free. */
KHUB_INTERNAL khub_status khub__dir_list_read(const khub_allocator *a, const char *dir,
                                              khub__dir_list *out);
KHUB_INTERNAL void khub__dir_list_free(khub__dir_list *l);
/* The i-th name (i < count), in the folder's order. */
static inline const char *khub__dir_list_name(const khub__dir_list *l, size_t i)
{
    return l->names + l->items[i].name;
}
/* Whether name was listed as a regular file. */
KHUB_INTERNAL bool khub__dir_list_regular(const khub__dir_list *l, const char *name);

#endif
