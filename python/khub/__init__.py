"""khub: load Llama-family models with kernels named by Hub ID, from Python.

A thin binding of libkhub's public C API (abi/khub/*.h) through ctypes:

    import khub
    model = khub.Model.from_pretrained("SmolLM2-135M-Instruct-hf",
                                       attn_implementation="kernels-community/flash-attn2")
    for piece in model.generate_stream("The capital of France is", max_new_tokens=16):
        print(piece, end="", flush=True)
    with khub.Session(model) as chat:     # a conversation that keeps its KV cache
        msgs = [{"role": "user", "content": "Hi"}]
        msgs.append({"role": "assistant",
                     "content": chat.generate(model.chat_format(msgs), max_new_tokens=64)})
    print(model.explain())        # which plugin serves each role, and why
    khub.lock("app")              # app/khub.json -> app/khub.lock (as `khub lock app`)

Failures raise khub.KhubError carrying khub's status (.status, .status_name)
and its one-line message (str(e)), exactly as the C API reports them.
"""
import ctypes
import os
import queue
import threading
import weakref
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Sequence

from . import _ffi

__all__ = [
    "KhubError", "Runtime", "Hub", "Model", "Plugin", "Op", "Selection", "KernelResult",
    "GenerationStream", "Session", "Pin", "version", "library_path", "plugins", "lock", "sync",
    "OP_KINDS",
]

_lib = _ffi.load_library()

# khub_op_kind by name, from the library's one table (khub_plugin.h's
# KHUB_OP_KINDS, through khub_op_kind_name): kinds are numbered from 1 on.
OP_KINDS = {}
for _k in range(1, 64):
    _name = _lib.khub_op_kind_name(_k).decode()
    if _name == "unknown":
        break
    OP_KINDS[_name] = _k
_KIND_NAMES = {v: k for k, v in OP_KINDS.items()}
_STOP_REASONS = {0: "none", 1: "eos", 2: "max_tokens", 3: "stop_string", 4: "callback",
                 5: "context", 6: "cancelled"}
_OPT_STRICT, _OPT_ALLOW_UNVERIFIED = 2, 3


class KhubError(Exception):
    """A khub call failed. str(e) is khub's one-line message (what failed, on
    what, what to do); .status the khub_status number and .status_name its
    name ("KHUB_STATUS_NOT_FOUND")."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.status_name = _lib.khub_status_name(status).decode()
        self.message = message

    def __repr__(self):
        return "KhubError(%s, %r)" % (self.status_name, self.message)


def _b(s: Optional[str]) -> Optional[bytes]:
    return None if s is None else str(s).encode()


def _s(b: Optional[bytes]) -> str:
    return "" if b is None else b.decode("utf-8", "replace")


def _check(st: int, errmsg) -> None:
    """Raises KhubError(st, errmsg()) unless st is KHUB_STATUS_OK."""
    if st != 0:
        msg = errmsg() or _s(_lib.khub_status_str(st))
        raise KhubError(st, msg)


def version() -> str:
    """libkhub's version string ("0.1.0")."""
    return _s(_lib.khub_version_str())


def library_path() -> str:
    """The path of the libkhub that was loaded."""
    return _lib._name


# Runtime and plugins ------------------------------------------------------------


@dataclass
class Op:
    """One op of a loaded plugin."""

    name: str
    kind: str  # "attention", "norm", ...
    device: str  # "cpu" or "cuda"
    priority: int


@dataclass
class Plugin:
    """A loaded plugin (what `khub plugins` lists)."""

    id: str
    version: str
    path: str
    sha256: str
    abi: str
    ops: List[Op] = field(default_factory=list)


@dataclass
class Selection:
    """The registry's answer to a query: the op chosen and the decision trace
    (one candidate per line: "accept ..." / "reject ...: reason")."""

    name: str
    trace: str


class Runtime:
    """A khub runtime (khub_runtime_new): the plugin table, registry and thread
    pool. builtin=True loads the built-in plugins (khub_plugin_load_builtin)."""

    def __init__(self, n_threads: int = 0, builtin: bool = True, strict: bool = False):
        opts = _ffi.make(_ffi.RuntimeOpts, n_threads=n_threads)
        h = ctypes.c_void_p()
        _check(_lib.khub_runtime_new(ctypes.byref(opts), ctypes.byref(h)), self._last_error)
        self._h = h
        if strict:
            self.set_option(_OPT_STRICT, 1)
        if builtin:
            self._call(_lib.khub_plugin_load_builtin(self._h))

    @staticmethod
    def _last_error() -> str:
        return _s(_lib.khub_last_error())

    def _errmsg(self) -> str:
        return _s(_lib.khub_runtime_errmsg(self._h))

    def _call(self, st: int) -> None:
        _check(st, self._errmsg)

    def set_option(self, option: int, value: int) -> None:
        """khub_runtime_set_option with a khub_option number."""
        self._call(_lib.khub_runtime_set_option(self._h, option, value))

    def load_plugin(self, path: str, sha256: Optional[str]) -> Plugin:
        """Loads a plugin file whose SHA-256 must equal sha256 (64 hex digits).
        sha256=None needs KHUB_OPT_ALLOW_UNVERIFIED, which this call does not
        set: pass the digest."""
        p = ctypes.c_void_p()
        self._call(_lib.khub_plugin_load(self._h, _b(path), _b(sha256), ctypes.byref(p)))
        return self._plugin(p)

    @staticmethod
    def _plugin(p) -> Plugin:
        maj, mnr = _ffi.u16(), _ffi.u16()
        _lib.khub_plugin_abi(p, ctypes.byref(maj), ctypes.byref(mnr))
        ops = []
        for i in range(_lib.khub_plugin_op_count(p)):
            d = _lib.khub_plugin_op(p, i).contents
            caps = d.caps.contents
            ops.append(Op(_s(d.name), _KIND_NAMES.get(d.kind, str(d.kind)),
                          "cuda" if caps.device_type == 2 else "cpu", caps.priority))
        return Plugin(_s(_lib.khub_plugin_id(p)), _s(_lib.khub_plugin_version(p)),
                      _s(_lib.khub_plugin_path(p)), _s(_lib.khub_plugin_sha256(p)),
                      "%d.%d" % (maj.value, mnr.value), ops)

    def plugins(self) -> List[Plugin]:
        """Every loaded plugin with its ops (`khub plugins`)."""
        return [self._plugin(ctypes.c_void_p(_lib.khub_plugin_at(self._h, i)))
                for i in range(_lib.khub_plugin_count(self._h))]

    def select(self, kind: str, plugin: Optional[str] = None, op: Optional[str] = None,
               head_dim: int = 0, dtype_id: int = -1) -> Selection:
        """Asks the registry for the best op of kind ("attention", "norm", ...),
        preferring plugin (and its op) when it can serve, and returns the
        choice with its decision trace (what `khub run --explain` prints per
        role)."""
        if kind not in OP_KINDS:
            raise ValueError("unknown op kind %r; one of %s" % (kind, ", ".join(OP_KINDS)))
        q = _ffi.make(_ffi.OpQuery, kind=OP_KINDS[kind], dtype_id=dtype_id, head_dim=head_dim,
                      plugin_id=_b(plugin), op_name=_b(op), act_dtype_id=-1)
        b = ctypes.c_void_p()
        self._call(_lib.khub_registry_select(self._h, ctypes.byref(q), ctypes.byref(b)))
        return Selection(_s(_lib.khub_binding_name(b)), _s(_lib.khub_binding_trace(b)))

    def close(self) -> None:
        """Frees the runtime (unloading every plugin). Models made on it must
        be closed first."""
        if getattr(self, "_h", None):
            _lib.khub_runtime_free(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()


def plugins() -> List[Plugin]:
    """The built-in plugins, as `khub plugins` lists them."""
    with Runtime() as rt:
        return rt.plugins()


# Hub -------------------------------------------------------------------------------


@dataclass
class KernelResult:
    """What khub_kernel_fetch loaded for a Hub ID."""

    plugin_id: str
    op_name: str
    repo: str
    commit: str
    variant: str
    file: str
    trust: str
    fell_back: bool
    locked: bool
    trace: str


class Hub:
    """A hub client (khub_hub_new): endpoint, cache and offline mode as
    huggingface_hub reads them from the environment unless given here. Makes
    no network connection until a kernel is fetched."""

    def __init__(self, endpoint: Optional[str] = None, cache_dir: Optional[str] = None,
                 token: Optional[str] = None, offline: Optional[bool] = None):
        self._keep = [_b(endpoint), _b(cache_dir), _b(token)]
        opts = _ffi.make(_ffi.HubOpts, endpoint=self._keep[0], cache_dir=self._keep[1],
                         token=self._keep[2], offline=-1 if offline is None else int(offline))
        h = ctypes.c_void_p()
        _check(_lib.khub_hub_new(ctypes.byref(opts), ctypes.byref(h)),
               lambda: _s(_lib.khub_last_error()))
        self._h = h

    @property
    def cache_dir(self) -> str:
        return _s(_lib.khub_hub_cache_dir(self._h))

    def fetch(self, runtime: Runtime, kernel_id: str, lock: Optional[str] = None,
              policy: Optional[str] = None, allow_unsigned: bool = False,
              strict: bool = False) -> KernelResult:
        """Fetches, verifies and loads kernel_id ("org/name[@REV][:symbol]")
        into runtime (khub_kernel_fetch), through lock when given."""
        ko = _ffi.make(_ffi.KernelOpts, policy_path=_b(policy), lock_path=_b(lock),
                       allow_unsigned=int(allow_unsigned), strict=int(strict))
        kr = _ffi.make(_ffi.KernelResult)
        runtime._call(_lib.khub_kernel_fetch(self._h, runtime._h, _b(kernel_id),
                                             ctypes.byref(ko), ctypes.byref(kr)))
        return KernelResult(_s(kr.plugin_id), _s(kr.op_name), _s(kr.repo), _s(kr.commit),
                            _s(kr.variant), _s(kr.file), _s(kr.trust), bool(kr.fell_back),
                            bool(kr.locked), _s(kr.trace))

    def close(self) -> None:
        if getattr(self, "_h", None):
            _lib.khub_hub_free(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()


# Model -----------------------------------------------------------------------------


class GenerationStream:
    """The text of one prompt's generation, piece by piece as khub streams it
    (each piece whole UTF-8). The C call runs in a worker thread; its stream
    callback hands pieces to this iterator. Leaving the loop early (break,
    close()) makes the callback ask khub to stop. After the loop, .result
    holds the stop reason, token counts and timings; a failure raises
    KhubError from the iteration. The generation runs at most _WINDOW pieces
    ahead of the reader, then waits for it: a reader that leaves the loop
    stops it within that many pieces, however the threads are scheduled."""

    _DONE = object()
    _WINDOW = 32

    def __init__(self, model: "Model", prompt: str, opts: dict):
        self.result: Optional[dict] = None
        self._q: "queue.Queue" = queue.Queue()
        self._stop = threading.Event()
        self._room = threading.Semaphore(self._WINDOW)  # pieces the reader has not taken
        self._error: Optional[KhubError] = None
        self._cb = _ffi.STREAM_FN(self._piece)  # kept alive for the whole call
        self._thread = threading.Thread(target=self._work, args=(model, prompt, opts),
                                        daemon=True)
        self._thread.start()

    def _piece(self, ud, prompt, text, n):
        if self._stop.is_set():
            return 1
        self._room.acquire()  # close() releases it once more, so this never waits for good
        self._q.put(ctypes.string_at(text, n))
        return 1 if self._stop.is_set() else 0

    def _work(self, model, prompt, opts):
        try:
            self.result = model._generate([prompt], opts, self._cb)[0]
        except KhubError as e:
            self._error = e
        finally:
            self._q.put(self._DONE)

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        item = self._q.get()
        if item is self._DONE:
            self._thread.join()
            if self._error:
                err, self._error = self._error, None
                raise err
            raise StopIteration
        self._room.release()
        return item.decode("utf-8", "replace")

    def close(self) -> None:
        """Stops the generation (at the next piece) and waits for it."""
        self._stop.set()
        self._room.release()  # a generation waiting for room goes on, sees the stop
        self._thread.join()

    def __del__(self):
        if hasattr(self, "_thread"):
            self.close()


class Model:
    """A loaded model (khub_model_load_hub): weights, tokenizer and the kernels
    chosen for each role. Use from_pretrained()."""

    def __init__(self, runtime: Runtime, hub: Hub, handle, report: str, own_runtime: bool):
        self.runtime, self.hub, self._h = runtime, hub, handle
        self.kernels_report = report
        self._own_runtime = own_runtime

    @classmethod
    def from_pretrained(cls, path: str, *, attn_implementation: Optional[str] = None,
                        quantization: Optional[str] = None,
                        cache_implementation: Optional[str] = None, norm: Optional[str] = None,
                        act: Optional[str] = None, rotary: Optional[str] = None,
                        linear: Optional[str] = None, kernels: Optional[str] = None,
                        lock: Optional[str] = None, policy: Optional[str] = None,
                        allow_unsigned: bool = False, strict: bool = False,
                        max_context: int = 0, max_seqs: int = 0, n_threads: int = 0,
                        runtime: Optional[Runtime] = None, hub: Optional[Hub] = None) -> "Model":
        """Loads the model at path (a .gguf file or a Hugging Face folder) with
        each role's kernel named as in Transformers' from_pretrained:
        attn_implementation ("kernels-community/flash-attn2", "sdpa", a loaded
        plugin's id), quantization ("nf4", "int8", "q8_0", "q4_0",
        "org/name:scheme"), cache_implementation ("static", "dynamic", a Hub
        ID), and norm/act/rotary/linear. kernels is a khub.json mapping, lock
        a khub.lock every named kernel loads through (its hashes re-checked),
        policy the trust policy file. strict: a kernel that cannot serve is an
        error instead of a fallback with a warning."""
        own = runtime is None
        rt = runtime or Runtime(n_threads=n_threads)
        hub = hub or Hub()
        keep = [_b(x) for x in (attn_implementation, quantization, cache_implementation, norm,
                                act, rotary, linear, kernels, lock, policy)]
        mk = _ffi.make(_ffi.ModelKernels, attn=keep[0], quant=keep[1], cache=keep[2],
                       norm=keep[3], act=keep[4], rotary=keep[5], linear=keep[6],
                       mapping_path=keep[7], lock_path=keep[8], policy_path=keep[9],
                       allow_unsigned=int(allow_unsigned), strict=int(strict))
        mo = _ffi.make(_ffi.ModelOpts, strict=int(strict), max_context=max_context,
                       max_seqs=max_seqs)
        rep = _ffi.ModelKernelsReport()
        h = ctypes.c_void_p()
        try:
            rt._call(_lib.khub_model_load_hub(hub._h, rt._h, _b(path), ctypes.byref(mo),
                                              ctypes.byref(mk), ctypes.byref(h),
                                              ctypes.byref(rep)))
        except KhubError:
            if own:
                rt.close()
            raise
        return cls(rt, hub, h, _s(rep.text), own)

    @property
    def info(self) -> dict:
        """What was loaded (khub_model_info): arch, format, sizes, eos, ..."""
        i = _ffi.make(_ffi.ModelInfo)
        self.runtime._call(_lib.khub_model_info_get(self._h, ctypes.byref(i)))
        out = {k: getattr(i, k) for k, _ in _ffi.ModelInfo._fields_[3:]
               if k not in ("reserved", "eos", "arch", "format")}
        out.update(arch=_s(i.arch), format=_s(i.format), eos=list(i.eos[:i.n_eos]))
        return out

    def explain(self) -> str:
        """The role -> plugin table with each binding's selection trace
        (`khub run --explain`)."""
        return _s(_lib.khub_model_explain(self._h))

    def tokenize(self, text: str, add_bos: bool = False) -> List[int]:
        """Token ids of text."""
        data = _b(text)
        n = ctypes.c_size_t()
        cap = len(data) + 8
        while True:
            ids = (_ffi.i32 * cap)()
            st = _lib.khub_model_tokenize(self._h, data, int(add_bos), ids, cap, ctypes.byref(n))
            if st == _OVERFLOW and n.value > cap:
                cap = n.value
                continue
            self.runtime._call(st)
            return list(ids[:n.value])

    def detokenize(self, ids: Sequence[int]) -> str:
        """The text of ids (special tokens dropped)."""
        arr = (_ffi.i32 * max(len(ids), 1))(*ids)
        n = ctypes.c_size_t()
        cap = 16 * len(ids) + 16
        while True:
            buf = ctypes.create_string_buffer(cap)
            st = _lib.khub_model_detokenize(self._h, arr, len(ids), buf, cap, ctypes.byref(n))
            if st == _OVERFLOW and n.value + 1 > cap:
                cap = n.value + 1
                continue
            self.runtime._call(st)
            return buf.raw[:n.value].decode("utf-8", "replace")

    def _generate(self, prompts: Sequence[str], kw: dict, callback=None) -> List[dict]:
        o, keep = _gen_opts(kw, callback)
        enc = [_b(p) for p in prompts]
        parr = (ctypes.c_char_p * len(enc))(*enc)
        res = (_ffi.GenerateResult * len(enc))()
        for r in res:
            r.struct_size = ctypes.sizeof(_ffi.GenerateResult)
        st = _lib.khub_model_generate(self._h, parr, len(enc), ctypes.byref(o), res)
        msg = self.runtime._errmsg() if st else ""
        out = [_result_dict(r) for r in res]
        _lib.khub_generate_results_free(self._h, res, len(enc))
        del keep
        _check(st, lambda: msg)
        return out

    def generate(self, prompt, **kw):
        """Generates a continuation of prompt (a str) or of each of a list of
        prompts (decoded together as one batch). Keywords: max_new_tokens (0 =
        128), temperature (0 = greedy), top_k, top_p, repetition_penalty,
        seed, stop (strings), chat (apply the chat template), system,
        ignore_eos. Returns the text, or a list of texts; details=True
        returns the result dicts (tokens, stop_reason, timings) instead."""
        details = kw.pop("details", False)
        single = isinstance(prompt, str)
        out = self._generate([prompt] if single else list(prompt), kw)
        if not details:
            out = [r["text"] for r in out]
        return out[0] if single else out

    def generate_stream(self, prompt: str, **kw) -> GenerationStream:
        """Like generate() for one prompt, as an iterator of text pieces."""
        return GenerationStream(self, prompt, kw)

    def chat_format(self, messages, add_generation_prompt: bool = True) -> str:
        """The conversation through the model's chat template
        (khub_model_chat_format): messages are {"role": ..., "content": ...}
        dicts (as OpenAI's API takes them) or (role, content) pairs; with
        add_generation_prompt the text ends where the assistant's answer
        begins. KhubError (TOKENIZER) for a model without a known template or
        roles the template refuses."""
        pairs = [(m["role"], m["content"]) if isinstance(m, dict) else tuple(m)
                 for m in messages]
        roles = (ctypes.c_char_p * max(len(pairs), 1))(*[_b(r) for r, _ in pairs])
        contents = (ctypes.c_char_p * max(len(pairs), 1))(*[_b(c) for _, c in pairs])
        n = ctypes.c_size_t()
        cap = 256 + sum(len(_b(c) or b"") + 64 for _, c in pairs)
        while True:
            buf = ctypes.create_string_buffer(cap)
            st = _lib.khub_model_chat_format(self._h, roles, contents, len(pairs),
                                             int(add_generation_prompt), buf, cap,
                                             ctypes.byref(n))
            if st == _OVERFLOW and n.value + 1 > cap:
                cap = n.value + 1
                continue
            self.runtime._call(st)
            return buf.raw[:n.value].decode("utf-8", "replace")

    def close(self) -> None:
        """Frees the model (and the runtime and hub it made for itself); a
        Session still open on it is closed first."""
        if getattr(self, "_h", None):
            ref = getattr(self, "_session", None)
            sess = ref() if ref is not None else None
            if sess is not None:
                sess.close()
            _lib.khub_model_free(self._h)
            self._h = None
            if self._own_runtime:
                self.runtime.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()


def _gen_opts(kw: dict, callback=None):
    """khub_generate_opts from generate()'s keywords, and what must stay
    alive while the call runs."""
    stop = [_b(s) for s in kw.get("stop") or []]
    stop_arr = (ctypes.c_char_p * max(len(stop), 1))(*stop)
    system = _b(kw.get("system"))
    o = _ffi.make(_ffi.GenerateOpts, max_new_tokens=kw.get("max_new_tokens", 0),
                  temperature=kw.get("temperature", 0.0), top_k=kw.get("top_k", 0),
                  top_p=kw.get("top_p", 0.0),
                  repetition_penalty=kw.get("repetition_penalty", 0.0),
                  seed=kw.get("seed", 0), stop=stop_arr, n_stop=len(stop),
                  chat=int(kw.get("chat", False)), system=system,
                  ignore_eos=int(kw.get("ignore_eos", False)))
    if callback is not None:
        o.callback = callback
    return o, (stop, stop_arr, system, callback)


def _result_dict(r) -> dict:
    """A khub_generate_result as generate(details=True) returns it."""
    return {
        "text": ctypes.string_at(r.text, r.text_len).decode("utf-8", "replace")
        if r.text else "",
        "tokens": list(r.tokens[:r.n_tokens]) if r.tokens else [],
        "n_prompt_tokens": r.n_prompt_tokens,
        "stop_reason": _STOP_REASONS.get(r.stop_reason, str(r.stop_reason)),
        "prefill_ms": r.prefill_ms, "decode_ms": r.decode_ms,
        "decode_tok_s": r.decode_tok_s,
    }


class Session:
    """A conversation that keeps its KV cache between generate calls
    (khub_session.h), the engine of `khub chat`: each call takes the whole
    conversation so far (Model.chat_format's text) and computes only the
    tokens after the longest prefix it shares with the last call's. One
    session per model (a second raises KhubError BUSY); use it from one
    thread at a time, except cancel(), which any thread may call."""

    def __init__(self, model: Model):
        if not getattr(model, "_h", None):
            raise ValueError("khub.Session: the model is closed")
        h = ctypes.c_void_p()
        model.runtime._call(_lib.khub_session_new(model._h, ctypes.byref(h)))
        self.model, self._h = model, h
        model._session = weakref.ref(self)  # Model.close closes it first

    def _generate(self, prompts: Sequence[str], kw: dict, callback=None) -> List[dict]:
        (prompt,) = prompts
        o, keep = _gen_opts(kw, callback)
        r = _ffi.make(_ffi.GenerateResult)
        st = _lib.khub_session_generate(self._h, _b(prompt), ctypes.byref(o), ctypes.byref(r))
        msg = self.model.runtime._errmsg() if st else ""
        out = _result_dict(r)
        _lib.khub_generate_results_free(self.model._h, ctypes.byref(r), 1)
        del keep
        _check(st, lambda: msg)
        return [out]

    def generate(self, prompt: str, **kw):
        """Continues prompt (the whole conversation so far), reusing the
        cached K/V of what it shares with the last call. Keywords as
        Model.generate's; returns the text, or with details=True the result
        dict (stop_reason "cancelled" after cancel())."""
        details = kw.pop("details", False)
        r = self._live()._generate([prompt], kw)[0]
        return r if details else r["text"]

    def generate_stream(self, prompt: str, **kw) -> GenerationStream:
        """Like generate(), as an iterator of text pieces."""
        return GenerationStream(self._live(), prompt, kw)

    def cancel(self) -> None:
        """Stops the generate call running on this session in another thread,
        during its prefill as during its decode (khub_session_cancel); with
        no call running, the next call stops at its first check."""
        if self._h:
            _lib.khub_session_cancel(self._h)

    def reset(self) -> None:
        """Forgets the conversation: the next call prefills its whole prompt."""
        self.model.runtime._call(_lib.khub_session_reset(self._live()._h))

    @property
    def info(self) -> dict:
        """n_cached (tokens whose K/V the session holds), max_context, and of
        the last call's prompt n_reused and n_prefilled."""
        i = _ffi.make(_ffi.SessionInfo)
        self.model.runtime._call(_lib.khub_session_info_get(self._live()._h, ctypes.byref(i)))
        return {k: getattr(i, k) for k, _ in _ffi.SessionInfo._fields_[3:]}

    def _live(self) -> "Session":
        if not self._h:
            raise ValueError("khub.Session: the session is closed")
        return self

    def close(self) -> None:
        """Frees the session (khub_session_free); the model stays open."""
        if getattr(self, "_h", None):
            _lib.khub_session_free(self._h)
            self._h = None
            ref = getattr(self.model, "_session", None)
            if ref is not None and ref() is self:
                self.model._session = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()


_OVERFLOW = None  # set below from the library's own status names


def _status_value(name: str) -> int:
    for v in range(0, 2000):
        if _s(_lib.khub_status_name(v)) == name:
            return v
    raise RuntimeError("libkhub has no status " + name)


_OVERFLOW = _status_value("KHUB_STATUS_OVERFLOW")


# Teams: lock and sync (khub_project.h) ----------------------------------------------


@dataclass
class Pin:
    """One kernel pinned in a khub.lock."""

    repo: str
    version: int  # the pinned v<N>, -1 when pinned by revision
    revision: str
    commit: str
    kernel_version: str  # metadata.json's "version" at that commit
    n_variants: int


def _pin(p) -> Pin:
    return Pin(_s(p.repo), p.version, _s(p.revision), _s(p.commit), _s(p.kernel_version),
               p.n_variants)


def _need_project(what: str) -> None:
    if _lib.khub_missing:
        raise NotImplementedError(
            "khub.%s() needs the project API (khub_project.h), which this libkhub (%s) does "
            "not export: %s" % (what, _lib._name, ", ".join(_lib.khub_missing)))


def _errbuf():
    return ctypes.create_string_buffer(_ffi.ERROR_SIZE)


def lock(directory: str = ".", kernels: Optional[str] = None, lock_path: Optional[str] = None,
         hub: Optional[Hub] = None) -> List[Pin]:
    """`khub lock`: resolves every kernel named in the mapping (default
    DIRECTORY/khub.json) to a commit, downloads and hashes each of its khub
    variants, and writes the lock (default DIRECTORY/khub.lock). Returns the
    pins written."""
    _need_project("lock")
    kpath = kernels or os.path.join(directory, "khub.json")
    lpath = lock_path or os.path.join(directory, "khub.lock")
    own, hub = hub is None, hub or Hub()
    err, m, lk = _errbuf(), ctypes.c_void_p(), ctypes.c_void_p()
    try:
        _check(_lib.khub_mapping_load(_b(kpath), ctypes.byref(m), err, len(err)),
               lambda: _s(err.value))
        _check(_lib.khub_lock_new(ctypes.byref(lk)), lambda: _s(_lib.khub_last_error()))
        pins = []
        for i in range(_lib.khub_mapping_kernel_count(m)):
            text = _lib.khub_mapping_kernel(m, i)
            hid = _ffi.HubId()
            _check(_lib.khub_hub_id_parse(text, ctypes.byref(hid), err, len(err)),
                   lambda: _s(err.value))
            r = _ffi.make(_ffi.LockResult)
            r.pin = _ffi.make(_ffi.LockPin)
            r.previous = _ffi.make(_ffi.LockPin)
            _check(_lib.khub_lock_kernel(hub._h, lk, ctypes.byref(hid), None, ctypes.byref(r)),
                   lambda: "%s: %s" % (_s(text), _s(_lib.khub_hub_errmsg(hub._h))))
            pins.append(_pin(r.pin))
        _check(_lib.khub_lock_save(lk, _b(lpath), err, len(err)), lambda: _s(err.value))
        return pins
    finally:
        if lk:
            _lib.khub_lock_free(lk)
        if m:
            _lib.khub_mapping_free(m)
        if own:
            hub.close()


def sync(directory: str = ".", lock_path: Optional[str] = None, hub: Optional[Hub] = None,
         all_variants: bool = False) -> List[dict]:
    """`khub sync`: fetches the locked commit of every kernel in the lock
    (default DIRECTORY/khub.lock) into the hub's cache and checks every file
    against the lock (the variant this machine would load, or every locked
    variant). Returns one dict per kernel: repo, commit, n_checked, and
    newer_version / newer_commit when the cache already holds a newer build
    (a lock moved back; khub sync warns)."""
    _need_project("sync")
    lpath = lock_path or os.path.join(directory, "khub.lock")
    own, hub = hub is None, hub or Hub()
    err, lk = _errbuf(), ctypes.c_void_p()
    try:
        _check(_lib.khub_lock_load(_b(lpath), ctypes.byref(lk), err, len(err)),
               lambda: _s(err.value))
        out = []
        opts = _ffi.make(_ffi.SyncOpts, all_variants=int(all_variants))
        for i in range(_lib.khub_lock_count(lk)):
            pin = _ffi.make(_ffi.LockPin)
            _check(_lib.khub_lock_pin_at(lk, i, ctypes.byref(pin)),
                   lambda: _s(_lib.khub_last_error()))
            r = _ffi.make(_ffi.SyncResult)
            _check(_lib.khub_lock_sync(hub._h, lk, i, ctypes.byref(opts), ctypes.byref(r)),
                   lambda: "%s: %s" % (_s(pin.repo), _s(_lib.khub_hub_errmsg(hub._h))))
            out.append({"repo": _s(pin.repo), "commit": _s(pin.commit),
                        "n_checked": r.n_checked, "newer_version": _s(r.newer_version),
                        "newer_commit": _s(r.newer_commit)})
        return out
    finally:
        if lk:
            _lib.khub_lock_free(lk)
        if own:
            hub.close()
