/*
 * loader.c: the verifying plugin loader: read, hash, seal, inspect, dlopen,
 * negotiate, register; hot reload; unload; the built-in manifest.
 *
 * Load only the bytes you verified. The file is read once into memory and
 * hashed; the bytes are copied into a memfd that is then sealed (no write,
 * grow, shrink, or further seals), so nobody can change them between the
 * check and dlopen. The sealed memfd is mapped and hashed again, its ELF
 * header and ABI note are read from that mapping, and only then is it
 * dlopened through /proc/self/fd/N. The memfd stays open until dlclose:
 * glibc reuses an already-loaded library whose name matches, so a recycled
 * fd number would hand back the old library.
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

#include <cjson/cJSON.h>

#include "check.h"
#include "elf_gate.h"
#include "install_paths.h"
#include "plugin_artifacts.h"
#include "runtime_impl.h"

#define MAX_PLUGIN_BYTES   ((size_t)1 << 30)
#define MAX_MANIFEST_BYTES ((size_t)1 << 20)
#define MAX_OPS            1024
#define MAX_HEAD_DIMS      64
#define MAX_OP_NAME        64
/* The largest op or caps struct_size accepted. ABI 1.x structs are under
 * 100 bytes and a newer minor only appends fields, so a descriptor claiming
 * kilobytes is broken or hostile: the op array is walked with the claimed
 * size as its stride, and a 1 GiB stride read far outside the plugin. */
#define MAX_STRUCT_SIZE 4096

/* The ABI 1.0 sizes: the smallest structs a plugin may hand over. */
#define DESC_MIN_1_0 (offsetof(khub_plugin_desc, shutdown) + sizeof(void (*)(void *)))
#define OP_MIN_1_0   (offsetof(khub_op_desc, methods) + sizeof(void *))
#define CAPS_MIN_1_0 (offsetof(khub_op_caps, reserved2) + sizeof(uint32_t))

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

/* Reads a regular file of at most cap bytes into memory from rt's
 * allocator (*size bytes, +1 for a NUL the caller may use). */
static khub_status read_file(khub_runtime *rt, const char *path, size_t cap, unsigned char **out,
                             size_t *size, char *msg, size_t n)
{
    *out = NULL;
    *size = 0;
    int fd = khub__open_regular(path, msg, n); /* never hangs on a FIFO */
    if (fd < 0) return errno == ENOENT ? KHUB_STATUS_NOT_FOUND : KHUB_STATUS_IO;
    struct stat sb;
    khub_status st = KHUB_STATUS_OK;
    unsigned char *buf = NULL;
    size_t len = 0;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        khub__errbuf(msg, n, "%s is not a regular file", path);
        st = KHUB_STATUS_IO;
        goto fail;
    }
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
    *out = buf;
    *size = len;
    return KHUB_STATUS_OK;
fail:
    khub__free(rt, buf, len + 1);
    close(fd);
    return st;
}

khub_status khub_plugin_inspect(const char *path, khub_plugin_info *info, char *errbuf,
                                size_t errbuf_size)
{
    char msg[KHUB_ERROR_SIZE];
    unsigned char *data = NULL;
    size_t size = 0;
    khub_plugin_info full = {KHUB_STRUCT_INIT(khub_plugin_info)};
    khub_status st = check_path(path, msg, sizeof msg);
    if (st == KHUB_STATUS_OK)
        st = read_file(NULL, path, MAX_PLUGIN_BYTES, &data, &size, msg, sizeof msg);
    if (st == KHUB_STATUS_OK) st = khub__sha256_hex(data, size, full.sha256);
    if (st == KHUB_STATUS_OK) st = khub__elf_inspect(data, size, path, &full, msg, sizeof msg);
    khub__free(NULL, data, size + 1);
    if (st != KHUB_STATUS_OK) {
        khub__fail(NULL, st, "%s", msg);
        khub__errbuf(errbuf, errbuf_size, "%s", msg);
        return st;
    }
    if (info) {
        uint32_t want = info->struct_size ? info->struct_size : (uint32_t)sizeof full;
        memcpy((char *)info + sizeof(uint32_t), (char *)&full + sizeof(uint32_t),
               (want < sizeof full ? want : sizeof full) - sizeof(uint32_t));
    }
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* Plugin objects                                                           */
/* ======================================================================== */

static khub_plugin *plugin_new(khub_runtime *rt)
{
    khub_plugin *p = khub__calloc(rt, 1, sizeof *p);
    if (!p) return NULL;
    p->rt = rt;
    p->memfd = -1;
    p->score = 1;
    atomic_init(&p->inflight, 0);
    pthread_mutex_init(&p->mod_lock, NULL);
    return p;
}

static int find_loaded(struct dl_phdr_info *info, size_t size, void *ud)
{
    (void)size;
    return info->dlpi_name && strcmp(info->dlpi_name, (const char *)ud) == 0;
}

/* dlclose, then check that the library really left the process. If it did
 * not (a NODELETE object), the memfd is deliberately kept open: closing it
 * would let a later load reuse the fd number and get this library back. */
static void plugin_dlclose(khub_plugin *p)
{
    if (!p->dl) return;
    char fdpath[32];
    snprintf(fdpath, sizeof fdpath, "/proc/self/fd/%d", p->memfd);
    dlclose(p->dl);
    p->dl = NULL;
    if (dl_iterate_phdr(find_loaded, fdpath)) {
        khub__log(p->rt, KHUB_LOG_WARN, "plugin %s %s: still mapped after dlclose; keeping %s open",
                  p->id, p->version, fdpath);
        p->memfd = -1;
    }
}

static void plugin_free(khub_plugin *p)
{
    if (!p) return;
    khub_runtime *rt = p->rt;
    for (uint32_t i = 0; p->ops && i < p->n_ops; i++) khub__strfree(rt, (char *)p->ops[i].name);
    khub__free(rt, p->ops, sizeof *p->ops * p->ops_cap);
    khub__free(rt, p->caps, sizeof *p->caps * p->ops_cap);
    khub__free(rt, p->dims, sizeof *p->dims * p->n_dims);
    if (p->memfd >= 0) close(p->memfd);
    khub__strfree(rt, p->id);
    khub__strfree(rt, p->version);
    khub__strfree(rt, p->path);
    khub__artifacts_free(rt, p->artifacts);
    khub__strfree(rt, p->quarantine);
    pthread_mutex_destroy(&p->mod_lock);
    khub__free(rt, p, sizeof *p);
}

/* Retirement: quiesce, shutdown, CUDA modules, dlclose, memory. The caller
 * has made sure no call is in flight. */
static void plugin_retire(khub_plugin *p)
{
    if (!p) return;
    if (p->desc.quiesce) {
        khub_status st = p->desc.quiesce(p->desc.state);
        if (st != KHUB_STATUS_OK)
            khub__log(p->rt, KHUB_LOG_WARN, "plugin %s %s: quiesce returned %s", p->id, p->version,
                      khub_status_name(st));
    }
    if (p->desc.shutdown) p->desc.shutdown(p->desc.state);
    khub__cuda_unload_modules(p);
    plugin_dlclose(p);
    plugin_free(p);
}

static void wait_idle(khub_plugin *p)
{
    for (unsigned spins = 0; atomic_load(&p->inflight) != 0; spins++) {
        if (spins < 64) {
            sched_yield();
        } else {
            struct timespec ts = {0, 50 * 1000};
            nanosleep(&ts, NULL);
        }
    }
}

/* ======================================================================== */
/* Negotiation                                                              */
/* ======================================================================== */

static bool valid_op_name(const char *s)
{
    size_t len = strnlen(s, MAX_OP_NAME);
    if (len == 0 || len >= MAX_OP_NAME) return false;
    for (size_t i = 0; i < len; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
            return false;
    return true;
}

/* Copies a plugin's caps (struct_size checked) into the host's zeroed copy:
 * only the fields of the plugin's minor, whatever its struct_size covers
 * (abi_minor.c), then in the host's terms: kind_flags holds the 1.0 word
 * too, and act_dtypes 0 means f32, what ops took before 1.3. */
static void copy_caps(khub_op_caps *dst, const khub_op_caps *src, unsigned minor)
{
    size_t n = khub__op_caps_size(minor);
    if (src->struct_size < n) n = src->struct_size;
    memcpy(dst, src, n < sizeof *dst ? n : sizeof *dst);
    dst->kind_flags |= dst->flags;
    if (!dst->act_dtypes) dst->act_dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32);
}

/* Checks the plugin's op i (src, untrusted) and copies it and its caps to
 * p->ops[p->n_ops++]; an op of a kind this host does not know is skipped
 * with a trace line (a plugin may offer a kind that only newer hosts run). */
static khub_status copy_op(khub_plugin *p, const char *who, unsigned minor, uint32_t i,
                           const khub_op_desc *src, uint32_t stride, size_t *dim_pos, char *msg,
                           size_t n)
{
    if (src->struct_size != stride) {
        khub__errbuf(msg, n, "%s: op %u has struct_size %u, op 0 has %u", who, i,
                     (unsigned)src->struct_size, (unsigned)stride);
        return KHUB_STATUS_PLUGIN_INVALID;
    }
    if (!src->name || !valid_op_name(src->name)) {
        khub__errbuf(msg, n, "%s: op %u: name is NULL, empty, over %d bytes or not [a-z0-9_]", who,
                     i, MAX_OP_NAME - 1);
        return KHUB_STATUS_PLUGIN_INVALID;
    }
    const char *name = src->name;
    if (src->kind == 0) {
        khub__errbuf(msg, n, "%s: op %s: kind 0 is no kind; set one of %s", who, name,
                     KHUB__OP_KIND_WORDS);
        return KHUB_STATUS_PLUGIN_INVALID;
    }
    if (src->kind >= KHUB_OP_KIND__COUNT) {
        khub__log(p->rt, KHUB_LOG_INFO,
                  "%s: op %s skipped: kind %u is unknown to this host (ABI %d.%d knows kinds "
                  "1-%d: %s); its other ops load",
                  who, name, (unsigned)src->kind, KHUB_ABI_MAJOR, KHUB_ABI_MINOR,
                  KHUB_OP_KIND__COUNT - 1, KHUB__OP_KIND_WORDS);
        return KHUB_STATUS_OK;
    }
    if (!src->caps) {
        khub__errbuf(msg, n, "%s: op %s: caps is NULL (required)", who, name);
        return KHUB_STATUS_PLUGIN_INVALID;
    }
    if (src->caps->struct_size < CAPS_MIN_1_0) {
        khub__errbuf(msg, n, "%s: op %s: caps struct_size %u, ABI 1.0 minimum %zu", who, name,
                     (unsigned)src->caps->struct_size, CAPS_MIN_1_0);
        return KHUB_STATUS_STRUCT_SIZE;
    }
    if (src->caps->struct_size > MAX_STRUCT_SIZE) {
        khub__errbuf(msg, n, "%s: op %s: caps struct_size %u, more than the %d allowed", who, name,
                     (unsigned)src->caps->struct_size, MAX_STRUCT_SIZE);
        return KHUB_STATUS_STRUCT_SIZE;
    }
    if (!src->run && src->kind != KHUB_OP_KV_CACHE) {
        khub__errbuf(msg, n, "%s: op %s: run is NULL (required for kind %s)", who, name,
                     khub__op_kind_name(src->kind));
        return KHUB_STATUS_PLUGIN_INVALID;
    }
    if (src->kind == KHUB_OP_KV_CACHE && !src->methods) {
        khub__errbuf(msg, n, "%s: op %s: kv_cache op without a methods table", who, name);
        return KHUB_STATUS_PLUGIN_INVALID;
    }
    uint32_t at = p->n_ops;
    khub_op_desc *op = &p->ops[at];
    khub_op_caps *caps = &p->caps[at];
    memcpy(op, src, stride < sizeof *op ? stride : sizeof *op);
    copy_caps(caps, src->caps, minor);
    op->struct_size = sizeof *op;
    caps->struct_size = sizeof *caps;
    op->caps = caps;
    op->name = NULL;
    if (caps->n_head_dims) {
        memcpy(p->dims + *dim_pos, src->caps->head_dims, caps->n_head_dims * sizeof(int32_t));
        caps->head_dims = p->dims + *dim_pos;
        *dim_pos += caps->n_head_dims;
    } else {
        caps->head_dims = NULL;
    }
    op->name = khub__strdup(p->rt, name);
    if (!op->name) {
        khub__errbuf(msg, n, "%s: out of memory", who);
        return KHUB_STATUS_NOMEM;
    }
    p->n_ops++;
    return KHUB_STATUS_OK;
}

/* Op names are unique within a plugin, skipped ops included (their names
 * were checked when they were walked). */
static khub_status check_unique(const char *who, const khub_op_desc *ops, uint32_t stride,
                                uint32_t i, char *msg, size_t n)
{
    const char *name = ((const khub_op_desc *)((const char *)ops + (size_t)i * stride))->name;
    for (uint32_t j = 0; j < i; j++) {
        const khub_op_desc *o = (const khub_op_desc *)((const char *)ops + (size_t)j * stride);
        if (strcmp(o->name, name) == 0) {
            khub__errbuf(msg, n, "%s: op name \"%s\" appears twice (ops %u and %u)", who, name, j,
                         i);
            return KHUB_STATUS_DUPLICATE_OP;
        }
    }
    return KHUB_STATUS_OK;
}

/* Counts head dims over all ops (checked) and allocates the op copies. */
static khub_status alloc_ops(khub_plugin *p, const char *who, const khub_plugin_desc *d,
                             uint32_t stride, char *msg, size_t n)
{
    size_t total = 0;
    for (uint32_t i = 0; i < d->n_ops; i++) {
        const khub_op_desc *src = (const khub_op_desc *)((const char *)d->ops + (size_t)i * stride);
        const khub_op_caps *c = src->caps;
        if (!c || c->struct_size < CAPS_MIN_1_0 || c->struct_size > MAX_STRUCT_SIZE ||
            c->n_head_dims == 0)
            continue;
        if (c->n_head_dims > MAX_HEAD_DIMS || !c->head_dims) {
            khub__errbuf(msg, n, "%s: op %u: %u head dims at %p (at most %d, non-NULL)", who, i,
                         (unsigned)c->n_head_dims, (const void *)c->head_dims, MAX_HEAD_DIMS);
            return KHUB_STATUS_PLUGIN_INVALID;
        }
        total += c->n_head_dims;
    }
    p->ops = khub__calloc(p->rt, d->n_ops ? d->n_ops : 1, sizeof *p->ops);
    p->caps = khub__calloc(p->rt, d->n_ops ? d->n_ops : 1, sizeof *p->caps);
    p->dims = total ? khub__calloc(p->rt, total, sizeof *p->dims) : NULL;
    if (!p->ops || !p->caps || (total && !p->dims)) {
        khub__errbuf(msg, n, "%s: out of memory for %u ops", who, (unsigned)d->n_ops);
        return KHUB_STATUS_NOMEM;
    }
    p->ops_cap = d->n_ops ? d->n_ops : 1;
    p->n_dims = total;
    return KHUB_STATUS_OK;
}

static khub_status check_ops(khub_plugin *p, const char *who, const khub_plugin_desc *d, char *msg,
                             size_t n)
{
    if (d->n_ops > MAX_OPS || (d->n_ops && !d->ops)) {
        khub__errbuf(msg, n, "%s: %u ops at %p (at most %d, ops non-NULL)", who, (unsigned)d->n_ops,
                     (const void *)d->ops, MAX_OPS);
        return KHUB_STATUS_PLUGIN_INVALID;
    }
    if (d->n_ops == 0) return KHUB_STATUS_OK;
    uint32_t stride = d->ops[0].struct_size;
    if (stride < OP_MIN_1_0) {
        khub__errbuf(msg, n, "%s: op struct_size %u, ABI 1.0 minimum %zu", who, (unsigned)stride,
                     OP_MIN_1_0);
        return KHUB_STATUS_STRUCT_SIZE;
    }
    if (stride > MAX_STRUCT_SIZE) {
        khub__errbuf(msg, n, "%s: op struct_size %u, more than the %d allowed", who,
                     (unsigned)stride, MAX_STRUCT_SIZE);
        return KHUB_STATUS_STRUCT_SIZE;
    }
    KHUB_FORWARD_IF_ERROR(NULL, alloc_ops(p, who, d, stride, msg, n));
    size_t dim_pos = 0;
    for (uint32_t i = 0; i < d->n_ops; i++) {
        const khub_op_desc *src = (const khub_op_desc *)((const char *)d->ops + (size_t)i * stride);
        KHUB_FORWARD_IF_ERROR(NULL,
                              copy_op(p, who, d->abi_minor, i, src, stride, &dim_pos, msg, n));
        KHUB_FORWARD_IF_ERROR(NULL, check_unique(who, d->ops, stride, i, msg, n));
    }
    return KHUB_STATUS_OK;
}

/* The descriptor's header, id and version against the host and the note
 * (note is NULL for static plugins). */
static khub_status check_desc(const khub_plugin_desc *d, const khub_plugin_info *note,
                              const char *who, char *msg, size_t n)
{
    char why[160];
    if (d->struct_size < DESC_MIN_1_0) {
        khub__errbuf(msg, n, "%s: descriptor struct_size %u, ABI 1.0 minimum %zu", who,
                     (unsigned)d->struct_size, DESC_MIN_1_0);
        return KHUB_STATUS_STRUCT_SIZE;
    }
    khub_status st = khub__abi_check(d->abi_major, d->abi_minor, sizeof(void *), why, sizeof why);
    if (st != KHUB_STATUS_OK) {
        khub__errbuf(msg, n, "%s: descriptor %s", who, why);
        return st;
    }
    if (note &&
        (d->abi_major != note->plugin_abi_major || d->abi_minor != note->plugin_abi_minor)) {
        khub__errbuf(msg, n, "%s: descriptor says ABI %u.%u, its ELF note says %u.%u", who,
                     d->abi_major, d->abi_minor, note->plugin_abi_major, note->plugin_abi_minor);
        return KHUB_STATUS_PLUGIN_INVALID;
    }
    if (!d->id || strnlen(d->id, sizeof note->full_id) >= sizeof note->full_id || !d->id[0] ||
        !d->version || strnlen(d->version, sizeof note->version) >= sizeof note->version ||
        !d->version[0]) {
        khub__errbuf(msg, n,
                     "%s: descriptor id or version is NULL, empty or too long "
                     "(id < %zu, version < %zu bytes)",
                     who, sizeof note->full_id, sizeof note->version);
        return KHUB_STATUS_PLUGIN_INVALID;
    }
    char why_name[KHUB_ERROR_SIZE];
    if (khub__plugin_name_check(d->id, d->version, why_name, sizeof why_name) != KHUB_STATUS_OK) {
        khub__errbuf(msg, n, "%s: descriptor %s", who, why_name);
        return KHUB_STATUS_PLUGIN_INVALID;
    }
    if (note && (strcmp(d->id, note->full_id) != 0 || strcmp(d->version, note->version) != 0)) {
        khub__errbuf(msg, n, "%s: descriptor names %s %s, its ELF note %s %s", who, d->id,
                     d->version, note->full_id, note->version);
        return KHUB_STATUS_PLUGIN_INVALID;
    }
    return KHUB_STATUS_OK;
}

/* The kinds of the registered ops are the kinds the ABI note declares (when
 * it declares any): the note is what inspection, `khub check` and variant
 * choice read without running code, so a plugin must not serve more, or
 * other, kinds than it says there. */
static khub_status check_kinds(const khub_plugin *p, uint32_t note_kinds, const char *who,
                               char *msg, size_t n)
{
    uint32_t kinds = 0, known = 0;
    for (uint32_t i = 0; i < p->n_ops; i++) kinds |= KHUB_KIND_BIT(p->ops[i].kind);
    for (uint32_t k = 1; k < KHUB_OP_KIND__COUNT; k++) known |= KHUB_KIND_BIT(k);
    note_kinds &= known; /* ops of kinds this host does not know were skipped */
    if (!note_kinds || kinds == note_kinds) return KHUB_STATUS_OK;
    char a[160] = "", b[160] = "";
    for (uint32_t k = 1; k < KHUB_OP_KIND__COUNT; k++) {
        if (note_kinds & KHUB_KIND_BIT(k))
            snprintf(a + strlen(a), sizeof a - strlen(a), " %s", khub__op_kind_name(k));
        if (kinds & KHUB_KIND_BIT(k))
            snprintf(b + strlen(b), sizeof b - strlen(b), " %s", khub__op_kind_name(k));
    }
    khub__errbuf(msg, n, "%s: its ABI note declares kinds {%s }, it registers ops of kinds {%s }",
                 who, a, b);
    return KHUB_STATUS_PLUGIN_INVALID;
}

/* Calls the entry, validates and copies what it returned. On failure after
 * a successful init the plugin's shutdown runs. */
static khub_status negotiate(khub_plugin *p, khub_plugin_init_fn init, const khub_plugin_info *note,
                             char *msg, size_t n)
{
    char who[384]; /* ids are up to 255 bytes (note version 2) */
    snprintf(who, sizeof who, "plugin %s %s", note ? note->full_id : "(static)",
             note ? note->version : "");
    /* What the plugin's minor declares, and no more (abi_minor.c). A static
     * plugin has no note: it gets this host's whole table. */
    unsigned minor = note ? note->plugin_abi_minor : KHUB_ABI_MINOR;
    khub__host_api_fill(p->rt, p, &p->hctx, &p->host);
    p->host.struct_size = (uint32_t)khub__host_api_size(minor);
    p->host.abi_minor = (uint16_t)minor;
    khub_plugin_desc d;
    memset(&d, 0, sizeof d);
    d.struct_size = (uint32_t)khub__plugin_desc_size(minor);
    char errbuf[KHUB_ERROR_SIZE] = "";
    khub__plugin_msg_clear();
    khub_status st = init(&p->host, &d, errbuf, sizeof errbuf);
    errbuf[sizeof errbuf - 1] = '\0';
    if (st != KHUB_STATUS_OK) {
        const char *why = errbuf[0]               ? errbuf
                          : khub__plugin_msg()[0] ? khub__plugin_msg()
                                                  : "(no message)";
        khub__errbuf(msg, n, "%s: init failed with %s: %s", who, khub_status_name(st), why);
        return KHUB_STATUS_INIT_FAILED;
    }
    if (d.struct_size > sizeof d) d.struct_size = sizeof d;
    st = check_desc(&d, note, who, msg, n);
    if (st == KHUB_STATUS_OK) {
        snprintf(who, sizeof who, "plugin %s %s", d.id, d.version);
        st = check_ops(p, who, &d, msg, n);
    }
    if (st == KHUB_STATUS_OK && note) st = check_kinds(p, note->kinds, who, msg, n);
    if (st == KHUB_STATUS_OK) {
        p->id = khub__strdup(p->rt, d.id);
        p->version = khub__strdup(p->rt, d.version);
        if (!p->id || !p->version) {
            khub__errbuf(msg, n, "%s: out of memory", who);
            st = KHUB_STATUS_NOMEM;
        }
    }
    if (st != KHUB_STATUS_OK) {
        if (d.struct_size >= DESC_MIN_1_0 && d.shutdown) d.shutdown(d.state);
        return st;
    }
    p->desc = d;
    p->desc.id = p->id;
    p->desc.version = p->version;
    p->desc.ops = p->ops;
    p->abi_major = d.abi_major;
    p->abi_minor = d.abi_minor;
    if (d.score) {
        int32_t s = d.score(d.state);
        p->score = s < 0 ? 0 : s;
    }
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
static khub_status gate_bytes(khub_runtime *rt, const void *map, size_t size, const char *path,
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
    khub_status st = khub__gate_check_mem(map, size, path, &pol, rep, err, sizeof err);
    if (st == KHUB_STATUS_PLUGIN_INVALID)
        khub__errbuf(msg, n, "%s: refused before loading: the ABI gate found %zu problem(s): %s%s",
                     path, rep->n_findings, rep->findings[0],
                     rep->n_findings > 1 ? " (and more: run 'khub check' on it)" : "");
    else if (st != KHUB_STATUS_OK)
        khub__errbuf(msg, n, "%s", err);
    khub__free(rt, rep, sizeof *rep);
    return st;
}

/* Copies the verified bytes into a sealed memfd, re-hashes and inspects
 * the sealed copy, and dlopens it. */
static khub_status open_sealed(khub_plugin *p, const unsigned char *bytes, size_t size,
                               khub_plugin_info *info, char *msg, size_t n)
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
    /* MAP_PRIVATE: libelf never writes through it, and if it did the write
     * would land in a private page, not in the sealed file. */
    void *map = size ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, p->memfd, 0) : NULL;
    if (size && map == MAP_FAILED) {
        khub__errbuf(msg, n, "%s: mmap of the sealed memfd: %s", p->path, strerror(errno));
        return KHUB_STATUS_IO;
    }
    char again[65];
    khub_status st = khub__sha256_hex(map, size, again);
    if (st == KHUB_STATUS_OK && !khub__digest_eq(again, p->sha256)) {
        khub__errbuf(msg, n, "%s: sealed copy has SHA-256 %s, read bytes had %s", p->path, again,
                     p->sha256);
        st = KHUB_STATUS_DIGEST_MISMATCH;
    }
    if (st == KHUB_STATUS_OK) st = khub__elf_inspect(map, size, p->path, info, msg, n);
    if (st == KHUB_STATUS_OK && p->artifacts) st = gate_bytes(p->rt, map, size, p->path, msg, n);
    if (map) munmap(map, size);
    if (st != KHUB_STATUS_OK) return st;

    char fdpath[32];
    snprintf(fdpath, sizeof fdpath, "/proc/self/fd/%d", p->memfd);
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
static khub_status prepare(khub_runtime *rt, const char *path, const char *sha256_hex,
                           khub__artifacts *arts, khub_plugin **out, char *msg, size_t n)
{
    *out = NULL;
    unsigned char *bytes = NULL;
    size_t size = 0;
    khub_plugin_info info = {KHUB_STRUCT_INIT(khub_plugin_info)};
    khub_plugin *p = plugin_new(rt);
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
    if (st == KHUB_STATUS_OK) st = read_file(rt, path, MAX_PLUGIN_BYTES, &bytes, &size, msg, n);
    if (st == KHUB_STATUS_OK) st = khub__sha256_hex(bytes, size, p->sha256);
    if (st == KHUB_STATUS_OK && sha256_hex && !khub__digest_eq(p->sha256, sha256_hex)) {
        khub__errbuf(msg, n,
                     "plugin file %s: SHA-256 is %s, expected %s; the file is not the "
                     "one that was verified, fetch it again",
                     path, p->sha256, sha256_hex);
        st = KHUB_STATUS_DIGEST_MISMATCH;
    }
    if (st == KHUB_STATUS_OK) st = open_sealed(p, bytes, size, &info, msg, n);
    khub__free(rt, bytes, size + 1);
    if (st != KHUB_STATUS_OK) goto fail;

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
    st = negotiate(p, init, &info, msg, n);
    if (st != KHUB_STATUS_OK) goto fail;
    *out = p;
    return KHUB_STATUS_OK;
fail:
    plugin_dlclose(p);
    plugin_free(p);
    return st;
}

/* ======================================================================== */
/* The registry's plugin list                                               */
/* ======================================================================== */

static khub_status list_append(khub_runtime *rt, khub_plugin *p)
{
    khub__plugin_list *l = &rt->plugins;
    if (l->count == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 8;
        khub_plugin **items =
            khub__realloc(rt, l->items, l->cap * sizeof *items, cap * sizeof *items);
        if (!items) return KHUB_STATUS_NOMEM;
        l->items = items;
        l->cap = cap;
    }
    l->items[l->count++] = p;
    return KHUB_STATUS_OK;
}

/* Index of p in the list, or SIZE_MAX. */
static size_t list_find(const khub_runtime *rt, const khub_plugin *p)
{
    for (size_t i = 0; i < rt->plugins.count; i++)
        if (rt->plugins.items[i] == p) return i;
    return SIZE_MAX;
}

static khub_status register_plugin(khub_runtime *rt, khub_plugin *p, khub_plugin **out)
{
    pthread_rwlock_wrlock(&rt->reg_lock);
    khub_status st = list_append(rt, p);
    pthread_rwlock_unlock(&rt->reg_lock);
    if (st != KHUB_STATUS_OK) {
        plugin_retire(p);
        return khub__fail(rt, st, "registering a plugin: out of memory");
    }
    khub__log(rt, KHUB_LOG_INFO, "loaded plugin %s %s (%u ops) from %s", p->id, p->version,
              (unsigned)p->n_ops, p->path);
    if (out) *out = p;
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* Public: load, static load, reload, unload                                */
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
    khub_status st = read_file(rt, path, MAX_PLUGIN_BYTES, &bytes, &size, msg, sizeof msg);
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
static khub_status isolated_init(khub_runtime *rt, const char *path, const char *sha256_hex)
{
    if (!rt->isolated_init) return KHUB_STATUS_OK;
    char report[KHUB_ERROR_SIZE];
    khub_status st = khub__check_in_child(path, sha256_hex, report, sizeof report);
    if (st != KHUB_STATUS_OK)
        return khub__fail(rt, st, "%s (init run in a child: KHUB_OPT_ISOLATED_INIT)", report);
    return KHUB_STATUS_OK;
}

static khub_status check_load_args(khub_runtime *rt, const char *path, const char *sha256_hex)
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
    KHUB_FORWARD_IF_ERROR(rt, check_load_args(rt, path, sha256_hex));
    KHUB_FORWARD_IF_ERROR(rt, isolated_init(rt, path, sha256_hex));
    char msg[KHUB_ERROR_SIZE];
    khub_plugin *p = NULL;
    khub_status st = prepare(rt, path, sha256_hex, NULL, &p, msg, sizeof msg);
    if (st != KHUB_STATUS_OK) return khub__fail(rt, st, "%s", msg);
    return register_plugin(rt, p, out);
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
    KHUB_FORWARD_IF_ERROR(rt, check_load_args(rt, path, sha256_hex));
    /* Downloaded kernels come this way: KHUB_OPT_ISOLATED_INIT holds here
     * as for khub_plugin_load (issue 10 item 1). The child runs the bytes
     * of the same digest, after they passed the ABI gate; it gets no
     * artifact directory. */
    KHUB_FORWARD_IF_ERROR(rt, gate_before_child(rt, path, sha256_hex));
    KHUB_FORWARD_IF_ERROR(rt, isolated_init(rt, path, sha256_hex));
    char msg[KHUB_ERROR_SIZE];
    khub__artifacts *arts = NULL;
    khub_status st = khub__artifacts_new(rt, files, n_files, &arts, msg, sizeof msg);
    if (st != KHUB_STATUS_OK) return khub__fail(rt, st, "plugin %s: %s", path, msg);
    khub_plugin *p = NULL;
    st = prepare(rt, path, sha256_hex, arts, &p, msg, sizeof msg);
    if (st != KHUB_STATUS_OK) return khub__fail(rt, st, "%s", msg);
    return register_plugin(rt, p, out);
}

khub_status khub_plugin_load_static(khub_runtime *rt, khub_plugin_init_fn init_fn,
                                    khub_plugin **out)
{
    KHUB_API_CHECK(NULL, rt != NULL && init_fn != NULL);
    khub__clear(rt);
    if (out) *out = NULL;
    khub_plugin *p = plugin_new(rt);
    if (!p) return khub__fail(rt, KHUB_STATUS_NOMEM, "static plugin: out of memory");
    pthread_rwlock_wrlock(&rt->reg_lock);
    p->seq = ++rt->plugin_seq;
    pthread_rwlock_unlock(&rt->reg_lock);
    char msg[KHUB_ERROR_SIZE];
    khub_status st = negotiate(p, init_fn, NULL, msg, sizeof msg);
    if (st == KHUB_STATUS_OK && !(p->path = khub__strdup(rt, "(static)"))) {
        snprintf(msg, sizeof msg, "static plugin: out of memory");
        st = KHUB_STATUS_NOMEM;
    }
    if (st != KHUB_STATUS_OK) {
        if (p->id)
            plugin_retire(p);
        else
            plugin_free(p);
        return khub__fail(rt, st, "%s", msg);
    }
    return register_plugin(rt, p, out);
}

/* Index of the op of old's op `name` and `kind` in p, or UINT32_MAX. */
static uint32_t op_named(const khub_plugin *p, const char *name, uint32_t kind)
{
    for (uint32_t i = 0; i < p->n_ops; i++)
        if (p->ops[i].kind == kind && strcmp(p->ops[i].name, name) == 0) return i;
    return UINT32_MAX;
}

/* Under the write lock: checks that np serves every binding of old, then
 * swaps them all and puts np in old's slot. */
static khub_status swap_bindings(khub_runtime *rt, khub_plugin *old, khub_plugin *np, size_t slot,
                                 char *msg, size_t n)
{
    for (size_t i = 0; i < rt->bindings.count; i++) {
        const khub_binding *b = rt->bindings.items[i];
        if (b->plugin != old) continue;
        const khub_op_desc *op = &old->ops[b->op_index];
        if (op_named(np, op->name, op->kind) == UINT32_MAX) {
            khub__errbuf(msg, n,
                         "reload %s %s -> %s %s: the new plugin has no %s op \"%s\", "
                         "which a binding uses; nothing changed",
                         old->id, old->version, np->id, np->version, khub__op_kind_name(op->kind),
                         op->name);
            return KHUB_STATUS_NO_KERNEL;
        }
    }
    for (size_t i = 0; i < rt->bindings.count; i++) {
        khub_binding *b = rt->bindings.items[i];
        if (b->plugin != old) continue;
        b->op_index = op_named(np, old->ops[b->op_index].name, b->kind);
        b->plugin = np;
        khub__binding_set_name(b);
    }
    np->seq = old->seq;
    rt->plugins.items[slot] = np;
    return KHUB_STATUS_OK;
}

khub_status khub_plugin_reload(khub_runtime *rt, khub_plugin *old, const char *path,
                               const char *sha256_hex, khub_plugin **out)
{
    KHUB_API_CHECK(NULL, rt != NULL && old != NULL);
    khub__clear(rt);
    if (out) *out = NULL;
    KHUB_FORWARD_IF_ERROR(rt, check_load_args(rt, path, sha256_hex));
    KHUB_RETURN_IF(rt, khub__pinned_here(old), KHUB_STATUS_BUSY,
                   "reload %s %s: this thread holds a khub_binding_acquire pin on it, so it "
                   "could never go idle; release the pin first; nothing changed",
                   old->id, old->version);
    KHUB_FORWARD_IF_ERROR(rt, isolated_init(rt, path, sha256_hex));
    char msg[KHUB_ERROR_SIZE];
    khub_plugin *np = NULL;
    khub_status st = prepare(rt, path, sha256_hex, NULL, &np, msg, sizeof msg);
    if (st != KHUB_STATUS_OK) return khub__fail(rt, st, "%s", msg);

    pthread_rwlock_wrlock(&rt->reg_lock);
    size_t slot = list_find(rt, old);
    if (slot == SIZE_MAX) {
        snprintf(msg, sizeof msg, "reload %s: the old plugin is not loaded in this runtime", path);
        st = KHUB_STATUS_MISUSE;
    } else {
        st = swap_bindings(rt, old, np, slot, msg, sizeof msg);
    }
    pthread_rwlock_unlock(&rt->reg_lock);
    if (st != KHUB_STATUS_OK) {
        plugin_retire(np);
        return khub__fail(rt, st, "%s", msg);
    }
    khub__log(rt, KHUB_LOG_INFO, "reloaded plugin %s %s -> %s", old->id, old->version, np->version);
    /* No new call can reach old now; wait out the ones that pinned it. */
    wait_idle(old);
    plugin_retire(old);
    if (out) *out = np;
    return KHUB_STATUS_OK;
}

khub_status khub_plugin_unload(khub_runtime *rt, khub_plugin *p)
{
    KHUB_API_CHECK(NULL, rt != NULL && p != NULL);
    khub__clear(rt);
    KHUB_RETURN_IF(rt, khub__pinned_here(p), KHUB_STATUS_BUSY,
                   "unload %s %s: this thread holds a khub_binding_acquire pin on it; release "
                   "the pin first",
                   p->id, p->version);
    pthread_rwlock_wrlock(&rt->reg_lock);
    size_t slot = list_find(rt, p);
    size_t users = slot == SIZE_MAX ? 0 : khub__registry_bindings_of(rt, p);
    if (slot != SIZE_MAX && users == 0) {
        khub__plugin_list *l = &rt->plugins;
        memmove(l->items + slot, l->items + slot + 1, (l->count - slot - 1) * sizeof *l->items);
        l->count--;
    }
    pthread_rwlock_unlock(&rt->reg_lock);
    KHUB_RETURN_IF(rt, slot == SIZE_MAX, KHUB_STATUS_MISUSE,
                   "unload: the plugin is not loaded in this runtime");
    KHUB_RETURN_IF(rt, users > 0, KHUB_STATUS_BUSY,
                   "unload %s %s: %zu binding(s) use it; reload it instead, or free the runtime",
                   p->id, p->version, users);
    wait_idle(p);
    plugin_retire(p);
    return KHUB_STATUS_OK;
}

void khub__registry_teardown(khub_runtime *rt)
{
    if (!rt) return;
    for (size_t i = rt->plugins.count; i-- > 0;) {
        wait_idle(rt->plugins.items[i]);
        plugin_retire(rt->plugins.items[i]);
    }
    khub__free(rt, rt->plugins.items, rt->plugins.cap * sizeof *rt->plugins.items);
    rt->plugins = (khub__plugin_list){0};
    khub__bindings_free(rt);
    khub__runtime_host_free(rt);
}

/* ======================================================================== */
/* Built-ins                                                                */
/* ======================================================================== */

static bool plain_file_name(const char *s)
{
    size_t len = strnlen(s, NAME_MAX + 1);
    return len > 0 && len <= NAME_MAX && !strchr(s, '/') && !strstr(s, "..") && strcmp(s, ".") != 0;
}

static bool file_exists(const char *path) { return access(path, R_OK) == 0; }

/* The manifest's directory: $KHUB_PLUGIN_DIR; else the plugins of the
 * install prefix this library runs from (an installed tree, wherever it was
 * installed or moved); else the build tree's; else the install directory
 * compiled in. buf holds the relocated path. */
static const char *builtin_dir(char *buf, size_t size)
{
    const char *env = getenv("KHUB_PLUGIN_DIR");
    if (env && env[0]) return env;
    char probe[PATH_MAX + 16];
    if (khub__install_path(KHUB_PLUGIN_INSTALL_REL, buf, size)) {
        snprintf(probe, sizeof probe, "%s/plugins.json", buf);
        if (file_exists(probe)) return buf;
    }
    if (file_exists(KHUB_PLUGIN_BUILD_DIR "/plugins.json")) return KHUB_PLUGIN_BUILD_DIR;
    return KHUB_PLUGIN_INSTALL_DIR;
}

static bool sha_loaded(khub_runtime *rt, const char *sha)
{
    bool found = false;
    pthread_rwlock_rdlock(&rt->reg_lock);
    for (size_t i = 0; i < rt->plugins.count && !found; i++)
        found = khub__digest_eq(rt->plugins.items[i]->sha256, sha);
    pthread_rwlock_unlock(&rt->reg_lock);
    return found;
}

static khub_status load_entry(khub_runtime *rt, const char *dir, const char *mpath, const cJSON *e,
                              int idx)
{
    const cJSON *file = cJSON_GetObjectItemCaseSensitive(e, "file");
    const cJSON *sha = cJSON_GetObjectItemCaseSensitive(e, "sha256");
    KHUB_RETURN_IF(rt, !cJSON_IsString(file) || !cJSON_IsString(sha), KHUB_STATUS_PARSE,
                   "%s: plugins[%d] needs string fields \"file\" and \"sha256\"", mpath, idx);
    KHUB_RETURN_IF(rt, !plain_file_name(file->valuestring), KHUB_STATUS_UNSAFE_PATH,
                   "%s: plugins[%d].file \"%.100s\" is not a plain file name", mpath, idx,
                   file->valuestring);
    KHUB_RETURN_IF(rt, !khub__is_sha256_hex(sha->valuestring), KHUB_STATUS_PARSE,
                   "%s: plugins[%d].sha256 is not 64 hex digits", mpath, idx);
    if (sha_loaded(rt, sha->valuestring)) return KHUB_STATUS_OK;
    char path[PATH_MAX];
    int len = snprintf(path, sizeof path, "%s/%s", dir, file->valuestring);
    KHUB_RETURN_IF(rt, len < 0 || (size_t)len >= sizeof path, KHUB_STATUS_INVALID_ARG,
                   "%s/%s: path exceeds PATH_MAX", dir, file->valuestring);
    return khub_plugin_load(rt, path, sha->valuestring, NULL);
}

khub_status khub_plugin_load_builtin(khub_runtime *rt)
{
    KHUB_API_CHECK(NULL, rt != NULL);
    khub__clear(rt);
    char dirbuf[PATH_MAX];
    const char *dir = builtin_dir(dirbuf, sizeof dirbuf);
    char mpath[PATH_MAX], msg[KHUB_ERROR_SIZE];
    int len = snprintf(mpath, sizeof mpath, "%s/plugins.json", dir);
    KHUB_RETURN_IF(rt, len < 0 || (size_t)len >= sizeof mpath, KHUB_STATUS_INVALID_ARG,
                   "KHUB_PLUGIN_DIR is longer than PATH_MAX");
    unsigned char *text = NULL;
    size_t size = 0;
    khub_status st = read_file(rt, mpath, MAX_MANIFEST_BYTES, &text, &size, msg, sizeof msg);
    if (st != KHUB_STATUS_OK)
        return khub__fail(rt, st,
                          "built-in plugins: %s; set KHUB_PLUGIN_DIR to the directory "
                          "holding plugins.json",
                          msg);
    cJSON *root = cJSON_ParseWithLength((const char *)text, size);
    khub__free(rt, text, size + 1);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, "plugins");
    if (!cJSON_IsArray(list)) {
        cJSON_Delete(root);
        return khub__fail(rt, KHUB_STATUS_PARSE,
                          "%s: not JSON of the form {\"plugins\": [{\"file\", \"sha256\"}]}",
                          mpath);
    }
    int idx = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, list)
    {
        st = load_entry(rt, dir, mpath, e, idx++);
        if (st != KHUB_STATUS_OK) break;
    }
    cJSON_Delete(root);
    return st;
}

/* ======================================================================== */
/* Accessors                                                                */
/* ======================================================================== */

size_t khub_plugin_count(const khub_runtime *rt)
{
    if (!rt) return 0;
    khub_runtime *w = (khub_runtime *)rt; /* the lock is not part of rt's value */
    pthread_rwlock_rdlock(&w->reg_lock);
    size_t n = rt->plugins.count;
    pthread_rwlock_unlock(&w->reg_lock);
    return n;
}

const khub_plugin *khub_plugin_at(const khub_runtime *rt, size_t i)
{
    if (!rt) return NULL;
    khub_runtime *w = (khub_runtime *)rt;
    pthread_rwlock_rdlock(&w->reg_lock);
    const khub_plugin *p = i < rt->plugins.count ? rt->plugins.items[i] : NULL;
    pthread_rwlock_unlock(&w->reg_lock);
    return p;
}

const char *khub_plugin_id(const khub_plugin *p) { return p ? p->id : NULL; }
const char *khub_plugin_version(const khub_plugin *p) { return p ? p->version : NULL; }
const char *khub_plugin_path(const khub_plugin *p) { return p ? p->path : NULL; }
const char *khub_plugin_sha256(const khub_plugin *p) { return p ? p->sha256 : NULL; }
uint32_t khub_plugin_op_count(const khub_plugin *p) { return p ? p->n_ops : 0; }

void khub_plugin_abi(const khub_plugin *p, uint16_t *major, uint16_t *minor)
{
    if (major) *major = p ? p->abi_major : 0;
    if (minor) *minor = p ? p->abi_minor : 0;
}

const khub_op_desc *khub_plugin_op(const khub_plugin *p, uint32_t i)
{
    return p && i < p->n_ops ? &p->ops[i] : NULL;
}

khub_status khub_plugin_selftest(khub_plugin *p, char *errbuf, size_t errbuf_size)
{
    KHUB_API_CHECK(NULL, p != NULL);
    khub__clear(p->rt);
    khub__errbuf(errbuf, errbuf_size, "%s", "");
    if (!p->desc.selftest) return KHUB_STATUS_OK;
    char buf[KHUB_ERROR_SIZE] = "";
    khub__plugin_msg_clear();
    atomic_fetch_add(&p->inflight, 1);
    khub_status st = p->desc.selftest(p->desc.state, buf, sizeof buf);
    atomic_fetch_sub(&p->inflight, 1);
    buf[sizeof buf - 1] = '\0';
    if (st == KHUB_STATUS_OK) return st;
    const char *why = buf[0] ? buf : khub__plugin_msg()[0] ? khub__plugin_msg() : "(no message)";
    khub__fail(p->rt, st, "plugin %s %s: selftest failed with %s: %s", p->id, p->version,
               khub_status_name(st), why);
    khub__copy_error(p->rt, errbuf, errbuf_size);
    return st;
}
