/*
 * errbuf.c: formatting of one-line error messages into a buffer, the
 * common step of khub__fail and of every errbuf a function fills.
 * Self-contained (libc only): the hub server (libkhub_server) compiles it
 * in as well, with file_read.c and the digests, since libkhub.so hides its
 * internals.
 */
#include <stdarg.h>
#include <stdio.h>

#include "internal.h"

void khub__verrbuf(char *buf, size_t n, const char *fmt, va_list ap)
{
    if (!buf || n == 0) return;
    vsnprintf(buf, n, fmt, ap);
    for (char *p = buf; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' '; /* messages stay one line */
}

void khub__errbuf(char *buf, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    khub__verrbuf(buf, n, fmt, ap);
    va_end(ap);
}
