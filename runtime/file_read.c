/*
 * file_read.c: reading a whole small file (manifests, policies, locks,
 * metadata, signatures) with a size bound, so no caller parses a file it
 * silently cut short.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

khub_status khub__read_file(const char *path, size_t max, char **out, size_t *n, char *errbuf,
                            size_t errbuf_size)
{
    *out = NULL;
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        khub__errbuf(errbuf, errbuf_size, "%s: cannot open: %s", path, strerror(e));
        return e == ENOENT ? KHUB_STATUS_NOT_FOUND : KHUB_STATUS_IO;
    }
    char *buf = malloc(max + 1);
    size_t got = buf ? fread(buf, 1, max + 1, f) : 0;
    int err = ferror(f);
    fclose(f);
    if (!buf) {
        khub__errbuf(errbuf, errbuf_size, "%s: out of memory for %zu bytes", path, max);
        return KHUB_STATUS_NOMEM;
    }
    if (err || got > max) {
        free(buf);
        if (err) {
            khub__errbuf(errbuf, errbuf_size, "%s: read error", path);
            return KHUB_STATUS_IO;
        }
        khub__errbuf(errbuf, errbuf_size, "%s: larger than %zu bytes", path, max);
        return KHUB_STATUS_OVERFLOW;
    }
    buf[got] = '\0';
    *out = buf;
    *n = got;
    return KHUB_STATUS_OK;
}
