"""Minimal Llama (HF LlamaForCausalLM-compatible parameter names and maths), torch only.

Parameter names match Hugging Face exactly (model.embed_tokens.weight, model.layers.{i}.
self_attn.{q,k,v,o}_proj.weight, model.layers.{i}.mlp.{gate,up,down}_proj.weight,
model.layers.{i}.{input,post_attention}_layernorm.weight, model.norm.weight), so
``state_dict()`` is directly an HF checkpoint (lm_head is tied to the embedding).
RMSNorm in fp32, RoPE with HF's rotate_half convention, SwiGLU MLP, grouped-query attention.

A restricted-vocabulary draft (``input_rows`` / ``head_rows`` > 0; the engine's optional tensors
``exactspec.embed_rows`` and ``exactspec.head_ids``, docs/draft_wasm.md): the embedding has
input_rows rows and token t reads row ``embed_rows[t]``; an untied ``lm_head`` has head_rows rows
and scores only the tokens ``head_ids`` (every other token's logit is -inf).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class LlamaConf:
    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 6
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    max_position_embeddings: int = 512
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    initializer_range: float = 0.02
    input_rows: int = 0      # M > 0: embedding (M, hidden) read through embed_rows (V,)
    head_rows: int = 0       # N > 0: untied lm_head (N, hidden) scoring head_ids (N,) only

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS = {
    "champion": LlamaConf(),
    "draft": LlamaConf(hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=64),
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dt)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, c: LlamaConf):
        super().__init__()
        self.nh, self.nkv, self.hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, c.hidden_size, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.nkv != self.nh:
            rep = self.nh // self.nkv
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, c: LlamaConf):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, c: LlamaConf):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Inner(nn.Module):
    def __init__(self, c: LlamaConf):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.input_rows or c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList([Block(c) for _ in range(c.num_hidden_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class Llama(nn.Module):
    def __init__(self, c: LlamaConf):
        super().__init__()
        assert c.head_rows or not c.input_rows, "a restricted embedding needs the untied restricted head"
        self.conf = c
        self.model = Inner(c)
        if c.head_rows:
            self.lm_head = nn.Linear(c.hidden_size, c.head_rows, bias=False)
            self.register_buffer("head_ids", torch.arange(c.head_rows), persistent=True)        # (N,) ascending
        if c.input_rows:
            self.register_buffer("embed_rows", torch.zeros(c.vocab_size, dtype=torch.long), persistent=True)  # (V,)
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.int64).float() / c.head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)
        self.reset_parameters()

    def reset_parameters(self):
        std = self.conf.initializer_range
        n = self.conf.num_hidden_layers
        for name, p in self.named_parameters():
            if p.dim() == 2:
                s = std
                if name.endswith(("o_proj.weight", "down_proj.weight")):
                    s = std / math.sqrt(2 * n)
                nn.init.normal_(p, mean=0.0, std=s)
            else:
                nn.init.ones_(p)

    def rope(self, T: int, device):
        pos = torch.arange(T, device=device, dtype=torch.float32)
        freqs = torch.outer(pos, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos()[None, None], emb.sin()[None, None]

    def hidden(self, idx):
        x = self.model.embed_tokens(self.embed_rows[idx] if self.conf.input_rows else idx)
        cos, sin = self.rope(idx.shape[1], idx.device)
        for blk in self.model.layers:
            x = blk(x, cos, sin)
        return self.model.norm(x)

    def head_logits(self, idx):
        """(B, T, N) logits of the head's own rows (N = V when unrestricted)."""
        if self.conf.head_rows:
            return self.lm_head(self.hidden(idx))
        return F.linear(self.hidden(idx), self.model.embed_tokens.weight)

    def forward(self, idx):
        """Return logits (B, T, V): tied to embed_tokens, or -inf outside head_ids when restricted."""
        logits = self.head_logits(idx)
        if not self.conf.head_rows:
            return logits
        full = logits.new_full(logits.shape[:-1] + (self.conf.vocab_size,), float("-inf"))
        return full.index_copy(-1, self.head_ids, logits)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def hf_config(c: LlamaConf) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": c.max_position_embeddings,
        "rope_theta": c.rope_theta,
        "rope_scaling": None,
        "rms_norm_eps": c.rms_norm_eps,
        "initializer_range": c.initializer_range,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "tie_word_embeddings": not (c.head_rows or c.input_rows),
        "use_cache": True,
        "torch_dtype": "float32",
        "bos_token_id": 0,
        "eos_token_id": [1, 6],
        "pad_token_id": 2,
    }
