"""The server and author APIs through the binding (khub.server, khub.author):
a kernel scaffolded, built, keyed, signed and published with the library
alone (no CLI), to a khub.server.Server on loopback whose access log comes
through a Python callback, then fetched, verified and loaded; and their
errors raised as KhubError with khub's message."""
import json
import shutil
import threading

import pytest

import khub
from khub import author, server


def test_templates_and_init_errors(tmp_path):
    kinds = {t["kind"] for t in author.templates()}
    assert {"norm", "attention", "linear"} <= kinds, kinds
    with pytest.raises(khub.KhubError) as e:
        author.init("acme/x", "no-such-kind", directory=str(tmp_path / "x"))
    assert e.value.status_name == "KHUB_STATUS_NOT_FOUND"
    assert "no-such-kind" in str(e.value)
    with pytest.raises(khub.KhubError) as e:
        author.build(str(tmp_path / "missing"))
    assert "kernel.json" in str(e.value)


def test_server_start_error():
    with pytest.raises(khub.KhubError) as e:
        server.Server("/nonexistent/khub-repos")
    assert e.value.status_name == "KHUB_STATUS_NOT_FOUND"
    assert str(e.value).startswith("serve: /nonexistent/khub-repos is not a directory of repos")


def test_init_build_sign_publish_serve_fetch(tmp_path):
    if not shutil.which("cc"):
        pytest.skip("needs a C compiler")
    kdir = str(tmp_path / "rmsnorm")
    files = []
    author.init("acme/rmsnorm", "norm", directory=kdir, on_file=files.append)
    assert any(f.endswith("kernel.json") for f in files), files
    steps = []
    built = author.build(kdir, progress=steps.append)
    assert built["variants"] and built["variants"][0].startswith("khub1-cpu-"), built
    assert steps
    key = author.key_generate(str(tmp_path / "acme.key"), str(tmp_path / "acme.pub"))
    assert key.public_key.startswith("khub-ed25519 ") and len(key.key_id) == 16
    signed = author.sign_build(str(tmp_path / "acme.key"), kdir)
    assert signed and all(s.endswith("metadata.json") for s in signed), signed
    (tmp_path / "repos").mkdir()
    lines, lock = [], threading.Lock()

    def log(line):
        with lock:
            lines.append(line)

    with server.Server(str(tmp_path / "repos"), token="hf_write", log=log) as srv:
        with khub.Hub(endpoint=srv.endpoint, token="hf_write",
                      cache_dir=str(tmp_path / "cache")) as hub:
            res = author.publish(hub, kdir)
            assert res["repo"] == "acme/rmsnorm" and res["branch"] == "v1", res
            assert res["changed"] and res["created_repo"] and len(res["commit"]) == 40, res
            policy = tmp_path / "policy.json"
            policy.write_text(json.dumps({"version": 1, "publishers": {"acme": [key.public_key]}}))
            with khub.Runtime() as rt:
                kr = hub.fetch(rt, "acme/rmsnorm@version=1", policy=str(policy))
                assert kr.repo == "acme/rmsnorm" and kr.commit == res["commit"], kr
                assert "signed" in kr.trust, kr.trust
        assert srv.request_count >= 3
        served = srv.request_count
    with lock:
        assert len(lines) == served, (len(lines), served)
        assert any(line.startswith("POST /api/kernels/acme/rmsnorm/commit/v1 auth=yes")
                   for line in lines), lines
        assert all("\n" not in line for line in lines)
