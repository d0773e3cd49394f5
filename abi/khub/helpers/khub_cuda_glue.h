/*
 * khub_cuda_glue.h: header-only helpers for the host glue of a CUDA kernel
 * (a plugin whose ops launch PTX through the host table), so that a glue
 * keeps its modules, functions and scratch per CUDA device and launches on
 * each device the code loaded there (a CUfunction belongs to the context
 * its module was loaded in; launching it in another device's context, or
 * on another device's memory, is an error of the driver):
 *   - khub_cg_device: the device a call runs on (its tensors' or ctx's
 *     device id), bounded by KHUB_CG_MAX_DEVICES, the size of a glue's
 *     per-device tables, with a message past it;
 *   - khub_cg_load_ptx: the newest "<stem>.sm_<cc>.ptx" artifact at or
 *     below a compute capability, loaded on one device.
 *
 * Usage inside an op (state->fn[KHUB_CG_MAX_DEVICES], NULL until loaded):
 *
 *     int dev = 0, cc = 0;
 *     khub_cuda_module *mod = NULL;
 *     KHUB_CG_TRY(khub_cg_device(host, "rms_norm (cuda)", a->x->device, &dev));
 *     if (!s->fn[dev]) {
 *         KHUB_CG_TRY(host->cuda_device_cc(host->host_ctx, dev, &cc));
 *         KHUB_CG_TRY(khub_cg_load_ptx(host, dev, cc, "rmsnorm", ccs, 3, "rmsnorm", &mod));
 *         KHUB_CG_TRY(host->cuda_module_function(host->host_ctx, mod, "khub_rms_norm_f32",
 *                                                &s->fn[dev]));
 *     }
 *
 * It sits in abi/khub/helpers/ rather than plugins/include/ (where
 * khub_plugin_util.h lives) because a kernels-src package is built on its
 * own (`khub build DIR`, with khub's include folder and DIR only): both the
 * source tree's abi/ and an installed khub's include/ hold it as
 * <khub/helpers/khub_cuda_glue.h>. Like khub_plugin_util.h it is static
 * inline, needs only khub_plugin.h, and is not part of the ABI: it may
 * change between khub releases (a built plugin has it compiled in).
 */
#ifndef KHUB_CUDA_GLUE_H
#define KHUB_CUDA_GLUE_H

#include <stddef.h>
#include <stdio.h>

#include <khub/khub_plugin.h>

/* Devices a glue keeps state for: cuda:0 .. cuda:15. */
#define KHUB_CG_MAX_DEVICES 16

#define KHUB_CG_TRY(x) \
    do { \
        khub_status st_ = (x); \
        if (st_ != KHUB_STATUS_OK) return st_; \
    } while (0)

/* *dev = d's CUDA ordinal, the index of the glue's per-device tables.
 * INVALID_ARG when d is not a CUDA device, UNSUPPORTED past the tables,
 * each with a message starting with who. */
static inline khub_status khub_cg_device(const khub_host_api *host, const char *who, khub_device d,
                                         int *dev)
{
    *dev = 0;
    if (d.device_type != KHUB_DEVICE_CUDA)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG, "%s: device type %d is not CUDA",
                          who, (int)d.device_type);
    if (d.device_id < 0 || d.device_id >= KHUB_CG_MAX_DEVICES)
        return host->fail(host->host_ctx, KHUB_STATUS_UNSUPPORTED,
                          "%s: cuda:%d: this kernel keeps its modules for cuda:0..cuda:%d only",
                          who, (int)d.device_id, KHUB_CG_MAX_DEVICES - 1);
    *dev = (int)d.device_id;
    return KHUB_STATUS_OK;
}

/* Loads the newest "<stem>.sm_<c>.ptx" artifact of the plugin's variant
 * with c <= cc (ccs: n_ccs capabilities, highest first, kernel.json's) on
 * device; the host owns *mod. UNSUPPORTED "<who>: no PTX for compute
 * capability X.Y" when none fits; the host's status when loading fails. */
static inline khub_status khub_cg_load_ptx(const khub_host_api *host, int device, int cc,
                                           const char *stem, const int *ccs, size_t n_ccs,
                                           const char *who, khub_cuda_module **mod)
{
    *mod = NULL;
    for (size_t i = 0; i < n_ccs; i++) {
        char name[96];
        const void *img = NULL;
        size_t n = 0;
        snprintf(name, sizeof name, "%s.sm_%d.ptx", stem, ccs[i]);
        if (ccs[i] > cc || host->artifact(host->host_ctx, name, &img, &n) != KHUB_STATUS_OK)
            continue;
        return host->cuda_module_load(host->host_ctx, device, img, n, mod);
    }
    return host->fail(host->host_ctx, KHUB_STATUS_UNSUPPORTED,
                      "%s: no PTX for compute capability %d.%d", who, cc / 10, cc % 10);
}

#endif /* KHUB_CUDA_GLUE_H */
