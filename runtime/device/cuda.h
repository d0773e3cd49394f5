/*
 * cuda.h: the CUDA driver layer (runtime/device/cuda.c), opened with dlopen at run
 * time and never linked. Without a driver every function returns
 * KHUB_STATUS_NO_CUDA with "no CUDA driver (libcuda.so.1: <dlerror>)".
 *
 * The khub__cuda_host_* functions have exactly the signatures of the
 * khub_host_api cuda_* fields (host_ctx is a khub__host_ctx *) and are what
 * plugins get in their host table.
 */
#ifndef KHUB_RUNTIME_CUDA_H
#define KHUB_RUNTIME_CUDA_H

#include "internal.h"

/* Driver version (e.g. 12080) and device count; fails with NO_CUDA (message
 * on rt) when there is no driver or cuInit fails. Either pointer may be
 * NULL. Thread-safe. */
KHUB_INTERNAL khub_status khub__cuda_info(khub_runtime *rt, int *driver_version, int *n_devices);
/* What the hub's variant choice needs, through the same process-wide driver
 * handle and cuGetProcAddress: the driver version (0 without one) and the
 * compute capability (major*10+minor) of up to max GPUs in cc[0..*n_gpus).
 * Works with a driver that lacks entry points plugins need (then
 * khub__cuda_info still fails), and with a driver but no GPU (cuInit fails:
 * the version, no GPUs). NO_CUDA, with *driver_version 0, when there is no
 * driver. Thread-safe. */
KHUB_INTERNAL khub_status khub__cuda_probe(int *driver_version, int *cc, int max, int *n_gpus);
/* Compute capability of a device as major*10+minor. */
KHUB_INTERNAL khub_status khub__cuda_device_cc(khub_runtime *rt, int device, int *cc);

KHUB_INTERNAL khub_status khub__cuda_host_device_count(void *host_ctx, int *count);
KHUB_INTERNAL khub_status khub__cuda_host_device_cc(void *host_ctx, int device, int *cc);
KHUB_INTERNAL khub_status khub__cuda_host_mem_alloc(void *host_ctx, int device, size_t bytes,
                                                    uint64_t *dptr);
KHUB_INTERNAL khub_status khub__cuda_host_mem_free(void *host_ctx, uint64_t dptr);
KHUB_INTERNAL khub_status khub__cuda_host_memcpy_htod(void *host_ctx, uint64_t dst, const void *src,
                                                      size_t n, void *stream);
KHUB_INTERNAL khub_status khub__cuda_host_memcpy_dtoh(void *host_ctx, void *dst, uint64_t src,
                                                      size_t n, void *stream);
KHUB_INTERNAL khub_status khub__cuda_host_stream_sync(void *host_ctx, void *stream);
KHUB_INTERNAL khub_status khub__cuda_host_stream_create(void *host_ctx, int device, void **stream);
KHUB_INTERNAL khub_status khub__cuda_host_stream_destroy(void *host_ctx, void *stream);
KHUB_INTERNAL khub_status khub__cuda_host_module_load(void *host_ctx, int device, const void *image,
                                                      size_t size, khub_cuda_module **out);
KHUB_INTERNAL khub_status khub__cuda_host_module_function(void *host_ctx, khub_cuda_module *mod,
                                                          const char *name, void **function);
KHUB_INTERNAL khub_status khub__cuda_host_launch(void *host_ctx, void *function,
                                                 const khub_cuda_launch_cfg *cfg,
                                                 void **kernel_params);

/* For the executor (its own device memory and stream, not a plugin's),
 * failing with the message on rt: free and total bytes of device (makes its
 * primary context current on this thread); a stream on device, for ops,
 * and its release, which waits for the stream's work first and then tells
 * rt's plugins that it ended (their stream_end, ABI 1.5; not when the wait
 * failed) before it destroys the handle. Allocation and copies
 * are the khub__cuda_host_* functions with a NULL host_ctx (their message is
 * khub__plugin_msg()). */
KHUB_INTERNAL khub_status khub__cuda_mem_info(khub_runtime *rt, int device, size_t *free_bytes,
                                              size_t *total);
KHUB_INTERNAL khub_status khub__cuda_stream_new(khub_runtime *rt, int device, void **stream);
KHUB_INTERNAL khub_status khub__cuda_stream_free(khub_runtime *rt, int device, void *stream);
/* A device-to-device copy of n bytes on stream (the executor's; message as
 * the khub__cuda_host_* copies). */
KHUB_INTERNAL khub_status khub__cuda_memcpy_dtod(uint64_t dst, uint64_t src, size_t n,
                                                 void *stream);

/* For NCCL (nccl.c), failing with the message in khub__plugin_msg(): makes
 * device's primary context current on this thread; a stream on device, and
 * its release (drained first). */
KHUB_INTERNAL khub_status khub__cuda_use_device(int device);
KHUB_INTERNAL khub_status khub__cuda_stream_open(int device, void **stream);
KHUB_INTERNAL khub_status khub__cuda_stream_close(int device, void *stream);

/* CUDA graphs (cuda_graph.c; issue 19 item 3), for the executor's decode
 * step, failing with the message in khub__plugin_msg() like the copies:
 * whether this driver has them (UNSUPPORTED, saying why, when it lacks an
 * entry point or is older than 12.0, whose cuGraphExecUpdate form khub
 * calls); a capture of stream (relaxed mode: a plugin's first call may
 * load its module) begun and ended, the graph in *graph (CUgraph, owned by
 * the caller; NULL when the capture failed, e.g. invalidated by a
 * synchronisation or a legacy-stream call); an executable graph made from
 * it; an executable updated in place from a new capture of the same
 * topology, which fails with *reshaped set when the driver says the two
 * differ in more than kernel parameters (instantiate again then); a
 * launch on stream; and the releases (NULL accepted). */
KHUB_INTERNAL khub_status khub__cuda_graphs_check(void);
KHUB_INTERNAL khub_status khub__cuda_capture_begin(void *stream);
KHUB_INTERNAL khub_status khub__cuda_capture_end(void *stream, void **graph);
KHUB_INTERNAL khub_status khub__cuda_graph_instantiate(void *graph, void **exec);
KHUB_INTERNAL khub_status khub__cuda_graph_update(void *exec, void *graph, bool *reshaped);
KHUB_INTERNAL khub_status khub__cuda_graph_launch(void *exec, void *stream);
KHUB_INTERNAL void khub__cuda_graph_free(void *graph);
KHUB_INTERNAL void khub__cuda_graph_exec_free(void *exec);
/* cuda.c's own, for cuda_graph.c: the driver's version (0 without one), an
 * entry point by name through cuGetProcAddress (false when absent), a
 * result turned into a status and message ("what failed: NAME (n)"), and
 * the thread's current context made usable. */
KHUB_INTERNAL int khub__cuda_driver_version(void);
KHUB_INTERNAL bool khub__cuda_proc(const char *name, void **fn, int version);
KHUB_INTERNAL khub_status khub__cuda_check(int result, const char *what);
KHUB_INTERNAL khub_status khub__cuda_use_current(void);

/* Releases the runtime's hold on the driver (the library itself stays
 * mapped: unloading a GPU driver from a live process is unsafe). */
KHUB_INTERNAL void khub__cuda_close(khub_runtime *rt);

#endif /* KHUB_RUNTIME_CUDA_H */
