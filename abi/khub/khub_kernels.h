/*
 * khub_kernels.h: kernels named by Hub ID, fetched, verified and loaded in
 * one call: what `attn_implementation="kernels-community/flash-attn2"` does
 * in Transformers, with the trust policy and the lock file enforced.
 *
 *     khub_hub *hub = NULL;
 *     khub_hub_new(NULL, &hub);
 *     khub_kernel_opts ko = {KHUB_APP_INIT(khub_kernel_opts), .lock_path = "khub.lock"};
 *     khub_kernel_result kr = {KHUB_APP_INIT(khub_kernel_result)};
 *     if (khub_kernel_fetch(hub, rt, "kernels-community/flash-attn2@version=1", &ko, &kr))
 *         fprintf(stderr, "%s\n", khub_runtime_errmsg(rt));
 *     khub_op_query q = {KHUB_APP_INIT(khub_op_query), .kind = KHUB_OP_ATTENTION,
 *                        .plugin_id = kr.plugin_id, .op_name = kr.op_name[0] ? kr.op_name : NULL};
 *
 * A model with its kernels named by Hub ID (from_pretrained's
 * attn_implementation, quantization_config and cache_implementation, with
 * the device and threads in the base options):
 *
 *     khub_model_opts mo = {KHUB_APP_INIT(khub_model_opts), .device = {KHUB_DEVICE_CPU, 0}};
 *     khub_model_kernels mk = {KHUB_APP_INIT(khub_model_kernels),
 *                              .attn = "kernels-community/flash-attn2", .quant = "nf4",
 *                              .cache = "static", .mapping_path = "khub.json"};
 *     khub_model *m = NULL;
 *     khub_model_load_hub(hub, rt, "SmolLM2-135M-Instruct-hf", &mo, &mk, &m, NULL);
 *
 * The pipeline: parse the ID; resolve it to a commit (or take the locked
 * commit); list and rank the variants for this host; download the best one
 * (one request for its archive); on a locked load compare every cached file
 * with khub.lock; decide trust on the exact bytes of metadata.json and
 * metadata.json.sig; only then parse metadata.json and check every file's
 * digest; pick the plugin file for this CPU's features; load exactly those
 * bytes with the variant's other verified files as its artifact directory
 * (host->artifact). docs/lockfile.md and docs/kernel-mapping.md describe the
 * files involved.
 *
 * Errors: the status says what kind of failure, khub_runtime_errmsg(rt) what
 * failed, on what, and what to do. Threading: as khub_hub (one thread per
 * handle). Anything not declared in abi/khub/ is not part of khub's API.
 */
#ifndef KHUB_KERNELS_H
#define KHUB_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "khub.h"
#include "khub_hub.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct khub_kernel_opts {
    KHUB_STRUCT_HEADER;
    /* Trust policy file (docs: hub/trust.h format). NULL = $KHUB_POLICY, else
     * $XDG_CONFIG_HOME/khub/policy.json or ~/.config/khub/policy.json when it
     * exists, else the default policy (no trusted keys, no opt-in). A named
     * file that cannot be read is an error. Borrowed. */
    const char *policy_path;
    /* khub.lock to load through, NULL = unlocked. With a lock the kernel must
     * be in it: its commit is used and every cached file is compared with
     * the lock's digests (LOCK_MISMATCH names the file). Borrowed. */
    const char *lock_path;
    int32_t allow_unsigned; /* 1 = accept unsigned kernels of organisations the policy omits */
    int32_t strict;         /* 1 = no variant for this host is NO_VARIANT, not a fallback */
    /* 1 = load a build whose signed metadata.json names another kernel or
     * variant than the one asked for (a warning); 0 = NAME_MISMATCH. */
    int32_t allow_name_mismatch;
    /* End of 0.1. */
} khub_kernel_opts;

typedef struct khub_kernel_result {
    KHUB_STRUCT_HEADER;
    khub_plugin *plugin; /* borrowed, valid until unloaded; NULL when fell_back */
    char plugin_id[64];  /* the loaded plugin's id, or "khub/ref-cpu" when fell_back */
    char op_name[128];   /* the ID's :symbol, "" if none (khub_op_query.op_name) */
    char repo[196];      /* "org/name" */
    char commit[41];     /* the commit loaded */
    char variant[128];   /* "khub1-cpu-x86_64-linux", "" when fell_back */
    char file[128];      /* the plugin file chosen for this CPU level */
    char trust[256];     /* the trust decision, one line */
    int32_t fell_back;   /* 1 = no variant fits; the reference plugin serves the role */
    int32_t locked;      /* 1 = loaded through the lock, its hashes re-checked */
    char trace[2048];    /* one line per variant: "name: accept|reject: reason" */
    /* End of 0.1. */
} khub_kernel_result;

/* Fetches, verifies and loads the kernel named by id
 * ("org/name[@REV|@version=N][:symbol]") into rt; see the pipeline above.
 * opts may be NULL; out (struct_size set by the caller, at least 0.1's)
 * receives what was loaded, also what is known after a failure (repo,
 * commit, trace), written only up to its struct_size. Statuses: those of
 * khub_hub_id_parse, khub_hub_resolve, khub_hub_download_variant and
 * khub_plugin_load, plus NO_VARIANT (strict, or no plugin file fits this
 * CPU), UNSIGNED, KEY_UNKNOWN, KEY_REVOKED, SIGNATURE_INVALID,
 * LOCK_MISMATCH, NAME_MISMATCH (the signed metadata names another kernel or
 * variant), NOT_FOUND (not in the lock), STRUCT_SIZE (out below 0.1's size,
 * struct_size 0 included, before anything is fetched; since 0.2, where
 * 0.1 cleared sizeof bytes of it; opts below 0.1's size, 0 included, since
 * 0.2, where 0 meant the whole struct). Since 0.1. */
KHUB_API khub_status khub_kernel_fetch(khub_hub *hub, khub_runtime *rt, const char *id,
                                       const khub_kernel_opts *opts, khub_kernel_result *out);

/* ------------------------------------------------------------------------ */
/* Loading a model with kernels named by Hub ID                             */
/* ------------------------------------------------------------------------ */

struct khub_model;
struct khub_model_opts;

/* The kernel roles of a model, one line each, the single list that every
 * other names them from: khub.json's "roles" keys, `khub run`'s flags, the
 * fields of khub_model_kernels and of khub_model_opts, and the executor's
 * preferences.
 *
 *     X(NAME, name, flag, opts_field)
 *       NAME        KHUB_KERNEL_ROLE_<NAME> below
 *       name        the role in khub.json ("roles": {"attention": ...}) and in
 *                   messages ("attention kernel ...")
 *       flag        khub run's option (--attn) and the khub_model_kernels field
 *       opts_field  the khub_model_opts field (khub_model.h) that receives the
 *                   loaded plugin's id
 *
 * The order is the enum's. The khub_model_kernels fields of the roles of
 * 0.1 (attention to linear) are in that order, and those of later roles
 * are appended at the struct's end, as are their khub_model_opts fields;
 * the library checks both at compile time (their layout is frozen). Roles
 * are appended only at the end. Since 0.1; embedding since 0.2 (the token
 * embedding lookup, op kind 9 of plugin ABI 1.5: khub.json's "embedding",
 * `khub run --embed`). */
#define KHUB_KERNEL_ROLES(X) \
    X(ATTENTION, attention, attn, attn_impl) \
    X(QUANT, quantization, quant, quant) \
    X(CACHE, cache, cache, cache_impl) \
    X(NORM, norm, norm, norm_impl) \
    X(ACTIVATION, activation, act, act_impl) \
    X(ROTARY, rotary, rotary, rotary_impl) \
    X(LINEAR, linear, linear, linear_impl) \
    X(EMBEDDING, embedding, embed, embed_impl)

typedef enum khub_kernel_role {
#define KHUB__KERNEL_ROLE_ENUM(NAME, name, flag, field) KHUB_KERNEL_ROLE_##NAME,
    KHUB_KERNEL_ROLES(KHUB__KERNEL_ROLE_ENUM)
#undef KHUB__KERNEL_ROLE_ENUM
        KHUB_KERNEL_ROLE__COUNT /* never use: the number of roles */
} khub_kernel_role;

/* "attention" for KHUB_KERNEL_ROLE_ATTENTION; "unknown" outside the list.
 * Static storage. Since 0.1. */
KHUB_API const char *khub_kernel_role_name(khub_kernel_role role);
/* The role named name ("quantization"), or KHUB_KERNEL_ROLE__COUNT when no
 * role has that name. Since 0.1. */
KHUB_API khub_kernel_role khub_kernel_role_from_name(const char *name);

/* Which kernel serves each role, the from_pretrained(attn_implementation=...)
 * equivalent. Each field is NULL (no preference; the mapping file may name
 * one), a built-in name (attn "eager"/"sdpa", cache "dynamic"/"static",
 * quant "int8"/"nf4"/"q8_0"/"q4_0"; served by the built-in plugins, never
 * fetched: cache "static" is khub/ref-cpu's static_cache, the Hub's is
 * "kernels-community/kv-cache:static_cache"), the id of a plugin the caller
 * loaded itself with khub_plugin_load, _load_static, _load_builtin or
 * khub_plugin_reload (alone or "id:op" for one of its ops; never fetched), or
 * a Hub ID (fetched, verified and loaded at every call, also when an earlier
 * fetch loaded it: the loaded copy is reused when its file and digest are the
 * same; quant takes "org/name:scheme"). A model load refuses a fetched plugin
 * whose id another build loaded in the runtime also has (EXISTS): the model
 * binds by id. All strings are borrowed for the call. */
typedef struct khub_model_kernels {
    KHUB_STRUCT_HEADER;
    /* One per role of KHUB_KERNEL_ROLES of 0.1, in its order (its flag names
     * them); later roles' fields follow strict. */
    const char *attn, *quant, *cache, *norm, *act, *rotary, *linear;
    /* khub.json; NULL = the model folder's (or the .gguf's folder's)
     * khub.json, else ./khub.json, else none. Command-line names (the fields
     * above) override it. */
    const char *mapping_path;
    /* khub.lock to load through (every role), or NULL: then a khub.lock next
     * to the mapping file, when there is one, pins the roles the mapping
     * names, and the fields above load unlocked. */
    const char *lock_path;
    const char *policy_path; /* trust policy, or NULL (see khub_kernel_opts) */
    int32_t allow_unsigned;  /* opt in to unsigned kernels of unlisted organisations */
    int32_t strict;          /* no fallback: a kernel with no variant here is an error */
    /* End of 0.1. */
    /* The embedding role's kernel, as the role fields above (added in 0.2;
     * read only when struct_size covers it). */
    const char *embed;
} khub_model_kernels;

/* What was resolved, one line per role: "attention: kernels-community/flash-
 * attn2 -> ... commit ... variant ... file ...; <trust decision>". */
typedef struct khub_model_kernels_report {
    char text[8192];
} khub_model_kernels_report;

/* Resolves every role's kernel (see khub_model_kernels), fetches and loads
 * the named ones into rt, then loads the model with them preferred for
 * their roles (khub_model_load with base's other options). A kernel with no
 * variant for this machine falls back to the reference plugin with a warning
 * carrying the variant trace, or with strict fails with NO_VARIANT. rep may
 * be NULL. Statuses: those of khub_kernel_fetch and khub_model_load, and
 * PARSE for a malformed mapping file (the message names the field).
 * Since 0.1. */
KHUB_API khub_status khub_model_load_hub(khub_hub *hub, khub_runtime *rt, const char *path,
                                         const struct khub_model_opts *base,
                                         const khub_model_kernels *kernels, struct khub_model **out,
                                         khub_model_kernels_report *rep);

/* ------------------------------------------------------------------------ */
/* Swapping a role's kernel in a loaded model (a live reload)               */
/* ------------------------------------------------------------------------ */

/* A kernel made ready to serve a role: resolved, fetched, verified, loaded
 * and self-tested by khub_kernel_swap_prepare, switched in by
 * khub_model_kernel_swap. The two steps let a server do the slow, fallible
 * part on any thread while its model keeps generating, and switch on the
 * model's own thread between two forward calls:
 *
 *     khub_kernel_swap sw = {KHUB_APP_INIT(khub_kernel_swap)};
 *     khub_model_kernels policy = {KHUB_APP_INIT(khub_model_kernels),
 *                                  .lock_path = "khub.lock"};
 *     if (khub_kernel_swap_prepare(hub, rt, KHUB_KERNEL_ROLE_ATTENTION,
 *                                  "kernels-community/flash-attn2@v2", &policy, &sw) ||
 *         khub_model_kernel_swap(m, &sw))               // on the model's thread
 *         fprintf(stderr, "%s\n", khub_last_error());   // the old kernel still serves
 */
typedef struct khub_kernel_swap {
    KHUB_STRUCT_HEADER;
    int32_t role; /* khub_kernel_role */
    /* 0 in 0.1. Since 0.2 (session 16), in a 0.1-sized struct only (one
     * whose struct_size ends before `name`), khub_kernel_swap_prepare writes
     * a tag of its load of plugin here (never 0), which khub_model_kernel_swap
     * checks as it checks plugin_load; 0, as in a struct filled by hand:
     * checked by address (set it to 0 when replacing a prepared plugin by
     * hand). A struct of 0.2's size leaves it 0. */
    uint32_t reserved;
    khub_plugin *plugin;   /* borrowed: the loaded plugin that serves the role after the swap */
    char op_name[128];     /* the ID's :symbol, "" = the plugin's best op of the role's kind */
    char resolved[1024];   /* how the name was resolved, one line: "attention: ID -> org/name
                              commit C variant V file F; <trust decision>"
                              (khub_model_kernels_report's) */
    char selftest[256];    /* "passed", or "none" when the plugin has no selftest */
    char previous[192];    /* filled by khub_model_kernel_swap: the op that served the
                              role before ("khub/ref-cpu 0.1.0 :: attention") */
    char now_serving[192]; /* filled by khub_model_kernel_swap: the op serving it now */
    /* End of 0.1. */
    char name[1024];      /* filled by khub_kernel_swap_prepare: the name asked for, which the
                             other ranks of a tensor-parallel model prepare too (added in 0.2) */
    uint64_t plugin_load; /* filled by khub_kernel_swap_prepare: the runtime's number for this
                             load of plugin (never reused), which khub_model_kernel_swap checks;
                             0 in a struct filled by hand: checked by address (set it to 0 when
                             replacing a prepared plugin by hand) (added in 0.2) */
    uint32_t held;        /* 1 from a successful prepare until khub_model_kernel_swap or
                             khub_kernel_swap_release: the swap holds plugin (added in 0.2) */
    uint32_t reserved2;
} khub_kernel_swap;

/* Ownership of the prepared plugin (since 0.2). sw->plugin is borrowed:
 * it is the runtime's. While a prepared swap holds it (below), and while a
 * khub_model_kernel_swap runs with it, khub_plugin_unload and
 * khub_plugin_reload of it answer BUSY ("unload ID VER: N prepared kernel
 * swap(s) hold it; switch them (khub_model_kernel_swap) or release them
 * (khub_kernel_swap_release) first"; since session 15, when the unload
 * succeeded and a concurrent switch could read the freed plugin), so an
 * unload on another thread can never pull it from under the switch. A swap
 * that holds nothing (released, a 0.1 struct, one filled by hand) can find
 * its plugin gone; khub_model_kernel_swap refuses a plugin that is no
 * longer loaded in the model's runtime as the load it prepared (MISUSE,
 * below) instead of using it. A successful prepare holds
 * its plugin until khub_model_kernel_swap (either outcome),
 * khub_kernel_swap_release, or another prepare into the same struct. When
 * the hold ends, a plugin that the prepare itself loaded (it was not loaded
 * in rt before) is unloaded if no binding of any model uses it and no other
 * prepared swap holds it: a refused switch, a failed selftest, or a swap
 * released unswitched leaves rt's plugins as they were. A plugin a prepare
 * loaded stays the swaps' after a switch that succeeded: when a later
 * switch swaps it out and no binding of any model and no prepared swap
 * uses it, that switch unloads it (since session 15), so swaps back and
 * forth between Hub kernels keep rt's plugin count; khub_model_free of
 * the last model it serves unloads it likewise (since session 16). A
 * plugin the caller loaded (khub_plugin_load, khub_plugin_load_builtin,
 * _load_static, _reload, also while a prepare runs on another thread) or a
 * model load loaded is never unloaded by a swap or a model's free: it is
 * the caller's to unload (khub_plugin_unload succeeds once no model that
 * uses it is left). A pointer to a swap-loaded plugin (sw->plugin,
 * khub_plugin_at) is borrowed and is stale once a switch swapped it out or
 * the last model it served was freed. A 0.1 khub_kernel_swap (no
 * plugin_load) holds nothing after its prepare, so its plugin may be
 * unloaded before its switch; the load it prepared is tagged in its
 * `reserved` slot (since session 16), so the switch refuses a plugin loaded
 * later at that address (MISUSE, below) where it used to switch it in. What
 * its prepare loaded is the swaps' as above. */

/* Makes the kernel `name` ready to serve `role` of a model on rt, without
 * touching any model: resolves the name as khub_model_load_hub does (a
 * built-in alias, the id of a plugin the caller loaded, or a Hub ID
 * "org/name[@REV|@version=N][:symbol]"
 * fetched and verified under policy: its trust policy, allow_unsigned and
 * lock_path, whose pinned commit and hashes then apply; the role fields and
 * mapping_path are ignored; never a fallback to the reference plugin), loads
 * it into rt, and runs the plugin's selftest when it has one. Arbitrary file
 * paths are not names: loading code from a path needs khub_plugin_load's
 * explicit digest. Any thread (the runtime serialises loads); a model on rt
 * may keep running meanwhile. On failure nothing serves differently and
 * khub_last_error() (this thread's) says why. Statuses: INVALID_ARG (role
 * outside the list), UNSUPPORTED (cache, linear, quantization and embedding
 * cannot be swapped in a running model: the KV cache holds the sequences in
 * its plugin's format, the weights were laid out for their op at load), those
 * of khub_kernel_fetch (BAD_ID, REPO_NOT_FOUND, NO_VARIANT, UNSIGNED,
 * SIGNATURE_INVALID, KEY_UNKNOWN, DIGEST_MISMATCH, LOCK_MISMATCH, NOT_FOUND
 * when not in the lock, ...), and the selftest's failure status. policy may
 * be NULL (the default policy, unlocked). out is overwritten; a hold it
 * still had from an earlier prepare on rt is released first (see
 * "Ownership" above; since 0.2), and a plugin loaded by a prepare whose
 * selftest fails is unloaded again. Since 0.1. */
KHUB_API khub_status khub_kernel_swap_prepare(khub_hub *hub, khub_runtime *rt,
                                              khub_kernel_role role, const char *name,
                                              const khub_model_kernels *policy,
                                              khub_kernel_swap *out);
/* khub_kernel_swap_prepare for `role` of model m, on m's runtime: on a
 * model placed on a CUDA device (khub_model_opts.device) a role that runs
 * on the device gets a Hub ID's CUDA variant for that GPU, chosen, verified
 * (digests, trust policy, lock, quarantine) and loaded as
 * khub_model_load_hub chooses it, and sw->resolved names the variant and
 * the device. A kernel with no CUDA variant for the GPU: with
 * policy->strict NO_VARIANT ("... no CUDA variant runs on cuda:N (strict):
 * <each CUDA variant's verdict>", the load's message); else its CPU variant
 * is loaded (sw->resolved says why) and khub_model_kernel_swap refuses it
 * with NO_KERNEL, nothing changed: a swap never moves a role off the
 * device. A role on the CPU, or a model on the CPU: exactly
 * khub_kernel_swap_prepare. Any thread, while m keeps running on its own
 * (m is only read). Statuses: those of khub_kernel_swap_prepare. Since
 * 0.2. */
KHUB_API khub_status khub_model_kernel_swap_prepare(khub_hub *hub, const struct khub_model *m,
                                                    khub_kernel_role role, const char *name,
                                                    const khub_model_kernels *policy,
                                                    khub_kernel_swap *out);
/* Switches every op binding of sw->role in m to sw->plugin (attention: the
 * dense or the paged one; norm: with and without the residual), strictly:
 * if the plugin cannot serve one of them (head dim, dtype, flags, the paged
 * cache's KV layout) nothing changes and the status is NO_KERNEL with the
 * reason. Call it on the thread that runs m, between two calls of
 * khub_model_*: every later forward call uses the new kernel, none before
 * it did, so a generation in progress goes on, on the new kernel, from its
 * next step. The bindings replaced stay listed (retired) by
 * khub_model_binding_get with their final counts, and are released when
 * the call returns (since 0.2): nothing can call them any more, so
 * khub_plugin_unload of the old plugin succeeds when no other binding uses
 * it (before the switch it answers BUSY); an old plugin that a swap's
 * prepare loaded is unloaded by the switch itself when nothing else uses
 * it (see "Ownership" above). khub_model_explain answers the
 * new table. Fills sw->previous and sw->now_serving. On a model placed on
 * a CUDA device (since 0.2) a role that runs on the device switches to the
 * plugin's CUDA op and a role on the CPU to its CPU op (a plugin without
 * one is NO_KERNEL: a swap never moves a role between the two); the
 * model's stream is drained first and the decode step's CUDA graph
 * dropped, so the next decode step captures the new op. Prepare a Hub ID
 * for a placed model with khub_model_kernel_swap_prepare (its CUDA variant
 * for a device role); khub_kernel_swap_prepare resolves it to its CPU
 * variant. Statuses: NO_KERNEL, UNSUPPORTED (see above), NOT_FOUND (the
 * model has no op of the role), NOMEM, MISUSE, CUDA (draining the stream
 * failed; nothing changed), MISUSE (sw->plugin is not loaded in m's
 * runtime as the load prepared: "MODEL: kernel swap: the plugin prepared
 * for the ROLE role (NAME) is not loaded in this model's runtime (unloaded
 * or reloaded since it was prepared, or another runtime's); prepare it
 * again; nothing changed"; since 0.2). Either way the call ends sw's hold
 * (see "Ownership" above): on success the plugin is bound; when the switch
 * fails, a plugin its prepare loaded and nothing else uses is unloaded, so
 * sw->plugin must not be used after a failure.
 *
 * A model loaded with tp_size > 1 (rank 0, which drives) swaps on every
 * rank at the same step (since 0.2): rank 0 sends sw->name to the others,
 * which prepare it for themselves (khub_model_tp_serve_kernels: each rank
 * resolves, verifies and self-tests under its own policy and lock); every
 * rank then says whether it could, and whether it got the same plugin bytes
 * as rank 0, and only when all could does every rank switch (a rank whose
 * switch fails makes the others switch back). Otherwise no rank changes,
 * and the status and message are the first failing rank's, as
 * "tp rank R: <its reason>" (DIGEST_MISMATCH when a rank's plugin differs;
 * UNSUPPORTED when a rank follows with plain khub_model_tp_serve, or sw is a
 * 0.1 struct without name). The other ranks wait in the step while they
 * prepare. Since 0.1. */
KHUB_API khub_status khub_model_kernel_swap(struct khub_model *m, khub_kernel_swap *sw);
/* Ends a prepared swap that will not be switched: its hold on sw->plugin
 * is dropped, and the plugin is unloaded when the prepare loaded it and
 * nothing else uses it (see "Ownership" above). A swap already switched or
 * refused by khub_model_kernel_swap, released before, prepared by 0.1
 * (struct_size without `held`) or never prepared is left as it is; rt or sw
 * NULL: nothing. rt is the runtime the swap was prepared on. Any thread, but
 * not while khub_model_kernel_swap runs with the same sw. Since 0.2. */
KHUB_API void khub_kernel_swap_release(khub_runtime *rt, khub_kernel_swap *sw);
/* A rank other than 0 of a tensor-parallel model: khub_model_tp_serve, and
 * when rank 0 swaps a kernel (khub_model_kernel_swap), this rank prepares
 * the same name with hub under policy (as khub_kernel_swap_prepare; NULL =
 * the default policy) and switches with the others, or keeps its kernel with
 * them. A swap that fails does not end the loop; a failed collective does.
 * hub and policy are borrowed for the call. Statuses: those of
 * khub_model_tp_serve. Since 0.2. */
KHUB_API khub_status khub_model_tp_serve_kernels(struct khub_model *m, khub_hub *hub,
                                                 const khub_model_kernels *policy);

#ifdef __cplusplus
}
#endif

#endif /* KHUB_KERNELS_H */
