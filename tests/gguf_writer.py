"""Write a Hugging Face model as a llama.cpp-style GGUF (Llama's q/k rows permuted, gpt2 byte-level vocab):
Llama/Mistral as "llama", Qwen3 (q/k norms), Phi-3 (fused projections, LongRoPE factors) and Gemma 3 (its
norms as 1 + w, as convert_hf_to_gguf.py's Gemma3Model writes them) as theirs."""

from __future__ import annotations

import numpy as np
import torch

_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight", "mlp.gate_up_proj.weight": "ffn_up.weight",
}
_GEMMA3_NAMES = {"post_attention_layernorm.weight": "post_attention_norm.weight",
                 "pre_feedforward_layernorm.weight": "ffn_norm.weight",
                 "post_feedforward_layernorm.weight": "post_ffw_norm.weight"}
_ARCH = {"llama": "llama", "mistral": "llama", "qwen3": "qwen3", "phi3": "phi3", "gemma3_text": "gemma3"}


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: rotate-half pairs become interleaved pairs."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model: torch.nn.Module, path: str, types: dict[str, int] | None = None,
               chat_template: str | None = None, eot_token_id: int | None = None) -> None:
    """types: GGUF tensor name suffix (e.g. "attn_q.weight") -> GGML type to quantize it to (default F32)."""
    import gguf
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    c = model.config
    arch = _ARCH[c.model_type]
    w = gguf.GGUFWriter(path, arch)
    w.add_name("tiny-test")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)
    if arch == "phi3":
        _add_longrope(w, c)
    if arch == "gemma3":
        _add_gemma3(w, c)
    else:
        w.add_rope_freq_base(c.rope_theta if hasattr(c, "rope_theta") else c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    alphabet = list(bytes_to_unicode().values())
    tokens = ["<pad>", "<s>", "</s>"] + alphabet + ["hi"] + [f"<extra{i}>" for i in range(c.vocab_size - 260)]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * 257
                      + [gguf.TokenType.USER_DEFINED] * (c.vocab_size - 260))
    w.add_token_merges(["h i"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    if eot_token_id is not None:
        w.add_eot_token_id(eot_token_id)
    def add(gguf_name: str, array: np.ndarray) -> None:
        qtype = next((gguf.GGMLQuantizationType(t) for k, t in (types or {}).items() if gguf_name.endswith(k)), None)
        if qtype is None:
            w.add_tensor(gguf_name, array)
        else:
            w.add_tensor(gguf_name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)

    names = _NAMES | (_GEMMA3_NAMES if arch == "gemma3" else {})
    for name, tensor in model.state_dict().items():
        array = tensor.float().numpy()
        if arch == "gemma3" and name.endswith("norm.weight"):
            array = array + 1
        if name == "model.embed_tokens.weight":
            add("token_embd.weight", array)
        elif name == "model.norm.weight":
            add("output_norm.weight", array)
        elif name == "lm_head.weight":
            if not c.tie_word_embeddings:
                add("output.weight", array)
        else:
            _, _, layer, rest = name.split(".", 3)
            if rest == "self_attn.q_proj.weight" and arch == "llama":
                array = llama_cpp_permute(array, c.num_attention_heads)
            elif rest == "self_attn.k_proj.weight" and arch == "llama":
                array = llama_cpp_permute(array, c.num_key_value_heads)
            add(f"blk.{layer}.{names[rest]}", array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _add_longrope(w, c) -> None:
    """As convert_hf_to_gguf.py's Phi3MiniModel: factors as tensors, pretraining length and attention factor as keys."""
    import math

    rope = c.rope_parameters
    original = rope["original_max_position_embeddings"]
    scale = c.max_position_embeddings / original
    head_dim = c.hidden_size // c.num_attention_heads
    w.add_rope_dimension_count(int(head_dim * getattr(c, "partial_rotary_factor", 1.0)))   # as the converter does
    w.add_rope_scaling_orig_ctx_len(original)
    w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)
    w.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
    w.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))


def _add_gemma3(w, c) -> None:
    """As convert_hf_to_gguf.py's Gemma3Model: the window and the global layers' RoPE (base, linear scaling);
    llama.cpp fixes the rest (every 6th layer global, the sliding layers' base 10k)."""
    import gguf

    layer_types = [t == "sliding_attention" for t in c.layer_types]
    assert layer_types == [bool((i + 1) % 6) for i in range(c.num_hidden_layers)], "llama.cpp's pattern is 6"
    assert c.rope_parameters["sliding_attention"]["rope_theta"] == 10000.0, "llama.cpp's sliding base is 10k"
    full = c.rope_parameters["full_attention"]
    w.add_rope_freq_base(full["rope_theta"])
    w.add_sliding_window(c.sliding_window)
    if full.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(full["factor"])
