/* make_seeds.c: writes the fuzzers' seed corpora from the test fixtures:
 *   make_seeds DIR  ->  DIR/gguf/, DIR/safetensors/, DIR/model_config/
 * (the folders must exist). Each GGUF mutation of the test suite becomes one
 * seed, so the fuzzer starts next to every rejection path. */
#include <stdio.h>

#include "model_fixtures.h"

static int put(const char *dir, const char *sub, const char *name, const fx_buf *b)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/%s", dir, sub, name);
    if (fx_write_file(path, b) != 0) {
        fprintf(stderr, "make_seeds: cannot write %s\n", path);
        return 1;
    }
    return 0;
}

static const char *const st_json[] = {
    "{\"__metadata__\":{\"format\":\"pt\"},"
    "\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
    "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
    "\"ids\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[32,48]}}",
    "{\"s\":{\"dtype\":\"F16\",\"shape\":[],\"data_offsets\":[0,2]},"
    "\"f4\":{\"dtype\":\"F4\",\"shape\":[6],\"data_offsets\":[2,5]}}",
    "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
    "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
};

static const char *const configs[] = {
    "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":576,\"intermediate_size\":1536,"
    "\"num_hidden_layers\":30,\"num_attention_heads\":9,\"num_key_value_heads\":3,"
    "\"vocab_size\":49152,\"rope_theta\":100000,\"rms_norm_eps\":1e-05,"
    "\"tie_word_embeddings\":true,\"bos_token_id\":1,\"eos_token_id\":2}",
    "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":2048,\"intermediate_size\":8192,"
    "\"num_hidden_layers\":16,\"num_attention_heads\":32,\"num_key_value_heads\":8,"
    "\"vocab_size\":128256,\"rope_scaling\":{\"factor\":32.0,\"high_freq_factor\":4.0,"
    "\"low_freq_factor\":1.0,\"original_max_position_embeddings\":8192,"
    "\"rope_type\":\"llama3\"},\"eos_token_id\":[128001,128008,128009]}",
    "{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":896,\"intermediate_size\":4864,"
    "\"num_hidden_layers\":24,\"num_attention_heads\":14,\"num_key_value_heads\":2,"
    "\"vocab_size\":151936,\"use_sliding_window\":true,\"sliding_window\":4096,"
    "\"max_window_layers\":21,\"layer_types\":[\"full_attention\"]}",
};

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: make_seeds DIR\n");
        return 2;
    }
    int bad = 0;
    char name[64];
    for (int m = FX_NONE; m <= FX_NUL_IN_NAME; m++) {
        fx_buf b = {0};
        fx_gguf_small(&b, (fx_gguf_mut)m);
        snprintf(name, sizeof name, "small-%02d.gguf", m);
        bad |= put(argv[1], "gguf", name, &b);
        fx_free(&b);
    }
    for (size_t i = 0; i < sizeof st_json / sizeof st_json[0]; i++) {
        fx_buf b = {0};
        fx_safetensors(&b, st_json[i], 48, 1);
        snprintf(name, sizeof name, "st-%02zu.safetensors", i);
        bad |= put(argv[1], "safetensors", name, &b);
        fx_free(&b);
    }
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        fx_buf b = {(uint8_t *)configs[i], strlen(configs[i]), 0};
        snprintf(name, sizeof name, "config-%02zu.json", i);
        bad |= put(argv[1], "model_config", name, &b);
    }
    return bad;
}
