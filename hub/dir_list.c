/*
 * dir_list.c: a folder's names, listed once (dir_list.h), and the
 * listings kept within a process for unchanged folders.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "dir_list.h"
#include "memo_flag.h"

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

/* ======================================================================== */
/* Listings kept for unchanged folders                                      */
/* ======================================================================== */

/* As hub/verified_files.c and runtime/loader/sealed_memo.c: a folder whose
 * ctime is this old can only change under a newer ctime. */
#define SETTLE_NS 2000000000LL

typedef struct kept {
    char *path; /* the C library's memory (khub__mem_*, NULL allocator), as names and
                   items; NULL = a free slot */
    unsigned long long dev, ino;
    long long mtime_ns, ctime_ns;
    char *names;
    struct khub__dir_entry *items;
    size_t names_len, count;
} kept;

static struct {
    kept k[KHUB_DIR_LIST_KEPT];
    size_t next; /* the slot the next listing replaces when none is free */
} memo;
static atomic_flag busy = ATOMIC_FLAG_INIT;
static atomic_size_t n_hits;

static long long ns_of(struct timespec t) { return (long long)t.tv_sec * 1000000000 + t.tv_nsec; }

static bool same_folder(const kept *k, const char *dir, const struct stat *sb)
{
    return k->path && k->dev == (unsigned long long)sb->st_dev &&
           k->ino == (unsigned long long)sb->st_ino && k->mtime_ns == ns_of(sb->st_mtim) &&
           k->ctime_ns == ns_of(sb->st_ctim) && !strcmp(k->path, dir);
}

static void drop(kept *k)
{
    khub__mem_free(k->path);
    khub__mem_free(k->names);
    khub__mem_free(k->items);
    memset(k, 0, sizeof *k);
}

/* The listing of slot k copied into *out, in a's memory. */
static khub_status give(const khub_allocator *a, const kept *k, khub__dir_list *out)
{
    out->names = khub__mem_alloc(a, k->names_len ? k->names_len : 1);
    out->items = khub__mem_alloc(a, k->count ? k->count * sizeof *k->items : 1);
    if (!out->names || !out->items) {
        khub__dir_list_free(out);
        return KHUB_STATUS_NOMEM;
    }
    memcpy(out->names, k->names, k->names_len);
    memcpy(out->items, k->items, k->count * sizeof *k->items);
    out->count = k->count;
    return KHUB_STATUS_OK;
}

/* Keeps a copy of l, listed from dir whose stat before the listing was sb
 * (settled: see dir_list.h). Out of memory: nothing kept. */
static void keep(const char *dir, const struct stat *sb, const khub__dir_list *l)
{
    size_t names_len = 0;
    for (size_t i = 0; i < l->count; i++)
        names_len = l->items[i].name + strlen(khub__dir_list_name(l, i)) + 1;
    kept k = {.path = khub__mem_strdup(NULL, dir),
              .dev = (unsigned long long)sb->st_dev,
              .ino = (unsigned long long)sb->st_ino,
              .mtime_ns = ns_of(sb->st_mtim),
              .ctime_ns = ns_of(sb->st_ctim),
              .names = khub__mem_alloc(NULL, names_len ? names_len : 1),
              .items = khub__mem_alloc(NULL, l->count ? l->count * sizeof *l->items : 1),
              .names_len = names_len,
              .count = l->count};
    if (!k.path || !k.names || !k.items) {
        drop(&k);
        return;
    }
    memcpy(k.names, l->names, names_len);
    memcpy(k.items, l->items, l->count * sizeof *l->items);
    size_t slot = KHUB_DIR_LIST_KEPT;
    for (size_t i = 0; i < KHUB_DIR_LIST_KEPT && slot == KHUB_DIR_LIST_KEPT; i++)
        if (!memo.k[i].path || !strcmp(memo.k[i].path, dir)) slot = i;
    if (slot == KHUB_DIR_LIST_KEPT) slot = memo.next++ % KHUB_DIR_LIST_KEPT;
    drop(&memo.k[slot]);
    memo.k[slot] = k;
}

khub_status khub__dir_list_kept(const khub_allocator *a, const char *dir, const struct stat *sb,
                                khub__dir_list *out)
{
    memset(out, 0, sizeof *out);
    if (!sb || !khub__memo_take(&busy)) return khub__dir_list_read(a, dir, out);
    for (size_t i = 0; i < KHUB_DIR_LIST_KEPT; i++) {
        if (!same_folder(&memo.k[i], dir, sb)) continue;
        khub_status st = give(a, &memo.k[i], out);
        khub__memo_give_back(&busy);
        if (st == KHUB_STATUS_OK) atomic_fetch_add(&n_hits, 1);
        return st;
    }
    khub__memo_give_back(&busy);
    khub_status st = khub__dir_list_read(a, dir, out);
    struct timespec now;
    bool settled =
        clock_gettime(CLOCK_REALTIME, &now) == 0 && ns_of(sb->st_ctim) + SETTLE_NS <= ns_of(now);
    if (st == KHUB_STATUS_OK && settled && khub__memo_take(&busy)) {
        keep(dir, sb, out);
        khub__memo_give_back(&busy);
    }
    return st;
}

size_t khub__dir_list_kept_hits(void) { return atomic_load(&n_hits); }
