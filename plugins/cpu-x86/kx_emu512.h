/*
 * kx_emu512.h: the AVX-512 instructions the cpu-avx512 module's kernels use,
 * emulated with AVX2 operations, for tests only.
 *
 * Why. The AVX-512 module's own logic (the KX_LEVEL_AVX512 branches of the
 * kernel files: 4-token tiles, vpdpwssd, vpdpbusd, masked adds, 512-bit
 * GEMM vectors) runs only on an AVX-512 CPU, and most development machines
 * lack one, so that logic could change for months without running once.
 * The test-only module cpu-avx512-emu.so (plugins/cpu-x86/CMakeLists.txt) is
 * built from the same kernel sources with KX_LEVEL_AVX512 and only the AVX2
 * flags, with this header force-included (-include) before each file: the
 * names below then stand for functions of this header, so the AVX-512
 * branches compile and run on any AVX2 CPU, and test_cpu_x86@avx512-emu
 * compares them with the oracles. The shipped cpu-avx512.so is compiled
 * without this header and is not changed by it.
 *
 * Each function computes what Intel's pseudo-code for the instruction
 * defines, bit for bit: integer sums wrap modulo 2^32 (vpdpwssd and vpdpbusd,
 * not their saturating S forms), a mask bit chooses between the sum and the
 * source per byte, and a 512-bit float operation is the same operation on
 * its two 256-bit halves (lanes 0-7, 8-15), with the same rounding: a fused
 * multiply-add stays fused. tests/test_emu512.c checks each against a scalar
 * reference written from that pseudo-code, edge values included, and against
 * the real instructions where the CPU has them.
 *
 * What this does not cover: the code the compiler itself makes from
 * -mavx512* flags (EVEX encodings, AVX-512 registers and masks it chooses on
 * its own) and anything about speed.
 *
 * KX_EMU512_NO_MAP: declare the functions without mapping the intrinsics'
 * names onto them (tests/test_emu512.c, which calls both).
 */
#ifndef KHUB_CPU_X86_KX_EMU512_H
#define KHUB_CPU_X86_KX_EMU512_H

#include <immintrin.h>
#include <stdint.h>

/* ------------------------------------------------------------------------ */
/* Integer: VNNI dot products and byte masks                                */
/* ------------------------------------------------------------------------ */

/* vpdpwssd ymm: dst.dword[j] = src.dword[j] + a.word[2j] * b.word[2j] +
 * a.word[2j + 1] * b.word[2j + 1], each product sign-extended to 32 bits,
 * the sum modulo 2^32. vpmaddwd gives the two products' sum modulo 2^32
 * (Intel: it wraps only when all four words are 0x8000, to 0x80000000), so
 * adding it to src is the same sum modulo 2^32. */
static inline __m256i kx_emu_dpwssd_epi32(__m256i src, __m256i a, __m256i b)
{
    return _mm256_add_epi32(src, _mm256_madd_epi16(a, b));
}

/* vpdpbusd ymm: dst.dword[j] = src.dword[j] + sum over k < 4 of
 * ZeroExtend(a.byte[4j + k]) * SignExtend(b.byte[4j + k]), modulo 2^32.
 * vpmaddubsw would saturate its pair sums (255 * -128 * 2 < -32768), so the
 * bytes are widened to int16 first, even bytes and odd bytes apart: a
 * product is within [-32640, 32385], a vpmaddwd pair sum fits in int32
 * without wrapping, and so do the four. */
static inline __m256i kx_emu_dpbusd_epi32(__m256i src, __m256i a, __m256i b)
{
    const __m256i low_byte = _mm256_set1_epi16(0x00ff);
    const __m256i a_even = _mm256_and_si256(a, low_byte); /* bytes 4j, 4j + 2 */
    const __m256i a_odd = _mm256_srli_epi16(a, 8);        /* bytes 4j + 1, 4j + 3 */
    const __m256i b_even = _mm256_srai_epi16(_mm256_slli_epi16(b, 8), 8);
    const __m256i b_odd = _mm256_srai_epi16(b, 8);
    const __m256i sum =
        _mm256_add_epi32(_mm256_madd_epi16(a_even, b_even), _mm256_madd_epi16(a_odd, b_odd));
    return _mm256_add_epi32(src, sum);
}

/* vpmovm2b ymm: byte i is 0xff where bit i of k is set, else 0. Each byte
 * takes the byte of k holding its bit (a shuffle of k broadcast), keeps
 * that one bit, and compares. */
static inline __m256i kx_emu_movm_epi8(uint32_t k)
{
    const __m256i byte_of_bit =
        _mm256_setr_epi64x(0, 0x0101010101010101ll, 0x0202020202020202ll, 0x0303030303030303ll);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i kb = _mm256_shuffle_epi8(_mm256_set1_epi32((int)k), byte_of_bit);
    return _mm256_cmpeq_epi8(_mm256_and_si256(kb, bit), bit);
}

/* vpaddb ymm {k}: dst.byte[i] = k bit i ? a.byte[i] + b.byte[i] (modulo
 * 2^8) : src.byte[i] (merge masking). */
static inline __m256i kx_emu_mask_add_epi8(__m256i src, uint32_t k, __m256i a, __m256i b)
{
    return _mm256_blendv_epi8(src, _mm256_add_epi8(a, b), kx_emu_movm_epi8(k));
}

/* ------------------------------------------------------------------------ */
/* 512-bit floats as two 256-bit halves                                     */
/* ------------------------------------------------------------------------ */

typedef struct kx_emu_m512 {
    __m256 lo; /* lanes 0-7 (the lower addresses) */
    __m256 hi; /* lanes 8-15 */
} kx_emu_m512;

/* vmovaps zmm, m512: faults unless p is 64-byte aligned, as the instruction
 * does (#GP); a trap here stands for that fault. */
static inline kx_emu_m512 kx_emu_load_ps(const float *p)
{
    if ((uintptr_t)p & 63) __builtin_trap();
    kx_emu_m512 v = {_mm256_load_ps(p), _mm256_load_ps(p + 8)};
    return v;
}

static inline void kx_emu_storeu_ps(float *p, kx_emu_m512 v)
{
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
}

static inline kx_emu_m512 kx_emu_set1_ps(float x)
{
    kx_emu_m512 v = {_mm256_set1_ps(x), _mm256_set1_ps(x)};
    return v;
}

static inline kx_emu_m512 kx_emu_setzero_ps(void)
{
    kx_emu_m512 v = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    return v;
}

/* vfmadd zmm: a * b + c per lane, rounded once. */
static inline kx_emu_m512 kx_emu_fmadd_ps(kx_emu_m512 a, kx_emu_m512 b, kx_emu_m512 c)
{
    kx_emu_m512 v = {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
    return v;
}

/* ------------------------------------------------------------------------ */
/* The intrinsics' names, mapped onto the functions above                   */
/* ------------------------------------------------------------------------ */

/* GCC defines some of these as macros and some as always-inline functions;
 * either way, from here on the kernel files' calls reach this header. A
 * name used by the AVX-512 branches and missing here fails the build of
 * cpu-avx512-emu.so ("target specific option mismatch", or "needs isa
 * option"), so the list cannot silently fall behind the sources. */
#ifndef KX_EMU512_NO_MAP
#undef _mm256_dpwssd_epi32
#undef _mm256_dpbusd_epi32
#undef _mm256_movm_epi8
#undef _mm256_mask_add_epi8
#undef _mm512_load_ps
#undef _mm512_storeu_ps
#undef _mm512_set1_ps
#undef _mm512_setzero_ps
#undef _mm512_fmadd_ps
#define _mm256_dpwssd_epi32(src, a, b)     kx_emu_dpwssd_epi32(src, a, b)
#define _mm256_dpbusd_epi32(src, a, b)     kx_emu_dpbusd_epi32(src, a, b)
#define _mm256_movm_epi8(k)                kx_emu_movm_epi8(k)
#define _mm256_mask_add_epi8(src, k, a, b) kx_emu_mask_add_epi8(src, k, a, b)
#define __m512                             kx_emu_m512
#define _mm512_load_ps(p)                  kx_emu_load_ps((const float *)(p))
#define _mm512_storeu_ps(p, v)             kx_emu_storeu_ps((float *)(p), v)
#define _mm512_set1_ps(x)                  kx_emu_set1_ps(x)
#define _mm512_setzero_ps()                kx_emu_setzero_ps()
#define _mm512_fmadd_ps(a, b, c)           kx_emu_fmadd_ps(a, b, c)
#endif

#endif /* KHUB_CPU_X86_KX_EMU512_H */
