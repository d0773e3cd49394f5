/*
 * server_path_set.c: a set of path strings, each with a value of the
 * caller's, for the lookups by path that one request makes many of (the
 * paths a paths-info request names, a commit's LFS marks, a commit log's
 * LFS marks). Open addressing with linear probing, grown at half full;
 * removal shifts the run that follows back, so there are no tombstones.
 *
 * The hash is keyed: FNV-1a started from a random key of this process and
 * finished with a 64-bit mix, so the slot a path lands in depends on every
 * bit of the key. Unkeyed, a slot is the hash's low bits, and FNV-1a's low
 * bits depend only on the low bits of its input and state: anyone could pick
 * 10,000 paths with one slot offline and send them in one paths-info
 * request, which needs no token, making each lookup walk all of them.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "server_impl.h"

struct path_slot {
    const char *path; /* NULL: empty */
    void *value;
};

/* This process's key, made on first use (never 0 once made). */
static uint64_t key(void)
{
    static _Atomic uint64_t made;
    uint64_t k = atomic_load_explicit(&made, memory_order_relaxed);
    if (k) return k;
    if (getrandom(&k, sizeof k, GRND_NONBLOCK) != (ssize_t)sizeof k) {
        struct timespec t; /* no entropy yet: still unknown to a client in advance */
        clock_gettime(CLOCK_MONOTONIC, &t);
        k = ((uint64_t)t.tv_nsec << 32) ^ (uint64_t)t.tv_sec ^ (uint64_t)(uintptr_t)&t;
    }
    k |= 1;
    uint64_t none = 0;
    return atomic_compare_exchange_strong(&made, &none, k) ? k : none;
}

size_t khub__srv_path_hash(const char *path)
{
    uint64_t h = 14695981039346656037u ^ key(); /* FNV-1a from the key */
    for (const unsigned char *p = (const unsigned char *)path; *p; p++)
        h = (h ^ *p) * 1099511628211u;
    h ^= h >> 30; /* the finalizer of splitmix64: every bit reaches the low ones */
    h *= 0xbf58476d1ce4e5b9u;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebu;
    h ^= h >> 31;
    return (size_t)h;
}

/* The slot holding path, or the empty slot where it would go. */
static size_t slot_of(const path_set *s, const char *path)
{
    size_t mask = s->cap - 1, i = khub__srv_path_hash(path) & mask;
    while (s->slot[i].path && strcmp(s->slot[i].path, path) != 0) i = (i + 1) & mask;
    return i;
}

static int grow(path_set *s)
{
    size_t cap = s->cap ? s->cap * 2 : 64;
    path_set bigger = {calloc(cap, sizeof *bigger.slot), cap, s->n};
    if (!bigger.slot) return 0;
    for (size_t i = 0; i < s->cap; i++)
        if (s->slot[i].path) bigger.slot[slot_of(&bigger, s->slot[i].path)] = s->slot[i];
    free(s->slot);
    *s = bigger;
    return 1;
}

int khub__srv_path_set_add(path_set *s, const char *path, void *value)
{
    if ((s->n + 1) * 2 > s->cap && !grow(s)) return -1;
    size_t i = slot_of(s, path);
    if (s->slot[i].path) return 0;
    s->slot[i] = (struct path_slot){path, value};
    s->n++;
    return 1;
}

void *khub__srv_path_set_get(const path_set *s, const char *path)
{
    return s->cap ? s->slot[slot_of(s, path)].value : NULL; /* an empty slot's is NULL */
}

void *khub__srv_path_set_take(path_set *s, const char *path)
{
    if (!s->cap) return NULL;
    size_t mask = s->cap - 1, hole = slot_of(s, path);
    void *value = s->slot[hole].value;
    if (!s->slot[hole].path) return NULL;
    s->slot[hole] = (struct path_slot){0};
    s->n--;
    /* Move back each later entry of the run that the hole now cuts off
     * from its home slot (Knuth's algorithm R). */
    for (size_t i = (hole + 1) & mask; s->slot[i].path; i = (i + 1) & mask) {
        size_t home = khub__srv_path_hash(s->slot[i].path) & mask;
        if (((i - home) & mask) >= ((i - hole) & mask)) {
            s->slot[hole] = s->slot[i];
            s->slot[i] = (struct path_slot){0};
            hole = i;
        }
    }
    return value;
}

void khub__srv_path_set_free(path_set *s)
{
    free(s->slot);
    *s = (path_set){0};
}
