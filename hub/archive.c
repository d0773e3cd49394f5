/*
 * archive.c: the per-variant archive (build/<variant>.tar.gz) unpacker.
 *
 * Archives come from the network and are hostile until verified. Every
 * entry is checked before anything is written: a relative path without
 * "..", a regular file or a directory (no symlinks, hard links, devices,
 * FIFOs or sockets: a variant needs none, and each is a known escape), a
 * size within limits, and a running unpacked/packed ratio that stops zip
 * bombs. libarchive's secure-extraction flags are set as a second line.
 * Everything lands in dest, which must not exist; on failure it is removed.
 */
#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "hub_impl.h"

static khub_status check_entry(khub_hub *hub, struct archive_entry *e, const khub__unpack_limits *l,
                               const char *archive)
{
    const char *name = archive_entry_pathname(e);
    if (!name) return khub__hub_fail(hub, KHUB_STATUS_PARSE, "%s: entry without a name", archive);
    char rel[KHUB__PATH_MAX];
    snprintf(rel, sizeof rel, "%s", name);
    size_t n = strlen(rel);
    while (n > 0 && rel[n - 1] == '/') rel[--n] = '\0'; /* "dir/" */
    const char *r = strncmp(rel, "./", 2) == 0 ? rel + 2 : rel;
    if (!khub__path_is_safe(r))
        return khub__hub_fail(hub, KHUB_STATUS_UNSAFE_PATH,
                              "%s: entry \"%.200s\" is absolute or has \"..\"; refusing the "
                              "archive",
                              archive, name);
    mode_t t = archive_entry_filetype(e);
    if (archive_entry_hardlink(e) || t == AE_IFLNK)
        return khub__hub_fail(hub, KHUB_STATUS_UNSAFE_PATH,
                              "%s: entry \"%.200s\" is a link; variant archives hold only files "
                              "and directories",
                              archive, name);
    if (t != AE_IFREG && t != AE_IFDIR)
        return khub__hub_fail(hub, KHUB_STATUS_UNSAFE_PATH,
                              "%s: entry \"%.200s\" is a device, FIFO or socket; refusing it",
                              archive, name);
    if (archive_entry_size_is_set(e) && (uint64_t)archive_entry_size(e) > l->max_entry_bytes)
        return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW,
                              "%s: entry \"%.200s\" is %lld bytes, over the %llu limit", archive,
                              name, (long long)archive_entry_size(e),
                              (unsigned long long)l->max_entry_bytes);
    return KHUB_STATUS_OK;
}

khub_status khub__archive_unpack(khub_hub *hub, const char *archive, const char *dest,
                                 const khub__unpack_limits *lim)
{
    khub__unpack_limits l = lim ? *lim : (khub__unpack_limits){0};
    if (!l.max_entry_bytes) l.max_entry_bytes = 1ull << 30;
    if (!l.max_total_bytes) l.max_total_bytes = 4ull << 30;
    if (!l.max_entries) l.max_entries = 100000;
    if (!l.max_ratio) l.max_ratio = 200;
    if (mkdir(dest, 0755) != 0)
        return khub__hub_fail(hub, KHUB_STATUS_IO, "cannot create %s: %s", dest, strerror(errno));
    struct archive *a = archive_read_new();
    struct archive *w = archive_write_disk_new();
    archive_read_support_filter_gzip(a);
    archive_read_support_format_tar(a);
    archive_write_disk_set_options(w, ARCHIVE_EXTRACT_SECURE_NODOTDOT |
                                          ARCHIVE_EXTRACT_SECURE_SYMLINKS |
                                          ARCHIVE_EXTRACT_NO_OVERWRITE);
    /* Not SECURE_NOABSOLUTEPATHS: entries are checked relative above and
     * written under dest, which is an absolute path of ours. */
    khub_status st = KHUB_STATUS_OK;
    uint64_t total = 0, entries = 0;
    if (archive_read_open_filename(a, archive, 1 << 16) != ARCHIVE_OK) {
        st = khub__hub_fail(hub, KHUB_STATUS_PARSE, "%s: %s", archive, archive_error_string(a));
        goto done;
    }
    struct archive_entry *e;
    int r;
    while ((r = archive_read_next_header(a, &e)) == ARCHIVE_OK) {
        if (++entries > l.max_entries) {
            st = khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "%s: more than %llu entries", archive,
                                (unsigned long long)l.max_entries);
            goto done;
        }
        if ((st = check_entry(hub, e, &l, archive)) != KHUB_STATUS_OK) goto done;
        char out[KHUB__PATH_MAX];
        if (!KHUB__PATHF(out, "%s/%s", dest, archive_entry_pathname(e))) {
            st = khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "%s: entry path too long", archive);
            goto done;
        }
        archive_entry_set_pathname(e, out);
        archive_entry_set_perm(e, archive_entry_filetype(e) == AE_IFDIR ? 0755 : 0644);
        if (archive_write_header(w, e) != ARCHIVE_OK) {
            st = khub__hub_fail(hub, KHUB_STATUS_IO, "%s: %s", archive, archive_error_string(w));
            goto done;
        }
        const void *buf;
        size_t len;
        int64_t off;
        uint64_t entry_bytes = 0;
        while ((r = archive_read_data_block(a, &buf, &len, &off)) == ARCHIVE_OK) {
            entry_bytes += len;
            total += len;
            uint64_t packed = (uint64_t)archive_filter_bytes(a, -1);
            if (entry_bytes > l.max_entry_bytes || total > l.max_total_bytes ||
                (total > (1u << 20) && packed > 0 && total / packed > l.max_ratio)) {
                st = khub__hub_fail(hub, KHUB_STATUS_OVERFLOW,
                                    "%s: unpacks to over the size or ratio limit (%llu bytes "
                                    "from %llu); refusing it",
                                    archive, (unsigned long long)total, (unsigned long long)packed);
                goto done;
            }
            if (archive_write_data_block(w, buf, len, off) != ARCHIVE_OK) {
                st =
                    khub__hub_fail(hub, KHUB_STATUS_IO, "%s: %s", archive, archive_error_string(w));
                goto done;
            }
        }
        if (r != ARCHIVE_EOF) {
            st = khub__hub_fail(hub, KHUB_STATUS_PARSE, "%s: %s", archive, archive_error_string(a));
            goto done;
        }
        archive_write_finish_entry(w);
    }
    if (r != ARCHIVE_EOF)
        st = khub__hub_fail(hub, KHUB_STATUS_PARSE, "%s: %s", archive, archive_error_string(a));
done:
    archive_read_free(a);
    archive_write_free(w);
    if (st != KHUB_STATUS_OK) khub__rmtree(dest);
    return st;
}
