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
 * code in one process. Tensors are compact, on the host or on a CUDA
 * device. Host tensors go over the job's communicator; CUDA tensors over
 * NCCL (runtime/device/nccl.c), whose communicator is made at the first
 * CUDA tensor's collective (collective itself: every rank makes the same
 * call there) on that tensor's device, its unique id broadcast over the
 * job's communicator, and ended when the model takes its communicator
 * back. One NCCL communicator per runtime, on one device: a rank's model
 * runs on one GPU.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda.h"
#include "nccl.h"
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
    khub__nccl *nc = NULL;
    if (rt->tp_owner == owner) {
        memset(&rt->tp_comm, 0, sizeof rt->tp_comm);
        rt->tp_owner = NULL;
        nc = rt->nccl;
        rt->nccl = NULL;
    }
    pthread_mutex_unlock(&rt->err_lock);
    khub__nccl_comm_free(nc);
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

/* The bytes of a compact host or CUDA tensor t, or 0 after recording why
 * not. */
static size_t tensor_bytes(const khub__host_ctx *c, const char *fn, const char *name,
                           const khub_tensor *t, khub_status *st)
{
    *st = KHUB_STATUS_INVALID_ARG;
    if (!t || !t->data || t->ndim < 1 || t->ndim > 8 || !t->shape || t->dtype.lanes != 1 ||
        t->dtype.bits == 0 || t->dtype.bits % 8 || t->dtype.code == KHUB_DL_BLOCKQ) {
        khub__plugin_fail(*st, "%s: %s: %s is not a tensor of whole-byte elements", who(c), fn,
                          name);
        return 0;
    }
    if (t->device.device_type != KHUB_DEVICE_CPU && t->device.device_type != KHUB_DEVICE_CUDA) {
        *st = KHUB_STATUS_UNSUPPORTED;
        khub__plugin_fail(*st,
                          "%s: %s: %s is on device type %d; the collectives take host (CPU) "
                          "and CUDA tensors",
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

static bool on_cuda(const khub_tensor *t) { return t->device.device_type == KHUB_DEVICE_CUDA; }

/* The communicator for CUDA tensors on device: the runtime's NCCL one, made
 * now when this is the first (a collective step of its own, every rank
 * being at the same call). NULL after recording why not. */
static const khub_comm *device_job(const khub__host_ctx *c, const char *fn, int device,
                                   khub_status *st)
{
    khub_runtime *rt = c->rt;
    const khub_comm *j = job(c);
    char err[320] = "";
    *st = KHUB_STATUS_OK;
    if (!rt->nccl) {
        khub__nccl *nc = NULL;
        *st = khub__nccl_comm_new(rt, j, device, &nc, err, sizeof err);
        if (*st != KHUB_STATUS_OK) {
            job_failed(c, fn, *st, err);
            return NULL;
        }
        pthread_mutex_lock(&rt->err_lock);
        rt->nccl = nc;
        pthread_mutex_unlock(&rt->err_lock);
    }
    if (khub__nccl_device(rt->nccl) != device) {
        *st = khub__plugin_fail(KHUB_STATUS_INVALID_ARG,
                                "%s: %s: the tensor is on CUDA device %d, and this rank's NCCL "
                                "communicator on device %d (one GPU per rank)",
                                who(c), fn, device, khub__nccl_device(rt->nccl));
        return NULL;
    }
    return khub__nccl_comm(rt->nccl);
}

/* A job of one copies send to recv on the device through the host. */
static khub_status device_copy(const khub__host_ctx *c, uint64_t dst, uint64_t src, size_t n)
{
    void *tmp = khub__malloc(c->rt, n);
    if (!tmp)
        return khub__plugin_fail(KHUB_STATUS_NOMEM, "%s: comm_all_gather: out of memory", who(c));
    khub_status st = khub__cuda_host_memcpy_dtoh(NULL, tmp, src, n, NULL);
    if (st == KHUB_STATUS_OK) st = khub__cuda_host_memcpy_htod(NULL, dst, tmp, n, NULL);
    if (st == KHUB_STATUS_OK) st = khub__cuda_host_stream_sync(NULL, NULL);
    khub__free(c->rt, tmp, n);
    return st;
}

khub_status khub__host_comm_all_reduce_sum(void *host_ctx, khub_tensor *t)
{
    const khub__host_ctx *c = host_ctx;
    khub_status st;
    size_t bytes = tensor_bytes(c, "comm_all_reduce_sum", "t", t, &st);
    if (st != KHUB_STATUS_OK) return st;
    if (t->dtype.code != KHUB_DL_FLOAT || t->dtype.bits != 32)
        return khub__plugin_fail(KHUB_STATUS_INVALID_ARG,
                                 "%s: comm_all_reduce_sum: t has dtype code %d, %d bits; the sum "
                                 "takes f32",
                                 who(c), (int)t->dtype.code, (int)t->dtype.bits);
    const khub_comm *j = job(c);
    if (!j || bytes == 0) return KHUB_STATUS_OK;
    if (on_cuda(t) && !(j = device_job(c, "comm_all_reduce_sum", t->device.device_id, &st)))
        return st;
    char err[256] = "";
    float *p = (float *)((char *)t->data + t->byte_offset);
    st = j->all_reduce_sum_f32(j->ud, p, (int64_t)(bytes / sizeof(float)), err, sizeof err);
    return st == KHUB_STATUS_OK ? st : job_failed(c, "comm_all_reduce_sum", st, err);
}

khub_status khub__host_comm_all_gather(void *host_ctx, const khub_tensor *send, khub_tensor *recv)
{
    const khub__host_ctx *c = host_ctx;
    khub_status st;
    size_t sb = tensor_bytes(c, "comm_all_gather", "send", send, &st);
    if (st != KHUB_STATUS_OK) return st;
    size_t rb = tensor_bytes(c, "comm_all_gather", "recv", recv, &st);
    if (st != KHUB_STATUS_OK) return st;
    const khub_comm *j = job(c);
    int32_t size = j ? j->size : 1;
    if (memcmp(&send->dtype, &recv->dtype, sizeof send->dtype) != 0 || rb / (size_t)size != sb ||
        rb % (size_t)size)
        return khub__plugin_fail(KHUB_STATUS_INVALID_ARG,
                                 "%s: comm_all_gather: recv holds %zu bytes and send %zu; recv "
                                 "wants send's dtype and %d times its bytes",
                                 who(c), rb, sb, (int)size);
    if (memcmp(&send->device, &recv->device, sizeof send->device) != 0)
        return khub__plugin_fail(KHUB_STATUS_INVALID_ARG,
                                 "%s: comm_all_gather: send is on device type %d id %d and recv "
                                 "on type %d id %d; both must be on the same device",
                                 who(c), (int)send->device.device_type, (int)send->device.device_id,
                                 (int)recv->device.device_type, (int)recv->device.device_id);
    const char *s = (const char *)send->data + send->byte_offset;
    char *r = (char *)recv->data + recv->byte_offset;
    if (!j && on_cuda(send))
        return device_copy(c, (uint64_t)(uintptr_t)r, (uint64_t)(uintptr_t)s, sb);
    if (!j) {
        memmove(r, s, sb);
        return KHUB_STATUS_OK;
    }
    if (on_cuda(send) && !(j = device_job(c, "comm_all_gather", send->device.device_id, &st)))
        return st;
    char err[256] = "";
    st = j->all_gather(j->ud, s, sb, r, err, sizeof err);
    return st == KHUB_STATUS_OK ? st : job_failed(c, "comm_all_gather", st, err);
}
