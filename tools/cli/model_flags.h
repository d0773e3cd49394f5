/*
 * model_flags.h: the flags that `khub run` and `khub chat` share (the model,
 * its kernels, its KV cache, sampling) and loading the model they describe
 * (tools/cli/model_flags.c). A command's own parser hands each argument to
 * cli_model_flag first:
 *
 *     cli_model_args a;
 *     cli_model_args_init(&a);
 *     for (int i = 1; i < argc; i++) {
 *         int rc = 0;
 *         if (cli_model_flag(&cmd, &a, argc, argv, &i, &rc)) { if (rc) return rc; continue; }
 *         ... the command's own flags ...
 *     }
 *     if ((rc = cli_model_args_finish(&cmd, &a))) return rc;
 *     khub_runtime *rt; khub_model *m = cli_model_open("chat", &a, 1, 1, &rt, NULL);
 */
#ifndef KHUB_CLI_MODEL_FLAGS_H
#define KHUB_CLI_MODEL_FLAGS_H

#include <stdint.h>

#include "cli.h"
#include "khub/khub_hub.h"
#include "khub/khub_kernels.h"
#include "khub/khub_model.h"

#define CLI_MAX_STOPS 16

typedef struct cli_model_args {
    const char *model;
    const char *stops[CLI_MAX_STOPS];
    int n_stops;
    const char *role[KHUB_KERNEL_ROLE__COUNT]; /* --attn NAME ... by KHUB_KERNEL_ROLES */
    const char *system;
    const char *kernels, *lock, *policy;
    int threads, strict, ignore_eos, allow_unsigned, quant_embeddings;
    int64_t max_context;                /* 0 = the executor's default */
    int num_blocks, block_size, kv_mib; /* paged cache pool; 0 = defaults */
    khub_dtype kv_dtype;                /* --kv-type: K/V storage; {0} = f32 */
    int allow_quarantined, verify_kernels;
    int32_t max_batch_tokens; /* 0 = the default */
    khub_generate_opts gen;   /* sampling; stop and system point into this struct */
    int tp;                   /* tensor-parallel ranks (--tp N), 0 = none */
    int32_t tp_plan;          /* --tp-plan: enum khub_tp_plan */
    khub_device device;       /* --device: {0, 0} = the CPU */
    const khub_comm *comm;    /* their collectives (tp_job.h), borrowed; NULL = none */
} cli_model_args;

/* Empty arguments with the defaults (128 new tokens, greedy). */
void cli_model_args_init(cli_model_args *a);
/* Parses a number into *out within [lo, hi]; 0, or cmd's usage error (2). */
int cli_num(const khub_cli_cmd *cmd, const char *flag, const char *s, double lo, double hi,
            double *out);
/* --kv-type's value: "f32" or "f16" into *out; 0, or cmd's usage error (2). */
int cli_kv_type(const khub_cli_cmd *cmd, const char *v, khub_dtype *out);
/* Takes argv[*i] when it is one of the shared flags, with its value (then
 * *i moves past it): returns 1, *rc 0 or the usage error's status. Returns
 * 0 for any other argument. */
int cli_model_flag(const khub_cli_cmd *cmd, cli_model_args *a, int argc, char **argv, int *i,
                   int *rc);
/* Checks what the shared flags need together (--model; --quant-embeddings
 * with --quant) and points gen at the stop strings and system message;
 * 0 or the usage error's status. */
int cli_model_args_finish(const khub_cli_cmd *cmd, cli_model_args *a);
/* A runtime and the model a describes, kernels resolved through the hub
 * (khub_model_load_hub); max_seqs 0 = the default (8); with no cache named,
 * the library gives a model of max_seqs > 1 the paged pool and one of a
 * single sequence the dense cache (docs/batching.md); progress: a progress bar
 * on stderr while layers load; rep (may be NULL) receives the kernels'
 * report. NULL after printing why as "khub <cmd>: ...". */
khub_model *cli_model_open(const char *cmd, const cli_model_args *a, int32_t max_seqs, int progress,
                           khub_runtime **rt, khub_model_kernels_report *rep);
/* The same with the caller's hub handle (borrowed; it may outlive the load,
 * as serve-model's live kernel swaps need); NULL = a handle of its own. */
khub_model *cli_model_open_hub(const char *cmd, const cli_model_args *a, int32_t max_seqs,
                               int progress, khub_hub *hub, khub_runtime **rt,
                               khub_model_kernels_report *rep);
/* Whether f is a sampling flag (--temperature, --stop, ...), which a
 * command that takes its settings per request refuses. */
int cli_model_sampling_flag(const char *f);

/* The shared flags' lines of a --help text. Each command writes its own
 * --max-new-tokens line before them: its default differs (run 128, chat 1024). */
#define CLI_MODEL_SAMPLING_HELP \
    "  --max-context N       KV capacity per sequence, prompt and new tokens (default: the\n" \
    "                        model's trained context, at most 4096); past the trained\n" \
    "                        context a warning says the model did not learn it\n" \
    "  --max-batch-tokens N  tokens per forward step: prefill chunks and decodes share it\n" \
    "                        (default 256)\n" \
    "  --threads N           worker threads (default: all cores)\n" \
    "  --temperature T       0 = greedy (default)\n" \
    "  --top-k K             keep the K most likely tokens (0 = all)\n" \
    "  --top-p P             nucleus sampling mass (0 or 1 = off)\n" \
    "  --repeat-penalty R    CTRL repetition penalty (1 = off)\n" \
    "  --seed S              sampling seed (default 0)\n" \
    "  --stop STR            stop when STR appears (repeatable; STR is not printed)\n" \
    "  --ignore-eos          keep going past end-of-sequence tokens\n"

/* The --tp lines of a --help text. */
#define CLI_MODEL_TP_HELP \
    "  --tp N                tensor parallelism over N MPI ranks: launch the command as\n" \
    "                        mpirun -np N khub COMMAND --tp N ...; rank 0 runs it, the\n" \
    "                        others follow its steps (docs/parallelism.md)\n" \
    "  --tp-plan PLAN        how o_proj and down_proj are split: reduce (default: columns,\n" \
    "                        then an all-reduce) or gather (inputs all-gathered, output\n" \
    "                        rows split: the logits of one process, more bytes moved)\n"

#define CLI_MODEL_KERNELS_HELP \
    "Kernels (each NAME is a Hub ID org/name[@REV|@version=N][:symbol], fetched from\n" \
    "HF_ENDPOINT, verified and loaded; or a loaded plugin's id; or a built-in name):\n" \
    "  --attn NAME           attention (built-ins: eager, sdpa)\n" \
    "  --quant NAME          quantize dense weights at load: int8, nf4, q8_0, q4_0, or a\n" \
    "                        kernel (ID, or ID:SCHEME to quantize with it); the embedding\n" \
    "                        and the output head stay as they are\n" \
    "  --quant-embeddings    with --quant: quantize the output head (lm_head, or the tied\n" \
    "                        embedding's copy used as the head) too\n" \
    "  --cache NAME          KV cache (built-ins: dynamic, static, quantized, quantized-int4,\n" \
    "                        paged, sliding, offloaded; NAME,key=value,... passes options,\n" \
    "                        e.g. offloaded,budget=1G,dir=/var/tmp; docs/caches.md); default\n" \
    "                        paged when requests run together (--parallel > 1), else\n" \
    "                        dynamic; --attn, --device cuda or --tp keep dynamic\n" \
    "  --kv-type TYPE        K/V storage of the cache: f32 (default) or f16 (half the bytes\n" \
    "                        per token, rounded to nearest even; --explain shows both)\n" \
    "  --num-blocks N        paged cache: blocks in the pool (default: what --kv-memory\n" \
    "                        holds, else every sequence at --max-context)\n" \
    "  --block-size N        paged cache: tokens per block (default 16)\n" \
    "  --kv-memory MIB       paged cache: memory budget of the pool in MiB\n" \
    "  --norm NAME           RMSNorm      --act NAME   SiLU-and-mul\n" \
    "  --rotary NAME         rotary       --linear NAME dense and quantized linear\n" \
    "  --embed NAME          the token embedding lookup (a plugin's embedding op; default:\n" \
    "                        the host's own lookup, or on a CUDA device the registry's op)\n" \
    "  --kernels FILE        khub.json mapping (default: next to the model, else ./khub.json);\n" \
    "                        the flags above override it\n" \
    "  --lock FILE           load every role through khub.lock: locked commits, hashes\n" \
    "                        re-checked (default: the khub.lock next to the mapping, for the\n" \
    "                        roles the mapping names)\n" \
    "  --policy FILE         trust policy (default $KHUB_POLICY, ~/.config/khub/policy.json)\n" \
    "  --allow-unsigned      accept unsigned kernels of organisations the policy omits\n" \
    "  --allow-quarantined   load a kernel build that crashed or called exit() in an earlier\n" \
    "                        run (khub cache quarantine lists them; a warning says so)\n" \
    "  --verify-kernels      check every norm, activation, rotary, linear, attention and\n" \
    "                        paged attention call against khub/ref-cpu (NMSE per op kind);\n" \
    "                        a kernel that differs fails the run naming plugin, op, role and\n" \
    "                        NMSE, one that writes into the KV pools naming the block (slow:\n" \
    "                        a debug aid)\n" \
    "  --strict              fail instead of falling back (no variant, plugin cannot serve,\n" \
    "                        with --device cuda: a role without a CUDA kernel)\n" \
    "  --device DEV          cpu (default), cuda or cuda:N: places the model on a CUDA GPU\n" \
    "                        (weights uploaded once, activations on the device, roles\n" \
    "                        without a CUDA kernel on the CPU between copies; memory and\n" \
    "                        copies in --explain; docs/gpu.md)\n"

#endif /* KHUB_CLI_MODEL_FLAGS_H */
