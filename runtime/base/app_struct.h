/*
 * app_struct.h: application structs sized by the caller (abi/ABI.md, "The
 * application API is versioned apart"). An application struct's version is
 * its struct_size: the library reads and writes a caller's struct only up
 * to it, accepts any size from the struct's 0.1 layout on (a caller built
 * against an older header), and takes a larger one (a newer header) as
 * well, leaving the bytes it does not know alone.
 *
 * An array of them, `T *xs, size_t n`, is the caller's array: its elements
 * are xs[0].struct_size bytes apart, not this header's sizeof(T), and all
 * have that size (one struct). Indexing it by sizeof(T) reads and writes
 * the wrong bytes as soon as T grows (session 16 found it in
 * khub_generate_batch; session 17 removed every other case).
 *
 * Header only (static inline), so the sibling libraries (libkhub_author,
 * libkhub_tune) use it too.
 */
#ifndef KHUB_RUNTIME_APP_STRUCT_H
#define KHUB_RUNTIME_APP_STRUCT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "khub/khub.h"

/* Bytes of type up to the end of field f: the struct's size in the release
 * whose last field was f (KHUB__SIZE_TO(khub_batch_result, error) is 0.1's
 * 360). */
#define KHUB__SIZE_TO(type, f) (offsetof(type, f) + sizeof(((type *)0)->f))

/* Whether the caller's struct s reaches field f of type (khub_plugin.h's
 * KHUB_HAS_FIELD, for application structs). */
#define KHUB__APP_HAS(s, type, f) ((s)->struct_size >= KHUB__SIZE_TO(type, f))

/* The struct_size of a caller's struct (every application struct starts
 * with it). */
static inline uint32_t khub__app_size(const void *s)
{
    uint32_t size;
    memcpy(&size, s, sizeof size);
    return size;
}

/* Element i of a caller's array: xs[0].struct_size bytes per element. */
static inline void *khub__app_at(void *xs, size_t i) { return (char *)xs + i * khub__app_size(xs); }

static inline const void *khub__app_at_const(const void *xs, size_t i)
{
    return (const char *)xs + i * khub__app_size(xs);
}

/* Checks a caller's array xs[n] of one application struct before anything
 * reads or writes it: xs[0].struct_size at least min (the struct's 0.1
 * size), and xs[1..n-1] of that same size. On failure writes the message
 * into msg[msg_n] and returns STRUCT_SIZE, naming the call (who) and the
 * array (name):
 *   "WHO: NAME[0].struct_size S is smaller than 0.1's MIN"
 *   "WHO: NAME[I].struct_size S differs from NAME[0]'s S0 (the array's
 *    elements are one struct)"
 * An output array whose caller sets only xs[0].struct_size (khub_op_test's
 * stride) is checked with n = 1. */
static inline khub_status khub__app_array_check(const void *xs, size_t n, size_t min,
                                                const char *who, const char *name, char *msg,
                                                size_t msg_n)
{
    const uint32_t size = n ? khub__app_size(xs) : 0;
    if (n && size < min) {
        snprintf(msg, msg_n, "%s: %s[0].struct_size %u is smaller than 0.1's %zu", who, name,
                 (unsigned)size, min);
        return KHUB_STATUS_STRUCT_SIZE;
    }
    for (size_t i = 1; i < n; i++) {
        uint32_t s = khub__app_size(khub__app_at_const(xs, i));
        if (s != size) {
            snprintf(msg, msg_n,
                     "%s: %s[%zu].struct_size %u differs from %s[0]'s %u (the array's elements "
                     "are one struct)",
                     who, name, i, (unsigned)s, name, (unsigned)size);
            return KHUB_STATUS_STRUCT_SIZE;
        }
    }
    return KHUB_STATUS_OK;
}

/* Checks a caller's single struct s (an option or an out-struct) before
 * anything reads or writes it: its struct_size at least min (the struct's
 * 0.1 size). On failure writes the message into msg[msg_n] and returns
 * STRUCT_SIZE, naming the call (who) and the argument (name):
 *   "WHO: NAME.struct_size S is smaller than 0.1's MIN" */
static inline khub_status khub__app_struct_check(const void *s, size_t min, const char *who,
                                                 const char *name, char *msg, size_t msg_n)
{
    const uint32_t size = khub__app_size(s);
    if (size >= min) return KHUB_STATUS_OK;
    snprintf(msg, msg_n, "%s: %s.struct_size %u is smaller than 0.1's %zu", who, name,
             (unsigned)size, min);
    return KHUB_STATUS_STRUCT_SIZE;
}

/* In libkhub (internal.h's khub__fail): returns STRUCT_SIZE from the
 * calling function, the message on rt, when the caller's struct s is below
 * min (khub__app_struct_check). */
#define KHUB__APP_CHECK(rt, s, min, who, name) \
    do { \
        char m_[KHUB_ERROR_SIZE]; \
        if (khub__app_struct_check((s), (min), (who), (name), m_, sizeof m_) != KHUB_STATUS_OK) \
            return khub__fail((rt), KHUB_STATUS_STRUCT_SIZE, "%s", m_); \
    } while (0)

/* Reads the caller's struct src into the library's dst (full = sizeof
 * *dst): what src's struct_size covers, the rest zero (a field the caller's
 * release lacks reads as its default); dst's struct_size is then what it
 * holds (at most full). */
static inline void khub__app_copy_in(void *dst, size_t full, const void *src)
{
    uint32_t size = khub__app_size(src);
    memset(dst, 0, full);
    memcpy(dst, src, size < full ? size : full);
    if (size > full) {
        uint32_t held = (uint32_t)full;
        memcpy(dst, &held, sizeof held);
    }
}

/* Checks the caller's single struct src (khub__app_struct_check: at least
 * min, 0.1's size) and reads it into the library's dst (khub__app_copy_in):
 * the one way an option struct comes in. On failure dst is untouched and
 * msg holds the message. */
static inline khub_status khub__app_read(void *dst, size_t full, const void *src, size_t min,
                                         const char *who, const char *name, char *msg, size_t msg_n)
{
    khub_status st = khub__app_struct_check(src, min, who, name, msg, msg_n);
    if (st == KHUB_STATUS_OK) khub__app_copy_in(dst, full, src);
    return st;
}

/* Writes the library's src (full = sizeof *src) into the caller's dst up to
 * dst's struct_size, after dst's 8-byte header: struct_size and the stamp
 * (abi_major, abi_minor) stay as the caller wrote them (abi/ABI.md rule 5);
 * the bytes past struct_size (a newer caller's fields, or the caller's next
 * element) are left alone. */
static inline void khub__app_copy_out(void *dst, const void *src, size_t full)
{
    uint32_t size = khub__app_size(dst);
    size_t n = size < full ? size : full;
    if (n > 8) memcpy((char *)dst + 8, (const char *)src + 8, n - 8);
}

/* Clears the caller's struct s after its 8-byte header (struct_size and
 * stamp stay as the caller wrote them), up to its struct_size or full
 * (sizeof the library's struct), whichever is less. */
static inline void khub__app_clear(void *s, size_t full)
{
    uint32_t size = khub__app_size(s);
    size_t n = size < full ? size : full;
    if (n > 8) memset((char *)s + 8, 0, n - 8);
}

#endif /* KHUB_RUNTIME_APP_STRUCT_H */
