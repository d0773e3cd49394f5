/*
 * sealed_memo.c: sealed memfds of downloaded plugins kept for the next
 * load of the same file (sealed_memo.h).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sealed_memo.h"
#include "memo_flag.h"

/* Git's "racily clean" margin, as hub/variant.c's sidecar: a file whose
 * ctime is this old can only change under a newer ctime. */
#define SETTLE_NS 2000000000LL

typedef struct slot {
    char *path; /* from the C library's allocator; NULL = free */
    char sha256[65];
    char name[48];
    khub__sealed_source src;
    size_t size;
    int fd;
} slot;

static struct {
    slot s[KHUB_SEALED_MEMO_SLOTS];
    size_t next; /* the slot the next copy replaces when none is free */
} memo;
static atomic_flag busy = ATOMIC_FLAG_INIT;
static atomic_size_t n_hits;

static void drop(slot *s)
{
    if (!s->path) return;
    close(s->fd);
    free(s->path);
    memset(s, 0, sizeof *s);
}

/* In a forked child: the copies are the parent's (a check child closes
 * every inherited descriptor next, and would find their numbers reused), so
 * the child starts with none. Only close() and memset here: the child of a
 * threaded parent may call nothing else. The paths are left (a few bytes
 * per copy, once per fork). */
static void forget_in_child(void)
{
    for (size_t i = 0; i < KHUB_SEALED_MEMO_SLOTS; i++)
        if (memo.s[i].path) close(memo.s[i].fd);
    memset(&memo, 0, sizeof memo);
    atomic_flag_clear(&busy); /* another thread of the parent may have held it */
}

static void register_fork_handler(void) { pthread_atfork(NULL, NULL, forget_in_child); }

void khub__sealed_source_of(const struct stat *sb, khub__sealed_source *out)
{
    out->dev = (unsigned long long)sb->st_dev;
    out->ino = (unsigned long long)sb->st_ino;
    out->size = (unsigned long long)sb->st_size;
    out->mtime_ns = (long long)sb->st_mtim.tv_sec * 1000000000 + sb->st_mtim.tv_nsec;
    out->ctime_ns = (long long)sb->st_ctim.tv_sec * 1000000000 + sb->st_ctim.tv_nsec;
    struct timespec now;
    out->settled = clock_gettime(CLOCK_REALTIME, &now) == 0 &&
                   out->ctime_ns + SETTLE_NS <= (long long)now.tv_sec * 1000000000 + now.tv_nsec;
}

static bool same_file(const khub__sealed_source *a, const khub__sealed_source *b)
{
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime_ns == b->mtime_ns && a->ctime_ns == b->ctime_ns;
}

int khub__sealed_memo_take(const char *path, const char *sha256, size_t *size, char name[48],
                           khub__sealed_source *src)
{
    if (!khub__memo_take(&busy)) return -1;
    slot *s = NULL;
    for (size_t i = 0; i < KHUB_SEALED_MEMO_SLOTS && !s; i++)
        if (memo.s[i].path && !strcmp(memo.s[i].path, path) && !strcmp(memo.s[i].sha256, sha256))
            s = &memo.s[i];
    int fd = -1;
    struct stat sb;
    if (s) {
        khub__sealed_source now;
        bool same = stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
        if (same) khub__sealed_source_of(&sb, &now);
        if (same && same_file(&now, &s->src)) {
            fd = s->fd;
            *size = s->size;
            memcpy(name, s->name, sizeof s->name);
            *src = s->src;
            free(s->path);
            memset(s, 0, sizeof *s);
        } else {
            drop(s); /* the file changed (or is gone): this copy never serves it again */
        }
    }
    khub__memo_give_back(&busy);
    if (fd >= 0) atomic_fetch_add(&n_hits, 1);
    return fd;
}

bool khub__sealed_memo_put(const char *path, const char *sha256, const khub__sealed_source *src,
                           int fd, size_t size, const char *name)
{
    if (!src->settled || size > KHUB_SEALED_MEMO_MAX_BYTES || strlen(sha256) != 64) return false;
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_fork_handler);
    char *own = strdup(path);
    if (!own) return false;
    if (!khub__memo_take(&busy)) {
        free(own);
        return false;
    }
    slot *s = NULL;
    for (size_t i = 0; i < KHUB_SEALED_MEMO_SLOTS && !s; i++)
        if (!memo.s[i].path) s = &memo.s[i];
    if (!s) {
        s = &memo.s[memo.next];
        memo.next = (memo.next + 1) % KHUB_SEALED_MEMO_SLOTS;
        drop(s);
    }
    s->path = own;
    memcpy(s->sha256, sha256, 65);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->src = *src;
    s->size = size;
    s->fd = fd;
    khub__memo_give_back(&busy);
    return true;
}

void khub__sealed_memo_stats(khub_sealed_memo_stats *out)
{
    out->hits = atomic_load(&n_hits);
    out->entries = 0;
    khub__memo_take_waiting(&busy);
    for (size_t i = 0; i < KHUB_SEALED_MEMO_SLOTS; i++) out->entries += memo.s[i].path != NULL;
    khub__memo_give_back(&busy);
}

void khub__sealed_memo_clear(void)
{
    khub__memo_take_waiting(&busy);
    for (size_t i = 0; i < KHUB_SEALED_MEMO_SLOTS; i++) drop(&memo.s[i]);
    memo.next = 0;
    khub__memo_give_back(&busy);
    atomic_store(&n_hits, 0);
}
