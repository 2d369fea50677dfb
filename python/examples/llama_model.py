"""The model of llama_loop.py: a random-weight, Llama-shaped decoder over a
paged KV cache (vLLM's layout: per layer [2, num_pages, page_tokens,
kv_heads, head_dim], a block table per request)."""

import math

import torch
import torch.nn.functional as F


class Llama:
    """Random-weight Llama-shaped decoder over a paged KV cache."""

    def __init__(self, a, device, dtype):
        self.a, self.device, self.dtype = a, device, dtype
        g = torch.Generator(device=device).manual_seed(a.seed)

        def w(*shape, fan_in):
            return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) / math.sqrt(fan_in)).to(dtype)

        H, D, KVH = a.heads, a.head_dim, a.kv_heads
        self.embed = w(a.vocab, a.hidden, fan_in=1)
        distinct = []
        for _ in range(a.distinct_layers or a.layers):
            distinct.append(dict(
                ln1=torch.ones(a.hidden, device=device, dtype=dtype),
                wq=w(a.hidden, H * D, fan_in=a.hidden), wk=w(a.hidden, KVH * D, fan_in=a.hidden),
                wv=w(a.hidden, KVH * D, fan_in=a.hidden), wo=w(H * D, a.hidden, fan_in=H * D),
                ln2=torch.ones(a.hidden, device=device, dtype=dtype),
                wg=w(a.hidden, a.intermediate, fan_in=a.hidden), wu=w(a.hidden, a.intermediate, fan_in=a.hidden),
                wd=w(a.intermediate, a.hidden, fan_in=a.intermediate),
            ))
        self.layers = [distinct[l % len(distinct)] for l in range(a.layers)]
        self.weight_bytes = sum(t.numel() * t.element_size() for L in distinct for t in L.values())
        self.lnf = torch.ones(a.hidden, device=device, dtype=dtype)
        self.lm_head = w(a.hidden, a.vocab, fan_in=a.hidden)
        self.weight_bytes += 2 * self.embed.numel() * self.embed.element_size()
        inv = 1.0 / (500000.0 ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D))
        self.inv_freq = inv

    @staticmethod
    def rms(x, wt, eps=1e-5):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * wt

    def rope(self, x, pos):
        f = torch.outer(pos.float(), self.inv_freq)  # [T, D/2]
        cos, sin = f.cos()[:, None, :], f.sin()[:, None, :]
        x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
        return out.to(x.dtype)

    def forward(self, tokens, start, kv, table, before_attn=None, after_attn=None, marks=None):
        """Prefills `tokens` at positions [start, start+T) whose earlier KV
        (positions < start) is already in the pages of `table`; writes the new
        KV into the cache and returns the last position's logits. `marks`
        (a Marks) timestamps each layer's start and end and the end of the
        LM head on the compute stream."""
        a = self.a
        T, PT = tokens.numel(), a.page_tokens
        H, KVH, D = a.heads, a.kv_heads, a.head_dim
        pos = torch.arange(start, start + T, device=self.device)
        ctx = start + T
        page_of = table[pos // PT]
        slot_of = pos % PT
        ctx_pages = table[: (ctx + PT - 1) // PT]
        if T == ctx:
            mask = None
        else:
            kpos = torch.arange(ctx, device=self.device)
            mask = kpos[None, :] <= pos[:, None]  # [T, ctx]
        h = self.embed[tokens]
        for l, L in enumerate(self.layers):
            if marks:
                marks.mark(("start", l))
            x = self.rms(h, L["ln1"])
            q = self.rope((x @ L["wq"]).view(T, H, D), pos)
            k = self.rope((x @ L["wk"]).view(T, KVH, D), pos)
            v = (x @ L["wv"]).view(T, KVH, D)
            if before_attn:
                before_attn(l)  # the earlier KV of this layer must be in place from here on
            cache = kv[l]
            cache[0, page_of, slot_of] = k
            cache[1, page_of, slot_of] = v
            K = cache[0, ctx_pages].reshape(-1, KVH, D)[:ctx]
            V = cache[1, ctx_pages].reshape(-1, KVH, D)[:ctx]
            K = K.repeat_interleave(H // KVH, dim=1)
            V = V.repeat_interleave(H // KVH, dim=1)
            o = attention(q.transpose(0, 1), K.transpose(0, 1), V.transpose(0, 1), mask)
            h = h + o.transpose(0, 1).reshape(T, H * D) @ L["wo"]
            if after_attn:
                after_attn(l)
            x = self.rms(h, L["ln2"])
            h = h + (F.silu(x @ L["wg"]) * (x @ L["wu"])) @ L["wd"]
            if marks:
                marks.mark(("end", l))
        logits = (self.rms(h[-1:], self.lnf) @ self.lm_head).float()[0]
        if marks:
            marks.mark("head")
        return logits


def attention(q, k, v, mask):
    """Causal attention of q [H, T, D] over k, v [H, ctx, D]; mask [T, ctx]
    (True = attend) or None for a full causal prefill (T == ctx)."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=None if mask is None else mask[None, None],
                                              is_causal=mask is None)[0]
    # torch < 2.0 (CPU smoke tests only)
    T, ctx = q.shape[1], k.shape[1]
    if mask is None:
        mask = torch.ones(T, ctx, dtype=torch.bool, device=q.device).tril()
    s = (q.float() @ k.float().transpose(1, 2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~mask[None], float("-inf"))
    return (s.softmax(-1) @ v.float()).to(q.dtype)
