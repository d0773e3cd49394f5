/*
 * layout.c: freezes the plugin ABI (1.0, plus the 1.1-1.5 additions) on LP64
 * (x86_64, aarch64).
 *
 * Every struct that crosses the plugin boundary has its size and every field
 * its offset pinned here (the three header fields by KHUB_LAYOUT_HEADER);
 * tests/t_abi_layout.sh fails when a struct or field of the ABI headers is
 * missing from this file. Growing a struct at the end changes only its
 * sizeof line (update it together with an "added in ABI 1.x" note and a
 * minor bump); any other failure here is an ABI break. This file is compiled
 * by tests/test_abi_layout.c, so the suite fails to build on a break.
 */
#include <stddef.h>

#include "khub/khub_plugin.h"

/* The three fields every versioned struct starts with (KHUB_STRUCT_HEADER). */
#define KHUB_LAYOUT_HEADER(T) \
    _Static_assert(offsetof(T, struct_size) == 0 && sizeof(((T *)0)->struct_size) == 4 && \
                       offsetof(T, abi_major) == 4 && sizeof(((T *)0)->abi_major) == 2 && \
                       offsetof(T, abi_minor) == 6 && sizeof(((T *)0)->abi_minor) == 2, \
                   #T " header")

#if defined(__LP64__)
static inline void khub_abi_layout_asserts(void)
{
    _Static_assert(sizeof(khub_tensor) == 48, "khub_tensor");
    _Static_assert(offsetof(khub_tensor, data) == 0, "khub_tensor.data");
    _Static_assert(offsetof(khub_tensor, device) == 8, "khub_tensor.device");
    _Static_assert(offsetof(khub_tensor, ndim) == 16, "khub_tensor.ndim");
    _Static_assert(offsetof(khub_tensor, dtype) == 20, "khub_tensor.dtype");
    _Static_assert(offsetof(khub_tensor, shape) == 24, "khub_tensor.shape");
    _Static_assert(offsetof(khub_tensor, strides) == 32, "khub_tensor.strides");
    _Static_assert(offsetof(khub_tensor, byte_offset) == 40, "khub_tensor.byte_offset");
    _Static_assert(sizeof(khub_device) == 8, "khub_device");
    _Static_assert(offsetof(khub_device, device_type) == 0, "khub_device.device_type");
    _Static_assert(offsetof(khub_device, device_id) == 4, "khub_device.device_id");
    _Static_assert(sizeof(khub_dtype) == 4, "khub_dtype");
    _Static_assert(offsetof(khub_dtype, code) == 0, "khub_dtype.code");
    _Static_assert(offsetof(khub_dtype, bits) == 1, "khub_dtype.bits");
    _Static_assert(offsetof(khub_dtype, lanes) == 2, "khub_dtype.lanes");
    _Static_assert(sizeof(khub_abi_note) == 112, "khub_abi_note");
    _Static_assert(offsetof(khub_abi_note, note_version) == 0, "khub_abi_note.note_version");
    _Static_assert(offsetof(khub_abi_note, abi_major) == 4, "khub_abi_note.abi_major");
    _Static_assert(offsetof(khub_abi_note, abi_minor) == 6, "khub_abi_note.abi_minor");
    _Static_assert(offsetof(khub_abi_note, ptr_size) == 8, "khub_abi_note.ptr_size");
    _Static_assert(offsetof(khub_abi_note, kinds) == 12, "khub_abi_note.kinds");
    _Static_assert(offsetof(khub_abi_note, id) == 16, "khub_abi_note.id");
    _Static_assert(offsetof(khub_abi_note, version) == 80, "khub_abi_note.version");
    /* added in ABI 1.3 */
    _Static_assert(sizeof(khub_abi_note_v2) == 304, "khub_abi_note_v2");
    _Static_assert(offsetof(khub_abi_note_v2, note_version) == 0, "khub_abi_note_v2.note_version");
    _Static_assert(offsetof(khub_abi_note_v2, abi_major) == 4, "khub_abi_note_v2.abi_major");
    _Static_assert(offsetof(khub_abi_note_v2, abi_minor) == 6, "khub_abi_note_v2.abi_minor");
    _Static_assert(offsetof(khub_abi_note_v2, ptr_size) == 8, "khub_abi_note_v2.ptr_size");
    _Static_assert(offsetof(khub_abi_note_v2, kinds) == 12, "khub_abi_note_v2.kinds");
    _Static_assert(offsetof(khub_abi_note_v2, id) == 16, "khub_abi_note_v2.id");
    _Static_assert(offsetof(khub_abi_note_v2, version) == 272, "khub_abi_note_v2.version");
    _Static_assert(sizeof(khub_cuda_launch_cfg) == 48, "khub_cuda_launch_cfg");
    KHUB_LAYOUT_HEADER(khub_cuda_launch_cfg);
    _Static_assert(offsetof(khub_cuda_launch_cfg, grid) == 8, "khub_cuda_launch_cfg.grid");
    _Static_assert(offsetof(khub_cuda_launch_cfg, block) == 20, "khub_cuda_launch_cfg.block");
    _Static_assert(offsetof(khub_cuda_launch_cfg, shared_bytes) == 32,
                   "khub_cuda_launch_cfg.shared_bytes");
    _Static_assert(offsetof(khub_cuda_launch_cfg, reserved) == 36, "khub_cuda_launch_cfg.reserved");
    _Static_assert(offsetof(khub_cuda_launch_cfg, stream) == 40, "khub_cuda_launch_cfg.stream");
    _Static_assert(sizeof(khub_host_api) == 208,
                   "khub_host_api"); /* 160 in ABI 1.0 and 1.1, 176 in 1.2-1.4 */
    KHUB_LAYOUT_HEADER(khub_host_api);
    _Static_assert(offsetof(khub_host_api, host_ctx) == 8, "khub_host_api.host_ctx");
    _Static_assert(offsetof(khub_host_api, log) == 16, "khub_host_api.log");
    _Static_assert(offsetof(khub_host_api, fail) == 24, "khub_host_api.fail");
    _Static_assert(offsetof(khub_host_api, alloc) == 32, "khub_host_api.alloc");
    _Static_assert(offsetof(khub_host_api, free) == 40, "khub_host_api.free");
    _Static_assert(offsetof(khub_host_api, parallel_for) == 48, "khub_host_api.parallel_for");
    _Static_assert(offsetof(khub_host_api, n_threads) == 56, "khub_host_api.n_threads");
    _Static_assert(offsetof(khub_host_api, cpu_features) == 64, "khub_host_api.cpu_features");
    _Static_assert(offsetof(khub_host_api, cuda_device_count) == 72,
                   "khub_host_api.cuda_device_count");
    _Static_assert(offsetof(khub_host_api, cuda_device_cc) == 80, "khub_host_api.cuda_device_cc");
    _Static_assert(offsetof(khub_host_api, cuda_mem_alloc) == 88, "khub_host_api.cuda_mem_alloc");
    _Static_assert(offsetof(khub_host_api, cuda_mem_free) == 96, "khub_host_api.cuda_mem_free");
    _Static_assert(offsetof(khub_host_api, cuda_memcpy_htod) == 104,
                   "khub_host_api.cuda_memcpy_htod");
    _Static_assert(offsetof(khub_host_api, cuda_memcpy_dtoh) == 112,
                   "khub_host_api.cuda_memcpy_dtoh");
    _Static_assert(offsetof(khub_host_api, cuda_stream_sync) == 120,
                   "khub_host_api.cuda_stream_sync");
    _Static_assert(offsetof(khub_host_api, cuda_module_load) == 128,
                   "khub_host_api.cuda_module_load");
    _Static_assert(offsetof(khub_host_api, cuda_module_function) == 136,
                   "khub_host_api.cuda_module_function");
    _Static_assert(offsetof(khub_host_api, cuda_launch) == 144, "khub_host_api.cuda_launch");
    _Static_assert(offsetof(khub_host_api, artifact) == 152, "khub_host_api.artifact");
    /* added in ABI 1.2 */
    _Static_assert(offsetof(khub_host_api, cuda_stream_create) == 160,
                   "khub_host_api.cuda_stream_create");
    _Static_assert(offsetof(khub_host_api, cuda_stream_destroy) == 168,
                   "khub_host_api.cuda_stream_destroy");
    /* added in ABI 1.5 */
    _Static_assert(offsetof(khub_host_api, comm_info) == 176, "khub_host_api.comm_info");
    _Static_assert(offsetof(khub_host_api, comm_all_reduce_sum) == 184,
                   "khub_host_api.comm_all_reduce_sum");
    _Static_assert(offsetof(khub_host_api, comm_all_gather) == 192,
                   "khub_host_api.comm_all_gather");
    _Static_assert(offsetof(khub_host_api, cuda_module_compile) == 200,
                   "khub_host_api.cuda_module_compile");
    _Static_assert(sizeof(khub_op_caps) == 88,
                   "khub_op_caps"); /* 56 in 1.0-1.2, 72 in 1.3, 80 in 1.4 */
    KHUB_LAYOUT_HEADER(khub_op_caps);
    _Static_assert(offsetof(khub_op_caps, device_type) == 8, "khub_op_caps.device_type");
    _Static_assert(offsetof(khub_op_caps, cpu_features) == 12, "khub_op_caps.cpu_features");
    _Static_assert(offsetof(khub_op_caps, dtypes) == 16, "khub_op_caps.dtypes");
    _Static_assert(offsetof(khub_op_caps, head_dims) == 24, "khub_op_caps.head_dims");
    _Static_assert(offsetof(khub_op_caps, n_head_dims) == 32, "khub_op_caps.n_head_dims");
    _Static_assert(offsetof(khub_op_caps, flags) == 36, "khub_op_caps.flags");
    _Static_assert(offsetof(khub_op_caps, cc_min) == 40, "khub_op_caps.cc_min");
    _Static_assert(offsetof(khub_op_caps, cc_max) == 42, "khub_op_caps.cc_max");
    _Static_assert(offsetof(khub_op_caps, ptx_isa) == 44, "khub_op_caps.ptx_isa");
    _Static_assert(offsetof(khub_op_caps, reserved) == 46, "khub_op_caps.reserved");
    _Static_assert(offsetof(khub_op_caps, priority) == 48, "khub_op_caps.priority");
    _Static_assert(offsetof(khub_op_caps, reserved2) == 52, "khub_op_caps.reserved2");
    /* added in ABI 1.3 */
    _Static_assert(offsetof(khub_op_caps, kind_flags) == 56, "khub_op_caps.kind_flags");
    _Static_assert(offsetof(khub_op_caps, act_dtypes) == 64, "khub_op_caps.act_dtypes");
    /* added in ABI 1.4 */
    _Static_assert(offsetof(khub_op_caps, kv_layouts) == 72, "khub_op_caps.kv_layouts");
    /* added in ABI 1.5 */
    _Static_assert(offsetof(khub_op_caps, stream_bytes) == 80, "khub_op_caps.stream_bytes");
    _Static_assert(sizeof(khub_op_desc) == 48, "khub_op_desc");
    KHUB_LAYOUT_HEADER(khub_op_desc);
    _Static_assert(offsetof(khub_op_desc, name) == 8, "khub_op_desc.name");
    _Static_assert(offsetof(khub_op_desc, kind) == 16, "khub_op_desc.kind");
    _Static_assert(offsetof(khub_op_desc, reserved) == 20, "khub_op_desc.reserved");
    _Static_assert(offsetof(khub_op_desc, caps) == 24, "khub_op_desc.caps");
    _Static_assert(offsetof(khub_op_desc, run) == 32, "khub_op_desc.run");
    _Static_assert(offsetof(khub_op_desc, methods) == 40, "khub_op_desc.methods");
    _Static_assert(sizeof(khub_plugin_desc) == 88, "khub_plugin_desc"); /* 80 in 1.0-1.4 */
    KHUB_LAYOUT_HEADER(khub_plugin_desc);
    _Static_assert(offsetof(khub_plugin_desc, id) == 8, "khub_plugin_desc.id");
    _Static_assert(offsetof(khub_plugin_desc, version) == 16, "khub_plugin_desc.version");
    _Static_assert(offsetof(khub_plugin_desc, n_ops) == 24, "khub_plugin_desc.n_ops");
    _Static_assert(offsetof(khub_plugin_desc, reserved) == 28, "khub_plugin_desc.reserved");
    _Static_assert(offsetof(khub_plugin_desc, ops) == 32, "khub_plugin_desc.ops");
    _Static_assert(offsetof(khub_plugin_desc, state) == 40, "khub_plugin_desc.state");
    _Static_assert(offsetof(khub_plugin_desc, score) == 48, "khub_plugin_desc.score");
    _Static_assert(offsetof(khub_plugin_desc, selftest) == 56, "khub_plugin_desc.selftest");
    _Static_assert(offsetof(khub_plugin_desc, quiesce) == 64, "khub_plugin_desc.quiesce");
    _Static_assert(offsetof(khub_plugin_desc, shutdown) == 72, "khub_plugin_desc.shutdown");
    /* added in ABI 1.5 */
    _Static_assert(offsetof(khub_plugin_desc, stream_end) == 80, "khub_plugin_desc.stream_end");
    _Static_assert(sizeof(khub_linear_args) == 48, "khub_linear_args");
    KHUB_LAYOUT_HEADER(khub_linear_args);
    _Static_assert(offsetof(khub_linear_args, stream) == 8, "khub_linear_args.stream");
    _Static_assert(offsetof(khub_linear_args, x) == 16, "khub_linear_args.x");
    _Static_assert(offsetof(khub_linear_args, weight) == 24, "khub_linear_args.weight");
    _Static_assert(offsetof(khub_linear_args, bias) == 32, "khub_linear_args.bias");
    _Static_assert(offsetof(khub_linear_args, y) == 40, "khub_linear_args.y");
    _Static_assert(sizeof(khub_quant_args) == 48, "khub_quant_args");
    KHUB_LAYOUT_HEADER(khub_quant_args);
    _Static_assert(offsetof(khub_quant_args, format) == 8, "khub_quant_args.format");
    _Static_assert(offsetof(khub_quant_args, reserved) == 12, "khub_quant_args.reserved");
    _Static_assert(offsetof(khub_quant_args, n_rows) == 16, "khub_quant_args.n_rows");
    _Static_assert(offsetof(khub_quant_args, n_cols) == 24, "khub_quant_args.n_cols");
    _Static_assert(offsetof(khub_quant_args, src) == 32, "khub_quant_args.src");
    _Static_assert(offsetof(khub_quant_args, dst) == 40, "khub_quant_args.dst");
    _Static_assert(sizeof(khub_qlinear_methods) == 24, "khub_qlinear_methods");
    KHUB_LAYOUT_HEADER(khub_qlinear_methods);
    _Static_assert(offsetof(khub_qlinear_methods, quantize) == 8, "khub_qlinear_methods.quantize");
    _Static_assert(offsetof(khub_qlinear_methods, dequantize) == 16,
                   "khub_qlinear_methods.dequantize");
    _Static_assert(sizeof(khub_attention_args) == 88, "khub_attention_args"); /* 80 in 1.0-1.4 */
    KHUB_LAYOUT_HEADER(khub_attention_args);
    _Static_assert(offsetof(khub_attention_args, stream) == 8, "khub_attention_args.stream");
    _Static_assert(offsetof(khub_attention_args, q) == 16, "khub_attention_args.q");
    _Static_assert(offsetof(khub_attention_args, k) == 24, "khub_attention_args.k");
    _Static_assert(offsetof(khub_attention_args, v) == 32, "khub_attention_args.v");
    _Static_assert(offsetof(khub_attention_args, mask) == 40, "khub_attention_args.mask");
    _Static_assert(offsetof(khub_attention_args, out) == 48, "khub_attention_args.out");
    _Static_assert(offsetof(khub_attention_args, scale) == 56, "khub_attention_args.scale");
    _Static_assert(offsetof(khub_attention_args, causal) == 60, "khub_attention_args.causal");
    _Static_assert(offsetof(khub_attention_args, q_pos0) == 64, "khub_attention_args.q_pos0");
    _Static_assert(offsetof(khub_attention_args, window) == 72, "khub_attention_args.window");
    _Static_assert(offsetof(khub_attention_args, softcap) == 80, "khub_attention_args.softcap");
    _Static_assert(offsetof(khub_attention_args, reserved_1_5) == 84,
                   "khub_attention_args.reserved_1_5");
    _Static_assert(sizeof(khub_norm_args) == 56, "khub_norm_args");
    KHUB_LAYOUT_HEADER(khub_norm_args);
    _Static_assert(offsetof(khub_norm_args, stream) == 8, "khub_norm_args.stream");
    _Static_assert(offsetof(khub_norm_args, norm_type) == 16, "khub_norm_args.norm_type");
    _Static_assert(offsetof(khub_norm_args, eps) == 20, "khub_norm_args.eps");
    _Static_assert(offsetof(khub_norm_args, x) == 24, "khub_norm_args.x");
    _Static_assert(offsetof(khub_norm_args, residual) == 32, "khub_norm_args.residual");
    _Static_assert(offsetof(khub_norm_args, weight) == 40, "khub_norm_args.weight");
    _Static_assert(offsetof(khub_norm_args, y) == 48, "khub_norm_args.y");
    _Static_assert(sizeof(khub_activation_args) == 48, "khub_activation_args");
    KHUB_LAYOUT_HEADER(khub_activation_args);
    _Static_assert(offsetof(khub_activation_args, stream) == 8, "khub_activation_args.stream");
    _Static_assert(offsetof(khub_activation_args, act_type) == 16, "khub_activation_args.act_type");
    _Static_assert(offsetof(khub_activation_args, reserved) == 20, "khub_activation_args.reserved");
    _Static_assert(offsetof(khub_activation_args, gate) == 24, "khub_activation_args.gate");
    _Static_assert(offsetof(khub_activation_args, up) == 32, "khub_activation_args.up");
    _Static_assert(offsetof(khub_activation_args, y) == 40, "khub_activation_args.y");
    _Static_assert(sizeof(khub_rotary_args) == 64, "khub_rotary_args");
    KHUB_LAYOUT_HEADER(khub_rotary_args);
    _Static_assert(offsetof(khub_rotary_args, stream) == 8, "khub_rotary_args.stream");
    _Static_assert(offsetof(khub_rotary_args, x) == 16, "khub_rotary_args.x");
    _Static_assert(offsetof(khub_rotary_args, positions) == 24, "khub_rotary_args.positions");
    _Static_assert(offsetof(khub_rotary_args, style) == 32, "khub_rotary_args.style");
    _Static_assert(offsetof(khub_rotary_args, scaling) == 36, "khub_rotary_args.scaling");
    _Static_assert(offsetof(khub_rotary_args, theta) == 40, "khub_rotary_args.theta");
    _Static_assert(offsetof(khub_rotary_args, factor) == 44, "khub_rotary_args.factor");
    _Static_assert(offsetof(khub_rotary_args, low_freq_factor) == 48,
                   "khub_rotary_args.low_freq_factor");
    _Static_assert(offsetof(khub_rotary_args, high_freq_factor) == 52,
                   "khub_rotary_args.high_freq_factor");
    _Static_assert(offsetof(khub_rotary_args, original_max_pos) == 56,
                   "khub_rotary_args.original_max_pos");
    _Static_assert(offsetof(khub_rotary_args, rotary_dim) == 60, "khub_rotary_args.rotary_dim");
    _Static_assert(sizeof(khub_kv_cache_config) == 80,
                   "khub_kv_cache_config"); /* 40 in 1.0-1.3, 72 in 1.4 */
    KHUB_LAYOUT_HEADER(khub_kv_cache_config);
    _Static_assert(offsetof(khub_kv_cache_config, n_layers) == 8, "khub_kv_cache_config.n_layers");
    _Static_assert(offsetof(khub_kv_cache_config, n_kv_heads) == 12,
                   "khub_kv_cache_config.n_kv_heads");
    _Static_assert(offsetof(khub_kv_cache_config, head_dim) == 16, "khub_kv_cache_config.head_dim");
    _Static_assert(offsetof(khub_kv_cache_config, n_seqs) == 20, "khub_kv_cache_config.n_seqs");
    _Static_assert(offsetof(khub_kv_cache_config, max_tokens) == 24,
                   "khub_kv_cache_config.max_tokens");
    _Static_assert(offsetof(khub_kv_cache_config, dtype) == 32, "khub_kv_cache_config.dtype");
    _Static_assert(offsetof(khub_kv_cache_config, reserved) == 36, "khub_kv_cache_config.reserved");
    /* added in ABI 1.4 */
    _Static_assert(offsetof(khub_kv_cache_config, options) == 40, "khub_kv_cache_config.options");
    _Static_assert(offsetof(khub_kv_cache_config, layer_window) == 48,
                   "khub_kv_cache_config.layer_window");
    _Static_assert(sizeof(khub_kv_cache_memory) == 40, "khub_kv_cache_memory"); /* ABI 1.4 */
    KHUB_LAYOUT_HEADER(khub_kv_cache_memory);
    _Static_assert(offsetof(khub_kv_cache_memory, bytes_total) == 8,
                   "khub_kv_cache_memory.bytes_total");
    _Static_assert(offsetof(khub_kv_cache_memory, bytes_per_token) == 16,
                   "khub_kv_cache_memory.bytes_per_token");
    _Static_assert(offsetof(khub_kv_cache_memory, tokens_capacity) == 24,
                   "khub_kv_cache_memory.tokens_capacity");
    _Static_assert(offsetof(khub_kv_cache_memory, tokens_used) == 32,
                   "khub_kv_cache_memory.tokens_used");
    _Static_assert(offsetof(khub_kv_cache_config, block_size) == 56,
                   "khub_kv_cache_config.block_size");
    _Static_assert(offsetof(khub_kv_cache_config, n_blocks) == 60, "khub_kv_cache_config.n_blocks");
    _Static_assert(offsetof(khub_kv_cache_config, max_bytes) == 64,
                   "khub_kv_cache_config.max_bytes");
    /* added in ABI 1.5 */
    _Static_assert(offsetof(khub_kv_cache_config, ctx) == 72, "khub_kv_cache_config.ctx");
    _Static_assert(sizeof(khub_kv_write_args) == 48, "khub_kv_write_args"); /* 40 in 1.0-1.4 */
    KHUB_LAYOUT_HEADER(khub_kv_write_args);
    _Static_assert(offsetof(khub_kv_write_args, layer) == 8, "khub_kv_write_args.layer");
    _Static_assert(offsetof(khub_kv_write_args, seq) == 12, "khub_kv_write_args.seq");
    _Static_assert(offsetof(khub_kv_write_args, pos) == 16, "khub_kv_write_args.pos");
    _Static_assert(offsetof(khub_kv_write_args, k) == 24, "khub_kv_write_args.k");
    _Static_assert(offsetof(khub_kv_write_args, v) == 32, "khub_kv_write_args.v");
    /* added in ABI 1.5 */
    _Static_assert(offsetof(khub_kv_write_args, ctx) == 40, "khub_kv_write_args.ctx");
    _Static_assert(sizeof(khub_kv_cache_methods) == 88,
                   "khub_kv_cache_methods"); /* 48 in 1.0-1.3 */
    KHUB_LAYOUT_HEADER(khub_kv_cache_methods);
    _Static_assert(offsetof(khub_kv_cache_methods, create) == 8, "khub_kv_cache_methods.create");
    _Static_assert(offsetof(khub_kv_cache_methods, destroy) == 16, "khub_kv_cache_methods.destroy");
    _Static_assert(offsetof(khub_kv_cache_methods, write) == 24, "khub_kv_cache_methods.write");
    _Static_assert(offsetof(khub_kv_cache_methods, view) == 32, "khub_kv_cache_methods.view");
    _Static_assert(offsetof(khub_kv_cache_methods, truncate) == 40,
                   "khub_kv_cache_methods.truncate");
    /* added in ABI 1.4 */
    _Static_assert(offsetof(khub_kv_cache_methods, memory) == 48, "khub_kv_cache_methods.memory");
    _Static_assert(offsetof(khub_kv_cache_methods, view_from) == 56,
                   "khub_kv_cache_methods.view_from");
    _Static_assert(offsetof(khub_kv_cache_methods, reserve) == 64, "khub_kv_cache_methods.reserve");
    _Static_assert(offsetof(khub_kv_cache_methods, release) == 72, "khub_kv_cache_methods.release");
    _Static_assert(offsetof(khub_kv_cache_methods, paged_view) == 80,
                   "khub_kv_cache_methods.paged_view");
    _Static_assert(sizeof(khub_kv_paged_view) == 72, "khub_kv_paged_view");
    KHUB_LAYOUT_HEADER(khub_kv_paged_view);
    _Static_assert(offsetof(khub_kv_paged_view, layout) == 8, "khub_kv_paged_view.layout");
    _Static_assert(offsetof(khub_kv_paged_view, block_size) == 12, "khub_kv_paged_view.block_size");
    _Static_assert(offsetof(khub_kv_paged_view, k_pool) == 16, "khub_kv_paged_view.k_pool");
    _Static_assert(offsetof(khub_kv_paged_view, v_pool) == 24, "khub_kv_paged_view.v_pool");
    _Static_assert(offsetof(khub_kv_paged_view, k_scales) == 32, "khub_kv_paged_view.k_scales");
    _Static_assert(offsetof(khub_kv_paged_view, v_scales) == 40, "khub_kv_paged_view.v_scales");
    _Static_assert(offsetof(khub_kv_paged_view, block_table) == 48,
                   "khub_kv_paged_view.block_table");
    _Static_assert(offsetof(khub_kv_paged_view, block_table_stride) == 56,
                   "khub_kv_paged_view.block_table_stride");
    _Static_assert(offsetof(khub_kv_paged_view, n_blocks) == 64, "khub_kv_paged_view.n_blocks");
    _Static_assert(offsetof(khub_kv_paged_view, n_free) == 68, "khub_kv_paged_view.n_free");
    _Static_assert(sizeof(khub_call_ctx) == 48, "khub_call_ctx");
    KHUB_LAYOUT_HEADER(khub_call_ctx);
    _Static_assert(offsetof(khub_call_ctx, device) == 8, "khub_call_ctx.device");
    _Static_assert(offsetof(khub_call_ctx, stream) == 16, "khub_call_ctx.stream");
    _Static_assert(offsetof(khub_call_ctx, workspace) == 24, "khub_call_ctx.workspace");
    _Static_assert(offsetof(khub_call_ctx, workspace_bytes) == 32, "khub_call_ctx.workspace_bytes");
    _Static_assert(offsetof(khub_call_ctx, n_threads) == 40, "khub_call_ctx.n_threads");
    _Static_assert(offsetof(khub_call_ctx, reserved) == 44, "khub_call_ctx.reserved");
    _Static_assert(sizeof(khub_embedding_args) == 72, "khub_embedding_args"); /* 1.5 */
    KHUB_LAYOUT_HEADER(khub_embedding_args);
    _Static_assert(offsetof(khub_embedding_args, ctx) == 8, "khub_embedding_args.ctx");
    _Static_assert(offsetof(khub_embedding_args, table) == 16, "khub_embedding_args.table");
    _Static_assert(offsetof(khub_embedding_args, ids) == 24, "khub_embedding_args.ids");
    _Static_assert(offsetof(khub_embedding_args, y) == 32, "khub_embedding_args.y");
    _Static_assert(offsetof(khub_embedding_args, n) == 40, "khub_embedding_args.n");
    _Static_assert(offsetof(khub_embedding_args, scale) == 48, "khub_embedding_args.scale");
    _Static_assert(offsetof(khub_embedding_args, reserved) == 52, "khub_embedding_args.reserved");
    _Static_assert(offsetof(khub_embedding_args, reserved2) == 56, "khub_embedding_args.reserved2");
    _Static_assert(sizeof(khub_paged_attention_args) == 152,
                   "khub_paged_attention_args"); /* 144 in 1.4 */
    KHUB_LAYOUT_HEADER(khub_paged_attention_args);
    _Static_assert(offsetof(khub_paged_attention_args, ctx) == 8, "khub_paged_attention_args.ctx");
    _Static_assert(offsetof(khub_paged_attention_args, layout) == 16,
                   "khub_paged_attention_args.layout");
    _Static_assert(offsetof(khub_paged_attention_args, n_seqs) == 20,
                   "khub_paged_attention_args.n_seqs");
    _Static_assert(offsetof(khub_paged_attention_args, q) == 24, "khub_paged_attention_args.q");
    _Static_assert(offsetof(khub_paged_attention_args, out) == 32, "khub_paged_attention_args.out");
    _Static_assert(offsetof(khub_paged_attention_args, k_pool) == 40,
                   "khub_paged_attention_args.k_pool");
    _Static_assert(offsetof(khub_paged_attention_args, v_pool) == 48,
                   "khub_paged_attention_args.v_pool");
    _Static_assert(offsetof(khub_paged_attention_args, k_scales) == 56,
                   "khub_paged_attention_args.k_scales");
    _Static_assert(offsetof(khub_paged_attention_args, v_scales) == 64,
                   "khub_paged_attention_args.v_scales");
    _Static_assert(offsetof(khub_paged_attention_args, cu_seqlens_q) == 72,
                   "khub_paged_attention_args.cu_seqlens_q");
    _Static_assert(offsetof(khub_paged_attention_args, q_pos0) == 80,
                   "khub_paged_attention_args.q_pos0");
    _Static_assert(offsetof(khub_paged_attention_args, kv_lens) == 88,
                   "khub_paged_attention_args.kv_lens");
    _Static_assert(offsetof(khub_paged_attention_args, block_table) == 96,
                   "khub_paged_attention_args.block_table");
    _Static_assert(offsetof(khub_paged_attention_args, seq_rows) == 104,
                   "khub_paged_attention_args.seq_rows");
    _Static_assert(offsetof(khub_paged_attention_args, block_table_stride) == 112,
                   "khub_paged_attention_args.block_table_stride");
    _Static_assert(offsetof(khub_paged_attention_args, block_size) == 120,
                   "khub_paged_attention_args.block_size");
    _Static_assert(offsetof(khub_paged_attention_args, scale) == 124,
                   "khub_paged_attention_args.scale");
    _Static_assert(offsetof(khub_paged_attention_args, causal) == 128,
                   "khub_paged_attention_args.causal");
    _Static_assert(offsetof(khub_paged_attention_args, reserved) == 132,
                   "khub_paged_attention_args.reserved");
    _Static_assert(offsetof(khub_paged_attention_args, window) == 136,
                   "khub_paged_attention_args.window");
    _Static_assert(offsetof(khub_paged_attention_args, softcap) == 144,
                   "khub_paged_attention_args.softcap");
    _Static_assert(offsetof(khub_paged_attention_args, reserved_1_5) == 148,
                   "khub_paged_attention_args.reserved_1_5");
}
#endif

/* Values that are ABI too. */
_Static_assert(KHUB_ABI_MAJOR == 1, "ABI major");
_Static_assert(KHUB_OP_ATTENTION == 1 && KHUB_OP_LINEAR == 2 && KHUB_OP_QLINEAR == 3 &&
                   KHUB_OP_KV_CACHE == 4 && KHUB_OP_NORM == 5 && KHUB_OP_ACTIVATION == 6 &&
                   KHUB_OP_ROTARY == 7,
               "op kinds");
_Static_assert(KHUB_QFORMAT_Q8_0 == 1 && KHUB_QFORMAT_Q4_0 == 2 && KHUB_QFORMAT_Q4_1 == 3 &&
                   KHUB_QFORMAT_Q4_K == 4 && KHUB_QFORMAT_Q6_K == 5 && KHUB_QFORMAT_INT8_ROW == 6 &&
                   KHUB_QFORMAT_NF4 == 7,
               "quant formats");
/* added in ABI 1.1 */
_Static_assert(KHUB_QFORMAT_Q5_0 == 8 && KHUB_QFORMAT_Q5_1 == 9 && KHUB_QFORMAT__COUNT == 10,
               "quant formats 1.1");
_Static_assert(KHUB_ABI_MINOR >= 1, "ABI 1.1 has Q5_0 and Q5_1");
_Static_assert(KHUB_ABI_MINOR >= 2, "ABI 1.2 has cuda_stream_create/destroy");
_Static_assert(KHUB_ABI_MINOR >= 3, "ABI 1.3 has per-kind caps flags and activation dtypes");
_Static_assert(KHUB_ABI_MINOR >= 4, "ABI 1.4 has paged attention and paged KV caches");
/* added in ABI 1.4 */
_Static_assert(KHUB_OP_PAGED_ATTENTION == 8, "op kinds 1.4");
_Static_assert(KHUB_KV_LAYOUT_NONE == 0 && KHUB_KV_LAYOUT_PAGED_HTD == 1 &&
                   KHUB_KV_LAYOUT_PAGED_HTD_Q8 == 2,
               "paged KV layouts");
_Static_assert(KHUB_STATUS_KV_FULL == 404, "status KV_FULL");
/* added in ABI 1.5 */
_Static_assert(KHUB_ABI_MINOR >= 5, "ABI 1.5 has attention logit soft-capping");
_Static_assert(KHUB_ATTN_SOFTCAP == 256, "attention flag softcap (kind bit 8)");
_Static_assert(KHUB_OP_EMBEDDING == 9 && KHUB_OP_KIND__COUNT == 10, "op kinds 1.5");
_Static_assert(KHUB_EMBEDDING_SCALE == 256 && KHUB_EMBEDDING_STRIDED_OUT == 512,
               "embedding flags (kind bits 8, 9)");
/* added in ABI 1.3: per-kind flags; bits 0-7 are the 1.0 word's */
_Static_assert(KHUB_ATTN_CAUSAL == 1 && KHUB_ATTN_GQA == 2 && KHUB_ATTN_MASK == 4 &&
                   KHUB_ATTN_STRIDED_KV == 8 && KHUB_ATTN_KV_F16 == 16 && KHUB_ATTN_SLIDING == 32 &&
                   KHUB_LINEAR_BIAS == 64 && KHUB_NORM_RESIDUAL == 128 &&
                   KHUB_KV_CACHE_STRIDED_VIEW == 8 && KHUB_KV_CACHE_F16 == 16,
               "per-kind flags");
_Static_assert(KHUB_CAP_CAUSAL == 1 && KHUB_CAP_GQA == 2 && KHUB_CAP_MASK == 4 &&
                   KHUB_CAP_STRIDED_KV == 8 && KHUB_CAP_KV_F16 == 16 && KHUB_CAP_SLIDING == 32 &&
                   KHUB_CAP_BIAS == 64 && KHUB_CAP_RESIDUAL == 128,
               "the 1.0 flags word");
_Static_assert(KHUB_DEVICE_CPU == 1 && KHUB_DEVICE_CUDA == 2, "DLPack device codes");
_Static_assert(KHUB_DL_INT == 0 && KHUB_DL_UINT == 1 && KHUB_DL_FLOAT == 2 && KHUB_DL_BFLOAT == 4,
               "DLPack dtype codes");
_Static_assert(KHUB_NOTE_TYPE == 0x4b480001u, "note type");
