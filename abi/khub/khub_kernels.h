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
 * opts may be NULL; out (struct_size set by the caller) receives what was
 * loaded. Statuses: those of khub_hub_id_parse, khub_hub_resolve,
 * khub_hub_download_variant and khub_plugin_load, plus NO_VARIANT (strict,
 * or no plugin file fits this CPU), UNSIGNED, KEY_UNKNOWN, KEY_REVOKED,
 * SIGNATURE_INVALID, LOCK_MISMATCH, NAME_MISMATCH (the signed metadata names
 * another kernel or variant), NOT_FOUND (not in the lock). Since 0.1. */
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
 * The order is the enum's and the order of the khub_model_kernels fields,
 * which the library checks at compile time (their layout is frozen).
 * Roles are appended only at the end. Since 0.1. */
#define KHUB_KERNEL_ROLES(X) \
    X(ATTENTION, attention, attn, attn_impl) \
    X(QUANT, quantization, quant, quant) \
    X(CACHE, cache, cache, cache_impl) \
    X(NORM, norm, norm, norm_impl) \
    X(ACTIVATION, activation, act, act_impl) \
    X(ROTARY, rotary, rotary, rotary_impl) \
    X(LINEAR, linear, linear, linear_impl)

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
 * "kernels-community/kv-cache:static_cache"), the id of a plugin already loaded, or a
 * Hub ID (fetched, verified and loaded; quant takes "org/name:scheme"). All
 * strings are borrowed for the call. */
typedef struct khub_model_kernels {
    KHUB_STRUCT_HEADER;
    /* One per role of KHUB_KERNEL_ROLES, in its order (its flag names them). */
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

#ifdef __cplusplus
}
#endif

#endif /* KHUB_KERNELS_H */
