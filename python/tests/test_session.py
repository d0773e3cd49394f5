"""khub.Session (khub_session.h) and Model.chat_format on the tiny model
(tools/make-tiny-model.py: SmolLM2's tokenizer and chat template)."""
import threading

import pytest

import khub


def test_chat_format_is_the_models_template(tiny_model):
    with khub.Model.from_pretrained(tiny_model) as m:
        text = m.chat_format([{"role": "user", "content": "Hi"}])
        assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"), text
        assert m.chat_format([("user", "Hi")]) == text
        closed = m.chat_format([("user", "Hi")], add_generation_prompt=False)
        assert closed + "<|im_start|>assistant\n" == text
        long = m.chat_format([("user", "word " * 500)])  # past the first buffer
        assert ("word " * 500) in long
        with pytest.raises(khub.KhubError) as e:
            m.chat_format([("", "Hi")])
        assert e.value.status_name == "KHUB_STATUS_TOKENIZER"
        assert str(e.value)


def test_session_turns_reuse_the_cache_and_equal_scratch(tiny_model):
    with khub.Model.from_pretrained(tiny_model, max_seqs=2) as m, khub.Session(m) as s:
        msgs = [{"role": "user", "content": "Hello there"}]
        r1 = s.generate(m.chat_format(msgs), max_new_tokens=6, ignore_eos=True, details=True)
        assert r1["stop_reason"] == "max_tokens" and len(r1["tokens"]) == 6
        i = s.info
        assert i["n_reused"] == 0 and i["n_prefilled"] == r1["n_prompt_tokens"]
        assert i["n_cached"] == r1["n_prompt_tokens"] + 5  # all but the last sampled token
        assert i["max_context"] > 0
        msgs += [{"role": "assistant", "content": r1["text"]},
                 {"role": "user", "content": "Go on"}]
        prompt = m.chat_format(msgs)
        text = s.generate(prompt, max_new_tokens=6, ignore_eos=True)
        i = s.info
        assert i["n_reused"] >= r1["n_prompt_tokens"] - 1  # BPE may merge across the seam
        assert i["n_prefilled"] < len(m.tokenize(prompt)) - r1["n_prompt_tokens"] + 8
        assert text == m.generate(prompt, max_new_tokens=6, ignore_eos=True)
        s.reset()
        assert s.info["n_cached"] == 0
        assert "".join(s.generate_stream(prompt, max_new_tokens=6, ignore_eos=True)) == text
        assert s.info["n_reused"] == 0


def test_one_session_per_model_and_closed_objects(tiny_model):
    m = khub.Model.from_pretrained(tiny_model)
    s = khub.Session(m)
    with pytest.raises(khub.KhubError) as e:
        khub.Session(m)
    assert e.value.status_name == "KHUB_STATUS_BUSY"
    assert "already has a session (one per model: free it first)" in str(e.value)
    s.close()
    s.close()  # twice is fine
    with pytest.raises(ValueError, match="the session is closed"):
        s.generate("Hi")
    s2 = khub.Session(m)  # the first one was freed
    m.close()  # closes s2 first
    with pytest.raises(ValueError, match="the session is closed"):
        s2.info
    with pytest.raises(ValueError, match="the model is closed"):
        khub.Session(m)


def test_cancel(tiny_model):
    with khub.Model.from_pretrained(tiny_model, max_context=4096) as m, khub.Session(m) as s:
        s.cancel()  # no call running: the next one stops at its first check
        r = s.generate("Hello", max_new_tokens=8, details=True)
        assert r["stop_reason"] == "cancelled" and r["tokens"] == []
        r = s.generate("Hello", max_new_tokens=8, ignore_eos=True, details=True)
        assert r["stop_reason"] == "max_tokens" and len(r["tokens"]) == 8
        # From another thread while a long answer is computed.
        out = {}
        t = threading.Thread(target=lambda: out.update(
            r=s.generate("Tell me a story", max_new_tokens=3000, ignore_eos=True, details=True)))
        t.start()
        threading.Timer(0.2, s.cancel).start()
        t.join(120)
        assert not t.is_alive()
        assert out["r"]["stop_reason"] == "cancelled", out["r"]["stop_reason"]
        assert len(out["r"]["tokens"]) < 3000
