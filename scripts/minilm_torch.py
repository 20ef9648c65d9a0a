"""all-MiniLM-L6-v2's encoder (BertModel, token type 0) as a scriptable torch module, for ``torch.jit.script``.

``scripts/minilm.py`` builds it from the safetensors weights and saves it as the ``minilm_encoder_torchscript``
model; its ``forward(input_ids, attention_mask)`` returns ``last_hidden_state`` as the ONNX encoder does.
Imported only when the TorchScript model is written (torch is imported here at module level).
"""

from __future__ import annotations

import math

import torch
from torch import nn

HIDDEN, HEADS, LAYERS = 384, 12, 6


def _linear(w: dict[str, torch.Tensor], prefix: str) -> nn.Linear:
    weight = w[f"{prefix}.weight"]
    layer = nn.Linear(weight.shape[1], weight.shape[0])
    with torch.no_grad():
        layer.weight.copy_(weight)
        layer.bias.copy_(w[f"{prefix}.bias"])
    return layer


def _norm(w: dict[str, torch.Tensor], prefix: str) -> nn.LayerNorm:
    norm = nn.LayerNorm(HIDDEN, eps=1e-12)
    with torch.no_grad():
        norm.weight.copy_(w[f"{prefix}.weight"])
        norm.bias.copy_(w[f"{prefix}.bias"])
    return norm


class Layer(nn.Module):
    """One BertLayer: self-attention + residual + LayerNorm, then GELU feed-forward + residual + LayerNorm."""

    def __init__(self, w: dict[str, torch.Tensor], p: str) -> None:
        super().__init__()
        self.query = _linear(w, f"{p}.attention.self.query")
        self.key = _linear(w, f"{p}.attention.self.key")
        self.value = _linear(w, f"{p}.attention.self.value")
        self.attn_out = _linear(w, f"{p}.attention.output.dense")
        self.attn_norm = _norm(w, f"{p}.attention.output.LayerNorm")
        self.inner = _linear(w, f"{p}.intermediate.dense")
        self.out = _linear(w, f"{p}.output.dense")
        self.out_norm = _norm(w, f"{p}.output.LayerNorm")
        # plain attributes: TorchScript cannot read module-level ints
        self.heads, self.head_dim, self.hidden = HEADS, HIDDEN // HEADS, HIDDEN
        self.scale = 1.0 / math.sqrt(HIDDEN // HEADS)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], x.shape[1], self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        q, k, v = self._heads(self.query(x)), self._heads(self.key(x)), self._heads(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale + bias
        context = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(x.shape[0], x.shape[1], self.hidden)
        h = self.attn_norm(self.attn_out(context) + x)
        return self.out_norm(self.out(nn.functional.gelu(self.inner(h))) + h)


class MiniLM(nn.Module):
    """``forward(input_ids, attention_mask)`` (int64 [batch, seq]) -> ``last_hidden_state`` [batch, seq, 384]."""

    def __init__(self, w: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.word = nn.Embedding.from_pretrained(w["embeddings.word_embeddings.weight"])
        self.position = nn.Embedding.from_pretrained(w["embeddings.position_embeddings.weight"])
        self.register_buffer("token_type", w["embeddings.token_type_embeddings.weight"][0].clone())
        self.norm = _norm(w, "embeddings.LayerNorm")
        self.masked = float(torch.finfo(torch.float32).min)
        self.layers = nn.ModuleList([Layer(w, f"encoder.layer.{i}") for i in range(LAYERS)])

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], dtype=torch.long, device=input_ids.device)
        x = self.norm(self.word(input_ids) + self.position(positions) + self.token_type)
        # padding keys get the most negative float, as BertModel's extended attention mask: [batch, 1, 1, seq]
        bias = (1.0 - attention_mask.to(x.dtype))[:, None, None, :] * self.masked
        for layer in self.layers:
            x = layer(x, bias)
        return x
