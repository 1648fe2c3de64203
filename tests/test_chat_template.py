"""The model's own chat template (tokenizer_config.json, a GGUF's tokenizer.chat_template), rendered in a
sandbox with the model's special and stop tokens; ours only where the model has none; hostile templates
refused with a clear error."""

from __future__ import annotations

import json
import logging

import pytest

from engine import ModelLoadError
from engine.model.chat_template import ChatTemplate, ChatTemplateError, SpecialTokens
from engine.model.checkpoint import _generation_eos, read_gguf
from engine.model.tokenizer import load_tokenizer
from tests.conftest import save_word_tokenizer
from tests.gguf_writer import write_gguf

CHATML = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
MESSAGES = [{"role": "system", "content": "w5 w6"}, {"role": "user", "content": "w7 w8 w9"}]


def chatml_tokenizer(path, template: str | None = CHATML):
    """The word tokenizer with ChatML's two special tokens and `template` in tokenizer_config.json."""
    from transformers import AutoTokenizer

    save_word_tokenizer(path, 300)
    tok = AutoTokenizer.from_pretrained(path)
    (path / "chat_template.jinja").unlink()   # the word tokenizer's own
    tok.chat_template = None
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.save_pretrained(path)
    if template is not None:   # where most Hub repos keep it (transformers now writes chat_template.jinja)
        config = json.loads((path / "tokenizer_config.json").read_text())
        (path / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": template}))
    return AutoTokenizer.from_pretrained(path)


def test_the_models_own_template_gives_transformers_ids_and_its_stop_token(tmp_path, caplog):
    hf = chatml_tokenizer(tmp_path)
    with caplog.at_level(logging.INFO, logger="engine.model.tokenizer"):
        ours = load_tokenizer("hf", str(tmp_path), 300)
    expected = hf.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    assert ours.apply_chat_template(MESSAGES) == list(expected["input_ids"])
    assert ours.apply_chat_template(MESSAGES)[0] == hf.bos_token_id     # the template's BOS, and only it
    assert ours.eos_token_ids == tuple(sorted({hf.eos_token_id, hf.convert_tokens_to_ids("<|im_end|>")}))
    assert "chat template: the model's own, from tokenizer_config.json" in caplog.text


def test_without_a_template_ours_serves_and_the_log_says_so(tmp_path, caplog):
    hf = chatml_tokenizer(tmp_path, template=None)
    with caplog.at_level(logging.INFO, logger="engine.model.tokenizer"):
        ours = load_tokenizer("hf", str(tmp_path), 300)
    assert ours.chat_template is None
    assert ours.apply_chat_template(MESSAGES) == hf.encode("system: w5 w6\nuser: w7 w8 w9\nassistant: ")
    assert "chat template: built-in" in caplog.text
    assert ours.eos_token_ids == (hf.eos_token_id,)     # no end-of-turn token without a template writing it


def test_a_ggufs_template_and_end_of_turn_token(tiny_hf, tmp_path, caplog):
    path = str(tmp_path / "chat.gguf")
    write_gguf(tiny_hf[1], path, chat_template="{% for m in messages %}{{ m['content'] }}|{% endfor %}",
               eot_token_id=7)
    assert read_gguf(path).config.eos_token_ids == (2, 7)
    with caplog.at_level(logging.INFO, logger="engine.model.tokenizer"):
        tok = load_tokenizer("gguf", path, 300)
    assert "from the GGUF's tokenizer.chat_template" in caplog.text
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == tok._tok.encode("hi|", add_special_tokens=False)


def test_generation_config_adds_its_eos_ids(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 9]}))
    assert _generation_eos(str(tmp_path), (2, 4)) == (2, 4, 9)
    assert _generation_eos(str(tmp_path / "missing"), (2,)) == (2,)


HOSTILE = {
    "class walk": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "function globals": "{{ raise_exception.__globals__ }}",
    "attr filter": "{{ (messages | attr('__class__')) }}",
    "mutation": "{{ messages.append({'role': 'user', 'content': 'x'}) }}",
    "namespace dunder": "{% set ns = namespace(_hidden=1) %}{{ ns }}",
    "string bomb": "{{ 'x' * 1000000000 }}",
    "power": "{{ 10 ** 10 ** 10 }}",
}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_templates_are_refused(name):
    with pytest.raises(ChatTemplateError, match="was refused"):
        ChatTemplate(HOSTILE[name], "test").render(MESSAGES)


def test_a_hostile_template_is_a_one_line_load_error(tmp_path):
    chatml_tokenizer(tmp_path, template=HOSTILE["class walk"])
    with pytest.raises(ModelLoadError, match="was refused") as error:
        load_tokenizer("hf", str(tmp_path), 300)
    assert "\n" not in str(error.value) and str(tmp_path) in str(error.value)


def test_a_template_hostile_only_to_some_conversations_fails_them_not_the_load():
    template = ChatTemplate("{% for m in messages %}{% if m['content'] == 'boom' %}{{ m.__class__ }}{% endif %}"
                            "{{ m['content'] }}{% endfor %}", "test")
    template.check_safe()
    with pytest.raises(ChatTemplateError, match="was refused"):
        template.render([{"role": "user", "content": "boom"}])


def test_raise_exception_and_syntax_errors_are_clear():
    strict = ChatTemplate("{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}", "t")
    with pytest.raises(ChatTemplateError, match="rejected the conversation: user first"):
        strict.render(MESSAGES)
    strict.check_safe()   # a conversation's rejection is not the template's fault
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for m in messages %}", "t")


def test_template_helpers_of_real_templates():
    """What Hub templates use: special tokens, tojson without HTML escapes, loop controls, generation tags."""
    source = ("{{ bos_token }}{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
              "{% generation %}{{ m | tojson }}{% endgeneration %}{% endfor %}{{ eos_token }}")
    out = ChatTemplate(source, "t", SpecialTokens(bos_token="<s>", eos_token="</s>")).render(
        [{"role": "user", "content": "<a & b>"}, {"role": "user", "content": "never"}])
    assert out == '<s>{"role": "user", "content": "<a & b>"}</s>'
