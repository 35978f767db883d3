"""textgen's model: a character-level decoder-only transformer, with KV-cached batched decoding.

Architecture: learned token and position embeddings, `n_layer` pre-LayerNorm blocks (causal
multi-head self-attention, then a GELU MLP four times as wide), a final LayerNorm and an output
head tied to the token embedding. One token is one character of VOCAB (printable ASCII and
newline), so streamed text can never split a multibyte character.

Array code goes through `xp`, numpy on a CPU or cupy on a GPU; sampling and stop handling run
on the host, on one [n, vocab] logits array copied back per step.

Serving: a `DecodeBatch` holds up to `capacity` sequences in the slots of one `KVCache`. A
sequence joins with a prefill over its prompt; each `step()` samples one token for every active
sequence and runs a single forward over all of their new tokens, one token each (one matmul
per weight for the whole batch). Finished sequences leave between steps and the last slot
moves into the hole, so the active sequences are always slots 0..n-1 and every step attends
over views of the cache, without gathering.

Context limit: prompt plus generated text is at most `context` characters. A prompt must be
shorter than the context; generation stops (finish reason "length") when the window is full,
as it does after `max_tokens` characters.
"""

import math
from dataclasses import dataclass

import numpy as np


def array_module(instance_kind: str):
    """cupy for a GPU instance where it is installed, else numpy: what the model computes with."""
    if instance_kind == "GPU":
        try:
            import cupy
        except ImportError:
            return np
        return cupy
    return np


# Token i is VOCAB[i]. Newline first, then printable ASCII in code order.
VOCAB = "\n" + "".join(chr(c) for c in range(32, 127))

# The weights of the model, in weights.npz under these names; per-layer weights are stacked
# along a leading layer axis.
PARAM_NAMES = (
    "tok_emb", "pos_emb",
    "ln1_g", "ln1_b", "w_qkv", "b_qkv", "w_o", "b_o",
    "ln2_g", "ln2_b", "w_up", "b_up", "w_down", "b_down",
    "lnf_g", "lnf_b",
)

LN_EPS = 1e-5
_GELU_C = math.sqrt(2.0 / math.pi)


class Vocabulary:
    """Characters <-> token ids. Non-ASCII characters become '?', ASCII control characters
    other than newline become spaces."""

    def __init__(self, chars: str):
        self.chars = chars
        self._bytes = np.frombuffer(chars.encode("ascii"), dtype=np.uint8)
        table = np.full(256, chars.index(" "), dtype=np.int32)
        table[self._bytes] = np.arange(len(chars), dtype=np.int32)
        self._ids = table

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        raw = np.frombuffer(text.encode("ascii", errors="replace"), dtype=np.uint8)
        return self._ids[raw]

    def decode(self, ids) -> str:
        return self._bytes[np.asarray(ids)].tobytes().decode("ascii")


def layer_norm(x, g, b):
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    var = (centered * centered).mean(axis=-1, keepdims=True)
    return centered * (var + LN_EPS) ** -0.5 * g + b


def gelu(x, xp=np):
    """GELU, tanh approximation."""
    return 0.5 * x * (1.0 + xp.tanh(_GELU_C * (x + 0.044715 * x * x * x)))


def softmax(x, xp=np):
    e = xp.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _to_host(x) -> np.ndarray:
    return x if isinstance(x, np.ndarray) else x.get()


class KVCache:
    """Keys and values of up to `slots` sequences: [layer, slot, head, position, head_dim].

    Zero-filled so that positions no sequence has written hold finite numbers: attention
    masks them, and a masked 0 * NaN would still poison the sum.
    """

    def __init__(self, xp, n_layer, slots, n_head, context, head_dim):
        shape = (n_layer, slots, n_head, context, head_dim)
        self.k = xp.zeros(shape, dtype=xp.float32)
        self.v = xp.zeros(shape, dtype=xp.float32)

    def move(self, src: int, dst: int, length: int) -> None:
        self.k[:, dst, :, :length] = self.k[:, src, :, :length]
        self.v[:, dst, :, :length] = self.v[:, src, :, :length]


class Transformer:
    def __init__(self, weights, xp=np):
        """`weights`: a mapping with PARAM_NAMES, `vocab` (uint8 codes) and `n_head`."""
        self.xp = xp
        self.vocab = Vocabulary(np.asarray(weights["vocab"], dtype=np.uint8).tobytes().decode())
        self.n_head = int(weights["n_head"])
        self.p = {name: xp.asarray(weights[name], dtype=xp.float32) for name in PARAM_NAMES}
        self.n_layer, self.d_model = self.p["w_qkv"].shape[:2]
        self.context = self.p["pos_emb"].shape[0]
        self.head_dim = self.d_model // self.n_head
        self._scale = 1.0 / math.sqrt(self.head_dim)

    @classmethod
    def load(cls, path: str, xp=np) -> "Transformer":
        with np.load(path) as weights:
            return cls(dict(weights), xp)

    def new_cache(self, slots: int) -> KVCache:
        return KVCache(self.xp, self.n_layer, slots, self.n_head, self.context, self.head_dim)

    # --- forward passes --------------------------------------------------------------------

    def forward(self, tokens) -> np.ndarray:
        """Logits [batch, time, vocab] of a full causal pass over tokens [batch, time]."""
        tokens = self.xp.asarray(tokens)
        x = self.p["tok_emb"][tokens] + self.p["pos_emb"][: tokens.shape[1]]
        x = self._blocks(x, lambda layer, q, k, v: self._causal(q, k, v))
        return _to_host(self._head(x))

    def prefill(self, tokens, cache: KVCache, slot: int) -> np.ndarray:
        """Runs prompt tokens [time] into cache slot `slot`; returns the next token's logits."""
        tokens = self.xp.asarray(tokens)
        length = tokens.shape[0]
        x = (self.p["tok_emb"][tokens] + self.p["pos_emb"][:length])[None]

        def attend(layer, q, k, v):
            cache.k[layer, slot, :, :length] = k[0]
            cache.v[layer, slot, :, :length] = v[0]
            return self._causal(q, k, v)

        x = self._blocks(x, attend)
        return _to_host(self._head(x[0, -1]))

    def decode(self, tokens, positions, cache: KVCache) -> np.ndarray:
        """One new token for each of the sequences in slots 0..n-1: tokens [n] at positions [n]
        (each sequence's length so far). Returns logits [n, vocab]."""
        xp = self.xp
        span = int(np.max(positions)) + 1
        tokens = xp.asarray(tokens)
        positions = xp.asarray(positions)
        n = tokens.shape[0]
        rows = xp.arange(n)
        # Additive mask: each sequence sees its own positions 0..position only.
        hidden = xp.arange(span)[None, :] > positions[:, None]
        bias = xp.where(hidden, -xp.inf, 0.0).astype(xp.float32)[:, None, None, :]
        x = (self.p["tok_emb"][tokens] + self.p["pos_emb"][positions])[:, None]

        def attend(layer, q, k, v):
            keys, values = cache.k[layer], cache.v[layer]
            keys[rows, :, positions] = k[:, :, 0]
            values[rows, :, positions] = v[:, :, 0]
            keys, values = keys[:n, :, :span], values[:n, :, :span]
            scores = q @ keys.transpose(0, 1, 3, 2) * self._scale + bias
            return softmax(scores, xp) @ values

        x = self._blocks(x, attend)
        return _to_host(self._head(x[:, 0]))

    def _causal(self, q, k, v):
        xp = self.xp
        t = q.shape[2]
        scores = q @ k.transpose(0, 1, 3, 2) * self._scale
        future = xp.triu(xp.ones((t, t), dtype=bool), 1)
        scores = xp.where(future, -xp.inf, scores)
        return softmax(scores, xp) @ v

    def _blocks(self, x, attend):
        """The transformer blocks over x [batch, time, d]; `attend(layer, q, k, v)` with q, k, v
        [batch, head, time, head_dim] returns the attention output in that layout."""
        p = self.p
        batch, t, d = x.shape
        # Rows of the residual stream as one 2-D matrix: one matmul per weight, where a 3-D
        # operand would be a loop of small matmuls (one per sequence when decoding).
        x = x.reshape(batch * t, d)
        for layer in range(self.n_layer):
            h = layer_norm(x, p["ln1_g"][layer], p["ln1_b"][layer])
            qkv = h @ p["w_qkv"][layer] + p["b_qkv"][layer]
            q, k, v = qkv.reshape(batch, t, 3, self.n_head, self.head_dim).transpose(2, 0, 3, 1, 4)
            a = attend(layer, q, k, v).transpose(0, 2, 1, 3).reshape(batch * t, d)
            x = x + a @ p["w_o"][layer] + p["b_o"][layer]
            h = layer_norm(x, p["ln2_g"][layer], p["ln2_b"][layer])
            x = x + gelu(h @ p["w_up"][layer] + p["b_up"][layer], self.xp) @ p["w_down"][layer]
            x = x + p["b_down"][layer]
        return x.reshape(batch, t, d)

    def _head(self, x):
        return layer_norm(x, self.p["lnf_g"], self.p["lnf_b"]) @ self.p["tok_emb"].T


# --- sampling ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SamplingParams:
    """max_tokens >= 1; temperature >= 0 (0 = greedy); 0 < top_p <= 1 (nucleus); stop
    sequences end the text and are left out of it; seed None = nondeterministic."""

    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple = ()
    seed: int | None = None

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if any(not isinstance(s, str) or s == "" for s in self.stop):
            raise ValueError("stop sequences must be non-empty strings")
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise ValueError(f"seed must be an unsigned 64-bit integer, got {self.seed}")


def sample(logits, temperature, top_p, uniforms) -> np.ndarray:
    """One token per row of logits [n, vocab]: argmax where temperature is 0, else a draw from
    the smallest set of most likely tokens whose probability reaches top_p, at that row's
    temperature, using that row's uniform number in [0, 1)."""
    greedy = temperature == 0
    z = logits / np.where(greedy, 1.0, temperature)[:, None]
    probs = softmax(z)
    order = np.argsort(-probs, axis=1, kind="stable")
    ranked = np.take_along_axis(probs, order, axis=1)
    # Keep a token while the tokens ranked above it hold less than top_p: the top token always.
    above = np.cumsum(ranked, axis=1) - ranked
    ranked = np.where(above < top_p[:, None], ranked, 0.0)
    cumulative = np.cumsum(ranked, axis=1)
    pick = (cumulative < (uniforms * cumulative[:, -1])[:, None]).sum(axis=1)
    tokens = np.take_along_axis(order, pick[:, None], axis=1)[:, 0]
    return np.where(greedy, logits.argmax(axis=1), tokens)


class Sequence:
    """One generation: its sampling settings and random stream, and the text produced so far.

    `text` is the generated text (stop sequence removed once matched). Text that may be the
    start of a stop sequence is held back from `accept`'s pieces until it is known not to be,
    so the pieces always add up to `text`.
    """

    def __init__(self, prompt_ids: np.ndarray, params: SamplingParams, context: int):
        if len(prompt_ids) == 0:
            # Nothing to go on: begin as the texts of the corpus do, after a newline (VOCAB[0]).
            prompt_ids = np.zeros(1, dtype=np.int32)
        if len(prompt_ids) >= context:
            raise ValueError(
                f"the prompt has {len(prompt_ids)} characters; the model's context holds "
                f"{context}, so a prompt may have at most {context - 1}"
            )
        self.prompt_ids = prompt_ids
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self.text = ""
        self.finish_reason = None
        self.slot = None
        self.length = 0  # tokens in the cache
        self.generated = 0  # tokens sampled
        self.last_token = None
        self._emitted = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def accept(self, token: int, char: str, window_full: bool) -> str:
        """Takes the next token; returns the text that can be handed out now."""
        self.last_token = token
        self.generated += 1
        self.text += char
        for stop in self.params.stop:
            if self.text.endswith(stop):
                self.text = self.text[: -len(stop)]
                self.finish_reason = "stop"
                break
        else:
            if window_full or self.generated >= self.params.max_tokens:
                self.finish_reason = "length"
        end = len(self.text) if self.finished else len(self.text) - self._held()
        piece = self.text[self._emitted:end]
        self._emitted = end
        return piece

    def _held(self) -> int:
        """Length of the longest end of `text` that is a proper start of a stop sequence."""
        held = 0
        for stop in self.params.stop:
            for k in range(min(len(stop) - 1, len(self.text)), held, -1):
                if self.text.endswith(stop[:k]):
                    held = k
                    break
        return held


class DecodeBatch:
    """Up to `capacity` sequences decoding together (see the module docstring)."""

    def __init__(self, model: Transformer, capacity: int):
        self.model = model
        self.capacity = capacity
        self.cache = model.new_cache(capacity)
        self.sequences: list[Sequence] = []
        vocab = len(model.vocab)
        self._logits = np.zeros((capacity, vocab), dtype=np.float32)
        self._temperature = np.zeros(capacity, dtype=np.float32)
        self._top_p = np.ones(capacity, dtype=np.float32)

    def __len__(self) -> int:
        return len(self.sequences)

    @property
    def full(self) -> bool:
        return len(self.sequences) == self.capacity

    @property
    def logits(self) -> np.ndarray:
        """Next-token logits of the active sequences, row i for slot i."""
        return self._logits[: len(self.sequences)]

    def add(self, seq: Sequence) -> None:
        if self.full:
            raise RuntimeError("the decode batch is full")
        slot = len(self.sequences)
        self._logits[slot] = self.model.prefill(seq.prompt_ids, self.cache, slot)
        self._temperature[slot] = seq.params.temperature
        self._top_p[slot] = seq.params.top_p
        seq.slot = slot
        seq.length = len(seq.prompt_ids)
        self.sequences.append(seq)

    def remove(self, seq: Sequence) -> None:
        slot, last = seq.slot, len(self.sequences) - 1
        if slot != last:
            moved = self.sequences[last]
            self.cache.move(last, slot, moved.length)
            self._logits[slot] = self._logits[last]
            self._temperature[slot] = self._temperature[last]
            self._top_p[slot] = self._top_p[last]
            self.sequences[slot] = moved
            moved.slot = slot
        self.sequences.pop()
        seq.slot = None

    def step(self) -> list[tuple[Sequence, str]]:
        """One token for every active sequence. Returns (sequence, text piece) for each of them;
        the finished ones (`seq.finished`) have left the batch."""
        n = len(self.sequences)
        if n == 0:
            return []
        uniforms = np.array([seq.rng.random() for seq in self.sequences])
        tokens = sample(self._logits[:n], self._temperature[:n], self._top_p[:n], uniforms)
        chars = self.model.vocab.decode(tokens)
        context = self.model.context
        out = []
        for seq, token, char in zip(self.sequences, tokens.tolist(), chars):
            out.append((seq, seq.accept(token, char, seq.length + 1 >= context)))
        for seq, _ in out:
            if seq.finished:
                self.remove(seq)
        if self.sequences:
            active = self.sequences
            positions = np.array([seq.length for seq in active])
            last = np.array([seq.last_token for seq in active])
            self._logits[: len(active)] = self.model.decode(last, positions, self.cache)
            for seq in active:
                seq.length += 1
        return out


def generate(model: Transformer, prompt: str, params: SamplingParams) -> str:
    """The whole generated text for one prompt (offline use; the server batches many)."""
    batch = DecodeBatch(model, 1)
    seq = Sequence(model.vocab.encode(prompt), params, model.context)
    batch.add(seq)
    while not seq.finished:
        batch.step()
    return seq.text
