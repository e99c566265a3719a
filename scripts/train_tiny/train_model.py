"""Train one tiny Qwen3 (dense), Qwen3-MoE, Qwen3.5 (dense), Qwen3.5-MoE or
Laguna model on the prepared corpus.

fp32 master weights with bf16 autocast, AdamW, linear warm-up then cosine
decay. The number of steps is fixed after a short timing run so training
takes about --seconds. Before saving, every weight is rounded to a
bf16-representable value, so a BF16 GGUF of the saved files is lossless with
respect to the f32 model the fixtures are computed from. Saves the HF
directory (bf16 safetensors, config, generation config, tokenizer files) and
a JSON summary (losses, steps, time, routing statistics for the MoE models).

qwen35moe / qwen35 (hybrid Gated DeltaNet) are built by hybrid_arch.py, which
also makes their Gated DeltaNet layers run transformers' torch reference
functions (no fla / causal_conv1d kernels) with the delta rule in fp32 inside
the bf16 autocast region (--gdn-autocast runs it under autocast instead).

laguna (sliding-window + YaRN attention, sigmoid-routed MoE) is built by
laguna_arch.py; before training, the sliding-window masking is checked from
eager attention probabilities and the default (sdpa) attention is compared
with eager. After training and bf16 rounding, every router's
e_score_correction_bias is set to fixed pseudo-random bf16 values (it is not
trained: transformers keeps it frozen), so the biased expert selection
differs from the unbiased one on some tokens; the summary records them.
"""
import argparse
import copy
import json
import math
import os
import shutil
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hybrid_arch  # noqa: E402
import laguna_arch  # noqa: E402

ARCHES = ("qwen3moe", "qwen3", "qwen35moe", "qwen35", "laguna")


# --preset small: a qwen3moe large enough to be predictable for speculative
# decoding's measurements (issue 40): 8 layers of hidden 768, 32 experts
# top-4 of 384, about 245M parameters (about 26M active a token).
SMALL_QWEN3MOE = dict(hidden_size=768, num_hidden_layers=8, num_attention_heads=12, num_key_value_heads=4,
                      num_experts=32, num_experts_per_tok=4, moe_intermediate_size=384)


def build_config(arch, vocab_size, ids, preset="tiny"):
    if preset == "small" and arch != "qwen3moe":
        raise SystemExit(f"--preset small is defined for qwen3moe only, not {arch}")
    if laguna_arch.is_laguna(arch):
        return laguna_arch.build_config(vocab_size, ids)
    if hybrid_arch.is_hybrid(arch):
        return hybrid_arch.build_config(arch, vocab_size, ids)
    from transformers import Qwen3Config, Qwen3MoeConfig
    base = dict(vocab_size=vocab_size, hidden_size=256, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, hidden_act="silu",
                max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False,
                attention_bias=False, use_sliding_window=False, initializer_range=0.02,
                bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"])
    if arch == "qwen3moe":
        cls = Qwen3MoeConfig
        # moe_intermediate_size 128 keeps the model near 9M parameters.
        base.update(num_experts=16, num_experts_per_tok=4, moe_intermediate_size=128,
                    norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                    intermediate_size=512, output_router_logits=False,
                    router_aux_loss_coef=0.001)
    else:
        cls = Qwen3Config
        base.update(intermediate_size=512, head_dim=64)
    if preset == "small":
        base.update(SMALL_QWEN3MOE)
    rope = {"rope_type": "default", "rope_theta": 1000000.0}
    try:
        cfg = cls(rope_parameters=rope, **base)
    except TypeError:
        cfg = cls(rope_theta=1000000.0, **base)
    if getattr(cfg, "head_dim", None) != 64:
        cfg.head_dim = 64
    return cfg


def model_class(arch):
    if laguna_arch.is_laguna(arch):
        return laguna_arch.model_class()
    if hybrid_arch.is_hybrid(arch):
        return hybrid_arch.model_class(arch)
    from transformers import Qwen3ForCausalLM, Qwen3MoeForCausalLM
    return Qwen3MoeForCausalLM if arch == "qwen3moe" else Qwen3ForCausalLM


def check_model_shape(model, cfg, arch="qwen3"):
    """Fail early if the config did not produce the intended architecture."""
    if laguna_arch.is_laguna(arch):
        return laguna_arch.check_shape(model, cfg)
    if hybrid_arch.is_hybrid(arch):
        return hybrid_arch.check_shape(model, cfg, arch)
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.out_features == cfg.num_attention_heads * 64, "head_dim"
    assert attn.k_proj.out_features == cfg.num_key_value_heads * 64, "head_dim"
    rotary = getattr(model.model, "rotary_emb", None) or getattr(attn, "rotary_emb", None)
    if rotary is None:
        print("WARNING: no rotary_emb module found; rope theta not checked")
        return
    inv = rotary.inv_freq.detach().float().cpu()
    want = 1.0 / (1e6 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64))
    assert torch.allclose(inv, want, rtol=1e-4), f"rope theta: {inv[:4]} vs {want[:4]}"


class Batcher:
    def __init__(self, ids, seq, batch, device, seed):
        self.data = torch.from_numpy(ids.astype(np.int64)).to(device)
        self.seq, self.batch = seq, batch
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(seed)
        self.ar = torch.arange(seq + 1, device=device)

    def next(self):
        hi = self.data.numel() - self.seq - 1
        start = torch.randint(0, hi, (self.batch,), generator=self.gen, device=self.data.device)
        return self.data[start[:, None] + self.ar[None, :]]


def lm_loss(model, x, aux_coef=0.0):
    if aux_coef:  # router load-balancing loss (--router-aux-loss), off by default
        out = model(input_ids=x[:, :-1], use_cache=False, output_router_logits=True)
        logits = out.logits
        ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        return ce + aux_coef * out.aux_loss.float()
    logits = model(input_ids=x[:, :-1], use_cache=False).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))


@torch.no_grad()
def eval_loss(model, ids, seq, device, max_windows=256, bs=32, autocast=False):
    n = min(max_windows, (ids.size - 1) // seq)
    data = torch.from_numpy(ids[: n * seq + 1].astype(np.int64)).to(device)
    total, count = 0.0, 0
    for b in range(0, n, bs):
        rows = [data[i * seq: i * seq + seq + 1] for i in range(b, min(n, b + bs))]
        x = torch.stack(rows)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = lm_loss(model, x)
        total += loss.item() * x.shape[0]
        count += x.shape[0]
    return total / max(1, count), n * seq


def lr_at(step, total, peak, warmup, min_frac):
    if step < warmup:
        return peak * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (min_frac + (1 - min_frac) * 0.5 * (1 + math.cos(math.pi * p)))


def train(model, batcher, args, log):
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    # --steps: a fixed count (a run reproducible on a slower or busier
    # machine); else fixed from --seconds once the step time is measured
    # (before warm-up ends).
    total = args.steps if args.steps > 0 else 10 ** 9
    step, t0, t_mark = 0, time.time(), None
    acc, acc_n, history = torch.zeros((), device="cuda"), 0, []
    model.train()
    while step < total and (args.steps > 0 or time.time() - t0 < args.seconds * 1.25):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, args.lr, args.warmup, 0.1)
        x = batcher.next()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = lm_loss(model, x, args.aux_coef)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        acc += loss.detach()
        acc_n += 1
        step += 1
        if step == 10:
            torch.cuda.synchronize()
            t_mark = time.time()
        if step == 40:
            torch.cuda.synchronize()
            per_step = (time.time() - t_mark) / 30
            if args.steps <= 0:
                total = max(args.warmup + 100, int((args.seconds - (time.time() - t0)) / per_step) + step)
            log(f"step time {per_step * 1000:.1f} ms -> {total} steps")
        if step % 100 == 0 or step == total:
            mean = (acc / acc_n).item()
            history.append({"step": step, "loss": round(mean, 4), "lr": opt.param_groups[0]["lr"],
                            "elapsed_s": round(time.time() - t0, 1)})
            log(f"step {step}/{total} loss {mean:.4f} lr {opt.param_groups[0]['lr']:.2e} "
                f"{time.time() - t0:.0f}s")
            acc.zero_()
            acc_n = 0
    model.eval()
    return {"steps": step, "planned_steps": total, "train_seconds": round(time.time() - t0, 1),
            "tokens_seen": step * args.batch * args.seq,
            "final_train_loss_last100_bf16": history[-1]["loss"] if history else None,
            "history": history}


def round_to_bf16(model):
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.bfloat16().float())


@torch.no_grad()
def routing_stats(model, ids, seq, device, n_windows=64, arch=None):
    """Per-layer top-k expert selection counts on held-out text. laguna: the
    experts its router selected (top-k of sigmoid score + selection bias),
    the counts without the bias, and the share of tokens whose selected set
    the bias changed; its dense layer has no router and is left out."""
    layers = model.model.layers
    k = model.config.num_experts_per_tok
    n_exp = model.config.num_experts
    laguna = laguna_arch.is_laguna(arch)
    if laguna:
        routers = laguna_arch.moe_layers(model)
    else:
        routers = [(li, layer.mlp.gate) for li, layer in enumerate(layers)]
    counts = {li: torch.zeros(n_exp, dtype=torch.long, device=device) for li, _ in routers}
    unbiased = {li: torch.zeros(n_exp, dtype=torch.long, device=device) for li, _ in routers}
    changed = {li: torch.zeros((), dtype=torch.long, device=device) for li, _ in routers}
    hooks = []
    for li, gate in routers:
        if laguna:
            def fwd_hook(mod, inputs, output, li=li):
                sel, _, unb, chg = laguna_arch.router_choice(mod, output, k)
                counts[li] += torch.bincount(sel.reshape(-1), minlength=n_exp)
                unbiased[li] += torch.bincount(unb.reshape(-1), minlength=n_exp)
                changed[li] += chg.sum()
            hooks.append(gate.register_forward_hook(fwd_hook))
        else:
            def pre_hook(mod, inputs, li=li):
                h = inputs[0].reshape(-1, inputs[0].shape[-1]).float()
                top = torch.topk(F.linear(h, mod.weight.float()), k, dim=-1).indices
                counts[li] += torch.bincount(top.reshape(-1), minlength=n_exp)
            hooks.append(gate.register_forward_pre_hook(pre_hook))
    try:
        n = min(n_windows, (ids.size - 1) // seq)
        data = torch.from_numpy(ids[: n * seq].astype(np.int64)).to(device).reshape(n, seq)
        for b in range(0, n, 16):
            model(input_ids=data[b: b + 16])
    finally:
        for h in hooks:
            h.remove()
    out = []
    for li, _ in routers:
        c = counts[li]
        share = (c.double() / c.sum()).cpu()
        srt = torch.sort(share, descending=True).values
        nz = share[share > 0]
        entropy = float(-(nz * nz.log()).sum())
        entry = {"layer": li, "counts": c.cpu().tolist(),
                 "top25pct_share": round(float(srt[: max(1, n_exp // 4)].sum()), 4),
                 "max_share": round(float(srt[0]), 4), "min_share": round(float(srt[-1]), 4),
                 "unused_experts": int((c == 0).sum()),
                 "entropy_norm": round(entropy / math.log(n_exp), 4)}
        if laguna:
            entry["counts_without_bias"] = unbiased[li].cpu().tolist()
            entry["tokens_selection_changed_by_bias"] = int(changed[li])
            entry["share_selection_changed_by_bias"] = round(int(changed[li]) / max(1, n * seq), 4)
        out.append(entry)
    res = {"tokens": int(n * seq), "top_k": k, "experts": n_exp, "uniform_top25pct_share": 0.25,
           "layers": out}
    if laguna:
        res["selection"] = ("experts selected by LagunaTopKRouter: top-k of sigmoid(logit) + "
                            "e_score_correction_bias; counts_without_bias: top-k of sigmoid(logit)")
    return res


def saved_tensor_names(out_dir):
    from safetensors import safe_open
    names = {}
    for f in sorted(os.listdir(out_dir)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(out_dir, f), "pt") as st:
                for k in st.keys():
                    names[k] = (f, list(st.get_slice(k).get_shape()))
    return names


def unfuse_experts(out_dir, n_exp, inter):
    """Rewrite fused 3-D expert tensors as per-expert 2-D tensors (the layout
    of the published Qwen3-MoE checkpoints), in place."""
    from safetensors.torch import load_file, save_file
    weight_map = {}
    for f in sorted(os.listdir(out_dir)):
        if not f.endswith(".safetensors"):
            continue
        path = os.path.join(out_dir, f)
        tensors = load_file(path)
        out = {}
        for k, t in tensors.items():
            if k.endswith("mlp.experts.gate_up_proj"):
                pre = k[: -len("gate_up_proj")]
                for e in range(n_exp):
                    out[f"{pre}{e}.gate_proj.weight"] = t[e, :inter].contiguous()
                    out[f"{pre}{e}.up_proj.weight"] = t[e, inter:].contiguous()
            elif k.endswith("mlp.experts.down_proj"):
                pre = k[: -len("down_proj")]
                for e in range(n_exp):
                    out[f"{pre}{e}.down_proj.weight"] = t[e].contiguous()
            else:
                out[k] = t
        save_file(out, path, metadata={"format": "pt"})
        weight_map.update({k: f for k in out})
    index = os.path.join(out_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as fh:
            idx = json.load(fh)
        idx["weight_map"] = dict(sorted(weight_map.items()))
        with open(index, "w") as fh:
            json.dump(idx, fh, indent=2)


def save_model(model, cfg, arch, out_dir, ids, tok_dir, log):
    from transformers import GenerationConfig
    os.makedirs(out_dir, exist_ok=True)
    m = copy.deepcopy(model).to(torch.bfloat16)
    eot, im_end = ids["<|endoftext|>"], ids["<|im_end|>"]
    # Same fields as Qwen3's generation_config.json.
    m.generation_config = GenerationConfig(bos_token_id=eot, eos_token_id=[im_end, eot],
                                           pad_token_id=eot, do_sample=True, temperature=0.6,
                                           top_k=20, top_p=0.95)
    try:
        m.save_pretrained(out_dir, safe_serialization=True, max_shard_size="12MB")
    except TypeError:
        m.save_pretrained(out_dir, max_shard_size="12MB")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, f), os.path.join(out_dir, f))
    names = saved_tensor_names(out_dir)
    fused = [k for k in names if k.endswith("experts.gate_up_proj") or k.endswith("experts.down_proj")]
    if laguna_arch.is_laguna(arch):
        # Kept as transformers wrote them (fused or per expert), as for the
        # hybrids; the reload check reads them back.
        per_expert = [k for k in names if ".mlp.experts.0." in k]
        log(f"saved expert tensors as written by save_pretrained: "
            + (f"fused ({len(fused)}), e.g. {fused[0]} {names[fused[0]][1]}" if fused else
               f"per expert, e.g. {per_expert[:3]}"))
        biases = sorted(k for k in names if k.endswith("mlp.gate.e_score_correction_bias"))
        log(f"saved router selection biases: {biases}")
    elif fused and hybrid_arch.is_hybrid(arch):
        # Kept as transformers wrote them: from_pretrained must read the files
        # back (the reload check), and whether this transformers re-fuses
        # per-expert tensors of this model type on load is not known here.
        log(f"saved fused expert tensors ({len(fused)}), e.g. {fused[0]} {names[fused[0]][1]}; kept fused")
    elif fused:
        log(f"saved fused expert tensors ({len(fused)}); rewriting per expert")
        unfuse_experts(out_dir, cfg.num_experts, cfg.moe_intermediate_size)
        names = saved_tensor_names(out_dir)
    files = {f: os.path.getsize(os.path.join(out_dir, f)) for f in sorted(os.listdir(out_dir))}
    log(f"saved {len(names)} tensors: {files}")
    return names, files


@torch.no_grad()
def check_reload(arch, out_dir, model, batch, log):
    cls = model_class(arch)
    m2 = cls.from_pretrained(out_dir, dtype=torch.float32).to("cuda").eval()
    a = model(input_ids=batch).logits
    b = m2(input_ids=batch).logits
    diff = float((a - b).abs().max())
    log(f"reload check: max |logit diff| in-memory vs saved = {diff}")
    return diff


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--arch", choices=ARCHES, required=True)
    ap.add_argument("--data", required=True, help="output dir of corpus_tokenizer.py")
    ap.add_argument("--out", required=True, help="HF model dir to write")
    ap.add_argument("--summary", required=True, help="JSON summary to write")
    ap.add_argument("--seconds", type=float, default=170)
    ap.add_argument("--steps", type=int, default=0,
                    help="train exactly this many steps (0: as many as --seconds allows)")
    ap.add_argument("--preset", choices=("tiny", "small"), default="tiny",
                    help="tiny: the committed test models; small: a ~245M qwen3moe for speculative decoding's "
                         "measurements")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--router-aux-loss", action="store_true",
                    help="add router_aux_loss_coef x the load-balancing loss (MoE; off by default, "
                         "as for the committed qwen3moe model)")
    ap.add_argument("--gdn-autocast", action="store_true",
                    help="qwen35*: run the gated delta rule under bf16 autocast too (default: fp32)")
    args = ap.parse_args()
    args.aux_coef = 0.0

    def log(msg):
        print(f"[{args.arch}] {msg}", flush=True)

    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    with open(os.path.join(args.data, "corpus_manifest.json")) as f:
        manifest = json.load(f)
    ids = manifest["token_ids"]
    train_ids = np.load(os.path.join(args.data, "train_ids.npy"))
    held_ids = np.load(os.path.join(args.data, "heldout_ids.npy"))
    cfg = build_config(args.arch, manifest["vocab_size"], ids, args.preset)
    if args.router_aux_loss:
        if not hybrid_arch.is_moe(args.arch):
            ap.error("--router-aux-loss needs a MoE arch")
        args.aux_coef = float(cfg.router_aux_loss_coef)
    gdn_info = None
    if hybrid_arch.is_hybrid(args.arch):
        gdn_info = hybrid_arch.install_gdn_patches(args.arch, fp32_delta_rule=not args.gdn_autocast)
        for name, desc in gdn_info.items():
            log(f"gated delta net: {name}: {desc['was']} -> {desc['now']}")
    model = model_class(args.arch)(cfg).to("cuda")
    shape_info = check_model_shape(model, cfg, args.arch)
    laguna_info = None
    if laguna_arch.is_laguna(args.arch):
        # Sliding-window masking, before any training time is spent: the eager
        # attention probabilities (fatal if wrong) and the training attention
        # (sdpa by default) against eager, in f32 without TF32, on 160 tokens
        # (5 windows) of fixed text.
        torch.backends.cuda.matmul.allow_tf32 = False
        x = torch.from_numpy(train_ids[: 2 * 160].astype(np.int64)).to("cuda").view(2, 160)
        model.eval()
        probe = laguna_arch.compare_with_eager(model, x)
        model.train()
        torch.backends.cuda.matmul.allow_tf32 = True
        log(f"attention probe before training: {probe['attn_implementation']} vs eager max |logit diff| "
            f"{probe['max_abs_logit_diff_vs_eager']:.3g}; eager window check "
            f"{json.dumps(probe['eager_window_check']['layers'])}")
        if not probe["eager_window_check"]["ok"]:
            raise RuntimeError(f"laguna sliding-window check failed: {probe['eager_window_check']['errors']}")
        if not probe["max_abs_logit_diff_vs_eager"] < 1e-3:
            raise RuntimeError(f"laguna: the {probe['attn_implementation']} attention differs from eager by "
                               f"{probe['max_abs_logit_diff_vs_eager']} in logits (f32): it does not mask the "
                               f"same way (sliding window?)")
        laguna_info = {"rope": shape_info, "attention_probe_before_training": probe}
        log(f"rotary: {json.dumps(shape_info)}")
    if gdn_info is not None:
        # One forward+backward under autocast through the patched torch path,
        # on fixed tokens (the training batches' RNG is not touched).
        x = torch.from_numpy(train_ids[: 2 * 129].astype(np.int64)).to("cuda").view(2, 129)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            probe = lm_loss(model, x, args.aux_coef)
        probe.backward()
        bad = [n for n, p in model.named_parameters()
               if p.grad is not None and not torch.isfinite(p.grad).all()]
        no_grad = [n for n, p in model.named_parameters() if p.grad is None]
        model.zero_grad(set_to_none=True)
        hybrid_arch.require_calls("torch_chunk_gated_delta_rule", "training forward")
        hybrid_arch.require_calls("causal_conv1d_fn", "training forward")
        if bad or not torch.isfinite(probe):
            raise RuntimeError(f"probe step through the torch Gated DeltaNet path: loss {probe.item()}, "
                               f"non-finite gradients in {bad[:5]}")
        if no_grad:
            log(f"WARNING: probe step left no gradient in {len(no_grad)} parameters: {no_grad[:5]}")
        log(f"probe step through the torch Gated DeltaNet path: loss {probe.item():.4f}, "
            f"calls {dict(hybrid_arch.CALLS)}")
    n_params = sum(p.numel() for p in model.parameters())
    n_embed = model.model.embed_tokens.weight.numel() + model.lm_head.weight.numel()
    log(f"params {n_params} (embedding+lm_head {n_embed}); config {cfg.to_json_string()}")
    batcher = Batcher(train_ids, args.seq, args.batch, "cuda", args.seed)
    result = train(model, batcher, args, log)

    round_to_bf16(model)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if laguna_info is not None:
        loss0, _ = eval_loss(model, held_ids, args.seq, "cuda")
        biases = laguna_arch.set_router_bias(model)
        log(f"heldout loss before the router selection biases {loss0:.4f}; biases set "
            f"(N(0,1) x {laguna_arch.ROUTER_BIAS_STD}, seed {laguna_arch.ROUTER_BIAS_SEED}, bf16): {biases}")
        laguna_info["router_bias"] = {
            "what": "mlp.gate.e_score_correction_bias of every sparse layer, not trained (frozen in "
                    "transformers, zero during training), set after training and bf16 rounding to "
                    "N(0,1) x std from a seeded CPU generator, rounded to bf16, so the biased top-k "
                    "selection differs from the unbiased one on some tokens; saved in the checkpoint",
            "std": laguna_arch.ROUTER_BIAS_STD, "seed": laguna_arch.ROUTER_BIAS_SEED,
            "values": {str(k): v for k, v in biases.items()},
            "heldout_loss_before_bias": round(loss0, 4)}
    held_loss, held_tokens = eval_loss(model, held_ids, args.seq, "cuda")
    train_loss, _ = eval_loss(model, train_ids[: held_ids.size * 4], args.seq, "cuda")
    log(f"after bf16 rounding (f32 eval): heldout loss {held_loss:.4f} ({held_tokens} tokens), "
        f"train loss {train_loss:.4f}")
    summary = {"arch": args.arch, "params": n_params, "params_embedding_and_head": n_embed,
               "seed": args.seed, "batch": args.batch, "seq": args.seq, "lr": args.lr,
               "warmup": args.warmup, "schedule": "linear warm-up, cosine to 10% of peak",
               "optimizer": "AdamW betas (0.9,0.95) wd 0.1 (matrices only), grad clip 1.0",
               "precision": "fp32 master weights, bf16 autocast; eval in f32 without TF32"
                            + ("" if gdn_info is None else
                               "; Gated DeltaNet: transformers' torch reference functions, the delta rule "
                               + ("under bf16 autocast" if args.gdn_autocast else "in fp32 (autocast off)")),
               "heldout_loss": round(held_loss, 4), "heldout_tokens": held_tokens,
               "train_sample_loss": round(train_loss, 4), **result,
               "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
    import transformers
    summary["transformers"] = transformers.__version__
    if gdn_info is not None:
        summary["gated_delta_net"] = gdn_info
        summary["layer_types"] = list(cfg.layer_types)
        summary["rope_parameters"] = dict(cfg.rope_parameters)
        summary["router_aux_loss"] = args.aux_coef
    if laguna_info is not None:
        x = torch.from_numpy(held_ids[: 2 * 160].astype(np.int64)).to("cuda").view(2, 160)
        probe = laguna_arch.compare_with_eager(model, x)
        log(f"attention probe after training: {probe['attn_implementation']} vs eager max |logit diff| "
            f"{probe['max_abs_logit_diff_vs_eager']:.3g}; window check ok {probe['eager_window_check']['ok']}")
        if not probe["eager_window_check"]["ok"]:
            log(f"WARNING: sliding-window check after training: {probe['eager_window_check']['errors']}")
        laguna_info["attention_probe_after_training"] = probe
        summary["laguna"] = laguna_info
        summary["layer_types"] = list(cfg.layer_types)
        summary["mlp_layer_types"] = list(cfg.mlp_layer_types)
        summary["num_attention_heads_per_layer"] = list(cfg.num_attention_heads_per_layer)
        summary["sliding_window"] = cfg.sliding_window
        summary["rope_parameters"] = json.loads(json.dumps(cfg.rope_parameters))
        summary["router_aux_loss"] = args.aux_coef
    if hybrid_arch.is_moe(args.arch):
        try:
            summary["routing"] = routing_stats(model, held_ids, args.seq, "cuda", arch=args.arch)
            for layer in summary["routing"]["layers"]:
                log(f"routing layer {layer['layer']}: top25% share {layer['top25pct_share']} "
                    f"entropy {layer['entropy_norm']} unused {layer['unused_experts']} "
                    f"max {layer['max_share']} min {layer['min_share']}"
                    + (f" selection changed by bias {layer['share_selection_changed_by_bias']}"
                       if "share_selection_changed_by_bias" in layer else ""))
                if layer.get("tokens_selection_changed_by_bias") == 0:
                    log(f"WARNING: layer {layer['layer']}: the router bias changed no selection")
        except Exception as e:  # keep the run going: the model is still useful
            log(f"routing stats failed: {e!r}")
    names, files = save_model(model, cfg, args.arch, args.out, ids,
                              os.path.join(args.data, "tokenizer"), log)
    summary["saved_files"] = files
    summary["saved_tensors"] = {k: v[1] for k, v in sorted(names.items())}
    if laguna_info is not None:
        fused = any(k.endswith("experts.gate_up_proj") for k in names)
        summary["expert_tensor_layout"] = (
            "fused (mlp.experts.gate_up_proj [E, 2F, H] = [gate; up] rows, mlp.experts.down_proj [E, H, F]), "
            "as save_pretrained wrote them" if fused else
            "per expert (mlp.experts.E.{gate,up,down}_proj.weight), as save_pretrained wrote them")
        # Fatal: a checkpoint without the biases would not be the model the fixtures describe.
        laguna_arch.verify_router_biases(model, args.out)
        log(f"expert tensors: {summary['expert_tensor_layout']}; router biases saved and verified")
    try:
        summary["reload_max_abs_logit_diff"] = check_reload(args.arch, args.out, model,
                                                            batcher.next()[:4, :-1], log)
    except Exception as e:
        log(f"reload check failed: {e!r}")
        summary["reload_error"] = repr(e)
    with open(args.summary, "w") as f:
        json.dump(summary, f, indent=1)
    log("done")


if __name__ == "__main__":
    main()
