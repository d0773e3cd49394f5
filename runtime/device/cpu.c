/*
 * cpu.c: CPU feature detection with CPUID and XGETBV, capped by
 * KHUB_CPU_LEVEL.
 *
 * A feature counts only when the CPU reports it AND the OS saves its register
 * state (XCR0), which ggml's scorer does not check (its FIXME).
 *
 * KHUB_CPU_LEVEL (x86-64, avx2, avx512, native) removes the features above a
 * level from everything khub reports and chooses by: the runtime's
 * cpu_features (host API, registry, runtime features), the Hub's variant
 * and plugin-level choice, khub check. It only ever removes: a level above
 * the CPU's reports what the CPU has. One machine can so run the suite as a
 * CPU without AVX-512, or without AVX2, would (issue 11). An unknown value
 * masks down to x86-64 here (removing is always safe); khub_runtime_new and
 * the CLI refuse it with khub__cpu_level_check's message.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The names of the KHUB_CPU_* bits, in bit order: the one table behind
 * traces, listings, kernel.json and metadata.json. */
const khub__cpu_feature khub__cpu_features_table[] = {
    {KHUB_CPU_SSE42, "sse4.2"},
    {KHUB_CPU_AVX, "avx"},
    {KHUB_CPU_AVX2, "avx2"},
    {KHUB_CPU_FMA, "fma"},
    {KHUB_CPU_F16C, "f16c"},
    {KHUB_CPU_AVX512F, "avx512f"},
    {KHUB_CPU_AVX512VNNI, "avx512vnni"},
    {KHUB_CPU_AVX512BF16, "avx512bf16"},
    {KHUB_CPU_AVXVNNI, "avxvnni"},
    {KHUB_CPU_BMI2, "bmi2"},
};
const size_t khub__cpu_features_count =
    sizeof khub__cpu_features_table / sizeof khub__cpu_features_table[0];

uint32_t khub__cpu_feature_bit(const char *name)
{
    if (!name) return 0;
    if (strcmp(name, "sse42") == 0) return KHUB_CPU_SSE42; /* accepted spelling */
    for (size_t i = 0; i < khub__cpu_features_count; i++)
        if (strcmp(khub__cpu_features_table[i].name, name) == 0)
            return khub__cpu_features_table[i].bit;
    return 0;
}

void khub__cpu_feature_list(uint32_t mask, const char *sep, char *buf, size_t n)
{
    size_t used = 0;
    if (n) buf[0] = '\0';
    for (size_t i = 0; i < khub__cpu_features_count && used < n; i++)
        if (mask & khub__cpu_features_table[i].bit)
            used += (size_t)snprintf(buf + used, n - used, "%s%s", used ? sep : "",
                                     khub__cpu_features_table[i].name);
}

/* ------------------------------------------------------------------------ */
/* KHUB_CPU_LEVEL                                                           */
/* ------------------------------------------------------------------------ */

#define LEVEL_AVX2 \
    (KHUB_CPU_SSE42 | KHUB_CPU_AVX | KHUB_CPU_AVX2 | KHUB_CPU_FMA | KHUB_CPU_F16C | KHUB_CPU_BMI2)
#define LEVEL_ALL UINT32_MAX

/* Each level and the features it lets khub use. "x86-64" is the baseline
 * every x86-64 CPU has (SSE2), as GCC's -march=x86-64 means it; "avx2" is
 * x86-64-v3's set (AVX2, FMA, F16C, BMI2 and what they imply); "avx512"
 * and "native" leave every detected feature, AVX-512 VNNI/BF16 and
 * AVX-VNNI included (x86-64-v4 would drop VNNI, which cpu-avx512.so needs). */
static const struct {
    const char *name;
    uint32_t allow;
} cpu_levels[] = {
    {"x86-64", 0},         {"generic", 0},        {"avx2", LEVEL_AVX2},
    {"avx512", LEVEL_ALL}, {"native", LEVEL_ALL},
};

/* The features value lets khub use; UINT32_MAX for NULL or "" (unset);
 * *known is 0 (and the result 0, the x86-64 baseline) when value names no
 * level. */
static uint32_t level_allow(const char *value, int *known)
{
    *known = 1;
    if (!value || !value[0]) return LEVEL_ALL;
    for (size_t i = 0; i < sizeof cpu_levels / sizeof cpu_levels[0]; i++)
        if (strcmp(value, cpu_levels[i].name) == 0) return cpu_levels[i].allow;
    *known = 0;
    return 0;
}

int khub__cpu_level_check(char *errbuf, size_t n)
{
    int known;
    const char *v = getenv("KHUB_CPU_LEVEL");
    level_allow(v, &known);
    if (known) return 0;
    snprintf(errbuf, n,
             "KHUB_CPU_LEVEL=%.64s is not a CPU level; use x86-64 (alias generic), avx2, "
             "avx512 or native, or unset it",
             v);
    return -1;
}

const char *khub__cpu_level_of(uint32_t f)
{
    const uint32_t avx2 = KHUB_CPU_AVX2 | KHUB_CPU_FMA | KHUB_CPU_F16C;
    if ((f & (avx2 | KHUB_CPU_AVX512F)) == (avx2 | KHUB_CPU_AVX512F)) return "avx512";
    if ((f & avx2) == avx2) return "avx2";
    return "x86-64";
}

uint32_t khub_cpu_features(void)
{
    int known;
    return khub__cpu_features_host() & level_allow(getenv("KHUB_CPU_LEVEL"), &known);
}

/* ------------------------------------------------------------------------ */
/* Detection                                                                */
/* ------------------------------------------------------------------------ */

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static uint32_t cpu_detect(void)
{
    unsigned a, b, c, d;
    uint32_t f = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    int osxsave = (c >> 27) & 1;
    uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    int ymm_ok = (xcr0 & 0x6) == 0x6;   /* SSE and AVX state */
    int zmm_ok = (xcr0 & 0xe6) == 0xe6; /* plus opmask and ZMM state */
    if ((c >> 20) & 1) f |= KHUB_CPU_SSE42;
    if (ymm_ok && ((c >> 28) & 1)) f |= KHUB_CPU_AVX;
    if (ymm_ok && ((c >> 12) & 1)) f |= KHUB_CPU_FMA;
    if (ymm_ok && ((c >> 29) & 1)) f |= KHUB_CPU_F16C;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        if (ymm_ok && ((b >> 5) & 1)) f |= KHUB_CPU_AVX2;
        if ((b >> 8) & 1) f |= KHUB_CPU_BMI2;
        /* AVX-512 F, DQ, CD, BW, VL together */
        const unsigned avx512 = (1u << 16) | (1u << 17) | (1u << 28) | (1u << 30) | (1u << 31);
        if (zmm_ok && (b & avx512) == avx512) {
            f |= KHUB_CPU_AVX512F;
            if ((c >> 11) & 1) f |= KHUB_CPU_AVX512VNNI;
        }
        unsigned a1, b1, c1, d1;
        if (__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)) {
            if (ymm_ok && ((a1 >> 4) & 1)) f |= KHUB_CPU_AVXVNNI;
            if (zmm_ok && (f & KHUB_CPU_AVX512F) && ((a1 >> 5) & 1)) f |= KHUB_CPU_AVX512BF16;
        }
    }
    return f;
}

/* CPUID is a VM exit on most hypervisors (~1-2 us each, four leaves per
 * detection) and the answer cannot change while the process runs, so it
 * is asked once; KHUB_CPU_LEVEL stays read on every khub_cpu_features()
 * call. Two threads racing on the first call compute the same value. */
uint32_t khub__cpu_features_host(void)
{
    static _Atomic uint32_t cached; /* detected | known_bit once asked */
    const uint32_t known_bit = 0x80000000u;
    uint32_t v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (!(v & known_bit)) {
        v = cpu_detect() | known_bit;
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v & ~known_bit;
}
#else
uint32_t khub__cpu_features_host(void) { return 0; }
#endif
