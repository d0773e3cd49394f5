"""Loading khub's sibling libraries (libkhub_server, libkhub_author) next
to the libkhub the binding loaded: they are installed beside it and link it."""
import ctypes
import os


def load(lib, name, env, signatures):
    """The CDLL of lib<name>.so beside lib (libkhub's CDLL), or $env; every
    signature declared. OSError naming what was tried."""
    tried = []
    cands = [os.environ[env]] if os.environ.get(env) else []
    here = os.path.dirname(os.path.realpath(lib._name)) if os.path.sep in lib._name else ""
    for base in ("lib%s.so.0" % name, "lib%s.so" % name):
        if here:
            cands.append(os.path.join(here, base))
        cands.append(base)
    for path in cands:
        try:
            so = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s: %s" % (path, e))
            continue
        for fn, (res, args) in signatures.items():
            f = getattr(so, fn)
            f.restype = res
            f.argtypes = args
        return so
    raise OSError("khub: cannot load lib%s; tried %s. Set %s to its path" %
                  (name, "; ".join(tried), env))
