/*
 * test_server_path_set.c: the set of paths that `khub serve` looks paths up
 * in (hub/server_path_set.c): adds, lookups and removals in any order agree
 * with a plain array, through growth and through removals from the middle of
 * a run of colliding slots; strings compare byte for byte (case counts).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner.h"
#include "server_impl.h"

TEST_IMPL(path_set_basics)
{
    path_set s = {0};
    ASSERT(khub__srv_path_set_get(&s, "a") == NULL);
    ASSERT(khub__srv_path_set_take(&s, "a") == NULL);
    int one = 1, two = 2;
    ASSERT_EQ(khub__srv_path_set_add(&s, "a.bin", &one), 1);
    ASSERT_EQ(khub__srv_path_set_add(&s, "A.bin", &two), 1);
    ASSERT_EQ(khub__srv_path_set_add(&s, "a.bin", &two), 0); /* there: value kept */
    ASSERT(khub__srv_path_set_get(&s, "a.bin") == &one);
    ASSERT(khub__srv_path_set_get(&s, "A.bin") == &two);
    ASSERT(khub__srv_path_set_get(&s, "a.bi") == NULL);
    ASSERT_EQ(s.n, 2);
    ASSERT(khub__srv_path_set_take(&s, "a.bin") == &one);
    ASSERT(khub__srv_path_set_take(&s, "a.bin") == NULL);
    ASSERT(khub__srv_path_set_get(&s, "A.bin") == &two);
    ASSERT_EQ(s.n, 1);
    khub__srv_path_set_free(&s);
    ASSERT(s.slot == NULL && s.cap == 0 && s.n == 0);
}

/* 200,000 random adds, takes and lookups over 5,000 names against an array
 * of what each name holds; every name is looked up after each 1,000 steps. */
TEST_IMPL(path_set_agrees_with_an_array)
{
    enum { NAMES = 5000, STEPS = 200000 };
    static char names[NAMES][24];
    static int held[NAMES]; /* 1: in the set, with value &held[i] */
    for (int i = 0; i < NAMES; i++) snprintf(names[i], sizeof names[i], "d%d/f%d.bin", i % 37, i);
    path_set s = {0};
    size_t n = 0;
    unsigned seed = 12345;
    for (int step = 0; step < STEPS; step++) {
        int i = (int)(rand_r(&seed) % NAMES), what = (int)(rand_r(&seed) % 3);
        if (what == 0) {
            ASSERT_EQ(khub__srv_path_set_add(&s, names[i], &held[i]), held[i] ? 0 : 1);
            n += !held[i];
            held[i] = 1;
        } else if (what == 1) {
            ASSERT(khub__srv_path_set_take(&s, names[i]) == (held[i] ? &held[i] : NULL));
            n -= held[i];
            held[i] = 0;
        } else {
            ASSERT(khub__srv_path_set_get(&s, names[i]) == (held[i] ? &held[i] : NULL));
        }
        ASSERT_EQ(s.n, n);
        if (step % 1000 == 999)
            for (int k = 0; k < NAMES; k++)
                ASSERT(khub__srv_path_set_get(&s, names[k]) == (held[k] ? &held[k] : NULL));
    }
    khub__srv_path_set_free(&s);
}

/* Paths a client could choose offline: 2,000 whose unkeyed FNV-1a hashes
 * share their low 12 bits, so without the key all would want one slot of a
 * 4,096-slot set. Keyed, they spread as any paths do: no slot of 4,096 is
 * wanted by more than 16 of them (the expected most is about 5). */
TEST_IMPL(path_hash_spreads_chosen_collisions)
{
    enum { WANT = 2000, SLOTS = 4096 };
    static char names[WANT][32];
    static unsigned count[SLOTS];
    int n = 0;
    for (unsigned long i = 0; n < WANT; i++) {
        char name[32];
        snprintf(name, sizeof name, "a/%lu.bin", i);
        uint64_t h = 14695981039346656037u;
        for (const unsigned char *p = (const unsigned char *)name; *p; p++)
            h = (h ^ *p) * 1099511628211u;
        if ((h & (SLOTS - 1)) == 0) memcpy(names[n++], name, sizeof name);
    }
    unsigned most = 0;
    for (int i = 0; i < WANT; i++) {
        unsigned c = ++count[khub__srv_path_hash(names[i]) & (SLOTS - 1)];
        if (c > most) most = c;
    }
    ASSERT(most <= 16);
    ASSERT_EQ(khub__srv_path_hash("a/b.bin"), khub__srv_path_hash("a/b.bin"));
}

#define TEST_LIST(X) \
    X(path_set_basics) \
    X(path_set_agrees_with_an_array) \
    X(path_hash_spreads_chosen_collisions)
TEST_MAIN(TEST_LIST)
