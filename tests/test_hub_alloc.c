/* test_hub_alloc.c: the hub's memory goes through the embedder's allocator
 * (issue 12): khub_hub_opts.allocator, or an attached runtime's after
 * khub_hub_set_runtime. Every block the hub allocates reaches the counting
 * allocator and comes back to it, results freed after the handle included;
 * an allocation failure at any point fails the call and leaks nothing; a
 * 0.1 caller's shorter khub_hub_opts is read only up to its struct_size.
 * (tests/t_hub_alloc.sh checks the other half: no C library allocation
 * is left in hub/.) */
#include <stddef.h>
#include <string.h>

#include "budget_alloc.h"
#include "hub_fixture.h"
#include "khub/khub_cache.h"
#include "khub/khub_project.h"

typedef struct counter {
    budget b;    /* live bytes, and an allocation budget (< 0: none) */
    long allocs; /* allocations and growths asked for */
} counter;

static void *count_realloc(void *ud, void *p, size_t old_n, size_t new_n)
{
    counter *c = ud;
    if (new_n) c->allocs++;
    return budget_realloc(&c->b, p, old_n, new_n);
}

static khub_hub_opts opts_with(const fixture *fx, int offline, counter *c)
{
    khub_hub_opts o = {KHUB_APP_INIT(khub_hub_opts),
                       .endpoint = fx->endpoint,
                       .cache_dir = fx->cache,
                       .token = "",
                       .offline = offline,
                       .backoff_ms = 50,
                       .max_tries = 2,
                       .allocator = {count_realloc, c}};
    return o;
}

/* ======================================================================== */
/* Every block through the allocator, every block back                      */
/* ======================================================================== */

TEST_IMPL(every_block_comes_from_the_allocator_and_goes_back)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    counter c = {{-1, 0}, 0};
    khub_hub_opts o = opts_with(&fx, 0, &c);
    khub_hub *hub = NULL;
    ASSERT_OK(khub_hub_new(&o, &hub));
    ASSERT_LE(1, c.allocs); /* the handle itself */
    khub_hub_id id = fx_id("org/demo@main");
    char commit[41], path[KHUB_HUB_PATH_MAX];
    ASSERT_OK(khub_hub_resolve(hub, &id, commit));
    khub_hub_variant_list *vl = NULL;
    ASSERT_OK(khub_hub_variants(hub, &id, commit, &vl));
    ASSERT_STR_EQ(vl->best, fx.variant);
    khub_hub_file_list *fl = NULL, *fl2 = NULL;
    ASSERT_OK(khub_hub_download_variant(hub, &id, commit, vl->best, &fl));
    ASSERT_OK(khub_hub_variant_files(hub, &id, commit, vl->best, &fl2));
    ASSERT_OK(khub_hub_download_path(hub, &id, commit, "weights.bin", path, sizeof path));
    khub_cache_report *rep = NULL;
    ASSERT_OK(khub_cache_scan(hub, &rep));
    uint64_t checked = 0, bad = 0;
    ASSERT_OK(khub_cache_verify(hub, NULL, NULL, NULL, &checked, &bad));
    ASSERT_LE(3, checked);
    khub_lock *lock = NULL;
    ASSERT_OK(khub_lock_new(&lock));
    khub_hub_id v1 = fx_id("org/demo@version=1");
    ASSERT_OK(khub_lock_kernel(hub, lock, &v1, NULL, NULL));
    ASSERT_OK(khub_lock_sync(hub, lock, 0, NULL, NULL));
    long allocs = c.allocs;
    ASSERT_LE(50, allocs); /* listings, trees, digests, reports: not a token few */
    khub_lock_free(lock);
    khub_hub_free(hub);
    /* Results outlive the handle and go back to the allocator they came
     * from: only they are still out now. */
    ASSERT(c.b.live > 0);
    khub_cache_report_free(rep);
    khub_hub_file_list_free(fl2);
    khub_hub_file_list_free(fl);
    khub_hub_variant_list_free(vl);
    ASSERT_EQ(c.b.live, 0);
    ASSERT_EQ(c.allocs, allocs); /* freeing allocates nothing */
    fx_done(&fx);
}

/* khub_hub_set_runtime: from then on the runtime's allocator; blocks made
 * before go back to the one they came from. */
TEST_IMPL(an_attached_runtime_allocates_from_then_on)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    counter h = {{-1, 0}, 0}, r = {{-1, 0}, 0};
    khub_runtime_opts ro = {KHUB_APP_INIT(khub_runtime_opts), .n_threads = 1,
                            .allocator = {count_realloc, &r}};
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(&ro, &rt));
    long live_rt = r.b.live, allocs_rt = r.allocs;
    khub_hub_opts o = opts_with(&fx, 0, &h);
    khub_hub *hub = NULL;
    ASSERT_OK(khub_hub_new(&o, &hub));
    khub_hub_id id = fx_id("org/demo@main");
    char commit[41];
    ASSERT_OK(khub_hub_resolve(hub, &id, commit));
    khub_hub_variant_list *before = NULL, *after = NULL;
    ASSERT_OK(khub_hub_variants(hub, &id, commit, &before));
    long h_allocs = h.allocs;
    khub_hub_set_runtime(hub, rt);
    ASSERT_OK(khub_hub_variants(hub, &id, commit, &after));
    ASSERT_EQ(h.allocs, h_allocs); /* nothing more from the hub's own */
    ASSERT_LE(allocs_rt + 2, r.allocs);
    ASSERT(r.b.live > live_rt); /* the list is the runtime allocator's */
    khub_hub_set_runtime(hub, NULL);
    khub_hub_variant_list_free(after);
    ASSERT_EQ(r.b.live, live_rt);
    khub_hub_variant_list_free(before);
    khub_hub_free(hub);
    ASSERT_EQ(h.b.live, 0);
    khub_runtime_free(rt);
    ASSERT_EQ(r.b.live, 0);
    fx_done(&fx);
}

/* ======================================================================== */
/* Out of memory at every allocation                                        */
/* ======================================================================== */

/* One offline round over a filled cache with budget k: each call fails or
 * succeeds, and whatever happened nothing stays out. Returns 1 when the
 * whole round succeeded. */
static int oom_round(const fixture *fx, long k)
{
    counter c = {{k, 0}, 0};
    khub_hub_opts o = opts_with(fx, 1, &c);
    khub_hub *hub = NULL;
    khub_status st = khub_hub_new(&o, &hub);
    if (st != KHUB_STATUS_OK) {
        ASSERT_STATUS(st, KHUB_STATUS_NOMEM);
        ASSERT_CONTAINS(khub_last_error(), "out of memory");
        ASSERT_EQ(c.b.live, 0);
        return 0;
    }
    khub_hub_id id = fx_id("org/demo@main");
    char commit[41], path[KHUB_HUB_PATH_MAX];
    khub_hub_variant_list *vl = NULL;
    khub_hub_file_list *fl = NULL;
    khub_cache_report *rep = NULL;
    int ok = khub_hub_resolve(hub, &id, commit) == KHUB_STATUS_OK &&
             khub_hub_variants(hub, &id, commit, &vl) == KHUB_STATUS_OK && vl->best &&
             khub_hub_variant_files(hub, &id, commit, vl->best, &fl) == KHUB_STATUS_OK &&
             khub_hub_download_path(hub, &id, commit, "README.md", path, sizeof path) ==
                 KHUB_STATUS_OK &&
             khub_cache_scan(hub, &rep) == KHUB_STATUS_OK;
    if (!ok) ASSERT(khub_hub_errmsg(hub)[0] != '\0'); /* a failure says why */
    khub_cache_report_free(rep);
    khub_hub_file_list_free(fl);
    khub_hub_variant_list_free(vl);
    khub_hub_free(hub);
    ASSERT_EQ(c.b.live, 0);
    return ok;
}

TEST_IMPL(oom_at_any_allocation_fails_and_leaks_nothing)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    { /* fill the cache online first */
        counter c = {{-1, 0}, 0};
        khub_hub_opts o = opts_with(&fx, 0, &c);
        khub_hub *hub = NULL;
        ASSERT_OK(khub_hub_new(&o, &hub));
        khub_hub_id id = fx_id("org/demo@main");
        char commit[41], path[KHUB_HUB_PATH_MAX];
        khub_hub_file_list *fl = NULL;
        ASSERT_OK(khub_hub_resolve(hub, &id, commit));
        ASSERT_OK(khub_hub_download_variant(hub, &id, commit, fx.variant, &fl));
        ASSERT_OK(khub_hub_download_path(hub, &id, commit, "README.md", path, sizeof path));
        khub_hub_file_list_free(fl);
        khub_hub_free(hub);
        ASSERT_EQ(c.b.live, 0);
    }
    long k = 0;
    while (k < 5000 && !oom_round(&fx, k)) k++;
    ASSERT_LE(5, k);  /* the round needs several allocations: each one failed once */
    ASSERT(k < 5000); /* and with enough of them it succeeds */
    fx_done(&fx);
}

/* ======================================================================== */
/* A 0.1 caller's struct                                                    */
/* ======================================================================== */

/* khub_hub_opts of 0.1 ends at max_retry_after_s: the bytes after it in a
 * 0.1 caller's memory are not an allocator (here garbage that would crash
 * as one), and are never read. */
TEST_IMPL(short_opts_are_read_only_to_struct_size)
{
    const size_t size_0_1 = offsetof(khub_hub_opts, max_retry_after_s) + sizeof(int32_t);
    ASSERT(size_0_1 < sizeof(khub_hub_opts));
    unsigned char raw[sizeof(khub_hub_opts) + 64];
    memset(raw, 0xA5, sizeof raw);
    khub_hub_opts o = {KHUB_STRUCT_INIT(khub_hub_opts), .token = "", .offline = 1,
                       .cache_dir = "/nonexistent/khub-cache"};
    o.struct_size = (uint32_t)size_0_1;
    memcpy(raw, &o, size_0_1);
    khub_hub *hub = NULL;
    ASSERT_OK(khub_hub_new((const khub_hub_opts *)(void *)raw, &hub));
    ASSERT_STR_EQ(khub_hub_cache_dir(hub), "/nonexistent/khub-cache");
    khub_hub_free(hub);
    o.struct_size = (uint32_t)size_0_1 - 4;
    ASSERT_STATUS(khub_hub_new(&o, &hub), KHUB_STATUS_STRUCT_SIZE);
    char want[96];
    snprintf(want, sizeof want, "khub_hub_new: opts.struct_size %zu is smaller than 0.1's %zu",
             size_0_1 - 4, size_0_1);
    ASSERT_STR_EQ(khub_last_error(), want);
}

/* ======================================================================== */
/* Paths for the caller                                                     */
/* ======================================================================== */

/* khub_hub_download_path writes into the caller's buffer; the 0.1
 * khub_hub_download_file's string stays the C library's (free()), whatever
 * the hub's allocator. */
TEST_IMPL(download_path_and_the_01_string)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    counter c = {{-1, 0}, 0};
    khub_hub_opts o = opts_with(&fx, 0, &c);
    khub_hub *hub = NULL;
    ASSERT_OK(khub_hub_new(&o, &hub));
    khub_hub_id id = fx_id("org/demo@main");
    char commit[41], path[KHUB_HUB_PATH_MAX], tiny[8] = "x";
    ASSERT_OK(khub_hub_resolve(hub, &id, commit));
    ASSERT_OK(khub_hub_download_path(hub, &id, commit, "README.md", path, sizeof path));
    ASSERT_CONTAINS(path, "/snapshots/" C1 "/README.md");
    ASSERT_STATUS(khub_hub_download_path(hub, &id, commit, "README.md", tiny, sizeof tiny),
                  KHUB_STATUS_OVERFLOW);
    ASSERT_STR_EQ(tiny, "");
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "path longer than the 8-byte buffer");
    long live = c.b.live;
    char *p = NULL;
    ASSERT_OK(khub_hub_download_file(hub, &id, commit, "README.md", &p));
    ASSERT_STR_EQ(p, path);
    ASSERT_EQ(c.b.live, live); /* not the hub's block */
    free(p);
    ASSERT_STATUS(khub_hub_download_path(hub, &id, commit, "README.md", NULL, 0),
                  KHUB_STATUS_MISUSE);
    khub_hub_free(hub);
    ASSERT_EQ(c.b.live, 0);
    fx_done(&fx);
}

#define TEST_LIST(X) \
    X(every_block_comes_from_the_allocator_and_goes_back) \
    X(an_attached_runtime_allocates_from_then_on) \
    X(oom_at_any_allocation_fails_and_leaks_nothing) \
    X(short_opts_are_read_only_to_struct_size) \
    X(download_path_and_the_01_string)
TEST_MAIN(TEST_LIST)
