"""Write a tiny random-weight GGUF (mamba, hybrid, qwen35 or SWA) that makes llama-server checkpoints.

--arch mamba (default): pure recurrent. A checkpoint holds the whole recurrent state of one
  sequence, n_layer * d_inner * (d_state + d_conv - 1) * 4 bytes with d_inner = 2 * n_embd. The
  defaults (n_embd 512, 8 layers, d_state 1536) give 48.09 MiB, above glibc's 32 MiB mmap
  threshold, so every fresh checkpoint buffer is a new mmap() whose pages fault during the fill.
--arch hybrid: `jamba` (mamba layers + attention layers, dense FFN), every 4th layer attention.
  A checkpoint (the server's partial state) holds the recurrent layers only: with the defaults
  6 of 8 layers, 36.07 MiB. The attention layers' KV cache is rolled back, not checkpointed.
--arch qwen35: `qwen35`, the hybrid family llama.cpp PR #201 measured (Qwen3.5): gated delta-net
  (linear attention) layers and every 4th layer full attention, dense FFN. A checkpoint holds the
  delta-net layers' state: per layer a conv state of (d_conv - 1) * (2 * k_heads + heads) *
  d_state floats and a delta-net state of heads * d_state^2 floats (d_state: the head size, 64
  or 128; --heads value heads, half as many key heads). The defaults (n_embd 256, 12 layers,
  d_state 128, 64 heads) give 9 delta-net layers, 37.69 MiB. Upstream (11434, 11549) and
  ik_llama.cpp 0.1.5 load it (ik: run it with -no-fa).
--arch swa: `gemma2` (sliding-window attention on every other layer). A checkpoint holds the
  sliding-window cache cells of the sequence, n_swa_layers * n_tokens * 4 * n_embd_kv bytes
  (K and V in f16): it grows with the prompt up to the window (--window), e.g. 8 KiB a token
  with the defaults (4 SWA layers, n_embd_kv 512).
The llama.cpp generations build.sh knows (0.3.36 and upstream 11434, 11549) load mamba, hybrid and
SWA; ik_llama.cpp 0.1.5 loads qwen35 only (its mamba graph asserts).

The weights are random (the text it writes is noise); the tokenizer is copied from a
vocab-only GGUF that ships with llama.cpp (default: gpt-2, from llama-cpp-python 0.3.36's sdist,
which this script fetches into the cache with build.sh --fetch-only when it is not there yet).
Needs `gguf==0.19.0` (the version vendored in that sdist): `pip install -e '.[llama]'`.

Usage: python samples/llama-server/make_model.py OUT.gguf [--arch mamba|hybrid|qwen35|swa]
       [--d-model N] [--layers N] [--d-state N] [--heads N] [--window N] [--seed N] [--vocab VOCAB.gguf]
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import subprocess
import sys
import tarfile
import tempfile

import numpy as np

SDIST_VERSION = "0.3.36"
D_CONV = 4
VOCAB_MEMBER = f"llama_cpp_python-{SDIST_VERSION}/vendor/llama.cpp/models/ggml-vocab-gpt-2.gguf"


ARCHS = {"mamba": "mamba", "hybrid": "jamba", "qwen35": "qwen35", "swa": "gemma2"}
HEAD_DIM = 64  # attention layers: n_head = n_embd / 64 (at least 1)
ATTN_EVERY = 4  # hybrid and qwen35: layers 3, 7, 11, ... are attention
# qwen35: the delta-net head sizes ik_llama.cpp's CPU kernel takes, and the defaults
QWEN35_HEAD_SIZES = (64, 128)
QWEN35_DEFAULTS = {"d_model": 256, "layers": 12, "d_state": 128, "heads": 64}
# multimodal rope sections of the attention layers (Qwen3.5's): they add up to HEAD_DIM / 2
QWEN35_ROPE_SECTIONS = [11, 11, 10, 0]


def state_bytes(d_model: int, layers: int, d_state: int) -> int:
    """Bytes of one sequence's recurrent state (conv + ssm) over `layers` mamba layers."""
    d_inner = 2 * d_model
    return layers * d_inner * (d_state + D_CONV - 1) * 4


def qwen35_state_bytes(layers: int, d_state: int, heads: int) -> int:
    """Bytes of one sequence's state over `layers` delta-net layers: conv + delta-net state, f32."""
    conv = (D_CONV - 1) * (2 * (heads // 2) + heads) * d_state
    return layers * (conv + heads * d_state * d_state) * 4


def attention_layers(arch: str, layers: int) -> list[bool]:
    """Per layer: is it attention (hybrid, qwen35), or sliding-window attention (swa)?"""
    if arch in ("hybrid", "qwen35"):
        return [i % ATTN_EVERY == ATTN_EVERY - 1 for i in range(layers)]
    if arch == "swa":
        return [i % 2 == 0 for i in range(layers)]  # gemma2's pattern: even layers slide
    return [False] * layers


def checkpoint_text(arch: str, d_model: int, layers: int, d_state: int, heads: int = 0) -> str:
    """What one checkpoint of this model holds, for the message make_model.py prints."""
    if arch == "qwen35":
        size = qwen35_state_bytes(layers - sum(attention_layers(arch, layers)), d_state, heads)
        return f"checkpoint about {size} bytes ({size / 2**20:.2f} MiB, and a few bytes of header)"
    if arch == "swa":
        n_swa = sum(attention_layers(arch, layers))
        per_token = n_swa * 4 * n_head(d_model) * HEAD_DIM
        return f"checkpoint {per_token} bytes a token in the window ({per_token / 1024:.1f} KiB)"
    recurrent = layers - sum(attention_layers(arch, layers))
    size = state_bytes(d_model, recurrent, d_state)
    return f"checkpoint {size} bytes ({size / 2**20:.2f} MiB)"


def n_head(d_model: int) -> int:
    return max(1, d_model // HEAD_DIM)


def cache_root() -> str:
    return os.path.join(os.environ.get("CKPTRACE_CACHE", "/var/cache/ckptrace"), "llama-server")


def fetch_sdist(sdist: str) -> None:
    """Fetch the 0.3.36 sdist into the cache with build.sh --fetch-only (pip download, once)."""
    build_sh = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build.sh")
    fix = f"bash {build_sh} --fetch-only --version {SDIST_VERSION}"
    print(f"make_model.py: no gpt-2 vocab in the cache: fetching llama-cpp-python {SDIST_VERSION}'s "
          f"sdist for it (once, into {os.path.dirname(sdist)})", file=sys.stderr, flush=True)
    p = subprocess.run(["bash", build_sh, "--fetch-only", "--version", SDIST_VERSION], stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env={**os.environ, "CKPTRACE_PYTHON": os.environ.get("CKPTRACE_PYTHON", sys.executable)})
    if p.returncode != 0 or not os.path.exists(sdist):
        last = [ln.strip() for ln in p.stderr.splitlines() if ln.strip()][-1:] or ["no output"]
        sys.exit(f"make_model.py: could not fetch the sdist ({last[0]}): run `{fix}` to see why, "
                 "or pass --vocab PATH")


def find_vocab() -> str:
    """The gpt-2 vocab GGUF: from an extracted build (any version), else pulled out of the
    cached 0.3.36 sdist."""
    root = cache_root()
    built = sorted(glob.glob(os.path.join(root, "*-*", "src", "models", "ggml-vocab-gpt-2.gguf")))
    if built:
        return built[0]
    out = os.path.join(root, "vocab", "ggml-vocab-gpt-2.gguf")
    if os.path.exists(out):
        return out
    sdist = os.path.join(root, f"sdist-{SDIST_VERSION}", f"llama_cpp_python-{SDIST_VERSION}.tar.gz")
    if not os.path.exists(sdist):
        fetch_sdist(sdist)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with tarfile.open(sdist) as tar:
        src = tar.extractfile(VOCAB_MEMBER)
        if src is None:
            sys.exit(f"make_model.py: {VOCAB_MEMBER} is not in {sdist}: pass --vocab PATH")
        # write then rename, so a concurrent reader never sees half a file
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(out))
        with os.fdopen(fd, "wb") as f:
            f.write(src.read())
        os.replace(tmp, out)
    return out


def copy_tokenizer(writer, vocab_path: str) -> int:
    """Copy every tokenizer.* key of the vocab GGUF; return the vocabulary size."""
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(vocab_path)
    n_vocab = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        value = field.contents()
        writer.add_key_value(name, value, vtype, sub_type=sub_type)
        if name == "tokenizer.ggml.tokens":
            n_vocab = len(value)
    if n_vocab == 0:
        sys.exit(f"make_model.py: {vocab_path} has no tokenizer.ggml.tokens")
    return n_vocab


def write_model(out: str, d_model: int, layers: int, d_state: int, seed: int, vocab: str,
                arch: str = "mamba", window: int = 512, heads: int = 0) -> None:
    import gguf

    rng = np.random.default_rng(seed)

    def normal(*shape: int, std: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    # Written beside under a name made exclusively (never a predictable one a link could sit
    # at), renamed when complete.
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(out) + ".", suffix=".tmp",
                               dir=os.path.dirname(os.path.abspath(out)))
    os.close(fd)
    writer = gguf.GGUFWriter(tmp, ARCHS[arch])
    writer.add_name(f"ckptrace-tiny-{arch}")
    writer.add_context_length(4096)
    writer.add_embedding_length(d_model)
    writer.add_block_count(layers)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    n_vocab = copy_tokenizer(writer, vocab)

    # numpy shapes are ggml's ne reversed
    writer.add_tensor("token_embd.weight", normal(n_vocab, d_model))
    writer.add_tensor("output_norm.weight", ones(d_model))
    if arch == "swa":
        write_swa_layers(writer, normal, ones, d_model, layers, window)
    elif arch == "qwen35":
        write_qwen35_layers(writer, normal, ones, d_model, layers, d_state, heads)
    else:
        write_recurrent_layers(writer, normal, ones, arch, d_model, layers, d_state)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.chmod(tmp, 0o644)  # mkstemp's 0600 is for while it is written
    os.replace(tmp, out)


def write_recurrent_layers(writer, normal, ones, arch: str, d_model: int, layers: int, d_state: int) -> None:
    """mamba, or jamba's mix of mamba and attention layers (each with a dense FFN)."""
    d_inner = 2 * d_model  # llama.cpp supports only this expansion factor
    dt_rank = math.ceil(d_model / 16)
    attn = attention_layers(arch, layers)
    heads = next(n for n in range(n_head(d_model), 0, -1) if d_model % n == 0)  # jamba: n_embd / n_head
    writer.add_ssm_conv_kernel(D_CONV)
    writer.add_ssm_inner_size(d_inner)
    writer.add_ssm_state_size(d_state)
    writer.add_ssm_time_step_rank(dt_rank)
    if arch == "hybrid":
        writer.add_feed_forward_length(d_model)
        writer.add_head_count(heads)
        writer.add_head_count_kv([heads if a else 0 for a in attn])  # 0 marks a mamba layer
    else:
        writer.add_feed_forward_length(0)
        writer.add_head_count(0)
    # values keep the recurrence stable (A < 0)
    a = -np.tile(np.arange(1, d_state + 1, dtype=np.float32), (d_inner, 1))
    for i in range(layers):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", ones(d_model))
        if attn[i]:
            for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
                writer.add_tensor(p + name + ".weight", normal(d_model, d_model))
        else:
            writer.add_tensor(p + "ssm_in.weight", normal(2 * d_inner, d_model))
            writer.add_tensor(p + "ssm_conv1d.weight", normal(d_inner, D_CONV, std=0.5))
            writer.add_tensor(p + "ssm_conv1d.bias", np.zeros(d_inner, dtype=np.float32))
            writer.add_tensor(p + "ssm_x.weight", normal(dt_rank + 2 * d_state, d_inner))
            writer.add_tensor(p + "ssm_dt.weight", normal(d_inner, dt_rank, std=0.1))
            writer.add_tensor(p + "ssm_dt.bias", np.full(d_inner, -4.0, dtype=np.float32))
            writer.add_tensor(p + "ssm_a", a)
            writer.add_tensor(p + "ssm_d", ones(d_inner))
            writer.add_tensor(p + "ssm_out.weight", normal(d_model, d_inner))
            if arch == "hybrid":  # jamba normalises dt, B and C
                writer.add_tensor(p + "ssm_dt_norm.weight", ones(dt_rank))
                writer.add_tensor(p + "ssm_b_norm.weight", ones(d_state))
                writer.add_tensor(p + "ssm_c_norm.weight", ones(d_state))
        if arch == "hybrid":
            writer.add_tensor(p + "ffn_norm.weight", ones(d_model))
            writer.add_tensor(p + "ffn_gate.weight", normal(d_model, d_model))
            writer.add_tensor(p + "ffn_up.weight", normal(d_model, d_model))
            writer.add_tensor(p + "ffn_down.weight", normal(d_model, d_model))


def write_qwen35_layers(writer, normal, ones, d_model: int, layers: int, d_state: int, heads: int) -> None:
    """qwen35: gated delta-net layers (their conv over q, k and v, the delta-net state of `heads`
    value heads of size d_state, half as many key heads) and every ATTN_EVERY-th layer gated full
    attention with q/k norms; every layer a post-attention norm and a dense FFN."""
    arch = "qwen35"
    k_heads = heads // 2
    key_dim, value_dim = d_state * k_heads, d_state * heads
    attn = attention_layers("qwen35", layers)
    n_heads = n_head(d_model)
    writer.add_feed_forward_length(d_model)
    writer.add_head_count(n_heads)
    writer.add_head_count_kv(n_heads)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_array(f"{arch}.rope.dimension_sections", QWEN35_ROPE_SECTIONS)
    writer.add_ssm_conv_kernel(D_CONV)
    writer.add_ssm_inner_size(value_dim)
    writer.add_ssm_state_size(d_state)
    writer.add_ssm_time_step_rank(heads)
    writer.add_ssm_group_count(k_heads)
    writer.add_uint32(f"{arch}.full_attention_interval", ATTN_EVERY)
    q_dim = n_heads * HEAD_DIM
    for i in range(layers):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", ones(d_model))
        writer.add_tensor(p + "post_attention_norm.weight", ones(d_model))
        if attn[i]:
            writer.add_tensor(p + "attn_q.weight", normal(2 * q_dim, d_model))  # query and its gate
            writer.add_tensor(p + "attn_k.weight", normal(q_dim, d_model))
            writer.add_tensor(p + "attn_v.weight", normal(q_dim, d_model))
            writer.add_tensor(p + "attn_output.weight", normal(d_model, q_dim))
            writer.add_tensor(p + "attn_q_norm.weight", ones(HEAD_DIM))
            writer.add_tensor(p + "attn_k_norm.weight", ones(HEAD_DIM))
        else:
            writer.add_tensor(p + "attn_qkv.weight", normal(2 * key_dim + value_dim, d_model))
            writer.add_tensor(p + "attn_gate.weight", normal(value_dim, d_model))
            writer.add_tensor(p + "ssm_conv1d.weight", normal(2 * key_dim + value_dim, D_CONV, std=0.5))
            writer.add_tensor(p + "ssm_dt.bias", np.zeros(heads, dtype=np.float32))
            writer.add_tensor(p + "ssm_a", -ones(heads))  # the decay stays below 1
            writer.add_tensor(p + "ssm_beta.weight", normal(heads, d_model))
            writer.add_tensor(p + "ssm_alpha.weight", normal(heads, d_model))
            writer.add_tensor(p + "ssm_norm.weight", ones(d_state))
            writer.add_tensor(p + "ssm_out.weight", normal(d_model, value_dim))
        writer.add_tensor(p + "ffn_gate.weight", normal(d_model, d_model))
        writer.add_tensor(p + "ffn_up.weight", normal(d_model, d_model))
        writer.add_tensor(p + "ffn_down.weight", normal(d_model, d_model))


def write_swa_layers(writer, normal, ones, d_model: int, layers: int, window: int) -> None:
    """gemma2: attention on every layer, sliding-window on the even ones, dense FFN."""
    heads = n_head(d_model)
    q_dim = heads * HEAD_DIM
    writer.add_feed_forward_length(d_model)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_sliding_window(window)
    writer.add_attn_logit_softcapping(50.0)
    writer.add_final_logit_softcapping(30.0)
    for i in range(layers):
        p = f"blk.{i}."
        for name in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            writer.add_tensor(p + name + ".weight", ones(d_model))
        for name in ("attn_q", "attn_k", "attn_v"):
            writer.add_tensor(p + name + ".weight", normal(q_dim, d_model))
        writer.add_tensor(p + "attn_output.weight", normal(d_model, q_dim))
        writer.add_tensor(p + "ffn_gate.weight", normal(d_model, d_model))
        writer.add_tensor(p + "ffn_up.weight", normal(d_model, d_model))
        writer.add_tensor(p + "ffn_down.weight", normal(d_model, d_model))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Write a tiny random-weight GGUF (mamba, hybrid or SWA) for llama-server "
                    "checkpoint tests.",
        epilog="Examples:\n"
               "  python samples/llama-server/make_model.py /tmp/tiny-mamba.gguf\n"
               "  python samples/llama-server/make_model.py m.gguf --d-model 384 --layers 6 "
               "--d-state 2048\n"
               "  python samples/llama-server/make_model.py /tmp/tiny-jamba.gguf --arch hybrid\n"
               "  python samples/llama-server/make_model.py /tmp/tiny-qwen35.gguf --arch qwen35 --layers 16\n"
               "  python samples/llama-server/make_model.py /tmp/tiny-gemma2.gguf --arch swa --window 256",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="path of the GGUF to write")
    ap.add_argument("--arch", choices=sorted(ARCHS), default="mamba",
                    help="mamba (default); hybrid: jamba, mamba + attention layers; qwen35: "
                         "gated delta-net + attention layers; swa: gemma2, sliding-window attention")
    ap.add_argument("--d-model", type=int, default=None, help="n_embd (default 512; qwen35: 256)")
    ap.add_argument("--layers", type=int, default=None, help="n_layer (default 8; qwen35: 12)")
    ap.add_argument("--d-state", type=int, default=None,
                    help="SSM state size, mamba and hybrid (default 1536); qwen35: the delta-net "
                         "head size, 64 or 128 (default 128)")
    ap.add_argument("--heads", type=int, default=None,
                    help="qwen35 only: delta-net value heads, even (default 64; key heads: half)")
    ap.add_argument("--window", type=int, default=None,
                    help="sliding window in tokens, swa only (default 512)")
    ap.add_argument("--seed", type=int, default=0, help="weights RNG seed (default 0)")
    ap.add_argument("--vocab", help="vocab-only GGUF to copy the tokenizer from "
                                    "(default: gpt-2 from the cached sdist)")
    args = ap.parse_args(argv)
    if args.arch == "swa" and args.d_state is not None:
        ap.error("--d-state applies to --arch mamba and hybrid, not swa")
    if args.arch != "qwen35" and args.heads is not None:
        ap.error("--heads applies to --arch qwen35 only")
    if args.arch != "swa" and args.window is not None:
        ap.error("--window applies to --arch swa only")
    defaults = QWEN35_DEFAULTS if args.arch == "qwen35" else {"d_model": 512, "layers": 8, "d_state": 1536, "heads": 0}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.window = 512 if args.window is None else args.window
    for name in ("d_model", "layers", "d_state", "window"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.arch in ("hybrid", "qwen35") and args.layers < ATTN_EVERY:
        ap.error(f"--arch {args.arch} needs --layers {ATTN_EVERY} or more (every {ATTN_EVERY}th is attention)")
    if args.arch == "qwen35":
        if args.d_state not in QWEN35_HEAD_SIZES:
            ap.error(f"--arch qwen35 takes --d-state {' or '.join(map(str, QWEN35_HEAD_SIZES))} "
                     "(the head sizes ik_llama.cpp's delta-net kernel has)")
        if args.heads < 2 or args.heads % 2:
            ap.error("--heads must be even and at least 2 (key heads: half of it)")
        if args.d_model < HEAD_DIM or args.d_model % HEAD_DIM:
            ap.error(f"--arch qwen35 needs --d-model a multiple of {HEAD_DIM} (its attention heads)")
    try:
        import gguf  # noqa: F401
    except ImportError:
        sys.exit("make_model.py: needs the gguf package: pip install 'gguf==0.19.0' "
                 "(or pip install -e '.[llama]')")
    vocab = args.vocab or find_vocab()
    write_model(args.out, args.d_model, args.layers, args.d_state, args.seed, vocab,
                args.arch, args.window, args.heads)
    shape = f"window {args.window}" if args.arch == "swa" else f"d_state {args.d_state}"
    if args.arch == "qwen35":
        shape += f", {args.heads} heads"
    print(f"wrote {args.out}: {ARCHS[args.arch]}, n_embd {args.d_model}, {args.layers} layers, "
          f"{shape}; {checkpoint_text(args.arch, args.d_model, args.layers, args.d_state, args.heads)}",
          file=sys.stderr)
    print(os.path.abspath(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
