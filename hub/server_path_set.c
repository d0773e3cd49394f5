/*
 * server_path_set.c: a set of path strings, each with a value of the
 * caller's, for the lookups by path that one request makes many of (the
 * paths a paths-info request names, a commit's LFS marks, a commit log's
 * LFS marks). Open addressing with linear probing, grown at half full;
 * removal shifts the run that follows back, so there are no tombstones.
 *
 * The hash is FNV-1a, not keyed: a client that chooses its paths can make
 * them collide. What it can reach is bounded by the callers' limits (10,000
 * paths per paths-info request; 100,000 operations per commit, which needs
 * the write token).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server_impl.h"

struct path_slot {
    const char *path; /* NULL: empty */
    void *value;
};

static size_t hash_of(const char *path)
{
    uint64_t h = 14695981039346656037u; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)path; *p; p++)
        h = (h ^ *p) * 1099511628211u;
    return (size_t)h;
}

/* The slot holding path, or the empty slot where it would go. */
static size_t slot_of(const path_set *s, const char *path)
{
    size_t mask = s->cap - 1, i = hash_of(path) & mask;
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
        size_t home = hash_of(s->slot[i].path) & mask;
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
