/*
 * selftest_cuda.c: the numeric self-test of a CUDA op (issue 11: "run the
 * CUDA numerics in khub check when a device is present"). The bench builds
 * its tensors in host memory as for a CPU op (selftest.c, selftest_attn.c,
 * the same cases: strided and offset K/V views included); for a CUDA op
 * each tensor of the call is copied to device memory with its strides and
 * byte offset as they are, the op runs on the device pointers (rotary's
 * positions and embedding's ids too), the outputs come back into the host
 * tensors, and the comparison with khub/ref-cpu is the one a CPU op gets.
 *
 * Whether a device is present is asked in a short child process: khub
 * check runs each plugin's self-test in a forked child, and a process that
 * initialised CUDA before fork() cannot use it in the child.
 */
#include <stddef.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda.h"
#include "selftest_impl.h"

bool khub__selftest_cuda_present(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        int n = 0;
        _exit(khub__cuda_info(NULL, NULL, &n) == KHUB_STATUS_OK && n > 0 ? 0 : 1);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return false;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* The tensor fields of each kind's args: offset, and whether the op writes
 * it (copied back). */
typedef struct field {
    size_t off;
    int out;
} field;

static int fields_of(uint32_t kind, field *f)
{
    int n = 0;
#define F(type, name, o) (f[n++] = (field){offsetof(type, name), o})
    switch (kind) {
    case KHUB_OP_NORM:
        F(khub_norm_args, x, 0), F(khub_norm_args, residual, 1);
        F(khub_norm_args, weight, 0), F(khub_norm_args, y, 1);
        break;
    case KHUB_OP_ACTIVATION:
        F(khub_activation_args, gate, 0), F(khub_activation_args, up, 0);
        F(khub_activation_args, y, 1);
        break;
    case KHUB_OP_ROTARY: F(khub_rotary_args, x, 1); break;
    case KHUB_OP_LINEAR:
    case KHUB_OP_QLINEAR:
        F(khub_linear_args, x, 0), F(khub_linear_args, weight, 0);
        F(khub_linear_args, bias, 0), F(khub_linear_args, y, 1);
        break;
    case KHUB_OP_ATTENTION:
        F(khub_attention_args, q, 0), F(khub_attention_args, k, 0);
        F(khub_attention_args, v, 0), F(khub_attention_args, mask, 0);
        F(khub_attention_args, out, 1);
        break;
    case KHUB_OP_EMBEDDING: F(khub_embedding_args, table, 0), F(khub_embedding_args, y, 1); break;
    default: break;
    }
#undef F
    return n;
}

/* Bytes from t->data to one past its last element (byte_offset included). */
static size_t extent(const khub_tensor *t)
{
    if (t->dtype.code == KHUB_DL_BLOCKQ)
        return (size_t)t->byte_offset +
               (size_t)t->shape[0] * (size_t)khub_qformat_row_bytes((khub_qformat)t->dtype.bits,
                                                                    t->shape[t->ndim - 1]);
    size_t elem = (size_t)(t->dtype.bits / 8), last = 0, count = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 0) return (size_t)t->byte_offset;
        if (t->strides)
            last += (size_t)(t->shape[i] - 1) * (size_t)t->strides[i];
        else
            count *= (size_t)t->shape[i];
    }
    return (size_t)t->byte_offset + (t->strides ? last + 1 : count) * elem;
}

typedef struct on_dev {
    khub_tensor t; /* the device copy the op sees */
    khub_tensor *host;
    uint64_t d;
    size_t bytes;
    int out;
} on_dev;

static khub_status put(on_dev *o, khub_tensor *host, int out)
{
    o->host = host, o->out = out, o->bytes = extent(host), o->t = *host, o->d = 0;
    khub__plugin_msg_clear();
    khub_status st = khub__cuda_host_mem_alloc(NULL, 0, o->bytes ? o->bytes : 1, &o->d);
    if (st == KHUB_STATUS_OK && o->bytes)
        st = khub__cuda_host_memcpy_htod(NULL, o->d, host->data, o->bytes, NULL);
    o->t.data = (void *)(uintptr_t)o->d;
    o->t.device = (khub_device){KHUB_DEVICE_CUDA, 0};
    return st;
}

khub_status khub__st_call_cuda(bench *b, khub_binding *binding, uint32_t kind, const void *args)
{
    field f[8];
    int n = fields_of(kind, f);
    KHUB_RETURN_IF(b->rt, !n, KHUB_STATUS_UNSUPPORTED,
                   "self-test: a CUDA op of kind %s has no numeric self-test on the device",
                   khub__op_kind_name(kind));
    unsigned char a[512];
    uint32_t size = 0; /* KHUB_STRUCT_HEADER: struct_size first */
    memcpy(&size, args, sizeof size);
    KHUB_RETURN_IF(b->rt, size > sizeof a, KHUB_STATUS_INTERNAL, "self-test: args of %u bytes",
                   size);
    memcpy(a, args, size);
    on_dev d[9];
    int nd = 0;
    khub_status st = KHUB_STATUS_OK;
    for (int i = 0; i < n && st == KHUB_STATUS_OK; i++) {
        khub_tensor **slot = (khub_tensor **)(a + f[i].off);
        if (!*slot) continue;
        st = put(&d[nd], *slot, f[i].out);
        *slot = &d[nd++].t;
    }
    khub_tensor pos = {0};
    int64_t pos_shape[1] = {0};
    if (st == KHUB_STATUS_OK && kind == KHUB_OP_ROTARY) { /* positions: [n] int32 */
        khub_rotary_args *r = (khub_rotary_args *)a;
        pos_shape[0] = r->x->shape[0];
        pos = (khub_tensor){
            .data = (void *)r->positions, .ndim = 1, .dtype = KHUB_DTYPE_I32, .shape = pos_shape};
        st = put(&d[nd], &pos, 0);
        r->positions = (const int32_t *)d[nd++].t.data;
    }
    if (st == KHUB_STATUS_OK && kind == KHUB_OP_EMBEDDING) { /* ids: [n] int32 */
        khub_embedding_args *e = (khub_embedding_args *)a;
        pos_shape[0] = e->n;
        pos = (khub_tensor){
            .data = (void *)e->ids, .ndim = 1, .dtype = KHUB_DTYPE_I32, .shape = pos_shape};
        st = put(&d[nd], &pos, 0);
        e->ids = (const int32_t *)d[nd++].t.data;
    }
    if (st == KHUB_STATUS_OK) st = khub_binding_call(binding, a);
    if (st == KHUB_STATUS_OK) st = khub__cuda_host_stream_sync(NULL, NULL);
    for (int i = 0; i < nd && st == KHUB_STATUS_OK; i++)
        if (d[i].out && d[i].bytes)
            st = khub__cuda_host_memcpy_dtoh(NULL, d[i].host->data, d[i].d, d[i].bytes, NULL);
    if (st == KHUB_STATUS_OK) st = khub__cuda_host_stream_sync(NULL, NULL);
    for (int i = 0; i < nd; i++) khub__cuda_host_mem_free(NULL, d[i].d);
    if (st != KHUB_STATUS_OK && !khub_runtime_errmsg(b->rt)[0])
        khub__fail(b->rt, st, "self-test on the device: %s", khub__plugin_msg());
    return st;
}
