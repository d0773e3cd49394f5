/*
 * plugin_artifacts.c: the verified artifact directory of a plugin (see
 * plugin_artifacts.h).
 *
 * Artifacts are read lazily: a CUDA plugin asks for the one PTX that fits
 * its device, and reading every PTX of every capability at load would cost
 * memory for nothing. The digest recorded at verification time is checked
 * again on the bytes actually read, so a file swapped in the cache after
 * the hub verified it is refused here, naming it.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "plugin_artifacts.h"

#define MAX_ARTIFACTS      256
#define MAX_ARTIFACT_BYTES ((size_t)256 << 20)

typedef struct artifact {
    char *name, *path;
    char sha256[65];
    unsigned char *bytes; /* NULL until first read; size + 1 bytes, NUL-terminated */
    size_t size;
} artifact;

struct khub__artifacts {
    pthread_mutex_t lock;
    artifact *items;
    size_t count;
};

static bool plain_name(const char *s)
{
    size_t len = s ? strnlen(s, 256) : 0;
    return len > 0 && len < 256 && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

void khub__artifacts_free(khub_runtime *rt, khub__artifacts *a)
{
    if (!a) return;
    for (size_t i = 0; i < a->count; i++) {
        khub__strfree(rt, a->items[i].name);
        khub__strfree(rt, a->items[i].path);
        if (a->items[i].bytes) khub__free(rt, a->items[i].bytes, a->items[i].size + 1);
    }
    khub__free(rt, a->items, a->count * sizeof *a->items);
    pthread_mutex_destroy(&a->lock);
    khub__free(rt, a, sizeof *a);
}

static khub_status check_entry(const khub__artifact_file *f, size_t i,
                               const khub__artifact_file *files, char *msg, size_t n)
{
    if (!plain_name(f->name) || !f->path || !f->path[0]) {
        khub__errbuf(msg, n,
                     "artifact %zu: name \"%.100s\" is not a plain file name, or the "
                     "path is empty",
                     i, f->name ? f->name : "(null)");
        return KHUB_STATUS_INVALID_ARG;
    }
    if (!f->sha256 || !khub__is_sha256_hex(f->sha256)) {
        khub__errbuf(msg, n, "artifact %s: digest is not 64 hex digits", f->name);
        return KHUB_STATUS_INVALID_ARG;
    }
    for (size_t j = 0; j < i; j++)
        if (strcmp(files[j].name, f->name) == 0) {
            khub__errbuf(msg, n, "artifact %s is listed twice", f->name);
            return KHUB_STATUS_INVALID_ARG;
        }
    return KHUB_STATUS_OK;
}

khub_status khub__artifacts_new(khub_runtime *rt, const khub__artifact_file *files, size_t n,
                                khub__artifacts **out, char *msg, size_t msg_size)
{
    *out = NULL;
    if (n > MAX_ARTIFACTS || (n && !files)) {
        khub__errbuf(msg, msg_size, "%zu artifacts, at most %d", n, MAX_ARTIFACTS);
        return KHUB_STATUS_INVALID_ARG;
    }
    for (size_t i = 0; i < n; i++)
        KHUB_FORWARD_IF_ERROR(NULL, check_entry(&files[i], i, files, msg, msg_size));
    khub__artifacts *a = khub__calloc(rt, 1, sizeof *a);
    artifact *items = n ? khub__calloc(rt, n, sizeof *items) : NULL;
    if (!a || (n && !items)) {
        khub__free(rt, a, sizeof *a);
        khub__free(rt, items, n * sizeof *items);
        khub__errbuf(msg, msg_size, "artifact directory: out of memory");
        return KHUB_STATUS_NOMEM;
    }
    pthread_mutex_init(&a->lock, NULL);
    a->items = items;
    a->count = n;
    for (size_t i = 0; i < n; i++) {
        items[i].name = khub__strdup(rt, files[i].name);
        items[i].path = khub__strdup(rt, files[i].path);
        memcpy(items[i].sha256, files[i].sha256, 65);
        if (!items[i].name || !items[i].path) {
            khub__artifacts_free(rt, a);
            khub__errbuf(msg, msg_size, "artifact directory: out of memory");
            return KHUB_STATUS_NOMEM;
        }
    }
    *out = a;
    return KHUB_STATUS_OK;
}

/* Reads e->path (at most MAX_ARTIFACT_BYTES) and keeps it only if its
 * SHA-256 is still the verified one. */
static khub_status read_verified(khub_runtime *rt, artifact *e, char *msg, size_t n)
{
    char why[KHUB_ERROR_SIZE];
    int fd = khub__open_regular(e->path, why, sizeof why);
    if (fd < 0) {
        khub__errbuf(msg, n, "artifact %s: %s", e->name, why);
        return KHUB_STATUS_IO;
    }
    struct stat sb;
    khub_status st = KHUB_STATUS_OK;
    unsigned char *buf = NULL;
    size_t len = 0;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        khub__errbuf(msg, n, "artifact %s: %s is not a regular file", e->name, e->path);
        st = KHUB_STATUS_IO;
    } else if ((uint64_t)sb.st_size > MAX_ARTIFACT_BYTES) {
        khub__errbuf(msg, n, "artifact %s: %lld bytes, more than the %zu allowed", e->name,
                     (long long)sb.st_size, MAX_ARTIFACT_BYTES);
        st = KHUB_STATUS_OVERFLOW;
    } else {
        len = (size_t)sb.st_size;
        buf = khub__malloc(rt, len + 1);
        if (!buf) st = KHUB_STATUS_NOMEM;
        if (!buf) khub__errbuf(msg, n, "artifact %s: out of memory for %zu bytes", e->name, len);
    }
    for (size_t got = 0; st == KHUB_STATUS_OK && got < len;) {
        ssize_t r = read(fd, buf + got, len - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            khub__errbuf(msg, n, "artifact %s: reading %s: %s", e->name, e->path,
                         r < 0 ? strerror(errno) : "short read");
            st = KHUB_STATUS_IO;
        } else {
            got += (size_t)r;
        }
    }
    close(fd);
    char got_sha[65];
    if (st == KHUB_STATUS_OK) st = khub__sha256_hex(buf, len, got_sha);
    if (st == KHUB_STATUS_OK && !khub__digest_eq(got_sha, e->sha256)) {
        khub__errbuf(msg, n,
                     "artifact %s: %s has SHA-256 %s, it was verified as %s; the cache "
                     "changed after verification, fetch the kernel again",
                     e->name, e->path, got_sha, e->sha256);
        st = KHUB_STATUS_DIGEST_MISMATCH;
    }
    if (st != KHUB_STATUS_OK) {
        if (buf) khub__free(rt, buf, len + 1);
        return st;
    }
    buf[len] = '\0'; /* PTX is loaded as a NUL-terminated string */
    e->bytes = buf;
    e->size = len;
    return KHUB_STATUS_OK;
}

khub_status khub__artifacts_get(khub_runtime *rt, khub__artifacts *a, const char *name,
                                const void **data, size_t *size, char *msg, size_t msg_size)
{
    if (data) *data = NULL;
    if (size) *size = 0;
    artifact *e = NULL;
    for (size_t i = 0; a && name && i < a->count && !e; i++)
        if (strcmp(a->items[i].name, name) == 0) e = &a->items[i];
    if (!e) {
        khub__errbuf(msg, msg_size,
                     "artifact %.100s is not a file of the plugin's verified "
                     "variant",
                     name ? name : "(null)");
        return KHUB_STATUS_NOT_FOUND;
    }
    pthread_mutex_lock(&a->lock);
    khub_status st = e->bytes ? KHUB_STATUS_OK : read_verified(rt, e, msg, msg_size);
    pthread_mutex_unlock(&a->lock);
    if (st != KHUB_STATUS_OK) return st;
    if (data) *data = e->bytes;
    if (size) *size = e->size;
    return KHUB_STATUS_OK;
}
