/*
 * test_model.c: model loading and the forward pass (runtime/executor/model.c,
 * forward.c, weights.c).
 *
 * Two kinds of model:
 *   - tiny random models written here as a Hugging Face folder (config.json +
 *     model.safetensors in F32, F16 or BF16, or two shards with
 *     model.safetensors.index.json), for Llama, Mistral (sliding window),
 *     Qwen2 (q/k/v bias) and Qwen3 (q/k norm), with and without rope_scaling:
 *     internal consistency (one prefill == token by token through the KV
 *     cache, several sequences in one batch == one at a time), the same
 *     logits from every dtype, from shards and from the GGUF llama.cpp's
 *     converter would make of them, quantize-at-load, and bad input (a
 *     missing tensor, a wrong shape);
 *   - tiny random GGUF files written here, one per weight type (F16, BF16,
 *     Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K, random blocks with sane
 *     scales), each against an F32 GGUF of its dequantized values;
 *   - the real SmolLM2-135M-Instruct (GGUF Q4_1 and its dequantized HF copy,
 *     made by tools/fetch-model.sh) against the Transformers fixtures in
 *     tests/fixtures (tools/make-reference.py), skipped when absent.
 */
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "executor.h"
#include "model_fixtures.h"
#include "ref_oracle.h"
#include "runner.h"

/* ======================================================================== */
/* Helpers                                                                  */
/* ======================================================================== */

static khub_runtime *runtime_threads(int n_threads)
{
    khub_runtime_opts o = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = n_threads};
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(&o, &rt));
    ASSERT_OK(khub_plugin_load_builtin(rt));
    return rt;
}

static khub_runtime *runtime(void) { return runtime_threads(2); }

/* Every role served by khub/ref-cpu: the numeric oracle, f32 compute. */
static khub_model_opts ref_opts(void)
{
    const char *r = "khub/ref-cpu";
    return (khub_model_opts){KHUB_STRUCT_INIT(khub_model_opts),
                             .attn_impl = r,
                             .quant = r,
                             .cache_impl = r,
                             .norm_impl = r,
                             .act_impl = r,
                             .rotary_impl = r,
                             .linear_impl = r};
}

static double rel_err(const float *a, const float *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        num = d > num ? d : num;
        den = fabs((double)b[i]) > den ? fabs((double)b[i]) : den;
    }
    return den > 0 ? num / den : num;
}

static int32_t argmax(const float *x, int64_t n)
{
    int32_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = (int32_t)i;
    return best;
}

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    ASSERT(buf && fread(buf, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    buf[n] = '\0';
    if (len) *len = (size_t)n;
    return buf;
}

/* ======================================================================== */
/* Tiny random models                                                       */
/* ======================================================================== */

enum { T_HIDDEN = 64, T_FFN = 128, T_LAYERS = 2, T_HEADS = 4, T_KV = 2, T_HD = 16, T_VOCAB = 256 };

typedef enum tiny_arch { TINY_LLAMA, TINY_QWEN2, TINY_QWEN3, TINY_MISTRAL } tiny_arch;

typedef struct tiny_tensor {
    char name[96];
    int64_t rows, cols; /* cols 0: a vector of rows */
} tiny_tensor;

static uint64_t rng_state = 88172645463325252ull;
static float frand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

/* Lists the tensors of a tiny model; `skip` is omitted, `bad` gets one more
 * row than it should. */
static int tiny_tensors(tiny_arch arch, tiny_tensor *t, const char *skip, const char *bad)
{
    int n = 0;
#define ADD(r, c, ...) \
    do { \
        snprintf(t[n].name, sizeof t[n].name, __VA_ARGS__); \
        t[n].rows = (r) + (bad && !strcmp(t[n].name, bad)); \
        t[n].cols = (c); \
        if (!skip || strcmp(t[n].name, skip)) n++; \
    } while (0)
    ADD(T_VOCAB, T_HIDDEN, "model.embed_tokens.weight");
    ADD(T_HIDDEN, 0, "model.norm.weight");
    for (int L = 0; L < T_LAYERS; L++) {
        const char *p = "model.layers";
        ADD(T_HIDDEN, 0, "%s.%d.input_layernorm.weight", p, L);
        ADD(T_HIDDEN, 0, "%s.%d.post_attention_layernorm.weight", p, L);
        ADD(T_HEADS * T_HD, T_HIDDEN, "%s.%d.self_attn.q_proj.weight", p, L);
        ADD(T_KV * T_HD, T_HIDDEN, "%s.%d.self_attn.k_proj.weight", p, L);
        ADD(T_KV * T_HD, T_HIDDEN, "%s.%d.self_attn.v_proj.weight", p, L);
        ADD(T_HIDDEN, T_HEADS * T_HD, "%s.%d.self_attn.o_proj.weight", p, L);
        if (arch == TINY_QWEN2) {
            ADD(T_HEADS * T_HD, 0, "%s.%d.self_attn.q_proj.bias", p, L);
            ADD(T_KV * T_HD, 0, "%s.%d.self_attn.k_proj.bias", p, L);
            ADD(T_KV * T_HD, 0, "%s.%d.self_attn.v_proj.bias", p, L);
        }
        if (arch == TINY_QWEN3) {
            ADD(T_HD, 0, "%s.%d.self_attn.q_norm.weight", p, L);
            ADD(T_HD, 0, "%s.%d.self_attn.k_norm.weight", p, L);
        }
        ADD(T_FFN, T_HIDDEN, "%s.%d.mlp.gate_proj.weight", p, L);
        ADD(T_FFN, T_HIDDEN, "%s.%d.mlp.up_proj.weight", p, L);
        ADD(T_HIDDEN, T_FFN, "%s.%d.mlp.down_proj.weight", p, L);
    }
#undef ADD
    return n;
}

/* What tiny_write puts on disk. Zero fields: F32, one file, no extras. */
typedef struct tiny_spec {
    tiny_arch arch;
    const char *skip, *bad; /* see tiny_tensors */
    const char *dtype;      /* "F32" (NULL), "F16" or "BF16": the stored dtype */
    int round8;             /* 1 = values rounded to 8 significant bits (exact in F16/BF16) */
    int shards;             /* 2 = two shards + model.safetensors.index.json */
    const char *extra;      /* more config.json members: ",\"sliding_window\":4" */
    const char *gguf;       /* also write the same weights as this GGUF file, as
                               llama.cpp's converter would, or NULL */
    int gguf_no_permute;    /* 1 = leave out the converter's Llama Q/K row permutation */
} tiny_spec;

/* v to 8 significant bits (round to nearest even), 0 below 2^-14: then the
 * F16 and BF16 encodings below are exact. */
static float round8(float v)
{
    if (fabsf(v) < 1.0f / 16384) return 0.0f;
    uint32_t u;
    memcpy(&u, &v, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&v, &u, 4);
    return v;
}

/* Encodes v (a round8 value) as dtype into out; returns the bytes written. */
static size_t encode(const char *dtype, float v, uint8_t *out)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    if (!strcmp(dtype, "F32")) {
        memcpy(out, &u, 4);
        return 4;
    }
    uint16_t h = (uint16_t)(u >> 16); /* BF16 */
    if (!strcmp(dtype, "F16")) {
        int e = (int)((u >> 23) & 0xff);
        h = (uint16_t)((u >> 16) & 0x8000u);
        if (e) h |= (uint16_t)(((e - 127 + 15) << 10) | ((u >> 13) & 0x3ffu));
    }
    memcpy(out, &h, 2);
    return 2;
}

/* Writes one safetensors file holding t[from, to) with their values. */
static void write_shard(const char *path, const tiny_tensor *t, float *const *vals, int from,
                        int to, const char *dtype)
{
    size_t esz = !strcmp(dtype, "F32") ? 4 : 2;
    char *hdr = malloc(16384);
    size_t hl = 0, off = 0;
    hl += (size_t)sprintf(hdr + hl, "{");
    for (int i = from; i < to; i++) {
        size_t bytes = (size_t)t[i].rows * (size_t)(t[i].cols ? t[i].cols : 1) * esz;
        char shape[48];
        if (t[i].cols)
            snprintf(shape, sizeof shape, "%lld,%lld", (long long)t[i].rows, (long long)t[i].cols);
        else
            snprintf(shape, sizeof shape, "%lld", (long long)t[i].rows);
        hl += (size_t)sprintf(hdr + hl,
                              "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],"
                              "\"data_offsets\":[%zu,%zu]}",
                              i > from ? "," : "", t[i].name, dtype, shape, off, off + bytes);
        off += bytes;
    }
    hl += (size_t)sprintf(hdr + hl, "}");
    while (hl % 8) hdr[hl++] = ' ';
    FILE *f = fopen(path, "wb");
    ASSERT(f);
    uint64_t len = hl;
    fwrite(&len, 8, 1, f);
    fwrite(hdr, 1, hl, f);
    for (int i = from; i < to; i++) {
        int64_t cnt = t[i].rows * (t[i].cols ? t[i].cols : 1);
        for (int64_t k = 0; k < cnt; k++) {
            uint8_t b[4];
            fwrite(b, 1, encode(dtype, vals[i][k], b), f);
        }
    }
    fclose(f);
    free(hdr);
}

/* The GGUF name of a Hugging Face tensor name, as convert_hf_to_gguf.py maps
 * it ("model.layers.1.self_attn.q_proj.weight" -> "blk.1.attn_q.weight"). */
static void gguf_name(const char *hf, char *out, size_t n)
{
    static const char *const map[][2] = {{"input_layernorm.weight", "attn_norm.weight"},
                                         {"post_attention_layernorm.weight", "ffn_norm.weight"},
                                         {"self_attn.q_proj.", "attn_q."},
                                         {"self_attn.k_proj.", "attn_k."},
                                         {"self_attn.v_proj.", "attn_v."},
                                         {"self_attn.o_proj.", "attn_output."},
                                         {"self_attn.q_norm.", "attn_q_norm."},
                                         {"self_attn.k_norm.", "attn_k_norm."},
                                         {"mlp.gate_proj.", "ffn_gate."},
                                         {"mlp.up_proj.", "ffn_up."},
                                         {"mlp.down_proj.", "ffn_down."}};
    if (!strcmp(hf, "model.embed_tokens.weight")) {
        snprintf(out, n, "token_embd.weight");
        return;
    }
    if (!strcmp(hf, "model.norm.weight")) {
        snprintf(out, n, "output_norm.weight");
        return;
    }
    int L = 0, used = 0;
    ASSERT(sscanf(hf, "model.layers.%d.%n", &L, &used) == 1 && used > 0);
    const char *rest = hf + used;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        size_t k = strlen(map[i][0]);
        if (!strncmp(rest, map[i][0], k)) {
            snprintf(out, n, "blk.%d.%s%s", L, map[i][1], rest + k);
            return;
        }
    }
    TEST_FAIL_("no GGUF name for %s", hf);
}

/* Writes the tensors t[0, n) with vals as an F32 GGUF of spec's architecture.
 * For Llama and Mistral the q/k rows are permuted as llama.cpp's converter
 * does (row h*hd + 2i + j <- row h*hd + j*hd/2 + i within each head), unless
 * spec->gguf_no_permute. */
static void write_gguf_copy(const tiny_spec *spec, const tiny_tensor *t, float *const *vals, int n)
{
    static const char *const garch[] = {"llama", "qwen2", "qwen3", "llama"};
    const char *arch = garch[spec->arch];
    int permute =
        (spec->arch == TINY_LLAMA || spec->arch == TINY_MISTRAL) && !spec->gguf_no_permute;
    fx_buf b = {0};
    char k[96];
    fx_gguf_header(&b, 3, (uint64_t)n, 10);
    fx_kv_str(&b, "general.architecture", arch);
#define K(s) (snprintf(k, sizeof k, "%s.%s", arch, s), k)
    fx_kv_u32(&b, K("embedding_length"), T_HIDDEN);
    fx_kv_u32(&b, K("feed_forward_length"), T_FFN);
    fx_kv_u32(&b, K("block_count"), T_LAYERS);
    fx_kv_u32(&b, K("attention.head_count"), T_HEADS);
    fx_kv_u32(&b, K("attention.head_count_kv"), T_KV);
    fx_kv_u32(&b, K("context_length"), 512);
    fx_kv_u32(&b, K("vocab_size"), T_VOCAB);
    fx_kv_f32(&b, K("attention.layer_norm_rms_epsilon"), 1e-5f);
    fx_kv_f32(&b, K("rope.freq_base"), 10000.0f);
#undef K
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        char name[96];
        gguf_name(t[i].name, name, sizeof name);
        uint64_t ne[2] = {(uint64_t)(t[i].cols ? t[i].cols : t[i].rows), (uint64_t)t[i].rows};
        fx_tensor_info(&b, name, t[i].cols ? 2 : 1, ne, 0, off);
        off += ((uint64_t)t[i].rows * (uint64_t)(t[i].cols ? t[i].cols : 1) * 4 + 31) / 32 * 32;
    }
    fx_align(&b, 32);
    for (int i = 0; i < n; i++) {
        int64_t rows = t[i].rows, cols = t[i].cols ? t[i].cols : 1;
        int qk =
            permute && (strstr(t[i].name, "q_proj.weight") || strstr(t[i].name, "k_proj.weight"));
        for (int64_t r = 0; r < rows; r++) {
            int64_t src = r;
            if (qk) { /* r = h*hd + 2i + j takes the HF row h*hd + j*hd/2 + i */
                int64_t h = r / T_HD, w = r % T_HD, ii = w / 2, jj = w % 2;
                src = h * T_HD + jj * (T_HD / 2) + ii;
            }
            for (int64_t c = 0; c < cols; c++) fx_f32(&b, vals[i][src * cols + c]);
        }
        fx_align(&b, 32);
    }
    ASSERT_EQ(fx_write_file(spec->gguf, &b), 0);
    fx_free(&b);
}

/* Writes dir/config.json and the safetensors of spec (scaled random weights,
 * the same values for the same tensor list whatever the dtype or sharding;
 * norms near 1) and returns dir. */
static const char *tiny_write(const tiny_spec *spec)
{
    static char dir[256];
    snprintf(dir, sizeof dir, "/tmp/khub-test-model-%d", (int)getpid());
    mkdir(dir, 0700);
    char path[320];
    static const char *const archs[] = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                                        "MistralForCausalLM"};
    static const char *const types[] = {"llama", "qwen2", "qwen3", "mistral"};
    const char *dtype = spec->dtype ? spec->dtype : "F32";
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    ASSERT(f);
    fprintf(f,
            "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", \"hidden_size\": %d, "
            "\"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d, "
            "\"num_key_value_heads\": %d, \"head_dim\": %d, \"vocab_size\": %d, "
            "\"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0, \"max_position_embeddings\": 512, "
            "\"tie_word_embeddings\": true, \"bos_token_id\": 1, \"eos_token_id\": 2, "
            "\"hidden_act\": \"silu\", \"torch_dtype\": \"%s\"%s}\n",
            archs[spec->arch], types[spec->arch], T_HIDDEN, T_FFN, T_LAYERS, T_HEADS, T_KV, T_HD,
            T_VOCAB,
            !strcmp(dtype, "F32")   ? "float32"
            : !strcmp(dtype, "F16") ? "float16"
                                    : "bfloat16",
            spec->extra ? spec->extra : "");
    fclose(f);

    static tiny_tensor t[64];
    int n = tiny_tensors(spec->arch, t, spec->skip, spec->bad);
    float *vals[64] = {0};
    rng_state = 88172645463325252ull;
    for (int i = 0; i < n; i++) {
        int vec = t[i].cols == 0;
        float scale = vec ? 0.1f : 1.0f / sqrtf((float)t[i].cols);
        int64_t cnt = t[i].rows * (vec ? 1 : t[i].cols);
        vals[i] = malloc((size_t)cnt * sizeof(float));
        for (int64_t k = 0; k < cnt; k++) {
            float v = frand() * scale + (vec && strstr(t[i].name, "norm") ? 1.0f : 0.0f);
            vals[i][k] = spec->round8 ? round8(v) : v;
        }
    }
    if (spec->shards == 2) {
        /* The embedding and the first layer in one file, the rest in the other. */
        int split = 1;
        while (split < n && !strstr(t[split].name, "layers.1.")) split++;
        snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", dir);
        write_shard(path, t, vals, 0, split, dtype);
        snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
        write_shard(path, t, vals, split, n, dtype);
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        f = fopen(path, "w");
        ASSERT(f);
        fprintf(f, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
        for (int i = 0; i < n; i++)
            fprintf(f, "%s\"%s\": \"model-0000%d-of-00002.safetensors\"", i ? ", " : "", t[i].name,
                    i < split ? 1 : 2);
        fprintf(f, "}}\n");
        fclose(f);
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        write_shard(path, t, vals, 0, n, dtype);
    }
    if (spec->gguf) write_gguf_copy(spec, t, vals, n);
    for (int i = 0; i < n; i++) free(vals[i]);
    return dir;
}

static const char *tiny_model(tiny_arch arch, const char *skip, const char *bad)
{
    tiny_spec spec = {arch, skip, bad, NULL, 0, 0, NULL, NULL, 0};
    return tiny_write(&spec);
}

static void tiny_cleanup(const char *dir)
{
    static const char *const files[] = {
        "config.json", "model.safetensors", "model.safetensors.index.json",
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    char path[320];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

/* Logits of the last of ids[0..n) fed one token per forward call. */
static void logits_incremental(khub_model *m, const int32_t *ids, int64_t n, float *out)
{
    ASSERT_OK(khub__forward_reset(m, 0));
    for (int64_t i = 0; i < n; i++) {
        khub__seg seg = {0, 0, i, 1};
        ASSERT_OK(khub__forward(m, ids + i, &seg, 1));
    }
    memcpy(out, m->logits, (size_t)m->cfg.vocab_size * sizeof *out);
}

static void check_consistency(const tiny_spec *spec)
{
    khub_runtime *rt = runtime();
    const char *dir = tiny_write(spec);
    khub_model_opts o = ref_opts();
    o.max_batch = 8; /* 13 tokens: the one-call path runs in two chunks */
    khub_model *m = NULL;
    ASSERT_OK(khub_model_load(rt, dir, &o, &m));
    int32_t ids[13] = {1, 17, 200, 3, 99, 45, 45, 45, 250, 7, 8, 128, 64};
    float a[T_VOCAB], b[T_VOCAB], c[T_VOCAB];
    ASSERT_OK(khub_model_logits(m, ids, 13, a));
    logits_incremental(m, ids, 13, b);
    ASSERT_LE(rel_err(b, a, T_VOCAB), 1e-5);
    /* A different prompt gives different logits (the test can fail). */
    ASSERT_OK(khub_model_logits(m, ids, 12, c));
    ASSERT(rel_err(c, a, T_VOCAB) > 1e-3);

    /* Two sequences in one batch equal each alone. */
    ASSERT_OK(khub__forward_reset(m, 0));
    ASSERT_OK(khub__forward_reset(m, 1));
    khub__seg segs[2] = {{0, 0, 0, 5}, {1, 0, 0, 3}};
    int32_t both[8] = {1, 17, 200, 3, 99, 1, 17, 200};
    ASSERT_OK(khub__forward(m, both, segs, 2));
    float s0[T_VOCAB], s1[T_VOCAB];
    memcpy(s0, m->logits, sizeof s0);
    memcpy(s1, m->logits + T_VOCAB, sizeof s1);
    ASSERT_OK(khub_model_logits(m, ids, 5, a));
    ASSERT_LE(rel_err(s0, a, T_VOCAB), 1e-5);
    ASSERT_OK(khub_model_logits(m, ids, 3, a));
    ASSERT_LE(rel_err(s1, a, T_VOCAB), 1e-5);
    /* A segment that does not continue its sequence is refused. */
    khub__seg gap = {1, 0, 7, 1};
    ASSERT_STATUS(khub__forward(m, ids, &gap, 1), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "sequence 1 continues at 7 but holds 3 tokens");

    khub_model_free(m);
    tiny_cleanup(dir);
    khub_runtime_free(rt);
}

/* The paged cache (issue 13) gives the dense cache's logits: a ragged batch
 * of three prompts in one forward call (blocks of 3 tokens, so every
 * sequence crosses blocks), then two decode steps of all three, then
 * sequence 1 released and run again on the blocks it gave back. A pool too
 * small for the batch fails with KV_FULL and its numbers. */
static void check_paged(const tiny_spec *spec)
{
    khub_runtime *rt = runtime();
    const char *dir = tiny_write(spec);
    khub_model_opts o = ref_opts();
    o.max_batch = 16;
    o.max_seqs = 3;
    khub_model *dense = NULL, *paged = NULL;
    ASSERT_OK(khub_model_load(rt, dir, &o, &dense));
    o.cache_impl = "khub/ref-cpu:paged_cache";
    o.kv_block_size = 3;
    ASSERT_OK(khub_model_load(rt, dir, &o, &paged));
    ASSERT_CONTAINS(khub_model_explain(paged),
                    "paged_attention[f32]: khub/ref-cpu 0.1.0 :: paged_attention\n    paired "
                    "with kv_cache khub/ref-cpu 0.1.0 :: paged_cache by KV layout paged_htd");
    int32_t ids[13] = {1, 17, 200, 3, 99, 45, 45, 45, 250, 7, 8, 128, 64};
    khub__seg segs[3] = {{0, 0, 0, 7}, {1, 0, 0, 2}, {2, 0, 0, 4}};
    khub_model *ms[2] = {dense, paged};
    float want[3 * T_VOCAB];
    for (int step = 0; step < 4; step++) {
        for (int k = 0; k < 2; k++) {
            if (step == 3) { /* sequence 1 again, from scratch, alone */
                ASSERT_OK(khub__forward_reset(ms[k], 1));
                khub__seg one = {1, 0, 0, 5};
                ASSERT_OK(khub__forward(ms[k], ids + 2, &one, 1));
            } else {
                ASSERT_OK(khub__forward(ms[k], ids, segs, 3));
            }
            int n = step == 3 ? 1 : 3;
            if (k == 0) memcpy(want, dense->logits, (size_t)n * T_VOCAB * sizeof(float));
            for (int s = 0; k == 1 && s < n; s++)
                ASSERT_LE(rel_err(paged->logits + s * T_VOCAB, want + s * T_VOCAB, T_VOCAB), 1e-6);
        }
        for (int s = 0; s < 3; s++) segs[s].pos0 += segs[s].n, segs[s].n = 1;
    }
    khub_model_free(paged);
    o.kv_num_blocks = 4; /* 12 tokens: the 7 + 2 + 4 of the batch need 3 + 1 + 2 blocks */
    ASSERT_OK(khub_model_load(rt, dir, &o, &paged));
    khub__seg first[3] = {{0, 0, 0, 7}, {1, 0, 0, 2}, {2, 0, 0, 4}};
    ASSERT_STATUS(khub__forward(paged, ids, first, 3), KHUB_STATUS_KV_FULL);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt),
                    "paged_cache.reserve: sequence 2 needs 2 more blocks of 3 tokens for 4 tokens, "
                    "the pool has 0 of 4 free");
    ASSERT_OK(khub__forward_reset(paged, 0)); /* gives its 3 blocks back */
    ASSERT_OK(khub__forward(paged, ids, first + 2, 1));
    khub_model_free(paged);
    khub_model_free(dense);
    tiny_cleanup(dir);
    khub_runtime_free(rt);
}

static void check_arch(tiny_arch arch, const char *extra)
{
    tiny_spec spec = {arch, NULL, NULL, NULL, 0, 0, extra, NULL, 0};
    check_consistency(&spec);
    check_paged(&spec);
}

TEST_IMPL(model_tiny_llama_prefill_equals_incremental) { check_arch(TINY_LLAMA, NULL); }
TEST_IMPL(model_tiny_qwen2_prefill_equals_incremental) { check_arch(TINY_QWEN2, NULL); }
TEST_IMPL(model_tiny_qwen3_prefill_equals_incremental) { check_arch(TINY_QWEN3, NULL); }

#define WINDOW_4    ",\"sliding_window\": 4"
#define ROPE_LINEAR ",\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 4.0}"
#define ROPE_LLAMA3 \
    ",\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, " \
    "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, " \
    "\"original_max_position_embeddings\": 64}"

/* Logits of the last of ids[0..n) for a tiny model of spec, on the
 * registry's default plugins. */
static void tiny_logits(const tiny_spec *spec, const int32_t *ids, int64_t n, float *out,
                        const char *want_explain)
{
    khub_runtime *rt = runtime();
    const char *dir = tiny_write(spec);
    khub_model *m = NULL;
    ASSERT_OK(khub_model_load(rt, dir, NULL, &m));
    if (want_explain) ASSERT_CONTAINS(khub_model_explain(m), want_explain);
    ASSERT_OK(khub_model_logits(m, ids, (size_t)n, out));
    khub_model_free(m);
    tiny_cleanup(dir);
    khub_runtime_free(rt);
}

/* The same weights as a Hugging Face folder and as the GGUF llama.cpp's
 * converter makes of it give the same logits, for Llama (whose GGUF q/k rows
 * are permuted for interleaved rotary), Qwen2 and Qwen3 (not permuted); a
 * Llama GGUF without the permutation gives other logits (the check can
 * fail). */
static void check_hf_equals_gguf(tiny_arch arch)
{
    char gp[96];
    snprintf(gp, sizeof gp, "/tmp/khub-test-copy-%d.gguf", (int)getpid());
    int32_t ids[13] = {1, 17, 200, 3, 99, 45, 45, 45, 250, 7, 8, 128, 64};
    float hf[T_VOCAB], gg[T_VOCAB];
    tiny_spec s = {arch, NULL, NULL, NULL, 0, 0, NULL, gp, 0};
    khub_runtime *rt = runtime();
    khub_model_opts ro = ref_opts();
    const char *dir = tiny_write(&s);
    khub_model *m = NULL;
    ASSERT_OK(khub_model_load(rt, dir, &ro, &m));
    ASSERT_OK(khub_model_logits(m, ids, 13, hf));
    khub_model_free(m);
    ASSERT_OK(khub_model_load(rt, gp, &ro, &m));
    khub_model_info info = {KHUB_STRUCT_INIT(khub_model_info)};
    ASSERT_OK(khub_model_info_get(m, &info));
    ASSERT_STR_EQ(info.format, "gguf");
    ASSERT_OK(khub_model_logits(m, ids, 13, gg));
    khub_model_free(m);
    double e = rel_err(gg, hf, T_VOCAB);
    fprintf(stderr, "  %s: GGUF copy vs folder, logits max rel err %.2e\n", info.arch, e);
    ASSERT_LE(e, 1e-5);
    if (arch == TINY_LLAMA) {
        s.gguf_no_permute = 1;
        tiny_write(&s);
        ASSERT_OK(khub_model_load(rt, gp, &ro, &m));
        ASSERT_OK(khub_model_logits(m, ids, 13, gg));
        khub_model_free(m);
        ASSERT(rel_err(gg, hf, T_VOCAB) > 1e-3);
    }
    tiny_cleanup(dir);
    unlink(gp);
    khub_runtime_free(rt);
}

TEST_IMPL(model_tiny_llama_hf_equals_gguf) { check_hf_equals_gguf(TINY_LLAMA); }
TEST_IMPL(model_tiny_qwen2_hf_equals_gguf) { check_hf_equals_gguf(TINY_QWEN2); }
TEST_IMPL(model_tiny_qwen3_hf_equals_gguf) { check_hf_equals_gguf(TINY_QWEN3); }

/* Mistral: sliding_window 4 runs (prefill == incremental across the window
 * edge) and means it: on the Llama weights, a prompt of 4 tokens (every key
 * inside the window) gives Llama's logits, one of 13 does not. */
TEST_IMPL(model_tiny_mistral_sliding_window)
{
    check_arch(TINY_MISTRAL, WINDOW_4);
    int32_t ids[13] = {1, 17, 200, 3, 99, 45, 45, 45, 250, 7, 8, 128, 64};
    float l4[T_VOCAB], m4[T_VOCAB], l13[T_VOCAB], m13[T_VOCAB];
    tiny_spec llama = {TINY_LLAMA, NULL, NULL, NULL, 0, 0, NULL, NULL, 0};
    tiny_spec mistral = {TINY_MISTRAL, NULL, NULL, NULL, 0, 0, WINDOW_4, NULL, 0};
    tiny_logits(&llama, ids, 4, l4, NULL);
    tiny_logits(&mistral, ids, 4, m4, NULL);
    tiny_logits(&llama, ids, 13, l13, NULL);
    tiny_logits(&mistral, ids, 13, m13, NULL);
    ASSERT_LE(rel_err(m4, l4, T_VOCAB), 1e-6);
    ASSERT(rel_err(m13, l13, T_VOCAB) > 1e-3);
}

/* Qwen2's sliding layers: use_sliding_window with max_window_layers 1 slides
 * layer 1 only. Prefill == incremental; inside the window the logits are
 * the full-attention ones; past it they differ from full attention and from
 * sliding in every layer (max_window_layers 0). */
TEST_IMPL(model_tiny_qwen2_sliding_layers)
{
#define QWEN2_SLIDE(from) \
    ",\"use_sliding_window\": true, \"sliding_window\": 4, \"max_window_layers\": " #from
    check_arch(TINY_QWEN2, QWEN2_SLIDE(1));
    int32_t ids[13] = {1, 17, 200, 3, 99, 45, 45, 45, 250, 7, 8, 128, 64};
    float full[T_VOCAB], one[T_VOCAB], all[T_VOCAB];
    tiny_spec f = {TINY_QWEN2, NULL, NULL, NULL, 0, 0, NULL, NULL, 0};
    tiny_spec o = {TINY_QWEN2, NULL, NULL, NULL, 0, 0, QWEN2_SLIDE(1), NULL, 0};
    tiny_spec a = {TINY_QWEN2, NULL, NULL, NULL, 0, 0, QWEN2_SLIDE(0), NULL, 0};
    tiny_logits(&f, ids, 4, full, NULL);
    tiny_logits(&o, ids, 4, one, NULL);
    ASSERT_LE(rel_err(one, full, T_VOCAB), 1e-6);
    tiny_logits(&f, ids, 13, full, NULL);
    tiny_logits(&o, ids, 13, one, NULL);
    tiny_logits(&a, ids, 13, all, NULL);
    ASSERT(rel_err(one, full, T_VOCAB) > 1e-3);
    ASSERT(rel_err(one, all, T_VOCAB) > 1e-3);
#undef QWEN2_SLIDE
}

/* rope_scaling "linear" and "llama3" reach the rotary op: the prompt gives
 * other logits than without scaling (position 0 alone is not rotated, so
 * one token gives the same), and prefill == incremental still holds. */
static void check_rope_scaling(const char *extra)
{
    check_arch(TINY_LLAMA, extra);
    int32_t ids[13] = {1, 17, 200, 3, 99, 45, 45, 45, 250, 7, 8, 128, 64};
    float plain[T_VOCAB], scaled[T_VOCAB];
    tiny_spec p = {TINY_LLAMA, NULL, NULL, NULL, 0, 0, NULL, NULL, 0};
    tiny_spec s = {TINY_LLAMA, NULL, NULL, NULL, 0, 0, extra, NULL, 0};
    tiny_logits(&p, ids, 1, plain, NULL);
    tiny_logits(&s, ids, 1, scaled, NULL);
    ASSERT_LE(rel_err(scaled, plain, T_VOCAB), 1e-6);
    tiny_logits(&p, ids, 13, plain, NULL);
    tiny_logits(&s, ids, 13, scaled, NULL);
    ASSERT(rel_err(scaled, plain, T_VOCAB) > 1e-3);
}

TEST_IMPL(model_tiny_rope_scaling_linear) { check_rope_scaling(ROPE_LINEAR); }
TEST_IMPL(model_tiny_rope_scaling_llama3) { check_rope_scaling(ROPE_LLAMA3); }

/* The same values stored as F32, F16 or BF16, in one file or two shards with
 * model.safetensors.index.json, give the same logits; the F16/BF16 weights
 * are served as they are (the explain line names their dtype). */
TEST_IMPL(model_tiny_dtypes_and_shards)
{
    int32_t ids[9] = {1, 5, 9, 33, 200, 17, 4, 4, 250};
    float ref[T_VOCAB], got[T_VOCAB];
    tiny_spec f32 = {TINY_QWEN2, NULL, NULL, "F32", 1, 0, NULL, NULL, 0};
    tiny_logits(&f32, ids, 9, ref, "qkv_proj[f32]: ");
    static const char *const dtypes[] = {"F16", "BF16", "F32", "BF16"};
    static const int shards[] = {0, 0, 2, 2};
    static const char *const explain[] = {
        "qkv_proj[f16]: ", "qkv_proj[bf16]: ", "qkv_proj[f32]: ", "qkv_proj[bf16]: "};
    for (int i = 0; i < 4; i++) {
        tiny_spec s = {TINY_QWEN2, NULL, NULL, dtypes[i], 1, shards[i], NULL, NULL, 0};
        tiny_logits(&s, ids, 9, got, explain[i]);
        double e = rel_err(got, ref, T_VOCAB);
        fprintf(stderr, "  %s%s: logits max rel err %.2e against F32\n", dtypes[i],
                shards[i] ? " in 2 shards" : "", e);
        ASSERT_LE(e, 1e-5);
    }
    /* Values that are not exact in BF16 do change the logits (the check can fail). */
    tiny_spec unrounded = {TINY_QWEN2, NULL, NULL, "F32", 0, 0, NULL, NULL, 0};
    tiny_logits(&unrounded, ids, 9, got, NULL);
    ASSERT(rel_err(got, ref, T_VOCAB) > 1e-5);
}

TEST_IMPL(model_tiny_info_and_explain)
{
    khub_runtime *rt = runtime();
    const char *dir = tiny_model(TINY_QWEN3, NULL, NULL);
    khub_model *m = NULL;
    ASSERT_OK(khub_model_load(rt, dir, NULL, &m));
    khub_model_info info = {KHUB_STRUCT_INIT(khub_model_info)};
    ASSERT_OK(khub_model_info_get(m, &info));
    ASSERT_STR_EQ(info.arch, "qwen3");
    ASSERT_STR_EQ(info.format, "safetensors");
    ASSERT_EQ(info.n_layers, T_LAYERS);
    ASSERT_EQ(info.head_dim, T_HD);
    ASSERT_EQ(info.vocab, T_VOCAB);
    ASSERT(info.weight_bytes > (uint64_t)T_VOCAB * T_HIDDEN * 4);
    const char *ex = khub_model_explain(m);
    ASSERT_CONTAINS(ex, "attention[f32]: ");
    ASSERT_CONTAINS(ex, "qkv_proj[f32]: ");
    ASSERT_CONTAINS(ex, "accept khub/ref-cpu");
    khub_model_free(m);
    tiny_cleanup(dir);
    khub_runtime_free(rt);
}

TEST_IMPL(model_tiny_quantize_at_load)
{
    static const char *const schemes[] = {"q8_0", "int8", "nf4", "q4_0"};
    static const double tol[] = {0.05, 0.05, 0.3, 0.3};
    khub_runtime *rt = runtime();
    const char *dir = tiny_model(TINY_LLAMA, NULL, NULL);
    int32_t ids[6] = {1, 5, 9, 33, 200, 17};
    float ref[T_VOCAB], q[T_VOCAB];
    khub_model *m = NULL;
    ASSERT_OK(khub_model_load(rt, dir, NULL, &m));
    ASSERT_OK(khub_model_logits(m, ids, 6, ref));
    khub_model_free(m);
    for (int s = 0; s < 4; s++) {
        khub_model_opts o = {KHUB_STRUCT_INIT(khub_model_opts), .quant = schemes[s]};
        ASSERT_OK(khub_model_load(rt, dir, &o, &m));
        char want[64];
        snprintf(want, sizeof want, "qkv_proj[%s]: ", schemes[s]);
        ASSERT_CONTAINS(khub_model_explain(m), want);
        ASSERT_CONTAINS(khub_model_explain(m), "lm_head[f32]: "); /* embeddings stay f32 */
        ASSERT_OK(khub_model_logits(m, ids, 6, q));
        double e = rel_err(q, ref, T_VOCAB);
        fprintf(stderr, "  %s: logits max rel err %.4f\n", schemes[s], e);
        ASSERT_LE(e, tol[s]);
        ASSERT(e > 0); /* really quantized */
        khub_model_free(m);
    }
    /* Asked for, the (tied) lm_head is quantized too, and its logits move. */
    khub_model_opts oq = {KHUB_STRUCT_INIT(khub_model_opts), .quant = "q8_0"};
    ASSERT_OK(khub_model_load(rt, dir, &oq, &m));
    ASSERT_OK(khub_model_logits(m, ids, 6, ref));
    khub_model_free(m);
    oq.quant_embeddings = 1;
    ASSERT_OK(khub_model_load(rt, dir, &oq, &m));
    ASSERT_CONTAINS(khub_model_explain(m), "lm_head[q8_0]: ");
    ASSERT_OK(khub_model_logits(m, ids, 6, q));
    ASSERT(rel_err(q, ref, T_VOCAB) > 0);
    ASSERT_LE(rel_err(q, ref, T_VOCAB), 0.05);
    khub_model_free(m);
    khub_model_opts bad = {KHUB_STRUCT_INIT(khub_model_opts), .quant = "fp3"};
    ASSERT_STATUS(khub_model_load(rt, dir, &bad, &m), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "quant scheme 'fp3' is not known");
    ASSERT(m == NULL);
    tiny_cleanup(dir);
    khub_runtime_free(rt);
}

/* The folder and its GGUF copy, both lacking one tensor or with one of the
 * wrong shape: refused naming the file (or folder) and the tensor. */
TEST_IMPL(model_tiny_missing_tensor)
{
    khub_runtime *rt = runtime();
    char gp[96];
    snprintf(gp, sizeof gp, "/tmp/khub-test-copy-%d.gguf", (int)getpid());
    tiny_spec s = {TINY_LLAMA, "model.layers.1.mlp.down_proj.weight", NULL, NULL, 0, 0, NULL, gp,
                   0};
    const char *dir = tiny_write(&s);
    khub_model *m = NULL;
    ASSERT_STATUS(khub_model_load(rt, dir, NULL, &m), KHUB_STATUS_MODEL_INVALID);
    char want[160]; /* the folder, then the tensor */
    snprintf(want, sizeof want, "%s: tensor 'model.layers.1.mlp.down_proj.weight' missing",
             strrchr(dir, '/') + 1);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), want);
    ASSERT(m == NULL);
    khub__clear(rt);
    ASSERT_STATUS(khub_model_load(rt, gp, NULL, &m), KHUB_STATUS_MODEL_INVALID);
    snprintf(want, sizeof want, "%s: tensor 'blk.1.ffn_down.weight' missing", strrchr(gp, '/') + 1);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), want);
    ASSERT(m == NULL);
    unlink(gp);
    tiny_cleanup(dir);
    khub_runtime_free(rt);
}

TEST_IMPL(model_tiny_wrong_shape)
{
    khub_runtime *rt = runtime();
    char gp[96];
    snprintf(gp, sizeof gp, "/tmp/khub-test-copy-%d.gguf", (int)getpid());
    tiny_spec s = {TINY_LLAMA, NULL, "model.layers.0.self_attn.k_proj.weight", NULL, 0, 0, NULL,
                   gp,         0};
    const char *dir = tiny_write(&s);
    khub_model *m = NULL;
    ASSERT_STATUS(khub_model_load(rt, dir, NULL, &m), KHUB_STATUS_MODEL_INVALID);
    char want[160];
    snprintf(want, sizeof want,
             "%s: tensor 'model.layers.0.self_attn.k_proj.weight' has shape [33, 64], expected "
             "[32, 64]",
             strrchr(dir, '/') + 1);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), want);
    khub__clear(rt);
    ASSERT_STATUS(khub_model_load(rt, gp, NULL, &m), KHUB_STATUS_MODEL_INVALID);
    snprintf(want, sizeof want,
             "%s: tensor 'blk.0.attn_k.weight' has shape [33, 64], expected [32, 64]",
             strrchr(gp, '/') + 1);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), want);
    ASSERT(m == NULL);
    unlink(gp);
    tiny_cleanup(dir);
    khub_runtime_free(rt);
}

TEST_IMPL(model_not_found)
{
    khub_runtime *rt = runtime();
    khub_model *m = NULL;
    ASSERT_STATUS(khub_model_load(rt, "/nonexistent/model.gguf", NULL, &m), KHUB_STATUS_NOT_FOUND);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "/nonexistent/model.gguf: no such file or folder");
    khub_runtime_free(rt);
}

/* ======================================================================== */
/* Tiny GGUF models, one per weight type                                    */
/* ======================================================================== */

/* Rows of 256 and 512: whole Q4_K / Q6_K blocks. */
enum { G_HIDDEN = 256, G_FFN = 512, G_HEADS = 4, G_KV = 2, G_HD = 64, G_VOCAB = 64 };

typedef struct gtype {
    const char *name; /* as the explain line prints it */
    uint32_t ggml;    /* GGUF tensor type */
    int be, bb;       /* elements and bytes per block; be 1 for F16/BF16 */
    void (*deq)(const uint8_t *, float *);
    int d_at, m_at; /* byte offsets of the f16 scale and min in a block, -1 = none */
    float d, m;     /* their magnitudes: weights of a few hundredths */
} gtype;

static const gtype gtypes[] = {
    {"f16", 1, 1, 2, NULL, -1, -1, 0, 0},
    {"bf16", 30, 1, 2, NULL, -1, -1, 0, 0},
    {"q8_0", 8, 32, 34, oracle_deq_q8_0, 0, -1, 8e-4f, 0},
    {"q4_0", 2, 32, 18, oracle_deq_q4_0, 0, -1, 0.0125f, 0},
    {"q4_1", 3, 32, 20, oracle_deq_q4_1, 0, 2, 0.008f, 0.06f},
    {"q5_0", 6, 32, 22, oracle_deq_q5_0, 0, -1, 0.006f, 0},
    {"q5_1", 7, 32, 24, oracle_deq_q5_1, 0, 2, 0.004f, 0.06f},
    {"q4_k", 12, 256, 144, oracle_deq_q4_k, 0, 2, 2e-4f, 1e-3f},
    {"q6_k", 14, 256, 210, oracle_deq_q6_k, 208, -1, 8e-5f, 0},
};

/* One matrix [rows, cols] of type t: its bytes in *q and its values in y. */
static void gguf_matrix(const gtype *t, int64_t rows, int64_t cols, fx_buf *q, float *y)
{
    int64_t n = rows * cols;
    if (!t->deq) {
        for (int64_t i = 0; i < n; i++) {
            uint8_t b[4];
            y[i] = round8(frand() / sqrtf((float)cols));
            fx_put(q, b, encode(t->ggml == 1 ? "F16" : "BF16", y[i], b));
        }
        return;
    }
    for (int64_t blk = 0; blk < n / t->be; blk++) {
        uint8_t b[256];
        for (int i = 0; i < t->bb; i++) b[i] = (uint8_t)(frand() * 128.0f + 128.0f);
        /* d in [1, 1.5] x its magnitude (an f16 normal), m in +-1 x its own */
        if (t->d_at >= 0) encode("F16", round8(t->d * (1.25f + 0.25f * frand())), b + t->d_at);
        if (t->m_at >= 0) encode("F16", round8(t->m * frand()), b + t->m_at);
        t->deq(b, y + blk * t->be);
        fx_put(q, b, (size_t)t->bb);
    }
}

typedef struct gtensor {
    char name[48];
    int64_t rows, cols; /* cols 0: a vector */
    int typed;          /* 1 = of the file's type, 0 = F32 */
} gtensor;

/* Writes a 1-layer Llama GGUF to path: matrices of type t (or F32 with the
 * same values when as_f32), the embedding and norms F32. The values depend on
 * t only. */
static void gguf_model(const char *path, const gtype *t, int as_f32, const float *rope_freqs)
{
    static const gtensor ts[] = {
        {"token_embd.weight", G_VOCAB, G_HIDDEN, 0},
        {"output_norm.weight", G_HIDDEN, 0, 0},
        {"blk.0.attn_norm.weight", G_HIDDEN, 0, 0},
        {"blk.0.attn_q.weight", G_HEADS * G_HD, G_HIDDEN, 1},
        {"blk.0.attn_k.weight", G_KV * G_HD, G_HIDDEN, 1},
        {"blk.0.attn_v.weight", G_KV * G_HD, G_HIDDEN, 1},
        {"blk.0.attn_output.weight", G_HIDDEN, G_HEADS * G_HD, 1},
        {"blk.0.ffn_norm.weight", G_HIDDEN, 0, 0},
        {"blk.0.ffn_gate.weight", G_FFN, G_HIDDEN, 1},
        {"blk.0.ffn_up.weight", G_FFN, G_HIDDEN, 1},
        {"blk.0.ffn_down.weight", G_HIDDEN, G_FFN, 1},
    };
    enum { NT = sizeof ts / sizeof ts[0] };
    fx_buf data[NT];
    memset(data, 0, sizeof data);
    rng_state = 0x9e3779b97f4a7c15ull + t->ggml;
    float *y = malloc((size_t)G_FFN * G_HIDDEN * sizeof(float));
    for (int i = 0; i < NT; i++) {
        int64_t cols = ts[i].cols ? ts[i].cols : 1, n = ts[i].rows * cols;
        if (ts[i].typed) {
            fx_buf q = {0};
            gguf_matrix(t, ts[i].rows, cols, &q, y);
            if (!as_f32) {
                data[i] = q;
                continue;
            }
            fx_free(&q);
        } else {
            for (int64_t k = 0; k < n; k++)
                y[k] = ts[i].cols ? frand() : 1.0f + 0.1f * frand(); /* embedding, norms */
        }
        for (int64_t k = 0; k < n; k++) fx_f32(&data[i], y[k]);
    }
    free(y);
    fx_buf b = {0};
    fx_gguf_header(&b, 3, NT + (rope_freqs != NULL), 8);
    fx_kv_str(&b, "general.architecture", "llama");
    fx_kv_u32(&b, "llama.embedding_length", G_HIDDEN);
    fx_kv_u32(&b, "llama.feed_forward_length", G_FFN);
    fx_kv_u32(&b, "llama.block_count", 1);
    fx_kv_u32(&b, "llama.attention.head_count", G_HEADS);
    fx_kv_u32(&b, "llama.attention.head_count_kv", G_KV);
    fx_kv_u32(&b, "llama.context_length", 256);
    fx_kv_f32(&b, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    uint64_t off = 0;
    for (int i = 0; i < NT; i++) {
        uint64_t ne[2] = {(uint64_t)(ts[i].cols ? ts[i].cols : ts[i].rows), (uint64_t)ts[i].rows};
        uint32_t type = ts[i].typed && !as_f32 ? t->ggml : 0;
        fx_tensor_info(&b, ts[i].name, ts[i].cols ? 2 : 1, ne, type, off);
        off += (data[i].n + 31) / 32 * 32;
    }
    uint64_t half = G_HD / 2;
    if (rope_freqs) fx_tensor_info(&b, "rope_freqs.weight", 1, &half, 0, off);
    fx_align(&b, 32);
    for (int i = 0; i < NT; i++) {
        fx_put(&b, data[i].p, data[i].n);
        fx_align(&b, 32);
        fx_free(&data[i]);
    }
    for (uint64_t j = 0; rope_freqs && j < half; j++) fx_f32(&b, rope_freqs[j]);
    ASSERT_EQ(fx_write_file(path, &b), 0);
    fx_free(&b);
}

static void gguf_logits(khub_runtime *rt, const char *path, const khub_model_opts *o,
                        const int32_t *ids, int64_t n, float *out, const char *want_explain)
{
    khub_model *m = NULL;
    ASSERT_OK(khub_model_load(rt, path, o, &m));
    if (want_explain) ASSERT_CONTAINS(khub_model_explain(m), want_explain);
    ASSERT_OK(khub_model_logits(m, ids, (size_t)n, out));
    khub_model_free(m);
}

/* Each GGUF weight type loads and computes the model its values define: the
 * logits equal those of an F32 GGUF holding the dequantized values (ref-cpu:
 * to rounding; the registry's choice, which rounds activations for its
 * quantized dot products, within a loose bound), and the explain line shows
 * the type was served as it is. */
TEST_IMPL(model_gguf_weight_types)
{
    khub_runtime *rt = runtime();
    char tp[96], rp[96];
    snprintf(tp, sizeof tp, "/tmp/khub-test-gguf-%d-t.gguf", (int)getpid());
    snprintf(rp, sizeof rp, "/tmp/khub-test-gguf-%d-r.gguf", (int)getpid());
    int32_t ids[7] = {1, 9, 33, 2, 60, 17, 17};
    float ref[G_VOCAB], got[G_VOCAB], best[G_VOCAB];
    khub_model_opts ro = ref_opts(), dflt = {KHUB_STRUCT_INIT(khub_model_opts)};
    for (size_t i = 0; i < sizeof gtypes / sizeof gtypes[0]; i++) {
        const gtype *t = &gtypes[i];
        gguf_model(tp, t, 0, NULL);
        gguf_model(rp, t, 1, NULL);
        gguf_logits(rt, rp, &ro, ids, 7, ref, "qkv_proj[f32]: khub/ref-cpu");
        char want[64];
        snprintf(want, sizeof want, "qkv_proj[%s]: khub/ref-cpu", t->name);
        gguf_logits(rt, tp, &ro, ids, 7, got, want);
        snprintf(want, sizeof want, "qkv_proj[%s]: ", t->name);
        gguf_logits(rt, tp, &dflt, ids, 7, best, want);
        double e_ref = rel_err(got, ref, G_VOCAB), e_best = rel_err(best, ref, G_VOCAB);
        fprintf(stderr, "  %-4s: logits max rel err %.2e (ref-cpu), %.2e (default plugins)\n",
                t->name, e_ref, e_best);
        double amax = 0;
        for (int v = 0; v < G_VOCAB; v++) {
            ASSERT(isfinite(ref[v]) && isfinite(got[v]) && isfinite(best[v]));
            amax = fabs(ref[v]) > amax ? fabs(ref[v]) : amax;
        }
        ASSERT(amax > 0.1); /* logits that say something */
        ASSERT_LE(e_ref, 1e-5);
        ASSERT_LE(e_best, 1e-3);
    }
    unlink(tp);
    unlink(rp);
    khub_runtime_free(rt);
}

/* Llama 3's RoPE scaling as a GGUF carries it (rope_freqs.weight, the
 * divisors llama.cpp's converter computes; factor 8, theta 10000, original
 * context 8192): the file loads, the model runs with the scaling (other
 * logits than without past position 0, the same at position 0), and prefill
 * equals one token at a time. */
TEST_IMPL(model_gguf_llama3_rope_freqs)
{
    float freqs[G_HD / 2];
    for (int j = 0; j < G_HD / 2; j++) {
        double inv = pow(10000.0, -2.0 * j / G_HD), wl = 2 * 3.14159265358979323846 / inv;
        double smooth = (8192.0 / wl - 1) / 3;
        freqs[j] = wl < 2048 ? 1.0f : wl > 8192 ? 8.0f : (float)(1 / ((1 - smooth) / 8 + smooth));
    }
    khub_runtime *rt = runtime();
    char sp[96], pp[96];
    snprintf(sp, sizeof sp, "/tmp/khub-test-gguf-%d-s.gguf", (int)getpid());
    snprintf(pp, sizeof pp, "/tmp/khub-test-gguf-%d-p.gguf", (int)getpid());
    gguf_model(sp, &gtypes[2], 0, freqs);
    gguf_model(pp, &gtypes[2], 0, NULL);
    int32_t ids[7] = {1, 9, 33, 2, 60, 17, 17};
    float plain[G_VOCAB], scaled[G_VOCAB], inc[G_VOCAB];
    khub_model_opts ro = ref_opts();
    gguf_logits(rt, pp, &ro, ids, 1, plain, NULL);
    gguf_logits(rt, sp, &ro, ids, 1, scaled, NULL);
    ASSERT_LE(rel_err(scaled, plain, G_VOCAB), 1e-6);
    gguf_logits(rt, pp, &ro, ids, 7, plain, NULL);
    khub_model *m = NULL;
    ASSERT_OK(khub_model_load(rt, sp, &ro, &m));
    ASSERT_EQ(m->cfg.rope_scaling, KHUB_ROPE_SCALING_LLAMA3);
    ASSERT(m->cfg.rope_factor == 8.0);
    ASSERT_OK(khub_model_logits(m, ids, 7, scaled));
    logits_incremental(m, ids, 7, inc);
    khub_model_free(m);
    fprintf(stderr, "  llama3 scaling moves the logits by %.2e; incremental differs by %.2e\n",
            rel_err(scaled, plain, G_VOCAB), rel_err(inc, scaled, G_VOCAB));
    ASSERT(rel_err(scaled, plain, G_VOCAB) > 1e-4);
    ASSERT_LE(rel_err(inc, scaled, G_VOCAB), 1e-5);
    unlink(sp);
    unlink(pp);
    khub_runtime_free(rt);
}

/* ======================================================================== */
/* The real model against Transformers                                      */
/* ======================================================================== */

static const char *model_path(const char *name, char *buf, size_t n)
{
    const char *d = getenv("KHUB_MODEL_DIR");
    if (d)
        snprintf(buf, n, "%s/%s", d, name);
    else
        snprintf(buf, n, "%s/.cache/khub/models/%s", getenv("HOME") ? getenv("HOME") : "", name);
    struct stat sb;
    return stat(buf, &sb) == 0 ? buf : NULL;
}

static cJSON *fixtures(void)
{
    char *txt = read_all(KHUB_SOURCE_DIR "/tests/fixtures/smollm2_greedy.json", NULL);
    if (!txt) return NULL;
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    ASSERT(j);
    return j;
}

/* Greedy tokens from ids with the model's KV cache, EOS not special. */
static void greedy(khub_model *m, const int32_t *ids, int64_t n, int32_t *out, int steps)
{
    ASSERT_OK(khub__forward_reset(m, 0));
    for (int64_t done = 0; done < n;) {
        int64_t take = n - done < m->max_batch ? n - done : m->max_batch;
        khub__seg seg = {0, 0, done, take};
        ASSERT_OK(khub__forward(m, ids + done, &seg, 1));
        done += take;
    }
    for (int s = 0; s < steps; s++) {
        out[s] = argmax(m->logits, m->cfg.vocab_size);
        if (s + 1 == steps) break;
        khub__seg seg = {0, 0, n + s, 1};
        ASSERT_OK(khub__forward(m, &out[s], &seg, 1));
    }
}

/* With reference set, every role runs on khub/ref-cpu (the oracle) and only
 * the logits of the short prompts are compared (ref-cpu is slow); otherwise
 * the registry's default choice (the optimized plugins, f32 compute) must
 * match every case's logits and all 64 greedy tokens. */
static void check_against_fixtures(const char *file, int reference)
{
    char buf[512];
    const char *path = model_path(file, buf, sizeof buf);
    if (!path) TEST_SKIP("%s not found (run tools/fetch-model.sh)", file);
    cJSON *fx = fixtures();
    if (!fx) TEST_SKIP("tests/fixtures/smollm2_greedy.json absent (tools/make-reference.py)");
    /* One thread: ~650 forward steps of many short jobs each, and with two
     * threads on a loaded machine every job waits for its descheduled
     * worker (measured in session 16 at load 9: the GGUF case took 152 s
     * of wall for 12 s of CPU with two threads, 49 s for 10 s with one;
     * the HF case passed 220 s, near the runner's 300 s per case, and the
     * program ctest's 600 s). What is compared does not depend on it: the
     * pool splits rows and heads, each computed alike on any thread, and
     * every case passes the same bounds either way. The two-thread path of
     * the real model is checked by
     * model_smollm2_gguf_prefill_equals_incremental. */
    khub_runtime *rt = runtime_threads(1);
    khub_model_opts o = ref_opts();
    khub_model_opts d = {KHUB_STRUCT_INIT(khub_model_opts)};
    khub_model *m = NULL;
    ASSERT_OK(khub_model_load(rt, path, reference ? &o : &d, &m));
    int64_t V = m->cfg.vocab_size;
    float *got = malloc((size_t)V * 4);
    const cJSON *cases = cJSON_GetObjectItem(fx, "cases"), *c;
    int n_cases = 0;
    cJSON_ArrayForEach(c, cases)
    {
        const cJSON *in = cJSON_GetObjectItem(c, "input_ids");
        int64_t n = cJSON_GetArraySize(in);
        if (reference && n > 40) continue;
        int32_t *ids = malloc((size_t)n * 4);
        for (int64_t i = 0; i < n; i++) ids[i] = cJSON_GetArrayItem(in, (int)i)->valueint;
        char lp[512];
        snprintf(lp, sizeof lp, KHUB_SOURCE_DIR "/tests/fixtures/%s",
                 cJSON_GetObjectItem(c, "logits_file")->valuestring);
        size_t len = 0;
        float *want = (float *)read_all(lp, &len);
        ASSERT(want && len == (size_t)V * 4);
        ASSERT_OK(khub_model_logits(m, ids, (size_t)n, got));
        double e = rel_err(got, want, V);
        fprintf(stderr, "  %s %s%s: %lld tokens, logits max rel err %.2e\n", file,
                cJSON_GetObjectItem(c, "name")->valuestring, reference ? " (ref-cpu)" : "",
                (long long)n, e);
        ASSERT_LE(e, 1e-3);
        if (reference) {
            free(want);
            free(ids);
            n_cases++;
            continue;
        }
        const cJSON *g = cJSON_GetObjectItem(c, "greedy_ids");
        int steps = cJSON_GetArraySize(g);
        int32_t out[128];
        ASSERT(steps <= 128);
        greedy(m, ids, n, out, steps);
        for (int s = 0; s < steps; s++)
            if (out[s] != cJSON_GetArrayItem(g, s)->valueint)
                TEST_FAIL_("%s: greedy token %d is %d, Transformers has %d",
                           cJSON_GetObjectItem(c, "name")->valuestring, s, (int)out[s],
                           cJSON_GetArrayItem(g, s)->valueint);
        free(want);
        free(ids);
        n_cases++;
    }
    ASSERT(n_cases > 0);
    free(got);
    cJSON_Delete(fx);
    khub_model_free(m);
    khub_runtime_free(rt);
}

TEST_IMPL(model_smollm2_gguf_matches_transformers)
{
    check_against_fixtures("SmolLM2-135M-Instruct.Q4_1.gguf", 0);
}

TEST_IMPL(model_smollm2_hf_matches_transformers)
{
    check_against_fixtures("SmolLM2-135M-Instruct-hf", 0);
}

TEST_IMPL(model_smollm2_gguf_ref_matches_transformers)
{
    check_against_fixtures("SmolLM2-135M-Instruct.Q4_1.gguf", 1);
}

/* Without fixtures the real model is still checked for consistency. */
TEST_IMPL(model_smollm2_gguf_prefill_equals_incremental)
{
    char buf[512];
    const char *path = model_path("SmolLM2-135M-Instruct.Q4_1.gguf", buf, sizeof buf);
    if (!path) TEST_SKIP("SmolLM2-135M-Instruct.Q4_1.gguf not found (run tools/fetch-model.sh)");
    khub_runtime *rt = runtime();
    khub_model *m = NULL;
    /* ref-cpu everywhere: the two paths must agree to rounding. */
    khub_model_opts o = ref_opts();
    ASSERT_OK(khub_model_load(rt, path, &o, &m));
    int64_t V = m->cfg.vocab_size;
    float *a = malloc((size_t)V * 4), *b = malloc((size_t)V * 4);
    int32_t ids[9] = {1, 504, 3458, 282, 4649, 314, 9, 1000, 42};
    ASSERT_OK(khub_model_logits(m, ids, 9, a));
    logits_incremental(m, ids, 9, b);
    double e = rel_err(b, a, V);
    fprintf(stderr, "  ref-cpu prefill vs incremental: max rel err %.2e\n", e);
    ASSERT_LE(e, 1e-4);
    khub_model_free(m);
    /* The best-ranked plugins: optimized qlinear ops quantize activations to
     * int8 (as llama.cpp does), whose rounding flips amplify tiny attention
     * differences between the batched and the one-row path; measured about
     * 3e-2 on this model. Bound it loosely and require the same argmax. */
    ASSERT_OK(khub_model_load(rt, path, NULL, &m));
    ASSERT_OK(khub_model_logits(m, ids, 9, a));
    logits_incremental(m, ids, 9, b);
    e = rel_err(b, a, V);
    fprintf(stderr, "  best plugins prefill vs incremental: max rel err %.2e\n", e);
    ASSERT_LE(e, 0.1);
    ASSERT_EQ(argmax(a, V), argmax(b, V));
    free(a);
    free(b);
    khub_model_free(m);
    khub_runtime_free(rt);
}

#define TEST_LIST(X) \
    X(model_tiny_llama_prefill_equals_incremental) \
    X(model_tiny_qwen2_prefill_equals_incremental) \
    X(model_tiny_qwen3_prefill_equals_incremental) \
    X(model_tiny_llama_hf_equals_gguf) \
    X(model_tiny_qwen2_hf_equals_gguf) \
    X(model_tiny_qwen3_hf_equals_gguf) \
    X(model_tiny_mistral_sliding_window) \
    X(model_tiny_qwen2_sliding_layers) \
    X(model_tiny_rope_scaling_linear) \
    X(model_tiny_rope_scaling_llama3) \
    X(model_tiny_dtypes_and_shards) \
    X(model_gguf_weight_types) \
    X(model_gguf_llama3_rope_freqs) \
    X(model_tiny_info_and_explain) \
    X(model_tiny_quantize_at_load) \
    X(model_tiny_missing_tensor) \
    X(model_tiny_wrong_shape) \
    X(model_not_found) \
    X(model_smollm2_gguf_prefill_equals_incremental) \
    X(model_smollm2_gguf_matches_transformers) \
    X(model_smollm2_hf_matches_transformers) \
    X(model_smollm2_gguf_ref_matches_transformers)
TEST_MAIN(TEST_LIST)
