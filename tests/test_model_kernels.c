/*
 * test_model_kernels.c: the C API of kernels named by Hub ID at model load
 * (khub_model_load_hub, khub_kernels.h) on an in-process hub. A kernel is
 * fetched and serves attention with the caller's threads and device; a
 * khub.json mapping (given, or next to the model) picks it, a name from the
 * caller overrides it, and a malformed one is refused naming the field;
 * through a lock the locked commit loads with no request once cached, and
 * a changed cached file is refused naming it; a kernel with no variant for this machine falls back
 * with the variant trace in the warning, or is NO_VARIANT with strict; the
 * embedding role (0.2) named in khub.json binds that plugin's op.
 *
 * The kernel is the built ref-cpu plugin published as "acme/ref" (and as
 * "acme/away", built for the other architecture only); the model is the
 * real SmolLM2 GGUF, skipped when absent (tools/fetch-model.sh).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hub_fixture.h"
#include "kernel_fetch.h"
#include "kernel_mapping.h"
#include "khub/khub_kernels.h"
#include "khub/khub_model.h"
#include "lockfile.h"
#include "verified_files.h"

static char warnings[16384];
static void capture(void *ud, khub_log_level level, const char *msg)
{
    (void)ud;
    if (level == KHUB_LOG_WARN)
        snprintf(warnings + strlen(warnings), sizeof warnings - strlen(warnings), "%s\n", msg);
}

static const char *model_file(char *buf, size_t n)
{
    const char *d = getenv("KHUB_MODEL_DIR");
    if (d)
        snprintf(buf, n, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", d);
    else
        snprintf(buf, n, "%s/.cache/khub/models/SmolLM2-135M-Instruct.Q4_1.gguf",
                 getenv("HOME") ? getenv("HOME") : "");
    struct stat sb;
    return stat(buf, &sb) == 0 ? buf : NULL;
}

static char *read_bytes(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    ASSERT(f != NULL);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)len);
    ASSERT(p != NULL);
    ASSERT_EQ(fread(p, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return p;
}

/* Publishes the plugin file src, with tail_n bytes of tail after its end
 * (another build of it: the same plugin, another digest), as repo
 * org/name, commit C1 (main and v1), in variant khub1-cpu-<arch>-linux. */
static void publish_so(fixture *fx, const char *repo, const char *arch, const char *src,
                       const char *tail, size_t tail_n)
{
    char rel[512], path[1024], sha[65], meta[2048];
    snprintf(rel, sizeof rel, "%s/refs.json", repo);
    fx_writef(fx, rel, "{\"branches\":{\"main\":\"" C1 "\",\"v1\":\"" C1 "\"},\"tags\":{}}");
    size_t n;
    char *so = read_bytes(src, &n);
    so = realloc(so, n + tail_n);
    ASSERT(so != NULL);
    memcpy(so + n, tail, tail_n);
    n += tail_n;
    snprintf(path, sizeof path, "%s/%s/commits/" C1 "/build/khub1-cpu-%s-linux/ref.so", fx->repos,
             repo, arch);
    fx_write(path, so, n);
    ASSERT_OK(khub__sha256_hex(so, n, sha));
    free(so);
    snprintf(meta, sizeof meta,
             "{\"format\":1,\"name\":\"%s\",\"version\":\"1.0.0\",\"major\":1,"
             "\"variant\":\"khub1-cpu-%s-linux\",\"abi\":{\"major\":%d,\"minor\":%d},"
             "\"backend\":{\"type\":\"cpu\",\"archs\":[\"%s\"]},"
             "\"plugins\":[{\"file\":\"ref.so\",\"level\":\"generic\",\"cpu_features\":[]}],"
             "\"files\":{\"ref.so\":\"%s\"},"
             "\"provenance\":{\"source_commit\":\"unknown\",\"dirty\":false}}",
             repo, arch, KHUB_ABI_MAJOR, KHUB_ABI_MINOR, arch, sha);
    snprintf(rel, sizeof rel, "%s/commits/" C1 "/build/khub1-cpu-%s-linux/metadata.json", repo,
             arch);
    fx_writef(fx, rel, meta);
}

#define REF_SO KHUB_PLUGIN_DIR_BUILD "/ref-cpu.so"

/* The built ref-cpu plugin as repo org/name (publish_so). */
static void publish_ref(fixture *fx, const char *repo, const char *arch)
{
    publish_so(fx, repo, arch, REF_SO, "", 0);
}

typedef struct env {
    fixture fx;
    khub_hub *hub;
    char model[1024], policy[600], map[600], lock[600];
} env;

/* The hub and the published kernels; with_model: the model too (skipped
 * when absent). */
static void env_init_with(env *e, bool with_model)
{
    memset(e, 0, sizeof *e);
    if (with_model && !model_file(e->model, sizeof e->model))
        TEST_SKIP("SmolLM2-135M-Instruct.Q4_1.gguf absent (run tools/fetch-model.sh)");
    fx_init(&e->fx, NULL, 0);
    publish_ref(&e->fx, "acme/ref", fx_arch());
    publish_ref(&e->fx, "acme/away", strcmp(fx_arch(), "x86_64") == 0 ? "aarch64" : "x86_64");
    e->hub = fx_hub(&e->fx, 0, NULL);
    /* No trusted keys: acme is unlisted, so its unsigned kernels need the opt-in. */
    snprintf(e->policy, sizeof e->policy, "%s/policy.json", e->fx.root);
    const char *policy = "{\"version\":1,\"publishers\":{}}";
    fx_write(e->policy, policy, strlen(policy));
    snprintf(e->map, sizeof e->map, "%s/khub.json", e->fx.root);
    snprintf(e->lock, sizeof e->lock, "%s/khub.lock", e->fx.root);
}

static void env_init(env *e) { env_init_with(e, true); }

static void env_done(env *e)
{
    khub_hub_free(e->hub);
    fx_done(&e->fx);
}

/* A runtime of 2 threads; builtin = 1 loads the built-in plugins (without
 * them the fetched ref-cpu copy is the only plugin). */
static khub_runtime *runtime(int builtin)
{
    khub_runtime_opts o = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = 2, .log = capture};
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(&o, &rt));
    if (builtin) ASSERT_OK(khub_plugin_load_builtin(rt));
    warnings[0] = '\0';
    return rt;
}

static khub_model_opts base_opts(void)
{
    return (khub_model_opts){KHUB_STRUCT_INIT(khub_model_opts), .n_threads = 2,
                             .device = {KHUB_DEVICE_CPU, 0}, .max_context = 64};
}

TEST_IMPL(attn_by_hub_id_with_threads_and_device)
{
    env e;
    env_init(&e);
    khub_runtime *rt = runtime(0);
    khub_model_opts base = base_opts();
    khub_model_kernels k = {KHUB_STRUCT_INIT(khub_model_kernels), .attn = "acme/ref@version=1",
                            .policy_path = e.policy, .allow_unsigned = 1};
    khub_model_kernels_report rep;
    khub_model *m = NULL;
    /* the caller's options reach khub_model_load: a thread count other
     * than the pool's is refused there */
    base.n_threads = 3;
    ASSERT_STATUS(khub_model_load_hub(e.hub, rt, e.model, &base, &k, &m, &rep),
                  KHUB_STATUS_INVALID_ARG);
    ASSERT(m == NULL);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "n_threads");
    base.n_threads = 2;
    ASSERT_OK(khub_model_load_hub(e.hub, rt, e.model, &base, &k, &m, &rep));
    ASSERT_CONTAINS(rep.text, "attention: acme/ref@version=1 -> khub/ref-cpu commit 111111111111 "
                              "variant khub1-cpu-");
    ASSERT_CONTAINS(rep.text, "file ref.so; unsigned, accepted by opt-in");
    /* the fetched copy only: nothing built in, and the failed first call's
     * plugin is reused, not loaded twice */
    ASSERT_EQ(khub_plugin_count(rt), (size_t)1);
    ASSERT_CONTAINS(khub_model_explain(m), "attention[f32]: khub/ref-cpu");
    float *logits = malloc(49152 * sizeof *logits);
    const int32_t ids[2] = {1, 2};
    ASSERT_OK(khub_model_logits(m, ids, 2, logits));
    free(logits);
    khub_model_free(m);
    /* unsigned without the opt-in is refused */
    khub_runtime_free(rt);
    rt = runtime(1);
    k.allow_unsigned = 0;
    ASSERT_STATUS(khub_model_load_hub(e.hub, rt, e.model, &base, &k, &m, &rep),
                  KHUB_STATUS_UNSIGNED);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "attention kernel acme/ref@version=1: refusing");
    khub_runtime_free(rt);
    env_done(&e);
}

TEST_IMPL(mapping_override_and_errors)
{
    env e;
    env_init(&e);
    khub_runtime *rt = runtime(0);
    khub_model_opts base = base_opts();
    const char *map = "{\"format\":1,\"roles\":{\"attention\":{\"cpu\":{\"repo\":\"acme/ref\","
                      "\"version\":1},\"cuda\":[{\"repo\":\"acme/away\",\"version\":1,"
                      "\"capability\":[80,90]}]}}}";
    fx_write(e.map, map, strlen(map));
    khub_model_kernels k = {KHUB_STRUCT_INIT(khub_model_kernels), .mapping_path = e.map,
                            .policy_path = e.policy, .allow_unsigned = 1};
    khub_model_kernels_report rep;
    khub_model *m = NULL;
    ASSERT_OK(khub_model_load_hub(e.hub, rt, e.model, &base, &k, &m, &rep));
    ASSERT_CONTAINS(rep.text, "mapping: ");
    ASSERT_CONTAINS(rep.text, "attention: acme/ref@version=1 -> khub/ref-cpu commit 111111111111");
    khub_model_free(m);
    khub_runtime_free(rt);
    /* without mapping_path, the khub.json next to the model is read */
    char linked[700], want[700];
    snprintf(linked, sizeof linked, "%s/model.gguf", e.fx.root);
    ASSERT_EQ(symlink(e.model, linked), 0);
    snprintf(want, sizeof want, "mapping: %s\n", e.map);
    rt = runtime(0);
    k.mapping_path = NULL;
    ASSERT_OK(khub_model_load_hub(e.hub, rt, linked, &base, &k, &m, &rep));
    ASSERT_CONTAINS(rep.text, want);
    ASSERT_CONTAINS(rep.text, "attention: acme/ref@version=1 -> khub/ref-cpu");
    khub_model_free(m);
    khub_runtime_free(rt);
    k.mapping_path = e.map;
    /* a name from the caller wins over the mapping */
    rt = runtime(1);
    k.attn = "sdpa";
    ASSERT_OK(khub_model_load_hub(e.hub, rt, e.model, &base, &k, &m, &rep));
    ASSERT_CONTAINS(rep.text, "attention: sdpa = khub/ref-cpu (built-in)");
    ASSERT(strstr(rep.text, "acme/ref") == NULL);
    khub_model_free(m);
    /* malformed mappings: PARSE (or BAD_ID) naming the field */
    static const struct {
        const char *json, *msg;
        khub_status st;
    } bad[] = {
        {"{\"format\":1,\"roles\":{\"attn\":\"acme/ref@v1\"}}", "roles.attn: unknown role",
         KHUB_STATUS_PARSE},
        {"{\"format\":1,\"roles\":{\"norm\":{\"tpu\":\"acme/ref@v1\"}}}",
         "roles.norm.tpu: unknown device type \"tpu\"", KHUB_STATUS_PARSE},
        {"{\"format\":1,\"roles\":{\"norm\":{\"cpu\":{\"repo\":\"acme/ref\",\"version\":1,"
         "\"revision\":\"main\"}}}}",
         "both \"version\" and \"revision\" are set", KHUB_STATUS_PARSE},
        {"{\"format\":1,\"roles\":{\"norm\":\"acme//ref\"}}",
         "roles.norm: bad Hub ID \"acme//ref\"", KHUB_STATUS_BAD_ID},
    };
    k.attn = NULL;
    k.norm = "rmsnorm"; /* neither a Hub ID nor a built-in name */
    ASSERT_STATUS(khub_model_load_hub(e.hub, rt, e.model, &base, &k, &m, &rep), KHUB_STATUS_BAD_ID);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt),
                    "norm kernel \"rmsnorm\": not a Hub ID "
                    "(org/name[@REV|@version=N][:symbol]); norm has no built-in names");
    k.norm = NULL;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fx_write(e.map, bad[i].json, strlen(bad[i].json));
        ASSERT_STATUS(khub_model_load_hub(e.hub, rt, e.model, &base, &k, &m, &rep), bad[i].st);
        ASSERT(m == NULL);
        ASSERT_CONTAINS(khub_runtime_errmsg(rt), bad[i].msg); /* this call's, not the last */
        ASSERT(strstr(khub_runtime_errmsg(rt), "khub.json: khub.json") == NULL);
    }
    khub_runtime_free(rt);
    env_done(&e);
}

TEST_IMPL(locked_load_no_request_and_tamper)
{
    env e;
    env_init(&e);
    const char *map = "{\"format\":1,\"roles\":{\"attention\":\"acme/ref@version=1\"}}";
    fx_write(e.map, map, strlen(map));
    khub_lock *lock = NULL;
    khub_lock_entry ent;
    char err[KHUB_ERROR_SIZE];
    khub_hub_id id = fx_id("acme/ref@version=1");
    ASSERT_OK(khub__lock_new(&lock));
    ASSERT_OK(khub__kernel_lock_entry(e.hub, &id, NULL, &ent));
    ASSERT_STR_EQ(ent.commit, C1);
    khub__lock_put(lock, &ent);
    ASSERT_OK(khub__lock_save(lock, e.lock, err, sizeof err));
    khub__lock_free(lock);

    khub_runtime *rt = runtime(0);
    khub_model_opts base = base_opts();
    khub_model_kernels k = {KHUB_STRUCT_INIT(khub_model_kernels), .mapping_path = e.map,
                            .lock_path = e.lock, .policy_path = e.policy, .allow_unsigned = 1};
    khub_model_kernels_report rep;
    khub_model *m = NULL;
    uint64_t before = khub_hub_request_count(e.hub);
    ASSERT_OK(khub_model_load_hub(e.hub, rt, e.model, &base, &k, &m, &rep));
    ASSERT_EQ(khub_hub_request_count(e.hub), before); /* khub lock cached the variant */
    ASSERT_CONTAINS(rep.text, "commit 111111111111");
    ASSERT_CONTAINS(rep.text, "(locked, hashes re-checked)");
    khub_model_free(m);
    khub_runtime_free(rt);

    /* without lock_path, the khub.lock next to khub.json is used */
    rt = runtime(0);
    k.lock_path = NULL;
    ASSERT_OK(khub_model_load_hub(e.hub, rt, e.model, &base, &k, &m, &rep));
    ASSERT_CONTAINS(rep.text, "lock: ");
    ASSERT_CONTAINS(rep.text, "(locked, hashes re-checked)");
    khub_model_free(m);
    khub_runtime_free(rt);

    /* one changed byte in the cached plugin: refused, naming the file */
    char so[1024]; /* no archive on this hub: the files are in the snapshot */
    snprintf(so, sizeof so, "%s/kernels--acme--ref/snapshots/" C1 "/build/%s/ref.so", e.fx.cache,
             e.fx.variant);
    FILE *f = fopen(so, "r+b");
    ASSERT(f != NULL);
    fseek(f, 200, SEEK_SET);
    int c = fgetc(f);
    fseek(f, 200, SEEK_SET);
    fputc(c ^ 0x55, f);
    fclose(f);
    rt = runtime(0);
    k.lock_path = e.lock;
    ASSERT_STATUS(khub_model_load_hub(e.hub, rt, e.model, &base, &k, &m, &rep),
                  KHUB_STATUS_LOCK_MISMATCH);
    ASSERT(m == NULL);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "ref.so has SHA-256");
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "khub.lock says");
    khub_runtime_free(rt);
    env_done(&e);
}

TEST_IMPL(no_variant_falls_back_or_strict_fails)
{
    env e;
    env_init(&e);
    khub_runtime *rt = runtime(1);
    khub_model_opts base = base_opts();
    khub_model_kernels k = {KHUB_STRUCT_INIT(khub_model_kernels), .norm = "acme/away@v1",
                            .policy_path = e.policy, .allow_unsigned = 1};
    khub_model_kernels_report rep;
    khub_model *m = NULL;
    ASSERT_OK(khub_model_load_hub(e.hub, rt, e.model, &base, &k, &m, &rep));
    ASSERT_CONTAINS(warnings, "norm kernel acme/away@v1: no variant fits this machine; the "
                              "reference plugin serves norm instead. Variant trace: khub1-cpu-");
    ASSERT_CONTAINS(warnings, "-linux: reject: ");
    ASSERT_CONTAINS(rep.text, "norm: acme/away@v1 -> fell back to khub/ref-cpu (no variant fits)");
    ASSERT_CONTAINS(khub_model_explain(m), "rms_norm[f32]: khub/ref-cpu");
    khub_model_free(m);
    k.strict = 1;
    ASSERT_STATUS(khub_model_load_hub(e.hub, rt, e.model, &base, &k, &m, &rep),
                  KHUB_STATUS_NO_VARIANT);
    ASSERT(m == NULL);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "norm kernel acme/away@v1: acme/away@111111111111: "
                                             "no build variant fits this machine (strict): "
                                             "khub1-cpu-");
    khub_runtime_free(rt);
    env_done(&e);
}

/* The binding of role (not retired) as khub_model_binding_get lists it;
 * false when the model has none. */
static bool binding_of(khub_model *m, const char *role, khub_model_binding *out)
{
    for (size_t i = 0;; i++) {
        khub_model_binding b = {KHUB_APP_INIT(khub_model_binding)};
        if (khub_model_binding_get(m, i, &b) != KHUB_STATUS_OK) return false;
        if (!b.retired && !strcmp(b.role, role)) {
            *out = b;
            return true;
        }
    }
}

/* The embedding role (0.2): a khub.json naming a plugin for it binds that
 * plugin's embedding op, which looks the rows up (the same logits, bit for
 * bit, as the host's own lookup: khub/ref-cpu's op is that lookup); the
 * caller's khub_model_kernels.embed does the same, a 0.1-sized struct
 * never reads it, and a role name the list lacks is still refused. */
TEST_IMPL(embedding_role_binds_the_named_plugin)
{
    env e;
    env_init(&e);
    khub_runtime *rt = runtime(1);
    khub_model_opts base = base_opts();
    khub_model_kernels k = {KHUB_STRUCT_INIT(khub_model_kernels), .mapping_path = e.map,
                            .policy_path = e.policy, .allow_unsigned = 1};
    khub_model_kernels_report rep;
    khub_model *m = NULL;
    const int32_t ids[3] = {1, 2, 3};
    float *want = malloc(49152 * sizeof *want), *got = malloc(49152 * sizeof *got);
    ASSERT(want && got);
    const char *none = "{\"format\":1,\"roles\":{}}";
    fx_write(e.map, none, strlen(none));
    ASSERT_OK(khub_model_load_hub(e.hub, rt, e.model, &base, &k, &m, &rep));
    khub_model_binding b = {0};
    ASSERT(!binding_of(m, "embedding", &b)); /* the host's own lookup */
    ASSERT_OK(khub_model_logits(m, ids, 3, want));
    khub_model_free(m);

    const char *map = "{\"format\":1,\"roles\":{\"embedding\":\"khub/ref-cpu\"}}";
    fx_write(e.map, map, strlen(map));
    ASSERT_OK(khub_model_load_hub(e.hub, rt, e.model, &base, &k, &m, &rep));
    ASSERT_CONTAINS(rep.text, "embedding: khub/ref-cpu (loaded plugin)\n");
    ASSERT(binding_of(m, "embedding", &b));
    ASSERT_STR_EQ(b.kernel, "khub/ref-cpu 0.1.0 :: embedding");
    char line[128];
    snprintf(line, sizeof line, "\nembedding[%s]: khub/ref-cpu 0.1.0 :: embedding\n", b.dtype);
    ASSERT_CONTAINS(khub_model_explain(m), line);
    ASSERT_EQ(b.calls, 0);
    ASSERT_OK(khub_model_logits(m, ids, 3, got));
    ASSERT(binding_of(m, "embedding", &b));
    ASSERT_EQ(b.calls, 1);
    ASSERT(memcmp(want, got, 49152 * sizeof *got) == 0);
    khub_model_free(m);

    /* the caller's field, which a 0.1 struct (smaller struct_size) lacks */
    fx_write(e.map, none, strlen(none));
    k.embed = "khub/ref-cpu";
    ASSERT_OK(khub_model_load_hub(e.hub, rt, e.model, &base, &k, &m, &rep));
    ASSERT(binding_of(m, "embedding", &b));
    khub_model_free(m);
    k.struct_size = (uint32_t)offsetof(khub_model_kernels, embed);
    ASSERT_OK(khub_model_load_hub(e.hub, rt, e.model, &base, &k, &m, &rep));
    ASSERT(!binding_of(m, "embedding", &b));
    khub_model_free(m);
    k.struct_size = (uint32_t)offsetof(khub_model_kernels, strict);
    ASSERT_STATUS(khub_model_load_hub(e.hub, rt, e.model, &base, &k, &m, &rep),
                  KHUB_STATUS_STRUCT_SIZE);
    k.struct_size = sizeof k;
    k.embed = NULL;

    /* a role the list lacks is still refused, the known ones named */
    const char *typo = "{\"format\":1,\"roles\":{\"embeddings\":\"khub/ref-cpu\"}}";
    fx_write(e.map, typo, strlen(typo));
    ASSERT_STATUS(khub_model_load_hub(e.hub, rt, e.model, &base, &k, &m, &rep), KHUB_STATUS_PARSE);
    ASSERT(m == NULL);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt),
                    "roles.embeddings: unknown role (known: attention, quantization, cache, norm, "
                    "activation, rotary, linear, embedding)");
    free(want);
    free(got);
    khub_runtime_free(rt);
    env_done(&e);
}

/* A kernel an earlier fetch loaded is judged again when a later load or
 * swap names it (session 19): khub/ref-cpu published as the Hub repo
 * khub/ref-cpu, whose plugin has that id, is fetched unsigned by opt-in;
 * while that model still holds it, a load without the opt-in is refused
 * UNSIGNED, and one after its build was quarantined QUARANTINED. Before,
 * the name matched the loaded plugin's id and the plugin served as is. */
TEST_IMPL(fetched_kernel_judged_again_by_its_id)
{
    env e;
    env_init(&e);
    publish_ref(&e.fx, "khub/ref-cpu", fx_arch());
    khub_runtime *rt = runtime(0); /* nothing built in: the fetch loads the only khub/ref-cpu */
    khub_model_opts base = base_opts();
    khub_model_kernels k = {KHUB_STRUCT_INIT(khub_model_kernels), .attn = "khub/ref-cpu",
                            .policy_path = e.policy, .allow_unsigned = 1};
    khub_model_kernels_report rep;
    khub_model *m1 = NULL, *m2 = NULL;
    ASSERT_OK(khub_model_load_hub(e.hub, rt, e.model, &base, &k, &m1, &rep));
    ASSERT_CONTAINS(rep.text, "attention: khub/ref-cpu -> khub/ref-cpu commit 111111111111 "
                              "variant khub1-cpu-");
    ASSERT_EQ(khub_plugin_count(rt), (size_t)1);
    char want[1024];
    k.allow_unsigned = 0;
    ASSERT_STATUS(khub_model_load_hub(e.hub, rt, e.model, &base, &k, &m2, &rep),
                  KHUB_STATUS_UNSIGNED);
    ASSERT(m2 == NULL);
    snprintf(want, sizeof want,
             "attention kernel khub/ref-cpu: refusing khub/ref-cpu@111111111111 variant %s: "
             "khub: unsigned kernel from an organisation the policy does not list; opt in with "
             "khub_kernel_opts.allow_unsigned or allow_unsigned in the policy",
             e.fx.variant);
    ASSERT_STR_EQ(khub_runtime_errmsg(rt), want);
    khub_kernel_swap sw = {KHUB_APP_INIT(khub_kernel_swap)};
    ASSERT_STATUS(
        khub_kernel_swap_prepare(e.hub, rt, KHUB_KERNEL_ROLE_ATTENTION, "khub/ref-cpu", &k, &sw),
        KHUB_STATUS_UNSIGNED);
    ASSERT_STR_EQ(khub_last_error(), want);
    /* a crash in another process quarantined the build since */
    k.allow_unsigned = 1;
    char marker[1024];
    snprintf(marker, sizeof marker, "%s/kernels--khub--ref-cpu/khub-quarantine/" C1 "/%s",
             e.fx.cache, e.fx.variant);
    fx_write(marker, "SIGSEGV in a call\n", 18);
    ASSERT_STATUS(khub_model_load_hub(e.hub, rt, e.model, &base, &k, &m2, &rep),
                  KHUB_STATUS_QUARANTINED);
    ASSERT(m2 == NULL);
    snprintf(want, sizeof want,
             "attention kernel khub/ref-cpu: khub/ref-cpu@111111111111 variant %s is quarantined: "
             "it ended a process before (SIGSEGV in a call). Clear it with "
             "khub_cache_quarantine_clear on khub/ref-cpu to retry, or load it anyway with "
             "KHUB_OPT_ALLOW_QUARANTINED",
             e.fx.variant);
    ASSERT_STR_EQ(khub_runtime_errmsg(rt), want);
    ASSERT_EQ(khub_plugin_count(rt), (size_t)1); /* and nothing else was loaded */
    khub_model_free(m1);
    khub_runtime_free(rt);
    env_done(&e);
}

/* A model binds a role's plugin by its id: a fetched build whose id
 * another build loaded in the runtime also has is refused (EXISTS), since
 * the registry would rank the two by priority and load order, not by which
 * was verified. Here acme/ref2 is khub/ref-cpu with 16 bytes more (another
 * digest); the built-in khub/ref-cpu, loaded first, would have served the
 * attention that the fetched build was verified for. The same bytes as a
 * loaded plugin (acme/ref) are one plugin and load as before. */
TEST_IMPL(fetched_build_sharing_a_loaded_id_refused)
{
    env e;
    env_init(&e);
    publish_so(&e.fx, "acme/ref2", fx_arch(), REF_SO, "khub-other-build", 16);
    khub_runtime *rt = runtime(1);
    size_t n_builtin = khub_plugin_count(rt);
    khub_model_opts base = base_opts();
    khub_model_kernels k = {KHUB_STRUCT_INIT(khub_model_kernels), .attn = "acme/ref2",
                            .policy_path = e.policy, .allow_unsigned = 1};
    khub_model_kernels_report rep;
    khub_model *m = NULL;
    ASSERT_STATUS(khub_model_load_hub(e.hub, rt, e.model, &base, &k, &m, &rep), KHUB_STATUS_EXISTS);
    ASSERT(m == NULL);
    const khub_plugin *builtin = NULL;
    for (size_t i = 0; i < khub_plugin_count(rt) && !builtin; i++)
        if (!strcmp(khub_plugin_id(khub_plugin_at(rt, i)), "khub/ref-cpu"))
            builtin = khub_plugin_at(rt, i);
    ASSERT(builtin != NULL);
    char want[2048];
    snprintf(want, sizeof want,
             "attention kernel acme/ref2: acme/ref2@111111111111 variant %s is plugin "
             "khub/ref-cpu, and another build of khub/ref-cpu is loaded in this runtime (%s, "
             "SHA-256 %.12s); a model binds a plugin by its id, so attention could be served by "
             "that build instead of the one verified now: unload it, or load the model in another "
             "runtime",
             e.fx.variant, khub_plugin_path(builtin), khub_plugin_sha256(builtin));
    ASSERT_STR_EQ(khub_runtime_errmsg(rt), want);
    ASSERT_EQ(khub_plugin_count(rt), n_builtin); /* the refused build is unloaded again */
    k.attn = "acme/ref";
    ASSERT_OK(khub_model_load_hub(e.hub, rt, e.model, &base, &k, &m, &rep));
    khub_model_free(m);
    khub_runtime_free(rt);
    env_done(&e);
}

/* The hub's verdict on a cached file may rest on its fingerprint (the
 * sidecar khub-verified/<commit>/<variant>, or the handle's note of a file
 * it hashed): a rewrite within one timestamp tick keeps the fingerprint, and
 * anyone who can write the cache can write the sidecar too. Neither makes
 * khub load changed bytes: here the cached plugin is changed in place and
 * the sidecar given the changed file's fingerprint (what a same-tick
 * rewrite leaves); the hub then lists the file as verified without hashing
 * it, and the load is still refused by the loader's hash of the sealed
 * bytes, naming the file (session 19, docs/security.md). */
TEST_IMPL(trusted_fingerprint_never_loads_changed_bytes)
{
    env e;
    env_init_with(&e, false);
    khub_runtime *rt = runtime(0);
    khub_kernel_opts ko = {KHUB_STRUCT_INIT(khub_kernel_opts), .policy_path = e.policy,
                           .allow_unsigned = 1};
    khub_kernel_result kr = {KHUB_STRUCT_INIT(khub_kernel_result)};
    ASSERT_OK(khub_kernel_fetch(e.hub, rt, "acme/ref@version=1", &ko, &kr));
    khub_runtime_free(rt);
    khub_hub_id id = fx_id("acme/ref");
    khub_hub_file_list *l = NULL;
    ASSERT_OK(khub_hub_variant_files(e.hub, &id, C1, e.fx.variant, &l));
    ASSERT_EQ(l->count, 1);
    char real[1024], want[65], got[65];
    snprintf(real, sizeof real, "%s", l->items[0].path);
    memcpy(want, l->items[0].sha256, 65);
    khub_hub_file_list_free(l);
    size_t n;
    char *so = read_bytes(real, &n);
    so[200] ^= 0x55;
    ASSERT_OK(khub__sha256_hex(so, n, got));
    FILE *f = fopen(real, "r+b"); /* in place: same inode and size */
    ASSERT(f != NULL);
    ASSERT_EQ(fwrite(so, 1, n, f), n);
    ASSERT_EQ(fclose(f), 0);
    free(so);
    char line[2048], side[1024], text[2100];
    ASSERT(khub__verified_line(real, NULL, "ref.so", want, line, sizeof line, NULL));
    snprintf(text, sizeof text, "khub-verified 1\n%s", line);
    snprintf(side, sizeof side, "%s/kernels--acme--ref/khub-verified/" C1 "/%s", e.fx.cache,
             e.fx.variant);
    fx_write(side, text, strlen(text));
    /* a fresh handle (no notes of its own): the hub trusts the fingerprint */
    khub_hub_free(e.hub);
    e.hub = fx_hub(&e.fx, 0, NULL);
    ASSERT_OK(khub_hub_variant_files(e.hub, &id, C1, e.fx.variant, &l));
    khub_hub_file_list_free(l);
    rt = runtime(0);
    ASSERT_STATUS(khub_kernel_fetch(e.hub, rt, "acme/ref@version=1", &ko, &kr),
                  KHUB_STATUS_DIGEST_MISMATCH);
    char msg[2048];
    snprintf(msg, sizeof msg,
             "plugin file %s: SHA-256 is %s, expected %s; the file is not the one that was "
             "verified, fetch it again",
             real, got, want);
    ASSERT_STR_EQ(khub_runtime_errmsg(rt), msg);
    ASSERT_EQ(khub_plugin_count(rt), (size_t)0);
    khub_runtime_free(rt);
    env_done(&e);
}

/* A Hub ID never takes over a copy of its plugin file that the embedder
 * loaded itself with khub_plugin_load, which runs no ABI gate (local
 * plugins are the embedder's choice): the fetch loads its own copy, gated,
 * and a build the gate refuses stays refused. Here the published plugin
 * has a RUNPATH (test plugin hostile_runpath); the embedder loads the
 * cached file by hand; khub_kernel_fetch is then refused by the gate as it
 * is without that copy (session 19: it returned the embedder's copy, OK). */
TEST_IMPL(hub_id_never_reuses_an_ungated_copy)
{
    env e;
    env_init_with(&e, false);
    publish_so(&e.fx, "acme/rp", fx_arch(), KHUB_TEST_PLUGIN_DIR "/hostile_runpath.so", "", 0);
    khub_kernel_opts ko = {KHUB_STRUCT_INIT(khub_kernel_opts), .policy_path = e.policy,
                           .allow_unsigned = 1};
    khub_kernel_result kr = {KHUB_STRUCT_INIT(khub_kernel_result)};
    khub_runtime *rt = runtime(0);
    ASSERT_STATUS(khub_kernel_fetch(e.hub, rt, "acme/rp@version=1", &ko, &kr),
                  KHUB_STATUS_PLUGIN_INVALID);
    char want[2048];
    snprintf(want, sizeof want, "%s", khub_runtime_errmsg(rt));
    ASSERT_CONTAINS(want, "/blobs/");
    ASSERT_CONTAINS(want, ": refused before loading: the ABI gate found 1 problem(s): has RUNPATH "
                          "'/opt/khub-hostile-lib' (plugins must not carry search paths)");
    khub_runtime_free(rt);
    khub_hub_id id = fx_id("acme/rp");
    khub_hub_file_list *l = NULL;
    ASSERT_OK(khub_hub_variant_files(e.hub, &id, C1, e.fx.variant, &l));
    ASSERT_EQ(l->count, 1);
    rt = runtime(0);
    khub_plugin *mine = NULL;
    ASSERT_OK(khub_plugin_load(rt, l->items[0].path, l->items[0].sha256, &mine));
    khub_hub_file_list_free(l);
    ASSERT_STATUS(khub_kernel_fetch(e.hub, rt, "acme/rp@version=1", &ko, &kr),
                  KHUB_STATUS_PLUGIN_INVALID);
    ASSERT_STR_EQ(khub_runtime_errmsg(rt), want);
    ASSERT_EQ(khub_plugin_count(rt), (size_t)1); /* the embedder's copy, nothing else */
    khub_runtime_free(rt);
    env_done(&e);
}

/* Every built-in name that khub.json accepts and the errors quote
 * (khub__builtin_names) resolves as built-in in khub_model_load_hub, so the
 * two can never disagree (model_kernels.c kept a list of its own before
 * session 18). The names are resolved before the model is read. */
TEST_IMPL(builtin_names_resolve_as_built_in)
{
    khub_hub_opts ho = {KHUB_APP_INIT(khub_hub_opts), .offline = 1, .token = ""};
    khub_hub *hub = NULL;
    ASSERT_OK(khub_hub_new(&ho, &hub));
    khub_runtime *rt = runtime(1);
    static const khub_role roles[] = {KHUB_ROLE_ATTENTION, KHUB_ROLE_QUANT, KHUB_ROLE_CACHE};
    int n_names = 0;
    for (size_t r = 0; r < sizeof roles / sizeof roles[0]; r++) {
        const char *list = khub__builtin_names(roles[r]);
        ASSERT(list != NULL);
        for (const char *p = list; *p; p += strspn(p, ", ")) {
            char name[64];
            size_t w = strcspn(p, ",");
            ASSERT(w > 0 && w < sizeof name);
            snprintf(name, sizeof name, "%.*s", (int)w, p);
            p += w;
            khub_model_kernels k = {KHUB_APP_INIT(khub_model_kernels)};
            if (roles[r] == KHUB_ROLE_ATTENTION) k.attn = name;
            if (roles[r] == KHUB_ROLE_QUANT) k.quant = name;
            if (roles[r] == KHUB_ROLE_CACHE) k.cache = name;
            khub_model_kernels_report rep;
            khub_model *m = NULL;
            khub_status st =
                khub_model_load_hub(hub, rt, "/nonexistent/m.gguf", NULL, &k, &m, &rep);
            ASSERT(st != KHUB_STATUS_OK && st != KHUB_STATUS_BAD_ID); /* the file is missing */
            char want[128];
            snprintf(want, sizeof want, "%s: %s%s", khub__role_name(roles[r]),
                     roles[r] == KHUB_ROLE_QUANT ? "scheme " : "", name);
            ASSERT_CONTAINS(rep.text, want);
            ASSERT_CONTAINS(rep.text, "(built-in");
            n_names++;
        }
    }
    ASSERT_EQ(n_names, 2 + 4 + 9);
    khub_runtime_free(rt);
    khub_hub_free(hub);
}

#define TEST_LIST(X) \
    X(attn_by_hub_id_with_threads_and_device) \
    X(mapping_override_and_errors) \
    X(locked_load_no_request_and_tamper) \
    X(no_variant_falls_back_or_strict_fails) \
    X(embedding_role_binds_the_named_plugin) \
    X(builtin_names_resolve_as_built_in) \
    X(fetched_kernel_judged_again_by_its_id) \
    X(fetched_build_sharing_a_loaded_id_refused) \
    X(trusted_fingerprint_never_loads_changed_bytes) \
    X(hub_id_never_reuses_an_ungated_copy) \
    /* end */
TEST_MAIN(TEST_LIST)
