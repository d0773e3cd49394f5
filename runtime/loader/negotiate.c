/*
 * negotiate.c: a plugin's entry called and what it returned checked and
 * copied: the descriptor, its ops, their caps and head dims, the kinds its
 * ABI note declared (loader_impl.h).
 *
 * Everything the host keeps from a plugin's descriptor is copied (strings,
 * op descriptors, caps, head dims), because plugin memory dies at dlclose.
 * A plugin's op array is walked with the plugin's own struct_size as the
 * stride, so a plugin built against a newer minor (larger structs) is read
 * correctly.
 */
#include <stdio.h>
#include <string.h>

#include "loader_impl.h"

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
static void copy_caps(khub_op_caps *dst, const khub_op_caps *src, uint32_t kind, unsigned minor)
{
    size_t n = khub__op_caps_size(minor);
    if (src->struct_size < n) n = src->struct_size;
    memcpy(dst, src, n < sizeof *dst ? n : sizeof *dst);
    dst->kind_flags = (dst->kind_flags | dst->flags) & khub__kind_flags_known(kind, minor);
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
    if (src->kind > khub__op_kind_max(minor)) {
        khub__log(p->rt, KHUB_LOG_INFO,
                  "%s: op %s skipped: kind %u (%s) is from a later ABI than the plugin's 1.%u "
                  "(1.%u knows kinds 1-%u); its other ops load",
                  who, name, (unsigned)src->kind, khub__op_kind_name(src->kind), minor, minor,
                  (unsigned)khub__op_kind_max(minor));
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
    copy_caps(caps, src->caps, src->kind, minor);
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
khub_status khub__plugin_negotiate(khub_plugin *p, khub_plugin_init_fn init,
                                   const khub_plugin_info *note, char *msg, size_t n)
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
    /* stream_end is 1.5's: from an older minor it is bytes that plugin
     * never set (abi_minor.c). */
    if (d.abi_minor < 5 || d.struct_size < khub__plugin_desc_size(5)) d.stream_end = NULL;
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
