"""A GPT-2 decoder block built with the jitml Graph API against PyTorch's functional
ops (layer_norm, softmax attention, erf gelu) in float64, batch and sequence symbolic.
PyTorch is Debian's python3-torch here (scripts/install-deps.sh)."""
import numpy as np
import pytest

import jitml

torch = pytest.importorskip("torch")
F = torch.nn.functional

D, H, FF = 64, 4, 256
NAMES = ("ln1_g", "ln1_b", "wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo",
         "ln2_g", "ln2_b", "w1", "c1", "w2", "c2")


def weights():
    rng = np.random.default_rng(11)
    shapes = {"wq": (D, D), "wk": (D, D), "wv": (D, D), "wo": (D, D), "w1": (D, FF),
              "c1": (FF,), "w2": (FF, D)}
    w = {}
    for name in NAMES:
        shape = shapes.get(name, (D,))
        w[name] = rng.uniform(-0.05, 0.05, size=shape).astype(np.float32)
        if name in ("ln1_g", "ln2_g"):
            w[name] += 1
    return w


def jitml_block(ctx, w):
    g = jitml.Graph(ctx, "gpt2_block")
    x = g.input("x", "float32", ("B", "S", D))
    mask = g.input("mask", "float32", ("S", "S"))
    v = {name: g.input(name, "float32", w[name].shape) for name in NAMES}

    def heads(t, keys):
        t = g.reshape(t, ("B", "S", H, D // H))
        return g.transpose(t, (0, 2, 3, 1) if keys else (0, 2, 1, 3))

    h = g.layer_norm(x, v["ln1_g"], v["ln1_b"], eps=1e-5)
    q = heads(h @ v["wq"] + v["bq"], False)
    k = heads(h @ v["wk"] + v["bk"], True)
    vv = heads(h @ v["wv"] + v["bv"], False)
    scores = g.mul(q @ k, g.scalar(1.0 / np.sqrt(D // H)))
    p = g.softmax(scores + mask, axis=-1)
    a = g.reshape(g.transpose(p @ vv, (0, 2, 1, 3)), ("B", "S", D))
    x1 = x + (a @ v["wo"] + v["bo"])
    h2 = g.layer_norm(x1, v["ln2_g"], v["ln2_b"], eps=1e-5)
    m = g.gelu_erf(h2 @ v["w1"] + v["c1"]) @ v["w2"] + v["c2"]
    g.output(x1 + m)
    g.finalize()
    return g


def torch_block(x, mask, w):
    t = {k: torch.from_numpy(a).double() for k, a in w.items()}
    x = torch.from_numpy(x).double()
    mask = torch.from_numpy(mask).double()
    b, s, _ = x.shape

    def heads(u):
        return u.reshape(b, s, H, D // H).transpose(1, 2)

    h = F.layer_norm(x, (D,), t["ln1_g"], t["ln1_b"], 1e-5)
    q, k, v = (heads(h @ t[n] + t[bn]) for n, bn in (("wq", "bq"), ("wk", "bk"), ("wv", "bv")))
    p = torch.softmax(q @ k.transpose(-1, -2) / np.sqrt(D // H) + mask, dim=-1)
    a = (p @ v).transpose(1, 2).reshape(b, s, D)
    x1 = x + a @ t["wo"] + t["bo"]
    h2 = F.layer_norm(x1, (D,), t["ln2_g"], t["ln2_b"], 1e-5)
    return (x1 + F.gelu(h2 @ t["w1"] + t["c1"]) @ t["w2"] + t["c2"]).numpy()


def test_gpt2_block_matches_pytorch(ctx):
    w = weights()
    g = jitml_block(ctx, w)
    rng = np.random.default_rng(3)
    for b, s in ((1, 1), (2, 7), (3, 33)):
        x = rng.uniform(-1, 1, size=(b, s, D)).astype(np.float32)
        mask = np.triu(np.full((s, s), -np.inf, dtype=np.float32), k=1)
        y = g(x, mask, *(w[n] for n in NAMES))
        assert y.shape == (b, s, D)
        np.testing.assert_allclose(y, torch_block(x, mask, w), rtol=1e-4, atol=1e-5,
                                   err_msg="B=%d S=%d" % (b, s))
