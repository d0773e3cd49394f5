"""The khub binding over libkhub: plugins and their selection traces, a tiny
model loaded with named kernels, tokens, generation (whole and streamed),
errors as KhubError with khub's own message, and SmolLM2 when it is cached."""
import os
import re

import pytest
import time

import khub


def test_version_is_the_library_one():
    assert re.fullmatch(r"\d+\.\d+\.\d+", khub.version())
    assert os.path.exists(khub.library_path()) or "libkhub" in khub.library_path()


def test_builtin_plugins_are_listed_with_their_ops():
    plugins = {p.id: p for p in khub.plugins()}
    ref = plugins["khub/ref-cpu"]
    assert re.fullmatch(r"[0-9a-f]{64}", ref.sha256)
    assert os.path.isfile(ref.path) and ref.path.endswith(".so")
    assert ref.abi.startswith("1.")
    kinds = {op.kind for op in ref.ops}
    assert {"attention", "norm", "activation", "rotary", "linear", "qlinear"} <= kinds
    assert all(op.device == "cpu" for op in ref.ops)


def test_selection_trace_names_the_choice_and_every_candidate():
    with khub.Runtime() as rt:
        sel = rt.select("norm", plugin="khub/ref-cpu")
        assert sel.name.startswith("khub/ref-cpu ") and ":: " in sel.name
        assert re.search(r"^accept khub/ref-cpu .* :: ", sel.trace, re.M), sel.trace
        n_norm = sum(1 for p in rt.plugins() for op in p.ops if op.kind == "norm")
        assert len([l for l in sel.trace.splitlines() if re.match(r"(accept|reject) ", l)]) \
            >= n_norm


def test_strict_selection_of_a_missing_plugin_raises_khub_error():
    with khub.Runtime(strict=True) as rt:
        with pytest.raises(khub.KhubError) as e:
            rt.select("attention", plugin="acme/absent")
        assert e.value.status_name == "KHUB_STATUS_NO_KERNEL"
        assert "acme/absent" in str(e.value)


def test_unknown_kind_is_a_value_error():
    with khub.Runtime(builtin=False) as rt, pytest.raises(ValueError, match="unknown op kind"):
        rt.select("convolution")


def test_missing_model_raises_khubs_exact_message(tmp_path):
    path = str(tmp_path / "absent")
    with pytest.raises(khub.KhubError) as e:
        khub.Model.from_pretrained(path)
    assert e.value.status_name == "KHUB_STATUS_NOT_FOUND"
    assert e.value.status == 6
    assert str(e.value) == ("%s: no such file or folder; pass a .gguf file or a Hugging Face "
                            "model folder" % path)


def test_bad_hub_id_raises_khubs_message(tiny_model):
    with pytest.raises(khub.KhubError) as e:
        khub.Model.from_pretrained(tiny_model, attn_implementation="acme//flash")
    assert e.value.status_name == "KHUB_STATUS_BAD_ID"
    assert str(e.value) == ('attention kernel acme//flash: bad Hub ID "acme//flash": at column 6: '
                            "a Hub ID has exactly one '/' (org/name)")


def test_tiny_model_loads_with_named_kernels(tiny_model):
    with khub.Model.from_pretrained(tiny_model, attn_implementation="khub/ref-cpu",
                                    norm="khub/ref-cpu", max_context=128) as m:
        info = m.info
        assert info["arch"] == "llama" and info["format"] == "safetensors"
        assert (info["n_layers"], info["hidden"], info["vocab"]) == (2, 64, 704)
        assert info["max_context"] == 128
        explain = m.explain()
        attn = [l for l in explain.splitlines() if re.match(r"\S*attention\S*: ", l)]
        assert attn and all("khub/ref-cpu" in l for l in attn), explain
        assert re.search(r"^\s+accept khub/ref-cpu", explain, re.M), explain


def test_quantization_at_load(tiny_model):
    with khub.Model.from_pretrained(tiny_model) as dense, \
            khub.Model.from_pretrained(tiny_model, quantization="nf4") as m:
        roles = [l for l in m.explain().splitlines() if not l.startswith(" ")]
        assert "qkv_proj[nf4]: khub/ref-cpu 0.1.0 :: qlinear" in roles, roles
        assert m.info["weight_bytes"] < dense.info["weight_bytes"]
        assert len(m.generate("Hello", max_new_tokens=2, ignore_eos=True, details=True)
                   ["tokens"]) == 2


def test_tokenize_round_trip(tiny_model):
    with khub.Model.from_pretrained(tiny_model) as m:
        text = "Hello world, 1234 caf\u00e9!"
        ids = m.tokenize(text)
        assert ids and all(0 <= i < 704 for i in ids)
        assert m.detokenize(ids) == text
        assert m.tokenize(text, add_bos=True)[-len(ids):] == ids
        long = "abc " * 500  # more ids than the first guess of the buffer
        assert m.detokenize(m.tokenize(long)) == long


def test_generate_and_stream_agree(tiny_model):
    with khub.Model.from_pretrained(tiny_model) as m:
        r = m.generate("Hello", max_new_tokens=6, ignore_eos=True, details=True)
        assert len(r["tokens"]) == 6 and r["stop_reason"] == "max_tokens"
        assert r["text"] == m.detokenize(r["tokens"])
        stream = m.generate_stream("Hello", max_new_tokens=6, ignore_eos=True)
        pieces = list(stream)
        assert "".join(pieces) == r["text"]
        assert stream.result["tokens"] == r["tokens"]
        assert m.generate(["Hello", "Hello"], max_new_tokens=6, ignore_eos=True) == [r["text"]] * 2


def test_stream_stops_when_the_loop_leaves(tiny_model):
    window = khub.GenerationStream._WINDOW
    with khub.Model.from_pretrained(tiny_model) as m:
        stream = m.generate_stream("Hello", max_new_tokens=100, ignore_eos=True)
        got = []
        for piece in stream:
            got.append(piece)
            if len(got) == 2:
                # A reader descheduled here (a loaded machine) used to let the
                # generation run to max_new_tokens: it may now run only the
                # window ahead of what was read.
                time.sleep(0.5)
                break
        stream.close()
        assert stream.result["stop_reason"] == "callback"
        assert len(stream.result["tokens"]) <= len(got) + window + 1


def test_generation_error_is_raised_from_the_stream(tiny_model):
    with khub.Model.from_pretrained(tiny_model, max_context=16) as m:
        with pytest.raises(khub.KhubError) as e:
            list(m.generate_stream("word " * 40, max_new_tokens=4))
        assert e.value.status_name == "KHUB_STATUS_CONTEXT_FULL"
        assert str(e.value)


def test_lock_without_a_mapping_raises_khubs_message(tmp_path):
    with pytest.raises(khub.KhubError) as e:
        khub.lock(str(tmp_path), hub=khub.Hub(cache_dir=str(tmp_path / "c"), offline=True))
    assert e.value.status_name == "KHUB_STATUS_NOT_FOUND"
    assert str(e.value) == "%s/khub.json: cannot open: No such file or directory" % tmp_path
    assert not (tmp_path / "khub.lock").exists()


def test_smollm2_knows_paris(smollm2):
    with khub.Model.from_pretrained(smollm2, attn_implementation="sdpa") as m:
        text = "".join(m.generate_stream("The capital of France is", max_new_tokens=8))
        assert "Paris" in text, text
