/* fake_cuda.c: a stand-in libcuda.so.1 for tests on machines without a GPU,
 * found through LD_LIBRARY_PATH. It answers the few driver calls the hub's
 * variant selection makes, from KHUB_FAKE_CUDA="VERSION:CC,CC,..." (for
 * example "13000:90,75": driver 13.0, two GPUs of compute capability 9.0
 * and 7.5). Like a real driver it hands these out through
 * cuGetProcAddress_v2, the only way khub looks them up. Everything else a
 * real driver offers is absent, so the runtime still reports no usable
 * driver to plugins ("lacks cuDevicePrimaryCtxRetain"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_MAX_GPUS 8

static int version, n_gpus, ccs[FAKE_MAX_GPUS];

static void parse(void)
{
    static int done;
    if (done) return;
    done = 1;
    const char *s = getenv("KHUB_FAKE_CUDA");
    if (!s) return;
    char *end = NULL;
    version = (int)strtol(s, &end, 10);
    while (end && *end && n_gpus < FAKE_MAX_GPUS) {
        s = end + 1;
        int cc = (int)strtol(s, &end, 10);
        if (end == s) break;
        ccs[n_gpus++] = cc;
    }
}

__attribute__((visibility("default"))) int cuInit(unsigned flags)
{
    (void)flags;
    parse();
    return version > 0 ? 0 : 100; /* CUDA_ERROR_NO_DEVICE */
}

__attribute__((visibility("default"))) int cuDriverGetVersion(int *v)
{
    parse();
    *v = version;
    return version > 0 ? 0 : 100;
}

__attribute__((visibility("default"))) int cuDeviceGetCount(int *n)
{
    parse();
    *n = n_gpus;
    return 0;
}

__attribute__((visibility("default"))) int cuDeviceGet(int *dev, int ordinal)
{
    parse();
    if (ordinal < 0 || ordinal >= n_gpus) return 101; /* CUDA_ERROR_INVALID_DEVICE */
    *dev = ordinal;
    return 0;
}

/* 75, 76: CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR. */
__attribute__((visibility("default"))) int cuDeviceGetAttribute(int *v, int attr, int dev)
{
    parse();
    if (dev < 0 || dev >= n_gpus) return 101;
    if (attr == 75)
        *v = ccs[dev] / 10;
    else if (attr == 76)
        *v = ccs[dev] % 10;
    else
        return 1; /* CUDA_ERROR_INVALID_VALUE */
    return 0;
}

/* CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
 *                              cuuint64_t flags, CUdriverProcAddressQueryResult *status) */
__attribute__((visibility("default"))) int cuGetProcAddress_v2(const char *symbol, void **pfn,
                                                               int cuda_version,
                                                               unsigned long long flags,
                                                               int *status)
{
    static const struct {
        const char *name;
        void *fn;
    } table[] = {
        {"cuInit", (void *)cuInit},
        {"cuDriverGetVersion", (void *)cuDriverGetVersion},
        {"cuDeviceGetCount", (void *)cuDeviceGetCount},
        {"cuDeviceGet", (void *)cuDeviceGet},
        {"cuDeviceGetAttribute", (void *)cuDeviceGetAttribute},
    };
    (void)cuda_version, (void)flags;
    *pfn = NULL;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcmp(symbol, table[i].name) == 0) {
            *pfn = table[i].fn;
            if (status) *status = 0; /* CU_GET_PROC_ADDRESS_SUCCESS */
            return 0;
        }
    }
    if (status) *status = 1; /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
    return 500;              /* CUDA_ERROR_NOT_FOUND */
}
