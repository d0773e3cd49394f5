/*
 * op_kinds.c: op kind names, generated from the one table in khub_plugin.h
 * (KHUB_OP_KINDS). kernel.json, traces, `khub plugins` and every message use
 * these words; no other file lists the kinds.
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"

const char *khub__op_kind_name(uint32_t kind)
{
    switch (kind) {
#define KIND_CASE(NAME, value, name) \
    case value: return #name;
        KHUB_OP_KINDS(KIND_CASE)
#undef KIND_CASE
    default: return "unknown";
    }
}

uint32_t khub__op_kind_from_name(const char *name)
{
#define KIND_MATCH(NAME, value, word) \
    if (strcmp(name, #word) == 0) return value;
    KHUB_OP_KINDS(KIND_MATCH)
#undef KIND_MATCH
    return 0;
}

/* Capability flags by kind: {kind, bit, name}. Bits 0-7 are the 1.0
 * KHUB_CAP_* word's, at the same positions (khub_plugin.h). */
typedef struct flag_name {
    uint32_t kind;
    uint64_t bit;
    const char *name;
} flag_name;

static const flag_name flag_names[] = {
    {KHUB_OP_ATTENTION, KHUB_ATTN_CAUSAL, "causal"},
    {KHUB_OP_ATTENTION, KHUB_ATTN_GQA, "gqa"},
    {KHUB_OP_ATTENTION, KHUB_ATTN_MASK, "mask"},
    {KHUB_OP_ATTENTION, KHUB_ATTN_STRIDED_KV, "strided_kv"},
    {KHUB_OP_ATTENTION, KHUB_ATTN_KV_F16, "kv_f16"},
    {KHUB_OP_ATTENTION, KHUB_ATTN_SLIDING, "sliding"},
    {KHUB_OP_ATTENTION, KHUB_ATTN_SOFTCAP, "softcap"}, /* 1.5 */
    {KHUB_OP_LINEAR, KHUB_LINEAR_BIAS, "bias"},
    {KHUB_OP_QLINEAR, KHUB_LINEAR_BIAS, "bias"},
    {KHUB_OP_NORM, KHUB_NORM_RESIDUAL, "residual"},
    {KHUB_OP_KV_CACHE, KHUB_KV_CACHE_STRIDED_VIEW, "strided_kv"},
    {KHUB_OP_KV_CACHE, KHUB_KV_CACHE_F16, "kv_f16"},
    /* paged_attention (1.4) takes attention's flags, same bits */
    {KHUB_OP_PAGED_ATTENTION, KHUB_ATTN_CAUSAL, "causal"},
    {KHUB_OP_PAGED_ATTENTION, KHUB_ATTN_GQA, "gqa"},
    {KHUB_OP_PAGED_ATTENTION, KHUB_ATTN_KV_F16, "kv_f16"},
    {KHUB_OP_PAGED_ATTENTION, KHUB_ATTN_SLIDING, "sliding"},
    {KHUB_OP_PAGED_ATTENTION, KHUB_ATTN_SOFTCAP, "softcap"},        /* 1.5 */
    {KHUB_OP_EMBEDDING, KHUB_EMBEDDING_SCALE, "scale"},             /* 1.5 */
    {KHUB_OP_EMBEDDING, KHUB_EMBEDDING_STRIDED_OUT, "strided_out"}, /* 1.5 */
};

void khub__cap_flag_names(uint32_t kind, uint64_t mask, const char *sep, char *buf, size_t n)
{
    size_t used = 0;
    if (!n) return;
    buf[0] = '\0';
    for (int b = 0; b < 64 && used < n; b++) {
        uint64_t bit = UINT64_C(1) << b;
        if (!(mask & bit)) continue;
        const char *name = NULL;
        for (size_t i = 0; i < sizeof flag_names / sizeof flag_names[0] && !name; i++)
            if (flag_names[i].kind == kind && flag_names[i].bit == bit) name = flag_names[i].name;
        char other[16];
        if (!name) snprintf(other, sizeof other, "bit%d", b);
        int w = snprintf(buf + used, n - used, "%s%s", used ? sep : "", name ? name : other);
        if (w < 0) return;
        used += (size_t)w;
    }
}

/* Paged KV layout names (khub_plugin.h, KHUB_KV_LAYOUT_*). */
const char *khub__kv_layout_name(uint32_t layout)
{
    switch (layout) {
    case KHUB_KV_LAYOUT_NONE: return "none";
    case KHUB_KV_LAYOUT_PAGED_HTD: return "paged_htd";
    case KHUB_KV_LAYOUT_PAGED_HTD_Q8: return "paged_htd_q8";
    default: return "unknown";
    }
}

void khub__kv_layouts_list(uint64_t mask, char *buf, size_t n)
{
    size_t used = 0;
    if (!n) return;
    snprintf(buf, n, "none");
    for (uint32_t b = 1; b < 64 && mask; b++) {
        if (!(mask & KHUB_KV_LAYOUT_BIT(b))) continue;
        int w = snprintf(buf + used, n - used, "%s%s", used ? " " : "", khub__kv_layout_name(b));
        if (w < 0 || (size_t)w >= n - used) return;
        used += (size_t)w;
    }
}
