"""ctypes declarations of libkhub's public C API (abi/khub/*.h).

Every struct here mirrors its C declaration field by field, in order; the
layout test (python/tests/test_layout.py) compiles the C headers and compares
each struct's size and every field's offset with these. Structs crossing the
boundary carry KHUB_STRUCT_HEADER (struct_size, abi_major, abi_minor), which
make() fills as KHUB_STRUCT_INIT does.
"""
import ctypes
import ctypes.util
import glob
import os
import subprocess

# khub_version.h: the plugin ABI these declarations follow.
ABI_MAJOR = 1
ABI_MINOR = 5
ERROR_SIZE = 512

c_char_p = ctypes.c_char_p
c_void_p = ctypes.c_void_p
i32, u32, i64, u64 = ctypes.c_int32, ctypes.c_uint32, ctypes.c_int64, ctypes.c_uint64
u16, u8 = ctypes.c_uint16, ctypes.c_uint8

HEADER = [("struct_size", u32), ("abi_major", u16), ("abi_minor", u16)]


def make(cls, **fields):
    """A zeroed cls with its header set (KHUB_STRUCT_INIT) and fields given."""
    s = cls()
    s.struct_size = ctypes.sizeof(cls)
    s.abi_major = ABI_MAJOR
    s.abi_minor = ABI_MINOR
    for k, v in fields.items():
        setattr(s, k, v)
    return s


# khub.h ---------------------------------------------------------------------

LOG_FN = ctypes.CFUNCTYPE(None, c_void_p, ctypes.c_int, c_char_p)
REALLOC_FN = ctypes.CFUNCTYPE(c_void_p, c_void_p, c_void_p, ctypes.c_size_t, ctypes.c_size_t)


class Allocator(ctypes.Structure):
    _fields_ = [("realloc", REALLOC_FN), ("ud", c_void_p)]


class RuntimeOpts(ctypes.Structure):
    _fields_ = HEADER + [
        ("allocator", Allocator),
        ("n_threads", i32),
        ("reserved", u32),
        ("log", LOG_FN),
        ("log_ud", c_void_p),
    ]


class OpCaps(ctypes.Structure):
    _fields_ = HEADER + [
        ("device_type", u32),
        ("cpu_features", u32),
        ("dtypes", u64),
        ("head_dims", ctypes.POINTER(i32)),
        ("n_head_dims", u32),
        ("flags", u32),
        ("cc_min", u16),
        ("cc_max", u16),
        ("ptx_isa", u16),
        ("reserved", u16),
        ("priority", i32),
        ("reserved2", u32),
        ("kind_flags", u64),  # ABI 1.3
        ("act_dtypes", u64),  # ABI 1.3
        ("kv_layouts", u64),  # ABI 1.4: KHUB_KV_LAYOUT_BIT mask
        ("stream_bytes", u64),  # ABI 1.5: device bytes kept per stream
    ]


class OpDesc(ctypes.Structure):
    _fields_ = HEADER + [
        ("name", c_char_p),
        ("kind", u32),
        ("reserved", u32),
        ("caps", ctypes.POINTER(OpCaps)),
        ("run", c_void_p),
        ("methods", c_void_p),
    ]


class OpQuery(ctypes.Structure):
    _fields_ = HEADER + [
        ("kind", u32),
        ("device_type", u32),
        ("dtype_id", i32),
        ("head_dim", i32),
        ("flags", u32),
        ("reserved", u32),
        ("plugin_id", c_char_p),
        ("op_name", c_char_p),
        ("kind_flags", u64),  # ABI 1.3
        ("act_dtype_id", i32),
        ("reserved2", u32),
        ("kv_layout", u32),  # plugin ABI 1.4: a paged KV layout, 0 = any
        ("reserved3", u32),
    ]


# khub_tensor.h --------------------------------------------------------------


class Device(ctypes.Structure):
    _fields_ = [("device_type", i32), ("device_id", i32)]


class Dtype(ctypes.Structure):
    _fields_ = [("code", u8), ("bits", u8), ("lanes", u16)]


# khub_model.h ---------------------------------------------------------------

PROGRESS_FN = ctypes.CFUNCTYPE(None, c_void_p, i32, i32)
STREAM_FN = ctypes.CFUNCTYPE(ctypes.c_int, c_void_p, i32, ctypes.POINTER(ctypes.c_char),
                             ctypes.c_size_t)


class ModelOpts(ctypes.Structure):
    _fields_ = HEADER + [
        ("n_threads", i32),
        ("device", Device),
        ("attn_impl", c_char_p),
        ("quant", c_char_p),
        ("cache_impl", c_char_p),
        ("norm_impl", c_char_p),
        ("act_impl", c_char_p),
        ("rotary_impl", c_char_p),
        ("strict", i32),
        ("quant_embeddings", i32),
        ("max_context", i64),
        ("kv_dtype", Dtype),
        ("reserved", u32),
        ("linear_impl", c_char_p),
        ("max_batch", i32),
        ("max_seqs", i32),
        ("progress", PROGRESS_FN),
        ("progress_ud", c_void_p),
        ("kv_block_size", i32),  # paged cache pool (plugin ABI 1.4)
        ("kv_num_blocks", i32),
        ("kv_max_bytes", u64),
        ("tp_size", i32),  # tensor parallelism (issue 18); the binding passes no comm
        ("tp_plan", i32),  # enum khub_tp_plan (0.1's reserved2)
        ("comm", ctypes.c_void_p),
        ("embed_impl", c_char_p),  # the embedding role's plugin (0.2)
    ]


class ModelInfo(ctypes.Structure):
    _fields_ = HEADER + [
        ("arch", ctypes.c_char * 32),
        ("format", ctypes.c_char * 16),
        ("n_layers", i32),
        ("hidden", i32),
        ("n_heads", i32),
        ("n_kv_heads", i32),
        ("head_dim", i32),
        ("ffn", i32),
        ("vocab", i32),
        ("n_eos", i32),
        ("context_length", i64),
        ("max_context", i64),
        ("n_params", u64),
        ("weight_bytes", u64),
        ("scratch_bytes", u64),
        ("load_ms", ctypes.c_double),
        ("eos", i32 * 8),
        ("bos", i32),
        ("reserved", u32),
        ("kv_bytes_per_token", u64),  # plugin ABI 1.4
        ("tp_rank", i32),  # tensor parallelism (issue 18)
        ("tp_size", i32),
        ("tp_collectives", u64),
        ("tp_comm_ns", u64),
    ]


class GenerateOpts(ctypes.Structure):
    _fields_ = HEADER + [
        ("max_new_tokens", i32),
        ("temperature", ctypes.c_float),
        ("top_k", i32),
        ("top_p", ctypes.c_float),
        ("repetition_penalty", ctypes.c_float),
        ("seed", u64),
        ("stop", ctypes.POINTER(c_char_p)),
        ("n_stop", u32),
        ("chat", u32),
        ("system", c_char_p),
        ("callback", STREAM_FN),
        ("callback_ud", c_void_p),
        ("ignore_eos", i32),
        ("reserved", u32),
    ]


class SessionInfo(ctypes.Structure):  # khub_session.h
    _fields_ = HEADER + [
        ("n_cached", i64),
        ("max_context", i64),
        ("n_reused", i64),
        ("n_prefilled", i64),
    ]


class GenerateResult(ctypes.Structure):
    _fields_ = HEADER + [
        ("text", ctypes.POINTER(ctypes.c_char)),
        ("text_len", ctypes.c_size_t),
        ("tokens", ctypes.POINTER(i32)),
        ("n_tokens", i64),
        ("n_prompt_tokens", i64),
        ("stop_reason", u32),
        ("reserved", u32),
        ("load_ms", ctypes.c_double),
        ("prefill_ms", ctypes.c_double),
        ("decode_ms", ctypes.c_double),
        ("prefill_tok_s", ctypes.c_double),
        ("decode_tok_s", ctypes.c_double),
    ]


# khub_hub.h and khub_kernels.h ----------------------------------------------


class HubOpts(ctypes.Structure):
    _fields_ = HEADER + [
        ("endpoint", c_char_p),
        ("cache_dir", c_char_p),
        ("token", c_char_p),
        ("offline", i32),
        ("repo_type", u32),
        ("max_tries", i32),
        ("backoff_ms", i32),
        ("timeout_s", i32),
        ("max_retry_after_s", i32),
        ("allocator", Allocator),  # 0.2; zero = the C library's
    ]


class KernelOpts(ctypes.Structure):
    _fields_ = HEADER + [
        ("policy_path", c_char_p),
        ("lock_path", c_char_p),
        ("allow_unsigned", i32),
        ("strict", i32),
        ("allow_name_mismatch", i32),
    ]


class KernelResult(ctypes.Structure):
    _fields_ = HEADER + [
        ("plugin", c_void_p),
        ("plugin_id", ctypes.c_char * 64),
        ("op_name", ctypes.c_char * 128),
        ("repo", ctypes.c_char * 196),
        ("commit", ctypes.c_char * 41),
        ("variant", ctypes.c_char * 128),
        ("file", ctypes.c_char * 128),
        ("trust", ctypes.c_char * 256),
        ("fell_back", i32),
        ("locked", i32),
        ("trace", ctypes.c_char * 2048),
    ]


class ModelKernels(ctypes.Structure):
    _fields_ = HEADER + [
        ("attn", c_char_p),
        ("quant", c_char_p),
        ("cache", c_char_p),
        ("norm", c_char_p),
        ("act", c_char_p),
        ("rotary", c_char_p),
        ("linear", c_char_p),
        ("mapping_path", c_char_p),
        ("lock_path", c_char_p),
        ("policy_path", c_char_p),
        ("allow_unsigned", i32),
        ("strict", i32),
        ("embed", c_char_p),  # the embedding role (0.2), after 0.1's end
    ]


class ModelKernelsReport(ctypes.Structure):
    _fields_ = [("text", ctypes.c_char * 8192)]


# khub_project.h ---------------------------------------------------------------

HUB_NAME_MAX, HUB_REV_MAX, HUB_SYMBOL_MAX = 96, 255, 127


class HubId(ctypes.Structure):
    _fields_ = [
        ("org", ctypes.c_char * (HUB_NAME_MAX + 1)),
        ("name", ctypes.c_char * (HUB_NAME_MAX + 1)),
        ("rev_kind", u32),
        ("version", i32),
        ("revision", ctypes.c_char * (HUB_REV_MAX + 1)),
        ("symbol", ctypes.c_char * (HUB_SYMBOL_MAX + 1)),
    ]


class LockPin(ctypes.Structure):
    _fields_ = HEADER + [
        ("repo", ctypes.c_char * (2 * HUB_NAME_MAX + 2)),
        ("version", i32),
        ("revision", ctypes.c_char * (HUB_REV_MAX + 1)),
        ("commit", ctypes.c_char * 41),
        ("kernel_version", ctypes.c_char * 32),
        ("n_variants", u32),
        ("reserved", u32),
    ]


class LockOpts(ctypes.Structure):
    _fields_ = HEADER + [("commit", c_char_p), ("allow_downgrade", i32), ("reserved", u32)]


class LockResult(ctypes.Structure):
    _fields_ = HEADER + [
        ("pin", LockPin),
        ("replaced", i32),
        ("downgrade", i32),
        ("previous", LockPin),
    ]


class SyncOpts(ctypes.Structure):
    _fields_ = HEADER + [("all_variants", i32), ("reserved", u32)]


class SyncResult(ctypes.Structure):
    _fields_ = HEADER + [
        ("n_checked", u32),
        ("reserved", u32),
        ("newer_version", ctypes.c_char * 32),
        ("newer_commit", ctypes.c_char * 41),
    ]


# The library ------------------------------------------------------------------

P = ctypes.POINTER
STATUS = ctypes.c_int  # khub_status, an enum

# name: (restype, argtypes)
SIGNATURES = {
    "khub_version_num": (ctypes.c_uint, []),
    "khub_version_str": (c_char_p, []),
    "khub_status_name": (c_char_p, [STATUS]),
    "khub_status_str": (c_char_p, [STATUS]),
    "khub_op_kind_name": (c_char_p, [u32]),
    "khub_last_error": (c_char_p, []),
    "khub_runtime_new": (STATUS, [P(RuntimeOpts), P(c_void_p)]),
    "khub_runtime_free": (None, [c_void_p]),
    "khub_runtime_errmsg": (c_char_p, [c_void_p]),
    "khub_runtime_set_option": (STATUS, [c_void_p, ctypes.c_int, i64]),
    "khub_runtime_get_option": (STATUS, [c_void_p, ctypes.c_int, P(i64)]),
    "khub_plugin_load": (STATUS, [c_void_p, c_char_p, c_char_p, P(c_void_p)]),
    "khub_plugin_load_builtin": (STATUS, [c_void_p]),
    "khub_plugin_count": (ctypes.c_size_t, [c_void_p]),
    "khub_plugin_at": (c_void_p, [c_void_p, ctypes.c_size_t]),
    "khub_plugin_id": (c_char_p, [c_void_p]),
    "khub_plugin_version": (c_char_p, [c_void_p]),
    "khub_plugin_path": (c_char_p, [c_void_p]),
    "khub_plugin_sha256": (c_char_p, [c_void_p]),
    "khub_plugin_abi": (None, [c_void_p, P(u16), P(u16)]),
    "khub_plugin_op_count": (u32, [c_void_p]),
    "khub_plugin_op": (P(OpDesc), [c_void_p, u32]),
    "khub_registry_select": (STATUS, [c_void_p, P(OpQuery), P(c_void_p)]),
    "khub_binding_name": (c_char_p, [c_void_p]),
    "khub_binding_trace": (c_char_p, [c_void_p]),
    "khub_model_load": (STATUS, [c_void_p, c_char_p, P(ModelOpts), P(c_void_p)]),
    "khub_model_free": (None, [c_void_p]),
    "khub_model_info_get": (STATUS, [c_void_p, P(ModelInfo)]),
    "khub_model_explain": (c_char_p, [c_void_p]),
    "khub_model_tokenize": (STATUS, [c_void_p, c_char_p, ctypes.c_int, P(i32), ctypes.c_size_t,
                                     P(ctypes.c_size_t)]),
    "khub_model_detokenize": (STATUS, [c_void_p, P(i32), ctypes.c_size_t, P(ctypes.c_char),
                                       ctypes.c_size_t, P(ctypes.c_size_t)]),
    "khub_model_generate": (STATUS, [c_void_p, P(c_char_p), ctypes.c_size_t, P(GenerateOpts),
                                     P(GenerateResult)]),
    "khub_generate_results_free": (None, [c_void_p, P(GenerateResult), ctypes.c_size_t]),
    "khub_model_chat_format": (STATUS, [c_void_p, P(c_char_p), P(c_char_p), ctypes.c_size_t,
                                        ctypes.c_int, P(ctypes.c_char), ctypes.c_size_t,
                                        P(ctypes.c_size_t)]),
    "khub_session_new": (STATUS, [c_void_p, P(c_void_p)]),
    "khub_session_free": (None, [c_void_p]),
    "khub_session_generate": (STATUS, [c_void_p, c_char_p, P(GenerateOpts), P(GenerateResult)]),
    "khub_session_cancel": (None, [c_void_p]),
    "khub_session_reset": (STATUS, [c_void_p]),
    "khub_session_info_get": (STATUS, [c_void_p, P(SessionInfo)]),
    "khub_hub_new": (STATUS, [P(HubOpts), P(c_void_p)]),
    "khub_hub_free": (None, [c_void_p]),
    "khub_hub_errmsg": (c_char_p, [c_void_p]),
    "khub_hub_cache_dir": (c_char_p, [c_void_p]),
    "khub_kernel_fetch": (STATUS, [c_void_p, c_void_p, c_char_p, P(KernelOpts),
                                   P(KernelResult)]),
    "khub_model_load_hub": (STATUS, [c_void_p, c_void_p, c_char_p, P(ModelOpts),
                                     P(ModelKernels), P(c_void_p), P(ModelKernelsReport)]),
}

# The project API (khub_project.h); a libkhub without it still loads, and
# khub.lock()/sync() then say so.
OPTIONAL_SIGNATURES = {
    "khub_hub_id_parse": (STATUS, [c_char_p, P(HubId), c_char_p, ctypes.c_size_t]),
    "khub_mapping_load": (STATUS, [c_char_p, P(c_void_p), c_char_p, ctypes.c_size_t]),
    "khub_mapping_free": (None, [c_void_p]),
    "khub_mapping_kernel_count": (ctypes.c_size_t, [c_void_p]),
    "khub_mapping_kernel": (c_char_p, [c_void_p, ctypes.c_size_t]),
    "khub_lock_new": (STATUS, [P(c_void_p)]),
    "khub_lock_load": (STATUS, [c_char_p, P(c_void_p), c_char_p, ctypes.c_size_t]),
    "khub_lock_save": (STATUS, [c_void_p, c_char_p, c_char_p, ctypes.c_size_t]),
    "khub_lock_free": (None, [c_void_p]),
    "khub_lock_count": (ctypes.c_size_t, [c_void_p]),
    "khub_lock_pin_at": (STATUS, [c_void_p, ctypes.c_size_t, P(LockPin)]),
    "khub_lock_kernel": (STATUS, [c_void_p, c_void_p, P(HubId), P(LockOpts), P(LockResult)]),
    "khub_lock_sync": (STATUS, [c_void_p, c_void_p, ctypes.c_size_t, P(SyncOpts),
                                P(SyncResult)]),
}


def _candidates():
    """Where libkhub may be, in the order tried, with how each was found."""
    env = os.environ.get("KHUB_LIBRARY")
    if env:
        yield env, "$KHUB_LIBRARY"
        return  # an explicit choice is never second-guessed
    prefix = os.environ.get("KHUB_PREFIX")
    if prefix:
        for p in sorted(glob.glob(os.path.join(prefix, "lib*", "**", "libkhub.so.0"),
                                  recursive=True)):
            yield p, "$KHUB_PREFIX"
    yield "libkhub.so.0", "the dynamic linker's search path"
    found = ctypes.util.find_library("khub")
    if found:
        yield found, "ldconfig"
    try:
        libdir = subprocess.run(["pkg-config", "--variable=libdir", "khub"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        libdir = ""
    if libdir:
        yield os.path.join(libdir, "libkhub.so.0"), "pkg-config khub"


def load_library():
    """The CDLL of libkhub with every signature declared; OSError naming
    every place tried when none loads."""
    tried = []
    for path, how in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s (%s): %s" % (path, how, e))
            continue
        for name, (res, args) in SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype = res
            fn.argtypes = args
        lib.khub_missing = []
        for name, (res, args) in OPTIONAL_SIGNATURES.items():
            try:
                fn = getattr(lib, name)
            except AttributeError:
                lib.khub_missing.append(name)
                continue
            fn.restype = res
            fn.argtypes = args
        return lib
    raise OSError("khub: cannot load libkhub; tried " + "; ".join(tried) +
                  ". Set KHUB_LIBRARY to the path of libkhub.so or KHUB_PREFIX to the "
                  "prefix khub was installed into (cmake --install build --prefix P)")
