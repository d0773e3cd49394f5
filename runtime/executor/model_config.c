/*
 * model_config.c: model hyper-parameters from HF config.json or GGUF
 * metadata (see model_config.h for the contract).
 *
 * Defaults follow Transformers' configuration classes (LlamaConfig,
 * MistralConfig, Qwen2Config, Qwen3Config, Gemma3TextConfig) where a field is
 * optional there. Fields that would change the math in ways khub does not
 * implement (quantization_config, partial rotary, YaRN and other RoPE
 * variants, an activation other than SiLU (Gemma: GELU-tanh), irregular
 * layer_types, logit soft-capping) are refused, not ignored: a
 * silently mis-run model is worse than a clear error.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mmap_file.h"
#include "model_config.h"

#define MAX_DIM    1048576.0 /* widths, layers, heads */
#define MAX_TOKENS 2147483647.0

const char *khub__model_arch_name(khub_model_arch arch)
{
    switch (arch) {
    case KHUB_ARCH_LLAMA: return "llama";
    case KHUB_ARCH_MISTRAL: return "mistral";
    case KHUB_ARCH_QWEN2: return "qwen2";
    case KHUB_ARCH_QWEN3: return "qwen3";
    case KHUB_ARCH_GEMMA3: return "gemma3";
    default: return "unknown";
    }
}

void khub__model_config_defaults(khub_model_config *c)
{
    memset(c, 0, sizeof *c);
    c->rope_style = KHUB_ROPE_NEOX;
    c->rope_theta = 10000.0;
    c->rope_scaling = KHUB_ROPE_SCALING_NONE;
    c->rope_factor = 1.0;
    c->rms_norm_eps = 1e-6;
    c->max_position_embeddings = 2048;
    c->bos_token_id = -1;
    c->pad_token_id = -1;
    c->torch_dtype = KHUB_DTYPE_F32;
    c->act = KHUB_ACT_SILU;
    c->embed_scale = 1.0;
}

/* The checks every source must pass, so the executor can trust the struct. */
khub_status khub__model_config_validate(khub_runtime *rt, const char *name, khub_model_config *c)
{
    if (c->n_kv_heads == 0) c->n_kv_heads = c->n_heads;
    if (c->head_dim == 0 && c->n_heads > 0) c->head_dim = c->hidden_size / c->n_heads;
    struct {
        const char *what;
        int64_t v;
        double max;
    } pos[] = {
        {"hidden size", c->hidden_size, MAX_DIM},
        {"intermediate size", c->intermediate_size, MAX_DIM},
        {"layer count", c->n_layers, MAX_DIM},
        {"head count", c->n_heads, MAX_DIM},
        {"kv head count", c->n_kv_heads, MAX_DIM},
        {"head_dim", c->head_dim, MAX_DIM},
        {"vocab size", c->vocab_size, MAX_TOKENS},
        {"context length", c->max_position_embeddings, MAX_TOKENS},
    };
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        KHUB_RETURN_IF(rt, pos[i].v < 1 || (double)pos[i].v > pos[i].max, KHUB_STATUS_MODEL_INVALID,
                       "%s: %s is %lld, must be in 1..%.0f", name, pos[i].what, (long long)pos[i].v,
                       pos[i].max);
    KHUB_RETURN_IF(rt, c->n_heads % c->n_kv_heads != 0, KHUB_STATUS_MODEL_INVALID,
                   "%s: %lld attention heads are not a multiple of %lld kv heads", name,
                   (long long)c->n_heads, (long long)c->n_kv_heads);
    KHUB_RETURN_IF(rt, c->head_dim % 2 != 0, KHUB_STATUS_MODEL_INVALID,
                   "%s: head_dim %lld is odd (RoPE rotates pairs)", name, (long long)c->head_dim);
    KHUB_RETURN_IF(rt, !(c->rms_norm_eps > 0 && c->rms_norm_eps < 1), KHUB_STATUS_MODEL_INVALID,
                   "%s: rms_norm_eps %g is not in (0, 1)", name, c->rms_norm_eps);
    KHUB_RETURN_IF(rt, !(c->rope_theta > 0 && isfinite(c->rope_theta)), KHUB_STATUS_MODEL_INVALID,
                   "%s: rope_theta %g is not a positive number", name, c->rope_theta);
    KHUB_RETURN_IF(rt, !(c->rope_factor > 0 && isfinite(c->rope_factor)), KHUB_STATUS_MODEL_INVALID,
                   "%s: rope scaling factor %g is not positive", name, c->rope_factor);
    KHUB_RETURN_IF(rt, c->bos_token_id >= c->vocab_size, KHUB_STATUS_MODEL_INVALID,
                   "%s: bos token id %d is outside the vocabulary (%lld)", name, c->bos_token_id,
                   (long long)c->vocab_size);
    for (int i = 0; i < c->n_eos; i++)
        KHUB_RETURN_IF(rt, c->eos_token_ids[i] >= c->vocab_size, KHUB_STATUS_MODEL_INVALID,
                       "%s: eos token id %d is outside the vocabulary (%lld)", name,
                       c->eos_token_ids[i], (long long)c->vocab_size);
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* JSON fields                                                              */
/* ======================================================================== */

/* The member key of obj; NULL when absent or JSON null. */
static const cJSON *field(const cJSON *obj, const char *key)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsNull(j) ? NULL : j;
}

/* An integer field in [lo, hi]. Absent (or null): *out unchanged, or
 * MODEL_INVALID when required. prefix names the enclosing object
 * ("rope_scaling.") or is "". */
static khub_status json_int(khub_runtime *rt, const char *name, const cJSON *obj,
                            const char *prefix, const char *key, bool required, double lo,
                            double hi, int64_t *out)
{
    const cJSON *j = field(obj, key);
    if (!j) {
        KHUB_RETURN_IF(rt, required, KHUB_STATUS_MODEL_INVALID, "%s: %s%s is missing", name, prefix,
                       key);
        return KHUB_STATUS_OK;
    }
    double d = cJSON_IsNumber(j) ? j->valuedouble : NAN;
    KHUB_RETURN_IF(rt, !(d >= lo && d <= hi) || d != floor(d), KHUB_STATUS_MODEL_INVALID,
                   "%s: %s%s must be an integer in %.0f..%.0f", name, prefix, key, lo, hi);
    *out = (int64_t)d;
    return KHUB_STATUS_OK;
}

static khub_status json_num(khub_runtime *rt, const char *name, const cJSON *obj,
                            const char *prefix, const char *key, bool required, double *out)
{
    const cJSON *j = field(obj, key);
    if (!j) {
        KHUB_RETURN_IF(rt, required, KHUB_STATUS_MODEL_INVALID, "%s: %s%s is missing", name, prefix,
                       key);
        return KHUB_STATUS_OK;
    }
    KHUB_RETURN_IF(rt, !cJSON_IsNumber(j) || !isfinite(j->valuedouble), KHUB_STATUS_MODEL_INVALID,
                   "%s: %s%s is not a number", name, prefix, key);
    *out = j->valuedouble;
    return KHUB_STATUS_OK;
}

static khub_status json_bool(khub_runtime *rt, const char *name, const cJSON *obj, const char *key,
                             bool *out)
{
    const cJSON *j = field(obj, key);
    if (!j) return KHUB_STATUS_OK;
    KHUB_RETURN_IF(rt, !cJSON_IsBool(j), KHUB_STATUS_MODEL_INVALID, "%s: %s is not true or false",
                   name, key);
    *out = cJSON_IsTrue(j);
    return KHUB_STATUS_OK;
}

/* A string field, or NULL when absent; a non-string is MODEL_INVALID. */
static khub_status json_str(khub_runtime *rt, const char *name, const cJSON *obj,
                            const char *prefix, const char *key, const char **out)
{
    const cJSON *j = field(obj, key);
    *out = NULL;
    if (!j) return KHUB_STATUS_OK;
    KHUB_RETURN_IF(rt, !cJSON_IsString(j), KHUB_STATUS_MODEL_INVALID, "%s: %s%s is not a string",
                   name, prefix, key);
    *out = j->valuestring;
    return KHUB_STATUS_OK;
}

/* bos/eos/pad token ids: eos is an int or a list of ints. */
static khub_status json_tokens(khub_runtime *rt, const char *name, const cJSON *obj,
                               khub_model_config *c)
{
    int64_t v = c->bos_token_id;
    KHUB_FORWARD_IF_ERROR(rt,
                          json_int(rt, name, obj, "", "bos_token_id", false, 0, MAX_TOKENS, &v));
    c->bos_token_id = (int32_t)v;
    v = c->pad_token_id;
    KHUB_FORWARD_IF_ERROR(rt,
                          json_int(rt, name, obj, "", "pad_token_id", false, 0, MAX_TOKENS, &v));
    c->pad_token_id = (int32_t)v;
    const cJSON *eos = field(obj, "eos_token_id");
    if (!eos) return KHUB_STATUS_OK;
    if (cJSON_IsNumber(eos)) {
        KHUB_FORWARD_IF_ERROR(rt,
                              json_int(rt, name, obj, "", "eos_token_id", true, 0, MAX_TOKENS, &v));
        c->eos_token_ids[0] = (int32_t)v;
        c->n_eos = 1;
        return KHUB_STATUS_OK;
    }
    int n = cJSON_IsArray(eos) ? cJSON_GetArraySize(eos) : -1;
    KHUB_RETURN_IF(rt, n < 0 || n > KHUB_MODEL_MAX_EOS, KHUB_STATUS_MODEL_INVALID,
                   "%s: eos_token_id is not an integer or a list of at most %d integers", name,
                   KHUB_MODEL_MAX_EOS);
    int i = 0;
    for (const cJSON *e = eos->child; e; e = e->next, i++) {
        double d = cJSON_IsNumber(e) ? e->valuedouble : -1;
        KHUB_RETURN_IF(rt, !(d >= 0 && d <= MAX_TOKENS) || d != floor(d), KHUB_STATUS_MODEL_INVALID,
                       "%s: eos_token_id[%d] is not a token id", name, i);
        c->eos_token_ids[i] = (int32_t)d;
    }
    c->n_eos = n;
    return KHUB_STATUS_OK;
}

static int cmp_cstr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Duplicate keys in any object of the tree are MODEL_INVALID: cJSON keeps
 * both and returns the first, while Python's json keeps the last, so a
 * duplicate would make khub and Transformers read different models. */
static khub_status check_dups(khub_runtime *rt, const char *name, const cJSON *j)
{
    for (const cJSON *c = j->child; c; c = c->next)
        if (c->child) KHUB_FORWARD_IF_ERROR(rt, check_dups(rt, name, c));
    if (!cJSON_IsObject(j)) return KHUB_STATUS_OK;
    size_t n = (size_t)cJSON_GetArraySize(j), i = 0;
    if (n < 2) return KHUB_STATUS_OK;
    const char **keys = khub__calloc(rt, n, sizeof *keys);
    KHUB_RETURN_IF(rt, !keys, KHUB_STATUS_NOMEM, "%s: out of memory", name);
    for (const cJSON *c = j->child; c && i < n; c = c->next) keys[i++] = c->string;
    qsort(keys, n, sizeof *keys, cmp_cstr);
    khub_status st = KHUB_STATUS_OK;
    for (i = 1; i < n && st == KHUB_STATUS_OK; i++)
        if (strcmp(keys[i - 1], keys[i]) == 0)
            st = khub__fail(rt, KHUB_STATUS_MODEL_INVALID, "%s: duplicate key '%.100s'", name,
                            keys[i]);
    khub__free(rt, keys, n * sizeof *keys);
    return st;
}

static khub_status parse_json(khub_runtime *rt, const char *name, const char *json, size_t len,
                              cJSON **out)
{
    *out = len ? cJSON_ParseWithLength(json, len) : NULL;
    KHUB_RETURN_IF(rt, !*out, KHUB_STATUS_MODEL_INVALID, "%s: not valid JSON", name);
    if (!cJSON_IsObject(*out)) {
        cJSON_Delete(*out);
        *out = NULL;
        return khub__fail(rt, KHUB_STATUS_MODEL_INVALID, "%s: not a JSON object", name);
    }
    khub_status st = check_dups(rt, name, *out);
    if (st != KHUB_STATUS_OK) {
        cJSON_Delete(*out);
        *out = NULL;
    }
    return st;
}

/* ======================================================================== */
/* config.json                                                              */
/* ======================================================================== */

static const struct {
    const char *cls, *model_type;
    khub_model_arch arch;
} hf_archs[] = {
    {"LlamaForCausalLM", "llama", KHUB_ARCH_LLAMA},
    {"MistralForCausalLM", "mistral", KHUB_ARCH_MISTRAL},
    {"Qwen2ForCausalLM", "qwen2", KHUB_ARCH_QWEN2},
    {"Qwen3ForCausalLM", "qwen3", KHUB_ARCH_QWEN3},
    {"Gemma3ForCausalLM", "gemma3_text", KHUB_ARCH_GEMMA3},
};
#define HF_SUPPORTED \
    "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM"

static khub_status hf_arch(khub_runtime *rt, const char *name, const cJSON *root,
                           khub_model_config *c)
{
    const cJSON *archs = field(root, "architectures");
    KHUB_RETURN_IF(rt, field(root, "text_config") != NULL, KHUB_STATUS_MODEL_UNSUPPORTED,
                   "%s: text_config is set: a multimodal checkpoint (such as "
                   "Gemma3ForConditionalGeneration); khub runs text-only folders "
                   "(supported: " HF_SUPPORTED ")",
                   name);
    if (archs) {
        const cJSON *a0 = cJSON_IsArray(archs) ? archs->child : NULL;
        KHUB_RETURN_IF(rt, !cJSON_IsString(a0), KHUB_STATUS_MODEL_INVALID,
                       "%s: architectures is not a non-empty list of strings", name);
        for (size_t i = 0; i < sizeof hf_archs / sizeof hf_archs[0]; i++)
            if (strcmp(a0->valuestring, hf_archs[i].cls) == 0) c->arch = hf_archs[i].arch;
        KHUB_RETURN_IF(rt, c->arch == KHUB_ARCH_UNKNOWN, KHUB_STATUS_MODEL_UNSUPPORTED,
                       "%s: architectures[0] '%.100s' is not supported (supported: " HF_SUPPORTED
                       ")",
                       name, a0->valuestring);
        return KHUB_STATUS_OK;
    }
    const char *mt;
    KHUB_FORWARD_IF_ERROR(rt, json_str(rt, name, root, "", "model_type", &mt));
    KHUB_RETURN_IF(rt, !mt, KHUB_STATUS_MODEL_INVALID,
                   "%s: neither architectures nor model_type is given", name);
    for (size_t i = 0; i < sizeof hf_archs / sizeof hf_archs[0]; i++)
        if (strcmp(mt, hf_archs[i].model_type) == 0) c->arch = hf_archs[i].arch;
    KHUB_RETURN_IF(rt, c->arch == KHUB_ARCH_UNKNOWN, KHUB_STATUS_MODEL_UNSUPPORTED,
                   "%s: model_type '%.100s' is not supported (supported: llama, mistral, qwen2, "
                   "qwen3, gemma3_text)",
                   name, mt);
    return KHUB_STATUS_OK;
}

/* rope_scaling (legacy) or rope_parameters (Transformers v5). */
static khub_status hf_rope(khub_runtime *rt, const char *name, const cJSON *root,
                           khub_model_config *c)
{
    KHUB_FORWARD_IF_ERROR(rt, json_num(rt, name, root, "", "rope_theta", false, &c->rope_theta));
    const char *pfx = "rope_scaling.";
    const cJSON *rs = field(root, "rope_scaling");
    const cJSON *rp = field(root, "rope_parameters");
    if (rp) {
        KHUB_RETURN_IF(rt, !cJSON_IsObject(rp), KHUB_STATUS_MODEL_INVALID,
                       "%s: rope_parameters is not an object", name);
        KHUB_FORWARD_IF_ERROR(
            rt, json_num(rt, name, rp, "rope_parameters.", "rope_theta", false, &c->rope_theta));
        rs = rp;
        pfx = "rope_parameters.";
    }
    if (!rs) return KHUB_STATUS_OK;
    KHUB_RETURN_IF(rt, !cJSON_IsObject(rs), KHUB_STATUS_MODEL_INVALID,
                   "%s: rope_scaling is not an object", name);
    const char *type, *key = "rope_type";
    KHUB_FORWARD_IF_ERROR(rt, json_str(rt, name, rs, pfx, "rope_type", &type));
    if (!type) {
        key = "type";
        KHUB_FORWARD_IF_ERROR(rt, json_str(rt, name, rs, pfx, "type", &type));
    }
    if (!type || strcmp(type, "default") == 0) return KHUB_STATUS_OK;
    if (strcmp(type, "linear") == 0) {
        c->rope_scaling = KHUB_ROPE_SCALING_LINEAR;
        return json_num(rt, name, rs, pfx, "factor", true, &c->rope_factor);
    }
    KHUB_RETURN_IF(rt, strcmp(type, "llama3") != 0, KHUB_STATUS_MODEL_UNSUPPORTED,
                   "%s: %s%s '%.60s' is not supported (supported: default, linear, llama3)", name,
                   pfx, key, type);
    c->rope_scaling = KHUB_ROPE_SCALING_LLAMA3;
    KHUB_FORWARD_IF_ERROR(rt, json_num(rt, name, rs, pfx, "factor", true, &c->rope_factor));
    KHUB_FORWARD_IF_ERROR(
        rt, json_num(rt, name, rs, pfx, "low_freq_factor", true, &c->rope_low_freq_factor));
    KHUB_FORWARD_IF_ERROR(
        rt, json_num(rt, name, rs, pfx, "high_freq_factor", true, &c->rope_high_freq_factor));
    KHUB_FORWARD_IF_ERROR(rt, json_int(rt, name, rs, pfx, "original_max_position_embeddings", true,
                                       1, MAX_TOKENS, &c->rope_original_max_pos));
    KHUB_RETURN_IF(
        rt, !(c->rope_high_freq_factor > c->rope_low_freq_factor && c->rope_low_freq_factor > 0),
        KHUB_STATUS_MODEL_INVALID, "%s: %shigh_freq_factor %g must exceed low_freq_factor %g > 0",
        name, pfx, c->rope_high_freq_factor, c->rope_low_freq_factor);
    return KHUB_STATUS_OK;
}

/* sliding_window / use_sliding_window / max_window_layers / layer_types. */
static khub_status hf_window(khub_runtime *rt, const char *name, const cJSON *root,
                             khub_model_config *c)
{
    int64_t win = 0;
    KHUB_FORWARD_IF_ERROR(
        rt, json_int(rt, name, root, "", "sliding_window", false, 0, MAX_TOKENS, &win));
    bool use = c->arch == KHUB_ARCH_MISTRAL;
    if (c->arch == KHUB_ARCH_QWEN2 || c->arch == KHUB_ARCH_QWEN3) {
        KHUB_FORWARD_IF_ERROR(rt, json_bool(rt, name, root, "use_sliding_window", &use));
        c->sliding_from_layer = 28; /* Qwen2Config's max_window_layers default */
        KHUB_FORWARD_IF_ERROR(rt, json_int(rt, name, root, "", "max_window_layers", false, 0,
                                           MAX_DIM, &c->sliding_from_layer));
    }
    c->sliding_window = use ? win : 0;
    if (c->sliding_window == 0) c->sliding_from_layer = 0;

    const cJSON *lt = field(root, "layer_types");
    if (!lt) return KHUB_STATUS_OK;
    KHUB_RETURN_IF(rt, !cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->n_layers,
                   KHUB_STATUS_MODEL_INVALID, "%s: layer_types is not a list of %lld strings", name,
                   (long long)c->n_layers);
    int64_t i = 0, first_sliding = -1;
    for (const cJSON *e = lt->child; e; e = e->next, i++) {
        bool full = cJSON_IsString(e) && strcmp(e->valuestring, "full_attention") == 0;
        bool sliding = cJSON_IsString(e) && strcmp(e->valuestring, "sliding_attention") == 0;
        KHUB_RETURN_IF(rt, !full && !sliding, KHUB_STATUS_MODEL_UNSUPPORTED,
                       "%s: layer_types[%lld] is not full_attention or sliding_attention", name,
                       (long long)i);
        if (sliding && first_sliding < 0) first_sliding = i;
        KHUB_RETURN_IF(rt, full && first_sliding >= 0, KHUB_STATUS_MODEL_UNSUPPORTED,
                       "%s: layer_types: full_attention at layer %lld after sliding layers is "
                       "not supported (only full layers, then sliding ones)",
                       name, (long long)i);
    }
    if (first_sliding < 0) {
        c->sliding_window = c->sliding_from_layer = 0;
        return KHUB_STATUS_OK;
    }
    KHUB_RETURN_IF(rt, win < 1, KHUB_STATUS_MODEL_INVALID,
                   "%s: layer_types has sliding_attention but sliding_window is not set", name);
    c->sliding_window = win;
    c->sliding_from_layer = first_sliding;
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* Gemma 3 (Gemma3ForCausalLM, model_type gemma3_text)                      */
/* ======================================================================== */

/* hidden_activation (Gemma's key; hidden_act when that is all there is):
 * the tanh approximation of GELU, as Transformers' gelu_pytorch_tanh and
 * gelu_new compute it. The exact erf GELU is another function: refused. */
static khub_status hf_gemma3_act(khub_runtime *rt, const char *name, const cJSON *root,
                                 khub_model_config *c)
{
    const char *act, *key = "hidden_activation";
    KHUB_FORWARD_IF_ERROR(rt, json_str(rt, name, root, "", key, &act));
    if (!act) KHUB_FORWARD_IF_ERROR(rt, json_str(rt, name, root, "", key = "hidden_act", &act));
    KHUB_RETURN_IF(rt, act && strcmp(act, "gelu_pytorch_tanh") != 0 && strcmp(act, "gelu_new") != 0,
                   KHUB_STATUS_MODEL_UNSUPPORTED,
                   "%s: %s '%.60s' is not supported for Gemma 3 (supported: gelu_pytorch_tanh, "
                   "gelu_new)",
                   name, key, act);
    c->act = KHUB_ACT_GELU_TANH;
    return KHUB_STATUS_OK;
}

/* Transformers v5 writes rope_parameters per layer type:
 * {"full_attention": {...}, "sliding_attention": {...}}. The full entry is
 * the global RoPE (scaling allowed, as hf_rope reads it); the sliding entry
 * must be plain RoPE and gives the local base. */
static khub_status hf_gemma3_rope(khub_runtime *rt, const char *name, const cJSON *root,
                                  khub_model_config *c)
{
    const cJSON *rp = field(root, "rope_parameters");
    const cJSON *full = rp ? field(rp, "full_attention") : NULL;
    const cJSON *local = rp ? field(rp, "sliding_attention") : NULL;
    if (!full && !local) return hf_rope(rt, name, root, c);
    KHUB_RETURN_IF(rt, !cJSON_IsObject(full) || !cJSON_IsObject(local), KHUB_STATUS_MODEL_INVALID,
                   "%s: rope_parameters needs both full_attention and sliding_attention objects",
                   name);
    cJSON *wrap = cJSON_CreateObject();
    KHUB_RETURN_IF(rt, !wrap, KHUB_STATUS_NOMEM, "%s: out of memory", name);
    cJSON_AddItemReferenceToObject(wrap, "rope_parameters", (cJSON *)full);
    khub_status st = hf_rope(rt, name, wrap, c);
    cJSON_Delete(wrap);
    KHUB_FORWARD_IF_ERROR(rt, st);
    const char *type;
    KHUB_FORWARD_IF_ERROR(
        rt, json_str(rt, name, local, "rope_parameters.sliding_attention.", "rope_type", &type));
    KHUB_RETURN_IF(rt, type && strcmp(type, "default") != 0, KHUB_STATUS_MODEL_UNSUPPORTED,
                   "%s: rope_parameters.sliding_attention.rope_type '%.60s' is not supported "
                   "(only default)",
                   name, type);
    return json_num(rt, name, local, "rope_parameters.sliding_attention.", "rope_theta", false,
                    &c->rope_theta_local);
}

/* The layer pattern: layer_types when given, else sliding_window_pattern
 * (or the older _sliding_window_pattern; Gemma3TextConfig's default 6).
 * khub serves the regular Gemma 3 pattern, every pattern-th layer global;
 * layer_types must spell one out, or it is refused naming the first layer
 * that breaks it. */
static khub_status hf_gemma3_layers(khub_runtime *rt, const char *name, const cJSON *root,
                                    khub_model_config *c)
{
    int64_t pattern = 6;
    KHUB_FORWARD_IF_ERROR(
        rt, json_int(rt, name, root, "", "_sliding_window_pattern", false, 1, MAX_DIM, &pattern));
    KHUB_FORWARD_IF_ERROR(
        rt, json_int(rt, name, root, "", "sliding_window_pattern", false, 1, MAX_DIM, &pattern));
    const cJSON *lt = field(root, "layer_types");
    if (lt) {
        KHUB_RETURN_IF(rt, !cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->n_layers,
                       KHUB_STATUS_MODEL_INVALID, "%s: layer_types is not a list of %lld strings",
                       name, (long long)c->n_layers);
        pattern = 0;
        int64_t i = 0;
        for (const cJSON *e = lt->child; e; e = e->next, i++) {
            bool full = cJSON_IsString(e) && strcmp(e->valuestring, "full_attention") == 0;
            bool sliding = cJSON_IsString(e) && strcmp(e->valuestring, "sliding_attention") == 0;
            KHUB_RETURN_IF(rt, !full && !sliding, KHUB_STATUS_MODEL_UNSUPPORTED,
                           "%s: layer_types[%lld] is not full_attention or sliding_attention", name,
                           (long long)i);
            if (full && pattern == 0) pattern = i + 1;
            bool want_full = pattern > 0 && (i + 1) % pattern == 0;
            KHUB_RETURN_IF(rt, pattern > 0 && full != want_full, KHUB_STATUS_MODEL_UNSUPPORTED,
                           "%s: layer_types[%lld] is %s; khub serves Gemma 3's regular pattern "
                           "(every %lld-th layer full_attention, the rest sliding_attention)",
                           name, (long long)i, e->valuestring, (long long)pattern);
        }
        if (pattern == 0) pattern = c->n_layers + 1; /* every layer slides */
    }
    int64_t win = 4096; /* Gemma3TextConfig's default */
    KHUB_FORWARD_IF_ERROR(
        rt, json_int(rt, name, root, "", "sliding_window", false, 1, MAX_TOKENS, &win));
    c->sliding_window = pattern == 1 ? 0 : win;
    c->sliding_pattern = pattern == 1 ? 0 : pattern;
    c->sliding_from_layer = 0;
    return KHUB_STATUS_OK;
}

/* Logit soft-capping (Gemma 2: cap * tanh(x / cap)) of the attention
 * scores and of the final logits. Gemma 3 sets both to null (none); a
 * number must be a positive cap. */
static khub_status hf_softcaps(khub_runtime *rt, const char *name, const cJSON *root,
                               khub_model_config *c)
{
    static const char *const keys[] = {"attn_logit_softcapping", "final_logit_softcapping"};
    double *dst[] = {&c->attn_softcap, &c->final_softcap};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const cJSON *j = field(root, keys[i]);
        if (!j || cJSON_IsNull(j)) continue;
        double cap = 0;
        KHUB_FORWARD_IF_ERROR(rt, json_num(rt, name, root, "", keys[i], false, &cap));
        KHUB_RETURN_IF(rt, !(cap > 0), KHUB_STATUS_MODEL_INVALID,
                       "%s: %s is %g; a soft-cap must be a positive number (or null for none)",
                       name, keys[i], cap);
        *dst[i] = cap;
    }
    return KHUB_STATUS_OK;
}

/* Everything Gemma 3 sets beyond the Llama fields, with Gemma3TextConfig's
 * defaults where a key is absent. */
static khub_status hf_gemma3(khub_runtime *rt, const char *name, const cJSON *root,
                             khub_model_config *c)
{
    bool bidir = false;
    KHUB_FORWARD_IF_ERROR(rt, json_bool(rt, name, root, "use_bidirectional_attention", &bidir));
    KHUB_RETURN_IF(rt, bidir, KHUB_STATUS_MODEL_UNSUPPORTED,
                   "%s: use_bidirectional_attention is true (an encoder); khub runs causal "
                   "decoders only",
                   name);
    KHUB_FORWARD_IF_ERROR(rt, hf_softcaps(rt, name, root, c));
    KHUB_FORWARD_IF_ERROR(rt, hf_gemma3_layers(rt, name, root, c));
    c->rope_theta_local = 10000.0;
    KHUB_FORWARD_IF_ERROR(
        rt, json_num(rt, name, root, "", "rope_local_base_freq", false, &c->rope_theta_local));
    KHUB_FORWARD_IF_ERROR(rt, hf_gemma3_rope(rt, name, root, c));
    KHUB_RETURN_IF(rt, !(c->rope_theta_local > 0 && isfinite(c->rope_theta_local)),
                   KHUB_STATUS_MODEL_INVALID, "%s: rope_local_base_freq %g is not positive", name,
                   c->rope_theta_local);
    double scalar = 256; /* Gemma3TextConfig's default */
    KHUB_FORWARD_IF_ERROR(rt,
                          json_num(rt, name, root, "", "query_pre_attn_scalar", false, &scalar));
    KHUB_RETURN_IF(rt, !(scalar > 0), KHUB_STATUS_MODEL_INVALID,
                   "%s: query_pre_attn_scalar %g is not positive", name, scalar);
    c->attn_scale = 1.0 / sqrt(scalar);
    c->qk_norm = c->post_norms = c->norm_plus_one = true;
    c->embed_scale = sqrt((double)c->hidden_size);
    return KHUB_STATUS_OK;
}

/* Fields khub refuses rather than ignore. */
static khub_status hf_refusals(khub_runtime *rt, const char *name, const cJSON *root,
                               khub_model_config *c)
{
    const char *act, *dt;
    if (c->arch == KHUB_ARCH_GEMMA3) {
        KHUB_FORWARD_IF_ERROR(rt, hf_gemma3_act(rt, name, root, c));
    } else {
        KHUB_FORWARD_IF_ERROR(rt, json_str(rt, name, root, "", "hidden_act", &act));
        KHUB_RETURN_IF(rt, act && strcmp(act, "silu") != 0, KHUB_STATUS_MODEL_UNSUPPORTED,
                       "%s: hidden_act '%.60s' is not supported (supported: silu)", name, act);
    }
    const cJSON *q = field(root, "quantization_config");
    if (q) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(q, "quant_method");
        return khub__fail(rt, KHUB_STATUS_MODEL_UNSUPPORTED,
                          "%s: quantization_config (quant_method '%.60s') is not supported; use "
                          "an unquantized checkpoint or a GGUF file",
                          name, cJSON_IsString(m) ? m->valuestring : "?");
    }
    double prf = 1.0;
    KHUB_FORWARD_IF_ERROR(rt, json_num(rt, name, root, "", "partial_rotary_factor", false, &prf));
    KHUB_RETURN_IF(rt, prf != 1.0, KHUB_STATUS_MODEL_UNSUPPORTED,
                   "%s: partial_rotary_factor %g is not supported (only 1)", name, prf);

    KHUB_FORWARD_IF_ERROR(rt, json_str(rt, name, root, "", "torch_dtype", &dt));
    if (!dt) KHUB_FORWARD_IF_ERROR(rt, json_str(rt, name, root, "", "dtype", &dt));
    if (!dt) return KHUB_STATUS_OK;
    if (strcmp(dt, "float32") == 0)
        c->torch_dtype = KHUB_DTYPE_F32;
    else if (strcmp(dt, "float16") == 0)
        c->torch_dtype = KHUB_DTYPE_F16;
    else if (strcmp(dt, "bfloat16") == 0)
        c->torch_dtype = KHUB_DTYPE_BF16;
    else
        return khub__fail(rt, KHUB_STATUS_MODEL_UNSUPPORTED,
                          "%s: torch_dtype '%.40s' is not supported (supported: float32, "
                          "float16, bfloat16)",
                          name, dt);
    return KHUB_STATUS_OK;
}

static khub_status hf_shape(khub_runtime *rt, const char *name, const cJSON *root,
                            khub_model_config *c)
{
    struct {
        const char *key;
        bool req;
        double max;
        int64_t *out;
    } f[] = {
        {"hidden_size", true, MAX_DIM, &c->hidden_size},
        {"intermediate_size", true, MAX_DIM, &c->intermediate_size},
        {"num_hidden_layers", true, MAX_DIM, &c->n_layers},
        {"num_attention_heads", true, MAX_DIM, &c->n_heads},
        {"num_key_value_heads", false, MAX_DIM, &c->n_kv_heads},
        {"head_dim", false, MAX_DIM, &c->head_dim},
        {"vocab_size", true, MAX_TOKENS, &c->vocab_size},
        {"max_position_embeddings", false, MAX_TOKENS, &c->max_position_embeddings},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        KHUB_FORWARD_IF_ERROR(
            rt, json_int(rt, name, root, "", f[i].key, f[i].req, 1, f[i].max, f[i].out));
    KHUB_FORWARD_IF_ERROR(rt,
                          json_num(rt, name, root, "", "rms_norm_eps", false, &c->rms_norm_eps));
    KHUB_FORWARD_IF_ERROR(
        rt, json_bool(rt, name, root, "tie_word_embeddings", &c->tie_word_embeddings));
    KHUB_FORWARD_IF_ERROR(rt, json_bool(rt, name, root, "attention_bias", &c->attention_bias));
    KHUB_FORWARD_IF_ERROR(rt, json_bool(rt, name, root, "mlp_bias", &c->mlp_bias));
    if (c->arch == KHUB_ARCH_QWEN2) c->attention_bias = true; /* q/k/v bias, fixed in Qwen2 */
    if (c->arch == KHUB_ARCH_QWEN3) c->qk_norm = true;
    return KHUB_STATUS_OK;
}

khub_status khub__model_config_from_json(khub_runtime *rt, const char *name, const char *json,
                                         size_t len, khub_model_config *out)
{
    KHUB_API_CHECK(rt, out != NULL);
    memset(out, 0, sizeof *out);
    KHUB_API_CHECK(rt, name != NULL && (json != NULL || len == 0));
    khub_model_config c;
    khub__model_config_defaults(&c);
    cJSON *root;
    KHUB_FORWARD_IF_ERROR(rt, parse_json(rt, name, json, len, &root));
    khub_status st = hf_arch(rt, name, root, &c);
    bool gemma = c.arch == KHUB_ARCH_GEMMA3;
    if (gemma) { /* Gemma3TextConfig's defaults for the keys hf_shape reads */
        c.head_dim = 256;
        c.rope_theta = 1000000.0;
        c.max_position_embeddings = 131072;
        c.tie_word_embeddings = true;
    }
    if (st == KHUB_STATUS_OK) st = hf_refusals(rt, name, root, &c);
    if (st == KHUB_STATUS_OK) st = hf_shape(rt, name, root, &c);
    if (st == KHUB_STATUS_OK && !gemma) st = hf_rope(rt, name, root, &c);
    if (st == KHUB_STATUS_OK && !gemma) st = hf_window(rt, name, root, &c);
    if (st == KHUB_STATUS_OK && gemma) st = hf_gemma3(rt, name, root, &c);
    if (st == KHUB_STATUS_OK) st = json_tokens(rt, name, root, &c);
    cJSON_Delete(root);
    if (st == KHUB_STATUS_OK) st = khub__model_config_validate(rt, name, &c);
    if (st == KHUB_STATUS_OK) *out = c;
    return st;
}

khub_status khub__model_config_apply_generation(khub_runtime *rt, const char *name,
                                                const char *json, size_t len,
                                                khub_model_config *cfg)
{
    KHUB_API_CHECK(rt, cfg != NULL && name != NULL && (json != NULL || len == 0));
    cJSON *root;
    KHUB_FORWARD_IF_ERROR(rt, parse_json(rt, name, json, len, &root));
    khub_model_config c = *cfg;
    khub_status st = json_tokens(rt, name, root, &c);
    cJSON_Delete(root);
    if (st == KHUB_STATUS_OK) st = khub__model_config_validate(rt, name, &c);
    if (st == KHUB_STATUS_OK) *cfg = c;
    return st;
}

/* Reads dir/file into a mapping; NOT_FOUND (message set) when absent. */
static khub_status map_in_dir(khub_runtime *rt, const char *dir, const char *file, char *path,
                              size_t n, khub_mmap *m)
{
    int w = snprintf(path, n, "%s/%s", dir, file);
    KHUB_RETURN_IF(rt, w < 0 || (size_t)w >= n, KHUB_STATUS_INVALID_ARG, "%s: path too long", dir);
    return khub__mmap_open(rt, path, m);
}

khub_status khub__model_config_from_hf_dir(khub_runtime *rt, const char *dir,
                                           khub_model_config *out)
{
    KHUB_API_CHECK(rt, out != NULL);
    memset(out, 0, sizeof *out);
    KHUB_API_CHECK(rt, dir != NULL);
    char path[4096];
    khub_mmap m;
    KHUB_FORWARD_IF_ERROR(rt, map_in_dir(rt, dir, "config.json", path, sizeof path, &m));
    khub_status st = khub__model_config_from_json(rt, path, (const char *)m.data, m.size, out);
    khub__mmap_close(rt, &m);
    if (st != KHUB_STATUS_OK) return st;

    int w = snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (w < 0 || (size_t)w >= sizeof path || access(path, F_OK) != 0) return KHUB_STATUS_OK;
    KHUB_FORWARD_IF_ERROR(rt, khub__mmap_open(rt, path, &m));
    st = khub__model_config_apply_generation(rt, path, (const char *)m.data, m.size, out);
    khub__mmap_close(rt, &m);
    if (st != KHUB_STATUS_OK) memset(out, 0, sizeof *out);
    return st;
}
