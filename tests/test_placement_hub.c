/*
 * test_placement_hub.c: Hub kernels for a model placed on a CUDA device
 * (khub_model_load_hub with khub_model_opts.device = cuda:N; issue 19 items
 * 1 and 4), on the fake driver (tests/fake_cuda) and an in-process hub.
 *
 * The kernel is acme/act, one silu_and_mul op (tests/plugins/hub_act.c):
 * at C1 (v1, main) a CPU variant and a CUDA 12.8 variant whose PTX is for
 * sm_80 and up, at C2 (v2) the CPU variant only. The runtime also holds
 * the built-in CPU plugins and khub-test/cuda-all, which has a CUDA op for
 * every role, silu_and_mul too, and was loaded first: only the role's
 * preference can make acme/act's CUDA op serve it. Checked: the CUDA
 * variant is loaded and serves the role on the device, the report naming
 * the variant and why; on a GPU the variant's PTX does not cover (sm_75),
 * and for the kernel without a CUDA variant, the CPU variant serves the
 * role on the CPU with its copies named, and strict refuses it (the hub's
 * refusal, and the placement's); the variant is judged for the GPU the
 * model is placed on, not any GPU of the host; a khub.lock pins the CUDA
 * variant's digests and a changed byte of its cached plugin is refused.
 * Kernel swaps: the CUDA variant swapped in, refusals that change nothing,
 * what a prepare loaded unloaded when its swap fails or is released, and
 * by the switch that swaps it out: swaps back and forth between two Hub
 * kernels (and as many model server reloads) keep the plugin count, while
 * a plugin the caller loaded stays. A freed model's bindings go with it:
 * the kernel its load fetched can be unloaded, one a swap loaded is.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* device_fixture.h and hub_fixture.h both name a "fixture" and a "load";
 * this test uses the hub's and the device file's fake driver and model. */
#define fixture dev_fixture
#define load    dev_load
#define unload  dev_unload
#include "device_fixture.h"
#undef fixture
#undef load
#undef unload
#include "hub_fixture.h"
#include "kernel_fetch.h"
#include "khub/khub_kernels.h"
#include "khub/khub_model_server.h"
#include "lockfile.h"

#define CUDA_VARIANT "khub1-cu128-x86_64-linux"
#define CPU_VARIANT  "khub1-cpu-x86_64-linux"

/* Publishes test plugin plugin (a tests/plugins build) as act.so of
 * acme/act's variant at commit, with the extra file (a stand-in PTX) when
 * not NULL. */
static void publish(fixture *fx, const char *commit, const char *variant, const char *plugin,
                    const char *extra)
{
    char path[1024], rel[512], sha[65], xsha[65] = "", meta[2048];
    size_t n = 0;
    unsigned char *so = tp_read(TP(plugin), &n);
    snprintf(path, sizeof path, "%s/acme/act/commits/%s/build/%s/act.so", fx->repos, commit,
             variant);
    fx_write(path, so, n);
    ASSERT_OK(khub__sha256_hex(so, n, sha));
    free(so);
    if (extra) {
        const char ptx[] = ".version 7.0\n.target sm_80\n";
        snprintf(path, sizeof path, "%s/acme/act/commits/%s/build/%s/%s", fx->repos, commit,
                 variant, extra);
        fx_write(path, ptx, sizeof ptx - 1);
        ASSERT_OK(khub__sha256_hex(ptx, sizeof ptx - 1, xsha));
    }
    bool cuda = strstr(variant, "-cu1") != NULL;
    char files[400], arts[200] = "";
    snprintf(files, sizeof files, "\"act.so\":\"%s\"%s%s%s%s%s", sha, extra ? ",\"" : "",
             extra ? extra : "", extra ? "\":\"" : "", xsha, extra ? "\"" : "");
    if (extra)
        snprintf(arts, sizeof arts, "\"artifacts\":[{\"file\":\"%s\",\"kind\":\"ptx\",\"sm\":80}],",
                 extra);
    snprintf(meta, sizeof meta,
             "{\"format\":1,\"name\":\"acme/act\",\"version\":\"1.0.0\",\"major\":1,"
             "\"variant\":\"%s\",\"abi\":{\"major\":%d,\"minor\":%d},"
             "\"backend\":{\"type\":\"%s\",\"archs\":[\"x86_64\"]},"
             "\"plugins\":[{\"file\":\"act.so\",\"level\":\"generic\",\"cpu_features\":[]}],"
             "%s\"files\":{%s},"
             "\"provenance\":{\"source_commit\":\"unknown\",\"dirty\":false}}",
             variant, KHUB_ABI_MAJOR, KHUB_ABI_MINOR, cuda ? "cuda" : "cpu", arts, files);
    snprintf(rel, sizeof rel, "acme/act/commits/%s/build/%s/metadata.json", commit, variant);
    fx_writef(fx, rel, meta);
}

typedef struct env {
    fixture fx;
    khub_hub *hub;
    khub_runtime *rt;
    khub_model *m;
    const char *dir; /* the tiny model */
    char policy[600], map[600], lock[600];
    khub_model_kernels k;
    khub_model_opts o;
    khub_model_kernels_report rep;
} env;

/* The hub, the runtime (built-in plugins, then khub-test/cuda-all) and
 * the options for device (a fake driver must be loaded first). */
static void env_init(env *e, khub_device device)
{
    if (strcmp(fx_arch(), "x86_64") != 0) TEST_SKIP("the published variants are x86_64 builds");
    memset(e, 0, sizeof *e);
    fx_init(&e->fx, NULL, 0);
    fx_writef(&e->fx, "acme/act/refs.json",
              "{\"branches\":{\"main\":\"" C1 "\",\"v1\":\"" C1 "\",\"v2\":\"" C2 "\"},"
              "\"tags\":{}}");
    publish(&e->fx, C1, CPU_VARIANT, "hub_act_cpu", NULL);
    publish(&e->fx, C1, CUDA_VARIANT, "hub_act_cuda", "act.sm_80.ptx");
    publish(&e->fx, C2, CPU_VARIANT, "hub_act_cpu", NULL);
    e->hub = fx_hub(&e->fx, 0, NULL);
    snprintf(e->policy, sizeof e->policy, "%s/policy.json", e->fx.root);
    const char *policy = "{\"version\":1,\"publishers\":{}}"; /* acme is unsigned: opt-in */
    fx_write(e->policy, policy, strlen(policy));
    snprintf(e->map, sizeof e->map, "%s/khub.json", e->fx.root);
    snprintf(e->lock, sizeof e->lock, "%s/khub.lock", e->fx.root);
    e->rt = tp_runtime(1);
    ASSERT_OK(khub_plugin_load_builtin(e->rt));
    tp_load(e->rt, "cuda_all");
    e->dir = tiny_model();
    e->k = (khub_model_kernels){KHUB_STRUCT_INIT(khub_model_kernels), .policy_path = e->policy,
                                .allow_unsigned = 1};
    e->o = (khub_model_opts){KHUB_APP_INIT(khub_model_opts), .device = device, .max_context = 64,
                             .max_seqs = 2, .max_batch = 16};
}

static khub_status env_load(env *e)
{
    khub_model_free(e->m);
    e->m = NULL;
    return khub_model_load_hub(e->hub, e->rt, e->dir, &e->o, &e->k, &e->m, &e->rep);
}

static void env_done(env *e)
{
    khub_model_free(e->m);
    khub_runtime_free(e->rt);
    tiny_rm(e->dir);
    khub_hub_free(e->hub);
    fx_done(&e->fx);
}

/* Whether the fake driver launched kernel name since it was loaded. */
static bool launched(const char *name)
{
    launch_log();
    for (long i = 0; i < stat_of("launches"); i++)
        if (!strcmp(launch_name(i), name)) return true;
    return false;
}

/* One forward pass of two tokens, which must succeed. */
static void forward(khub_model *m)
{
    float logits[VOCAB];
    const int32_t ids[2] = {1, 2};
    ASSERT_OK(khub_model_logits(m, ids, 2, logits));
}

/* What --explain says of the activation when the CPU variant serves it. */
#define CPU_LINE(COMMIT, WHY) \
    "  silu_and_mul[f32]: cpu fallback, acme/act 1.0.0 :: silu_and_mul (no CUDA kernel: " \
    "acme/act@" COMMIT " has no CUDA variant that runs on cuda:0 (" WHY "); its CPU " \
    "variant " CPU_VARIANT " serves activation on the CPU)\n" \
    "    copies per token each time it runs: device->host 1024 B (gate, up), host->device 512 " \
    "B (act)\n"

/* ======================================================================== */
/* The CUDA variant serves the role on the device                           */
/* ======================================================================== */

TEST_IMPL(hub_cuda_variant_serves_the_device)
{
    fake("12080:90", "100000000", NULL);
    env e;
    env_init(&e, cuda0);
    e.k.act = "acme/act@v1";
    ASSERT_OK(env_load(&e));
    ASSERT_CONTAINS(e.rep.text,
                    "device: cuda:0 (sm_90): Hub kernels load their CUDA variant for it\n");
    ASSERT_CONTAINS(e.rep.text,
                    "activation: acme/act@v1 -> acme/act commit 111111111111 variant " CUDA_VARIANT
                    " for cuda:0 (accept: CUDA 12.8 build, driver 12.8, GPU 0 sm_90) file act.so; "
                    "unsigned, accepted by opt-in");
    const char *x = khub_model_explain(e.m);
    ASSERT_CONTAINS(x, "  silu_and_mul[f32]: cuda:0, acme/act 1.0.0 :: silu_and_mul\n");
    ASSERT_CONTAINS(x, "  rms_norm[f32]: cuda:0, khub-test/cuda-all 1.0.0 :: rms_norm\n");
    ASSERT_CONTAINS(x, ": 11 roles on the device, 0 on the CPU\n");
    /* the CPU binding is the registry's best CPU op (it runs nothing here) */
    ASSERT(strstr(x, "silu_and_mul[f32]: acme/act") == NULL);
    forward(e.m);
    ASSERT(launched("khub_hub_act"));
    env_done(&e);
}

/* ======================================================================== */
/* No CUDA variant for the device: the CPU variant, on the CPU              */
/* ======================================================================== */

/* The CUDA variant's PTX is for sm_80: on an sm_75 GPU the role runs the
 * kernel's CPU variant on the CPU, the copies named, and the forward pass
 * computes through it. */
TEST_IMPL(hub_no_ptx_for_the_gpu_runs_the_cpu_variant)
{
    fake("12080:75", "100000000", NULL);
    env e;
    env_init(&e, cuda0);
    e.k.act = "acme/act@v1";
    ASSERT_OK(env_load(&e));
    ASSERT_CONTAINS(
        e.rep.text,
        "activation: acme/act@v1 -> acme/act commit 111111111111 variant " CPU_VARIANT
        " on the CPU (acme/act@111111111111 has no CUDA variant that runs on cuda:0 (" CUDA_VARIANT
        ": reject: no PTX or cubin for GPU 0 sm_75)) file act.so");
    ASSERT_CONTAINS(khub_model_explain(e.m), CPU_LINE("111111111111", CUDA_VARIANT
                                                      ": reject: no PTX or cubin for GPU 0 sm_75"));
    ASSERT_CONTAINS(khub_model_explain(e.m), ": 10 roles on the device, 1 on the CPU\n");
    forward(e.m);
    ASSERT(!launched("khub_hub_act"));
    env_done(&e);
}

/* Two GPUs, sm_75 and sm_90: the variant is judged for the GPU the model
 * is placed on. */
TEST_IMPL(hub_variant_judged_for_the_placed_gpu)
{
    fake("12080:75,90", "100000000", NULL);
    env e;
    env_init(&e, (khub_device){KHUB_DEVICE_CUDA, 1});
    e.k.act = "acme/act@v1";
    ASSERT_OK(env_load(&e));
    ASSERT_CONTAINS(e.rep.text, "device: cuda:1 (sm_90)");
    ASSERT_CONTAINS(e.rep.text, "variant " CUDA_VARIANT " for cuda:1 (accept: CUDA 12.8 build, "
                                "driver 12.8, GPU 1 sm_90)");
    ASSERT_CONTAINS(khub_model_explain(e.m), "silu_and_mul[f32]: cuda:1, acme/act 1.0.0");
    e.o.device = cuda0;
    ASSERT_OK(env_load(&e));
    ASSERT_CONTAINS(e.rep.text, "device: cuda:0 (sm_75)");
    ASSERT_CONTAINS(e.rep.text, "has no CUDA variant that runs on cuda:0 (" CUDA_VARIANT
                                ": reject: no PTX or cubin for GPU 0 sm_75)");
    ASSERT_CONTAINS(khub_model_explain(e.m), "silu_and_mul[f32]: cpu fallback, acme/act 1.0.0");
    env_done(&e);
}

/* A kernel with a CPU variant only (v2): the CPU variant serves the role on
 * the CPU; strict refuses it in the hub (khub_model_kernels.strict: before
 * anything is fetched) and in the placement (khub_model_opts.strict). */
TEST_IMPL(hub_cpu_only_kernel_falls_back_or_strict_refuses)
{
    fake("12080:90", "100000000", NULL);
    env e;
    env_init(&e, cuda0);
    e.k.act = "acme/act@v2";
    ASSERT_OK(env_load(&e));
    ASSERT_CONTAINS(khub_model_explain(e.m), CPU_LINE("222222222222", "it has no CUDA variant"));
    forward(e.m);
    e.k.strict = 1;
    ASSERT_STATUS(env_load(&e), KHUB_STATUS_NO_VARIANT);
    ASSERT(e.m == NULL);
    ASSERT_STR_EQ(khub_runtime_errmsg(e.rt),
                  "activation kernel acme/act@v2: acme/act@222222222222: no CUDA variant runs on "
                  "cuda:0 (strict): it has no CUDA variant");
    e.k.strict = 0;
    e.o.strict = 1;
    ASSERT_STATUS(env_load(&e), KHUB_STATUS_NO_KERNEL);
    ASSERT(e.m == NULL);
    ASSERT_CONTAINS(khub_runtime_errmsg(e.rt),
                    ": cuda:0: strict: role silu_and_mul[f32] has no CUDA kernel (acme/act@"
                    "222222222222 has no CUDA variant that runs on cuda:0 (it has no CUDA "
                    "variant); its CPU variant " CPU_VARIANT " serves activation on the CPU); "
                    "load one that serves it, or drop strict to run it on the CPU");
    env_done(&e);
}

/* ======================================================================== */
/* The mapping and the lock                                                 */
/* ======================================================================== */

/* khub.json's cuda rule for the device's capability is the one used; a
 * khub.lock next to it pins the CUDA variant's digests (loaded with its
 * hashes re-checked), and one changed byte of the cached CUDA plugin is
 * refused naming the file and the lock. */
TEST_IMPL(hub_locked_cuda_variant_and_tamper)
{
    fake("12080:90", "100000000", NULL);
    env e;
    env_init(&e, cuda0);
    const char *map = "{\"format\":1,\"roles\":{\"activation\":{"
                      "\"cpu\":{\"repo\":\"acme/act\",\"version\":2},"
                      "\"cuda\":[{\"repo\":\"acme/act\",\"version\":1,\"capability\":[80,90]}]}}}";
    fx_write(e.map, map, strlen(map));
    khub_lock *lock = NULL;
    khub_lock_entry ent;
    char err[KHUB_ERROR_SIZE];
    khub_hub_id id = fx_id("acme/act@version=1");
    ASSERT_OK(khub__lock_new(&lock));
    ASSERT_OK(khub__kernel_lock_entry(e.hub, &id, NULL, &ent));
    ASSERT_STR_EQ(ent.commit, C1);
    const khub_lock_variant *lv = khub__lock_variant(&ent, CUDA_VARIANT);
    ASSERT(lv != NULL);
    khub__lock_put(lock, &ent);
    ASSERT_OK(khub__lock_save(lock, e.lock, err, sizeof err));
    khub__lock_free(lock);
    e.k.mapping_path = e.map;
    ASSERT_OK(env_load(&e));
    ASSERT_CONTAINS(e.rep.text, "lock: ");
    ASSERT_CONTAINS(e.rep.text, "activation: acme/act@version=1 -> acme/act commit 111111111111 "
                                "variant " CUDA_VARIANT " for cuda:0 (");
    ASSERT_CONTAINS(e.rep.text, "file act.so (locked, hashes re-checked)");
    ASSERT_CONTAINS(khub_model_explain(e.m), "silu_and_mul[f32]: cuda:0, acme/act 1.0.0");
    khub_model_free(e.m);
    e.m = NULL;
    khub_runtime_free(e.rt);

    /* one changed byte of the cached CUDA plugin */
    char so[1024];
    snprintf(so, sizeof so, "%s/kernels--acme--act/snapshots/" C1 "/build/" CUDA_VARIANT "/act.so",
             e.fx.cache);
    FILE *f = fopen(so, "r+b");
    ASSERT(f != NULL);
    fseek(f, 200, SEEK_SET);
    int c = fgetc(f);
    fseek(f, 200, SEEK_SET);
    fputc(c ^ 0x55, f);
    fclose(f);
    e.rt = tp_runtime(1);
    ASSERT_OK(khub_plugin_load_builtin(e.rt));
    tp_load(e.rt, "cuda_all");
    ASSERT_STATUS(env_load(&e), KHUB_STATUS_LOCK_MISMATCH);
    ASSERT(e.m == NULL);
    ASSERT_CONTAINS(khub_runtime_errmsg(e.rt), "activation kernel acme/act@version=1: ");
    ASSERT_CONTAINS(khub_runtime_errmsg(e.rt), "act.so has SHA-256");
    ASSERT_CONTAINS(khub_runtime_errmsg(e.rt), "khub.lock says");
    env_done(&e);
}

/* ======================================================================== */
/* Kernel swaps on a placed model (khub_model_kernel_swap_prepare)           */
/* ======================================================================== */

/* The swap's policy: the test's trust policy, acme's unsigned builds
 * accepted. */
static khub_model_kernels swap_policy(const env *e)
{
    return (khub_model_kernels){KHUB_APP_INIT(khub_model_kernels), .policy_path = e->policy,
                                .allow_unsigned = 1};
}

/* The loaded plugin called id. */
static khub_plugin *plugin_named(khub_runtime *rt, const char *id)
{
    for (size_t i = 0; i < khub_plugin_count(rt); i++)
        if (!strcmp(khub_plugin_id(khub_plugin_at(rt, i)), id))
            return (khub_plugin *)khub_plugin_at(rt, i);
    return NULL;
}

/* The retired binding of role serving kernel, as khub_model_binding_get
 * lists it; false when there is none. */
static bool retired_binding(khub_model *m, const char *role, const char *kernel,
                            khub_model_binding *out)
{
    for (size_t i = 0;; i++) {
        khub_model_binding b = {KHUB_APP_INIT(khub_model_binding)};
        if (khub_model_binding_get(m, i, &b) != KHUB_STATUS_OK) return false;
        if (b.retired && !strcmp(b.role, role) && !strcmp(b.kernel, kernel)) {
            *out = b;
            return true;
        }
    }
}

#define UNLOAD_BUSY \
    "unload acme/act 1.0.0: 1 binding(s) of loaded models use it; free those models or swap it " \
    "out of them (khub_model_kernel_swap), or reload it instead"

/* A swap to a Hub ID on a placed model loads the kernel's CUDA variant for
 * the device (the load's choice, named in sw.resolved) and its CUDA op
 * serves the role; khub_kernel_swap_prepare, which knows no model, still
 * resolves the CPU variant. The old plugin is BUSY while it serves, and
 * unloads once a swap has replaced it, its retired binding still listed. */
TEST_IMPL(hub_swap_loads_the_cuda_variant)
{
    fake("12080:90", "100000000", NULL);
    env e;
    env_init(&e, cuda0);
    ASSERT_OK(env_load(&e));
    ASSERT_CONTAINS(khub_model_explain(e.m),
                    "  silu_and_mul[f32]: cuda:0, khub-test/cuda-all 1.0.0 :: silu_and_mul\n");
    khub_model_kernels pol = swap_policy(&e);
    khub_kernel_swap sw = {KHUB_APP_INIT(khub_kernel_swap)};
    ASSERT_OK(khub_kernel_swap_prepare(e.hub, e.rt, KHUB_KERNEL_ROLE_ACTIVATION, "acme/act@v1",
                                       &pol, &sw));
    ASSERT_CONTAINS(sw.resolved, "variant " CPU_VARIANT " file act.so");
    ASSERT_OK(khub_model_kernel_swap_prepare(e.hub, e.m, KHUB_KERNEL_ROLE_ACTIVATION, "acme/act@v1",
                                             &pol, &sw));
    ASSERT_STR_EQ(sw.resolved,
                  "activation: acme/act@v1 -> acme/act commit 111111111111 variant " CUDA_VARIANT
                  " for cuda:0 (accept: CUDA 12.8 build, driver 12.8, GPU 0 sm_90) file act.so; "
                  "unsigned, accepted by opt-in (khub_kernel_opts.allow_unsigned)");
    khub_plugin *act = sw.plugin;
    ASSERT_OK(khub_model_kernel_swap(e.m, &sw));
    ASSERT_STR_EQ(sw.previous, "khub-test/cuda-all 1.0.0 :: silu_and_mul");
    ASSERT_STR_EQ(sw.now_serving, "acme/act 1.0.0 :: silu_and_mul");
    ASSERT_CONTAINS(khub_model_explain(e.m),
                    "  swapped: silu_and_mul[f32]: on the device, acme/act 1.0.0 :: silu_and_mul "
                    "(was khub-test/cuda-all 1.0.0 :: silu_and_mul)\n");
    forward(e.m);
    ASSERT(launched("khub_hub_act"));

    /* it serves: unloading it is refused, and changes nothing */
    ASSERT_STATUS(khub_plugin_unload(e.rt, act), KHUB_STATUS_BUSY);
    ASSERT_STR_EQ(khub_runtime_errmsg(e.rt), UNLOAD_BUSY);
    forward(e.m);
    /* swapped away (to a loaded plugin's id), nothing can call it: its
     * prepare loaded it, so the switch unloads it */
    size_t n = khub_plugin_count(e.rt);
    ASSERT_OK(khub_model_kernel_swap_prepare(e.hub, e.m, KHUB_KERNEL_ROLE_ACTIVATION,
                                             "khub-test/cuda-all", &pol, &sw));
    ASSERT_OK(khub_model_kernel_swap(e.m, &sw));
    ASSERT_STR_EQ(sw.now_serving, "khub-test/cuda-all 1.0.0 :: silu_and_mul");
    ASSERT(plugin_named(e.rt, "acme/act") == NULL);
    ASSERT_EQ(khub_plugin_count(e.rt), n - 1);
    for (size_t i = 0; i < khub_plugin_count(e.rt); i++) ASSERT(khub_plugin_at(e.rt, i) != act);
    khub_model_binding old = {0};
    ASSERT(retired_binding(e.m, "silu_and_mul", "acme/act 1.0.0 :: silu_and_mul", &old));
    ASSERT(old.calls > 0);
    forward(e.m);
    /* a plugin that still serves other roles stays BUSY */
    ASSERT_STATUS(khub_plugin_unload(e.rt, plugin_named(e.rt, "khub-test/cuda-all")),
                  KHUB_STATUS_BUSY);
    env_done(&e);
}

/* A kernel without a CUDA variant for the device: strict refuses it in the
 * hub with the load's message; without strict its CPU variant is loaded
 * and the switch refuses it (a swap never moves a role off the device).
 * Nothing changes either way. */
TEST_IMPL(hub_swap_without_a_cuda_variant_changes_nothing)
{
    fake("12080:90", "100000000", NULL);
    env e;
    env_init(&e, cuda0);
    ASSERT_OK(env_load(&e));
    const char *x = khub_model_explain(e.m);
    khub_model_kernels pol = swap_policy(&e);
    pol.strict = 1;
    khub_kernel_swap sw = {KHUB_APP_INIT(khub_kernel_swap)};
    ASSERT_STATUS(khub_model_kernel_swap_prepare(e.hub, e.m, KHUB_KERNEL_ROLE_ACTIVATION,
                                                 "acme/act@v2", &pol, &sw),
                  KHUB_STATUS_NO_VARIANT);
    ASSERT_STR_EQ(khub_last_error(),
                  "activation kernel acme/act@v2: acme/act@222222222222: no CUDA variant runs on "
                  "cuda:0 (strict): it has no CUDA variant");
    ASSERT(plugin_named(e.rt, "acme/act") == NULL); /* refused before anything was loaded */
    size_t n = khub_plugin_count(e.rt);
    pol.strict = 0;
    ASSERT_OK(khub_model_kernel_swap_prepare(e.hub, e.m, KHUB_KERNEL_ROLE_ACTIVATION, "acme/act@v2",
                                             &pol, &sw));
    ASSERT_EQ(khub_plugin_count(e.rt), n + 1);
    ASSERT_STR_EQ(sw.resolved,
                  "activation: acme/act@v2 -> acme/act commit 222222222222 variant " CPU_VARIANT
                  " on the CPU (acme/act@222222222222 has no CUDA variant that runs on cuda:0 (it "
                  "has no CUDA variant)) file act.so; unsigned, accepted by opt-in "
                  "(khub_kernel_opts.allow_unsigned)");
    ASSERT_STATUS(khub_model_kernel_swap(e.m, &sw), KHUB_STATUS_NO_KERNEL);
    ASSERT_CONTAINS(khub_last_error(),
                    ": acme/act cannot serve silu_and_mul on cuda:0: acme/act 1.0.0 for "
                    "activation is rejected: device cpu, wants cuda; nothing changed");
    ASSERT(!strncmp(khub_last_error(), "khub-placement-", 15)); /* the model's file */
    ASSERT(khub_model_explain(e.m) == x); /* the same table: nothing changed */
    /* the CPU plugin its prepare loaded is unloaded with the refusal: a
     * server's repeated reloads do not pile plugins up */
    ASSERT(plugin_named(e.rt, "acme/act") == NULL);
    ASSERT_EQ(khub_plugin_count(e.rt), n);
    ASSERT_EQ(sw.held, 0);
    /* two prepared swaps of it: the refusal of one leaves it to the other,
     * whose release unloads it */
    khub_kernel_swap sw2 = {KHUB_APP_INIT(khub_kernel_swap)};
    ASSERT_OK(khub_model_kernel_swap_prepare(e.hub, e.m, KHUB_KERNEL_ROLE_ACTIVATION, "acme/act@v2",
                                             &pol, &sw));
    ASSERT_OK(khub_model_kernel_swap_prepare(e.hub, e.m, KHUB_KERNEL_ROLE_ACTIVATION, "acme/act@v2",
                                             &pol, &sw2));
    ASSERT(sw2.plugin == sw.plugin);
    ASSERT_EQ(khub_plugin_count(e.rt), n + 1);
    ASSERT_STATUS(khub_model_kernel_swap(e.m, &sw), KHUB_STATUS_NO_KERNEL);
    ASSERT(plugin_named(e.rt, "acme/act") == sw2.plugin);
    khub_kernel_swap_release(e.rt, &sw2);
    ASSERT_EQ(sw2.held, 0);
    ASSERT(plugin_named(e.rt, "acme/act") == NULL);
    ASSERT_EQ(khub_plugin_count(e.rt), n);
    khub_kernel_swap_release(e.rt, &sw2); /* released already: nothing */
    khub_kernel_swap_release(NULL, NULL);
    forward(e.m);
    ASSERT(launched("khub_test_act") && !launched("khub_hub_act"));
    env_done(&e);
}

/* What a swap's prepare loads is the swap's until the switch: released
 * unswitched, or replaced by another prepare into the same struct, it is
 * unloaded; a plugin loaded before the prepare (the caller's, a model's)
 * never is, and neither is one a switch bound. */
TEST_IMPL(hub_swap_release_unloads_only_what_the_prepare_loaded)
{
    fake("12080:90", "100000000", NULL);
    env e;
    env_init(&e, (khub_device){KHUB_DEVICE_CPU, 0});
    ASSERT_OK(env_load(&e));
    khub_model_kernels pol = swap_policy(&e);
    size_t n = khub_plugin_count(e.rt);
    khub_kernel_swap sw = {KHUB_APP_INIT(khub_kernel_swap)};
    ASSERT_OK(khub_model_kernel_swap_prepare(e.hub, e.m, KHUB_KERNEL_ROLE_ACTIVATION, "acme/act@v1",
                                             &pol, &sw));
    ASSERT_EQ(khub_plugin_count(e.rt), n + 1);
    khub_kernel_swap_release(e.rt, &sw);
    ASSERT_EQ(khub_plugin_count(e.rt), n);
    ASSERT(plugin_named(e.rt, "acme/act") == NULL);
    /* prepared twice into one struct: v1 gives way to v2 */
    ASSERT_OK(khub_model_kernel_swap_prepare(e.hub, e.m, KHUB_KERNEL_ROLE_ACTIVATION, "acme/act@v1",
                                             &pol, &sw));
    ASSERT_OK(khub_model_kernel_swap_prepare(e.hub, e.m, KHUB_KERNEL_ROLE_ACTIVATION, "acme/act@v2",
                                             &pol, &sw));
    ASSERT_EQ(khub_plugin_count(e.rt), n + 1);
    ASSERT_CONTAINS(sw.resolved, "commit 222222222222");
    /* switched: bound, so the hold's end keeps it */
    ASSERT_OK(khub_model_kernel_swap(e.m, &sw));
    ASSERT_EQ(khub_plugin_count(e.rt), n + 1);
    khub_kernel_swap_release(e.rt, &sw);
    ASSERT_EQ(khub_plugin_count(e.rt), n + 1);
    /* a plugin the prepare found loaded (the caller's) stays on release */
    ASSERT_OK(khub_model_kernel_swap_prepare(e.hub, e.m, KHUB_KERNEL_ROLE_NORM,
                                             "khub-test/cuda-all", &pol, &sw));
    khub_kernel_swap_release(e.rt, &sw);
    ASSERT(plugin_named(e.rt, "khub-test/cuda-all") != NULL);
    ASSERT_EQ(khub_plugin_count(e.rt), n + 1);
    forward(e.m);
    env_done(&e);
}

/* On the CPU the model-aware prepare is khub_kernel_swap_prepare's, and the
 * replaced binding is released at the switch: the old plugin, which a
 * swap's prepare loaded, is unloaded with it. */
TEST_IMPL(hub_swap_on_the_cpu_releases_the_old_plugin)
{
    fake("12080:90", "100000000", NULL);
    env e;
    env_init(&e, (khub_device){KHUB_DEVICE_CPU, 0});
    ASSERT_OK(env_load(&e));
    khub_model_kernels pol = swap_policy(&e);
    khub_kernel_swap sw = {KHUB_APP_INIT(khub_kernel_swap)};
    ASSERT_OK(khub_model_kernel_swap_prepare(e.hub, e.m, KHUB_KERNEL_ROLE_ACTIVATION, "acme/act@v1",
                                             &pol, &sw));
    ASSERT_STR_EQ(sw.resolved,
                  "activation: acme/act@v1 -> acme/act commit 111111111111 variant " CPU_VARIANT
                  " file act.so; unsigned, accepted by opt-in (khub_kernel_opts.allow_unsigned)");
    khub_plugin *act = sw.plugin;
    ASSERT_OK(khub_model_kernel_swap(e.m, &sw));
    ASSERT_STR_EQ(sw.now_serving, "acme/act 1.0.0 :: silu_and_mul");
    forward(e.m);
    ASSERT_STATUS(khub_plugin_unload(e.rt, act), KHUB_STATUS_BUSY);
    ASSERT_STR_EQ(khub_runtime_errmsg(e.rt), UNLOAD_BUSY);
    ASSERT_OK(khub_model_kernel_swap_prepare(e.hub, e.m, KHUB_KERNEL_ROLE_ACTIVATION,
                                             "khub/ref-cpu", &pol, &sw));
    ASSERT_OK(khub_model_kernel_swap(e.m, &sw));
    ASSERT(plugin_named(e.rt, "acme/act") == NULL); /* its prepare loaded it: unloaded */
    khub_model_binding old = {0};
    ASSERT(retired_binding(e.m, "silu_and_mul", "acme/act 1.0.0 :: silu_and_mul", &old));
    ASSERT(old.calls > 0);
    forward(e.m);
    env_done(&e);
}

/* The loaded plugin acme/act of version v, or NULL. */
static const khub_plugin *act_of(khub_runtime *rt, const char *v)
{
    for (size_t i = 0; i < khub_plugin_count(rt); i++) {
        const khub_plugin *p = khub_plugin_at(rt, i);
        if (!strcmp(khub_plugin_id(p), "acme/act") && !strcmp(khub_plugin_version(p), v)) return p;
    }
    return NULL;
}

/* Swaps back and forth between two Hub kernels (acme/act@v1, 1.0.0, and
 * @v2, here 1.0.1: two plugins) keep the runtime's plugin count: each
 * switch unloads the plugin it swapped out, which a prepare loaded and
 * nothing else uses; through khub_model_kernel_swap and through the model
 * server's reload. A plugin the caller loaded is never unloaded by a swap. */
TEST_IMPL(hub_swaps_back_and_forth_keep_the_plugin_count)
{
    fake("12080:90", "100000000", NULL);
    env e;
    env_init(&e, (khub_device){KHUB_DEVICE_CPU, 0});
    publish(&e.fx, C2, CPU_VARIANT, "hub_act_cpu_101", NULL); /* before anything fetched it */
    ASSERT_OK(env_load(&e));
    khub_model_kernels pol = swap_policy(&e);
    size_t n = khub_plugin_count(e.rt);
    const char *names[2] = {"acme/act@v1", "acme/act@v2"}, *versions[2] = {"1.0.0", "1.0.1"};
    for (int i = 0; i < 8; i++) {
        khub_kernel_swap sw = {KHUB_APP_INIT(khub_kernel_swap)};
        ASSERT_OK(khub_model_kernel_swap_prepare(e.hub, e.m, KHUB_KERNEL_ROLE_ACTIVATION,
                                                 names[i % 2], &pol, &sw));
        ASSERT_OK(khub_model_kernel_swap(e.m, &sw));
        ASSERT_EQ(khub_plugin_count(e.rt), n + 1); /* the one serving, no more */
        ASSERT(act_of(e.rt, versions[i % 2]) == sw.plugin);
        ASSERT(act_of(e.rt, versions[1 - i % 2]) == NULL);
        forward(e.m);
    }
    /* the model server's reload path: the same */
    khub_model_server_opts so = {KHUB_APP_INIT(khub_model_server_opts), .model = e.m, .hub = e.hub,
                                 .policy_path = e.policy, .allow_unsigned = 1};
    khub_model_server *srv = NULL;
    char err[KHUB_ERROR_SIZE];
    ASSERT_OK(khub_model_server_start(&so, &srv, err, sizeof err));
    for (int i = 0; i < 8; i++) {
        ASSERT_OK(khub_model_server_reload(srv, "activation", names[i % 2], err, sizeof err));
        ASSERT_EQ(khub_plugin_count(e.rt), n + 1);
        ASSERT(act_of(e.rt, versions[i % 2]) != NULL);
        ASSERT(act_of(e.rt, versions[1 - i % 2]) == NULL);
    }
    khub_model_server_stop(srv);
    /* back to the built-in plugin, the caller's: the Hub kernel goes */
    khub_kernel_swap sw = {KHUB_APP_INIT(khub_kernel_swap)};
    ASSERT_OK(khub_model_kernel_swap_prepare(e.hub, e.m, KHUB_KERNEL_ROLE_ACTIVATION,
                                             "khub/ref-cpu", &pol, &sw));
    ASSERT_OK(khub_model_kernel_swap(e.m, &sw));
    ASSERT_EQ(khub_plugin_count(e.rt), n);
    ASSERT(plugin_named(e.rt, "acme/act") == NULL);
    /* the kernel loaded by the caller: swapped to by its id and away, it
     * stays the caller's */
    khub_plugin *mine = tp_load(e.rt, "hub_act_cpu");
    ASSERT_OK(khub_model_kernel_swap_prepare(e.hub, e.m, KHUB_KERNEL_ROLE_ACTIVATION, "acme/act",
                                             &pol, &sw));
    ASSERT(sw.plugin == mine);
    ASSERT_OK(khub_model_kernel_swap(e.m, &sw));
    ASSERT_OK(khub_model_kernel_swap_prepare(e.hub, e.m, KHUB_KERNEL_ROLE_ACTIVATION,
                                             "khub/ref-cpu", &pol, &sw));
    ASSERT_OK(khub_model_kernel_swap(e.m, &sw));
    ASSERT(plugin_named(e.rt, "acme/act") == mine);
    ASSERT_EQ(khub_plugin_count(e.rt), n + 1);
    ASSERT_OK(khub_plugin_unload(e.rt, mine));
    forward(e.m);
    env_done(&e);
}

/* A placed model's bindings (CPU and device) are the model's: once it is
 * freed, the Hub kernel its load fetched can be unloaded by the caller, and
 * one a swap's prepare loaded goes with the last model it served. */
TEST_IMPL(hub_model_free_releases_its_kernels)
{
    fake("12080:90", "100000000", NULL);
    env e;
    env_init(&e, cuda0);
    size_t n = khub_plugin_count(e.rt);
    e.k.act = "acme/act@v1";
    ASSERT_OK(env_load(&e));
    forward(e.m);
    khub_plugin *act = plugin_named(e.rt, "acme/act");
    ASSERT(act != NULL);
    ASSERT_EQ(khub_plugin_count(e.rt), n + 1);
    ASSERT_STATUS(khub_plugin_unload(e.rt, act), KHUB_STATUS_BUSY);
    ASSERT_STR_EQ(khub_runtime_errmsg(e.rt), UNLOAD_BUSY);
    khub_model_free(e.m);
    e.m = NULL;
    ASSERT_EQ(khub_plugin_count(e.rt), n + 1); /* the load's: the caller's to unload */
    ASSERT_OK(khub_plugin_unload(e.rt, act));
    ASSERT_EQ(khub_plugin_count(e.rt), n);
    /* swapped in by a prepare: unloaded with the model it served */
    e.k.act = NULL;
    ASSERT_OK(env_load(&e));
    khub_model_kernels pol = swap_policy(&e);
    khub_kernel_swap sw = {KHUB_APP_INIT(khub_kernel_swap)};
    ASSERT_OK(khub_model_kernel_swap_prepare(e.hub, e.m, KHUB_KERNEL_ROLE_ACTIVATION, "acme/act@v1",
                                             &pol, &sw));
    ASSERT_OK(khub_model_kernel_swap(e.m, &sw));
    forward(e.m);
    ASSERT_EQ(khub_plugin_count(e.rt), n + 1);
    khub_model_free(e.m);
    e.m = NULL;
    ASSERT_EQ(khub_plugin_count(e.rt), n);
    ASSERT(plugin_named(e.rt, "acme/act") == NULL);
    env_done(&e);
}

/* The embedding role named on a placed model whose plugins have no CUDA
 * embedding op: the named plugin's CPU op looks the rows up on the host,
 * named in --explain, and the forward pass runs through it. */
TEST_IMPL(hub_embedding_role_on_a_placed_model)
{
    fake("12080:90", "100000000", NULL);
    env e;
    env_init(&e, cuda0);
    e.k.embed = "khub/ref-cpu";
    ASSERT_OK(env_load(&e));
    ASSERT_CONTAINS(e.rep.text, "embedding: khub/ref-cpu (loaded plugin)\n");
    ASSERT_CONTAINS(khub_model_explain(e.m),
                    "  embedding[f32]: cpu fallback, khub/ref-cpu 0.1.0 :: embedding (no CUDA "
                    "kernel: ");
    forward(e.m);
    khub_model_binding b = {KHUB_APP_INIT(khub_model_binding)};
    bool found = false;
    for (size_t i = 0; !found && khub_model_binding_get(e.m, i, &b) == KHUB_STATUS_OK; i++)
        found = !strcmp(b.role, "embedding");
    ASSERT(found);
    ASSERT_STR_EQ(b.kernel, "khub/ref-cpu 0.1.0 :: embedding");
    ASSERT_EQ(b.calls, 1);
    env_done(&e);
}

#define TEST_LIST(X) \
    X(hub_cuda_variant_serves_the_device) \
    X(hub_no_ptx_for_the_gpu_runs_the_cpu_variant) \
    X(hub_variant_judged_for_the_placed_gpu) \
    X(hub_cpu_only_kernel_falls_back_or_strict_refuses) \
    X(hub_locked_cuda_variant_and_tamper) \
    X(hub_swap_loads_the_cuda_variant) \
    X(hub_swap_without_a_cuda_variant_changes_nothing) \
    X(hub_swap_on_the_cpu_releases_the_old_plugin) \
    X(hub_swaps_back_and_forth_keep_the_plugin_count) \
    X(hub_swap_release_unloads_only_what_the_prepare_loaded) \
    X(hub_model_free_releases_its_kernels) \
    X(hub_embedding_role_on_a_placed_model) \
    /* end */
TEST_MAIN(TEST_LIST)
