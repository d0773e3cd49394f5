/*
 * unicode.c: bounded UTF-8 decoding and the \p{L} / \p{N} / \s classes.
 *
 * Classes are a binary search over the generated ranges, with an ASCII fast
 * path: pre-tokenizing is dominated by ASCII text.
 */
#include "unicode.h"

/* ------------------------------------------------------------------------ */
/* UTF-8                                                                    */
/* ------------------------------------------------------------------------ */

/* Expected length from the lead byte, 0 for a byte that cannot lead. */
static size_t lead_len(unsigned char b)
{
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b >= 0xE0 && b <= 0xEF) return 3;
    if (b >= 0xF0 && b <= 0xF4) return 4;
    return 0;
}

/* Valid range of the second byte for a lead byte (Unicode table 3-7):
 * excludes overlongs, surrogates and code points above U+10FFFF. */
static bool second_ok(unsigned char lead, unsigned char b)
{
    switch (lead) {
    case 0xE0: return b >= 0xA0 && b <= 0xBF;
    case 0xED: return b >= 0x80 && b <= 0x9F;
    case 0xF0: return b >= 0x90 && b <= 0xBF;
    case 0xF4: return b >= 0x80 && b <= 0x8F;
    default: return b >= 0x80 && b <= 0xBF;
    }
}

/* Number of bytes of s[0..n) that form a valid prefix of one sequence. */
static size_t valid_prefix(const unsigned char *s, size_t n, size_t want)
{
    size_t i = 1;
    if (i < n && i < want) {
        if (!second_ok(s[0], s[1])) return 1;
        i++;
    }
    while (i < n && i < want && (s[i] & 0xC0) == 0x80) i++;
    return i;
}

size_t khub__utf8_decode(const unsigned char *s, size_t n, uint32_t *cp)
{
    size_t want = lead_len(s[0]);
    if (want == 1) {
        *cp = s[0];
        return 1;
    }
    if (want == 0 || n < want || valid_prefix(s, n, want) != want) {
        *cp = KHUB__UNI_INVALID;
        return 1;
    }
    uint32_t c = s[0] & (0x7F >> want);
    for (size_t i = 1; i < want; i++) c = (c << 6) | (s[i] & 0x3F);
    *cp = c;
    return want;
}

size_t khub__utf8_encode(uint32_t cp, unsigned char out[4])
{
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xC0 | (cp >> 6));
        out[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xE0 | (cp >> 12));
        out[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (unsigned char)(0xF0 | (cp >> 18));
    out[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t khub__utf8_incomplete_tail(const unsigned char *s, size_t n)
{
    if (n == 0) return 0;
    size_t want = lead_len(s[0]);
    if (want <= 1 || n >= want) return 0;
    return valid_prefix(s, n, want) == n ? n : 0;
}

size_t khub__utf8_invalid_len(const unsigned char *s, size_t n)
{
    size_t want = lead_len(s[0]);
    if (want <= 1) return 1;
    return valid_prefix(s, n, want);
}

/* ------------------------------------------------------------------------ */
/* Classes                                                                  */
/* ------------------------------------------------------------------------ */

static bool in_ranges(const khub__uni_range *r, size_t n, uint32_t cp)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < r[mid].lo)
            hi = mid;
        else if (cp > r[mid].hi)
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

bool khub__uni_is_letter(uint32_t cp)
{
    if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
    return cp != KHUB__UNI_INVALID && in_ranges(khub__uni_letter, khub__uni_letter_count, cp);
}

bool khub__uni_is_number(uint32_t cp)
{
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    return cp != KHUB__UNI_INVALID && in_ranges(khub__uni_number, khub__uni_number_count, cp);
}

bool khub__uni_is_space(uint32_t cp)
{
    if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
    return cp != KHUB__UNI_INVALID && in_ranges(khub__uni_space, khub__uni_space_count, cp);
}
