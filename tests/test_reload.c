/* test_reload.c: hot reload swaps bindings atomically, fails with nothing
 * changed, really unloads the old library, and survives concurrent calls. */
#include <pthread.h>

#include "plugins/tp_args.h"
#include "plugins/tp_util.h"
#include "runtime_impl.h"

static khub_binding *bind_stamp(khub_runtime *rt)
{
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query), .kind = KHUB_OP_NORM, .dtype_id = -1};
    khub_binding *b = NULL;
    ASSERT_OK(khub_registry_select(rt, &q, &b));
    return b;
}

static int32_t call_stamp(khub_binding *b)
{
    tp_stamp_args a = {{0}};
    ASSERT_OK(khub_binding_call(b, &a));
    for (int i = 1; i < 8; i++) ASSERT_EQ(a.out[i], a.out[0]);
    return a.out[0];
}

static khub_plugin *reload(khub_runtime *rt, khub_plugin *old, const char *name)
{
    const char *path = TP(name);
    khub_plugin *np = NULL;
    khub_status st = khub_plugin_reload(rt, old, path, TP_SHA(path), &np);
    if (st != KHUB_STATUS_OK) TEST_FAIL_("reload to %s: %s", name, khub_runtime_errmsg(rt));
    return np;
}

TEST_IMPL(reload_swaps_bindings)
{
    khub_runtime *rt = tp_runtime(1);
    khub_plugin *v1 = tp_load(rt, "good_v1");
    khub_binding *b = bind_stamp(rt);
    ASSERT_EQ(call_stamp(b), 1);
    char old_map[48];
    snprintf(old_map, sizeof old_map, "%s", v1->memfd_name);
    ASSERT(tp_mapped(old_map));
    khub_plugin *v2 = reload(rt, v1, "good_v2");
    ASSERT_EQ(call_stamp(b), 2);
    ASSERT_STR_EQ(khub_binding_name(b), "khub-test/good 2.0.0 :: stamp");
    ASSERT_EQ(khub_plugin_count(rt), 1);
    ASSERT(khub_plugin_at(rt, 0) == v2);
    ASSERT(!tp_mapped(old_map)); /* really dlclosed */
    ASSERT(tp_mapped(v2->memfd_name));
    khub_runtime_free(rt);
}

TEST_IMPL(reload_missing_op_changes_nothing)
{
    khub_runtime *rt = tp_runtime(1);
    khub_plugin *v1 = tp_load(rt, "good_v1");
    khub_binding *b = bind_stamp(rt);
    const char *path = TP("good_v3_nostamp");
    khub_plugin *np = (khub_plugin *)1;
    ASSERT_STATUS(khub_plugin_reload(rt, v1, path, TP_SHA(path), &np), KHUB_STATUS_NO_KERNEL);
    ASSERT(np == NULL);
    ASSERT_STR_EQ(khub_runtime_errmsg(rt),
                  "reload khub-test/good 1.0.0 -> khub-test/good 3.0.0: the new plugin has no "
                  "norm op \"stamp\", which a binding uses; nothing changed");
    ASSERT_EQ(call_stamp(b), 1);
    ASSERT_EQ(khub_plugin_count(rt), 1);
    ASSERT(khub_plugin_at(rt, 0) == v1);
    ASSERT(!tp_mapped("khub-plugin-2-")); /* the rejected new one is gone */
    khub_runtime_free(rt);
}

TEST_IMPL(reload_rejects_bad_file_keeps_old)
{
    khub_runtime *rt = tp_runtime(1);
    khub_plugin *v1 = tp_load(rt, "good_v1");
    khub_binding *b = bind_stamp(rt);
    const char *wrong = "1111111111111111111111111111111111111111111111111111111111111111";
    ASSERT_STATUS(khub_plugin_reload(rt, v1, TP("good_v2"), wrong, NULL),
                  KHUB_STATUS_DIGEST_MISMATCH);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "expected 1111");
    ASSERT_EQ(call_stamp(b), 1);
    khub_runtime_free(rt);
}

TEST_IMPL(reload_refuses_own_pin)
{
    /* Waiting for the old plugin to go idle while this thread pins it would
     * hang: refused with BUSY, nothing changed, and fine after release. */
    khub_runtime *rt = tp_runtime(1);
    khub_plugin *v1 = tp_load(rt, "good_v1");
    khub_binding *b = bind_stamp(rt);
    void *state = NULL;
    ASSERT(khub_binding_acquire(b, &state) != NULL);
    const char *path = TP("good_v2");
    ASSERT_STATUS(khub_plugin_reload(rt, v1, path, TP_SHA(path), NULL), KHUB_STATUS_BUSY);
    ASSERT_STR_EQ(khub_runtime_errmsg(rt),
                  "reload khub-test/good 1.0.0: this thread holds a khub_binding_acquire pin on "
                  "it, so it could never go idle; release the pin first; nothing changed");
    ASSERT_STATUS(khub_plugin_unload(rt, v1), KHUB_STATUS_BUSY);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "unload khub-test/good 1.0.0: this thread holds");
    ASSERT_EQ(khub_plugin_count(rt), 1);
    ASSERT_EQ(call_stamp(b), 1);
    khub_binding_release(b);
    ASSERT(reload(rt, v1, "good_v2") != NULL);
    ASSERT_EQ(call_stamp(b), 2);
    khub_runtime_free(rt);
}

/* ------------------------------------------------------------------------ */
/* Stress: 4 callers against 50 reloads                                     */
/* ------------------------------------------------------------------------ */

typedef struct caller {
    khub_binding *b;
    atomic_int *stop;
    int32_t other; /* the stamp of the version alternating with v1 */
    long calls, failures, torn, v1, v2;
} caller;

static void *caller_main(void *arg)
{
    caller *c = arg;
    while (!atomic_load(c->stop)) {
        tp_stamp_args a = {{0}};
        if (khub_binding_call(c->b, &a) != KHUB_STATUS_OK) {
            c->failures++;
            continue;
        }
        c->calls++;
        for (int i = 1; i < 8; i++) c->torn += a.out[i] != a.out[0];
        if (a.out[0] == 1)
            c->v1++;
        else if (a.out[0] == c->other)
            c->v2++;
        else
            c->torn++;
    }
    return NULL;
}

/* 4 threads call the stamp op while v1 and `other` (stamp value
 * other_stamp) are swapped in 50 times: no call fails, none sees a torn
 * result, and each old library is gone after its reload. */
static void reload_stress(const char *other, int32_t other_stamp)
{
    enum { THREADS = 4, RELOADS = 50 };
    khub_runtime *rt = tp_runtime(1);
    khub_plugin *p = tp_load(rt, "good_v1");
    khub_binding *b = bind_stamp(rt);
    atomic_int stop;
    atomic_init(&stop, 0);
    caller c[THREADS];
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) {
        c[i] = (caller){.b = b, .stop = &stop, .other = other_stamp};
        ASSERT_EQ(pthread_create(&th[i], NULL, caller_main, &c[i]), 0);
    }
    for (int r = 0; r < RELOADS; r++) {
        char old_map[48];
        snprintf(old_map, sizeof old_map, "%s", p->memfd_name);
        p = reload(rt, p, r % 2 == 0 ? other : "good_v1");
        if (tp_mapped(old_map)) TEST_FAIL_("reload %d: %s still mapped", r, old_map);
    }
    atomic_store(&stop, 1);
    long calls = 0, v1 = 0, v2 = 0;
    for (int i = 0; i < THREADS; i++) {
        ASSERT_EQ(pthread_join(th[i], NULL), 0);
        ASSERT_EQ(c[i].failures, 0);
        ASSERT_EQ(c[i].torn, 0);
        calls += c[i].calls, v1 += c[i].v1, v2 += c[i].v2;
    }
    fprintf(stderr, "  %d reloads v1 <-> %s, %ld calls (%ld saw v1, %ld saw the other)\n", RELOADS,
            other, calls, v1, v2);
    ASSERT(v1 > 0 && v2 > 0);
    ASSERT_EQ(calls, v1 + v2);
    ASSERT_EQ(khub_plugin_count(rt), 1);
    ASSERT_STR_EQ(khub_plugin_version(p), "1.0.0"); /* 50 reloads end on v1 */
    ASSERT_EQ(call_stamp(b), 1);
    ASSERT_STR_EQ(khub_binding_name(b), "khub-test/good 1.0.0 :: stamp");
    khub_runtime_free(rt);
}

TEST_IMPL(reload_stress_concurrent_calls) { reload_stress("good_v2", 2); }

/* v4 lists stamp last (index 2, where v1 has "host"): every call must reach
 * the op by the index that belongs to the plugin it pinned. */
TEST_IMPL(reload_stress_reordered_ops)
{
    khub_runtime *rt = tp_runtime(1);
    khub_plugin *v1 = tp_load(rt, "good_v1");
    khub_binding *b = bind_stamp(rt);
    khub_plugin *v4 = reload(rt, v1, "good_v4_reordered");
    ASSERT_STR_EQ(khub_plugin_op(v4, 2)->name, "stamp");
    ASSERT_EQ(call_stamp(b), 4);
    ASSERT_STR_EQ(khub_binding_name(b), "khub-test/good 4.0.0 :: stamp");
    khub_runtime_free(rt);
    reload_stress("good_v4_reordered", 4);
}

#define TEST_LIST(X) \
    X(reload_swaps_bindings) \
    X(reload_missing_op_changes_nothing) \
    X(reload_rejects_bad_file_keeps_old) \
    X(reload_refuses_own_pin) \
    X(reload_stress_concurrent_calls) \
    X(reload_stress_reordered_ops)
TEST_MAIN(TEST_LIST)
