/*
 * kernel_mapping.h: khub.json, which kernel serves each role of a model,
 * per device type and CUDA capability range (docs/kernel-mapping.md).
 *
 *     {"format": 1,
 *      "roles": {
 *        "attention": "kernels-community/flash-attn2@version=1",
 *        "norm": {"cpu":  {"repo": "kernels-community/rmsnorm", "version": 1},
 *                 "cuda": [{"repo": "kernels-community/rmsnorm", "version": 1,
 *                           "capability": [75, 90]}]}},
 *      "dependencies": {"kernels-community/kv-cache": {"version": 1}}}
 *
 * Roles: KHUB_KERNEL_ROLES (khub_kernels.h): attention, quantization, cache,
 * norm, activation, rotary, linear.
 * Devices: cpu, cuda. Each rule has a version or a revision, never both.
 */
#ifndef KHUB_HUB_KERNEL_MAPPING_H
#define KHUB_HUB_KERNEL_MAPPING_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"
#include "khub/khub_hub.h"
#include "khub/khub_kernels.h"

/* The public khub_kernel_role under the hub's older names, generated from
 * the one table. */
typedef enum khub_role {
#define KHUB__ROLE_ALIAS(NAME, name, flag, field) KHUB_ROLE_##NAME = KHUB_KERNEL_ROLE_##NAME,
    KHUB_KERNEL_ROLES(KHUB__ROLE_ALIAS)
#undef KHUB__ROLE_ALIAS
        KHUB_ROLE__COUNT = KHUB_KERNEL_ROLE__COUNT
} khub_role;

#define KHUB_MAP_MAX_RULES 16
#define KHUB_MAP_MAX_DEPS  64
#define KHUB_MAP_ID_MAX    512

typedef struct khub_map_rule {
    uint32_t device;            /* khub_device_type */
    int32_t cc_min, cc_max;     /* inclusive capability x10; 0..INT32_MAX when not given */
    khub_hub_id id;             /* with its version or revision */
    char text[KHUB_MAP_ID_MAX]; /* canonical ID text (khub_hub_id_format), or the built-in name */
    int32_t builtin; /* 1 = text is a built-in name ("nf4", "quantized-int4"); id unset */
} khub_map_rule;

typedef struct khub_mapping {
    khub_map_rule rules[KHUB_ROLE__COUNT][KHUB_MAP_MAX_RULES];
    size_t n_rules[KHUB_ROLE__COUNT];
    khub_hub_id deps[KHUB_MAP_MAX_DEPS];
    char dep_text[KHUB_MAP_MAX_DEPS][KHUB_MAP_ID_MAX];
    size_t n_deps;
} khub_mapping;

/* "attention" -> KHUB_ROLE_ATTENTION; KHUB_ROLE__COUNT when unknown. */
KHUB_INTERNAL khub_role khub__role_from_name(const char *name);
KHUB_INTERNAL const char *khub__role_name(khub_role role);

/* The built-in names of each role that has them, served by the built-in
 * plugins and never fetched: X(name, op), op being the khub/ref-cpu op a
 * cache name runs ("" = the plugin's default, or for attention and
 * quantization no op of its own: khub/ref-cpu's, and a quantization
 * scheme). The one table behind khub.json's check, the command line's
 * (`khub run --quant nf4`) and runtime/kernels/model_kernels.c's
 * resolution. A cache name may carry options
 * ("quantized-int4,q_group_size=32"). */
#define KHUB__BUILTIN_ATTENTION(X) X("eager", "") X("sdpa", "")
#define KHUB__BUILTIN_QUANT(X)     X("int8", "") X("nf4", "") X("q8_0", "") X("q4_0", "")
#define KHUB__BUILTIN_CACHE(X) \
    X("dynamic", "") \
    X("static", "static_cache") \
    X("quantized", "quantized_cache") \
    X("quantized-int8", "quantized_cache") \
    X("quantized-int4", "quantized_cache_int4") \
    X("paged", "paged_cache") \
    X("sliding", "sliding_cache") \
    X("sliding_window", "sliding_cache") \
    X("offloaded", "offloaded_cache")

/* The built-in names a role takes (the table above), as one ", "-separated
 * list; NULL when the role has none. khub.json's parser and
 * runtime/kernels/model_kernels.c quote it in their errors. */
KHUB_INTERNAL const char *khub__builtin_names(khub_role role);

/* Parses khub.json text. Errors name the field path ("roles.norm.cuda[1]:
 * ..."): unknown role, unknown device type, malformed ID (with its column),
 * version and revision both set, bad capability range. Status PARSE (BAD_ID
 * for a malformed ID). *out is caller-freed with free(). */
KHUB_INTERNAL khub_status khub__mapping_parse(const char *json, size_t n, khub_mapping **out,
                                              char *errbuf, size_t errbuf_size);
KHUB_INTERNAL khub_status khub__mapping_load(const char *path, khub_mapping **out, char *errbuf,
                                             size_t errbuf_size);
/* The rule for role on this device: the device type must match and cc lie
 * in the range (cpu rules ignore cc); among several, the narrowest range
 * wins, then the first written. NULL when none. */
KHUB_INTERNAL const khub_map_rule *khub__mapping_pick(const khub_mapping *m, khub_role role,
                                                      uint32_t device, int32_t cc);
/* Every kernel the mapping names (roles on all devices, then dependencies),
 * each repo once, in order: ids[i] receives the canonical ID text. Returns
 * the count (at most cap). */
KHUB_INTERNAL size_t khub__mapping_kernels(const khub_mapping *m, const char **ids, size_t cap);

#endif /* KHUB_HUB_KERNEL_MAPPING_H */
