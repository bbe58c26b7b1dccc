"""Independent PyTorch implementation of the model in docs/MODEL_MATH.md.

Written from the math contract only, never from the C++, so that agreement
between the two is evidence that both follow the contract. Everything runs in
float64 by default: the trainer computes in float32, and the reference must be
the more precise side so that measured differences are the trainer's error.
"""
import math
import os
import re
from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F

# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


def _parse_scalar(text):
    text = text.strip()
    if text == "" or text in ("~", "null", "Null", "NULL"):
        return None
    if (text[0] == text[-1]) and text[0] in "'\"" and len(text) >= 2:
        return text[1:-1]
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [_parse_scalar(p) for p in inner.split(",")] if inner else []
    if text in ("true", "True", "TRUE"):
        return True
    if text in ("false", "False", "FALSE"):
        return False
    if re.fullmatch(r"[-+]?\d+", text):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text


def _strip_comment(line):
    # A '#' starts a comment only at line start or after whitespace, outside quotes.
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
    return line


def parse_simple_yaml(text):
    """Block-style YAML subset: nested maps, '- item' lists, flow lists, scalars.

    Only used when PyYAML is missing; the resolved trainer config needs no more.
    """
    lines = []
    for raw in text.splitlines():
        line = _strip_comment(raw).rstrip()
        if line.strip() in ("", "---", "..."):
            continue
        lines.append((len(line) - len(line.lstrip(" ")), line.strip()))

    def parse_block(i, indent):
        if i < len(lines) and lines[i][1].startswith("-"):
            items = []
            while i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("-"):
                items.append(_parse_scalar(lines[i][1][1:]))
                i += 1
            return items, i
        result = {}
        while i < len(lines) and lines[i][0] == indent:
            content = lines[i][1]
            if ":" not in content:
                raise ValueError(f"cannot parse YAML line: {content!r}")
            key, _, rest = content.partition(":")
            key = key.strip().strip("'\"")
            i += 1
            if rest.strip():
                result[key] = _parse_scalar(rest)
            elif i < len(lines) and (lines[i][0] > indent or
                                     (lines[i][0] == indent and lines[i][1].startswith("-"))):
                result[key], i = parse_block(i, lines[i][0])
            else:
                result[key] = None
        return result, i

    if not lines:
        return {}
    value, i = parse_block(0, lines[0][0])
    if i != len(lines):
        raise ValueError(f"cannot parse YAML near line: {lines[i][1]!r}")
    return value


def load_yaml(path):
    with open(path) as f:
        text = f.read()
    try:
        import yaml
    except ImportError:
        return parse_simple_yaml(text)
    return yaml.safe_load(text) or {}


_MISSING = object()


def cfg_get(cfg, paths, default=_MISSING):
    """First present value among dotted `paths` (a string or a list of alternatives).

    Alternatives exist because the MoE block may be printed as `model.moe.*`
    (the struct layout) or as a top-level `moe.*` (the name MODEL_MATH.md uses).
    """
    if isinstance(paths, str):
        paths = [paths]
    for path in paths:
        node = cfg
        for part in path.split("."):
            if isinstance(node, dict) and part in node:
                node = node[part]
            else:
                break
        else:
            if node is not None:
                return node
    if default is _MISSING:
        raise KeyError(f"config has none of {paths}")
    return default


def _as_bool(v):
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false", "1", "0", "yes", "no", "on", "off"):
        return v.lower() in ("true", "1", "yes", "on")
    if isinstance(v, (int, float)):
        return bool(v)
    raise ValueError(f"not a boolean: {v!r}")


@dataclass
class ModelSpec:
    arch: str
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    max_seq_len: int
    norm_eps: float
    rope_theta: float
    tied: bool
    num_experts: int
    top_k: int
    moe_every: int
    capacity_factor: float
    aux_loss_coeff: float
    moe_d_ff: int
    normalize_topk: bool
    # RoPE scaling (MODEL_MATH.md, RoPE): None or {"type": "linear" | "llama3",
    # "factor", "low_freq_factor", "high_freq_factor", "original_max_seq_len"}.
    rope_scaling: dict = None
    # Attention biases of a llama: "none", "qkv" or "qkvo" (gpt2: all).
    attn_bias: str = "none"
    sliding_window: int = 0  # 0: none; W: a query sees keys t - W .. t

    def has_bias(self, proj):
        """Whether attention projection proj ("wq", "wk", "wv", "wo") has a bias."""
        if self.arch == "gpt2":
            return True
        return self.attn_bias == "qkvo" or (self.attn_bias == "qkv" and proj != "wo")

    @property
    def head_dim(self):
        return self.d_model // self.n_heads

    def is_moe_layer(self, i):
        return self.num_experts > 0 and (i + 1) % self.moe_every == 0


def round_up(x, m):
    return (x + m - 1) // m * m


def model_spec_from_config(cfg):
    m = lambda key, default=_MISSING: cfg_get(cfg, "model." + key, default)  # noqa: E731
    moe = lambda key, default: cfg_get(cfg, ["model.moe." + key, "moe." + key], default)  # noqa: E731
    arch = str(m("arch", "llama"))
    if arch not in ("llama", "gpt2"):
        raise ValueError(f"model.arch must be llama or gpt2, got {arch!r}")
    d_model = int(m("d_model", 64))
    n_heads = int(m("n_heads", 4))
    n_kv = int(m("n_kv_heads", 0)) or n_heads
    d_ff = int(m("d_ff", 0))
    if d_ff <= 0:
        d_ff = round_up(8 * d_model // 3, 32) if arch == "llama" else 4 * d_model
    tie = m("tie_embeddings", "auto")
    tied = (arch == "gpt2") if str(tie).lower() == "auto" else _as_bool(tie)
    moe_d_ff = int(moe("d_ff", 0)) or d_ff
    rs = lambda key, default: cfg_get(cfg, "model.rope_scaling." + key, default)  # noqa: E731
    scaling_type = str(rs("type", "none"))
    if scaling_type not in ("none", "linear", "llama3"):
        raise ValueError(f"model.rope_scaling.type must be none, linear or llama3, got {scaling_type!r}")
    rope_scaling = None if scaling_type == "none" else {
        "type": scaling_type, "factor": float(rs("factor", 1.0)),
        "low_freq_factor": float(rs("low_freq_factor", 1.0)), "high_freq_factor": float(rs("high_freq_factor", 4.0)),
        "original_max_seq_len": float(rs("original_max_seq_len", 0))}
    spec = ModelSpec(
        arch=arch,
        vocab_size=int(m("vocab_size", 256)),
        d_model=d_model,
        n_layers=int(m("n_layers", 2)),
        n_heads=n_heads,
        n_kv_heads=n_kv,
        d_ff=d_ff,
        max_seq_len=int(m("max_seq_len", 64)),
        norm_eps=float(m("norm_eps", 1e-5)),
        rope_theta=float(m("rope_theta", 10000.0)),
        tied=tied,
        num_experts=int(moe("num_experts", 0)),
        top_k=int(moe("top_k", 2)),
        moe_every=int(moe("every", 1)),
        capacity_factor=float(moe("capacity_factor", 0.0)),
        aux_loss_coeff=float(moe("aux_loss_coeff", 0.01)),
        moe_d_ff=moe_d_ff,
        normalize_topk=_as_bool(moe("normalize_topk", True)),
        rope_scaling=rope_scaling,
        attn_bias=str(m("attn_bias", "none")),
        sliding_window=int(m("sliding_window", 0)),
    )
    if d_model % n_heads or n_heads % n_kv:
        raise ValueError(f"d_model {d_model}, n_heads {n_heads}, n_kv_heads {n_kv} are inconsistent")
    if spec.arch == "llama" and spec.head_dim % 2:
        raise ValueError("RoPE needs an even head_dim")
    if spec.num_experts > 0 and not (1 <= spec.top_k <= spec.num_experts):
        raise ValueError(f"moe.top_k {spec.top_k} must be in [1, {spec.num_experts}]")
    return spec


def param_shapes(spec):
    """Every parameter name of MODEL_MATH.md with its shape, in a fixed order."""
    C, V, D = spec.d_model, spec.vocab_size, spec.head_dim
    Hq, Hkv, Fd = spec.n_heads, spec.n_kv_heads, spec.d_ff
    E, Fe = spec.num_experts, spec.moe_d_ff
    gpt2 = spec.arch == "gpt2"
    s = OrderedDict()
    s["tok_embed.weight"] = (V, C)
    if gpt2:
        s["pos_embed.weight"] = (spec.max_seq_len, C)
    for i in range(spec.n_layers):
        p = f"layers.{i}."
        s[p + "attn_norm.weight"] = (C,)
        if gpt2:
            s[p + "attn_norm.bias"] = (C,)
        for name, out in (("wq", Hq * D), ("wk", Hkv * D), ("wv", Hkv * D)):
            s[p + f"attn.{name}.weight"] = (out, C)
            if spec.has_bias(name):
                s[p + f"attn.{name}.bias"] = (out,)
        s[p + "attn.wo.weight"] = (C, Hq * D)
        if spec.has_bias("wo"):
            s[p + "attn.wo.bias"] = (C,)
        s[p + "mlp_norm.weight"] = (C,)
        if gpt2:
            s[p + "mlp_norm.bias"] = (C,)
        if spec.is_moe_layer(i):
            s[p + "moe.router.weight"] = (E, C)
            if gpt2:
                s[p + "moe.w_fc"] = (E, Fe, C)
                s[p + "moe.w_proj"] = (E, C, Fe)
            else:
                s[p + "moe.w_gate"] = (E, Fe, C)
                s[p + "moe.w_up"] = (E, Fe, C)
                s[p + "moe.w_down"] = (E, C, Fe)
        elif gpt2:
            s[p + "mlp.w_fc.weight"] = (Fd, C)
            s[p + "mlp.w_fc.bias"] = (Fd,)
            s[p + "mlp.w_proj.weight"] = (C, Fd)
            s[p + "mlp.w_proj.bias"] = (C,)
        else:
            s[p + "mlp.w_gate.weight"] = (Fd, C)
            s[p + "mlp.w_up.weight"] = (Fd, C)
            s[p + "mlp.w_down.weight"] = (C, Fd)
    s["final_norm.weight"] = (C,)
    if gpt2:
        s["final_norm.bias"] = (C,)
    if not spec.tied:
        s["lm_head.weight"] = (V, C)
    return s


def check_param_names(spec, tensors, what):
    """List of human-readable problems (empty when names and shapes match exactly)."""
    expected = param_shapes(spec)
    problems = []
    for name, shape in expected.items():
        if name not in tensors:
            problems.append(f"{what}: missing {name} {list(shape)}")
        elif tuple(tensors[name].shape) != tuple(shape):
            problems.append(f"{what}: {name} has shape {list(tensors[name].shape)}, expected {list(shape)}")
    for name in tensors:
        if name not in expected:
            problems.append(f"{what}: unexpected tensor {name} {list(tensors[name].shape)}")
    return problems


def random_params(spec, seed=0, std=0.02, dtype=torch.float32):
    """Random weights like the contract's init, except that biases and norms get
    non-trivial values so that the self-test exercises every term."""
    g = torch.Generator().manual_seed(seed)
    out = OrderedDict()
    for name, shape in param_shapes(spec).items():
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=g, dtype=torch.float64)
        elif name.endswith(".bias"):
            t = 0.02 * torch.randn(shape, generator=g, dtype=torch.float64)
        else:
            scale = std
            if any(k in name for k in ("attn.wo", "w_down", "w_proj")):
                scale = std / math.sqrt(2 * spec.n_layers)
            t = scale * torch.randn(shape, generator=g, dtype=torch.float64)
        out[name] = t.to(dtype)
    return out


# ---------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------


def rms_norm(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # biased variance
    return (x - mean) / torch.sqrt(var + eps) * w + b


def linear(x, w, b=None):
    y = x @ w.transpose(-1, -2)
    return y if b is None else y + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def rope_inv_freq(D, theta, scaling=None):
    """inv_freq [D/2] float64 of MODEL_MATH.md's RoPE: theta^(-2i/D), scaled."""
    f = theta ** (-2.0 * torch.arange(D // 2, dtype=torch.float64) / D)
    if scaling is None:
        return f
    if scaling["type"] == "linear":
        return f / scaling["factor"]
    if scaling["type"] != "llama3":
        raise ValueError(f"unknown RoPE scaling {scaling['type']!r}")
    orig, lo, hi, factor = (scaling["original_max_seq_len"], scaling["low_freq_factor"],
                            scaling["high_freq_factor"], scaling["factor"])
    w = 2 * math.pi / f
    s = (orig / w - lo) / (hi - lo)
    ramp = (1 - s) * f / factor + s * f
    return torch.where(w > orig / lo, f / factor, torch.where(w < orig / hi, f, ramp))


def rope(x, theta, scaling=None):
    """Half-split RoPE on x [B, T, H, D]: pair (i, i + D/2) rotated by t * inv_freq[i]."""
    B, T, H, D = x.shape
    half = D // 2
    # Angles in float64 regardless of x's dtype, then cast: the reference's own
    # rounding should stay far below the trainer's.
    inv_freq = rope_inv_freq(D, theta, scaling)
    t = torch.arange(T, dtype=torch.float64)
    ang = t[:, None] * inv_freq[None, :]  # [T, half]
    cos = torch.cos(ang).to(x.dtype)[None, :, None, :]
    sin = torch.sin(ang).to(x.dtype)[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def causal_attention(q, k, v, window=0):
    """q [B,T,Hq,D], k/v [B,T,Hkv,D]; query head j reads kv head j // (Hq/Hkv).
    window > 0: query t sees keys t - window .. t only (sliding window)."""
    B, T, Hq, D = q.shape
    Hkv = k.shape[2]
    group = Hq // Hkv
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    qh, kh, vh = (z.permute(0, 2, 1, 3) for z in (q, k, v))  # [B,H,T,D]
    scores = (qh @ kh.transpose(-1, -2)) / math.sqrt(D)
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    if window > 0:
        t = torch.arange(T)
        future = future | (t[:, None] - t[None, :] > window)
    scores = scores.masked_fill(future, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = probs @ vh  # [B,H,T,D]
    return out.permute(0, 2, 1, 3).reshape(B, T, Hq * D)


def topk_stable(p, k):
    """Top-k along the last dim, descending, ties broken towards the lower index.

    torch.topk does not promise any tie order; a stable descending sort does.
    """
    vals, idx = torch.sort(p, dim=-1, descending=True, stable=True)
    return vals[..., :k], idx[..., :k]


def moe_route(p, top_k, capacity_factor, normalize_topk):
    """Routing decisions for router probabilities p [N, E].

    Returns (experts [N,K] long, weights [N,K] differentiable, keep [N,K] bool,
    counts [E] assignments before dropping, capacity or None, min_margin)."""
    N, E = p.shape
    _, experts = topk_stable(p.detach(), top_k)
    w = torch.gather(p, 1, experts)
    if normalize_topk:
        w = w / w.sum(-1, keepdim=True)
    counts = torch.bincount(experts.reshape(-1), minlength=E)
    if capacity_factor > 0:
        capacity = math.ceil(capacity_factor * N * top_k / E)
        # Admission is k-major (all tokens' first choice, then second, ...),
        # token order within each k: rank each assignment within its expert in
        # that order and keep the first `capacity`.
        order = experts.t().reshape(-1)  # [K*N], index k*N + n
        onehot = F.one_hot(order, E)
        rank = (onehot.cumsum(0) - onehot)[torch.arange(order.numel()), order]
        keep = (rank < capacity).reshape(top_k, N).t()
    else:
        capacity = None
        keep = torch.ones_like(experts, dtype=torch.bool)
    # Distance of the routing decisions from a tie, in p: float32 rounding in
    # the trainer can flip a decision closer than its own error in p. The set
    # chosen depends on the gap at rank K; with a capacity the order within
    # the top K decides admission too, so those gaps count as well.
    sorted_p, _ = torch.sort(p.detach(), dim=-1, descending=True)
    gaps = sorted_p[:, :-1] - sorted_p[:, 1:]  # gap j: rank j vs rank j+1
    if capacity is not None:
        gaps = gaps[:, :top_k]
    else:
        gaps = gaps[:, top_k - 1:top_k]
    min_margin = float(gaps.min()) if gaps.numel() else float("inf")
    return experts, w, keep, counts, capacity, min_margin


# ---------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------


class ReferenceModel:
    """Holds leaf tensors named as in MODEL_MATH.md; forward is plain autograd math."""

    def __init__(self, spec, weights, dtype=torch.float64):
        problems = check_param_names(spec, weights, "weights")
        if problems:
            raise ValueError("weights do not match the config:\n  " + "\n  ".join(problems))
        self.spec = spec
        self.dtype = dtype
        self.params = OrderedDict()
        for name in param_shapes(spec):
            t = weights[name].detach().to(dtype).clone()
            t.requires_grad_(True)
            self.params[name] = t
        self.last_stats = {}

    def _norm(self, x, prefix):
        P, s = self.params, self.spec
        if s.arch == "llama":
            return rms_norm(x, P[prefix + ".weight"], s.norm_eps)
        return layer_norm(x, P[prefix + ".weight"], P[prefix + ".bias"], s.norm_eps)

    def _bias(self, name):
        return self.params.get(name)

    def _dense_ffn(self, h, p):
        P = self.params
        if self.spec.arch == "llama":
            g = linear(h, P[p + "mlp.w_gate.weight"])
            u = linear(h, P[p + "mlp.w_up.weight"])
            return linear(F.silu(g) * u, P[p + "mlp.w_down.weight"])
        a = gelu_tanh(linear(h, P[p + "mlp.w_fc.weight"], P[p + "mlp.w_fc.bias"]))
        return linear(a, P[p + "mlp.w_proj.weight"], P[p + "mlp.w_proj.bias"])

    def _expert(self, h, p, e):
        P = self.params
        if self.spec.arch == "llama":
            g = linear(h, P[p + "moe.w_gate"][e])
            u = linear(h, P[p + "moe.w_up"][e])
            return linear(F.silu(g) * u, P[p + "moe.w_down"][e])
        return linear(gelu_tanh(linear(h, P[p + "moe.w_fc"][e])), P[p + "moe.w_proj"][e])

    def _moe(self, h, p, stats):
        s = self.spec
        B, T, C = h.shape
        x = h.reshape(B * T, C)
        N, E, K = B * T, s.num_experts, s.top_k
        probs = torch.softmax(linear(x, self.params[p + "moe.router.weight"]), dim=-1)
        experts, w, keep, counts, capacity, margin = moe_route(
            probs, K, s.capacity_factor, s.normalize_topk)
        y = torch.zeros_like(x)
        for e in range(E):
            sel = (experts == e) & keep  # a token picks an expert at most once
            tok, slot = torch.nonzero(sel, as_tuple=True)
            if tok.numel() == 0:
                continue
            out = self._expert(x[tok], p, e)
            y = y.index_add(0, tok, w[tok, slot].unsqueeze(-1) * out)
        f = counts.to(x.dtype) / (N * K)  # a count: constant by construction
        P_e = probs.mean(0)
        aux = E * (f * P_e).sum()
        stats.setdefault("min_margin", float("inf"))
        stats["min_margin"] = min(stats["min_margin"], margin)
        stats.setdefault("dropped", 0)
        stats["dropped"] += int((~keep).sum())
        stats.setdefault("capacity", capacity)
        return y.reshape(B, T, C), aux

    def forward(self, ids):
        """ids [B, T] int -> (logits [B*T, V], aux summed over MoE layers)."""
        s, P = self.spec, self.params
        ids = ids.long()
        B, T = ids.shape
        if T > s.max_seq_len and s.arch == "gpt2":
            raise ValueError(f"sequence length {T} exceeds max_seq_len {s.max_seq_len}")
        x = P["tok_embed.weight"][ids]
        if s.arch == "gpt2":
            x = x + P["pos_embed.weight"][:T].unsqueeze(0)
        Hq, Hkv, D = s.n_heads, s.n_kv_heads, s.head_dim
        aux = torch.zeros((), dtype=self.dtype)
        stats = {}
        for i in range(s.n_layers):
            p = f"layers.{i}."
            h = self._norm(x, p + "attn_norm")
            q = linear(h, P[p + "attn.wq.weight"], self._bias(p + "attn.wq.bias")).reshape(B, T, Hq, D)
            k = linear(h, P[p + "attn.wk.weight"], self._bias(p + "attn.wk.bias")).reshape(B, T, Hkv, D)
            v = linear(h, P[p + "attn.wv.weight"], self._bias(p + "attn.wv.bias")).reshape(B, T, Hkv, D)
            if s.arch == "llama":
                q, k = rope(q, s.rope_theta, s.rope_scaling), rope(k, s.rope_theta, s.rope_scaling)
            a = causal_attention(q, k, v, s.sliding_window)
            x = x + linear(a, P[p + "attn.wo.weight"], self._bias(p + "attn.wo.bias"))
            h = self._norm(x, p + "mlp_norm")
            if s.is_moe_layer(i):
                y, layer_aux = self._moe(h, p, stats)
                aux = aux + layer_aux
            else:
                y = self._dense_ffn(h, p)
            x = x + y
        h = self._norm(x, "final_norm")
        w_head = P["tok_embed.weight"] if s.tied else P["lm_head.weight"]
        logits = linear(h, w_head).reshape(B * T, s.vocab_size)
        self.last_stats = stats
        return logits, aux


def load_dump_config(dump_dir):
    return load_yaml(os.path.join(dump_dir, "config.yaml"))
