"""Reference fixtures from HF transformers in float32 on the CPU.

Loads the saved HF directory (bf16 weights, exactly representable in f32)
as float32 with eager attention and writes, for each prompt of prompts.py:
prompt ids, top-20 (id, logit) at every position, the full logits of the
last position (base64 little-endian f32), a 64-token greedy continuation
with EOS disabled (argmax of a full recompute at every step, no KV cache),
and for the MoE model the router's top-k experts at every position.
It also measures what the tolerances should be: f32 vs f64, an f16 KV
cache estimate, and Q8_0 weight rounding (top-1 agreement, mean KL).

qwen35moe / qwen35 (hybrid Gated DeltaNet, see hybrid_arch.py): the greedy
continuation comes from transformers' generate() with its cache (KV cache for
the full-attention layer, conv + recurrent state for the Gated DeltaNet
layers, i.e. the recurrent decode path), and is cross-checked against the
argmax of a full recompute without cache at every step (greedy_nocache_*);
the f64 reference runs the delta rule token by token in float64; the f16 KV
estimate rounds only the full-attention layer's K and V.

laguna (see laguna_arch.py): as qwen3moe (greedy by full recompute, checked
against generate() with its KV cache), with eager attention whose sliding
window is checked from the attention probabilities of the long prompt
(attention_window_check); router_topk holds only the sparse layers
(router_topk_layers) and the experts the router selected (top-k of
sigmoid(logit) + e_score_correction_bias, in that order), with how many of
them the bias changed; the saved biases are checked against the loaded model.
"""
import argparse
import base64
import copy
import json
import os
import platform
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hybrid_arch  # noqa: E402
import laguna_arch  # noqa: E402
from prompts import PROMPTS, TOKENIZER_CASES  # noqa: E402

GREEDY_TOKENS = 64
TOP_N = 20


def load(arch, model_dir):
    if laguna_arch.is_laguna(arch):
        cls = laguna_arch.model_class()
    elif hybrid_arch.is_hybrid(arch):
        cls = hybrid_arch.model_class(arch)
    else:
        from transformers import Qwen3ForCausalLM, Qwen3MoeForCausalLM
        cls = Qwen3MoeForCausalLM if arch == "qwen3moe" else Qwen3ForCausalLM
    kw = dict(dtype=torch.float32, attn_implementation="eager")
    if hybrid_arch.is_moe(arch):
        try:  # the plain per-expert loop, when this transformers has a choice
            return cls.from_pretrained(model_dir, experts_implementation="eager", **kw).eval()
        except Exception as e:  # noqa: BLE001 - fall back to the default implementation
            print(f"experts_implementation not accepted ({e!r}); using the default")
    return cls.from_pretrained(model_dir, **kw).eval()


def render_jinja(template, messages, kwargs):
    """Plain jinja2 rendering with the settings HF uses, as a cross-check."""
    import jinja2
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True,
                             extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False)
    return env.from_string(template).render(messages=messages, **kwargs)


def prompt_text(p, hf_tok, template, notes):
    if "text" in p:
        return p["text"]
    jinja_text = render_jinja(template, p["messages"], p["template_kwargs"])
    if hf_tok is not None:
        try:
            text = hf_tok.apply_chat_template(p["messages"], tokenize=False, **p["template_kwargs"])
            if text != jinja_text:
                notes.append(f"{p['name']}: apply_chat_template differs from plain jinja2")
            return text
        except Exception as e:
            notes.append(f"{p['name']}: apply_chat_template failed ({e!r}); used jinja2")
    return jinja_text


def hf_ids(hf_tok, text):
    if hf_tok is None:
        return None
    try:
        return list(hf_tok(text, add_special_tokens=False)["input_ids"])
    except Exception as e:
        return repr(e)


def router_hooks(model, store, arch=None):
    """Record the router's top-k experts (by logit) for every token. laguna:
    the experts its router selected (top-k of sigmoid + selection bias, in
    that order), the k-th minus (k+1)-th selection score, and how many
    tokens' selected sets differ from the unbiased top-k; sparse layers only."""
    hooks = []
    k = model.config.num_experts_per_tok
    if laguna_arch.is_laguna(arch):
        for li, gate in laguna_arch.moe_layers(model):
            def fwd_hook(mod, inputs, output, li=li):
                sel, margin, _, changed = laguna_arch.router_choice(mod, output, k)
                store.setdefault(li, []).append((sel.tolist(), margin.tolist(), int(changed.sum())))
            hooks.append(gate.register_forward_hook(fwd_hook))
        return hooks
    for li, layer in enumerate(model.model.layers):
        def pre_hook(mod, inputs, li=li):
            h = inputs[0].reshape(-1, inputs[0].shape[-1])
            logits = F.linear(h, mod.weight)
            top = torch.topk(logits, k + 1, dim=-1)
            store.setdefault(li, []).append(
                (top.indices[:, :k].tolist(), (top.values[:, k - 1] - top.values[:, k]).tolist()))
        hooks.append(layer.mlp.gate.register_forward_pre_hook(pre_hook))
    return hooks


def kv16_hooks(model):
    """Round K (before RoPE) and V to f16, to estimate an f16 KV cache
    (full-attention layers only: the Gated DeltaNet layers have no KV cache)."""
    hooks = []
    for layer in model.model.layers:
        att = getattr(layer, "self_attn", None)
        if att is None:
            continue
        for mod in (att.k_norm, att.v_proj):
            hooks.append(mod.register_forward_hook(lambda m, i, o: o.half().float()))
    return hooks


def q8_0_roundtrip(w):
    blocks = w.reshape(*w.shape[:-1], w.shape[-1] // 32, 32)
    d = (blocks.abs().amax(dim=-1, keepdim=True) / 127.0).half().float()
    q = torch.where(d > 0, torch.round(blocks / torch.where(d > 0, d, torch.ones_like(d))),
                    torch.zeros_like(blocks)).clamp(-127, 127)
    return (q * d).reshape(w.shape)


def q8_0_model(model):
    """Weights of every matrix except the router rounded through Q8_0. Like
    moeserve's quant mix, one-row matrices (the shared expert gate [1, H]) stay
    f32, and so does the Gated DeltaNet conv1d (rows of 4)."""
    m = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if (p.ndim >= 2 and not name.endswith("mlp.gate.weight") and p.shape[-1] % 32 == 0
                    and p.shape[:-1].numel() > 1):
                p.copy_(q8_0_roundtrip(p))
    return m


def greedy(model, ids, eos_ids):
    seq = list(ids)
    margins, out = [], []
    with torch.no_grad():
        for _ in range(GREEDY_TOKENS):
            last = model(input_ids=torch.tensor([seq])).logits[0, -1]
            top = torch.topk(last, 2)
            margins.append(round(float(top.values[0] - top.values[1]), 6))
            nxt = int(top.indices[0])
            out.append(nxt)
            seq.append(nxt)
    first_eos = next((i for i, t in enumerate(out) if t in eos_ids), None)
    return out, margins, first_eos


def greedy_nocache(model, ids):
    """greedy() with use_cache=False, keeping each step's logits."""
    seq, out, margins, steps = list(ids), [], [], []
    with torch.no_grad():
        for _ in range(GREEDY_TOKENS):
            last = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1]
            top = torch.topk(last, 2)
            margins.append(round(float(top.values[0] - top.values[1]), 6))
            out.append(int(top.indices[0]))
            seq.append(out[-1])
            steps.append(last.clone())
    return out, margins, steps


def generate_cached(model, ids):
    """transformers' generate() with use_cache=True, EOS disabled: the ids and
    each step's logits (the model's own cache path)."""
    from transformers import GenerationConfig
    gc = GenerationConfig(do_sample=False, max_new_tokens=GREEDY_TOKENS, eos_token_id=None,
                          pad_token_id=model.config.bos_token_id, use_cache=True,
                          return_dict_in_generate=True, output_logits=True)
    saved = model.generation_config
    model.generation_config = gc
    try:
        x = torch.tensor([ids])
        with torch.no_grad():
            out = model.generate(x, attention_mask=torch.ones_like(x), generation_config=gc)
        new = out.sequences[0, len(ids):].tolist()
        steps = [l[0].float() for l in out.logits]
        if len(new) != GREEDY_TOKENS or len(steps) != GREEDY_TOKENS:
            raise RuntimeError(f"generate() gave {len(new)} tokens / {len(steps)} logits, "
                               f"wanted {GREEDY_TOKENS}")
        margins = []
        for step, tok in zip(steps, new):
            top = torch.topk(step, 2)
            if int(top.indices[0]) != tok:  # ties: keep what generate() chose, note it
                margins.append(0.0)
            else:
                margins.append(round(float(top.values[0] - top.values[1]), 6))
        return new, margins, steps
    finally:
        model.generation_config = saved


def hf_generate(model, ids):
    """transformers' own generate() with a KV cache, EOS disabled, for comparison."""
    from transformers import GenerationConfig
    gc = GenerationConfig(do_sample=False, max_new_tokens=GREEDY_TOKENS, eos_token_id=None,
                          pad_token_id=model.config.bos_token_id)
    saved = model.generation_config
    model.generation_config = gc
    try:
        x = torch.tensor([ids])
        out = model.generate(x, attention_mask=torch.ones_like(x), generation_config=gc)
        return out[0, len(ids):].tolist()
    finally:
        model.generation_config = saved


def kl_mean(ref_logits, other_logits):
    lp = F.log_softmax(ref_logits.double(), -1)
    lq = F.log_softmax(other_logits.double(), -1)
    return float((lp.exp() * (lp - lq)).sum(-1).mean())


def hybrid_greedy(fx, model, ids, eos_ids, tok):
    """qwen35*: greedy continuation through generate()'s cache, cross-checked
    against a full recompute without cache at every step."""
    g_ids, g_margins, g_steps = generate_cached(model, ids)
    fx["greedy_ids"] = g_ids
    fx["greedy_text"] = tok.decode(g_ids, skip_special_tokens=False)
    fx["greedy_top1_margins"] = g_margins
    fx["greedy_first_eos_index"] = next((i for i, t in enumerate(g_ids) if t in eos_ids), None)
    n_ids, n_margins, n_steps = greedy_nocache(model, ids)
    fx["greedy_nocache_matches"] = n_ids == g_ids
    same = next((i for i, (a, b) in enumerate(zip(g_ids, n_ids)) if a != b), GREEDY_TOKENS)
    if n_ids != g_ids:
        fx["greedy_nocache_ids"] = n_ids
        fx["greedy_nocache_first_difference"] = same
    # Step i's logits depend only on tokens before i, so steps 0..same compare like for like.
    diff = max(float((a.double() - b.double()).abs().max())
               for a, b in zip(g_steps[: same + 1], n_steps[: same + 1]))
    fx["greedy_cache_vs_nocache_max_abs_logit_diff"] = round(diff, 8)
    fx["greedy_nocache_top1_margins"] = n_margins


def prompt_fixture(p, text, ids, model, variants, tok, hf_tok, eos_ids, is_moe, notes,
                   hybrid=False, arch=None):
    x = torch.tensor([ids])
    routes = {}
    hooks = router_hooks(model, routes, arch) if is_moe else []
    with torch.no_grad():
        logits = model(input_ids=x).logits[0]
    for h in hooks:
        h.remove()
    top = torch.topk(logits, TOP_N, dim=-1)
    if not hybrid:
        g_ids, g_margins, first_eos = greedy(model, ids, eos_ids)
    fx = {"name": p["name"], "kind": p["kind"], "text": text, "ids": ids, "n_tokens": len(ids)}
    if "messages" in p:
        fx["messages"] = p["messages"]
        fx["template_kwargs"] = p["template_kwargs"]
    h_ids = hf_ids(hf_tok, text)
    fx["hf_autotokenizer_ids_match"] = h_ids == ids
    if h_ids != ids:
        fx["hf_autotokenizer_ids"] = h_ids
        notes.append(f"{p['name']}: AutoTokenizer ids differ from tokenizer.json ids")
    fx["decode_roundtrip_ok"] = tok.decode(ids, skip_special_tokens=False) == text
    fx["top_ids"] = top.indices.tolist()
    fx["top_logits"] = [[round(v, 6) for v in row] for row in top.values.tolist()]
    top2 = torch.topk(logits, 2, dim=-1).values
    fx["top1_margins"] = [round(float(v), 6) for v in (top2[:, 0] - top2[:, 1])]
    fx["last_logits_f32_b64"] = base64.b64encode(
        logits[-1].contiguous().numpy().astype("<f4").tobytes()).decode("ascii")
    if hybrid:
        hybrid_greedy(fx, model, ids, eos_ids, tok)
    else:
        fx["greedy_ids"] = g_ids
        fx["greedy_text"] = tok.decode(g_ids, skip_special_tokens=False)
        fx["greedy_top1_margins"] = g_margins
        fx["greedy_first_eos_index"] = first_eos
        try:
            hg = hf_generate(model, ids)
            fx["hf_generate_kv_cache_matches"] = hg == g_ids
            if hg != g_ids:
                fx["hf_generate_ids"] = hg
        except Exception as e:
            fx["hf_generate_error"] = repr(e)
    if is_moe:
        fx["router_topk"] = [routes[li][0][0] for li in sorted(routes)]
        fx["router_min_kth_margin"] = round(min(min(routes[li][0][1]) for li in routes), 6)
        if laguna_arch.is_laguna(arch):
            fx["router_bias_changed_selections"] = sum(routes[li][0][2] for li in routes)
    for vname, vmodel in variants.items():
        with torch.no_grad():
            other = vmodel(input_ids=x).logits[0]
        fx[f"{vname}_max_abs_logit_diff"] = round(float((other.double() - logits.double()).abs().max()), 8)
        fx[f"{vname}_top1_agree"] = round(float((other.argmax(-1) == logits.argmax(-1)).double().mean()), 4)
        fx[f"{vname}_mean_kl"] = round(kl_mean(logits, other), 8)
    return fx


def tolerances(fixtures, hybrid=False):
    def worst(key):
        return max(f[key] for f in fixtures if key in f) if any(key in f for f in fixtures) else None
    f64 = worst("f64_max_abs_logit_diff") or 0.0
    kv = worst("kv16_max_abs_logit_diff") or 0.0
    margins = [m for f in fixtures for m in f["top1_margins"] + f["greedy_top1_margins"]]
    if hybrid:
        margins += [m for f in fixtures for m in f.get("greedy_nocache_top1_margins", [])]
    q8_agree = min(f["q8_0_top1_agree"] for f in fixtures if "q8_0_top1_agree" in f)
    q8_kl = max(f["q8_0_mean_kl"] for f in fixtures if "q8_0_mean_kl" in f)
    out = {
        "measured_f32_vs_f64_max_abs_logit_diff": f64,
        "measured_f16_kv_estimate_max_abs_logit_diff": kv,
        "measured_q8_0_weights_min_top1_agree": q8_agree,
        "measured_q8_0_weights_max_mean_kl": q8_kl,
        "min_top1_margin_all_positions": min(margins),
        "positions_with_top1_margin_below_1e-3": sum(1 for m in margins if m < 1e-3),
        "recommended_max_abs_logit_diff_f32_kv": round(max(2e-3, 20 * f64), 6),
        "recommended_max_abs_logit_diff_f16_kv": round(max(2e-2, 4 * kv), 6),
        "recommended_q8_0_min_top1_agree": round(max(0.8, q8_agree - 0.05), 3),
        "recommended_q8_0_max_mean_kl": round(max(0.01, 4 * q8_kl), 4),
        "note": ("f32 engine with bf16 GGUF weights: greedy continuations and top-1 at every "
                 "position should be identical, except where a top-1 margin is below the logit "
                 "tolerance. The f16 KV figure rounds K before RoPE (HF caches it after), so it "
                 "is an estimate. Q8_0 figures round weights only; the engine also quantizes "
                 "activations, so allow some slack. Q4_K_M is not simulated here."),
    }
    if hybrid:
        cache = worst("greedy_cache_vs_nocache_max_abs_logit_diff") or 0.0
        out["measured_cache_vs_nocache_max_abs_logit_diff"] = cache
        out["greedy_nocache_all_match"] = all(f.get("greedy_nocache_matches") for f in fixtures)
        out["recommended_max_abs_logit_diff_f32_kv"] = round(max(2e-3, 20 * f64, 4 * cache), 6)
        out["note"] += (" Hybrid (Gated DeltaNet): greedy_ids come from generate() with the cache "
                        "(recurrent decode path); the cache-vs-nocache figure is the largest logit "
                        "difference between that and a full recompute (chunked path) over the 64 "
                        "steps. The f16 KV figure rounds only the full-attention layer's K and V; "
                        "the conv and recurrent states are not rounded. The f64 reference runs the "
                        "delta rule token by token in float64 (RMSNorms and RoPE angles stay f32 "
                        "inside transformers, as for qwen3).")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--arch", choices=("qwen3moe", "qwen3", "qwen35moe", "qwen35", "laguna"), required=True)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--name", required=True, help="model name recorded in the fixture")
    ap.add_argument("--template", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer-cases-out", default=None)
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import tokenizers
    import transformers
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(args.model_dir, "tokenizer.json"))
    notes = []
    try:
        from transformers import AutoTokenizer
        hf_tok = AutoTokenizer.from_pretrained(args.model_dir)
        notes.append(f"AutoTokenizer class: {type(hf_tok).__name__}")
    except Exception as e:
        hf_tok = None
        notes.append(f"AutoTokenizer failed: {e!r}")
    with open(args.template, encoding="utf-8") as f:
        template = f.read()
    hybrid = hybrid_arch.is_hybrid(args.arch)
    if hybrid:
        gdn_info = hybrid_arch.install_gdn_patches(args.arch)
        notes.append("gated delta net: " + "; ".join(f"{k}: {v['was']} -> {v['now']}"
                                                      for k, v in gdn_info.items()))
    model = load(args.arch, args.model_dir)
    notes.append(f"attn_implementation {getattr(model.config, '_attn_implementation', '?')}, "
                 f"experts_implementation {getattr(model.config, '_experts_implementation', 'n/a')}")
    is_moe = hybrid_arch.is_moe(args.arch)
    laguna = laguna_arch.is_laguna(args.arch)
    laguna_doc = {}
    if laguna:
        # The loaded model is the intended one (config, shapes, RoPE), holds
        # the saved selection biases, and its eager attention honours the
        # window (the long prompt: 224 tokens, 7 windows). All fatal.
        laguna_doc["rope"] = laguna_arch.check_shape(model, model.config)
        laguna_doc["router_bias"] = {str(k): v for k, v in
                                     laguna_arch.verify_router_biases(model, args.model_dir).items()}
        long_text = next(p["text"] for p in PROMPTS if p["name"] == "long_code")
        long_ids = torch.tensor([tok.encode(long_text, add_special_tokens=False).ids])
        laguna_doc["attention_window_check"] = laguna_arch.attention_window_check(model, long_ids)
        notes.append(f"laguna: sliding-window check on long_code ({long_ids.shape[1]} tokens, window "
                     f"{model.config.sliding_window}) passed; router biases match the saved tensors")
    eos_ids = {tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")}
    variants = {"f64": copy.deepcopy(model).double(), "q8_0": q8_0_model(model)}
    kv_model = copy.deepcopy(model)
    kv16_hooks(kv_model)
    variants["kv16"] = kv_model
    fixtures = []
    for p in PROMPTS:
        text = prompt_text(p, hf_tok, template, notes)
        ids = tok.encode(text, add_special_tokens=False).ids
        fixtures.append(prompt_fixture(p, text, ids, model, variants, tok, hf_tok, eos_ids,
                                       is_moe, notes, hybrid, args.arch))
        print(f"[{args.name}] {p['name']}: {len(ids)} tokens, greedy "
              f"{fixtures[-1]['greedy_text'][:60]!r}", flush=True)
    cfg = json.load(open(os.path.join(args.model_dir, "config.json")))
    greedy_doc = {"max_new_tokens": GREEDY_TOKENS, "eos_disabled": True,
                  "method": "argmax of the last position of a full forward over prompt+generated "
                            "tokens at each step (no KV cache); ties are not special-cased"}
    if hybrid:
        notes.append(f"gated delta net calls: {dict(sorted(hybrid_arch.CALLS.items()))}")
        for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule",
                     "causal_conv1d_update"):
            if hybrid_arch.CALLS[name] == 0:
                notes.append(f"WARNING: {name} was never called: this transformers dispatches the "
                             f"Gated DeltaNet differently (the f64 reference and the cache path "
                             f"are not what the fixture says)")
                print(f"[{args.name}] {notes[-1]}", flush=True)
        greedy_doc["method"] = (
            "transformers generate() with use_cache=True, do_sample false: the full-attention "
            "layer's KV cache and the Gated DeltaNet conv + recurrent state "
            "(torch_recurrent_gated_delta_rule, causal_conv1d_update per decoded token); "
            "greedy_top1_margins from generate()'s logits. Cross-check: greedy_nocache_* is the "
            "argmax of a full forward without cache (chunked delta rule) at each step")
    doc = {
        "model": args.name, "arch": args.arch, "hf_dir": f"hf/{args.name}", "config": cfg,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__, "python": platform.python_version()},
        "compute": "HF transformers, float32 on CPU, attn_implementation=eager, weights bf16-representable"
                   + ("; Gated DeltaNet layers through transformers' torch reference functions "
                      "(no fla / causal_conv1d kernels)" if hybrid else ""),
        "top_n": TOP_N,
        "greedy": greedy_doc,
        "last_logits_encoding": "base64 of vocab_size little-endian float32",
        "router_topk_layout": "[layer][position][k] expert ids, ordered by router logit, prompt positions only",
        "tolerances": tolerances(fixtures, hybrid), "notes": notes, "prompts": fixtures,
    }
    if laguna:
        doc["compute"] += ("; sliding-window layers masked by transformers' sliding-window causal mask "
                           "(checked: attention_window_check)")
        doc["router_topk_layers"] = sorted(li for li, _ in laguna_arch.moe_layers(model))
        doc["router_topk_layout"] = (
            "[i][position][k]: expert ids selected by the router of layer router_topk_layers[i] "
            "(the sparse layers; the dense layer 0 has no router), ordered by selection score "
            "sigmoid(logit) + e_score_correction_bias, prompt positions only; router_min_kth_margin is "
            "the smallest k-th minus (k+1)-th selection score; router_bias_changed_selections counts "
            "(layer, position) pairs whose selected set differs from the top-k of sigmoid(logit) alone")
        doc["router_bias_changed_selections_total"] = sum(f["router_bias_changed_selections"]
                                                          for f in fixtures)
        doc["laguna"] = laguna_doc
        doc["tolerances"]["note"] += (
            " Laguna: the f16 KV figure rounds K (after k_norm, before RoPE) and V of all 4 layers; "
            "the routers select with a non-zero e_score_correction_bias, so an engine that ignores "
            "it differs on the (layer, position) pairs counted in router_bias_changed_selections.")
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
    print(f"[{args.name}] tolerances {json.dumps(doc['tolerances'])}")
    print(f"[{args.name}] notes {notes}")
    if args.tokenizer_cases_out:
        cases = []
        for s in TOKENIZER_CASES:
            ids = tok.encode(s, add_special_tokens=False).ids
            h = hf_ids(hf_tok, s)
            cases.append({"text": s, "ids": ids, "hf_autotokenizer_ids_match": h == ids,
                          "decoded": tok.decode(ids, skip_special_tokens=False)})
        with open(args.tokenizer_cases_out, "w", encoding="utf-8") as f:
            json.dump({"tokenizer": "tokenizer.json of the tiny models", "cases": cases}, f,
                      ensure_ascii=False, indent=1)
        print(f"tokenizer cases: {sum(c['hf_autotokenizer_ids_match'] for c in cases)}/{len(cases)} "
              f"AutoTokenizer matches")


if __name__ == "__main__":
    main()
