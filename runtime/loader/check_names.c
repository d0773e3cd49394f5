/*
 * check_names.c: the public names of op kinds, dtypes, capability flags and
 * CPU features (khub_check.h). Each wraps the one table that holds them
 * (op_kinds.c, registry.c, cpu.c), so reports made by programs and by the
 * CLI spell everything the same way.
 */
#include "internal.h"
#include "khub/khub_check.h"

const char *khub_op_kind_name(uint32_t kind) { return khub__op_kind_name(kind); }

uint32_t khub_op_kind_from_name(const char *name)
{
    return name ? khub__op_kind_from_name(name) : 0;
}

const char *khub_dtype_id_name(int32_t id) { return khub__dtype_id_name(id); }

void khub_cap_flag_names(uint32_t kind, uint64_t flags, const char *sep, char *buf, size_t n)
{
    if (!buf || !n) return;
    khub__cap_flag_names(kind, flags, sep ? sep : ",", buf, n);
}

const char *khub_cpu_feature_at(size_t i, uint32_t *bit)
{
    if (i >= khub__cpu_features_count) return NULL;
    if (bit) *bit = khub__cpu_features_table[i].bit;
    return khub__cpu_features_table[i].name;
}

void khub_cpu_feature_names(uint32_t mask, const char *sep, char *buf, size_t n)
{
    if (!buf || !n) return;
    khub__cpu_feature_list(mask, sep ? sep : ",", buf, n);
}

uint32_t khub_cpu_features_host(void) { return khub__cpu_features_host(); }

const char *khub_cpu_level_name(uint32_t features) { return khub__cpu_level_of(features); }

khub_status khub_cpu_level_check(char *errbuf, size_t errbuf_size)
{
    char msg[KHUB_ERROR_SIZE];
    if (khub__cpu_level_check(msg, sizeof msg) == 0) return KHUB_STATUS_OK;
    khub__errbuf(errbuf, errbuf_size, "%s", msg);
    return KHUB_STATUS_INVALID_ARG;
}

const char *khub_check_code_name(uint32_t code)
{
    switch (code) {
#define CODE_CASE(NAME, value, name) \
    case value: return #name;
        KHUB_CHECK_CODES(CODE_CASE)
#undef CODE_CASE
    default: return "unknown";
    }
}
