/*
 * kvcache_offload.c: the offloaded KV cache, op "offloaded_cache", behind
 * `--cache offloaded[,budget=SIZE][,dir=PATH]` (Transformers'
 * OffloadedCache, issue 13 item 4): K/V up to a memory budget stay in
 * memory, the rest lives in a second tier. On a CPU-only machine that tier
 * is a file: an unlinked temporary file under dir (default $TMPDIR, else
 * /var/tmp, which is disk where /tmp may be RAM), mapped shared. Its pages
 * are the kernel's page cache: written back to disk and dropped under
 * memory pressure without swap, read back on use.
 *
 * Slots. Each (layer, sequence) slot is token-major [cap][n_kv_heads *
 * head_dim] rows of K and of V in the config's dtype, growing by doubling
 * from 16 tokens as the dynamic cache does. A slot lives in memory while the
 * memory tier's bytes (every memory slot's capacity, K and V) stay within
 * the budget; the growth that would cross it moves the slot to the file
 * (copying its rows there, then freeing the memory), where it stays until
 * the sequence is truncated to 0. Layers fill in order, so with a budget
 * smaller than the whole cache the first layers of each sequence stay in
 * memory and the later ones go to the file. Each slot owns a fixed region
 * of the file, [K: max_tokens rows][V: max_tokens rows], at its index: the
 * file is sized once at create (sparse: nothing is allocated) and mapped
 * once, so file views never move. Disk blocks are allocated
 * (posix_fallocate) for the rows a slot grows to before anything is copied
 * or written, so a full disk is a status (KHUB_STATUS_IO naming dir and the
 * errno) with nothing changed, never a SIGBUS on a mapped page; truncating
 * a sequence to 0 punches its regions out of the file again.
 *
 * Bringing the file tier back: views point into the mapping (no copy), and
 * a view of layer l asks the kernel (madvise MADV_WILLNEED) to read the used
 * rows of layers l and l + 1 of that sequence, so the next layer's K/V are
 * on their way while layer l's attention runs. Rejected: copying each layer
 * into a memory buffer before use, which on a CPU moves the same bytes the
 * attention reads anyway, synchronously, without the kernel's readahead.
 *
 * Options: budget (bytes of K/V kept in memory; a size with an optional
 * K, M or G suffix, powers of 1024; default 64M; 0 is refused: a budget too
 * small for one slot, such as 1, offloads everything), dir (an existing
 * writable directory; no commas). memory reports both tiers' bytes.
 * Threading: none inside; calls on one cache are serialised by the caller.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* mkostemp, fallocate */
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvcache_strategy.h"

#define OPN            "offloaded_cache"
#define OF_MIN_CAP     16
#define OF_DEF_BUDGET  (64ull << 20)
#define OF_MAX_MAPPING (1ull << 46) /* 64 TiB of address space */

enum { TIER_NONE = 0, TIER_MEM = 1, TIER_FILE = 2 };

typedef struct of_slot {
    uint8_t *k, *v; /* [cap][H * D] rows; memory or the mapping, NULL while none */
    int64_t cap;    /* rows of storage (in the file: rows allocated on disk) */
    int64_t len;    /* positions written */
    int tier;       /* TIER_* */
} of_slot;

typedef struct of_cache {
    khub_kv_cache_config cfg;
    size_t esize;       /* 4 (f32) or 2 (f16) */
    size_t row;         /* bytes of one position of K (or V) */
    uint64_t budget;    /* bytes the memory tier may hold */
    uint64_t mem_used;  /* bytes the memory tier holds */
    uint64_t file_used; /* bytes allocated in the file */
    char dir[256];
    int fd;          /* the unlinked file, or -1 */
    uint8_t *map;    /* the whole file mapped, or NULL */
    size_t map_size; /* n_slots x 2 x max_tokens x row */
    of_slot *slots;  /* [n_layers * n_seqs], layer-major */
} of_cache;

static of_cache *of_of(khub_kv_cache *c) { return (of_cache *)(void *)c; }

static int64_t of_index(const of_cache *c, int32_t layer, int32_t seq)
{
    return (int64_t)layer * c->cfg.n_seqs + seq;
}

/* The slot's region in the file: K rows, then V rows. */
static size_t of_region(const of_cache *c, int64_t idx)
{
    return (size_t)idx * 2 * (size_t)c->cfg.max_tokens * c->row;
}

/* ------------------------------------------------------------------------ */
/* Options                                                                  */
/* ------------------------------------------------------------------------ */

/* Parses "N[K|M|G][B|iB]" (powers of 1024) into *out. */
static khub_status of_size(const khub_host_api *host, const char *s, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = s[0] >= '0' && s[0] <= '9' ? strtoull(s, &end, 10) : 0;
    int shift = 0;
    if (end && (*end == 'k' || *end == 'K'))
        shift = 10, end++;
    else if (end && (*end == 'm' || *end == 'M'))
        shift = 20, end++;
    else if (end && (*end == 'g' || *end == 'G'))
        shift = 30, end++;
    if (end && shift && *end == 'i') end++;
    if (end && (*end == 'b' || *end == 'B')) end++;
    if (!end || *end || errno == ERANGE || (shift && v > (UINT64_MAX >> shift)))
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          OPN ".create: option budget (got \"%s\", want a size in bytes such as "
                              "1048576, 512K, 64M or 2G)",
                          s);
    if (v == 0)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          OPN ".create: option budget (got 0, want at least 1 byte: a budget "
                              "smaller than one slot, such as 1, offloads everything; the dynamic "
                              "cache keeps everything in memory)");
    *out = (uint64_t)v << shift;
    return KHUB_STATUS_OK;
}

static khub_status of_options(const khub_host_api *host, const khub_kv_cache_config *cfg,
                              of_cache *c)
{
    char budget[32] = "";
    const char *tmp = getenv("TMPDIR");
    snprintf(c->dir, sizeof c->dir, "%s", tmp && tmp[0] ? tmp : "/var/tmp");
    khub_ref_kv_opt opts[] = {{"budget", NULL, budget, sizeof budget},
                              {"dir", NULL, c->dir, sizeof c->dir}};
    KHUB_PU_TRY(khub_ref__kv_opts_parse(host, OPN ".create", cfg, opts, 2));
    c->budget = OF_DEF_BUDGET;
    return budget[0] ? of_size(host, budget, &c->budget) : KHUB_STATUS_OK;
}

/* ------------------------------------------------------------------------ */
/* The file tier                                                            */
/* ------------------------------------------------------------------------ */

/* Creates the unlinked file under c->dir, sizes it (sparse) and maps it. */
static khub_status of_file_open(const khub_host_api *host, of_cache *c)
{
    void *hc = host->host_ctx;
    struct stat sb;
    if (stat(c->dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return host->fail(hc, KHUB_STATUS_INVALID_ARG,
                          OPN ".create: dir \"%s\": %s (want an existing writable directory)",
                          c->dir, stat(c->dir, &sb) != 0 ? strerror(errno) : "not a directory");
    size_t n_slots = (size_t)c->cfg.n_layers * (size_t)c->cfg.n_seqs, size;
    if (__builtin_mul_overflow(n_slots * 2, (size_t)c->cfg.max_tokens, &size) ||
        __builtin_mul_overflow(size, c->row, &size) || size > OF_MAX_MAPPING)
        return host->fail(
            hc, KHUB_STATUS_OVERFLOW,
            OPN ".create: %zu slots of %lld tokens need more than %llu bytes of "
                "address space for the file tier (lower max_context or the sequences)",
            n_slots, (long long)c->cfg.max_tokens, (unsigned long long)OF_MAX_MAPPING);
    char path[300];
    snprintf(path, sizeof path, "%s/khub-kv-XXXXXX", c->dir);
    c->fd = mkostemp(path, O_CLOEXEC);
    if (c->fd < 0)
        return host->fail(hc, KHUB_STATUS_IO,
                          OPN ".create: cannot create the file tier under \"%s\": %s (choose "
                              "another dir=)",
                          c->dir, strerror(errno));
    unlink(path); /* the file lives as long as the descriptor */
    if (ftruncate(c->fd, (off_t)size) != 0)
        return host->fail(hc, KHUB_STATUS_IO,
                          OPN ".create: sizing the file tier under \"%s\" to %zu bytes: %s "
                              "(choose another dir= or lower max_context)",
                          c->dir, size, strerror(errno));
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, 0);
    if (p == MAP_FAILED)
        return host->fail(hc, KHUB_STATUS_IO, OPN ".create: mapping %zu bytes of \"%s\": %s", size,
                          c->dir, strerror(errno));
    c->map = p;
    c->map_size = size;
    return KHUB_STATUS_OK;
}

/* Allocates disk blocks for rows [0, rows) of both halves of slot idx. */
static khub_status of_file_reserve(const khub_host_api *host, of_cache *c, int64_t idx,
                                   int64_t layer, int64_t seq, int64_t have, int64_t rows)
{
    size_t base = of_region(c, idx), half = (size_t)c->cfg.max_tokens * c->row;
    size_t from = (size_t)have * c->row, bytes = (size_t)(rows - have) * c->row;
    int e = posix_fallocate(c->fd, (off_t)(base + from), (off_t)bytes);
    if (e == 0) e = posix_fallocate(c->fd, (off_t)(base + half + from), (off_t)bytes);
    if (e != 0)
        return host->fail(host->host_ctx, KHUB_STATUS_IO,
                          OPN ".write: the file tier under \"%s\" is full: allocating %zu bytes "
                              "for layer %lld seq %lld failed (%s); nothing was written (free "
                              "space there, choose another dir= or raise budget)",
                          c->dir, 2 * bytes, (long long)layer, (long long)seq, strerror(e));
    c->file_used += 2 * (uint64_t)bytes;
    return KHUB_STATUS_OK;
}

/* Gives a file slot's disk blocks back (best effort: a file system without
 * hole punching keeps them until the cache is destroyed). */
static void of_file_drop(of_cache *c, int64_t idx, of_slot *s)
{
    size_t base = of_region(c, idx), bytes = (size_t)s->cap * c->row;
    size_t half = (size_t)c->cfg.max_tokens * c->row;
    (void)fallocate(c->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)base, (off_t)bytes);
    (void)fallocate(c->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)(base + half),
                    (off_t)bytes);
    c->file_used -= 2 * (uint64_t)bytes;
    s->k = s->v = NULL;
    s->cap = 0;
    s->tier = TIER_NONE;
}

/* Asks the kernel to read a file slot's used rows back ahead of use. */
static void of_prefetch(const of_cache *c, const of_slot *s)
{
    if (s->tier != TIER_FILE || s->len == 0) return;
    long pg = sysconf(_SC_PAGESIZE);
    size_t bytes = (size_t)s->len * c->row;
    for (int h = 0; h < 2; h++) {
        uintptr_t a = (uintptr_t)(h ? s->v : s->k), a0 = a & ~(uintptr_t)(pg - 1);
        (void)madvise((void *)a0, bytes + (a - a0), MADV_WILLNEED);
    }
}

/* ------------------------------------------------------------------------ */
/* create / destroy                                                         */
/* ------------------------------------------------------------------------ */

static void of_destroy(void *state, khub_kv_cache *kc)
{
    if (!kc) return;
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    of_cache *c = of_of(kc);
    int64_t n_slots = (int64_t)c->cfg.n_layers * c->cfg.n_seqs;
    for (int64_t i = 0; c->slots && i < n_slots; i++) {
        if (c->slots[i].tier != TIER_MEM) continue;
        host->free(host->host_ctx, c->slots[i].k);
        host->free(host->host_ctx, c->slots[i].v);
    }
    if (c->map) munmap(c->map, c->map_size);
    if (c->fd >= 0) close(c->fd);
    host->free(host->host_ctx, c->slots);
    host->free(host->host_ctx, c);
}

static khub_status of_create(void *state, const khub_kv_cache_config *cfg, khub_kv_cache **out)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    void *hc = host->host_ctx;
    if (!out) return host->fail(hc, KHUB_STATUS_INVALID_ARG, OPN ".create: out is NULL");
    *out = NULL;
    size_t esize = 0;
    KHUB_PU_TRY(khub_ref__kv_config_check(host, OPN ".create", cfg, &esize));
    size_t n_slots = (size_t)cfg->n_layers * (size_t)cfg->n_seqs;
    of_cache *c = host->alloc(hc, sizeof *c);
    if (!c) return host->fail(hc, KHUB_STATUS_NOMEM, OPN ".create: out of memory");
    memset(c, 0, sizeof *c);
    c->fd = -1;
    khub_pu_kv_config_copy(&c->cfg, cfg);
    c->esize = esize;
    c->row = (size_t)cfg->n_kv_heads * (size_t)cfg->head_dim * esize;
    khub_status st = of_options(host, cfg, c);
    if (st == KHUB_STATUS_OK) {
        c->slots = host->alloc(hc, n_slots * sizeof *c->slots);
        st = c->slots ? KHUB_STATUS_OK
                      : host->fail(hc, KHUB_STATUS_NOMEM,
                                   OPN ".create: out of memory for %zu "
                                       "slots",
                                   n_slots);
    }
    if (st == KHUB_STATUS_OK) {
        memset(c->slots, 0, n_slots * sizeof *c->slots);
        st = of_file_open(host, c);
    }
    if (st != KHUB_STATUS_OK) {
        of_destroy(state, (khub_kv_cache *)(void *)c);
        return st;
    }
    *out = (khub_kv_cache *)(void *)c;
    return KHUB_STATUS_OK;
}

/* ------------------------------------------------------------------------ */
/* write                                                                    */
/* ------------------------------------------------------------------------ */

/* Moves slot s (memory or none) to the file with nc rows. */
static khub_status of_to_file(const khub_host_api *host, of_cache *c, int32_t layer, int32_t seq,
                              of_slot *s, int64_t nc)
{
    int64_t idx = of_index(c, layer, seq);
    KHUB_PU_TRY(of_file_reserve(host, c, idx, layer, seq, 0, nc));
    uint8_t *k = c->map + of_region(c, idx), *v = k + (size_t)c->cfg.max_tokens * c->row;
    if (s->tier == TIER_MEM) {
        memcpy(k, s->k, (size_t)s->len * c->row);
        memcpy(v, s->v, (size_t)s->len * c->row);
        host->free(host->host_ctx, s->k);
        host->free(host->host_ctx, s->v);
        c->mem_used -= (uint64_t)s->cap * c->row * 2;
    }
    if (host->log)
        host->log(host->host_ctx, KHUB_LOG_INFO,
                  OPN ": layer %d seq %d goes to the file tier under %s (memory tier %llu of "
                      "%llu bytes)",
                  (int)layer, (int)seq, c->dir, (unsigned long long)c->mem_used,
                  (unsigned long long)c->budget);
    s->k = k, s->v = v, s->cap = nc, s->tier = TIER_FILE;
    return KHUB_STATUS_OK;
}

/* Grows slot s to hold need rows, in memory while the budget allows. On
 * failure nothing changed. */
static khub_status of_grow(const khub_host_api *host, of_cache *c, int32_t layer, int32_t seq,
                           of_slot *s, int64_t need)
{
    int64_t nc = s->cap ? s->cap : OF_MIN_CAP;
    while (nc < need) nc *= 2;
    if (nc > c->cfg.max_tokens) nc = c->cfg.max_tokens;
    if (s->tier == TIER_FILE) {
        KHUB_PU_TRY(of_file_reserve(host, c, of_index(c, layer, seq), layer, seq, s->cap, nc));
        s->cap = nc;
        return KHUB_STATUS_OK;
    }
    uint64_t old = (uint64_t)s->cap * c->row * 2, now = (uint64_t)nc * c->row * 2;
    if (c->mem_used - old + now > c->budget) return of_to_file(host, c, layer, seq, s, nc);
    uint8_t *k = host->alloc(host->host_ctx, (size_t)now / 2);
    uint8_t *v = host->alloc(host->host_ctx, (size_t)now / 2);
    if (!k || !v) {
        host->free(host->host_ctx, k);
        host->free(host->host_ctx, v);
        return host->fail(host->host_ctx, KHUB_STATUS_NOMEM,
                          OPN ".write: out of memory growing a slot to %lld tokens", (long long)nc);
    }
    if (s->len > 0) {
        memcpy(k, s->k, (size_t)s->len * c->row);
        memcpy(v, s->v, (size_t)s->len * c->row);
    }
    host->free(host->host_ctx, s->k);
    host->free(host->host_ctx, s->v);
    c->mem_used = c->mem_used - old + now;
    s->k = k, s->v = v, s->cap = nc, s->tier = TIER_MEM;
    return KHUB_STATUS_OK;
}

static khub_status of_write(void *state, khub_kv_cache *kc, const khub_kv_write_args *a)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    const char *op = OPN ".write";
    if (!kc) return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG, "%s: cache is NULL", op);
    KHUB_PU_TRY(khub_pu_args_check(host, op, a, sizeof(khub_kv_write_args)));
    of_cache *c = of_of(kc);
    KHUB_PU_TRY(khub_ref__kv_locate(host, op, &c->cfg, a->layer, a->seq));
    of_slot *s = &c->slots[of_index(c, a->layer, a->seq)];
    KHUB_PU_TRY(khub_ref__kv_write_check(host, op, &c->cfg, a, 0, s->len));
    int64_t n = a->k->shape[0], end = a->pos + n;
    if (n == 0) return KHUB_STATUS_OK;
    if (end > s->cap) KHUB_PU_TRY(of_grow(host, c, a->layer, a->seq, s, end));
    khub_ref__kv_store_rows(&c->cfg, c->esize, s->k, a->k, a->pos);
    khub_ref__kv_store_rows(&c->cfg, c->esize, s->v, a->v, a->pos);
    if (end > s->len) s->len = end;
    return KHUB_STATUS_OK;
}

/* ------------------------------------------------------------------------ */
/* view / truncate / memory                                                 */
/* ------------------------------------------------------------------------ */

static khub_status of_view(void *state, khub_kv_cache *kc, int32_t layer, int32_t seq, int64_t n,
                           khub_tensor *k, khub_tensor *v)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    const char *op = OPN ".view";
    if (!kc) return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG, "%s: cache is NULL", op);
    of_cache *c = of_of(kc);
    KHUB_PU_TRY(khub_ref__kv_locate(host, op, &c->cfg, layer, seq));
    const of_slot *s = &c->slots[of_index(c, layer, seq)];
    if (n < 0 || n > s->len)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "%s: n (got %lld, want 0..%lld, the length of layer %d seq %d)", op,
                          (long long)n, (long long)s->len, (int)layer, (int)seq);
    of_prefetch(c, s);
    if (layer + 1 < c->cfg.n_layers) of_prefetch(c, &c->slots[of_index(c, layer + 1, seq)]);
    int64_t H = c->cfg.n_kv_heads, D = c->cfg.head_dim;
    KHUB_PU_TRY(khub_ref__kv_view_fill(host, op, k, "k", s->k, c->cfg.dtype, n, H, D, H * D, D));
    return khub_ref__kv_view_fill(host, op, v, "v", s->v, c->cfg.dtype, n, H, D, H * D, D);
}

static khub_status of_truncate(void *state, khub_kv_cache *kc, int32_t seq, int64_t n)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    const char *op = OPN ".truncate";
    if (!kc) return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG, "%s: cache is NULL", op);
    of_cache *c = of_of(kc);
    KHUB_PU_TRY(khub_ref__kv_locate(host, op, &c->cfg, 0, seq));
    if (n < 0)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG, "%s: n (got %lld, want >= 0)",
                          op, (long long)n);
    for (int32_t l = 0; l < c->cfg.n_layers; l++) {
        int64_t idx = of_index(c, l, seq);
        of_slot *s = &c->slots[idx];
        if (s->len > n) s->len = n;
        if (n == 0 && s->tier == TIER_FILE) of_file_drop(c, idx, s);
    }
    return KHUB_STATUS_OK;
}

static khub_status of_memory(void *state, khub_kv_cache *kc, khub_kv_cache_memory *out)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    if (!kc)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG, OPN ".memory: cache is NULL");
    KHUB_PU_TRY(khub_pu_args_check(host, OPN ".memory", out, sizeof *out));
    of_cache *c = of_of(kc);
    int64_t used = 0;
    for (int32_t q = 0; q < c->cfg.n_seqs; q++) {
        int64_t longest = 0;
        for (int32_t l = 0; l < c->cfg.n_layers; l++) {
            const of_slot *s = &c->slots[of_index(c, l, q)];
            if (s->len > longest) longest = s->len;
        }
        used += longest;
    }
    out->bytes_total = c->mem_used + c->file_used;
    out->bytes_per_token = (uint64_t)c->row * 2 * (uint64_t)c->cfg.n_layers;
    out->tokens_capacity = c->cfg.max_tokens;
    out->tokens_used = used;
    return KHUB_STATUS_OK;
}

static const khub_kv_cache_methods of_methods = {
    KHUB_STRUCT_INIT(khub_kv_cache_methods),
    .create = of_create,
    .destroy = of_destroy,
    .write = of_write,
    .view = of_view,
    .truncate = of_truncate,
    .memory = of_memory,
};

/* Priority -1: served only when named (`--cache offloaded`). */
static const khub_op_caps of_caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CPU,
    .dtypes = KHUB_REF_BIT_F32 | KHUB_REF_BIT_F16,
    .flags = KHUB_CAP_STRIDED_KV | KHUB_CAP_KV_F16,
    .priority = -1,
};

const khub_op_desc khub_ref__offloaded_cache_op = {
    KHUB_STRUCT_INIT(khub_op_desc),
    .name = "offloaded_cache",
    .kind = KHUB_OP_KV_CACHE,
    .caps = &of_caps,
    .run = NULL,
    .methods = &of_methods,
};
