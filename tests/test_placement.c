/*
 * test_placement.c: the host side of a model loaded for a CUDA device
 * (runtime/executor/placement.c, issue 19 items 1, 4 and 5) and of the
 * driver layer under it (runtime/device/cuda.c), without a GPU: each case
 * dlopens the fake driver (tests/fake_cuda) by path before khub opens
 * "libcuda.so.1", so the name resolves to it, and reads what the driver
 * saw through khub_fake_cuda_stat. The fake runs no kernel: nothing here
 * checks numbers computed on a device (tools/gpu-check.sh does, on a GPU).
 *
 * The model is a tiny random Llama (tests/device_fixture.h: F32
 * safetensors, tied embeddings), so its sizes are known exactly. CUDA
 * graphs of the decode step: tests/test_cuda_graphs.c.
 */
#include "cuda.h"
#include "device_fixture.h"

/* ======================================================================== */
/* The driver and the device                                                */
/* ======================================================================== */

TEST_IMPL(placement_without_driver)
{
    if (khub__cuda_info(NULL, NULL, NULL) == KHUB_STATUS_OK)
        TEST_SKIP("a CUDA driver is present; this case checks its absence");
    fixture f;
    ASSERT_STATUS(load(&f, cuda0, NULL, false), KHUB_STATUS_NO_CUDA);
    ASSERT(f.m == NULL);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt),
                    ": device cuda:0 needs the CUDA driver: no CUDA driver (libcuda.so.1: ");
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt), "; use the CPU");
    unload(&f);
}

TEST_IMPL(placement_driver_without_gpu)
{
    fake("12080:", "1000000", NULL);
    fixture f;
    ASSERT_STATUS(load(&f, cuda0, NULL, false), KHUB_STATUS_NO_CUDA);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt),
                    ": device cuda:0: CUDA driver 12.8 is present but sees no GPU; use the CPU");
    unload(&f);
}

TEST_IMPL(placement_no_such_ordinal)
{
    fake("12080:90,80", "100000000", NULL);
    fixture f;
    ASSERT_STATUS(load(&f, (khub_device){KHUB_DEVICE_CUDA, 2}, NULL, false),
                  KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt),
                    ": device cuda:2: 2 CUDA device(s) present (cuda:0..cuda:1)");
    ASSERT_EQ(stat_of("allocs_live"), 0);
    unload(&f);
}

TEST_IMPL(placement_bad_device_options)
{
    fixture f;
    ASSERT_STATUS(load(&f, (khub_device){7, 0}, NULL, false), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt),
                    "khub_model_load: device type 7: want KHUB_DEVICE_CPU or KHUB_DEVICE_CUDA");
    unload(&f);
    ASSERT_STATUS(load(&f, (khub_device){KHUB_DEVICE_CPU, 1}, NULL, false),
                  KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt),
                    "khub_model_load: device id 1: want 0 for the CPU, a CUDA ordinal >= 0");
    unload(&f);
}

/* ======================================================================== */
/* The plan: fallback, strict, mixed                                        */
/* ======================================================================== */

/* Only CPU plugins: every role falls back, named with its copies; the
 * activations' scratch is still the only block on the device, and a forward
 * pass copies exactly what the explain lines name, per token and role. */
TEST_IMPL(placement_all_roles_fall_back)
{
    fake("12080:90", "100000000", NULL);
    fixture f;
    ASSERT_OK(load(&f, cuda0, NULL, false));
    const char *ex = khub_model_explain(f.m);
    ASSERT_CONTAINS(ex, "placement: cuda:0 (sm_90, driver 12.8): 0 roles on the device, ");
    ASSERT_CONTAINS(ex, "  rms_norm[f32]: cpu fallback, khub/");
    ASSERT_CONTAINS(ex, "(no CUDA kernel: no norm op fits: ");
    ASSERT_CONTAINS(ex, "  qkv_proj[f32]: cpu fallback, ");
    ASSERT_CONTAINS(ex, "    copies per token each time it runs: device->host 256 B (x), "
                        "host->device 512 B (q, k, v)\n");
    ASSERT_CONTAINS(ex, "KV cache 0.0 MiB (on the host)");
    ASSERT_CONTAINS(ex, "  embedding[f32]: host lookup (no CUDA kernel: no embedding op fits: ");
    ASSERT_CONTAINS(ex, "    copies per token each time it runs: host->device 256 B (the row)\n");
    ASSERT_CONTAINS(ex, "embedding lookup on the host, host->device 256 B per token\n");
    ASSERT_CONTAINS(ex, "forward pass on the device: one stream, synchronised around each CPU "
                        "role; logits device->host 0 B per sequence per step; CUDA graphs: no "
                        "(11 roles on the CPU (first: ");
    ASSERT_CONTAINS(ex, "), whose copies synchronise the stream mid-step)\n");
    ASSERT_EQ(stat_of("allocs_live"), 1); /* the scratch */
    ASSERT_EQ(stat_of("htod_bytes"), 0);  /* no weight went up */
    ASSERT_EQ(stat_of("streams_live"), 1);
    float logits[VOCAB];
    int32_t ids[] = {1, 5};
    ASSERT_OK(khub_model_logits(f.m, ids, 2, logits));
    /* Floats per token each role's explain line names (h 64, q 64, kv 32,
     * ffn 128), down and up: layer 0's attn_norm is a plain norm (h, h),
     * layer 1's a residual one (2h, 2h); per layer qkv (h, q + 2kv), rotary
     * q and k (q + kv, q + kv), cache + attention (q + 2kv, q), o (q, h),
     * ffn_norm (2h, 2h), gate/up (h, 2f), act (2f, f), down (f, h); then
     * final_norm (2h, 2h); the embedding row goes up (h); lm_head takes the
     * last row down (h, once per sequence) and keeps the logits. */
    long layer_down = 64 + 96 + 128 + 64 + 128 + 64 + 256 + 128,
         layer_up = 128 + 96 + 64 + 64 + 128 + 256 + 128 + 64;
    long down = 2 * layer_down + 64 + 128 + 128, up = 2 * layer_up + 64 + 128 + 128 + 64;
    ASSERT_EQ(stat_of("dtoh_bytes"), 4 * (2 * down + 64));
    ASSERT_EQ(stat_of("htod_bytes"), 4 * 2 * up);
    ASSERT_EQ(stat_of("dtod_bytes"), 4 * 64); /* the last row gathered on the device */
    ASSERT_EQ(stat_of("launches"), 0);
    /* The fake's copies really copy, so this pass computed on the CPU
     * through device memory: the same logits as the model loaded for it. */
    khub_model_opts o = {KHUB_APP_INIT(khub_model_opts), .max_context = 64, .max_seqs = 2,
                         .max_batch = 16};
    khub_model *cpu = NULL;
    ASSERT_OK(khub_model_load(f.rt, f.dir, &o, &cpu)); /* the same files */
    float want[VOCAB];
    ASSERT_OK(khub_model_logits(cpu, ids, 2, want));
    ASSERT_EQ(memcmp(logits, want, sizeof want), 0);
    khub_model_free(cpu);
    khub_model_free(f.m);
    f.m = NULL;
    ASSERT_EQ(stat_of("allocs_live"), 0);
    ASSERT_EQ(stat_of("streams_live"), 0);
    ASSERT_EQ(stat_of("busy_destroyed"), 0);
    unload(&f);
}

TEST_IMPL(placement_strict_refuses_a_cpu_role)
{
    fake("12080:90", "100000000", NULL);
    fixture f;
    ASSERT_STATUS(load(&f, cuda0, "cuda_ops", true), KHUB_STATUS_NO_KERNEL);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt),
                    ": cuda:0: strict: role rotary[f32] has no CUDA kernel (");
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt),
                    "); load one that serves it, or drop strict to run it on the CPU");
    ASSERT_EQ(stat_of("allocs_live"), 0); /* refused before any allocation */
    unload(&f);
}

/* test/cuda-ops serves the norms, the dense projections and the
 * activation: their weights go up once, exactly their bytes; rotary, the
 * cache and attention stay on the CPU with their copies named. */
TEST_IMPL(placement_mixed_uploads_device_weights)
{
    fake("12080:90", "100000000", NULL);
    fixture f;
    ASSERT_OK(load(&f, cuda0, "cuda_ops", false));
    const char *ex = khub_model_explain(f.m);
    ASSERT_CONTAINS(ex, "placement: cuda:0 (sm_90, driver 12.8): 8 roles on the device, "
                        "3 on the CPU\n");
    ASSERT_CONTAINS(ex, "  rms_norm[f32]: cuda:0, khub-test/cuda-ops 1.0.0 :: rms_norm\n");
    ASSERT_CONTAINS(ex, "  qkv_proj[f32]: cuda:0, khub-test/cuda-ops 1.0.0 :: linear\n");
    ASSERT_CONTAINS(ex, "  silu_and_mul[f32]: cuda:0, khub-test/cuda-ops 1.0.0 :: silu_and_mul\n");
    ASSERT_CONTAINS(ex, "  rotary[f32]: cpu fallback, khub/ref-cpu 0.1.0 :: rotary");
    ASSERT_CONTAINS(ex, "  attention[f32]: cpu fallback, ");
    size_t aligned, copied;
    device_weights(&aligned, &copied);
    ASSERT_EQ((long)stat_of("htod_bytes"), (long)copied);
    ASSERT_EQ(stat_of("allocs_live"), 2); /* weights and scratch; the KV cache is on the host */
    size_t scratch = (size_t)stat_of("bytes_live") - aligned;
    char want[160];
    snprintf(want, sizeof want, "device memory: weights %.1f MiB, KV cache 0.0 MiB (on the host)",
             (double)aligned / (1024.0 * 1024.0));
    ASSERT_CONTAINS(ex, want);
    ASSERT(scratch > 0);
    ASSERT(stat_of("stream_syncs") >= 1); /* the host's weights outlived the copies */
    khub_model_free(f.m);
    f.m = NULL;
    ASSERT_EQ(stat_of("allocs_live"), 0);
    ASSERT_EQ(stat_of("bytes_live"), 0);
    ASSERT_EQ(stat_of("streams_live"), 0);
    unload(&f);
}

/* A role bound for two dtypes, one of them without a CUDA op, is not split:
 * the whole qkv role stays on the CPU, and none of its weights go up. */
TEST_IMPL(placement_never_splits_a_role)
{
    fake("12080:90", "100000000", NULL);
    f16_q0 = true;
    fixture f;
    ASSERT_OK(load(&f, cuda0, "cuda_ops", false));
    const char *ex = khub_model_explain(f.m);
    ASSERT_CONTAINS(ex, "placement: cuda:0 (sm_90, driver 12.8): 7 roles on the device, "
                        "4 on the CPU\n");
    ASSERT_CONTAINS(ex, "  qkv_proj[f16]: cpu fallback, khub/");
    ASSERT_CONTAINS(ex, ":: linear (no CUDA kernel: no linear op fits: ");
    ASSERT_CONTAINS(ex, "  qkv_proj[f32]: cpu fallback, khub/");
    ASSERT_CONTAINS(ex, "(no CUDA kernel: khub-test/cuda-ops 1.0.0 :: linear has one, but the "
                        "role's other weights have none)\n");
    ASSERT_CONTAINS(ex, "  o_proj[f32]: cuda:0, khub-test/cuda-ops 1.0.0 :: linear\n");
    size_t aligned, copied, qkv = 0;
    device_weights(&aligned, &copied);
    tensor t[32];
    int n = tensors(t);
    for (int i = 0; i < n; i++)
        if (strstr(t[i].name, "_proj.weight") && strstr(t[i].name, "self_attn.") &&
            !strstr(t[i].name, "o_proj"))
            qkv += (size_t)t[i].r * (size_t)t[i].c * 4;
    ASSERT_EQ((long)stat_of("htod_bytes"), (long)(copied - qkv));
    unload(&f);
}

/* ======================================================================== */
/* Memory and driver failures                                               */
/* ======================================================================== */

TEST_IMPL(placement_does_not_fit)
{
    fake("12080:90", "200000", NULL); /* 195 KiB: less than the weights */
    fixture f;
    ASSERT_STATUS(load(&f, cuda0, "cuda_ops", false), KHUB_STATUS_NOMEM);
    const char *e = khub_runtime_errmsg(f.rt);
    ASSERT_CONTAINS(e, ": cuda:0: the model needs ");
    ASSERT_CONTAINS(e, " MiB of device memory (weights ");
    ASSERT_CONTAINS(e, " MiB, KV cache 0.0 MiB, scratch ");
    ASSERT_CONTAINS(e, " MiB) and 0.2 MiB of 0.2 MiB are free; lower max_context or max_seqs, "
                       "quantize the weights, or use another device");
    ASSERT_EQ(stat_of("allocs_live"), 0); /* checked before allocating anything */
    ASSERT_EQ(stat_of("streams_live"), 0);
    unload(&f);
}

TEST_IMPL(placement_allocation_fails)
{
    fake("12080:90", "100000000", "cuMemAlloc@2"); /* the weights' block, then the scratch's */
    fixture f;
    ASSERT_STATUS(load(&f, cuda0, "cuda_ops", false), KHUB_STATUS_CUDA);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt),
                    ": cuda:0: allocating 0.0 MiB for the scratch: cuMemAlloc failed: "
                    "CUDA_ERROR_OUT_OF_MEMORY (2)");
    ASSERT_EQ(stat_of("allocs_live"), 0); /* the weights' block was given back */
    ASSERT_EQ(stat_of("streams_live"), 0);
    unload(&f);
}

TEST_IMPL(placement_upload_fails)
{
    fake("12080:90", "100000000", "cuMemcpyHtoDAsync@3");
    fixture f;
    ASSERT_STATUS(load(&f, cuda0, "cuda_ops", false), KHUB_STATUS_CUDA);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt), ": cuda:0: uploading 'model.layers.0.");
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt),
                    "': cuMemcpyHtoDAsync failed: CUDA_ERROR_INVALID_VALUE (1)");
    ASSERT_EQ(stat_of("allocs_live"), 0);
    unload(&f);
}

/* ======================================================================== */
/* The forward pass with every role on the device                           */
/* ======================================================================== */

/* test/cuda-all serves every role: one step launches each layer's ops in
 * forward.c's order on the model's stream, copies only the embedding rows
 * and positions up and the logits row down, and synchronises once. */
TEST_IMPL(device_forward_every_role_on_device)
{
    fake("12080:90", "100000000", NULL);
    launch_log();
    fixture f;
    ASSERT_OK(load(&f, cuda0, "cuda_all", false));
    const char *ex = khub_model_explain(f.m);
    ASSERT_CONTAINS(ex, " roles on the device, 0 on the CPU\n");
    ASSERT_CONTAINS(ex, "  kv_cache[f32]: cuda:0, khub-test/cuda-all 1.0.0 :: static_cache\n");
    ASSERT_CONTAINS(ex, "host->device 256 B per token (+ 4 B of position)");
    ASSERT_CONTAINS(ex, "forward pass on the device: one stream, one synchronisation per step; "
                        "logits device->host 1024 B per sequence per step; CUDA graphs: yes "
                        "(decode steps: captured each step, instantiated once per batch shape, "
                        "then updated in place with cuGraphExecUpdate; prefill runs plain "
                        "launches)\n");
    ASSERT_EQ(stat_of("allocs_live"), 3); /* weights, scratch, the device cache */
    long up0 = stat_of("htod_bytes"), syncs0 = stat_of("stream_syncs");
    float logits[VOCAB];
    int32_t ids[] = {1, 5};
    ASSERT_OK(khub_model_logits(f.m, ids, 2, logits));
    static const char *const layer[] = {"norm",   "linear",   "linear",    "linear", "rotary",
                                        "rotary", "kv_write", "attention", "linear", "norm",
                                        "linear", "linear",   "act",       "linear"};
    long i = 0;
    for (int L = 0; L < LAYERS; L++)
        for (size_t k = 0; k < sizeof layer / sizeof layer[0]; k++, i++) {
            char want[64];
            snprintf(want, sizeof want, "khub_test_%s", layer[k]);
            ASSERT_STR_EQ(launch_name(i), want);
        }
    ASSERT_STR_EQ(launch_name(i++), "khub_test_norm");   /* final_norm */
    ASSERT_STR_EQ(launch_name(i++), "khub_test_linear"); /* lm_head */
    ASSERT_EQ(stat_of("launches"), i);
    ASSERT_EQ(stat_of("htod_bytes") - up0, 2 * (4 * HID + 4)); /* rows and positions */
    ASSERT_EQ(stat_of("dtoh_bytes"), 4 * VOCAB);               /* the logits row */
    ASSERT_EQ(stat_of("dtod_bytes"), 4 * HID);                 /* the last row gathered */
    ASSERT_EQ(stat_of("stream_syncs") - syncs0, 1);
    khub_model_free(f.m);
    f.m = NULL;
    ASSERT_EQ(stat_of("allocs_live"), 0);
    ASSERT_EQ(stat_of("streams_live"), 0);
    ASSERT_EQ(stat_of("busy_destroyed"), 0);
    unload(&f);
}

/* A launch failing mid-pass (the 5th: layer 0's rotary q) surfaces with the
 * role, the layer, the op and the driver's error; the next call works and
 * freeing the model gives everything back. */
TEST_IMPL(device_forward_launch_failure)
{
    fake("12080:90", "100000000", "cuLaunchKernel@5");
    fixture f;
    ASSERT_OK(load(&f, cuda0, "cuda_all", false));
    float logits[VOCAB];
    int32_t ids[] = {1, 5};
    ASSERT_STATUS(khub_model_logits(f.m, ids, 2, logits), KHUB_STATUS_CUDA);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt),
                    ": cuda:0: layer 0 rotary q failed: khub-test/cuda-all 1.0.0 :: rotary: "
                    "cuLaunchKernel failed: CUDA_ERROR_LAUNCH_FAILED (719)");
    ASSERT_EQ(stat_of("launches"), 4);
    ASSERT_OK(khub_model_logits(f.m, ids, 2, logits)); /* @5 fails once */
    khub_model_free(f.m);
    f.m = NULL;
    ASSERT_EQ(stat_of("allocs_live"), 0);
    ASSERT_EQ(stat_of("bytes_live"), 0);
    ASSERT_EQ(stat_of("streams_live"), 0);
    ASSERT_EQ(stat_of("busy_destroyed"), 0);
    unload(&f);
}

/* test/cuda-embed serves every role and the embedding (ABI 1.5): the table
 * goes up once (the tied head reads that copy: the load copies each weight's
 * bytes once), a step launches the embedding before the layers and copies
 * only the token ids and positions up (4 + 4 B per token); an id outside
 * the vocabulary is refused before anything goes up or runs, and the
 * embedding's own launch failing is named like any role's. */
TEST_IMPL(device_forward_embedding_on_device)
{
    fake("12080:90", "100000000", "cuLaunchKernel@32");
    launch_log();
    fixture f;
    ASSERT_OK(load(&f, cuda0, "cuda_embed", false));
    const char *ex = khub_model_explain(f.m);
    ASSERT_CONTAINS(ex, " roles on the device, 0 on the CPU\n");
    ASSERT_CONTAINS(ex, "  embedding[f32]: cuda:0, khub-test/cuda-embed 1.0.0 :: embedding\n");
    ASSERT_CONTAINS(ex, "embedding lookup on the device (its table 0.1 MiB in device memory, read "
                        "by the tied lm_head too), host->device 4 B of token id per token (+ 4 B "
                        "of position)\n");
    size_t aligned, copied;
    device_weights(&aligned, &copied);
    ASSERT_EQ((long)stat_of("htod_bytes"), (long)copied); /* the table once, not twice */
    long up0 = stat_of("htod_bytes");
    float logits[VOCAB];
    int32_t bad[] = {1, VOCAB};
    ASSERT_STATUS(khub_model_logits(f.m, bad, 2, logits), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt),
                    "token id 256 at position 1 is outside the vocabulary [0, 256)");
    ASSERT_EQ(stat_of("launches"), 0);
    ASSERT_EQ(stat_of("htod_bytes") - up0, 0); /* nothing went up */
    int32_t ids[] = {1, 5};
    ASSERT_OK(khub_model_logits(f.m, ids, 2, logits));
    ASSERT_STR_EQ(launch_name(0), "khub_test_embedding");
    ASSERT_STR_EQ(launch_name(1), "khub_test_norm"); /* layer 0's attn_norm */
    ASSERT_EQ(stat_of("launches"), 1 + LAYERS * 14 + 2);
    ASSERT_EQ(stat_of("htod_bytes") - up0, 2 * (4 + 4)); /* ids and positions */
    /* the 32nd launch is the next step's embedding */
    ASSERT_STATUS(khub_model_logits(f.m, ids, 2, logits), KHUB_STATUS_CUDA);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt),
                    ": cuda:0: layer -1 embedding failed: khub-test/cuda-embed 1.0.0 :: "
                    "embedding: cuLaunchKernel failed: CUDA_ERROR_LAUNCH_FAILED (719)");
    khub_model_free(f.m);
    f.m = NULL;
    ASSERT_EQ(stat_of("allocs_live"), 0);
    ASSERT_EQ(stat_of("streams_live"), 0);
    ASSERT_EQ(stat_of("busy_destroyed"), 0);
    unload(&f);
}

/* The device cache's own allocation (the third, after the weights and the
 * scratch) failing fails the load, named, and leaks nothing. */
TEST_IMPL(device_forward_cache_out_of_memory)
{
    fake("12080:90", "100000000", "cuMemAlloc@3");
    fixture f;
    ASSERT_STATUS(load(&f, cuda0, "cuda_all", false), KHUB_STATUS_CUDA);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt),
                    ": cuda:0: creating the device KV cache (64 tokens x 2 sequences) in "
                    "khub-test/cuda-all 1.0.0 :: static_cache: cuMemAlloc failed: "
                    "CUDA_ERROR_OUT_OF_MEMORY (2)");
    ASSERT_EQ(stat_of("allocs_live"), 0);
    ASSERT_EQ(stat_of("streams_live"), 0);
    unload(&f);
}

/* ======================================================================== */
/* The driver layer as plugins use it                                       */
/* ======================================================================== */

TEST_IMPL(cuda_layer_roundtrip_on_fake_driver)
{
    fake("12080:90", "4096", NULL);
    khub_runtime *rt = tp_runtime(1);
    khub_plugin *p = tp_load(rt, "cuda_ops");
    const khub_host_api *h = &p->host;
    int n = 0, cc = 0;
    ASSERT_OK(h->cuda_device_count(h->host_ctx, &n));
    ASSERT_EQ(n, 1);
    ASSERT_OK(h->cuda_device_cc(h->host_ctx, 0, &cc));
    ASSERT_EQ(cc, 90);
    float host[32], back[32];
    for (int i = 0; i < 32; i++) host[i] = (float)i;
    uint64_t d = 0;
    ASSERT_OK(h->cuda_mem_alloc(h->host_ctx, 0, sizeof host, &d));
    ASSERT_OK(h->cuda_memcpy_htod(h->host_ctx, d, host, sizeof host, NULL));
    ASSERT_OK(h->cuda_memcpy_dtoh(h->host_ctx, back, d, sizeof back, NULL));
    ASSERT_OK(h->cuda_stream_sync(h->host_ctx, NULL));
    ASSERT_EQ(memcmp(host, back, sizeof host), 0);
    /* Out of the fake's 4096 bytes; the driver's error, named. */
    uint64_t big = 0;
    khub__plugin_msg_clear();
    ASSERT_STATUS(h->cuda_mem_alloc(h->host_ctx, 0, 8192, &big), KHUB_STATUS_CUDA);
    ASSERT_STR_EQ(khub__plugin_msg(), "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (2)");
    ASSERT_EQ(big, 0);
    ASSERT_OK(h->cuda_mem_free(h->host_ctx, d));
    ASSERT_EQ(stat_of("allocs_live"), 0);
    khub_runtime_free(rt);
}

TEST_IMPL(cuda_layer_launch_failure)
{
    fake("12080:90", "4096", "cuLaunchKernel");
    khub_runtime *rt = tp_runtime(1);
    khub_plugin *p = tp_load(rt, "cuda_ops");
    void *fn = NULL;
    khub__plugin_msg_clear();
    ASSERT_STATUS(nop_launch(&p->host, NULL, &fn), KHUB_STATUS_CUDA);
    ASSERT_STR_EQ(khub__plugin_msg(), "cuLaunchKernel failed: CUDA_ERROR_LAUNCH_FAILED (719)");
    ASSERT_EQ(stat_of("launches"), 0);
    khub_runtime_free(rt);
    ASSERT_EQ(stat_of("modules_live"), 0);
}

/* A plugin retired with work queued on its streams: the host drains each
 * stream before destroying it and unloads the modules after. */
TEST_IMPL(cuda_layer_unload_while_streams_busy)
{
    fake("12080:90", "4096", NULL);
    khub_runtime *rt = tp_runtime(1);
    khub_plugin *p = tp_load(rt, "cuda_ops");
    const khub_host_api *h = &p->host;
    void *s1 = NULL, *s2 = NULL, *fn = NULL;
    ASSERT_OK(h->cuda_stream_create(h->host_ctx, 0, &s1));
    ASSERT_OK(h->cuda_stream_create(h->host_ctx, 0, &s2));
    ASSERT_OK(nop_launch(h, s1, &fn));
    ASSERT_OK(nop_launch(h, s2, &fn));
    ASSERT_EQ(stat_of("launches"), 2);
    ASSERT_EQ(stat_of("streams_live"), 2);
    ASSERT_EQ(stat_of("modules_live"), 2);
    long syncs = stat_of("stream_syncs");
    khub_runtime_free(rt); /* retires the plugin with both streams busy */
    ASSERT_EQ(stat_of("busy_destroyed"), 0);
    ASSERT_EQ(stat_of("stream_syncs"), syncs + 2);
    ASSERT_EQ(stat_of("streams_live"), 0);
    ASSERT_EQ(stat_of("modules_live"), 0);
}

#define TEST_LIST(X) \
    X(placement_without_driver) \
    X(placement_driver_without_gpu) \
    X(placement_no_such_ordinal) \
    X(placement_bad_device_options) \
    X(placement_all_roles_fall_back) \
    X(placement_strict_refuses_a_cpu_role) \
    X(placement_mixed_uploads_device_weights) \
    X(placement_never_splits_a_role) \
    X(placement_does_not_fit) \
    X(placement_allocation_fails) \
    X(placement_upload_fails) \
    X(device_forward_every_role_on_device) \
    X(device_forward_launch_failure) \
    X(device_forward_embedding_on_device) \
    X(device_forward_cache_out_of_memory) \
    X(cuda_layer_roundtrip_on_fake_driver) \
    X(cuda_layer_launch_failure) \
    X(cuda_layer_unload_while_streams_busy)
TEST_MAIN(TEST_LIST)
