/*
 * device_fixture.h: what the host-side tests of a model placed on a CUDA
 * device share (test_placement.c, test_cuda_graphs.c): the fake driver
 * (tests/fake_cuda), dlopened by path before khub opens "libcuda.so.1" so
 * the name resolves to it, and read through khub_fake_cuda_stat and its
 * launch log; and a tiny random Llama written to /tmp (F32 safetensors,
 * tied embeddings) with its loading for a device.
 */
#ifndef KHUB_TESTS_DEVICE_FIXTURE_H
#define KHUB_TESTS_DEVICE_FIXTURE_H

#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../plugins/include/khub_plugin_util.h" /* f32 -> f16 */
#include "khub/khub_model.h"
#include "plugins/tp_util.h"
#include "runtime_impl.h"

/* ======================================================================== */
/* The fake driver                                                          */
/* ======================================================================== */

static long (*fake_stat)(const char *);

/* Loads the fake driver with KHUB_FAKE_CUDA=spec, KHUB_FAKE_CUDA_MEM=mem
 * and KHUB_FAKE_CUDA_FAIL=fail (NULL = unset). Each case is its own
 * process, so each gets a fresh driver. */
static inline void fake(const char *spec, const char *mem, const char *fail)
{
    setenv("KHUB_FAKE_CUDA", spec, 1);
    if (mem)
        setenv("KHUB_FAKE_CUDA_MEM", mem, 1);
    else
        unsetenv("KHUB_FAKE_CUDA_MEM");
    if (fail)
        setenv("KHUB_FAKE_CUDA_FAIL", fail, 1);
    else
        unsetenv("KHUB_FAKE_CUDA_FAIL");
    void *h = dlopen(KHUB_BINARY_DIR "/fake-cuda/libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) TEST_FAIL_("the fake driver: %s", dlerror());
    fake_stat = (long (*)(const char *))dlsym(h, "khub_fake_cuda_stat");
    ASSERT(fake_stat != NULL);
}

static inline long stat_of(const char *what)
{
    long v = fake_stat(what);
    if (v < 0) TEST_FAIL_("the fake driver has no statistic %s", what);
    return v;
}

/* ======================================================================== */
/* A tiny model                                                             */
/* ======================================================================== */

enum { HID = 64, HEADS = 4, KVH = 2, HD = 16, FFN = 128, VOCAB = 256, LAYERS = 2 };

static uint64_t rng = 88172645463325252ull;
static inline float frand(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

/* Elements of every tensor, in file order (its names below). */
typedef struct tensor {
    char name[80];
    int64_t r, c; /* c 0 = a vector */
    bool f16;     /* stored as F16 (else F32) */
} tensor;

/* Layer 0's q_proj stored as F16 (the others F32): the qkv role is then
 * bound twice, once per dtype. */
static bool f16_q0;

static inline int tensors(tensor *t)
{
    int n = 0;
#define ADD(R, C, ...) \
    (snprintf(t[n].name, sizeof t[n].name, __VA_ARGS__), t[n].r = (R), t[n].c = (C), \
     t[n].f16 = f16_q0 && !strcmp(t[n].name, "model.layers.0.self_attn.q_proj.weight"), n++)
    ADD(VOCAB, HID, "model.embed_tokens.weight");
    ADD(HID, 0, "model.norm.weight");
    for (int L = 0; L < LAYERS; L++) {
        ADD(HID, 0, "model.layers.%d.input_layernorm.weight", L);
        ADD(HID, 0, "model.layers.%d.post_attention_layernorm.weight", L);
        ADD(HEADS * HD, HID, "model.layers.%d.self_attn.q_proj.weight", L);
        ADD(KVH * HD, HID, "model.layers.%d.self_attn.k_proj.weight", L);
        ADD(KVH * HD, HID, "model.layers.%d.self_attn.v_proj.weight", L);
        ADD(HID, HEADS * HD, "model.layers.%d.self_attn.o_proj.weight", L);
        ADD(FFN, HID, "model.layers.%d.mlp.gate_proj.weight", L);
        ADD(FFN, HID, "model.layers.%d.mlp.up_proj.weight", L);
        ADD(HID, FFN, "model.layers.%d.mlp.down_proj.weight", L);
    }
#undef ADD
    return n;
}

static inline const char *tiny_model(void)
{
    static char dir[128];
    snprintf(dir, sizeof dir, "/tmp/khub-placement-%d", (int)getpid());
    mkdir(dir, 0700);
    char path[256], hdr[8192];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    ASSERT(f);
    fprintf(f,
            "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", "
            "\"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d, "
            "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, "
            "\"vocab_size\": %d, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0, "
            "\"max_position_embeddings\": 512, \"tie_word_embeddings\": true, "
            "\"bos_token_id\": 1, \"eos_token_id\": 2, \"hidden_act\": \"silu\", "
            "\"torch_dtype\": \"float32\"}\n",
            HID, FFN, LAYERS, HEADS, KVH, HD, VOCAB);
    fclose(f);
    tensor t[32];
    int n = tensors(t);
    size_t len = 1, off = 0;
    hdr[0] = '{';
    for (int i = 0; i < n; i++) {
        size_t cnt = (size_t)t[i].r * (size_t)(t[i].c ? t[i].c : 1), es = t[i].f16 ? 2 : 4;
        char shape[48];
        if (t[i].c)
            snprintf(shape, sizeof shape, "%lld,%lld", (long long)t[i].r, (long long)t[i].c);
        else
            snprintf(shape, sizeof shape, "%lld", (long long)t[i].r);
        len += (size_t)snprintf(hdr + len, sizeof hdr - len,
                                "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],"
                                "\"data_offsets\":[%zu,%zu]}",
                                i ? "," : "", t[i].name, t[i].f16 ? "F16" : "F32", shape, off,
                                off + cnt * es);
        off += cnt * es;
    }
    len += (size_t)snprintf(hdr + len, sizeof hdr - len, "}");
    while (len % 8) hdr[len++] = ' ';
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    f = fopen(path, "wb");
    ASSERT(f);
    uint64_t hl = len;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr, 1, len, f);
    for (int i = 0; i < n; i++) {
        size_t cnt = (size_t)t[i].r * (size_t)(t[i].c ? t[i].c : 1);
        for (size_t k = 0; k < cnt; k++) {
            float v = t[i].c ? frand() / sqrtf((float)t[i].c) : 1.0f + 0.1f * frand();
            uint16_t h = khub_pu_f32_to_f16(v);
            if (t[i].f16)
                fwrite(&h, 2, 1, f);
            else
                fwrite(&v, 4, 1, f);
        }
    }
    ASSERT_EQ(fclose(f), 0);
    return dir;
}

static inline void tiny_rm(const char *dir)
{
    char p[256];
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    unlink(p);
    rmdir(dir);
}

static inline size_t up256(size_t n) { return (n + 255) / 256 * 256; }

/* Device bytes of the weights of the roles test/cuda-ops serves (norms and
 * every dense projection, and the tied head as its own copy: the lm_head
 * role reads it), each rounded up to placement.c's 256-byte alignment; and
 * the same weights' bytes as copied. */
static inline void device_weights(size_t *aligned, size_t *copied)
{
    tensor t[32];
    int n = tensors(t);
    *aligned = *copied = 0;
    for (int i = 0; i < n; i++) {
        size_t b = (size_t)t[i].r * (size_t)(t[i].c ? t[i].c : 1) * 4;
        *aligned += up256(b); /* the embedding's bytes count once, as the head's */
        *copied += b;
    }
}

/* ======================================================================== */
/* Loading                                                                  */
/* ======================================================================== */

typedef struct fixture {
    khub_runtime *rt;
    khub_model *m;
    const char *dir;
} fixture;

/* A runtime with the built-in plugins (and the test plugin `cuda`, e.g.
 * "cuda_ops" or "cuda_all", unless NULL), and the tiny model loaded for
 * device; st is what the load returned. */
static inline khub_status load(fixture *f, khub_device device, const char *cuda, bool strict)
{
    memset(f, 0, sizeof *f);
    f->rt = tp_runtime(1);
    ASSERT_OK(khub_plugin_load_builtin(f->rt));
    if (cuda) tp_load(f->rt, cuda);
    f->dir = tiny_model();
    khub_model_opts o = {KHUB_APP_INIT(khub_model_opts),
                         .device = device,
                         .strict = strict,
                         .max_context = 64,
                         .max_seqs = 2,
                         .max_batch = 16};
    return khub_model_load(f->rt, f->dir, &o, &f->m);
}

static inline void unload(fixture *f)
{
    khub_model_free(f->m);
    khub_runtime_free(f->rt);
    tiny_rm(f->dir);
}

static const khub_device cuda0 = {KHUB_DEVICE_CUDA, 0};

static const char *(*launch_name)(long);

static inline void launch_log(void)
{
    void *h = dlopen(KHUB_BINARY_DIR "/fake-cuda/libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    launch_name = h ? (const char *(*)(long))dlsym(h, "khub_fake_cuda_launch_name") : NULL;
    ASSERT(launch_name != NULL);
}

/* Loads a one-kernel PTX module through plugin host table h and launches
 * its nop on stream (NULL = legacy); *fn is the function. */
static inline khub_status nop_launch(const khub_host_api *h, void *stream, void **fn)
{
    static const char ptx[] = ".version 7.0\n.target sm_52\n.address_size 64\n"
                              ".visible .entry nop()\n{\n  ret;\n}\n";
    khub_cuda_module *m = NULL;
    khub_status st = h->cuda_module_load(h->host_ctx, 0, ptx, sizeof ptx, &m);
    if (st == KHUB_STATUS_OK) st = h->cuda_module_function(h->host_ctx, m, "nop", fn);
    khub_cuda_launch_cfg cfg = {KHUB_STRUCT_INIT(khub_cuda_launch_cfg), .grid = {1, 1, 1},
                                .block = {32, 1, 1}, .stream = stream};
    if (st == KHUB_STATUS_OK) st = h->cuda_launch(h->host_ctx, *fn, &cfg, NULL);
    return st;
}

#endif /* KHUB_TESTS_DEVICE_FIXTURE_H */
