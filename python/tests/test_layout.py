"""The ctypes structs of khub/_ffi.py against the C headers: a C program
built from abi/khub prints each struct's size and every field's offset."""
import ctypes
import os
import shutil
import subprocess

import pytest

from khub import _ffi

STRUCTS = {
    "RuntimeOpts": "khub_runtime_opts", "OpCaps": "khub_op_caps", "OpDesc": "khub_op_desc",
    "OpQuery": "khub_op_query", "Device": "khub_device", "Dtype": "khub_dtype",
    "ModelOpts": "khub_model_opts", "ModelInfo": "khub_model_info",
    "GenerateOpts": "khub_generate_opts", "GenerateResult": "khub_generate_result",
    "SessionInfo": "khub_session_info",
    "HubOpts": "khub_hub_opts", "KernelOpts": "khub_kernel_opts",
    "KernelResult": "khub_kernel_result", "ModelKernels": "khub_model_kernels",
    "ModelKernelsReport": "khub_model_kernels_report",
}
PROJECT_STRUCTS = {
    "HubId": "khub_hub_id", "LockPin": "khub_lock_pin", "LockOpts": "khub_lock_opts",
    "LockResult": "khub_lock_result", "SyncOpts": "khub_sync_opts",
    "SyncResult": "khub_sync_result",
}


SIBLING_STRUCTS = {  # (module, class): C struct, of khub_server.h and khub_author.h
    ("server", "ServerOpts"): "khub_server_opts",
    ("author", "Template"): "khub_author_template", ("author", "InitOpts"): "khub_author_init_opts",
    ("author", "BuildOpts"): "khub_author_build_opts",
    ("author", "BuildResult"): "khub_author_build_result", ("author", "Key"): "khub_author_key",
    ("author", "PublishOpts"): "khub_author_publish_opts",
    ("author", "PublishResult"): "khub_author_publish_result",
}


def test_structs_match_the_headers(src, tmp_path):
    cc = shutil.which("cc")
    if not cc:
        pytest.skip("no C compiler")
    lines = ["#include <stddef.h>", "#include <stdio.h>", "#include <khub/khub_kernels.h>",
             "#include <khub/khub_model.h>", "#include <khub/khub_session.h>"]
    structs = dict(STRUCTS)
    if os.path.exists(os.path.join(src, "abi", "khub", "khub_project.h")):
        lines.append("#include <khub/khub_project.h>")
        structs.update(PROJECT_STRUCTS)
    from khub import author, server  # noqa: F401 (the sibling libraries' structs)
    lines += ["#include <khub/khub_server.h>", "#include <khub/khub_author.h>"]
    classes = {c: getattr(_ffi, py) for py, c in structs.items()}
    for (mod, py), c in SIBLING_STRUCTS.items():
        classes[c] = getattr({"server": server, "author": author}[mod], py)
    lines.append("int main(void) {")
    want = []
    for c, cls in classes.items():
        lines.append('printf("%s %%zu\\n", sizeof(%s));' % (c, c))
        want.append("%s %d" % (c, ctypes.sizeof(cls)))
        for name, _ in cls._fields_:
            lines.append('printf("%s.%s %%zu\\n", offsetof(%s, %s));' % (c, name, c, name))
            want.append("%s.%s %d" % (c, name, getattr(cls, name).offset))
    lines += ["return 0; }"]
    (tmp_path / "layout.c").write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c11", "-I", os.path.join(src, "abi"), str(tmp_path / "layout.c"),
                    "-o", str(exe)], check=True)
    got = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split("\n")
    assert [g for g in got if g] == want


def test_abi_version_matches_the_header(src):
    text = open(os.path.join(src, "abi", "khub", "khub_version.h")).read()
    assert "#define KHUB_ABI_MAJOR %d\n" % _ffi.ABI_MAJOR in text
    assert "#define KHUB_ABI_MINOR %d\n" % _ffi.ABI_MINOR in text
