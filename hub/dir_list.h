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
#include <sys/stat.h>

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

/* Listings kept within a process. ext4 builds its hash-tree order anew for
 * every open folder it lists, so a warm locked load spent ~4 us (an open,
 * two getdents64, a close) listing the same unchanged variant folder each
 * time (docs/performance.md, "Warm load, session 16"). khub__dir_list_kept
 * answers as khub__dir_list_read, from a copy of the listing of the same
 * path made before in this process when sb (dir's stat, taken by the
 * caller BEFORE this call) still shows the same device, inode, mtime and
 * ctime: a folder's mtime and ctime move whenever a name in it is added,
 * removed or renamed, so a changed folder never reuses an old listing. A
 * listing is kept only when the folder's ctime was at least 2 s old at the
 * stat (git's racily-clean rule: a change in the same clock tick as the
 * one before could leave both times as they were), at most
 * KHUB_DIR_LIST_KEPT of them, and only listings that succeeded. The
 * checks that read the listing run on every load, on the copy; nothing
 * about a refusal is kept. sb NULL: no memo (a staging folder). */
#define KHUB_DIR_LIST_KEPT 4
KHUB_INTERNAL khub_status khub__dir_list_kept(const khub_allocator *a, const char *dir,
                                              const struct stat *sb, khub__dir_list *out);
/* Listings handed out from the memo since the process began (tests). */
KHUB_INTERNAL size_t khub__dir_list_kept_hits(void);
/* The i-th name (i < count), in the folder's order. */
static inline const char *khub__dir_list_name(const khub__dir_list *l, size_t i)
{
    return l->names + l->items[i].name;
}
/* Whether name was listed as a regular file. */
KHUB_INTERNAL bool khub__dir_list_regular(const khub__dir_list *l, const char *name);

#endif
