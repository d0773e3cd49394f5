/*
 * test_kernel_swap.c: a live kernel swap through the public API
 * (khub_kernel_swap_prepare, khub_model_kernel_swap in khub_kernels.h) and
 * the call counts of khub_model_binding_get / khub_binding_calls, on the
 * tiny Gemma 3 fixture (tests/fixtures/gemma3_tiny, no download): the
 * attention role moves to khub/ref-cpu by its loaded id (and by
 * "id:op") and back, the
 * greedy tokens stay those of before, the replaced binding is listed as
 * retired with its count frozen while the new one counts; every refusal
 * comes with its status and message and changes nothing (cache, linear and
 * quantization roles, a plugin without the role's op, a role outside the
 * list, an empty name, a name that is no Hub ID, an old struct_size); with
 * a paged KV cache the swap moves the paged_attention binding; a prepared
 * plugin unloaded before the switch is refused, never used (run it under
 * ASan: without the check the switch reads the freed plugin); while a swap
 * holds its plugin, unload and reload answer BUSY, and an unload on another
 * thread during the switch never frees the plugin the switch reads; a 0.1
 * struct, which holds nothing, refuses a plugin loaded later at the
 * address of the one it prepared.
 */
#include <pthread.h>
#include <stddef.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "khub/khub_kernels.h"
#include "khub/khub_model.h"
#include "plugins/tp_util.h"
#include "runner.h"

typedef struct fixture {
    khub_runtime *rt;
    khub_hub *hub;
    khub_model *m;
} fixture;

static void open_fixture_cache(fixture *f, const char *cache)
{
    khub_runtime_opts ro = {KHUB_APP_INIT(khub_runtime_opts), .n_threads = 1};
    ASSERT_OK(khub_runtime_new(&ro, &f->rt));
    ASSERT_OK(khub_plugin_load_builtin(f->rt));
    khub_hub_opts ho = {KHUB_APP_INIT(khub_hub_opts), .offline = 1};
    ASSERT_OK(khub_hub_new(&ho, &f->hub));
    khub_model_opts mo = {KHUB_APP_INIT(khub_model_opts), .max_context = 64, .max_seqs = 2,
                          .cache_impl = cache};
    ASSERT_OK(khub_model_load(f->rt, KHUB_SOURCE_DIR "/tests/fixtures/gemma3_tiny", &mo, &f->m));
}

/* The dense cache, named: a model of 2 sequences would get the paged pool. */
static void open_fixture(fixture *f) { open_fixture_cache(f, "khub/ref-cpu:kv_cache"); }

static void close_fixture(fixture *f)
{
    khub_model_free(f->m);
    khub_hub_free(f->hub);
    khub_runtime_free(f->rt);
}

/* 10 greedy tokens of a fixed prompt into ids. */
static void greedy(khub_model *m, int32_t ids[10])
{
    const char *prompt[] = {"Sliding window attention looks at the last few tokens"};
    khub_generate_opts go = {KHUB_APP_INIT(khub_generate_opts), .max_new_tokens = 10,
                             .ignore_eos = 1};
    khub_generate_result res = {KHUB_APP_INIT(khub_generate_result)};
    ASSERT_OK(khub_model_generate(m, prompt, 1, &go, &res));
    ASSERT_EQ(res.n_tokens, 10);
    memcpy(ids, res.tokens, 10 * sizeof *ids);
    khub_generate_results_free(m, &res, 1);
}

/* The binding of role (retired or not) as khub_model_binding_get lists it;
 * its index, or -1. */
static int find(khub_model *m, const char *role, uint32_t retired, khub_model_binding *out)
{
    for (size_t i = 0;; i++) {
        khub_model_binding b = {KHUB_APP_INIT(khub_model_binding)};
        khub_status st = khub_model_binding_get(m, i, &b);
        if (st == KHUB_STATUS_NOT_FOUND) return -1;
        ASSERT_OK(st);
        if (!strcmp(b.role, role) && b.retired == retired) {
            *out = b;
            return (int)i;
        }
    }
}

TEST_IMPL(kernel_swap_attention_and_back)
{
    fixture f = {0};
    open_fixture(&f);
    int32_t before[10], after[10], back[10];
    greedy(f.m, before);
    khub_model_binding att = {0}, old = {0};
    ASSERT(find(f.m, "attention", 0, &att) >= 0);
    ASSERT_STR_EQ(att.dtype, "f32");
    /* 11 positions (prompt) + 9 decode steps, one call per layer each */
    ASSERT(att.calls > 0);
    ASSERT(find(f.m, "attention", 1, &old) < 0);
    char first[192];
    snprintf(first, sizeof first, "%s", att.kernel);

    khub_kernel_swap sw = {KHUB_APP_INIT(khub_kernel_swap)};
    ASSERT_OK(khub_kernel_swap_prepare(f.hub, f.rt, KHUB_KERNEL_ROLE_ATTENTION, "khub/ref-cpu",
                                       NULL, &sw));
    ASSERT_STR_EQ(khub_plugin_id(sw.plugin), "khub/ref-cpu");
    ASSERT_STR_EQ(sw.resolved, "attention: khub/ref-cpu (loaded plugin)");
    ASSERT(!strcmp(sw.selftest, "passed") || !strcmp(sw.selftest, "none"));
    ASSERT_OK(khub_model_kernel_swap(f.m, &sw));
    ASSERT_STR_EQ(sw.previous, first);
    ASSERT_STR_EQ(sw.now_serving, "khub/ref-cpu 0.1.0 :: attention");
    ASSERT_CONTAINS(khub_model_explain(f.m), "attention[f32]: khub/ref-cpu 0.1.0 :: attention");

    khub_model_binding now = {0};
    ASSERT(find(f.m, "attention", 1, &old) >= 0);
    ASSERT_STR_EQ(old.kernel, first);
    ASSERT_EQ(old.calls, att.calls);
    ASSERT(find(f.m, "attention", 0, &now) >= 0);
    ASSERT_EQ(now.calls, 0);
    greedy(f.m, after);
    for (int i = 0; i < 10; i++) ASSERT_EQ(after[i], before[i]);
    ASSERT(find(f.m, "attention", 0, &now) >= 0);
    ASSERT_EQ(now.calls, att.calls); /* the same work, now all on the new kernel */
    khub_model_binding frozen = {0};
    find(f.m, "attention", 1, &frozen);
    ASSERT_EQ(frozen.calls, old.calls);

    /* and back by the built-in alias */
    khub_kernel_swap sw2 = {KHUB_APP_INIT(khub_kernel_swap)};
    ASSERT_OK(
        khub_kernel_swap_prepare(f.hub, f.rt, KHUB_KERNEL_ROLE_ATTENTION, "sdpa", NULL, &sw2));
    ASSERT_STR_EQ(sw2.resolved, "attention: sdpa = khub/ref-cpu (built-in)");
    ASSERT_OK(khub_model_kernel_swap(f.m, &sw2));
    greedy(f.m, back);
    for (int i = 0; i < 10; i++) ASSERT_EQ(back[i], before[i]);

    /* "id:op" of a loaded plugin is that op, never a Hub fetch (the hub is
     * offline here: a fetch would fail) */
    khub_kernel_swap sw3 = {KHUB_APP_INIT(khub_kernel_swap)};
    ASSERT_OK(khub_kernel_swap_prepare(f.hub, f.rt, KHUB_KERNEL_ROLE_ATTENTION,
                                       "khub/ref-cpu:attention", NULL, &sw3));
    ASSERT_STR_EQ(sw3.resolved,
                  "attention: khub/ref-cpu:attention (op attention of the loaded plugin)");
    ASSERT_STR_EQ(khub_plugin_id(sw3.plugin), "khub/ref-cpu");
    ASSERT_OK(khub_model_kernel_swap(f.m, &sw3));
    ASSERT_STR_EQ(sw3.now_serving, "khub/ref-cpu 0.1.0 :: attention");
    /* with a revision it is a Hub ID: offline, not cached, refused */
    ASSERT(khub_kernel_swap_prepare(f.hub, f.rt, KHUB_KERNEL_ROLE_ATTENTION,
                                    "khub/ref-cpu@v1:attention", NULL, &sw3) != KHUB_STATUS_OK);
    ASSERT_CONTAINS(khub_last_error(), "attention kernel khub/ref-cpu@v1:attention: ");
    close_fixture(&f);
}

TEST_IMPL(kernel_swap_refusals_change_nothing)
{
    fixture f = {0};
    open_fixture(&f);
    khub_kernel_swap sw = {KHUB_APP_INIT(khub_kernel_swap)};
    ASSERT_STATUS(
        khub_kernel_swap_prepare(f.hub, f.rt, KHUB_KERNEL_ROLE_CACHE, "static", NULL, &sw),
        KHUB_STATUS_UNSUPPORTED);
    ASSERT_STR_EQ(khub_last_error(),
                  "kernel swap: the cache kernel cannot be swapped in a running model (the KV "
                  "cache holds the running sequences in its plugin's own format); load the "
                  "model again with it");
    ASSERT_STATUS(
        khub_kernel_swap_prepare(f.hub, f.rt, KHUB_KERNEL_ROLE_LINEAR, "khub/ref-cpu", NULL, &sw),
        KHUB_STATUS_UNSUPPORTED);
    ASSERT_CONTAINS(khub_last_error(), "the linear kernel cannot be swapped in a running model "
                                       "(the weights were laid out for their op at load)");
    ASSERT_STATUS(khub_kernel_swap_prepare(f.hub, f.rt, KHUB_KERNEL_ROLE_QUANT, "nf4", NULL, &sw),
                  KHUB_STATUS_UNSUPPORTED);
    ASSERT_STATUS(khub_kernel_swap_prepare(f.hub, f.rt, (khub_kernel_role)99, "x/y", NULL, &sw),
                  KHUB_STATUS_INVALID_ARG);
    ASSERT_STR_EQ(khub_last_error(), "kernel swap: role 99 is not a kernel role");
    ASSERT_STATUS(khub_kernel_swap_prepare(f.hub, f.rt, KHUB_KERNEL_ROLE_ATTENTION, "", NULL, &sw),
                  KHUB_STATUS_INVALID_ARG);
    /* the Hub ID form every message quotes (without @version=N before
     * session 18) */
    ASSERT_STR_EQ(khub_last_error(),
                  "kernel swap: the attention kernel's name is empty (want a Hub ID "
                  "org/name[@REV|@version=N][:symbol] or a loaded plugin's id)");
    ASSERT_STATUS(
        khub_kernel_swap_prepare(f.hub, f.rt, KHUB_KERNEL_ROLE_ATTENTION, "nope", NULL, &sw),
        KHUB_STATUS_BAD_ID);
    ASSERT_STR_EQ(khub_last_error(),
                  "attention kernel \"nope\": not a Hub ID "
                  "(org/name[@REV|@version=N][:symbol]) nor a built-in name (eager, sdpa)");
    /* offline and not cached: the hub's refusal, nothing loaded */
    ASSERT(khub_kernel_swap_prepare(f.hub, f.rt, KHUB_KERNEL_ROLE_ATTENTION, "acme/none", NULL,
                                    &sw) != KHUB_STATUS_OK);
    ASSERT_CONTAINS(khub_last_error(), "attention kernel acme/none: ");
    khub_kernel_swap old = {.struct_size = 16};
    ASSERT_STATUS(khub_kernel_swap_prepare(f.hub, f.rt, KHUB_KERNEL_ROLE_ATTENTION, "khub/ref-cpu",
                                           NULL, &old),
                  KHUB_STATUS_STRUCT_SIZE);

    /* a plugin without the role's op: prepared, then refused at the swap */
    khub_model_binding rot = {0};
    ASSERT(find(f.m, "rotary", 0, &rot) >= 0);
    const char *ex = khub_model_explain(f.m);
    ASSERT_OK(khub_kernel_swap_prepare(f.hub, f.rt, KHUB_KERNEL_ROLE_ACTIVATION, "khub/ref-cpu",
                                       NULL, &sw));
    /* edited by hand: the prepare's hold ends, the plugin is checked by address */
    khub_kernel_swap_release(f.rt, &sw);
    sw.plugin_load = 0;
    sw.role = KHUB_KERNEL_ROLE_ROTARY;
    for (size_t i = 0; i < khub_plugin_count(f.rt); i++)
        if (!strcmp(khub_plugin_id(khub_plugin_at(f.rt, i)), "khub/cpu-avx2"))
            sw.plugin = (khub_plugin *)khub_plugin_at(f.rt, i);
    if (sw.plugin && !strcmp(khub_plugin_id(sw.plugin), "khub/cpu-avx2")) {
        ASSERT_STATUS(khub_model_kernel_swap(f.m, &sw), KHUB_STATUS_NO_KERNEL);
        ASSERT_STR_EQ(khub_last_error(), "gemma3_tiny: khub/cpu-avx2 cannot serve rotary: "
                                         "khub/cpu-avx2 0.1.0 for rotary is unusable: it has no "
                                         "rotary op; nothing changed");
        ASSERT(khub_model_explain(f.m) == ex); /* the same table: nothing changed */
        khub_model_binding still = {0};
        ASSERT(find(f.m, "rotary", 0, &still) >= 0);
        ASSERT_STR_EQ(still.kernel, rot.kernel);
        ASSERT(find(f.m, "rotary", 1, &still) < 0);
    }
    /* the bindings' list ends with NOT_FOUND; an old struct is refused */
    khub_model_binding b = {KHUB_APP_INIT(khub_model_binding)};
    ASSERT_STATUS(khub_model_binding_get(f.m, 1000, &b), KHUB_STATUS_NOT_FOUND);
    b.struct_size = 8;
    ASSERT_STATUS(khub_model_binding_get(f.m, 0, &b), KHUB_STATUS_STRUCT_SIZE);
    ASSERT_EQ(khub_binding_calls(NULL), 0);
    close_fixture(&f);
}

/* A paged cache reads through a paged_attention op of its KV layout: the
 * swap moves that binding, asking the new plugin for the same layout. */
TEST_IMPL(kernel_swap_paged_attention)
{
    fixture f = {0};
    open_fixture_cache(&f, "khub/ref-cpu:paged_cache");
    int32_t before[10], after[10];
    greedy(f.m, before);
    khub_model_binding pa = {0};
    ASSERT(find(f.m, "paged_attention", 0, &pa) >= 0);
    ASSERT(find(f.m, "attention", 0, &pa) < 0);
    khub_kernel_swap sw = {KHUB_APP_INIT(khub_kernel_swap)};
    ASSERT_OK(khub_kernel_swap_prepare(f.hub, f.rt, KHUB_KERNEL_ROLE_ATTENTION, "khub/ref-cpu",
                                       NULL, &sw));
    ASSERT_OK(khub_model_kernel_swap(f.m, &sw));
    ASSERT_STR_EQ(sw.now_serving, "khub/ref-cpu 0.1.0 :: paged_attention");
    ASSERT(find(f.m, "paged_attention", 1, &pa) >= 0);
    ASSERT(pa.calls > 0);
    greedy(f.m, after);
    for (int i = 0; i < 10; i++) ASSERT_EQ(after[i], before[i]);
    ASSERT(find(f.m, "paged_attention", 0, &pa) >= 0);
    ASSERT(pa.calls > 0);
    close_fixture(&f);
}

/* The refusal of a prepared plugin that is gone, with the name asked for
 * ("" for a struct filled by hand). */
static void refused_stale(khub_model *m, khub_kernel_swap *sw, const char *name)
{
    const char *ex = khub_model_explain(m);
    ASSERT_STATUS(khub_model_kernel_swap(m, sw), KHUB_STATUS_MISUSE);
    char want[512];
    snprintf(want, sizeof want,
             "gemma3_tiny: kernel swap: the plugin prepared for the attention role%s%s%s is not "
             "loaded in this model's runtime (unloaded or reloaded since it was prepared, or "
             "another runtime's); prepare it again; nothing changed",
             *name ? " (" : "", name, *name ? ")" : "");
    ASSERT_STR_EQ(khub_last_error(), want);
    ASSERT(khub_model_explain(m) == ex); /* the same table: nothing changed */
    ASSERT_EQ(sw->held, 0);
}

#define HELD_BY(N) \
    "khub-test/paged-attn 1.0.0: " #N " prepared kernel swap(s) hold it; switch them " \
    "(khub_model_kernel_swap) or release them (khub_kernel_swap_release) first"

/* sw.plugin is borrowed. While the swap holds it, the caller's unload and
 * reload answer BUSY; released, it can be unloaded before the switch: by
 * the caller, or after another swap's switch released the bindings that
 * kept it loaded. The switch refuses it as the load it prepared, even when
 * a new load of the plugin sits at the same address, and the model keeps
 * generating. */
TEST_IMPL(kernel_swap_refuses_a_plugin_unloaded_since_prepare)
{
    fixture f = {0};
    open_fixture_cache(&f, "khub/ref-cpu:paged_cache");
    int32_t before[10], after[10];
    greedy(f.m, before);
    khub_plugin *pa = tp_load(f.rt, "paged_attn");
    khub_kernel_swap sw = {KHUB_APP_INIT(khub_kernel_swap)};
    ASSERT_OK(khub_kernel_swap_prepare(f.hub, f.rt, KHUB_KERNEL_ROLE_ATTENTION,
                                       "khub-test/paged-attn", NULL, &sw));
    ASSERT(sw.plugin == pa);
    ASSERT_EQ(sw.held, 1);
    /* held: the caller's unload and reload are refused, nothing changes */
    ASSERT_STATUS(khub_plugin_unload(f.rt, pa), KHUB_STATUS_BUSY);
    ASSERT_STR_EQ(khub_runtime_errmsg(f.rt), "unload " HELD_BY(1));
    const char *path = TP("paged_attn");
    ASSERT_STATUS(khub_plugin_reload(f.rt, pa, path, TP_SHA(path), NULL), KHUB_STATUS_BUSY);
    ASSERT_STR_EQ(khub_runtime_errmsg(f.rt), "reload " HELD_BY(1) "; nothing changed");
    ASSERT_EQ(sw.held, 1);
    /* released, the caller unloads it */
    khub_kernel_swap_release(f.rt, &sw);
    ASSERT_OK(khub_plugin_unload(f.rt, pa));
    refused_stale(f.m, &sw, "khub-test/paged-attn");
    /* a later load at that address is another load */
    khub_plugin *again = tp_load(f.rt, "paged_attn");
    sw.plugin = again;
    refused_stale(f.m, &sw, "khub-test/paged-attn");
    /* a struct filled by hand is checked by address: another runtime's */
    khub_runtime *rt2 = tp_runtime(1);
    khub_kernel_swap hand = {KHUB_APP_INIT(khub_kernel_swap), .role = KHUB_KERNEL_ROLE_ATTENTION,
                             .plugin = tp_load(rt2, "paged_attn")};
    refused_stale(f.m, &hand, "");
    khub_runtime_free(rt2);
    /* swap_b holds the serving plugin; swap_c's switch releases its
     * bindings; once swap_b is released, the caller unloads it */
    khub_kernel_swap sw_a = {KHUB_APP_INIT(khub_kernel_swap)}, sw_b = sw_a, sw_c = sw_a;
    ASSERT_OK(khub_kernel_swap_prepare(f.hub, f.rt, KHUB_KERNEL_ROLE_ATTENTION,
                                       "khub-test/paged-attn", NULL, &sw_a));
    ASSERT_OK(khub_model_kernel_swap(f.m, &sw_a));
    ASSERT_STR_EQ(sw_a.now_serving, "khub-test/paged-attn 1.0.0 :: paged_attention");
    ASSERT_OK(khub_kernel_swap_prepare(f.hub, f.rt, KHUB_KERNEL_ROLE_ATTENTION,
                                       "khub-test/paged-attn", NULL, &sw_b));
    ASSERT(sw_b.plugin == again);
    ASSERT_OK(khub_kernel_swap_prepare(f.hub, f.rt, KHUB_KERNEL_ROLE_ATTENTION, "khub/ref-cpu",
                                       NULL, &sw_c));
    ASSERT_OK(khub_model_kernel_swap(f.m, &sw_c));
    ASSERT_STATUS(khub_plugin_unload(f.rt, again), KHUB_STATUS_BUSY); /* sw_b holds it */
    ASSERT_STR_EQ(khub_runtime_errmsg(f.rt), "unload " HELD_BY(1));
    khub_kernel_swap_release(f.rt, &sw_b);
    ASSERT_OK(khub_plugin_unload(f.rt, again));
    refused_stale(f.m, &sw_b, "khub-test/paged-attn");
    greedy(f.m, after);
    for (int i = 0; i < 10; i++) ASSERT_EQ(after[i], before[i]);
    close_fixture(&f);
}

/* A 0.1 khub_kernel_swap (struct_size of 0.1: no plugin_load, no hold)
 * holds nothing between its prepare and its switch, so its plugin can be
 * unloaded meanwhile (by the caller here; by another swap's release or
 * switch in a server). Its prepare tags the load in the struct's 0.1
 * `reserved` slot, so the switch refuses a plugin loaded later at that
 * address instead of switching it in; a 0.1 struct filled by hand
 * (reserved 0) is still checked by address, and the model keeps its
 * tokens. */
TEST_IMPL(kernel_swap_0_1_struct_refuses_a_reused_address)
{
    fixture f = {0};
    open_fixture_cache(&f, "khub/ref-cpu:paged_cache");
    int32_t before[10], after[10];
    greedy(f.m, before);
    const uint32_t size01 = (uint32_t)offsetof(khub_kernel_swap, name); /* "End of 0.1" */
    khub_plugin *pa = tp_load(f.rt, "paged_attn");
    khub_kernel_swap sw = {KHUB_APP_INIT(khub_kernel_swap)};
    sw.struct_size = size01;
    ASSERT_OK(khub_kernel_swap_prepare(f.hub, f.rt, KHUB_KERNEL_ROLE_ATTENTION,
                                       "khub-test/paged-attn", NULL, &sw));
    ASSERT(sw.plugin == pa);
    ASSERT(sw.reserved != 0);
    ASSERT_EQ(sw.plugin_load, 0); /* nothing written past a 0.1 struct */
    ASSERT_EQ(sw.held, 0);
    ASSERT_OK(khub_plugin_unload(f.rt, pa)); /* a 0.1 swap holds nothing */
    refused_stale(f.m, &sw, "");
    /* a later load at that address is another load */
    khub_plugin *again = tp_load(f.rt, "paged_attn");
    sw.plugin = again;
    refused_stale(f.m, &sw, "");
    /* prepared again, it switches */
    ASSERT_OK(khub_kernel_swap_prepare(f.hub, f.rt, KHUB_KERNEL_ROLE_ATTENTION,
                                       "khub-test/paged-attn", NULL, &sw));
    ASSERT(sw.plugin == again);
    ASSERT_OK(khub_model_kernel_swap(f.m, &sw));
    ASSERT_STR_EQ(sw.now_serving, "khub-test/paged-attn 1.0.0 :: paged_attention");
    /* filled by hand, reserved 0: checked by address, as 0.1 always was */
    khub_kernel_swap hand = {.struct_size = size01, .role = KHUB_KERNEL_ROLE_ATTENTION};
    for (size_t i = 0; i < khub_plugin_count(f.rt); i++)
        if (!strcmp(khub_plugin_id(khub_plugin_at(f.rt, i)), "khub/ref-cpu"))
            hand.plugin = (khub_plugin *)khub_plugin_at(f.rt, i);
    ASSERT(hand.plugin != NULL);
    ASSERT_OK(khub_model_kernel_swap(f.m, &hand));
    ASSERT_STR_EQ(hand.now_serving, "khub/ref-cpu 0.1.0 :: paged_attention");
    ASSERT_OK(khub_plugin_unload(f.rt, again)); /* the caller's, unused again */
    greedy(f.m, after);
    for (int i = 0; i < 10; i++) ASSERT_EQ(after[i], before[i]);
    close_fixture(&f);
}

/* ======================================================================== */
/* An unload on another thread during the switch                            */
/* ======================================================================== */

typedef struct unloader {
    khub_runtime *rt;
    khub_plugin *p;
    atomic_int ready, go;  /* it waits for go; then both start at once */
    atomic_int stop, done; /* told to stop; it stopped */
    atomic_int tries;
    int busy, ok, other; /* the answers it got */
} unloader;

/* Tries to unload u->p until it succeeds or is told to stop. */
static void *unload_loop(void *ud)
{
    unloader *u = ud;
    atomic_store(&u->ready, 1);
    while (!atomic_load(&u->go)) continue;
    while (!atomic_load(&u->stop)) {
        khub_status st = khub_plugin_unload(u->rt, u->p);
        if (st == KHUB_STATUS_OK)
            u->ok++;
        else if (st == KHUB_STATUS_BUSY)
            u->busy++;
        else
            u->other++;
        atomic_fetch_add(&u->tries, 1);
        if (st == KHUB_STATUS_OK) break;
    }
    atomic_store(&u->done, 1);
    return NULL;
}

/* The switch to sw on m while another thread tries to unload sw->plugin,
 * the switch started after `delay` empty loop turns (so that either may
 * come first), or (delay < 0) once the other thread has tried once;
 * returns the switch's status, *u the other thread's answers. */
static khub_status switch_racing_unload(fixture *f, khub_kernel_swap *sw, int delay, unloader *u)
{
    *u = (unloader){.rt = f->rt, .p = sw->plugin};
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, NULL, unload_loop, u), 0);
    while (!atomic_load(&u->ready)) sched_yield();
    atomic_store(&u->go, 1);
    for (volatile int k = 0; k < delay; k++) continue;
    while (delay < 0 && !atomic_load(&u->tries)) sched_yield();
    khub_status st = khub_model_kernel_swap(f->m, sw);
    /* at least one try after the switch, unless the unload won */
    int t0 = atomic_load(&u->tries);
    while (atomic_load(&u->tries) == t0 && !atomic_load(&u->done)) sched_yield();
    atomic_store(&u->stop, 1);
    ASSERT_EQ(pthread_join(t, NULL), 0);
    return st;
}

/* A khub_plugin_unload of the plugin being switched in, on another thread,
 * during khub_model_kernel_swap: the prepared swap's hold makes it BUSY,
 * and the switch succeeds. A swap that holds nothing (released before the
 * switch) races it fairly: exactly one of the two wins, the switch (then
 * the plugin is bound: every unload is BUSY) or the unload (then the
 * switch refuses the plugin as gone, MISUSE), and the switch never reads a
 * freed plugin (run it under ASan). */
TEST_IMPL(kernel_swap_unload_during_the_switch)
{
    fixture f = {0};
    open_fixture_cache(&f, "khub/ref-cpu:paged_cache");
    int32_t before[10], after[10];
    greedy(f.m, before);
    for (int i = 0; i < 40; i++) {
        khub_plugin *pa = tp_load(f.rt, "paged_attn");
        khub_kernel_swap sw = {KHUB_APP_INIT(khub_kernel_swap)}, back = sw;
        ASSERT_OK(khub_kernel_swap_prepare(f.hub, f.rt, KHUB_KERNEL_ROLE_ATTENTION,
                                           "khub-test/paged-attn", NULL, &sw));
        bool hold = i % 2 == 0;
        if (!hold) khub_kernel_swap_release(f.rt, &sw);
        unloader u;
        khub_status st = switch_racing_unload(&f, &sw, hold ? -1 : (i / 2 % 10) * 2000, &u);
        ASSERT_EQ(u.other, 0);
        if (hold) {
            ASSERT_OK(st);
            ASSERT_EQ(u.ok, 0);
            ASSERT(u.busy > 0);
        } else {
            ASSERT(st == KHUB_STATUS_OK || st == KHUB_STATUS_MISUSE);
            ASSERT_EQ(u.ok, st == KHUB_STATUS_MISUSE); /* exactly one wins */
        }
        ASSERT_EQ(sw.held, 0);
        if (st != KHUB_STATUS_OK) continue; /* the unload won: nothing changed */
        ASSERT_STR_EQ(sw.now_serving, "khub-test/paged-attn 1.0.0 :: paged_attention");
        ASSERT_OK(khub_kernel_swap_prepare(f.hub, f.rt, KHUB_KERNEL_ROLE_ATTENTION, "khub/ref-cpu",
                                           NULL, &back));
        ASSERT_OK(khub_model_kernel_swap(f.m, &back));
        ASSERT_OK(khub_plugin_unload(f.rt, pa)); /* the caller's: left to the caller */
    }
    greedy(f.m, after);
    for (int i = 0; i < 10; i++) ASSERT_EQ(after[i], before[i]);
    close_fixture(&f);
}

/* The bindings khub_model_binding_get lists. */
static size_t binding_count(khub_model *m)
{
    size_t n = 0;
    khub_model_binding b = {KHUB_APP_INIT(khub_model_binding)};
    while (khub_model_binding_get(m, n, &b) == KHUB_STATUS_OK) n++;
    return n;
}

/* A switch that selects a new binding for one of a role's ops and then
 * fails on the next (khub-test/good's norm op "stamp" serves rms_norm but
 * has no residual flag for rms_norm+residual) drops the binding it made:
 * the model lists what it listed, nothing is retired, and the caller's
 * plugin unloads (a binding left behind would answer BUSY until
 * khub_runtime_free). */
TEST_IMPL(kernel_swap_failed_switch_drops_its_new_bindings)
{
    fixture f = {0};
    open_fixture(&f);
    khub_model_binding res = {0};
    ASSERT(find(f.m, "rms_norm+residual", 0, &res) >= 0);
    const size_t plugins = khub_plugin_count(f.rt), bindings = binding_count(f.m);
    const char *ex = khub_model_explain(f.m);
    khub_plugin *good = NULL;
    const char *path = TP("good_v1");
    ASSERT_OK(khub_plugin_load(f.rt, path, TP_SHA(path), &good));
    khub_kernel_swap sw = {KHUB_APP_INIT(khub_kernel_swap)};
    ASSERT_OK(
        khub_kernel_swap_prepare(f.hub, f.rt, KHUB_KERNEL_ROLE_NORM, "khub-test/good", NULL, &sw));
    ASSERT(sw.plugin == good);
    ASSERT_STATUS(khub_model_kernel_swap(f.m, &sw), KHUB_STATUS_NO_KERNEL);
    ASSERT_STR_EQ(khub_last_error(), "gemma3_tiny: khub-test/good cannot serve rms_norm+residual: "
                                     "khub-test/good 1.0.0 for norm is rejected: missing flag "
                                     "residual; nothing changed");
    ASSERT_EQ(binding_count(f.m), bindings);
    ASSERT(find(f.m, "rms_norm", 1, &res) < 0); /* nothing retired */
    ASSERT(khub_model_explain(f.m) == ex);
    ASSERT_EQ(khub_plugin_count(f.rt), plugins + 1); /* the caller's: stays loaded */
    ASSERT_OK(khub_plugin_unload(f.rt, good));
    ASSERT_EQ(khub_plugin_count(f.rt), plugins);
    int32_t ids[10];
    greedy(f.m, ids); /* the old norms still serve */
    close_fixture(&f);
}

#define TEST_LIST(X) \
    X(kernel_swap_attention_and_back) \
    X(kernel_swap_refusals_change_nothing) \
    X(kernel_swap_paged_attention) \
    X(kernel_swap_refuses_a_plugin_unloaded_since_prepare) \
    X(kernel_swap_0_1_struct_refuses_a_reused_address) \
    X(kernel_swap_unload_during_the_switch) \
    X(kernel_swap_failed_switch_drops_its_new_bindings)
TEST_MAIN(TEST_LIST)
