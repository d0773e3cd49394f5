/*
 * host_comm.c: the collectives a plugin calls through khub_host_api (ABI
 * 1.5: comm_info, comm_all_reduce_sum, comm_all_gather; issue 18 item 3).
 *
 * The communicator is the one the embedder gave the runtime's
 * tensor-parallel model (khub_model_opts.comm): the executor lends it to
 * the runtime at load (khub__runtime_lend_comm) and takes it back when the
 * model is freed. One runtime runs one rank's model; a second
 * tensor-parallel model on the same runtime keeps the first's communicator
 * for plugins (the ranks of a job share one communicator anyway).
 *
 * Without one the job is a job of one: rank 0 of 1, and the collectives
 * return the data unchanged, so a plugin that communicates runs the same
 * code in one process. Only compact host tensors are taken: a CUDA tensor
 * needs a communicator that reads device memory (NCCL), and the host has
 * none to offer it yet.
 */
#include <string.h>

#include "runtime_impl.h"

void khub__runtime_lend_comm(khub_runtime *rt, const khub_comm *comm, const void *owner)
{
    pthread_mutex_lock(&rt->err_lock);
    if (!rt->tp_owner) {
        rt->tp_comm = *comm;
        rt->tp_owner = owner;
    }
    pthread_mutex_unlock(&rt->err_lock);
}

void khub__runtime_return_comm(khub_runtime *rt, const void *owner)
{
    pthread_mutex_lock(&rt->err_lock);
    if (rt->tp_owner == owner) {
        memset(&rt->tp_comm, 0, sizeof rt->tp_comm);
        rt->tp_owner = NULL;
    }
    pthread_mutex_unlock(&rt->err_lock);
}

static const khub_comm *job(const khub__host_ctx *c)
{
    return c->rt->tp_owner ? &c->rt->tp_comm : NULL;
}

static const char *who(const khub__host_ctx *c)
{
    return c->plugin && c->plugin->id ? c->plugin->id : "host";
}

khub_status khub__host_comm_info(void *host_ctx, int32_t *rank, int32_t *size)
{
    const khub_comm *j = job(host_ctx);
    if (!rank || !size)
        return khub__plugin_fail(KHUB_STATUS_INVALID_ARG, "%s: comm_info: rank or size is NULL",
                                 who(host_ctx));
    *rank = j ? j->rank : 0;
    *size = j ? j->size : 1;
    return KHUB_STATUS_OK;
}

/* The bytes of a compact host tensor t, or 0 after recording why not. */
static size_t host_bytes(const khub__host_ctx *c, const char *fn, const char *name,
                         const khub_tensor *t, khub_status *st)
{
    *st = KHUB_STATUS_INVALID_ARG;
    if (!t || !t->data || t->ndim < 1 || t->ndim > 8 || !t->shape || t->dtype.lanes != 1 ||
        t->dtype.bits == 0 || t->dtype.bits % 8 || t->dtype.code == KHUB_DL_BLOCKQ) {
        khub__plugin_fail(*st, "%s: %s: %s is not a tensor of whole-byte elements", who(c), fn,
                          name);
        return 0;
    }
    if (t->device.device_type != KHUB_DEVICE_CPU) {
        *st = KHUB_STATUS_UNSUPPORTED;
        khub__plugin_fail(*st,
                          "%s: %s: %s is on device type %d; this job's collectives take host "
                          "(CPU) tensors only",
                          who(c), fn, name, (int)t->device.device_type);
        return 0;
    }
    size_t n = t->dtype.bits / 8;
    int64_t want = 1; /* the compact stride of the innermost dimension */
    for (int d = t->ndim - 1; d >= 0; d--) {
        size_t next = 0;
        if (t->shape[d] < 0 || !khub__mul_ok(n, (size_t)t->shape[d], &next) ||
            (t->strides && t->strides[d] != want && t->shape[d] > 1)) {
            khub__plugin_fail(*st, "%s: %s: %s is not compact row-major (dimension %d)", who(c), fn,
                              name, d);
            return 0;
        }
        want *= t->shape[d];
        n = next;
    }
    *st = KHUB_STATUS_OK;
    return n;
}

/* A failed collective of the job: the communicator's own words. */
static khub_status job_failed(const khub__host_ctx *c, const char *fn, khub_status st,
                              const char *err)
{
    const khub_comm *j = job(c);
    return khub__plugin_fail(st, "%s: %s: tp rank %d of %d: %s", who(c), fn, (int)j->rank,
                             (int)j->size, err[0] ? err : khub_status_str(st));
}

khub_status khub__host_comm_all_reduce_sum(void *host_ctx, khub_tensor *t)
{
    const khub__host_ctx *c = host_ctx;
    khub_status st;
    size_t bytes = host_bytes(c, "comm_all_reduce_sum", "t", t, &st);
    if (st != KHUB_STATUS_OK) return st;
    if (t->dtype.code != KHUB_DL_FLOAT || t->dtype.bits != 32)
        return khub__plugin_fail(KHUB_STATUS_INVALID_ARG,
                                 "%s: comm_all_reduce_sum: t has dtype code %d, %d bits; the sum "
                                 "takes f32",
                                 who(c), (int)t->dtype.code, (int)t->dtype.bits);
    const khub_comm *j = job(c);
    if (!j || bytes == 0) return KHUB_STATUS_OK;
    char err[256] = "";
    float *p = (float *)((char *)t->data + t->byte_offset);
    st = j->all_reduce_sum_f32(j->ud, p, (int64_t)(bytes / sizeof(float)), err, sizeof err);
    return st == KHUB_STATUS_OK ? st : job_failed(c, "comm_all_reduce_sum", st, err);
}

khub_status khub__host_comm_all_gather(void *host_ctx, const khub_tensor *send, khub_tensor *recv)
{
    const khub__host_ctx *c = host_ctx;
    khub_status st;
    size_t sb = host_bytes(c, "comm_all_gather", "send", send, &st);
    if (st != KHUB_STATUS_OK) return st;
    size_t rb = host_bytes(c, "comm_all_gather", "recv", recv, &st);
    if (st != KHUB_STATUS_OK) return st;
    const khub_comm *j = job(c);
    int32_t size = j ? j->size : 1;
    if (memcmp(&send->dtype, &recv->dtype, sizeof send->dtype) != 0 || rb / (size_t)size != sb ||
        rb % (size_t)size)
        return khub__plugin_fail(KHUB_STATUS_INVALID_ARG,
                                 "%s: comm_all_gather: recv holds %zu bytes and send %zu; recv "
                                 "wants send's dtype and %d times its bytes",
                                 who(c), rb, sb, (int)size);
    const char *s = (const char *)send->data + send->byte_offset;
    char *r = (char *)recv->data + recv->byte_offset;
    if (!j) {
        memmove(r, s, sb);
        return KHUB_STATUS_OK;
    }
    char err[256] = "";
    st = j->all_gather(j->ud, s, sb, r, err, sizeof err);
    return st == KHUB_STATUS_OK ? st : job_failed(c, "comm_all_gather", st, err);
}
