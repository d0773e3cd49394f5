"""The kernel author's API (libkhub_author, khub_author.h) from Python:
scaffold a kernel from a template, build its variants, make a signing key,
sign a build and publish it, as `khub init/build/keygen/sign/publish` do.

    khub.author.init("acme/rmsnorm", "norm", directory="rmsnorm")
    variants = khub.author.build("rmsnorm")
    key = khub.author.key_generate("acme.key", "acme.pub")
    khub.author.sign_build("acme.key", "rmsnorm")
    with khub.Hub(endpoint=ep, token="hf_write") as hub:
        res = khub.author.publish(hub, "rmsnorm")

Each failure raises KhubError with khub's status and one-line message.
"""
import ctypes
from dataclasses import dataclass
from typing import Callable, List, Optional

from . import _ffi, _sibling
from . import _lib, KhubError, _b, _s

P = ctypes.POINTER
LINE_FN = ctypes.CFUNCTYPE(None, _ffi.c_void_p, _ffi.c_char_p)
BACKEND_CPU, BACKEND_CUDA = 1, 2


class Template(ctypes.Structure):
    _fields_ = _ffi.HEADER + [("kind", _ffi.c_char_p), ("op", _ffi.c_char_p),
                              ("cuda", _ffi.i32)]


class InitOpts(ctypes.Structure):
    _fields_ = _ffi.HEADER + [("repo", _ffi.c_char_p), ("kind", _ffi.c_char_p),
                              ("backends", _ffi.u32), ("reserved", _ffi.u32),
                              ("dir", _ffi.c_char_p), ("on_file", LINE_FN),
                              ("on_file_ud", _ffi.c_void_p)]


class BuildOpts(ctypes.Structure):
    _fields_ = _ffi.HEADER + [("cc", _ffi.c_char_p), ("include_dir", _ffi.c_char_p),
                              ("progress", LINE_FN), ("progress_ud", _ffi.c_void_p)]


class BuildResult(ctypes.Structure):
    _fields_ = _ffi.HEADER + [("n_variants", _ffi.u32), ("variants", (ctypes.c_char * 96) * 4),
                              ("skipped", ctypes.c_char * 512)]


class Key(ctypes.Structure):
    _fields_ = _ffi.HEADER + [("public_key", ctypes.c_char * 96), ("key_id", ctypes.c_char * 24)]


class PublishOpts(ctypes.Structure):
    _fields_ = _ffi.HEADER + [("dir", _ffi.c_char_p), ("repo", _ffi.c_char_p),
                              ("message", _ffi.c_char_p)]


class PublishResult(ctypes.Structure):
    _fields_ = _ffi.HEADER + [
        ("repo", ctypes.c_char * 200), ("branch", ctypes.c_char * 32),
        ("version", ctypes.c_char * 32), ("commit", ctypes.c_char * 41),
        ("url", ctypes.c_char * 1024), ("changed", _ffi.i32), ("created_repo", _ffi.i32),
        ("created_branch", _ffi.i32), ("n_files", _ffi.u64), ("n_unchanged", _ffi.u64),
        ("n_uploaded", _ffi.u64), ("n_lfs_stored", _ffi.u64), ("n_deleted", _ffi.u64)]


_ERR = [_ffi.c_char_p, ctypes.c_size_t]
_au = _sibling.load(_lib, "khub_author", "KHUB_AUTHOR_LIBRARY", {
    "khub_author_template_count": (ctypes.c_size_t, []),
    "khub_author_template_at": (_ffi.STATUS, [ctypes.c_size_t, P(Template)]),
    "khub_author_init": (_ffi.STATUS, [P(InitOpts)] + _ERR),
    "khub_author_build": (_ffi.STATUS, [_ffi.c_char_p, P(BuildOpts), P(BuildResult)] + _ERR),
    "khub_author_key_generate": (_ffi.STATUS, [_ffi.c_char_p, _ffi.c_char_p, P(Key)] + _ERR),
    "khub_author_sign_build": (_ffi.STATUS, [_ffi.c_char_p, _ffi.c_char_p, LINE_FN,
                                             _ffi.c_void_p] + _ERR),
    "khub_author_publish": (_ffi.STATUS, [_ffi.c_void_p, P(PublishOpts), P(PublishResult)]),
})


def _call(fn, *args):
    err = ctypes.create_string_buffer(_ffi.ERROR_SIZE)
    st = fn(*args, err, len(err))
    if st != 0:
        raise KhubError(st, _s(err.value))


def _lines(cb: Optional[Callable[[str], None]]):
    return LINE_FN(lambda ud, line: cb(_s(line))) if cb else LINE_FN()


def templates() -> List[dict]:
    """The templates `khub init` offers: kind, op, whether it has CUDA."""
    out = []
    for i in range(_au.khub_author_template_count()):
        t = _ffi.make(Template)
        if _au.khub_author_template_at(i, ctypes.byref(t)) == 0:
            out.append({"kind": _s(t.kind), "op": _s(t.op), "cuda": bool(t.cuda)})
    return out


def init(repo: str, kind: str, directory: Optional[str] = None, cuda: bool = False,
         on_file: Optional[Callable[[str], None]] = None) -> None:
    """Writes a kernel source tree for repo ("org/name") from kind's
    template into directory (must not exist; None = ./<name>)."""
    cb = _lines(on_file)
    o = _ffi.make(InitOpts, repo=_b(repo), kind=_b(kind), dir=_b(directory), on_file=cb,
                  backends=BACKEND_CPU | (BACKEND_CUDA if cuda else 0))
    _call(_au.khub_author_init, ctypes.byref(o))


def build(directory: str, cc: Optional[str] = None,
          progress: Optional[Callable[[str], None]] = None) -> dict:
    """Builds directory's variants into directory/build (`khub build`):
    {"variants": [...], "skipped": why a declared one was skipped or ""}."""
    cb = _lines(progress)
    o = _ffi.make(BuildOpts, cc=_b(cc), progress=cb)
    r = _ffi.make(BuildResult)
    _call(_au.khub_author_build, _b(directory), ctypes.byref(o), ctypes.byref(r))
    return {"variants": [_s(r.variants[i].value) for i in range(r.n_variants)],
            "skipped": _s(r.skipped)}


@dataclass
class KeyPair:
    public_key: str  # "khub-ed25519 <base64>", the line a trust policy lists
    key_id: str


def key_generate(private_path: str, public_path: str) -> KeyPair:
    """A new Ed25519 key: the private key at private_path (mode 0600), the
    public key line at public_path."""
    k = _ffi.make(Key)
    _call(_au.khub_author_key_generate, _b(private_path), _b(public_path), ctypes.byref(k))
    return KeyPair(_s(k.public_key), _s(k.key_id))


def sign_build(private_path: str, directory: str) -> List[str]:
    """Signs every variant's metadata.json under directory/build (each gets
    its metadata.json.sig); returns the metadata.json paths signed."""
    done: List[str] = []
    cb = _lines(done.append)
    _call(_au.khub_author_sign_build, _b(private_path), _b(directory), cb, None)
    return done


def publish(hub, directory: str, repo: Optional[str] = None,
            message: Optional[str] = None) -> dict:
    """Publishes directory/build to hub's endpoint (khub.Hub with a token
    that may write), on branch v<major> (`khub publish`)."""
    o = _ffi.make(PublishOpts, dir=_b(directory), repo=_b(repo), message=_b(message))
    r = _ffi.make(PublishResult)
    st = _au.khub_author_publish(hub._h, ctypes.byref(o), ctypes.byref(r))
    if st != 0:
        raise KhubError(st, _s(_lib.khub_hub_errmsg(hub._h)))
    return {"repo": _s(r.repo), "branch": _s(r.branch), "version": _s(r.version),
            "commit": _s(r.commit), "changed": bool(r.changed),
            "created_repo": bool(r.created_repo), "n_files": int(r.n_files),
            "n_uploaded": int(r.n_uploaded)}
