"""Qwen3.5 support (hybrid Gated DeltaNet + gated attention) for train_model.py
and make_fixtures.py.

qwen35moe: transformers' Qwen3_5MoeForCausalLM / Qwen3_5MoeTextConfig
qwen35:    transformers' Qwen3_5ForCausalLM / Qwen3_5TextConfig

Shapes are those of `moeserve make-model --preset tiny` (src/convert/model_presets.cpp)
except the vocabulary, which comes from the trained tokenizer. Every config
field name is checked against the config class, and every module shape of the
built model against the intended one, so a transformers version that names
things differently fails with a clear message instead of training the wrong
model.

Gated DeltaNet kernels: no fla / causal_conv1d packages are installed on the GPU
machine, so transformers falls back to its torch reference functions
(torch_chunk_gated_delta_rule for full forwards and prefill,
torch_recurrent_gated_delta_rule + causal_conv1d_update for cached decode,
causal_conv1d_fn). install_gdn_patches() rebinds the modeling module's four
functions to those torch references (even if a kernel package were
importable), counts the calls, runs the delta rule with autocast disabled
(fp32, as the fla kernels accumulate) and, for float64 inputs, runs a
sequential float64 delta rule instead (the torch references cast to float32,
which would make an "f64" reference model partly f32).
"""
import collections
import importlib
import inspect

import torch

HYBRID_ARCHES = ("qwen35moe", "qwen35")
# Every MoE arch of train_model.py / make_fixtures.py (laguna: laguna_arch.py).
MOE_ARCHES = ("qwen3moe", "qwen35moe", "laguna")

_NAMES = {
    "qwen35moe": ("qwen3_5_moe", "Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig"),
    "qwen35": ("qwen3_5", "Qwen3_5ForCausalLM", "Qwen3_5TextConfig"),
}

# Small enough to commit (a bf16 GGUF of ~5.8 MB for qwen35moe, ~3.8 MB for
# qwen35; the repository must stay under what a GPU-machine call carries),
# with every size the GPU kernels take: attention heads of 64 (the
# tensor-core kernel), DeltaNet heads of 32 with 2 K / 4 V heads (the
# tiled head order matters), a shared expert.
HIDDEN = 128
N_LAYER = 4
FULL_ATTENTION_INTERVAL = 4
LAYER_TYPES = ["linear_attention" if (i + 1) % FULL_ATTENTION_INTERVAL else "full_attention"
               for i in range(N_LAYER)]
N_HEAD, N_HEAD_KV, HEAD_DIM = 4, 2, 64
PARTIAL_ROTARY_FACTOR = 0.25  # 16 rotary dims of 64
ROTARY_DIMS = int(HEAD_DIM * PARTIAL_ROTARY_FACTOR)
ROPE_THETA = 1e7
# moeserve's ModelShape::rope_sections() for n_rot 16: half = 8, s = 8 * 11 / 32 = 2
# -> [2, 2, 4]; sums to 8 = ROTARY_DIMS / 2. Text-only positions are equal on
# all three M-RoPE axes, so the sections do not change any number here.
MROPE_SECTION = [2, 2, 4]
LIN_K_HEADS, LIN_V_HEADS, LIN_K_DIM, LIN_V_DIM, CONV_KERNEL = 2, 4, 32, 32, 4
N_EXPERT, N_EXPERT_USED, EXPERT_FF, SHARED_FF = 8, 2, 128, 128
DENSE_FF = 384

GDN_FUNCS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule",
             "causal_conv1d_fn", "causal_conv1d_update")
CALLS = collections.Counter()  # calls of the patched functions, by name


def is_hybrid(arch):
    return arch in HYBRID_ARCHES


def is_moe(arch):
    return arch in MOE_ARCHES


def _transformers_version():
    try:
        import transformers
        return transformers.__version__
    except Exception:  # noqa: BLE001
        return "?"


def _import(module_name, what):
    try:
        return importlib.import_module(module_name)
    except ImportError as e:
        raise RuntimeError(f"cannot import {module_name} ({what}) from transformers "
                           f"{_transformers_version()}: {e!r}. qwen35moe/qwen35 need a transformers "
                           f"with Qwen3.5 support (written against 5.17)") from e


def _get(module, name):
    obj = getattr(module, name, None)
    if obj is None:
        raise RuntimeError(f"{module.__name__} has no {name} (transformers {_transformers_version()})")
    return obj


def modeling_module(arch):
    pkg = _NAMES[arch][0]
    return _import(f"transformers.models.{pkg}.modeling_{pkg}", f"{arch} modeling")


def model_class(arch):
    return _get(modeling_module(arch), _NAMES[arch][1])


def config_class(arch):
    pkg = _NAMES[arch][0]
    return _get(_import(f"transformers.models.{pkg}.configuration_{pkg}", f"{arch} config"),
                _NAMES[arch][2])


def _config_fields(cls):
    """Field names the config class declares (dataclass fields or __init__
    parameters), or None when they cannot be listed."""
    import dataclasses
    names = set()
    for klass in cls.__mro__:
        if dataclasses.is_dataclass(klass):
            names.update(f.name for f in dataclasses.fields(klass))
        names.update(getattr(klass, "__annotations__", {}).keys())
    try:
        params = inspect.signature(cls.__init__).parameters
        names.update(n for n, p in params.items()
                     if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and n != "self")
    except (TypeError, ValueError):
        pass
    return names or None


def build_config(arch, vocab_size, ids):
    cls = config_class(arch)
    rope = {"rope_type": "default", "rope_theta": ROPE_THETA,
            "partial_rotary_factor": PARTIAL_ROTARY_FACTOR,
            "mrope_section": list(MROPE_SECTION), "mrope_interleaved": True}
    kw = dict(vocab_size=vocab_size, hidden_size=HIDDEN, num_hidden_layers=N_LAYER,
              num_attention_heads=N_HEAD, num_key_value_heads=N_HEAD_KV, head_dim=HEAD_DIM,
              hidden_act="silu", max_position_embeddings=2048, rms_norm_eps=1e-6,
              tie_word_embeddings=False, attention_bias=False, initializer_range=0.02,
              rope_parameters=rope, layer_types=list(LAYER_TYPES),
              linear_conv_kernel_dim=CONV_KERNEL, linear_key_head_dim=LIN_K_DIM,
              linear_value_head_dim=LIN_V_DIM, linear_num_key_heads=LIN_K_HEADS,
              linear_num_value_heads=LIN_V_HEADS,
              bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"])
    if arch == "qwen35moe":
        kw.update(num_experts=N_EXPERT, num_experts_per_tok=N_EXPERT_USED,
                  moe_intermediate_size=EXPERT_FF, shared_expert_intermediate_size=SHARED_FF,
                  output_router_logits=False, router_aux_loss_coef=0.001)
    else:
        kw.update(intermediate_size=DENSE_FF)
    fields = _config_fields(cls)
    if fields is not None:
        unknown = sorted(k for k in kw if k not in fields)
        if unknown:
            raise RuntimeError(f"{cls.__name__} (transformers {_transformers_version()}) has no "
                               f"field(s) {unknown}; the field names differ from the 5.17 ones "
                               f"hybrid_arch.build_config uses. Known fields: {sorted(fields)}")
    try:  # stored like the published Qwen3.5 configs; layer_types is what counts
        cfg = cls(full_attention_interval=FULL_ATTENTION_INTERVAL, **kw)
    except TypeError:
        cfg = cls(**kw)
    bad = []
    for k, v in kw.items():
        if k in ("rope_parameters", "layer_types"):
            continue
        if getattr(cfg, k, None) != v:
            bad.append(f"{k}: wanted {v!r}, config has {getattr(cfg, k, None)!r}")
    if list(getattr(cfg, "layer_types", None) or []) != LAYER_TYPES:
        bad.append(f"layer_types: wanted {LAYER_TYPES}, config has {getattr(cfg, 'layer_types', None)}")
    rp = getattr(cfg, "rope_parameters", None)
    if not isinstance(rp, dict):
        bad.append(f"rope_parameters is {rp!r}, not a dict")
    else:
        for k in ("rope_type", "rope_theta", "partial_rotary_factor", "mrope_section"):
            if rp.get(k) != rope[k]:
                bad.append(f"rope_parameters[{k!r}]: wanted {rope[k]!r}, config has {rp.get(k)!r}")
    if bad:
        raise RuntimeError(f"{cls.__name__} did not take the intended values: " + "; ".join(bad))
    return cfg


def _expect(root, path, shape, errors):
    obj = root
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            errors.append(f"{path}: missing")
            return
    got = list(obj.shape)
    if got != list(shape):
        errors.append(f"{path}: shape {got}, wanted {list(shape)}")


def check_shape(model, cfg, arch):
    """Fail early if the config did not produce the intended architecture:
    layer types, head_dim, the gated q_proj, the Gated DeltaNet tensors, the
    MoE / dense FFN, and 16 rotary dims (8 inverse frequencies) with theta 1e7."""
    H, D = HIDDEN, HEAD_DIM
    key_dim, value_dim = LIN_K_HEADS * LIN_K_DIM, LIN_V_HEADS * LIN_V_DIM
    conv_dim = 2 * key_dim + value_dim
    errors = []
    layers = model.model.layers
    if len(layers) != N_LAYER:
        errors.append(f"{len(layers)} layers, wanted {N_LAYER}")
    for i, layer in enumerate(layers):
        p = f"layers.{i}"
        lt = cfg.layer_types[i]
        if lt == "linear_attention":
            la = getattr(layer, "linear_attn", None)
            if la is None or getattr(layer, "self_attn", None) is not None:
                errors.append(f"{p}: linear_attention layer without linear_attn (or with self_attn)")
                continue
            for name, shape in (("in_proj_qkv.weight", [conv_dim, H]), ("in_proj_z.weight", [value_dim, H]),
                                ("in_proj_b.weight", [LIN_V_HEADS, H]), ("in_proj_a.weight", [LIN_V_HEADS, H]),
                                ("conv1d.weight", [conv_dim, 1, CONV_KERNEL]), ("A_log", [LIN_V_HEADS]),
                                ("dt_bias", [LIN_V_HEADS]), ("norm.weight", [LIN_V_DIM]),
                                ("out_proj.weight", [H, value_dim])):
                _expect(la, name, shape, errors)
        else:
            att = getattr(layer, "self_attn", None)
            if att is None:
                errors.append(f"{p}: full_attention layer without self_attn")
                continue
            if getattr(att, "head_dim", D) != D:
                errors.append(f"{p}.self_attn.head_dim {att.head_dim}, wanted {D}")
            # q_proj holds [q | gate] per head: 2 * n_head * head_dim rows.
            for name, shape in (("q_proj.weight", [2 * N_HEAD * D, H]), ("k_proj.weight", [N_HEAD_KV * D, H]),
                                ("v_proj.weight", [N_HEAD_KV * D, H]), ("o_proj.weight", [H, N_HEAD * D]),
                                ("q_norm.weight", [D]), ("k_norm.weight", [D])):
                _expect(att, name, shape, errors)
        mlp = layer.mlp
        if arch == "qwen35moe":
            for name, shape in (("gate.weight", [N_EXPERT, H]),
                                ("experts.gate_up_proj", [N_EXPERT, 2 * EXPERT_FF, H]),
                                ("experts.down_proj", [N_EXPERT, H, EXPERT_FF]),
                                ("shared_expert.gate_proj.weight", [SHARED_FF, H]),
                                ("shared_expert.up_proj.weight", [SHARED_FF, H]),
                                ("shared_expert.down_proj.weight", [H, SHARED_FF]),
                                ("shared_expert_gate.weight", [1, H])):
                _expect(mlp, name, shape, errors)
        else:
            for name, shape in (("gate_proj.weight", [DENSE_FF, H]), ("up_proj.weight", [DENSE_FF, H]),
                                ("down_proj.weight", [H, DENSE_FF])):
                _expect(mlp, name, shape, errors)
    rotary = getattr(model.model, "rotary_emb", None)
    if rotary is None:
        errors.append("model.rotary_emb: missing")
    else:
        inv = rotary.inv_freq.detach().float().cpu()
        want = 1.0 / (ROPE_THETA ** (torch.arange(0, ROTARY_DIMS, 2, dtype=torch.float32) / ROTARY_DIMS))
        if inv.numel() != want.numel():
            errors.append(f"rotary inv_freq has {inv.numel()} entries, wanted {want.numel()} "
                          f"({ROTARY_DIMS} rotary dims)")
        elif not torch.allclose(inv, want, rtol=1e-4):
            errors.append(f"rotary inv_freq {inv.tolist()} != {want.tolist()} (theta {ROPE_THETA})")
        section = getattr(rotary, "mrope_section", None)
        if section is not None and sum(section) != ROTARY_DIMS // 2:
            errors.append(f"rotary mrope_section {section} does not sum to {ROTARY_DIMS // 2}")
    if errors:
        raise RuntimeError(f"{arch}: the built model is not the intended one: " + "; ".join(errors))


def _resolved(fn):
    """What a transformers hub/fallback wrapper dispatches to (closure variable
    `implementation`), else the function itself."""
    impl = fn
    try:
        cells = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))
        impl = cells.get("implementation", fn)
    except (AttributeError, ValueError):
        pass
    return f"{getattr(impl, '__module__', '?')}.{getattr(impl, '__qualname__', repr(impl))}"


def _l2norm(x, eps=1e-6):  # as transformers' l2norm (and fla)
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def delta_rule_sequential(query, key, value, g, beta, chunk_size=64, initial_state=None,
                          output_final_state=False, use_qk_l2norm_in_kernel=False, **kwargs):
    """The gated delta rule token by token in the inputs' own dtype (float64
    for the reference model); same arguments and results as transformers'
    torch_chunk_gated_delta_rule / torch_recurrent_gated_delta_rule."""
    dt = query.dtype
    q, k, v, b, decay = (x.transpose(1, 2).to(dt) for x in (query, key, value, beta, g))
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    q = q * (q.shape[-1] ** -0.5)
    batch, heads, length, dk = k.shape
    dv = v.shape[-1]
    state = (torch.zeros(batch, heads, dk, dv, dtype=dt, device=q.device) if initial_state is None
             else initial_state.to(dt))
    out = torch.zeros(batch, heads, length, dv, dtype=dt, device=q.device)
    for t in range(length):
        state = state * decay[:, :, t].exp()[..., None, None]
        kv_mem = (state * k[:, :, t, :, None]).sum(dim=-2)
        delta = (v[:, :, t] - kv_mem) * b[:, :, t, None]
        state = state + k[:, :, t, :, None] * delta[:, :, None, :]
        out[:, :, t] = (state * q[:, :, t, :, None]).sum(dim=-2)
    return out.transpose(1, 2).contiguous(), (state if output_final_state else None)


def install_gdn_patches(arch, fp32_delta_rule=True):
    """Rebind the modeling module's Gated DeltaNet functions to transformers'
    torch reference implementations (see the module docstring). Returns a
    description: what each name resolved to before, and what runs now.
    Idempotent. CALLS counts the calls."""
    mod = modeling_module(arch)
    info = {}
    for name in GDN_FUNCS:
        fn = getattr(mod, name, None)
        if fn is None:
            raise RuntimeError(f"{mod.__name__} has no {name} (transformers {_transformers_version()}); "
                               f"hybrid_arch.install_gdn_patches needs updating")
        if getattr(fn, "_train_tiny_patched", False):
            info[name] = fn._train_tiny_info
            continue
        ref = inspect.unwrap(fn)
        is_delta = "delta_rule" in name

        def patched(*args, _name=name, _ref=ref, _is_delta=is_delta, **kwargs):
            CALLS[_name] += 1
            if _is_delta:
                q = args[0] if args else kwargs["query"]
                if q.dtype == torch.float64:
                    return delta_rule_sequential(*args, **kwargs)
                if fp32_delta_rule:
                    with torch.autocast(device_type=q.device.type, enabled=False):
                        return _ref(*args, **kwargs)
            return _ref(*args, **kwargs)

        desc = {"was": _resolved(fn), "now": f"{getattr(ref, '__module__', '?')}.{getattr(ref, '__qualname__', '?')}"}
        if is_delta:
            desc["now"] += " (autocast off: fp32)" if fp32_delta_rule else " (under autocast)"
            desc["now"] += "; float64 inputs: hybrid_arch.delta_rule_sequential"
        patched._train_tiny_patched = True
        patched._train_tiny_info = desc
        setattr(mod, name, patched)
        info[name] = desc
    return info


def require_calls(name, what):
    if CALLS[name] == 0:
        raise RuntimeError(f"{what}: the model never called the module-level {name}; this transformers "
                           f"({_transformers_version()}) dispatches the Gated DeltaNet differently, so "
                           f"hybrid_arch.install_gdn_patches has no effect")
