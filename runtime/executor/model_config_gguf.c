/*
 * model_config_gguf.c: model hyper-parameters from GGUF metadata
 * ("<arch>.embedding_length" and the rest; see model_config.h for the
 * contract). The defaults and the final validation are model_config.c's,
 * shared with config.json.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model_config.h"

#define MAX_TOKENS 2147483647.0 /* as model_config.c */

/* ======================================================================== */
/* GGUF metadata                                                            */
/* ======================================================================== */

/* An optional u32 key "<arch>.<suffix>" or a full key (suffix NULL). */
static khub_status gguf_opt_i64(const khub_gguf *g, const char *arch, const char *suffix,
                                bool required, int64_t *out)
{
    char key[128];
    if (arch)
        snprintf(key, sizeof key, "%s.%s", arch, suffix);
    else
        snprintf(key, sizeof key, "%s", suffix);
    if (!required && !khub__gguf_find(g, key)) return KHUB_STATUS_OK;
    uint32_t v;
    khub_status st = khub__gguf_get_u32(g, key, &v);
    if (st == KHUB_STATUS_NOT_FOUND) st = KHUB_STATUS_MODEL_INVALID; /* a required key */
    if (st != KHUB_STATUS_OK) return st;
    *out = v;
    return KHUB_STATUS_OK;
}

static khub_status gguf_opt_f64(const khub_gguf *g, const char *arch, const char *suffix,
                                double *out)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!khub__gguf_find(g, key)) return KHUB_STATUS_OK;
    return khub__gguf_get_f64(g, key, out);
}

static khub_status gguf_arch(khub_runtime *rt, const khub_gguf *g, khub_model_config *c,
                             char arch[16])
{
    const char *s;
    size_t len;
    khub_status st = khub__gguf_get_str(g, "general.architecture", &s, &len);
    if (st == KHUB_STATUS_NOT_FOUND) st = KHUB_STATUS_MODEL_INVALID;
    if (st != KHUB_STATUS_OK) return st;
    static const struct {
        const char *name;
        khub_model_arch arch;
    } known[] = {{"llama", KHUB_ARCH_LLAMA},
                 {"qwen2", KHUB_ARCH_QWEN2},
                 {"qwen3", KHUB_ARCH_QWEN3},
                 {"gemma3", KHUB_ARCH_GEMMA3}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (len == strlen(known[i].name) && memcmp(s, known[i].name, len) == 0) {
            c->arch = known[i].arch;
            snprintf(arch, 16, "%s", known[i].name);
        }
    KHUB_RETURN_IF(rt, c->arch == KHUB_ARCH_UNKNOWN, KHUB_STATUS_MODEL_UNSUPPORTED,
                   "%s: general.architecture '%.*s' is not supported (supported: llama, qwen2, "
                   "qwen3, gemma3)",
                   khub__gguf_path(g), (int)(len > 60 ? 60 : len), s);
    c->rope_style = c->arch == KHUB_ARCH_LLAMA ? KHUB_ROPE_INTERLEAVED : KHUB_ROPE_NEOX;
    c->attention_bias =
        c->arch == KHUB_ARCH_QWEN2 || khub__gguf_tensor_find(g, "blk.0.attn_q.bias") != NULL;
    c->qk_norm = c->arch == KHUB_ARCH_QWEN3 || c->arch == KHUB_ARCH_GEMMA3;
    c->tie_word_embeddings = khub__gguf_tensor_find(g, "output.weight") == NULL;
    return KHUB_STATUS_OK;
}

/* Llama 3's RoPE scaling in a GGUF: llama.cpp's converter stores it as
 * rope_freqs.weight, one divisor of each frequency (1 for high frequencies,
 * factor for low ones, a blend between), computed from factor,
 * low_freq_factor, high_freq_factor and original_max_position_embeddings.
 * The rotary op takes those four numbers, so the tensor is matched against
 * the rule with factor = its largest entry, low 1 and high 4 (every Llama
 * 3.1-3.3 release) and the original context from
 * <arch>.rope.scaling.original_context_length or 8192; a tensor the rule
 * does not reproduce is refused with the first entry that differs. */
static khub_status gguf_rope_freqs(khub_runtime *rt, const khub_gguf *g, const char *arch,
                                   const khub_gguf_tensor *t, khub_model_config *c)
{
    const char *name = khub__gguf_path(g);
    int64_t half = c->head_dim / 2;
    KHUB_RETURN_IF(rt, t->ggml_type != KHUB_GGML_F32 || t->n_dims != 1 || t->ne[0] != half,
                   KHUB_STATUS_MODEL_INVALID,
                   "%s: tensor 'rope_freqs.weight' must be F32 [%lld] (head_dim / 2)", name,
                   (long long)half);
    double factor = 0;
    for (int64_t j = 0; j < half; j++) {
        float v;
        memcpy(&v, (const uint8_t *)t->data + 4 * j, sizeof v);
        factor = v > factor ? v : factor;
    }
    KHUB_RETURN_IF(rt, !(factor >= 1 && factor <= 1024), KHUB_STATUS_MODEL_INVALID,
                   "%s: tensor 'rope_freqs.weight': largest factor %g is not in [1, 1024]", name,
                   factor);
    int64_t orig = 8192;
    KHUB_FORWARD_IF_ERROR(
        rt, gguf_opt_i64(g, arch, "rope.scaling.original_context_length", false, &orig));
    KHUB_RETURN_IF(rt, orig < 1 || orig > MAX_TOKENS, KHUB_STATUS_MODEL_INVALID,
                   "%s: %s.rope.scaling.original_context_length %lld is out of range", name, arch,
                   (long long)orig);
    const double lo = 1, hi = 4, pi = 3.14159265358979323846;
    for (int64_t j = 0; j < half; j++) {
        double inv = pow(c->rope_theta, -(double)(2 * j) / (double)c->head_dim);
        double wavelen = 2 * pi / inv, want = 1;
        if (wavelen > (double)orig / lo) {
            want = factor;
        } else if (wavelen >= (double)orig / hi) {
            double smooth = ((double)orig / wavelen - lo) / (hi - lo);
            want = 1 / ((1 - smooth) / factor + smooth);
        }
        float got;
        memcpy(&got, (const uint8_t *)t->data + 4 * j, sizeof got);
        KHUB_RETURN_IF(rt, fabs((double)got - want) > 1e-4 * want, KHUB_STATUS_MODEL_UNSUPPORTED,
                       "%s: tensor 'rope_freqs.weight'[%lld] is %g, llama3 scaling (factor %g, "
                       "low_freq_factor 1, high_freq_factor 4, original context %lld) gives %g; "
                       "other per-frequency factors are not supported",
                       name, (long long)j, (double)got, factor, (long long)orig, want);
    }
    c->rope_scaling = KHUB_ROPE_SCALING_LLAMA3;
    c->rope_factor = factor;
    c->rope_low_freq_factor = lo;
    c->rope_high_freq_factor = hi;
    c->rope_original_max_pos = orig;
    return KHUB_STATUS_OK;
}

static khub_status gguf_rope(khub_runtime *rt, const khub_gguf *g, const char *arch,
                             khub_model_config *c)
{
    const char *name = khub__gguf_path(g);
    KHUB_FORWARD_IF_ERROR(rt, gguf_opt_f64(g, arch, "rope.freq_base", &c->rope_theta));
    int64_t rot = c->head_dim;
    KHUB_FORWARD_IF_ERROR(rt, gguf_opt_i64(g, arch, "rope.dimension_count", false, &rot));
    KHUB_RETURN_IF(rt, rot != c->head_dim, KHUB_STATUS_MODEL_UNSUPPORTED,
                   "%s: %s.rope.dimension_count %lld differs from head_dim %lld (partial rotary "
                   "is not supported)",
                   name, arch, (long long)rot, (long long)c->head_dim);
    if (khub__gguf_tensor_find(g, "rope_freqs.weight"))
        return gguf_rope_freqs(rt, g, arch, khub__gguf_tensor_find(g, "rope_freqs.weight"), c);
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    if (!khub__gguf_find(g, key)) return KHUB_STATUS_OK;
    const char *s;
    size_t len;
    KHUB_FORWARD_IF_ERROR(rt, khub__gguf_get_str(g, key, &s, &len));
    if (len == 4 && memcmp(s, "none", 4) == 0) return KHUB_STATUS_OK;
    KHUB_RETURN_IF(rt, !(len == 6 && memcmp(s, "linear", 6) == 0), KHUB_STATUS_MODEL_UNSUPPORTED,
                   "%s: %s '%.*s' is not supported (supported: none, linear)", name, key,
                   (int)(len > 40 ? 40 : len), s);
    c->rope_scaling = KHUB_ROPE_SCALING_LINEAR;
    snprintf(key, sizeof key, "%s.rope.scaling.factor", arch);
    return khub__gguf_get_f64(g, key, &c->rope_factor);
}

/* The soft-caps a converter wrote (llama.cpp's %s.attn_logit_softcapping and
 * %s.final_logit_softcapping, f32; Gemma 3 files have none): > 0 each. */
static khub_status gguf_softcaps(khub_runtime *rt, const khub_gguf *g, khub_model_config *c)
{
    const char *name = khub__gguf_path(g);
    static const char *const keys[] = {"attn_logit_softcapping", "attention.logit_softcapping",
                                       "final_logit_softcapping"};
    double *dst[] = {&c->attn_softcap, &c->attn_softcap, &c->final_softcap};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        double cap = 0;
        KHUB_FORWARD_IF_ERROR(rt, gguf_opt_f64(g, "gemma3", keys[i], &cap));
        KHUB_RETURN_IF(rt, !(cap >= 0) || !isfinite(cap), KHUB_STATUS_MODEL_INVALID,
                       "%s: gemma3.%s is %g; a soft-cap must be positive (0: none)", name, keys[i],
                       cap);
        if (cap > 0) *dst[i] = cap;
    }
    return KHUB_STATUS_OK;
}

/* Gemma 3's knobs. The GGUF stores only the sliding window (and, when a
 * converter wrote them, the soft-caps); the local RoPE base (10000), the
 * pattern (every sixth layer global) and the attention scale are what
 * llama.cpp (src/llama-model.cpp) and Transformers' Gemma3TextConfig
 * defaults fix for every Gemma 3 file. */
static khub_status gguf_gemma3(khub_runtime *rt, const khub_gguf *g, khub_model_config *c)
{
    const char *name = khub__gguf_path(g);
    KHUB_FORWARD_IF_ERROR(rt, gguf_softcaps(rt, g, c));
    KHUB_RETURN_IF(rt, c->rope_scaling != KHUB_ROPE_SCALING_NONE, KHUB_STATUS_MODEL_UNSUPPORTED,
                   "%s: gemma3.rope.scaling is set; RoPE scaling of Gemma 3's global layers is "
                   "not supported",
                   name);
    int64_t win = 0;
    KHUB_FORWARD_IF_ERROR(rt, gguf_opt_i64(g, "gemma3", "attention.sliding_window", false, &win));
    c->sliding_window = win;
    c->sliding_pattern = win > 0 ? 6 : 0;
    c->rope_theta_local = 10000.0;
    c->post_norms = true;
    c->act = KHUB_ACT_GELU_TANH;
    c->embed_scale = sqrt((double)c->hidden_size);
    /* llama.cpp: the 27B (62 layers) scales by hidden / heads, the rest by head_dim. */
    double scalar =
        c->n_layers == 62 ? (double)c->hidden_size / (double)c->n_heads : (double)c->head_dim;
    c->attn_scale = 1.0 / sqrt(scalar);
    return KHUB_STATUS_OK;
}

static khub_status gguf_tokens(khub_runtime *rt, const khub_gguf *g, khub_model_config *c)
{
    int64_t v = -1;
    KHUB_FORWARD_IF_ERROR(rt, gguf_opt_i64(g, NULL, "tokenizer.ggml.bos_token_id", false, &v));
    c->bos_token_id = (int32_t)v;
    v = -1;
    KHUB_FORWARD_IF_ERROR(rt, gguf_opt_i64(g, NULL, "tokenizer.ggml.padding_token_id", false, &v));
    c->pad_token_id = (int32_t)v;
    static const char *const eos_keys[] = {"tokenizer.ggml.eos_token_id",
                                           "tokenizer.ggml.eot_token_id",
                                           "tokenizer.ggml.eom_token_id"};
    for (size_t i = 0; i < sizeof eos_keys / sizeof eos_keys[0]; i++) {
        v = -1;
        KHUB_FORWARD_IF_ERROR(rt, gguf_opt_i64(g, NULL, eos_keys[i], false, &v));
        bool dup = false;
        for (int j = 0; j < c->n_eos; j++) dup |= c->eos_token_ids[j] == v;
        if (v >= 0 && !dup) c->eos_token_ids[c->n_eos++] = (int32_t)v;
    }
    if (c->vocab_size == 0) {
        const khub_gguf_kv *tok = khub__gguf_find(g, "tokenizer.ggml.tokens");
        const khub_gguf_tensor *emb = khub__gguf_tensor_find(g, "token_embd.weight");
        if (tok && tok->type == KHUB_GGUF_ARRAY)
            c->vocab_size = (int64_t)tok->count;
        else if (emb && emb->n_dims == 2)
            c->vocab_size = emb->ne[1];
    }
    return KHUB_STATUS_OK;
}

khub_status khub__model_config_from_gguf(khub_runtime *rt, const khub_gguf *g,
                                         khub_model_config *out)
{
    KHUB_API_CHECK(rt, out != NULL);
    memset(out, 0, sizeof *out);
    KHUB_API_CHECK(rt, g != NULL);
    khub_model_config c;
    khub__model_config_defaults(&c);
    c.rms_norm_eps = 1e-5; /* llama.cpp's default */
    char arch[16];
    KHUB_FORWARD_IF_ERROR(rt, gguf_arch(rt, g, &c, arch));
    struct {
        const char *suffix;
        bool req;
        int64_t *out;
    } f[] = {
        {"embedding_length", true, &c.hidden_size},
        {"feed_forward_length", true, &c.intermediate_size},
        {"block_count", true, &c.n_layers},
        {"attention.head_count", true, &c.n_heads},
        {"attention.head_count_kv", false, &c.n_kv_heads},
        {"attention.key_length", false, &c.head_dim},
        {"context_length", false, &c.max_position_embeddings},
        {"vocab_size", false, &c.vocab_size},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        KHUB_FORWARD_IF_ERROR(rt, gguf_opt_i64(g, arch, f[i].suffix, f[i].req, f[i].out));
    if (c.head_dim == 0 && c.n_heads > 0) c.head_dim = c.hidden_size / c.n_heads;
    KHUB_FORWARD_IF_ERROR(
        rt, gguf_opt_f64(g, arch, "attention.layer_norm_rms_epsilon", &c.rms_norm_eps));
    KHUB_FORWARD_IF_ERROR(rt, gguf_rope(rt, g, arch, &c));
    if (c.arch == KHUB_ARCH_GEMMA3) KHUB_FORWARD_IF_ERROR(rt, gguf_gemma3(rt, g, &c));
    KHUB_FORWARD_IF_ERROR(rt, gguf_tokens(rt, g, &c));
    KHUB_FORWARD_IF_ERROR(rt, khub__model_config_validate(rt, khub__gguf_path(g), &c));
    *out = c;
    return KHUB_STATUS_OK;
}
