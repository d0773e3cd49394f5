/*
 * loader.c: the verifying plugin loader: read, hash, seal, inspect, dlopen,
 * negotiate (negotiate.c), register (plugin_list.c). Hot reload, unload and
 * the plugin list are plugin_list.c; the built-in manifest is builtins.c.
 *
 * Load only the bytes you verified. The file is read once into memory and
 * copied into a memfd that is then sealed (no write, grow, shrink, or
 * further seals), so nobody can change them between the check and dlopen.
 * The sealed memfd is read back over the read buffer and hashed, once:
 * that digest is the one compared with the expected digest (and the
 * plugin's recorded SHA-256), because only the sealed bytes are the ones
 * dlopen maps; hashing the read buffer as well (before session 10) checked
 * the same bytes twice. Its ELF header and ABI note are read from those
 * bytes (or, for bytes of a digest that passed before in this process,
 * copied from gate_memo.c), and only then is it dlopened through
 * /proc/self/fd/N. The memfd stays open until dlclose:
 * glibc reuses an already-loaded library whose name matches, so a recycled
 * fd number would hand back the old library. After the unload of a
 * downloaded plugin its sealed memfd may be kept (sealed_memo.h): a later
 * load of the same, unchanged file then starts from that sealed copy
 * instead of reading the file and filling a new memfd, and reads it back,
 * hashes and checks it like any other.
 *
 * Everything the host keeps from a plugin's descriptor is copied (strings,
 * op descriptors, caps, head dims), because plugin memory dies at dlclose.
 * A plugin's op array is walked with the plugin's own struct_size as the
 * stride, so a plugin built against a newer minor (larger structs) is read
 * correctly.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "app_struct.h"
#include "check.h"
#include "elf_gate.h"
#include "gate_memo.h"
#include "loader_impl.h"
#include "plugin_artifacts.h"

/* ======================================================================== */
/* Files                                                                    */
/* ======================================================================== */

static khub_status check_path(const char *path, char *msg, size_t n)
{
    if (!path || !path[0]) {
        khub__errbuf(msg, n, "plugin path is empty; pass the path of a plugin .so");
        return KHUB_STATUS_INVALID_ARG;
    }
    if (strnlen(path, PATH_MAX) >= PATH_MAX) {
        khub__errbuf(msg, n, "plugin path of %zu+ bytes exceeds PATH_MAX (%d)", (size_t)PATH_MAX,
                     PATH_MAX);
        return KHUB_STATUS_INVALID_ARG;
    }
    return KHUB_STATUS_OK;
}

/* khub__plugin_read_file; src (may be NULL) receives what the bytes were
 * read from: the descriptor's fstat (sealed_memo.h). */
static khub_status read_file(khub_runtime *rt, const char *path, size_t cap, unsigned char **out,
                             size_t *size, khub__sealed_source *src, char *msg, size_t n)
{
    *out = NULL;
    *size = 0;
    struct stat sb; /* the descriptor's: a regular file (never hangs on a FIFO) */
    int fd = khub__open_regular_stat(path, &sb, msg, n);
    if (fd < 0) return errno == ENOENT ? KHUB_STATUS_NOT_FOUND : KHUB_STATUS_IO;
    khub_status st = KHUB_STATUS_OK;
    unsigned char *buf = NULL;
    size_t len = 0;
    if ((uint64_t)sb.st_size > cap) {
        khub__errbuf(msg, n, "%s: %lld bytes, more than the %zu allowed", path,
                     (long long)sb.st_size, cap);
        st = KHUB_STATUS_OVERFLOW;
        goto fail;
    }
    len = (size_t)sb.st_size;
    buf = khub__malloc(rt, len + 1);
    if (!buf) {
        khub__errbuf(msg, n, "%s: out of memory for %zu bytes", path, len);
        st = KHUB_STATUS_NOMEM;
        goto fail;
    }
    for (size_t got = 0; got < len;) {
        ssize_t r = read(fd, buf + got, len - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            khub__errbuf(msg, n, "reading %s: %s", path, r < 0 ? strerror(errno) : "short read");
            st = KHUB_STATUS_IO;
            goto fail;
        }
        got += (size_t)r;
    }
    buf[len] = '\0';
    close(fd);
    if (src) khub__sealed_source_of(&sb, src);
    *out = buf;
    *size = len;
    return KHUB_STATUS_OK;
fail:
    khub__free(rt, buf, len + 1);
    close(fd);
    return st;
}

/* Reads a regular file of at most cap bytes into memory from rt's
 * allocator (*size bytes, +1 for a NUL the caller may use). */
khub_status khub__plugin_read_file(khub_runtime *rt, const char *path, size_t cap,
                                   unsigned char **out, size_t *size, char *msg, size_t n)
{
    return read_file(rt, path, cap, out, size, NULL, msg, n);
}

khub_status khub_plugin_inspect(const char *path, khub_plugin_info *info, char *errbuf,
                                size_t errbuf_size)
{
    char msg[KHUB_ERROR_SIZE];
    unsigned char *data = NULL;
    size_t size = 0;
    khub_plugin_info full = {KHUB_STRUCT_INIT(khub_plugin_info)};
    /* 0.1's size at least, before the file is read (since session 17: a
     * struct_size of 0 was taken as the whole struct, 1-7 as a header) */
    khub_status st = info ? khub__app_struct_check(info, KHUB__SIZE_TO(khub_plugin_info, sha256),
                                                   "khub_plugin_inspect", "info", msg, sizeof msg)
                          : KHUB_STATUS_OK;
    if (st == KHUB_STATUS_OK) st = check_path(path, msg, sizeof msg);
    if (st == KHUB_STATUS_OK)
        st = khub__plugin_read_file(NULL, path, MAX_PLUGIN_BYTES, &data, &size, msg, sizeof msg);
    if (st == KHUB_STATUS_OK) st = khub__sha256_hex(data, size, full.sha256);
    if (st == KHUB_STATUS_OK) st = khub__elf_inspect(data, size, path, &full, msg, sizeof msg);
    khub__free(NULL, data, size + 1);
    if (st != KHUB_STATUS_OK) {
        khub__fail(NULL, st, "%s", msg);
        khub__errbuf(errbuf, errbuf_size, "%s", msg);
        return st;
    }
    if (info) khub__app_copy_out(info, &full, sizeof full); /* the caller's header kept */
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* Verified bytes into the process                                          */
/* ======================================================================== */

static khub_status write_all(int fd, const unsigned char *b, size_t size)
{
    for (size_t put = 0; put < size;) {
        ssize_t w = write(fd, b + put, size - put);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return KHUB_STATUS_IO;
        put += (size_t)w;
    }
    return KHUB_STATUS_OK;
}

/* A downloaded plugin (khub__plugin_load_verified, the only load with an
 * artifact directory) passes the ABI gate on its sealed bytes before dlopen
 * runs any of its code: a RUNPATH or a library off the allow-list would
 * make the dynamic loader map code that no signature covers, and extra
 * exports, a glibc newer than this host's, NODELETE or GNU_UNIQUE break
 * the hot-load rules. Local plugins (khub_plugin_load) are the embedder's
 * choice and `khub check` gates them. */
static khub_status gate_bytes(khub_runtime *rt, const void *bytes, size_t size, const char *path,
                              char *msg, size_t n)
{
    khub_gate_policy pol;
    char ceiling[32];
    khub__gate_load_policy(&pol, ceiling);
    khub_gate_report *rep = khub__calloc(rt, 1, sizeof *rep);
    if (!rep) {
        khub__errbuf(msg, n, "%s: out of memory for the ABI gate", path);
        return KHUB_STATUS_NOMEM;
    }
    char err[KHUB_ERROR_SIZE];
    khub_status st = khub__gate_check_mem(bytes, size, path, &pol, rep, err, sizeof err);
    if (st == KHUB_STATUS_PLUGIN_INVALID)
        khub__errbuf(msg, n, "%s: refused before loading: the ABI gate found %zu problem(s): %s%s",
                     path, rep->n_findings, rep->findings[0],
                     rep->n_findings > 1 ? " (and more: run 'khub check' on it)" : "");
    else if (st != KHUB_STATUS_OK)
        khub__errbuf(msg, n, "%s", err);
    khub__free(rt, rep, sizeof *rep);
    return st;
}

/* The ELF inspection and, for a downloaded plugin, the ABI gate, on the
 * sealed bytes whose SHA-256 is p->sha256, unless bytes of that digest
 * passed them before in this process (gate_memo.h). */
static khub_status check_bytes(khub_plugin *p, const unsigned char *bytes, size_t size,
                               khub_plugin_info *info, char *msg, size_t n)
{
    bool gated = p->artifacts != NULL;
    if (khub__gate_memo_find(p->sha256, gated, info)) return KHUB_STATUS_OK;
    khub_status st = khub__elf_inspect(bytes, size, p->path, info, msg, n);
    if (st == KHUB_STATUS_OK && gated) st = gate_bytes(p->rt, bytes, size, p->path, msg, n);
    if (st == KHUB_STATUS_OK) khub__gate_memo_add(p->sha256, gated, info);
    return st;
}

/* Reads the sealed memfd back into bytes (size bytes, the buffer it was
 * filled from): what is hashed and inspected next is then the sealed
 * content, whatever was written to the memfd before the seal. A read of
 * 16 KB costs ~1.5 us; the mmap, four page faults and munmap it replaces
 * cost ~7 us on Zen 2 (docs/performance.md, "Warm load, session 14"). */
static khub_status read_back(int fd, unsigned char *bytes, size_t size)
{
    for (size_t got = 0; got < size;) {
        ssize_t r = pread(fd, bytes + got, size - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return KHUB_STATUS_IO;
        got += (size_t)r;
    }
    return KHUB_STATUS_OK;
}

/* Copies the bytes read into a new memfd (p->memfd) and seals it. */
static khub_status fill_sealed(khub_plugin *p, const unsigned char *bytes, size_t size, char *msg,
                               size_t n)
{
    snprintf(p->memfd_name, sizeof p->memfd_name, "khub-plugin-%llu-%d", (unsigned long long)p->seq,
             (int)getpid());
    p->memfd = memfd_create(p->memfd_name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (p->memfd < 0) {
        khub__errbuf(msg, n, "%s: memfd_create: %s", p->path, strerror(errno));
        return KHUB_STATUS_IO;
    }
    if (write_all(p->memfd, bytes, size) != KHUB_STATUS_OK ||
        fcntl(p->memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL)) {
        khub__errbuf(msg, n, "%s: cannot fill and seal a memfd: %s", p->path, strerror(errno));
        return KHUB_STATUS_IO;
    }
    return KHUB_STATUS_OK;
}

/* Reads the sealed memfd (p->memfd, size bytes: filled now, or kept by
 * sealed_memo.h) back into bytes, hashes that into p->sha256 and checks it
 * against want (NULL: an unverified load), inspects it, and dlopens it.
 * Hashing after the seal covers a write to the memfd through /proc/PID/fd
 * before it was sealed as well as a file changed before it was read. */
static khub_status load_sealed(khub_plugin *p, unsigned char *bytes, size_t size, const char *want,
                               khub_plugin_info *info, char *msg, size_t n)
{
    if (read_back(p->memfd, bytes, size) != KHUB_STATUS_OK) {
        khub__errbuf(msg, n, "%s: reading the sealed memfd back: %s", p->path, strerror(errno));
        return KHUB_STATUS_IO;
    }
    khub_status st = khub__sha256_hex(bytes, size, p->sha256);
    if (st == KHUB_STATUS_OK && want && !khub__digest_eq(p->sha256, want)) {
        khub__errbuf(msg, n,
                     "plugin file %s: SHA-256 is %s, expected %s; the file is not the "
                     "one that was verified, fetch it again",
                     p->path, p->sha256, want);
        st = KHUB_STATUS_DIGEST_MISMATCH;
    }
    if (st == KHUB_STATUS_OK) st = check_bytes(p, bytes, size, info, msg, n);
    if (st != KHUB_STATUS_OK) return st;

    /* glibc's dlopen returns an object already loaded under the same name,
     * whatever the name points at now. A child forked for an isolated init
     * holds its parent's plugins as /proc/self/fd/N with those descriptors
     * closed, and its memfd takes the lowest free number, maybe one of those
     * N: move the memfd to a number no loaded object is named by, so the
     * bytes verified above are the bytes loaded. */
    char fdpath[32];
    snprintf(fdpath, sizeof fdpath, "/proc/self/fd/%d", p->memfd);
    while (khub__fd_path_loaded(fdpath)) {
        int fd = fcntl(p->memfd, F_DUPFD_CLOEXEC, p->memfd + 1);
        if (fd < 0) {
            khub__errbuf(msg, n, "%s: moving the memfd off %s: %s", p->path, fdpath,
                         strerror(errno));
            return KHUB_STATUS_IO;
        }
        close(p->memfd);
        p->memfd = fd;
        snprintf(fdpath, sizeof fdpath, "/proc/self/fd/%d", p->memfd);
    }
    dlerror();
    p->dl = dlopen(fdpath, RTLD_NOW | RTLD_LOCAL);
    if (!p->dl) {
        const char *e = dlerror();
        khub__errbuf(msg, n, "plugin %s %s (%s): dlopen failed: %s", info->full_id, info->version,
                     p->path, e ? e : "unknown error");
        return KHUB_STATUS_DLOPEN;
    }
    return KHUB_STATUS_OK;
}

/* Everything up to a ready, unregistered plugin. arts (may be NULL) is the
 * verified artifact directory; the plugin owns it from here on, also on
 * failure. */
khub_status khub__plugin_prepare(khub_runtime *rt, const char *path, const char *sha256_hex,
                                 khub__artifacts *arts, khub_plugin **out, char *msg, size_t n)
{
    *out = NULL;
    unsigned char *bytes = NULL;
    size_t size = 0;
    khub_plugin_info info = {KHUB_STRUCT_INIT(khub_plugin_info)};
    khub_plugin *p = khub__plugin_new(rt);
    if (!p) {
        khub__artifacts_free(rt, arts);
        khub__errbuf(msg, n, "loading %s: out of memory", path);
        return KHUB_STATUS_NOMEM;
    }
    p->artifacts = arts;
    pthread_rwlock_wrlock(&rt->reg_lock);
    p->seq = ++rt->plugin_seq;
    pthread_rwlock_unlock(&rt->reg_lock);
    p->path = khub__strdup(rt, path);
    khub_status st = p->path ? KHUB_STATUS_OK : KHUB_STATUS_NOMEM;
    if (st != KHUB_STATUS_OK) khub__errbuf(msg, n, "loading %s: out of memory", path);
    /* A downloaded plugin's sealed copy of this file, kept since an earlier
     * load, serves when the file is unchanged (sealed_memo.h); its bytes
     * are read back, hashed and checked below like fresh ones. */
    bool verified = arts && sha256_hex;
    khub__sealed_source src = {0};
    if (st == KHUB_STATUS_OK && verified)
        p->memfd = khub__sealed_memo_take(path, sha256_hex, &size, p->memfd_name, &src);
    if (st == KHUB_STATUS_OK && p->memfd >= 0 && !(bytes = khub__malloc(rt, size + 1))) {
        khub__errbuf(msg, n, "loading %s: out of memory for %zu bytes", path, size);
        st = KHUB_STATUS_NOMEM;
    } else if (st == KHUB_STATUS_OK && p->memfd < 0) {
        st = read_file(rt, path, MAX_PLUGIN_BYTES, &bytes, &size, &src, msg, n);
        if (st == KHUB_STATUS_OK) st = fill_sealed(p, bytes, size, msg, n);
    }
    if (st == KHUB_STATUS_OK) st = load_sealed(p, bytes, size, sha256_hex, &info, msg, n);
    if (bytes) khub__free(rt, bytes, size + 1);
    if (st != KHUB_STATUS_OK) goto fail;
    p->memfd_size = size;
    p->source = src;

    p->kinds = info.kinds;
    khub_plugin_init_fn init = (khub_plugin_init_fn)dlsym(p->dl, KHUB_PLUGIN_ENTRY);
    if (!init) {
        khub__errbuf(msg, n,
                     "plugin %s %s (%s): no entry symbol %s; build it with "
                     "KHUB_PLUGIN_DEFINE as a module",
                     info.full_id, info.version, path, KHUB_PLUGIN_ENTRY);
        st = KHUB_STATUS_NO_ENTRY;
        goto fail;
    }
    st = khub__plugin_negotiate(p, init, &info, msg, n);
    if (st != KHUB_STATUS_OK) goto fail;
    p->keep_sealed = verified;
    *out = p;
    return KHUB_STATUS_OK;
fail:
    khub__plugin_dlclose(p);
    khub__plugin_free(p);
    return st;
}

/* ======================================================================== */
/* Public: load, verified load, static load                                 */
/* ======================================================================== */

/* With KHUB_OPT_ISOLATED_INIT a downloaded plugin's code first runs in the
 * child, so the ABI gate comes before it too: on the file's bytes, which
 * must have the digest the child will load by. */
static khub_status gate_before_child(khub_runtime *rt, const char *path, const char *sha256_hex)
{
    if (!rt->isolated_init) return KHUB_STATUS_OK; /* prepare gates the sealed bytes */
    char msg[KHUB_ERROR_SIZE], sha[65];
    unsigned char *bytes = NULL;
    size_t size = 0;
    khub_status st =
        khub__plugin_read_file(rt, path, MAX_PLUGIN_BYTES, &bytes, &size, msg, sizeof msg);
    if (st == KHUB_STATUS_OK) st = khub__sha256_hex(bytes, size, sha);
    if (st == KHUB_STATUS_OK && !khub__digest_eq(sha, sha256_hex)) {
        khub__errbuf(msg, sizeof msg, "plugin file %s: SHA-256 is %s, expected %s", path, sha,
                     sha256_hex);
        st = KHUB_STATUS_DIGEST_MISMATCH;
    }
    if (st == KHUB_STATUS_OK) st = gate_bytes(rt, bytes, size, path, msg, sizeof msg);
    if (bytes) khub__free(rt, bytes, size + 1);
    return st == KHUB_STATUS_OK ? st : khub__fail(rt, st, "%s", msg);
}

/* With KHUB_OPT_ISOLATED_INIT: the same file, verified against the same
 * digest, loaded, initialised and self-tested in a forked child first, so a
 * crash there is a status here. (Unverified loads hand the child no digest;
 * then nothing ties the bytes it ran to the bytes loaded next.) */
khub_status khub__plugin_isolated_init(khub_runtime *rt, const char *path, const char *sha256_hex)
{
    if (!rt->isolated_init) return KHUB_STATUS_OK;
    char report[KHUB_ERROR_SIZE];
    khub_status st = khub__check_in_child(path, sha256_hex, report, sizeof report);
    if (st != KHUB_STATUS_OK)
        return khub__fail(rt, st, "%s (init run in a child: KHUB_OPT_ISOLATED_INIT)", report);
    return KHUB_STATUS_OK;
}

khub_status khub__plugin_check_args(khub_runtime *rt, const char *path, const char *sha256_hex)
{
    char msg[KHUB_ERROR_SIZE];
    khub_status st = check_path(path, msg, sizeof msg);
    if (st != KHUB_STATUS_OK) return khub__fail(rt, st, "%s", msg);
    KHUB_RETURN_IF(rt, !sha256_hex && !rt->allow_unverified, KHUB_STATUS_INVALID_ARG,
                   "plugin %s: no SHA-256 digest given; pass the digest from the kernel's "
                   "metadata, or set KHUB_OPT_ALLOW_UNVERIFIED",
                   path);
    KHUB_RETURN_IF(rt, sha256_hex && !khub__is_sha256_hex(sha256_hex), KHUB_STATUS_INVALID_ARG,
                   "plugin %s: digest \"%.80s\" is not 64 hex digits", path, sha256_hex);
    return KHUB_STATUS_OK;
}

khub_status khub_plugin_load(khub_runtime *rt, const char *path, const char *sha256_hex,
                             khub_plugin **out)
{
    KHUB_API_CHECK(NULL, rt != NULL);
    khub__clear(rt);
    if (out) *out = NULL;
    KHUB_FORWARD_IF_ERROR(rt, khub__plugin_check_args(rt, path, sha256_hex));
    KHUB_FORWARD_IF_ERROR(rt, khub__plugin_isolated_init(rt, path, sha256_hex));
    char msg[KHUB_ERROR_SIZE];
    khub_plugin *p = NULL;
    khub_status st = khub__plugin_prepare(rt, path, sha256_hex, NULL, &p, msg, sizeof msg);
    if (st != KHUB_STATUS_OK) return khub__fail(rt, st, "%s", msg);
    p->by_caller = true; /* never unloaded by a kernel swap */
    return khub__plugin_register(rt, p, out);
}

khub_status khub__plugin_load_verified(khub_runtime *rt, const char *path, const char *sha256_hex,
                                       const khub__artifact_file *files, size_t n_files,
                                       khub_plugin **out)
{
    KHUB_API_CHECK(NULL, rt != NULL);
    khub__clear(rt);
    if (out) *out = NULL;
    KHUB_RETURN_IF(rt, !sha256_hex, KHUB_STATUS_INVALID_ARG,
                   "plugin %s: a verified variant's plugin needs its digest", path ? path : "");
    KHUB_FORWARD_IF_ERROR(rt, khub__plugin_check_args(rt, path, sha256_hex));
    /* Downloaded kernels come this way: KHUB_OPT_ISOLATED_INIT holds here
     * as for khub_plugin_load (issue 10 item 1). The child runs the bytes
     * of the same digest, after they passed the ABI gate; it gets no
     * artifact directory. */
    KHUB_FORWARD_IF_ERROR(rt, gate_before_child(rt, path, sha256_hex));
    KHUB_FORWARD_IF_ERROR(rt, khub__plugin_isolated_init(rt, path, sha256_hex));
    char msg[KHUB_ERROR_SIZE];
    khub__artifacts *arts = NULL;
    khub_status st = khub__artifacts_new(rt, files, n_files, &arts, msg, sizeof msg);
    if (st != KHUB_STATUS_OK) return khub__fail(rt, st, "plugin %s: %s", path, msg);
    khub_plugin *p = NULL;
    st = khub__plugin_prepare(rt, path, sha256_hex, arts, &p, msg, sizeof msg);
    if (st != KHUB_STATUS_OK) return khub__fail(rt, st, "%s", msg);
    return khub__plugin_register(rt, p, out);
}

khub_status khub_plugin_load_static(khub_runtime *rt, khub_plugin_init_fn init_fn,
                                    khub_plugin **out)
{
    KHUB_API_CHECK(NULL, rt != NULL && init_fn != NULL);
    khub__clear(rt);
    if (out) *out = NULL;
    khub_plugin *p = khub__plugin_new(rt);
    if (!p) return khub__fail(rt, KHUB_STATUS_NOMEM, "static plugin: out of memory");
    pthread_rwlock_wrlock(&rt->reg_lock);
    p->seq = ++rt->plugin_seq;
    pthread_rwlock_unlock(&rt->reg_lock);
    char msg[KHUB_ERROR_SIZE];
    khub_status st = khub__plugin_negotiate(p, init_fn, NULL, msg, sizeof msg);
    if (st == KHUB_STATUS_OK && !(p->path = khub__strdup(rt, "(static)"))) {
        snprintf(msg, sizeof msg, "static plugin: out of memory");
        st = KHUB_STATUS_NOMEM;
    }
    if (st != KHUB_STATUS_OK) {
        if (p->id)
            khub__plugin_retire(p);
        else
            khub__plugin_free(p);
        return khub__fail(rt, st, "%s", msg);
    }
    p->by_caller = true;
    return khub__plugin_register(rt, p, out);
}
