/*
 * tokenizer_pretok.c: the pre-tokenizers' split patterns, matched by hand:
 * no regex library, and the exact alternation order of each pattern is what
 * decides the pieces. GPT-2's pattern (SmolLM2's too, on the stretches
 * between the digits its Digits step isolates in tokenizer_encode.c) and
 * the Llama-3 pattern, with \p{N}{1,3} for Llama-3 and \p{N} for Qwen2.
 */
#include "tokenizer_impl.h"

static bool is_other(uint32_t c)
{
    return !khub__uni_is_letter(c) && !khub__uni_is_number(c) && !khub__uni_is_space(c);
}

/* End of the run of code points from i for which cls holds. */
size_t khub__tok_run_end(span t, size_t i, bool (*cls)(uint32_t))
{
    while (i < t.n) {
        uint32_t c;
        size_t l = khub__tok_cp_at(t, i, &c);
        if (!cls(c)) break;
        i += l;
    }
    return i;
}

static bool is_crlf(uint32_t c) { return c == '\r' || c == '\n'; }

/* Length of 's|'t|'re|'ve|'m|'ll|'d at i (case-insensitive with ci, where
 * U+017F LONG S folds to s as in Oniguruma's case folding), or 0. */
static size_t contraction(span t, size_t i, bool ci)
{
    if (t.s[i] != '\'' || i + 1 >= t.n) return 0;
    unsigned char a = t.s[i + 1];
    unsigned char al = ci ? (unsigned char)(a | 0x20) : a;
    if (ci && a == 0xC5 && i + 2 < t.n && t.s[i + 2] == 0xBF) return 3;
    if (al == 's' || al == 't' || al == 'm' || al == 'd') return 2;
    if (i + 2 >= t.n) return 0;
    unsigned char b = t.s[i + 2];
    unsigned char bl = ci ? (unsigned char)(b | 0x20) : b;
    if ((al == 'r' && bl == 'e') || (al == 'v' && bl == 'e') || (al == 'l' && bl == 'l')) return 3;
    return 0;
}

/* \s+(?!\S)|\s+ at i, where i starts a whitespace run. */
static size_t match_spaces(span t, size_t i)
{
    size_t e = khub__tok_run_end(t, i, khub__uni_is_space);
    if (e == t.n) return e;
    size_t last = e - 1;
    while (last > i && (t.s[last] & 0xC0) == 0x80) last--; /* start of the last code point */
    return last > i ? last : e;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t match_gpt2(span t, size_t i)
{
    size_t l = contraction(t, i, false);
    if (l) return i + l;
    uint32_t c, c2 = KHUB__UNI_INVALID;
    size_t cl = khub__tok_cp_at(t, i, &c);
    bool sp = c == ' ' && i + 1 < t.n;
    if (sp) khub__tok_cp_at(t, i + 1, &c2);
    if (sp && khub__uni_is_letter(c2)) return khub__tok_run_end(t, i + 1, khub__uni_is_letter);
    if (khub__uni_is_letter(c)) return khub__tok_run_end(t, i + cl, khub__uni_is_letter);
    if (sp && khub__uni_is_number(c2)) return khub__tok_run_end(t, i + 1, khub__uni_is_number);
    if (khub__uni_is_number(c)) return khub__tok_run_end(t, i + cl, khub__uni_is_number);
    if (sp && is_other(c2)) return khub__tok_run_end(t, i + 1, is_other);
    if (is_other(c)) return khub__tok_run_end(t, i + cl, is_other);
    return match_spaces(t, i);
}

/* Llama-3 and Qwen2 (max_digits 3 and 1):
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max}|
 *  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static size_t match_llama3(span t, size_t i, int max_digits)
{
    size_t l = contraction(t, i, true);
    if (l) return i + l;
    uint32_t c, c2 = KHUB__UNI_INVALID;
    size_t cl = khub__tok_cp_at(t, i, &c);
    bool has2 = i + cl < t.n;
    if (has2) khub__tok_cp_at(t, i + cl, &c2);
    bool lead = !is_crlf(c) && !khub__uni_is_letter(c) && !khub__uni_is_number(c);
    if (lead && khub__uni_is_letter(c2)) return khub__tok_run_end(t, i + cl, khub__uni_is_letter);
    if (khub__uni_is_letter(c)) return khub__tok_run_end(t, i + cl, khub__uni_is_letter);
    if (khub__uni_is_number(c)) {
        size_t e = i + cl;
        for (int k = 1; k < max_digits && e < t.n; k++) {
            size_t dl = khub__tok_cp_at(t, e, &c2);
            if (!khub__uni_is_number(c2)) break;
            e += dl;
        }
        return e;
    }
    size_t start = c == ' ' && has2 && is_other(c2) ? i + 1 : i;
    uint32_t c0 = start == i ? c : c2;
    if (is_other(c0)) {
        size_t e = khub__tok_run_end(t, start, is_other);
        while (e < t.n && (t.s[e] == '\r' || t.s[e] == '\n')) e++;
        return e;
    }
    size_t e = khub__tok_run_end(t, i, khub__uni_is_space); /* c is whitespace here */
    for (size_t p = e; p > i; p--)
        if (t.s[p - 1] == '\r' || t.s[p - 1] == '\n') return p;
    return match_spaces(t, i);
}

size_t khub__tok_match_piece(pre_kind pre, span t, size_t i)
{
    switch (pre) {
    case PRE_LLAMA3: return match_llama3(t, i, 3);
    case PRE_QWEN2: return match_llama3(t, i, 1);
    default: return match_gpt2(t, i);
    }
}
