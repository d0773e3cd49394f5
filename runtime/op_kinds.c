/*
 * op_kinds.c: op kind names, generated from the one table in khub_plugin.h
 * (KHUB_OP_KINDS). kernel.json, traces, `khub plugins` and every message use
 * these words; no other file lists the kinds.
 */
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
