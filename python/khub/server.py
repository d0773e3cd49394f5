"""The local hub server (libkhub_server, khub_server.h) from Python: serve a
folder of kernel repos with the Hugging Face Hub protocol, as `khub serve`
does, in the server's own threads.

    with khub.server.Server("repos", token="hf_write") as srv:
        hub = khub.Hub(endpoint=srv.endpoint)
"""
import ctypes
from typing import Callable, List, Optional

from . import _ffi, _sibling
from . import _lib, KhubError, _b, _s

P = ctypes.POINTER


class ServerOpts(ctypes.Structure):
    _fields_ = _ffi.HEADER + [
        ("dir", _ffi.c_char_p),
        ("host", _ffi.c_char_p),
        ("port", _ffi.u16),
        ("reserved0", _ffi.u16),
        ("page_size", _ffi.u32),
        ("token", _ffi.c_char_p),
        ("log_path", _ffi.c_char_p),
        ("faults", _ffi.c_char_p),
        ("max_connections", _ffi.u32),
        ("max_per_ip", _ffi.u32),
        ("idle_timeout_s", _ffi.u32),
        ("reserved1", _ffi.u32),
        ("max_body", _ffi.u64),
        ("log", _ffi.LOG_FN),  # 0.2
        ("log_ud", _ffi.c_void_p),
    ]


_srv = _sibling.load(_lib, "khub_server", "KHUB_SERVER_LIBRARY", {
    "khub_server_start": (_ffi.STATUS, [P(ServerOpts), P(_ffi.c_void_p), _ffi.c_char_p,
                                        ctypes.c_size_t]),
    "khub_server_port": (_ffi.u16, [_ffi.c_void_p]),
    "khub_server_request_count": (_ffi.u64, [_ffi.c_void_p]),
    "khub_server_connection_count": (_ffi.u64, [_ffi.c_void_p]),
    "khub_server_stop": (None, [_ffi.c_void_p]),
})


class Server:
    """Serves directory (<dir>/<org>/<name>/refs.json and commits/<sha>/,
    docs/hub-server.md) on host:port (port 0 = a free one) until stop().
    token: writes need it (reads stay open). log: called with each access
    log line ("GET /api/... auth=no range=- ua=..."), from the server's
    threads, one call at a time. Errors raise KhubError with the message."""

    def __init__(self, directory: str, host: Optional[str] = None, port: int = 0,
                 token: Optional[str] = None, page_size: int = 0,
                 log: Optional[Callable[[str], None]] = None, faults: str = ""):
        self._keep = [_b(directory), _b(host), _b(token), _b(faults)]
        self._log = _ffi.LOG_FN(lambda ud, level, msg: log(_s(msg))) if log else _ffi.LOG_FN()
        opts = _ffi.make(ServerOpts, dir=self._keep[0], host=self._keep[1], port=port,
                         token=self._keep[2], page_size=page_size, faults=self._keep[3],
                         log=self._log)
        h = ctypes.c_void_p()
        err = ctypes.create_string_buffer(_ffi.ERROR_SIZE)
        st = _srv.khub_server_start(ctypes.byref(opts), ctypes.byref(h), err, len(err))
        if st != 0:
            raise KhubError(st, _s(err.value))
        self._h = h

    @property
    def port(self) -> int:
        return int(_srv.khub_server_port(self._h))

    @property
    def endpoint(self) -> str:
        """The HF_ENDPOINT of this server (on 127.0.0.1 unless host was given)."""
        host = _s(self._keep[1]) if self._keep[1] else "127.0.0.1"
        return "http://%s:%d" % ("127.0.0.1" if host == "localhost" else host, self.port)

    @property
    def request_count(self) -> int:
        return int(_srv.khub_server_request_count(self._h))

    @property
    def connection_count(self) -> int:
        return int(_srv.khub_server_connection_count(self._h))

    def stop(self) -> None:
        """Stops accepting, waits for the requests in flight, frees it."""
        if getattr(self, "_h", None):
            _srv.khub_server_stop(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def __del__(self):
        self.stop()


__all__: List[str] = ["Server", "ServerOpts"]
