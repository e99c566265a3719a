"""Laguna support (transformers' LagunaForCausalLM / LagunaConfig) for
train_model.py and make_fixtures.py.

Laguna (Poolside): per-layer query head counts, full-attention layers with
YaRN RoPE on half the head (partial_rotary_factor 0.5) and sliding-window
layers with plain RoPE on the whole head, a softplus output gate per head
(g_proj), q/k RMSNorm, leading dense SwiGLU layers, then MoE layers whose
router scores experts with a sigmoid, selects the top-k of score +
e_score_correction_bias, weighs them by the unbiased scores renormalised, and
scales the routed sum by moe_routed_scaling_factor before adding an ungated
shared expert.

Every config field name is checked against LagunaConfig, every module shape
of the built model against the intended one, and the rotary inverse
frequencies and YaRN attention scaling against values computed here, so a
transformers version that names or computes things differently fails with a
clear message instead of training the wrong model. attention_window_check()
verifies, from the eager attention probabilities, that sliding layers see
exactly the last `sliding_window` keys (key j visible from query i iff
0 <= i - j < window) and that full layers see past the window.
"""
import contextlib
import copy
import importlib
import math

import torch

ARCH = "laguna"

# Small enough to commit (about 3.0 M parameters, a bf16 GGUF of ~6 MB), with
# every shape the C++ side handles: heads of 64 (the tensor-core kernel),
# per-layer query head counts (4 on the full layer, 6 on the sliding ones,
# GQA groups 2 and 3), a window smaller than the fixtures' prompt +
# continuation (every prompt + its 64 greedy tokens is >= 65 tokens, the
# long one 288), one leading dense layer, a shared expert.
HIDDEN = 128
N_LAYER = 4
LAYER_TYPES = ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(N_LAYER)]
MLP_LAYER_TYPES = ["dense"] + ["sparse"] * (N_LAYER - 1)
N_HEAD = 4
HEADS_PER_LAYER = [4, 6, 6, 6]
N_HEAD_KV, HEAD_DIM = 2, 64
SLIDING_WINDOW = 32
MAX_POS = 2048
# Full layers: YaRN over 32 of 64 dims. theta 1e6 is neither moeserve's
# default rope.freq_base (500000) nor the sliding layers' 10000, so a
# converter that drops either key fails the parity tests.
FULL_THETA = 1_000_000.0
FULL_PARTIAL = 0.5
YARN_FACTOR, YARN_ORIG_CTX, YARN_BETA_FAST, YARN_BETA_SLOW = 4.0, 64, 64.0, 1.0
SWA_THETA, SWA_PARTIAL = 10000.0, 1.0
N_EXPERT, N_EXPERT_USED, EXPERT_FF, SHARED_FF = 8, 2, 128, 128
DENSE_FF = 384
ROUTED_SCALE = 2.5
# After training, each router's e_score_correction_bias is set to
# N(0, 1) * ROUTER_BIAS_STD (seeded, rounded to bf16) so the biased selection
# differs from the unbiased one on some tokens.
ROUTER_BIAS_STD = 0.05
ROUTER_BIAS_SEED = 20261127


def is_laguna(arch):
    return arch == ARCH


def _transformers_version():
    try:
        import transformers
        return transformers.__version__
    except Exception:  # noqa: BLE001
        return "not importable"


def _import(name):
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise RuntimeError(
            f"cannot import {name} from transformers {_transformers_version()}: {e!r}. "
            f"--arch laguna needs a transformers with Laguna (transformers.models.laguna, "
            f"LagunaForCausalLM / LagunaConfig; written against 5.17)") from e


def _get(module, name):
    obj = getattr(module, name, None)
    if obj is None:
        raise RuntimeError(f"{module.__name__} has no {name} (transformers {_transformers_version()}); "
                           f"--arch laguna needs a transformers with Laguna (written against 5.17)")
    return obj


def modeling_module():
    return _import("transformers.models.laguna.modeling_laguna")


def model_class():
    return _get(modeling_module(), "LagunaForCausalLM")


def config_class():
    return _get(_import("transformers.models.laguna.configuration_laguna"), "LagunaConfig")


def rope_parameters():
    return {
        "full_attention": {"rope_type": "yarn", "rope_theta": FULL_THETA,
                           "partial_rotary_factor": FULL_PARTIAL, "factor": YARN_FACTOR,
                           "original_max_position_embeddings": YARN_ORIG_CTX,
                           "beta_fast": YARN_BETA_FAST, "beta_slow": YARN_BETA_SLOW},
        "sliding_attention": {"rope_type": "default", "rope_theta": SWA_THETA,
                              "partial_rotary_factor": SWA_PARTIAL},
    }


def build_config(vocab_size, ids):
    from hybrid_arch import _config_fields  # same field listing as the Qwen3.5 configs
    cls = config_class()
    rope = rope_parameters()
    # pad_token_id stays unset (None), as for the Qwen models: LagunaModel
    # passes it to nn.Embedding as padding_idx, which would zero and freeze
    # the embedding of <|endoftext|>, the document separator of the corpus.
    # generation_config.json names the pad id.
    kw = dict(vocab_size=int(vocab_size), hidden_size=HIDDEN, intermediate_size=DENSE_FF,
              num_hidden_layers=N_LAYER, num_attention_heads=N_HEAD,
              num_key_value_heads=N_HEAD_KV, head_dim=HEAD_DIM, hidden_act="silu",
              max_position_embeddings=MAX_POS, initializer_range=0.02, rms_norm_eps=1e-6,
              tie_word_embeddings=False, rope_parameters=copy.deepcopy(rope),
              sliding_window=SLIDING_WINDOW, layer_types=list(LAYER_TYPES),
              mlp_layer_types=list(MLP_LAYER_TYPES),
              num_attention_heads_per_layer=list(HEADS_PER_LAYER), gating=True,
              attention_bias=False, moe_intermediate_size=EXPERT_FF,
              shared_expert_intermediate_size=SHARED_FF, num_experts=N_EXPERT,
              num_experts_per_tok=N_EXPERT_USED, moe_routed_scaling_factor=ROUTED_SCALE,
              moe_router_logit_softcapping=0.0, output_router_logits=False,
              router_aux_loss_coef=0.001,
              bos_token_id=int(ids["<|endoftext|>"]), eos_token_id=int(ids["<|im_end|>"]))
    fields = _config_fields(cls)
    if fields is not None:
        unknown = sorted(k for k in kw if k not in fields)
        if unknown:
            raise RuntimeError(f"{cls.__name__} (transformers {_transformers_version()}) has no "
                               f"field(s) {unknown}; the field names differ from the ones "
                               f"laguna_arch.build_config uses. Known fields: {sorted(fields)}")
    cfg = cls(**kw)
    bad = []
    for k, v in kw.items():
        if k == "rope_parameters":
            continue
        got = getattr(cfg, k, None)
        if isinstance(v, list):
            got = list(got) if got is not None else None
        if got != v:
            bad.append(f"{k}: wanted {v!r}, config has {got!r}")
    rp = getattr(cfg, "rope_parameters", None)
    if not isinstance(rp, dict):
        bad.append(f"rope_parameters is {rp!r}, not a dict")
    else:
        for lt, want in rope.items():
            have = rp.get(lt)
            if not isinstance(have, dict):
                bad.append(f"rope_parameters[{lt!r}] is {have!r}")
                continue
            for k, v in want.items():
                if have.get(k) != v:
                    bad.append(f"rope_parameters[{lt!r}][{k!r}]: wanted {v!r}, config has {have.get(k)!r}")
    if getattr(cfg, "pad_token_id", None) is not None:
        bad.append(f"pad_token_id is {cfg.pad_token_id} (wanted None: it would freeze an embedding row)")
    if bad:
        raise RuntimeError(f"{cls.__name__} did not take the intended values: " + "; ".join(bad))
    return cfg


def yarn_inv_freq(base, dim, factor, orig_ctx, beta_fast, beta_slow, truncate=True):
    """transformers' _compute_yarn_parameters (modeling_rope_utils), for the
    check; returns (inv_freq, ramp_low, ramp_high)."""
    def corr_dim(rotations):
        return dim * math.log(orig_ctx / (rotations * 2 * math.pi)) / (2 * math.log(base))
    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    top = high + 0.001 if low == high else high
    pos = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extrapolation, interpolation = 1.0 / pos, 1.0 / (factor * pos)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (top - low)).clamp(0, 1)
    extra_w = 1 - ramp
    return interpolation * (1 - extra_w) + extrapolation * extra_w, low, high


def default_inv_freq(base, dim):
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))


def _expect(root, path, shape, errors):
    obj = root
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            errors.append(f"{path}: missing")
            return None
    got = list(obj.shape)
    if got != list(shape):
        errors.append(f"{path}: shape {got}, wanted {list(shape)}")
    return obj


def check_rotary(model, errors):
    """The rotary module's inverse frequencies and attention scaling per layer
    type against the values computed here; returns what it found."""
    rotary = getattr(model.model, "rotary_emb", None)
    info = {}
    if rotary is None:
        errors.append("model.rotary_emb: missing")
        return info
    full_dim, swa_dim = int(HEAD_DIM * FULL_PARTIAL), int(HEAD_DIM * SWA_PARTIAL)
    want_yarn, low, high = yarn_inv_freq(FULL_THETA, full_dim, YARN_FACTOR, YARN_ORIG_CTX,
                                         YARN_BETA_FAST, YARN_BETA_SLOW, truncate=True)
    want_yarn_nt, low_nt, high_nt = yarn_inv_freq(FULL_THETA, full_dim, YARN_FACTOR, YARN_ORIG_CTX,
                                                  YARN_BETA_FAST, YARN_BETA_SLOW, truncate=False)
    want_scale = 0.1 * math.log(YARN_FACTOR) + 1.0
    for lt, want, want_att, dim in (("full_attention", want_yarn, want_scale, full_dim),
                                    ("sliding_attention", default_inv_freq(SWA_THETA, swa_dim), 1.0, swa_dim)):
        inv = getattr(rotary, f"{lt}_inv_freq", None)
        att = getattr(rotary, f"{lt}_attention_scaling", None)
        if inv is None or att is None:
            errors.append(f"rotary_emb.{lt}_inv_freq / {lt}_attention_scaling: missing "
                          f"(transformers {_transformers_version()} names the per-layer-type RoPE "
                          f"buffers differently)")
            continue
        inv = inv.detach().float().cpu()
        entry = {"rotary_dims": 2 * inv.numel(), "inv_freq": [float(x) for x in inv],
                 "attention_scaling": float(att)}
        if inv.numel() != dim // 2:
            errors.append(f"rotary {lt}: {inv.numel()} inverse frequencies, wanted {dim // 2} ({dim} rotary dims)")
        elif lt == "full_attention":
            entry.update(yarn_ramp_low=low, yarn_ramp_high=high, yarn_truncate=True)
            if not torch.allclose(inv, want, rtol=1e-5, atol=0):
                if torch.allclose(inv, want_yarn_nt, rtol=1e-5, atol=0):
                    # Still the reference (the fixtures come from it), but moeserve
                    # implements the truncated ramp: say so loudly.
                    entry.update(yarn_ramp_low=low_nt, yarn_ramp_high=high_nt, yarn_truncate=False)
                    print(f"WARNING: transformers {_transformers_version()} computes the YaRN ramp "
                          f"without truncation (low {low_nt:.4f}, high {high_nt:.4f}); moeserve's "
                          f"yarn_rope() truncates (floor/ceil): the parity tests will show it", flush=True)
                else:
                    errors.append(f"rotary full_attention inv_freq {inv.tolist()} != YaRN {want.tolist()} "
                                  f"(theta {FULL_THETA}, factor {YARN_FACTOR}, original {YARN_ORIG_CTX}, "
                                  f"beta_fast {YARN_BETA_FAST}, beta_slow {YARN_BETA_SLOW})")
        elif not torch.allclose(inv, want, rtol=1e-5, atol=0):
            errors.append(f"rotary {lt} inv_freq {inv.tolist()} != {want.tolist()} (theta {SWA_THETA})")
        if abs(float(att) - want_att) > 1e-6:
            errors.append(f"rotary {lt} attention_scaling {float(att)}, wanted {want_att}")
        info[lt] = entry
    return info


def check_shape(model, cfg):
    """Fail early if the config did not produce the intended architecture:
    layer and MLP types, per-layer head counts, every projection's shape, the
    per-head gate, the router with its (frozen) selection bias, fused experts,
    the shared expert, untied lm_head, and the rotary frequencies. Returns
    the rotary details (for the training summary)."""
    H, D = HIDDEN, HEAD_DIM
    errors = []
    for name, want in (("layer_types", LAYER_TYPES), ("mlp_layer_types", MLP_LAYER_TYPES),
                       ("num_attention_heads_per_layer", HEADS_PER_LAYER)):
        got = getattr(cfg, name, None)
        if got is None or list(got) != want:
            errors.append(f"config.{name} {got}, wanted {want}")
    layers = model.model.layers
    if len(layers) != N_LAYER:
        errors.append(f"{len(layers)} layers, wanted {N_LAYER}")
    for i, layer in enumerate(layers):
        p = f"layers.{i}"
        nh = HEADS_PER_LAYER[i]
        att = getattr(layer, "self_attn", None)
        if att is None:
            errors.append(f"{p}.self_attn: missing")
        else:
            for name, shape in (("q_proj.weight", [nh * D, H]), ("k_proj.weight", [N_HEAD_KV * D, H]),
                                ("v_proj.weight", [N_HEAD_KV * D, H]), ("o_proj.weight", [H, nh * D]),
                                ("g_proj.weight", [nh, H]), ("q_norm.weight", [D]), ("k_norm.weight", [D])):
                _expect(att, name, shape, errors)
            for name in ("q_proj", "k_proj", "v_proj", "o_proj", "g_proj"):
                mod = getattr(att, name, None)
                if mod is not None and getattr(mod, "bias", None) is not None:
                    errors.append(f"{p}.self_attn.{name} has a bias")
            want_window = SLIDING_WINDOW if LAYER_TYPES[i] == "sliding_attention" else None
            for attr, want in (("num_heads", nh), ("head_dim", D), ("sliding_window", want_window),
                               ("gate_per_head", True)):
                if hasattr(att, attr) and getattr(att, attr) != want:
                    errors.append(f"{p}.self_attn.{attr} {getattr(att, attr)!r}, wanted {want!r}")
        for name in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            _expect(layer, name, [H], errors)
        mlp = layer.mlp
        if MLP_LAYER_TYPES[i] == "dense":
            if hasattr(mlp, "experts") or hasattr(mlp, "gate"):
                errors.append(f"{p}.mlp is a MoE block, wanted dense")
            for name, shape in (("gate_proj.weight", [DENSE_FF, H]), ("up_proj.weight", [DENSE_FF, H]),
                                ("down_proj.weight", [H, DENSE_FF])):
                _expect(mlp, name, shape, errors)
        else:
            for name, shape in (("gate.weight", [N_EXPERT, H]),
                                ("experts.gate_up_proj", [N_EXPERT, 2 * EXPERT_FF, H]),
                                ("experts.down_proj", [N_EXPERT, H, EXPERT_FF]),
                                ("shared_experts.gate_proj.weight", [SHARED_FF, H]),
                                ("shared_experts.up_proj.weight", [SHARED_FF, H]),
                                ("shared_experts.down_proj.weight", [H, SHARED_FF])):
                _expect(mlp, name, shape, errors)
            bias = _expect(mlp, "gate.e_score_correction_bias", [N_EXPERT], errors)
            if bias is not None:
                if not isinstance(bias, torch.nn.Parameter):
                    errors.append(f"{p}.mlp.gate.e_score_correction_bias is a {type(bias).__name__}, "
                                  f"not a Parameter (it would not be saved as a weight)")
                elif bias.requires_grad:
                    # from_pretrained re-creates parameters with requires_grad on;
                    # training freezes it itself (set_router_biases / the optimizer).
                    print(f"[laguna] note: {p}.mlp.gate.e_score_correction_bias requires grad", flush=True)
            gate = getattr(mlp, "gate", None)
            if gate is not None and getattr(gate, "top_k", N_EXPERT_USED) != N_EXPERT_USED:
                errors.append(f"{p}.mlp.gate.top_k {gate.top_k}, wanted {N_EXPERT_USED}")
            if gate is not None and getattr(gate, "router_logit_softcapping", 0.0) != 0.0:
                errors.append(f"{p}.mlp.gate.router_logit_softcapping {gate.router_logit_softcapping}, wanted 0")
            if getattr(mlp, "routed_scaling_factor", ROUTED_SCALE) != ROUTED_SCALE:
                errors.append(f"{p}.mlp.routed_scaling_factor {mlp.routed_scaling_factor}, wanted {ROUTED_SCALE}")
    V = cfg.vocab_size
    emb = _expect(model.model, "embed_tokens.weight", [V, H], errors)
    head = _expect(model, "lm_head.weight", [V, H], errors)
    _expect(model.model, "norm.weight", [H], errors)
    if emb is not None and head is not None and emb.data_ptr() == head.data_ptr():
        errors.append("lm_head is tied to embed_tokens (wanted untied)")
    if getattr(model.model.embed_tokens, "padding_idx", None) is not None:
        errors.append(f"embed_tokens.padding_idx is {model.model.embed_tokens.padding_idx} (wanted None)")
    rope_info = check_rotary(model, errors)
    if errors:
        raise RuntimeError(f"laguna: the built model is not the intended one "
                           f"(transformers {_transformers_version()}): " + "; ".join(errors))
    return rope_info


def moe_layers(model):
    """(layer index, router module) of the sparse layers."""
    return [(i, layer.mlp.gate) for i, layer in enumerate(model.model.layers)
            if hasattr(layer.mlp, "gate") and hasattr(layer.mlp.gate, "e_score_correction_bias")]


@torch.no_grad()
def set_router_bias(model, std=ROUTER_BIAS_STD, seed=ROUTER_BIAS_SEED):
    """Fixed pseudo-random, bf16-exact selection biases; returns them by layer."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    out = {}
    for li, gate in moe_layers(model):
        b = gate.e_score_correction_bias
        vals = (torch.randn(b.shape, generator=gen, dtype=torch.float32) * std).bfloat16().float()
        b.copy_(vals.to(device=b.device, dtype=b.dtype))
        out[li] = vals.tolist()
    if not out:
        raise RuntimeError("laguna: no router with e_score_correction_bias found")
    return out


def router_choice(mod, output, k):
    """What one LagunaTopKRouter call chose, from its forward output
    (router_logits, routing_weights, selected_experts): the selected experts
    (in selection-score order), the gap between the k-th and (k+1)-th
    selection score (sigmoid + bias), and the selection without the bias."""
    if not (isinstance(output, (tuple, list)) and len(output) == 3):
        raise RuntimeError(f"LagunaTopKRouter returned {type(output).__name__} of "
                           f"{len(output) if isinstance(output, (tuple, list)) else '?'} entries; "
                           f"wanted (router_logits, routing_weights, selected_experts)")
    logits, _, selected = output
    scores = torch.sigmoid(logits.float())
    biased = scores + mod.e_score_correction_bias.float()
    top = torch.topk(biased, k + 1, dim=-1)
    margin = top.values[:, k - 1] - top.values[:, k]
    unbiased = torch.topk(scores, k, dim=-1).indices
    changed = (torch.sort(selected, dim=-1).values != torch.sort(unbiased, dim=-1).values).any(dim=-1)
    return selected, margin, unbiased, changed


def eager_copy(model):
    """A copy of the model running eager attention (the attention
    probabilities are returned, the masks are explicit)."""
    m = copy.deepcopy(model)
    try:
        m.set_attn_implementation("eager")
    except Exception as e:  # noqa: BLE001 - fall back to the config attribute
        print(f"set_attn_implementation('eager') failed ({e!r}); setting config._attn_implementation", flush=True)
    if getattr(m.config, "_attn_implementation", None) != "eager":
        m.config._attn_implementation = "eager"
    if getattr(m.config, "_attn_implementation", None) != "eager":
        raise RuntimeError(f"could not switch the model to eager attention "
                           f"(config._attn_implementation is {m.config._attn_implementation!r})")
    return m


@contextlib.contextmanager
def _attention_probs(model, store):
    hooks = []
    for li, layer in enumerate(model.model.layers):
        def hook(mod, inputs, output, li=li):
            w = output[1] if isinstance(output, (tuple, list)) and len(output) > 1 else None
            store[li] = None if w is None else w.detach().float()
        hooks.append(layer.self_attn.register_forward_hook(hook))
    try:
        yield
    finally:
        for h in hooks:
            h.remove()


@torch.no_grad()
def attention_window_check(model, input_ids, fail=True):
    """From the eager attention probabilities of one forward (model must run
    eager attention): on sliding layers, no weight on keys with i - j >=
    window (nor on future keys); on full layers, some weight beyond the
    window. Raises (fail=True) or returns the findings."""
    cfg = model.config
    window = cfg.sliding_window
    probs = {}
    with _attention_probs(model, probs):
        model(input_ids=input_ids, use_cache=False)
    T = input_ids.shape[-1]
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    future = j > i
    beyond = (i - j >= window) & ~future
    errors, layers = [], []
    if T <= window:
        errors.append(f"probe of {T} tokens does not exceed the window {window}")
    for li in range(len(model.model.layers)):
        w = probs.get(li)
        lt = cfg.layer_types[li]
        if w is None:
            errors.append(f"layer {li}: no attention probabilities (attention is not eager: "
                          f"{getattr(cfg, '_attn_implementation', '?')!r})")
            continue
        w = w.cpu()
        if w.shape[-2:] != (T, T):
            errors.append(f"layer {li}: attention probabilities of shape {list(w.shape)}, wanted [..., {T}, {T}]")
            continue
        out_w = float(w[..., beyond].abs().max()) if beyond.any() else 0.0
        fut_w = float(w[..., future].abs().max()) if future.any() else 0.0
        visible_last = (w[..., -1, :] > 0).sum(dim=-1).reshape(-1)
        entry = {"layer": li, "type": lt, "max_weight_beyond_window": out_w,
                 "max_weight_on_future_keys": fut_w,
                 "visible_keys_of_last_query": sorted(set(int(v) for v in visible_last))}
        layers.append(entry)
        if fut_w != 0.0:
            errors.append(f"layer {li}: weight {fut_w} on future keys")
        if lt == "sliding_attention" and out_w != 0.0:
            errors.append(f"layer {li} (sliding): weight {out_w} on keys {window} or more positions back")
        if lt == "full_attention" and out_w == 0.0:
            errors.append(f"layer {li} (full): no weight beyond {window} positions back: windowed?")
    result = {"tokens": T, "window": window, "ok": not errors, "layers": layers}
    if errors:
        result["errors"] = errors
        if fail:
            raise RuntimeError("laguna sliding-window check failed: " + "; ".join(errors))
    return result


@torch.no_grad()
def compare_with_eager(model, input_ids):
    """Largest |logit| difference between the model's own attention
    implementation and an eager copy on input_ids (f32), plus the eager
    window check."""
    eager = eager_copy(model).eval()
    a = model(input_ids=input_ids, use_cache=False).logits.float()
    b = eager(input_ids=input_ids, use_cache=False).logits.float()
    check = attention_window_check(eager, input_ids[:1], fail=False)
    del eager
    return {"attn_implementation": getattr(model.config, "_attn_implementation", None),
            "max_abs_logit_diff_vs_eager": float((a - b).abs().max()), "eager_window_check": check}


def saved_router_biases(model_dir):
    """e_score_correction_bias tensors of a saved directory, by layer index."""
    import os
    from safetensors import safe_open
    out = {}
    for f in sorted(os.listdir(model_dir)):
        if not f.endswith(".safetensors"):
            continue
        with safe_open(os.path.join(model_dir, f), "pt") as st:
            for k in st.keys():
                # transformers may rename it on save (its conversion mapping):
                # accept any per-layer router bias spelling and say which.
                if "layers." in k and (k.endswith("e_score_correction_bias") or k.endswith("expert_bias")):
                    print(f"[laguna] saved router bias tensor: {k}", flush=True)
                    parts = k.split(".")
                    li = int(parts[parts.index("layers") + 1])
                    out[li] = st.get_tensor(k).float()
    return out


def verify_router_biases(model, model_dir):
    """The saved biases exist for every sparse layer, are not all zero, and
    are what the model holds. Raises otherwise; returns them by layer."""
    saved = saved_router_biases(model_dir)
    errors = []
    result = {}
    for li, gate in moe_layers(model):
        have = gate.e_score_correction_bias.detach().float().cpu()
        if li not in saved:
            errors.append(f"layer {li}: no mlp.gate.e_score_correction_bias in {model_dir}")
            continue
        if not torch.equal(saved[li], have):
            errors.append(f"layer {li}: saved bias {saved[li].tolist()} != model's {have.tolist()}")
        if not bool((saved[li] != 0).any()):
            errors.append(f"layer {li}: saved bias is all zero (not the post-training values)")
        result[li] = saved[li].tolist()
    if errors:
        import os
        from safetensors import safe_open
        names = []
        for f in sorted(os.listdir(model_dir)):
            if f.endswith(".safetensors"):
                with safe_open(os.path.join(model_dir, f), "pt") as st:
                    names += [k for k in st.keys() if "layers.1." in k and "experts." not in k]
        raise RuntimeError("laguna router biases: " + "; ".join(errors) + f" (layer 1 tensors: {names})")
    return result
