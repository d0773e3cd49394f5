/* test_model_config.c: hyper-parameters from config.json (+ generation_config)
 * and from GGUF metadata; every refusal names its field. */
#include <cjson/cJSON.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model_config.h"
#include "model_fixtures.h"
#include "runner.h"

static khub_runtime *new_rt(void)
{
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(NULL, &rt));
    return rt;
}

static khub_status from_json(khub_runtime *rt, const char *json, khub_model_config *c)
{
    return khub__model_config_from_json(rt, "config.json", json, strlen(json), c);
}

/* The SmolLM2-135M-Instruct config.json as published (fields as on the Hub). */
static const char *const smol_json =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"attention_bias\":false,"
    "\"attention_dropout\":0.0,\"bos_token_id\":1,\"eos_token_id\":2,\"head_dim\":64,"
    "\"hidden_act\":\"silu\",\"hidden_size\":576,\"initializer_range\":0.041666666666666664,"
    "\"intermediate_size\":1536,\"is_llama_config\":true,\"max_position_embeddings\":8192,"
    "\"mlp_bias\":false,\"model_type\":\"llama\",\"num_attention_heads\":9,"
    "\"num_hidden_layers\":30,\"num_key_value_heads\":3,\"pad_token_id\":2,"
    "\"pretraining_tp\":1,\"rms_norm_eps\":1e-05,\"rope_interleaved\":false,"
    "\"rope_scaling\":null,\"rope_theta\":100000,\"tie_word_embeddings\":true,"
    "\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.42.3\",\"use_cache\":true,"
    "\"vocab_size\":49152}";

static void assert_smol(const khub_model_config *c)
{
    ASSERT_EQ(c->arch, KHUB_ARCH_LLAMA);
    ASSERT_EQ(c->hidden_size, 576);
    ASSERT_EQ(c->intermediate_size, 1536);
    ASSERT_EQ(c->n_layers, 30);
    ASSERT_EQ(c->n_heads, 9);
    ASSERT_EQ(c->n_kv_heads, 3);
    ASSERT_EQ(c->head_dim, 64);
    ASSERT_EQ(c->vocab_size, 49152);
    ASSERT_EQ(c->max_position_embeddings, 8192);
    ASSERT(c->rope_theta == 100000.0);
    ASSERT_EQ(c->rope_scaling, KHUB_ROPE_SCALING_NONE);
    ASSERT(fabs(c->rms_norm_eps - 1e-5) < 1e-11);
    ASSERT(c->tie_word_embeddings);
    ASSERT(!c->attention_bias && !c->qk_norm);
    ASSERT_EQ(c->sliding_window, 0);
    ASSERT_EQ(c->bos_token_id, 1);
    ASSERT_EQ(c->n_eos, 1);
    ASSERT_EQ(c->eos_token_ids[0], 2);
    ASSERT_EQ(c->pad_token_id, 2);
}

TEST_IMPL(hf_smollm2)
{
    khub_model_config c;
    ASSERT_OK(from_json(NULL, smol_json, &c));
    assert_smol(&c);
    ASSERT_EQ(c.rope_style, KHUB_ROPE_NEOX);
    ASSERT_EQ(khub_dtype_id_of(c.torch_dtype), KHUB_DTYPE_ID_BF16);
}

TEST_IMPL(hf_llama31_rope_scaling)
{
    khub_model_config c;
    ASSERT_OK(from_json(
        NULL,
        "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":2048,"
        "\"intermediate_size\":8192,\"num_hidden_layers\":16,\"num_attention_heads\":32,"
        "\"num_key_value_heads\":8,\"vocab_size\":128256,\"rope_theta\":500000.0,"
        "\"rope_scaling\":{\"factor\":32.0,\"high_freq_factor\":4.0,\"low_freq_factor\":1.0,"
        "\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"},"
        "\"eos_token_id\":[128001,128008,128009],\"bos_token_id\":128000}",
        &c));
    ASSERT_EQ(c.head_dim, 64); /* hidden / heads */
    ASSERT_EQ(c.rope_scaling, KHUB_ROPE_SCALING_LLAMA3);
    ASSERT(c.rope_factor == 32.0 && c.rope_low_freq_factor == 1.0);
    ASSERT(c.rope_high_freq_factor == 4.0);
    ASSERT_EQ(c.rope_original_max_pos, 8192);
    ASSERT_EQ(c.n_eos, 3);
    ASSERT_EQ(c.eos_token_ids[2], 128009);
    ASSERT(!c.tie_word_embeddings);
    ASSERT_EQ(c.pad_token_id, -1);
}

TEST_IMPL(hf_qwen_and_mistral)
{
    khub_model_config c;
    ASSERT_OK(
        from_json(NULL,
                  "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":1024,\"head_dim\":128,"
                  "\"intermediate_size\":3072,\"num_hidden_layers\":28,\"num_attention_heads\":16,"
                  "\"num_key_value_heads\":8,\"vocab_size\":151936,\"rope_theta\":1000000,"
                  "\"use_sliding_window\":false,\"sliding_window\":null,\"max_window_layers\":28,"
                  "\"tie_word_embeddings\":true,\"rms_norm_eps\":1e-06}",
                  &c));
    ASSERT_EQ(c.arch, KHUB_ARCH_QWEN3);
    ASSERT_EQ(c.head_dim, 128);
    ASSERT(c.qk_norm && !c.attention_bias);
    ASSERT_EQ(c.sliding_window, 0);

    ASSERT_OK(
        from_json(NULL,
                  "{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":896,"
                  "\"intermediate_size\":4864,\"num_hidden_layers\":24,\"num_attention_heads\":14,"
                  "\"num_key_value_heads\":2,\"vocab_size\":151936,\"use_sliding_window\":true,"
                  "\"sliding_window\":4096,\"max_window_layers\":21}",
                  &c));
    ASSERT_EQ(c.arch, KHUB_ARCH_QWEN2);
    ASSERT(c.attention_bias);
    ASSERT_EQ(c.head_dim, 64);
    ASSERT_EQ(c.sliding_window, 4096);
    ASSERT_EQ(c.sliding_from_layer, 21);

    ASSERT_OK(from_json(
        NULL,
        "{\"model_type\":\"mistral\",\"hidden_size\":4096,\"intermediate_size\":14336,"
        "\"num_hidden_layers\":32,\"num_attention_heads\":32,\"num_key_value_heads\":8,"
        "\"vocab_size\":32000,\"sliding_window\":4096,\"rope_scaling\":{\"type\":\"linear\","
        "\"factor\":2.0}}",
        &c));
    ASSERT_EQ(c.arch, KHUB_ARCH_MISTRAL);
    ASSERT_EQ(c.sliding_window, 4096);
    ASSERT_EQ(c.sliding_from_layer, 0);
    ASSERT_EQ(c.rope_scaling, KHUB_ROPE_SCALING_LINEAR);
    ASSERT(c.rope_factor == 2.0);
}

/* google/gemma-3-270m's config.json (Transformers 4.55 layout), less the
 * layer_types list, which gemma_json() writes for n layers. */
#define GEMMA3_HEAD \
    "{\"_sliding_window_pattern\":6,\"architectures\":[\"Gemma3ForCausalLM\"]," \
    "\"attention_bias\":false,\"attention_dropout\":0.0,\"attn_logit_softcapping\":null," \
    "\"bos_token_id\":2,\"eos_token_id\":1,\"final_logit_softcapping\":null,\"head_dim\":256," \
    "\"hidden_activation\":\"gelu_pytorch_tanh\",\"hidden_size\":640," \
    "\"initializer_range\":0.02,\"intermediate_size\":2048,\"max_position_embeddings\":32768," \
    "\"model_type\":\"gemma3_text\",\"num_attention_heads\":4,\"num_key_value_heads\":1," \
    "\"pad_token_id\":0,\"query_pre_attn_scalar\":256,\"rms_norm_eps\":1e-06," \
    "\"rope_local_base_freq\":10000.0,\"rope_scaling\":null,\"rope_theta\":1000000.0," \
    "\"sliding_window\":512,\"torch_dtype\":\"bfloat16\",\"use_bidirectional_attention\":false," \
    "\"use_cache\":true,\"vocab_size\":262144,"

/* GEMMA3_HEAD with num_hidden_layers n, layer_types from types ('s'
 * sliding, 'f' full, other: chunked, one letter a layer; NULL: none), and
 * the members of extra ("\"key\":value," ...) added or replacing the
 * head's. */
static char *gemma_json(const char *extra, int n, const char *types)
{
    static char buf[8192];
    int k = snprintf(buf, sizeof buf, GEMMA3_HEAD "\"num_hidden_layers\":%d", n);
    if (types) {
        k += snprintf(buf + k, sizeof buf - (size_t)k, ",\"layer_types\":[");
        for (int i = 0; types[i]; i++)
            k += snprintf(buf + k, sizeof buf - (size_t)k, "%s\"%s_attention\"", i ? "," : "",
                          types[i] == 'f'   ? "full"
                          : types[i] == 's' ? "sliding"
                                            : "chunked");
        k += snprintf(buf + k, sizeof buf - (size_t)k, "]");
    }
    snprintf(buf + k, sizeof buf - (size_t)k, "}");
    cJSON *root = cJSON_Parse(buf);
    char more[4096];
    snprintf(more, sizeof more, "{%s\"_end\":0}", extra);
    cJSON *add = cJSON_Parse(more);
    ASSERT(root && add);
    for (cJSON *e = add->child; e; e = e->next) {
        if (!strcmp(e->string, "_end")) continue;
        cJSON_DeleteItemFromObjectCaseSensitive(root, e->string);
        cJSON_AddItemToObject(root, e->string, cJSON_Duplicate(e, 1));
    }
    char *out = cJSON_PrintUnformatted(root);
    snprintf(buf, sizeof buf, "%s", out);
    free(out);
    cJSON_Delete(add);
    cJSON_Delete(root);
    return buf;
}

/* Every Gemma 3 knob from config.json: as published, in Transformers v5's
 * rope_parameters layout, and with the defaults Gemma3TextConfig fills. */
TEST_IMPL(hf_gemma3)
{
    khub_model_config c;
    ASSERT_OK(from_json(NULL, gemma_json("", 18, "sssssfsssssfsssssf"), &c));
    ASSERT_STR_EQ(khub__model_arch_name(c.arch), "gemma3");
    ASSERT_EQ(c.head_dim, 256);
    ASSERT_EQ(c.n_kv_heads, 1);
    ASSERT_EQ(c.act, KHUB_ACT_GELU_TANH);
    ASSERT(c.qk_norm && c.post_norms && c.norm_plus_one && c.tie_word_embeddings);
    ASSERT(fabs(c.embed_scale - sqrt(640.0)) < 1e-12);
    ASSERT(fabs(c.attn_scale - 1.0 / 16) < 1e-12);
    ASSERT_EQ(c.sliding_window, 512);
    ASSERT_EQ(c.sliding_pattern, 6);
    ASSERT(c.rope_theta == 1000000.0 && c.rope_theta_local == 10000.0);
    ASSERT_EQ(c.rope_scaling, KHUB_ROPE_SCALING_NONE);
    ASSERT_EQ(c.bos_token_id, 2);
    ASSERT_EQ(c.eos_token_ids[0], 1);
    ASSERT_EQ(c.max_position_embeddings, 32768);

    /* v5: rope_parameters per layer type; linear scaling on the global
     * layers; query_pre_attn_scalar other than head_dim; no layer_types
     * (sliding_window_pattern 4). */
    ASSERT_OK(from_json(
        NULL,
        gemma_json("\"rope_parameters\":{\"full_attention\":{\"rope_type\":\"linear\","
                   "\"factor\":8.0,\"rope_theta\":1000000.0},\"sliding_attention\":{"
                   "\"rope_type\":\"default\",\"rope_theta\":5000.0}},\"sliding_window_pattern\":4,"
                   "\"query_pre_attn_scalar\":144,",
                   8, NULL),
        &c));
    ASSERT_EQ(c.rope_scaling, KHUB_ROPE_SCALING_LINEAR);
    ASSERT(c.rope_factor == 8.0 && c.rope_theta == 1000000.0 && c.rope_theta_local == 5000.0);
    ASSERT_EQ(c.sliding_pattern, 4);
    ASSERT(fabs(c.attn_scale - 1.0 / 12) < 1e-12);

    /* Only what Gemma3ForCausalLM requires: the rest from the defaults. */
    ASSERT_OK(from_json(NULL,
                        "{\"model_type\":\"gemma3_text\",\"hidden_size\":64,"
                        "\"intermediate_size\":128,\"num_hidden_layers\":7,"
                        "\"num_attention_heads\":2,\"vocab_size\":300}",
                        &c));
    ASSERT_EQ(c.head_dim, 256);
    ASSERT(c.rope_theta == 1000000.0 && c.rope_theta_local == 10000.0);
    ASSERT_EQ(c.sliding_window, 4096);
    ASSERT_EQ(c.sliding_pattern, 6);
    ASSERT(fabs(c.attn_scale - 1.0 / 16) < 1e-12);
    ASSERT(c.tie_word_embeddings);
    ASSERT_EQ(c.act, KHUB_ACT_GELU_TANH);
}

/* What a Gemma folder can ask for that khub does not compute: refused,
 * naming the key. */
TEST_IMPL(hf_gemma3_refusals)
{
    static const struct {
        const char *extra, *types;
        int n;
        khub_status st;
        const char *msg;
    } cases[] = {
        {"\"final_logit_softcapping\":-30.0,", NULL, 6, KHUB_STATUS_MODEL_INVALID,
         "config.json: final_logit_softcapping is -30; a soft-cap must be a positive number "
         "(or null for none)"},
        {"\"attn_logit_softcapping\":0,", NULL, 6, KHUB_STATUS_MODEL_INVALID,
         "config.json: attn_logit_softcapping is 0; a soft-cap must be a positive number"},
        {"\"attn_logit_softcapping\":\"50\",", NULL, 6, KHUB_STATUS_MODEL_INVALID,
         "config.json: attn_logit_softcapping is not a number"},
        {"\"hidden_activation\":\"gelu\",", NULL, 6, KHUB_STATUS_MODEL_UNSUPPORTED,
         "hidden_activation 'gelu' is not supported for Gemma 3 (supported: gelu_pytorch_tanh"},
        {"", "sssfssss", 8, KHUB_STATUS_MODEL_UNSUPPORTED,
         "config.json: layer_types[7] is sliding_attention; khub serves Gemma 3's regular "
         "pattern (every 4-th layer full_attention"},
        {"", "sxs", 3, KHUB_STATUS_MODEL_UNSUPPORTED, "layer_types[1] is not full_attention"},
        {"", "ss", 3, KHUB_STATUS_MODEL_INVALID, "layer_types is not a list of 3 strings"},
        {"\"use_bidirectional_attention\":true,", NULL, 6, KHUB_STATUS_MODEL_UNSUPPORTED,
         "use_bidirectional_attention is true"},
        {"\"query_pre_attn_scalar\":0,", NULL, 6, KHUB_STATUS_MODEL_INVALID,
         "query_pre_attn_scalar 0 is not positive"},
        {"\"text_config\":{},", NULL, 6, KHUB_STATUS_MODEL_UNSUPPORTED,
         "text_config is set: a multimodal checkpoint"},
        {"\"rope_parameters\":{\"full_attention\":{\"rope_type\":\"default\"},"
         "\"sliding_attention\":{\"rope_type\":\"linear\",\"factor\":2}},",
         NULL, 6, KHUB_STATUS_MODEL_UNSUPPORTED,
         "rope_parameters.sliding_attention.rope_type 'linear' is not supported"},
        {"\"rope_parameters\":{\"full_attention\":{\"rope_type\":\"default\"}},", NULL, 6,
         KHUB_STATUS_MODEL_INVALID, "rope_parameters needs both full_attention and"},
    };
    khub_runtime *rt = new_rt();
    /* Soft-caps (Gemma 2's knobs) are read; null is none. */
    khub_model_config cap;
    ASSERT_OK(from_json(
        rt, gemma_json("\"attn_logit_softcapping\":50,\"final_logit_softcapping\":30.0,", 6, NULL),
        &cap));
    ASSERT(cap.attn_softcap == 50.0 && cap.final_softcap == 30.0);
    ASSERT_OK(from_json(rt, gemma_json("", 6, NULL), &cap));
    ASSERT(cap.attn_softcap == 0.0 && cap.final_softcap == 0.0);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        khub_model_config c;
        khub_status st = from_json(rt, gemma_json(cases[i].extra, cases[i].n, cases[i].types), &c);
        if (st != cases[i].st || !strstr(khub_runtime_errmsg(rt), cases[i].msg))
            fprintf(stderr, "  case %zu: %s: %s\n", i, khub_status_name(st),
                    khub_runtime_errmsg(rt));
        ASSERT_STATUS(st, cases[i].st);
        ASSERT_CONTAINS(khub_runtime_errmsg(rt), cases[i].msg);
        khub__clear(rt);
    }
    khub_runtime_free(rt);
}

typedef struct reject_case {
    const char *json;
    khub_status st;
    const char *msg;
} reject_case;

#define BASE \
    "\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":2," \
    "\"num_attention_heads\":4,\"vocab_size\":100"
#define LLAMA "{\"architectures\":[\"LlamaForCausalLM\"]," BASE
static const reject_case rejects[] = {
    {"{\"architectures\":[\"GPT2LMHeadModel\"]," BASE "}", KHUB_STATUS_MODEL_UNSUPPORTED,
     "config.json: architectures[0] 'GPT2LMHeadModel' is not supported (supported: "
     "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
     "Gemma3ForCausalLM)"},
    {"{" BASE "}", KHUB_STATUS_MODEL_INVALID,
     "config.json: neither architectures nor model_type is given"},
    {"{\"model_type\":\"gemma\"," BASE "}", KHUB_STATUS_MODEL_UNSUPPORTED,
     "model_type 'gemma' is not supported"},
    {LLAMA ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0}}",
     KHUB_STATUS_MODEL_UNSUPPORTED, "config.json: rope_scaling.rope_type 'yarn' is not supported"},
    {LLAMA ",\"rope_scaling\":{\"type\":\"dynamic\",\"factor\":4.0}}",
     KHUB_STATUS_MODEL_UNSUPPORTED, "rope_scaling.type 'dynamic' is not supported"},
    {LLAMA ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0}}",
     KHUB_STATUS_MODEL_INVALID, "rope_scaling.low_freq_factor is missing"},
    {LLAMA ",\"rope_scaling\":{\"rope_type\":\"linear\"}}", KHUB_STATUS_MODEL_INVALID,
     "rope_scaling.factor is missing"},
    {LLAMA ",\"hidden_act\":\"gelu\"}", KHUB_STATUS_MODEL_UNSUPPORTED,
     "hidden_act 'gelu' is not supported"},
    {LLAMA ",\"quantization_config\":{\"quant_method\":\"gptq\"}}", KHUB_STATUS_MODEL_UNSUPPORTED,
     "quantization_config (quant_method 'gptq') is not supported"},
    {LLAMA ",\"partial_rotary_factor\":0.5}", KHUB_STATUS_MODEL_UNSUPPORTED,
     "partial_rotary_factor 0.5 is not supported"},
    {LLAMA ",\"torch_dtype\":\"float8_e4m3fn\"}", KHUB_STATUS_MODEL_UNSUPPORTED,
     "torch_dtype 'float8_e4m3fn' is not supported"},
    {"{\"architectures\":[\"LlamaForCausalLM\"],\"intermediate_size\":1,"
     "\"num_hidden_layers\":1,\"num_attention_heads\":1,\"vocab_size\":1}",
     KHUB_STATUS_MODEL_INVALID, "config.json: hidden_size is missing"},
    {LLAMA ",\"num_key_value_heads\":3}", KHUB_STATUS_MODEL_INVALID,
     "4 attention heads are not a multiple of 3 kv heads"},
    {LLAMA ",\"head_dim\":15}", KHUB_STATUS_MODEL_INVALID, "head_dim 15 is odd"},
    {LLAMA ",\"num_hidden_layers\":-2}", KHUB_STATUS_MODEL_INVALID,
     "config.json: duplicate key 'num_hidden_layers'"},
    {LLAMA ",\"rope_scaling\":{\"factor\":2,\"factor\":3,\"rope_type\":\"linear\"}}",
     KHUB_STATUS_MODEL_INVALID, "config.json: duplicate key 'factor'"},
    {"{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":1,"
     "\"num_hidden_layers\":-2,\"num_attention_heads\":1,\"vocab_size\":1}",
     KHUB_STATUS_MODEL_INVALID, "num_hidden_layers must be an integer in 1..1048576"},
    {"{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":1,"
     "\"num_hidden_layers\":\"2\",\"num_attention_heads\":1,\"vocab_size\":1}",
     KHUB_STATUS_MODEL_INVALID, "num_hidden_layers must be an integer"},
    {LLAMA ",\"rms_norm_eps\":0}", KHUB_STATUS_MODEL_INVALID, "rms_norm_eps 0 is not in (0, 1)"},
    {LLAMA ",\"tie_word_embeddings\":1}", KHUB_STATUS_MODEL_INVALID,
     "tie_word_embeddings is not true or false"},
    {LLAMA ",\"eos_token_id\":[1,2,3,4,5,6,7,8,9]}", KHUB_STATUS_MODEL_INVALID,
     "eos_token_id is not an integer or a list of at most 8 integers"},
    {LLAMA ",\"eos_token_id\":[1,\"x\"]}", KHUB_STATUS_MODEL_INVALID,
     "eos_token_id[1] is not a token id"},
    {LLAMA ",\"eos_token_id\":100}", KHUB_STATUS_MODEL_INVALID,
     "eos token id 100 is outside the vocabulary (100)"},
    {LLAMA ",\"layer_types\":[\"sliding_attention\",\"full_attention\"],\"sliding_window\":8}",
     KHUB_STATUS_MODEL_UNSUPPORTED, "full_attention at layer 1 after sliding layers"},
    {LLAMA ",\"layer_types\":[\"full_attention\"]}", KHUB_STATUS_MODEL_INVALID,
     "layer_types is not a list of 2 strings"},
    {LLAMA ",}", KHUB_STATUS_MODEL_INVALID, "config.json: not valid JSON"},
    {"[1]", KHUB_STATUS_MODEL_INVALID, "config.json: not a JSON object"},
    {"", KHUB_STATUS_MODEL_INVALID, "config.json: not valid JSON"},
};

TEST_IMPL(hf_rejections_name_the_field)
{
    khub_runtime *rt = new_rt();
    for (size_t i = 0; i < sizeof rejects / sizeof rejects[0]; i++) {
        khub_model_config c;
        c.hidden_size = 99;
        khub_status st = from_json(rt, rejects[i].json, &c);
        if (st != rejects[i].st || !strstr(khub_runtime_errmsg(rt), rejects[i].msg))
            fprintf(stderr, "  case %zu: %s: %s\n", i, khub_status_name(st),
                    khub_runtime_errmsg(rt));
        ASSERT_STATUS(st, rejects[i].st);
        ASSERT_CONTAINS(khub_runtime_errmsg(rt), rejects[i].msg);
        ASSERT_EQ(c.hidden_size, 0); /* zeroed on error */
        khub__clear(rt);
    }
    khub_runtime_free(rt);
}

TEST_IMPL(hf_dir_with_generation_config)
{
    khub_runtime *rt = new_rt();
    char dir[] = "/tmp/khub-cfg-XXXXXX";
    ASSERT(mkdtemp(dir) != NULL);
    char path[256];
    khub_model_config c;
    ASSERT_STATUS(khub__model_config_from_hf_dir(rt, dir, &c), KHUB_STATUS_NOT_FOUND);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "/config.json: cannot open");
    khub__clear(rt);
    snprintf(path, sizeof path, "%s/config.json", dir);
    ASSERT_EQ(fx_write_text(path, smol_json), 0);
    ASSERT_OK(khub__model_config_from_hf_dir(rt, dir, &c));
    assert_smol(&c);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    ASSERT_EQ(fx_write_text(path, "{\"bos_token_id\":1,\"eos_token_id\":[2,0],"
                                  "\"temperature\":0.2}"),
              0);
    ASSERT_OK(khub__model_config_from_hf_dir(rt, dir, &c));
    ASSERT_EQ(c.n_eos, 2);
    ASSERT_EQ(c.eos_token_ids[0], 2);
    ASSERT_EQ(c.eos_token_ids[1], 0);
    ASSERT_EQ(fx_write_text(path, "{\"eos_token_id\":99999}"), 0);
    ASSERT_STATUS(khub__model_config_from_hf_dir(rt, dir, &c), KHUB_STATUS_MODEL_INVALID);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt),
                    "generation_config.json: eos token id 99999 is outside the vocabulary");
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
    khub_runtime_free(rt);
}

/* ------------------------------------------------------------------------ */
/* GGUF                                                                     */
/* ------------------------------------------------------------------------ */

TEST_IMPL(gguf_golden_tiny_llama)
{
    khub_runtime *rt = new_rt();
    khub_gguf *g = NULL;
    ASSERT_OK(khub__gguf_open(rt, KHUB_SOURCE_DIR "/tests/golden/tiny_llama.gguf", &g));
    khub_model_config c;
    ASSERT_OK(khub__model_config_from_gguf(rt, g, &c));
    ASSERT_EQ(c.arch, KHUB_ARCH_LLAMA);
    ASSERT_EQ(c.rope_style, KHUB_ROPE_INTERLEAVED);
    ASSERT_EQ(c.hidden_size, 64);
    ASSERT_EQ(c.n_layers, 2);
    ASSERT_EQ(c.n_heads, 4);
    ASSERT_EQ(c.n_kv_heads, 2);
    ASSERT_EQ(c.head_dim, 16);
    ASSERT_EQ(c.intermediate_size, 128);
    ASSERT_EQ(c.vocab_size, 32);
    ASSERT_EQ(c.max_position_embeddings, 2048);
    ASSERT(c.rope_theta == 10000.0);
    ASSERT(fabs(c.rms_norm_eps - 1e-5) < 1e-11);
    ASSERT(c.tie_word_embeddings);
    ASSERT_EQ(c.bos_token_id, 1);
    ASSERT_EQ(c.n_eos, 1);
    ASSERT_EQ(c.eos_token_ids[0], 2);
    const khub_gguf_tensor *t;
    ASSERT_OK(khub__gguf_tensor_get(g, "blk.1.attn_k.weight", &t));
    ASSERT_EQ(t->ggml_type, KHUB_GGML_Q4_1);
    ASSERT_EQ(t->nbytes, 32 * 2 * 20);
    khub__gguf_close(g);
    khub_runtime_free(rt);
}

/* A GGUF with only metadata (no tensors) for arch tests. */
static void meta_gguf(fx_buf *b, const char *arch, int with_blocks)
{
    char k[64];
    fx_gguf_header(b, 3, 0, 5 + (with_blocks ? 1 : 0));
    fx_kv_str(b, "general.architecture", arch);
#define K(s) (snprintf(k, sizeof k, "%s.%s", arch, s), k)
    fx_kv_u32(b, K("embedding_length"), 256);
    fx_kv_u32(b, K("feed_forward_length"), 512);
    fx_kv_u32(b, K("attention.head_count"), 4);
    fx_kv_u32(b, K("vocab_size"), 1000);
    if (with_blocks) fx_kv_u32(b, K("block_count"), 3);
#undef K
}

TEST_IMPL(gguf_arches_and_refusals)
{
    khub_runtime *rt = new_rt();
    khub_model_config c;
    khub_gguf *g = NULL;
    fx_buf b = {0};
    meta_gguf(&b, "qwen3", 1);
    ASSERT_OK(khub__gguf_open_mem(rt, "q3.gguf", b.p, b.n, &g));
    ASSERT_OK(khub__model_config_from_gguf(rt, g, &c));
    ASSERT_EQ(c.arch, KHUB_ARCH_QWEN3);
    ASSERT_EQ(c.rope_style, KHUB_ROPE_NEOX);
    ASSERT(c.qk_norm);
    ASSERT_EQ(c.n_kv_heads, 4);
    ASSERT_EQ(c.head_dim, 64);
    ASSERT_EQ(c.n_eos, 0);
    khub__gguf_close(g);
    fx_free(&b);

    meta_gguf(&b, "gpt2", 1);
    ASSERT_OK(khub__gguf_open_mem(rt, "g2.gguf", b.p, b.n, &g));
    ASSERT_STATUS(khub__model_config_from_gguf(rt, g, &c), KHUB_STATUS_MODEL_UNSUPPORTED);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "g2.gguf: general.architecture 'gpt2' is not "
                                             "supported (supported: llama, qwen2, qwen3, "
                                             "gemma3)");
    khub__clear(rt);
    khub__gguf_close(g);
    fx_free(&b);

    meta_gguf(&b, "llama", 0);
    ASSERT_OK(khub__gguf_open_mem(rt, "nb.gguf", b.p, b.n, &g));
    ASSERT_STATUS(khub__model_config_from_gguf(rt, g, &c), KHUB_STATUS_MODEL_INVALID);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt),
                    "nb.gguf: metadata key 'llama.block_count' is missing");
    khub__clear(rt);
    khub__gguf_close(g);
    fx_free(&b);

    meta_gguf(&b, "llama", 1);
    b.p[16] = 7; /* metadata_kv_count 6 -> 7: one more pair follows */
    fx_kv_str(&b, "llama.rope.scaling.type", "yarn");
    ASSERT_OK(khub__gguf_open_mem(rt, "y.gguf", b.p, b.n, &g));
    ASSERT_STATUS(khub__model_config_from_gguf(rt, g, &c), KHUB_STATUS_MODEL_UNSUPPORTED);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "llama.rope.scaling.type 'yarn' is not supported");
    khub__gguf_close(g);
    fx_free(&b);
    khub_runtime_free(rt);
}

/* Gemma 3's knobs from a gemma3 GGUF: every sixth layer global, the local
 * RoPE base, GELU-tanh, post norms, sqrt(hidden) embeddings, q/k norms;
 * soft-capping keys refused by name. */
TEST_IMPL(gguf_gemma3)
{
    khub_runtime *rt = new_rt();
    khub_model_config c;
    khub_gguf *g = NULL;
    fx_buf b = {0};
    meta_gguf(&b, "gemma3", 1);
    b.p[16] = 9; /* three more pairs follow */
    fx_kv_u32(&b, "gemma3.attention.key_length", 256);
    fx_kv_u32(&b, "gemma3.attention.sliding_window", 512);
    fx_kv_f32(&b, "gemma3.rope.freq_base", 1000000.0f);
    ASSERT_OK(khub__gguf_open_mem(rt, "g3.gguf", b.p, b.n, &g));
    ASSERT_OK(khub__model_config_from_gguf(rt, g, &c));
    ASSERT_EQ(c.arch, KHUB_ARCH_GEMMA3);
    ASSERT_STR_EQ(khub__model_arch_name(c.arch), "gemma3");
    ASSERT_EQ(c.rope_style, KHUB_ROPE_NEOX);
    ASSERT(c.qk_norm && c.post_norms && !c.norm_plus_one);
    ASSERT_EQ(c.act, KHUB_ACT_GELU_TANH);
    ASSERT_EQ(c.head_dim, 256);
    ASSERT_EQ(c.sliding_window, 512);
    ASSERT_EQ(c.sliding_pattern, 6);
    ASSERT(fabs(c.rope_theta - 1e6) < 1e-3 && fabs(c.rope_theta_local - 1e4) < 1e-9);
    ASSERT(fabs(c.embed_scale - 16.0) < 1e-12);      /* sqrt(256) */
    ASSERT(fabs(c.attn_scale - 1.0 / 16.0) < 1e-12); /* 256^-0.5 */
    ASSERT(c.tie_word_embeddings);
    khub__gguf_close(g);
    fx_free(&b);

    meta_gguf(&b, "gemma3", 1);
    b.p[16] = 8; /* the key count: meta_gguf's and these two */
    fx_kv_f32(&b, "gemma3.final_logit_softcapping", 30.0f);
    fx_kv_f32(&b, "gemma3.attn_logit_softcapping", 50.0f);
    ASSERT_OK(khub__gguf_open_mem(rt, "cap.gguf", b.p, b.n, &g));
    ASSERT_OK(khub__model_config_from_gguf(rt, g, &c));
    ASSERT(c.final_softcap == 30.0 && c.attn_softcap == 50.0);
    khub__gguf_close(g);
    fx_free(&b);

    meta_gguf(&b, "gemma3", 1);
    b.p[16] = 7;
    fx_kv_f32(&b, "gemma3.attn_logit_softcapping", -1.0f);
    ASSERT_OK(khub__gguf_open_mem(rt, "cap.gguf", b.p, b.n, &g));
    ASSERT_STATUS(khub__model_config_from_gguf(rt, g, &c), KHUB_STATUS_MODEL_INVALID);
    ASSERT_STR_EQ(khub_runtime_errmsg(rt), "cap.gguf: gemma3.attn_logit_softcapping is -1; a "
                                           "soft-cap must be positive (0: none)");
    khub__clear(rt);
    khub__gguf_close(g);
    fx_free(&b);

    /* Llama-family configs keep the neutral values. */
    meta_gguf(&b, "llama", 1);
    ASSERT_OK(khub__gguf_open_mem(rt, "l.gguf", b.p, b.n, &g));
    ASSERT_OK(khub__model_config_from_gguf(rt, g, &c));
    ASSERT(!c.post_norms && c.act == KHUB_ACT_SILU && c.embed_scale == 1.0);
    ASSERT(c.attn_scale == 0 && c.sliding_pattern == 0 && c.rope_theta_local == 0);
    khub__gguf_close(g);
    fx_free(&b);
    khub_runtime_free(rt);
}

/* A Llama 3.2-shaped GGUF header (theta 500000, head_dim 64) with the given
 * rope_freqs.weight of n entries (n 0: none). */
static void llama3_gguf(fx_buf *b, const float *freqs, uint64_t n)
{
    fx_gguf_header(b, 3, n ? 1 : 0, 7);
    fx_kv_str(b, "general.architecture", "llama");
    fx_kv_u32(b, "llama.vocab_size", 128256);
    fx_kv_u32(b, "llama.embedding_length", 2048);
    fx_kv_u32(b, "llama.feed_forward_length", 8192);
    fx_kv_u32(b, "llama.attention.head_count", 32);
    fx_kv_u32(b, "llama.block_count", 16);
    fx_kv_f32(b, "llama.rope.freq_base", 500000.0f);
    if (n) {
        fx_tensor_info(b, "rope_freqs.weight", 1, &n, 0, 0);
        fx_align(b, 32);
        for (uint64_t i = 0; i < n; i++) fx_f32(b, freqs[i]);
    }
}

/* rope_freqs.weight of Llama 3.2 1B (factor 32, low 1, high 4, original
 * 8192, theta 500000, head_dim 64) as llama.cpp's convert_hf_to_gguf.py
 * computes it (float32 arithmetic, replayed with numpy). */
static const float llama32_freqs[32] = {
    1,           1,           1,  1,  1,  1,  1,  1,  1,  1,  1,  1,  1,  1,  1,  1.65132928f,
    3.29226279f, 9.66673088f, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32};

TEST_IMPL(gguf_llama3_rope_freqs)
{
    khub_runtime *rt = new_rt();
    khub_model_config c;
    khub_gguf *g = NULL;
    fx_buf b = {0};
    llama3_gguf(&b, llama32_freqs, 32);
    ASSERT_OK(khub__gguf_open_mem(rt, "l3.gguf", b.p, b.n, &g));
    khub_status st = khub__model_config_from_gguf(rt, g, &c);
    if (st) fprintf(stderr, "  %s\n", khub_runtime_errmsg(rt));
    ASSERT_OK(st);
    ASSERT_EQ(c.rope_scaling, KHUB_ROPE_SCALING_LLAMA3);
    ASSERT(c.rope_factor == 32.0 && c.rope_low_freq_factor == 1.0);
    ASSERT(c.rope_high_freq_factor == 4.0);
    ASSERT_EQ(c.rope_original_max_pos, 8192);
    khub__gguf_close(g);
    fx_free(&b);

    /* Without the tensor: no scaling. */
    llama3_gguf(&b, NULL, 0);
    ASSERT_OK(khub__gguf_open_mem(rt, "l3.gguf", b.p, b.n, &g));
    ASSERT_OK(khub__model_config_from_gguf(rt, g, &c));
    ASSERT_EQ(c.rope_scaling, KHUB_ROPE_SCALING_NONE);
    khub__gguf_close(g);
    fx_free(&b);

    /* Factors the llama3 rule does not give are refused at the entry. */
    float odd[32];
    memcpy(odd, llama32_freqs, sizeof odd);
    odd[16] = 3.5f;
    llama3_gguf(&b, odd, 32);
    ASSERT_OK(khub__gguf_open_mem(rt, "odd.gguf", b.p, b.n, &g));
    ASSERT_STATUS(khub__model_config_from_gguf(rt, g, &c), KHUB_STATUS_MODEL_UNSUPPORTED);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt),
                    "odd.gguf: tensor 'rope_freqs.weight'[16] is 3.5, llama3 scaling (factor 32, "
                    "low_freq_factor 1, high_freq_factor 4, original context 8192) gives 3.29");
    khub__clear(rt);
    khub__gguf_close(g);
    fx_free(&b);

    /* A tensor of the wrong length. */
    llama3_gguf(&b, llama32_freqs, 16);
    ASSERT_OK(khub__gguf_open_mem(rt, "short.gguf", b.p, b.n, &g));
    ASSERT_STATUS(khub__model_config_from_gguf(rt, g, &c), KHUB_STATUS_MODEL_INVALID);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt),
                    "short.gguf: tensor 'rope_freqs.weight' must be F32 [32] (head_dim / 2)");
    khub__gguf_close(g);
    fx_free(&b);
    khub_runtime_free(rt);
}

TEST_IMPL(real_smollm2_config)
{
    char path[1024];
    const char *dir = getenv("KHUB_MODEL_DIR");
    if (dir && *dir)
        snprintf(path, sizeof path, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir);
    else
        snprintf(path, sizeof path, "%s/.cache/khub/models/SmolLM2-135M-Instruct.Q4_1.gguf",
                 getenv("HOME") ? getenv("HOME") : "");
    struct stat sb;
    if (stat(path, &sb) != 0) TEST_SKIP("model absent: run tools/fetch-model.sh (%s)", path);
    khub_runtime *rt = new_rt();
    khub_gguf *g = NULL;
    ASSERT_OK(khub__gguf_open(rt, path, &g));
    khub_model_config c;
    ASSERT_OK(khub__model_config_from_gguf(rt, g, &c));
    assert_smol(&c);
    ASSERT_EQ(c.rope_style, KHUB_ROPE_INTERLEAVED);
    khub__gguf_close(g);
    khub_runtime_free(rt);
}

#define TEST_LIST(X) \
    X(hf_smollm2) \
    X(hf_llama31_rope_scaling) \
    X(hf_qwen_and_mistral) \
    X(hf_rejections_name_the_field) \
    X(hf_dir_with_generation_config) \
    X(gguf_golden_tiny_llama) \
    X(gguf_arches_and_refusals) \
    X(gguf_gemma3) \
    X(hf_gemma3) \
    X(hf_gemma3_refusals) \
    X(gguf_llama3_rope_freqs) \
    X(real_smollm2_config)
TEST_MAIN(TEST_LIST)
