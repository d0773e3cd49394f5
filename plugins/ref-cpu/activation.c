/*
 * activation.c: reference gated activations (op "silu_and_mul").
 *
 *     SILU:       y = gate / (1 + exp(-gate)) * up
 *     GELU_TANH:  y = 0.5 * gate * (1 + tanh(sqrt(2/pi) * (gate + 0.044715 gate^3))) * up
 *
 * Evaluated in double per element and rounded once to f32. y may alias gate
 * or up (elementwise, each input is read before its output is written).
 */
#include <math.h>

#include "ref_cpu.h"

#define OP "silu_and_mul"

typedef struct act_job {
    uint32_t type;
    int64_t ff;
    int64_t sg[2], su[2], sy[2];
    const float *gate, *up;
    float *y;
} act_job;

static double act_silu(double g) { return g / (1.0 + exp(-g)); }

static double act_gelu_tanh(double g)
{
    const double k = 0.7978845608028654; /* sqrt(2 / pi) */
    return 0.5 * g * (1.0 + tanh(k * (g + 0.044715 * g * g * g)));
}

static void act_range(void *ud, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const act_job *j = ud;
    for (int64_t i = begin; i < end; i++) {
        for (int64_t k = 0; k < j->ff; k++) {
            double g = j->gate[i * j->sg[0] + k * j->sg[1]];
            double u = j->up[i * j->su[0] + k * j->su[1]];
            double a = j->type == KHUB_ACT_SILU ? act_silu(g) : act_gelu_tanh(g);
            j->y[i * j->sy[0] + k * j->sy[1]] = (float)(a * u);
        }
    }
}

static khub_status ref_activation(void *state, const void *args)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    const uint64_t f32 = KHUB_REF_BIT_F32;
    KHUB_PU_TRY(khub_pu_args_check(host, OP, args, sizeof(khub_activation_args)));
    const khub_activation_args *a = args;
    if (a->act_type != KHUB_ACT_SILU && a->act_type != KHUB_ACT_GELU_TANH)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          OP ": act_type (got %u, want 1 (SILU) or 2 (GELU_TANH))",
                          (unsigned)a->act_type);
    KHUB_PU_TRY(khub_pu_tensor_check(host, OP, "gate", a->gate, 2, f32, KHUB_DEVICE_CPU));
    KHUB_PU_TRY(khub_pu_tensor_check(host, OP, "up", a->up, 2, f32, KHUB_DEVICE_CPU));
    KHUB_PU_TRY(khub_pu_tensor_check(host, OP, "y", a->y, 2, f32, KHUB_DEVICE_CPU));
    for (int d = 0; d < 2; d++) {
        const char *what = d == 0 ? "n" : "ff";
        KHUB_PU_TRY(khub_pu_dim_check(host, OP, "up", a->up, d, a->gate->shape[d], what));
        KHUB_PU_TRY(khub_pu_dim_check(host, OP, "y", a->y, d, a->gate->shape[d], what));
    }
    act_job j = {.type = a->act_type, .ff = a->gate->shape[1]};
    khub_pu_strides(a->gate, j.sg);
    khub_pu_strides(a->up, j.su);
    khub_pu_strides(a->y, j.sy);
    j.gate = khub_pu_base(a->gate);
    j.up = khub_pu_base(a->up);
    j.y = khub_pu_base(a->y);
    int64_t n = a->gate->shape[0];
    if (n > 0 && j.ff > 0) host->parallel_for(host->host_ctx, n, act_range, &j);
    return KHUB_STATUS_OK;
}

static const khub_op_caps activation_caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CPU,
    .dtypes = KHUB_REF_BIT_F32,
};

const khub_op_desc khub_ref__activation_op = {
    KHUB_STRUCT_INIT(khub_op_desc), .name = "silu_and_mul", .kind = KHUB_OP_ACTIVATION,
    .caps = &activation_caps,       .run = ref_activation,
};
