/*
 * tp_args.h: argument structs of the test plugins' ops, shared by the
 * plugins in tests/plugins and the tests that call them.
 */
#ifndef KHUB_TESTS_TP_ARGS_H
#define KHUB_TESTS_TP_ARGS_H

#include <stdint.h>

/* "stamp": writes the plugin's version number (1, 2, ...) into every slot,
 * one at a time, so a torn call would show mixed values. */
typedef struct tp_stamp_args {
    int32_t out[8];
} tp_stamp_args;

/* "host": exercises the host table from inside an op. */
typedef struct tp_host_args {
    int64_t n;             /* items for parallel_for */
    unsigned char *marks;  /* [n], each set to 1 by parallel_for */
    int32_t n_threads;     /* host->n_threads() */
    uint32_t cpu_features; /* host->cpu_features() */
    int32_t aligned;       /* 1 when host->alloc returned a 64-byte aligned block */
    int32_t artifact_st;   /* status of host->artifact("kernel.ptx") */
    int32_t cuda_st;       /* status of host->cuda_device_count() */
    int32_t cuda_count;
} tp_host_args;

/* "probe" of target.c: what a plugin built for a target minor saw. */
typedef struct tp_target_args {
    uint32_t host_size;     /* host->struct_size at init */
    uint32_t host_minor;    /* host->abi_minor at init */
    uint32_t desc_size;     /* out->struct_size at init */
    uint32_t own_host_size; /* sizeof(khub_host_api) as the plugin's header declared it */
    uint32_t target_minor;  /* KHUB_PLUGIN_TARGET_MINOR */
    uint32_t qformat_count; /* KHUB_QFORMAT__COUNT as the plugin's header declared it */
} tp_target_args;

#endif /* KHUB_TESTS_TP_ARGS_H */
