/*
 * test_kv_offload.c: ref-cpu's offloaded KV cache (issue 13 item 4)
 * through the fake host of kv_host.h: the memory budget splits slots
 * between memory and the file tier (a view of a file slot points into the
 * mapping of the unlinked khub-kv-* file), a slot moves to the file when it
 * outgrows the budget and keeps its values, memory counts both tiers and
 * truncating to 0 gives the file's blocks back; hostile options (budget 0,
 * negative, malformed, overflowing; a missing, non-directory or unwritable
 * dir; a cache too large to map) are refused with their messages; a full
 * disk (a 64 KiB tmpfs mounted in a private mount namespace) is
 * KHUB_STATUS_IO with the directory and errno, and loses nothing; out of
 * memory at any allocation is NOMEM without leaks.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <khub/khub.h>

#include "kv_host.h"

#define OF "offloaded_cache"

/* 1-3 layers of 2 heads x 4 dims (f32: a row of K is 32 bytes, a slot of
 * 16 rows 1 KiB with V), 2 sequences. */
static khub_status of_new(int32_t layers, int64_t max_tokens, const char *options,
                          khub_kv_cache **c)
{
    khub_kv_cache_config cfg = {KHUB_STRUCT_INIT(khub_kv_cache_config),
                                .n_layers = layers,
                                .n_kv_heads = 2,
                                .head_dim = 4,
                                .n_seqs = 2,
                                .max_tokens = max_tokens,
                                .dtype = KHUB_DTYPE_F32,
                                .options = options};
    *c = NULL;
    g_err[0] = '\0';
    return kvm(OF)->create(g_desc.state, &cfg, c);
}

static float of_val(int64_t p, int64_t i) { return (float)(p * 8 + i) * 0.5f; }

static khub_status of_put(khub_kv_cache *c, int32_t layer, int32_t seq, int64_t pos, int64_t n)
{
    float *k = fbuf((size_t)n * 8), *v = fbuf((size_t)n * 8);
    for (int64_t i = 0; i < n * 8; i++) k[i] = of_val(pos + i / 8, i % 8), v[i] = -k[i];
    khub_status st = put(OF, c, layer, seq, pos, k, v, n, 2, 4);
    free(k), free(v);
    return st;
}

/* 1 when p lies in a mapping of a khub-kv file, 0 when in another mapping. */
static int in_file_tier(const void *p)
{
    FILE *f = fopen("/proc/self/maps", "r");
    ASSERT(f != NULL);
    char line[1024];
    int inside = 0;
    while (!inside && fgets(line, sizeof line, f)) {
        unsigned long lo = 0, hi = 0;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && strstr(line, "/khub-kv-"))
            inside = (uintptr_t)p >= lo && (uintptr_t)p < hi;
    }
    fclose(f);
    return inside;
}

/* Checks positions [0, n) of a slot; returns whether it is in the file. */
static int of_check(khub_kv_cache *c, int32_t layer, int32_t seq, int64_t n)
{
    int64_t ks[3], kst[3], vs[3], vst[3];
    khub_tensor kt = {.shape = ks, .strides = kst}, vt = {.shape = vs, .strides = vst};
    ASSERT_OK(kvm(OF)->view(g_desc.state, c, layer, seq, n, &kt, &vt));
    ASSERT_EQ(ks[0], n);
    for (int64_t p = 0; p < n; p++)
        for (int64_t i = 0; i < 8; i++) {
            ASSERT(view_at(&kt, p, i / 4, i % 4) == of_val(p, i));
            ASSERT(view_at(&vt, p, i / 4, i % 4) == -of_val(p, i));
        }
    return in_file_tier(kt.data);
}

static khub_kv_cache_memory of_mem(khub_kv_cache *c)
{
    khub_kv_cache_memory mem = {KHUB_STRUCT_INIT(khub_kv_cache_memory)};
    ASSERT_OK(kvm(OF)->memory(g_desc.state, c, &mem));
    return mem;
}

static char g_dir[64];

static const char *tmp_dir(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/khub-kvoff-XXXXXX");
    ASSERT(mkdtemp(g_dir) != NULL);
    return g_dir;
}

/* budget=2K holds two slots of 16 rows: layers 0 and 1 of seq 0 stay in
 * memory, layer 2 goes to the file; growing layer 0 to 32 rows crosses the
 * budget and moves it, values intact. */
TEST_IMPL(offloaded_budget_splits_the_tiers)
{
    setup();
    char opts[128];
    snprintf(opts, sizeof opts, "budget=2K,dir=%s", tmp_dir());
    khub_kv_cache *c = NULL;
    ASSERT_OK(of_new(3, 64, opts, &c));
    for (int32_t l = 0; l < 3; l++) ASSERT_OK(of_put(c, l, 0, 0, 10));
    ASSERT_EQ(of_check(c, 0, 0, 10), 0);
    ASSERT_EQ(of_check(c, 1, 0, 10), 0);
    ASSERT_EQ(of_check(c, 2, 0, 10), 1);
    khub_kv_cache_memory mem = of_mem(c);
    ASSERT_EQ(mem.bytes_total, 3 * 1024);
    ASSERT_EQ(mem.bytes_per_token, 3 * 2 * 32);
    ASSERT_EQ(mem.tokens_used, 10);
    ASSERT_OK(of_put(c, 0, 0, 10, 10)); /* 20 rows: 2 KiB, over the budget with layer 1 */
    ASSERT_EQ(of_check(c, 0, 0, 20), 1);
    ASSERT_EQ(of_check(c, 1, 0, 10), 0);
    ASSERT_OK(of_put(c, 1, 0, 10, 10)); /* now alone in memory: 2 KiB fits */
    ASSERT_EQ(of_check(c, 1, 0, 20), 0);
    ASSERT_OK(of_put(c, 2, 0, 10, 10));
    ASSERT_EQ(of_check(c, 2, 0, 20), 1);
    mem = of_mem(c);
    ASSERT_EQ(mem.bytes_total, 3 * 2048);
    ASSERT_EQ(mem.tokens_used, 20);
    /* truncating to 0 gives the file slots back; memory slots keep theirs */
    ASSERT_OK(kvm(OF)->truncate(g_desc.state, c, 0, 0));
    mem = of_mem(c);
    ASSERT_EQ(mem.bytes_total, 2048);
    ASSERT_EQ(mem.tokens_used, 0);
    ASSERT_OK(of_put(c, 2, 0, 0, 5));   /* a file slot given back starts over */
    ASSERT_EQ(of_check(c, 2, 0, 5), 1); /* memory is still full of layer 1 */
    kvm(OF)->destroy(g_desc.state, c);
    ASSERT_EQ(rmdir(g_dir), 0); /* the file was unlinked at create */
    ASSERT_NO_LEAKS();
}

/* The write and view checks of every cache apply. */
TEST_IMPL(offloaded_checks_positions)
{
    setup();
    char opts[128];
    snprintf(opts, sizeof opts, "budget=1,dir=%s", tmp_dir());
    khub_kv_cache *c = NULL;
    ASSERT_OK(of_new(1, 16, opts, &c));
    ASSERT_OK(of_put(c, 0, 1, 0, 4));
    ASSERT_FAILS(of_put(c, 0, 1, 6, 1), KHUB_STATUS_INVALID_ARG,
                 "offloaded_cache.write: pos (got 6, want 0..4");
    ASSERT_FAILS(of_put(c, 0, 1, 4, 13), KHUB_STATUS_CONTEXT_FULL,
                 "offloaded_cache.write: positions 4..16 exceed max_tokens 16");
    int64_t ks[3], kst[3], vs[3], vst[3];
    khub_tensor kt = {.shape = ks, .strides = kst}, vt = {.shape = vs, .strides = vst};
    ASSERT_FAILS(kvm(OF)->view(g_desc.state, c, 0, 1, 5, &kt, &vt), KHUB_STATUS_INVALID_ARG,
                 "offloaded_cache.view: n (got 5, want 0..4, the length of layer 0 seq 1)");
    ASSERT_FAILS(kvm(OF)->view(g_desc.state, c, 1, 1, 1, &kt, &vt), KHUB_STATUS_INVALID_ARG,
                 "offloaded_cache.view: layer (got 1, want 0..0)");
    ASSERT_EQ(of_check(c, 0, 1, 4), 1);
    kvm(OF)->destroy(g_desc.state, c);
    ASSERT_EQ(rmdir(g_dir), 0);
    ASSERT_NO_LEAKS();
}

TEST_IMPL(offloaded_hostile_options)
{
    setup();
    const char *dir = tmp_dir();
    char file[128], opts[512], msg[512], longdir[300];
    snprintf(file, sizeof file, "%s/plain", dir);
    FILE *f = fopen(file, "w");
    ASSERT(f != NULL);
    fclose(f);
    memset(longdir, 'd', sizeof longdir - 1);
    longdir[sizeof longdir - 1] = '\0';
    static const struct {
        const char *opts, *msg;
    } bad[] = {
        {"budget=0", "offloaded_cache.create: option budget (got 0, want at least 1 byte: a "
                     "budget smaller than one slot, such as 1, offloads everything; the dynamic "
                     "cache keeps everything in memory)"},
        {"budget=-1", "offloaded_cache.create: option budget (got \"-1\", want a size in bytes "
                      "such as 1048576, 512K, 64M or 2G)"},
        {"budget=12X", "option budget (got \"12X\", want a size in bytes"},
        {"budget=M", "option budget (got \"M\", want a size in bytes"},
        {"budget=99999999999999999999", "option budget (got \"99999999999999999999\""},
        {"budget=17179869184G", "option budget (got \"17179869184G\""},
        {"budget=", "offloaded_cache.create: option budget (got 0 characters, want 1..31)"},
        {"dir=/nonexistent/kv", "offloaded_cache.create: dir \"/nonexistent/kv\": No such file "
                                "or directory (want an existing writable directory)"},
        {"dir=/proc/self", "offloaded_cache.create: cannot create the file tier under "
                           "\"/proc/self\": "},
        {"budget", "offloaded_cache.create: option \"budget\" is not key=value (keys: budget, "
                   "dir)"},
        {"size=1G", "offloaded_cache.create: unknown option \"size\" (keys: budget, dir)"},
    };
    khub_kv_cache *c = NULL;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ASSERT_FAILS(of_new(1, 16, bad[i].opts, &c),
                     strncmp(bad[i].opts, "dir=/proc", 9) == 0 ? KHUB_STATUS_IO
                                                               : KHUB_STATUS_INVALID_ARG,
                     bad[i].msg);
        ASSERT(c == NULL);
        ASSERT_NO_LEAKS();
    }
    snprintf(opts, sizeof opts, "dir=%s", file);
    snprintf(msg, sizeof msg, "dir \"%s\": not a directory (want an existing writable directory)",
             file);
    ASSERT_FAILS(of_new(1, 16, opts, &c), KHUB_STATUS_INVALID_ARG, msg);
    snprintf(opts, sizeof opts, "dir=/%s", longdir);
    ASSERT_FAILS(of_new(1, 16, opts, &c), KHUB_STATUS_INVALID_ARG,
                 "offloaded_cache.create: option dir (got 300 characters, want 1..255)");
    /* a cache whose file tier needs more than 64 TiB of address space */
    snprintf(opts, sizeof opts, "dir=%s", dir);
    ASSERT_FAILS(of_new(3, (int64_t)1 << 40, opts, &c), KHUB_STATUS_OVERFLOW,
                 "offloaded_cache.create: 6 slots of 1099511627776 tokens need more than");
    ASSERT(c == NULL);
    /* sizes with suffixes are accepted */
    static const char *const good[] = {"budget=1", "budget=512K", "budget=64MiB", "budget=2g",
                                       "budget=100kb"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        snprintf(opts, sizeof opts, "%s,dir=%s", good[i], dir);
        ASSERT_OK(of_new(1, 16, opts, &c));
        kvm(OF)->destroy(g_desc.state, c);
    }
    ASSERT_EQ(unlink(file), 0);
    ASSERT_EQ(rmdir(dir), 0);
    ASSERT_NO_LEAKS();
}

TEST_IMPL(offloaded_out_of_memory)
{
    setup();
    char opts[128];
    snprintf(opts, sizeof opts, "budget=3K,dir=%s", tmp_dir());
    int failed = 0;
    for (int k = 1; k < 16; k++) {
        khub_kv_cache *c = NULL;
        g_fail_allocs = k;
        khub_status st = of_new(2, 64, opts, &c);
        for (int64_t p = 0; st == KHUB_STATUS_OK && p < 40; p += 8)
            for (int32_t l = 0; st == KHUB_STATUS_OK && l < 2; l++) st = of_put(c, l, 0, p, 8);
        g_fail_allocs = 0;
        if (st != KHUB_STATUS_OK) {
            ASSERT_EQ(st, KHUB_STATUS_NOMEM);
            ASSERT_CONTAINS(g_err, "offloaded_cache.");
            failed++;
        }
        kvm(OF)->destroy(g_desc.state, c);
        ASSERT_NO_LEAKS();
    }
    ASSERT(failed >= 3);
    ASSERT_EQ(rmdir(g_dir), 0);
}

/* A private mount namespace with a 64 KiB tmpfs on a fresh directory
 * (root, or an unprivileged user namespace); 0 when it worked. */
static int small_tmpfs(char *dir, size_t n, char *why, size_t why_n)
{
    if (unshare(CLONE_NEWNS) != 0) {
        uid_t uid = getuid();
        gid_t gid = getgid();
        if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) {
            snprintf(why, why_n, "unshare: %s", strerror(errno));
            return -1;
        }
        char map[64];
        int fd = open("/proc/self/setgroups", O_WRONLY);
        if (fd >= 0) (void)!write(fd, "deny", 4), close(fd);
        snprintf(map, sizeof map, "0 %u 1", (unsigned)uid);
        fd = open("/proc/self/uid_map", O_WRONLY);
        if (fd >= 0) (void)!write(fd, map, strlen(map)), close(fd);
        snprintf(map, sizeof map, "0 %u 1", (unsigned)gid);
        fd = open("/proc/self/gid_map", O_WRONLY);
        if (fd >= 0) (void)!write(fd, map, strlen(map)), close(fd);
    }
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
        snprintf(why, why_n, "making / private: %s", strerror(errno));
        return -1;
    }
    snprintf(dir, n, "/tmp/khub-kvfull-XXXXXX");
    if (!mkdtemp(dir)) {
        snprintf(why, why_n, "mkdtemp: %s", strerror(errno));
        return -1;
    }
    if (mount("tmpfs", dir, "tmpfs", 0, "size=64k") != 0) {
        snprintf(why, why_n, "mount tmpfs: %s", strerror(errno));
        rmdir(dir);
        return -1;
    }
    return 0;
}

/* A full disk: 1 layer, everything in the file (budget=1); each sequence's
 * region is 2 x 1024 rows of 32 bytes. Sequence 0 takes 32 KiB of the
 * 64 KiB; sequence 1 grows to 512 rows (32 KiB more) and then cannot grow
 * to 1024: KHUB_STATUS_IO naming the directory and errno, its 300 tokens
 * intact and its length unchanged. Giving sequence 0 back makes room. */
TEST_IMPL(offloaded_disk_full_loses_nothing)
{
    setup();
    char dir[64], why[256], opts[128];
    if (small_tmpfs(dir, sizeof dir, why, sizeof why) != 0)
        TEST_SKIP("cannot mount a small tmpfs here (%s)", why);
    snprintf(opts, sizeof opts, "budget=1,dir=%s", dir);
    khub_kv_cache *c = NULL;
    khub_status st = of_new(1, 1024, opts, &c);
    if (st) fprintf(stderr, "  %s\n", g_err);
    ASSERT_OK(st);
    ASSERT_OK(of_put(c, 0, 0, 0, 512));
    ASSERT_OK(of_put(c, 0, 1, 0, 300));
    ASSERT_EQ(of_check(c, 0, 1, 300), 1);
    char msg[256];
    snprintf(msg, sizeof msg,
             "offloaded_cache.write: the file tier under \"%s\" is full: allocating 32768 bytes "
             "for layer 0 seq 1 failed (No space left on device); nothing was written (free "
             "space there, choose another dir= or raise budget)",
             dir);
    ASSERT_FAILS(of_put(c, 0, 1, 300, 400), KHUB_STATUS_IO, msg);
    ASSERT_EQ(of_check(c, 0, 1, 300), 1); /* every value kept */
    int64_t ks[3], kst[3], vs[3], vst[3];
    khub_tensor kt = {.shape = ks, .strides = kst}, vt = {.shape = vs, .strides = vst};
    ASSERT_FAILS(kvm(OF)->view(g_desc.state, c, 0, 1, 301, &kt, &vt), KHUB_STATUS_INVALID_ARG,
                 "n (got 301, want 0..300"); /* and the length */
    ASSERT_OK(of_put(c, 0, 1, 300, 200));    /* within the 512 rows it has */
    ASSERT_OK(kvm(OF)->truncate(g_desc.state, c, 0, 0));
    ASSERT_OK(of_put(c, 0, 1, 500, 400));
    ASSERT_EQ(of_check(c, 0, 1, 900), 1);
    kvm(OF)->destroy(g_desc.state, c);
    ASSERT_EQ(umount2(dir, MNT_DETACH), 0);
    ASSERT_EQ(rmdir(dir), 0);
    ASSERT_NO_LEAKS();
}

#define TEST_LIST(X) \
    X(offloaded_budget_splits_the_tiers) \
    X(offloaded_checks_positions) \
    X(offloaded_hostile_options) \
    X(offloaded_out_of_memory) \
    X(offloaded_disk_full_loses_nothing)
TEST_MAIN(TEST_LIST)
