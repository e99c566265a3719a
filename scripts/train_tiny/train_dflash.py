"""Train a DFlash draft (block diffusion, arXiv 2602.06036) for a tiny target.

The target is one of the committed tiny models (tests/data/models/*.gguf,
weights read from the GGUF into a transformers model built from the
committed config.json); its hidden states at --target-layers are the draft's
features. The draft is the published DFlash architecture, written here from
its description (model-and-format-specs.md section 6), not copied:

  ctx   = hidden_norm(fc(concat of the target layers' outputs))  (committed rows)
  block = the target's embedding of [x_a, MASK x (B-1)] at positions a..a+B-1
  layer: q from the block; k, v from ctx rows and block rows (k_norm, RoPE);
         the block sees every ctx row before a and every block row (non-causal)
  logits of block row i = target lm_head(norm(h_i)): the token at a + i.

Training (the recipe: random anchors, masked block, the target as teacher):
per sequence, random anchors a; the loss is the KL divergence from the
target's next-token distribution at positions a..a+B-2 (what the target will
accept), weighted exp(-(i-1)/gamma) over block position i. The target is
frozen. Output: a z-lab style checkpoint directory (config.json with
dflash_config, model.safetensors) that `moeserve convert` turns into a GGUF.

  python3 scripts/train_tiny/train_dflash.py --arch qwen3 --out /tmp/dflash-qwen3 --seconds 150
"""
import argparse
import json
import math
import os
import struct
import sys
import sysconfig
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# ---- the target, from the committed GGUF ----------------------------------

GGUF_TYPES = {0: (np.float32, 4), 1: (np.float16, 2), 30: ("bf16", 2)}


def read_gguf(path):
    """Tensors of an F32/F16/BF16 GGUF file as float32 numpy arrays (torch order)."""
    with open(path, "rb") as f:
        data = f.read()
    off = 0

    def take(fmt):
        nonlocal off
        v = struct.unpack_from("<" + fmt, data, off)
        off += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal off
        n = take("Q")
        s = data[off:off + n].decode("utf-8", "replace")
        off += n
        return s

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        return take(scalar[t])

    assert data[:4] == b"GGUF", path
    off = 4
    _version, n_tensors, n_kv = take("I"), take("Q"), take("Q")
    meta = {}
    for _ in range(n_kv):
        k = string()
        meta[k] = value(take("I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        nd = take("I")
        ne = [take("Q") for _ in range(nd)]
        t, o = take("I"), take("Q")
        infos.append((name, ne, t, o))
    align = meta.get("general.alignment", 32)
    base = (off + align - 1) // align * align
    out = {}
    for name, ne, t, o in infos:
        n = int(np.prod(ne))
        kind, size = GGUF_TYPES[t]
        raw = np.frombuffer(data, dtype=np.uint8, count=n * size, offset=base + o)
        if kind == "bf16":
            arr = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            arr = raw.view(kind).astype(np.float32)
        out[name] = arr.reshape(list(reversed(ne))).copy()
    return meta, out


def load_target(hf_dir, gguf_path, device):
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.from_pretrained(hf_dir)
    if gguf_path == "hf":  # the weights as train_model.py saved them (no GGUF needed yet)
        model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
        return model.to(device).eval(), cfg
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    _, t = read_gguf(gguf_path)
    sd = model.state_dict()
    new = {}

    def put(hf, value):
        assert hf in sd, f"{hf} not in the model"
        assert tuple(sd[hf].shape) == tuple(value.shape), f"{hf}: {tuple(sd[hf].shape)} vs {value.shape}"
        new[hf] = torch.from_numpy(value)

    put("model.embed_tokens.weight", t["token_embd.weight"])
    put("model.norm.weight", t["output_norm.weight"])
    put("lm_head.weight", t.get("output.weight", t["token_embd.weight"]))
    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
             "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj", "ffn_gate_inp": "mlp.gate"}
    for i in range(cfg.num_hidden_layers):
        for g, h in names.items():
            key = f"blk.{i}.{g}.weight"
            if key in t:
                put(f"model.layers.{i}.{h}.weight", t[key])
        if f"blk.{i}.ffn_gate_exps.weight" in t:
            gate, up = t[f"blk.{i}.ffn_gate_exps.weight"], t[f"blk.{i}.ffn_up_exps.weight"]  # [E, F, H]
            down = t[f"blk.{i}.ffn_down_exps.weight"]  # [E, H, F]
            p = f"model.layers.{i}.mlp.experts."
            if p + "gate_up_proj" in sd:
                fused = np.concatenate([gate, up], axis=1)  # [E, 2F, H]
                if tuple(sd[p + "gate_up_proj"].shape) != fused.shape:
                    fused = fused.transpose(0, 2, 1)
                put(p + "gate_up_proj", np.ascontiguousarray(fused))
                d = down if tuple(sd[p + "down_proj"].shape) == down.shape else down.transpose(0, 2, 1)
                put(p + "down_proj", np.ascontiguousarray(d))
            else:
                for e in range(gate.shape[0]):
                    put(f"{p}{e}.gate_proj.weight", gate[e])
                    put(f"{p}{e}.up_proj.weight", up[e])
                    put(f"{p}{e}.down_proj.weight", down[e])
    missing = [k for k in sd if k not in new and "rotary" not in k]
    assert not missing, f"not loaded: {missing[:8]}"
    model.load_state_dict(new, strict=False)
    return model.to(device).eval(), cfg


# ---- the corpus (the targets' training text: the stdlib) -------------------

def corpus_ids(tokenizer_path, max_bytes=10_000_000):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer_path)
    root = sysconfig.get_paths()["stdlib"]
    files = []
    for d, dirs, names in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in {"site-packages", "dist-packages", "__pycache__"})
        files += [os.path.join(d, n) for n in sorted(names) if n.endswith(".py")]
    texts, total = [], 0
    for p in files:
        text = open(p, encoding="utf-8", errors="replace").read()
        total += len(text)
        if total > max_bytes:
            break
        texts.append(text)
    eos = tok.token_to_id("<|endoftext|>")
    train, held = [], []
    for i, enc in enumerate(tok.encode_batch(texts)):
        (held if i % 50 == 49 else train).extend(enc.ids + [eos])
    return np.array(train, dtype=np.int64), np.array(held, dtype=np.int64)


# ---- the target's own text (self-distillation) ------------------------------

@torch.no_grad()
def greedy_continuations(target, train_ids, n_seqs, seq, prompt_len, batch, seed, device):
    """n_seqs sequences of `seq` tokens: a prompt of prompt_len tokens from the
    corpus, then the target's greedy continuation. At inference the draft
    reads the features of text the target wrote itself (greedy decoding is
    what speculation verifies against), so it learns most from that text:
    the DFlash recipe trains on target-generated responses."""
    gen = np.random.default_rng(seed)
    out = []
    for b0 in range(0, n_seqs, batch):
        n = min(batch, n_seqs - b0)
        starts = gen.integers(0, train_ids.size - prompt_len - 1, n)
        ids = torch.from_numpy(np.stack([train_ids[s:s + prompt_len] for s in starts])).to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            o = target(input_ids=ids, use_cache=True)
            past, nxt = o.past_key_values, o.logits[:, -1].argmax(-1)
            toks = [nxt]
            for _ in range(seq - prompt_len - 1):
                o = target(input_ids=nxt[:, None], past_key_values=past, use_cache=True)
                past, nxt = o.past_key_values, o.logits[:, -1].argmax(-1)
                toks.append(nxt)
        out.append(torch.cat([ids, torch.stack(toks, 1)], 1))
    return torch.cat(out, 0)


# ---- the draft -------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rope(x, pos, theta):  # x [..., T, heads, d], pos [..., T] (NEOX halves)
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.float()[..., None] * inv  # [..., T, d/2]
    cos, sin = ang.cos()[..., None, :], ang.sin()[..., None, :]
    a, b = x[..., : d // 2].float(), x[..., d // 2:].float()
    return torch.cat([a * cos - b * sin, a * sin + b * cos], -1).to(x.dtype)


class DraftLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, d, nh, nkv = c["hidden_size"], c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
        self.d, self.nh, self.nkv = d, nh, nkv
        self.input_layernorm = RMSNorm(H, c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(H, c["rms_norm_eps"])
        self.q_proj = nn.Linear(H, nh * d, bias=False)
        self.k_proj = nn.Linear(H, nkv * d, bias=False)
        self.v_proj = nn.Linear(H, nkv * d, bias=False)
        self.o_proj = nn.Linear(nh * d, H, bias=False)
        self.q_norm = RMSNorm(d, c["rms_norm_eps"])
        self.k_norm = RMSNorm(d, c["rms_norm_eps"])
        self.gate_proj = nn.Linear(H, c["intermediate_size"], bias=False)
        self.up_proj = nn.Linear(H, c["intermediate_size"], bias=False)
        self.down_proj = nn.Linear(c["intermediate_size"], H, bias=False)
        self.theta = c["rope_theta"]

    def forward(self, h, ctx, ctx_pos, blk_pos, ctx_visible):
        # h [B, N, L, H] blocks; ctx [B, T, H]; ctx_visible [B, N, T] (ctx rows before the anchor)
        B, N, L, _ = h.shape
        T = ctx.shape[1]
        x = self.input_layernorm(h)
        q = rope(self.q_norm(self.q_proj(x).view(B, N, L, self.nh, self.d)), blk_pos, self.theta)
        kb = rope(self.k_norm(self.k_proj(x).view(B, N, L, self.nkv, self.d)), blk_pos, self.theta)
        vb = self.v_proj(x).view(B, N, L, self.nkv, self.d)
        kc = rope(self.k_norm(self.k_proj(ctx).view(B, T, self.nkv, self.d)), ctx_pos, self.theta)
        vc = self.v_proj(ctx).view(B, T, self.nkv, self.d)
        k = torch.cat([kc[:, None].expand(B, N, T, self.nkv, self.d), kb], 2)
        v = torch.cat([vc[:, None].expand(B, N, T, self.nkv, self.d), vb], 2)
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, 3).permute(0, 1, 3, 2, 4)  # [B, N, nh, T+L, d]
        v = v.repeat_interleave(rep, 3).permute(0, 1, 3, 2, 4)
        q = q.permute(0, 1, 3, 2, 4)  # [B, N, nh, L, d]
        mask = torch.cat([ctx_visible, torch.ones(B, N, L, dtype=torch.bool, device=h.device)], -1)
        mask = mask[:, :, None, None, :].expand(B, N, self.nh, L, T + L)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        h = h + self.o_proj(o.permute(0, 1, 3, 2, 4).reshape(B, N, L, self.nh * self.d))
        x = self.post_attention_layernorm(h)
        return h + self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Draft(nn.Module):
    def __init__(self, c, n_features):
        super().__init__()
        H = c["hidden_size"]
        self.fc = nn.Linear(n_features * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, c["rms_norm_eps"])
        self.norm = RMSNorm(H, c["rms_norm_eps"])
        self.layers = nn.ModuleList([DraftLayer(c) for _ in range(c["num_hidden_layers"])])

    def forward(self, block_embeds, feats, ctx_pos, blk_pos, ctx_visible):
        ctx = self.hidden_norm(self.fc(feats))
        h = block_embeds
        for layer in self.layers:
            h = layer(h, ctx, ctx_pos, blk_pos, ctx_visible)
        return self.norm(h)

    def hf_state_dict(self):
        out = {"fc.weight": self.fc.weight, "hidden_norm.weight": self.hidden_norm.weight,
               "norm.weight": self.norm.weight}
        for i, l in enumerate(self.layers):
            p = f"layers.{i}."
            out[p + "input_layernorm.weight"] = l.input_layernorm.weight
            out[p + "post_attention_layernorm.weight"] = l.post_attention_layernorm.weight
            for n in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
                out[p + f"self_attn.{n}.weight"] = getattr(l, n).weight
            for n in ("gate_proj", "up_proj", "down_proj"):
                out[p + f"mlp.{n}.weight"] = getattr(l, n).weight
        return {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in out.items()}


# ---- parity fixture --------------------------------------------------------

def parity_dump(path, target, draft, ids, layers, mask_id, block, anchors):
    """What the engine's draft must reproduce (tests/spec/dflash_parity_test.cpp):
    for one token sequence and a few anchors, the draft's block outputs given
    the features of the rows before the anchor, in f32 with the saved (bf16)
    weights: each block row's top 8 logits and arg-max, and the target's own
    next tokens there."""
    import copy
    d32 = copy.deepcopy(draft).float()
    with torch.no_grad():
        for p in d32.parameters():
            p.copy_(p.to(torch.bfloat16).float())
        T = ids.numel()
        out = target(input_ids=ids[None], output_hidden_states=True, use_cache=False)
        feats = torch.cat([out.hidden_states[l + 1] for l in layers], -1).float()
        target_next = out.logits[0].float().argmax(-1)  # token at t + 1
        rows = []
        for a in anchors:
            blk = torch.full((1, 1, block), mask_id, dtype=torch.long, device=ids.device)
            blk[0, 0, 0] = ids[a]
            emb = target.model.embed_tokens(blk).float()
            ctx_pos = torch.arange(T, device=ids.device)[None]
            blk_pos = (a + torch.arange(block, device=ids.device))[None, None]
            visible = (torch.arange(T, device=ids.device) < a)[None, None]
            h = d32(emb, feats, ctx_pos, blk_pos, visible)
            logits = target.lm_head(h[:, :, 1:]).float()[0, 0]  # [block - 1, V]
            top = logits.topk(8, -1)
            rows.append({"anchor": a, "greedy": logits.argmax(-1).tolist(),
                         "top_ids": top.indices.tolist(), "top_logits": top.values.tolist(),
                         "target_next": target_next[a: a + block - 1].tolist()})
    with open(path, "w") as f:
        json.dump({"tokens": ids.tolist(), "target_layers": layers, "mask_token_id": mask_id, "block": block,
                   "anchors": rows}, f)


# ---- training --------------------------------------------------------------

def batch_step(target, draft, ids, args, layers, gen, mask_id):
    """One batch: the loss and the greedy chain's acceptance per block (teacher forced)."""
    dev = ids.device
    B, T = ids.shape
    with torch.no_grad():
        out = target(input_ids=ids, output_hidden_states=True, use_cache=False)
        feats = torch.cat([out.hidden_states[l + 1] for l in layers], -1).float()
        teacher = out.logits.float()  # [B, T, V]: the token at t+1
    L, N = args.block, args.anchors
    anchors = torch.randint(1, T - L, (B, N), generator=gen, device=dev)  # root positions
    offs = torch.arange(L, device=dev)
    blk_pos = anchors[..., None] + offs  # [B, N, L]
    blk_tok = torch.full((B, N, L), mask_id, device=dev, dtype=torch.long)
    blk_tok[..., 0] = torch.gather(ids, 1, anchors)
    emb = target.model.embed_tokens(blk_tok).float()
    ctx_pos = torch.arange(T, device=dev)[None].expand(B, T)
    ctx_visible = torch.arange(T, device=dev)[None, None, :] < anchors[..., None]  # [B, N, T]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        h = draft(emb, feats, ctx_pos, blk_pos, ctx_visible)
        logits = target.lm_head(h[:, :, 1:]).float()  # [B, N, L-1, V]: token at a + i
    # The target's distribution of the token at a+i is teacher[a+i-1].
    tpos = (anchors[..., None] + offs[None, None, : L - 1])  # a .. a+L-2
    tl = torch.gather(teacher, 1, tpos.reshape(B, -1, 1).expand(B, N * (L - 1), teacher.shape[-1]))
    tl = tl.view(B, N, L - 1, -1)
    w = torch.exp(-torch.arange(L - 1, device=dev).float() / args.gamma)
    kl = (F.softmax(tl, -1) * (F.log_softmax(tl, -1) - F.log_softmax(logits, -1))).sum(-1)  # [B, N, L-1]
    loss = (kl * w).sum(-1).mean() / w.sum()
    with torch.no_grad():
        hit = (logits.argmax(-1) == tl.argmax(-1)).int().cumprod(-1).sum(-1).float()
    return loss, hit.mean().item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="qwen3")
    ap.add_argument("--out", required=True)
    ap.add_argument("--target-dir", default="", help="the target's HF directory (config, tokenizer); "
                    "default: the committed <arch>-tiny")
    ap.add_argument("--target-gguf", default="", help="the target's F32/F16/BF16 GGUF (its weights); "
                    "default: the committed <arch>-tiny.bf16.gguf; 'hf': the weights of --target-dir")
    ap.add_argument("--seconds", type=float, default=150)
    ap.add_argument("--layers", type=int, default=2, help="draft layers")
    ap.add_argument("--target-layers", default="", help="comma list; default: 1 and the one before the last")
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--anchors", type=int, default=24)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--gamma", type=float, default=7.0)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--distill-seqs", type=int, default=0,
                    help="sequences of the target's own greedy text to train on beside the corpus (0: none)")
    ap.add_argument("--distill-share", type=float, default=0.5, help="share of batches taken from them")
    ap.add_argument("--distill-prompt", type=int, default=64, help="corpus tokens before each continuation")
    ap.add_argument("--parity-out", default="", help="write the engine parity fixture (JSON) here")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    dev = "cuda"
    hf_dir = args.target_dir or os.path.join(REPO, "tests/data/models/hf", f"{args.arch}-tiny")
    gguf = args.target_gguf or os.path.join(REPO, "tests/data/models", f"{args.arch}-tiny.bf16.gguf")
    target, tcfg = load_target(hf_dir, gguf, dev)
    for p in target.parameters():
        p.requires_grad_(False)
    n_layer = tcfg.num_hidden_layers
    # Never the last layer: HF hands it over after the final norm (the engine captures before it).
    layers = [int(x) for x in args.target_layers.split(",")] if args.target_layers else [1, n_layer - 2]
    tok_path = os.path.join(hf_dir, "tokenizer.json")
    train_ids, held_ids = corpus_ids(tok_path)
    print(f"corpus: {train_ids.size} train tokens, {held_ids.size} held out", flush=True)
    mask_id = tcfg.vocab_size - 1
    theta = tcfg.rope_parameters["rope_theta"] if getattr(tcfg, "rope_parameters", None) else tcfg.rope_theta
    c = {"hidden_size": tcfg.hidden_size, "num_hidden_layers": args.layers,
         "num_attention_heads": tcfg.num_attention_heads, "num_key_value_heads": tcfg.num_key_value_heads,
         "head_dim": tcfg.head_dim, "intermediate_size": 2 * tcfg.hidden_size, "rms_norm_eps": tcfg.rms_norm_eps,
         "rope_theta": float(theta)}
    draft = Draft(c, len(layers)).to(dev)
    # The target's held-out loss: the GGUF weights went in right.
    held = torch.from_numpy(held_ids[: 8 * args.seq + 1]).to(dev)
    with torch.no_grad():
        x = held[: 8 * args.seq].view(8, args.seq)
        y = held[1: 8 * args.seq + 1].view(8, args.seq)
        tl = F.cross_entropy(target(input_ids=x).logits.float().reshape(-1, tcfg.vocab_size), y.reshape(-1))
    print(f"target held-out loss {tl.item():.3f}", flush=True)
    opt = torch.optim.AdamW(draft.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    data = torch.from_numpy(train_ids).to(dev)
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)
    t0 = time.time()
    own = None
    if args.distill_seqs > 0:
        own = greedy_continuations(target, train_ids, args.distill_seqs, args.seq, args.distill_prompt, 256,
                                   args.seed, dev)
        print(f"target's own text: {own.shape[0]} sequences of {own.shape[1]} tokens in "
              f"{time.time() - t0:.0f} s (counted in --seconds)", flush=True)
    step, warm = 0, 100
    pick = np.random.default_rng(args.seed + 1)
    ar = torch.arange(args.seq, device=dev)
    while time.time() - t0 < args.seconds:
        frac = min(1.0, (time.time() - t0) / args.seconds)
        lr = args.lr * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        if own is not None and pick.random() < args.distill_share:
            ids = own[torch.from_numpy(pick.integers(0, own.shape[0], args.batch)).to(dev)]
        else:
            start = torch.randint(0, data.numel() - args.seq - 1, (args.batch,), generator=gen, device=dev)
            ids = data[start[:, None] + ar]
        loss, al = batch_step(target, draft, ids, args, layers, gen, mask_id)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        if step % 100 == 0:
            print(f"step {step} t {time.time() - t0:.0f}s lr {lr:.2e} loss {loss.item():.4f} "
                  f"teacher-forced acceptance {al:.2f}", flush=True)
        step += 1
    with torch.no_grad():
        hd = torch.from_numpy(held_ids[: 16 * args.seq]).to(dev).view(16, args.seq)
        loss, al = batch_step(target, draft, hd, args, layers, gen, mask_id)
        # The target's own continuations of held-out prompts: what decoding meets.
        held_own = greedy_continuations(target, held_ids, 16, args.seq, args.distill_prompt, 16, args.seed + 2,
                                        dev)
        _, al_own = batch_step(target, draft, held_own, args, layers, gen, mask_id)
    print(f"held out: loss {loss.item():.4f}, accepted draft tokens per block {al:.2f} (greedy chain, "
          f"teacher forced); on the target's own continuations of held-out prompts {al_own:.2f}; "
          f"{step} steps", flush=True)
    os.makedirs(args.out, exist_ok=True)
    from safetensors.torch import save_file
    save_file(draft.hf_state_dict(), os.path.join(args.out, "model.safetensors"), metadata={"format": "pt"})
    config = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": c["hidden_size"],
              "num_hidden_layers": args.layers, "num_attention_heads": c["num_attention_heads"],
              "num_key_value_heads": c["num_key_value_heads"], "head_dim": c["head_dim"],
              "intermediate_size": c["intermediate_size"], "rms_norm_eps": c["rms_norm_eps"],
              "rope_theta": c["rope_theta"], "max_position_embeddings": tcfg.max_position_embeddings,
              "vocab_size": tcfg.vocab_size, "tie_word_embeddings": False, "attention_bias": False,
              "hidden_act": "silu", "block_size": args.block, "num_target_layers": n_layer,
              "dflash_config": {"target_layer_ids": layers, "mask_token_id": mask_id}}
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    if args.parity_out:
        # The first held-out prompt and the target's greedy text after it (float32, as the engine runs).
        parity_dump(args.parity_out, target, draft, held_own[0, :96].contiguous(), layers, mask_id, args.block,
                    [24, 48, 72])
    with open(os.path.join(args.out, "train_summary.json"), "w") as f:
        json.dump({"arch": args.arch, "seconds": args.seconds, "steps": step, "held_out_loss": loss.item(),
                   "teacher_forced_acceptance": al, "acceptance_on_own_text": al_own,
                   "target_held_out_loss": tl.item(),
                   "args": vars(args)}, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
