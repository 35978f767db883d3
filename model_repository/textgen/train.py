"""Trains textgen's character transformer (1/transformer.py) on corpus.txt; writes 1/weights.npz.

Usage: .venv/bin/python model_repository/textgen/train.py

numpy only: the forward pass keeps what the backward pass needs, the gradients are written out
by hand (tests/unit/model_repository/test_textgen.py checks them against finite differences), and Adam updates
the weights. Reproducible: one fixed seed drives initialization and batch order, and the step
count is fixed (the run takes a few minutes on two CPU cores). The weights are saved as
float16 with the vocabulary and head count, and the script ends by reloading them through
transformer.py to report the losses and a sample of the saved model.

corpus.txt, about 29 KB of English, is public domain: the Declaration of Independence (1776),
the Preamble and the Bill of Rights of the US Constitution (1787, 1791), and Lincoln's
Gettysburg Address (1863) and Second Inaugural Address (1865) are works of the US government
or of its officers in their office, never under copyright; Genesis 1 and Psalm 23 of the King
James Bible (1611), Shakespeare's Sonnet 18 (1609) and Poe's "The Raven" (1845) were published
long before any copyright that could still run. The texts were typed from memory in plain
ASCII ("--" for dashes), so small departures from the canonical editions may remain. The
corpus is kept small so that a few minutes of training learn it well.
"""

import math
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "1"))
from transformer import (  # noqa: E402
    LN_EPS, PARAM_NAMES, VOCAB, SamplingParams, Transformer, Vocabulary, generate,
)

CORPUS = os.path.join(HERE, "corpus.txt")
WEIGHTS = os.path.join(HERE, "1", "weights.npz")

N_LAYER, N_HEAD, D_MODEL, CONTEXT = 4, 4, 128, 256
SEED = 1234
STEPS = 2400
BATCH = 8
PEAK_LR, FINAL_LR, WARMUP = 2e-3, 1e-4, 100
BETAS, ADAM_EPS = (0.9, 0.99), 1e-8
CLIP_NORM = 1.0
# Every VAL_EVERY-th block of BLOCK characters is held out to measure generalization.
BLOCK, VAL_EVERY = 1024, 20
# Amplitude of the sinusoids the position embedding starts from (see init_params).
POSITION_AMPLITUDE = 0.1

_GELU_C, _GELU_A = math.sqrt(2.0 / math.pi), 0.044715


def init_params(rng, n_layer, d_model, context, vocab_size, dtype=np.float32) -> dict:
    def normal(*shape, std=0.02):
        return (rng.standard_normal(shape) * std).astype(dtype)

    d, L = d_model, n_layer
    # Residual projections start smaller so the residual stream's variance does not grow
    # with depth.
    residual_std = 0.02 / math.sqrt(2 * n_layer)
    # The learned position embedding starts as sines and cosines of the position: their dot
    # products depend on the offset between positions, so attention can find the previous
    # characters from the start (random positions cost several hundred steps of plateau).
    angles = np.arange(context)[:, None] / 10000.0 ** (np.arange(0, d, 2) / d)
    positions = np.stack([np.sin(angles), np.cos(angles)], axis=-1).reshape(context, d)
    return {
        "tok_emb": normal(vocab_size, d),
        "pos_emb": (positions * POSITION_AMPLITUDE).astype(dtype),
        "ln1_g": np.ones((L, d), dtype), "ln1_b": np.zeros((L, d), dtype),
        "w_qkv": normal(L, d, 3 * d), "b_qkv": np.zeros((L, 3 * d), dtype),
        "w_o": normal(L, d, d, std=residual_std), "b_o": np.zeros((L, d), dtype),
        "ln2_g": np.ones((L, d), dtype), "ln2_b": np.zeros((L, d), dtype),
        "w_up": normal(L, d, 4 * d), "b_up": np.zeros((L, 4 * d), dtype),
        "w_down": normal(L, 4 * d, d, std=residual_std), "b_down": np.zeros((L, d), dtype),
        "lnf_g": np.ones(d, dtype), "lnf_b": np.zeros(d, dtype),
    }


# --- forward and backward ---------------------------------------------------------------------


def _ln_forward(x, g, b):
    centered = x - x.mean(axis=-1, keepdims=True)
    rstd = ((centered * centered).mean(axis=-1, keepdims=True) + LN_EPS) ** -0.5
    xhat = centered * rstd
    return xhat * g + b, (xhat, rstd, g)


def _ln_backward(dy, saved):
    """Gradients of a layer norm for x, g and b."""
    xhat, rstd, g = saved
    rows = dy.reshape(-1, dy.shape[-1])
    dg = (rows * xhat.reshape(rows.shape)).sum(axis=0)
    db = rows.sum(axis=0)
    dxhat = dy * g
    dx = rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True)
                 - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, dg, db


def _flat(a):
    return a.reshape(-1, a.shape[-1])


def loss_and_grads(params: dict, n_head: int, inputs, targets):
    """Mean cross-entropy of targets [B, T] given inputs [B, T], and its gradient per weight."""
    p = params
    batch, t = inputs.shape
    n_layer, d = p["w_qkv"].shape[:2]
    head_dim = d // n_head
    scale = 1.0 / math.sqrt(head_dim)
    # Added to the attention scores: -inf hides the future.
    causal = np.triu(np.full((t, t), -np.inf, dtype=p["w_qkv"].dtype), 1)

    x = p["tok_emb"][inputs] + p["pos_emb"][:t]
    saved = []
    for layer in range(n_layer):
        h1, ln1 = _ln_forward(x, p["ln1_g"][layer], p["ln1_b"][layer])
        qkv = h1 @ p["w_qkv"][layer] + p["b_qkv"][layer]
        q, k, v = qkv.reshape(batch, t, 3, n_head, head_dim).transpose(2, 0, 3, 1, 4)
        scores = q @ k.transpose(0, 1, 3, 2)
        scores *= scale
        scores += causal
        scores -= scores.max(axis=-1, keepdims=True)
        att = np.exp(scores, out=scores)
        att /= att.sum(axis=-1, keepdims=True)
        merged = (att @ v).transpose(0, 2, 1, 3).reshape(batch, t, d)
        x_mid = x + merged @ p["w_o"][layer] + p["b_o"][layer]
        h2, ln2 = _ln_forward(x_mid, p["ln2_g"][layer], p["ln2_b"][layer])
        up = h2 @ p["w_up"][layer] + p["b_up"][layer]
        tanh = np.tanh(_GELU_C * (up + _GELU_A * up * up * up))
        act = 0.5 * up * (1.0 + tanh)
        saved.append((h1, ln1, q, k, v, att, merged, h2, ln2, up, tanh, act))
        x = x_mid + act @ p["w_down"][layer] + p["b_down"][layer]
    hf, lnf = _ln_forward(x, p["lnf_g"], p["lnf_b"])
    logits = hf @ p["tok_emb"].T

    logits = _flat(logits)
    logits = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    rows = np.arange(probs.shape[0])
    flat_targets = targets.reshape(-1)
    loss = float(-np.log(probs[rows, flat_targets]).mean())

    g = {name: np.zeros_like(value) for name, value in p.items()}
    dlogits = probs
    dlogits[rows, flat_targets] -= 1.0
    dlogits /= probs.shape[0]
    g["tok_emb"] += dlogits.T @ _flat(hf)
    dx, g["lnf_g"], g["lnf_b"] = _ln_backward((dlogits @ p["tok_emb"]).reshape(hf.shape), lnf)

    for layer in reversed(range(n_layer)):
        h1, ln1, q, k, v, att, merged, h2, ln2, up, tanh, act = saved[layer]
        # MLP: x = x_mid + gelu(h2 @ w_up + b_up) @ w_down + b_down
        g["w_down"][layer] = _flat(act).T @ _flat(dx)
        g["b_down"][layer] = _flat(dx).sum(axis=0)
        dact = dx @ p["w_down"][layer].T
        dgelu = 0.5 * (1.0 + tanh) + 0.5 * up * (1.0 - tanh * tanh) * _GELU_C * (
            1.0 + 3.0 * _GELU_A * up * up)
        dup = dact * dgelu
        g["w_up"][layer] = _flat(h2).T @ _flat(dup)
        g["b_up"][layer] = _flat(dup).sum(axis=0)
        dx_mid, g["ln2_g"][layer], g["ln2_b"][layer] = _ln_backward(
            dup @ p["w_up"][layer].T, ln2)
        dx_mid += dx
        # Attention: x_mid = x + merge(softmax(q k^T * scale) v) @ w_o + b_o
        g["w_o"][layer] = _flat(merged).T @ _flat(dx_mid)
        g["b_o"][layer] = _flat(dx_mid).sum(axis=0)
        dy = (dx_mid @ p["w_o"][layer].T).reshape(batch, t, n_head, head_dim).transpose(0, 2, 1, 3)
        datt = dy @ v.transpose(0, 1, 3, 2)
        dv = att.transpose(0, 1, 3, 2) @ dy
        dscores = att * (datt - (datt * att).sum(axis=-1, keepdims=True)) * scale
        dq = dscores @ k
        dk = dscores.transpose(0, 1, 3, 2) @ q
        dqkv = np.stack([dq, dk, dv]).transpose(1, 3, 0, 2, 4).reshape(batch, t, 3 * d)
        g["w_qkv"][layer] = _flat(h1).T @ _flat(dqkv)
        g["b_qkv"][layer] = _flat(dqkv).sum(axis=0)
        dx_in, g["ln1_g"][layer], g["ln1_b"][layer] = _ln_backward(
            dqkv @ p["w_qkv"][layer].T, ln1)
        dx = dx_mid + dx_in

    np.add.at(g["tok_emb"], inputs.reshape(-1), _flat(dx))
    g["pos_emb"][:t] = dx.sum(axis=0)
    return loss, g


# --- optimization -----------------------------------------------------------------------------


class Adam:
    def __init__(self, params: dict):
        self.m = {name: np.zeros_like(value) for name, value in params.items()}
        self.v = {name: np.zeros_like(value) for name, value in params.items()}
        self.t = 0

    def update(self, params: dict, grads: dict, lr: float) -> None:
        self.t += 1
        b1, b2 = BETAS
        step = lr * math.sqrt(1 - b2 ** self.t) / (1 - b1 ** self.t)
        for name, grad in grads.items():
            m, v = self.m[name], self.v[name]
            m *= b1
            m += (1 - b1) * grad
            v *= b2
            v += (1 - b2) * grad * grad
            params[name] -= step * m / (np.sqrt(v) + ADAM_EPS)


def clip(grads: dict, max_norm: float) -> float:
    """Scales grads in place to a global norm of at most max_norm; returns the norm before."""
    norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
    if norm > max_norm:
        for g in grads.values():
            g *= max_norm / norm
    return norm


def learning_rate(step: int) -> float:
    """Linear warm-up, then cosine decay from PEAK_LR to FINAL_LR."""
    if step < WARMUP:
        return PEAK_LR * (step + 1) / WARMUP
    progress = (step - WARMUP) / max(1, STEPS - WARMUP)
    return FINAL_LR + 0.5 * (PEAK_LR - FINAL_LR) * (1 + math.cos(math.pi * progress))


# --- data -------------------------------------------------------------------------------------


def split(ids: np.ndarray, window: int):
    """Start positions of training windows (none touches a held-out block) and the held-out
    windows, back to back inside the held-out blocks, as an array [n, window]."""
    held_out = (np.arange(len(ids)) // BLOCK) % VAL_EVERY == VAL_EVERY // 2
    touched = np.concatenate([[0], np.cumsum(held_out)])
    starts = np.arange(len(ids) - window + 1)
    train_starts = starts[touched[starts + window] == touched[starts]]
    val = []
    for block in np.flatnonzero(held_out[::BLOCK]):
        chunk = ids[block * BLOCK:(block + 1) * BLOCK]
        val.extend(chunk[i:i + window] for i in range(0, len(chunk) - window + 1, window))
    return train_starts, np.array(val)


def unigram_entropy(ids: np.ndarray) -> float:
    counts = np.bincount(ids)
    freq = counts[counts > 0] / len(ids)
    return float(-(freq * np.log(freq)).sum())


def model_loss(model: Transformer, windows: np.ndarray) -> float:
    """Mean cross-entropy of the model over windows [n, time + 1]."""
    total = 0.0
    for w in windows:
        logits = model.forward(w[None, :-1])[0].astype(np.float64)
        logits -= logits.max(axis=1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        total += -logp[np.arange(len(w) - 1), w[1:]].mean()
    return total / len(windows)


def _weights(params: dict, dtype=np.float32) -> dict:
    """What weights.npz holds: the weights, the vocabulary and the head count."""
    weights = {name: params[name].astype(dtype) for name in PARAM_NAMES}
    weights["vocab"] = np.frombuffer(VOCAB.encode("ascii"), dtype=np.uint8)
    weights["n_head"] = np.array(N_HEAD, dtype=np.int32)
    return weights


def main() -> None:
    rng = np.random.default_rng(SEED)
    vocab = Vocabulary(VOCAB)
    with open(CORPUS, encoding="ascii") as f:
        ids = vocab.encode(f.read())
    train_starts, val = split(ids, CONTEXT + 1)
    params = init_params(rng, N_LAYER, D_MODEL, CONTEXT, len(vocab))
    n_params = sum(v.size for v in params.values())
    print(f"corpus {len(ids)} chars, {len(train_starts)} training windows, {len(val)} held-out "
          f"windows; {n_params} parameters; unigram entropy {unigram_entropy(ids):.3f} nats")

    adam = Adam(params)
    began = time.perf_counter()
    recent = []
    for step in range(STEPS):
        starts = rng.choice(train_starts, BATCH)
        windows = ids[starts[:, None] + np.arange(CONTEXT + 1)]
        loss, grads = loss_and_grads(params, N_HEAD, windows[:, :-1], windows[:, 1:])
        norm = clip(grads, CLIP_NORM)
        adam.update(params, grads, learning_rate(step))
        recent.append(loss)
        if step == 0 or (step + 1) % 100 == 0:
            print(f"step {step + 1:5d}  loss {np.mean(recent):.4f}  grad norm {norm:.2f}  "
                  f"lr {learning_rate(step):.2e}  {time.perf_counter() - began:.0f} s", flush=True)
            recent = []
        if (step + 1) % 400 == 0:
            held_out = model_loss(Transformer(_weights(params)), val)
            print(f"           held-out loss {held_out:.4f}", flush=True)

    np.savez(WEIGHTS, **_weights(params, np.float16))
    print(f"trained in {time.perf_counter() - began:.0f} s; wrote {WEIGHTS} "
          f"({os.path.getsize(WEIGHTS) / 1e6:.2f} MB)")

    model = Transformer.load(WEIGHTS)
    sample_starts = rng.choice(train_starts, len(val))
    train_windows = ids[sample_starts[:, None] + np.arange(CONTEXT + 1)]
    print(f"saved model: train loss {model_loss(model, train_windows):.4f}, held-out loss "
          f"{model_loss(model, val):.4f} nats/char")
    prompt = "We hold these"
    print(f"greedy: {prompt}{generate(model, prompt, SamplingParams(160, 0.0))}")


if __name__ == "__main__":
    main()
