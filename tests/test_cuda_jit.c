/*
 * test_cuda_jit.c: load-time CUDA compilation (runtime/device/cuda_jit.c,
 * host->cuda_module_compile, issue 19 item 2) without a GPU or the CUDA
 * toolkit: the fake driver (tests/fake_cuda) and a fake NVRTC
 * (tests/fake_nvrtc, through KHUB_NVRTC_LIBRARY) that "compiles" at once
 * and writes a line per compile to KHUB_FAKE_NVRTC_LOG.
 *
 * Every load is its own child process, forked before any driver is
 * opened, as a fresh `khub run` would be: it loads the test plugin
 * khub-test/good with the files of a variant folder (this test's CUDA
 * sources) as its verified artifacts, asks the host to compile one, and
 * reports the status, the message, the warnings logged and the compiles
 * NVRTC saw. The parent owns the disk cache the children share.
 */
#include <dlfcn.h>
#include <dirent.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "plugin_artifacts.h"
#include "runtime_impl.h"
#include "runner.h"

/* ======================================================================== */
/* One load in a child                                                      */
/* ======================================================================== */

static char dir[200]; /* this case's folder: the variant's files, the cache, the log */
static const char *k_src = "extern \"C\" __global__ void k(float *x) { x[0] = HD; }\n";
static const char *k_tampered = "extern \"C\" __global__ void k() { /* changed */ }\n";

typedef struct load_spec {
    const char *cuda;          /* KHUB_FAKE_CUDA; "13000:90" when NULL */
    const char *nvrtc;         /* KHUB_NVRTC_LIBRARY; the fake when NULL */
    const char *nvrtc_version; /* KHUB_FAKE_NVRTC_VERSION; "13.0" when NULL */
    const char *cache;         /* KHUB_CUDA_CACHE; dir/cache when NULL */
    const char *jit;           /* KHUB_CUDA_JIT, unset when NULL */
    int device;
    const char *source; /* "k.cu" when NULL */
    const char *defines[4];
    size_t n_defines;
    bool no_artifacts; /* the plugin loaded from its bare file */
    bool tamper;       /* k.cu rewritten after it was verified */
    /* Instead of compiling directly: load kernels-src's rotary ('r') or
     * flash-attn2 ('f') glue with its source and a stand-in PTX for sm_90,
     * and run its op twice on device tensors of this shape. */
    char glue;
    int heads, kv_heads, head_dim, rotary_dim;
} load_spec;

typedef struct load_result {
    khub_status st;
    char msg[KHUB_ERROR_SIZE];
    char warn[2048];      /* the WARN lines logged, each ending in '\n' */
    int compiles;         /* lines NVRTC's log got */
    char launched[2][64]; /* the glue's two launches, by function name */
    char nvrtc_log[1024]; /* what NVRTC compiled, a line each */
} load_result;

static void log_warn(void *ud, khub_log_level level, const char *msg)
{
    load_result *r = ud;
    size_t len = strlen(r->warn);
    if (level == KHUB_LOG_WARN) snprintf(r->warn + len, sizeof r->warn - len, "%s\n", msg);
}

static void sha256_of(const char *path, char hex[65])
{
    char *b = NULL;
    size_t n = 0;
    ASSERT_OK(khub__read_file(path, 1 << 20, &b, &n, NULL, 0));
    ASSERT_OK(khub__sha256_hex(b, n, hex));
    free(b);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    ASSERT(f);
    fputs(text, f);
    fclose(f);
}

static khub_tensor device_tensor(khub_plugin *p, int nd, int64_t *shape)
{
    size_t n = 4;
    for (int i = 0; i < nd; i++) n *= (size_t)shape[i];
    uint64_t d = 0;
    void *zero = calloc(1, n);
    ASSERT(zero);
    ASSERT_OK(p->host.cuda_mem_alloc(p->host.host_ctx, 0, n, &d));
    ASSERT_OK(p->host.cuda_memcpy_htod(p->host.host_ctx, d, zero, n, NULL));
    free(zero);
    return (khub_tensor){.data = (void *)(uintptr_t)d,
                         .device = {KHUB_DEVICE_CUDA, 0},
                         .ndim = nd,
                         .dtype = KHUB_DTYPE_F32,
                         .shape = shape};
}

/* The glue's op, twice, on device tensors of the spec's shape; the names
 * of the two launches. */
static void run_glue(const load_spec *s, khub_plugin *p, load_result *r)
{
    long (*launches)(const char *) =
        (long (*)(const char *))dlsym(RTLD_DEFAULT, "khub_fake_cuda_stat");
    const char *(*launch_name)(long) =
        (const char *(*)(long))dlsym(RTLD_DEFAULT, "khub_fake_cuda_launch_name");
    ASSERT(launches && launch_name);
    int64_t qs[3] = {5, s->heads, s->head_dim}, ks[3] = {5, s->kv_heads, s->head_dim}, ps[1] = {5};
    khub_tensor q = device_tensor(p, 3, qs), k = device_tensor(p, 3, ks),
                v = device_tensor(p, 3, ks), o = device_tensor(p, 3, qs),
                pos = device_tensor(p, 1, ps);
    for (int call = 0; call < 2; call++) {
        khub__plugin_msg_clear();
        if (s->glue == 'r') {
            khub_rotary_args a = {KHUB_STRUCT_INIT(khub_rotary_args),
                                  .x = &q,
                                  .positions = pos.data,
                                  .style = KHUB_ROPE_NEOX,
                                  .theta = 10000.0f,
                                  .rotary_dim = s->rotary_dim};
            r->st = p->ops[0].run(p->desc.state, &a);
        } else {
            khub_attention_args a = {KHUB_STRUCT_INIT(khub_attention_args),
                                     .q = &q,
                                     .k = &k,
                                     .v = &v,
                                     .out = &o,
                                     .scale = 0.125f,
                                     .causal = 1};
            r->st = p->ops[0].run(p->desc.state, &a);
        }
        if (r->st != KHUB_STATUS_OK) {
            snprintf(r->msg, sizeof r->msg, "%s", khub__plugin_msg());
            return;
        }
        snprintf(r->launched[call], sizeof r->launched[call], "%s",
                 launch_name(launches("launches") - 1));
    }
}

/* The glue plugin with its variant's files: the real CUDA source from
 * kernels-src and a stand-in PTX for sm_90 (the fake driver loads any
 * image). */
static khub_plugin *load_glue(khub_runtime *rt, char glue)
{
    const char *name = glue == 'r' ? "rotary" : "flash_attn";
    char cu[300], ptx[300], so[300], sums[2][65], names[2][64];
    snprintf(cu, sizeof cu, "%s/kernels-src/%s/%s.cu", KHUB_SOURCE_DIR,
             glue == 'r' ? "rotary" : "flash-attn2", name);
    snprintf(ptx, sizeof ptx, "%s/%s.sm_90.ptx", dir, name);
    FILE *f = fopen(ptx, "wb");
    ASSERT(f);
    fwrite("// stand-in PTX\n", 1, 17, f); /* with its NUL, as khub build writes PTX */
    fclose(f);
    snprintf(names[0], sizeof names[0], "%s.cu", name);
    snprintf(names[1], sizeof names[1], "%s.sm_90.ptx", name);
    sha256_of(cu, sums[0]);
    sha256_of(ptx, sums[1]);
    khub__artifact_file files[2] = {{names[0], cu, sums[0]}, {names[1], ptx, sums[1]}};
    snprintf(so, sizeof so, "%s/kc_%s.so", KHUB_TEST_PLUGIN_DIR, name);
    char sum[65];
    sha256_of(so, sum);
    khub_plugin *p = NULL;
    ASSERT_OK(khub__plugin_load_verified(rt, so, sum, files, 2, &p));
    return p;
}

/* In the child: the environment, the fake driver, a runtime, the plugin
 * with dir/src/ as its variant's files, one compile (or a glue's op). */
static void child_load(const load_spec *s, load_result *r)
{
    char path[512], log[256];
    snprintf(path, sizeof path, "%s/cache", dir);
    setenv("KHUB_CUDA_CACHE", s->cache ? s->cache : path, 1);
    setenv("KHUB_FAKE_CUDA", s->cuda ? s->cuda : "13000:90", 1);
    setenv("KHUB_FAKE_CUDA_MEM", "1073741824", 1);
    setenv("KHUB_NVRTC_LIBRARY", s->nvrtc ? s->nvrtc : KHUB_BINARY_DIR "/fake-nvrtc/libnvrtc.so.13",
           1);
    setenv("KHUB_FAKE_NVRTC_VERSION", s->nvrtc_version ? s->nvrtc_version : "13.0", 1);
    snprintf(log, sizeof log, "%s/nvrtc.log", dir);
    setenv("KHUB_FAKE_NVRTC_LOG", log, 1);
    if (s->jit)
        setenv("KHUB_CUDA_JIT", s->jit, 1);
    else
        unsetenv("KHUB_CUDA_JIT");
    if (!dlopen(KHUB_BINARY_DIR "/fake-cuda/libcuda.so.1", RTLD_NOW | RTLD_GLOBAL))
        TEST_FAIL_("the fake driver: %s", dlerror());
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(NULL, &rt));
    khub_log_set(rt, log_warn, r);
    if (s->glue) {
        run_glue(s, load_glue(rt, s->glue), r);
        khub_runtime_free(rt);
        return;
    }
    /* The variant's files: every file of dir/src, digested now (as the hub
     * verifies them before the load). */
    static char names[8][64], paths[8][300], sums[8][65];
    khub__artifact_file files[8];
    size_t n = 0;
    char src[256];
    snprintf(src, sizeof src, "%s/src", dir);
    DIR *d = opendir(src);
    ASSERT(d);
    for (struct dirent *e; (e = readdir(d)) && n < 8;) {
        if (e->d_name[0] == '.') continue;
        snprintf(names[n], sizeof names[n], "%s", e->d_name);
        snprintf(paths[n], sizeof paths[n], "%s/%s", src, e->d_name);
        sha256_of(paths[n], sums[n]);
        files[n] = (khub__artifact_file){names[n], paths[n], sums[n]};
        n++;
    }
    closedir(d);
    const char *so = KHUB_TEST_PLUGIN_DIR "/good_v1.so";
    khub_plugin *p = NULL;
    char sum[65];
    sha256_of(so, sum);
    if (s->no_artifacts)
        ASSERT_OK(khub_plugin_load(rt, so, sum, &p));
    else
        ASSERT_OK(khub__plugin_load_verified(rt, so, sum, files, n, &p));
    if (s->tamper) {
        snprintf(path, sizeof path, "%s/k.cu", src);
        write_text(path, k_tampered);
    }
    khub_cuda_module *mod = NULL;
    khub__plugin_msg_clear();
    r->st = p->host.cuda_module_compile(p->host.host_ctx, s->device, s->source ? s->source : "k.cu",
                                        s->defines, s->n_defines, &mod);
    snprintf(r->msg, sizeof r->msg, "%s", r->st == KHUB_STATUS_OK ? "" : khub__plugin_msg());
    if (r->st == KHUB_STATUS_OK) {
        void *fn = NULL;
        ASSERT(mod != NULL);
        ASSERT_OK(p->host.cuda_module_function(p->host.host_ctx, mod, "k", &fn));
    } else {
        ASSERT(mod == NULL);
    }
    khub_runtime_free(rt);
}

/* The lines of NVRTC's log into r (the compiles, and their text). */
static void read_nvrtc_log(const char *path, load_result *r)
{
    FILE *f = fopen(path, "r");
    r->compiles = 0;
    r->nvrtc_log[0] = '\0';
    if (!f) return;
    size_t len = fread(r->nvrtc_log, 1, sizeof r->nvrtc_log - 1, f);
    r->nvrtc_log[len] = '\0';
    for (size_t i = 0; i < len; i++) r->compiles += r->nvrtc_log[i] == '\n';
    fclose(f);
}

/* One load in a child process; the compiles NVRTC saw in it. */
static load_result load(const load_spec *s)
{
    char log[256];
    snprintf(log, sizeof log, "%s/nvrtc.log", dir);
    unlink(log);
    int fds[2];
    ASSERT(pipe(fds) == 0);
    fflush(NULL);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        load_result r = {0};
        child_load(s, &r);
        ssize_t w = write(fds[1], &r, sizeof r);
        exit(w == (ssize_t)sizeof r ? 0 : 1); /* exit, not _exit: LeakSanitizer checks the load */
    }
    close(fds[1]);
    load_result r = {0};
    ssize_t got = read(fds[0], &r, sizeof r);
    close(fds[0]);
    int status = 0;
    ASSERT(waitpid(pid, &status, 0) == pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || got != (ssize_t)sizeof r)
        TEST_FAIL_("the load's child failed (status %d)", status);
    read_nvrtc_log(log, &r);
    return r;
}

/* ======================================================================== */
/* Fixtures                                                                 */
/* ======================================================================== */

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/khub-cuda-jit-%d", (int)getpid());
    char path[300];
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/src", dir);
    mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/src/k.cu", dir);
    write_text(path, k_src);
}

static void teardown(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ASSERT(system(cmd) == 0);
}

/* The cache's entries (NAME.cubin files) in names[] (up to 16); how many. */
static int entries(char names[16][128])
{
    char path[300];
    snprintf(path, sizeof path, "%s/cache", dir);
    DIR *d = opendir(path);
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        ASSERT(strstr(e->d_name, ".cubin") != NULL);
        if (n < 16) snprintf(names[n], 128, "%s/%s", path, e->d_name);
        n++;
    }
    closedir(d);
    return n;
}

static char *slurp(const char *path, size_t *n)
{
    char *b = NULL;
    ASSERT_OK(khub__read_file(path, 1 << 20, &b, n, NULL, 0));
    return b;
}

/* ======================================================================== */
/* The cases                                                                */
/* ======================================================================== */

TEST_IMPL(first_load_compiles_second_hits_the_disk_cache)
{
    setup();
    load_spec s = {.defines = {"HD=64", "GROUP=3"}, .n_defines = 2};
    load_result r = load(&s);
    ASSERT_OK(r.st);
    ASSERT_EQ(r.compiles, 1);
    ASSERT_STR_EQ(r.warn, "");
    char names[16][128];
    ASSERT_EQ(entries(names), 1);
    /* The entry: one header line, then what NVRTC gave, compiled for the
     * device's own architecture with the defines sorted. */
    size_t n = 0;
    char *e = slurp(names[0], &n);
    ASSERT(strncmp(e, "khub-cuda-jit 1 ", 16) == 0);
    const char *payload = strchr(e, '\n') + 1;
    ASSERT(memcmp(payload, "\177ELF fake-nvrtc k.cu src:", 25) == 0);
    ASSERT_CONTAINS(payload, " --gpu-architecture=sm_90 --std=c++17 -default-device -DGROUP=3 "
                             "-DHD=64");
    free(e);
    /* A second process: the disk cache, no compile. */
    r = load(&s);
    ASSERT_OK(r.st);
    ASSERT_EQ(r.compiles, 0);
    ASSERT_STR_EQ(r.warn, "");
    ASSERT_EQ(entries(names), 1);
    teardown();
}

TEST_IMPL(key_covers_source_arch_versions_and_defines)
{
    setup();
    char names[16][128];
    load_spec base = {.defines = {"HD=64", "GROUP=3"}, .n_defines = 2};
    ASSERT_EQ(load(&base).compiles, 1);
    /* the same defines in another order: the same module */
    load_spec s = {.defines = {"GROUP=3", "HD=64"}, .n_defines = 2};
    ASSERT_EQ(load(&s).compiles, 0);
    /* another define's value */
    s = (load_spec){.defines = {"HD=128", "GROUP=3"}, .n_defines = 2};
    ASSERT_EQ(load(&s).compiles, 1);
    ASSERT_EQ(load(&s).compiles, 0);
    /* another architecture: device 1 is sm_120 (device 0, sm_90, hits) */
    s = base, s.cuda = "13000:90,120", s.device = 1;
    ASSERT_EQ(load(&s).compiles, 1);
    s.device = 0;
    ASSERT_EQ(load(&s).compiles, 0);
    /* another driver version */
    s = base, s.cuda = "13010:90";
    ASSERT_EQ(load(&s).compiles, 1);
    ASSERT_EQ(load(&s).compiles, 0);
    /* another NVRTC version */
    s = base, s.nvrtc_version = "13.1";
    ASSERT_EQ(load(&s).compiles, 1);
    ASSERT_EQ(load(&s).compiles, 0);
    ASSERT_EQ(entries(names), 5);
    /* another source: the same name, other bytes */
    char path[300];
    snprintf(path, sizeof path, "%s/src/k.cu", dir);
    write_text(path, "extern \"C\" __global__ void k(float *x) { x[0] = HD + 1; }\n");
    ASSERT_EQ(load(&base).compiles, 1);
    ASSERT_EQ(load(&base).compiles, 0);
    ASSERT_EQ(entries(names), 6);
    teardown();
}

/* Rewrites the one cache entry with fn (which also says why it is now
 * unusable, as the warning will) and loads again: one compile, exactly that
 * warning, and a good entry after it. */
typedef void (*spoil_fn)(char *b, size_t *n, size_t hl, char *why, size_t why_n);

static void corrupt_case(spoil_fn fn)
{
    setup();
    load_spec s = {.defines = {"HD=64"}, .n_defines = 1};
    ASSERT_EQ(load(&s).compiles, 1);
    char names[16][128];
    ASSERT_EQ(entries(names), 1);
    size_t n = 0;
    char *b = slurp(names[0], &n);
    char *big = malloc(n + 64);
    ASSERT(big);
    memcpy(big, b, n);
    free(b);
    size_t hl = (size_t)(strchr(big, '\n') - big) + 1;
    char why[300], want[1024];
    fn(big, &n, hl, why, sizeof why);
    FILE *f = fopen(names[0], "wb");
    ASSERT(f);
    ASSERT_EQ(fwrite(big, 1, n, f), n);
    fclose(f);
    free(big);
    snprintf(want, sizeof want,
             "khub-test/good: the cached cubin %s is %s: not used; compiling k.cu for sm_90 "
             "again\n",
             names[0], why);
    load_result r = load(&s);
    ASSERT_OK(r.st);
    ASSERT_EQ(r.compiles, 1);
    ASSERT_STR_EQ(r.warn, want);
    r = load(&s); /* the entry was replaced by a good one */
    ASSERT_OK(r.st);
    ASSERT_EQ(r.compiles, 0);
    ASSERT_STR_EQ(r.warn, "");
    teardown();
}

/* A flipped payload byte: the payload's digest differs from the header's
 * ("khub-cuda-jit 1 " KEY " " SUM " " SIZE). */
static void flip_a_byte(char *b, size_t *n, size_t hl, char *why, size_t why_n)
{
    b[*n - 2] ^= 0x20;
    char calc[65];
    ASSERT_OK(khub__sha256_hex(b + hl, *n - hl, calc));
    snprintf(why, why_n, "corrupt: its payload's SHA-256 is %.12s, the header says %.12s", calc,
             b + 16 + 65);
}

static void cut_ten_bytes(char *b, size_t *n, size_t hl, char *why, size_t why_n)
{
    (void)b;
    snprintf(why, why_n, "truncated or padded: %zu payload bytes, the header says %zu",
             *n - hl - 10, *n - hl);
    *n -= 10;
}

static void garbage(char *b, size_t *n, size_t hl, char *why, size_t why_n)
{
    (void)hl;
    *n = (size_t)snprintf(b, 64, "hello\n");
    snprintf(why, why_n, "not a khub-cuda-jit 1 entry");
}

/* Another key's entry under this key's name. */
static void other_key(char *b, size_t *n, size_t hl, char *why, size_t why_n)
{
    (void)n, (void)hl;
    memcpy(b + 16, "0123456789ab", 12);
    snprintf(why, why_n, "made for another key (0123456789ab)");
}

TEST_IMPL(corrupt_entry_is_recompiled_with_a_warning) { corrupt_case(flip_a_byte); }
TEST_IMPL(truncated_entry_is_recompiled) { corrupt_case(cut_ten_bytes); }
TEST_IMPL(garbage_entry_is_recompiled) { corrupt_case(garbage); }
TEST_IMPL(entry_of_another_key_is_recompiled) { corrupt_case(other_key); }

TEST_IMPL(without_nvrtc_the_exact_error)
{
    setup();
    load_spec s = {.nvrtc = "/nonexistent/libnvrtc.so.13"};
    load_result r = load(&s);
    ASSERT_STATUS(r.st, KHUB_STATUS_NO_NVRTC);
    ASSERT_STR_EQ(r.msg, "khub-test/good: load-time compilation of k.cu for sm_90 needs NVRTC: "
                         "NVRTC not found (/nonexistent/libnvrtc.so.13: cannot open shared "
                         "object file: No such file or directory); install the CUDA toolkit's "
                         "NVRTC or set KHUB_NVRTC_LIBRARY to its libnvrtc.so");
    ASSERT_EQ(r.compiles, 0);
    char line[KHUB_ERROR_SIZE + 2]; /* the host also logs it: plugins usually fall back */
    snprintf(line, sizeof line, "%s\n", r.msg);
    ASSERT_STR_EQ(r.warn, line);
    /* a library that is not NVRTC (the fake driver) */
    s.nvrtc = KHUB_BINARY_DIR "/fake-cuda/libcuda.so.1";
    r = load(&s);
    ASSERT_STATUS(r.st, KHUB_STATUS_NO_NVRTC);
    ASSERT_STR_EQ(r.msg, "khub-test/good: load-time compilation of k.cu for sm_90 needs NVRTC: "
                         "NVRTC " KHUB_BINARY_DIR "/fake-cuda/libcuda.so.1 lacks nvrtcVersion; "
                         "use the CUDA toolkit's");
    char names[16][128];
    ASSERT_EQ(entries(names), 0);
    teardown();
}

TEST_IMPL(unwritable_cache_still_compiles)
{
    setup();
    char file[300], cache[320];
    snprintf(file, sizeof file, "%s/afile", dir);
    write_text(file, "not a folder\n");
    snprintf(cache, sizeof cache, "%s/cache", file);
    load_spec s = {.cache = cache, .defines = {"HD=64"}, .n_defines = 1};
    char want[1024];
    snprintf(want, sizeof want,
             "khub-test/good: the CUDA cache is not writable (cannot make %s: Not a directory): "
             "k.cu for sm_90 compiled without caching\n",
             cache);
    for (int i = 0; i < 2; i++) { /* no cache: a compile every time */
        load_result r = load(&s);
        ASSERT_OK(r.st);
        ASSERT_EQ(r.compiles, 1);
        ASSERT_STR_EQ(r.warn, want);
    }
    teardown();
}

TEST_IMPL(refusals_name_what_is_wrong)
{
    setup();
    char path[300];
    snprintf(path, sizeof path, "%s/src/bad.cu", dir);
    write_text(path, "#error not today\n");
    /* not a file of the variant */
    load_spec s = {.source = "nope.cu"};
    load_result r = load(&s);
    ASSERT_STATUS(r.st, KHUB_STATUS_NOT_FOUND);
    ASSERT_STR_EQ(r.msg, "khub-test/good: cuda_module_compile: artifact nope.cu is not a file of "
                         "the plugin's verified variant");
    /* a plugin without a variant */
    s = (load_spec){.no_artifacts = true};
    r = load(&s);
    ASSERT_STATUS(r.st, KHUB_STATUS_NOT_FOUND);
    ASSERT_STR_EQ(r.msg, "khub-test/good: cuda_module_compile k.cu: the plugin was loaded without "
                         "its variant's files (the source must be one of them)");
    /* a source changed after it was verified */
    s = (load_spec){.tamper = true};
    r = load(&s);
    ASSERT_STATUS(r.st, KHUB_STATUS_DIGEST_MISMATCH);
    char was[65], now[65], want[1024];
    ASSERT_OK(khub__sha256_hex(k_src, strlen(k_src), was));
    ASSERT_OK(khub__sha256_hex(k_tampered, strlen(k_tampered), now));
    snprintf(want, sizeof want,
             "khub-test/good: cuda_module_compile: artifact k.cu: %s/src/k.cu has SHA-256 %s, it "
             "was verified as %s; the cache changed after verification, fetch the kernel again",
             dir, now, was);
    ASSERT_STR_EQ(r.msg, want);
    /* a define that is not NAME=VALUE */
    s = (load_spec){.defines = {"HD=64", "X=1 -include /etc/passwd"}, .n_defines = 2};
    r = load(&s);
    ASSERT_STATUS(r.st, KHUB_STATUS_INVALID_ARG);
    ASSERT_STR_EQ(r.msg, "khub-test/good: cuda_module_compile k.cu: define \"X=1 -include "
                         "/etc/passwd\" is not NAME or NAME=VALUE (an identifier; letters, digits "
                         "and _ . + -; at most 64 characters each)");
    /* turned off */
    s = (load_spec){.jit = "0"};
    r = load(&s);
    ASSERT_STATUS(r.st, KHUB_STATUS_UNSUPPORTED);
    ASSERT_STR_EQ(r.msg, "khub-test/good: load-time compilation of k.cu is off (KHUB_CUDA_JIT=0)");
    /* a compile error: NVRTC's log, on one line */
    s = (load_spec){.source = "bad.cu"};
    r = load(&s);
    ASSERT_STATUS(r.st, KHUB_STATUS_ERROR);
    ASSERT_STR_EQ(r.msg, "khub-test/good: load-time compilation of bad.cu for sm_90 (no defines) "
                         "failed: bad.cu: NVRTC: bad.cu(1): error: #error directive: fake "
                         "failure");
    ASSERT_EQ(r.compiles, 1);
    char names[16][128];
    ASSERT_EQ(entries(names), 0);
    teardown();
}

/* ======================================================================== */
/* The glues of kernels-src: specialised at load, the build's PTX otherwise */
/* ======================================================================== */

#define NO_NVRTC_MSG(who, src, sm) \
    who ": load-time compilation of " src " for " sm " needs NVRTC: NVRTC not found " \
        "(/nonexistent/libnvrtc.so.13: cannot open shared object file: No such file or " \
        "directory); install the CUDA toolkit's NVRTC or set KHUB_NVRTC_LIBRARY to its " \
        "libnvrtc.so\n"

static void assert_launched(const load_result *r, const char *fn)
{
    ASSERT_OK(r->st);
    ASSERT_STR_EQ(r->launched[0], fn);
    ASSERT_STR_EQ(r->launched[1], fn);
}

TEST_IMPL(rotary_specialises_on_the_model_shape)
{
    setup();
    load_spec s = {.glue = 'r', .heads = 9, .kv_heads = 3, .head_dim = 64};
    load_result r = load(&s);
    assert_launched(&r, "khub_rope_f32_spec");
    ASSERT_STR_EQ(r.nvrtc_log, "compile rotary.cu --gpu-architecture=sm_90 --std=c++17 "
                               "-default-device -DKHUB_ROPE_HALF=32 -DKHUB_ROPE_HEAD_DIM=64 "
                               "-DKHUB_ROPE_SCALING=0 -DKHUB_ROPE_STYLE=1\n");
    ASSERT_STR_EQ(r.warn, "");
    /* the next process: from the disk cache */
    r = load(&s);
    assert_launched(&r, "khub_rope_f32_spec");
    ASSERT_EQ(r.compiles, 0);
    /* a partial rotary_dim: its own module (the build's generic kernel otherwise) */
    s.rotary_dim = 48;
    r = load(&s);
    assert_launched(&r, "khub_rope_f32_spec");
    ASSERT_CONTAINS(r.nvrtc_log, " -DKHUB_ROPE_HALF=24 -DKHUB_ROPE_HEAD_DIM=64 ");
    ASSERT_EQ(r.compiles, 1);
    /* turned off: the build's kernels, no compile, no warning */
    s.rotary_dim = 0, s.jit = "0";
    r = load(&s);
    assert_launched(&r, "khub_rope_f32_half32");
    ASSERT_EQ(r.compiles, 0);
    ASSERT_STR_EQ(r.warn, "");
    /* no NVRTC: the build's kernels, and a warning saying why */
    s.jit = NULL, s.nvrtc = "/nonexistent/libnvrtc.so.13";
    r = load(&s);
    assert_launched(&r, "khub_rope_f32_half32");
    ASSERT_STR_EQ(r.warn, NO_NVRTC_MSG("kernels-community/rotary", "rotary.cu", "sm_90"));
    teardown();
}

TEST_IMPL(rotary_on_a_newer_gpu_compiles_for_it)
{
    setup();
    /* sm_120, newer than every capability the variant lists (90 at most):
     * the module for sm_120 itself, then the shape's */
    load_spec s = {.glue = 'r', .heads = 9, .kv_heads = 3, .head_dim = 64, .cuda = "13000:120"};
    load_result r = load(&s);
    assert_launched(&r, "khub_rope_f32_spec");
    ASSERT_STR_EQ(r.nvrtc_log,
                  "compile rotary.cu --gpu-architecture=sm_120 --std=c++17 -default-device\n"
                  "compile rotary.cu --gpu-architecture=sm_120 --std=c++17 -default-device "
                  "-DKHUB_ROPE_HALF=32 -DKHUB_ROPE_HEAD_DIM=64 -DKHUB_ROPE_SCALING=0 "
                  "-DKHUB_ROPE_STYLE=1\n");
    /* turned off: the newest PTX of the build (the driver compiles it forward) */
    s.jit = "0";
    r = load(&s);
    assert_launched(&r, "khub_rope_f32_half32");
    ASSERT_EQ(r.compiles, 0);
    /* no NVRTC: the same, warned twice (the module, the shape) */
    s.jit = NULL, s.nvrtc = "/nonexistent/libnvrtc.so.13";
    r = load(&s);
    assert_launched(&r, "khub_rope_f32_half32");
    ASSERT_STR_EQ(r.warn, NO_NVRTC_MSG("kernels-community/rotary", "rotary.cu", "sm_120")
                              NO_NVRTC_MSG("kernels-community/rotary", "rotary.cu", "sm_120"));
    teardown();
}

TEST_IMPL(flash_attn2_specialises_on_the_model_shape)
{
    setup();
    /* 5 rows over 5 keys: split-K (test_fa2_cuda checks the tiles too) */
    load_spec s = {.glue = 'f', .heads = 9, .kv_heads = 3, .head_dim = 64};
    load_result r = load(&s);
    assert_launched(&r, "khub_fa2_decode_spec");
    ASSERT_STR_EQ(r.nvrtc_log, "compile flash_attn.cu --gpu-architecture=sm_90 --std=c++17 "
                               "-default-device -DKHUB_FA2_GROUP=3 -DKHUB_FA2_HD=64 "
                               "-DKHUB_FA2_HEADS=9\n");
    ASSERT_STR_EQ(r.warn, "");
    r = load(&s);
    assert_launched(&r, "khub_fa2_decode_spec");
    ASSERT_EQ(r.compiles, 0);
    /* another model's heads: another module */
    s.heads = 8, s.kv_heads = 2, s.head_dim = 128;
    r = load(&s);
    assert_launched(&r, "khub_fa2_decode_spec");
    ASSERT_CONTAINS(r.nvrtc_log, " -DKHUB_FA2_GROUP=4 -DKHUB_FA2_HD=128 -DKHUB_FA2_HEADS=8\n");
    ASSERT_EQ(r.compiles, 1);
    s.jit = "0";
    r = load(&s);
    assert_launched(&r, "khub_fa2_decode_hd128");
    ASSERT_EQ(r.compiles, 0);
    s.jit = NULL, s.nvrtc = "/nonexistent/libnvrtc.so.13";
    s.heads = 9, s.kv_heads = 3, s.head_dim = 64;
    r = load(&s);
    assert_launched(&r, "khub_fa2_decode_hd64");
    ASSERT_STR_EQ(r.warn, NO_NVRTC_MSG("kernels-community/flash-attn2", "flash_attn.cu", "sm_90"));
    teardown();
}

#define TEST_LIST(X) \
    X(first_load_compiles_second_hits_the_disk_cache) \
    X(key_covers_source_arch_versions_and_defines) \
    X(corrupt_entry_is_recompiled_with_a_warning) \
    X(truncated_entry_is_recompiled) \
    X(garbage_entry_is_recompiled) \
    X(entry_of_another_key_is_recompiled) \
    X(without_nvrtc_the_exact_error) \
    X(unwritable_cache_still_compiles) \
    X(refusals_name_what_is_wrong) \
    X(rotary_specialises_on_the_model_shape) \
    X(rotary_on_a_newer_gpu_compiles_for_it) \
    X(flash_attn2_specialises_on_the_model_shape)
TEST_MAIN(TEST_LIST)
