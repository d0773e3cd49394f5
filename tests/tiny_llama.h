/*
 * tiny_llama.h: a tiny random Llama (or Qwen2) written to a folder as a
 * Hugging Face model: config.json and model.safetensors (F32, optionally
 * layer 0's q_proj in F16), tied embeddings. The tests that load a model
 * without a real one share it (device_fixture.h for test_placement and
 * test_cuda_graphs, test_batch, test_device_paged, test_tp).
 *
 * The weights come from a xorshift generator seeded per model, so the same
 * options write the same bytes every time: a matrix [r, c] holds U(-1, 1)
 * / sqrt(c), a norm weight 1 + 0.1 U(-1, 1), a bias 0.1 U(-1, 1), drawn in
 * the file's tensor order.
 */
#ifndef KHUB_TESTS_TINY_LLAMA_H
#define KHUB_TESTS_TINY_LLAMA_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../plugins/include/khub_plugin_util.h" /* f32 -> f16 */
#include "runner.h"

typedef struct tiny_llama {
    int hidden, ffn, layers, heads, kv_heads, head_dim, vocab;
    bool qwen2;    /* Qwen2ForCausalLM: q/k/v projections with biases */
    bool f16_q0;   /* layer 0's q_proj stored as F16 (the rest F32) */
    uint64_t seed; /* the generator's state; 0 = 88172645463325252 */
} tiny_llama;

static inline float tiny_llama_rand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (float)((*s >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

typedef struct tiny_llama_tensor {
    char name[80];
    int64_t r, c; /* c 0: a vector */
    bool f16;
} tiny_llama_tensor;

/* The tensors of t in file order into ts (room for 16 + 12 per layer). */
static inline int tiny_llama_tensors(const tiny_llama *t, tiny_llama_tensor *ts)
{
    int n = 0, hid = t->hidden, q = t->heads * t->head_dim, kv = t->kv_heads * t->head_dim;
#define ADD(R, C, ...) \
    (snprintf(ts[n].name, sizeof ts[n].name, __VA_ARGS__), ts[n].r = (R), ts[n].c = (C), \
     ts[n].f16 = false, n++)
    ADD(t->vocab, hid, "model.embed_tokens.weight");
    ADD(hid, 0, "model.norm.weight");
    for (int L = 0; L < t->layers; L++) {
        ADD(hid, 0, "model.layers.%d.input_layernorm.weight", L);
        ADD(hid, 0, "model.layers.%d.post_attention_layernorm.weight", L);
        ADD(q, hid, "model.layers.%d.self_attn.q_proj.weight", L);
        ts[n - 1].f16 = t->f16_q0 && L == 0;
        ADD(kv, hid, "model.layers.%d.self_attn.k_proj.weight", L);
        ADD(kv, hid, "model.layers.%d.self_attn.v_proj.weight", L);
        ADD(hid, q, "model.layers.%d.self_attn.o_proj.weight", L);
        if (t->qwen2) {
            ADD(q, 0, "model.layers.%d.self_attn.q_proj.bias", L);
            ADD(kv, 0, "model.layers.%d.self_attn.k_proj.bias", L);
            ADD(kv, 0, "model.layers.%d.self_attn.v_proj.bias", L);
        }
        ADD(t->ffn, hid, "model.layers.%d.mlp.gate_proj.weight", L);
        ADD(t->ffn, hid, "model.layers.%d.mlp.up_proj.weight", L);
        ADD(hid, t->ffn, "model.layers.%d.mlp.down_proj.weight", L);
    }
#undef ADD
    return n;
}

static inline void tiny_llama_config(const char *dir, const tiny_llama *t)
{
    char path[300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    ASSERT(f);
    fprintf(f,
            "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", \"hidden_size\": %d, "
            "\"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d, "
            "\"num_key_value_heads\": %d, \"head_dim\": %d, \"vocab_size\": %d, "
            "\"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0, \"max_position_embeddings\": 512, "
            "\"tie_word_embeddings\": true, \"bos_token_id\": 1, \"eos_token_id\": 2, "
            "\"hidden_act\": \"silu\", \"torch_dtype\": \"float32\"}\n",
            t->qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM", t->qwen2 ? "qwen2" : "llama",
            t->hidden, t->ffn, t->layers, t->heads, t->kv_heads, t->head_dim, t->vocab);
    ASSERT_EQ(fclose(f), 0);
}

/* Writes dir/config.json and dir/model.safetensors for t (dir created). */
static inline void tiny_llama_write(const char *dir, const tiny_llama *t)
{
    mkdir(dir, 0700);
    tiny_llama_config(dir, t);
    static tiny_llama_tensor ts[16 + 12 * 8];
    ASSERT(t->layers <= 8);
    int n = tiny_llama_tensors(t, ts);
    char path[300], hdr[16384];
    size_t len = 1, off = 0;
    hdr[0] = '{';
    for (int i = 0; i < n; i++) {
        size_t bytes = (size_t)ts[i].r * (size_t)(ts[i].c ? ts[i].c : 1) * (ts[i].f16 ? 2 : 4);
        char shape[48];
        if (ts[i].c)
            snprintf(shape, sizeof shape, "%lld,%lld", (long long)ts[i].r, (long long)ts[i].c);
        else
            snprintf(shape, sizeof shape, "%lld", (long long)ts[i].r);
        len += (size_t)snprintf(hdr + len, sizeof hdr - len,
                                "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],"
                                "\"data_offsets\":[%zu,%zu]}",
                                i ? "," : "", ts[i].name, ts[i].f16 ? "F16" : "F32", shape, off,
                                off + bytes);
        off += bytes;
    }
    len += (size_t)snprintf(hdr + len, sizeof hdr - len, "}");
    ASSERT(len + 8 < sizeof hdr);
    while (len % 8) hdr[len++] = ' ';
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    ASSERT(f);
    uint64_t hl = len;
    ASSERT_EQ(fwrite(&hl, 8, 1, f), 1);
    ASSERT_EQ(fwrite(hdr, 1, len, f), len);
    uint64_t s = t->seed ? t->seed : 88172645463325252ull;
    for (int i = 0; i < n; i++) {
        bool vec = ts[i].c == 0, norm = vec && strstr(ts[i].name, "norm") != NULL;
        float scale = vec ? 0.1f : 1.0f / sqrtf((float)ts[i].c);
        size_t cnt = (size_t)ts[i].r * (size_t)(vec ? 1 : ts[i].c);
        for (size_t k = 0; k < cnt; k++) {
            float v = tiny_llama_rand(&s) * scale + (norm ? 1.0f : 0.0f);
            uint16_t h = khub_pu_f32_to_f16(v);
            if (ts[i].f16)
                ASSERT_EQ(fwrite(&h, 2, 1, f), 1);
            else
                ASSERT_EQ(fwrite(&v, 4, 1, f), 1);
        }
    }
    ASSERT_EQ(fclose(f), 0);
}

static inline void tiny_llama_rm(const char *dir)
{
    char p[300];
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    unlink(p);
    rmdir(dir);
}

#endif /* KHUB_TESTS_TINY_LLAMA_H */
