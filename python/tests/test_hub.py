"""Kernels named by Hub ID through the binding: a kernel made with the khub
CLI (init, build, keygen, sign), published to a `khub serve` on loopback,
then fetched, verified against a trust policy and loaded by
Model.from_pretrained / Hub.fetch, and loaded again offline through a
khub.lock. Needs the CLI ($KHUB_BIN, which ctest sets) and a C compiler."""
import json
import os
import shutil
import subprocess
import time

import pytest

import khub


def _khub(*args, cwd):
    return subprocess.run([os.environ["KHUB_BIN"]] + list(args), cwd=cwd, check=True,
                          capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """(endpoint, work dir with policy.json) after publishing acme/rmsnorm."""
    if not os.environ.get("KHUB_BIN") or not shutil.which("cc"):
        pytest.skip("needs the khub CLI ($KHUB_BIN) and cc")
    w = tmp_path_factory.mktemp("hub")
    _khub("init", "acme/rmsnorm", "--kind", "norm", cwd=w)
    _khub("build", "rmsnorm", "--quiet", cwd=w)
    _khub("keygen", "acme", cwd=w)
    _khub("sign", "--key", "acme.key", "rmsnorm", cwd=w)
    pub = (w / "acme.pub").read_text().strip()
    (w / "policy.json").write_text(json.dumps({"version": 1, "publishers": {"acme": [pub]}}))
    (w / "repos").mkdir()
    out = open(w / "serve.out", "w+")
    srv = subprocess.Popen([os.environ["KHUB_BIN"], "serve", str(w / "repos"), "--port", "0",
                            "--token", "hf_test"], stdout=out, stderr=subprocess.DEVNULL)
    try:
        ep = None
        for _ in range(50):
            text = (w / "serve.out").read_text()
            if "http://" in text:
                ep = text[text.index("http://"):].split()[0]
                break
            time.sleep(0.1)
        assert ep, "khub serve printed no address"
        _khub("publish", "rmsnorm", "--endpoint", ep, "--token", "hf_test", "--quiet", cwd=w)
        yield ep, w
    finally:
        srv.terminate()
        srv.wait()


def test_model_loads_a_kernel_by_hub_id(published, tiny_model, tmp_path):
    ep, w = published
    hub = khub.Hub(endpoint=ep, cache_dir=str(tmp_path / "cache"))
    with khub.Model.from_pretrained(tiny_model, norm="acme/rmsnorm", hub=hub,
                                    policy=str(w / "policy.json")) as m:
        assert "norm: acme/rmsnorm -> acme/rmsnorm commit " in m.kernels_report
        assert "accepted by the policy" in m.kernels_report
        assert m.explain().splitlines()[0] == "rms_norm[f32]: acme/rmsnorm 1.0.0 :: rms_norm"
        assert len(m.generate("Hello", max_new_tokens=3, ignore_eos=True, details=True)
                   ["tokens"]) == 3


def test_hub_fetch_reports_variant_and_trust(published, tmp_path):
    ep, w = published
    with khub.Runtime() as rt, khub.Hub(endpoint=ep, cache_dir=str(tmp_path / "c")) as hub:
        kr = hub.fetch(rt, "acme/rmsnorm@version=1", policy=str(w / "policy.json"))
        assert kr.plugin_id == "acme/rmsnorm" and kr.repo == "acme/rmsnorm"
        assert kr.variant == "khub1-cpu-x86_64-linux" and len(kr.commit) == 40
        assert not kr.fell_back and not kr.locked
        assert "khub1-cpu-x86_64-linux: accept" in kr.trace
        assert any(p.id == "acme/rmsnorm" for p in rt.plugins())


def test_second_load_of_a_forged_signature_is_refused(published, tmp_path):
    """In one process (this one): a signed load, the same load again (its
    Ed25519 verdict is remembered, hub/sig_memo.c), then the cached
    metadata.json.sig edited: a forged signature and an edited statement
    are refused with the status and message a first load would get."""
    ep, w = published
    cache, policy = str(tmp_path / "c"), str(w / "policy.json")
    with khub.Runtime() as rt, khub.Hub(endpoint=ep, cache_dir=cache) as hub:
        first = hub.fetch(rt, "acme/rmsnorm@version=1", policy=policy)
    kid = first.trust.split("signed with key ")[1].split(",")[0]
    pinned = "acme/rmsnorm@" + first.commit
    with khub.Runtime() as rt, khub.Hub(cache_dir=cache, offline=True) as hub:
        assert hub.fetch(rt, pinned, policy=policy).trust == first.trust
    sig = os.path.realpath(os.path.join(cache, "kernels--acme--rmsnorm", "khub-variants",
                                        first.commit, first.variant, "metadata.json.sig"))
    good = open(sig).read()
    at = good.index('"signature": "') + len('"signature": "')
    forged = good[:at] + ("B" if good[at] == "A" else "A") + good[at + 1:]
    edited = good.replace('"version": "1.0.0"', '"version": "1.0.1"')
    assert edited != good
    want = ("refusing acme/rmsnorm@%s variant %s: acme: signature by key %s does not verify "
            "over its signed statement" % (first.commit[:12], first.variant, kid))
    os.chmod(sig, 0o644)
    for text in (forged, edited):
        with open(sig, "w") as f:
            f.write(text)
        with khub.Runtime() as rt, khub.Hub(cache_dir=cache, offline=True) as hub:
            with pytest.raises(khub.KhubError) as e:
                hub.fetch(rt, pinned, policy=policy)
        assert e.value.status_name == "KHUB_STATUS_SIGNATURE_INVALID"
        assert str(e.value) == want
    with open(sig, "w") as f:
        f.write(good)
    with khub.Runtime() as rt, khub.Hub(cache_dir=cache, offline=True) as hub:
        assert hub.fetch(rt, pinned, policy=policy).trust == first.trust


def test_unlisted_signer_is_refused_with_khubs_message(published, tiny_model, tmp_path):
    ep, w = published
    (tmp_path / "empty.json").write_text('{"version": 1, "publishers": {}}')
    hub = khub.Hub(endpoint=ep, cache_dir=str(tmp_path / "cache"))
    with pytest.raises(khub.KhubError) as e:
        khub.Model.from_pretrained(tiny_model, norm="acme/rmsnorm", hub=hub,
                                   policy=str(tmp_path / "empty.json"))
    assert e.value.status_name == "KHUB_STATUS_KEY_UNKNOWN"
    assert str(e.value).startswith("norm kernel acme/rmsnorm: refusing acme/rmsnorm@")
    assert "but the policy lists no keys for this organisation" in str(e.value)


def test_locked_load_runs_offline(published, tiny_model, tmp_path):
    ep, w = published
    cache = str(tmp_path / "cache")
    (tmp_path / "khub.json").write_text(
        '{"format": 1, "roles": {"norm": {"cpu": {"repo": "acme/rmsnorm", "version": 1}}}}')
    env = dict(os.environ, HF_ENDPOINT=ep, KHUB_CACHE=cache)
    subprocess.run([os.environ["KHUB_BIN"], "lock", str(tmp_path)], check=True, env=env,
                   capture_output=True)
    hub = khub.Hub(cache_dir=cache, offline=True)
    with khub.Model.from_pretrained(tiny_model, kernels=str(tmp_path / "khub.json"),
                                    lock=str(tmp_path / "khub.lock"), hub=hub,
                                    policy=str(w / "policy.json")) as m:
        assert "(locked, hashes re-checked)" in m.kernels_report


def test_lock_and_sync_through_the_binding(published, tiny_model, tmp_path):
    ep, w = published
    (tmp_path / "khub.json").write_text(
        '{"format": 1, "roles": {"norm": {"cpu": {"repo": "acme/rmsnorm", "version": 1}}}}')
    pins = khub.lock(str(tmp_path), hub=khub.Hub(endpoint=ep, cache_dir=str(tmp_path / "a")))
    assert [(p.repo, p.version, p.kernel_version, p.n_variants) for p in pins] == \
        [("acme/rmsnorm", 1, "1.0.0", 1)]
    assert len(pins[0].commit) == 40
    assert pins[0].commit in (tmp_path / "khub.lock").read_text()
    # sync into another cache, then load from it offline through the lock
    cache = str(tmp_path / "b")
    synced = khub.sync(str(tmp_path), hub=khub.Hub(endpoint=ep, cache_dir=cache))
    assert [(s["repo"], s["commit"], s["n_checked"], s["newer_version"]) for s in synced] == \
        [("acme/rmsnorm", pins[0].commit, 1, "")]
    with khub.Model.from_pretrained(tiny_model, kernels=str(tmp_path / "khub.json"),
                                    lock=str(tmp_path / "khub.lock"),
                                    hub=khub.Hub(cache_dir=cache, offline=True),
                                    policy=str(w / "policy.json")) as m:
        assert "(locked, hashes re-checked)" in m.kernels_report
