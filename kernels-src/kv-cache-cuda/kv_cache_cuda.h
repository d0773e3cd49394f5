/*
 * kv_cache_cuda.h: what the host glue files of kernels-community/kv-cache-cuda
 * share. Package-internal: not installed, not ABI (the package builds as one
 * plugin from kernel.json's cuda_host sources).
 */
#ifndef KHUB_KV_CACHE_CUDA_H
#define KHUB_KV_CACHE_CUDA_H

#include <khub/helpers/khub_cuda_glue.h>
#include <khub/khub_plugin.h>

/* kv_cache_cuda.c: the package's module `stem` ("kv_append", "paged_attn")
 * on CUDA device `device` (0 <= device < KHUB_CG_MAX_DEVICES): the newest
 * "<stem>.sm_<cc>.ptx" artifact at or below that device's compute
 * capability (kernel.json's capabilities), loaded once per device and
 * plugin load; later calls give the same module (the host owns it).
 * KHUB_STATUS_UNSUPPORTED "<who>: no PTX for compute capability X.Y" when no
 * artifact fits. Thread-safe. */
khub_status khub_kvc__module(const khub_host_api *host, int device, const char *stem,
                             const char *who, khub_cuda_module **mod);

/* The device of a cache's config: its ctx's (ABI 1.5), else cuda:0 (a host
 * of 1.4 sends none, and placed its models on cuda:0 only). */
khub_status khub_kvc__config_device(const khub_host_api *host, const char *who,
                                    const khub_kv_cache_config *cfg, int *device);

/* paged_cuda.c: the paged cache (op "paged_cache", layout PAGED_HTD). */
extern const khub_op_desc khub_kvc__paged_cache_op;
void khub_kvc__paged_init(const khub_host_api *host);
void khub_kvc__paged_shutdown(void);

/* paged_attention_cuda.c: the attention that reads it (op "paged_attention"). */
extern const khub_op_desc khub_kvc__paged_attention_op;
void khub_kvc__attention_init(const khub_host_api *host);
void khub_kvc__attention_shutdown(void);
/* The host ended `stream` (khub_plugin_desc.stream_end, ABI 1.5; drained):
 * its split-K scratch is freed and its slot free for another stream. */
void khub_kvc__attention_stream_end(void *stream);

#endif /* KHUB_KV_CACHE_CUDA_H */
