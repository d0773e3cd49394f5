/*
 * test_emu512.c: plugins/cpu-x86/kx_emu512.h, the AVX2 emulation of the
 * AVX-512 instructions that the test-only cpu-avx512-emu.so runs in place of
 * the real ones (test_cpu_x86@avx512-emu), against scalar references written
 * from Intel's pseudo-code for each instruction, edge values included, and
 * against the real instructions where this CPU has them. Without this, the
 * emulated module's agreement with the oracles would say nothing about
 * cpu-avx512.so.
 *
 * Each reference is also pinned by a few values worked out by hand (a sum
 * that wraps, a fused product that an unfused one would round away), so
 * that a reference and an emulation wrong in the same way still fail.
 *
 * The vector code is compiled for AVX2 (a target pragma) and runs only
 * after the CPU was seen to have AVX2, FMA and F16C; elsewhere it skips.
 */
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include <khub/khub.h>
#include <khub/khub_check.h>

#include "runner.h"

#define AVX2_NEED   (KHUB_CPU_AVX2 | KHUB_CPU_FMA | KHUB_CPU_F16C)
#define AVX512_NEED (AVX2_NEED | KHUB_CPU_AVX512F | KHUB_CPU_AVX512VNNI)

static void need_avx2(void)
{
    if ((khub_cpu_features_host() & AVX2_NEED) != AVX2_NEED)
        TEST_SKIP("this CPU has no AVX2+FMA+F16C, which the emulation runs on");
}

/* ------------------------------------------------------------------------ */
/* Data                                                                     */
/* ------------------------------------------------------------------------ */

static uint64_t rng_state = 0x2545f4914f6cdd1du;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* 32 random bytes; one call in four draws from the extremes only (0x00,
 * 0x01, 0x7f, 0x80, 0xff), where wrap-around and sign errors show. */
static void rand_bytes(uint8_t b[32])
{
    static const uint8_t edge[] = {0x00, 0x01, 0x7f, 0x80, 0xff};
    int extremes = rnd() % 4 == 0;
    for (int i = 0; i < 32; i++) b[i] = extremes ? edge[rnd() % 5] : (uint8_t)rnd();
}

/* A random float: normal, subnormal, zero, huge, of either sign. */
static float rand_float(void)
{
    uint32_t u = rnd(), kind = rnd() % 8;
    if (kind == 0) u &= 0x807fffffu;                    /* subnormal or zero */
    if (kind == 1) u = (u & 0x80000000u) | 0x7f000000u; /* 2^127 */
    if (kind >= 2) u = (u & 0x807fffffu) | (0x3c000000u + (rnd() % 0x06000000u)); /* ~2^-7..2^4 */
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ------------------------------------------------------------------------ */
/* Scalar references, from Intel's pseudo-code                              */
/* ------------------------------------------------------------------------ */

/* VPDPWSSD: DEST.dword[j] + a.word[2j] * b.word[2j] + a.word[2j+1] *
 * b.word[2j+1], sign-extended products, the sum modulo 2^32 (no saturation). */
static void ref_dpwssd(const int32_t src[8], const int16_t a[16], const int16_t b[16],
                       int32_t out[8])
{
    for (int j = 0; j < 8; j++) {
        uint32_t p0 = (uint32_t)((int32_t)a[2 * j] * (int32_t)b[2 * j]);
        uint32_t p1 = (uint32_t)((int32_t)a[2 * j + 1] * (int32_t)b[2 * j + 1]);
        out[j] = (int32_t)((uint32_t)src[j] + p0 + p1);
    }
}

/* VPDPBUSD: DEST.dword[j] + the four ZeroExtend(a.byte) * SignExtend(b.byte)
 * of the dword, modulo 2^32. */
static void ref_dpbusd(const int32_t src[8], const uint8_t a[32], const int8_t b[32],
                       int32_t out[8])
{
    for (int j = 0; j < 8; j++) {
        uint32_t sum = (uint32_t)src[j];
        for (int k = 0; k < 4; k++)
            sum += (uint32_t)((int32_t)a[4 * j + k] * (int32_t)b[4 * j + k]);
        out[j] = (int32_t)sum;
    }
}

/* VPADDB with merge masking: byte i is a + b modulo 2^8 where bit i of k is
 * set, else src's. */
static void ref_mask_add(const uint8_t src[32], uint32_t k, const uint8_t a[32],
                         const uint8_t b[32], uint8_t out[32])
{
    for (int i = 0; i < 32; i++) out[i] = (k >> i) & 1 ? (uint8_t)(a[i] + b[i]) : src[i];
}

/* VPMOVM2B: byte i is all ones where bit i of k is set. */
static void ref_movm(uint32_t k, uint8_t out[32])
{
    for (int i = 0; i < 32; i++) out[i] = (k >> i) & 1 ? 0xff : 0x00;
}

/* ------------------------------------------------------------------------ */
/* The emulation, and the real instructions, on arrays                      */
/* ------------------------------------------------------------------------ */

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#define KX_EMU512_NO_MAP
#include "../plugins/cpu-x86/kx_emu512.h"

#define LD(p)    _mm256_loadu_si256((const __m256i *)(const void *)(p))
#define ST(p, v) _mm256_storeu_si256((__m256i *)(void *)(p), v)

static void emu_dpwssd(const int32_t src[8], const int16_t a[16], const int16_t b[16],
                       int32_t out[8])
{
    ST(out, kx_emu_dpwssd_epi32(LD(src), LD(a), LD(b)));
}

static void emu_dpbusd(const int32_t src[8], const uint8_t a[32], const int8_t b[32],
                       int32_t out[8])
{
    ST(out, kx_emu_dpbusd_epi32(LD(src), LD(a), LD(b)));
}

static void emu_mask_add(const uint8_t src[32], uint32_t k, const uint8_t a[32],
                         const uint8_t b[32], uint8_t out[32])
{
    ST(out, kx_emu_mask_add_epi8(LD(src), k, LD(a), LD(b)));
}

static void emu_movm(uint32_t k, uint8_t out[32]) { ST(out, kx_emu_movm_epi8(k)); }

/* out[16] = a * b + c, through kx_emu_fmadd_ps and unaligned stores; a is
 * loaded with the aligned load (a 64-byte aligned). */
static void emu_fmadd(const float *a, const float b[16], const float c[16], float out[16])
{
    kx_emu_m512 vb, vc;
    vb.lo = _mm256_loadu_ps(b), vb.hi = _mm256_loadu_ps(b + 8);
    vc.lo = _mm256_loadu_ps(c), vc.hi = _mm256_loadu_ps(c + 8);
    kx_emu_storeu_ps(out, kx_emu_fmadd_ps(kx_emu_load_ps(a), vb, vc));
}

static void emu_set1_store(float x, float *out) { kx_emu_storeu_ps(out, kx_emu_set1_ps(x)); }
static void emu_zero_store(float *out) { kx_emu_storeu_ps(out, kx_emu_setzero_ps()); }
static float emu_load_lane(const float *p, int lane)
{
    float v[16];
    kx_emu_storeu_ps(v, kx_emu_load_ps(p));
    return v[lane];
}

#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl," \
                                                   "avx512dq,avx512vnni"))), \
                             apply_to = function)
#else
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
#endif

/* The same on the real instructions (only called on an AVX-512 VNNI CPU). */
static void hw_dpwssd(const int32_t src[8], const int16_t a[16], const int16_t b[16],
                      int32_t out[8])
{
    ST(out, _mm256_dpwssd_epi32(LD(src), LD(a), LD(b)));
}

static void hw_dpbusd(const int32_t src[8], const uint8_t a[32], const int8_t b[32], int32_t out[8])
{
    ST(out, _mm256_dpbusd_epi32(LD(src), LD(a), LD(b)));
}

static void hw_mask_add(const uint8_t src[32], uint32_t k, const uint8_t a[32], const uint8_t b[32],
                        uint8_t out[32])
{
    ST(out, _mm256_mask_add_epi8(LD(src), (__mmask32)k, LD(a), LD(b)));
}

static void hw_movm(uint32_t k, uint8_t out[32]) { ST(out, _mm256_movm_epi8((__mmask32)k)); }

static void hw_fmadd(const float *a, const float b[16], const float c[16], float out[16])
{
    _mm512_storeu_ps(out,
                     _mm512_fmadd_ps(_mm512_load_ps(a), _mm512_loadu_ps(b), _mm512_loadu_ps(c)));
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* ------------------------------------------------------------------------ */
/* Integer instructions                                                     */
/* ------------------------------------------------------------------------ */

/* Every lane of three results equal, naming the first that differs. */
static void same_i32(const char *what, int iter, const int32_t want[8], const int32_t got[8])
{
    for (int j = 0; j < 8; j++)
        if (want[j] != got[j])
            TEST_FAIL_("%s, case %d, dword %d: got %d (0x%08x), want %d (0x%08x)", what, iter, j,
                       got[j], (unsigned)got[j], want[j], (unsigned)want[j]);
}

static void same_u8(const char *what, int iter, const uint8_t want[32], const uint8_t got[32])
{
    for (int i = 0; i < 32; i++)
        if (want[i] != got[i])
            TEST_FAIL_("%s, case %d, byte %d: got 0x%02x, want 0x%02x", what, iter, i, got[i],
                       want[i]);
}

TEST_IMPL(dpwssd_edges_by_hand)
{
    need_avx2();
    int32_t src[8], out[8], want[8];
    int16_t a[16], b[16];
    /* -32768 * -32768 twice: 2^31, which wraps to INT32_MIN (vpmaddwd's one
     * wrap), plus src 0 / -1 / INT32_MAX */
    for (int i = 0; i < 16; i++) a[i] = b[i] = INT16_MIN;
    for (int j = 0; j < 8; j++) src[j] = j == 0 ? 0 : j == 1 ? -1 : INT32_MAX;
    emu_dpwssd(src, a, b, out);
    ASSERT_EQ(out[0], INT32_MIN);
    ASSERT_EQ(out[1], INT32_MAX); /* -2^31 - 1 wraps */
    ASSERT_EQ(out[2], -1);        /* 2^31 - 1 + 2^31 */
    /* the accumulator alone wraps: INT32_MAX + 1 * 1 + 1 * 1 */
    for (int i = 0; i < 16; i++) a[i] = b[i] = 1;
    emu_dpwssd(src, a, b, out);
    ASSERT_EQ(out[2], INT32_MIN + 1);
    /* mixed signs, no saturation: 32767 * -32768 + -32768 * 32767 = -2^31 + 2^16 */
    for (int i = 0; i < 16; i++)
        a[i] = (int16_t)(i % 2 ? INT16_MIN : INT16_MAX),
        b[i] = (int16_t)(i % 2 ? INT16_MAX : INT16_MIN);
    src[3] = -(1 << 16) - 1;
    emu_dpwssd(src, a, b, out);
    ASSERT_EQ(out[3], INT32_MAX); /* -2^31 - 1 wraps */
    ref_dpwssd(src, a, b, want);
    same_i32("dpwssd vs reference", 0, want, out);
}

TEST_IMPL(dpwssd_matches_pseudocode)
{
    need_avx2();
    for (int iter = 0; iter < 200000; iter++) {
        int32_t src[8], out[8], want[8];
        int16_t a[16], b[16];
        rand_bytes((uint8_t *)a), rand_bytes((uint8_t *)b);
        for (int j = 0; j < 8; j++) src[j] = (int32_t)(rnd() << (rnd() % 2 ? 16 : 0));
        if (iter % 5 == 0) src[iter % 8] = iter % 2 ? INT32_MAX : INT32_MIN;
        ref_dpwssd(src, a, b, want);
        emu_dpwssd(src, a, b, out);
        same_i32("dpwssd", iter, want, out);
    }
}

TEST_IMPL(dpbusd_edges_by_hand)
{
    need_avx2();
    int32_t src[8] = {0, 0, INT32_MIN, INT32_MAX, 7, 0, 0, 0}, out[8], want[8];
    uint8_t a[32];
    int8_t b[32];
    /* 255 x -128 quads: -130560 each, which vpmaddubsw would saturate */
    for (int i = 0; i < 32; i++) a[i] = 255, b[i] = INT8_MIN;
    emu_dpbusd(src, a, b, out);
    ASSERT_EQ(out[0], -130560);
    ASSERT_EQ(out[2], INT32_MAX - 130560 + 1); /* INT32_MIN - 130560 wraps */
    ASSERT_EQ(out[3], INT32_MAX - 130560);
    /* 255 x 127: 129540; the accumulator wraps at INT32_MAX */
    for (int i = 0; i < 32; i++) b[i] = INT8_MAX;
    emu_dpbusd(src, a, b, out);
    ASSERT_EQ(out[0], 129540);
    ASSERT_EQ(out[3], INT32_MIN + 129540 - 1);
    /* a is unsigned, b signed: 128 x -1 is -128, not 128 or -(-128) */
    for (int i = 0; i < 32; i++) a[i] = (uint8_t)(i % 4 == 1 ? 0x80 : 0), b[i] = -1;
    emu_dpbusd(src, a, b, out);
    ASSERT_EQ(out[0], -128);
    ASSERT_EQ(out[4], 7 - 128);
    ref_dpbusd(src, a, b, want);
    same_i32("dpbusd vs reference", 0, want, out);
}

TEST_IMPL(dpbusd_matches_pseudocode)
{
    need_avx2();
    for (int iter = 0; iter < 200000; iter++) {
        int32_t src[8], out[8], want[8];
        uint8_t a[32];
        int8_t b[32];
        rand_bytes(a), rand_bytes((uint8_t *)b);
        for (int j = 0; j < 8; j++) src[j] = (int32_t)(rnd() << (rnd() % 2 ? 16 : 0));
        if (iter % 5 == 0) src[iter % 8] = iter % 2 ? INT32_MAX : INT32_MIN;
        ref_dpbusd(src, a, b, want);
        emu_dpbusd(src, a, b, out);
        same_i32("dpbusd", iter, want, out);
    }
}

TEST_IMPL(mask_add_and_movm_match_pseudocode)
{
    need_avx2();
    uint8_t src[32], a[32], b[32], out[32], want[32];
    /* 0x7f + 1 wraps to 0x80 and 0xff + 1 to 0 where the mask is set; byte
     * i of src is i + 100 where it is not */
    for (int i = 0; i < 32; i++) src[i] = (uint8_t)(i + 100), a[i] = i % 2 ? 0xff : 0x7f, b[i] = 1;
    emu_mask_add(src, 0x0000ffffu, a, b, out);
    for (int i = 0; i < 32; i++) ASSERT_EQ(out[i], i < 16 ? (i % 2 ? 0x00 : 0x80) : i + 100);
    emu_movm(0x80000001u, out);
    for (int i = 0; i < 32; i++) ASSERT_EQ(out[i], i == 0 || i == 31 ? 0xff : 0);
    /* every single bit, none, all, then random masks */
    for (int iter = 0; iter < 100034; iter++) {
        uint32_t k = iter < 32 ? 1u << iter : iter == 32 ? 0 : iter == 33 ? ~0u : rnd();
        if (iter >= 34 && iter % 3 == 0) k = ~k;
        rand_bytes(src), rand_bytes(a), rand_bytes(b);
        ref_mask_add(src, k, a, b, want);
        emu_mask_add(src, k, a, b, out);
        same_u8("mask_add", iter, want, out);
        ref_movm(k, want);
        emu_movm(k, out);
        same_u8("movm", iter, want, out);
    }
}

/* ------------------------------------------------------------------------ */
/* 512-bit floats                                                           */
/* ------------------------------------------------------------------------ */

static int same_bits(float x, float y) { return !memcmp(&x, &y, sizeof x); }

TEST_IMPL(fmadd_is_fused_per_lane)
{
    need_avx2();
    _Alignas(64) float a[16];
    float b[16], c[16], out[16];
    /* (1 + 2^-23)(1 - 2^-23) - 1 = -2^-46 exactly; a product rounded to f32
     * first (1.0f) would give 0. Lane i gets a distinct scale 2^i, so a
     * swap of lanes or halves shows too. */
    for (int i = 0; i < 16; i++) {
        a[i] = ldexpf(1.0f + 0x1p-23f, i);
        b[i] = 1.0f - 0x1p-23f;
        c[i] = -ldexpf(1.0f, i);
    }
    emu_fmadd(a, b, c, out);
    for (int i = 0; i < 16; i++)
        if (!same_bits(out[i], ldexpf(-0x1p-46f, i)))
            TEST_FAIL_("lane %d: got %a, want %a (fused)", i, (double)out[i],
                       (double)ldexpf(-0x1p-46f, i));
    /* random values, subnormals and overflow included, against C's fmaf
     * (one rounding, the default round-to-nearest-even) */
    for (int iter = 0; iter < 100000; iter++) {
        for (int i = 0; i < 16; i++) a[i] = rand_float(), b[i] = rand_float(), c[i] = rand_float();
        emu_fmadd(a, b, c, out);
        for (int i = 0; i < 16; i++) {
            float want = fmaf(a[i], b[i], c[i]);
            if (!same_bits(out[i], want) && !(isnan(out[i]) && isnan(want)))
                TEST_FAIL_("case %d lane %d: fma(%a, %a, %a) = %a, want %a", iter, i, (double)a[i],
                           (double)b[i], (double)c[i], (double)out[i], (double)want);
        }
    }
}

TEST_IMPL(set1_setzero_load_storeu)
{
    need_avx2();
    _Alignas(64) float p[32];
    float out[17];
    for (int i = 0; i < 32; i++) p[i] = (float)i + 0.5f;
    for (int lane = 0; lane < 16; lane++)
        ASSERT(same_bits(emu_load_lane(p + 16, lane), 16.5f + (float)lane));
    /* an unaligned store writes exactly 16 floats */
    out[0] = out[16] = 7.0f;
    emu_set1_store(-0.0f, out);
    for (int i = 0; i < 16; i++) ASSERT(same_bits(out[i], -0.0f));
    ASSERT(same_bits(out[16], 7.0f));
    emu_set1_store(3.25f, out + 1);
    ASSERT(same_bits(out[0], -0.0f));
    for (int i = 1; i < 17; i++) ASSERT(same_bits(out[i], 3.25f));
    emu_zero_store(out);
    for (int i = 0; i < 16; i++) ASSERT(same_bits(out[i], 0.0f));
}

/* vmovaps zmm faults on an address that is not 64-byte aligned, and so
 * does the emulation: 32-byte alignment (enough for the two halves) is not. */
TEST_IMPL(load_ps_faults_unless_64_byte_aligned)
{
    need_avx2();
    _Alignas(64) float p[48] = {0};
    ASSERT(same_bits(emu_load_lane(p, 0), 0.0f));
    for (int off = 1; off < 16; off++) {
        pid_t pid = fork();
        ASSERT(pid >= 0);
        if (pid == 0) {
            volatile float f = emu_load_lane(p + off, 0);
            (void)f;
            _exit(0);
        }
        int ws = 0;
        ASSERT_EQ(waitpid(pid, &ws, 0), pid);
        if (!WIFSIGNALED(ws))
            TEST_FAIL_("a load at 64-byte alignment + %d bytes did not fault (status %d)", 4 * off,
                       ws);
    }
}

/* ------------------------------------------------------------------------ */
/* Against the real instructions                                            */
/* ------------------------------------------------------------------------ */

TEST_IMPL(matches_the_real_instructions)
{
    if ((khub_cpu_features_host() & AVX512_NEED) != AVX512_NEED)
        TEST_SKIP("this CPU has no AVX-512 VNNI; the emulation was compared with Intel's "
                  "pseudo-code only");
    for (int iter = 0; iter < 100000; iter++) {
        int32_t src[8], o1[8], o2[8];
        uint8_t a[32], b[32], s8[32], m1[32], m2[32];
        rand_bytes(a), rand_bytes(b), rand_bytes(s8);
        for (int j = 0; j < 8; j++) src[j] = (int32_t)rnd() << (iter % 3 ? 0 : 16);
        emu_dpwssd(src, (int16_t *)a, (int16_t *)b, o1);
        hw_dpwssd(src, (int16_t *)a, (int16_t *)b, o2);
        same_i32("dpwssd vs vpdpwssd", iter, o2, o1);
        emu_dpbusd(src, a, (int8_t *)b, o1);
        hw_dpbusd(src, a, (int8_t *)b, o2);
        same_i32("dpbusd vs vpdpbusd", iter, o2, o1);
        uint32_t k = rnd() ^ (rnd() << 16);
        emu_mask_add(s8, k, a, b, m1);
        hw_mask_add(s8, k, a, b, m2);
        same_u8("mask_add vs vpaddb{k}", iter, m2, m1);
        emu_movm(k, m1);
        hw_movm(k, m2);
        same_u8("movm vs vpmovm2b", iter, m2, m1);
        _Alignas(64) float fa[16];
        float fb[16], fc[16], f1[16], f2[16];
        for (int i = 0; i < 16; i++)
            fa[i] = rand_float(), fb[i] = rand_float(), fc[i] = rand_float();
        emu_fmadd(fa, fb, fc, f1);
        hw_fmadd(fa, fb, fc, f2);
        for (int i = 0; i < 16; i++)
            if (!same_bits(f1[i], f2[i]))
                TEST_FAIL_("fmadd vs vfmadd231ps zmm, case %d lane %d: %a against %a", iter, i,
                           (double)f1[i], (double)f2[i]);
    }
}

#define TEST_LIST(X) \
    X(dpwssd_edges_by_hand) \
    X(dpwssd_matches_pseudocode) \
    X(dpbusd_edges_by_hand) \
    X(dpbusd_matches_pseudocode) \
    X(mask_add_and_movm_match_pseudocode) \
    X(fmadd_is_fused_per_lane) \
    X(set1_setzero_load_storeu) \
    X(load_ps_faults_unless_64_byte_aligned) \
    X(matches_the_real_instructions)
TEST_MAIN(TEST_LIST)
